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
the ``-v`` log of triton's own ptxas call, the one that makes the cubin a GPU loads (its options:
``-lineinfo --regAllocOptLevel=2``), reports the registers and the spill stores and loads (must
be 0); triton's metadata the shared memory (must fit the target's per-block limit);
``cuobjdump -sass`` on its cubin must hold no GPU- or system-scope memory fence (``MEMBAR.*.GPU``,
``MEMBAR.*.SYS``, ``MEMBAR.SC``) and no L1 invalidation (``CCTL.IVALL``): what an
acquire-release atomic compiles to; nor any global atomic (``ATOM``, ``RED``, Hopper's ``REDG``:
the backward is deterministic because it has none). ``-s`` prints each kernel's row of
docs/benchmarks.md's configuration table (registers, spills, shared memory, blocks per SM).

Triton's interpreter (tests/test_triton_kernels.py) accepts code the compiler refuses (block
sizes, masked edges, tl.dot's dtypes), so this is the check that the kernels are GPU code. Each
configuration compiles in its own Python process without TRITON_INTERPRET (a process has one
triton mode, fixed when triton is imported), into a fresh triton cache (nothing cached across
runs), by studies/triton_build.py (the signatures, the compile, ptxas and cuobjdump, the
checks). Needs triton (``pip install -e '.[triton]'``); skipped without it."""

import importlib.util
import os
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

from studies.triton_build import FENCE, compile_in_subprocess, problems, table_row  # noqa: E402

CONFIGS = [
    (arch, dtype, head_dim)
    for arch in (80, 90)
    for dtype in ("float16", "bfloat16")
    for head_dim in (32, 64, 128)
] + [(80, "float32", 128), (90, "float32", 128), (86, "float16", 128)]
# head sizes that are not powers of two (padded to 128 in the kernels, masked to the head)
CONFIGS += [(80, "float16", 80), (80, "bfloat16", 96), (90, "bfloat16", 80), (90, "float16", 96)]


@pytest.mark.parametrize("arch,dtype,head_dim", CONFIGS, ids=lambda x: str(x))
def test_kernels_compile_without_spills_or_fences_within_shared_memory(
    arch, dtype, head_dim, tmp_path
):
    kernels = compile_in_subprocess("stream", arch, dtype, head_dim, tmp_path / "triton-cache")
    assert {k["kernel"] for k in kernels} == {"forward", "delta", "backward", "dq"}
    for k in kernels:
        print(table_row(arch, dtype, head_dim, k))  # docs/benchmarks.md's table (-s)
    found = problems(kernels, arch)
    assert not found, found


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


def test_the_report_is_the_log_of_tritons_own_ptxas_call(tmp_path):
    """studies/triton_build.py reads the ``-v`` log of the ptxas call triton makes the cubin
    with. A kernel triton takes from its cache was not compiled by that call and has no log:
    that stops with one line instead of a report of nothing (or of another call)."""
    code = (
        "from studies import triton_build as tb\n"
        "from realformer_fairseq.modules.routes import triton_kernels as tk\n"
        "from realformer_fairseq.modules.routes.triton_launch import KernelConfig\n"
        "consts = tb.constants(tk._delta_kernel, 64, KernelConfig(64, 16, 4, 1), {})\n"
        "compiled, _, log = tb.compile_kernel(tk._delta_kernel, 90, 'float16', consts, 4, 1)\n"
        "print(tb.ptxas_report(compiled, log, 90, None)['registers'])\n"
        "tb.compile_kernel(tk._delta_kernel, 90, 'float16', consts, 4, 1)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", TRITON_CACHE_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert 16 <= int(proc.stdout.strip().splitlines()[-1]) <= 255
    assert proc.stderr.strip().splitlines()[-1] == (
        "RuntimeError: no ptxas log for _delta_kernel: triton took it from its cache (compile "
        "each configuration into a fresh TRITON_CACHE_DIR)"
    )
