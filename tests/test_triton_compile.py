"""The triton route's kernels (realformer_fairseq/modules/routes/triton_kernels.py) compile for the GPUs
the project measures on, without a GPU, into code without register spills or GPU-wide fences:
every kernel (the forward; the backward's delta, key-block and dq passes) at every configuration
the route launches (``launch_configs``: short and long sequences) for A100 (sm_80) and H100/H200
(sm_90), float16 and bfloat16 at head sizes 32, 64 and 128 (and 80 and 96, not powers of two:
each at both targets), float32 at head size 128, and
sm_86 (99 KB of shared memory per block; the same table) at float16 and head size 128, with
every optional input present (previous stream, key padding, the running mean, dropout, the
stream gradient in and out), each kernel twice: with the causal mask made from the indices and
with an additive mask read.

For each compiled kernel, with the tools the triton wheel ships (``triton/backends/nvidia/bin``):
the ``ptxas`` triton compiles with, ``-v`` on its PTX for its target (``sm_80``, ``sm_90a``)
reports the registers and the spill stores and loads (must be 0); triton's metadata the shared
memory (must fit the target's per-block limit);
``cuobjdump -sass`` on its cubin must hold no GPU- or system-scope memory fence (``MEMBAR.*.GPU``,
``MEMBAR.*.SYS``, ``MEMBAR.SC``) and no L1 invalidation (``CCTL.IVALL``): what an
acquire-release atomic compiles to; nor any global atomic (``ATOM``, ``RED``, Hopper's ``REDG``:
the backward is deterministic because it has none). ``-s`` prints each kernel's row of
docs/benchmarks.md's configuration table (registers, spills, shared memory, blocks per SM).

Triton's interpreter (tests/test_triton_kernels.py) accepts code the compiler refuses (block
sizes, masked edges, tl.dot's dtypes), so this is the check that the kernels are GPU code. Each
configuration compiles in its own Python process without TRITON_INTERPRET (a process has one
triton mode, fixed when triton is imported), into a fresh triton cache (nothing cached across
runs). Needs triton (``pip install -e '.[triton]'``); skipped without it."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

# out of the default suite, run by -m triton (.ci/run's triton job)
pytestmark = pytest.mark.triton

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

# compiles one configuration's kernels; prints each one's ptxas report and SASS fences as JSON
COMPILE = r"""
import json, os, re, subprocess, sys, tempfile, time
import torch
import triton
import triton.language as tl
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from realformer_fairseq.modules.routes import triton_kernels as ta
from realformer_fairseq.modules.routes import triton_launch

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
KERNELS = {"forward": ta._forward_kernel, "delta": ta._delta_kernel,
           "backward": ta._backward_kernel, "dq": ta._dq_kernel}
# pointers: the inputs' dtype, the stream, its gradient and the row statistics float32, key
# padding int8
INPUT_DTYPE = ("Q", "K", "V", "OUT", "DOUT", "DK", "DV", "DQ")
FLOATS = ("divisor", "mask_value", "dropout_p")
# the launcher's integer specialisations: unit strides become the constant 1, strides that are
# multiples of the head size get divisibility 16 (as pointers do); lengths stay unaligned
UNIT = ("sq_d", "sk_d", "sv_d", "sp_s", "sds_s", "sm_s", "skpm_s", "sdo_d")
ALIGNED = ("sq_b", "sq_t", "sk_b", "sk_s", "sv_b", "sv_s", "sdo_b", "sdo_t")
FLAGS = ("HAS_PREV", "HAS_KPM", "DIVIDE", "DROPOUT", "HAS_DSTREAM", "REBUILD")
# the route launches a causal chain with the mask made from the indices, any other mask read
VARIANTS = {"causal": {"CAUSAL": True, "HAS_MASK": False},
            "mask": {"CAUSAL": False, "HAS_MASK": True}}
