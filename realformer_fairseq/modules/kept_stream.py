"""The eager route's backward with one score stream kept per chain, the earlier ones rebuilt.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention" (arXiv
2012.11747). Layer ``l`` of a chain computes ``S_l = S_{l-1} + Q_l K_l^T / sqrt(d)`` and
attends with ``softmax(mask(S_l) [/ (l + 1)])``. Plain autograd keeps, for every layer, what
the softmax, the attention dropout and the product with the values save: the float32
probabilities, the dropout mask and the dropped probabilities, T x T each. Layer ``l``'s
backward needs only ``S_l`` (besides q, k and v, which the products keep anyway): from it the
probabilities, and with the dropout generator's state replayed, the same dropout mask, are
recomputed. And ``S_{l-1} = S_l - Q_l K_l^T / sqrt(d)``: layer ``l``'s backward has just used
``S_l`` and holds q and k, so it rebuilds ``S_{l-1}`` in place, in ``S_l``'s buffer, and hands it
to layer ``l - 1``. A chain therefore keeps one stream from forward to backward, its last
(issue 51), as reversible networks rebuild their activations.

Off by default (``RealformerMultiheadAttention.kept_stream``): on CPU a training step costs
1.1-1.4x the plain route's time; docs/reference.md, "The eager route's kept stream (off)", has
the numbers.

The forward runs the eager route's own operations (``_raw_scores``, ``_add_to_stream``,
``_attend_heads``) in the same order, so its outputs are bitwise those of the plain route; the
backward recomputes them from the kept or rebuilt stream. The rebuilt stream is
``S_l - X`` with ``S_l = fl(S_{l-1} + X)``: one rounding per layer of the stream's dtype off
``S_{l-1}`` (float32; float64 stays float64), which docs/reference.md measures over 60 layers.

How a chain hands its stream on (:class:`StreamLink`): each layer's node holds its output
stream until a layer of this route consumes it as its previous stream; that consumer then owns
the rebuild, and the producer's node lets the stream go. A stream nobody consumes (the last of
the chain) stays with its node. Where that hand-over cannot hold, the layer runs the plain
eager route (autograd keeps its probabilities), or keeps its own stream, each reason said once
per process at WARNING: a layer whose forward runs during backward (fairseq's
``--checkpoint-activations``, ``--offload-activations``: it re-runs the layer then, with a
detached stream), an attention mask that needs a gradient, keys shared by the beams, attention
dropout on a device other than CPU and CUDA, a previous stream made elsewhere (another route,
or the caller) or taken by a second layer. Where the layers above a layer get no gradient
(their backward never runs: fairseq's ``transformer_align`` with ``--full-context-alignment``
uses one layer's attention of its alignment pass), that layer rebuilds its stream from the
chain's kept one itself, with the q and k its takers' links hold until their own backward
releases them. A chain's kept stream is rebuilt, and so consumed, by one backward: a second
backward through the same graph (``retain_graph=True``) raises instead of reading a stream that
is no longer there.
"""

import contextlib
import functools
import logging
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from . import route_warnings

logger = logging.getLogger(__name__)


def warn_once(reason: str, route: str = "eager", kept: str = "tensors"):
    """The one WARNING line per process of a reason that keeps a layer's stream (or, on the
    eager route, its ``kept`` tensors) to itself instead of the chain's one rebuilt stream."""
    route_warnings.warn_once(
        logger,
        "residual attention, %s route: %s, so that layer keeps its own %s for backward instead "
        "of the chain's one rebuilt stream",
        route,
        reason,
        kept,
    )


