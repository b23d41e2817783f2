"""Residual attention (RealFormer) in fused Triton kernels: the ``triton`` route's arithmetic.

One forward kernel per (batch x head, block of queries) walks the key blocks: it reads the
previous layer's score stream, adds ``q k^T`` (``q`` arrives scaled by ``head_dim ** -0.5``),
writes the new stream (float32; float64 for float64 inputs), takes an online softmax over a
masked copy (the running mean's division, the additive mask clamped at the project's finite
fill, key padding replaced by the fill), drops probabilities with a counter-based RNG
(Philox, ``tl.rand``) and accumulates ``P V``. Autograd keeps ``q``, ``k``, ``v``, the output,
each row's softmax maximum and sum, the written stream and the dropout seed; nothing else of
size ``T x T``.

The backward kernel runs per (batch x head, block of keys) over the query blocks: it reads the
stream once, recomputes the probabilities from the log-sum-exp, regenerates the dropout mask,
and produces ``dk``, ``dv``, the stream gradient handed to the previous layer (the softmax's
gradient, divided for the running mean and zero at padded keys, plus the gradient of this
layer's own stream arriving from the next layer) and ``dq`` (added atomically, per key block).

The semantics are the eager route's (:class:`~.residual_attention.RealformerMultiheadAttention`,
``_add_to_stream`` and ``_attend_stream``), up to the order of floating-point sums; for
float16/bfloat16 inputs the kernels add ``q k^T`` to the stream as accumulated in float32, where
the eager route rounds the product to the inputs' dtype first. With
``TRITON_INTERPRET=1`` (set before triton is imported) the kernels run on CPU tensors, which is
how the tests check them against the eager formula.

This module imports triton; the plugin imports it only when the triton route is asked for.
"""

import contextlib
from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

from .residual_attention import _MASK_VALUE


class KernelConfig(NamedTuple):
    """Block sizes (powers of two, at least 16) and launch options of one kernel."""

    block_m: int  # queries per block
    block_n: int  # keys per block
    num_warps: int
    num_stages: int


# the largest head size (after padding to a power of two) the configurations are made for
MAX_HEAD_DIM = 128

# the capability the interpreter (CPU tensors) is given configurations for: small blocks, so
# that the tests' short sequences span several blocks and their edges
INTERPRETER = None


def padded_head_dim(head_dim: int) -> int:
    """The head size the kernels work on: the next power of two, at least 16."""
    return max(16, triton.next_power_of_2(head_dim))


def launch_config(
    kernel: str, head_dim: int, dtype: torch.dtype, capability: Optional[Tuple[int, int]]
) -> KernelConfig:
    """The configuration the route launches ``kernel`` ("forward" or "backward") with, for
    inputs of ``dtype`` and ``head_dim`` on a CUDA device of ``capability`` ((8, 0): A100,
    (9, 0): H100/H200), or ``capability=None`` for the interpreter. The compile test checks
    each GPU configuration's shared memory against its target's limit."""
    if kernel not in ("forward", "backward"):
        raise ValueError(f"kernel must be 'forward' or 'backward', got {kernel!r}")
    if capability is None:
        return KernelConfig(16, 16, 4, 1)
    d = padded_head_dim(head_dim)
    if d > MAX_HEAD_DIM:
        raise ValueError(f"the triton kernels take head sizes up to {MAX_HEAD_DIM}, got {head_dim}")
    wide = dtype in (torch.float32, torch.float64)  # 4-byte (or 8-byte) tiles: half the blocks
    # A100 (8.0), H100/H200 (9.0) and later: 164-228 KB of shared memory per block; other
    # devices (8.6, 8.9: 99 KB) the small blocks
    small = capability != (8, 0) and capability[0] < 9
    if kernel == "forward":
        if wide or small:
            return KernelConfig(64, 32, 4, 2)
        if d <= 64:
            return KernelConfig(128, 64, 4, 3)
        return KernelConfig(128, 64, 8, 2)
    if wide or small:
        return KernelConfig(32, 32, 4, 1)
    if d <= 64:
        return KernelConfig(64, 64, 4, 2)
    return KernelConfig(64, 64, 8, 1)


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
def _keep(seed, bh, offs_m, offs_n, tgt_len, src_len, dropout_p):
    """The dropout mask of a tile: True where the probability is kept. One Philox draw per
    element of the (bsz*heads, tgt_len, src_len) probabilities, counted by its flat index."""
    row = bh.to(tl.int64) * tgt_len + offs_m.to(tl.int64)
    offsets = row[:, None] * src_len + offs_n[None, :].to(tl.int64)
    return tl.rand(seed, offsets) >= dropout_p


