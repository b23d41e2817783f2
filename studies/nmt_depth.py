#!/usr/bin/env python
"""The paper's NMT claim at depth: ADMIN vs RealFormer+ADMIN vs a Post-LN baseline, 3 seeds.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747), Table 7:
RealFormer+ADMIN 60L-12L 43.97 tokenized BLEU on WMT'14 En-Fr against ADMIN's 43.72. ADMIN
(Liu et al., arXiv 2004.08249 and 2008.07772) exists to make deep Post-LN models train; the
claim is that residual attention helps on top of it. This study tests that claim at the
greatest encoder depth this project's 2-core CPU trains in about two hours (default 18L-6L,
d 128, 4 heads), on Tatoeba En-Fr:

1. data: ``../shared/data/enfr/tatoeba`` (sorted short to long) is shuffled with a fixed seed;
   ``--test-pairs`` and ``--valid-pairs`` pairs are held out, and every training pair whose
   English or French side occurs in them is dropped (Tatoeba repeats sides), then the WMT'14
   pipeline's own ``prepare.sh --offline`` (Moses tokenisation, joint BPE, clean, binarise);
2. training: the same data, batches (``--max-tokens``) and update budget for every variant and
   seed, by ``fairseq-train --user-dir realformer_fairseq``, with the WMT'14 recipe's optimiser
   (Transformer-Clinic's ``admin 60-12l``: RAdam, betas (0.9, 0.98), lr 7e-4, inverse-sqrt,
   warm-up from 1e-7, no clipping, dropout / attention / activation dropout 0.1, label
   smoothing 0.1, weight decay 0) scaled down: ``--warmup`` updates instead of 8,000, batches of
   ``--max-tokens`` on one CPU process instead of 16 GPUs x 5,000 x 16, ``--max-update`` instead
   of 50 epochs, float32 instead of fp16, the last checkpoint instead of the average of 10;
3. measures per run: the valid-loss curve, test BLEU (beam 5, lenpen 0.8 as the recipe,
   ``--required-batch-size-multiple 1``: tokenized BLEU as fairseq prints it and SacreBLEU on the
   detokenised output, by ``examples/wmt14_en_fr/evaluate.sh``), divergence (a non-finite loss,
   a failed run, or a final valid loss no better than the first), and the adjacent-layer
   attention JS divergence of each chain (``realformer-attention-stats`` on valid pairs);
4. verdict: the per-seed paired difference RealFormer+ADMIN - ADMIN (test BLEU, valid loss),
   the updates each variant needs to reach ADMIN's final valid loss (seed-paired), a table and a
   plot of valid loss against updates.

Runs go seed by seed (every variant of seed 1, then seed 2, ...), so a study stopped early has
whole pairs; each finished run leaves ``WORK/runs/<variant>_seed<S>/result.json`` and is not
run again (resume: start the same command). Progress is logged, one line per stage.

Writes ``docs/benchmarks/nmt_depth.json`` (``config``, ``runs``, ``paired``, ``summary``),
``nmt_depth.md`` (the table and verdict) and ``nmt_depth.png``.

usage (from the repository root; its run time is in docs/benchmarks.md):
    nohup python -m studies.nmt_depth > work_dirs/nmt_depth.log 2>&1 &
    python -m studies.nmt_depth --smoke --work-dir /tmp/nmt_smoke   # 2 layers, 2 updates
"""

import argparse
import json
import logging
import math
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import runs

PREPARE = runs.REPO_ROOT / "examples" / "wmt14_en_fr" / "prepare.sh"
EVALUATE = runs.REPO_ROOT / "examples" / "wmt14_en_fr" / "evaluate.sh"
logger = runs.get_logger("nmt_depth")

