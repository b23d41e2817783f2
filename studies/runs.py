"""What the training studies share: fairseq subprocesses with their logs, JSON results (written
atomically), fairseq's json log lines, resume by ``result.json``, common arguments, logging, and
the report of a study.

Resume. A run's ``result.json`` carries its *definition*: its command (with the run's folder,
the work folder, the repository and the venv written as placeholders, so that moving them is
not a change), a fingerprint of its data (the bytes of the prepared data) and the study's
settings (the parsed arguments, less those that say which runs to do and how, not what a run
is: ``NOT_DEFINING``). A stored result is reused only when its definition is the one asked for
now. Otherwise the run is trained again, and its old folder is kept beside it as
``<run>.superseded``: a study asked to train for another budget or on other data means those
runs, and stopping to ask for ``--force`` would make the command users type (the same
command with a new ``--max-update``) fail by design; the WARNING names what differs, so a
change made by mistake is seen, and the old result is not lost.

Outcomes. Only fairseq's own NaN/Inf stop (``NAN_INF_STOPS``) is a divergence, a result of the
run. Any other failure of a command (a signal, the OOM killer, a full disk, a bug) is an error:
the run is not stored, its ``error.json`` says what happened, the other runs go on, and the
next start of the same command trains it again. ``run_seeds`` raises ``RunsFailed`` listing
every failed run once all have finished.

The drivers (``studies.convergence``, ``studies.lm_comparison``, ``studies.paper_checks``) check
He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747) and Liu et al.,
"Understanding the Difficulty of Training Transformers" (arXiv 2004.08249). Seed means and
tables are in ``studies.tables``, plots in ``studies.plots``.
"""

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

from realformer_fairseq.atomic_files import atomic_output, write_json_atomic, write_text_atomic

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path(
    os.environ.get("REALFORMER_SHARED_DATA", REPO_ROOT.parent / "shared" / "data" / "enfr")
)
BIN = Path(sys.executable).parent


class StudyError(RuntimeError):
    """A stage failed; the message names the stage and the command's output tail."""


class CommandFailed(StudyError):
    """A command exited non-zero (``returncode``; negative: killed by that signal)."""

    def __init__(self, message: str, returncode: int, log_file: Path):
        super().__init__(message)
        self.returncode = returncode
        self.log_file = log_file


class RunsFailed(StudyError):
    """Runs of a study failed (errors, not divergence); the others finished and are stored."""


LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"


def get_logger(name: str) -> logging.Logger:
    """The study's logger; ``main_entry`` (or ``configure_logging``) gives it times at INFO."""
    return logging.getLogger(name)


def configure_logging():
    """INFO with times on stdout for the study's process. ``force``: importing the plugin
    imports fairseq, which has configured the root logger already (DEBUG, stderr, no times),
    so a plain ``basicConfig`` would do nothing; matplotlib's DEBUG font search stays quiet."""
    logging.basicConfig(
        format=LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S", level=logging.INFO, stream=sys.stdout,
        force=True,
    )  # fmt: skip
    logging.getLogger("matplotlib").setLevel(logging.WARNING)


def main_entry(prog: str, main: Callable):
    """A study's ``if __name__ == "__main__"``: logging by ``configure_logging``, then
    ``main()``; a StudyError becomes the exit message ``prog: error: ...``."""
    configure_logging()
    try:
        main()
    except StudyError as err:
        raise SystemExit(f"{prog}: error: {err}") from None


def fairseq_command(name: str) -> str:
    exe = BIN / name
    return str(exe) if exe.exists() else name


def user_dir() -> str:
    import realformer_fairseq

    return str(Path(realformer_fairseq.__file__).resolve().parent)


