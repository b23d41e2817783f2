"""End-to-end helpers for tests: small real data, fairseq-preprocess, -train,
-generate, all in a temporary directory, with the plugin passed by --user-dir.

fairseq's own ``tests/utils.py`` is not in its wheel; these are ours.
"""

import atexit
import contextlib
import importlib
import io
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import realformer_fairseq

REPO_ROOT = Path(__file__).resolve().parents[1]
USER_DIR = str(Path(realformer_fairseq.__file__).resolve().parent)
SHARED_DATA = Path(
    os.environ.get("REALFORMER_SHARED_DATA", REPO_ROOT.parent / "shared" / "data" / "enfr")
)
BIN = Path(sys.executable).parent


def shared_data(*parts: str) -> Path:
    """A file under ../shared/data/enfr (read-only); tests never download."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"shared data missing: {path} (see ../shared/data/enfr/README.md)")
    return path


def realformer_tf_fixture(*parts: str) -> Path:
    """A file of the TensorFlow RealFormer fixture, ../shared/data/realformer_tf (beside the
    En-Fr data; read-only): a checkpoint written by Google's realformer.py and its outputs."""
    path = SHARED_DATA.parent.joinpath("realformer_tf", *parts)
    if not (path.exists() or path.with_name(path.name + ".index").exists()):
        raise FileNotFoundError(f"shared data missing: {path} (see its README.md)")
    return path


def import_realformer_tf_fixture(out: Path, vocab: Optional[Path] = None) -> Path:
    """``realformer-import-tf`` of the TF RealFormer fixture (with another ``vocab.txt`` of the
    same 71 tokens if given) into the model folder ``out`` (model.pt, dict.txt, vocab.txt:
    WordPiece, BERT's pair layout, 64 positions); ``out``."""
    proc = subprocess.run(
        [Path(sys.executable).parent / "realformer-import-tf", "--tf-checkpoint",
         realformer_tf_fixture("model.ckpt"), "--bert-config", realformer_tf_fixture("bert_config.json"),
         "--vocab", vocab or realformer_tf_fixture("vocab.txt"), "--out", out],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@contextlib.contextmanager
def pipeline_imports(pipeline: str):
    """Within it, a module imported by a sibling's name is ``examples/<pipeline>/``'s, as when
    that pipeline's script runs: its folder first on ``sys.path`` (taken off again after), and a
    module of the same name from another pipeline folder (every pipeline has a ``recipes.py``)
    replaced in ``sys.modules``. For the import of a pipeline module and for the calls of its
    functions that import siblings when they run."""
    folder = (REPO_ROOT / "examples" / pipeline).resolve()
    for sibling in folder.glob("*.py"):
        cached = sys.modules.get(sibling.stem)
        if cached is not None and Path(getattr(cached, "__file__", "") or "").parent != folder:
            del sys.modules[sibling.stem]
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))


def pipeline_module(pipeline: str, name: str):
    """``examples/<pipeline>/<name>.py`` imported as that pipeline's scripts import it
    (:func:`pipeline_imports`). The pipelines' shared Python is the installed
    ``realformer_pipelines`` package, imported as usual."""
    with pipeline_imports(pipeline):
        return importlib.import_module(name)


# ---------------------------------------------------------------- parallel workers

# one folder per test run that all its pytest-xdist workers see (conftest.py makes it in the
# process that starts the run, before the workers, and removes it at the end of the run)
RUN_DIR_VARIABLE = "REALFORMER_TEST_RUN_DIR"
_built: Dict[str, Path] = {}


def run_dir() -> Path:
    """The test run's shared folder (a folder of this process's own outside pytest)."""
    if not os.environ.get(RUN_DIR_VARIABLE):
        folder = tempfile.mkdtemp(prefix="realformer-tests-")
        atexit.register(shutil.rmtree, folder, True)
        os.environ[RUN_DIR_VARIABLE] = folder
    return Path(os.environ[RUN_DIR_VARIABLE])


def built_once(name: str, build: Callable[[Path], None]) -> Path:
    """``run_dir()/name``, filled by ``build(folder)`` once per test run whichever worker asks
    first (pytest-xdist's file-lock pattern: the others wait for it, then find it built); a
    build that fails leaves nothing behind, so the next caller builds again."""
    from filelock import FileLock

    if name not in _built:
        folder = run_dir() / name
        with FileLock(str(folder) + ".lock"):
            if not (folder / ".built").exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True)
                try:
                    build(folder)
                except BaseException:
                    shutil.rmtree(folder, ignore_errors=True)
                    raise
                (folder / ".built").touch()
        _built[name] = folder
    return _built[name]


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it): for anything a test starts that
    listens, never a fixed port, so that parallel tests (and other users) do not collide."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fairseq_command(name: str) -> str:
    """Path of a fairseq console script in this environment."""
    exe = BIN / name
    return str(exe) if exe.exists() else name


