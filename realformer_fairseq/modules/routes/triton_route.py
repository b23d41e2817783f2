"""The triton route of residual attention (RealFormer, arXiv 2012.11747): one fused Triton
kernel per layer reads the previous stream and writes the new one
(:func:`.triton_function.residual_attention`); the calls it does not serve run the eager route,
each reason said once. Imports no triton: :func:`kernel_module` imports the kernels when a
module is built. docs/reference.md, "The triton route", has the design.
"""

import logging
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from ...errors import RealformerConfigError
from ...settings import TRITON_INSTALL, TRITON_MISSING, triton_installed
from .eager import Attended, Carried, Heads, RealformerMultiheadAttention
from .rules import TritonRule, concat_phase_depth, triton_rule_for_this_machine
from .shared import (
    FORWARD_IN_BACKWARD,
    dropout_active,
    forward_runs_in_backward,
    stream_dtype,
    warn_kept_own,
    warn_once,
)
from .triton_launch import INTERPRETER_CAPABILITY, MAX_HEAD_DIM

logger = logging.getLogger(__name__)

# attention masks already checked for causality: (mask, its version, whether causal), newest
# last. The masks are kept (a few): no other tensor takes their memory while they are here
_CAUSAL_SEEN = []
_CAUSAL_SEEN_MAX = 16


def is_causal_mask(attn_mask: Tensor, mask_value: float) -> bool:
    """Whether ``attn_mask`` is a causal mask: square, 0 on and below the diagonal, at most the
    fill ``mask_value`` after it (fairseq's ``-inf`` future mask). Checked once per mask (its
    storage, shape, strides and version: fairseq's decoder slices one cached mask per batch),
    so that the kernels make it from the indices instead of reading it."""
    if attn_mask.dim() != 2 or attn_mask.size(0) != attn_mask.size(1):
        return False
    key = (attn_mask.data_ptr(), attn_mask.shape, attn_mask.stride(), attn_mask.dtype,
           attn_mask.device)  # fmt: skip
    for seen, version, verdict in _CAUSAL_SEEN:
        same = (seen.data_ptr(), seen.shape, seen.stride(), seen.dtype, seen.device) == key
        if same and version == attn_mask._version:
            return verdict
    n = attn_mask.size(0)
    future = torch.ones(n, n, dtype=torch.bool, device=attn_mask.device).triu(1)
    verdict = bool(torch.where(future, attn_mask <= mask_value, attn_mask == 0).all())
    _CAUSAL_SEEN.append((attn_mask, attn_mask._version, verdict))
    del _CAUSAL_SEEN[:-_CAUSAL_SEEN_MAX]
    return verdict


FUSED = "fused Triton kernel"
CONCAT_PHASE = "fused Triton kernel, concat phase (scores recomputed, no T x T tensor)"
# why the first stream-kernel layer after the concat phase keeps its own stream
FORMED_AT_SWITCH = "the stream was formed from the concat phase's queries and keys at the switch"


def kernel_module():
    """:mod:`.triton_function` (which imports triton), imported here on first use; a missing or broken triton is one :class:`RealformerConfigError` line."""
    if not triton_installed():
        raise RealformerConfigError(TRITON_MISSING)
    try:
        from . import triton_function
    except ImportError as err:
        raise RealformerConfigError(
            f"--residual-attention-impl triton: importing triton failed ({err}); {TRITON_INSTALL}"
        ) from err
    return triton_function


def concat_module():
    """:mod:`.triton_concat_function` (imports triton), imported where a chain runs the concat
    phase (the kernels are importable then: :func:`kernel_module` ran at build time)."""
    from . import triton_concat_function

    return triton_concat_function


def concat_link(prev_attn_scores: Optional[Tensor]) -> Optional[Tensor]:
    """``prev_attn_scores`` where it is a concat-phase layer's link (what a chain in the concat
    phase carries instead of the stream), else None."""
    if prev_attn_scores is not None and hasattr(prev_attn_scores, "concat_buffers"):
        return prev_attn_scores
    return None


def warn_eager(reason: str):
    """The one WARNING line per process of a reason that keeps this route off the kernel."""
    warn_once(
        logger, "--residual-attention-impl %s: runs the eager route where %s", "triton", reason
    )


