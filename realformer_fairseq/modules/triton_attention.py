"""Residual attention (RealFormer) in fused Triton kernels: the ``triton`` route's arithmetic.

One forward kernel per (batch x head, block of queries) walks the key blocks: it reads the
previous layer's score stream, adds ``q k^T`` (``q`` arrives scaled by ``head_dim ** -0.5``),
writes the new stream (float32; float64 for float64 inputs), takes an online softmax over a
masked copy (the running mean's division, the additive mask clamped at the project's finite
fill or the causal mask made from the indices, key padding replaced by the fill), drops
probabilities with a counter-based RNG (Philox, four keys per ``tl.randint4x`` call) and
accumulates ``P V``. Autograd keeps ``q``, ``k``, ``v``, the output, each row's softmax maximum
and sum, the written stream and the dropout seed; nothing else of size ``T x T``.

The backward is three kernels, none with atomics (deterministic): ``delta`` (the row sums of
``d_out * out``); the key-block pass, one program per (batch x head, block of keys) over the
query blocks, which reads the stream once, recomputes the probabilities from the row
statistics, regenerates the dropout mask and writes ``dk``, ``dv`` and the stream gradient of
its own key columns (the softmax's gradient, divided for the running mean and zero at padded
keys, plus the gradient of this layer's own stream arriving from the next layer: the gradient
handed to the previous layer); and the dq pass, one program per (batch x head, block of
queries), ``dq = dS k`` over the key blocks in order. Every configuration they launch is in
one table (``_LAUNCH_TABLE``, by target, input width, head size and length).

The semantics are the eager route's (:class:`~.residual_attention.RealformerMultiheadAttention`,
``_add_to_stream`` and ``_attend_stream``), up to the order of floating-point sums; for
float16/bfloat16 inputs the kernels add ``q k^T`` to the stream as accumulated in float32, where
the eager route rounds the product to the inputs' dtype first. With
``TRITON_INTERPRET=1`` (set before triton is imported) the kernels run on CPU tensors, which is
how the tests check them against the eager formula.

This module imports triton; the plugin imports it only when the triton route is asked for.
"""

import contextlib
import functools
from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

from .kept_stream import (
    FORWARD_IN_BACKWARD,
    StreamLink,
    forward_runs_in_backward,
    storage_unshared,
    stream_link_of,
    warn_once,
    writable_stream,
)
from .residual_attention import _MASK_VALUE


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
INTERPRETER = None

# sequences up to this many tokens (queries for the forward and dq, keys for the key-block
# pass) get the "short" row: 32-wide blocks, never mostly padding at 32 tokens
SHORT = 64

# Every configuration the route launches, in one place: (bytes per input element, padded head
# size) -> kernel -> length class -> config, for every target: A100 (sm_80), H100/H200 (sm_90)
# and the others (sm_86/89: 99 KB of shared memory per block) have the same 64K registers per
# SM, and the register file, not shared memory, is what bounds these kernels. Each row compiles
# without register spills for sm_80 and sm_90 (and sm_86 at float16, head 128) with every
# optional input on, causal or with a mask (tests/test_triton_compile.py); its registers, shared
# memory and blocks per SM: docs/benchmarks.md, "Launch configurations of the triton route".
# Backward (key-block pass) blocks are 32 x 32: larger ones spill with every input on.
_DELTA = KernelConfig(64, 16, 4, 1)  # block_m rows of (bsz*heads*tgt_len, head_dim) per program
_SHORT_16BIT = {"forward": KernelConfig(32, 32, 4, 2), "dq": KernelConfig(32, 32, 4, 2)}
_LAUNCH_TABLE = {
    (2, 32): {
        "forward": {"long": KernelConfig(64, 32, 8, 2), "short": _SHORT_16BIT["forward"]},
        "backward": {"long": KernelConfig(32, 32, 4, 2), "short": KernelConfig(32, 32, 4, 2)},
        "dq": {"long": KernelConfig(64, 64, 4, 2), "short": _SHORT_16BIT["dq"]},
    },
    (2, 64): {
        "forward": {"long": KernelConfig(64, 32, 8, 2), "short": _SHORT_16BIT["forward"]},
        "backward": {"long": KernelConfig(32, 32, 4, 2), "short": KernelConfig(32, 32, 4, 2)},
        "dq": {"long": KernelConfig(64, 64, 4, 2), "short": _SHORT_16BIT["dq"]},
    },
    (2, 128): {
        "forward": {"long": KernelConfig(64, 32, 8, 2), "short": _SHORT_16BIT["forward"]},
        "backward": {"long": KernelConfig(32, 32, 8, 1), "short": KernelConfig(32, 32, 8, 1)},
        "dq": {"long": _SHORT_16BIT["dq"], "short": _SHORT_16BIT["dq"]},
    },
    # float32 (tl.dot in full precision: FMA, not tensor cores) at every head size
    (4, None): {
        "forward": {"long": KernelConfig(16, 16, 4, 1), "short": KernelConfig(16, 16, 4, 1)},
        "backward": {"long": KernelConfig(16, 16, 8, 1), "short": KernelConfig(16, 16, 8, 1)},
        "dq": {"long": KernelConfig(32, 32, 4, 1), "short": KernelConfig(32, 32, 4, 1)},
    },
}


def padded_head_dim(head_dim: int) -> int:
    """The head size the kernels work on: the next power of two, at least 16."""
    return max(16, triton.next_power_of_2(head_dim))


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


_TL_DTYPES = {
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
    torch.float32: tl.float32,
    torch.float64: tl.float64,
}


def stream_dtype(dtype: torch.dtype) -> torch.dtype:
    """The stream's dtype for inputs of ``dtype``: float32, float64 for float64 (as eager)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@triton.jit
def _dot(a, b, ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` accumulated in ``ACC``; ``UPCAST``: on float32 copies (the interpreter, whose
    numpy has no bfloat16, multiplies bfloat16 tiles as their raw bits)."""
    if UPCAST:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), out_dtype=ACC, input_precision=PRECISION)
    else:
        c = tl.dot(a, b, out_dtype=ACC, input_precision=PRECISION)
    return c