@triton.jit
def _logits(
    s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor, mask_value,
    MASK, sm_t, sm_s, KPM, skpm_b, skpm_s,
    HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr, DIVIDE: tl.constexpr,
):  # fmt: skip
    """The softmax input of a stream tile, as the eager route forms it, and the tile's padded
    keys (a (1, BLOCK_N) mask; all False without key padding). Columns past ``src_len`` are
    -inf: they take no part in any row, a fully masked row included."""
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
    if HAS_KPM:
        b = bh // num_heads
        pad = tl.load(KPM + b * skpm_b + offs_n * skpm_s, mask=valid_n, other=0) != 0
        pad2 = pad[None, :]
    else:
        pad2 = (offs_n < 0)[None, :]
    logits = tl.where(pad2, mask_value, logits)
    logits = tl.where(valid_n[None, :], logits, float("-inf"))
    return logits, pad2


# integers that change from batch to batch: triton would otherwise compile a variant of each
# kernel per value class (1, a multiple of 16, other) of each, at the first batch that has it
_RUNTIME_INTEGERS = [
    "tgt_len", "src_len", "num_heads", "seed", "sp_b", "sp_t", "sds_b", "sds_t", "sm_t", "skpm_b"
]  # fmt: skip


@triton.jit(do_not_specialize=[n for n in _RUNTIME_INTEGERS if n not in ("sds_b", "sds_t")])
def _forward_kernel(
    Q, K, V, PREV, STREAM, OUT, ROWMAX, ROWSUM, MASK, KPM,
    sq_b, sq_t, sq_d, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sp_b, sp_t, sp_s,
    sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_PREV: tl.constexpr, HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
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
    stream_base = STREAM + bh64 * tgt_len * src_len
    for start_n in range(0, src_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        valid_n = offs_n < src_len
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
        tl.store(stream_base + offs_m[:, None] * src_len + offs_n[None, :], s, mask=tile)
        logits, _ = _logits(
            s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor, mask_value,
            MASK, sm_t, sm_s, KPM, skpm_b, skpm_s, HAS_MASK, HAS_KPM, DIVIDE,
        )  # fmt: skip
        m_new = tl.maximum(m_i, tl.max(logits, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(logits - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            keep = _keep(seed, bh, offs_m, offs_n, tgt_len, src_len, dropout_p)
            p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
        v = tl.load(
            V + bh64 * sv_b + offs_n[:, None] * sv_s + offs_d[None, :] * sv_d,
            mask=valid_n[:, None] & valid_d[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, ACC, PRECISION, UPCAST)
        m_i = m_new
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


@triton.jit(do_not_specialize=[n for n in _RUNTIME_INTEGERS if n not in ("sp_b", "sp_t")])
def _backward_kernel(
    Q, K, V, STREAM, DOUT, ROWMAX, ROWSUM, DELTA, DSTREAM, DPREV, DQ, DK, DV, MASK, KPM,
    sq_b, sq_t, sq_d, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sds_b, sds_t, sds_s,
    sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_DSTREAM: tl.constexpr, HAS_DPREV: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_KPM: tl.constexpr, DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
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
    stream_base = bh64 * tgt_len * src_len
    for start_m in range(0, tgt_len, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        valid_m = offs_m < tgt_len
        tile = valid_m[:, None] & valid_n[None, :]
        qd_tile = valid_m[:, None] & valid_d[None, :]
        q = tl.load(
            Q + bh64 * sq_b + offs_m[:, None] * sq_t + offs_d[None, :] * sq_d,
            mask=qd_tile,
            other=0.0,
        )
        row_d = bh64 * tgt_len * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        do = tl.load(DOUT + row_d, mask=qd_tile, other=0.0)
        s = tl.load(
            STREAM + stream_base + offs_m[:, None] * src_len + offs_n[None, :], mask=tile, other=0.0
        )
        logits, pad2 = _logits(
            s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor, mask_value,
            MASK, sm_t, sm_s, KPM, skpm_b, skpm_s, HAS_MASK, HAS_KPM, DIVIDE,
        )  # fmt: skip
        m_i = tl.load(ROWMAX + bh64 * tgt_len + offs_m, mask=valid_m, other=0.0)
        l_i = tl.load(ROWSUM + bh64 * tgt_len + offs_m, mask=valid_m, other=1.0)
        delta = tl.load(DELTA + bh64 * tgt_len + offs_m, mask=valid_m, other=0.0)
        p = tl.exp(logits - m_i[:, None]) * (1.0 / l_i)[:, None]
        p = tl.where(tile, p, 0.0)
        # dP of the dropped probabilities, as the eager route's P.V in the values' dtype
        dp = _dot(do, tl.trans(v), ACC, PRECISION, UPCAST)
        if DROPOUT:
            keep = _keep(seed, bh, offs_m, offs_n, tgt_len, src_len, dropout_p)
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
            )
            ds = ds + ds_in.to(ACC)
        if HAS_DPREV:
            tl.store(
                DPREV + stream_base + offs_m[:, None] * src_len + offs_n[None, :], ds, mask=tile
            )
        ds_in_dtype = ds.to(q.dtype)
        dk += _dot(tl.trans(ds_in_dtype), q, ACC, PRECISION, UPCAST)
        dq = _dot(ds_in_dtype, k, ACC, PRECISION, UPCAST)
        tl.atomic_add(DQ + row_d, dq, mask=qd_tile)
    out_d = bh64 * src_len * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out_d, dk.to(DK.dtype.element_ty), mask=kv_tile)
    tl.store(DV + out_d, dv.to(DV.dtype.element_ty), mask=kv_tile)


@triton.jit
def _dropout_mask_kernel(
    KEEP, tgt_len, src_len, dropout_p, seed, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    bh = tl.program_id(2)
    keep = _keep(seed, bh, offs_m, offs_n, tgt_len, src_len, dropout_p)
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
    ``(bsz_heads, tgt_len, src_len)``. For tests: eager attention with this mask is what the
    kernels compute."""
    keep = torch.empty((bsz_heads, tgt_len, src_len), dtype=torch.int8, device=device)
    grid = (triton.cdiv(tgt_len, 16), triton.cdiv(src_len, 16), bsz_heads)
    _dropout_mask_kernel[grid](keep, tgt_len, src_len, float(dropout_p), seed, 16, 16)
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


class _ResidualAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q, k, v, prev, key_padding_mask, attn_mask, num_heads, divisor, dropout_p, mask_value
    ):
        bh, tgt_len, head_dim = q.shape
        src_len = k.size(1)
        sdtype = stream_dtype(q.dtype)
        stream = torch.empty((bh, tgt_len, src_len), dtype=sdtype, device=q.device)
        out = torch.empty((bh, tgt_len, head_dim), dtype=q.dtype, device=q.device)
        rowmax = torch.empty((bh, tgt_len), dtype=sdtype, device=q.device)
        rowsum = torch.empty((bh, tgt_len), dtype=sdtype, device=q.device)
        seed = draw_dropout_seed() if dropout_p > 0 else 0
        acc, precision = _options(q)
        cfg = launch_config("forward", head_dim, q.dtype, _capability(q.device))
        mask, kpm = _masks(attn_mask, key_padding_mask, sdtype)
        prev_arg = prev if prev is not None else stream  # never read without HAS_PREV
        grid = (triton.cdiv(tgt_len, cfg.block_m), bh)
        with _device_of(q):
            _forward_kernel[grid](
                q, k, v, prev_arg, stream, out, rowmax, rowsum, mask, kpm,
                *q.stride(), *k.stride(), *v.stride(), *prev_arg.stride(),
                *_strides2(mask), *_strides2(kpm),
                tgt_len, src_len, num_heads, float(divisor), float(mask_value), float(dropout_p),
                seed,
                HEAD_DIM=head_dim, BLOCK_D=padded_head_dim(head_dim), BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, HAS_PREV=prev is not None, HAS_MASK=attn_mask is not None,
                HAS_KPM=key_padding_mask is not None, DIVIDE=divisor != 1.0,
                DROPOUT=dropout_p > 0,
                ACC=acc, PRECISION=precision, UPCAST=_upcast(q),
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, rowmax, rowsum, stream, mask, kpm)
        ctx.has_mask = attn_mask is not None
        ctx.has_kpm = key_padding_mask is not None
        ctx.has_prev = prev is not None
        ctx.params = (num_heads, float(divisor), float(dropout_p), float(mask_value), seed)
        ctx.set_materialize_grads(False)
        return out, stream

    @staticmethod
    def backward(ctx, d_out, d_stream):
        q, k, v, out, rowmax, rowsum, stream, mask, kpm = ctx.saved_tensors
        num_heads, divisor, dropout_p, mask_value, seed = ctx.params
        bh, tgt_len, head_dim = q.shape
        src_len = k.size(1)
        sdtype = stream.dtype
        if d_out is None:
            d_out = torch.zeros_like(out)
        d_out = d_out.contiguous()
        delta = (d_out.to(sdtype) * out.to(sdtype)).sum(-1)
        need_dprev = ctx.has_prev and ctx.needs_input_grad[3]
        dprev = torch.empty_like(stream) if need_dprev else None
        dq = torch.zeros((bh, tgt_len, head_dim), dtype=sdtype, device=q.device)
        dk = torch.empty((bh, src_len, head_dim), dtype=k.dtype, device=q.device)
        dv = torch.empty((bh, src_len, head_dim), dtype=v.dtype, device=q.device)
        acc, precision = _options(q)
        cfg = launch_config("backward", head_dim, q.dtype, _capability(q.device))
        ds_arg = d_stream if d_stream is not None else stream  # never read without HAS_DSTREAM
        grid = (triton.cdiv(src_len, cfg.block_n), bh)
        with _device_of(q):
            _backward_kernel[grid](
                q, k, v, stream, d_out, rowmax, rowsum, delta, ds_arg,
                dprev if need_dprev else stream, dq, dk, dv, mask, kpm,
                *q.stride(), *k.stride(), *v.stride(), *ds_arg.stride(),
                *_strides2(mask), *_strides2(kpm),
                tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, seed,
                HEAD_DIM=head_dim, BLOCK_D=padded_head_dim(head_dim), BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, HAS_DSTREAM=d_stream is not None, HAS_DPREV=need_dprev,
                HAS_MASK=ctx.has_mask, HAS_KPM=ctx.has_kpm, DIVIDE=divisor != 1.0,
                DROPOUT=dropout_p > 0, ACC=acc, PRECISION=precision, UPCAST=_upcast(q),
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )  # fmt: skip
        return dq.to(q.dtype), dk, dv, dprev, None, None, None, None, None, None


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
) -> Tuple[Tensor, Tensor]:
    """One layer of residual attention in the fused kernels.

    ``q`` ``(bsz*heads, tgt_len, head_dim)``, already scaled by ``head_dim ** -0.5``; ``k``,
    ``v`` ``(bsz*heads, src_len, head_dim)``, all of one dtype (float16, bfloat16, float32 or
    float64) on one device; ``prev_attn_scores`` the previous layer's stream ``(bsz*heads,
    tgt_len, src_len)`` or None; ``key_padding_mask`` ``(bsz, src_len)`` bool, True at padded
    keys; ``attn_mask`` ``(tgt_len, src_len)`` additive (may hold -inf) or None;
    ``softmax_divisor`` 1 for the running sum, ``layer_idx + 1`` for the running mean;
    ``dropout_p`` the attention dropout (0 in eval). Returns ``attn`` ``(bsz*heads, tgt_len,
    head_dim)`` in ``q``'s dtype and the new stream ``attn_scores`` ``(bsz*heads, tgt_len,
    src_len)``, float32 (float64 for float64 inputs). Differentiable in ``q``, ``k``, ``v`` and
    ``prev_attn_scores``; the stream's gradient flows on into ``prev_attn_scores``'.
    """
    _check(q, k, v, prev_attn_scores, key_padding_mask, attn_mask, num_heads, softmax_divisor,
           dropout_p)  # fmt: skip
    return _ResidualAttention.apply(
        q, k, v, prev_attn_scores, key_padding_mask, attn_mask, num_heads,
        float(softmax_divisor), float(dropout_p), float(mask_value),
    )  # fmt: skip


def _check(q, k, v, prev, key_padding_mask, attn_mask, num_heads, divisor, dropout_p) -> None:
    """One-line errors for inputs the kernels cannot take."""
    if q.dtype not in _TL_DTYPES:
        raise ValueError(
            f"triton residual attention takes float16/bfloat16/float32/float64, got {q.dtype}"
        )
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
