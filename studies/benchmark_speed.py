#!/usr/bin/env python
"""What residual attention (RealFormer) and ADMIN cost on CPU, next to fairseq's transformer.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).

Variants (``bench_models.VARIANTS``): ``vanilla`` (fairseq ``transformer``; its training
attention is ``F.multi_head_attention_forward``), ``vanilla_eager`` (the same model forced onto
fairseq's own bmm/softmax path), ``realformer`` (``realformer_transformer``: residual attention
on all three chains, running mean, ADMIN; the default ``--residual-attention-impl auto``),
``realformer_eager`` and ``realformer_concat`` (the same model on the eager and on the concat
route of the score chains), ``postln`` and ``admin`` (the plugin's Post-LN
baseline without and with ADMIN). Per variant, measured interleaved in one process
(``bench_measure``): training target words/s (forward, backward, Adam step,
``label_smoothed_cross_entropy``, dropout on); peak memory of one training step (CPU allocator
events, plus 3 x parameter bytes for weights and Adam's moments) and of the forward alone;
beam-5 generation sentences/s with the output length pinned (``min_len = max_len``).

Configs (``CONFIGS``: sizes, batch and lengths) and variants (``bench_models.VARIANTS``: arch,
attention path, extra flags) are data: a new length or route is one entry there.

usage (from the repository root):
    python -m studies.benchmark_speed   # base, deep, len128/512/1024 -> docs/benchmarks/speed.json
    python -m studies.benchmark_speed --configs toy --repeats 2 --json /tmp/speed.json
"""

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Dict

import torch

from .bench_measure import interleaved_rates, machine_info, peak_bytes, ratio_of_rates
from .bench_models import VARIANTS, Bench, dummy_dictionary, make_batch, quiet_route_logs
from .runs import config, get_logger, main_entry, write_json
from .tables import md_table

REPO_ROOT = Path(__file__).resolve().parents[1]
logger = get_logger("benchmark_speed")

# name -> sizes and workload (gen_batch None: no generation measured)
CONFIGS = {
    "base": dict(enc_layers=6, dec_layers=6, width=512, ffn=2048, heads=8, vocab=8000,
                 train_batch=8, src_len=32, tgt_len=32, gen_batch=8, gen_len=32),
    "deep": dict(enc_layers=60, dec_layers=12, width=128, ffn=512, heads=4, vocab=8000,
                 train_batch=16, src_len=32, tgt_len=32, gen_batch=8, gen_len=32),
    "len128": dict(enc_layers=6, dec_layers=6, width=256, ffn=1024, heads=4, vocab=8000,
                   train_batch=4, src_len=128, tgt_len=128, gen_batch=None, gen_len=None),
    "len512": dict(enc_layers=6, dec_layers=6, width=256, ffn=1024, heads=4, vocab=8000,
                   train_batch=1, src_len=512, tgt_len=512, gen_batch=None, gen_len=None),
    "len1024": dict(enc_layers=6, dec_layers=6, width=256, ffn=1024, heads=4, vocab=8000,
                    train_batch=1, src_len=1024, tgt_len=1024, gen_batch=None, gen_len=None),
    "toy": dict(enc_layers=2, dec_layers=2, width=32, ffn=64, heads=2, vocab=100,
                train_batch=4, src_len=8, tgt_len=8, gen_batch=2, gen_len=6),
}  # fmt: skip


def config_label(cfg: Dict) -> str:
    """E.g. ``6L-6L d512 ffn2048 h8, length 32``: the sizes the config builds."""
    return (
        f"{cfg['enc_layers']}L-{cfg['dec_layers']}L d{cfg['width']} ffn{cfg['ffn']} "
        f"h{cfg['heads']}, length {cfg['src_len']}"
    )