@triton.jit
def _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The dropout mask of the tile of rows ``offs_m`` and keys ``start_n ..
    start_n + BLOCK_N``: True where the probability is kept. One Philox call (``randint4x``)
    draws the bits of four neighbouring keys: key ``n`` of row ``r`` of the (bsz*heads,
    tgt_len, src_len) probabilities takes output ``n % 4`` of counter ``r * ceil(src_len / 4) +
    n // 4`` (``r = bh * tgt_len + row``), kept where its top 31 bits are at least
    ``threshold = round(p * 2**31)``. The mask depends on neither block size."""
    groups = (src_len + 3) // 4
    row = bh.to(tl.int64) * tgt_len + offs_m.to(tl.int64)
    offs_g = start_n // 4 + tl.arange(0, BLOCK_N // 4)
    r0, r1, r2, r3 = tl.randint4x(seed, row[:, None] * groups + offs_g[None, :].to(tl.int64))
    bits = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (BLOCK_M, BLOCK_N))
    return (bits >> 1).to(tl.int32) >= threshold


@triton.jit
def _logits(
    s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor, mask_value,
    MASK, sm_t, sm_s, KPM, skpm_b, skpm_s,
    HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr, DIVIDE: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """The softmax input of a stream tile, as the eager route forms it, and the tile's padded
    keys (a (1, BLOCK_N) mask; all False without key padding). Columns past ``src_len`` are
    -inf: they take no part in any row, a fully masked row included. ``CAUSAL``: keys after the
    query are the fill, as the eager route's sum of the stream and a -inf causal mask clamped
    at the fill (``s / divisor - 1e30`` is -1e30 for any stream value below 3.7e22); unlike
    padded keys, which are replaced, their gradient flows on into the stream as the eager
    route's does."""
    logits = s
    if DIVIDE:
        logits = logits / divisor
    valid_n = offs_n < src_len
    if HAS_MASK:
        am = tl.load(
            MASK + offs_m[:, None] * sm_t + offs_n[None, :] * sm_s,
            mask=(offs_m < tgt_len)[:, None] & valid_n[None, :],
            other=0.0,
        ).to(s.dtype)
        logits = logits + tl.maximum(am, mask_value)
    if CAUSAL:
        logits = tl.where(offs_n[None, :] > offs_m[:, None], mask_value, logits)
    if HAS_KPM:
        b = bh // num_heads
        pad = tl.load(KPM + b * skpm_b + offs_n * skpm_s, mask=valid_n, other=0) != 0
        pad2 = pad[None, :]
    else:
        pad2 = (offs_n < 0)[None, :]
    logits = tl.where(pad2, mask_value, logits)
    logits = tl.where(valid_n[None, :], logits, float("-inf"))
    return logits, pad2


@triton.jit
def _program(length, BLOCK: tl.constexpr):
    """This program's (block of ``length``, bsz*heads index): the grid's one axis folds them,
    the blocks of one head next to each other (see ``_grid``)."""
    blocks = tl.cdiv(length, BLOCK)
    return tl.program_id(0) % blocks, tl.program_id(0) // blocks


@triton.jit
def _any_row_only_fill(ROWMAX, bh64, tgt_len, offs_m, valid_m, mask_value):
    """Whether a row of the block sees nothing but the fill (its maximum is the fill: every key
    up to it padded, under the causal mask): such a row attends to every key, the ones after it
    included, as in the eager route, so its blocks after the diagonal are not skipped."""
    row_max = tl.load(ROWMAX + bh64 * tgt_len + offs_m, mask=valid_m, other=0.0)
    return tl.min(row_max) <= mask_value


# integers that change from batch to batch: triton would otherwise compile a variant of each
# kernel per value class (1, a multiple of 16, other) of each, at the first batch that has it
_RUNTIME_INTEGERS = [
    "tgt_len", "src_len", "num_heads", "seed", "threshold", "sp_b", "sp_t", "sds_b", "sds_t",
    "sm_t", "skpm_b", "rows",
]  # fmt: skip


def _not_specialized(*aligned):
    """The runtime integers of a kernel but ``aligned`` (strides that keep their divisibility)."""
    return [n for n in _RUNTIME_INTEGERS if n not in aligned]


