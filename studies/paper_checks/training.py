"""The runs of the RealFormer paper checks (He et al., arXiv 2012.11747): masked-LM
``fairseq-train`` runs (one ``result.json`` each), the NMT runs of ``studies.convergence``
(ADMIN vs RealFormer+ADMIN, Liu et al. arXiv 2004.08249), and ``realformer-attention-stats`` on
every final checkpoint.

A stored result carries its definition (``studies.runs.definition``) and is reused, or reported
by ``--report-only``, only when that is the definition asked for now (``studies.runs.finished``:
otherwise a WARNING names what differs). An MLM run: its ``fairseq-train`` command, the
fingerprint of the masked-LM data and the settings that shape it. The NMT attention statistics
(``nmt/attn_done.json``): the ``studies.convergence`` command, the fingerprint of the
checkpoints, data and text they are computed from, and ``--attn-lines``; the NMT runs
themselves are ``studies.convergence``'s, which reuses them by their own definitions."""

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from .. import convergence
from ..runs import (
    REPO_ROOT,
    CommandFailed,
    claim,
    data_fingerprint,
    definition,
    fairseq_command,
    finished,
    get_logger,
    log_records,
    nan_inf_stop,
    run,
    run_flags,
    train_head,
    valid_curve,
    write_json,
)
from .config import NMT_VARIANTS, SIZES, VARIANTS, mlm_run_dir, nmt_run_dir

log = get_logger("paper_checks")

# settings that do not define one MLM run (its own lr is in its command) or the NMT part
MLM_NOT_DEFINING = ("lr", "sweep_lrs", "only", "nmt_updates", "full")
NMT_NOT_DEFINING = ("lr", "sweep_lrs", "only", "full", "size", "max_update", "valid_every")


def mlm_command(data_bin: Path, save_dir: Path, arch: str, seed: int, lr: float, cfg) -> List:
    layers, width, heads, ffn, batch = SIZES[cfg.size]
    return [
        *train_head(data_bin, "masked_lm"),
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
        *run_flags(cfg.valid_every, save_dir, seed, log_interval=20),
    ]  # fmt: skip


def parse_mlm_log(text: str):
    """The valid curve (loss, accuracy) and the median updates/s of the training lines."""
    ups = [float(t["ups"]) for t in log_records(text, "train_inner") if "ups" in t]
    return valid_curve(text, "accuracy"), (statistics.median(ups) if ups else None)


def mlm_arch(label: str) -> str:
    return f"{VARIANTS[label]}_tiny"  # sizes come from the explicit flags


def mlm_definition(label: str, seed: int, lr: float, data_bin: Path, cfg):
    """(run folder, ``fairseq-train`` command, definition) of one MLM run."""
    run_dir = mlm_run_dir(cfg, label, lr, seed)
    cmd = mlm_command(data_bin, run_dir, mlm_arch(label), seed, lr, cfg)
    wanted = definition(cmd, data_fingerprint(data_bin), cfg, run_dir, drop=MLM_NOT_DEFINING)
    return run_dir, cmd, wanted


def stored_mlm(label: str, seed: int, lr: float, data_bin: Path, cfg) -> Optional[Dict]:
    """The stored result of this MLM run (``--report-only``): None when there is none or it is
    another definition's (WARNING)."""
    run_dir, _, wanted = mlm_definition(label, seed, lr, data_bin, cfg)
    return finished(run_dir / "result.json", wanted, report_only=True)


def run_mlm(label: str, seed: int, lr: float, data_bin: Path, cfg) -> Optional[Dict]:
    run_dir, cmd, wanted = mlm_definition(label, seed, lr, data_bin, cfg)
    result_file = run_dir / "result.json"
    result = finished(result_file, wanted)
    if result:
        return result
    # another definition's folder (its checkpoint_last.pt would be resumed) goes aside
    claim(run_dir, wanted)
    start = time.time()
    try:
        text = run(cmd, run_dir / "train.log")
        failed = None
    except CommandFailed:
        text = (run_dir / "train.log").read_text(encoding="utf-8")
        failed = nan_inf_stop(text)  # fairseq's NaN/Inf stop: a divergence, a result
        if failed is None:
            raise  # a signal, OOM, disk, ...: an error, retried on the next start
    curve, ups = parse_mlm_log(text)
    diverged = failed is not None or not curve or not all(math.isfinite(p["loss"]) for p in curve)
    result = {
        "variant": label,
        "arch": mlm_arch(label),
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
        "definition": wanted,
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
        fairseq_command("realformer-attention-stats"), "--path", ckpt, "--input", inp,
        "--out-dir", out, "--data", data, "--cpu", "--max-lines", cfg.attn_lines,
        "--max-plot-points", "20000",
    ]  # fmt: skip
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
    res["plots"] = [os.path.relpath(out / p, REPO_ROOT) for p in stats["plots"]]
    return res


# ---------------------------------------------------------------------------
# NMT (ADMIN vs RealFormer+ADMIN) through studies.convergence


def nmt_command(cfg) -> List:
    """``python -m studies.convergence`` for the NMT part (the paper checks' ``--data``)."""
    out = cfg.work_dir / "nmt"
    return [
        sys.executable, "-m", convergence.__name__, "--data", cfg.data, "--work-dir",
        out / "work", "--out", out, "--variants", *(label for label, _ in NMT_VARIANTS),
        "--seeds", "1", "--max-update", cfg.nmt_updates,
        "--valid-every", max(cfg.nmt_updates // 4, 1), "--jobs", "2", "--keep-checkpoints",
    ]  # fmt: skip


def nmt_definition(cfg) -> Dict:
    """What defines the NMT attention statistics: the convergence command, the fingerprint of
    its checkpoints, its data-bin and the test text they are computed on, ``--attn-lines``."""
    work = cfg.work_dir / "nmt" / "work"
    inputs = [nmt_run_dir(cfg, prefix) / "checkpoint_last.pt" for _, prefix in NMT_VARIANTS]
    inputs += [work / "data-bin"]
    inputs += [convergence.prepared_text(work, "test", lang) for lang in ("en", "fr")]
    return definition(nmt_command(cfg), data_fingerprint(inputs), cfg, cfg.work_dir / "nmt",
                      drop=NMT_NOT_DEFINING)  # fmt: skip


def stored_nmt(cfg) -> Optional[Dict]:
    """The stored NMT attention statistics (``--report-only``): None when there are none or
    they are another definition's (WARNING)."""
    done = finished(cfg.work_dir / "nmt" / "attn_done.json", nmt_definition(cfg), report_only=True)
    return done and done["attention"]


def run_nmt(cfg) -> Optional[Dict]:
    """The convergence runs (reused by their definitions), then the attention statistics of
    their checkpoints, unless those stored are of the same definition."""
    out = cfg.work_dir / "nmt"
    work = out / "work"
    run(nmt_command(cfg), out.with_suffix(".log"))
    wanted = nmt_definition(cfg)
    done = finished(out / "attn_done.json", wanted)
    if done:
        return done["attention"]
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
    write_json(out / "attn_done.json", {"attention": res, "definition": wanted})
    return res
