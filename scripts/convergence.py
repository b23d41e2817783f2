#!/usr/bin/env python
"""Convergence study on Multi30k En-Fr: Post-LN, Pre-LN, ADMIN and RealFormer+ADMIN.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).

Every variant is trained by a real ``fairseq-train --user-dir realformer_fairseq``
subprocess at the same size, for the same number of updates, with several seeds;
the script records the validation loss curve of each run and the test BLEU
(``examples/wmt14_en_fr/evaluate.sh``: beam search, Moses-detokenised, SacreBLEU against
the lower-cased raw references), then writes a JSON file, a Markdown table and a PNG
plot of the curves (``convergence_report.py``).

Data: ``../shared/data/enfr/multi30k`` (train 29k, val 1014, test_2016_flickr 1000),
prepared by ``scripts/prepare_multi30k.sh`` (lower-cased, Moses-tokenised, joint BPE)
once under ``--work-dir`` and reused.

usage:
    python scripts/convergence.py                # the full study (~45 min on 2 shared cores)
    python scripts/convergence.py --quick        # smoke check (~1-2 min)
    python scripts/convergence.py --max-update 600 --seeds 1 2 3 --jobs 2 --out docs/benchmarks
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
from typing import Dict, List, Sequence

from convergence_report import markdown_table, plot_curves, summarise

REPO_ROOT = Path(__file__).resolve().parents[1]
PREPARE_MULTI30K = REPO_ROOT / "scripts" / "prepare_multi30k.sh"
EVALUATE = REPO_ROOT / "examples" / "wmt14_en_fr" / "evaluate.sh"
DEFAULT_DATA = Path(
    os.environ.get("REALFORMER_SHARED_DATA", REPO_ROOT.parent / "shared" / "data" / "enfr")
)
BIN = Path(sys.executable).parent

logging.basicConfig(
    format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
    datefmt="%Y-%m-%d %H:%M:%S",
    level=logging.INFO,
    stream=sys.stdout,
)
logger = logging.getLogger("convergence")

# label -> arch prefix (each registered as <prefix>_tiny by the plugin)
VARIANTS = {
    "Post-LN": "postln_transformer",
    "Pre-LN": "preln_transformer",
    "ADMIN": "admin_transformer",
    "RealFormer+ADMIN": "realformer",
}


class StudyError(RuntimeError):
    """A stage failed; the message names the stage and the command's output tail."""


def fairseq_command(name: str) -> str:
    exe = BIN / name
    return str(exe) if exe.exists() else name


def user_dir() -> str:
    import realformer_fairseq

    return str(Path(realformer_fairseq.__file__).resolve().parent)


