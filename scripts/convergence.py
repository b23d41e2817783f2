#!/usr/bin/env python
"""Convergence study on Multi30k En-Fr: Post-LN, Pre-LN, ADMIN and RealFormer+ADMIN.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).

Every variant is trained by a real ``fairseq-train --user-dir realformer_fairseq``
subprocess at the same size, for the same number of updates, with several seeds;
the script records the validation loss curve of each run and the test BLEU
(``fairseq-generate`` beam search, Moses-detokenised, scored with SacreBLEU against
the lower-cased raw references), then writes a JSON file, a Markdown table and a
PNG plot of the curves (mean and min/max band over seeds).

Data: ``../shared/data/enfr/multi30k`` (train 29k, val 1014, test_2016_flickr 1000),
lower-cased, Moses-tokenised (sacremoses) and segmented with a joint BPE learnt by
subword-nmt; prepared once under ``--work-dir`` and reused.

usage:
    python scripts/convergence.py                # the full study (~45 min on 2 shared cores)
    python scripts/convergence.py --quick        # smoke check (~1-2 min)
    python scripts/convergence.py --max-update 600 --seeds 1 2 3 --jobs 2 --out docs/benchmarks
"""

import argparse
import json
import logging
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
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
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


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
    env = dict(os.environ)
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


def read_lines(path: Path, limit: Optional[int]) -> List[str]:
    if not path.exists():
        raise StudyError(f"data file missing: {path} (see ../shared/data/enfr/README.md)")
    with open(path, encoding="utf-8") as fh:
        lines = [line.rstrip("\n") for line in fh]
    if not lines:
        raise StudyError(f"data file is empty: {path}")
    return lines[:limit] if limit else lines


