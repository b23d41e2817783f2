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
finishes and is skipped on a rerun (resumable run by run); the report (JSON, Markdown
table, PNG of the validation curves) is rewritten from all finished runs.

Data: ``../shared/data/enfr/multi30k/{train,val,test_2016_flickr}.en``, lower-cased,
punctuation split off, word-level dictionary (``fairseq-preprocess --only-source
--thresholdsrc 2``).

usage (about 20 minutes on 2 shared CPU cores, 12 runs of 200 updates, 2 at a time):
    python scripts/lm_comparison.py
    python scripts/lm_comparison.py --quick      # smoke check (~1-2 min)
    python scripts/lm_comparison.py --report-only  # report the runs finished so far

measured: 12 runs took about 10 minutes each, 2 at a time, on the 2-core build machine at
load average 15-17 (shared with other jobs; sized from 1.7-2.5 updates/s measured at load 9).
"""

import argparse
import json
import logging
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convergence import (  # noqa: E402  (scripts/ is not a package)
    DEFAULT_DATA,
    REPO_ROOT,
    StudyError,
    fairseq_command,
    mean_std,
    read_lines,
    run,
    user_dir,
    write_atomic,
)

logging.basicConfig(
    format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
    datefmt="%Y-%m-%d %H:%M:%S",
    level=logging.INFO,
    stream=sys.stdout,
)
logger = logging.getLogger("lm_comparison")

# label -> arch (registered by the plugin)
VARIANTS = {
    "Post-LN": "postln_transformer_lm_tiny",
    "Pre-LN": "preln_transformer_lm_tiny",
    "ADMIN": "admin_transformer_lm_tiny",
    "RealFormer+ADMIN": "realformer_lm_tiny",
}
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def tokenize(line: str) -> str:
    return " ".join(re.sub(r"([.,!?;:\"()])", r" \1 ", line.lower()).split())


def prepare_data(data_root: Path, work: Path, limits: Dict[str, int]) -> Path:
    data_bin = work / "data-bin"
    if (data_bin / "test.bin").exists():
        return data_bin
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, name in SPLITS.items():
        lines = read_lines(data_root / "multi30k" / f"{name}.en", limits.get(split))
        write_atomic(raw / f"{split}.txt", "".join(tokenize(x) + "\n" for x in lines))
    run(
        [
            fairseq_command("fairseq-preprocess"), "--only-source",
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
        fairseq_command("fairseq-train"), data_bin,
        "--user-dir", user_dir(), "--task", "language_modeling", "--arch", arch,
        *model_flags(cfg), "--dropout", "0.1",
        "--tokens-per-sample", str(cfg.tokens_per_sample), "--sample-break-mode", "complete",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", str(cfg.lr), "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", str(cfg.warmup), "--warmup-init-lr", "1e-07",
        "--criterion", "cross_entropy",
        "--max-tokens", str(cfg.max_tokens), "--max-update", str(cfg.max_update),
        "--validate-interval-updates", str(cfg.valid_every), "--validate-interval", "100000",
        "--save-interval", "100000", "--no-epoch-checkpoints", "--no-save-optimizer-state",
        "--save-dir", save_dir, "--log-format", "json", "--log-interval", "10",
        "--num-workers", "0", "--seed", str(seed), "--cpu",
    ]  # fmt: skip


def eval_command(data_bin: Path, checkpoint: Path, cfg) -> List[str]:
    return [
        fairseq_command("fairseq-eval-lm"), data_bin,
        "--user-dir", user_dir(), "--path", checkpoint, "--gen-subset", "test",
        "--tokens-per-sample", str(cfg.tokens_per_sample), "--sample-break-mode", "complete",
        "--max-tokens", "4096", "--num-workers", "0", "--cpu",
    ]  # fmt: skip


def parse_valid_curve(train_log: str) -> List[Dict[str, float]]:
    """``[{"update": n, "loss": x, "ppl": y}]`` (loss in base 2) from json log lines."""
    curve = {}
    for match in re.finditer(r"\| valid \| (\{.*\})", train_log):
        stats = json.loads(match.group(1))
        update = int(float(stats["valid_num_updates"]))
        curve[update] = {
            "update": update,
            "loss": float(stats["valid_loss"]),
            "ppl": float(stats["valid_ppl"]),
        }
    return [curve[k] for k in sorted(curve)]


def parse_eval_lm(output: str) -> Dict[str, float]:
    match = re.search(r"Loss \(base 2\): ([\d.]+|nan|inf), Perplexity: ([\d.]+|nan|inf)", output)
    if not match:
        raise StudyError(f"no perplexity in fairseq-eval-lm output:\n{output[-2000:]}")
    return {"loss_base2": float(match.group(1)), "ppl": 2 ** float(match.group(1))}


def run_one(label: str, seed: int, data_bin: Path, work: Path, cfg) -> Dict:
    arch = VARIANTS[label]
    run_dir = work / "runs" / f"{arch}_seed{seed}"
    result_file = run_dir / "result.json"
    if result_file.exists() and not cfg.force:
        logger.info("reusing %s", result_file)
        return json.loads(result_file.read_text(encoding="utf-8"))
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    log = run(train_command(data_bin, run_dir, arch, seed, cfg), run_dir / "train.log")
    train_s = time.time() - start
    curve = parse_valid_curve(log)
    if not curve:
        raise StudyError(f"{run_dir / 'train.log'}: no validation lines")
    test = parse_eval_lm(
        run(eval_command(data_bin, run_dir / "checkpoint_last.pt", cfg), run_dir / "eval_lm.log")
    )
    result = {
        "variant": label,
        "arch": arch,
        "seed": seed,
        "valid_curve": curve,
        "final_valid_ppl": curve[-1]["ppl"],
        "test_ppl": test["ppl"],
        "test_loss_base2": test["loss_base2"],
        "train_seconds": round(train_s, 1),
    }
    write_atomic(result_file, json.dumps(result, indent=1))
    for ckpt in run_dir.glob("checkpoint*.pt"):
        ckpt.unlink()
    logger.info("%s seed %d: test ppl %.2f (train %.0fs)", label, seed, test["ppl"], train_s)
    return result


def summarise(results: List[Dict]) -> Dict[str, Dict]:
    summary = {}
    for label in VARIANTS:
        runs = [r for r in results if r["variant"] == label]
        if runs:
            summary[label] = {
                key: mean_std([r[key] for r in runs])
                for key in ("test_ppl", "final_valid_ppl", "train_seconds")
            }
    return summary


def markdown_table(summary: Dict[str, Dict], cfg) -> str:
    rows = [
        f"| variant ({cfg.layers} layers, width {cfg.width}) | held-out (test) ppl "
        f"@ {cfg.max_update} upd | valid ppl | train s/run | seeds |",
        "|---|---|---|---|---|",
    ]
    for label, s in summary.items():
        test, valid, secs = s["test_ppl"], s["final_valid_ppl"], s["train_seconds"]
        rows.append(
            f"| {label} | {test['mean']:.2f} ± {test['std']:.2f} | "
            f"{valid['mean']:.2f} ± {valid['std']:.2f} | {secs['mean']:.0f} | {test['n']} |"
        )
    return "\n".join(rows)


def plot_curves(results: List[Dict], png: Path, title: str):
    import os
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in VARIANTS:
        runs = [r for r in results if r["variant"] == label]
        if not runs:
            continue
        updates = sorted(set.intersection(*[{p["update"] for p in r["valid_curve"]} for r in runs]))
        per_update = [
            [next(p["ppl"] for p in r["valid_curve"] if p["update"] == u) for r in runs]
            for u in updates
        ]
        ax.plot(
            updates,
            [statistics.fmean(v) for v in per_update],
            marker="o",
            ms=3,
            label=f"{label} (n={len(runs)})",
        )
        ax.fill_between(
            updates, [min(v) for v in per_update], [max(v) for v in per_update], alpha=0.2
        )
    ax.set_yscale("log")
    ax.set_xlabel("updates")
    ax.set_ylabel("valid perplexity")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = png.with_name(png.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, png)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="root of ../shared/data/enfr")
    p.add_argument("--work-dir", type=Path, default=None, help="default: work_dirs/lm_comparison")
    p.add_argument("--out", type=Path, default=None, help="where the JSON/PNG/MD go")
    p.add_argument("--quick", action="store_true", help="smoke check: small data, few updates")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--seeds", nargs="+", type=int, default=None)
    p.add_argument("--max-update", type=int, default=None)
    p.add_argument("--valid-every", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tokens-per-sample", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--jobs", type=int, default=2, help="training runs in parallel (1 thread each)")
    p.add_argument("--force", action="store_true", help="rerun runs that have a result.json")
    p.add_argument(
        "--report-only", action="store_true", help="write the report of the finished runs only"
    )
    args = p.parse_args(argv)
    quick = args.quick
    args.seeds = args.seeds or ([1] if quick else [1, 2, 3])
    args.max_update = args.max_update or (20 if quick else 200)
    args.valid_every = args.valid_every or max(1, args.max_update // (2 if quick else 5))
    args.warmup = args.warmup or (5 if quick else 50)
    name = "lm_comparison_quick" if quick else "lm_comparison"
    args.work_dir = args.work_dir or REPO_ROOT / "work_dirs" / name
    args.out = args.out or (args.work_dir if quick else REPO_ROOT / "docs" / "benchmarks")
    args.limits = {"train": 2000, "valid": 100, "test": 100} if quick else {}
    return args


def main(argv=None):
    args = parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    data_bin = prepare_data(args.data, args.work_dir, args.limits)
    logger.info("data ready in %.0fs: %s", time.time() - t0, data_bin)
    jobs = [(label, seed) for seed in args.seeds for label in args.variants]
    if args.report_only:  # the runs finished so far, nothing started
        files = [
            args.work_dir / "runs" / f"{VARIANTS[label]}_seed{seed}" / "result.json"
            for label, seed in jobs
        ]
        results = [json.loads(f.read_text(encoding="utf-8")) for f in files if f.exists()]
        logger.info("report of %d of %d runs", len(results), len(jobs))
    else:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(
                pool.map(lambda job: run_one(job[0], job[1], data_bin, args.work_dir, args), jobs)
            )
    summary = summarise(results)
    table = markdown_table(summary, args)
    name = "lm_comparison_quick" if args.quick else "lm_comparison"
    config = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(args).items()
        if k not in ("force", "report_only")
    }
    report = {
        "description": "Multi30k English word-level LM, CPU, small scale; held-out perplexity "
        "(fairseq-eval-lm on test_2016_flickr) and valid perplexity curves per run",
        "config": config,
        "train_command_example": " ".join(
            map(str, train_command(data_bin, Path("SAVE_DIR"), "ARCH", 1, args))
        ),
        "eval_command_example": " ".join(
            map(str, eval_command(data_bin, Path("SAVE_DIR/checkpoint_last.pt"), args))
        ),
        "wall_seconds": round(time.time() - t0, 1),
        "runs_finished": f"{len(results)} of {len(jobs)}",
        "summary": summary,
        "runs": results,
    }
    write_atomic(args.out / f"{name}.json", json.dumps(report, indent=1))
    write_atomic(args.out / f"{name}.md", table + "\n")
    plot_curves(
        results,
        args.out / f"{name}.png",
        f"Multi30k English LM, {args.layers} layers, width {args.width}, "
        f"{args.max_update} updates, seeds {args.seeds}",
    )
    print(table)
    return report


if __name__ == "__main__":
    main()
