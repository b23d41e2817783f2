"""The triton route's concat-phase kernels (realformer_fairseq/modules/routes/
triton_concat_kernels.py) compile for A100 (sm_80) and H100/H200 (sm_90) without a GPU, into
code without register spills, GPU-wide fences or atomics: every kernel the phase launches (its
forward, the stream kernels' ``delta``, its key-block and query-block passes) at every
configuration of its launch table, float16 and bfloat16 at head sizes 32, 64 and 128 and
float32 at 128, with key padding, the running mean and dropout on, causal and with an
additive mask. The slice count (the layer's depth) and the buffers' batch strides are runtime
arguments, so one binary serves every depth up to the widest concat (24 layers); the buffers'
row strides (``depth * head_dim``) are compiled as multiples of 16, as they are at any depth.
The checks are tests/test_triton_compile.py's (ptxas -v, cuobjdump -sass), in a subprocess per
configuration without TRITON_INTERPRET, into a fresh triton cache. Needs triton; skipped
without it."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip(
        "triton is not installed (the triton extra: pip install -e '.[triton]')",
        allow_module_level=True,
    )

from harness import REPO_ROOT  # noqa: E402
from test_triton_compile import FENCE, SHARED_LIMIT, blocks_per_sm  # noqa: E402

pytestmark = pytest.mark.triton

# compiles one configuration's kernels; prints each one's ptxas report and SASS fences as JSON
COMPILE = r"""
import json, os, re, subprocess, sys, tempfile, time
import torch
import triton
import triton.language as tl
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from realformer_fairseq.modules.routes import triton_concat_kernels as tck
from realformer_fairseq.modules.routes import triton_kernels as ta
from realformer_fairseq.modules.routes import triton_concat_launch
from realformer_fairseq.modules.routes.triton_launch import padded_head_dim

arch, dtype_name, head_dim = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
fence = re.compile(sys.argv[4])
dtype = getattr(torch, dtype_name)
short = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[dtype_name]
from triton.backends.nvidia.compiler import get_ptxas
# the ptxas triton itself compiles with (triton 3.9: CUDA 13's, "ptxas-blackwell", for every
# target), and the cuobjdump beside it
ptxas_path = get_ptxas(arch).path
cuobjdump_path = os.path.join(os.path.dirname(ptxas_path), "cuobjdump")
ptxas_arch = "sm_90a" if arch == 90 else f"sm_{arch}"
KERNELS = {"concat_forward": tck._concat_forward_kernel, "delta": ta._delta_kernel,
           "concat_backward": tck._concat_backward_kernel, "concat_dq": tck._concat_dq_kernel}
# pointers: the inputs' dtype (the buffers of queries and keys too), the gradient buffers and
# the row statistics float32, key padding int8
INPUT_DTYPE = ("QB", "KB", "V", "OUT", "DOUT", "DV")
FLOATS = ("divisor", "mask_value", "dropout_p")
# the launcher's integer specialisations: unit strides become the constant 1, strides that are
# multiples of the head size get divisibility 16 (as pointers do); lengths stay unaligned
# (the buffers' batch strides and the slice count stay runtime integers: one binary for every
# depth; their row strides, depth*head_dim, are multiples of 16 at any depth)
UNIT = ("sv_d", "sm_s", "skpm_s", "sdo_d")
ALIGNED = ("sqb_t", "skb_s", "sgq_t", "sgk_s", "sv_b", "sv_s", "sdo_b", "sdo_t")
FLAGS = ("HAS_KPM", "DIVIDE", "DROPOUT")
# the route launches a causal chain with the mask made from the indices, any other mask read
VARIANTS = {"causal": {"CAUSAL": True, "HAS_MASK": False},
            "mask": {"CAUSAL": False, "HAS_MASK": True}}
