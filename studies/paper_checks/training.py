"""The runs of the RealFormer paper checks (He et al., arXiv 2012.11747): masked-LM
``fairseq-train`` runs (one ``result.json`` each, skipped when present), the NMT runs of
``studies.convergence`` (ADMIN vs RealFormer+ADMIN, Liu et al. arXiv 2004.08249), and
``realformer-attention-stats`` on every final checkpoint."""

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
    data_fingerprint,
    definition,
    fairseq_command,
    finished,
    get_logger,
    log_records,
    nan_inf_stop,
    read_json,
    run,
    run_flags,
    train_head,
    valid_curve,
    write_json,
)
from .config import NMT_VARIANTS, SIZES, VARIANTS, mlm_run_dir, nmt_run_dir

log = get_logger("paper_checks")


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


def run_mlm(label: str, seed: int, lr: float, data_bin: Path, cfg) -> Optional[Dict]:
    arch = f"{VARIANTS[label]}_tiny"  # sizes come from the explicit flags
    run_dir = mlm_run_dir(cfg, label, lr, seed)
    result_file = run_dir / "result.json"
    cmd = mlm_command(data_bin, run_dir, arch, seed, lr, cfg)
    # the run's own lr is in its command; the other runs' lrs and the NMT part do not define it
    wanted = definition(cmd, data_fingerprint(data_bin), cfg, run_dir,
                        drop=("lr", "sweep_lrs", "only", "nmt_updates", "full"))  # fmt: skip
    result = finished(result_file, wanted)
    if result:
        return result
    run_dir.mkdir(parents=True, exist_ok=True)
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


def run_nmt(cfg) -> Optional[Dict]:
    out = cfg.work_dir / "nmt"
    done = out / "attn_done.json"
    if done.exists():
        return read_json(done)
    work = out / "work"
    argv = [
        sys.executable, "-m", convergence.__name__, "--work-dir", work, "--out", out,
        "--variants", *(label for label, _ in NMT_VARIANTS), "--seeds", "1",
        "--max-update", cfg.nmt_updates, "--valid-every", max(cfg.nmt_updates // 4, 1),
        "--jobs", "2", "--keep-checkpoints",
    ]  # fmt: skip
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