plan = [
    (kernel_name, cfg, variant)
    for kernel_name, cfg in triton_launch.launch_configs(head_dim, dtype, (arch // 10, arch % 10))
    for variant in (VARIANTS if kernel_name != "delta" else [""])
]
result = []
work = tempfile.mkdtemp()
for kernel_name, cfg, variant in plan:
    kernel = KERNELS[kernel_name]
    consts = {
        "HEAD_DIM": head_dim, "BLOCK_D": triton_launch.padded_head_dim(head_dim), "BLOCK_M": cfg.block_m,
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
] + [(80, "float32", 128), (90, "float32", 128), (86, "float16", 128)]
# head sizes that are not powers of two (padded to 128 in the kernels, masked to the head)
CONFIGS += [(80, "float16", 80), (80, "bfloat16", 96), (90, "bfloat16", 80), (90, "float16", 96)]


def blocks_per_sm(arch, registers, num_warps, shared):
    """Resident blocks per SM: the least of the register file (allocated per warp in units of
    256), shared memory (1 KB reserved per block), threads and CUDA's block limit."""
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = 65536 // (per_warp * num_warps)
    by_shared = SM_SHARED[arch] // (shared + 1024)
    by_threads = SM_THREADS[arch] // (32 * num_warps)
    return min(by_registers, by_shared, by_threads, SM_BLOCKS[arch])


@pytest.mark.parametrize("arch,dtype,head_dim", CONFIGS, ids=lambda x: str(x))
def test_kernels_compile_without_spills_or_fences_within_shared_memory(
    arch, dtype, head_dim, tmp_path
):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9's default, without its warning
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # a fresh cache: nothing reused
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE, str(arch), dtype, str(head_dim), FENCE.pattern],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernels = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {k["kernel"] for k in kernels} == {"forward", "delta", "backward", "dq"}
    problems = []
    for k in kernels:
        block_m, block_n, num_warps, num_stages = k["config"]
        blocks = blocks_per_sm(arch, k["registers"], num_warps, k["shared"])
        # the row of docs/benchmarks.md's table (-s)
        print(
            f"| sm_{arch} | {dtype} | {head_dim} | {k['kernel']} {k['variant']} | "
            f"{block_m}, {block_n}, "
            f"{num_warps}, {num_stages} | {k['registers']} | {k['spill_stores']} / "
            f"{k['spill_loads']} | {k['shared'] // 1024} KB | {blocks} | {k['seconds']} s |"
        )
        if k["spill_stores"] or k["spill_loads"]:
            problems.append(
                f"{k['kernel']} {k['variant']} {k['config']}: spills {k['spill_stores']} B "
                f"stored, {k['spill_loads']} B loaded ({k['registers']} registers)"
            )
        if k["fences"]:
            problems.append(
                f"{k['kernel']} {k['variant']} {k['config']}: fences in SASS {k['fences']}"
            )
        if not 0 <= k["shared"] <= SHARED_LIMIT[arch]:
            problems.append(f"{k['kernel']} {k['variant']} {k['config']}: shared {k['shared']} B")
        if k["sass_lines"] == 0 or blocks == 0:
            problems.append(
                f"{k['kernel']} {k['variant']} {k['config']}: no SASS or no block fits an SM"
            )
    assert not problems, problems


def test_the_fence_pattern_finds_what_acquire_release_atomics_compile_to():
    """The SASS lines the issue found around the old backward's dq atomics (and relaxed atomic
    adds: no fence, but not deterministic; sm_80 spells them RED, sm_90 REDG), not the
    forward's CTA-scope fence before wgmma (normal: not a GPU-wide fence) nor a warp's REDUX."""
    sass = (
        "/*0a10*/ MEMBAR.ALL.GPU ;\n/*0a20*/ CCTL.IVALL ;\n/*0a30*/ MEMBAR.SC.GPU ;\n"
        "/*0a40*/ MEMBAR.ALL.SYS ;\n/*0a50*/ MEMBAR.SC ;\n/*0b00*/ MEMBAR.ALL.CTA ;\n"
        "/*0b10*/ RED.E.ADD.F32.FTZ.RN.STRONG.GPU [R2.64], R5 ;\n"
        "/*0b20*/ REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR6][R2.64], R5 ;\n"
        "/*0b30*/ ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, R7, desc[UR6][R2.64], R5 ;\n"
        "/*0b40*/ REDUX.SUM UR5, R4 ;\n"
    )
    assert [m.group(0) for m in FENCE.finditer(sass)] == [
        "MEMBAR.ALL.GPU", "CCTL.IVALL", "MEMBAR.SC.GPU", "MEMBAR.ALL.SYS", "MEMBAR.SC",
        "RED.E.ADD.F32.FTZ.RN.STRONG.GPU", "REDG.E.ADD.F32.FTZ.RN.STRONG.GPU",
        "ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU",
    ]  # fmt: skip


def test_cpu_tensors_without_the_interpreter_stop_with_one_line():
    code = (
        "import torch\n"
        "from realformer_fairseq.modules.routes.triton_function import residual_attention\n"
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
