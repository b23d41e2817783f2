"""Runs the plan of the RealFormer paper checks (He et al., arXiv 2012.11747) and writes the
report: ``paper_checks.json``, the figures and ``paper_checks_results.md``. Usage in the
package docstring (``python -m studies.paper_checks``)."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from realformer_fairseq.atomic_files import write_text_atomic

from ..runs import RunsFailed, config, write_json
from .config import BPE_MERGES, N_ANALYSIS, N_VALID, SIZES, VARIANTS, parse_args
from .data import mlm_data_bin, prepare_mlm_data
from .figures import plot
from .markdown import markdown
from .summary import summarise
from .training import log, mlm_command, run_mlm, run_nmt, stored_mlm, stored_nmt


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
    write_text_atomic(cfg.out / "paper_checks_results.md", markdown(summary, cfg))
    return summary


def main(argv=None):
    cfg = parse_args(argv)
    t0 = time.time()
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    if cfg.report_only:  # prepares nothing: without its data no stored run is of its definition
        data_bin = mlm_data_bin(cfg.work_dir)
    else:
        data_bin = prepare_mlm_data(cfg.data, cfg.work_dir, N_VALID, N_ANALYSIS, BPE_MERGES)
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
        if cfg.report_only:  # only the stored runs of the definitions asked for now
            if kind == "nmt":
                return stored_nmt(cfg)
            return stored_mlm(lab, seed, lr, data_bin, cfg)
        if kind == "nmt":
            return run_nmt(cfg)
        return run_mlm(lab, seed, lr, data_bin, cfg)

    results, failures = {}, []
    with ThreadPoolExecutor(max_workers=cfg.jobs) as pool:
        futures = {job: pool.submit(do, job) for job in jobs}
        for job, fut in futures.items():
            try:
                results[job] = fut.result()
            except Exception as err:  # every run ends; the failures are listed at the end
                log.error("%s failed: %s", job, err)
                failures.append(f"{job}: {str(err).splitlines()[0]}")
                results[job] = None
    mlm = [r for (k, *_), r in results.items() if k == "mlm" and r]
    base = [r for r in mlm if r["seed"] == cfg.seeds[0] and r["variant"] != "Pre-LN"]
    sweep = base + [r for (k, *_), r in results.items() if k == "lr" and r]
    nmt = next((r for (k, *_), r in results.items() if k == "nmt"), None)
    summary = report(mlm, sweep, nmt, cfg, t0)
    print(json.dumps(summary["mlm_table"], indent=1))
    log.info("done in %.0fs; report in %s", time.time() - t0, cfg.out / "paper_checks.json")
    if failures:
        raise RunsFailed(f"{len(failures)} of {len(jobs)} runs failed (the report has the "
                         "others; the same command runs the failed ones again):\n"
                         + "\n".join(failures))  # fmt: skip
