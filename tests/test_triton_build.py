"""studies/triton_build.py's naming conventions and checks, with the values written here: the
Triton signature it gives a stream kernel and a concat-phase kernel (which pointers take the
inputs' dtype, key padding int8, the float scalars, an absent optional input as a constexpr
None, which arguments are divisible by 16), and what ``problems`` and ``blocks_per_sm`` say of a row.
The kernels are only read (their argument names), under the interpreter as
tests/test_triton_kernels.py sets it. Needs triton; skipped without it."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

# out of the default suite, run by -m triton (.ci/run's triton job)
pytestmark = pytest.mark.triton

pytest.importorskip(
    "triton", reason="triton is not installed (the triton extra: pip install -e '.[triton]')"
)

from test_triton_kernels import interpreted  # noqa: E402,F401

from realformer_fairseq.modules.routes import triton_concat_kernels as tck  # noqa: E402
from realformer_fairseq.modules.routes import triton_kernels as tk  # noqa: E402
from realformer_fairseq.modules.routes.triton_launch import KernelConfig  # noqa: E402
from studies.triton_build import (  # noqa: E402
    blocks_per_sm,
    constants,
    problems,
    signature,
    table_row,
)

DIVISIBLE = [["tt.divisibility", 16]]


def divisible_args(kernel, attrs):
    assert all(value == DIVISIBLE for value in attrs.values()), attrs
    return {kernel.arg_names[i] for (i,) in attrs}


def test_the_forward_kernels_signature_in_float16():
    import triton.language as tl

    kernel = tk._forward_kernel
    # the causal variant with every optional input on: no additive mask (None)
    flags = {"DIVIDE": True, "DROPOUT": True, "REBUILD": True, "CAUSAL": True, "MASK": None}
    consts = constants(kernel, 64, KernelConfig(64, 32, 4, 2), flags)
    assert consts == {
        "HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_M": 64, "BLOCK_N": 32, "ACC": tl.float32,
        "UPCAST": False, "DIVIDE": True, "DROPOUT": True, "CAUSAL": True, "MASK": None,
    }  # fmt: skip
    sig, attrs = signature(kernel, "float16", consts)
    assert list(sig) == kernel.arg_names
    assert sig == {
        **dict.fromkeys(["Q", "K", "V", "OUT"], "*fp16"),
        **dict.fromkeys(["PREV", "STREAM", "ROWMAX", "ROWSUM"], "*fp32"),
        "KPM": "*i8",
        **dict.fromkeys(["divisor", "mask_value", "dropout_p"], "fp32"),
        **dict.fromkeys(
            ["bsz_heads", "tgt_len", "src_len", "num_heads", "threshold", "seed"], "i32"
        ),
        **dict.fromkeys(consts, "constexpr"),
    }  # fmt: skip
    # every pointer; no integer (lengths and counts: no strides)
    assert divisible_args(kernel, attrs) == {
        "Q", "K", "V", "PREV", "STREAM", "OUT", "ROWMAX", "ROWSUM", "KPM",
    }  # fmt: skip


def test_the_concat_backward_kernels_signature_in_bfloat16():
    kernel = tck._concat_backward_kernel
    flags = {"DIVIDE": False, "DROPOUT": True, "REBUILD": True, "CAUSAL": False}
    consts = constants(kernel, 96, KernelConfig(32, 64, 8, 1), flags)
    assert {k: v for k, v in consts.items() if k != "ACC"} == {
        "HEAD_DIM": 96, "BLOCK_D": 128, "BLOCK_M": 32, "BLOCK_N": 64, "UPCAST": False,
        "DIVIDE": False, "DROPOUT": True, "CAUSAL": False,
    }  # fmt: skip
    sig, attrs = signature(kernel, "bfloat16", consts)
    assert list(sig) == kernel.arg_names
    # the query and key buffers take the inputs' dtype; the key gradient buffer is float32
    assert sig == {
        **dict.fromkeys(["QB", "KB", "V", "DOUT", "DV"], "*bf16"),
        **dict.fromkeys(["ROWMAX", "ROWSUM", "DELTA", "GK", "MASK"], "*fp32"),
        "KPM": "*i8",
        **dict.fromkeys(["divisor", "mask_value", "dropout_p"], "fp32"),
        **dict.fromkeys(
            ["slices", "depth", "bsz_heads", "tgt_len", "src_len", "num_heads", "threshold",
             "seed"],
            "i32",
        ),
        **dict.fromkeys(consts, "constexpr"),
    }  # fmt: skip
    assert divisible_args(kernel, attrs) == {
        "QB", "KB", "V", "DOUT", "ROWMAX", "ROWSUM", "DELTA", "GK", "DV", "MASK", "KPM",
    }  # fmt: skip


def row(**changes):
    clean = {"kernel": "dq", "variant": "mask", "config": [64, 64, 4, 2], "seconds": 0.4,
             "registers": 96, "spill_stores": 0, "spill_loads": 0, "stack": 0,
             "shared": 32768, "sass_lines": 900, "fences": []}  # fmt: skip
    return {**clean, **changes}


def test_blocks_per_sm_is_the_least_of_registers_shared_memory_threads_and_blocks():
    # 96 registers * 32 threads = 3072 per warp, 4 warps: 65536 // 12288 = 5 by registers
    assert blocks_per_sm(90, 96, 4, 32768) == 5
    # 200 KB of shared memory: one block on sm_90, none on sm_86
    assert blocks_per_sm(90, 32, 4, 200 * 1024) == 1
    assert blocks_per_sm(86, 32, 4, 200 * 1024) == 0
    # 1 warp, few registers: CUDA's 16 blocks per SM on sm_86
    assert blocks_per_sm(86, 16, 1, 0) == 16


def test_problems_name_spills_fences_shared_memory_and_empty_code():
    assert problems([row()], 90) == []
    assert problems([row(spill_stores=8, spill_loads=4)], 90) == [
        "dq mask [64, 64, 4, 2]: spills 8 B stored, 4 B loaded (96 registers)"
    ]
    assert problems([row(fences=["MEMBAR.SC.GPU"])], 80) == [
        "dq mask [64, 64, 4, 2]: fences or atomics in SASS ['MEMBAR.SC.GPU']"
    ]
    # over sm_86's 99 KB per block (and so no block per SM); within sm_90's 227 KB
    assert problems([row(shared=120 * 1024)], 90) == []
    assert problems([row(shared=120 * 1024)], 86) == [
        "dq mask [64, 64, 4, 2]: shared 122880 B",
        "dq mask [64, 64, 4, 2]: no SASS or no block fits an SM",
    ]
    assert problems([row(sass_lines=0)], 90) == [
        "dq mask [64, 64, 4, 2]: no SASS or no block fits an SM"
    ]


def test_the_table_row_of_docs_benchmarks():
    assert table_row(90, "float16", 64, row()) == (
        "| sm_90 | float16 | 64 | dq mask | 64, 64, 4, 2 | 96 | 0 / 0 | 32 KB | 5 | 0.4 s |"
    )
