#!/usr/bin/env python
"""The RealFormer paper's claims, checked at CPU scale.

He, Ravula, Kanagal, Ainslie, "RealFormer: Transformer Likes Residual Attention"
(arXiv 2012.11747): §4.1 BERT pre-training (Post-LN, Pre-LN, RealFormer: held-out
masked-LM loss and accuracy), "converges faster", "stabilizes training" (a learning-rate
sweep) and §4.3 attention analysis (per-layer entropy, adjacent-layer JS divergence),
the latter also on NMT models with ADMIN init (Liu et al., arXiv 2004.08249).

Every run is a real ``fairseq-train --user-dir realformer_fairseq`` subprocess
(``--task masked_lm --criterion masked_lm_accuracy``); the attention statistics come
from ``realformer-attention-stats``; the NMT checkpoints from ``scripts/convergence.py``
(``--keep-checkpoints``). Each finished run writes ``result.json`` in its run directory
and is skipped when the driver is started again (resume); the report (JSON + PNG) is
rewritten from whatever has finished.

Data: English side of Tatoeba (``../shared/data/enfr/tatoeba``), shuffled with a fixed
seed, split into train / valid (held out, never trained on) / analysis lines;
lower-cased, split into words and punctuation, joint BPE (subword-nmt).

Reduced configuration (default; what docs/paper_checks.md reports): 6 layers, d 64, ffn 256,
4 heads, 8 x 128 tokens per update, 3000 updates: 6.3 updates/s per run measured on this 2-core
machine when quiet (one thread per run, two runs at a time), about 8 min per run, ~75 min for
the whole default plan. ``--full`` is the issue's size (6L, d 256, 32 x 128 tokens, 3000
updates): 0.43 updates/s measured on the quiet machine, ~2 h per run, ~14 h for the plan.

usage:
    python scripts/paper_checks.py                 # the doc's runs: 3 seeds, LR sweep, NMT attention
    python scripts/paper_checks.py --full          # the issue's size (6L, d 256, 3000 updates)
    python scripts/paper_checks.py --jobs 2 --only mlm lr   # parts: mlm lr nmt
"""

import argparse
import json
import math
import os
import random
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

import convergence
import study
from study import (
    DEFAULT_DATA,
    REPO_ROOT,
    StudyError,
    config,
    fairseq_command,
    finished,
    log_records,
    pyplot,
    read_json,
    read_lines,
    run,
    save_figure,
    seed_curves,
    valid_curve,
    write_atomic,
    write_json,
)

NMT_VARIANTS = (("ADMIN", "admin_transformer"), ("RealFormer+ADMIN", "realformer"))
VARIANTS = {"Post-LN": "postln_bert", "Pre-LN": "preln_bert", "RealFormer": "realformer_bert"}
SIZES = {  # name -> layers, width, heads, ffn, batch size (samples of --tokens-per-sample)
    "reduced": (6, 64, 4, 256, 8),
    "full": (6, 256, 4, 1024, 32),
}
log = study.get_logger("paper_checks")


# ---------------------------------------------------------------------------
# data


def tokenize(line: str) -> str:
    return " ".join(re.findall(r"\w+|[^\w\s]", line.lower()))


