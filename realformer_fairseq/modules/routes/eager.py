"""The eager route of residual attention (RealFormer), and the class every route subclasses.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention".
Findings of ACL 2021 (arXiv 2012.11747), section 3.2 and appendix A.2: layer ``l`` of a chain
attends with ``softmax(S_l + mask)`` (``S_l / (l + 1)`` for the running mean) and hands on the
raw, unmasked, float32 running sum ``S_l = S_{l-1} + Q_l K_l^T / sqrt(d)``.
"""

import logging
from typing import Dict, NamedTuple, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor

from ...settings import RESIDUAL_ATTENTION_MODES
from .kept_stream import gradient_wanted, kept_stream_attention, why_plain_route
from .shared import MASK_VALUE, chain_mismatch, stream_dtype, warn_kept_own, warn_once

logger = logging.getLogger(__name__)


class Heads(NamedTuple):
    """One call's projected heads and what every route needs with them."""

    q: Tensor  # (bsz*heads, tgt_len, head_dim), scaled by head_dim ** -0.5
    k: Tensor  # (kv_bsz*heads, src_len, head_dim)
    v: Tensor  # (kv_bsz*heads, src_len, head_dim)
    prev_attn_scores: Optional[Tensor]  # (bsz*heads, tgt_len, src_len), the stream so far
    key_padding_mask: Optional[Tensor]  # (kv_bsz, src_len), True at padded keys
    attn_mask: Optional[Tensor]  # (tgt_len, src_len), additive
    bsz: int
    kv_bsz: int  # bsz / beam_size where the beams of a sentence share its encoder keys
    layer_idx: int  # position in the chain, for the running mean
    need_weights: bool
    need_head_weights: bool


class Carried(NamedTuple):
    """The concat route's chain: queries ``(bsz*heads, tgt_len, l*head_dim)`` and keys
    ``(kv_bsz*heads, src_len, l*head_dim)`` of the earlier layers (None on other routes)."""

    queries: Optional[Tensor]
    keys: Optional[Tensor]


# attn, attn_weights, attn_scores, attn_queries, attn_keys
Attended = Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor], Optional[Tensor]]


