"""Transformer layers that thread RealFormer score streams and ADMIN residuals.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).

A layer takes ``prev_attn_scores`` for each of its attention chains and returns its own
``attn_scores`` (``None`` where the chain is off) next to its output: the streams are
explicit arguments and returns, so that fairseq's activation checkpointing and FSDP
wrappers (which wrap ``forward``) recompute them with the layer. Where a chain is off,
the attention module is fairseq's own ``MultiheadAttention`` (fused path and all).

Layers are built from a :class:`RealformerTransformerConfig`: fairseq's
``TransformerConfig`` with the plugin's :class:`~realformer_fairseq.settings.RealformerSettings`
as a declared field, which fairseq's build hooks (``build_self_attention``,
``build_encoder_attention``, called from fairseq's ``__init__``) read. The forwards are
TorchScript-compatible: which branch a layer takes is a constant of the built layer.
"""

import argparse
import dataclasses
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from fairseq.models.transformer import TransformerConfig
from fairseq.modules import TransformerDecoderLayer, TransformerEncoderLayer
from torch import Tensor

from ..errors import RealformerConfigError
from ..settings import RealformerSettings
from .admin import AdminResidual
from .routes import ROUTES, RealformerMultiheadAttention
from .routes.rules import built_route


@dataclasses.dataclass
class RealformerTransformerConfig(TransformerConfig):
    """fairseq's ``TransformerConfig`` plus the plugin's settings (set by the model's
    ``build_model`` from :func:`~realformer_fairseq.settings.read_realformer_settings`)."""

    realformer: Optional[RealformerSettings] = None


def namespace_of(cfg) -> argparse.Namespace:
    """A flat ``Namespace`` copy of a legacy model config (``Namespace`` or ``DictConfig``),
    so that fairseq's ``TransformerConfig.from_namespace`` keeps every key: for a
    ``DictConfig`` it would keep only its own dataclass fields."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg):
        return argparse.Namespace(**OmegaConf.to_container(cfg, resolve=True))
    if isinstance(cfg, Mapping):
        return argparse.Namespace(**cfg)
    return cfg


def realformer_config(args, settings: RealformerSettings) -> RealformerTransformerConfig:
    """The layers' config of a model config ``args`` (``Namespace``, ``DictConfig`` or a
    ``TransformerConfig``; every key kept) with the model's ``settings``."""
    if isinstance(args, RealformerTransformerConfig):
        cfg = args
    else:
        cfg = RealformerTransformerConfig.from_namespace(namespace_of(args))
    cfg.realformer = settings
    return cfg


def settings_of(cfg) -> RealformerSettings:
    """The settings a layer or stack is built with; refuses a config that has none."""
    settings = getattr(cfg, "realformer", None)
    if not isinstance(settings, RealformerSettings):
        raise RealformerConfigError(
            "RealFormer layers are built from a RealformerTransformerConfig with the plugin's "
            "settings: build the model with its build_model (or fairseq's task.build_model)"
        )
    return settings


def build_residual_attention(layer, embed_dim, num_heads, cfg, chain: str, **kwargs):
    """The residual attention module of ``chain`` (``"encoder"``, ``"decoder"`` or
    ``"cross"``): the class :data:`~.routes.ROUTES` names for the route
    :func:`~.routes.rules.built_route` resolves the settings' ``--residual-attention-impl`` to
    on this machine (never a GPU's rule for a ``--cpu`` build), with the arguments fairseq
    0.12.3's layers give their ``MultiheadAttention`` (dropout, quant noise)."""
    settings = settings_of(cfg)
    requested = settings.residual_attention_impl
    route = built_route(requested, chain, settings.cpu)
    return ROUTES[route].for_chain(
        route,
        requested,
        chain,
        settings.cpu,
        embed_dim,
        num_heads,
        residual_attention_mode=settings.residual_attention_mode,
        dropout=cfg.attention_dropout,
        q_noise=layer.quant_noise,
        qn_block_size=layer.quant_noise_block_size,
        **kwargs,
    )


class FeedForwardSublayer:
    """The feed-forward block of fairseq 0.12.3's layers ([pre-LN] -> fc1 -> activation ->
    dropout -> fc2 -> dropout -> residual -> [post-LN]) with the layer's ADMIN residual."""

    def feed_forward_sublayer(self, x: Tensor) -> Tensor:
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