def prepare_mlm_data(data_root: Path, work: Path, n_valid: int, n_analysis: int, merges: int):
    """Shuffle (seed 0) and split Tatoeba English; BPE; fairseq-preprocess --only-source."""
    import io

    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    data_bin = work / "mlm-bin"
    if (data_bin / "valid.bin").exists():
        return data_bin
    lines = read_lines(data_root / "tatoeba" / "fra-eng.no-tatoeba-test.en", None)
    lines = sorted(set(tokenize(x) for x in lines if x.strip()))  # dedup: no leak train/valid
    random.Random(0).shuffle(lines)
    splits = {
        "valid": lines[:n_valid],
        "analysis": lines[n_valid : n_valid + n_analysis],
        "train": lines[n_valid + n_analysis :],
    }
    codes = io.StringIO()
    learn_bpe(io.StringIO("\n".join(splits["train"]) + "\n"), codes, merges)
    bpe = BPE(io.StringIO(codes.getvalue()))
    bpe_dir = work / "mlm-bpe"
    bpe_dir.mkdir(parents=True, exist_ok=True)
    for name, part in splits.items():
        write_atomic(bpe_dir / name, "\n".join(bpe.process_line(x) for x in part) + "\n")
    # analysis input: consecutive held-out sentences packed to <= 120 BPE tokens per line,
    # like the training blocks (--sample-break-mode complete)
    packed, cur = [], []
    for sent in (bpe_dir / "analysis").read_text(encoding="utf-8").splitlines():
        if cur and len(cur) + len(sent.split()) > 120:
            packed.append(" ".join(cur))
            cur = []
        cur += sent.split()
    write_atomic(work / "analysis.packed.bpe", "\n".join(packed) + "\n")
    tmp = work / "mlm-bin.tmp"
    run(
        [
            fairseq_command("fairseq-preprocess"), "--only-source",
            "--trainpref", bpe_dir / "train", "--validpref", bpe_dir / "valid",
            "--destdir", tmp, "--workers", "1",
        ],
        work / "preprocess.log",
    )  # fmt: skip
    os.replace(tmp, data_bin)
    return data_bin


# ---------------------------------------------------------------------------
# masked-LM runs


def mlm_command(data_bin: Path, save_dir: Path, arch: str, seed: int, lr: float, cfg) -> List:
    layers, width, heads, ffn, batch = SIZES[cfg.size]
    return [
        *study.train_head(data_bin, "masked_lm"),
        "--criterion", "masked_lm_accuracy", "--arch", arch,
        "--encoder-layers", layers, "--encoder-embed-dim", width,
        "--encoder-attention-heads", heads, "--encoder-ffn-embed-dim", ffn,
        "--tokens-per-sample", "128", "--sample-break-mode", "complete",
        "--batch-size", batch, "--required-batch-size-multiple", "1",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-6",
        "--weight-decay", "0.01", "--clip-norm", "0.0",
        "--lr", lr, "--lr-scheduler", "polynomial_decay",
        "--warmup-updates", cfg.max_update // 10, "--total-num-update", cfg.max_update,
        "--max-update", cfg.max_update,
        *study.run_flags(cfg.valid_every, save_dir, seed, log_interval=20),
    ]  # fmt: skip


def parse_mlm_log(text: str):
    """The valid curve (loss, accuracy) and the median updates/s of the training lines."""
    ups = [float(t["ups"]) for t in log_records(text, "train_inner") if "ups" in t]
    return valid_curve(text, "accuracy"), (statistics.median(ups) if ups else None)


def mlm_run_dir(cfg, label: str, lr: float, seed: int) -> Path:
    return cfg.work_dir / "runs" / f"{VARIANTS[label]}_lr{lr:g}_seed{seed}"


def nmt_run_dir(cfg, prefix: str) -> Path:
    """Where scripts/convergence.py (run by run_nmt) trains the NMT model ``prefix``."""
    return cfg.work_dir / "nmt" / "work" / "runs" / f"{prefix}_seed1"