RATIOS = [
    ("realformer", "vanilla"),  # the targets apply to this row (the default route, auto)
    ("realformer_eager", "vanilla"),  # the routes of the residual score chains, side by side
    ("realformer_concat", "vanilla"),
    ("realformer", "realformer_eager"),  # what auto gains over the eager route
    ("vanilla_eager", "vanilla"),  # fused-kernel gain in training; generation: same code (noise)
    ("realformer", "vanilla_eager"),
    ("realformer", "admin"),  # cost of residual attention
    ("admin", "postln"),  # cost of ADMIN
    ("admin", "vanilla"),  # the same where postln is not run (postln = vanilla's computation)
    ("postln", "vanilla"),
]
TARGETS = {  # realformer/vanilla, per config
    "base": {"train_wps": 1.00, "gen_sents_per_s": 0.95, "peak_memory": 1.15},
    "deep": {"train_wps": 0.97, "gen_sents_per_s": 0.95, "peak_memory": 1.15},
    # the auto route's targets at long lengths (memory <= 1.05 x fairseq's)
    "len128": {"train_wps": 0.95, "peak_memory": 1.05},
    "len512": {"train_wps": 0.95, "peak_memory": 1.05},
    "len1024": {"train_wps": 0.95, "peak_memory": 1.05},
}


def run_config(name: str, args) -> Dict:
    cfg = dict(CONFIGS[name], label=config_label(CONFIGS[name]))
    dictionary = dummy_dictionary(cfg["vocab"])
    logger.info("[%s] building %s (%s)", name, ", ".join(args.variants), cfg["label"])
    benches = {v: Bench(v, cfg, dictionary, beam=args.beam) for v in args.variants}
    train = make_batch(dictionary, cfg["train_batch"], cfg["src_len"], cfg["tgt_len"], seed=1)
    generation = cfg["gen_batch"] is not None and not args.skip_generation
    if generation:
        gen = make_batch(dictionary, cfg["gen_batch"], cfg["src_len"], cfg["tgt_len"], seed=2)
    for bench in benches.values():  # warm-up; the first step also runs ADMIN's profiling
        bench.train_step(train)
        bench.train_step(train)
        if generation:
            bench.generate(gen, cfg["gen_len"])

    memory = {}
    for v, bench in benches.items():
        bench.model.train()
        kept = []
        forward = peak_bytes(lambda: kept.append(bench.criterion(bench.model, train)[0]))
        kept[0].backward()
        bench.optimizer.zero_grad(set_to_none=True)
        step = peak_bytes(lambda: bench.train_step(train))
        persistent = bench.persistent_bytes  # parameters + Adam exp_avg + exp_avg_sq
        memory[v] = dict(forward_peak_bytes=forward, step_peak_bytes=step,
                         persistent_bytes=persistent, peak_memory=step + persistent)  # fmt: skip

    def log(r, last):
        logger.info("[%s] repeat %d/%d: %s", name, r + 1, args.repeats,
                    ", ".join(f"{v}={x:.1f}" for v, x in last.items()))  # fmt: skip

    wps = interleaved_rates(
        {v: (lambda b=b: b.train_step(train)) for v, b in benches.items()},
        {v: train["ntokens"] for v in benches}, args.repeats, args.train_steps, log=log,
    )  # fmt: skip
    sps = {}
    if generation:
        sps = interleaved_rates(
            {v: (lambda b=b: b.generate(gen, cfg["gen_len"])) for v, b in benches.items()},
            {v: cfg["gen_batch"] for v in benches}, args.repeats, args.gen_batches, log=log,
        )  # fmt: skip

    ratios = {}
    for a, b in RATIOS:
        if a not in benches or b not in benches:
            continue
        train_ratio = ratio_of_rates(wps, a, b)
        entry = {
            "train_wps": train_ratio["median"],
            "train_wps_per_repeat": train_ratio["per_repeat"],
        }
        for key in ("peak_memory", "step_peak_bytes", "forward_peak_bytes"):
            entry[key.replace("_bytes", "_memory")] = memory[a][key] / memory[b][key]
        if sps:
            gen_ratio = ratio_of_rates(sps, a, b)
            entry["gen_sents_per_s"] = gen_ratio["median"]
            entry["gen_sents_per_s_per_repeat"] = gen_ratio["per_repeat"]
        ratios[f"{a}/{b}"] = entry
    variants = {
        v: dict(arch=bench.arch, flags=list(bench.flags), params=bench.params, train_wps=wps[v],
                train_wps_median=statistics.median(wps[v]), gen_sents_per_s=sps.get(v),
                gen_sents_per_s_median=statistics.median(sps[v]) if sps else None, **memory[v])
        for v, bench in benches.items()
    }  # fmt: skip
    return {"config": cfg, "variants": variants, "ratios": ratios}


