#!/usr/bin/env python
"""The paper's pre-training comparison at CPU scale: Post-LN, Pre-LN and RealFormer BERT
pre-trained by the ``examples/pretrain_bert`` pipeline on the same text with the same masking,
masked-token accuracy on held-out documents against updates.

He, Ravula, Kanagal, Ainslie, "RealFormer: Transformer Likes Residual Attention" (arXiv
2012.11747) compares the three by held-out masked-token accuracy after BERT pre-training, and
claims RealFormer reaches the baselines' accuracy in about half the steps.

Everything goes through the pipeline's own code: ``pretrain_tools.py`` (split, vocabulary,
instances, data-bin; ``evaluate`` with one fixed masking seed, so every checkpoint of every run is
scored on the same masked positions) and ``recipes.py command`` (the fairseq-train arguments
pretrain.sh runs: BERT's recipe), with the scale-downs this CPU needs passed as overrides and
recorded in the JSON: the ``tiny`` size (the largest registered size this CPU trains in about 90
minutes for 9 runs: ``small`` is ~100 times the work per token), 32 sequences per update instead
of 256, a shorter schedule and a larger peak learning rate.

Text: English of ``../shared/data/enfr`` (newstest2012-2014, Multi30k train, Tatoeba) in
pseudo-documents of 20 consecutive lines (the files have no document boundaries; news lines are
consecutive sentences of articles, the others unrelated sentences).

Each run (variant, seed) trains, is scored and writes ``result.json``, reused on a rerun only
while its definition (command, data, settings) is the one asked for, otherwise trained again
(``studies.runs``; an interrupted run of the same definition resumes from its
``checkpoint_last.pt``); the report (JSON, Markdown, PNG) is rewritten from the finished runs,
with the load average seen while they ran.

usage (from the repository root):
    python -m studies.pretrain_comparison                # docs/benchmarks/pretrain_comparison.*
    python -m studies.pretrain_comparison --quick        # smoke check
    python -m studies.pretrain_comparison --report-only  # the report of the runs finished so far
"""

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from realformer_fairseq.atomic_files import write_text_atomic

from . import plots, runs, tables

PIPELINE = runs.REPO_ROOT / "examples" / "pretrain_bert"
TOOLS = PIPELINE / "pretrain_tools.py"
RECIPES = PIPELINE / "recipes.py"
logger = runs.get_logger("pretrain_comparison")

VARIANTS = {"Post-LN": "postln", "Pre-LN": "preln", "RealFormer": "realformer"}
SOURCES = [
    "newstest2013/newstest2012.en",
    "newstest2013/newstest2013.en",
    "newstest2014/newstest2014-fren.en",
    "multi30k/train.en",
    "tatoeba/fra-eng.no-tatoeba-test.en",
]
DOC_LINES = 20


def make_corpus(data_root: Path, out: Path, limit: int = 0) -> Path:
    """Pseudo-documents of DOC_LINES consecutive lines of each source (blank line between)."""
    if out.exists():
        return out
    lines_out = []
    for name in SOURCES:
        lines = runs.read_lines(data_root / name, limit or None)
        for start in range(0, len(lines), DOC_LINES):
            lines_out += [line for line in lines[start : start + DOC_LINES] if line.strip()] + [""]
    write_text_atomic(out, "\n".join(lines_out) + "\n")
    return out


def prepare_data(args) -> Path:
    work = args.work_dir / "prepare"
    data_bin = work / "data-bin"
    if (data_bin / "prepare.json").exists():
        return data_bin
    work.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(args.data, work / "corpus.txt", 400 if args.quick else 0)
    tool = [sys.executable, TOOLS]
    runs.run(tool + ["split", "--corpus", corpus, "--train", work / "train.txt",
                     "--valid", work / "valid.txt", "--stats", work / "split.json",
                     "--valid-docs", str(args.valid_docs)], work / "split.log")  # fmt: skip
    runs.run(tool + ["vocab", "--train", work / "train.txt", "--vocab-size", str(args.vocab_size),
                     "--out", work / "vocab.txt"], work / "vocab.log")  # fmt: skip
    for split in ("train", "valid"):
        runs.run(tool + ["instances", "--input", work / f"{split}.txt",
                         "--output", work / f"{split}.wp", "--stats", work / f"{split}.json",
                         "--vocab", work / "vocab.txt", "--max-seq-len", str(args.seq_len)],
                 work / f"instances_{split}.log")  # fmt: skip
    runs.run(tool + ["finish-data-bin", "--vocab", work / "vocab.txt",
                     "--write-dict", work / "dict.txt"], work / "dict.log")  # fmt: skip
    tmp = work / "data-bin.tmp"
    runs.run([runs.fairseq_command("fairseq-preprocess"), "--only-source", "--srcdict",
              work / "dict.txt", "--trainpref", work / "train.wp", "--validpref",
              work / "valid.wp", "--destdir", tmp, "--workers", "1"],
             work / "preprocess.log")  # fmt: skip
    runs.run(tool + ["finish-data-bin", "--vocab", work / "vocab.txt", "--data-bin", tmp,
                     "--split-stats", work / "split.json", "--train-stats", work / "train.json",
                     "--valid-stats", work / "valid.json"], work / "finish.log")  # fmt: skip
    tmp.rename(data_bin)
    return data_bin


