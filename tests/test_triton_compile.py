"""The triton route's kernels (realformer_fairseq/modules/triton_attention.py) compile for the GPUs
the project measures on, without a GPU: forward and backward, for A100 (sm_80) and H100/H200
(sm_90), at every configuration the route launches for float16 and bfloat16 (head sizes 32, 64
and 128, the block sizes of ``launch_config``), for float32 at head size 128, and the small
blocks other GPUs get (sm_86: 99 KB) at float16 and head size 128, with every optional input
present (previous stream, both masks, the running mean, dropout, the stream gradient in and
out). Each compiled kernel's shared memory fits its target's per-block limit.

Triton's interpreter (tests/test_triton_kernels.py) accepts code the compiler refuses (block
sizes, masked edges, tl.dot's dtypes), so this is the check that the kernels are GPU code. Each
configuration compiles in its own Python process without TRITON_INTERPRET (a process has one
triton mode, fixed when triton is imported). Needs triton (``pip install -e '.[triton]'``);
skipped without it. About 10-30 s per configuration on one CPU core (LLVM and ptxas)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

# looked up, not imported: triton's mode (compiled or interpreted) is fixed by the first import
# in a process, which tests/test_triton_kernels.py makes with TRITON_INTERPRET=1
if importlib.util.find_spec("triton") is None:
    pytest.skip(
        "triton is not installed (the triton extra: pip install -e '.[triton]')",
        allow_module_level=True,
    )

from harness import REPO_ROOT  # noqa: E402

# shared memory per block with the opt-in (cudaDevAttrMaxSharedMemoryPerBlockOptin)
SHARED_LIMIT = {80: 166912, 86: 101376, 90: 232448}

# compiles one configuration's forward and backward kernels; prints their shared memory
COMPILE = r"""
import json, sys, time
import torch
import triton.language as tl
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from realformer_fairseq.modules import triton_attention as ta

arch, dtype_name, head_dim = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dtype = getattr(torch, dtype_name)
short = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[dtype_name]
# pointers: the inputs' dtype, the stream and its row statistics float32, key padding int8
POINTERS = {
    "Q": short, "K": short, "V": short, "OUT": short, "DOUT": short, "DK": short, "DV": short,
    "PREV": "fp32", "STREAM": "fp32", "ROWMAX": "fp32", "ROWSUM": "fp32", "MASK": "fp32",
    "DELTA": "fp32", "DSTREAM": "fp32", "DPREV": "fp32", "DQ": "fp32", "KPM": "i8",
}
FLOATS = ("divisor", "mask_value", "dropout_p")
# the launcher's integer specialisations: unit strides become the constant 1, strides that are
# multiples of the head size get divisibility 16 (as pointers do); lengths stay unaligned
UNIT = ("sq_d", "sk_d", "sv_d", "sp_s", "sds_s", "sm_s", "skpm_s")
ALIGNED = ("sq_b", "sq_t", "sk_b", "sk_s", "sv_b", "sv_s")
FLAGS = ("HAS_PREV", "HAS_MASK", "HAS_KPM", "DIVIDE", "DROPOUT", "HAS_DSTREAM", "HAS_DPREV")
result = {}
for kernel_name, kernel in (("forward", ta._forward_kernel), ("backward", ta._backward_kernel)):
    cfg = ta.launch_config(kernel_name, head_dim, dtype, (arch // 10, arch % 10))
    consts = {
        "HEAD_DIM": head_dim, "BLOCK_D": ta.padded_head_dim(head_dim), "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n, "ACC": tl.float32, "PRECISION": "ieee", "UPCAST": False,
    }
    consts.update({flag: True for flag in FLAGS if flag in kernel.arg_names})
    consts.update({name: 1 for name in UNIT if name in kernel.arg_names})
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif name in POINTERS:
            signature[name] = "*" + POINTERS[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name in FLOATS else "i32"
            if name in ALIGNED:
                attrs[(i,)] = [["tt.divisibility", 16]]
    start = time.perf_counter()
    compiled = compile(
        ASTSource(fn=kernel, signature=signature, constexprs=consts, attrs=attrs),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
    )
    result[kernel_name] = {
        "config": list(cfg), "shared": compiled.metadata.shared,
        "seconds": round(time.perf_counter() - start, 1), "cubin": len(compiled.asm["cubin"]),
    }
print(json.dumps(result))
"""

CONFIGS = [
    (arch, dtype, head_dim)
    for arch in (80, 90)
    for dtype in ("float16", "bfloat16")
    for head_dim in (32, 64, 128)
] + [(80, "float32", 128), (90, "float32", 128), (86, "float16", 128)]


@pytest.mark.parametrize("arch,dtype,head_dim", CONFIGS, ids=lambda x: str(x))
def test_kernels_compile_for_the_gpu_within_its_shared_memory(arch, dtype, head_dim):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9's default, without its warning
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE, str(arch), dtype, str(head_dim)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(arch, dtype, head_dim, result)  # the shared memory and compile time of each (-s)
    for kernel in ("forward", "backward"):
        assert result[kernel]["cubin"] > 0
        assert 0 < result[kernel]["shared"] <= SHARED_LIMIT[arch], (kernel, result[kernel])


def test_cpu_tensors_without_the_interpreter_stop_with_one_line():
    code = (
        "import torch\n"
        "from realformer_fairseq.modules.triton_attention import residual_attention\n"
        "q = torch.zeros(2, 3, 8)\n"
        "residual_attention(q, q, q, None, None, None, 1, 1.0, 0.0)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ValueError: the triton kernels run on CUDA tensors, got cpu "
        "(CPU tensors only under TRITON_INTERPRET=1, set before triton is imported)"
    )
