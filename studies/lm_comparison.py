#!/usr/bin/env python
"""Small language-model comparison on Multi30k English: Post-LN, Pre-LN, ADMIN and
RealFormer+ADMIN decoder-only LMs (``--task language_modeling``).

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).

Every variant is a real ``fairseq-train --user-dir realformer_fairseq`` subprocess of
the plugin's ``*_lm_tiny`` architectures resized to the same model (default 6 layers,
width 64, ffn 256, 4 heads, tied input/output embeddings), trained for the same
number of updates with several seeds; held-out perplexity is ``fairseq-eval-lm`` on
Multi30k test_2016_flickr (English). Each run writes its ``result.json`` as soon as it
finishes, reused on a rerun only while its definition (command, data, settings) is the one asked
for, otherwise trained again (``studies.runs``: resumable run by run); the report (JSON,
Markdown table, PNG of the validation curves) is rewritten from the finished runs of that
definition.

Data: ``../shared/data/enfr/multi30k/{train,val,test_2016_flickr}.en``, lower-cased,
punctuation split off, word-level dictionary (``fairseq-preprocess --only-source
--thresholdsrc 2``).

usage (from the repository root):
    python -m studies.lm_comparison
    python -m studies.lm_comparison --quick        # smoke check
    python -m studies.lm_comparison --report-only  # report the runs finished so far

measured (2026-12, docs/benchmarks_lm.md): the 12 runs of 200 updates, 2 at a time, took 64
minutes of wall time (runs of 210-700 s) on the 2-core build machine at load average 15-17; it
had been sized as about 20 minutes from 1.7-2.5 updates/s measured at load 9.
"""

import re
from pathlib import Path
from typing import Dict, List

from realformer_fairseq.atomic_files import write_text_atomic

from . import plots, runs, tables
from .text import LM_PUNCTUATION, split_words

logger = runs.get_logger("lm_comparison")

# label -> arch (registered by the plugin)
VARIANTS = {label: f"{prefix}_lm_tiny" for label, prefix in runs.VARIANTS.items()}
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def prepare_data(data_root: Path, work: Path, limits: Dict[str, int]) -> Path:
    data_bin = work / "data-bin"
    if (data_bin / "test.bin").exists():
        return data_bin
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, name in SPLITS.items():
        lines = runs.read_lines(data_root / "multi30k" / f"{name}.en", limits.get(split))
        text = "".join(split_words(x, LM_PUNCTUATION) + "\n" for x in lines)
        write_text_atomic(raw / f"{split}.txt", text)
    runs.run(
        [
            runs.fairseq_command("fairseq-preprocess"), "--only-source",
            "--trainpref", raw / "train.txt", "--validpref", raw / "valid.txt",
            "--testpref", raw / "test.txt", "--destdir", data_bin,
            "--thresholdsrc", "2", "--workers", "1",
        ],
        work / "preprocess.log",
    )  # fmt: skip
    return data_bin


def model_flags(cfg) -> List[str]:
    return [
        "--decoder-layers", str(cfg.layers), "--decoder-embed-dim", str(cfg.width),
        "--decoder-ffn-embed-dim", str(cfg.ffn), "--decoder-attention-heads", str(cfg.heads),
        "--share-decoder-input-output-embed",
    ]  # fmt: skip


def train_command(data_bin: Path, save_dir: Path, arch: str, seed: int, cfg) -> List[str]:
    return [
        *runs.train_head(data_bin, "language_modeling"), "--arch", arch,
        *model_flags(cfg), "--dropout", "0.1",
        "--tokens-per-sample", str(cfg.tokens_per_sample), "--sample-break-mode", "complete",
        *runs.adam_inverse_sqrt(cfg), "--criterion", "cross_entropy",
        "--max-tokens", str(cfg.max_tokens), "--max-update", str(cfg.max_update),
        *runs.run_flags(cfg.valid_every, save_dir, seed),
    ]  # fmt: skip


def eval_command(data_bin: Path, checkpoint: Path, cfg) -> List[str]:
    return [
        runs.fairseq_command("fairseq-eval-lm"), data_bin,
        "--user-dir", runs.user_dir(), "--path", checkpoint, "--gen-subset", "test",
        "--tokens-per-sample", str(cfg.tokens_per_sample), "--sample-break-mode", "complete",
        "--max-tokens", "4096", "--num-workers", "0", "--cpu",
    ]  # fmt: skip


