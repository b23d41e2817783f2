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
   seed, by ``fairseq-train --user-dir realformer_fairseq``, with the WMT'14 recipe's training
   flags, read from ``examples/wmt14_en_fr/recipes.py`` (``CLINIC_TRAIN``: Transformer-Clinic's
   ``admin 60-12l``, RAdam, betas (0.9, 0.98), lr 7e-4, inverse-sqrt, warm-up from 1e-7, no
   clipping, dropout / attention / activation dropout 0.1, label smoothing 0.1, weight decay 0)
   less those this study replaces (``REPLACED``, each with its reason): ``--warmup`` updates
   instead of 8,000, batches of ``--max-tokens`` on one CPU process instead of 16 GPUs x 5,000
   x 16, ``--max-update`` instead of 50 epochs, float32 instead of fp16, the last checkpoint
   instead of the average of 10;
3. measures per run: the valid-loss curve, test BLEU (beam, lenpen and batch from the recipe's
   ``CLINIC_EVAL``, ``--required-batch-size-multiple 1``: tokenized BLEU as fairseq prints it
   and SacreBLEU on the detokenised output, by ``examples/wmt14_en_fr/evaluate.sh``),
   divergence (fairseq's own NaN/Inf stop, or a non-finite loss in its log), a stall (no
   progress after the warm-up, judged over at least ``STALL_POINTS`` validations), and the
   adjacent-layer attention JS divergence of each chain (``realformer-attention-stats`` on
   valid pairs);
4. verdict: the per-seed paired difference RealFormer+ADMIN - ADMIN (test BLEU, valid loss),
   the updates each variant needs to reach ADMIN's final valid loss (seed-paired), a table and a
   plot: per metric the variants on one axis (seed mean and each seed), the paired difference
   per seed beside it.

Runs go seed by seed (every variant of seed 1, then seed 2, ...), so a study stopped early has
whole pairs; each finished run leaves ``WORK/runs/<variant>_seed<S>/result.json`` with what
defines it, and is not run again while that definition is asked for (resume: start the same
command; another ``--max-update`` trains the runs again, see ``studies.runs``). A failed
command (a signal, OOM, a full disk) is an error, not a divergence: the other runs finish, the
study exits non-zero listing it, and the same command trains it again. Progress is logged with
times, one line per stage.

Writes ``docs/benchmarks/nmt_depth.json`` (``config``, ``runs``, ``paired``, ``summary``),
``nmt_depth.md`` (the table and verdict) and ``nmt_depth.png``.

usage (from the repository root; its run time is in docs/benchmarks.md):
    nohup python -m studies.nmt_depth > work_dirs/nmt_depth.log 2>&1 &
    python -m studies.nmt_depth --quick --work-dir /tmp/nmt_quick   # 2 layers, 20 updates
    python -m studies.nmt_depth --replot   # nmt_depth.png again from docs/benchmarks' JSON