def recipe_args(args, data_bin: Path, variant: str) -> List[str]:
    """The fairseq-train arguments of ``pretrain.sh --cpu`` (recipes.py command), one CPU."""
    out = subprocess.run(
        [sys.executable, RECIPES, "command", "--variant", variant, "--size", args.size,
         "--data-bin", str(data_bin), "--seq-len", str(args.seq_len), "--world", "1",
         "--batch-size", str(args.batch_size), "--max-update", str(args.max_update),
         "--warmup", str(args.warmup), "--cpu"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    line = next(x for x in out.splitlines() if x.startswith("PHASE1_ARGS=("))
    return shlex.split(line[len("PHASE1_ARGS=(") : -1])


def overrides(args) -> Dict[str, str]:
    """The study's departures from the recipe (replacing the recipe's values)."""
    return {
        "--update-freq": "1",  # 32 sequences an update, not 256
        "--lr": str(args.lr),
        "--save-interval-updates": str(args.save_every),
    }


def train_command(args, data_bin: Path, variant: str, seed: int, save_dir: Path) -> List:
    flags = recipe_args(args, data_bin, variant)
    for flag, value in overrides(args).items():
        flags[flags.index(flag) + 1] = value
    return [
        runs.fairseq_command("fairseq-train"), data_bin, "--user-dir", runs.user_dir(), *flags,
        "--seed", str(seed), "--save-dir", save_dir, "--cpu", "--num-workers", "0",
        "--log-format", "json", "--log-interval", "50",
    ]  # fmt: skip


def evaluate_command(args, data_bin: Path, save_dir: Path) -> List:
    return [sys.executable, TOOLS, "evaluate", "--data-bin", data_bin,
            "--checkpoint-dir", save_dir, "--cpu", "--seed", str(args.mask_seed)]  # fmt: skip


def run_command(label: str, seed: int, data_bin: Path, run_dir: Path, args) -> List:
    """The training of one run (what, with the data and settings, defines it)."""
    return train_command(args, data_bin, VARIANTS[label], seed, run_dir)


def run_one(label: str, seed: int, data_bin: Path, run_dir: Path, args) -> Dict:
    variant = VARIANTS[label]
    run_dir.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    start = time.time()
    runs.run(run_command(label, seed, data_bin, run_dir, args), run_dir / "train.log")
    train_s = time.time() - start
    runs.run(evaluate_command(args, data_bin, run_dir), run_dir / "evaluate.log")
    report = json.loads((run_dir / "mlm_accuracy.json").read_text(encoding="utf-8"))
    curve = [
        {"update": c["update"], "accuracy": c["accuracy"], "loss_base2": c["loss_base2"]}
        for c in report["runs"][0]["checkpoints"]
    ]
    result = {
        "variant": label,
        "arch": f"{variant}_bert_{args.size}",
        "seed": seed,
        "valid_curve": curve,
        "final_accuracy": curve[-1]["accuracy"],
        "final_loss_base2": curve[-1]["loss_base2"],
        "fingerprint": report["fingerprint"],
        "n_masked": report["n_masked"],
        "frequency_baseline": report["frequency_baseline"],
        "train_seconds": round(train_s, 1),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
    }
    logger.info(
        "%s seed %d: accuracy %.2f %% at %d updates (train %.0f s, load %.1f -> %.1f)",
        label, seed, result["final_accuracy"], curve[-1]["update"], train_s, load_start[0],
        result["load_average_end"][0],
    )  # fmt: skip
    return result


def updates_to_reach(curve: List[Dict], level: float):
    for point in curve:
        if point["accuracy"] >= level:
            return point["update"]
    return None


def parse_args(argv=None):
    p = runs.run_parser(__doc__, "pretrain_comparison", VARIANTS, jobs=2)
    p.add_argument("--size", default="tiny")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--valid-docs", type=int, default=200)
    p.add_argument("--save-every", type=int, default=None)
    p.add_argument("--mask-seed", type=int, default=12345)
    p.add_argument("--report-only", action="store_true")
    args = runs.parse_run_args(p, argv, "pretrain_comparison", max_update=2000, valid_points=8,
                               warmup=200)  # fmt: skip
    args.save_every = args.save_every or args.valid_every
    if args.quick:
        args.valid_docs = 20
    return args


def main(argv=None):
    args = parse_args(argv)
    data_bin, t0 = runs.prepare(args, lambda: prepare_data(args))
    results = runs.run_seeds(
        run_one, data_bin, args, VARIANTS, args.report_only, command=run_command
    )
    planned = len(args.seeds) * len(args.variants)
    fingerprints = sorted({r["fingerprint"] for r in results})
    summary = tables.summarise(results, VARIANTS, ("final_accuracy", "final_loss_base2",
                                                    "train_seconds"))  # fmt: skip
    # "half the steps": the updates each run needs to reach the Post-LN seeds' mean final accuracy
    post = [r["final_accuracy"] for r in results if r["variant"] == "Post-LN"]
    target = statistics.fmean(post) if post else None
    for r in results:
        r["updates_to_postln_final"] = updates_to_reach(r["valid_curve"], target) if post else None
    baseline = results[0]["frequency_baseline"]["accuracy"] if results else None
    header = [f"variant ({args.size}, {args.max_update} updates of {args.batch_size} sequences)",
              "held-out masked-token accuracy (%)", "loss (bits)", "updates to Post-LN's final",
              "train s/run", "seeds"]  # fmt: skip
    rows = []
    for label, s in summary.items():
        reach = [r["updates_to_postln_final"] for r in results if r["variant"] == label]
        rows.append([
            label, "{mean:.2f} ± {std:.2f}".format(**s["final_accuracy"]),
            "{mean:.3f} ± {std:.3f}".format(**s["final_loss_base2"]),
            ", ".join("never" if u is None else str(u) for u in reach),
            "{mean:.0f}".format(**s["train_seconds"]), s["final_accuracy"]["n"],
        ])  # fmt: skip
    table = tables.md_table(header, rows)
    if baseline is not None:
        table += (
            f"\n\nfrequency baseline (the most frequent WordPiece everywhere): {baseline:.2f} %"
        )
    name = runs.study_name(args, "pretrain_comparison")
    example = train_command(args, data_bin, "realformer", 1, Path("SAVE_DIR"))
    loads = [r["load_average_start"][0] for r in results] + [
        r["load_average_end"][0] for r in results
    ]
    report = runs.report(
        args, name, t0, results, summary, table,
        description="BERT pre-training (examples/pretrain_bert) of Post-LN / Pre-LN / RealFormer "
        "at the tiny size on CPU; held-out masked-token accuracy with one masking seed for every "
        "checkpoint of every run",
        drop=("force", "report_only"), command=f"{sys.executable} -m studies.pretrain_comparison",
        train_command_example=runs.command_line(example),
        evaluate_command_example=runs.command_line(evaluate_command(args, data_bin, Path("SAVE_DIR"))),
        recipe_overrides=overrides(args), runs_finished=f"{len(results)} of {planned}",
        masked_positions_fingerprints=fingerprints,
        load_average={"min": min(loads), "max": max(loads)} if loads else None,
        postln_final_mean=target,
    )  # fmt: skip
    title = (f"held-out masked-token accuracy, {args.size} BERT, {args.batch_size} seq/update, "
             f"seeds {args.seeds}")  # fmt: skip
    plots.plot_curves(results, VARIANTS, "accuracy", args.out / f"{name}.png", title,
                      "masked-token accuracy (%)")  # fmt: skip
    return report


if __name__ == "__main__":
    runs.main_entry("studies.pretrain_comparison", main)
