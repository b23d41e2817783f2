"""What the training studies share: fairseq subprocesses with their logs, JSON results (written
atomically), fairseq's json log lines, resume by ``result.json``, common arguments, and the
report of a study.

The drivers (``studies.convergence``, ``studies.lm_comparison``, ``studies.paper_checks``) check
He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747) and Liu et al.,
"Understanding the Difficulty of Training Transformers" (arXiv 2004.08249). Seed means and
tables are in ``studies.tables``, plots in ``studies.plots``.
"""

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from realformer_fairseq.atomic_files import atomic_output, write_json_atomic, write_text_atomic

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path(
    os.environ.get("REALFORMER_SHARED_DATA", REPO_ROOT.parent / "shared" / "data" / "enfr")
)
BIN = Path(sys.executable).parent


class StudyError(RuntimeError):
    """A stage failed; the message names the stage and the command's output tail."""


def get_logger(name: str) -> logging.Logger:
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=logging.INFO,
        stream=sys.stdout,
    )
    return logging.getLogger(name)


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
        raise StudyError(
            f"command failed ({proc.returncode}), log {log_file}: "
            f"{' '.join(map(str, cmd))}\n{out[-3000:]}"
        )
    return out


def write_json(path: Path, obj):
    write_json_atomic(path, obj, default=str)


def read_json(path: Path) -> Optional[Dict]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def finished(result_file: Path, force: bool = False) -> Optional[Dict]:
    """The stored result of a finished run (resume); None when the run is still to do."""
    result = None if force else read_json(result_file)
    if result is not None:
        logging.getLogger("study").info("reusing %s", result_file)
    return result


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
    """Write the run's ``result.json`` (what ``finished`` reads) and drop its checkpoints."""
    write_json(run_dir / "result.json", result)
    for ckpt in [] if keep_checkpoints else run_dir.glob("checkpoint*.pt"):
        ckpt.unlink()  # keep the work dir small
    return result


# ---------------------------------------------------------------------------
# arguments of the training studies


def run_parser(doc: str, name: str, variants: Sequence[str], jobs: int):
    """The arguments every training study has: data, folders, seeds, schedule, parallel runs."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="root of ../shared/data/enfr")
    p.add_argument("--work-dir", type=Path, default=None, help=f"default: work_dirs/{name}")
    p.add_argument("--out", type=Path, default=None, help="where the JSON/PNG/MD go")
    p.add_argument("--quick", action="store_true", help="smoke check: small data, few updates")
    p.add_argument("--variants", nargs="+", choices=list(variants), default=list(variants))
    p.add_argument("--seeds", nargs="+", type=int, default=None)
    p.add_argument("--max-update", type=int, default=None)
    p.add_argument("--valid-every", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--jobs", type=int, default=jobs, help="training runs in parallel (1 thread each)"
    )
    p.add_argument("--force", action="store_true", help="rerun runs that have a result.json")
    return p


def add_model_args(p, layers: int, width: int, ffn: int, heads: int):
    for flag, default in (("layers", layers), ("width", width), ("ffn", ffn), ("heads", heads)):
        p.add_argument(f"--{flag}", type=int, default=default)


def prepare(args, prepare_data: Callable[[], Path]):
    """Make the work and output folders, then the data; (data-bin folder, start time)."""
    args.work_dir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    data_bin = prepare_data()
    logging.getLogger("study").info("data ready in %.0fs: %s", time.time() - t0, data_bin)
    return data_bin, t0


def run_seeds(run_one: Callable, data_bin: Path, args, variants: Dict, report_only=False):
    """Every seed of every variant, ``args.jobs`` at a time: ``run_one(label, seed, data_bin,
    run_dir, args)`` for the runs without a ``run_dir/result.json`` (all with --force, none
    with ``report_only``), whose result is stored there; the results in that order."""

    def one(label, seed):
        run_dir = args.work_dir / "runs" / f"{variants[label]}_seed{seed}"
        result = finished(run_dir / "result.json", args.force and not report_only)
        if result is None and not report_only:
            result = run_one(label, seed, data_bin, run_dir, args)
            store(run_dir, result, getattr(args, "keep_checkpoints", False))
        return result

    jobs = [(label, seed) for seed in args.seeds for label in args.variants]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda job: one(*job), jobs))
    return [r for r in results if r is not None]


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
