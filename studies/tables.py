"""Seed means and spreads, and the Markdown tables of the studies (RealFormer, He et al.
arXiv 2012.11747; ADMIN, Liu et al. arXiv 2004.08249). No plotting here: see
``studies.plots``."""

import math
import statistics
from typing import Dict, Iterable, List, Optional, Sequence


def mean_std(values: Iterable[Optional[float]], empty=(float("nan"), 0.0)) -> Dict[str, float]:
    """Mean and sample std of the finite values; ``empty`` is (mean, std) when there are none."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    mean, std = empty
    if finite:
        mean, std = statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0
    return {"mean": mean, "std": std, "n": len(finite)}


def summarise(results: List[Dict], variants: Sequence[str], keys: Sequence[str]) -> Dict:
    """``{variant: {key: mean_std over its runs}}``, for the variants that have runs."""
    summary = {}
    for label in variants:
        runs = [r for r in results if r["variant"] == label]
        if runs:
            summary[label] = {key: mean_std([r[key] for r in runs]) for key in keys}
    return summary


def summary_table(summary: Dict, header: Sequence[str], columns: Sequence) -> str:
    """A row per variant, a cell per ``(key, template)``: ``template.format(**mean_std)``."""
    rows = [[label] + [t.format(**s[key]) for key, t in columns] for label, s in summary.items()]
    return md_table(header, rows)


def md_table(header: Sequence, rows: Iterable[Sequence]) -> str:
    def line(cells):
        return "| " + " | ".join(map(str, cells)) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header)] + [line(r) for r in rows])


def seed_curves(runs: List[Dict], key: str):
    """The updates every run validated at, and per update the runs' values of ``key``."""
    updates = sorted(set.intersection(*[{p["update"] for p in r["valid_curve"]} for r in runs]))
    values = [
        [next(p[key] for p in r["valid_curve"] if p["update"] == u) for r in runs] for u in updates
    ]
    return updates, values
