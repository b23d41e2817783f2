"""The triton route's autograd Function and its host launchers: one layer of residual attention
(RealFormer, arXiv 2012.11747) in the kernels of :mod:`.triton_kernels`, launched with the
configurations of :mod:`.triton_launch`. Imports triton.
"""

import contextlib
import functools
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .shared import (
    FORWARD_IN_BACKWARD,
    MASK_VALUE,
    StreamLink,
    chain_mismatch,
    forward_runs_in_backward,
    storage_unshared,
    stream_dtype,
    stream_link_of,
    warn_kept_own,
    writable_stream,
)
from .triton_kernels import (
    RUNS_IN_INTERPRETER,
    _backward_kernel,
    _delta_kernel,
    _dq_kernel,
    _dropout_mask_kernel,
    _forward_kernel,
)
from .triton_launch import INTERPRETER_CAPABILITY, MAX_HEAD_DIM, launch_config, padded_head_dim

# the input dtypes the kernels take
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# the route runs a chain's first layers on the concat phase's kernels (triton_concat_function)
CONCAT_PHASE = True


def dropout_threshold(dropout_p: float) -> int:
    """The kernels' integer threshold of ``dropout_p``: a probability is kept where the top 31
    bits of its Philox output are at least this (keep rate ``1 - threshold / 2**31``)."""
    return min(int(round(dropout_p * 2**31)), 2**31 - 1)


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
    return INTERPRETER_CAPABILITY


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
        # rebuilds it in its backward (shared.StreamLink)
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
    run (see ``shared.StreamLink.take``)."""
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
    mask_value: float = MASK_VALUE,
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

    ``one_stream_per_chain``: a chain of these calls keeps one stream from forward to
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
    warn_kept_own(reason, route="triton", kept="stream")
    return None


def _check(
    q, k, v, prev, key_padding_mask, attn_mask, num_heads, divisor, dropout_p, causal
) -> None:
    """One-line errors for inputs the kernels cannot take."""
    if q.dtype not in DTYPES:
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
            raise ValueError(chain_mismatch(list(prev.shape), [bh, tgt_len, src_len]))
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
    if q.device.type != "cuda" and not RUNS_IN_INTERPRETER:
        raise ValueError(
            f"the triton kernels run on CUDA tensors, got {q.device} "
            "(CPU tensors only under TRITON_INTERPRET=1, set before triton is imported)"
        )
    if not divisor >= 1.0:
        raise ValueError(f"softmax_divisor must be >= 1, got {divisor}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