def run(
    cmd: Sequence[str],
    cwd: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    timeout: int = 900,
):
    """Run a command; on failure raise with the tail of its output."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("MKL_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stdout[-4000:]}"
        )
    return proc.stdout


# a command's environment with this entry runs it as a process of its own, never forked by the
# suite's fork server: for commands run twice and compared for determinism (forked commands share
# the server's hash seed; tests/fork_server.py)
FRESH_PROCESS = {"REALFORMER_TEST_FORK_SERVER": "0"}


# ------------------------------------------------------------------ the pipelines' scripts

# an error line of any of the project's programs: "PROG: error: MESSAGE"
ERROR_LINE = re.compile(r"^[\w.-]+: error: ")


def pipeline_env(**extra: str) -> Dict[str, str]:
    """The environment a test runs a pipeline script in: this interpreter as ``PYTHON`` (its
    environment's console scripts first on ``PATH``), one thread."""
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")  # fmt: skip
    env.update(extra)
    return env


def pipeline_bash(pipeline: str, script: str, *args, cwd=None, timeout: int = 900,
                  env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:  # fmt: skip
    """``bash examples/PIPELINE/SCRIPT ARGS`` as a user runs it (:func:`pipeline_env`, or
    ``env``), stdout and stderr captured as text."""
    return subprocess.run(
        ["bash", str(REPO_ROOT / "examples" / pipeline / script), *map(str, args)], cwd=cwd,
        env=env or pipeline_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        timeout=timeout,
    )  # fmt: skip


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """``proc``, which exited 0 (else the tail of its stderr)."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def run_main(main, *argv) -> subprocess.CompletedProcess:
    """``main(ARGV)`` in this process, as its command's process would end: the exit status of
    its SystemExit (one error line on stderr), or 1 and the traceback of any other exception."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            status = main([str(a) for a in argv])
        except SystemExit as stop:
            status = stop.code
        except Exception:
            traceback.print_exc(file=sys.stderr)
            status = 1
    return subprocess.CompletedProcess(argv, status, stdout.getvalue(), stderr.getvalue())


def one_error_line(proc: subprocess.CompletedProcess, *parts, prog: str) -> str:
    """The project's one-line error: exit status 1, no traceback, exactly one error line of any
    program (``NAME: error: ...``), which is ``prog``'s and holds each of ``parts``. Returns its
    message (after ``PROG: error: ``)."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if ERROR_LINE.match(line)]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith(f"{prog}: error: "), errors[0]
    for part in parts:
        assert str(part) in errors[0], errors[0]
    return errors[0][len(f"{prog}: error: ") :]


# the largest subset any test takes; cleaning (ratio 1.5) keeps 2295 of the first 2400 train pairs
MULTI30K_PREPARED_LINES = {"train": 2400, "valid": 200, "test": 100}
_multi30k_work: Optional[Path] = None


def prepared_multi30k() -> Path:
    """scripts/prepare_multi30k.sh (the project's one Multi30k preparation: lower-cased,
    Moses-tokenised, joint BPE of 3000 merges) on the first lines of each split, once per
    test run (:func:`built_once`: the parallel workers share it); returns its work folder
    (BPE'd text in ``final/``)."""
    global _multi30k_work
    if _multi30k_work is None:
        limits = MULTI30K_PREPARED_LINES

        def prepare(work: Path):
            run(
                [
                    "bash", REPO_ROOT / "scripts" / "prepare_multi30k.sh",
                    "--work-dir", work, "--data", SHARED_DATA, "--bpe-size", "3000",
                    "--workers", "1", "--max-train-lines", limits["train"],
                    "--max-valid-lines", limits["valid"], "--max-test-lines", limits["test"],
                    "--until", "clean",
                ],
                env={"PYTHON": sys.executable},
            )  # fmt: skip

        _multi30k_work = built_once("multi30k", prepare)
    return _multi30k_work


def make_multi30k_subset(
    out_dir: Path, n_train: int = 2000, n_valid: int = 200, n_test: int = 100
) -> Path:
    """The first pairs of each split of the prepared Multi30k en-fr (see prepared_multi30k)
    as out_dir/{train,valid,test}.{en,fr}."""
    final = prepared_multi30k() / "final"
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        for lang in ("en", "fr"):
            lines = (final / f"{split}.{lang}").read_text(encoding="utf-8").splitlines(True)
            if len(lines) < n:
                raise ValueError(f"{final / f'{split}.{lang}'} has {len(lines)} lines, not {n}")
            (out_dir / f"{split}.{lang}").write_text("".join(lines[:n]), encoding="utf-8")
    return out_dir


def fairseq_preprocess(args: Sequence) -> None:
    """``fairseq-preprocess ARGS...``, run in this process as fairseq's own tests run it (their
    tests/utils.py calls fairseq_cli.preprocess.main): the same data-bin, without starting a
    Python that imports fairseq again (about 4 CPU seconds each). For the data of tests; the
    tests of the command itself (the README's blocks, the pipelines) run the command."""
    import logging

    root = logging.getLogger()
    guard = None
    if not root.handlers:  # fairseq_cli.preprocess calls logging.basicConfig when imported
        guard = logging.NullHandler()
        root.addHandler(guard)
    try:
        from fairseq import options
        from fairseq_cli import preprocess as fairseq_cli_preprocess
    finally:
        if guard is not None:
            root.removeHandler(guard)
    logger = logging.getLogger("fairseq_cli.preprocess")
    handlers = logger.handlers[:]
    try:
        parser = options.get_preprocessing_parser()
        fairseq_cli_preprocess.main(parser.parse_args([str(a) for a in args]))
    finally:  # main() adds a FileHandler (DESTDIR/preprocess.log) to its logger on every call
        for handler in logger.handlers:
            if handler not in handlers:
                handler.close()
        logger.handlers[:] = handlers


def preprocess(
    raw_dir: Path, data_bin: Path, src: str = "en", tgt: str = "fr", extra: Sequence[str] = ()
):
    """fairseq-preprocess with a joined dictionary."""
    fairseq_preprocess(
        [
            "--source-lang",
            src,
            "--target-lang",
            tgt,
            "--trainpref",
            raw_dir / "train",
            "--validpref",
            raw_dir / "valid",
            "--testpref",
            raw_dir / "test",
            "--destdir",
            data_bin,
            "--joined-dictionary",
            "--workers",
            "1",
            *extra,
        ]
    )
    return data_bin


def translation_train_args(
    data_bin: Path,
    save_dir: Path,
    arch: str = "realformer_tiny",
    max_update: Optional[int] = None,
    extra: Sequence[str] = (),
    epoch_checkpoints: bool = False,
) -> List[str]:
    """fairseq-train arguments (without the command) for a tiny translation run
    with --user-dir realformer_fairseq on CPU; ``extra`` comes last and wins."""
    args = [
        str(data_bin),
        "--user-dir", USER_DIR,
        "--task", "translation",
        "--arch", arch,
        "--share-all-embeddings",
        "--optimizer", "adam",
        "--adam-betas", "(0.9, 0.98)",
        "--lr", "1e-3",
        "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "10",
        "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", "0.1",
        "--max-tokens", "2000",
        "--save-dir", str(save_dir),
        "--log-format", "simple",
        "--log-interval", "1",
        "--num-workers", "0",
        "--seed", "1",
        "--cpu",
    ]  # fmt: skip
    if max_update is not None:
        args += ["--max-update", str(max_update)]
    if not epoch_checkpoints:
        args.append("--no-epoch-checkpoints")
    return args + [str(a) for a in extra]


def train_translation(
    data_bin: Path,
    save_dir: Path,
    arch: str = "realformer_tiny",
    max_update: int = 20,
    extra: Sequence[str] = (),
    env: Optional[Dict[str, str]] = None,
) -> str:
    """A few updates of fairseq-train --user-dir realformer_fairseq on CPU."""
    return run(
        [
            fairseq_command("fairseq-train"),
            *translation_train_args(data_bin, save_dir, arch, max_update, extra),
        ],
        env=env,
    )


def generate(
    data_bin: Path, checkpoint: Path, extra: Sequence[str] = ("--beam", "5", "--lenpen", "0.8")
) -> str:
    return run(
        [
            fairseq_command("fairseq-generate"),
            data_bin,
            "--user-dir",
            USER_DIR,
            "--path",
            checkpoint,
            "--gen-subset",
            "test",
            "--batch-size",
            "32",
            # fairseq 0.12's batch_by_size drops a last batch that is not a
            # multiple of this (default 8): sentences would silently go missing
            "--required-batch-size-multiple",
            "1",
            "--remove-bpe",
            "--num-workers",
            "0",
            "--cpu",
            *extra,
        ]
    )


def parse_bleu(generate_output: str) -> float:
    match = re.search(r"BLEU4? = ([\d.]+)", generate_output)
    if not match:
        raise AssertionError(f"no BLEU line in fairseq-generate output:\n{generate_output[-2000:]}")
    return float(match.group(1))


def parse_train_losses(train_output: str) -> List[float]:
    """Per-update training losses from fairseq's simple log format."""
    return [float(m) for m in re.findall(r"train_inner \| .*? loss=([\d.]+),", train_output)]


def parse_valid_loss(train_output: str) -> List[float]:
    return [float(m) for m in re.findall(r"valid on 'valid' subset \| loss ([\d.]+)", train_output)]


def toy_dictionary(n_symbols: int = 40):
    """A fairseq Dictionary with ``n_symbols`` made-up words (plus specials)."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(n_symbols):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def build_translation_model(
    arch: str = "realformer_tiny", model: str = "realformer_transformer", **overrides
):
    """Build a registered translation model in-process (no data on disk)."""
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    dictionary = toy_dictionary()
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    args = argparse.Namespace(arch=arch, _name=arch, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task), dictionary


# dropout off: as build_translation_model overrides, and as fairseq command-line flags
NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
NO_DROPOUT_FLAGS = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]


def build_fairseq_tiny_transformer(**overrides):
    """fairseq's own ``transformer`` (model and arch) at the width of the plugin's
    ``*_transformer_tiny`` (64 wide, FFN 128, 2 heads); ``overrides`` and the return
    value as for :func:`build_translation_model`."""
    return build_translation_model(
        "transformer",
        model="transformer",
        encoder_embed_dim=64,
        encoder_ffn_embed_dim=128,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        **overrides,
    )


def random_batch(
    dictionary, bsz: int = 3, src_len: int = 7, tgt_len: int = 6, seed: int = 0, pad_rows=(1,)
):
    """Random source/target tokens; rows in ``pad_rows`` are shorter (left-padded
    source, right-padded target, as fairseq's collater makes them)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    low = dictionary.nspecial
    src = torch.randint(low, len(dictionary), (bsz, src_len), generator=g)
    tgt = torch.randint(low, len(dictionary), (bsz, tgt_len), generator=g)
    src[:, -1] = dictionary.eos()
    tgt[:, 0] = dictionary.eos()  # prev_output_tokens start with EOS
    for row in pad_rows:
        src[row, : src_len // 2] = dictionary.pad()
        tgt[row, tgt_len - 2 :] = dictionary.pad()
    src_lengths = src.ne(dictionary.pad()).sum(1)
    return src, src_lengths, tgt


def beam_decode_with_reordering(model, dictionary, src, src_lengths, beam: int, steps: int):
    """Incremental decoding as SequenceGenerator drives it: the encoder output expanded to
    ``bsz * beam`` hypotheses, random hypothesis reorderings within each sentence from the
    second step on (``reorder_incremental_state_scripting``), random next tokens. Returns the
    last-position logits of every step, stacked ``(bsz*beam, steps, vocab)``, and the full
    forward of the same final prefixes, to be compared."""
    import torch

    bsz = src.size(0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths)
        expand = torch.arange(bsz).view(-1, 1).repeat(1, beam).view(-1)
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, expand)
        tokens = torch.full((bsz * beam, 1), dictionary.eos(), dtype=torch.long)
        incremental_state = {}
        step_logits = []
        for step in range(steps):
            if step > 0:
                perm = torch.stack([torch.randperm(beam, generator=g) for _ in range(bsz)])
                new_order = (perm + torch.arange(bsz).view(-1, 1) * beam).view(-1)
                model.decoder.reorder_incremental_state_scripting(incremental_state, new_order)
                tokens = tokens.index_select(0, new_order)
                step_logits = [x.index_select(0, new_order) for x in step_logits]
            logits, _ = model.decoder(
                tokens, encoder_out=encoder_out, incremental_state=incremental_state
            )
            step_logits.append(logits[:, -1])
            nxt = torch.randint(dictionary.nspecial, len(dictionary), (bsz * beam, 1), generator=g)
            tokens = torch.cat([tokens, nxt], dim=1)
        full_logits, _ = model.decoder(tokens[:, :steps], encoder_out=encoder_out)
    return torch.stack(step_logits, dim=1), full_logits


# RealFormer's BERT sizes (He et al. 2020, Table 1): size -> (layers, width, heads, ffn)
PAPER_BERT_SIZES = {
    "tiny": (2, 64, 2, 128),  # not the paper's: for tests on CPU
    "small": (4, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
    "xlarge": (36, 1536, 24, 6144),
}

MLM_TOKENS_PER_SAMPLE = 64

MLM_COMMON = [
    "--optimizer",
    "adam",
    "--adam-betas",
    "(0.9, 0.98)",
    "--lr-scheduler",
    "inverse_sqrt",
    "--batch-size",
    "32",
    "--log-format",
    "simple",
    "--log-interval",
    "10",
    "--num-workers",
    "0",
    "--seed",
    "1",
    "--cpu",
    "--no-epoch-checkpoints",
]


def fairseq_train(data_bin: Path, *args) -> str:
    """fairseq-train on ``data_bin`` with the plugin (``--user-dir``) and ``args``; its output."""
    return run([fairseq_command("fairseq-train"), data_bin, "--user-dir", USER_DIR, *args])


# fairseq-train's task arguments for the data of make_language_id_data (English 0 /
# French 1): sentence_prediction with the classification head "language_id"
LANGUAGE_ID_TASK = [
    "--task",
    "sentence_prediction",
    "--criterion",
    "sentence_prediction",
    "--num-classes",
    "2",
    "--classification-head-name",
    "language_id",
    "--max-positions",
    str(MLM_TOKENS_PER_SAMPLE),
    "--init-token",
    "0",
    "--separator-token",
    "2",
]


def train_masked_lm(
    data_bin: Path, save_dir: Path, arch="realformer_bert_tiny", max_update=60, extra=()
):
    return fairseq_train(
        data_bin,
        "--task",
        "masked_lm",
        "--criterion",
        "masked_lm",
        "--arch",
        arch,
        "--tokens-per-sample",
        str(MLM_TOKENS_PER_SAMPLE),
        # blocks of whole sentences up to --tokens-per-sample, as in RoBERTa pre-training
        "--sample-break-mode",
        "complete",
        "--lr",
        "1e-3",
        "--warmup-updates",
        "20",
        "--max-update",
        str(max_update),
        "--validate-interval-updates",
        str(max(max_update // 3, 1)),
        "--validate-interval",
        "1000",  # epochs: validate on the update interval (and at the end) only
        "--save-dir",
        save_dir,
        *MLM_COMMON,
        *extra,
    )


def write_lines(path: Path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def multi30k_lines(lang: str, split: str, start: int, n: int):
    with open(shared_data("multi30k", f"{split}.{lang}"), encoding="utf-8") as fh:
        lines = [line.strip().lower() for line in fh]
    return lines[start : start + n]


def make_mlm_data(root: Path, n_train: int = 2000, n_valid: int = 200) -> Path:
    """English side of Multi30k, fairseq-preprocess --only-source for masked_lm."""
    raw = root / "mlm_raw"
    raw.mkdir(parents=True, exist_ok=True)
    write_lines(raw / "train.txt", multi30k_lines("en", "train", 0, n_train))
    write_lines(raw / "valid.txt", multi30k_lines("en", "val", 0, n_valid))
    data_bin = root / "mlm_bin"
    fairseq_preprocess(
        [
            "--only-source",
            "--task",
            "masked_lm",
            "--trainpref",
            raw / "train.txt",
            "--validpref",
            raw / "valid.txt",
            "--destdir",
            data_bin,
            "--thresholdsrc",
            "2",
            "--workers",
            "1",
        ]
    )
    return data_bin


def make_language_id_data(root: Path, srcdict: Path, n_train: int = 500, n_valid: int = 100):
    """ "Is this line English (0) or French (1)?": Multi30k lines (English and French
    taken from different sentence pairs, so no line has its translation in the set),
    in fairseq's sentence_prediction layout (input0/, label/)."""
    raw = root / "cls_raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, src, start, n in (("train", "train", 5000, n_train), ("valid", "val", 200, n_valid)):
        rows = [(line, "0") for line in multi30k_lines("en", src, start, n)]
        rows += [(line, "1") for line in multi30k_lines("fr", src, start + n, n)]
        random.Random(0).shuffle(rows)
        write_lines(raw / f"{split}.input0", [r[0] for r in rows])
        write_lines(raw / f"{split}.label", [r[1] for r in rows])
    data_bin = root / "cls_bin"
    for part, extra in (("input0", ["--srcdict", srcdict]), ("label", [])):
        fairseq_preprocess(
            [
                "--only-source",
                "--trainpref",
                raw / f"train.{part}",
                "--validpref",
                raw / f"valid.{part}",
                "--destdir",
                data_bin / part,
                "--workers",
                "1",
                *extra,
            ]
        )
    return data_bin