"""

import argparse
import importlib.util
import json
import math
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import plots, runs, tables

PIPELINE = runs.REPO_ROOT / "examples" / "wmt14_en_fr"
PREPARE = PIPELINE / "prepare.sh"
EVALUATE = PIPELINE / "evaluate.sh"
logger = runs.get_logger("nmt_depth")


def pipeline_recipes():
    """``examples/wmt14_en_fr/recipes.py``, the one place the WMT'14 recipe's values are kept
    (executed from its file: ``examples`` is not a package)."""
    spec = importlib.util.spec_from_file_location("wmt14_en_fr_recipes", PIPELINE / "recipes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECIPES = pipeline_recipes()
RECIPE = RECIPES.recipe("admin-clinic")
RECIPE_VALUES = {flag: value for flag, value, _ in RECIPE["train"]}
EVAL_VALUES = {name: value for name, value, _ in RECIPE["eval"]}
# the recipe's flags this study sets itself, and why
REPLACED = {
    "--warmup-updates": "--warmup: 8,000 updates is 13x this study's whole default budget",
    "--lr": "--lr, whose default is the recipe's",
    "--seed": "--seeds: one run per seed",
    "--max-epoch": "--max-update: a CPU budget of updates, not 50 epochs of WMT'14",
    "--log-format": "json: the study reads fairseq's json log lines",
    "--log-interval": "--log-interval",
    **{flag: "float32 on CPU (GPU-only fp16 flags)" for flag in RECIPES.FP16_FLAGS},
}
# the recipe's other training flags, as its train.sh passes them
RECIPE_FLAGS = [
    word
    for flag, value, _ in RECIPE["train"]
    if flag not in REPLACED
    for word in ((flag,) if value is None else (flag, value))
]

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


def run_command(label: str, seed: int, data_bin: Path, run_dir: Path, cfg) -> List[str]:
    """The training of one run (what, with the data and settings, defines it)."""
    return train_command(data_bin, run_dir, label, seed, cfg)


def train_losses(text: str) -> List[float]:
    return [float(s["loss"]) for s in runs.log_records(text, "train_inner")]


def diverged_reason(curve: List[Dict], losses: List[float], nan_inf_stop: Optional[str]) -> str:
    """Why a run counts as diverged ("" when it does not): fairseq's own NaN/Inf stop (its
    line, ``runs.nan_inf_stop``) or a non-finite loss in its log. A failed command is an error
    (raised, never stored) and a loss that stops falling is a stall (``stall_reason``)."""
    if nan_inf_stop:
        return f"fairseq stopped: {nan_inf_stop}"
    values = [p["loss"] for p in curve] + losses
    if not all(math.isfinite(x) for x in values):
        return "non-finite loss"
    return ""


# A stall is judged over the validations from the end of the warm-up on (the learning rate at
# its peak and after), and only with at least this many of them: two intervals of training at
# full learning rate, so that one noisy validation cannot make a stall. Shorter curves (smoke
# runs: 2 updates) are "too short to tell" (None), neither a stall nor progress.
STALL_POINTS = 3


def stall_reason(curve: List[Dict], warmup: int) -> Optional[str]:
    """ "" when the valid loss fell after the warm-up, the stall when it did not (the last
    valid loss not below the first one at or after update ``warmup``), None when fewer than
    ``STALL_POINTS`` validations lie there."""
    after = [p for p in curve if p["update"] >= warmup]
    if len(after) < STALL_POINTS:
        return None
    first, last = after[0], after[-1]
    if last["loss"] < first["loss"]:
        return ""
    return (
        f"no progress after the warm-up: valid loss {first['loss']:.3f} at update "
        f"{first['update']} -> {last['loss']:.3f} at {last['update']}"
    )


# ---------------------------------------------------------------------------
# stage 3: evaluation


def evaluate(data_bin: Path, checkpoint: Path, run_dir: Path, cfg) -> Dict:
    """The recipe's beam and lenpen, --required-batch-size-multiple 1 on the test set by the
    pipeline's evaluate.sh: {"tokenized": fairseq's BLEU4, "sacrebleu": SacreBLEU of the
    detokenised output}."""
    results = run_dir / "evaluate.json"
    runs.run(
        [
            "bash", EVALUATE, "--data-bin", data_bin, "--checkpoint", checkpoint,
            "--beam", EVAL_VALUES["beam"], "--lenpen", EVAL_VALUES["lenpen"],
            "--batch-size", str(cfg.gen_batch), "--cpu",
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
    """Train (unless this definition's training had ended: ``runs.claim`` moved any other
    aside), evaluate, and return the run's result. fairseq's NaN/Inf stop is a result (a
    divergence); any other failure of the training raises ``runs.CommandFailed``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    stop = None
    text = finished_training(run_dir, cfg)
    if text is not None:
        logger.info("%s seed %d: training had finished, evaluating %s", label, seed, run_dir)
    else:
        cmd = run_command(label, seed, data_bin, run_dir, cfg)
        logger.info("%s seed %d: training (%d updates) -> %s", label, seed, cfg.max_update, run_dir)
        try:
            text = runs.run(cmd, run_dir / "train.log")
        except runs.CommandFailed:
            text = (run_dir / "train.log").read_text(encoding="utf-8")
            stop = runs.nan_inf_stop(text)
            if stop is None:
                raise  # a signal, OOM, disk, ...: an error, trained again on the next start
    wall = log_seconds(text)
    curve = runs.valid_curve(text)
    losses = train_losses(text)
    reason = diverged_reason(curve, losses, stop)
    stall = None if reason else stall_reason(curve, cfg.warmup)
    result = {
        "variant": label,
        "arch": VARIANTS[label][0],
        "seed": seed,
        "valid_curve": curve,
        "valid_loss": curve[-1]["loss"] if curve else None,
        "updates": curve[-1]["update"] if curve else 0,
        "diverged": bool(reason),
        "diverged_reason": reason or None,
        "stalled": None if stall is None else bool(stall),
        "stall_reason": stall or None,
        "test_bleu": None,
        "test_sacrebleu": None,
        "attention_js": None,
        "wall_s": round(wall, 1),
    }
    checkpoint = run_dir / "checkpoint_last.pt"
    if checkpoint.exists() and not reason:
        start = time.time()
        scores = evaluate(data_bin, checkpoint, run_dir, cfg)
        result.update(test_bleu=scores["tokenized"], test_sacrebleu=scores["sacrebleu"])
        result["attention_js"] = attention_js(checkpoint, data_bin, run_dir, cfg)
        result["eval_wall_s"] = round(time.time() - start, 1)
    logger.info(
        "%s seed %d: valid loss %s after %d updates, test BLEU %s (sacreBLEU %s)%s%s, %.0f s",
        label, seed, _fmt(result["valid_loss"], 3), result["updates"],
        _fmt(result["test_bleu"], 2), _fmt(result["test_sacrebleu"], 2),
        f", DIVERGED: {reason}" if reason else "", f", STALLED: {stall}" if stall else "", wall,
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
    stalled = sorted(f"{r['variant']} seed {r['seed']}" for r in results if r.get("stalled"))
    div += f" Stalled runs: {', '.join(stalled)}." if stalled else ""
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
        f"diverged | stalled | valid loss @ {cfg.max_update} | test BLEU (tok) | test sacreBLEU | "
        "mean adjacent-layer JS (enc / dec self / cross) | train s/run |"
    )
    lines = [head, "|" + "---|" * 9]
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
        stalled = sum(1 for r in rs if r.get("stalled"))
        lines.append(
            f"| {label} | {len(rs)} | {len(rs) - len(ok)} | {stalled} | {' | '.join(cells)} | "
            f"{' / '.join(js)} | {wall:.0f} |"
        )
    return "\n".join(lines)