# label -> (arch, extra flags). The baseline is fairseq's own Post-LN ``transformer`` (no
# plugin code in its layers); Pre-LN is fairseq's ``transformer`` with pre-normalisation.
VARIANTS: Dict[str, tuple] = {
    "ADMIN": ("admin_transformer_wmt_en_fr", ()),
    "RealFormer+ADMIN": ("realformer_wmt_en_fr", ()),
    "Post-LN (fairseq)": ("transformer", ()),
    "Pre-LN (fairseq)": (
        "transformer",
        ("--encoder-normalize-before", "--decoder-normalize-before"),
    ),
}
DEFAULT_VARIANTS = ("ADMIN", "RealFormer+ADMIN", "Post-LN (fairseq)")
SLUG = {
    "ADMIN": "admin",
    "RealFormer+ADMIN": "realformer_admin",
    "Post-LN (fairseq)": "postln",
    "Pre-LN (fairseq)": "preln",
}

# Transformer-Clinic nmt-experiments/wmt14_en-fr.md, "admin 60-12l" (lines 170-177; the same
# values as examples/wmt14_en_fr/recipes.py CLINIC_TRAIN), less the GPU-only flags
RECIPE_FLAGS = [
    "--optimizer", "radam", "--radam-variant", "clinic", "--adam-betas", "(0.9, 0.98)",
    "--clip-norm", "0.0", "--lr-scheduler", "inverse_sqrt", "--warmup-init-lr", "1e-07",
    "--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1",
    "--weight-decay", "0.0", "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", "0.1", "--share-all-embeddings",
]  # fmt: skip


# ---------------------------------------------------------------------------
# stage 1: data


def split_tatoeba(data_root: Path, out: Path, valid: int, test: int, max_train: int, seed: int):
    """Shuffle Tatoeba's pairs (seed), hold out ``test`` then ``valid`` pairs and drop every
    training pair that shares a side with them; writes ``out/{train,valid,test}.{en,fr}`` and
    returns the counts. Rewritten only when its settings change."""
    stamp = out / "split.json"
    settings = {"valid": valid, "test": test, "max_train": max_train, "seed": seed}
    old = runs.read_json(stamp)
    if old is not None and old.get("settings") == settings:
        return old["counts"]
    src = data_root / "tatoeba" / "fra-eng.no-tatoeba-test"
    en = runs.read_lines(Path(f"{src}.en"), None)
    fr = runs.read_lines(Path(f"{src}.fr"), None)
    if len(en) != len(fr):
        raise runs.StudyError(f"{src}.en/.fr: {len(en)} vs {len(fr)} lines")
    pairs = [(e.strip(), f.strip()) for e, f in zip(en, fr) if e.strip() and f.strip()]
    random.Random(seed).shuffle(pairs)
    if test + valid >= len(pairs):
        raise runs.StudyError(f"--test-pairs + --valid-pairs >= the {len(pairs)} pairs")
    held = {"test": pairs[:test], "valid": pairs[test : test + valid]}
    seen_en = {e for part in held.values() for e, _ in part}
    seen_fr = {f for part in held.values() for _, f in part}
    train = [(e, f) for e, f in pairs[test + valid :] if e not in seen_en and f not in seen_fr]
    dropped = len(pairs) - test - valid - len(train)
    if max_train:
        train = train[:max_train]
    out.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", train), *held.items()):
        for i, lang in enumerate(("en", "fr")):
            runs.write_text_atomic(out / f"{split}.{lang}", "".join(p[i] + "\n" for p in part))
    counts = {"train": len(train), "valid": valid, "test": test, "dropped_overlap": dropped}
    runs.write_json(stamp, {"settings": settings, "counts": counts})
    return counts


def prepare_data(args) -> Path:
    split = args.work_dir / "split"
    counts = split_tatoeba(
        args.data, split, args.valid_pairs, args.test_pairs, args.max_train_pairs, args.split_seed
    )
    args.split_counts = counts
    logger.info(
        "split: %d train, %d valid, %d test pairs (%d training pairs dropped: a side in valid/test)",
        counts["train"], counts["valid"], counts["test"], counts["dropped_overlap"],
    )  # fmt: skip
    data_bin = args.work_dir / "data-bin"
    cmd = [
        "bash", PREPARE, "--offline", "--train", split / "train", "--valid", split / "valid",
        "--test", split / "test", "--bpe-size", args.bpe_size, "--work-dir", args.work_dir / "prep",
        "--dest", data_bin, "--workers", "2",
    ]  # fmt: skip
    runs.run(cmd, args.work_dir / "prepare.log", threads=2)
    return data_bin


