#!/usr/bin/env python
"""Report of the convergence study (scripts/convergence.py): mean and spread over seeds,
a Markdown table and a plot of the validation curves.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).
Each run is a dict ``{"variant", "seed", "valid_curve": [{"update", "loss"}, ...],
"final_valid_loss", "test_bleu", "train_seconds"}``.
"""

import math
import os
import statistics
from pathlib import Path
from typing import Dict, List, Sequence


def mean_std(values: Sequence[float]) -> Dict[str, float]:
    finite = [v for v in values if math.isfinite(v)]
    return {
        "mean": statistics.fmean(finite) if finite else float("nan"),
        "std": statistics.stdev(finite) if len(finite) > 1 else 0.0,
        "n": len(finite),
    }


def summarise(results: List[Dict], variants: Sequence[str]) -> Dict[str, Dict]:
    summary = {}
    for label in variants:
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


def plot_curves(results: List[Dict], variants: Sequence[str], png: Path, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in variants:
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