def _mean_sd_text(s: Dict, digits: int) -> str:
    if s["mean"] is None:
        return "n/a"
    sd = "" if s["sd"] is None else f" ± {s['sd']:.{digits}f}"
    return f"{s['mean']:.{digits}f}{sd}"


PAIR = ("RealFormer+ADMIN", "ADMIN")  # the difference the study exists for


def figure(results: List[Dict], variants: Sequence[str], cfg):
    """Per metric (valid loss against updates; test BLEU) the variants on one axis, each seed
    thin and the seed mean bold, and beside it the paired difference RealFormer+ADMIN - ADMIN
    per seed (the same seed, two variants). Diverged runs: dotted, left out of means and pairs."""
    plt = plots.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), gridspec_kw={"width_ratios": [3, 2]})
    (loss_ax, loss_diff), (bleu_ax, bleu_diff) = axes
    colour = {label: f"C{i}" for i, label in enumerate(variants)}
    finite = [p["loss"] for r in results for p in r["valid_curve"] if math.isfinite(p["loss"])]
    for label in variants:
        rs = sorted((r for r in results if r["variant"] == label), key=lambda r: r["seed"])
        for r in rs:
            xs, ys = zip(*((p["update"], p["loss"]) for p in r["valid_curve"])) or ((), ())
            style = ":" if r["diverged"] else "-"
            loss_ax.plot(xs, ys, style, color=colour[label], lw=0.8, alpha=0.6)
        ok = [r for r in rs if not r["diverged"] and r["valid_curve"]]
        if ok:
            ups, values = tables.seed_curves(ok, "loss")
            mean = [statistics.fmean(v) for v in values]
            loss_ax.plot(ups, mean, color=colour[label], lw=2.2, label=f"{label} (n={len(ok)})")
    if finite:
        loss_ax.set_ylim(min(finite) - 0.1, min(max(finite), min(finite) + 6) + 0.1)
    loss_ax.set(xlabel="updates", ylabel="valid loss (label-smoothed CE, base 2)",
                title="valid loss: seed mean (bold) and each seed (thin)")  # fmt: skip
    loss_ax.legend(fontsize=8)

    by = {(r["variant"], r["seed"]): r for r in results if not r["diverged"]}
    a, b = PAIR
    # seeds in colours of their own (C0.. are the variants')
    for i, seed in enumerate(sorted({s for v, s in by if v == a} & {s for v, s in by if v == b})):
        ca = {p["update"]: p["loss"] for p in by[(a, seed)]["valid_curve"]}
        cb = {p["update"]: p["loss"] for p in by[(b, seed)]["valid_curve"]}
        ups = sorted(set(ca) & set(cb))
        loss_diff.plot(
            ups, [ca[u] - cb[u] for u in ups], marker=".", color=f"C{4 + i}", label=f"seed {seed}"
        )
    if loss_diff.get_lines():
        loss_diff.legend(fontsize=8)
    loss_diff.axhline(0.0, color="k", lw=0.8)
    loss_diff.set(xlabel="updates", ylabel="valid loss difference",
                  title=f"{a} - {b}, same seed\n(below 0: {a} better)")  # fmt: skip

    for i, label in enumerate(variants):
        scored = [r for r in results if r["variant"] == label and r["test_bleu"] is not None
                  and not r["diverged"]]  # fmt: skip
        if not scored:
            continue
        bleu_ax.scatter([i] * len(scored), [r["test_bleu"] for r in scored], color=colour[label])
        for r in scored:
            bleu_ax.annotate(f" seed {r['seed']}", (i, r["test_bleu"]), fontsize=7)
        mean = statistics.fmean(r["test_bleu"] for r in scored)
        bleu_ax.hlines(mean, i - 0.25, i + 0.25, color=colour[label], lw=2.2)
    bleu_ax.set_xticks(range(len(variants)), list(variants))
    bleu_ax.set(ylabel="test BLEU (tokenized)", title="test BLEU: each seed (dots), mean (bar)")

    rows = paired(results, a, b)["per_seed"]
    diffs = [row["test_bleu"] for row in rows]
    bleu_diff.bar([f"seed {row['seed']}" for row in rows], diffs,
                  color=["C2" if d > 0 else "C3" for d in diffs])  # fmt: skip
    bleu_diff.axhline(0.0, color="k", lw=0.8)
    bleu_diff.set(
        ylabel="test BLEU difference", title=f"{a} - {b}, same seed\n(above 0: {a} better)"
    )
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"Tatoeba En-Fr, {cfg.encoder_layers}L-{cfg.decoder_layers}L d{cfg.width}, "
        f"{cfg.max_update} updates of {cfg.max_tokens} tokens, CPU"
    )
    return fig


