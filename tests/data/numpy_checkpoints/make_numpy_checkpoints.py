"""How tests/data/numpy_checkpoints was made: fairseq checkpoints that hold numpy objects, written
under numpy 1.x and under numpy 2 (not run by the tests).

fairseq pickles numpy objects into its checkpoints' ``extra_state``: ``--eval-bleu`` keeps its
n-gram counts as numpy arrays in the ``valid`` meters (``numpy.ndarray``, ``numpy.dtype`` and
``multiarray._reconstruct``), and GLUE's metric of MRPC and QQP (``--report-acc-and-f1``,
``--best-checkpoint-metric acc_and_f1``: a mean of numpy booleans) is a numpy float64 in
``val_loss`` and ``best`` (``multiarray.scalar``). numpy 1.x names those functions under ``numpy.core.multiarray``, numpy 2
under ``numpy._core.multiarray``. Two real ``fairseq-train`` runs of tiny RealFormer models
(word reversal with ``--eval-bleu``; sentence classification with ``--report-acc-and-f1``), on a
synthetic 10-word language, write ``translation_eval_bleu.numpy{1,2}.pt`` and
``sentence_prediction_acc_and_f1.numpy{1,2}.pt`` (each its ``checkpoint_best.pt``), and the dictionaries
a model needs to be built (``dict.*.txt``). Made with realformer-fairseq's venvs on Python 3.11,
torch 2.13.0+cpu, ve-fairseq 0.12.3: numpy 1.26.4 (``scripts/install.sh``) and numpy 2.4.6.

Run (once per venv): VENV/bin/python tests/data/numpy_checkpoints/make_numpy_checkpoints.py
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
USER_DIR = str(HERE.parents[2] / "realformer_fairseq")
WORDS = "the a red dog cat runs sees big small blue".split()
TINY = [
    "--encoder-layers", "1", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "16",
    "--encoder-attention-heads", "2",
]  # fmt: skip
COMMON = [
    "--user-dir", USER_DIR, "--optimizer", "adam", "--lr", "1e-3", "--max-update", "4",
    "--validate-interval-updates", "2", "--no-epoch-checkpoints", "--no-last-checkpoints",
    "--required-batch-size-multiple", "1", "--num-workers", "0", "--seed", "1", "--cpu",
    "--log-format", "simple",
]  # fmt: skip


def run(*cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([str(c) for c in cmd], check=True, env=env, stdout=subprocess.DEVNULL)


def sentences(rng, n):
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) for _ in range(n)]


def write(path: Path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def translation_eval_bleu(work: Path, out: Path):
    rng = random.Random(0)
    for split, n in (("train", 64), ("valid", 16)):
        src = sentences(rng, n)
        write(work / f"{split}.src", src)
        write(work / f"{split}.tgt", [" ".join(reversed(s.split())) for s in src])
    run(
        BIN / "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", work / "train", "--validpref", work / "valid", "--destdir", work / "bin",
        "--joined-dictionary", "--workers", "1",
    )  # fmt: skip
    run(
        BIN / "fairseq-train", work / "bin", "--task", "translation", "--arch", "realformer_tiny",
        *TINY, "--decoder-layers", "1", "--decoder-attention-heads", "2",
        "--share-all-embeddings", "--max-tokens", "400", "--save-dir", work / "ck_translation",
        "--eval-bleu", "--eval-bleu-args", json.dumps({"beam": 1, "max_len_b": 8}),
        "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric", *COMMON,
    )  # fmt: skip
    for lang in ("src", "tgt"):
        shutil.copy(work / "bin" / f"dict.{lang}.txt", out / f"dict.{lang}.txt")
    return work / "ck_translation" / "checkpoint_best.pt"


def sentence_prediction_acc_and_f1(work: Path, out: Path):
    rng = random.Random(1)
    for split, n in (("train", 64), ("valid", 16)):
        lines = sentences(rng, n)
        write(work / f"{split}.input0", lines)
        write(work / f"{split}.label", ["1" if "dog" in s.split() else "0" for s in lines])
    for part in ("input0", "label"):
        run(
            BIN / "fairseq-preprocess", "--only-source", "--trainpref", work / f"train.{part}",
            "--validpref", work / f"valid.{part}", "--destdir", work / "cls" / part,
            "--workers", "1",
        )  # fmt: skip
    run(
        BIN / "fairseq-train", work / "cls", "--task", "sentence_prediction",
        "--criterion", "sentence_prediction", "--num-classes", "2", "--max-positions", "16",
        "--init-token", "0", "--separator-token", "2", "--arch", "realformer_bert_tiny", *TINY,
        "--batch-size", "16", "--save-dir", work / "ck_cls", "--report-acc-and-f1",
        "--best-checkpoint-metric", "acc_and_f1", "--maximize-best-checkpoint-metric", *COMMON,
    )  # fmt: skip
    (out / "cls").mkdir(exist_ok=True)
    for part in ("input0", "label"):
        (out / "cls" / part).mkdir(exist_ok=True)
        shutil.copy(work / "cls" / part / "dict.txt", out / "cls" / part / "dict.txt")
    return work / "ck_cls" / "checkpoint_best.pt"


def main():
    major = numpy.__version__.split(".")[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, make in (
            ("translation_eval_bleu", translation_eval_bleu),
            ("sentence_prediction_acc_and_f1", sentence_prediction_acc_and_f1),
        ):
            target = HERE / f"{name}.numpy{major}.pt"
            shutil.copy(make(work, HERE), target)
            print(f"{target} ({target.stat().st_size} bytes, numpy {numpy.__version__})")


if __name__ == "__main__":
    main()