def parse_eval_lm(output: str) -> Dict[str, float]:
    match = re.search(r"Loss \(base 2\): ([\d.]+|nan|inf), Perplexity: ([\d.]+|nan|inf)", output)
    if not match:
        raise runs.StudyError(f"no perplexity in fairseq-eval-lm output:\n{output[-2000:]}")
    return {"loss_base2": float(match.group(1)), "ppl": 2 ** float(match.group(1))}


def run_command(label: str, seed: int, data_bin: Path, run_dir: Path, cfg) -> List[str]:
    """The training of one run (what, with the data and settings, defines it)."""
    return train_command(data_bin, run_dir, VARIANTS[label], seed, cfg)


def run_one(label: str, seed: int, data_bin: Path, run_dir: Path, cfg) -> Dict:
    arch = VARIANTS[label]
    cmd = run_command(label, seed, data_bin, run_dir, cfg)
    result, train_s = runs.train(cmd, run_dir, "ppl", variant=label, arch=arch, seed=seed)
    checkpoint = run_dir / "checkpoint_last.pt"
    test = parse_eval_lm(runs.run(eval_command(data_bin, checkpoint, cfg), run_dir / "eval_lm.log"))
    result["final_valid_ppl"] = result["valid_curve"][-1]["ppl"]
    result["test_ppl"] = test["ppl"]
    result["test_loss_base2"] = test["loss_base2"]
    result["train_seconds"] = round(train_s, 1)
    logger.info("%s seed %d: test ppl %.2f (train %.0fs)", label, seed, test["ppl"], train_s)
    return result


def parse_args(argv=None):
    p = runs.run_parser(__doc__, "lm_comparison", VARIANTS, jobs=2)
    p.add_argument("--tokens-per-sample", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=1024)
    runs.add_model_args(p, layers=6, width=64, ffn=256, heads=4)
    p.add_argument(
        "--report-only", action="store_true", help="write the report of the finished runs only"
    )
    args = runs.parse_run_args(p, argv, "lm_comparison", max_update=200, valid_points=5, warmup=50)
    args.limits = {"train": 2000, "valid": 100, "test": 100} if args.quick else {}
    return args


def main(argv=None):
    args = parse_args(argv)
    data_bin, t0 = runs.prepare(args, lambda: prepare_data(args.data, args.work_dir, args.limits))
    # with --report-only, the runs finished so far, nothing started
    results = runs.run_seeds(
        run_one, data_bin, args, VARIANTS, args.report_only, command=run_command
    )
    planned = len(args.seeds) * len(args.variants)
    if args.report_only:
        logger.info("report of %d of %d runs", len(results), planned)
    summary = tables.summarise(results, VARIANTS, ("test_ppl", "final_valid_ppl", "train_seconds"))
    header = [
        f"variant ({args.layers} layers, width {args.width})",
        f"held-out (test) ppl @ {args.max_update} upd", "valid ppl", "train s/run", "seeds",
    ]  # fmt: skip
    table = tables.summary_table(
        summary, header,
        [("test_ppl", "{mean:.2f} ± {std:.2f}"), ("final_valid_ppl", "{mean:.2f} ± {std:.2f}"),
         ("train_seconds", "{mean:.0f}"), ("test_ppl", "{n}")],
    )  # fmt: skip
    name = runs.study_name(args, "lm_comparison")
    train_example = train_command(data_bin, Path("SAVE_DIR"), "ARCH", 1, args)
    eval_example = eval_command(data_bin, Path("SAVE_DIR/checkpoint_last.pt"), args)
    report = runs.report(
        args, name, t0, results, summary, table,
        description="Multi30k English word-level LM, CPU, small scale; held-out perplexity "
        "(fairseq-eval-lm on test_2016_flickr) and valid perplexity curves per run",
        drop=("force", "report_only"), train_command_example=runs.command_line(train_example),
        eval_command_example=runs.command_line(eval_example),
        runs_finished=f"{len(results)} of {planned}",
    )  # fmt: skip
    title = f"Multi30k English LM, {args.layers} layers, width {args.width}, "
    title += f"{args.max_update} updates, seeds {args.seeds}"
    png = args.out / f"{name}.png"
    plots.plot_curves(results, VARIANTS, "ppl", png, title, "valid perplexity", log_y=True)
    return report


if __name__ == "__main__":
    runs.main_entry("studies.lm_comparison", main)
