#!/usr/bin/env python
"""Seconds Triton takes to compile each kernel of the triton route for an H100/H200 (sm_90),
measured without a GPU: what ``studies.gpu_check --plan`` adds for the compiles of a run.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747): the route's
fused kernels (``realformer_fairseq/modules/routes/triton_kernels.py``: the forward; in backward
``delta``, the key-block pass and the dq pass).

Each (kernel, launch configuration) the route launches at head size 64 in fp16 and bf16
(``launch_configs``), each mask kind (the causal mask from the indices; key padding read) and
with its optional inputs off and on (the first layer of a chain, a middle one), compiled by
``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` into a fresh cache, one after another in
this process (needs triton, not TRITON_INTERPRET; no GPU). Writes
``docs/benchmarks/triton_compile_times.json`` with the date, the command and the machine.

usage (from the repository root):
    .venv-triton/bin/python -m studies.triton_compile_times [--json PATH]
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import triton_build
from .runs import REPO_ROOT

DEFAULT_JSON = REPO_ROOT / "docs" / "benchmarks" / "triton_compile_times.json"
# the optional inputs of a chain's first layer (all off) and of a middle one (all on); the
# additive mask and key padding go with the mask kind
FIRST_LAYER = {"PREV": None, "DSTREAM": None, "DIVIDE": False, "DROPOUT": False,
               "REBUILD": False}  # fmt: skip
MASKS = {"causal": {"CAUSAL": True, "MASK": None, "KPM": None},
         "key padding": {"CAUSAL": False, "MASK": None}}  # fmt: skip


def plan(head_dim: int = 64, dtypes=("float16", "bfloat16"), arch: int = 90):
    """(dtype, kernel name, kernel, config, mask, inputs, constexprs), one per compile."""
    import torch

    kernels, launch_configs = triton_build.kernel_set("stream")
    seen = set()
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for kernel_name, cfg in launch_configs(head_dim, dtype, (arch // 10, arch % 10)):
            kernel = kernels[kernel_name]
            variants = [("", "")] if kernel_name == "delta" else [
                (mask, inputs) for mask in MASKS for inputs in ("first layer", "middle layer")
            ]  # fmt: skip
            for mask, inputs in variants:
                flags = dict(triton_build.FLAGS_ON if inputs == "middle layer" else FIRST_LAYER)
                flags.update(MASKS.get(mask, {}))
                consts = triton_build.constants(kernel, head_dim, cfg, flags)
                key = (dtype_name, kernel_name, tuple(cfg), tuple(sorted(map(str, consts.items()))))
                if key in seen:  # a kernel without these inputs (dq, delta): one compile
                    continue
                seen.add(key)
                yield dtype_name, kernel_name, kernel, cfg, mask, inputs, consts


def measure(head_dim: int = 64, dtypes=("float16", "bfloat16"), arch: int = 90):
    rows = []
    for dtype_name, kernel_name, kernel, cfg, mask, inputs, consts in plan(head_dim, dtypes, arch):
        _, seconds, _ = triton_build.compile_kernel(
            kernel, arch, dtype_name, consts, cfg.num_warps, cfg.num_stages
        )
        rows.append(dict(dtype=dtype_name, head_dim=head_dim, kernel=kernel_name,
                         config=list(cfg), mask=mask, inputs=inputs,
                         seconds=round(seconds, 2)))  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def summary(rows):
    """Median seconds per kernel (over dtypes, configurations, masks and inputs)."""
    out = {}
    for name in sorted({r["kernel"] for r in rows}):
        out[name] = statistics.median(r["seconds"] for r in rows if r["kernel"] == name)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("unset TRITON_INTERPRET: this measures the compiler")
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-cache-"))
    t0 = time.time()
    rows = measure()
    from .bench_measure import machine_info

    report = dict(
        date=datetime.date.today().isoformat(),
        command="TRITON_DEFAULT_FP_FUSION=1 .venv-triton/bin/python -m studies.triton_compile_times",
        target="sm_90 (triton GPUTarget('cuda', 90, 32)), no GPU",
        machine=machine_info(),
        wall_seconds=round(time.time() - t0, 1),
        median_seconds_per_kernel=summary(rows),
        kernels=rows,
    )
    from realformer_fairseq.atomic_files import write_json_atomic

    write_json_atomic(args.json, report)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