@triton.jit
def _forward_block(
    q, m_i, l_i, acc, start_n, offs_m, offs_d, bh, K, V, PREV, STREAM, MASK, KPM,
    sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sp_b, sp_t, sp_s, sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_PREV: tl.constexpr, HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One key block of the forward: the stream tile written (0 after the diagonal where
    ``CAUSAL``), the online softmax's maximum, sum and ``P V`` updated."""
    bh64 = bh.to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    valid_m = offs_m < tgt_len
    valid_n = offs_n < src_len
    valid_d = offs_d < HEAD_DIM
    tile = valid_m[:, None] & valid_n[None, :]
    k = tl.load(
        K + bh64 * sk_b + offs_n[:, None] * sk_s + offs_d[None, :] * sk_d,
        mask=valid_n[:, None] & valid_d[None, :],
        other=0.0,
    )
    s = _dot(q, tl.trans(k), ACC, PRECISION, UPCAST)
    if HAS_PREV:
        prev = tl.load(
            PREV + bh64 * sp_b + offs_m[:, None] * sp_t + offs_n[None, :] * sp_s,
            mask=tile,
            other=0.0,
        )
        s = s + prev.to(ACC)
    stream_tile = STREAM + bh64 * tgt_len * src_len + offs_m[:, None] * src_len + offs_n[None, :]
    if CAUSAL:
        tl.store(stream_tile, tl.where(offs_n[None, :] > offs_m[:, None], 0.0, s), mask=tile)
    else:
        tl.store(stream_tile, s, mask=tile)
    logits, _ = _logits(
        s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor, mask_value,
        MASK, sm_t, sm_s, KPM, skpm_b, skpm_s, HAS_MASK, HAS_KPM, DIVIDE, CAUSAL,
    )  # fmt: skip
    m_new = tl.maximum(m_i, tl.max(logits, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(logits - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DROPOUT:
        keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold, BLOCK_M, BLOCK_N)
        p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
    v = tl.load(
        V + bh64 * sv_b + offs_n[:, None] * sv_s + offs_d[None, :] * sv_d,
        mask=valid_n[:, None] & valid_d[None, :],
        other=0.0,
    )
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, ACC, PRECISION, UPCAST)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=_not_specialized("sds_b", "sds_t"))
def _forward_kernel(
    Q, K, V, PREV, STREAM, OUT, ROWMAX, ROWSUM, MASK, KPM,
    sq_b, sq_t, sq_d, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sp_b, sp_t, sp_s,
    sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_PREV: tl.constexpr, HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One program per (bsz*heads, block of queries), folded into the grid's first axis (the
    query blocks of one head next to each other): walks the key blocks. ``CAUSAL`` (a
    self-attention chain, ``tgt_len == src_len``): the key blocks wholly after the block's last
    query are not computed (their stream tiles are written 0), but where a row of the block
    sees only the fill (see ``_any_row_only_fill``)."""
    pid_m, bh = _program(tgt_len, BLOCK_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    valid_m = offs_m < tgt_len
    valid_d = offs_d < HEAD_DIM
    bh64 = bh.to(tl.int64)
    q = tl.load(
        Q + bh64 * sq_b + offs_m[:, None] * sq_t + offs_d[None, :] * sq_d,
        mask=valid_m[:, None] & valid_d[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    hi = src_len
    if CAUSAL:
        hi = tl.minimum(src_len, (pid_m + 1) * BLOCK_M)  # the keys up to the block's last query
    for start_n in range(0, hi, BLOCK_N):
        m_i, l_i, acc = _forward_block(
            q, m_i, l_i, acc, start_n, offs_m, offs_d, bh, K, V, PREV, STREAM, MASK, KPM,
            sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sp_b, sp_t, sp_s, sm_t, sm_s, skpm_b, skpm_s,
            tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
            HEAD_DIM, BLOCK_M, BLOCK_N, HAS_PREV, HAS_MASK, HAS_KPM, DIVIDE, DROPOUT, CAUSAL,
            ACC, PRECISION, UPCAST,
        )  # fmt: skip
    if CAUSAL:
        only_fill = tl.min(tl.where(valid_m, m_i, 0.0)) <= mask_value
        stream_base = STREAM + bh64 * tgt_len * src_len
        for start_n in range(tl.cdiv(hi, BLOCK_N) * BLOCK_N, src_len, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            valid_n = offs_n < src_len
            tl.store(
                stream_base + offs_m[:, None] * src_len + offs_n[None, :],
                tl.zeros([BLOCK_M, BLOCK_N], ACC),
                mask=valid_m[:, None] & valid_n[None, :],
            )
            if only_fill:
                # every logit of the tile is the fill (the row maximum stays): the rows that
                # see only the fill take 1 each, the others 0 (exp(-1e30 - max))
                p = tl.where(valid_n[None, :], tl.exp(mask_value - m_i)[:, None], 0.0)
                l_i += tl.sum(p, 1)
                if DROPOUT:
                    keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold,
                                 BLOCK_M, BLOCK_N)  # fmt: skip
                    p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
                v = tl.load(
                    V + bh64 * sv_b + offs_n[:, None] * sv_s + offs_d[None, :] * sv_d,
                    mask=valid_n[:, None] & valid_d[None, :],
                    other=0.0,
                )
                acc += _dot(p.to(v.dtype), v, ACC, PRECISION, UPCAST)
    out = acc / l_i[:, None]
    tl.store(
        OUT + bh64 * tgt_len * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
        out.to(OUT.dtype.element_ty),
        mask=valid_m[:, None] & valid_d[None, :],
    )
    # the maximum and the sum, not their log-sum-exp: a fully masked row's maximum is the fill,
    # -1e30, which would absorb log(src_len)
    tl.store(ROWMAX + bh64 * tgt_len + offs_m, m_i, mask=valid_m)
    tl.store(ROWSUM + bh64 * tgt_len + offs_m, l_i, mask=valid_m)


@triton.jit(do_not_specialize=_not_specialized())
def _delta_kernel(
    OUT, DOUT, DELTA, sdo_b, sdo_t, sdo_d, rows, tgt_len,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """``delta = rowsum(d_out * out)`` of ``BLOCK_M`` of the ``rows = bsz*heads*tgt_len`` rows:
    the softmax backward's correction, read from ``d_out`` in its own strides."""
    offs_r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    valid = (offs_r < rows)[:, None] & (offs_d < HEAD_DIM)[None, :]
    r64 = offs_r.to(tl.int64)
    out = tl.load(OUT + r64[:, None] * HEAD_DIM + offs_d[None, :], mask=valid, other=0.0)
    d_out = tl.load(
        DOUT + (r64 // tgt_len)[:, None] * sdo_b + (r64 % tgt_len)[:, None] * sdo_t
        + offs_d[None, :] * sdo_d,
        mask=valid,
        other=0.0,
    )  # fmt: skip
    delta = tl.sum(out.to(ACC) * d_out.to(ACC), 1)
    tl.store(DELTA + r64, delta, mask=offs_r < rows)


@triton.jit
def _backward_block(
    k, v, dk, dv, start_m, start_n, offs_d, bh, Q, STREAM, DOUT, ROWMAX, ROWSUM, DELTA, DSTREAM,
    DS, MASK, KPM, sq_b, sq_t, sq_d, sdo_b, sdo_t, sdo_d, sds_b, sds_t, sds_s,
    sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_DSTREAM: tl.constexpr, HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, REBUILD: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One query block of the key-block pass: the stream gradient tile written, ``dk`` and
    ``dv`` updated; ``REBUILD``: the stream tile ``S_l`` rewritten as ``S_{l-1} = S_l - q k^T``
    (0 after the diagonal where ``CAUSAL``, as the forward wrote it)."""
    bh64 = bh.to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    valid_m = offs_m < tgt_len
    valid_n = offs_n < src_len
    valid_d = offs_d < HEAD_DIM
    tile = valid_m[:, None] & valid_n[None, :]
    qd_tile = valid_m[:, None] & valid_d[None, :]
    q = tl.load(
        Q + bh64 * sq_b + offs_m[:, None] * sq_t + offs_d[None, :] * sq_d, mask=qd_tile, other=0.0
    )
    do = tl.load(
        DOUT + bh64 * sdo_b + offs_m[:, None] * sdo_t + offs_d[None, :] * sdo_d,
        mask=qd_tile,
        other=0.0,
    )
    stream_offs = bh64 * tgt_len * src_len + offs_m[:, None] * src_len + offs_n[None, :]
    s = tl.load(STREAM + stream_offs, mask=tile, other=0.0)
    if REBUILD:  # this program's own tile: read above, written once here
        rebuilt = s - _dot(q, tl.trans(k), ACC, PRECISION, UPCAST)
        if CAUSAL:
            rebuilt = tl.where(offs_n[None, :] > offs_m[:, None], 0.0, rebuilt)
        tl.store(STREAM + stream_offs, rebuilt, mask=tile)
    logits, pad2 = _logits(
        s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor, mask_value,
        MASK, sm_t, sm_s, KPM, skpm_b, skpm_s, HAS_MASK, HAS_KPM, DIVIDE, CAUSAL,
    )  # fmt: skip
    m_i = tl.load(ROWMAX + bh64 * tgt_len + offs_m, mask=valid_m, other=0.0)
    l_i = tl.load(ROWSUM + bh64 * tgt_len + offs_m, mask=valid_m, other=1.0)
    delta = tl.load(DELTA + bh64 * tgt_len + offs_m, mask=valid_m, other=0.0)
    p = tl.exp(logits - m_i[:, None]) * (1.0 / l_i)[:, None]
    p = tl.where(tile, p, 0.0)
    # dP of the dropped probabilities, as the eager route's P.V in the values' dtype
    dp = _dot(do, tl.trans(v), ACC, PRECISION, UPCAST)
    if DROPOUT:
        keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold, BLOCK_M, BLOCK_N)
        # the eager route scales by 1 / (1 - p): one division of the kept entries
        scale = tl.where(keep, 1.0, 0.0).to(ACC) / (1.0 - dropout_p)
        pd = p * scale
        dp = dp * scale
    else:
        pd = p
    dv += _dot(tl.trans(pd.to(v.dtype)), do, ACC, PRECISION, UPCAST)
    ds = p * (dp - delta[:, None])
    if DIVIDE:
        ds = ds / divisor
    ds = tl.where(pad2, 0.0, ds)  # padded keys were replaced, not added to
    if HAS_DSTREAM:
        ds_in = tl.load(
            DSTREAM + bh64 * sds_b + offs_m[:, None] * sds_t + offs_n[None, :] * sds_s,
            mask=tile,
            other=0.0,
        ).to(ACC)
        if CAUSAL:  # after the diagonal, only rows that see only the fill take it on
            ds_in = tl.where((offs_n[None, :] > offs_m[:, None]) & (m_i > mask_value)[:, None],
                             0.0, ds_in)  # fmt: skip
        ds = ds + ds_in
    tl.store(DS + stream_offs, ds, mask=tile)
    dk += _dot(tl.trans(ds.to(q.dtype)), q, ACC, PRECISION, UPCAST)
    return dk, dv


@triton.jit(do_not_specialize=_not_specialized())
def _backward_kernel(
    Q, K, V, STREAM, DOUT, ROWMAX, ROWSUM, DELTA, DSTREAM, DS, DK, DV, MASK, KPM,
    sq_b, sq_t, sq_d, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sdo_b, sdo_t, sdo_d,
    sds_b, sds_t, sds_s, sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_DSTREAM: tl.constexpr, HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, REBUILD: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One program per (bsz*heads, block of keys), folded into the grid's first axis: walks the
    query blocks, recomputes the probabilities from the stream and the row statistics, and
    writes ``dk``, ``dv`` and the stream gradient ``DS`` of its own key columns (the softmax's
    gradient, divided for the running mean and zero at padded keys, plus ``DSTREAM``, the
    gradient arriving at this layer's stream): the previous stream's gradient, and what the
    dq pass multiplies by ``k``. No atomics: every tile it writes is its own. ``CAUSAL``: the
    query blocks wholly before the block's first key are not computed (their gradient tiles
    are written 0), but where a row of the block sees only the fill. ``REBUILD`` (one stream per
    chain): its key columns of ``STREAM`` are rewritten as the previous layer's stream. ``DS``
    may be ``DSTREAM`` itself: each tile is read and written by this program alone."""
    pid_n, bh = _program(src_len, BLOCK_N)
    bh64 = bh.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    valid_n = offs_n < src_len
    valid_d = offs_d < HEAD_DIM
    kv_tile = valid_n[:, None] & valid_d[None, :]
    k = tl.load(
        K + bh64 * sk_b + offs_n[:, None] * sk_s + offs_d[None, :] * sk_d, mask=kv_tile, other=0.0
    )
    v = tl.load(
        V + bh64 * sv_b + offs_n[:, None] * sv_s + offs_d[None, :] * sv_d, mask=kv_tile, other=0.0
    )
    dk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    lo = 0
    if CAUSAL:
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M  # the first query block that sees a key
        for start_m in range(0, lo, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            valid_m = offs_m < tgt_len
            if _any_row_only_fill(ROWMAX, bh64, tgt_len, offs_m, valid_m, mask_value):
                # a tile wholly after the diagonal: its stream is 0 in every layer (nothing to
                # rebuild)
                dk, dv = _backward_block(
                    k, v, dk, dv, start_m, pid_n * BLOCK_N, offs_d, bh, Q, STREAM, DOUT, ROWMAX,
                    ROWSUM,
                    DELTA, DSTREAM, DS, MASK, KPM, sq_b, sq_t, sq_d, sdo_b, sdo_t, sdo_d,
                    sds_b, sds_t, sds_s, sm_t, sm_s, skpm_b, skpm_s, tgt_len, src_len,
                    num_heads, divisor, mask_value, dropout_p, threshold, seed, HEAD_DIM,
                    BLOCK_M, BLOCK_N, HAS_DSTREAM, HAS_MASK, HAS_KPM, DIVIDE, DROPOUT, CAUSAL,
                    False, ACC, PRECISION, UPCAST,
                )  # fmt: skip
            else:
                tl.store(
                    DS + bh64 * tgt_len * src_len + offs_m[:, None] * src_len + offs_n[None, :],
                    tl.zeros([BLOCK_M, BLOCK_N], ACC),
                    mask=valid_m[:, None] & valid_n[None, :],
                )
    for start_m in range(lo, tgt_len, BLOCK_M):
        dk, dv = _backward_block(
            k, v, dk, dv, start_m, pid_n * BLOCK_N, offs_d, bh, Q, STREAM, DOUT, ROWMAX, ROWSUM,
            DELTA,
            DSTREAM, DS, MASK, KPM, sq_b, sq_t, sq_d, sdo_b, sdo_t, sdo_d, sds_b, sds_t, sds_s,
            sm_t, sm_s, skpm_b, skpm_s, tgt_len, src_len, num_heads, divisor, mask_value,
            dropout_p, threshold, seed, HEAD_DIM, BLOCK_M, BLOCK_N, HAS_DSTREAM, HAS_MASK,
            HAS_KPM, DIVIDE, DROPOUT, CAUSAL, REBUILD, ACC, PRECISION, UPCAST,
        )  # fmt: skip
    out_d = bh64 * src_len * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out_d, dk.to(DK.dtype.element_ty), mask=kv_tile)
    tl.store(DV + out_d, dv.to(DV.dtype.element_ty), mask=kv_tile)


@triton.jit
def _dq_block(acc, ds_base, start_n, offs_m, offs_d, K, sk_b, sk_s, sk_d, bh64,
              tgt_len, src_len, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
              ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    offs_n = start_n + tl.arange(0, BLOCK_N)
    valid_n = offs_n < src_len
    ds = tl.load(
        ds_base + offs_m[:, None] * src_len + offs_n[None, :],
        mask=(offs_m < tgt_len)[:, None] & valid_n[None, :],
        other=0.0,
    )
    k = tl.load(
        K + bh64 * sk_b + offs_n[:, None] * sk_s + offs_d[None, :] * sk_d,
        mask=valid_n[:, None] & (offs_d < HEAD_DIM)[None, :],
        other=0.0,
    )
    return acc + _dot(ds.to(k.dtype), k, ACC, PRECISION, UPCAST)


@triton.jit(do_not_specialize=_not_specialized())
def _dq_kernel(
    DS, K, DQ, ROWMAX, sk_b, sk_s, sk_d, tgt_len, src_len, mask_value,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """``dq = DS k`` per (bsz*heads, block of queries), folded into the grid's first axis: the
    stream gradient's rows (as the key-block pass wrote them, rounded to the inputs' dtype as
    that pass rounds them for ``dk``) times the keys, summed over the key blocks in order (no
    atomics: deterministic), stored once in the inputs' dtype. ``CAUSAL``: the key blocks after
    the block's last query (zero gradient) are skipped, but where a row sees only the fill."""
    pid_m, bh = _program(tgt_len, BLOCK_M)
    bh64 = bh.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    valid_m = offs_m < tgt_len
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    ds_base = DS + bh64 * tgt_len * src_len
    hi = src_len
    if CAUSAL:
        hi = tl.minimum(src_len, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        acc = _dq_block(acc, ds_base, start_n, offs_m, offs_d, K, sk_b, sk_s, sk_d, bh64,
                        tgt_len, src_len, HEAD_DIM, BLOCK_N, ACC, PRECISION, UPCAST)  # fmt: skip
    if CAUSAL:
        if _any_row_only_fill(ROWMAX, bh64, tgt_len, offs_m, valid_m, mask_value):
            for start_n in range(tl.cdiv(hi, BLOCK_N) * BLOCK_N, src_len, BLOCK_N):
                acc = _dq_block(acc, ds_base, start_n, offs_m, offs_d, K, sk_b, sk_s, sk_d,
                                bh64, tgt_len, src_len, HEAD_DIM, BLOCK_N, ACC, PRECISION,
                                UPCAST)  # fmt: skip
    tl.store(
        DQ + bh64 * tgt_len * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
        acc.to(DQ.dtype.element_ty),
        mask=valid_m[:, None] & (offs_d < HEAD_DIM)[None, :],
    )


def dropout_threshold(dropout_p: float) -> int:
    """The kernels' integer threshold of ``dropout_p``: a probability is kept where the top 31
    bits of its Philox output are at least this (keep rate ``1 - threshold / 2**31``)."""
    return min(int(round(dropout_p * 2**31)), 2**31 - 1)


@triton.jit
def _dropout_mask_kernel(
    KEEP, tgt_len, src_len, threshold, seed, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    start_n = tl.program_id(1) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    bh = tl.program_id(2)
    keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold, BLOCK_M, BLOCK_N)
    row = bh.to(tl.int64) * tgt_len + offs_m.to(tl.int64)
    tl.store(
        KEEP + row[:, None] * src_len + offs_n[None, :],
        keep.to(tl.int8),
        mask=(offs_m < tgt_len)[:, None] & (offs_n < src_len)[None, :],
    )


def dropout_keep_mask(
    seed: int, bsz_heads: int, tgt_len: int, src_len: int, dropout_p: float, device
) -> Tensor:
    """The dropout mask (True = kept) the kernels draw for ``seed``: a bool tensor of shape
    ``(bsz_heads, tgt_len, src_len)``, drawn by the kernels' own ``_keep`` (for replaying a
    call's masks, as studies/route_precision.py does; tests/test_triton_kernels.py checks the
    kernels' mask against Philox written there instead)."""
    keep = torch.empty((bsz_heads, tgt_len, src_len), dtype=torch.int8, device=device)
    grid = (triton.cdiv(tgt_len, 16), triton.cdiv(src_len, 16), bsz_heads)
    with _device_of(keep):
        _dropout_mask_kernel[grid](
            keep, tgt_len, src_len, dropout_threshold(dropout_p), seed, 16, 16
        )  # fmt: skip
    return keep.bool()


def draw_dropout_seed() -> int:
    """The seed of one call's dropout mask, drawn from torch's CPU generator (seeded by
    ``torch.manual_seed``, as fairseq seeds it), without a device synchronisation."""
    return int(torch.randint(0, 2**31 - 1, (1,)).item())


def _capability(device: torch.device) -> Optional[Tuple[int, int]]:
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)
    return INTERPRETER


def _device_of(t: Tensor):
    """Launches on ``t``'s GPU (triton launches on the current device)."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _upcast(q: Tensor) -> bool:
    """Whether the dots run on float32 copies: bfloat16 in the interpreter (CPU tensors)."""
    return q.dtype == torch.bfloat16 and q.device.type == "cpu"


def _options(q: Tensor):
    """The kernels' accumulator dtype and tl.dot's precision for inputs like ``q``: float32
    products on full-precision float32 (no TF32, as eager's default), float64 for float64."""
    acc = tl.float64 if q.dtype == torch.float64 else tl.float32
    return acc, "ieee"


# whether this module's kernels run in triton's interpreter (TRITON_INTERPRET=1 at import)
INTERPRETED = isinstance(_forward_kernel, InterpretedFunction)


def _grid(length: int, block: int, bsz_heads: int) -> Tuple[int]:
    """The launch grid of one program per (bsz*heads, block of ``length``), folded into the
    first axis (up to 2**31 - 1 programs; the second and third axes stop at 65,535)."""
    return (triton.cdiv(length, block) * bsz_heads,)


class _ResidualAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q, k, v, prev, key_padding_mask, attn_mask, num_heads, divisor, dropout_p, mask_value,
        causal, link_in, link_out,
    ):  # fmt: skip
        bh, tgt_len, head_dim = q.shape
        src_len = k.size(1)
        sdtype = stream_dtype(q.dtype)
        stream = torch.empty((bh, tgt_len, src_len), dtype=sdtype, device=q.device)
        out = torch.empty((bh, tgt_len, head_dim), dtype=q.dtype, device=q.device)
        rowmax = torch.empty((bh, tgt_len), dtype=sdtype, device=q.device)
        rowsum = torch.empty((bh, tgt_len), dtype=sdtype, device=q.device)
        seed = draw_dropout_seed() if dropout_p > 0 else 0
        acc, precision = _options(q)
        cfg = launch_config("forward", head_dim, q.dtype, _capability(q.device), tgt_len)
        mask, kpm = _masks(attn_mask, key_padding_mask, sdtype)
        prev_arg = prev if prev is not None else stream  # never read without HAS_PREV
        with _device_of(q):
            _forward_kernel[_grid(tgt_len, cfg.block_m, bh)](
                q, k, v, prev_arg, stream, out, rowmax, rowsum, mask, kpm,
                *q.stride(), *k.stride(), *v.stride(), *prev_arg.stride(),
                *_strides2(mask), *_strides2(kpm),
                tgt_len, src_len, num_heads, float(divisor), float(mask_value), float(dropout_p),
                dropout_threshold(dropout_p), seed,
                HEAD_DIM=head_dim, BLOCK_D=padded_head_dim(head_dim), BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, HAS_PREV=prev is not None, HAS_MASK=attn_mask is not None,
                HAS_KPM=key_padding_mask is not None, DIVIDE=divisor != 1.0,
                DROPOUT=dropout_p > 0, CAUSAL=causal,
                ACC=acc, PRECISION=precision, UPCAST=_upcast(q),
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, rowmax, rowsum, mask, kpm)
        # the stream, held by the link: handed to the next layer that reads it, which
        # rebuilds it in its backward (kept_stream.StreamLink)
        ctx.link_in, ctx.link_out = link_in, link_out
        link_out.keep(stream)
        link_out.remember_scores(functools.partial(recomputed_scores, causal=causal), q, k)
        ctx.has_mask = attn_mask is not None
        ctx.has_kpm = key_padding_mask is not None
        ctx.has_prev = prev is not None
        ctx.causal = causal
        ctx.params = (num_heads, float(divisor), float(dropout_p), float(mask_value), seed)
        ctx.set_materialize_grads(False)
        return out, stream

    @staticmethod
    def backward(ctx, d_out, d_stream):
        q, k, v, out, rowmax, rowsum, mask, kpm = ctx.saved_tensors
        num_heads, divisor, dropout_p, mask_value, seed = ctx.params
        link_in = ctx.link_in
        rebuild = link_in is not None and link_in.rebuilder is ctx.link_out
        stream = ctx.link_out.take(release=rebuild)  # S_l: kept, or rebuilt by the layer above
        if rebuild:  # S_{l-1} written over S_l: never over a stream a caller holds
            stream = writable_stream(stream)
        bh, tgt_len, head_dim = q.shape
        src_len = k.size(1)
        sdtype = stream.dtype
        capability = _capability(q.device)
        if d_out is None:  # only the stream's gradient arrives: zeros that take no memory
            d_out = out.new_zeros(()).expand_as(out)
        acc, precision = _options(q)
        block_d = padded_head_dim(head_dim)
        # the stream gradient: the previous stream's gradient where it has one, else a
        # scratch that only the dq pass reads; written over the incoming gradient where that is
        # this chain's own buffer
        if _gradient_writable(ctx, d_stream, sdtype):
            d_scores = d_stream
        else:
            d_scores = torch.empty_like(stream)
        delta = torch.empty((bh, tgt_len), dtype=sdtype, device=q.device)
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk = torch.empty((bh, src_len, head_dim), dtype=k.dtype, device=q.device)
        dv = torch.empty((bh, src_len, head_dim), dtype=v.dtype, device=q.device)
        ds_arg = d_stream if d_stream is not None else stream  # never read without HAS_DSTREAM
        delta_cfg = launch_config("delta", head_dim, q.dtype, capability, tgt_len)
        cfg = launch_config("backward", head_dim, q.dtype, capability, src_len)
        dq_cfg = launch_config("dq", head_dim, q.dtype, capability, tgt_len)
        with _device_of(q):
            _delta_kernel[(triton.cdiv(bh * tgt_len, delta_cfg.block_m),)](
                out, d_out, delta, *d_out.stride(), bh * tgt_len, tgt_len,
                HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=delta_cfg.block_m, ACC=acc,
                num_warps=delta_cfg.num_warps, num_stages=delta_cfg.num_stages,
            )  # fmt: skip
            _backward_kernel[_grid(src_len, cfg.block_n, bh)](
                q, k, v, stream, d_out, rowmax, rowsum, delta, ds_arg, d_scores, dk, dv,
                mask, kpm,
                *q.stride(), *k.stride(), *v.stride(), *d_out.stride(), *ds_arg.stride(),
                *_strides2(mask), *_strides2(kpm),
                tgt_len, src_len, num_heads, divisor, mask_value, dropout_p,
                dropout_threshold(dropout_p), seed,
                HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, HAS_DSTREAM=d_stream is not None,
                HAS_MASK=ctx.has_mask, HAS_KPM=ctx.has_kpm, DIVIDE=divisor != 1.0,
                DROPOUT=dropout_p > 0, CAUSAL=ctx.causal, REBUILD=rebuild, ACC=acc,
                PRECISION=precision, UPCAST=_upcast(q),
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )  # fmt: skip
            _dq_kernel[_grid(tgt_len, dq_cfg.block_m, bh)](
                d_scores, k, dq, rowmax, *k.stride(), tgt_len, src_len, mask_value,
                HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=dq_cfg.block_m,
                BLOCK_N=dq_cfg.block_n, CAUSAL=ctx.causal, ACC=acc, PRECISION=precision,
                UPCAST=_upcast(q),
                num_warps=dq_cfg.num_warps, num_stages=dq_cfg.num_stages,
            )  # fmt: skip
        if rebuild:
            link_in.keep(stream)  # now S_{l-1}, for the previous layer's backward
        ctx.link_out.scores = None  # this layer's q and k: needed no longer
        need_dprev = ctx.has_prev and ctx.needs_input_grad[3]
        d_prev = d_scores if need_dprev else None
        return dq, dk, dv, d_prev, None, None, None, None, None, None, None, None, None


def _gradient_writable(ctx, d_stream: Optional[Tensor], sdtype: torch.dtype) -> bool:
    """Whether the previous stream's gradient may be written over ``d_stream``, the gradient
    of this layer's stream: where a layer of this route took the stream over (the gradient is
    the one its backward wrote), nobody hooked the stream then (``hooked``), and it is a
    contiguous tensor of the stream's dtype that nothing else holds."""
    return (
        d_stream is not None
        and ctx.link_out.rebuilder is not None
        and not ctx.link_out.hooked
        and d_stream.dtype == sdtype
        and d_stream.is_contiguous()
        and storage_unshared(d_stream)
    )


def recomputed_scores(q: Tensor, k: Tensor, causal: bool) -> Tensor:
    """What the forward added to the stream, ``q k^T`` in the stream's dtype (0 after the
    diagonal where ``causal``), recomputed in torch: for a layer whose own backward does not
    run (see ``kept_stream.StreamLink.take``)."""
    sdtype = stream_dtype(q.dtype)
    raw = torch.bmm(q.to(sdtype), k.to(sdtype).transpose(1, 2))
    return raw.tril_() if causal else raw


def _masks(
    attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor], sdtype: torch.dtype
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """The masks as the kernels read them: the additive mask in the stream's dtype (as eager
    converts it), key padding as int8 (nonzero = padded)."""
    mask = attn_mask.to(sdtype) if attn_mask is not None else None
    kpm = key_padding_mask.to(torch.int8) if key_padding_mask is not None else None
    return mask, kpm


def _strides2(t: Optional[Tensor]) -> Tuple[int, int]:
    return (t.stride(0), t.stride(1)) if t is not None else (0, 0)


def residual_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prev_attn_scores: Optional[Tensor],
    key_padding_mask: Optional[Tensor],
    attn_mask: Optional[Tensor],
    num_heads: int,
    softmax_divisor: float,
    dropout_p: float,
    mask_value: float = _MASK_VALUE,
    causal: bool = False,
    one_stream_per_chain: bool = True,
) -> Tuple[Tensor, Tensor]:
    """One layer of residual attention in the fused kernels.

    ``q`` ``(bsz*heads, tgt_len, head_dim)``, already scaled by ``head_dim ** -0.5``; ``k``,
    ``v`` ``(bsz*heads, src_len, head_dim)``, all of one dtype (float16, bfloat16, float32 or
    float64) on one device; ``prev_attn_scores`` the previous layer's stream ``(bsz*heads,
    tgt_len, src_len)`` or None; ``key_padding_mask`` ``(bsz, src_len)`` bool, True at padded
    keys; ``attn_mask`` ``(tgt_len, src_len)`` additive (may hold -inf) or None;
    ``softmax_divisor`` 1 for the running sum, ``layer_idx + 1`` for the running mean;
    ``dropout_p`` the attention dropout (0 in eval); ``causal``: self-attention (``tgt_len ==
    src_len``) under the causal mask, made in the kernels from the indices (no ``attn_mask``
    then). Returns ``attn`` ``(bsz*heads, tgt_len,
    head_dim)`` in ``q``'s dtype and the new stream ``attn_scores`` ``(bsz*heads, tgt_len,
    src_len)``, float32 (float64 for float64 inputs). Differentiable in ``q``, ``k``, ``v`` and
    ``prev_attn_scores``; the stream's gradient flows on into ``prev_attn_scores``'.

    With ``causal``, the stream holds 0 after the diagonal (key after query), where the eager
    route holds ``prev + q k^T``: the blocks wholly after it are not computed. Any finite value
    there gives the same probabilities to a layer that reads the stream (the causal mask's fill
    absorbs it), eager or fused. Its gradient there is not passed on, but in rows that see only
    the fill (every key up to the query padded), which attend to every key as in the eager
    route: the kernels compute those rows' blocks after the diagonal and pass them the eager
    route's gradient.

    ``one_stream_per_chain`` (issue 51): a chain of these calls keeps one stream from forward to
    backward, its last; each layer's backward rewrites the stream it used, ``S_l``, as ``S_{l-1}
    = S_l - q k^T`` in place for the layer below, and writes the previous stream's gradient over
    the incoming one (see ``_backward_kernel``). Rebuilt in float32, ``S_{l-1}`` is off by up to
    one rounding per layer (docs/reference.md has it measured over 60 layers). A stream a caller
    still holds when backward runs (the chain's last, returned) is copied first, never changed.
    Where the hand-over cannot hold (a forward run during backward by activation checkpointing,
    a previous stream not made by this function, a stream read by two layers), the layer keeps
    its own stream, the reason said once at WARNING. A second backward through the same graph
    (``retain_graph=True``) raises: pass ``one_stream_per_chain=False`` for that.
    """
    _check(q, k, v, prev_attn_scores, key_padding_mask, attn_mask, num_heads, softmax_divisor,
           dropout_p, causal)  # fmt: skip
    link_in = _link_in(prev_attn_scores, (q, k, v), one_stream_per_chain)
    link_out = StreamLink(route="triton", kept="stream")
    attn, stream = _ResidualAttention.apply(
        q, k, v, prev_attn_scores, key_padding_mask, attn_mask, num_heads,
        float(softmax_divisor), float(dropout_p), float(mask_value), bool(causal), link_in,
        link_out,
    )  # fmt: skip
    if link_in is not None:
        link_in.hand_over(link_out, prev_attn_scores)
    return attn, stream


def _link_in(prev: Optional[Tensor], inputs, one_stream_per_chain: bool) -> Optional[StreamLink]:
    """The link of the layer whose stream ``prev`` is, where this layer takes it over (rebuilds
    it in backward): None without a gradient, with ``one_stream_per_chain`` off, or where the
    hand-over cannot hold, the reason said once (the layer keeps its own stream)."""
    grads = torch.is_grad_enabled() and any(
        t.requires_grad for t in (*inputs, prev) if t is not None
    )
    if not (one_stream_per_chain and grads and prev is not None and prev.requires_grad):
        return None
    if forward_runs_in_backward():
        reason = FORWARD_IN_BACKWARD
    else:
        link = stream_link_of(prev, _ResidualAttention)
        if link is not None:
            return link
        reason = ("the previous stream was not made by the kernel (a layer on the eager route "
                  "in the chain, or a stream from the caller)")  # fmt: skip
    warn_once(reason, route="triton", kept="stream")
    return None


def _check(
    q, k, v, prev, key_padding_mask, attn_mask, num_heads, divisor, dropout_p, causal
) -> None:
    """One-line errors for inputs the kernels cannot take."""
    if q.dtype not in _TL_DTYPES:
        raise ValueError(
            f"triton residual attention takes float16/bfloat16/float32/float64, got {q.dtype}"
        )
    if q.dtype == torch.float64 and q.device.type == "cuda":  # the table has no float64 row
        raise ValueError("the triton kernels take float64 in the interpreter only, not on CUDA")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError(
            f"q (bsz*heads, tgt_len, head_dim) and k, v (bsz*heads, src_len, head_dim) expected, "
            f"got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}"
        )
    bh, tgt_len, head_dim = q.shape
    src_len = k.size(1)
    if k.size(0) != bh or k.size(2) != head_dim:
        raise ValueError(f"k {list(k.shape)} does not match q {list(q.shape)}")
    if tgt_len == 0 or src_len == 0 or bh == 0:
        raise ValueError(f"empty inputs: q {list(q.shape)}, k {list(k.shape)}")
    if padded_head_dim(head_dim) > MAX_HEAD_DIM:
        raise ValueError(f"the triton kernels take head sizes up to {MAX_HEAD_DIM}, got {head_dim}")
    if triton.cdiv(max(tgt_len, src_len), 16) * bh > 2**31 - 1:
        raise ValueError(f"{bh} heads of {max(tgt_len, src_len)} tokens exceed CUDA's grid")
    if num_heads <= 0 or bh % num_heads:
        raise ValueError(f"bsz*heads {bh} is not a multiple of num_heads {num_heads}")
    if prev is not None:
        if prev.shape != (bh, tgt_len, src_len):
            raise ValueError(
                "residual attention chain mismatch: previous layer scores "
                f"{list(prev.shape)} vs this layer's {[bh, tgt_len, src_len]} "
                "(bsz*heads, tgt_len, src_len)"
            )
        if prev.dtype != stream_dtype(q.dtype):
            raise ValueError(
                f"prev_attn_scores must be {stream_dtype(q.dtype)} for {q.dtype} inputs, "
                f"got {prev.dtype}"
            )
    if key_padding_mask is not None and key_padding_mask.shape != (bh // num_heads, src_len):
        raise ValueError(
            f"key_padding_mask must be (bsz, src_len) = {[bh // num_heads, src_len]}, "
            f"got {list(key_padding_mask.shape)}"
        )
    if causal and (attn_mask is not None or tgt_len != src_len):
        raise ValueError(
            f"causal takes self-attention (tgt_len == src_len) without attn_mask, got "
            f"{tgt_len} queries, {src_len} keys and {'an' if attn_mask is not None else 'no'} "
            f"attn_mask"
        )
    if attn_mask is not None:
        if attn_mask.shape != (tgt_len, src_len):
            raise ValueError(
                f"attn_mask must be (tgt_len, src_len) = {[tgt_len, src_len]}, "
                f"got {list(attn_mask.shape)}"
            )
        if attn_mask.requires_grad:
            raise ValueError("triton residual attention passes no gradient to attn_mask")
    for t in (k, v, prev, key_padding_mask, attn_mask):
        if t is not None and t.device != q.device:
            raise ValueError(f"all inputs must be on {q.device}, got one on {t.device}")
    if q.device.type != "cuda" and not INTERPRETED:
        raise ValueError(
            f"the triton kernels run on CUDA tensors, got {q.device} "
            "(CPU tensors only under TRITON_INTERPRET=1, set before triton is imported)"
        )
    if not divisor >= 1.0:
        raise ValueError(f"softmax_divisor must be >= 1, got {divisor}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