class SelfAttentionSublayer:
    """The self-attention block of fairseq 0.12.3's encoder and decoder layers ([pre-LN] ->
    self-attention -> dropout -> residual -> [post-LN]) with the layer's ADMIN residual and,
    where the chain is residual, the chain's carried values in and out: one call site for
    either route (:class:`RealformerMultiheadAttention` and
    :class:`ConcatRealformerMultiheadAttention` take and return the same values), fairseq's
    own module where the chain is off.

    A chain's carried values stay three explicit tensors (the stream ``attn_scores``, or the
    concat route's ``attn_queries`` / ``attn_keys``), not one structure, at the layers'
    boundary: fairseq's ``checkpoint_wrapper`` (``--checkpoint-activations``) and FSDP
    track the gradients of the tensors a layer takes and returns, not of tensors inside
    other objects."""

    def self_attention_sublayer(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        prev_attn_scores: Optional[Tensor],
        prev_attn_queries: Optional[Tensor],
        prev_attn_keys: Optional[Tensor],
        layer_idx: int,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        """``(x, attn_scores, attn_queries, attn_keys)``; the three are None where the chain
        is off."""
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        attn_scores: Optional[Tensor] = None  # (bsz*heads, tgt_len, src_len)
        attn_queries: Optional[Tensor] = None  # (bsz*heads, tgt_len, (l+1)*head_dim)
        attn_keys: Optional[Tensor] = None  # (bsz*heads, src_len, (l+1)*head_dim)
        if self.residual_self_attention:
            x, _, attn_scores, attn_queries, attn_keys = self.self_attn(
                query=x,
                key=x,
                value=x,
                key_padding_mask=key_padding_mask,
                incremental_state=incremental_state,
                need_weights=False,
                attn_mask=attn_mask,
                prev_attn_scores=prev_attn_scores,
                layer_idx=layer_idx,
                prev_attn_queries=prev_attn_queries,
                prev_attn_keys=prev_attn_keys,
            )
        else:
            x, _ = self.self_attn(
                query=x,
                key=x,
                value=x,
                key_padding_mask=key_padding_mask,
                incremental_state=incremental_state,
                need_weights=False,
                attn_mask=attn_mask,
            )
        x = self.dropout_module(x)
        x = self.self_attn_residual(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        return x, attn_scores, attn_queries, attn_keys


class RealformerEncoderLayer(SelfAttentionSublayer, FeedForwardSublayer, TransformerEncoderLayer):
    """fairseq's :class:`TransformerEncoderLayer` with a residual self-attention chain
    (``"encoder"``) and ADMIN residuals."""

    __constants__ = ["residual_self_attention"]

    def __init__(self, cfg: RealformerTransformerConfig):
        settings = settings_of(cfg)
        super().__init__(cfg)
        self.residual_self_attention = isinstance(self.self_attn, RealformerMultiheadAttention)
        self.self_attn_residual = AdminResidual(self.embed_dim, settings.admin, chain="encoder")
        self.ffn_residual = AdminResidual(self.embed_dim, settings.admin, chain="encoder")

    def build_self_attention(self, embed_dim, cfg):
        if not settings_of(cfg).residual("encoder"):
            return super().build_self_attention(embed_dim, cfg)
        return build_residual_attention(
            self, embed_dim, cfg.encoder.attention_heads, cfg, "encoder",
            self_attention=True,
        )  # fmt: skip

    def forward(
        self,
        x,
        encoder_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
        prev_attn_scores: Optional[Tensor] = None,
        layer_idx: int = 0,
        prev_attn_queries: Optional[Tensor] = None,
        prev_attn_keys: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        """Mirrors fairseq 0.12.3 ``TransformerEncoderLayerBase.forward`` with the score
        chain and ADMIN residuals added (``return_fc`` is not supported).

        Args:
            x: (seq_len, bsz, embed_dim)
            prev_attn_scores: (bsz*heads, seq_len, seq_len) float32, or None
            prev_attn_queries, prev_attn_keys: the chain's concatenated queries and keys
                (concat route), or None

        Returns:
            ``(x, attn_scores, attn_queries, attn_keys)``: what the chain carries on (see
            :class:`ConcatRealformerMultiheadAttention`); all None when the chain is off.
        """
        if attn_mask is not None:
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4
            )
        x, attn_scores, attn_queries, attn_keys = self.self_attention_sublayer(
            x, encoder_padding_mask, attn_mask, None, prev_attn_scores, prev_attn_queries,
            prev_attn_keys, layer_idx,
        )  # fmt: skip
        return self.feed_forward_sublayer(x), attn_scores, attn_queries, attn_keys


class RealformerDecoderLayer(SelfAttentionSublayer, FeedForwardSublayer, TransformerDecoderLayer):
    """fairseq's :class:`TransformerDecoderLayer` with residual self-attention
    (``"decoder"``) and cross-attention (``"cross"``) chains and ADMIN residuals."""

    __constants__ = ["residual_self_attention", "residual_cross_attention"]

    def __init__(
        self,
        cfg: RealformerTransformerConfig,
        no_encoder_attn=False,
        add_bias_kv=False,
        add_zero_attn=False,
    ):
        settings = settings_of(cfg)
        super().__init__(
            cfg,
            no_encoder_attn=no_encoder_attn,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
        )
        self.residual_self_attention = isinstance(self.self_attn, RealformerMultiheadAttention)
        self.residual_cross_attention = isinstance(self.encoder_attn, RealformerMultiheadAttention)
        self.self_attn_residual = AdminResidual(self.embed_dim, settings.admin, chain="decoder")
        self.encoder_attn_residual = (
            AdminResidual(self.embed_dim, settings.admin, chain="decoder")
            if self.encoder_attn is not None
            else None
        )
        self.ffn_residual = AdminResidual(self.embed_dim, settings.admin, chain="decoder")

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if not settings_of(cfg).residual("decoder"):
            return super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn)
        return build_residual_attention(
            self,
            embed_dim,
            cfg.decoder.attention_heads,
            cfg,
            "decoder",
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=True,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        if not settings_of(cfg).residual("cross"):
            return super().build_encoder_attention(embed_dim, cfg)
        return build_residual_attention(
            self,
            embed_dim,
            cfg.decoder.attention_heads,
            cfg,
            "cross",
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
        prev_self_attn_queries: Optional[Tensor] = None,
        prev_self_attn_keys: Optional[Tensor] = None,
        prev_cross_attn_queries: Optional[Tensor] = None,
        prev_cross_attn_keys: Optional[Tensor] = None,
    ) -> Tuple[
        Tensor,
        Optional[Tensor],
        Optional[Tensor],
        Optional[Tensor],
        Optional[Tensor],
        Optional[Tensor],
        Optional[Tensor],
        Optional[Tensor],
    ]:
        """Mirrors fairseq 0.12.3 ``TransformerDecoderLayerBase.forward`` (without
        cross-self-attention, NormFormer scaling, ONNX export and ``prev_self_attn_state``,
        which the model refuses at start-up) with both score streams and ADMIN residuals.

        Args:
            x: (tgt_len, bsz, embed_dim); tgt_len is 1 when decoding incrementally
            prev_self_attn_scores: (bsz*heads, tgt_len, tgt_len) or, per
                incremental step, (bsz*heads, 1, t)
            prev_cross_attn_scores: (bsz*heads, tgt_len, src_len)
            prev_*_attn_queries, prev_*_attn_keys: each chain's concatenated queries and
                keys (concat route, see :class:`ConcatRealformerMultiheadAttention`), or None

        Returns:
            ``(x, attn, self_attn_scores, self_attn_queries, self_attn_keys,
            cross_attn_scores, cross_attn_queries, cross_attn_keys)``: ``attn`` as fairseq's,
            then what each chain carries on (None where a chain is off)
        """
        if need_head_weights:
            need_attn = True
        x, self_attn_scores, self_attn_queries, self_attn_keys = self.self_attention_sublayer(
            x, self_attn_padding_mask, self_attn_mask, incremental_state, prev_self_attn_scores,
            prev_self_attn_queries, prev_self_attn_keys, layer_idx,
        )  # fmt: skip
        attn: Optional[Tensor] = None
        cross_attn_scores: Optional[Tensor] = None  # (bsz*heads, tgt_len, src_len)
        cross_attn_queries: Optional[Tensor] = None
        cross_attn_keys: Optional[Tensor] = None
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.normalize_before:
                assert self.encoder_attn_layer_norm is not None
                x = self.encoder_attn_layer_norm(x)
            need_weights = need_attn or (not self.training and self.need_attn)
            if self.residual_cross_attention:
                x, attn, cross_attn_scores, cross_attn_queries, cross_attn_keys = self.encoder_attn(
                    query=x,
                    key=encoder_out,
                    value=encoder_out,
                    key_padding_mask=encoder_padding_mask,
                    incremental_state=incremental_state,
                    static_kv=True,
                    need_weights=need_weights,
                    need_head_weights=need_head_weights,
                    prev_attn_scores=prev_cross_attn_scores,
                    layer_idx=layer_idx,
                    prev_attn_queries=prev_cross_attn_queries,
                    prev_attn_keys=prev_cross_attn_keys,
                )
            else:
                x, attn = self.encoder_attn(
                    query=x,
                    key=encoder_out,
                    value=encoder_out,
                    key_padding_mask=encoder_padding_mask,
                    incremental_state=incremental_state,
                    static_kv=True,
                    need_weights=need_weights,
                    need_head_weights=need_head_weights,
                )
            x = self.dropout_module(x)
            assert self.encoder_attn_residual is not None
            x = self.encoder_attn_residual(x, residual)
            if not self.normalize_before:
                assert self.encoder_attn_layer_norm is not None
                x = self.encoder_attn_layer_norm(x)
        return (
            self.feed_forward_sublayer(x),
            attn,
            self_attn_scores,
            self_attn_queries,
            self_attn_keys,
            cross_attn_scores,
            cross_attn_queries,
            cross_attn_keys,
        )


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