def run_mlm(label: str, seed: int, lr: float, data_bin: Path, cfg) -> Optional[Dict]:
    arch = f"{VARIANTS[label]}_tiny"  # sizes come from the explicit flags
    run_dir = mlm_run_dir(cfg, label, lr, seed)
    result_file = run_dir / "result.json"
    result = finished(result_file)
    if result:
        return result
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    try:
        text = run(mlm_command(data_bin, run_dir, arch, seed, lr, cfg), run_dir / "train.log")
        failed = None
    except StudyError as err:  # divergence (e.g. fairseq's NaN-loss stop) is a result
        text = (run_dir / "train.log").read_text(encoding="utf-8")
        failed = str(err).splitlines()[-1][:300]
    curve, ups = parse_mlm_log(text)
    diverged = failed is not None or not curve or not all(math.isfinite(p["loss"]) for p in curve)
    result = {
        "variant": label,
        "arch": arch,
        "size": cfg.size,
        "seed": seed,
        "lr": lr,
        "max_update": cfg.max_update,
        "valid_curve": curve,
        "final_valid_loss": curve[-1]["loss"] if curve else float("nan"),
        "final_valid_accuracy": curve[-1]["accuracy"] if curve else float("nan"),
        "completed_updates": curve[-1]["update"] if curve else 0,
        "diverged": diverged,
        "error": failed,
        "median_ups": ups,
        "train_seconds": round(time.time() - start, 1),
    }
    if (run_dir / "checkpoint_last.pt").exists() and not diverged:
        attention_stats(
            run_dir / "checkpoint_last.pt",
            cfg.work_dir / "analysis.packed.bpe",
            run_dir / "attn",
            data_bin,
            cfg,
        )
        result["attention"] = load_attn(run_dir / "attn")
    write_json(result_file, result)
    log.info(
        "%s lr %g seed %d: valid loss %.3f acc %.2f (%.0fs, %.2f ups)",
        label,
        lr,
        seed,
        result["final_valid_loss"],
        result["final_valid_accuracy"],
        result["train_seconds"],
        ups or 0,
    )
    return result


def attention_stats(ckpt: Path, inp: Path, out: Path, data: Path, cfg, target: Path = None):
    cmd = [
        fairseq_command("realformer-attention-stats"),
        "--path",
        ckpt,
        "--input",
        inp,
        "--out-dir",
        out,
        "--data",
        data,
        "--cpu",
        "--max-lines",
        cfg.attn_lines,
        "--max-plot-points",
        "20000",
    ]
    if target:
        cmd += ["--target", target]
    run(cmd, out.with_suffix(".log"))


def load_attn(out: Path) -> Dict:
    stats = json.loads((out / "attention_stats.json").read_text(encoding="utf-8"))
    res = {
        chain: {
            "entropy_per_layer": s["entropy"]["per_layer"],
            "js_per_layer": s["js_divergence"]["per_layer"],
            "num_queries": s["num_queries"],
        }
        for chain, s in stats["chains"].items()
    }
    res["plots"] = [os.path.relpath(p, REPO_ROOT) for p in stats["plots"]]
    return res


# ---------------------------------------------------------------------------
# NMT (ADMIN vs RealFormer+ADMIN) through scripts/convergence.py