class RealformerMultiheadAttention(MultiheadAttention):
    """fairseq :class:`MultiheadAttention` with a residual score stream.

    ``forward`` takes ``prev_attn_scores`` (the previous layer's stream,
    ``(bsz * num_heads, tgt_len, src_len)`` float32, or ``None`` for the first
    layer of a chain) and ``layer_idx`` (position in the chain, for the running
    mean) and returns ``(attn, attn_weights, attn_scores, attn_queries, attn_keys)``:
    the same call and the same five values as :class:`ConcatRealformerMultiheadAttention`,
    so that a layer calls either route at one call site; this route carries no queries and
    keys (``prev_attn_queries`` / ``prev_attn_keys`` must be None, and are returned None).

    fairseq's forward hands every call without incremental state (all of
    training) to ``F.multi_head_attention_forward``, which never exposes the
    scores and ignores ``before_softmax``. This class therefore re-owns the
    non-fused path of ``MultiheadAttention.forward`` (fairseq 0.12.2/0.12.3),
    without the ONNX/TPU/xformers/bias_kv/zero_attn/pruning branches, which it
    refuses at construction. The incremental-state layout (``prev_key``,
    ``prev_value``, ``prev_key_padding_mask``) is fairseq's, so the inherited
    ``reorder_incremental_state`` serves beam search unchanged.

    Every route subclasses it: ``forward`` is this class's for all of them (the preamble and
    the projections once), and a route overrides :meth:`why_not`, :meth:`attend` and, where
    its fallback is not the plain eager route, :meth:`fall_back` (docs/reference.md, "Adding
    a route"). ``calls`` counts forwards through this path; tests use it to prove that the
    residual path ran.
    """

    @classmethod
    def route_help(cls, name: str) -> str:
        """The clause of ``--residual-attention-impl``'s help for this route, as ``name``."""
        return "materialises the float32 running sum of scores"

    @classmethod
    def for_chain(
        cls, name: str, requested: str, chain: str, cpu: bool, embed_dim, num_heads,
        residual_attention_mode: str, **kwargs,
    ):  # fmt: skip
        """This route's module for a layer of ``chain``, built as route ``name`` (its key in
        ``ROUTES``) for ``--residual-attention-impl requested`` (``cpu``: a ``--cpu`` build);
        ``kwargs`` are fairseq's ``MultiheadAttention`` arguments. A route with a measured rule
        overrides this; any other is built as it is."""
        module = cls(embed_dim, num_heads, residual_attention_mode, **kwargs)
        module.residual_attention_impl = name
        return module

    def __init__(
        self,
        embed_dim,
        num_heads,
        residual_attention_mode: str,
        **kwargs,
    ):
        for unsupported in ("add_bias_kv", "add_zero_attn", "xformers_att_config"):
            if kwargs.get(unsupported):
                raise ValueError(
                    f"residual attention does not support {unsupported}={kwargs[unsupported]!r}"
                )
        if residual_attention_mode not in RESIDUAL_ATTENTION_MODES:
            raise ValueError(
                f"residual attention mode must be one of {RESIDUAL_ATTENTION_MODES}, "
                f"got {residual_attention_mode!r}"
            )
        super().__init__(embed_dim, num_heads, **kwargs)
        self.residual_attention_mode = residual_attention_mode
        self.residual_attention_impl = "eager"  # the route (the subclass: concat or auto)
        # True: the chain keeps one stream for backward and rebuilds the earlier ones
        # (kept_stream.py); off on the eager route (docs/reference.md, "The eager route's kept
        # stream (off)"), on by default on the triton route
        self.one_stream_per_chain = False
        self.mask_value = MASK_VALUE  # an attribute: TorchScript reads no module globals
        # a list, not an int attribute: assigning to a Module attribute goes through
        # nn.Module.__setattr__, a measurable cost per incremental decoding step
        self._calls = [0]
        # what the last forward ran (last_route), in a list for the same reason
        self._last_route = [""]

    __jit_unused_properties__ = ["kept_stream", "last_route", "last_kernel"]

    @property
    def calls(self) -> int:
        return self._calls[0]

    @property
    def kept_stream(self) -> bool:
        """The eager route's former name of :attr:`one_stream_per_chain`."""
        return self.one_stream_per_chain

    @kept_stream.setter
    def kept_stream(self, value: bool):
        self.one_stream_per_chain = value

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
        prev_attn_scores: Optional[Tensor] = None,
        layer_idx: int = 0,
        prev_attn_queries: Optional[Tensor] = None,
        prev_attn_keys: Optional[Tensor] = None,
    ) -> Attended:
        """Input shape: Time x Batch x Channel (as fairseq).

        Returns ``attn`` (tgt_len, bsz, embed_dim), the attention weights as fairseq returns
        them (or ``None``), ``attn_scores``, the float32 running sum of raw scores
        ``(bsz * num_heads, tgt_len, src_len)``, and the concat route's carried queries and
        keys (None on every other route). The route runs where :meth:`why_not` has no reason,
        else the eager route (:meth:`fall_back`), the reason logged (:meth:`_fell_back`).
        """
        carried = Carried(prev_attn_queries, prev_attn_keys)
        if not self.carries_queries() and (carried.queries is not None or carried.keys is not None):
            raise ValueError(
                "the " + self.residual_attention_impl + " route carries no concatenated queries "
                "and keys"
            )
        if before_softmax:
            raise ValueError("use the returned attn_scores instead of before_softmax")
        if need_head_weights:
            need_weights = True
        if not torch.jit.is_scripting():
            self._calls[0] += 1
        tgt_len, bsz, embed_dim = query.size()
        assert embed_dim == self.embed_dim, f"query dim {embed_dim} != {self.embed_dim}"
        q, k, v, key_padding_mask, kv_bsz = self._project_heads(
            query, key, value, key_padding_mask, incremental_state, static_kv
        )
        heads = Heads(
            q, k, v, prev_attn_scores, key_padding_mask, attn_mask, bsz, kv_bsz, layer_idx,
            need_weights, need_head_weights,
        )  # fmt: skip
        reason = self.why_not(heads, carried, incremental_state)
        if reason is not None:
            if not torch.jit.is_scripting():
                self._fell_back(reason, layer_idx)
            return self.fall_back(heads, carried)
        return self.attend(heads, carried)

    # ---------------------------------------------------------------- what a route overrides

    def carries_queries(self) -> bool:
        """Whether the route carries the chain's queries and keys (the concat route)."""
        return False

    def why_not(
        self,
        heads: Heads,
        carried: Carried,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
    ) -> Optional[str]:
        """Why this route cannot run this call (None where it can): the eager route then runs
        it (:meth:`fall_back`)."""
        return None

    def attend(self, heads: Heads, carried: Carried) -> Attended:
        """This route's attention from the projected heads on: the five values of
        :meth:`forward`. The eager route: this layer's raw scores added to the stream, the
        masked softmax, the values and the output projection; autograd keeps each layer's
        probabilities, or, where ``one_stream_per_chain`` is set, the chain keeps one stream
        (:mod:`.kept_stream`), but where a reason it says once keeps the plain route."""
        return self._eager_route(heads, self.one_stream_per_chain)

    def fall_back(self, heads: Heads, carried: Carried) -> Attended:
        """The call :meth:`why_not` refused, on the eager route (autograd keeps what it needs)."""
        return self._eager_route(heads, False)

    # ---------------------------------------------------------------- the eager route

    def _eager_route(self, heads: Heads, one_stream_per_chain: bool) -> Attended:
        if not torch.jit.is_scripting():
            if one_stream_per_chain:
                kept = self._kept_stream_route(heads)
                if kept is not None:
                    return kept[0], kept[1], kept[2], None, None
        raw_scores = self.raw_scores(heads.q, heads.k, heads.bsz, heads.kv_bsz)
        attn_scores = self.add_to_stream(raw_scores, heads.prev_attn_scores)
        attn, attn_weights = self._attend_stream(
            attn_scores, raw_scores, heads.v, heads.key_padding_mask, heads.attn_mask, heads.bsz,
            heads.kv_bsz, heads.layer_idx, heads.need_weights, heads.need_head_weights,
        )  # fmt: skip
        return attn, attn_weights, attn_scores, None, None

    @torch.jit.unused
    def _kept_stream_route(self, heads: Heads) -> Optional[Tuple[Tensor, Optional[Tensor], Tensor]]:
        """``(attn, attn_weights, attn_scores)`` of the eager route with the chain's one kept
        stream, or None where the plain route runs (the reason said once where a gradient is
        wanted)."""
        tensors = [heads.q, heads.k, heads.v, heads.prev_attn_scores]
        if not gradient_wanted(tensors):
            return None  # nothing is kept for backward
        reason = why_plain_route(self, tensors, heads.attn_mask, heads.bsz, heads.kv_bsz)
        if reason is not None:
            warn_kept_own(reason)
            return None
        attn, attn_scores, probabilities = kept_stream_attention(
            self, heads.q, heads.k, heads.v, heads.prev_attn_scores, heads.key_padding_mask,
            heads.attn_mask, heads.layer_idx,
        )  # fmt: skip
        tgt_len, src_len = attn_scores.size(1), attn_scores.size(2)
        attn_weights: Optional[Tensor] = None
        if heads.need_weights:
            attn_weights = self._weights_as_fairseq(
                probabilities, heads.bsz, tgt_len, src_len, heads.need_head_weights
            )
        return self._merge_heads(attn, tgt_len, heads.bsz), attn_weights, attn_scores

    # ---------------------------------------------------------------- what the route took

    @torch.jit.unused
    def _route_logger(self) -> logging.Logger:
        return logging.getLogger(type(self).__module__)

    @torch.jit.unused
    def _took(self, what: str, layer_idx: int):
        """Record what this call ran (:attr:`last_route`): one debug line where it changed."""
        if what != self._last_route[0]:
            self._last_route[0] = what
            self._route_logger().debug(
                "residual attention, %s route, layer %d of its chain: %s",
                self.residual_attention_impl, layer_idx, what,
            )  # fmt: skip

    @torch.jit.unused
    def _fell_back(self, reason: str, layer_idx: int):
        """Record the eager route taken for ``reason``; said once per process at WARNING where
        the route says its fallbacks (:meth:`says_fallbacks`)."""
        self._took("eager, because " + reason, layer_idx)
        if self.says_fallbacks():
            warn_once(
                self._route_logger(),
                "--residual-attention-impl %s: runs the eager route where %s",
                self.residual_attention_impl, reason,
            )  # fmt: skip

    @torch.jit.unused
    def says_fallbacks(self) -> bool:
        """Whether a call this route cannot run is said at WARNING (once per reason)."""
        return True

    @property
    def last_route(self) -> str:
        """What the last forward ran: the fused kernel, or ``"eager, because ..."`` ("" where
        the route records nothing: the plain eager route)."""
        return self._last_route[0]

    def _weights_as_fairseq(
        self, probabilities: Tensor, bsz: int, tgt_len: int, src_len: int, per_head: bool
    ) -> Tensor:
        """The float probabilities ``(bsz*heads, tgt_len, src_len)`` as fairseq returns its
        attention weights: ``(heads, bsz, tgt_len, src_len)``, or their mean over heads."""
        weights = probabilities.view(bsz, self.num_heads, tgt_len, src_len).transpose(1, 0)
        if not per_head:
            weights = weights.mean(dim=0)  # average over heads
        return weights

    def _project_heads(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        static_kv: bool,
    ) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor], int]:
        """Scaled queries ``(bsz*heads, tgt_len, head_dim)``, keys and values
        ``(kv_bsz*heads, src_len, head_dim)`` with fairseq's incremental state read and
        updated, the key padding mask ``(kv_bsz, src_len)`` (or None) and ``kv_bsz``
        (``bsz / beam_size`` where the beams of a sentence share its encoder keys)."""
        tgt_len, bsz, _ = query.size()
        saved_state: Optional[Dict[str, Optional[Tensor]]] = None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
            if saved_state is not None and "prev_key" in saved_state and static_kv:
                # cached encoder keys/values: no need to project them again
                assert self.encoder_decoder_attention and not self.self_attention
                key = value = None

        q = self.q_proj(query)
        k: Optional[Tensor] = None
        v: Optional[Tensor] = None
        if self.self_attention:
            k = self.k_proj(query)
            v = self.v_proj(query)
        elif key is not None:
            assert value is not None
            if self.encoder_decoder_attention and self.beam_size > 1 and bsz == key.size(1):
                # fairseq's set_beam_size: the beams of a sentence share its encoder output;
                # key is [T, bsz*beam_size, C], reduce to [T, bsz, C]
                key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0, :]
                value = key
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask.view(
                        -1, self.beam_size, key_padding_mask.size(1)
                    )[:, 0, :]
            k = self.k_proj(key)
            v = self.v_proj(value)
        else:
            assert value is None
        q = q * self.scaling

        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        kv_bsz = bsz  # bsz / beam_size where the beams share the encoder's keys
        if k is not None:
            kv_bsz = k.size(1)
            k = k.contiguous().view(-1, kv_bsz * self.num_heads, self.head_dim).transpose(0, 1)
        if v is not None:
            v = v.contiguous().view(-1, kv_bsz * self.num_heads, self.head_dim).transpose(0, 1)

        if saved_state is not None:
            # saved states are stored with shape (kv_bsz, num_heads, seq_len, head_dim)
            if "prev_key" in saved_state:
                saved_key = saved_state["prev_key"]
                assert saved_key is not None
                kv_bsz = saved_key.size(0)
                prev_key = saved_key.view(kv_bsz * self.num_heads, -1, self.head_dim)
                if static_kv or k is None:
                    k = prev_key
                else:
                    k = torch.cat([prev_key, k], dim=1)
            if "prev_value" in saved_state:
                saved_value = saved_state["prev_value"]
                assert saved_value is not None
                prev_value = saved_value.view(kv_bsz * self.num_heads, -1, self.head_dim)
                if static_kv or v is None:
                    v = prev_value
                else:
                    v = torch.cat([prev_value, v], dim=1)
            prev_key_padding_mask: Optional[Tensor] = None
            if "prev_key_padding_mask" in saved_state:
                prev_key_padding_mask = saved_state["prev_key_padding_mask"]
            assert k is not None and v is not None
            key_padding_mask = self._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=prev_key_padding_mask,
                batch_size=kv_bsz,
                src_len=k.size(1),
                static_kv=static_kv,
            )
            saved_state["prev_key"] = k.view(kv_bsz, self.num_heads, -1, self.head_dim)
            saved_state["prev_value"] = v.view(kv_bsz, self.num_heads, -1, self.head_dim)
            saved_state["prev_key_padding_mask"] = key_padding_mask
            assert incremental_state is not None
            incremental_state = self._set_input_buffer(incremental_state, saved_state)
        assert k is not None and v is not None
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None
        return q, k, v, key_padding_mask, kv_bsz

    def raw_scores(self, q: Tensor, k: Tensor, bsz: int, kv_bsz: int) -> Tensor:
        """``q k^T`` per head, ``(bsz*heads, tgt_len, src_len)``, in the inputs' dtype."""
        if self.encoder_decoder_attention and bsz != kv_bsz:
            # as fairseq: beams of one sentence against its keys
            raw_scores = torch.einsum(
                "bxhtd,bhsd->bxhts",
                q.view((kv_bsz, -1, self.num_heads) + q.size()[1:]),
                k.view((kv_bsz, self.num_heads) + k.size()[1:]),
            )
            return raw_scores.reshape((-1,) + raw_scores.size()[-2:])
        return torch.bmm(q, k.transpose(1, 2))

    def add_to_stream(self, raw_scores: Tensor, prev_attn_scores: Optional[Tensor]) -> Tensor:
        """This layer's raw scores plus the stream so far: the stream is at least float32
        (float64 stays float64); the sum is added in place into this layer's fresh product
        (autograd keeps ``q`` and ``k`` for the product's backward, not the product)."""
        attn_scores = raw_scores
        if raw_scores.dtype != stream_dtype(raw_scores.dtype):
            attn_scores = raw_scores.to(stream_dtype(raw_scores.dtype))
        if prev_attn_scores is not None:
            if prev_attn_scores.shape != attn_scores.shape:
                raise ValueError(
                    chain_mismatch(list(prev_attn_scores.shape), list(attn_scores.shape))
                )
            attn_scores.add_(prev_attn_scores.to(attn_scores.dtype))
        return attn_scores

    def _attend_stream(
        self,
        attn_scores: Tensor,
        raw_scores: Tensor,
        v: Tensor,
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        bsz: int,
        kv_bsz: int,
        layer_idx: int,
        need_weights: bool,
        need_head_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """softmax over the masked stream (divided by ``layer_idx + 1`` for the running
        mean), attention dropout, the values and the output projection; returns
        ``(attn, attn_weights)`` as fairseq does."""
        attn, attn_weights_float = self.attend_heads(
            attn_scores, raw_scores, v, key_padding_mask, attn_mask, bsz, kv_bsz, layer_idx
        )
        tgt_len, src_len = attn_scores.size(1), attn_scores.size(2)
        attn = self._merge_heads(attn, tgt_len, bsz)
        attn_weights: Optional[Tensor] = None
        if need_weights:
            attn_weights = self._weights_as_fairseq(
                attn_weights_float, bsz, tgt_len, src_len, need_head_weights
            )
        return attn, attn_weights

    def attend_heads(
        self,
        attn_scores: Tensor,
        raw_scores: Tensor,
        v: Tensor,
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        bsz: int,
        kv_bsz: int,
        layer_idx: int,
    ) -> Tuple[Tensor, Tensor]:
        """softmax over the masked stream (divided by ``layer_idx + 1`` for the running
        mean), attention dropout and the values, per head: ``(attn (bsz*heads, tgt_len,
        head_dim), the float probabilities (bsz*heads, tgt_len, src_len))``; the dropped
        probabilities are cast to ``raw_scores``' dtype before the values."""
        shared_kv = self.encoder_decoder_attention and bsz != kv_bsz
        attn_weights_float = self._probabilities(
            attn_scores, key_padding_mask, attn_mask, kv_bsz, layer_idx
        )
        attn_probs = self.dropout_module(attn_weights_float.type_as(raw_scores))
        if shared_kv:
            attn = torch.einsum(
                "bxhts,bhsd->bxhtd",
                attn_probs.view((kv_bsz, -1, self.num_heads) + attn_probs.size()[1:]),
                v.view((kv_bsz, self.num_heads) + v.size()[1:]),
            )
            attn = attn.reshape((-1,) + attn.size()[-2:])
        else:
            attn = torch.bmm(attn_probs, v)  # (bsz*heads, tgt_len, head_dim)
        return attn, attn_weights_float

    def _probabilities(
        self,
        attn_scores: Tensor,
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        kv_bsz: int,
        layer_idx: int,
    ) -> Tensor:
        """The float probabilities ``(bsz*heads, tgt_len, src_len)``: softmax over the masked
        stream (divided by ``layer_idx + 1`` for the running mean), the masks with the finite
        fill on a copy, never on the stream itself."""
        tgt_len, src_len = attn_scores.size(1), attn_scores.size(2)
        # the softmax input: a masked copy, never the stream itself
        logits = attn_scores
        own_copy = False
        if self.residual_attention_mode == "mean" and layer_idx > 0:
            logits = logits / float(layer_idx + 1)
            own_copy = True
        if attn_mask is not None:
            # (tgt_len, src_len), additive float (fairseq uses -inf or -1e8)
            mask = attn_mask.to(logits.dtype).clamp(min=self.mask_value).unsqueeze(0)
            if own_copy:  # in place where logits is already this layer's own copy
                logits.add_(mask)
            else:
                logits = logits + mask
                own_copy = True
        if key_padding_mask is not None:
            # (kv_bsz, src_len): every beam (x) of a sentence (b) shares its padding
            padding = key_padding_mask.view(kv_bsz, 1, 1, 1, src_len).to(torch.bool)
            per_head = logits.view(kv_bsz, -1, self.num_heads, tgt_len, src_len)
            if own_copy:
                per_head.masked_fill_(padding, self.mask_value)
            else:  # one new tensor, never the stream
                logits = per_head.masked_fill(padding, self.mask_value).view_as(attn_scores)
        return torch.softmax(logits, dim=-1)

    def _merge_heads(self, attn: Tensor, tgt_len: int, bsz: int) -> Tensor:
        """``(bsz*heads, tgt_len, head_dim)`` -> output projection ``(tgt_len, bsz, embed_dim)``."""
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, self.embed_dim)
        return self.out_proj(attn)
