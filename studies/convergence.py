#!/usr/bin/env python
"""Convergence study on Multi30k En-Fr: Post-LN, Pre-LN, ADMIN and RealFormer+ADMIN.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).

Every variant is trained by a real ``fairseq-train --user-dir realformer_fairseq``
subprocess at the same size, for the same number of updates, with several seeds;
the script records the validation loss curve of each run and the test BLEU
(``examples/wmt14_en_fr/evaluate.sh``: beam search, Moses-detokenised, SacreBLEU against
the lower-cased raw references), then writes a JSON file, a Markdown table and a PNG
plot of the curves.

Data: ``../shared/data/enfr/multi30k`` (train 29k, val 1014, test_2016_flickr 1000),
prepared by ``scripts/prepare_multi30k.sh`` (lower-cased, Moses-tokenised, joint BPE)
once under ``--work-dir`` and reused.

usage (from the repository root; measured run times in docs/benchmarks.md):
    python -m studies.convergence                # the full study (33 min wall on 2 shared cores)
    python -m studies.convergence --quick        # smoke check (41 s on a quiet machine)
    python -m studies.convergence --max-update 600 --seeds 1 2 3 --jobs 2 --out docs/benchmarks
"""

import json
import time
from pathlib import Path
from typing import Dict, List

from . import plots, runs, tables

PREPARE_MULTI30K = runs.REPO_ROOT / "scripts" / "prepare_multi30k.sh"
EVALUATE = runs.REPO_ROOT / "examples" / "wmt14_en_fr" / "evaluate.sh"
logger = runs.get_logger("convergence")

VARIANTS = runs.VARIANTS  # label -> arch prefix (<prefix>_tiny)


# ---------------------------------------------------------------------------
# stage 1: data


def prep_dir(work: Path) -> Path:
    """prepare_multi30k.sh's --work-dir (its intermediate and BPE'd files)."""
    return work / "prep"


def prepared_text(work: Path, split: str, lang: str) -> Path:
    """The BPE'd text of one split, where prepare_multi30k.sh leaves it (WORK/final/)."""
    return prep_dir(work) / "final" / f"{split}.{lang}"


def prepare_data(data_root: Path, work: Path, bpe_merges: int, limits: Dict[str, int]) -> Path:
    """scripts/prepare_multi30k.sh into ``work/data-bin``; its stages are skipped on a re-run
    with the same settings and redone when they change."""
    data_bin = work / "data-bin"
    cmd = ["bash", PREPARE_MULTI30K, "--work-dir", prep_dir(work), "--dest", data_bin]
    cmd += ["--data", data_root, "--bpe-size", bpe_merges, "--workers", "2"]
    for split, lines in limits.items():
        cmd += [f"--max-{split}-lines", lines]
    runs.run(cmd, work / "prepare.log", threads=2)
    return data_bin


# ---------------------------------------------------------------------------
# stage 2: training


def model_flags(layers: int, width: int, ffn: int, heads: int) -> List[str]:
    return [
        "--encoder-layers", str(layers), "--decoder-layers", str(layers),
        "--encoder-embed-dim", str(width), "--decoder-embed-dim", str(width),
        "--encoder-ffn-embed-dim", str(ffn), "--decoder-ffn-embed-dim", str(ffn),
        "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads),
    ]  # fmt: skip


def train_command(data_bin: Path, save_dir: Path, arch: str, seed: int, cfg) -> List[str]:
    return [
        *runs.train_head(data_bin, "translation"), "--arch", arch,
        *model_flags(cfg.layers, cfg.width, cfg.ffn, cfg.heads),
        "--share-all-embeddings", "--dropout", "0.1", *runs.adam_inverse_sqrt(cfg),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", str(cfg.max_tokens), "--max-update", str(cfg.max_update),
        *runs.run_flags(cfg.valid_every, save_dir, seed),
    ]  # fmt: skip


# ---------------------------------------------------------------------------
# stage 3: generation + SacreBLEU