def run_nmt(cfg) -> Optional[Dict]:
    out = cfg.work_dir / "nmt"
    done = out / "attn_done.json"
    if done.exists():
        return read_json(done)
    work = out / "work"
    argv = [
        sys.executable,
        REPO_ROOT / "scripts" / "convergence.py",
        "--work-dir",
        work,
        "--out",
        out,
        "--variants",
        "ADMIN",
        "RealFormer+ADMIN",
        "--seeds",
        "1",
        "--max-update",
        cfg.nmt_updates,
        "--valid-every",
        max(cfg.nmt_updates // 4, 1),
        "--jobs",
        "2",
        "--keep-checkpoints",
    ]
    run(argv, out.with_suffix(".log"))
    res = {}
    for label, prefix in NMT_VARIANTS:
        run_dir = nmt_run_dir(cfg, prefix)
        attention_stats(
            run_dir / "checkpoint_last.pt",
            convergence.prepared_text(work, "test", "en"),
            run_dir / "attn",
            work / "data-bin",
            cfg,
            target=convergence.prepared_text(work, "test", "fr"),
        )
        res[label] = load_attn(run_dir / "attn")
    write_json(done, res)
    return res


# ---------------------------------------------------------------------------
# report


def mean_std(vals):
    return study.mean_std(vals, empty=(None, None))


def mean_curve(runs):
    """Seed-mean loss at the updates every run validated at."""
    return [{"update": u, "loss": statistics.fmean(v)} for u, v in zip(*seed_curves(runs, "loss"))]


def updates_to_reach(curve, target):
    """First validated update whose loss is <= target (None: never)."""
    return next((p["update"] for p in curve if p["loss"] <= target), None)


def summarise(mlm: List[Dict], sweep: List[Dict], nmt: Optional[Dict], cfg) -> Dict:
    table = {}
    for label in VARIANTS:
        runs = [r for r in mlm if r["variant"] == label and not r["diverged"]]
        table[label] = {
            "final_valid_loss": mean_std([r["final_valid_loss"] for r in runs]),
            "final_valid_accuracy": mean_std([r["final_valid_accuracy"] for r in runs]),
            "seeds": [r["seed"] for r in runs],
        }
    # convergence speed: updates to reach Post-LN's final loss (mean over Post-LN seeds);
    # per seed and on the seed-mean curve
    speed = {}
    base = table["Post-LN"]["final_valid_loss"]["mean"]
    postln = {
        r["seed"]: r["final_valid_loss"]
        for r in mlm
        if r["variant"] == "Post-LN" and not r["diverged"]
    }
    if base is not None:
        for label in VARIANTS:
            runs = [r for r in mlm if r["variant"] == label and not r["diverged"]]
            speed[label] = {
                "target_loss": base,
                "per_seed": {r["seed"]: updates_to_reach(r["valid_curve"], base) for r in runs},
                "seed_mean_curve": updates_to_reach(mean_curve(runs), base) if runs else None,
                # paired by seed (same initial RNG and batch order): the same seed's Post-LN
                "paired": {
                    r["seed"]: {
                        "updates_to_reach": updates_to_reach(r["valid_curve"], postln[r["seed"]]),
                        "loss_minus_postln": r["final_valid_loss"] - postln[r["seed"]],
                    }
                    for r in runs
                    if r["seed"] in postln
                },
            }
    attn = {}
    for label in VARIANTS:
        runs = [r for r in mlm if r["variant"] == label and "attention" in r]
        if runs:
            attn[label] = {
                m: [
                    mean_std([r["attention"]["encoder"][key]["mean"][layer] for r in runs])["mean"]
                    for layer in range(len(runs[0]["attention"]["encoder"][key]["mean"]))
                ]
                for m, key in (("entropy", "entropy_per_layer"), ("js", "js_per_layer"))
            }
    return {
        "mlm_table": table,
        "updates_to_postln_final_loss": speed,
        "mlm_attention": attn,
        "lr_sweep": [
            {
                k: r[k]
                for k in (
                    "variant",
                    "lr",
                    "seed",
                    "final_valid_loss",
                    "final_valid_accuracy",
                    "diverged",
                    "completed_updates",
                )
            }
            for r in sweep
        ],
        "nmt_attention": nmt,
    }


def plot(mlm, sweep, summary, nmt, out: Path, cfg):
    plt = pyplot()

    # 1. curves: mean and min/max band over seeds, loss and accuracy
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("loss", "accuracy")):
        study.plot_seeds(ax, [r for r in mlm if not r["diverged"]], VARIANTS, key)
    base = summary["mlm_table"]["Post-LN"]["final_valid_loss"]["mean"]
    if base:
        axes[0].axhline(base, ls=":", c="grey", lw=1, label="Post-LN final")
    axes[0].set_ylabel("held-out masked-LM loss (base 2)")
    axes[1].set_ylabel("held-out masked-LM accuracy (%)")
    for ax in axes:
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    layers, width, heads, ffn, batch = SIZES[cfg.size]
    fig.suptitle(
        f"Masked LM on Tatoeba en, {layers}L d={width} {heads}h, 128 tok x {batch}, "
        f"{cfg.max_update} updates, CPU",
        fontsize=9,
    )
    save(fig, out / "paper_checks_mlm_curves.png")

    # 2. attention: per-layer mean entropy and JS, MLM (3 variants) and NMT (3 chains)
    panels = [("MLM encoder", summary["mlm_attention"])]
    if nmt:
        for chain in ("encoder", "decoder", "cross"):
            panels.append(
                (
                    f"NMT {chain}",
                    {
                        lab: {
                            "entropy": nmt[lab][chain]["entropy_per_layer"]["mean"],
                            "js": nmt[lab][chain]["js_per_layer"]["mean"],
                        }
                        for lab in nmt
                        if chain in nmt[lab]
                    },
                )
            )
    fig, axes = plt.subplots(2, len(panels), figsize=(4 * len(panels), 6.5), squeeze=False)
    for col, (title, data) in enumerate(panels):
        for label, d in data.items():
            for row, key in enumerate(("entropy", "js")):
                ys = [y for y in d[key]]
                xs = [i for i, y in enumerate(ys) if y is not None]
                axes[row][col].plot(xs, [ys[i] for i in xs], marker="o", ms=3, label=label)
        axes[0][col].set_title(title, fontsize=9)
        axes[0][col].set_ylabel("mean attention entropy (nats)")
        axes[1][col].set_ylabel("mean JS(layer l, l-1), same head (nats)")
        for row in range(2):
            axes[row][col].set_xlabel("layer")
            axes[row][col].grid(alpha=0.3)
            axes[row][col].legend(fontsize=7)
    fig.suptitle("Attention analysis (RealFormer §4.3), held-out text", fontsize=9)
    save(fig, out / "paper_checks_attention.png")

    # 3. the tool's own violin plots side by side: MLM (seed 1 of each variant, entropy and
    # JS of the encoder) and NMT (ADMIN vs RealFormer+ADMIN, entropy of each chain)
    mlm_panels = {}
    for label in VARIANTS:
        r = next((r for r in mlm if r["variant"] == label and "attention" in r), None)
        if r:
            run_dir = mlm_run_dir(cfg, label, r["lr"], r["seed"])
            for metric in ("entropy", "js"):
                mlm_panels[(metric, f"{label} seed {r['seed']}: {metric}")] = (
                    run_dir / "attn" / f"encoder_{metric}_violin.png"
                )
    violins(plt, mlm_panels, out / "paper_checks_attention_violins.png")
    if nmt:
        nmt_panels = {
            (chain, f"{label}: {chain} entropy"): nmt_run_dir(cfg, prefix)
            / "attn" / f"{chain}_entropy_violin.png"
            for chain in ("encoder", "decoder", "cross")
            for label, prefix in NMT_VARIANTS
        }  # fmt: skip
        violins(plt, nmt_panels, out / "paper_checks_nmt_violins.png")

    # 4. LR sweep
    if sweep:
        fig, ax = plt.subplots(figsize=(6, 4))
        for label in ("Post-LN", "RealFormer"):
            pts = sorted((r["lr"], r) for r in sweep if r["variant"] == label)
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [
                        p[1]["final_valid_loss"] if not p[1]["diverged"] else float("nan")
                        for p in pts
                    ],
                    marker="o",
                    label=label,
                )
                for lr, r in pts:
                    if r["diverged"]:
                        ax.annotate("diverged", (lr, ax.get_ylim()[1]), fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel(f"held-out MLM loss @ {cfg.max_update} updates")
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, out / "paper_checks_lr_sweep.png")