# ---------------------------------------------------------------------------
# stage 2: training


def model_flags(cfg) -> List[str]:
    return [
        "--encoder-layers", str(cfg.encoder_layers), "--decoder-layers", str(cfg.decoder_layers),
        "--encoder-embed-dim", str(cfg.width), "--decoder-embed-dim", str(cfg.width),
        "--encoder-ffn-embed-dim", str(cfg.ffn), "--decoder-ffn-embed-dim", str(cfg.ffn),
        "--encoder-attention-heads", str(cfg.heads), "--decoder-attention-heads", str(cfg.heads),
    ]  # fmt: skip


def train_command(data_bin: Path, save_dir: Path, label: str, seed: int, cfg) -> List[str]:
    arch, extra = VARIANTS[label]
    return [
        *runs.train_head(data_bin, "translation"), "--arch", arch, *extra, *model_flags(cfg),
        *RECIPE_FLAGS, "--lr", str(cfg.lr), "--warmup-updates", str(cfg.warmup),
        "--max-tokens", str(cfg.max_tokens), "--max-update", str(cfg.max_update),
        *runs.run_flags(cfg.valid_every, save_dir, seed, log_interval=cfg.log_interval),
    ]  # fmt: skip


def train_losses(text: str) -> List[float]:
    return [float(s["loss"]) for s in runs.log_records(text, "train_inner")]


def diverged_reason(curve: List[Dict], losses: List[float], failed: Optional[str]) -> str:
    """Why a run counts as diverged ("" when it does not): a failed command, a non-finite
    loss, or no progress (its last valid loss is not below its first)."""
    if failed:
        return f"failed: {failed}"
    values = [p["loss"] for p in curve] + losses
    if not all(math.isfinite(x) for x in values):
        return "non-finite loss"
    if len(curve) >= 2 and not curve[-1]["loss"] < curve[0]["loss"]:
        return f"no progress: valid loss {curve[0]['loss']:.3f} -> {curve[-1]['loss']:.3f}"
    return ""


# ---------------------------------------------------------------------------
# stage 3: evaluation


def evaluate(data_bin: Path, checkpoint: Path, run_dir: Path, cfg) -> Dict:
    """Beam 5, lenpen 0.8, --required-batch-size-multiple 1 on the test set by the pipeline's
    evaluate.sh: {"tokenized": fairseq's BLEU4, "sacrebleu": SacreBLEU of the detokenised
    output}."""
    results = run_dir / "evaluate.json"
    runs.run(
        [
            "bash", EVALUATE, "--data-bin", data_bin, "--checkpoint", checkpoint, "--beam", "5",
            "--lenpen", "0.8", "--batch-size", str(cfg.gen_batch), "--cpu",
            "--out-dir", run_dir / "eval", "--results", results,
            "--", "--required-batch-size-multiple", "1", "--num-workers", "0",
        ],
        run_dir / "evaluate.log",
    )  # fmt: skip
    scores = json.loads(results.read_text(encoding="utf-8"))
    return {
        "tokenized": scores["tokenized_bleu_fairseq"]["score"],
        "sacrebleu": scores["sacrebleu"]["score"],
    }


