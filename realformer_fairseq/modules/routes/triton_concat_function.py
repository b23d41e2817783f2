"""The triton route's concat phase: one layer of residual attention (RealFormer, arXiv
2012.11747) whose scores ``S_l = sum_{i<=l} Q_i K_i^T`` are recomputed by the kernels of
:mod:`.triton_concat_kernels` from a chain's buffers of scaled queries and keys, so that no
T x T tensor is kept. Imports triton.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .shared import MASK_VALUE, _current_graph_task_id, stream_dtype
from .triton_concat_kernels import (
    _concat_backward_kernel,
    _concat_dq_kernel,
    _concat_forward_kernel,
)
from .triton_concat_launch import concat_launch_config
from .triton_function import (
    Call,
    Launch,
    _capability,
    _check,
    _device_of,
    _grid,
    draw_dropout_seed,
    empty_rows,
    in_rows_layout,
    kernel_call,
    launch_delta,
    launch_of,
    masks_of,
    without_masks,
)


class ConcatBuffers:
    """One chain's scaled queries and keys ``(bsz*heads, length, depth*head_dim)`` in the
    inputs' dtype, made by its first layer's forward; layer ``l`` writes slice ``l``
    (columns ``l*head_dim .. (l+1)*head_dim``) in place and reads slices ``0..l``, never
    changed after. In backward, the float32 (float64 for float64) gradient buffers of the same
    shapes: each layer's backward adds its gradients of slices ``0..l`` and hands its own slice
    to its q and k as a new tensor; they are freed after layer 0's backward (a second backward
    through the graph makes them anew)."""

    __slots__ = ("depth", "head_dim", "queries", "keys", "written", "grad_queries",
                 "grad_keys", "grad_task")  # fmt: skip

    def __init__(self, q: Tensor, k: Tensor, depth: int):
        bh, tgt_len, head_dim = q.shape
        self.depth, self.head_dim = depth, head_dim
        self.queries = q.new_empty((bh, tgt_len, depth * head_dim))
        self.keys = k.new_empty((bh, k.size(1), depth * head_dim))
        self.written = 0
        self.grad_queries: Optional[Tensor] = None
        self.grad_keys: Optional[Tensor] = None
        self.grad_task = -1  # the backward pass the gradient buffers belong to

    def columns(self, layer_idx: int) -> slice:
        return slice(layer_idx * self.head_dim, (layer_idx + 1) * self.head_dim)

    def write(self, layer_idx: int, q: Tensor, k: Tensor):
        """Slice ``layer_idx`` of the buffers, from this layer's scaled ``q`` and ``k``."""
        if layer_idx != self.written:
            raise ValueError(
                f"concat phase: layer {layer_idx} of a chain ran after {self.written} layers "
                f"(its layers run in order, each once per forward)"
            )
        if q.shape[:2] != self.queries.shape[:2] or k.shape[:2] != self.keys.shape[:2]:
            raise ValueError(
                f"concat phase: layer {layer_idx}'s q {list(q.shape)} and k {list(k.shape)} do "
                f"not match the chain's buffers {list(self.queries.shape)}, "
                f"{list(self.keys.shape)}"
            )
        with torch.no_grad():
            self.queries[:, :, self.columns(layer_idx)].copy_(q)
            self.keys[:, :, self.columns(layer_idx)].copy_(k)
        self.written += 1

    def gradients(self) -> Tuple[Tensor, Tensor]:
        """The gradient buffers of the running backward pass: zeros at its first node of this
        chain (every node of one pass shares its graph task)."""
        task = _current_graph_task_id()
        if self.grad_queries is None or task != self.grad_task:
            sdtype = stream_dtype(self.queries.dtype)
            self.grad_queries = torch.zeros_like(self.queries, dtype=sdtype)
            self.grad_keys = torch.zeros_like(self.keys, dtype=sdtype)
            self.grad_task = task
        return self.grad_queries, self.grad_keys

    def hand_down(self, layer_idx: int, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """Layer ``layer_idx``'s own gradients of q and k, new tensors of ``dtype`` (nothing
        later adds to them); the buffers freed after layer 0."""
        cols = self.columns(layer_idx)
        dq = self.grad_queries[:, :, cols].to(
            dtype, copy=True, memory_format=torch.contiguous_format
        )
        dk = self.grad_keys[:, :, cols].to(dtype, copy=True, memory_format=torch.contiguous_format)
        if layer_idx == 0:
            self.grad_queries = self.grad_keys = None
        return dq, dk


def _concat_forward(v, buffers, layer_idx, call: Call, launch: Launch):
    """The concat forward kernel: ``(out, rowmax, rowsum)``."""
    bh, src_len, head_dim = v.shape
    tgt_len = buffers.queries.size(1)
    sdtype = stream_dtype(v.dtype)
    out = empty_rows(bh, tgt_len, v)
    rowmax = v.new_empty((bh, tgt_len), dtype=sdtype)
    rowsum = v.new_empty((bh, tgt_len), dtype=sdtype)
    cfg = concat_launch_config("concat_forward", head_dim, v.dtype, _capability(v.device))
    _concat_forward_kernel[_grid(tgt_len, cfg.block_m, bh)](
        buffers.queries, buffers.keys, v, out, rowmax, rowsum, call.attn_mask,
        call.key_padding_mask, layer_idx + 1, buffers.depth, *launch.scalars,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **launch.flags, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip
    return out, rowmax, rowsum


def _concat_backward(saved, d_out, buffers, layer_idx, call: Call, launch: Launch):
    """The concat backward kernels: ``delta``, the key-block pass (``dv``; the keys' gradients
    of slices ``0..layer_idx`` added to the chain's buffer), the query-block pass (the
    queries'): returns ``dv``."""
    v, out, rowmax, rowsum = saved
    bh, src_len, head_dim = v.shape
    tgt_len = out.size(1)
    grad_q, grad_k = buffers.gradients()
    dv = empty_rows(bh, src_len, v)
    delta = launch_delta(out, d_out, launch)
    capability = _capability(v.device)
    tensors = (buffers.queries, buffers.keys, v, d_out, rowmax, rowsum, delta)
    masks_and_slices = (call.attn_mask, call.key_padding_mask, layer_idx + 1, buffers.depth)
    cfg = concat_launch_config("concat_backward", head_dim, v.dtype, capability)
    _concat_backward_kernel[_grid(src_len, cfg.block_n, bh)](
        *tensors, grad_k, dv, *masks_and_slices, *launch.scalars, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, **launch.flags, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    cfg = concat_launch_config("concat_dq", head_dim, v.dtype, capability)
    _concat_dq_kernel[_grid(tgt_len, cfg.block_m, bh)](
        *tensors, grad_q, *masks_and_slices, *launch.scalars, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, **launch.flags, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return dv


class _ConcatAttention(torch.autograd.Function):
    """``q`` ``(bsz*heads, tgt_len, head_dim)``, ``k`` ``(bsz*heads, src_len, head_dim)``
    (copied into the chain's ``buffers``), ``v`` in the kernels' layout, the previous layer's
    ``link`` (an empty tensor), ``call`` a :class:`Call`, ``layer_idx`` -> ``(attn, link)``."""

    @staticmethod
    def forward(ctx, q, k, v, link, call, buffers, layer_idx):
        buffers.write(layer_idx, q, k)
        seed = draw_dropout_seed() if call.dropout_p > 0 else 0
        launch = launch_of(q, k.size(1), call, seed)
        with _device_of(q):
            out, rowmax, rowsum = _concat_forward(v, buffers, layer_idx, call, launch)
        # nothing T x T: the values, the output and the row statistics; q and k are in the
        # chain's buffers, which ctx holds
        ctx.save_for_backward(v, out, rowmax, rowsum, *masks_of(call))
        ctx.call, ctx.launch = without_masks(call), launch
        ctx.buffers, ctx.layer_idx = buffers, layer_idx
        ctx.q_dtype = q.dtype
        ctx.set_materialize_grads(False)
        # the link to the next layer: an empty tensor whose node runs this backward after the
        # next layer's, which adds its gradients of this layer's slices first
        return out, q.new_empty(0)

    @staticmethod
    def backward(ctx, d_out, d_link):
        *saved, attn_mask, key_padding_mask = ctx.saved_tensors
        call = ctx.call._replace(attn_mask=attn_mask, key_padding_mask=key_padding_mask)
        buffers, layer_idx = ctx.buffers, ctx.layer_idx
        if d_out is None:
            buffers.gradients()  # the earlier layers' gradients may still arrive
            dv = torch.zeros_like(saved[0])
        else:
            with _device_of(d_out):
                dv = _concat_backward(saved, in_rows_layout(d_out), buffers, layer_idx, call,
                                      ctx.launch)  # fmt: skip
        dq, dk = buffers.hand_down(layer_idx, ctx.q_dtype)
        return dq, dk, dv, None, None, None, None


class _StreamOfBuffers(torch.autograd.Function):
    @staticmethod
    def forward(ctx, link, buffers, slices):
        sdtype = stream_dtype(buffers.queries.dtype)
        stream = None
        for layer_idx in range(slices):
            cols = buffers.columns(layer_idx)
            q, k = buffers.queries[:, :, cols], buffers.keys[:, :, cols]
            # as the eager route's add_to_stream: the product in the inputs' dtype, at least
            # float32, this layer's product plus the stream so far
            raw = torch.bmm(q, k.transpose(1, 2)).to(sdtype)
            stream = raw if stream is None else raw.add_(stream)
        ctx.buffers, ctx.slices = buffers, slices
        ctx.set_materialize_grads(False)
        return stream

    @staticmethod
    def backward(ctx, d_stream):
        buffers, slices = ctx.buffers, ctx.slices
        grad_q, grad_k = buffers.gradients()
        if d_stream is not None:
            d_raw = d_stream.to(buffers.queries.dtype)
            for layer_idx in range(slices):
                cols = buffers.columns(layer_idx)
                q, k = buffers.queries[:, :, cols], buffers.keys[:, :, cols]
                grad_q[:, :, cols] += torch.bmm(d_raw, k).to(grad_q.dtype)
                grad_k[:, :, cols] += torch.bmm(d_raw.transpose(1, 2), q).to(grad_k.dtype)
        return None, None, None


def stream_of_concat_phase(link: Tensor) -> Tensor:
    """The stream ``S_l = sum_{i<=l} q_i k_i^T`` ``(bsz*heads, tgt_len, src_len)`` of the
    chain whose layer ``l`` made ``link``, formed once from its buffers in the eager route's
    order and dtype (float32, float64 for float64 inputs; the full sum after the diagonal too):
    the previous stream of a layer that runs the stream kernels after the concat phase. Its
    gradient is added to the gradients the concat layers hand down to their q and k."""
    buffers = concat_buffers_of(link)
    return _StreamOfBuffers.apply(link, buffers, buffers.written)


def concat_buffers_of(link: Tensor) -> ConcatBuffers:
    """The chain buffers a concat-phase layer's ``link`` output belongs to."""
    buffers = getattr(link, "concat_buffers", None)
    if buffers is None:
        raise ValueError("concat phase: the previous layer's link was not made by the concat phase")
    return buffers


def concat_residual_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prev_link: Optional[Tensor],
    key_padding_mask: Optional[Tensor],
    attn_mask: Optional[Tensor],
    num_heads: int,
    layer_idx: int,
    depth: int,
    softmax_divisor: float,
    dropout_p: float,
    mask_value: float = MASK_VALUE,
    causal: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Layer ``layer_idx`` (of the ``depth`` layers of a chain's concat phase) of residual
    attention in the concat kernels: ``softmax(S_l [/ (l + 1)] + masks)`` (dropped) times ``v``
    with ``S_l = sum_{i<=l} q_i k_i^T`` over the chain's layers so far, as the eager route's
    stream holds it. ``q`` ``(bsz*heads, tgt_len, head_dim)`` scaled, ``k``, ``v`` ``(bsz*heads,
    src_len, head_dim)``, the masks and ``causal`` as :func:`.triton_function.
    residual_attention`; ``prev_link`` the previous layer's link (None at layer 0, which makes
    the chain's buffers). Returns ``attn`` ``(bsz*heads, tgt_len, head_dim)`` in ``q``'s dtype
    and this layer's link (an empty tensor: the next layer's ``prev_link``). Differentiable in
    ``q``, ``k``, ``v``; each layer's backward adds its gradients of the earlier layers' q and
    k to the chain's gradient buffers, which those layers' backwards hand on."""
    _check(q, k, v, None, key_padding_mask, attn_mask, num_heads, softmax_divisor, dropout_p,
           causal)  # fmt: skip
    if not 0 <= layer_idx < depth:
        raise ValueError(f"concat phase: layer {layer_idx} outside the chain's {depth} layers")
    if (layer_idx == 0) != (prev_link is None):
        raise ValueError(f"concat phase: layer {layer_idx} needs the previous layer's link "
                         "exactly where it is not the chain's first")  # fmt: skip
    buffers = ConcatBuffers(q, k, depth) if prev_link is None else concat_buffers_of(prev_link)
    if q.size(2) != buffers.head_dim or q.dtype != buffers.queries.dtype:
        raise ValueError(
            f"concat phase: layer {layer_idx}'s heads {list(q.shape)} {q.dtype} do not match "
            f"the chain's ({buffers.head_dim}, {buffers.queries.dtype})"
        )
    link = prev_link if prev_link is not None else q.new_empty(0)
    call = kernel_call(key_padding_mask, attn_mask, num_heads, softmax_divisor, dropout_p,
                       mask_value, causal, stream_dtype(q.dtype))  # fmt: skip
    attn, out_link = _ConcatAttention.apply(q, k, in_rows_layout(v), link, call, buffers, layer_idx)
    out_link.concat_buffers = buffers
    return attn, out_link