def save(fig, path: Path):
    save_figure(fig, path, dpi=110)


def violins(plt, panels: Dict, png: Path):
    """``{(row, title): png}`` -> one figure, a row per distinct ``row``, in order."""
    panels = {key: path for key, path in panels.items() if path.exists()}
    if not panels:
        return
    rows = list(dict.fromkeys(row for row, _ in panels))
    cols = max(sum(1 for r, _ in panels if r == row) for row in rows)
    fig, axes = plt.subplots(len(rows), cols, figsize=(6 * cols, 4 * len(rows)), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, row in enumerate(rows):
        for col, (title, path) in enumerate((t, p) for (r, t), p in panels.items() if r == row):
            axes[i][col].imshow(plt.imread(path))
            axes[i][col].set_title(title, fontsize=9)
    save(fig, png)


def report(mlm, sweep, nmt, cfg, t0):
    summary = summarise(mlm, sweep, nmt, cfg)
    settings = config(cfg)
    settings["model"] = dict(
        zip(("layers", "width", "heads", "ffn", "batch_size"), SIZES[cfg.size])
    )
    out = {
        "description": "RealFormer paper checks at CPU scale: masked LM on Tatoeba en "
        "(held-out valid split), LR sweep, attention entropy / JS (realformer-attention-stats)",
        "config": settings,
        "train_command_example": " ".join(
            map(str, mlm_command(Path("DATA_BIN"), Path("SAVE_DIR"), "ARCH", 1, cfg.lr, cfg))
        ),
        "summary": summary,
        "runs": mlm + [r for r in sweep if r not in mlm],
        "wall_seconds_this_invocation": round(time.time() - t0, 1),
    }
    cfg.out.mkdir(parents=True, exist_ok=True)
    write_json(cfg.out / "paper_checks.json", out)
    plot(mlm, sweep, summary, nmt, cfg.out, cfg)
    write_atomic(cfg.out / "paper_checks_results.md", markdown(summary, cfg))
    return summary


def fmt(ms, digits=3):
    if not ms or ms["mean"] is None:
        return "not run"
    return f"{ms['mean']:.{digits}f} ± {ms['std']:.{digits}f} (n={ms['n']})"


def markdown(summary, cfg) -> str:
    """The generated tables of docs/paper_checks.md (numbers only; the verdicts are prose)."""
    layers, width, heads, ffn, batch = SIZES[cfg.size]
    rows = [
        f"MLM, {layers}L d={width} {heads} heads ffn {ffn}, 128 tokens x {batch} per update, "
        f"{cfg.max_update} updates, peak LR {cfg.lr:g}; held-out valid split",
        "",
        "| variant | held-out MLM loss (base 2) | held-out MLM accuracy (%) | updates to reach "
        "Post-LN's final loss (per seed; seed-mean curve) |",
        "|---|---|---|---|",
    ]
    for label, t in summary["mlm_table"].items():
        sp = summary["updates_to_postln_final_loss"].get(label, {})
        per = (
            ", ".join(
                f"s{k}: {v if v is not None else 'never'}"
                for k, v in sp.get("per_seed", {}).items()
            )
            or "not run"
        )
        mean_c = sp.get("seed_mean_curve")
        rows.append(
            f"| {label} | {fmt(t['final_valid_loss'])} | {fmt(t['final_valid_accuracy'], 2)} | "
            f"{per}; {mean_c if mean_c is not None else 'never'} |"
        )
    rows += [
        "",
        "Paired by seed (same initial RNG and batch order as that seed's Post-LN run):",
        "",
        "| variant | final loss − Post-LN's (bits, per seed) | updates to reach that seed's "
        "Post-LN final loss |",
        "|---|---|---|",
    ]
    for label, sp in summary["updates_to_postln_final_loss"].items():
        paired = sp.get("paired", {})
        rows.append(
            f"| {label} | "
            + ", ".join(f"s{k}: {v['loss_minus_postln']:+.3f}" for k, v in paired.items())
            + " | "
            + ", ".join(f"s{k}: {v['updates_to_reach'] or 'never'}" for k, v in paired.items())
            + " |"
        )
    rows += ["", "Attention (MLM encoder, seed mean), per layer 0..L-1:", ""]
    rows += ["| variant | mean entropy (nats) | mean JS to layer below (nats) |", "|---|---|---|"]
    for label, a in summary["mlm_attention"].items():
        ent = " ".join(f"{x:.3f}" for x in a["entropy"])
        js = " ".join("-" if x is None else f"{x:.4f}" for x in a["js"])
        rows.append(f"| {label} | {ent} | {js} |")
    rows += [
        "",
        "LR sweep (seed 1):",
        "",
        "| variant | peak LR | held-out loss | accuracy | diverged |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(summary["lr_sweep"], key=lambda r: (r["variant"], r["lr"])):
        rows.append(
            f"| {r['variant']} | {r['lr']:g} | {r['final_valid_loss']:.3f} | "
            f"{r['final_valid_accuracy']:.2f} | {r['diverged']} |"
        )
    nmt = summary.get("nmt_attention")
    rows += ["", "NMT attention (ADMIN vs RealFormer+ADMIN, seed 1), per layer 0..L-1:", ""]
    if not nmt:
        rows.append("not run")
    else:
        rows += ["| chain | variant | mean entropy (nats) | mean JS to layer below (nats) |"]
        rows += ["|---|---|---|---|"]
        for chain in ("encoder", "decoder", "cross"):
            for label, chains in nmt.items():
                if chain in chains:
                    ent = " ".join(f"{x:.3f}" for x in chains[chain]["entropy_per_layer"]["mean"])
                    js = " ".join(
                        "-" if x is None else f"{x:.4f}"
                        for x in chains[chain]["js_per_layer"]["mean"]
                    )
                    rows.append(f"| {chain} | {label} | {ent} | {js} |")
    return "\n".join(rows) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--work-dir", type=Path, default=REPO_ROOT / "work_dirs" / "paper_checks")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "docs")
    p.add_argument(
        "--full",
        action="store_true",
        help="the issue's scale: 6L d256 ffn 1024, 32x128 tokens, 3000 updates",
    )
    p.add_argument("--max-update", type=int, default=None)
    p.add_argument("--valid-every", type=int, default=None)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--lr", type=float, default=1e-3, help="peak LR of the MLM table")
    p.add_argument("--sweep-lrs", nargs="+", type=float, default=[3e-3, 1e-2])
    p.add_argument("--nmt-updates", type=int, default=1500)
    p.add_argument("--attn-lines", type=int, default=300)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--only", nargs="+", default=["mlm", "lr", "nmt"], choices=["mlm", "lr", "nmt"])
    p.add_argument("--report-only", action="store_true", help="rewrite the report, run nothing")
    args = p.parse_args(argv)
    args.size = "full" if args.full else "reduced"
    args.max_update = args.max_update or 3000
    args.valid_every = args.valid_every or max(args.max_update // 30, 1)
    if args.full:
        args.work_dir = args.work_dir.with_name(args.work_dir.name + "_full")
    return args


def main(argv=None):
    cfg = parse_args(argv)
    t0 = time.time()
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    data_bin = prepare_mlm_data(cfg.data, cfg.work_dir, 2000, 1500, 3000)
    jobs = []
    if "mlm" in cfg.only:
        jobs += [("mlm", lab, s, cfg.lr) for s in cfg.seeds for lab in VARIANTS]
    if "lr" in cfg.only:
        jobs += [
            ("lr", lab, cfg.seeds[0], lr)
            for lr in cfg.sweep_lrs
            for lab in ("Post-LN", "RealFormer")
        ]
    if "nmt" in cfg.only:
        jobs.append(("nmt", None, None, None))

    def do(job):
        kind, lab, seed, lr = job
        if cfg.report_only:
            if kind == "nmt":
                return read_json(cfg.work_dir / "nmt" / "attn_done.json")
            return read_json(mlm_run_dir(cfg, lab, lr, seed) / "result.json")
        if kind == "nmt":
            return run_nmt(cfg)
        return run_mlm(lab, seed, lr, data_bin, cfg)

    results = {}
    with ThreadPoolExecutor(max_workers=cfg.jobs) as pool:
        futures = {job: pool.submit(do, job) for job in jobs}
        for job, fut in futures.items():
            try:
                results[job] = fut.result()
            except StudyError as err:
                log.error("%s failed: %s", job, err)
                results[job] = None
    mlm = [r for (k, *_), r in results.items() if k == "mlm" and r]
    base = [r for r in mlm if r["seed"] == cfg.seeds[0] and r["variant"] != "Pre-LN"]
    sweep = base + [r for (k, *_), r in results.items() if k == "lr" and r]
    nmt = next((r for (k, *_), r in results.items() if k == "nmt"), None)
    summary = report(mlm, sweep, nmt, cfg, t0)
    print(json.dumps(summary["mlm_table"], indent=1))
    log.info("done in %.0fs; report in %s", time.time() - t0, cfg.out / "paper_checks.json")


if __name__ == "__main__":
    main()
