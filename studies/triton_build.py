#!/usr/bin/env python
"""The triton route's kernels compiled for a GPU target without a GPU, and what the compiler
made of them: the one place that turns a kernel's arguments into a Triton signature, compiles
it (``triton.compile`` for ``GPUTarget("cuda", arch, 32)``), reads ptxas's report (registers,
spills, stack) and the SASS's GPU-wide fences and atomics, and judges a configuration's rows.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747): the route's
fused kernels (``realformer_fairseq/modules/routes/triton_kernels.py``: the forward; in backward
``delta``, the key-block pass and the dq pass; the concat phase's in
``triton_concat_kernels.py``). Used by tests/test_triton_compile.py,
tests/test_triton_concat_compile.py and ``studies.triton_compile_times``. Triton is imported
inside the functions: a process has one triton mode (compiled or interpreted), fixed by its
first import, so each configuration compiles in its own process (``compile_in_subprocess``).

usage (from the repository root; prints one configuration's rows as JSON):
    .venv-triton/bin/python -m studies.triton_build --kernels stream|concat --arch 90 \
        --dtype float16 --head-dim 64
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from .runs import REPO_ROOT

# The launcher's naming conventions, read off each kernel's ``arg_names`` (a name a kernel does
# not have is ignored, so one list serves the stream and the concat kernels).
# Pointers are the uppercase names: these take the inputs' dtype (the concat phase's query and
# key buffers QB, KB too); KPM (key padding) is int8; every other pointer (the stream, its
# gradient, the row statistics, the concat phase's gradient buffers GQ, GK) is float32.
INPUT_DTYPE = ("Q", "K", "V", "OUT", "DOUT", "DK", "DV", "DQ", "QB", "KB")
# the float scalars; every other lowercase argument is an i32 (lengths, counts, the seed): the
# kernels take no strides (one layout), so no integer is known to be aligned
FLOATS = ("divisor", "mask_value", "dropout_p")
# optional inputs are a pointer or None (then a constexpr None): the previous stream, the
# additive mask, key padding, the gradient arriving at the stream
OPTIONAL_POINTERS = ("PREV", "MASK", "KPM", "DSTREAM")
# the compile tests turn every optional input on: the pointers above present (but the mask of
# a causal chain), the running mean, dropout and the rebuild of the previous stream
FLAGS_ON = {"DIVIDE": True, "DROPOUT": True, "REBUILD": True}
# the route launches a causal chain with the mask made from the indices, any other mask read
VARIANTS = {"causal": {"CAUSAL": True, "MASK": None}, "mask": {"CAUSAL": False}}
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}

# shared memory per block with the opt-in (cudaDevAttrMaxSharedMemoryPerBlockOptin)
SHARED_LIMIT = {80: 166912, 86: 101376, 90: 232448}
# per SM: shared memory, resident threads and blocks (CUDA's occupancy tables)
SM_SHARED = {80: 167936, 86: 102400, 90: 233472}
SM_THREADS = {80: 2048, 86: 1536, 90: 2048}
SM_BLOCKS = {80: 32, 86: 16, 90: 32}
# what acquire-release (or sequentially consistent) atomics and fences compile to; and any
# global atomic (ATOM, ATOMG, RED; REDG on sm_90): the backward is deterministic because it has
# none. Not REDUX (a reduction across a warp's registers)
FENCE = re.compile(
    r"\bMEMBAR\.(?:\w+\.)*(?:GPU|SYS)\b|\bMEMBAR\.SC\b|\bCCTL\.IVALL\b|\bATOMG?\.\S+|\bREDG?\.\S+"
)


def kernel_set(which):
    """name -> kernel, and the (name, config) list's function, of the stream kernels or the
    concat phase's (which launches the stream kernels' ``delta``)."""
    from realformer_fairseq.modules.routes import triton_kernels as ta

    if which == "stream":
        from realformer_fairseq.modules.routes.triton_launch import launch_configs

        kernels = {"forward": ta._forward_kernel, "delta": ta._delta_kernel,
                   "backward": ta._backward_kernel, "dq": ta._dq_kernel}  # fmt: skip
        return kernels, launch_configs
    if which == "concat":
        from realformer_fairseq.modules.routes import triton_concat_kernels as tck
        from realformer_fairseq.modules.routes.triton_concat_launch import concat_launch_configs

        kernels = {"concat_forward": tck._concat_forward_kernel, "delta": ta._delta_kernel,
                   "concat_backward": tck._concat_backward_kernel,
                   "concat_dq": tck._concat_dq_kernel}  # fmt: skip
        return kernels, concat_launch_configs
    raise ValueError(f"unknown kernel set {which!r} (stream or concat)")


def constants(kernel, head_dim, cfg, flags):
    """The kernel's constexprs at one launch configuration: the head and block sizes, float32
    accumulation, ``flags`` (name -> bool, or None for an absent optional pointer); only names
    the kernel has."""
    import triton.language as tl

    from realformer_fairseq.modules.routes.triton_launch import padded_head_dim

    consts = {
        "HEAD_DIM": head_dim, "BLOCK_D": padded_head_dim(head_dim), "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n, "ACC": tl.float32, "UPCAST": False,
    }  # fmt: skip
    consts.update(flags)
    return {name: value for name, value in consts.items() if name in kernel.arg_names}


def signature(kernel, input_dtype_name, constexprs):
    """(signature, attrs) for ``triton.compile``'s ASTSource: the constexprs, then pointers and
    scalars by the naming conventions above; pointers divisible by 16 (as torch allocates)."""
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.isupper():
            if name in INPUT_DTYPE:
                pointee = SHORT_DTYPE[input_dtype_name]
            else:
                pointee = "i8" if name == "KPM" else "fp32"
            signature[name] = "*" + pointee
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name in FLOATS else "i32"
    return signature, attrs


def compile_kernel(kernel, arch, dtype_name, constexprs, num_warps, num_stages):
    """(the compiled kernel, the seconds ``triton.compile`` took, the ``ptxas -v`` log of the
    run that made its cubin) for sm_``arch``: triton's own ptxas call, with its own options
    (``-lineinfo``, ``--regAllocOptLevel=2``), its log captured (triton prints it where
    ``knobs.nvidia.dump_ptxas_log`` is on)."""
    import contextlib
    import io

    from triton import compile, knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, attrs = signature(kernel, dtype_name, constexprs)
    log = io.StringIO()
    start = time.perf_counter()
    with knobs.nvidia.scope(), contextlib.redirect_stdout(log):
        knobs.nvidia.dump_ptxas_log = True
        compiled = compile(
            ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs),
            target=GPUTarget("cuda", arch, 32),
            options={"num_warps": num_warps, "num_stages": num_stages},
        )
    seconds = time.perf_counter() - start
    if "Used" not in log.getvalue():
        raise RuntimeError(
            f"no ptxas log for {kernel.fn.__name__}: triton took it from its cache (compile "
            "each configuration into a fresh TRITON_CACHE_DIR)"
        )
    return compiled, seconds, log.getvalue()


def ptxas_report(compiled, ptxas_log, arch, workdir):
    """What ptxas made of the kernel, from the log of triton's own ptxas run (registers, spill
    bytes, stack), and cuobjdump -sass on its cubin (line count, the FENCE matches) with the
    cuobjdump beside triton's ptxas (triton 3.9: CUDA 13's, "ptxas-blackwell", for every
    target)."""
    from triton.backends.nvidia.compiler import get_ptxas

    cuobjdump_path = os.path.join(os.path.dirname(get_ptxas(arch).path), "cuobjdump")
    base = os.path.join(tempfile.mkdtemp(dir=workdir), "kernel")
    with open(base + ".cubin", "wb") as f:
        f.write(compiled.asm["cubin"])
    sass = subprocess.run(
        [cuobjdump_path, "-sass", base + ".cubin"], capture_output=True, text=True, check=True
    ).stdout

    def number(pattern):
        return int(re.search(pattern, ptxas_log).group(1))

    return {
        "registers": number(r"Used (\d+) registers"),
        "spill_stores": number(r"(\d+) bytes spill stores"),
        "spill_loads": number(r"(\d+) bytes spill loads"),
        "stack": number(r"(\d+) bytes stack frame"),
        "shared": compiled.metadata.shared,
        "sass_lines": len(sass.splitlines()),
        "fences": sorted({m.group(0) for m in FENCE.finditer(sass)}),
    }


def build_rows(which, arch, dtype_name, head_dim):
    """One row per (kernel, config, mask variant) the route launches at these inputs on
    sm_``arch``, every optional input on: the config, compile seconds and ptxas_report."""
    import torch

    kernels, configs = kernel_set(which)
    capability = (arch // 10, arch % 10)
    rows = []
    work = tempfile.mkdtemp()
    for kernel_name, cfg in configs(head_dim, getattr(torch, dtype_name), capability):
        kernel = kernels[kernel_name]
        for variant in VARIANTS if kernel_name != "delta" else [""]:
            flags = dict(FLAGS_ON, **VARIANTS.get(variant, {}))
            consts = constants(kernel, head_dim, cfg, flags)
            compiled, seconds, log = compile_kernel(
                kernel, arch, dtype_name, consts, cfg.num_warps, cfg.num_stages
            )
            row = {"kernel": kernel_name, "variant": variant, "config": list(cfg),
                   "seconds": round(seconds, 1)}  # fmt: skip
            row.update(ptxas_report(compiled, log, arch, work))
            rows.append(row)
    return rows


def compile_in_subprocess(which, arch, dtype_name, head_dim, cache_dir, timeout=900):
    """``build_rows`` in a fresh Python process without TRITON_INTERPRET, into the triton cache
    ``cache_dir`` (a fresh one reuses nothing); raises with the process's stderr on failure."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9's default, without its warning
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    command = [sys.executable, "-m", "studies.triton_build", "--kernels", which,
               "--arch", str(arch), "--dtype", dtype_name, "--head-dim", str(head_dim)]  # fmt: skip
    proc = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:])} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def blocks_per_sm(arch, registers, num_warps, shared):
    """Resident blocks per SM: the least of the register file (allocated per warp in units of
    256), shared memory (1 KB reserved per block), threads and CUDA's block limit."""
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = 65536 // (per_warp * num_warps)
    by_shared = SM_SHARED[arch] // (shared + 1024)
    by_threads = SM_THREADS[arch] // (32 * num_warps)
    return min(by_registers, by_shared, by_threads, SM_BLOCKS[arch])


