"""Transformer layers that thread RealFormer score streams and ADMIN residuals.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).

A layer takes ``prev_attn_scores`` for each of its attention chains and returns
its own ``attn_scores`` (``None`` where the chain is off). Where a chain is off,
the attention module is fairseq's own ``MultiheadAttention`` (fused path and all).
"""

from typing import Dict, List, Optional, Tuple

import torch
from fairseq import utils
from fairseq.models.transformer import TransformerConfig
from fairseq.modules import TransformerDecoderLayer, TransformerEncoderLayer
from torch import Tensor

from ..errors import RealformerConfigError
from ..settings import RESIDUAL_CHAINS, parse_residual_chains  # noqa: F401 (re-exported)
from .admin import AdminResidual
from .residual_attention import RealformerMultiheadAttention


class RealformerSublayers:
    """The sublayer blocks shared by the encoder and decoder layers (fairseq
    0.12.3's order: [pre-LN] -> block -> dropout -> residual -> [post-LN])."""

    def build_residual_attention(self, embed_dim, num_heads, cfg, **kwargs):
        return RealformerMultiheadAttention(
            embed_dim,
            num_heads,
            residual_attention_mode=self.residual_attention_mode,
            dropout=cfg.attention_dropout,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            **kwargs,
        )

    def attention_sublayer(
        self,
        x: Tensor,
        attention,
        layer_norm,
        residual_connection,
        prev_attn_scores: Optional[Tensor],
        layer_idx: int,
        memory: Optional[Tensor] = None,
        **kwargs,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """Attend to ``memory`` (the encoder output), or to ``x`` itself when it
        is None. Returns ``(x, attn_weights, attn_scores)``; ``attn_scores`` is
        None where ``attention`` is fairseq's own module (chain off)."""
        residual = x
        if self.normalize_before:
            x = layer_norm(x)
        kv = x if memory is None else memory
        if isinstance(attention, RealformerMultiheadAttention):
            x, attn_weights, attn_scores = attention(
                query=x,
                key=kv,
                value=kv,
                prev_attn_scores=prev_attn_scores,
                layer_idx=layer_idx,
                **kwargs,
            )
        else:
            (x, attn_weights), attn_scores = attention(query=x, key=kv, value=kv, **kwargs), None
        x = self.dropout_module(x)
        x = residual_connection(x, residual)
        if not self.normalize_before:
            x = layer_norm(x)
        return x, attn_weights, attn_scores

    def ffn_sublayer(self, x: Tensor) -> Tensor:
        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.activation_fn(self.fc1(x))
        x = self.activation_dropout_module(x)
        x = self.fc2(x)
        x = self.dropout_module(x)
        x = self.ffn_residual(x, residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x


class RealformerEncoderLayer(RealformerSublayers, TransformerEncoderLayer):
    """Encoder layer with a residual self-attention chain (``"encoder"``) and
    ADMIN residuals, built on fairseq's :class:`TransformerEncoderLayer`."""

    def __init__(
        self,
        args,
        *,
        residual_self_attention: bool,
        residual_attention_mode: Optional[str],
        admin: bool,
    ):
        """``args``: fairseq's layer config; the plugin's switches are explicit
        (the encoder passes them from its :class:`RealformerSettings`)."""
        # read by build_self_attention, which fairseq's __init__ calls
        self.residual_self_attention = residual_self_attention
        self.residual_attention_mode = residual_attention_mode
        super().__init__(args)
        self.self_attn_residual = AdminResidual(self.embed_dim, admin, chain="encoder")
        self.ffn_residual = AdminResidual(self.embed_dim, admin, chain="encoder")

    def build_self_attention(self, embed_dim, args):
        if not self.residual_self_attention:
            return super().build_self_attention(embed_dim, args)
        cfg = TransformerConfig.from_namespace(args)
        return self.build_residual_attention(
            embed_dim, cfg.encoder.attention_heads, cfg, self_attention=True
        )

    def forward(
        self,
        x,
        encoder_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
        prev_attn_scores: Optional[Tensor] = None,
        layer_idx: int = 0,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Mirrors fairseq 0.12.3 ``TransformerEncoderLayerBase.forward`` with the
        score stream and ADMIN residuals added.

        Args:
            x: (seq_len, bsz, embed_dim)
            prev_attn_scores: (bsz*heads, seq_len, seq_len) float32, or None

        Returns:
            ``(x, attn_scores)``; ``attn_scores`` is None when the chain is off.
        """
        if attn_mask is not None:
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4
            )
        x, _, attn_scores = self.attention_sublayer(
            x,
            self.self_attn,
            self.self_attn_layer_norm,
            self.self_attn_residual,
            prev_attn_scores,
            layer_idx,
            key_padding_mask=encoder_padding_mask,
            need_weights=False,
            attn_mask=attn_mask,
        )
        return self.ffn_sublayer(x), attn_scores


class RealformerDecoderLayer(RealformerSublayers, TransformerDecoderLayer):
    """Decoder layer with residual self-attention (``"decoder"``) and
    cross-attention (``"cross"``) chains and ADMIN residuals."""

    def __init__(
        self,
        args,
        no_encoder_attn=False,
        add_bias_kv=False,
        add_zero_attn=False,
        *,
        residual_self_attention: bool,
        residual_cross_attention: bool,
        residual_attention_mode: Optional[str],
        admin: bool,
    ):
        """``args`` and the first three: as fairseq's layer; the plugin's switches
        are explicit (the decoder passes them from its :class:`RealformerSettings`)."""
        self.residual_self_attention = residual_self_attention
        self.residual_cross_attention = residual_cross_attention
        self.residual_attention_mode = residual_attention_mode
        for flag in (
            "cross_self_attention",
            "scale_attn",
            "scale_heads",
            "scale_fc",
            "scale_resids",
        ):
            if utils.safe_getattr(args, flag, False):
                raise RealformerConfigError(
                    f"realformer decoder layers do not support --{flag.replace('_', '-')}"
                )
        super().__init__(
            args,
            no_encoder_attn=no_encoder_attn,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
        )
        self.self_attn_residual = AdminResidual(self.embed_dim, admin, chain="decoder")
        self.encoder_attn_residual = (
            AdminResidual(self.embed_dim, admin, chain="decoder")
            if self.encoder_attn is not None
            else None
        )
        self.ffn_residual = AdminResidual(self.embed_dim, admin, chain="decoder")

    def build_self_attention(self, embed_dim, args, add_bias_kv=False, add_zero_attn=False):
        if not self.residual_self_attention:
            return super().build_self_attention(embed_dim, args, add_bias_kv, add_zero_attn)
        cfg = TransformerConfig.from_namespace(args)
        return self.build_residual_attention(
            embed_dim,
            cfg.decoder.attention_heads,
            cfg,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=True,
        )

    def build_encoder_attention(self, embed_dim, args):
        if not self.residual_cross_attention:
            return super().build_encoder_attention(embed_dim, args)
        cfg = TransformerConfig.from_namespace(args)
        return self.build_residual_attention(
            embed_dim,
            cfg.decoder.attention_heads,
            cfg,
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            encoder_decoder_attention=True,
        )

    def forward(
        self,
        x,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
        prev_self_attn_scores: Optional[Tensor] = None,
        prev_cross_attn_scores: Optional[Tensor] = None,
        layer_idx: int = 0,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        """Mirrors fairseq 0.12.3 ``TransformerDecoderLayerBase.forward`` (without
        cross-self-attention, NormFormer scaling, ONNX export and
        ``prev_self_attn_state``) with both score streams and ADMIN residuals.

        Args:
            x: (tgt_len, bsz, embed_dim); tgt_len is 1 when decoding incrementally
            prev_self_attn_scores: (bsz*heads, tgt_len, tgt_len) or, per
                incremental step, (bsz*heads, 1, t)
            prev_cross_attn_scores: (bsz*heads, tgt_len, src_len)

        Returns:
            ``(x, attn, self_attn_scores, cross_attn_scores)``
        """
        if need_head_weights:
            need_attn = True
        x, _, self_attn_scores = self.attention_sublayer(
            x,
            self.self_attn,
            self.self_attn_layer_norm,
            self.self_attn_residual,
            prev_self_attn_scores,
            layer_idx,
            key_padding_mask=self_attn_padding_mask,
            incremental_state=incremental_state,
            need_weights=False,
            attn_mask=self_attn_mask,
        )
        attn: Optional[Tensor] = None
        cross_attn_scores: Optional[Tensor] = None
        if self.encoder_attn is not None and encoder_out is not None:
            x, attn, cross_attn_scores = self.attention_sublayer(
                x,
                self.encoder_attn,
                self.encoder_attn_layer_norm,
                self.encoder_attn_residual,
                prev_cross_attn_scores,
                layer_idx,
                memory=encoder_out,
                key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state,
                static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights,
            )
        return self.ffn_sublayer(x), attn, self_attn_scores, cross_attn_scores


def every_layer(layers: torch.nn.ModuleList) -> List[torch.nn.Module]:
    """All layers of a layer list, by index. Iterating fairseq's LayerDropModuleList
    (``--*-layerdrop``) in training mode, as a freshly built model is, would skip
    some layers at random and draw random numbers that fairseq's own build does not."""
    return [layers[i] for i in range(len(layers))]


def check_chain_heads(layers: List[torch.nn.Module], attr: str, chain: str):
    """All layers of one residual chain must have the same number of heads."""
    layers = every_layer(layers)
    heads = [
        getattr(layer, attr).num_heads for layer in layers if getattr(layer, attr, None) is not None
    ]
    if len(set(heads)) > 1:
        raise RealformerConfigError(
            f"residual attention chain '{chain}' needs the same number of heads in "
            f"every layer, got {heads}"
        )
