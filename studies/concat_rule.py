#!/usr/bin/env python
"""Where the concat route of residual attention pays: the measurements behind ``auto``'s rule.

RealFormer (He et al., arXiv 2012.11747) layer l attends with ``softmax(sum_{i<=l} Q_i K_i^T)``.
The eager route keeps that sum as a float32 ``T x S`` stream; the concat route computes it
inside one fused attention over the concatenated queries and keys of layers 0..l, whose ``q k``
part is l + 1 times wider. A chain can run the first ``D`` layers concatenated and the rest
eager (the module switches once, forming the stream from the parts). For each length, head
size and batch x heads, this times one chain of ``--layers`` self-attention layers (the
plugin's own ``ConcatRealformerMultiheadAttention``, padding mask, running mean) for every
switch depth D = 0 (all eager) .. L (all concat), interleaved in one process, forward and
backward (``--no-grad``: forward only), and reports each D's time relative to D = 0 and the
best D.

usage (from the repository root):
    OMP_NUM_THREADS=1 python -m studies.concat_rule               # -> docs/benchmarks/concat_rule.json
    python -m studies.concat_rule --lengths 16 --layers 2 --repeats 1 --json /tmp/rule.json  # smoke
"""

import argparse
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Dict, List

import torch

from realformer_fairseq.modules.routes import ConcatRealformerMultiheadAttention
from realformer_fairseq.modules.routes.rules import ConcatRule

from .bench_measure import interleaved_rates, machine_info
from .runs import config, write_json
from .tables import md_table

REPO_ROOT = Path(__file__).resolve().parents[1]


DTYPES = {"float32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def switch_depth_rule(depth: int) -> ConcatRule:
    """A rule under measurement: the first ``depth`` layers fused, on any device."""
    return ConcatRule(
        device_name="", capability=(0, 0), torch_version="", dtypes=tuple(DTYPES.values()),
        chains=("encoder", "decoder"), min_length=0, depth=depth,
        source="studies.concat_rule: a switch depth under measurement",
    )  # fmt: skip


def chain(layers: int, heads: int, head_dim: int, switch_depth: int, mode: str, device, dtype):
    """``layers`` modules of the auto route with the rule ``layer < switch_depth`` (on any
    device: the measured rules of routes/rules.py apply to CUDA devices only)."""
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        m = ConcatRealformerMultiheadAttention(
            heads * head_dim, heads, residual_attention_mode=mode,
            residual_attention_impl="auto", rule=switch_depth_rule(switch_depth),
            self_attention=True,
        )  # fmt: skip
        m.auto_runs_fused = lambda layer_idx, src_len, q, d=switch_depth: layer_idx < d
        modules.append(m.to(device=device, dtype=dtype))
    return modules


def run_chain(modules, x, padding, grad: bool):
    scores = queries = keys = None
    out = x
    with torch.set_grad_enabled(grad):
        for idx, m in enumerate(modules):
            out, _, scores, queries, keys = m(
                out, out, out, key_padding_mask=padding, need_weights=False,
                prev_attn_scores=scores, layer_idx=idx, prev_attn_queries=queries,
                prev_attn_keys=keys,
            )  # fmt: skip
        if grad:
            out.sum().backward()


def measure(length: int, head_dim: int, batch: int, args) -> Dict:
    heads, device, dtype = args.heads, args.device, DTYPES[args.dtype]
    x = torch.randn(length, batch, heads * head_dim, device=device, dtype=dtype)
    x.requires_grad_(not args.no_grad)
    padding = torch.zeros(batch, length, dtype=torch.bool, device=device)
    padding[-1, : length // 4] = True  # one left-padded sentence, as fairseq's sources
    depths = sorted({0, *[d for d in (args.depths or range(args.layers + 1)) if d <= args.layers]})
    chains = {d: chain(args.layers, heads, head_dim, d, args.mode, device, dtype) for d in depths}
    steps = {d: (lambda c=c: run_chain(c, x, padding, not args.no_grad)) for d, c in chains.items()}
    for step in steps.values():
        step()  # warm-up
    rates = interleaved_rates(steps, {d: 1.0 for d in depths}, args.repeats, 1, device)
    seconds = {d: 1.0 / statistics.median(r) for d, r in rates.items()}
    ratio = {  # time of D / time of all-eager, median of per-repeat ratios
        d: statistics.median(e / c for c, e in zip(rates[d], rates[0])) for d in depths
    }
    kernels = sorted({m.last_route for m in chains[args.layers]})
    best = min(depths, key=lambda d: ratio[d])
    return dict(length=length, head_dim=head_dim, batch=batch, heads=heads,
                stream_elements=batch * heads * length * length, seconds=seconds,
                time_ratio_vs_eager=ratio, best_switch_depth=best, concat_kernels=kernels,
                load_average=os.getloadavg())  # fmt: skip


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", nargs="+", type=int, default=[64, 128, 256, 512, 1024, 2048])
    p.add_argument("--head-dims", nargs="+", type=int, default=[32, 64])
    p.add_argument("--tokens", type=int, default=2048, help="batch = max(1, tokens // length)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4, help="chain length (switch depths 0..L)")
    p.add_argument("--depths", nargs="+", type=int, help="switch depths to time (default 0..L)")
    p.add_argument("--mode", choices=("sum", "mean"), default="mean")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-grad", action="store_true", help="forward only (inference)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--json", type=Path, default=REPO_ROOT / "docs/benchmarks/concat_rule.json")
    return p.parse_args(argv)


def main(argv=None) -> Dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    # fairseq's wav2vec2_classification sets the root logger to DEBUG on import: keep the
    # route's kernel lines out of the output
    logging.getLogger("realformer_fairseq.modules.routes.concat").setLevel(logging.INFO)
    t0 = time.time()
    rows: List[Dict] = []
    for head_dim in args.head_dims:
        for length in args.lengths:
            rows.append(measure(length, head_dim, max(1, args.tokens // length), args))
            print(f"T={length} d={head_dim}: best D={rows[-1]['best_switch_depth']} "
                  f"ratios {rows[-1]['time_ratio_vs_eager']} load {os.getloadavg()}",
                  flush=True)  # fmt: skip
    report = dict(description=__doc__.split("\n\n")[0], machine=machine_info(),
                  settings=config(args), rows=rows, wall_seconds=round(time.time() - t0, 1),
                  load_average_at_end=os.getloadavg())  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.json, report)
    depths = list(rows[0]["time_ratio_vs_eager"])
    header = ["T", "head dim", "batch", *[f"D={d}" for d in depths], "best D"]
    table = md_table(header, [
        [r["length"], r["head_dim"], r["batch"],
         *[f"{r['time_ratio_vs_eager'][d]:.2f}" for d in depths],
         r["best_switch_depth"]] for r in rows
    ])  # fmt: skip
    args.json.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return report


if __name__ == "__main__":
    main()