def storage_unshared(t: Tensor) -> bool:
    """Whether ``t`` is the only tensor on its storage (no caller, view or saved tensor holds
    it): then it may be written in place in backward. False where torch cannot say (its
    private use count is gone): the caller then copies."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return False
    storage = t.untyped_storage()
    return use_count(storage._cdata) <= 2  # ``t``'s reference and ``storage``'s


def writable_stream(stream: Tensor) -> Tensor:
    """``stream`` itself where it is the chain's own buffer, else a copy: a stream that a
    caller still holds (the chain's last, returned by the model) keeps its values after
    backward."""
    return stream if storage_unshared(stream) else stream.clone()


def stream_link_of(prev: Tensor, function) -> Optional["StreamLink"]:
    """The link of the ``function`` (an autograd Function of a kept-stream route) node that
    made ``prev`` as its stream (its output 1), or None where another operation made it."""
    link = getattr(prev.grad_fn, "link_out", None)
    if isinstance(prev.grad_fn, function._backward_cls) and prev.output_nr == 1:
        return link
    return None


# the reason every route's layer keeps its own tensors where activation checkpointing re-runs it
FORWARD_IN_BACKWARD = (
    "a layer's forward runs during backward (activation checkpointing: fairseq's "
    "--checkpoint-activations / --offload-activations)"
)


def forward_runs_in_backward() -> bool:
    """Whether this forward runs during a backward pass: fairseq's activation checkpointing
    (--checkpoint-activations / --offload-activations) re-running a layer."""
    return _current_graph_task_id() != -1


class StreamLink:
    """One layer's output stream ``S_l`` as its node holds it for backward: ``stream`` is a
    detached alias (no reference back to the node: no cycle), kept until a layer of this route
    takes it over (``rebuilder``: that layer's own link), which rebuilds it in backward and
    puts it back here; ``version`` is the tensor's version counter when it was kept, checked
    when it is taken (an in-place change in between raises, as for ``save_for_backward``).
    ``scores``: what recomputes the layer's raw scores (a function of q and k, q and k, their
    versions) where the layer's own backward does not run; released by that backward.
    ``route`` and ``kept`` name the route and what its layers keep instead, for the WARNING
    of a stream used twice."""

    __slots__ = ("stream", "version", "rebuilder", "scores", "route", "kept", "hooked")

    def __init__(self, route: str = "eager", kept: str = "tensors"):
        self.route, self.kept = route, kept
        # whether the stream had a gradient hook (or retain_grad) when a layer took it over:
        # then its gradient is not written over in backward
        self.hooked = False
        self.stream: Optional[Tensor] = None
        self.version = 0
        self.rebuilder: Optional["StreamLink"] = None
        self.scores: Optional[Tuple] = None

    def remember_scores(self, recompute: Callable[[Tensor, Tensor], Tensor], q: Tensor, k: Tensor):
        """``recompute(q, k)``: what the layer added to the stream, as its route computes it."""
        self.scores = (recompute, q.detach(), k.detach(), q._version, k._version)

    def raw_scores(self) -> Tensor:
        """This link's layer's raw scores ``Q K^T / sqrt(d)``, recomputed."""
        recompute, q, k, q_version, k_version = self.scores
        if q._version != q_version or k._version != k_version:
            raise RuntimeError(
                "residual attention: a layer's queries or keys kept for backward were modified "
                "in place after the forward"
            )
        return recompute(q, k)

    def keep(self, stream: Tensor):
        self.stream = stream.detach()
        self.version = stream._version

    def hand_over(self, consumer: "StreamLink", stream: Tensor):
        """``consumer`` (the link of the layer that took ``stream``, this link's stream, as its
        previous stream) rebuilds it in backward; a second consumer means the stream is used
        twice: it is then kept here as it is, and nobody rebuilds it."""
        if self.rebuilder is None and self.stream is not None:
            self.hooked = bool(stream._backward_hooks) or stream.retains_grad
            self.rebuilder = consumer
            self.stream = None
            return
        warn_once("a stream is the previous stream of more than one layer", self.route, self.kept)
        self.rebuilder = None
        self.keep(stream)

    def take(self, release: bool) -> Tensor:
        """The stream for this layer's backward. ``release``: the layer writes the previous
        stream over it, and it is no longer held here; else it stays, as a saved tensor stays
        for a second backward through the graph (``retain_graph=True``), until the graph goes.
        Where the layer that took it over got no gradient (its backward never ran, nor any above
        it: fairseq's ``transformer_align`` with ``--full-context-alignment`` uses one layer's
        attention of its alignment pass), it is rebuilt here from the chain's kept stream down,
        in place."""
        rebuilder = self.rebuilder
        if self.stream is None and rebuilder is not None and rebuilder.scores is not None:
            above = rebuilder.take(release=True)
            with torch.no_grad():
                above = writable_stream(above)
                self.keep(above.sub_(rebuilder.raw_scores().to(above.dtype)))
            rebuilder.scores = None
        stream = self.stream
        if stream is None:
            raise RuntimeError(
                "residual attention: the chain's kept score stream is gone: a second backward "
                "through the same graph (retain_graph=True); set the attention modules' "
                "kept_stream (eager route) or one_stream_per_chain (triton route) to False "
                "for this"
            )
        if stream._version != self.version:
            raise RuntimeError(
                "residual attention: a score stream kept for backward was modified in place "
                "after the forward"
            )
        if release:
            self.stream = None
        return stream


def _dropout_active(module) -> bool:
    dropout = module.dropout_module
    return dropout.p > 0 and (dropout.training or dropout.apply_during_inference)


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
    return module._raw_scores(q, k, bsz, bsz)


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
        raw_scores = module._raw_scores(q, k, bsz, bsz)
        stream = module._add_to_stream(raw_scores, prev)
        attn, probabilities = module._attend_heads(
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
                    attn, probabilities = module._attend_heads(
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
            raw_scores = module._raw_scores(q_, k_, bsz, bsz)
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


def _current_graph_task_id() -> int:
    """-1 outside a backward pass; the running backward's id inside one (where fairseq's
    checkpoint wrapper re-runs a layer's forward). Private torch API (``torch.utils.
    checkpoint`` uses it), read defensively."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return -1 if current is None else current()


def why_plain_route(
    module,
    tensors: List[Optional[Tensor]],
    attn_mask: Optional[Tensor],
    bsz: int,
    kv_bsz: int,
) -> Optional[str]:
    """Why a call of the eager route runs the plain route: None where the kept stream runs,
    ``""`` where no gradient is wanted (nothing is kept for backward: nothing to say), else
    the reason (said once by :func:`kept_stream_attention`'s caller)."""
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in tensors):
        return ""
    if forward_runs_in_backward():
        return FORWARD_IN_BACKWARD
    if attn_mask is not None and attn_mask.requires_grad:
        return "the attention mask needs a gradient"
    if bsz != kv_bsz:
        return "the beams share the encoder's keys (set_beam_size)"
    device = tensors[0].device
    if _dropout_active(module) and device.type not in ("cpu", "cuda"):
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
            warn_once(
                "the previous stream was not made by a kept-stream layer (a layer of another "
                "route in the chain, or a stream from the caller)"
            )
    link_out = StreamLink()
    rng = _rng_state(q.device) if _dropout_active(module) else None
    attn, stream, probabilities = _KeptStreamAttention.apply(
        q, k, v, prev, key_padding_mask, attn_mask, module, layer_idx, link_in, link_out, rng
    )
    if link_in is not None:
        link_in.hand_over(link_out, prev)
    return attn, stream, probabilities
