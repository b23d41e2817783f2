"""RealFormer encoder-decoder transformer with ADMIN initialisation for fairseq.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention"
(arXiv 2012.11747); Liu et al. "Understanding the Difficulty of Training
Transformers" (arXiv 2004.08249) and "Very Deep Transformers for NMT" (2008.07772).

Three separate residual score chains: encoder self-attention (``encoder``),
decoder self-attention (``decoder``) and decoder cross-attention (``cross``).
"""

import contextlib
import logging
from typing import Dict, List, Optional

import torch
from fairseq import utils
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model
from fairseq.models.transformer import TransformerDecoder, TransformerEncoder, TransformerModel
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from omegaconf import OmegaConf, open_dict
from torch import Tensor

from ..errors import one_line_under_fairseq_commands
from ..modules.admin import AdminProfilingMixin
from ..modules.dropout_names import RetainDropoutNamesMixin
from ..modules.realformer_layer import (
    RealformerDecoderLayer,
    RealformerEncoderLayer,
    RealformerTransformerConfig,
    check_chain_heads,
    every_layer,
    realformer_config,
    settings_of,
)
from ..settings import RESIDUAL_CHAINS, add_realformer_args
from .architectures import register_family_architectures, register_family_base_architecture
from .build_checks import arch_label, check_layers_match_settings, settings_for_build
from .checkpoint_guard import ArchCheckedLoadMixin
from .supported_flags import refuse_unsupported_task

logger = logging.getLogger(__name__)


def _wrap_layer(layer, args):
    """fairseq's activation checkpointing / FSDP wrapping of a layer (as in
    ``TransformerEncoderBase.build_encoder_layer``)."""
    checkpoint = utils.safe_getattr(args, "checkpoint_activations", False)
    if checkpoint:
        layer = checkpoint_wrapper(
            layer, offload_to_cpu=utils.safe_getattr(args, "offload_activations", False)
        )
    min_params_to_wrap = (
        utils.safe_getattr(args, "min_params_to_wrap", 1e8) if not checkpoint else 0
    )
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class RealformerTransformerEncoder(TransformerEncoder):
    """fairseq :class:`TransformerEncoder` whose layer loop threads the
    encoder self-attention score stream.

    ``cfg`` is a :class:`RealformerTransformerConfig` (fairseq's config plus the plugin's
    settings, made by the model's ``build_model`` with ``realformer_config``)."""

    def __init__(self, cfg: RealformerTransformerConfig, dictionary, embed_tokens):
        settings_of(cfg)  # refuse a config without the plugin's settings, before building
        super().__init__(cfg, dictionary, embed_tokens)
        check_chain_heads(self.layers, "self_attn", "encoder")

    def build_encoder_layer(self, cfg):
        return _wrap_layer(RealformerEncoderLayer(cfg), cfg)

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[torch.Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[torch.Tensor] = None,
    ):
        """Mirrors fairseq 0.12.3 ``TransformerEncoderBase.forward_scriptable``;
        the layer loop passes ``prev_attn_scores`` from layer to layer."""
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = encoder_padding_mask.any()

        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        # account for padding while computing the representation
        x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x) * has_pads.type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        encoder_states = [x] if return_all_hiddens else []
        attn_scores: Optional[Tensor] = None  # (bsz*heads, src_len, src_len)
        for idx, layer in enumerate(self.layers):
            x, attn_scores = layer(
                x,
                encoder_padding_mask=encoder_padding_mask if has_pads else None,
                prev_attn_scores=attn_scores,
                layer_idx=idx,
            )
            if return_all_hiddens:
                encoder_states.append(x)

        if self.layer_norm is not None:
            x = self.layer_norm(x)

        src_lengths = (
            src_tokens.ne(self.padding_idx)
            .sum(dim=1, dtype=torch.int32)
            .reshape(-1, 1)
            .contiguous()
        )
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [encoder_padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


class RealformerTransformerDecoder(TransformerDecoder):
    """fairseq :class:`TransformerDecoder` whose layer loop threads the decoder
    self-attention and cross-attention score streams.

    Incremental decoding needs no extra state: at step t the self-attention
    stream is the new query row ``(bsz*heads, 1, t)`` and the cross-attention
    stream ``(bsz*heads, 1, src_len)``; both are recomputed layer by layer from
    the cached keys, so beam reordering is fairseq's own.
    """

    def __init__(
        self,
        cfg: RealformerTransformerConfig,
        dictionary,
        embed_tokens,
        no_encoder_attn=False,
        output_projection=None,
    ):
        settings_of(cfg)  # refuse a config without the plugin's settings, before building
        super().__init__(
            cfg,
            dictionary,
            embed_tokens,
            no_encoder_attn=no_encoder_attn,
            output_projection=output_projection,
        )
        check_chain_heads(self.layers, "self_attn", "decoder")
        check_chain_heads(self.layers, "encoder_attn", "cross")

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(RealformerDecoderLayer(cfg, no_encoder_attn), cfg)

    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        """Mirrors fairseq 0.12.3 ``TransformerDecoderBase.extract_features_scriptable``
        (without cross-self-attention); the layer loop passes both streams on."""
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1

        enc: Optional[Tensor] = None
        padding_mask: Optional[Tensor] = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(
                prev_output_tokens, incremental_state=incremental_state
            )
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]

        prev_output_tokens = prev_output_tokens.contiguous()
        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x += positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        self_attn_padding_mask: Optional[Tensor] = None
        if prev_output_tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        self_attn_scores: Optional[Tensor] = None  # (bsz*heads, tgt_len, tgt_len)
        cross_attn_scores: Optional[Tensor] = None  # (bsz*heads, tgt_len, src_len)
        for idx, layer in enumerate(self.layers):
            if incremental_state is None and not full_context_alignment:
                self_attn_mask = self.buffered_future_mask(x)
            else:
                self_attn_mask = None
            x, layer_attn, self_attn_scores, cross_attn_scores = layer(
                x,
                enc,
                padding_mask,
                incremental_state,
                self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
                need_attn=bool(idx == alignment_layer),
                need_head_weights=bool(idx == alignment_layer),
                prev_self_attn_scores=self_attn_scores,
                prev_cross_attn_scores=cross_attn_scores,
                layer_idx=idx,
            )
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)

        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average probabilities over heads

        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}


