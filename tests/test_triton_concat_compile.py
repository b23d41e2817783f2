"""The triton route's concat-phase kernels (realformer_fairseq/modules/routes/
triton_concat_kernels.py) compile for A100 (sm_80) and H100/H200 (sm_90) without a GPU, into
code without register spills, GPU-wide fences or atomics: every kernel the phase launches (its
forward, the stream kernels' ``delta``, its key-block and query-block passes) at every
configuration of its launch table, float16 and bfloat16 at head sizes 32, 64 and 128 and
float32 at 128, with key padding, the running mean and dropout on, causal and with an
additive mask. The slice count (the layer's depth) and the buffers' depth are runtime
arguments, so one binary serves every depth up to the widest concat (24 layers).
The checks are tests/test_triton_compile.py's (studies/triton_build.py: ptxas -v, cuobjdump
-sass), in a subprocess per configuration without TRITON_INTERPRET, into a fresh triton cache.
Needs triton; skipped without it."""

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

from studies.triton_build import compile_in_subprocess, problems, table_row  # noqa: E402

pytestmark = pytest.mark.triton

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


def test_the_slice_count_and_the_buffers_depth_are_runtime_integers():
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
    # the slice count and the buffers' depth (their strides are made from it in the kernels)
    wide = {
        "_concat_forward_kernel": {"slices", "depth"},
        "_concat_backward_kernel": {"slices", "depth"},
        "_concat_dq_kernel": {"slices", "depth"},
    }
    assert set(kernels) == set(wide)
    for name, args in kernels.items():
        assert wide[name] <= set(args["runtime"]), (name, args["runtime"])
        assert not wide[name] & set(args["constexpr"]), (name, args["constexpr"])


@pytest.mark.parametrize("arch,dtype,head_dim", CONFIGS, ids=lambda x: str(x))
def test_concat_kernels_compile_without_spills_or_fences_within_shared_memory(
    arch, dtype, head_dim, tmp_path
):
    kernels = compile_in_subprocess("concat", arch, dtype, head_dim, tmp_path / "triton-cache")
    assert {k["kernel"] for k in kernels} == {
        "concat_forward", "delta", "concat_backward", "concat_dq"
    }  # fmt: skip
    for k in kernels:
        print(table_row(arch, dtype, head_dim, k))  # docs/benchmarks.md's table (-s)
    found = problems(kernels, arch)
    assert not found, found