def attention_js(checkpoint: Path, data_bin: Path, run_dir: Path, cfg) -> Dict[str, float]:
    """Mean adjacent-layer JS divergence per chain (layers 1..L-1, all heads) on the first
    ``cfg.attn_lines`` BPE'd valid pairs, by ``realformer-attention-stats``."""
    prep = cfg.work_dir / "prep" / "final"
    out = run_dir / "attn"
    cmd = [
        runs.fairseq_command("realformer-attention-stats"), "--path", checkpoint,
        "--input", prep / "valid.en", "--target", prep / "valid.fr", "--data", data_bin,
        "--out-dir", out, "--cpu", "--no-plots", "--max-lines", str(cfg.attn_lines),
    ]  # fmt: skip
    runs.run(cmd, run_dir / "attention_stats.log")
    stats = json.loads((out / "attention_stats.json").read_text(encoding="utf-8"))
    result = {}
    for chain, s in stats["chains"].items():
        per_layer = [x for x in s["js_divergence"]["per_layer"]["mean"] if x is not None]
        result[chain] = round(statistics.fmean(per_layer), 5) if per_layer else None
    return result


def finished_training(run_dir: Path, cfg) -> Optional[str]:
    """The log of a training of this run that ended (its checkpoint saved at ``--max-update``),
    so that a restarted study evaluates it instead of training it again; None otherwise."""
    log = run_dir / "train.log"
    if not (log.exists() and (run_dir / "checkpoint_last.pt").exists()):
        return None
    text = log.read_text(encoding="utf-8")
    done = "done training" in text and f"max_update={cfg.max_update}," in text
    return text if done else None


def log_seconds(text: str) -> float:
    """Seconds between the first and the last time stamp of a fairseq log."""
    stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \|", text, re.M)
    if len(stamps) < 2:
        return 0.0
    first, last = (
        time.mktime(time.strptime(s, "%Y-%m-%d %H:%M:%S")) for s in (stamps[0], stamps[-1])
    )
    return last - first


def run_one(label: str, seed: int, data_bin: Path, run_dir: Path, cfg) -> Dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    failed = None
    text = finished_training(run_dir, cfg)
    if text is not None:
        logger.info("%s seed %d: training had finished, evaluating %s", label, seed, run_dir)
    else:
        cmd = train_command(data_bin, run_dir, label, seed, cfg)
        logger.info("%s seed %d: training (%d updates) -> %s", label, seed, cfg.max_update, run_dir)
        try:
            text = runs.run(cmd, run_dir / "train.log")
        except runs.StudyError as err:  # divergence (fairseq's NaN stop) is a result
            text = (run_dir / "train.log").read_text(encoding="utf-8")
            failed = str(err).splitlines()[0][:300]
    wall = log_seconds(text)
    curve = runs.valid_curve(text)
    losses = train_losses(text)
    reason = diverged_reason(curve, losses, failed)
    result = {
        "variant": label,
        "arch": VARIANTS[label][0],
        "seed": seed,
        "valid_curve": curve,
        "valid_loss": curve[-1]["loss"] if curve else None,
        "updates": curve[-1]["update"] if curve else 0,
        "diverged": bool(reason),
        "diverged_reason": reason or None,
        "test_bleu": None,
        "test_sacrebleu": None,
        "attention_js": None,
        "wall_s": round(wall, 1),
    }
    checkpoint = run_dir / "checkpoint_last.pt"
    if checkpoint.exists() and not (failed or "non-finite" in reason):
        start = time.time()
        scores = evaluate(data_bin, checkpoint, run_dir, cfg)
        result.update(test_bleu=scores["tokenized"], test_sacrebleu=scores["sacrebleu"])
        result["attention_js"] = attention_js(checkpoint, data_bin, run_dir, cfg)
        result["eval_wall_s"] = round(time.time() - start, 1)
    logger.info(
        "%s seed %d: valid loss %s after %d updates, test BLEU %s (sacreBLEU %s)%s, %.0f s",
        label, seed, _fmt(result["valid_loss"], 3), result["updates"],
        _fmt(result["test_bleu"], 2), _fmt(result["test_sacrebleu"], 2),
        f", DIVERGED: {reason}" if reason else "", wall,
    )  # fmt: skip
    return result


def _fmt(x, digits: int) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


# ---------------------------------------------------------------------------
# stage 4: verdict


