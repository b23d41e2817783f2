"""The triton route's autograd Function and its host launchers: one layer of residual attention
(RealFormer, arXiv 2012.11747) in the kernels of :mod:`.triton_kernels`, launched with the
configurations of :mod:`.triton_launch`. Imports triton.
"""

import contextlib
import functools
from typing import Dict, NamedTuple, Optional, Tuple

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


def _grid(length: int, block: int, bsz_heads: int) -> Tuple[int]:
    """The launch grid of one program per (bsz*heads, block of ``length``), folded into the
    first axis (up to 2**31 - 1 programs; the second and third axes stop at 65,535)."""
    return (triton.cdiv(length, block) * bsz_heads,)


def in_rows_layout(x: Tensor) -> Tensor:
    """``x`` ``(bsz*heads, length, head_dim)`` in the kernels' layout, ``(length, bsz*heads,
    head_dim)`` in memory: itself where fairseq's projection made it, else a copy."""
    if x.transpose(0, 1).is_contiguous():
        return x
    return x.transpose(0, 1).contiguous().transpose(0, 1)


def empty_rows(bsz_heads: int, length: int, like: Tensor) -> Tensor:
    """A new ``(bsz*heads, length, head_dim)`` tensor of ``like``'s dtype in the kernels'
    layout: what fairseq's merge of the heads (``attn.transpose(0, 1).contiguous()``) reads
    without a copy."""
    return like.new_empty((length, bsz_heads, like.size(-1))).transpose(0, 1)


class Call(NamedTuple):
    """What one layer's kernels take besides its tensors: the masks as the kernels read them
    (the additive one contiguous in the stream's dtype, key padding contiguous int8), and the
    scalars, in the kernels' order from ``num_heads`` on."""

    attn_mask: Optional[Tensor]  # (tgt_len, src_len)
    key_padding_mask: Optional[Tensor]  # (bsz, src_len), nonzero at padded keys
    num_heads: int
    divisor: float  # 1 for the running sum, layer_idx + 1 for the running mean
    mask_value: float
    dropout_p: float
    causal: bool


def kernel_call(
    key_padding_mask, attn_mask, num_heads, divisor, dropout_p, mask_value, causal, sdtype
) -> Call:
    mask = attn_mask.to(sdtype).contiguous() if attn_mask is not None else None
    kpm = key_padding_mask.to(torch.int8).contiguous() if key_padding_mask is not None else None
    return Call(mask, kpm, num_heads, float(divisor), float(mask_value), float(dropout_p),
                bool(causal))  # fmt: skip


def masks_of(call: Call) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """The call's masks, which its node saves for backward (``save_for_backward``)."""
    return call.attn_mask, call.key_padding_mask


def without_masks(call: Call) -> Call:
    """The call as its node keeps it: the masks are saved tensors."""
    return call._replace(attn_mask=None, key_padding_mask=None)


class Launch(NamedTuple):
    """One layer's runtime scalars and compile-time flags, built once for its forward and its
    backward: ``scalars`` in the kernels' order (``bsz_heads`` .. ``seed``)."""

    scalars: Tuple
    flags: Dict[str, object]


def launch_of(q: Tensor, src_len: int, call: Call, seed: int) -> Launch:
    bh, tgt_len, head_dim = q.shape
    scalars = (
        bh, tgt_len, src_len, call.num_heads, call.divisor, call.mask_value, call.dropout_p,
        dropout_threshold(call.dropout_p), seed,
    )  # fmt: skip
    flags = dict(
        HEAD_DIM=head_dim,
        BLOCK_D=padded_head_dim(head_dim),
        DIVIDE=call.divisor != 1.0,
        DROPOUT=call.dropout_p > 0,
        CAUSAL=call.causal,
        # float32 accumulation (float64 for float64); bfloat16 dots on float32 copies in the
        # interpreter, whose numpy has no bfloat16
        ACC=tl.float64 if q.dtype == torch.float64 else tl.float32,
        UPCAST=q.dtype == torch.bfloat16 and q.device.type == "cpu",
    )
    return Launch(scalars, flags)