def prepare_data(data_root: Path, work: Path, bpe_merges: int, limits: Dict[str, int]) -> Path:
    """Lower-case + Moses-tokenise + joint BPE + fairseq-preprocess; cached in ``work``."""
    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    data_bin = work / "data-bin"
    stamp = json.dumps({"data": str(data_root), "bpe_merges": bpe_merges, "limits": limits})
    stamp_file = work / "data-bin.settings.json"
    if (data_bin / "test.en-fr.fr.bin").exists() and stamp_file.exists():
        if stamp_file.read_text(encoding="utf-8") == stamp:
            logger.info("reusing preprocessed data in %s", data_bin)
            return data_bin
        raise StudyError(
            f"{data_bin} was prepared with other settings ({stamp_file}); "
            "use another --work-dir or delete it"
        )
    m30k = data_root / "multi30k"
    tok_dir = work / "tok"
    tok_dir.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "fr"):
        mt = MosesTokenizer(lang=lang)
        for split, name in SPLITS.items():
            lines = read_lines(m30k / f"{name}.{lang}", limits.get(split))
            tok = [mt.tokenize(line.lower(), escape=False, return_str=True) for line in lines]
            write_atomic(tok_dir / f"{split}.{lang}", "\n".join(tok) + "\n")
            if split == "test":  # raw lower-cased references for SacreBLEU
                write_atomic(work / f"test.ref.{lang}", "\n".join(x.lower() for x in lines) + "\n")
    logger.info("learning a joint BPE with %d merges", bpe_merges)
    joint = (tok_dir / "train.en").read_text(encoding="utf-8") + (tok_dir / "train.fr").read_text(
        encoding="utf-8"
    )
    codes_path = work / "bpe.codes"
    import io

    codes = io.StringIO()
    learn_bpe(io.StringIO(joint), codes, bpe_merges)
    write_atomic(codes_path, codes.getvalue())
    with open(codes_path, encoding="utf-8") as fh:
        bpe = BPE(fh)
    bpe_dir = work / "bpe"
    bpe_dir.mkdir(exist_ok=True)
    for split in SPLITS:
        for lang in ("en", "fr"):
            lines = (tok_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            write_atomic(
                bpe_dir / f"{split}.{lang}",
                "\n".join(bpe.process_line(line) for line in lines) + "\n",
            )
    tmp_bin = work / "data-bin.tmp"
    if tmp_bin.exists():
        shutil.rmtree(tmp_bin)
    run(
        [
            fairseq_command("fairseq-preprocess"),
            "--source-lang", "en", "--target-lang", "fr",
            "--trainpref", bpe_dir / "train", "--validpref", bpe_dir / "valid",
            "--testpref", bpe_dir / "test", "--destdir", tmp_bin,
            "--joined-dictionary", "--workers", "1",
        ],
        work / "preprocess.log",
    )  # fmt: skip
    if data_bin.exists():  # incomplete, or from a run without a settings stamp
        shutil.rmtree(data_bin)
    os.replace(tmp_bin, data_bin)
    write_atomic(stamp_file, stamp)
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


def parse_train_wall(train_log: str) -> Optional[float]:
    matches = re.findall(r"\| train \| (\{.*\})", train_log)
    if not matches:
        return None
    return float(json.loads(matches[-1]).get("train_wall", "nan"))


# ---------------------------------------------------------------------------
# stage 3: generation + SacreBLEU


def bleu_of(data_bin: Path, checkpoint: Path, ref_file: Path, log_file: Path, cfg) -> float:
    import sacrebleu
    from sacremoses import MosesDetokenizer

    out = run(
        [
            fairseq_command("fairseq-generate"), data_bin,
            "--user-dir", user_dir(), "--path", checkpoint, "--gen-subset", "test",
            "--beam", "5", "--lenpen", "1.0", "--batch-size", str(cfg.gen_batch),
            "--max-len-a", "1.2", "--max-len-b", "10", "--required-batch-size-multiple", "1",
            "--remove-bpe", "--num-workers", "0", "--cpu",
        ],
        log_file,
    )  # fmt: skip
    hyps: Dict[int, str] = {}
    for line in out.splitlines():
        if line.startswith("H-"):
            ident, _score, text = (line.split("\t") + ["", ""])[:3]
            hyps[int(ident[2:])] = text
    refs = ref_file.read_text(encoding="utf-8").splitlines()
    if len(hyps) != len(refs):
        raise StudyError(f"{log_file}: {len(hyps)} hypotheses for {len(refs)} references")
    detok = MosesDetokenizer(lang="fr")
    sys_out = [detok.detokenize(hyps[i].split()) for i in range(len(refs))]
    return float(sacrebleu.corpus_bleu(sys_out, [refs]).score)


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
    bleu = bleu_of(
        data_bin,
        run_dir / "checkpoint_last.pt",
        work / "test.ref.fr",
        run_dir / "generate.log",
        cfg,
    )
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


# ---------------------------------------------------------------------------
# stage 4: report


def mean_std(values: Sequence[float]) -> Dict[str, float]:
    finite = [v for v in values if math.isfinite(v)]
    return {
        "mean": statistics.fmean(finite) if finite else float("nan"),
        "std": statistics.stdev(finite) if len(finite) > 1 else 0.0,
        "n": len(finite),
    }


def summarise(results: List[Dict]) -> Dict[str, Dict]:
    summary = {}
    for label in VARIANTS:
        runs = [r for r in results if r["variant"] == label]
        if runs:
            summary[label] = {
                "final_valid_loss": mean_std([r["final_valid_loss"] for r in runs]),
                "test_bleu": mean_std([r["test_bleu"] for r in runs]),
                "train_seconds": mean_std([r["train_seconds"] for r in runs]),
            }
    return summary


def markdown_table(summary: Dict[str, Dict], cfg) -> str:
    size = f"{cfg.layers}L-{cfg.layers}L, width {cfg.width}"
    rows = [
        f"| variant ({size}) | valid loss @ {cfg.max_update} upd | test BLEU | train s/run |",
        "|---|---|---|---|",
    ]
    for label, s in summary.items():
        loss, bleu, secs = s["final_valid_loss"], s["test_bleu"], s["train_seconds"]
        rows.append(
            f"| {label} | {loss['mean']:.3f} ± {loss['std']:.3f} | "
            f"{bleu['mean']:.2f} ± {bleu['std']:.2f} | {secs['mean']:.0f} |"
        )
    return "\n".join(rows)


def plot_curves(results: List[Dict], png: Path, title: str):
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
            [next(p["loss"] for p in r["valid_curve"] if p["update"] == u) for r in runs]
            for u in updates
        ]
        mean = [statistics.fmean(v) for v in per_update]
        ax.plot(updates, mean, marker="o", ms=3, label=f"{label} (n={len(runs)})")
        ax.fill_between(
            updates, [min(v) for v in per_update], [max(v) for v in per_update], alpha=0.2
        )
    ax.set_xlabel("updates")
    ax.set_ylabel("valid loss (label-smoothed CE, base 2)")
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
    summary = summarise(results)
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
