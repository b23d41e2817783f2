"""The figures of ``realformer-attention-stats`` (RealFormer, He et al. arXiv 2012.11747, section
4.3): per chain and metric, violin plots of the per-token values by layer and layer x head
heatmaps of their means.

matplotlib comes from the ``plots`` extra (``pip install 'realformer-fairseq[plots]'``;
``scripts/install.sh`` installs it); the plugin itself never needs it, and this module imports it
only when a figure is drawn.
"""

import os
from typing import Dict, List

import numpy as np

from ..atomic_files import atomic_output
from ..errors import RealformerConfigError

MISSING_MATPLOTLIB = (
    "the plots need matplotlib, which is not installed: pip install 'realformer-fairseq[plots]' "
    "(scripts/install.sh installs it), or pass --no-plots"
)


class PlotsUnavailable(RealformerConfigError):
    """matplotlib is not installed (the ``plots`` extra); the message says what to do."""


def pyplot():
    """matplotlib.pyplot on the Agg backend, or :class:`PlotsUnavailable`."""
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable(MISSING_MATPLOTLIB) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _subsample(values: np.ndarray, limit: int, rng: np.random.Generator) -> np.ndarray:
    values = values.reshape(-1)
    if limit and values.size > limit:
        values = rng.choice(values, size=limit, replace=False)
    return values


def write_plots(out_dir: str, stats: Dict[str, object], max_points: int) -> List[str]:
    """Violin plots (per-token values by layer, heads pooled) and layer x head heatmaps of
    the means, per chain and metric, of ``attention_stats.ChainStats``. Returns the file
    names."""
    plt = pyplot()
    written = []
    rng = np.random.default_rng(0)
    labels = {"entropy": "attention entropy (nats)", "js": "JS divergence to layer l-1 (nats)"}
    for name, chain in stats.items():
        for metric in ("entropy", "js"):
            layers = [l for l in range(chain.num_layers) if chain.values(metric, l).shape[1] > 0]
            if not layers:
                continue  # one-layer chain: no JS divergence
            data = [_subsample(chain.values(metric, l), max_points, rng) for l in layers]
            fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(layers) + 2), 3.5))
            ax.violinplot(data, positions=layers, showmedians=True, widths=0.8)
            ax.set_xticks(layers)
            ax.set_xlabel("layer")
            ax.set_ylabel(labels[metric])
            ax.set_title(f"{name} attention: {metric} per layer")
            fig.tight_layout()
            written.append(_save_fig(fig, os.path.join(out_dir, f"{name}_{metric}_violin.png")))
            plt.close(fig)

            means = np.full((chain.num_layers, chain.num_heads), np.nan)
            for l in layers:
                means[l] = chain.values(metric, l).astype(np.float64).mean(axis=1)
            fig, ax = plt.subplots(
                figsize=(
                    max(3.5, 0.5 * chain.num_heads + 2),
                    max(3.0, 0.35 * chain.num_layers + 1.5),
                )
            )
            im = ax.imshow(
                np.ma.masked_invalid(means), aspect="auto", origin="lower", cmap="viridis"
            )
            fig.colorbar(im, ax=ax, label=f"mean {labels[metric]}")
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_xticks(range(chain.num_heads))
            ax.set_yticks(range(chain.num_layers))
            ax.set_title(f"{name} attention: mean {metric}")
            fig.tight_layout()
            written.append(_save_fig(fig, os.path.join(out_dir, f"{name}_{metric}_heatmap.png")))
            plt.close(fig)
    return written


def _save_fig(fig, path: str) -> str:
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return os.path.basename(path)