@register_model("realformer_transformer")
class RealformerTransformerModel(
    RetainDropoutNamesMixin, ArchCheckedLoadMixin, AdminProfilingMixin, TransformerModel
):
    """fairseq's :class:`TransformerModel` with RealFormer residual attention
    (per chain) and ADMIN initialisation."""

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        settings = settings_of(encoder.cfg)
        self.register_admin_state(
            settings.init_type,
            settings.admin_profile_out,
            {"encoder": 2 * len(encoder.layers), "decoder": 3 * len(decoder.layers)},
        )
        self.register_arch_check()

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_realformer_args(parser)

    @classmethod
    @one_line_under_fairseq_commands
    def build_model(cls, args, task):
        """fairseq's ``build_model`` for ``args`` of any type (argparse ``Namespace``
        from ``fairseq-train``, ``DictConfig`` from ``fairseq-hydra-train``, checkpoints
        and ``task.build_model``): apply the defaults, read the plugin's settings once,
        build, and refuse a model that does not match them."""
        with open_dict(args) if OmegaConf.is_config(args) else contextlib.nullcontext():
            realformer_base_architecture(args)
        model_name = arch_label(args, "realformer_transformer")
        refuse_unsupported_task(task)
        settings = settings_for_build(args, RESIDUAL_CHAINS, model_name)
        cfg = realformer_config(args, settings)
        if utils.safe_getattr(cfg, "arch", None) is None:  # hydra: model._name is the arch
            cfg.arch = utils.safe_getattr(args, "_name", None)
        model = super().build_model(cfg, task)
        check_layers_match_settings(
            settings,
            {
                "encoder": [layer.self_attn for layer in every_layer(model.encoder.layers)],
                "decoder": [layer.self_attn for layer in every_layer(model.decoder.layers)],
                "cross": [layer.encoder_attn for layer in every_layer(model.decoder.layers)],
            },
            model,
            model_name=model_name,
        )
        return model

    @classmethod
    def from_pretrained(
        cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", **kwargs
    ):
        """fairseq's, plus the task's languages for ``tokenizer="moses"`` and a warning for a
        checkpoint of another model class (``models/hub_interface.py``)."""
        from .hub_interface import translation_hub

        hub = super().from_pretrained(
            model_name_or_path, checkpoint_file, data_name_or_path, **kwargs
        )
        return translation_hub(hub, cls, kwargs, f"{model_name_or_path}/{checkpoint_file}")

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return RealformerTransformerEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return RealformerTransformerDecoder(
            cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention
        )

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        return_all_hiddens: bool = True,
        features_only: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        """Mirrors fairseq 0.12.3 ``TransformerModelBase.forward`` (TorchScript compiles no
        ``super()`` call), with ADMIN profiling on the first training batch first."""
        if not torch.jit.is_scripting():
            self.profile_admin_if_needed(src_tokens, src_lengths, prev_output_tokens)
        encoder_out = self.encoder(
            src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens
        )
        decoder_out = self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            features_only=features_only,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
        )
        return decoder_out


# Architectures: every default is in models/architectures.py (FAMILIES).

realformer_base_architecture = register_family_base_architecture("realformer_transformer")

ARCHITECTURES = register_family_architectures("realformer_transformer")
