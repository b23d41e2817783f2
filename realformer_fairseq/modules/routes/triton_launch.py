"""The launch table of the triton route: every block size and launch option its kernels use.

Imports no triton: studies and tests read the table without it.
"""

from typing import NamedTuple, Optional, Tuple

import torch


class KernelConfig(NamedTuple):
    """Block sizes (powers of two, at least 16) and launch options of one kernel."""

    block_m: int  # queries per block
    block_n: int  # keys per block
    num_warps: int
    num_stages: int


# the largest head size (after padding to a power of two) the configurations are made for
MAX_HEAD_DIM = 128

# the kernels the route launches per layer: the forward; in backward the row statistic
# ``delta``, the key-block pass (dk, dv, the stream gradient) and the query-block pass (dq)
KERNELS = ("forward", "delta", "backward", "dq")

# the capability the interpreter (CPU tensors) is given configurations for: small blocks, so
# that the tests' short sequences span several blocks and their edges
INTERPRETER_CAPABILITY = None

# sequences up to this many tokens (queries for the forward and dq, keys for the key-block
# pass) get the "short" row: 32-wide blocks, never mostly padding at 32 tokens
SHORT = 64

# Every configuration the route launches, in one place: (bytes per input element, padded head
# size) -> kernel -> length class -> config, for every target: A100 (sm_80), H100/H200 (sm_90)
# and the others (sm_86/89: 99 KB of shared memory per block) have the same 64K registers per
# SM, and the register file, not shared memory, is what bounds these kernels. Each row compiles
# without register spills for sm_80 and sm_90 (and sm_86 at float16, head 128) with every
# optional input on, causal or with a mask, as triton's own ptxas call compiles it
# (tests/test_triton_compile.py); its registers, shared memory and blocks per SM:
# docs/benchmarks.md, "Launch configurations of the triton route". The key-block pass runs
# one pipeline stage, 16 queries per step at head 128: more spill with every input on.
_DELTA = KernelConfig(64, 16, 4, 1)  # block_m rows of (bsz*heads*tgt_len, head_dim) per program
_SHORT_16BIT = {"forward": KernelConfig(32, 32, 4, 2), "dq": KernelConfig(32, 32, 4, 1)}
_LAUNCH_TABLE = {
    (2, 32): {
        "forward": {"long": KernelConfig(64, 32, 8, 2), "short": _SHORT_16BIT["forward"]},
        "backward": {"long": KernelConfig(32, 32, 4, 1), "short": KernelConfig(32, 32, 4, 1)},
        "dq": {"long": KernelConfig(64, 64, 4, 2), "short": _SHORT_16BIT["dq"]},
    },
    (2, 64): {
        "forward": {"long": KernelConfig(64, 32, 8, 2), "short": _SHORT_16BIT["forward"]},
        "backward": {"long": KernelConfig(32, 32, 4, 1), "short": KernelConfig(32, 32, 4, 1)},
        "dq": {"long": KernelConfig(64, 64, 4, 2), "short": _SHORT_16BIT["dq"]},
    },
    (2, 128): {
        "forward": {"long": KernelConfig(64, 32, 8, 2), "short": _SHORT_16BIT["forward"]},
        "backward": {"long": KernelConfig(16, 32, 8, 1), "short": KernelConfig(16, 32, 8, 1)},
        "dq": {"long": _SHORT_16BIT["dq"], "short": _SHORT_16BIT["dq"]},
    },
    # float32 (tl.dot in full precision: FMA, not tensor cores) at every head size
    (4, None): {
        "forward": {"long": KernelConfig(16, 16, 4, 1), "short": KernelConfig(16, 16, 4, 1)},
        "backward": {"long": KernelConfig(16, 16, 16, 1), "short": KernelConfig(16, 16, 16, 1)},
        "dq": {"long": KernelConfig(32, 32, 4, 1), "short": KernelConfig(32, 32, 4, 1)},
    },
}


def padded_head_dim(head_dim: int) -> int:
    """The head size the kernels work on: the next power of two, at least 16."""
    return max(16, 1 << (head_dim - 1).bit_length())


def launch_config(
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    capability: Optional[Tuple[int, int]],
    length: int,
) -> KernelConfig:
    """The configuration the route launches ``kernel`` (one of :data:`KERNELS`) with, for
    inputs of ``dtype`` and ``head_dim`` on a CUDA device of ``capability`` ((8, 0): A100,
    (9, 0): H100/H200), or ``capability=None`` for the interpreter; ``length`` the number of
    queries (forward, dq) or keys (backward) its blocks tile."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if capability is None:
        return KernelConfig(16, 16, 4, 1) if kernel != "delta" else _DELTA
    d = padded_head_dim(head_dim)
    if d > MAX_HEAD_DIM:
        raise ValueError(f"the triton kernels take head sizes up to {MAX_HEAD_DIM}, got {head_dim}")
    if kernel == "delta":
        return _DELTA
    width = min(torch.finfo(dtype).bits // 8, 4)  # float64 (off the GPU table) as float32
    row = _LAUNCH_TABLE[(2, max(d, 32))] if width == 2 else _LAUNCH_TABLE[(4, None)]
    return row[kernel]["short" if length <= SHORT else "long"]


def launch_configs(head_dim: int, dtype: torch.dtype, capability: Tuple[int, int]):
    """Every distinct (kernel, config) the route may launch for these inputs on this device:
    what the compile test compiles."""
    seen = []
    for kernel in KERNELS:
        for length in (SHORT, SHORT + 1):
            cfg = launch_config(kernel, head_dim, dtype, capability, length)
            if (kernel, cfg) not in seen:
                seen.append((kernel, cfg))
    return seen
