"""RealFormer encoder-decoder transformer with ADMIN initialisation for fairseq.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention"
(arXiv 2012.11747); Liu et al. "Understanding the Difficulty of Training
Transformers" (arXiv 2004.08249) and "Very Deep Transformers for NMT" (2008.07772).

Three separate residual score chains: encoder self-attention (``encoder``),
decoder self-attention (``decoder``) and decoder cross-attention (``cross``).
"""

import contextlib
import logging
from typing import Dict, List, Optional, Sequence

import torch
from fairseq import utils
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoder,
    TransformerEncoder,
    TransformerModel,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from omegaconf import OmegaConf, open_dict
from torch import Tensor

from ..errors import RealformerConfigError, exit_on_config_error
from ..modules.admin import INIT_TYPES, AdminProfilingMixin
from ..modules.realformer_layer import (
    RealformerDecoderLayer,
    RealformerEncoderLayer,
    check_chain_heads,
    every_layer,
    parse_residual_chains,
)
from ..modules.residual_attention import RESIDUAL_ATTENTION_MODES
from ..settings import (
    RealformerSettings,
    check_layers_match_settings,
    namespace_of,
    read_realformer_settings,
)
from .architectures import (  # noqa: F401 (realformer_flag_defaults: re-exported)
    realformer_flag_defaults,
    register_family_architectures,
    register_family_base_architecture,
)
from .checkpoint_guard import ArchCheckedLoadMixin
from .supported_flags import refuse_unsupported_flags

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

    ``settings`` (the plugin's flags, read once by the model's ``build_model``) is
    explicit: fairseq converts ``args`` to a ``TransformerConfig`` before the layers
    are built, which drops the plugin's keys when ``args`` is a ``DictConfig``."""

    def __init__(self, args, dictionary, embed_tokens, settings: RealformerSettings):
        # read by build_encoder_layer, which fairseq's __init__ calls
        self.realformer_settings = settings
        super().__init__(args, dictionary, embed_tokens)
        check_chain_heads(self.layers, "self_attn", "encoder")

    def build_encoder_layer(self, args):
        settings = self.realformer_settings
        layer = RealformerEncoderLayer(
            args,
            residual_self_attention=settings.residual("encoder"),
            residual_attention_mode=settings.residual_attention_mode,
            admin=settings.admin,
        )
        return _wrap_layer(layer, args)

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
        args,
        dictionary,
        embed_tokens,
        settings: RealformerSettings,
        no_encoder_attn=False,
        output_projection=None,
    ):
        self.realformer_settings = settings  # read by build_decoder_layer
        super().__init__(
            args,
            dictionary,
            embed_tokens,
            no_encoder_attn=no_encoder_attn,
            output_projection=output_projection,
        )
        check_chain_heads(self.layers, "self_attn", "decoder")
        check_chain_heads(self.layers, "encoder_attn", "cross")

    def build_decoder_layer(self, args, no_encoder_attn=False):
        settings = self.realformer_settings
        layer = RealformerDecoderLayer(
            args,
            no_encoder_attn,
            residual_self_attention=settings.residual("decoder"),
            residual_cross_attention=settings.residual("cross"),
            residual_attention_mode=settings.residual_attention_mode,
            admin=settings.admin,
        )
        return _wrap_layer(layer, args)

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


def _settings_of(cfg) -> RealformerSettings:
    settings = getattr(cfg, "realformer_settings", None)
    if not isinstance(settings, RealformerSettings):
        raise RealformerConfigError(
            "build realformer_transformer models with RealformerTransformerModel.build_model "
            "(or fairseq's task.build_model), which reads the plugin's settings"
        )
    return settings


def add_realformer_args(parser):
    """The flags this plugin adds to every model it registers."""
    parser.add_argument(
        "--residual-attention",
        metavar="CHAINS",
        help="residual attention (RealFormer) chains: 'all', 'none' or a comma list of "
        "encoder (encoder self-attn), decoder (decoder self-attn), cross (encoder-decoder attn)",
    )
    parser.add_argument(
        "--residual-attention-mode",
        choices=RESIDUAL_ATTENTION_MODES,
        help="sum: softmax over the running sum of scores; mean: over the running "
        "mean (the stream passed on stays the sum; the paper's NMT setting)",
    )
    parser.add_argument(
        "--init-type",
        choices=INIT_TYPES,
        help="default: fairseq's init; admin: ADMIN omega profiled on the first "
        "training batch; admin-closed-form: admin-torch's data-free omega",
    )
    parser.add_argument(
        "--admin-profile-out",
        metavar="FILE",
        help="with --init-type admin: write the profiled omega to this JSON file",
    )
    parser.add_argument(
        "--admin-allow-pre-ln",
        action="store_true",
        help="allow --init-type admin* with Pre-LN (ADMIN is meant for Post-LN)",
    )


