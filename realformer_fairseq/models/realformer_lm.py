"""Decoder-only RealFormer language models for fairseq's ``language_modeling`` task.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention"
(Findings of ACL 2021, arXiv 2012.11747): each causal self-attention layer adds the
previous layer's raw pre-softmax scores to its own (the decoder self-attention chain
of the encoder-decoder model, without cross-attention). ADMIN initialisation (Liu et
al. 2020, arXiv 2004.08249 / 2008.07772) for the Post-LN backbone, profiled on the
first ``language_modeling`` batch, with N = 2 * layers residual sublayers.

The model is fairseq's :class:`TransformerLanguageModel` whose decoder is a
:class:`RealformerLMDecoder` (the plugin's RealFormer decoder, ``no_encoder_attn``).
fairseq-train / fairseq-hydra-train / fairseq-eval-lm / hub ``sample()`` are fairseq's.

Architectures (defaults in ``FAMILIES["realformer_lm"]`` of
:mod:`realformer_fairseq.models.architectures`): ``{variant}`` + ``_{size}`` for its sizes
(each mirrors a fairseq ``transformer_lm*`` architecture, whose arch function is called
last; the size ``""`` adds no suffix) and its variants:

=========================  ==========================  ======  =====  =====  =====
``--arch``                 fairseq size it mirrors     layers  width  heads  ffn
=========================  ==========================  ======  =====  =====  =====
``realformer_lm_tiny``     (tests)                     2       64     2      128
``realformer_lm``          ``transformer_lm``          6       512    8      2048
``realformer_lm_gpt2_small`` ``transformer_lm_gpt2_small`` 24   1024   16     4096
=========================  ==========================  ======  =====  =====  =====

``realformer_lm*``: residual attention (running sum), Post-LN, ADMIN;
``admin_transformer_lm*``: Post-LN + ADMIN; ``postln_transformer_lm*``: Post-LN,
fairseq init; ``preln_transformer_lm*``: Pre-LN, fairseq init (= fairseq's
``transformer_lm*``, whose ``base_lm_architecture`` always forces Pre-LN).
"""

import logging
from typing import Dict, Optional

import torch
from fairseq import options, utils
from fairseq.models import register_model
from fairseq.models.transformer_lm import (
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
)
from fairseq.modules import AdaptiveInput, CharacterTokenEmbedder
from omegaconf import OmegaConf
from torch import Tensor

from ..errors import one_line_under_fairseq_commands
from ..modules.admin import AdminProfilingMixin
from ..modules.dropout_names import RetainDropoutNamesMixin
from ..modules.realformer_layer import (
    RealformerTransformerConfig,
    every_layer,
    realformer_config,
    settings_of,
)
from ..settings import add_realformer_args
from .architectures import (
    FAMILIES,
    register_family_architectures,
    register_family_base_architecture,
)
from .build_checks import arch_label, check_layers_match_settings, settings_for_build
from .checkpoint_guard import ArchCheckedLoadMixin
from .realformer_transformer import RealformerTransformerDecoder

logger = logging.getLogger(__name__)

DECODER_ONLY_CHAINS = ("decoder",)
CHARACTER_EMBEDDER_FIELDS = (
    "character_filters",
    "character_embedding_dim",
    "char_embedder_highway_layers",
)


class RealformerLMDecoder(RealformerTransformerDecoder):
    """The RealFormer decoder (decoder self-attention chain, ADMIN residuals)
    without cross-attention, for language models; ``cfg`` carries the plugin's settings
    (read once by ``build_model``)."""

    def __init__(self, cfg: RealformerTransformerConfig, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=True)