def updates_to_reach(curve: List[Dict], target: float) -> Optional[int]:
    """The first validated update whose valid loss is at or below ``target`` (None: never)."""
    for point in curve:
        if point["loss"] <= target:
            return point["update"]
    return None


def mean_sd(values: Sequence[float]) -> Dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0, "mean": None, "sd": None}
    sd = statistics.stdev(values) if len(values) > 1 else None
    return {"n": len(values), "mean": statistics.fmean(values), "sd": sd}


def paired(results: List[Dict], a: str, b: str) -> Dict:
    """Per seed, ``a - b`` in test BLEU, SacreBLEU and final valid loss, where both runs of the
    seed finished without diverging; with the mean, the sample sd and the range."""
    by = {(r["variant"], r["seed"]): r for r in results}
    seeds = sorted({s for v, s in by if v == a} & {s for v, s in by if v == b})
    rows = []
    for seed in seeds:
        ra, rb = by[(a, seed)], by[(b, seed)]
        if ra["diverged"] or rb["diverged"] or ra["test_bleu"] is None or rb["test_bleu"] is None:
            continue
        rows.append(
            {
                "seed": seed,
                "test_bleu": round(ra["test_bleu"] - rb["test_bleu"], 2),
                "test_sacrebleu": round(ra["test_sacrebleu"] - rb["test_sacrebleu"], 2),
                "valid_loss": round(ra["valid_loss"] - rb["valid_loss"], 4),
            }
        )
    out = {"difference": f"{a} - {b}", "per_seed": rows}
    for key in ("test_bleu", "test_sacrebleu", "valid_loss"):
        values = [r[key] for r in rows]
        stats = mean_sd(values)
        stats["min"] = min(values) if values else None
        stats["max"] = max(values) if values else None
        out[key] = stats
    return out


def reach_admin(results: List[Dict]) -> Dict[str, List]:
    """Per variant, per seed: the updates to reach the same seed's ADMIN final valid loss."""
    admin = {r["seed"]: r["valid_loss"] for r in results if r["variant"] == "ADMIN"}
    out: Dict[str, List] = {}
    for r in results:
        target = admin.get(r["seed"])
        if target is None or r["valid_loss"] is None:
            continue
        reached = updates_to_reach(r["valid_curve"], target)
        out.setdefault(r["variant"], []).append({"seed": r["seed"], "updates": reached})
    return out


def verdict(pair: Dict, results: List[Dict]) -> str:
    """One plain paragraph on what the paired runs support."""
    bleu = pair["test_bleu"]
    n = bleu["n"]
    if n == 0:
        return "No seed has both ADMIN and RealFormer+ADMIN finished: nothing to compare."
    diverged = sorted({r["variant"] for r in results if r["diverged"]})
    div = f" Diverged runs: {', '.join(diverged)}." if diverged else " No run diverged."
    mean, lo, hi = bleu["mean"], bleu["min"], bleu["max"]
    spread = f"per-seed differences {lo:+.2f} to {hi:+.2f} BLEU over {n} seed(s)"
    loss = pair["valid_loss"]["mean"]
    if n >= 2 and lo > 0:
        claim = f"RealFormer+ADMIN beat ADMIN on every seed (mean {mean:+.2f}; {spread})"
    elif n >= 2 and hi < 0:
        claim = f"RealFormer+ADMIN was worse than ADMIN on every seed (mean {mean:+.2f}; {spread})"
    else:
        claim = (
            f"the data cannot tell RealFormer+ADMIN from ADMIN (mean {mean:+.2f}; {spread}, "
            "the sign changes between seeds)"
            if n >= 2
            else f"one seed only ({mean:+.2f} BLEU): no spread to judge it by"
        )
    losses = pair["valid_loss"]
    side = ""
    if n >= 2 and (losses["min"] > 0 or losses["max"] < 0):
        side = (
            f", {'higher' if losses['min'] > 0 else 'lower'} for RealFormer+ADMIN on every seed "
            f"({losses['min']:+.4f} to {losses['max']:+.4f})"
        )
    return (
        f"At this depth and budget, {claim}; final valid loss difference {loss:+.4f}{side} "
        f"(negative favours RealFormer+ADMIN).{div}"
    )