def validate_realformer_args(args, chains_used=("encoder", "decoder", "cross")):
    """Start-up checks of the plugin's flags; raises RealformerConfigError."""
    chains = parse_residual_chains(utils.safe_getattr(args, "residual_attention", "none"))
    chains &= set(chains_used)
    mode = utils.safe_getattr(args, "residual_attention_mode", None)
    if mode is not None and not chains:
        raise RealformerConfigError(
            f"--residual-attention-mode {mode} needs residual attention on "
            "(--residual-attention is 'none' for this architecture)"
        )
    init_type = utils.safe_getattr(args, "init_type", "default")
    pre_ln = utils.safe_getattr(args, "encoder_normalize_before", False) or (
        "decoder" in chains_used and utils.safe_getattr(args, "decoder_normalize_before", False)
    )
    if (
        init_type != "default"
        and pre_ln
        and not utils.safe_getattr(args, "admin_allow_pre_ln", False)
    ):
        raise RealformerConfigError(
            f"--init-type {init_type} is for Post-LN models, but this one is Pre-LN "
            "(--encoder/decoder-normalize-before); pass --admin-allow-pre-ln to use it anyway"
        )
    if utils.safe_getattr(args, "admin_profile_out", None) and init_type != "admin":
        raise RealformerConfigError("--admin-profile-out needs --init-type admin")
    refuse_unsupported_flags(args, chains_used)


def read_and_validate_realformer_args(
    args, model_chains: Sequence[str], model_name: str
) -> RealformerSettings:
    """The settings of a model with only the chains ``model_chains`` (the encoder-only
    and decoder-only models): :func:`read_realformer_settings` (which refuses a chain
    the model lacks, naming it ``model_name``), then :func:`validate_realformer_args`."""
    settings = read_realformer_settings(args, model_chains=model_chains, model_name=model_name)
    validate_realformer_args(args, chains_used=model_chains)
    return settings


def arch_label(args) -> str:
    """``--arch NAME`` for the built-model check's messages: ``args.arch``, or the
    ``_name`` of a hydra model config."""
    return f"--arch {utils.safe_getattr(args, 'arch', None) or args._name}"


@register_model("realformer_transformer")
class RealformerTransformerModel(ArchCheckedLoadMixin, AdminProfilingMixin, TransformerModel):
    """fairseq's :class:`TransformerModel` with RealFormer residual attention
    (per chain) and ADMIN initialisation."""

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        settings = encoder.realformer_settings
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
    @exit_on_config_error
    def build_model(cls, args, task):
        """fairseq's ``build_model`` for ``args`` of any type (argparse ``Namespace``
        from ``fairseq-train``, ``DictConfig`` from ``fairseq-hydra-train``, checkpoints
        and ``task.build_model``): apply the defaults, read the plugin's settings once,
        build, and refuse a model that does not match them."""
        with open_dict(args) if OmegaConf.is_config(args) else contextlib.nullcontext():
            realformer_base_architecture(args)
        validate_realformer_args(args)
        settings = read_realformer_settings(args)
        # fairseq's TransformerConfig.from_namespace keeps non-field keys only from a
        # Namespace; the settings travel on the config to build_encoder/build_decoder
        cfg = TransformerConfig.from_namespace(namespace_of(args))
        cfg.realformer_settings = settings
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
            model_name=f"--arch {cfg.arch}",
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
        return RealformerTransformerEncoder(cfg, src_dict, embed_tokens, settings=_settings_of(cfg))

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return RealformerTransformerDecoder(
            cfg,
            tgt_dict,
            embed_tokens,
            settings=_settings_of(cfg),
            no_encoder_attn=cfg.no_cross_attention,
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
        if self.needs_admin_profiling():
            self.admin_profile(src_tokens, src_lengths, prev_output_tokens)
        return super().forward(
            src_tokens,
            src_lengths,
            prev_output_tokens,
            return_all_hiddens=return_all_hiddens,
            features_only=features_only,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
        )


# Architectures: every default is in models/architectures.py (FAMILIES).

realformer_base_architecture = register_family_base_architecture("realformer_transformer")

ARCHITECTURES = register_family_architectures("realformer_transformer")