plan = [
    (kernel_name, cfg, variant)
    for kernel_name, cfg in triton_concat_launch.concat_launch_configs(
        head_dim, dtype, (arch // 10, arch % 10))
    for variant in (VARIANTS if kernel_name != "delta" else [""])
]
result = []
work = tempfile.mkdtemp()
for kernel_name, cfg, variant in plan:
    kernel = KERNELS[kernel_name]
    consts = {
        "HEAD_DIM": head_dim, "BLOCK_D": padded_head_dim(head_dim), "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n, "ACC": tl.float32, "PRECISION": "ieee", "UPCAST": False,
    }
    consts = {name: value for name, value in consts.items() if name in kernel.arg_names}
    consts.update({flag: True for flag in FLAGS if flag in kernel.arg_names})
    consts.update({f: on for f, on in VARIANTS.get(variant, {}).items() if f in kernel.arg_names})
    consts.update({name: 1 for name in UNIT if name in kernel.arg_names})
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif name.isupper():
            pointee = short if name in INPUT_DTYPE else "i8" if name == "KPM" else "fp32"
            signature[name] = "*" + pointee
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
    seconds = time.perf_counter() - start
    base = os.path.join(work, f"{kernel_name}_{len(result)}")
    with open(base + ".ptx", "w") as f:
        f.write(compiled.asm["ptx"])
    with open(base + ".cubin", "wb") as f:
        f.write(compiled.asm["cubin"])
    ptxas = subprocess.run(
        [ptxas_path, f"-arch={ptxas_arch}", "-v", base + ".ptx",
         "-o", base + ".ptxas.cubin"],
        capture_output=True, text=True, check=True,
    )
    report = ptxas.stderr
    sass = subprocess.run(
        [cuobjdump_path, "-sass", base + ".cubin"],
        capture_output=True, text=True, check=True,
    ).stdout
    number = lambda pattern: int(re.search(pattern, report).group(1))
    result.append({
        "kernel": kernel_name, "variant": variant, "config": list(cfg),
        "seconds": round(seconds, 1),
        "registers": number(r"Used (\d+) registers"),
        "spill_stores": number(r"(\d+) bytes spill stores"),
        "spill_loads": number(r"(\d+) bytes spill loads"),
        "stack": number(r"(\d+) bytes stack frame"),
        "shared": compiled.metadata.shared, "sass_lines": len(sass.splitlines()),
        "fences": sorted({m.group(0) for m in fence.finditer(sass)}),
    })
print(json.dumps(result))
"""

CONFIGS = [
    (arch, dtype, head_dim)
    for arch in (80, 90)
    for dtype in ("float16", "bfloat16")
    for head_dim in (32, 64, 128)
] + [(80, "float32", 128), (90, "float32", 128)]


RUNTIME_ARGUMENTS = r"""
import json
from realformer_fairseq.modules.routes import triton_concat_kernels as tck
print(json.dumps({
    k.fn.__name__: {
        "runtime": [p.name for p in k.params if p.do_not_specialize],
        "constexpr": [p.name for p in k.params if p.is_constexpr],
    }
    for k in (tck._concat_forward_kernel, tck._concat_backward_kernel, tck._concat_dq_kernel)
}))
"""


def test_the_slice_count_and_buffer_batch_strides_are_runtime_integers():
    """One compiled kernel per configuration serves every depth: no argument that grows with
    the depth is specialised on its value (a depth-24 chain runs what the test compiles). In a
    subprocess: this process's triton mode is not fixed here."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", RUNTIME_ARGUMENTS], cwd=REPO_ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernels = json.loads(proc.stdout.strip().splitlines()[-1])
    wide = {
        "_concat_forward_kernel": {"slices", "sqb_b", "skb_b"},
        "_concat_backward_kernel": {"slices", "sqb_b", "skb_b", "sgk_b"},
        "_concat_dq_kernel": {"slices", "sqb_b", "skb_b", "sgq_b"},
    }
    assert set(kernels) == set(wide)
    for name, args in kernels.items():
        assert wide[name] <= set(args["runtime"]), (name, args["runtime"])
        assert not wide[name] & set(args["constexpr"]), (name, args["constexpr"])


@pytest.mark.parametrize("arch,dtype,head_dim", CONFIGS, ids=lambda x: str(x))
def test_concat_kernels_compile_without_spills_or_fences_within_shared_memory(
    arch, dtype, head_dim, tmp_path
):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # a fresh cache: nothing reused
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE, str(arch), dtype, str(head_dim), FENCE.pattern],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernels = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {k["kernel"] for k in kernels} == {
        "concat_forward", "delta", "concat_backward", "concat_dq"
    }  # fmt: skip
    problems = []
    for k in kernels:
        block_m, block_n, num_warps, num_stages = k["config"]
        blocks = blocks_per_sm(arch, k["registers"], num_warps, k["shared"])
        print(
            f"| sm_{arch} | {dtype} | {head_dim} | {k['kernel']} {k['variant']} | "
            f"{block_m}, {block_n}, {num_warps}, {num_stages} | {k['registers']} | "
            f"{k['spill_stores']} / {k['spill_loads']} | {k['shared'] // 1024} KB | {blocks} | "
            f"{k['seconds']} s |"
        )
        what = f"{k['kernel']} {k['variant']} {k['config']}"
        if k["spill_stores"] or k["spill_loads"]:
            problems.append(
                f"{what}: spills {k['spill_stores']} B stored, {k['spill_loads']} B loaded "
                f"({k['registers']} registers)"
            )
        if k["fences"]:
            problems.append(f"{what}: fences or atomics in SASS {k['fences']}")
        if not 0 <= k["shared"] <= SHARED_LIMIT[arch]:
            problems.append(f"{what}: shared {k['shared']} B")
        if k["sass_lines"] == 0 or blocks == 0:
            problems.append(f"{what}: no SASS or no block fits an SM")
    assert not problems, problems
