"""The figures of the RealFormer paper checks (He et al., arXiv 2012.11747; matplotlib, from the
``plots`` extra): masked-LM curves, per-layer attention entropy and JS divergence (MLM and the
three NMT chains), the tool's violin plots side by side, and the LR sweep."""

from pathlib import Path
from typing import Dict

from ..plots import plot_seeds, pyplot, save_figure
from .config import NMT_VARIANTS, SIZES, VARIANTS, mlm_run_dir, nmt_run_dir


def plot(mlm, sweep, summary, nmt, out: Path, cfg):
    plt = pyplot()

    # 1. curves: mean and min/max band over seeds, loss and accuracy
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("loss", "accuracy")):
        plot_seeds(ax, [r for r in mlm if not r["diverged"]], VARIANTS, key)
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
