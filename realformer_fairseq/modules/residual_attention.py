"""Residual multi-head attention (RealFormer).

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention".
Findings of ACL 2021 (arXiv 2012.11747), section 3.2 and appendix A.2.

Layer ``l`` of a chain computes raw scores ``S_l = Q_l K_l^T / sqrt(d) + S_{l-1}``
(per head, ``S_{-1} = 0``), attends with ``softmax(S_l + mask)`` and hands ``S_l``
on to layer ``l + 1``. With the running mean, the softmax input is
``S_l / (l + 1)`` while the stream handed on stays the running *sum*.

Masks are added to a copy of the scores that only feeds the softmax: the stream
carries the raw, unmasked sum, always in float32 (a 60-layer sum of half-precision
scores overflows or loses precision).
"""

import logging
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor

from ..settings import RESIDUAL_ATTENTION_MODES
from . import route_warnings
from .kept_stream import kept_stream_attention, warn_once, why_plain_route
from .route_rules import ConcatRule

logger = logging.getLogger(__name__)

# The fill of masked logits, on both routes and every kernel (float32, float64, bfloat16):
# large negative but finite, so masked entries get exactly zero probability, while a row whose
# keys are all masked (a fully padded sequence) softmaxes to a uniform row (the mean of the
# values) instead of NaN, with finite gradients. Not torch.finfo(float32).min: PyTorch's fused
# CUDA kernels (memory-efficient, cuDNN) scale the masked logits by log2(e) inside, which turns
# finfo.min into -inf, and a fully masked row into -inf - (-inf) (the concat route then
# returned zeros for fully padded sequences on an H200, issue 35). 1e30 is far above any score
# (a 60-layer sum stays below 1e6, absorbed: ulp(1e30) is 7.6e22) and far below overflow.
# fp16 cannot hold it: the concat route's fp16 fill is finfo(float16).min, whose rows it
# handles itself (see ConcatRealformerMultiheadAttention).
_MASK_VALUE = -1e30


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

    ``calls`` counts forwards through this path; tests use it to prove that the
    residual path ran.
    """

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
        # True: this module's eager route keeps one stream per chain for backward and rebuilds
        # the earlier ones (modules/kept_stream.py); off by default, and why: docs/reference.md,
        # "The eager route's kept stream (off)"
        self.kept_stream = False
        self.mask_value = _MASK_VALUE  # an attribute: TorchScript reads no module globals
        # a list, not an int attribute: assigning to a Module attribute goes through
        # nn.Module.__setattr__, a measurable cost per incremental decoding step
        self._calls = [0]

    @property
    def calls(self) -> int:
        return self._calls[0]

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
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        """Input shape: Time x Batch x Channel (as fairseq).

        Returns ``attn`` (tgt_len, bsz, embed_dim), the attention weights as
        fairseq returns them (or ``None``), ``attn_scores``, the float32
        running sum of raw scores ``(bsz * num_heads, tgt_len, src_len)``, and None, None
        (the concat route's queries and keys, which this route never carries).
        """
        if prev_attn_queries is not None or prev_attn_keys is not None:
            raise ValueError("the eager route carries no concatenated queries and keys")
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
        return self._eager_route(
            q, k, v, prev_attn_scores, key_padding_mask, attn_mask, bsz, kv_bsz, layer_idx,
            need_weights, need_head_weights,
        )  # fmt: skip

    def _eager_route(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        prev_attn_scores: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        bsz: int,
        kv_bsz: int,
        layer_idx: int,
        need_weights: bool,
        need_head_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        """The eager route from the projected heads on: this layer's raw scores added to the
        stream, the masked softmax, the values and the output projection; the five values of
        ``forward`` (the queries and keys None). Autograd keeps each layer's probabilities;
        where ``kept_stream`` is set (off by default), the chain keeps one stream for
        backward instead (:mod:`~realformer_fairseq.modules.kept_stream`), except where a
        reason it says once keeps the plain route."""
        if not torch.jit.is_scripting():
            if self.kept_stream:
                kept = self._kept_stream_route(
                    q, k, v, prev_attn_scores, key_padding_mask, attn_mask, bsz, kv_bsz,
                    layer_idx, need_weights, need_head_weights,
                )  # fmt: skip
                if kept is not None:
                    return kept[0], kept[1], kept[2], None, None
        raw_scores = self._raw_scores(q, k, bsz, kv_bsz)
        attn_scores = self._add_to_stream(raw_scores, prev_attn_scores)
        attn, attn_weights = self._attend_stream(
            attn_scores, raw_scores, v, key_padding_mask, attn_mask, bsz, kv_bsz, layer_idx,
            need_weights, need_head_weights,
        )  # fmt: skip
        return attn, attn_weights, attn_scores, None, None

    @torch.jit.unused
    def _kept_stream_route(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        prev_attn_scores: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        bsz: int,
        kv_bsz: int,
        layer_idx: int,
        need_weights: bool,
        need_head_weights: bool,
    ) -> Optional[Tuple[Tensor, Optional[Tensor], Tensor]]:
        """``(attn, attn_weights, attn_scores)`` of the eager route with the chain's one kept
        stream, or None where the plain route runs (the reason said once where a gradient is
        wanted)."""
        tensors = [q, k, v, prev_attn_scores]
        reason = why_plain_route(self, tensors, attn_mask, bsz, kv_bsz)
        if reason is not None:
            if reason:
                warn_once(reason)
            return None
        attn, attn_scores, probabilities = kept_stream_attention(
            self, q, k, v, prev_attn_scores, key_padding_mask, attn_mask, layer_idx
        )
        tgt_len, src_len = attn_scores.size(1), attn_scores.size(2)
        attn_weights: Optional[Tensor] = None
        if need_weights:
            attn_weights = self._weights_as_fairseq(
                probabilities, bsz, tgt_len, src_len, need_head_weights
            )
        return self._merge_heads(attn, tgt_len, bsz), attn_weights, attn_scores

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

    def _raw_scores(self, q: Tensor, k: Tensor, bsz: int, kv_bsz: int) -> Tensor:
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

    def _add_to_stream(self, raw_scores: Tensor, prev_attn_scores: Optional[Tensor]) -> Tensor:
        """This layer's raw scores plus the stream so far: the stream is at least float32
        (float64 stays float64); the sum is added in place into this layer's fresh product
        (autograd keeps ``q`` and ``k`` for the product's backward, not the product)."""
        attn_scores = raw_scores
        if raw_scores.dtype != torch.float32 and raw_scores.dtype != torch.float64:
            attn_scores = raw_scores.float()
        if prev_attn_scores is not None:
            if prev_attn_scores.shape != attn_scores.shape:
                raise ValueError(
                    "residual attention chain mismatch: previous layer scores "
                    + str(list(prev_attn_scores.shape))
                    + " vs this layer's "
                    + str(list(attn_scores.shape))
                    + " (bsz*heads, tgt_len, src_len); "
                    + "all layers of a chain need the same number of heads"
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
        attn, attn_weights_float = self._attend_heads(
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

    def _attend_heads(
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


# torch's SDPBackend numbering, as torch._fused_sdp_choice returns it
_SDPA_KERNELS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


class ConcatRealformerMultiheadAttention(RealformerMultiheadAttention):
    """The same residual attention, computed without the score stream where it pays.

    Layer ``l``'s softmax input is ``S_l = sum_{i<=l} Q_i K_i^T / sqrt(d)`` (divided by
    ``l + 1`` for the running mean), which is ``[Q_0 .. Q_l] [K_0 .. K_l]^T / sqrt(d)``: one
    attention over the queries and keys of this and all earlier layers of the chain,
    concatenated along the head dimension. So ``softmax(S_l + mask) V_l`` is
    ``F.scaled_dot_product_attention(cat(Q_0..Q_l), cat(K_0..K_l), V_l, scale=1 [/(l+1)])``,
    which runs in PyTorch's fused kernels and never forms a ``T x T`` tensor. Its ``q k``
    part is ``l + 1`` times wider than one layer's, so it pays at long lengths and shallow
    depth; with ``residual_attention_impl="auto"`` the layers a measured rule names run fused
    (:mod:`~realformer_fairseq.modules.route_rules`; ``auto`` builds this class only on a
    machine such a rule matches, the plain eager module elsewhere).

    A chain is in one of two phases, carried from layer to layer by what ``forward`` returns:

    * **concat**: ``attn_queries`` / ``attn_keys`` are the chain's concatenated scaled
      queries ``(bsz*heads, tgt_len, (l+1)*head_dim)`` and keys ``(kv_bsz*heads, src_len,
      (l+1)*head_dim)``; ``attn_scores`` is None. The stream they stand for is
      ``stream_of(attn_queries, attn_keys)``.
    * **eager**: from the first layer that cannot or should not run fused (``need_weights``,
      attention dropout on CPU, a mask that needs a gradient, no fused kernel for the shapes,
      or ``auto`` finding eager faster), the stream is formed once from the concatenated
      parts, in the eager route's order and dtype (per layer product, float32 at least, added
      in layer order), and the chain continues exactly as the eager route: ``attn_scores``
      is the stream, the queries and keys are None.

    Every switch of kernel is logged at debug level (``realformer_fairseq.modules.
    residual_attention``), with the reason; with an explicit ``concat``, a reason that keeps
    a call from fusing is also logged once per process at WARNING. Masks are additive float
    masks with the eager route's finite fill. A row whose keys are all masked (a fully padded
    sequence) yields the mean of the values, as in the eager route, on every kernel: the
    module sets such rows itself after the fused call (in fp16, whose fill cannot absorb the
    scores, the kernel alone would give the softmax of the scores; a kernel that treats a fill
    as -inf would give zeros). With attention dropout on CUDA the fused kernel draws its own
    dropout mask (the same distribution as the eager route's, not the same draw).
    """

    def __init__(
        self,
        embed_dim,
        num_heads,
        residual_attention_mode: str,
        residual_attention_impl: str = "concat",
        rule: Optional[ConcatRule] = None,
        **kwargs,
    ):
        if residual_attention_impl not in ("concat", "auto"):
            raise ValueError(
                "ConcatRealformerMultiheadAttention computes the 'concat' and 'auto' routes, "
                f"got {residual_attention_impl!r} (the eager route is RealformerMultiheadAttention)"
            )
        if (residual_attention_impl == "auto") != (rule is not None):
            raise ValueError("the auto route needs its measured rule, the concat route none")
        super().__init__(embed_dim, num_heads, residual_attention_mode, **kwargs)
        self.residual_attention_impl = residual_attention_impl
        self.fp16_mask_value = float(torch.finfo(torch.float16).min)
        # auto's rule (route_rules.ConcatRule) as plain attributes, for TorchScript: the
        # first ``auto_depth`` layers of the chain run fused on CUDA in the measured dtypes,
        # on keys at least ``auto_min_length`` long
        self.auto_depth = rule.depth if rule is not None else 0
        self.auto_min_length = rule.min_length if rule is not None else 0
        self.auto_fp16 = rule is not None and torch.float16 in rule.dtypes
        self.auto_bf16 = rule is not None and torch.bfloat16 in rule.dtypes
        self.auto_float32 = rule is not None and torch.float32 in rule.dtypes
        # the last kernel logged, in a list for the same reason as _calls
        self._last_kernel = [""]

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
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        """As :meth:`RealformerMultiheadAttention.forward`, with the concat phase's carried
        queries and keys in and out: returns ``(attn, attn_weights, attn_scores,
        attn_queries, attn_keys)``, where either ``attn_scores`` (eager phase) or
        ``attn_queries`` and ``attn_keys`` (concat phase) are set."""
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
        if prev_attn_scores is not None:  # the chain is in its eager phase
            if not torch.jit.is_scripting():
                self._last_kernel[0] = "eager, the chain's stream"
            return self._eager_route(
                q, k, v, prev_attn_scores, key_padding_mask, attn_mask, bsz, kv_bsz, layer_idx,
                need_weights, need_head_weights,
            )  # fmt: skip

        queries = q if prev_attn_queries is None else torch.cat([prev_attn_queries, q], dim=-1)
        keys = k if prev_attn_keys is None else torch.cat([prev_attn_keys, k], dim=-1)
        src_len = k.size(1)
        dropout_p = 0.0
        if self.training or self.dropout_module.apply_during_inference:
            dropout_p = self.dropout_module.p
        reason = self._why_not_fused(
            q, bsz, kv_bsz, src_len, layer_idx, need_weights, attn_mask, dropout_p
        )
        fill = self.mask_value
        if q.dtype == torch.float16:
            fill = self.fp16_mask_value
        kernel = -1
        mask: Optional[Tensor] = None
        q4, k4, v4 = queries, keys, v
        if reason == "":
            mask = self._additive_mask(
                key_padding_mask, attn_mask, kv_bsz, tgt_len, src_len, q, fill
            )
            q4, k4, v4 = self._heads_first(queries, keys, v, bsz, kv_bsz, tgt_len)
            scale = 1.0 / float(layer_idx + 1) if self.residual_attention_mode == "mean" else 1.0
            kernel = torch._fused_sdp_choice(q4, k4, v4, mask, dropout_p, False, scale=scale)
            if kernel <= 0 and v4.size(-1) != q4.size(-1):
                # kernels that need one head size for q, k and v (flash; all of them on CPU):
                # zeros in front of the values, whose share of the output is then dropped
                v4 = F.pad(v4, (q4.size(-1) - v4.size(-1), 0))
                kernel = torch._fused_sdp_choice(q4, k4, v4, mask, dropout_p, False, scale=scale)
            if kernel <= 0:
                reason = "no fused kernel for these shapes and dtype (SDPA would use math)"
        if reason != "":
            if not torch.jit.is_scripting():
                self._log_kernel(-1, reason, layer_idx)
            raw_scores, attn_scores = self._stream_of_parts(queries, keys, q, k, bsz, kv_bsz)
            attn, attn_weights = self._attend_stream(
                attn_scores, raw_scores, v, key_padding_mask, attn_mask, bsz, kv_bsz, layer_idx,
                need_weights, need_head_weights,
            )  # fmt: skip
            return attn, attn_weights, attn_scores, None, None

        if not torch.jit.is_scripting():
            self._log_kernel(kernel, "", layer_idx)
        scale = 1.0 / float(layer_idx + 1) if self.residual_attention_mode == "mean" else 1.0
        out = F.scaled_dot_product_attention(
            q4, k4, v4, attn_mask=mask, dropout_p=dropout_p, scale=scale
        )
        head_dim = v.size(-1)
        out = out[..., out.size(-1) - head_dim :]
        if mask is not None:
            out = self._fully_masked_rows_as_eager(
                out, mask, fill, v4[..., v4.size(-1) - head_dim :]
            )
        attn = self._heads_back(out, bsz, kv_bsz, tgt_len)
        return self._merge_heads(attn, tgt_len, bsz), None, None, queries, keys

    def _fully_masked_rows_as_eager(
        self, out: Tensor, mask: Tensor, fill: float, v4: Tensor
    ) -> Tensor:
        """Rows whose keys are all masked get the eager route's result, the uniform average of
        the values ``v4`` ``(batch, heads, src_len, head_dim)``, whatever the kernel made of
        them (see the class docstring); ``out`` is ``(batch, heads, tgt_len, head_dim)``."""
        fully_masked = (mask <= fill).all(dim=-1, keepdim=True)
        return torch.where(fully_masked, v4.mean(-2, True), out)

    def auto_runs_fused(self, layer_idx: int, src_len: int, q: Tensor) -> bool:
        """``auto``'s measured rule (:mod:`~realformer_fairseq.modules.route_rules`): layer
        ``layer_idx`` runs fused on CUDA, in a measured dtype, on keys at least
        ``auto_min_length`` long, for the first ``auto_depth`` layers of the chain."""
        if q.device.type != "cuda" or layer_idx >= self.auto_depth:
            return False
        if src_len < self.auto_min_length:
            return False
        if q.dtype == torch.float16:
            return self.auto_fp16
        if q.dtype == torch.bfloat16:
            return self.auto_bf16
        return q.dtype == torch.float32 and self.auto_float32

    def _why_not_fused(
        self,
        q: Tensor,
        bsz: int,
        kv_bsz: int,
        src_len: int,
        layer_idx: int,
        need_weights: bool,
        attn_mask: Optional[Tensor],
        dropout_p: float,
    ) -> str:
        """Why this call runs the eager route ("" where the fused attention may run)."""
        if need_weights:
            return "the attention probabilities are asked for (need_weights)"
        if dropout_p > 0.0 and q.device.type == "cpu":
            return "attention dropout on CPU (no fused CPU kernel draws it)"
        if attn_mask is not None and attn_mask.requires_grad:
            return "the attention mask needs a gradient"
        if attn_mask is not None and bsz != kv_bsz:
            return "an attention mask with keys shared by the beams"
        if self.residual_attention_impl == "auto" and not self.auto_runs_fused(
            layer_idx, src_len, q
        ):
            return "auto: its measured rule runs the eager route here"
        return ""

    def _additive_mask(
        self,
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        kv_bsz: int,
        tgt_len: int,
        src_len: int,
        q: Tensor,
        fill: float,
    ) -> Optional[Tensor]:
        """The eager route's masks as one additive mask in ``q``'s dtype, broadcastable to
        ``(kv_bsz, heads, tgt_len, src_len)``: the attention mask clamped at ``fill``, and
        ``fill`` at padded keys (the eager route's finite fill; fp16's own minimum in fp16)."""
        mask: Optional[Tensor] = None
        if attn_mask is not None:
            mask = attn_mask.to(q.dtype).clamp(min=fill).view(1, 1, tgt_len, src_len)
        if key_padding_mask is not None:
            padding = key_padding_mask.view(kv_bsz, 1, 1, src_len).to(torch.bool)
            if mask is None:
                mask = torch.zeros(
                    (kv_bsz, 1, 1, src_len), dtype=q.dtype, device=q.device
                ).masked_fill(padding, fill)
            else:
                mask = mask.masked_fill(padding, fill)
        return mask

    def _heads_first(
        self, queries: Tensor, keys: Tensor, v: Tensor, bsz: int, kv_bsz: int, tgt_len: int
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """``(batch, heads, len, dim)`` views for SDPA; where the beams of a sentence share
        its keys, their queries are laid out one after another along the query axis."""
        width = queries.size(-1)
        k4 = keys.view(kv_bsz, self.num_heads, -1, width)
        v4 = v.view(kv_bsz, self.num_heads, -1, v.size(-1))
        if bsz != kv_bsz:
            q4 = queries.view(kv_bsz, -1, self.num_heads, tgt_len, width).transpose(1, 2)
            q4 = q4.reshape(kv_bsz, self.num_heads, -1, width)
        else:
            q4 = queries.view(bsz, self.num_heads, tgt_len, width)
        return q4, k4, v4

    def _heads_back(self, out: Tensor, bsz: int, kv_bsz: int, tgt_len: int) -> Tensor:
        """SDPA's output back to ``(bsz*heads, tgt_len, head_dim)``."""
        head_dim = out.size(-1)
        if bsz != kv_bsz:
            out = out.reshape(kv_bsz, self.num_heads, -1, tgt_len, head_dim).transpose(1, 2)
        return out.reshape(bsz * self.num_heads, tgt_len, head_dim)

    def _stream_of_parts(
        self, queries: Tensor, keys: Tensor, q: Tensor, k: Tensor, bsz: int, kv_bsz: int
    ) -> Tuple[Tensor, Tensor]:
        """This layer's raw scores and the stream ``queries keys^T``, computed as the eager
        route computes it: each layer's product (its own head-size slice), at least float32,
        added in layer order."""
        stream: Optional[Tensor] = None
        d = self.head_dim
        for i in range(queries.size(-1) // d - 1):
            raw = self._raw_scores(
                queries[:, :, i * d : (i + 1) * d], keys[:, :, i * d : (i + 1) * d], bsz, kv_bsz
            )
            stream = self._add_to_stream(raw, stream)
        raw_scores = self._raw_scores(q, k, bsz, kv_bsz)
        return raw_scores, self._add_to_stream(raw_scores, stream)

    @torch.jit.unused
    def _log_kernel(self, kernel: int, reason: str, layer_idx: int):
        """One debug line each time this module's kernel (or the reason for eager) changes:
        ``kernel`` is torch's SDPA backend number, ``-1`` with a ``reason`` for eager."""
        what = f"eager, because {reason}" if reason else f"fused SDPA, {_SDPA_KERNELS[kernel]}"
        if what != self._last_kernel[0]:
            self._last_kernel[0] = what
            logger.debug(
                "residual attention, %s route, layer %d of its chain: %s",
                self.residual_attention_impl, layer_idx, what,
            )  # fmt: skip
        if reason and self.residual_attention_impl == "concat":
            route_warnings.warn_once(
                logger, "--residual-attention-impl concat: runs the eager route where %s", reason
            )

    @property
    def last_kernel(self) -> str:
        """What the last forward ran (``"fused SDPA, flash"``, ``"eager, because ..."``)."""
        return self._last_kernel[0]


def stream_of(attn_queries: Tensor, attn_keys: Tensor) -> Tensor:
    """The stream a concat-phase chain stands for, ``(bsz*heads, tgt_len, src_len)``: the
    running sum of the scaled raw scores of every layer so far (float64 in, float64 out).
    For tests and tools; the module itself never forms it in the concat phase."""
    return torch.bmm(attn_queries, attn_keys.transpose(1, 2))
