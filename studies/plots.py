"""The studies' figures (matplotlib, from the ``plots`` extra: ``pip install -e '.[plots]'``,
which ``scripts/install.sh`` installs): validation curves with their seed band, and the figure
writer. Measures RealFormer (He et al., arXiv 2012.11747) and ADMIN (Liu et al., arXiv
2004.08249) runs; the numbers come from ``studies.tables``."""

import statistics
from pathlib import Path
from typing import Dict, List, Sequence

from realformer_fairseq.atomic_files import atomic_output

from .tables import seed_curves


def pyplot():
    """matplotlib.pyplot on the Agg backend; one line naming the extra when it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "studies: error: the plots need matplotlib: pip install -e '.[plots]' "
            "(scripts/install.sh installs it)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, png: Path, dpi: int):
    fig.tight_layout()
    with atomic_output(png) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    pyplot().close(fig)


def plot_seeds(ax, results: List[Dict], variants: Sequence[str], key: str, **style):
    """Per variant, the seed mean of ``key`` and its min-max band over the seeds."""
    for label in variants:
        runs = [r for r in results if r["variant"] == label]
        if runs:
            ups, vals = seed_curves(runs, key)
            mean = [statistics.fmean(v) for v in vals]
            ax.plot(ups, mean, label=f"{label} (n={len(runs)})", **style)
            ax.fill_between(ups, [min(v) for v in vals], [max(v) for v in vals], alpha=0.2)


def plot_curves(results, variants, key: str, png: Path, title: str, ylabel: str, log_y=False):
    """The validation curves of a study: seed mean and min-max band per variant."""
    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    plot_seeds(ax, results, variants, key, marker="o", ms=3)
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("updates")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, png, dpi=120)
