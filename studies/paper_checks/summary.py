"""The numbers of the RealFormer paper checks (He et al., arXiv 2012.11747), from the finished
runs: the masked-LM table, convergence speed (updates to reach Post-LN's final loss, per seed,
on the seed-mean curve and paired by seed), per-layer attention, the LR sweep, NMT attention."""

import statistics
from typing import Dict, List, Optional

from .. import tables
from ..tables import seed_curves
from .config import VARIANTS


def mean_std(vals):
    return tables.mean_std(vals, empty=(None, None))


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