@register_model("realformer_lm")
class RealformerLanguageModel(
    RetainDropoutNamesMixin, ArchCheckedLoadMixin, AdminProfilingMixin, TransformerLanguageModel
):
    """fairseq's :class:`TransformerLanguageModel` with RealFormer residual
    attention in its causal self-attention chain and optional ADMIN init.

    Registered without a dataclass (as fairseq's legacy ``transformer``), so that the
    ``--arch`` functions set the sizes under fairseq-train and fairseq-hydra-train alike
    (a dataclass would fill every size with ``transformer_lm``'s defaults first).

    Unlike fairseq 0.12.3's ``transformer_lm``, it compiles with TorchScript (``forward``
    spells out the decoder's arguments; fairseq's ``supported_targets`` property, a set, is
    left out of the scripted model).
    """

    __jit_unused_properties__ = ["supported_targets"]

    def __init__(self, args, decoder):
        super().__init__(decoder)
        self.args = args
        settings = settings_of(decoder.cfg)
        self.register_admin_state(
            settings.init_type,
            settings.admin_profile_out,
            {"decoder": 2 * len(decoder.layers)},
        )
        self.register_arch_check()

    @classmethod
    def hub_models(cls):
        # fairseq's transformer_lm downloads are vanilla checkpoints: loading one
        # through this class would silently give a model without residual attention
        return {}

    @classmethod
    def from_pretrained(
        cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", **kwargs
    ):
        """fairseq's, plus a warning for a checkpoint of another model class."""
        from .hub_interface import warn_if_not_plugin_model

        hub = super().from_pretrained(
            model_name_or_path, checkpoint_file, data_name_or_path, **kwargs
        )
        warn_if_not_plugin_model(hub.models, cls, f"{model_name_or_path}/{checkpoint_file}")
        return hub

    @classmethod
    def add_args(cls, parser):
        from fairseq.dataclass.utils import gen_parser_from_dataclass

        # as BaseFairseqModel.add_args does for transformer_lm's dataclass
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_realformer_args(parser)

    @classmethod
    @one_line_under_fairseq_commands
    def build_model(cls, args, task):
        """Mirrors fairseq 0.12.3 ``TransformerLanguageModel.build_model``, which
        hard-codes ``TransformerDecoder``; this one applies the defaults, reads the
        plugin's settings once, builds a :class:`RealformerLMDecoder` with them and
        refuses a model that does not match them."""
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        realformer_lm_base_architecture(args)
        # fairseq's transformer_lm takes these from its dataclass; base_lm_architecture (what
        # this model without a dataclass has) leaves them unset: --character-embeddings crashed
        for name in CHARACTER_EMBEDDER_FIELDS:
            if utils.safe_getattr(args, name, None) is None:
                setattr(
                    args, name, TransformerLanguageModelConfig.__dataclass_fields__[name].default
                )
        settings = settings_for_build(args, DECODER_ONLY_CHAINS, "this decoder-only language model")

        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))

        if utils.safe_getattr(args, "max_target_positions", None) is None:
            # fairseq's dataclass reads task.tokens_per_sample by interpolation; a
            # hydra model config of this (legacy) model has no such key: ask the task
            args.max_target_positions = utils.safe_getattr(
                args,
                "tokens_per_sample",
                utils.safe_getattr(
                    getattr(task, "args", None), "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS
                ),
            )

        if args.character_embeddings:
            embed_tokens = CharacterTokenEmbedder(
                task.source_dictionary,
                eval(args.character_filters),
                args.character_embedding_dim,
                args.decoder_embed_dim,
                args.char_embedder_highway_layers,
            )
        elif args.adaptive_input:
            embed_tokens = AdaptiveInput(
                len(task.source_dictionary),
                task.source_dictionary.pad(),
                args.decoder_input_dim,
                args.adaptive_input_factor,
                args.decoder_embed_dim,
                options.eval_str_list(args.adaptive_input_cutoff, type=int),
                args.quant_noise_pq,
                args.quant_noise_pq_block_size,
            )
        else:
            embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)

        if args.tie_adaptive_weights:
            assert args.adaptive_input
            assert args.adaptive_input_factor == args.adaptive_softmax_factor
            assert args.adaptive_softmax_cutoff == args.adaptive_input_cutoff, "{} != {}".format(
                args.adaptive_softmax_cutoff, args.adaptive_input_cutoff
            )
            assert args.decoder_input_dim == args.decoder_output_dim

        decoder = RealformerLMDecoder(
            realformer_config(args, settings), task.target_dictionary, embed_tokens
        )
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        model = cls(args, decoder)
        check_layers_match_settings(
            settings,
            {"decoder": [layer.self_attn for layer in every_layer(decoder.layers)]},
            model,
            model_name=arch_label(args, "realformer_lm"),
        )
        return model

    def forward(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        features_only: bool = False,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
        return_all_hiddens: bool = False,
    ):
        """fairseq 0.12.3's ``FairseqLanguageModel.forward`` (``self.decoder(src_tokens,
        **kwargs)``) with the decoder's keyword arguments spelled out, so that TorchScript
        compiles it (fairseq's own ``transformer_lm`` does not script: ``**kwargs``), and
        with ADMIN profiling on the first training batch first."""
        if not torch.jit.is_scripting():
            self.profile_admin_if_needed(
                src_tokens,
                src_lengths=src_lengths,
                features_only=features_only,
                return_all_hiddens=return_all_hiddens,
            )
        return self.decoder(
            src_tokens,
            incremental_state=incremental_state,
            features_only=features_only,
            full_context_alignment=full_context_alignment,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
        )


# Architectures: every default is in models/architectures.py (FAMILIES["realformer_lm"]).

realformer_lm_base_architecture = register_family_base_architecture("realformer_lm", "")

LM_ARCHITECTURES = {
    "realformer_lm": realformer_lm_base_architecture,
    **register_family_architectures("realformer_lm"),
}
LM_FAMILY = FAMILIES["realformer_lm"]
