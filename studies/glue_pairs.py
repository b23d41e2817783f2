#!/usr/bin/env python
"""A GLUE-format sentence-pair task a small model can learn, and the study of Post-LN, Pre-LN and
RealFormer BERT on it (pre-trained with ``masked_lm``, fine-tuned and scored with
``examples/glue``).

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747): the paper's
headline is GLUE after BERT pre-training; this is the same path at CPU scale. The task is
"are these two sentences translations of each other?" in MRPC's file layout (``Quality``,
``#1 ID``, ``#2 ID``, ``#1 String``, ``#2 String``; test without labels): Tatoeba English-French
pairs (``../shared/data/enfr/tatoeba``): half aligned (label 1), a quarter with the French
sentence of another pair of the split, a quarter with the English sentence of another pair
(label 0). Telling the second sentence's language gives 75 %; matching the two, the rest.
The pre-training text is other Tatoeba pairs, each English line followed by its French line
(so that ``--sample-break-mode complete`` packs a pair into one block), Moses-tokenised as
``prepare.sh`` does (English rules) with a joint subword-nmt BPE.

Every variant and seed: ``fairseq-train --task masked_lm`` of the plugin's ``{variant}_bert_tiny``
(resized by ``--layers/--width/--ffn/--heads``), then ``examples/glue/finetune.sh --task MRPC``
and ``evaluate.sh``; each run writes ``result.json`` as soon as it finishes, reused on a rerun
only while its definition (command, data, settings) is the one asked for, otherwise trained
again (``studies.runs``: resumable run by run); the report (JSON, Markdown, PNG of the
fine-tuning dev accuracy) is rewritten from the finished runs.

usage (from the repository root):
    python -m studies.glue_pairs                # 3 variants x 3 seeds (docs/benchmarks/glue_pairs.md)
    python -m studies.glue_pairs --quick        # smoke check
    python -m studies.glue_pairs --report-only  # the report of the runs finished so far
"""

import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from realformer_fairseq.atomic_files import write_text_atomic

from . import plots, runs, tables

GLUE = runs.REPO_ROOT / "examples" / "glue"
# the pipelines' shared text tools (examples/common/pipeline.sh runs them so)
TEXT_TOOLS = ["-m", "realformer_pipelines.tools"]
logger = runs.get_logger("glue_pairs")

VARIANTS = {"Post-LN": "postln_bert_tiny", "Pre-LN": "preln_bert_tiny",
            "RealFormer": "realformer_bert_tiny"}  # fmt: skip
MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
MRPC_TEST_HEADER = "index\t#1 ID\t#2 ID\t#1 String\t#2 String"


# ---------------------------------------------------------------------------
# the task


MAX_WORDS = 12  # per sentence: a pair (BPE) stays within the 128 positions


def tatoeba_pairs(data_root: Path) -> List[Tuple[str, str]]:
    """Tatoeba's pairs of sentences of at most MAX_WORDS words, one pair per English sentence
    (its first French one), in file order (short to long)."""
    en = runs.read_lines(data_root / "tatoeba" / "fra-eng.no-tatoeba-test.en", None)
    fr = runs.read_lines(data_root / "tatoeba" / "fra-eng.no-tatoeba-test.fr", None)
    seen, pairs = set(), []
    for e, f in zip(en, fr):
        short = len(e.split()) <= MAX_WORDS and len(f.split()) <= MAX_WORDS
        if short and e not in seen and "\t" not in e + f:
            seen.add(e)
            pairs.append((e, f))
    return pairs


TASK_KINDS = ("translation", "translation-french", "same-language", "any-french")