def format_tables(report: Dict) -> str:
    ratios = []
    for name, res in report["configs"].items():
        for key, entry in res["ratios"].items():
            targets = TARGETS.get(name, {}) if key == "realformer/vanilla" else {}
            cells = []
            for col in ("train_wps", "peak_memory", "forward_peak_memory", "gen_sents_per_s"):
                value, target = entry.get(col), targets.get(col)
                mark = ""
                if value is not None and target is not None:
                    met = value <= target if col == "peak_memory" else value >= target
                    mark = " ✓" if met else " ✗"
                cells.append("-" if value is None else f"{value:.3f}{mark}")
            ratios.append([f"{name} ({res['config']['label']})", key, *cells])
    mib = 2**20
    variants = [
        [name, v, f"{d['params'] / 1e6:.1f}M", f"{d['train_wps_median']:.0f}",
         f"{d['forward_peak_bytes'] / mib:.1f}", f"{d['step_peak_bytes'] / mib:.1f}",
         f"{d['persistent_bytes'] / mib:.1f}",
         "-" if d["gen_sents_per_s_median"] is None else f"{d['gen_sents_per_s_median']:.2f}"]
        for name, res in report["configs"].items()
        for v, d in res["variants"].items()
    ]  # fmt: skip
    return "\n\n".join([
        md_table(["config", "ratio", "train words/s", "peak memory", "fwd activations",
                  "generation sents/s"], ratios),
        md_table(["config", "variant", "params", "train words/s", "fwd peak MiB", "step peak MiB",
                  "+persistent MiB", "gen sents/s"], variants),
    ])  # fmt: skip


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--configs",
        nargs="+",
        choices=list(CONFIGS),
        default=["base", "deep", "len128", "len512", "len1024"],
    )
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (median taken)")
    p.add_argument("--train-steps", type=int, default=2, help="training steps per timing")
    p.add_argument("--gen-batches", type=int, default=1, help="generate() calls per timing")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--skip-generation", action="store_true")
    p.add_argument("--json", type=Path, default=REPO_ROOT / "docs" / "benchmarks" / "speed.json")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.train_steps < 1 or args.gen_batches < 1:
        p.error("--repeats, --train-steps and --gen-batches must be >= 1")
    if "vanilla" not in args.variants:
        p.error("--variants must include vanilla (the baseline)")
    args.variants = [v for v in VARIANTS if v in args.variants]
    return args


def main(argv=None) -> Dict:
    args = parse_args(argv)
    quiet_route_logs()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0 = time.time()
    report = {
        "description": "CPU measurements at small scale; ratios are medians of per-repeat "
        "ratios of interleaved runs in one process",
        "memory_method": "torch.profiler(profile_memory=True) CPU allocator events: peak live "
        "tensor bytes during one training step above its start, plus persistent "
        "3 x parameter bytes (weights + Adam moments); fwd = the training forward alone",
        "machine": machine_info(),
        "settings": config(args),
        "targets": TARGETS,
        "configs": {name: run_config(name, args) for name in args.configs},
    }
    report["wall_seconds"] = round(time.time() - t0, 1)
    report["load_average_at_end"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.json, report)
    print(format_tables(report))
    logger.info("wrote %s in %.0fs", args.json, report["wall_seconds"])
    return report


if __name__ == "__main__":
    main_entry("studies.benchmark_speed", main)