def plot(results: List[Dict], variants: Sequence[str], path: Path, cfg):
    plots.save_figure(figure(results, variants, cfg), path, dpi=110)


# ---------------------------------------------------------------------------

# where each default comes from (the help of its flag)
SOURCES = {
    "--warmup": "updates of linear warm-up (default 90: 15 %% of the default 600-update budget, "
    "the fraction of this study's first version, 60 of 400; the recipe's 8,000 is 13x the "
    "whole budget). Not scaled with --max-update: inverse_sqrt does not depend on the budget, "
    "so a longer run's first 600 updates have the 600-update runs' schedule",
    "--max-update": "updates per run (default 600: the budget this CPU trains the 9 runs of "
    "18L-6L in, about 1.5 hours; docs/benchmarks.md)",
    "--valid-every": "updates between validations (default: 12 points, 50 at 600 updates)",
    "--lr": f"peak learning rate (default: the recipe's {RECIPE_VALUES['--lr']})",
    "--seeds": "default 1 2 3: the paired difference needs a spread (--quick: 1)",
    "--jobs": "runs in parallel, 1 thread each (default 2: the project's 2 cores)",
}
QUICK = dict(encoder_layers=2, decoder_layers=2, width=32, ffn=64, heads=2, bpe_size=200,
             max_train_pairs=2000, valid_pairs=20, test_pairs=20, max_tokens=512,
             attn_lines=10)  # fmt: skip