def launch_delta(out: Tensor, d_out: Tensor, launch: Launch) -> Tensor:
    """``delta = rowsum(d_out * out)`` ``(bsz*heads, tgt_len)``, in the stream's dtype."""
    bh, tgt_len, head_dim = out.shape
    delta = out.new_empty((bh, tgt_len), dtype=stream_dtype(out.dtype))
    cfg = launch_config("delta", head_dim, out.dtype, _capability(out.device), tgt_len)
    flags = launch.flags
    _delta_kernel[_grid(tgt_len, cfg.block_m, bh)](
        out, d_out, delta, bh, tgt_len, HEAD_DIM=flags["HEAD_DIM"], BLOCK_D=flags["BLOCK_D"],
        BLOCK_M=cfg.block_m, ACC=flags["ACC"], num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip
    return delta


def _forward(q, k, v, prev, call: Call, launch: Launch):
    """The forward kernel: ``(out, stream, rowmax, rowsum)``."""
    bh, tgt_len, head_dim = q.shape
    src_len = k.size(1)
    sdtype = stream_dtype(q.dtype)
    stream = q.new_empty((bh, tgt_len, src_len), dtype=sdtype)
    out = empty_rows(bh, tgt_len, q)
    rowmax = q.new_empty((bh, tgt_len), dtype=sdtype)
    rowsum = q.new_empty((bh, tgt_len), dtype=sdtype)
    cfg = launch_config("forward", head_dim, q.dtype, _capability(q.device), tgt_len)
    _forward_kernel[_grid(tgt_len, cfg.block_m, bh)](
        q, k, v, prev, stream, out, rowmax, rowsum, call.attn_mask, call.key_padding_mask,
        *launch.scalars, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **launch.flags,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out, stream, rowmax, rowsum


def _backward(saved, stream, d_out, d_stream, d_scores, call: Call, launch: Launch, rebuild):
    """The backward kernels: ``delta``, the key-block pass (``dk``, ``dv``, the stream gradient
    ``d_scores``; ``stream`` rebuilt as the previous one where ``rebuild``), the dq pass."""
    q, k, v, out, rowmax, rowsum = saved
    bh, tgt_len, head_dim = q.shape
    src_len = k.size(1)
    capability = _capability(q.device)
    dq, dk, dv = empty_rows(bh, tgt_len, q), empty_rows(bh, src_len, k), empty_rows(bh, src_len, v)
    delta = launch_delta(out, d_out, launch)
    cfg = launch_config("backward", head_dim, q.dtype, capability, src_len)
    _backward_kernel[_grid(src_len, cfg.block_n, bh)](
        q, k, v, stream, d_out, rowmax, rowsum, delta, d_stream, d_scores, dk, dv,
        call.attn_mask, call.key_padding_mask, *launch.scalars, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, **launch.flags, REBUILD=rebuild, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip
    cfg = launch_config("dq", head_dim, q.dtype, capability, tgt_len)
    flags = launch.flags
    _dq_kernel[_grid(tgt_len, cfg.block_m, bh)](
        d_scores, k, dq, rowmax, bh, tgt_len, src_len, call.mask_value,
        HEAD_DIM=flags["HEAD_DIM"], BLOCK_D=flags["BLOCK_D"], BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, CAUSAL=flags["CAUSAL"], ACC=flags["ACC"], UPCAST=flags["UPCAST"],
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return dq, dk, dv


class _ResidualAttention(torch.autograd.Function):
    """``q`` ``(bsz*heads, tgt_len, head_dim)``, ``k`` and ``v`` ``(bsz*heads, src_len,
    head_dim)`` in the kernels' layout, ``prev`` ``(bsz*heads, tgt_len, src_len)`` contiguous
    or None, ``call`` a :class:`Call`, ``links`` (in, out) -> ``(attn, stream)``."""

    @staticmethod
    def forward(ctx, q, k, v, prev, call, links):
        seed = draw_dropout_seed() if call.dropout_p > 0 else 0
        launch = launch_of(q, k.size(1), call, seed)
        with _device_of(q):
            out, stream, rowmax, rowsum = _forward(q, k, v, prev, call, launch)
        ctx.save_for_backward(q, k, v, out, rowmax, rowsum, *masks_of(call))
        ctx.call, ctx.launch, ctx.has_prev = without_masks(call), launch, prev is not None
        # the stream, held by the link: handed to the next layer that reads it, which
        # rebuilds it in its backward (shared.StreamLink)
        ctx.link_in, ctx.link_out = links
        ctx.link_out.keep(stream)
        ctx.link_out.remember_scores(functools.partial(recomputed_scores, causal=call.causal), q, k)
        ctx.set_materialize_grads(False)
        return out, stream

    @staticmethod
    def backward(ctx, d_out, d_stream):
        *saved, attn_mask, key_padding_mask = ctx.saved_tensors
        call = ctx.call._replace(attn_mask=attn_mask, key_padding_mask=key_padding_mask)
        link_in = ctx.link_in
        rebuild = link_in is not None and link_in.rebuilder is ctx.link_out
        stream = ctx.link_out.take(release=rebuild)  # S_l: kept, or rebuilt by the layer above
        if rebuild:  # S_{l-1} written over S_l: never over a stream a caller holds
            stream = writable_stream(stream)
        if d_out is None:  # only the stream's gradient arrives
            d_out = torch.zeros_like(saved[3])
        if d_stream is not None:
            d_stream = d_stream.contiguous()
        # the stream gradient: the previous stream's gradient where it has one, else a
        # scratch that only the dq pass reads; written over the incoming gradient where that is
        # this chain's own buffer
        d_scores = d_stream if _gradient_writable(ctx, d_stream, stream.dtype) else None
        if d_scores is None:
            d_scores = torch.empty_like(stream)
        with _device_of(stream):
            dq, dk, dv = _backward(saved, stream, in_rows_layout(d_out), d_stream, d_scores,
                                   call, ctx.launch, rebuild)  # fmt: skip
        if rebuild:
            link_in.keep(stream)  # now S_{l-1}, for the previous layer's backward
        ctx.link_out.scores = None  # this layer's q and k: needed no longer
        d_prev = d_scores if ctx.has_prev and ctx.needs_input_grad[3] else None
        return dq, dk, dv, d_prev, None, None


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
    call = kernel_call(key_padding_mask, attn_mask, num_heads, softmax_divisor, dropout_p,
                       mask_value, causal, stream_dtype(q.dtype))  # fmt: skip
    prev = prev_attn_scores.contiguous() if prev_attn_scores is not None else None
    attn, stream = _ResidualAttention.apply(
        in_rows_layout(q), in_rows_layout(k), in_rows_layout(v), prev, call, (link_in, link_out)
    )
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
