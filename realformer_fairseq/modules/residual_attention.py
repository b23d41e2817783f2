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

from typing import Dict, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor

from ..settings import RESIDUAL_ATTENTION_MODES

# Large negative but finite: masked entries still get exactly zero probability,
# while a row whose keys are all masked (a fully padded sequence) softmaxes to a
# uniform row instead of NaN, and its gradient stays finite.
_MASK_VALUE = torch.finfo(torch.float32).min


class RealformerMultiheadAttention(MultiheadAttention):
    """fairseq :class:`MultiheadAttention` with a residual score stream.

    ``forward`` takes ``prev_attn_scores`` (the previous layer's stream,
    ``(bsz * num_heads, tgt_len, src_len)`` float32, or ``None`` for the first
    layer of a chain) and ``layer_idx`` (position in the chain, for the running
    mean) and returns ``(attn, attn_weights, attn_scores)``.

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
    ) -> Tuple[Tensor, Optional[Tensor], Tensor]:
        """Input shape: Time x Batch x Channel (as fairseq).

        Returns ``attn`` (tgt_len, bsz, embed_dim), the attention weights as
        fairseq returns them (or ``None``) and ``attn_scores``, the float32
        running sum of raw scores ``(bsz * num_heads, tgt_len, src_len)``.
        """
        if before_softmax:
            raise ValueError("use the returned attn_scores instead of before_softmax")
        if need_head_weights:
            need_weights = True
        if not torch.jit.is_scripting():
            self._calls[0] += 1

        tgt_len, bsz, embed_dim = query.size()
        assert embed_dim == self.embed_dim, f"query dim {embed_dim} != {self.embed_dim}"

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
        src_len = k.size(1)
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None
        shared_kv = self.encoder_decoder_attention and bsz != kv_bsz

        # raw scores of this layer plus the stream so far: the stream is at least float32
        # (float64 stays float64); the sum is added in place into this layer's fresh product
        if shared_kv:  # as fairseq: beams of one sentence against its keys
            raw_scores = torch.einsum(
                "bxhtd,bhsd->bxhts",
                q.view((kv_bsz, -1, self.num_heads) + q.size()[1:]),
                k.view((kv_bsz, self.num_heads) + k.size()[1:]),
            )
            raw_scores = raw_scores.reshape((-1,) + raw_scores.size()[-2:])
        else:
            raw_scores = torch.bmm(q, k.transpose(1, 2))  # (bsz*heads, tgt_len, src_len)
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

        attn_weights_float = torch.softmax(logits, dim=-1)
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
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, self.embed_dim)
        attn = self.out_proj(attn)

        attn_weights: Optional[Tensor] = None
        if need_weights:
            attn_weights = attn_weights_float.view(bsz, self.num_heads, tgt_len, src_len).transpose(
                1, 0
            )
            if not need_head_weights:
                attn_weights = attn_weights.mean(dim=0)  # average over heads
        return attn, attn_weights, attn_scores