def parse_args(argv=None):
    p = runs.run_parser(__doc__, "nmt_depth", VARIANTS, jobs=2, sources=SOURCES)
    p.set_defaults(variants=list(DEFAULT_VARIANTS), lr=float(RECIPE_VALUES["--lr"]))
    depth = "the deepest encoder this CPU trains 9 runs of in about 1.5 hours (docs/benchmarks.md)"
    p.add_argument("--encoder-layers", type=int, default=18, help=depth)
    p.add_argument("--decoder-layers", type=int, default=6,
                   help="the 6L study's decoder: this study deepens the encoder only "
                   "(the paper deepens both, 60L-12L)")  # fmt: skip
    p.add_argument("--width", type=int, default=128, help="d_model: the 6L study's (convergence)")
    p.add_argument("--ffn", type=int, default=256, help="2x width, as the 6L study")
    p.add_argument("--heads", type=int, default=4, help="head size 32, as the 6L study")
    p.add_argument("--bpe-size", type=int, default=8000,
                   help="joint BPE merges: about the frequent word forms of the corpus")  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=1024,
                   help="tokens per batch (with --max-update, the CPU budget)")  # fmt: skip
    p.add_argument("--log-interval", type=int, default=10,
                   help="train_inner lines every N updates (10: 60 training losses of a "
                   "600-update run for the non-finite-loss check)")  # fmt: skip
    held = ("held-out pairs, {} (1,000: under 1 %% of Tatoeba's pairs, a third of newstest2014's "
            "3,003 sentences)")  # fmt: skip
    p.add_argument("--valid-pairs", type=int, default=1000, help=held.format("valid"))
    p.add_argument("--test-pairs", type=int, default=1000, help=held.format("test"))
    p.add_argument("--max-train-pairs", type=int, default=0, help="0: all")
    p.add_argument("--split-seed", type=int, default=20261206, help="the study's date")
    p.add_argument("--gen-batch", type=int, default=int(EVAL_VALUES["batch_size"]),
                   help="sentences per generation batch (default: the recipe's)")  # fmt: skip
    p.add_argument("--attn-lines", type=int, default=200,
                   help="valid pairs for the attention statistics (200: a sample for a mean JS "
                   "per layer, at a cost per run small next to its training)")  # fmt: skip
    p.add_argument("--replot", action="store_true",
                   help="rewrite the PNG from the stored JSON in --out; train nothing")  # fmt: skip
    args = runs.parse_run_args(p, argv, "nmt_depth", max_update=600, valid_points=12, warmup=90)
    if args.quick:
        vars(args).update(QUICK)
    return args


def replot(args, name: str) -> Path:
    """The PNG again from the study's JSON (its runs and config), without training."""
    stored = runs.read_json(args.out / f"{name}.json")
    if stored is None:
        raise runs.StudyError(f"{args.out / f'{name}.json'}: no stored study to plot")
    cfg = argparse.Namespace(**stored["config"])
    png = args.out / f"{name}.png"
    plot(stored["runs"], cfg.variants, png, cfg)
    logger.info("plotted %s from %s", png, args.out / f"{name}.json")
    return png


def main(argv=None):
    args = parse_args(argv)
    name = runs.study_name(args, "nmt_depth")
    if args.replot:
        replot(args, name)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    data_bin, t0 = runs.prepare(args, lambda: prepare_data(args))
    logger.info("%d runs", len(args.variants) * len(args.seeds))
    # seed-major, resumable; a failed run raises after the others, before the report
    results = runs.run_seeds(run_one, data_bin, args, SLUG, command=run_command)
    pair = paired(results, *PAIR)
    text = verdict(pair, results)
    md = table(results, args.variants, args)
    config = runs.config(args, drop=("quick", "force", "replot"))
    config["train_command_example"] = runs.command_line(
        train_command(data_bin, Path("SAVE_DIR"), "RealFormer+ADMIN", 1, args)
    )
    config["recipe_changes"] = (
        f"Transformer-Clinic admin 60-12l flags from {RECIPES.MD} (examples/wmt14_en_fr/"
        "recipes.py CLINIC_TRAIN) with: warm-up {args.warmup} updates (reference 8000), "
        f"{args.max_tokens}-token batches on one CPU process (reference 16 GPUs x 5000 x 16), "
        f"{args.max_update} updates (reference 50 epochs), float32 (reference fp16), "
        "the last checkpoint (reference: average of the last 10 epochs)"
    )
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
    runs.main_entry("studies.nmt_depth", main)