class TritonRealformerMultiheadAttention(RealformerMultiheadAttention):
    """:class:`RealformerMultiheadAttention` whose attention runs in one fused Triton kernel
    (see the module docstring): the same constructor (plus ``rule``), the same ``forward``
    call and the same five values (``attn``, ``attn_weights``, ``attn_scores``, None, None),
    the same projections (``_project_heads``) and output projection (``_merge_heads``).

    ``rule``: a measured :class:`~.rules.TritonRule` where
    ``--residual-attention-impl auto`` built this route (the kernel runs in its dtypes only);
    None for an explicit ``triton``."""

    @classmethod
    def route_help(cls, name: str) -> str:
        return (
            "runs one fused Triton kernel per layer that reads the previous stream and writes "
            "the new one (needs the extra: pip install -e '.[triton]'; incremental decoding, "
            "TorchScript and keys shared by the beams run eager, with one warning)"
        )

    @classmethod
    def for_chain(
        cls, name: str, requested: str, chain: str, cpu: bool, embed_dim, num_heads,
        residual_attention_mode: str, **kwargs,
    ):  # fmt: skip
        rule = triton_rule_for_this_machine(chain, cpu) if requested == "auto" else None
        return cls(embed_dim, num_heads, residual_attention_mode, rule=rule, **kwargs)

    def __init__(
        self,
        embed_dim,
        num_heads,
        residual_attention_mode: str,
        rule: Optional[TritonRule] = None,
        **kwargs,
    ):
        super().__init__(embed_dim, num_heads, residual_attention_mode, **kwargs)
        kernel_module()  # at build time: a missing triton stops the build
        if self.head_dim > MAX_HEAD_DIM:
            raise RealformerConfigError(
                f"--residual-attention-impl triton: the kernels take head sizes up to "
                f"{MAX_HEAD_DIM}, this model's is {self.head_dim} "
                f"({embed_dim} / {num_heads} heads); --residual-attention-impl eager runs it"
            )
        self.residual_attention_impl = "triton"
        # plain attributes (TorchScript reads no module globals; it never runs the kernel)
        self.rule_dtypes = [str(d) for d in rule.dtypes] if rule is not None else []
        # True: a chain of kernel calls keeps one stream for backward and rebuilds the earlier
        # ones (triton_function.residual_attention); False: every layer keeps its
        # own (what a second backward through one graph, retain_graph=True, needs)
        self.one_stream_per_chain = True

    def why_not(
        self,
        heads: Heads,
        carried: Carried,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
    ) -> Optional[str]:
        if torch.jit.is_scripting():
            return "the model is scripted (TorchScript)"
        return self._why_eager(heads, incremental_state)

    @torch.jit.unused
    def attend(self, heads: Heads, carried: Carried) -> Attended:
        """The kernels: the concat phase for a chain's first ``D`` layers
        (:func:`~.rules.concat_phase_depth`; ``attn_scores`` is then the chain's link, an empty
        tensor, not the stream: :meth:`stream_of` forms it), then the stream kernels, the
        stream formed once at the switch. Where asked for, ``attn_weights`` are the eager
        route's softmax of the masked stream the kernel returns."""
        link = concat_link(heads.prev_attn_scores)
        depth = self._concat_depth(heads, link)
        if heads.layer_idx < depth:
            self._took(CONCAT_PHASE, heads.layer_idx)
            attn, out_link = self._fused(
                heads.q, heads.k, heads.v, link, heads.key_padding_mask, heads.attn_mask,
                heads.layer_idx, concat_depth=depth,
            )  # fmt: skip
            return self._merge_heads(attn, heads.q.size(1), heads.bsz), None, out_link, None, None
        self._took(FUSED, heads.layer_idx)
        one_stream_per_chain = self.one_stream_per_chain
        if link is not None:  # the switch: the stream formed once, in the eager route's order
            heads = heads._replace(prev_attn_scores=concat_module().stream_of_concat_phase(link))
            if one_stream_per_chain and torch.is_grad_enabled():
                warn_kept_own(FORMED_AT_SWITCH, route="triton", kept="stream")
            one_stream_per_chain = False
        q, bsz, tgt_len = heads.q, heads.bsz, heads.q.size(1)
        attn, attn_scores = self._fused(
            q, heads.k, heads.v, heads.prev_attn_scores, heads.key_padding_mask, heads.attn_mask,
            heads.layer_idx, one_stream_per_chain=one_stream_per_chain,
        )  # fmt: skip
        attn_weights: Optional[Tensor] = None
        if heads.need_weights:  # fairseq's alignment layer: from the kernel's stream
            probabilities = self._probabilities(
                attn_scores, heads.key_padding_mask, heads.attn_mask, heads.kv_bsz,
                heads.layer_idx,
            )  # fmt: skip
            attn_weights = self._weights_as_fairseq(
                probabilities, bsz, tgt_len, attn_scores.size(2), heads.need_head_weights
            )
        return self._merge_heads(attn, tgt_len, bsz), attn_weights, attn_scores, None, None

    def fall_back(self, heads: Heads, carried: Carried) -> Attended:
        """The eager route; after a concat phase, from the stream formed once from its link."""
        if not torch.jit.is_scripting():
            heads = self._with_stream(heads)
        return self._eager_route(heads, False)

    @torch.jit.unused
    def _with_stream(self, heads: Heads) -> Heads:
        link = concat_link(heads.prev_attn_scores)
        if link is None:
            return heads
        return heads._replace(prev_attn_scores=concat_module().stream_of_concat_phase(link))

    @torch.jit.unused
    def stream_of(self, attn_scores: Optional[Tensor]) -> Optional[Tensor]:
        """The stream ``(bsz*heads, tgt_len, src_len)`` a layer of this route returned as
        ``attn_scores``: formed once from the chain's queries and keys where the layer ran the
        concat phase (it returns the chain's link), else ``attn_scores`` itself. The model
        drops the last layer's ``attn_scores``; a caller that reads them calls this."""
        link = concat_link(attn_scores)
        if link is None:
            return attn_scores
        return concat_module().stream_of_concat_phase(link)

    @torch.jit.unused
    def _concat_depth(self, heads: Heads, link: Optional[Tensor]) -> int:
        """The chain's switch depth ``D`` where this layer may run the concat phase, else 0:
        a chain starts it at layer 0 (D from the rule for its shapes) and keeps it while its
        layers carry the link; the stream kernels run where a layer needs the stream
        (``need_weights``), without a gradient (``torch.no_grad``: evaluation, and the first
        pass of activation checkpointing) and in a forward re-run during backward (activation
        checkpointing: said once)."""
        if not getattr(kernel_module(), "CONCAT_PHASE", False):
            return 0  # kernels without the concat phase (the tests' pure-torch stand-in)
        if link is not None:
            depth = concat_module().concat_buffers_of(link).depth
        elif heads.prev_attn_scores is None and heads.layer_idx == 0:
            capability = (
                torch.cuda.get_device_capability(heads.q.device)
                if heads.q.device.type == "cuda"
                else INTERPRETER_CAPABILITY
            )
            depth = concat_phase_depth(heads.q.size(2), heads.k.size(1), heads.q.dtype, capability)
        else:
            return 0
        if depth == 0 or heads.need_weights or not torch.is_grad_enabled():
            return 0
        if forward_runs_in_backward():
            warn_kept_own(FORWARD_IN_BACKWARD, route="triton", kept="stream")
            return 0
        return depth

    @torch.jit.unused
    def _why_eager(
        self,
        heads: Heads,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
    ) -> Optional[str]:
        """Why this call runs the eager route (None where the kernel runs)."""
        q, attn_mask = heads.q, heads.attn_mask
        if incremental_state is not None:
            return "decoding incrementally (incremental_state)"
        if heads.bsz != heads.kv_bsz:
            return "the beams share the encoder's keys (set_beam_size)"
        if attn_mask is not None and attn_mask.requires_grad:
            return "the attention mask needs a gradient"
        if q.device.type != "cuda" and not kernel_module().RUNS_IN_INTERPRETER:
            return (
                f"tensors are on {q.device.type}, not CUDA, without Triton's interpreter "
                "(TRITON_INTERPRET=1 when triton is imported)"
            )
        if self.rule_dtypes and str(q.dtype) not in self.rule_dtypes:
            return f"auto: {q.dtype} is not a dtype of its measured triton rule"
        return None

    @torch.jit.unused
    def _fused(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        prev_attn_scores: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        layer_idx: int,
        one_stream_per_chain: bool = True,
        concat_depth: int = 0,
    ) -> Tuple[Tensor, Tensor]:
        """The kernel: ``(attn (bsz*heads, tgt_len, head_dim) in q's dtype, the new stream)``;
        with ``concat_depth``, the concat phase's (``prev_attn_scores`` is the previous
        layer's link, or None at layer 0): ``(attn, this layer's link)``."""
        dropout_p = float(self.dropout_module.p) if dropout_active(self) else 0.0
        divisor = float(layer_idx + 1) if self.residual_attention_mode == "mean" else 1.0
        sdtype = stream_dtype(q.dtype)
        causal = (
            attn_mask is not None
            and q.size(1) == k.size(1)
            and is_causal_mask(attn_mask, self.mask_value)
        )
        if causal:  # made in the kernels from the indices
            attn_mask = None
        elif attn_mask is not None:  # the eager route's finite fill (-inf, -1e8 -> -1e30)
            attn_mask = attn_mask.to(sdtype).clamp(min=self.mask_value)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.to(torch.bool)
        if concat_depth:
            return concat_module().concat_residual_attention(
                q, k, v, prev_attn_scores, key_padding_mask, attn_mask, self.num_heads,
                layer_idx, concat_depth, divisor, dropout_p, mask_value=self.mask_value,
                causal=causal,
            )  # fmt: skip
        if prev_attn_scores is not None:  # its shape: checked by residual_attention
            prev_attn_scores = prev_attn_scores.to(sdtype)
        return kernel_module().residual_attention(
            q, k, v, prev_attn_scores, key_padding_mask, attn_mask, self.num_heads,
            divisor, dropout_p, mask_value=self.mask_value, causal=causal,
            one_stream_per_chain=one_stream_per_chain and self.one_stream_per_chain,
        )  # fmt: skip

    def __prepare_scriptable__(self):
        """``torch.jit.script`` calls this before scripting: the scripted model runs the eager
        route (the kernel is Python), said once."""
        warn_eager("the model is scripted (TorchScript)")
        self._last_route[0] = "eager, because the model is scripted (TorchScript)"
        return self

    @property
    def last_kernel(self) -> str:
        """The former name of :attr:`last_route` (on the routes that record one)."""
        return self._last_route[0]
