"""The eager route with one score stream kept per chain (RealFormer, arXiv 2012.11747).

Each layer's backward recomputes its probabilities (and replays its dropout) from its stream
``S_l`` and rebuilds the previous one in place, ``S_{l-1} = S_l - Q_l K_l^T / sqrt(d)``, so a
chain keeps one stream from forward to backward instead of every layer's probabilities; the
hand-over between layers is :class:`~.shared.StreamLink`. Off by default
(``RealformerMultiheadAttention.one_stream_per_chain``); docs/reference.md, "The eager route's
kept stream (off)", has the design and its cost.
"""

import contextlib
import functools
from typing import List, Optional

import torch
from torch import Tensor

from .shared import (
    FORWARD_IN_BACKWARD,
    StreamLink,
    dropout_active,
    forward_runs_in_backward,
    stream_link_of,
    warn_kept_own,
    writable_stream,
)


def _rng_state(device: torch.device) -> Tensor:
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


@contextlib.contextmanager
def _replayed_rng(state: Optional[Tensor], device: torch.device):
    """The generator as it was before the forward's dropout draw (nothing without dropout),
    restored afterwards, as ``torch.utils.checkpoint`` replays it."""
    if state is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if device.type == "cuda":
            torch.cuda.set_rng_state(state, device)
        else:
            torch.set_rng_state(state)
        yield


def _module_raw_scores(module, q: Tensor, k: Tensor) -> Tensor:
    bsz = q.size(0) // module.num_heads
    return module.raw_scores(q, k, bsz, bsz)


class _KeptStreamAttention(torch.autograd.Function):
    """``(attn (bsz*heads, tgt_len, head_dim), S_l, the float probabilities)`` of one eager
    layer, keeping for backward q, k, v, the masks and the stream's link (see the module
    docstring); the probabilities are not kept (a caller that asks for them holds them), and
    their gradient, where they have one, goes through the recomputed probabilities."""

    @staticmethod
    def forward(
        ctx, q, k, v, prev, key_padding_mask, attn_mask, module, layer_idx, link_in, link_out, rng
    ):
        bsz = q.size(0) // module.num_heads
        raw_scores = module.raw_scores(q, k, bsz, bsz)
        stream = module.add_to_stream(raw_scores, prev)
        attn, probabilities = module.attend_heads(
            stream, raw_scores, v, key_padding_mask, attn_mask, bsz, bsz, layer_idx
        )
        ctx.save_for_backward(q, k, v, key_padding_mask, attn_mask)
        ctx.module, ctx.layer_idx, ctx.rng = module, layer_idx, rng
        ctx.link_in, ctx.link_out = link_in, link_out
        ctx.prev_dtype = None if prev is None else prev.dtype
        link_out.keep(stream)
        link_out.remember_scores(functools.partial(_module_raw_scores, module), q, k)
        ctx.set_materialize_grads(False)
        return attn, stream, probabilities

    @staticmethod
    def backward(ctx, d_attn, d_stream, d_probabilities):
        q, k, v, key_padding_mask, attn_mask = ctx.saved_tensors
        module, layer_idx = ctx.module, ctx.layer_idx
        bsz = q.size(0) // module.num_heads
        link_in = ctx.link_in
        rebuild = link_in is not None and link_in.rebuilder is ctx.link_out
        stream = ctx.link_out.take(release=rebuild)
        d_q = d_k = d_v = d_total = None
        with torch.enable_grad():
            q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
            if d_attn is not None or d_probabilities is not None:
                stream_ = stream.detach().requires_grad_()
                with _replayed_rng(ctx.rng, q.device):
                    attn, probabilities = module.attend_heads(
                        stream_, q, v_, key_padding_mask, attn_mask, bsz, bsz, layer_idx
                    )
                outputs = [(attn, d_attn), (probabilities, d_probabilities)]
                outputs = [(out, grad) for out, grad in outputs if grad is not None]
                d_total, d_v = torch.autograd.grad(
                    [out for out, _ in outputs],
                    (stream_, v_),
                    [grad for _, grad in outputs],
                    allow_unused=True,
                )
                del stream_, attn, probabilities, outputs  # aliases of S_l: it would be copied
            if d_stream is not None:
                d_total = d_stream if d_total is None else d_total.add_(d_stream)
            raw_scores = module.raw_scores(q_, k_, bsz, bsz)
            if d_total is not None:
                d_q, d_k = torch.autograd.grad(raw_scores, (q_, k_), d_total.to(q.dtype))
        if rebuild:
            # S_{l-1} = S_l - Q_l K_l^T / sqrt(d), in S_l's buffer (a copy where a caller
            # holds it), for layer l - 1's backward
            stream = writable_stream(stream)
            link_in.keep(stream.sub_(raw_scores.detach().to(stream.dtype)))
        ctx.link_out.scores = None  # this layer's q and k: needed no longer
        d_prev = None
        if ctx.prev_dtype is not None and ctx.needs_input_grad[3] and d_total is not None:
            d_prev = d_total.to(ctx.prev_dtype)
        return d_q, d_k, d_v, d_prev, None, None, None, None, None, None, None


def gradient_wanted(tensors: List[Optional[Tensor]]) -> bool:
    """Whether this call builds a graph for backward (else nothing is kept: the plain route)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def why_plain_route(
    module,
    tensors: List[Optional[Tensor]],
    attn_mask: Optional[Tensor],
    bsz: int,
    kv_bsz: int,
) -> Optional[str]:
    """Why a call that wants a gradient cannot keep the chain's one stream (None where it can):
    the reason the plain route runs, said once by the caller."""
    if forward_runs_in_backward():
        return FORWARD_IN_BACKWARD
    if attn_mask is not None and attn_mask.requires_grad:
        return "the attention mask needs a gradient"
    if bsz != kv_bsz:
        return "the beams share the encoder's keys (set_beam_size)"
    device = tensors[0].device
    if dropout_active(module) and device.type not in ("cpu", "cuda"):
        return f"attention dropout on {device.type} (its generator is replayed on CPU and CUDA)"
    return None


def kept_stream_attention(
    module,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prev: Optional[Tensor],
    key_padding_mask: Optional[Tensor],
    attn_mask: Optional[Tensor],
    layer_idx: int,
):
    """``(attn (bsz*heads, tgt_len, head_dim), S_l, the float probabilities (bsz*heads,
    tgt_len, src_len))`` of ``module``'s eager route with the chain's stream handed on (see
    the module docstring); the caller checked :func:`why_plain_route`."""
    link_in: Optional[StreamLink] = None
    if prev is not None and prev.requires_grad:
        link_in = stream_link_of(prev, _KeptStreamAttention)
        if link_in is None:
            warn_kept_own(
                "the previous stream was not made by a kept-stream layer (a layer of another "
                "route in the chain, or a stream from the caller)"
            )
    link_out = StreamLink()
    rng = _rng_state(q.device) if dropout_active(module) else None
    attn, stream, probabilities = _KeptStreamAttention.apply(
        q, k, v, prev, key_padding_mask, attn_mask, module, layer_idx, link_in, link_out, rng
    )
    if link_in is not None:
        link_in.hand_over(link_out, prev)
    return attn, stream, probabilities