def labelled_pairs(
    pairs: Sequence[Tuple[str, str]], rng: random.Random, kind: str = "translation"
):  # fmt: skip
    """(label, first sentence, second sentence), shuffled. ``translation`` (the study's task):
    English first; half aligned pairs (1, the French translation); a quarter given the French
    sentence of another pair of the split drawn at random (0: a French sentence, not the
    translation); a quarter given the English sentence of another pair (0: not even French). A
    model that only tells the second sentence's language scores 75 %; above that it matches the
    two sentences. ``translation-french``: every negative gets the French sentence of another
    pair, so that the second sentence alone says nothing (50 %). ``same-language``: "are the two
    sentences in the same language?", the first sentence English or French (alternately), the
    second one a sentence of another pair, in the same language (1, half of the pairs) or the
    other (0): either sentence alone says nothing (50 %), both together everything.
    ``any-french``: "is one of the two sentences French?", half two English sentences (0), a
    quarter a French first sentence, a quarter a French second one (1; the other sentence
    English, of another pair): either sentence alone scores at most 75 %, both together 100 %."""
    if kind not in TASK_KINDS:
        raise runs.StudyError(f"kind must be one of {', '.join(TASK_KINDS)}, got {kind!r}")
    n = len(pairs)
    if kind == "any-french":
        out = []
        for i, (e, f) in enumerate(pairs):
            other_english = e
            while other_english == e:
                other_english = pairs[rng.randrange(n)][0]
            if i < n // 2:
                out.append(("0", e, other_english))
            elif i % 2 == 0:
                out.append(("1", f, other_english))
            else:
                other_french = f
                while other_french == f:
                    other_french = pairs[rng.randrange(n)][1]
                out.append(("1", e, other_french))
        rng.shuffle(out)
        return out
    if kind == "same-language":
        out = []
        for i, pair in enumerate(pairs):
            first = i % 2  # English, French
            same = i < n // 2
            side = first if same else 1 - first
            other = pair[side]
            while other in pair:
                other = pairs[rng.randrange(n)][side]
            out.append(("1" if same else "0", pair[first], other))
        rng.shuffle(out)
        return out
    out = [("1", e, f) for e, f in pairs[: n // 2]]
    for i, (e, f) in enumerate(pairs[n // 2 :]):
        side = 1 if i % 2 == 0 or kind == "translation-french" else 0  # French, English
        other = (e, f)[side]
        while other in (e, f):
            other = pairs[rng.randrange(n)][side]
        out.append(("0", e, other))
    rng.shuffle(out)
    return out


def build_task(
    data_root: Path, out: Path, sizes: Dict[str, int], seed: int = 0, kind: str = "translation",
    blank_first: bool = False,
) -> Dict:  # fmt: skip
    """``out/MRPC/{train,dev,test}.tsv`` (MRPC's layout), ``out/test_labels.txt`` (the test
    labels the GLUE server would hold) and ``out/pretrain.raw`` (English and French lines of
    other pairs, for masked_lm); sizes: pretrain, train, dev, test (pairs); ``kind``: see
    labelled_pairs; ``blank_first``: every first sentence replaced by "." (the ablation of a
    model that sees only the second sentence)."""
    pairs = tatoeba_pairs(data_root)
    random.Random(seed).shuffle(pairs)
    need = sum(sizes.values())
    if need > len(pairs):
        raise runs.StudyError(f"{need} pairs asked, Tatoeba has {len(pairs)}")
    task_dir = out / "MRPC"
    task_dir.mkdir(parents=True, exist_ok=True)
    start = sizes["pretrain"]
    rng = random.Random(seed + 1)
    ids = iter(range(100000, 10**7))
    for split in ("train", "dev", "test"):
        rows = labelled_pairs(pairs[start : start + sizes[split]], rng, kind)
        if blank_first:
            rows = [(q, ".", f) for q, _, f in rows]
        start += sizes[split]
        if split == "test":
            lines = [MRPC_TEST_HEADER] + [
                f"{i}\t{next(ids)}\t{next(ids)}\t{e}\t{f}" for i, (_, e, f) in enumerate(rows)
            ]
            write_text_atomic(out / "test_labels.txt", "".join(r[0] + "\n" for r in rows))
        else:
            lines = [MRPC_HEADER] + [f"{q}\t{next(ids)}\t{next(ids)}\t{e}\t{f}" for q, e, f in rows]
        write_text_atomic(task_dir / f"{split}.tsv", "\n".join(lines) + "\n")
    pretrain = "".join(f"{e}\n{f}\n" for e, f in pairs[: sizes["pretrain"]])
    write_text_atomic(out / "pretrain.raw", pretrain)
    return {"glue_dir": out, "pairs_available": len(pairs), **sizes}


def prepare_pretraining(raw: Path, work: Path, bpe_merges: int) -> Tuple[Path, Path]:
    """Moses tokenisation of ``raw`` (realformer_pipelines.tools, English rules: what prepare.sh applies),
    subword-nmt BPE learned on it, and its masked_lm data-bin; (codes, data-bin)."""
    codes, data_bin = work / "bpecodes", work / "mlm-bin"
    if (data_bin / "valid.bin").exists():
        return codes, data_bin
    python = sys.executable
    tok, bpe = work / "pretrain.tok", work / "pretrain.bpe"
    work.mkdir(parents=True, exist_ok=True)
    runs.run([python, *TEXT_TOOLS, "tokenize", "--lang", "en", "--input", raw,
              "--output", tok], work / "tokenize.log")  # fmt: skip
    runs.run([python, *TEXT_TOOLS, "learn-bpe", "--symbols", bpe_merges, "--output", codes, tok],
             work / "learn_bpe.log")  # fmt: skip
    runs.run([python, *TEXT_TOOLS, "apply-bpe", "--codes", codes, "--input", tok, "--output", bpe],
             work / "apply_bpe.log")  # fmt: skip
    lines = bpe.read_text(encoding="utf-8").splitlines(True)
    held_out = max(200, len(lines) // 50) // 2 * 2  # whole pairs
    write_text_atomic(work / "mlm.train", "".join(lines[:-held_out]))
    write_text_atomic(work / "mlm.valid", "".join(lines[-held_out:]))
    runs.run(
        [
            runs.fairseq_command("fairseq-preprocess"), "--only-source", "--trainpref",
            work / "mlm.train", "--validpref", work / "mlm.valid", "--destdir", data_bin,
            "--workers", "1",
        ],
        work / "preprocess.log",
    )  # fmt: skip
    return codes, data_bin


def model_flags(cfg) -> List[str]:
    return [
        "--encoder-layers", str(cfg.layers), "--encoder-embed-dim", str(cfg.width),
        "--encoder-ffn-embed-dim", str(cfg.ffn), "--encoder-attention-heads", str(cfg.heads),
    ]  # fmt: skip


def pretrain_command(mlm_bin: Path, save_dir: Path, arch: str, seed: int, cfg, extra=()) -> List:
    """fairseq-train --task masked_lm of the tiny BERT: Adam, inverse-sqrt lr after a warm-up,
    blocks of whole sentences (a pair's two lines packed together); ``extra`` last."""
    return [
        *runs.train_head(mlm_bin, "masked_lm"), "--criterion", "masked_lm", "--arch", arch,
        *model_flags(cfg), "--tokens-per-sample", str(cfg.tokens_per_sample),
        "--sample-break-mode", "complete", *runs.adam_inverse_sqrt(cfg),
        "--batch-size", str(cfg.mlm_batch), "--max-update", str(cfg.mlm_updates),
        *runs.run_flags(cfg.mlm_updates, save_dir, seed, log_interval=50), *extra,
    ]  # fmt: skip


def glue_script(name: str, *args) -> List:
    return ["bash", GLUE / name, *args]


def prepare_command(glue_dir: Path, work: Path, codes: Path, mlm_bin: Path) -> List:
    return glue_script(
        "prepare.sh", "--task", "MRPC", "--glue-dir", glue_dir, "--bpe-codes", codes,
        "--dict", mlm_bin / "dict.txt", "--work-dir", work, "--workers", "1",
    )  # fmt: skip


def finetune_command(data_bin: Path, checkpoint: Path, save_dir: Path, seed: int, cfg) -> List:
    return glue_script(
        "finetune.sh", "--task", "MRPC", "--data-bin", data_bin, "--checkpoint", checkpoint,
        "--save-dir", save_dir, "--cpu", "--lr", cfg.ft_lr, "--batch-size", cfg.ft_batch,
        "--max-update", cfg.ft_updates, "--warmup", max(1, cfg.ft_updates // 16),
        "--seed", seed, "--log-interval", 25, "--",
        "--validate-interval-updates", cfg.ft_valid_every, "--num-workers", "0",
    )  # fmt: skip


def evaluate_command(data_bin: Path, save_dir: Path, out_dir: Path) -> List:
    return glue_script(
        "evaluate.sh", "--task", "MRPC", "--data-bin", data_bin, "--checkpoint-dir", save_dir,
        "--out-dir", out_dir, "--cpu",
    )  # fmt: skip


def test_accuracy(pred: Path, gold: Path) -> float:
    """Accuracy of evaluate.sh's test predictions against the labels build_task kept back."""
    p, g = pred.read_text().split(), gold.read_text().split()
    if len(p) != len(g):
        raise runs.StudyError(f"{pred}: {len(p)} predictions for {len(g)} test pairs")
    return 100.0 * sum(a == b for a, b in zip(p, g)) / len(g)


# ---------------------------------------------------------------------------
# the study


def run_commands(label: str, seed: int, data: Dict, run_dir: Path, cfg) -> Tuple[List, List]:
    """The pre-training and the fine-tuning of one run."""
    checkpoint = run_dir / "mlm" / "checkpoint_last.pt"
    return (
        pretrain_command(data["mlm_bin"], run_dir / "mlm", VARIANTS[label], seed, cfg),
        finetune_command(data["data_bin"], checkpoint, run_dir / "ft", seed, cfg),
    )


def run_command(label: str, seed: int, data: Dict, run_dir: Path, cfg) -> List:
    """Both trainings of one run as one line (what, with the data and settings, defines it)."""
    pretrain, finetune = run_commands(label, seed, data, run_dir, cfg)
    return [*pretrain, "&&", *finetune]


def run_one(label: str, seed: int, data: Dict, run_dir: Path, cfg) -> Dict:
    arch = VARIANTS[label]
    run_dir.mkdir(parents=True, exist_ok=True)
    pretrain, finetune = run_commands(label, seed, data, run_dir, cfg)
    t0 = time.time()
    mlm, _ = runs.train(pretrain, run_dir / "mlm", variant=label)
    t1 = time.time()
    out = runs.run(finetune, run_dir / "finetune.log")
    curve = runs.valid_curve(out, "accuracy")
    t2 = time.time()
    runs.run(evaluate_command(data["data_bin"], run_dir / "ft", run_dir / "eval"),
             run_dir / "evaluate.log")  # fmt: skip
    results = json.loads((run_dir / "eval" / "results.dev.json").read_text())
    dev = results["subsets"]["valid"]
    test = test_accuracy(Path(results["test_predictions"]["test"]), data["test_labels"])
    shutil.rmtree(run_dir / "mlm", ignore_errors=True)  # checkpoints: the work dir stays small
    for ckpt in (run_dir / "ft").glob("*.pt"):
        ckpt.unlink()
    result = {
        "variant": label, "arch": arch, "seed": seed,
        "mlm_valid_loss": mlm["valid_curve"][-1]["loss"],
        "dev_accuracy": dev["metrics"]["accuracy"], "dev_f1": dev["metrics"]["f1"],
        "majority_accuracy": dev["majority_class"]["metrics"]["accuracy"],
        "test_accuracy": test, "checkpoint": results["checkpoint"],
        "valid_curve": curve, "mlm_seconds": round(t1 - t0, 1),
        "finetune_seconds": round(t2 - t1, 1), "seconds": round(time.time() - t0, 1),
    }  # fmt: skip
    logger.info("%s seed %d: dev accuracy %.1f (majority %.1f), test %.1f, %.0f s", label, seed,
                result["dev_accuracy"], result["majority_accuracy"], test, result["seconds"])  # fmt: skip
    return result


def prepare_data(args) -> Dict:
    sizes = {"pretrain": args.pretrain_pairs, "train": args.train_pairs, "dev": args.dev_pairs,
             "test": args.test_pairs}  # fmt: skip
    task = args.work_dir / "task"
    if not (task / "pretrain.raw").exists():
        build_task(args.data, task, sizes)
    codes, mlm_bin = prepare_pretraining(task / "pretrain.raw", args.work_dir, args.bpe_merges)
    glue_work = args.work_dir / "glue_prepare"
    runs.run(prepare_command(task, glue_work, codes, mlm_bin), args.work_dir / "prepare.log")
    return {"mlm_bin": mlm_bin, "data_bin": glue_work / "data-bin",
            "test_labels": task / "test_labels.txt"}  # fmt: skip


def parse_args(argv=None):
    p = runs.run_parser(__doc__, "glue_pairs", VARIANTS, jobs=1)
    runs.add_model_args(p, layers=2, width=64, ffn=128, heads=2)
    p.add_argument("--tokens-per-sample", type=int, default=128)
    p.add_argument("--mlm-batch", type=int, default=16)
    p.add_argument("--mlm-updates", type=int, default=None)
    p.add_argument("--ft-updates", type=int, default=None)
    p.add_argument("--ft-lr", type=float, default=5e-4)
    p.add_argument("--ft-batch", type=int, default=16)
    p.add_argument("--bpe-merges", type=int, default=2000)
    p.add_argument("--pretrain-pairs", type=int, default=None)
    p.add_argument("--train-pairs", type=int, default=None)
    p.add_argument("--dev-pairs", type=int, default=500)
    p.add_argument("--test-pairs", type=int, default=500)
    p.add_argument("--report-only", action="store_true")
    p.set_defaults(lr=3e-3)  # masked_lm: the tiny model learns little at fairseq's 1e-3 here
    args = runs.parse_run_args(p, argv, "glue_pairs", max_update=0, valid_points=1, warmup=100)
    quick = args.quick
    args.mlm_updates = args.mlm_updates or (40 if quick else 3000)
    args.ft_updates = args.ft_updates or (20 if quick else 1500)
    args.ft_valid_every = max(1, args.ft_updates // (2 if quick else 10))
    args.pretrain_pairs = args.pretrain_pairs or (2000 if quick else 40000)
    args.train_pairs = args.train_pairs or (400 if quick else 4000)
    if quick:
        args.dev_pairs, args.test_pairs = min(args.dev_pairs, 100), min(args.test_pairs, 100)
    args.max_update = args.mlm_updates  # what runs.run_flags / adam_inverse_sqrt read
    return args


def main(argv=None):
    args = parse_args(argv)
    data, t0 = runs.prepare(args, lambda: prepare_data(args))
    results = runs.run_seeds(run_one, data, args, VARIANTS, args.report_only, command=run_command)
    planned = len(args.seeds) * len(args.variants)
    keys = ("dev_accuracy", "test_accuracy", "majority_accuracy", "mlm_valid_loss", "seconds")
    summary = tables.summarise(results, VARIANTS, keys)
    header = [
        f"variant ({args.layers} layers, width {args.width})", "dev accuracy", "test accuracy",
        "majority class (dev)", "MLM valid loss", "s/run", "seeds",
    ]  # fmt: skip
    table = tables.summary_table(
        summary, header,
        [("dev_accuracy", "{mean:.1f} ± {std:.1f}"), ("test_accuracy", "{mean:.1f} ± {std:.1f}"),
         ("majority_accuracy", "{mean:.1f}"), ("mlm_valid_loss", "{mean:.3f} ± {std:.3f}"),
         ("seconds", "{mean:.0f}"), ("dev_accuracy", "{n}")],
    )  # fmt: skip
    name = runs.study_name(args, "glue_pairs")
    example = pretrain_command(data["mlm_bin"], Path("SAVE_DIR"), "ARCH", 1, args)
    report = runs.report(
        args, name, t0, results, summary, table,
        description="Tatoeba translation-pair detection in MRPC's layout; masked_lm pre-training "
        "then examples/glue finetune.sh / evaluate.sh, CPU, small scale",
        drop=("force", "report_only"), pretrain_command_example=runs.command_line(example),
        finetune_command_example=runs.command_line(
            finetune_command(data["data_bin"], Path("CKPT"), Path("SAVE_DIR"), 1, args)),
        runs_finished=f"{len(results)} of {planned}",
    )  # fmt: skip
    title = f"translation pairs (MRPC layout), {args.layers} layers, width {args.width}, "
    title += f"MLM {args.mlm_updates} + fine-tuning {args.ft_updates} updates"
    plots.plot_curves(results, VARIANTS, "accuracy", args.out / f"{name}.png", title,
                      "dev accuracy (fine-tuning)")  # fmt: skip
    return report


if __name__ == "__main__":
    runs.main_entry("studies.glue_pairs", main)
