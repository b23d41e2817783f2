"""The launch table of the triton route's concat phase: every block size and launch option of
its kernels (:mod:`.triton_concat_kernels`). Imports no triton.
"""

from typing import Optional, Tuple

import torch

from .triton_launch import MAX_HEAD_DIM, KernelConfig, padded_head_dim

# the kernels of one concat-phase layer: the forward; in backward the stream kernels' ``delta``,
# the key-block pass (dv, the keys' gradients) and the query-block pass (the queries')
CONCAT_KERNELS = ("concat_forward", "delta", "concat_backward", "concat_dq")

# the interpreter's blocks (capability None): the stream kernels' 16 x 16
_INTERPRETER = KernelConfig(16, 16, 4, 1)
_DELTA = KernelConfig(64, 16, 4, 1)

# (bytes per input element, padded head size) -> kernel -> config, for A100 (sm_80) and
# H100/H200 (sm_90) alike but for ``_SM90``; each compiles without spills with every optional
# input on, as triton's own ptxas call compiles it (tests/test_triton_concat_compile.py)
_LAUNCH_TABLE = {
    (2, 32): {
        "concat_forward": KernelConfig(64, 32, 4, 2),
        "concat_backward": KernelConfig(32, 32, 4, 2),
        "concat_dq": KernelConfig(32, 32, 8, 1),
    },
    (2, 64): {
        "concat_forward": KernelConfig(64, 32, 4, 2),
        "concat_backward": KernelConfig(16, 32, 4, 2),
        "concat_dq": KernelConfig(32, 32, 4, 2),
    },
    (2, 128): {
        "concat_forward": KernelConfig(64, 32, 8, 2),
        "concat_backward": KernelConfig(16, 32, 8, 1),
        "concat_dq": KernelConfig(32, 32, 4, 1),
    },
    # float32: tl.dot in full precision (FMA, not tensor cores)
    (4, None): {
        "concat_forward": KernelConfig(16, 16, 4, 1),
        "concat_backward": KernelConfig(16, 16, 8, 1),
        "concat_dq": KernelConfig(16, 16, 4, 1),
    },
}


# where sm_90 takes another configuration than sm_80: float32's key-block pass spills with 8
# warps there and with 4 on sm_80
_SM90 = {(4, None): {"concat_backward": KernelConfig(16, 16, 4, 1)}}


def concat_launch_config(
    kernel: str, head_dim: int, dtype: torch.dtype, capability: Optional[Tuple[int, int]]
) -> KernelConfig:
    """The configuration the concat phase launches ``kernel`` (one of :data:`CONCAT_KERNELS`)
    with, for inputs of ``dtype`` and ``head_dim`` on a CUDA device of ``capability``, or
    ``capability=None`` for the interpreter."""
    if kernel not in CONCAT_KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(CONCAT_KERNELS)}, got {kernel!r}")
    if kernel == "delta":
        return _DELTA
    if capability is None:
        return _INTERPRETER
    d = padded_head_dim(head_dim)
    if d > MAX_HEAD_DIM:
        raise ValueError(f"the triton kernels take head sizes up to {MAX_HEAD_DIM}, got {head_dim}")
    width = min(torch.finfo(dtype).bits // 8, 4)  # float64 (off the GPU table) as float32
    key = (2, max(d, 32)) if width == 2 else (4, None)
    if tuple(capability) >= (9, 0) and kernel in _SM90.get(key, {}):
        return _SM90[key][kernel]
    return _LAUNCH_TABLE[key][kernel]


def concat_launch_configs(head_dim: int, dtype: torch.dtype, capability: Tuple[int, int]):
    """Every (kernel, config) the concat phase may launch for these inputs on this device."""
    return [(k, concat_launch_config(k, head_dim, dtype, capability)) for k in CONCAT_KERNELS]
