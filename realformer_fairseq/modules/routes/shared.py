"""What every route of residual attention (RealFormer, arXiv 2012.11747) shares: the mask
fill, the stream's dtype, the once-per-process WARNING lines, and the hand-over of a chain's
one kept stream from layer to layer (:class:`StreamLink`).
"""

import logging
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

# The fill of masked logits on every route and kernel: finite, so that a fully masked row
# softmaxes to a uniform row instead of NaN; not finfo(float32).min, which fused kernels scale
# into -inf; far above any stream value and far below overflow (docs/reference.md, "The mask
# fill"). fp16 cannot hold it: the concat route uses finfo(float16).min there.
MASK_VALUE = -1e30


def stream_dtype(dtype: torch.dtype) -> torch.dtype:
    """The stream's dtype for inputs of ``dtype``: float32, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chain_mismatch(prev: List[int], this: List[int]) -> str:
    """The error of a previous stream whose shape is not this layer's (scriptable)."""
    return (
        "residual attention chain mismatch: previous layer scores " + str(prev) + " vs this "
        "layer's " + str(this) + " (bsz*heads, tgt_len, src_len); all layers of a chain need the "
        "same number of heads"
    )


def dropout_active(module) -> bool:
    """Whether ``module``'s attention dropout drops in this call (as ``FairseqDropout``)."""
    dropout = module.dropout_module
    return dropout.p > 0 and (dropout.training or dropout.apply_during_inference)


# (logger name, message, arguments) already said at WARNING in this process
_SAID = set()


def warn_once(log: logging.Logger, message: str, *args) -> None:
    """``log.warning(message % args)`` the first time this process meets it, with
    "(said once per process)" appended."""
    key = (log.name, message, args)
    if key not in _SAID:
        _SAID.add(key)
        log.warning(message + " (said once per process)", *args)


def warn_kept_own(reason: str, route: str = "eager", kept: str = "tensors"):
    """The WARNING line, once per process, of a ``reason`` that keeps a layer's own stream (or,
    on the eager route, its ``kept`` tensors) for backward instead of the chain's one."""
    warn_once(
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


def _current_graph_task_id() -> int:
    """-1 outside a backward pass; the running backward's id inside one (where fairseq's
    checkpoint wrapper re-runs a layer's forward). Private torch API (``torch.utils.
    checkpoint`` uses it), read defensively."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return -1 if current is None else current()


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
        warn_kept_own(
            "a stream is the previous stream of more than one layer", self.route, self.kept
        )
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
                "one_stream_per_chain to False for this"
            )
        if stream._version != self.version:
            raise RuntimeError(
                "residual attention: a score stream kept for backward was modified in place "
                "after the forward"
            )
        if release:
            self.stream = None
        return stream