def table(results: List[Dict], variants: Sequence[str], cfg) -> str:
    head = (
        f"| variant ({cfg.encoder_layers}L-{cfg.decoder_layers}L, d {cfg.width}) | seeds | "
        f"diverged | valid loss @ {cfg.max_update} | test BLEU (tok) | test sacreBLEU | "
        "mean adjacent-layer JS (enc / dec self / cross) | train s/run |"
    )
    lines = [head, "|" + "---|" * 8]
    for label in variants:
        rs = [r for r in results if r["variant"] == label]
        if not rs:
            continue
        ok = [r for r in rs if not r["diverged"]]
        cells = []
        for key, digits in (("valid_loss", 3), ("test_bleu", 2), ("test_sacrebleu", 2)):
            s = mean_sd([r[key] for r in ok])
            cells.append(_mean_sd_text(s, digits))
        js = []
        for chain in ("encoder", "decoder", "cross"):
            s = mean_sd([(r["attention_js"] or {}).get(chain) for r in ok])
            js.append(_fmt(s["mean"], 3))
        wall = mean_sd([r["wall_s"] for r in rs])["mean"]
        lines.append(
            f"| {label} | {len(rs)} | {len(rs) - len(ok)} | {' | '.join(cells)} | "
            f"{' / '.join(js)} | {wall:.0f} |"
        )
    return "\n".join(lines)


def _mean_sd_text(s: Dict, digits: int) -> str:
    if s["mean"] is None:
        return "n/a"
    sd = "" if s["sd"] is None else f" ± {s['sd']:.{digits}f}"
    return f"{s['mean']:.{digits}f}{sd}"


def plot(results: List[Dict], variants: Sequence[str], path: Path, cfg):
    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants), 3.6), sharey=True)
    axes = [axes] if len(variants) == 1 else list(axes)
    finite = [p["loss"] for r in results for p in r["valid_curve"] if math.isfinite(p["loss"])]
    for ax, label in zip(axes, variants):
        for r in sorted((r for r in results if r["variant"] == label), key=lambda r: r["seed"]):
            xs = [p["update"] for p in r["valid_curve"]]
            ys = [p["loss"] for p in r["valid_curve"]]
            style = ":" if r["diverged"] else "-"
            ax.plot(xs, ys, style, marker=".", label=f"seed {r['seed']}")
        ax.set_title(label)
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if finite:
        axes[0].set_ylim(min(finite) - 0.1, min(max(finite), min(finite) + 6) + 0.1)
    axes[0].set_ylabel("valid loss (label-smoothed CE, base 2)")
    fig.suptitle(
        f"Tatoeba En-Fr, {cfg.encoder_layers}L-{cfg.decoder_layers}L d{cfg.width}, "
        f"{cfg.max_update} updates of {cfg.max_tokens} tokens, CPU"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=runs.DEFAULT_DATA, help="../shared/data/enfr")
    p.add_argument("--work-dir", type=Path, default=runs.REPO_ROOT / "work_dirs" / "nmt_depth")
    p.add_argument("--out", type=Path, default=None, help="default: docs/benchmarks")
    p.add_argument("--smoke", action="store_true", help="2 layers, 2 updates, small data")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=None)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--encoder-layers", type=int, default=18)
    p.add_argument("--decoder-layers", type=int, default=6)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--bpe-size", type=int, default=8000, help="joint BPE merges")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--max-update", type=int, default=600)
    p.add_argument("--valid-every", type=int, default=50)
    p.add_argument("--warmup", type=int, default=90)
    p.add_argument("--lr", type=float, default=7e-4, help="the recipe's 7e-4")
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--valid-pairs", type=int, default=1000)
    p.add_argument("--test-pairs", type=int, default=1000)
    p.add_argument("--max-train-pairs", type=int, default=0, help="0: all")
    p.add_argument("--split-seed", type=int, default=20261206)
    p.add_argument("--gen-batch", type=int, default=128)
    p.add_argument("--attn-lines", type=int, default=200)
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel, 1 thread each")
    p.add_argument("--force", action="store_true", help="rerun runs that have a result.json")
    args = p.parse_args(argv)
    if args.smoke:
        args.encoder_layers = args.decoder_layers = 2
        args.width, args.ffn, args.heads = 32, 64, 2
        args.max_update, args.valid_every, args.warmup = 2, 1, 1
        args.bpe_size, args.max_train_pairs = 200, 2000
        args.valid_pairs = args.test_pairs = 20
        args.max_tokens, args.attn_lines, args.seeds = 512, 10, args.seeds[:1]
    args.variants = args.variants or list(DEFAULT_VARIANTS)
    args.out = args.out or (args.work_dir if args.smoke else runs.REPO_ROOT / "docs" / "benchmarks")
    return args