def sacrebleu_on_test_set(data_bin: Path, checkpoint: Path, out_dir: Path, cfg) -> float:
    """SacreBLEU of beam search on the test set, by the pipeline's evaluate.sh."""
    results = out_dir / "evaluate.json"
    runs.run(
        [
            "bash", EVALUATE, "--data-bin", data_bin, "--checkpoint", checkpoint,
            "--beam", "5", "--lenpen", "1.0", "--batch-size", str(cfg.gen_batch), "--cpu",
            "--out-dir", out_dir / "eval", "--results", results,
            "--", "--max-len-a", "1.2", "--max-len-b", "10", "--num-workers", "0",
        ],
        out_dir / "evaluate.log",
    )  # fmt: skip
    return float(json.loads(results.read_text(encoding="utf-8"))["sacrebleu"]["score"])


def run_command(label: str, seed: int, data_bin: Path, run_dir: Path, cfg) -> List[str]:
    """The training of one run (what, with the data and settings, defines it)."""
    return train_command(data_bin, run_dir, f"{VARIANTS[label]}_tiny", seed, cfg)


def run_one(label: str, seed: int, data_bin: Path, run_dir: Path, cfg) -> Dict:
    arch = f"{VARIANTS[label]}_tiny"
    cmd = run_command(label, seed, data_bin, run_dir, cfg)
    result, train_s = runs.train(cmd, run_dir, "nll_loss", variant=label, arch=arch, seed=seed)
    start = time.time()
    bleu = sacrebleu_on_test_set(data_bin, run_dir / "checkpoint_last.pt", run_dir, cfg)
    result.update(
        final_valid_loss=result["valid_curve"][-1]["loss"], test_bleu=bleu,
        train_seconds=round(train_s, 1), generate_seconds=round(time.time() - start, 1),
    )  # fmt: skip
    logger.info(
        "%s seed %d: valid loss %.3f, test BLEU %.2f (train %.0fs)",
        label, seed, result["final_valid_loss"], bleu, train_s,
    )  # fmt: skip
    return result


def parse_args(argv=None):
    p = runs.run_parser(__doc__, "convergence", VARIANTS, jobs=3)
    p.add_argument("--max-tokens", type=int, default=1024)
    runs.add_model_args(p, layers=6, width=128, ffn=256, heads=4)
    p.add_argument("--bpe-merges", type=int, default=None)
    p.add_argument("--gen-batch", type=int, default=200)
    p.add_argument(
        "--keep-checkpoints", action="store_true", help="keep checkpoint_last.pt of each run"
    )
    args = runs.parse_run_args(p, argv, "convergence", max_update=160, valid_points=8, warmup=40)
    args.bpe_merges = args.bpe_merges or (500 if args.quick else 4000)
    args.limits = {"train": 2000, "valid": 100, "test": 50} if args.quick else {"valid": 400}
    return args


def main(argv=None):
    args = parse_args(argv)
    data_bin, t0 = runs.prepare(
        args, lambda: prepare_data(args.data, args.work_dir, args.bpe_merges, args.limits)
    )
    results = runs.run_seeds(run_one, data_bin, args, VARIANTS, command=run_command)
    summary = tables.summarise(
        results, VARIANTS, ("final_valid_loss", "test_bleu", "train_seconds")
    )
    table = tables.summary_table(
        summary,
        [f"variant ({args.layers}L-{args.layers}L, width {args.width})",
         f"valid loss @ {args.max_update} upd", "test BLEU", "train s/run"],
        [("final_valid_loss", "{mean:.3f} ± {std:.3f}"), ("test_bleu", "{mean:.2f} ± {std:.2f}"),
         ("train_seconds", "{mean:.0f}")],
    )  # fmt: skip
    name = runs.study_name(args, "convergence")
    example = train_command(data_bin, Path("SAVE_DIR"), "ARCH", 1, args)
    runs.report(
        args, name, t0, results, summary, table,
        description="Multi30k En-Fr, CPU, small scale; valid loss curves and test BLEU "
        "(SacreBLEU, lower-cased refs, test_2016_flickr) per run",
        drop=("force", "keep_checkpoints"), train_command_example=runs.command_line(example),
    )  # fmt: skip
    title = f"Multi30k En-Fr valid loss, {args.layers}L-{args.layers}L d={args.width}, "
    title += f"{len(args.seeds)} seed(s), CPU"
    ylabel = "valid loss (label-smoothed CE, base 2)"
    plots.plot_curves(results, VARIANTS, "loss", args.out / f"{name}.png", title, ylabel)
    logger.info("done in %.0fs; results in %s", time.time() - t0, args.out)


if __name__ == "__main__":
    runs.main_entry("studies.convergence", main)