def run(cmd: Sequence, log_file: Path, threads: int = 1) -> str:
    """Run a command with its output in ``log_file``; raise StudyError on failure."""
    # PYTHONPATH: a study run as ``python -m studies.NAME`` from any folder
    env = dict(os.environ, PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with atomic_output(log_file) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            proc = subprocess.run(
                [str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT, env=env, text=True
            )
        out = Path(tmp).read_text(encoding="utf-8")
    if proc.returncode != 0:
        raise CommandFailed(
            f"{exit_text(proc.returncode)}, log {log_file}: "
            f"{' '.join(map(str, cmd))}\n{out[-3000:]}",
            proc.returncode,
            log_file,
        )
    return out


def exit_text(returncode: int) -> str:
    """``command failed (exit status 1)`` or ``command killed by signal SIGKILL``."""
    if returncode < 0:
        try:
            return f"command killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"command killed by signal {-returncode}"
    return f"command failed (exit status {returncode})"


# fairseq 0.12's own stops on a non-finite loss or gradient, as its traceback's last line
# prints them: fairseq/trainer.py Trainer.train_step ("gradients are Nan/Inf", without
# --amp), fairseq/optim/dynamic_loss_scaler.py and amp_optimizer.py (--fp16 / --amp: the loss
# scale fell to --min-loss-scale). fairseq's other FloatingPointError ("gradients are
# inconsistent between workers") is a hardware or set-up fault, not a divergence.
NAN_INF_STOPS = re.compile(
    r"^FloatingPointError: (gradients are Nan/Inf|(AMP: )?Minimum loss scale reached \(.*)$",
    re.M,
)


def nan_inf_stop(log_text: str) -> Optional[str]:
    """The line of fairseq's NaN/Inf stop in a training log (a divergence), or None."""
    found = NAN_INF_STOPS.search(log_text)
    return found.group(0) if found else None


def write_json(path: Path, obj):
    write_json_atomic(path, obj, default=str)


def read_json(path: Path) -> Optional[Dict]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


# parsed arguments that say which runs to do and how, not what a run is
NOT_DEFINING = (
    "seeds", "variants", "jobs", "force", "report_only", "work_dir", "out", "quick", "data",
    "keep_checkpoints",
)  # fmt: skip


def data_fingerprint(data: Union[Path, Dict, Sequence]) -> str:
    """sha256 of the prepared data: every file under ``data`` (a folder, a file, or a dict or
    list of them), by relative name and bytes; fairseq's ``*.log`` files (times) left out."""
    paths = list(data.values()) if isinstance(data, dict) else [data]
    paths = [p for item in paths for p in (item if isinstance(item, (list, tuple)) else [item])]
    digest = hashlib.sha256()
    for root in map(Path, paths):
        files = sorted(root.rglob("*")) if root.is_dir() else [root]
        for path in files:
            if path.is_file() and path.suffix != ".log":
                digest.update(f"{path.relative_to(root.parent)}\n".encode())
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        digest.update(block)
    return digest.hexdigest()


def portable_command(cmd: Sequence, run_dir: Path, work_dir: Path) -> str:
    """The command line with the run's folder, the work folder, the venv's bin and the
    repository as ``RUN_DIR``, ``WORK_DIR``, ``BIN`` and ``REPO``."""
    text = command_line(cmd)
    for path, name in ((run_dir, "RUN_DIR"), (work_dir, "WORK_DIR"), (BIN, "BIN"),
                       (REPO_ROOT, "REPO")):  # fmt: skip
        text = text.replace(str(path), name)
    return text


def definition(cmd: Sequence, data_print: str, args, run_dir: Path, drop=()) -> Dict:
    """What defines a run: its command, its data's fingerprint and the study's settings
    (``config(args)`` less ``NOT_DEFINING`` and ``drop``)."""
    return {
        "command": portable_command(cmd, run_dir, args.work_dir),
        "data": data_print,
        "settings": config(args, drop=(*NOT_DEFINING, *drop)),
    }


def differences(stored: Optional[Dict], wanted: Dict) -> List[str]:
    """The parts of a stored definition that differ from ``wanted`` (settings by name)."""
    if not stored:
        return ["no definition stored"]
    diff = [k for k in ("command", "data") if stored.get(k) != wanted[k]]
    old, new = stored.get("settings") or {}, wanted["settings"]
    diff += [
        f"--{k.replace('_', '-')}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)
    ]
    return diff


def finished(
    result_file: Path, wanted: Dict, force: bool = False, report_only: bool = False
) -> Optional[Dict]:
    """The stored result of a finished run of definition ``wanted`` (resume, or a report of
    stored runs with ``report_only``); None when the run is still to do or not to report (none
    stored, ``force``, or stored for another definition: WARNING naming what differs)."""
    result = None if force else read_json(result_file)
    if result is None:
        return None
    diff = differences(result.get("definition"), wanted)
    if diff:
        logging.getLogger("study").warning(
            "%s is another run's (differs in: %s): not %s",
            result_file, ", ".join(diff), "reported" if report_only else "reused",
        )  # fmt: skip
        return None
    logging.getLogger("study").info("%s %s", "reporting" if report_only else "reusing", result_file)
    return result


def claim(run_dir: Path, wanted: Dict):
    """Make ``run_dir`` this definition's: a folder left by another definition (or by a
    version that stored none) is moved aside to ``<run_dir>.superseded``, so that its logs and
    checkpoints are not taken for this run's; then ``definition.json`` records ``wanted``."""
    stamp = run_dir / "definition.json"
    if run_dir.exists() and any(run_dir.iterdir()) and read_json(stamp) != wanted:
        aside = run_dir.with_name(run_dir.name + ".superseded")
        shutil.rmtree(aside, ignore_errors=True)
        run_dir.rename(aside)
        logging.getLogger("study").warning(
            "%s held another definition's run: moved to %s", run_dir, aside
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(stamp, wanted)


def read_lines(path: Path, limit: Optional[int]) -> List[str]:
    if not path.exists():
        raise StudyError(f"data file missing: {path} (see ../shared/data/enfr/README.md)")
    with open(path, encoding="utf-8") as fh:
        lines = [line.rstrip("\n") for line in fh]
    if not lines:
        raise StudyError(f"data file is empty: {path}")
    return lines[:limit] if limit else lines


def config(args, drop: Sequence[str] = ()) -> Dict:
    """The parsed arguments as JSON values (paths as strings)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in drop}


def command_line(cmd: Sequence) -> str:
    return " ".join(map(str, cmd))


# ---------------------------------------------------------------------------
# fairseq-train: its command and its json log lines

# the four variants of the NMT and LM studies -> the plugin's arch prefix (<prefix>_tiny,
# <prefix>_lm_tiny)
VARIANTS = {
    "Post-LN": "postln_transformer",
    "Pre-LN": "preln_transformer",
    "ADMIN": "admin_transformer",
    "RealFormer+ADMIN": "realformer",
}


def train_head(data_bin: Path, task: str) -> List:
    return [fairseq_command("fairseq-train"), data_bin, "--user-dir", user_dir(), "--task", task]


def adam_inverse_sqrt(cfg) -> List[str]:
    """Adam, no clipping, inverse-sqrt schedule after a linear warm-up from 1e-7."""
    return [
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", str(cfg.lr), "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", str(cfg.warmup), "--warmup-init-lr", "1e-07",
    ]  # fmt: skip


def run_flags(valid_every: int, save_dir: Path, seed: int, log_interval: int = 10) -> List:
    """Validate on a fixed grid of updates only (and at the end), keep the last checkpoint
    without optimizer state, json log lines, one process on CPU."""
    return [
        "--validate-interval-updates", str(valid_every), "--validate-interval", "100000",
        "--save-interval", "100000", "--no-epoch-checkpoints", "--no-save-optimizer-state",
        "--save-dir", save_dir, "--log-format", "json", "--log-interval", str(log_interval),
        "--num-workers", "0", "--seed", str(seed), "--cpu",
    ]  # fmt: skip


def log_records(text: str, kind: str) -> List[Dict]:
    """The stats of fairseq's ``| valid |`` or ``| train_inner |`` lines (--log-format json)."""
    return [json.loads(m.group(1)) for m in re.finditer(rf"\| {kind} \| (\{{.*\}})", text)]


def valid_curve(text: str, *extra: str) -> List[Dict[str, float]]:
    """``[{"update": n, "loss": x, extra[0]: y, ...}]``, the last point of an update (fairseq
    may validate twice at the last one: interval and end of training)."""
    curve = {}
    for s in log_records(text, "valid"):
        update = int(float(s["valid_num_updates"]))
        curve[update] = {"update": update, "loss": float(s["valid_loss"])}
        curve[update].update((k, float(s[f"valid_{k}"])) for k in extra)
    return [curve[k] for k in sorted(curve)]


def train(cmd: Sequence, run_dir: Path, *extra: str, **fields):
    """Run ``fairseq-train`` logging to ``run_dir/train.log``; (``{**fields, "valid_curve"}``,
    seconds)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    curve = valid_curve(run(cmd, run_dir / "train.log"), *extra)
    if not curve:
        raise StudyError(f"{run_dir / 'train.log'}: no validation lines")
    return {**fields, "valid_curve": curve}, time.time() - start


def store(run_dir: Path, result: Dict, keep_checkpoints: bool = False) -> Dict:
    """Write the run's ``result.json`` (what ``finished`` reads) and drop its checkpoints and
    the ``error.json`` of an earlier try."""
    write_json(run_dir / "result.json", result)
    (run_dir / "error.json").unlink(missing_ok=True)
    for ckpt in [] if keep_checkpoints else run_dir.glob("checkpoint*.pt"):
        ckpt.unlink()  # keep the work dir small
    return result


# ---------------------------------------------------------------------------
# arguments of the training studies


def run_parser(doc: str, name: str, variants: Sequence[str], jobs: int, sources: Dict = None):
    """The arguments every training study has: data, folders, seeds, schedule, parallel runs;
    ``sources``: {flag: help} saying where a study's default comes from (replaces the help)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    sources = sources or {}

    def add(flag: str, text: str = None, **kwargs):
        p.add_argument(flag, help=sources.get(flag, text), **kwargs)

    add("--data", type=Path, default=DEFAULT_DATA, text="root of ../shared/data/enfr")
    add("--work-dir", type=Path, default=None, text=f"default: work_dirs/{name}")
    add("--out", type=Path, default=None, text="where the JSON/PNG/MD go")
    add("--quick", action="store_true", text="smoke check: small data, few updates")
    add("--variants", nargs="+", choices=list(variants), default=list(variants))
    add("--seeds", nargs="+", type=int, default=None)
    add("--max-update", type=int, default=None)
    add("--valid-every", type=int, default=None)
    add("--warmup", type=int, default=None)
    add("--lr", type=float, default=1e-3)
    add("--jobs", type=int, default=jobs, text="training runs in parallel (1 thread each)")
    add("--force", action="store_true", text="rerun runs that have a result.json")
    return p


def add_model_args(p, layers: int, width: int, ffn: int, heads: int):
    for flag, default in (("layers", layers), ("width", width), ("ffn", ffn), ("heads", heads)):
        p.add_argument(f"--{flag}", type=int, default=default)


def prepare(args, prepare_data: Callable[[], Path]):
    """Make the work and output folders, then the data; (data-bin folder, start time)."""
    args.work_dir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    logging.getLogger("study").info("work dir %s", args.work_dir)
    data_bin = prepare_data()
    logging.getLogger("study").info("data ready in %.0fs: %s", time.time() - t0, data_bin)
    return data_bin, t0


def run_seeds(
    run_one: Callable, data_bin, args, variants: Dict, report_only=False, *,
    command: Callable, drop: Sequence[str] = (),
):  # fmt: skip
    """Every seed of every variant, ``args.jobs`` at a time: ``run_one(label, seed, data_bin,
    run_dir, args)`` for the runs without a ``run_dir/result.json`` of this definition (its
    training ``command(label, seed, data_bin, run_dir, args)``, the data's fingerprint and the
    settings less ``drop``; all with --force, none with ``report_only``), whose result is
    stored there with its ``definition``; the results in that order. A run that raises does
    not stop the others: once all have ended, ``RunsFailed`` lists every failure."""
    data_print = data_fingerprint(data_bin)
    log = logging.getLogger("study")

    def one(label, seed):
        run_dir = args.work_dir / "runs" / f"{variants[label]}_seed{seed}"
        cmd = command(label, seed, data_bin, run_dir, args)
        wanted = definition(cmd, data_print, args, run_dir, drop)
        result = finished(
            run_dir / "result.json", wanted, args.force and not report_only, report_only
        )
        if result is None and not report_only:
            claim(run_dir, wanted)
            try:
                result = run_one(label, seed, data_bin, run_dir, args)
            except Exception as err:
                write_json(run_dir / "error.json", {"error": str(err), "definition": wanted})
                log.error("%s seed %d failed (retried on resume): %s", label, seed,
                          str(err).splitlines()[0])  # fmt: skip
                raise
            result = store(run_dir, {**result, "definition": wanted},
                           getattr(args, "keep_checkpoints", False))  # fmt: skip
        return result

    jobs = [(label, seed) for seed in args.seeds for label in args.variants]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one, *job) for job in jobs]
        outcomes = [(job, future.exception()) for job, future in zip(jobs, futures)]
    failures = [f"{label} seed {seed}: {str(err).splitlines()[0]}"
                for (label, seed), err in outcomes if err is not None]  # fmt: skip
    if failures:
        raise RunsFailed(
            f"{len(failures)} of {len(jobs)} runs failed (the others are stored; the same "
            "command trains the failed ones again):\n" + "\n".join(failures)
        )
    return [r for r in (future.result() for future in futures) if r is not None]


def report(args, name: str, t0: float, runs: List[Dict], summary: Dict, table: str, **fields):
    """Write ``{name}.json`` (``fields``, config without ``drop``, wall seconds, summary, runs)
    and the table as ``{name}.md`` into ``args.out``; print the table."""
    drop = fields.pop("drop", ())
    head = {"description": fields.pop("description"), "config": config(args, drop), **fields}
    wall = round(time.time() - t0, 1)
    out = {**head, "wall_seconds": wall, "summary": summary, "runs": runs}
    write_json(args.out / f"{name}.json", out)
    write_text_atomic(args.out / f"{name}.md", table + "\n")
    print(table)
    return out


def study_name(args, name: str) -> str:
    return f"{name}_quick" if args.quick else name


def parse_run_args(p, argv, name: str, max_update: int, valid_points: int, warmup: int):
    """Parse, then fill in what was not given: --quick is 1 seed, 20 updates, 2 validations."""
    args = p.parse_args(argv)
    quick = args.quick
    args.seeds = args.seeds or ([1] if quick else [1, 2, 3])
    args.max_update = args.max_update or (20 if quick else max_update)
    args.valid_every = args.valid_every or max(1, args.max_update // (2 if quick else valid_points))
    args.warmup = args.warmup or (5 if quick else warmup)
    args.work_dir = args.work_dir or REPO_ROOT / "work_dirs" / study_name(args, name)
    args.out = args.out or (args.work_dir if quick else REPO_ROOT / "docs" / "benchmarks")
    return args