def main(argv=None):
    args = parse_args(argv)
    # importing fairseq configured the root logger (no times, DEBUG): the log's lines get times
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=logging.INFO,
        stream=sys.stdout,
        force=True,
    )
    args.work_dir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    logger.info("work dir %s, %d runs", args.work_dir, len(args.variants) * len(args.seeds))
    data_bin = prepare_data(args)
    logger.info("data ready in %.0f s: %s", time.time() - t0, data_bin)
    results = runs.run_seeds(run_one, data_bin, args, SLUG)  # seed-major, resumable
    pair = paired(results, "RealFormer+ADMIN", "ADMIN")
    text = verdict(pair, results)
    md = table(results, args.variants, args)
    config = runs.config(args, drop=("smoke", "force"))
    config["train_command_example"] = runs.command_line(
        train_command(data_bin, Path("SAVE_DIR"), "RealFormer+ADMIN", 1, args)
    )
    config["recipe_changes"] = (
        "Transformer-Clinic admin 60-12l optimiser (RAdam clinic, betas (0.9, 0.98), lr "
        f"{args.lr:g}, inverse_sqrt from 1e-7, clip 0, dropouts 0.1, label smoothing 0.1, "
        f"weight decay 0) with: warm-up {args.warmup} updates (reference 8000), "
        f"{args.max_tokens}-token batches on one CPU process (reference 16 GPUs x 5000 x 16), "
        f"{args.max_update} updates (reference 50 epochs), float32 (reference fp16), "
        "the last checkpoint (reference: average of the last 10 epochs)"
    )
    name = "nmt_depth_smoke" if args.smoke else "nmt_depth"
    out = {
        "description": "RealFormer+ADMIN vs ADMIN vs fairseq Post-LN at encoder depth "
        f"{args.encoder_layers} on Tatoeba En-Fr (held-out test pairs), {len(args.seeds)} "
        "seed(s); test BLEU: beam 5, lenpen 0.8, last checkpoint",
        "command": " ".join(["python", "-m", "studies.nmt_depth", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "config": config,
        "runs": results,
        "paired": pair,
        "updates_to_reach_admin_final_valid_loss": reach_admin(results),
        "verdict": text,
        # this invocation (a resumed study reuses finished runs) and the runs' own time
        "wall_seconds": round(time.time() - t0, 1),
        "runs_train_and_eval_seconds": round(
            sum(r["wall_s"] + r.get("eval_wall_s", 0.0) for r in results), 1
        ),
    }
    runs.write_json(args.out / f"{name}.json", out)
    runs.write_text_atomic(args.out / f"{name}.md", md + "\n\n" + text + "\n")
    plot(results, args.variants, args.out / f"{name}.png", args)
    print(md)
    print(text)
    logger.info("done in %.0f s; %s", time.time() - t0, args.out / f"{name}.json")


if __name__ == "__main__":
    try:
        main()
    except runs.StudyError as err:
        raise SystemExit(f"studies.nmt_depth: error: {err}")