def run(cmd: Sequence, log_file: Path, threads: int = 1) -> str:
    """Run a command with its output in ``log_file``; raise StudyError on failure."""
    env = dict(os.environ, PYTHON=sys.executable)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    tmp = log_file.with_suffix(log_file.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        proc = subprocess.run(
            [str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT, env=env, text=True
        )
    out = tmp.read_text(encoding="utf-8")
    os.replace(tmp, log_file)
    if proc.returncode != 0:
        raise StudyError(
            f"command failed ({proc.returncode}), log {log_file}: "
            f"{' '.join(map(str, cmd))}\n{out[-3000:]}"
        )
    return out


def write_atomic(path: Path, text: str):
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# stage 1: data


def prepare_data(data_root: Path, work: Path, bpe_merges: int, limits: Dict[str, int]) -> Path:
    """scripts/prepare_multi30k.sh into ``work/data-bin``; its stages are skipped on a re-run
    with the same settings and redone when they change."""
    data_bin = work / "data-bin"
    cmd = ["bash", PREPARE_MULTI30K, "--work-dir", work / "prep", "--dest", data_bin]
    cmd += ["--data", data_root, "--bpe-size", bpe_merges, "--workers", "2"]
    for split, lines in limits.items():
        cmd += [f"--max-{split}-lines", lines]
    run(cmd, work / "prepare.log", threads=2)
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
        fairseq_command("fairseq-train"), data_bin,
        "--user-dir", user_dir(), "--task", "translation", "--arch", arch,
        *model_flags(cfg.layers, cfg.width, cfg.ffn, cfg.heads),
        "--share-all-embeddings", "--dropout", "0.1",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", str(cfg.lr), "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", str(cfg.warmup), "--warmup-init-lr", "1e-07",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", str(cfg.max_tokens), "--max-update", str(cfg.max_update),
        # validate on a fixed grid of updates only (and at the end)
        "--validate-interval-updates", str(cfg.valid_every), "--validate-interval", "100000",
        "--save-interval", "100000", "--no-epoch-checkpoints", "--no-save-optimizer-state",
        "--save-dir", save_dir, "--log-format", "json", "--log-interval", "10",
        "--num-workers", "0", "--seed", str(seed), "--cpu",
    ]  # fmt: skip


def parse_valid_curve(train_log: str) -> List[Dict[str, float]]:
    """``[{"update": n, "loss": x, "nll_loss": y}]`` from fairseq's json log lines."""
    curve = []
    for match in re.finditer(r"\| valid \| (\{.*\})", train_log):
        stats = json.loads(match.group(1))
        curve.append(
            {
                "update": int(float(stats["valid_num_updates"])),
                "loss": float(stats["valid_loss"]),
                "nll_loss": float(stats["valid_nll_loss"]),
            }
        )
    # fairseq may validate twice at the last update (interval and end of training)
    dedup = {point["update"]: point for point in curve}
    return [dedup[k] for k in sorted(dedup)]


# ---------------------------------------------------------------------------
# stage 3: generation + SacreBLEU


def sacrebleu_on_test_set(data_bin: Path, checkpoint: Path, out_dir: Path, cfg) -> float:
    """SacreBLEU of beam search on the test set, by the pipeline's evaluate.sh."""
    results = out_dir / "evaluate.json"
    run(
        [
            "bash", EVALUATE, "--data-bin", data_bin, "--checkpoint", checkpoint,
            "--beam", "5", "--lenpen", "1.0", "--batch-size", str(cfg.gen_batch), "--cpu",
            "--out-dir", out_dir / "eval", "--results", results,
            "--", "--max-len-a", "1.2", "--max-len-b", "10", "--num-workers", "0",
        ],
        out_dir / "evaluate.log",
    )  # fmt: skip
    return float(json.loads(results.read_text(encoding="utf-8"))["sacrebleu"]["score"])


def run_one(label: str, seed: int, data_bin: Path, work: Path, cfg) -> Dict:
    arch = f"{VARIANTS[label]}_tiny"
    run_dir = work / "runs" / f"{VARIANTS[label]}_seed{seed}"
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
    start = time.time()
    bleu = sacrebleu_on_test_set(data_bin, run_dir / "checkpoint_last.pt", run_dir, cfg)
    result = {
        "variant": label,
        "arch": arch,
        "seed": seed,
        "valid_curve": curve,
        "final_valid_loss": curve[-1]["loss"],
        "test_bleu": bleu,
        "train_seconds": round(train_s, 1),
        "generate_seconds": round(time.time() - start, 1),
    }
    write_atomic(result_file, json.dumps(result, indent=1))
    if not cfg.keep_checkpoints:
        for ckpt in run_dir.glob("checkpoint*.pt"):
            ckpt.unlink()  # keep the work dir small
    logger.info(
        "%s seed %d: valid loss %.3f, test BLEU %.2f (train %.0fs)",
        label, seed, result["final_valid_loss"], bleu, train_s,
    )  # fmt: skip
    return result


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="root of ../shared/data/enfr")
    p.add_argument("--work-dir", type=Path, default=None, help="default: work_dirs/convergence")
    p.add_argument("--out", type=Path, default=None, help="where the JSON/PNG/MD go")
    p.add_argument("--quick", action="store_true", help="smoke check: small data, few updates")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--seeds", nargs="+", type=int, default=None)
    p.add_argument("--max-update", type=int, default=None)
    p.add_argument("--valid-every", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--bpe-merges", type=int, default=None)
    p.add_argument("--gen-batch", type=int, default=200)
    p.add_argument("--jobs", type=int, default=3, help="training runs in parallel (1 thread each)")
    p.add_argument("--force", action="store_true", help="rerun runs that have a result.json")
    p.add_argument(
        "--keep-checkpoints", action="store_true", help="keep checkpoint_last.pt of each run"
    )
    args = p.parse_args(argv)
    quick = args.quick
    args.seeds = args.seeds or ([1] if quick else [1, 2, 3])
    args.max_update = args.max_update or (20 if quick else 160)
    args.valid_every = args.valid_every or max(1, args.max_update // (2 if quick else 8))
    args.warmup = args.warmup or (5 if quick else 40)
    args.bpe_merges = args.bpe_merges or (500 if quick else 4000)
    name = "convergence_quick" if quick else "convergence"
    args.work_dir = args.work_dir or REPO_ROOT / "work_dirs" / name
    args.out = args.out or (args.work_dir if quick else REPO_ROOT / "docs" / "benchmarks")
    args.limits = {"train": 2000, "valid": 100, "test": 50} if quick else {"valid": 400}
    return args


def main(argv=None):
    args = parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    data_bin = prepare_data(args.data, args.work_dir, args.bpe_merges, args.limits)
    logger.info("data ready in %.0fs: %s", time.time() - t0, data_bin)
    jobs = [(label, seed) for seed in args.seeds for label in args.variants]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(
            pool.map(lambda job: run_one(job[0], job[1], data_bin, args.work_dir, args), jobs)
        )
    summary = summarise(results, list(VARIANTS))
    table = markdown_table(summary, args)
    config = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(args).items()
        if k not in ("force", "keep_checkpoints")
    }
    name = "convergence_quick" if args.quick else "convergence"
    report = {
        "description": "Multi30k En-Fr, CPU, small scale; valid loss curves and test BLEU "
        "(SacreBLEU, lower-cased refs, test_2016_flickr) per run",
        "config": config,
        "train_command_example": " ".join(
            map(str, train_command(data_bin, Path("SAVE_DIR"), "ARCH", 1, args))
        ),
        "summary": summary,
        "runs": results,
        "wall_seconds": round(time.time() - t0, 1),
    }
    write_atomic(args.out / f"{name}.json", json.dumps(report, indent=1))
    write_atomic(args.out / f"{name}.md", table + "\n")
    plot_curves(
        results,
        list(VARIANTS),
        args.out / f"{name}.png",
        f"Multi30k En-Fr valid loss, {args.layers}L-{args.layers}L d={args.width}, "
        f"{len(args.seeds)} seed(s), CPU",
    )
    print(table)
    logger.info("done in %.0fs; results in %s", time.time() - t0, args.out)


if __name__ == "__main__":
    try:
        main()
    except StudyError as err:
        raise SystemExit(f"convergence.py: error: {err}")
