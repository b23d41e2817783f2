"""GLUE's metrics (Wang et al. 2018, arXiv 1804.07461, Table 1) of the dev predictions, the
majority-class baseline, and the choice of the best candidate checkpoint (examples/glue).
Scored with scikit-learn / scipy, in percent as GLUE reports them. Library functions: they raise
InputError and return results; glue_tools.py's commands print (glue_report.py: the lines)."""

import collections
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

from glue_tasks import Task

from realformer_pipelines.errors import InputError
from realformer_pipelines.files import read_column, write_json_atomic


def _sklearn_scipy():
    try:
        import scipy.stats
        import sklearn.metrics
    except ImportError:
        raise InputError(
            "GLUE's metrics need scikit-learn and scipy: pip install -e '.[glue]'"
        ) from None
    return sklearn.metrics, scipy.stats


def glue_metrics(task: Task, gold: Sequence[str], pred: Sequence[str]) -> Dict[str, float]:
    """GLUE's metrics of the task, in percent (as GLUE reports them), plus the primary one."""
    metrics, stats = _sklearn_scipy()
    if len(gold) != len(pred):
        raise InputError(f"{len(pred)} predictions for {len(gold)} examples")
    out = {}
    if task.regression:
        g, p = [float(x) for x in gold], [float(x) for x in pred]
        out["pearson"] = 100 * float(stats.pearsonr(p, g)[0])
        out["spearman"] = 100 * float(stats.spearmanr(p, g)[0])
    else:
        out["accuracy"] = 100 * float(metrics.accuracy_score(gold, pred))
        if "f1" in task.metrics:  # the positive class: "1" (paraphrase, duplicate)
            out["f1"] = 100 * float(metrics.f1_score(gold, pred, pos_label="1", zero_division=0))
        if "mcc" in task.metrics:
            out["mcc"] = 100 * float(metrics.matthews_corrcoef(gold, pred))
    out = {k: v for k, v in out.items() if k in task.metrics or k == "accuracy"}
    if task.primary == "acc_and_f1":
        out["acc_and_f1"] = (out["accuracy"] + out["f1"]) / 2
    elif task.primary == "pearson_and_spearman":
        out["pearson_and_spearman"] = (out["pearson"] + out["spearman"]) / 2
    return out


def majority_label(task: Task, glue_dir: str) -> Optional[str]:
    """The most frequent training label (ties: the task's first): the majority-class baseline."""
    if task.regression:
        return None
    counts = collections.Counter(read_column(os.path.join(glue_dir, "train.label")))
    return max(task.labels, key=lambda label: (counts[label], -task.labels.index(label)))


def score(task: Task, data_bin: str, pred_dir: str, results_path: Optional[str], meta=()):
    """Dev metrics of the predictions in ``pred_dir`` against the gold labels kept by
    prepare.sh (DATA_BIN/glue/{subset}.label), and the majority-class baseline."""
    glue_dir = os.path.join(data_bin, "glue")
    results = {"task": task.name, "primary_metric": task.primary, "subsets": {}}
    majority = majority_label(task, glue_dir)
    for subset in task.subsets("dev"):
        gold = read_column(os.path.join(glue_dir, f"{subset}.label"))
        pred = read_column(os.path.join(pred_dir, f"{subset}.pred"))
        entry = {"examples": len(gold), "metrics": glue_metrics(task, gold, pred),
                 "file": task.split(subset).file}  # fmt: skip
        if majority is not None:
            entry["majority_class"] = {
                "label": majority,
                "metrics": glue_metrics(task, gold, [majority] * len(gold)),
            }
        results["subsets"][subset] = entry
    results["score"] = results["subsets"]["valid"]["metrics"][task.primary]
    for key, value in meta:
        results.setdefault("meta", {})[key] = value
    if results_path:
        write_json_atomic(results_path, results)
    return results


def select(results_paths: Sequence[str], test_subsets: Sequence[str]) -> dict:
    """The candidate with the best primary dev score (a tie goes to the first given): its
    results, every candidate's score, and where its test predictions go."""
    candidates: List[Tuple[dict, str]] = []
    for path in results_paths:
        with open(path, encoding="utf-8") as fh:
            candidates.append((json.load(fh), os.path.dirname(os.path.abspath(path))))
    best, best_dir = candidates[0]
    for result, pred_dir in candidates[1:]:
        if result["score"] > best["score"]:
            best, best_dir = result, pred_dir
    out = dict(best, checkpoint=best["meta"]["checkpoint"], pred_dir=best_dir)
    out["candidates"] = {r["meta"]["checkpoint"]: r["score"] for r, _ in candidates}
    out["test_predictions"] = {t: os.path.join(best_dir, f"{t}.pred") for t in test_subsets}
    return out