def row_blocks(arch, row):
    return blocks_per_sm(arch, row["registers"], row["config"][2], row["shared"])


def table_row(arch, dtype_name, head_dim, row):
    """The row of docs/benchmarks.md's configuration table for one kernel's row."""
    block_m, block_n, num_warps, num_stages = row["config"]
    return (
        f"| sm_{arch} | {dtype_name} | {head_dim} | {row['kernel']} {row['variant']} | "
        f"{block_m}, {block_n}, {num_warps}, {num_stages} | {row['registers']} | "
        f"{row['spill_stores']} / {row['spill_loads']} | {row['shared'] // 1024} KB | "
        f"{row_blocks(arch, row)} | {row['seconds']} s |"
    )


def problems(rows, arch):
    """What is wrong with a configuration's rows on sm_``arch``: register spills, fences or
    atomics in the SASS, shared memory over the per-block limit, no SASS or no block per SM."""
    found = []
    for row in rows:
        what = f"{row['kernel']} {row['variant']} {row['config']}"
        if row["spill_stores"] or row["spill_loads"]:
            found.append(
                f"{what}: spills {row['spill_stores']} B stored, {row['spill_loads']} B loaded "
                f"({row['registers']} registers)"
            )
        if row["fences"]:
            found.append(f"{what}: fences or atomics in SASS {row['fences']}")
        if not 0 <= row["shared"] <= SHARED_LIMIT[arch]:
            found.append(f"{what}: shared {row['shared']} B")
        if row["sass_lines"] == 0 or row_blocks(arch, row) == 0:
            found.append(f"{what}: no SASS or no block fits an SM")
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", choices=("stream", "concat"), required=True)
    p.add_argument("--arch", type=int, choices=sorted(SHARED_LIMIT), required=True)
    p.add_argument("--dtype", choices=sorted(SHORT_DTYPE), required=True)
    p.add_argument("--head-dim", type=int, required=True)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("unset TRITON_INTERPRET: this compiles for a GPU target")
    print(json.dumps(build_rows(args.kernels, args.arch, args.dtype, args.head_dim)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
