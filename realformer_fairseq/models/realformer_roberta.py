"""Encoder-only RealFormer (BERT/RoBERTa style) for fairseq's ``masked_lm`` and
``sentence_prediction`` tasks.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention"
(Findings of ACL 2021, arXiv 2012.11747), sections 3-4: Post-LN BERT whose
self-attention layers add the previous layer's raw attention scores (running sum,
no running mean in the BERT experiments). ADMIN initialisation (Liu et al., 2020,
arXiv 2004.08249) is available with ``--init-type``, as for the encoder-decoder model.

The model is fairseq's :class:`RobertaModel` with one hook changed:
``RobertaEncoder.build_encoder`` returns a :class:`RealformerTransformerEncoder`
(which threads the encoder score stream). Everything else (LM head,
classification heads, ``--restore-file`` of an MLM checkpoint into a
``sentence_prediction`` run, hub interface) is fairseq's; ``from_pretrained`` returns fairseq's
hub interface with ``fill_mask`` spacing fixed for subword-nmt BPE (``models/hub_interface.py``).

Architectures ``realformer_bert_*`` (Post-LN + residual attention, the paper's
system), ``postln_bert_*`` (Post-LN BERT baseline) and ``preln_bert_*`` (Pre-LN
baseline, as fairseq's ``roberta_prenorm``) at the paper's Table 1 sizes (``tiny``,
``small``, ``base``, ``large``, ``xlarge``): their defaults are in
:mod:`realformer_fairseq.models.architectures`.
"""

import logging

import torch
from fairseq import utils
from fairseq.models import register_model
from fairseq.models.roberta.model import RobertaEncoder, RobertaModel
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from omegaconf import OmegaConf

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
from .architectures import register_family_architectures, register_family_base_architecture
from .build_checks import arch_label, check_layers_match_settings, settings_for_build
from .checkpoint_guard import ArchCheckedLoadMixin
from .realformer_transformer import RealformerTransformerEncoder

logger = logging.getLogger(__name__)

ENCODER_ONLY_CHAINS = ("encoder",)


class RealformerRobertaEncoder(RobertaEncoder):
    """fairseq's :class:`RobertaEncoder` whose sentence encoder is a
    :class:`RealformerTransformerEncoder` (residual attention, ADMIN residuals).

    ``cfg`` is a :class:`RealformerTransformerConfig` (the model config with every key, plus
    the plugin's settings), which fairseq's ``__init__`` hands to ``build_encoder``."""

    def __init__(self, cfg: RealformerTransformerConfig, dictionary):
        settings_of(cfg)  # refuse a config without the plugin's settings, before building
        super().__init__(cfg, dictionary)

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = RealformerTransformerEncoder(args, dictionary, embed_tokens)
        encoder.apply(init_bert_params)
        return encoder


@register_model("realformer_roberta")
class RealformerRobertaModel(
    RetainDropoutNamesMixin, ArchCheckedLoadMixin, AdminProfilingMixin, RobertaModel
):
    """fairseq's :class:`RobertaModel` with RealFormer residual attention in its
    encoder and optional ADMIN initialisation (profiled on the first training
    batch of ``masked_lm`` or ``sentence_prediction``, or closed form).

    Like fairseq 0.12.3's ``RobertaModel``, it does not compile with TorchScript (its
    ``forward`` takes ``**kwargs``)."""

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        settings = settings_of(encoder.args)
        self.register_admin_state(
            settings.init_type,
            settings.admin_profile_out,
            {"encoder": 2 * len(encoder.sentence_encoder.layers)},
        )
        self.register_arch_check()

    @classmethod
    def add_args(cls, parser):
        RobertaModel.add_args(parser)
        add_realformer_args(parser)

    @classmethod
    @one_line_under_fairseq_commands
    def build_model(cls, args, task):
        """Mirrors fairseq 0.12.3 ``RobertaModel.build_model``, which hard-codes
        ``RobertaEncoder``; this one reads the plugin's settings once, builds a
        :class:`RealformerRobertaEncoder` with them and refuses a model that does not match
        them."""
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)

        realformer_roberta_base_architecture(args)
        settings = settings_for_build(args, ENCODER_ONLY_CHAINS, "this encoder-only model")

        if not utils.safe_hasattr(args, "max_positions"):
            if not utils.safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample

        encoder = RealformerRobertaEncoder(
            realformer_config(args, settings), task.source_dictionary
        )

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)

        model = cls(args, encoder)
        layers = encoder.sentence_encoder.layers
        check_layers_match_settings(
            settings,
            {"encoder": [layer.self_attn for layer in every_layer(layers)]},
            model,
            model_name=arch_label(args, "realformer_roberta"),
        )
        return model

    @classmethod
    def from_pretrained(
        cls,
        model_name_or_path,
        checkpoint_file="model.pt",
        data_name_or_path=".",
        bpe="gpt2",
        **kwargs,
    ):
        """fairseq's ``RobertaModel.from_pretrained`` (same arguments: ``data_name_or_path``,
        ``bpe``, ``bpe_codes``, ...), returning a :class:`RealformerRobertaHubInterface`."""
        from .hub_interface import RealformerRobertaHubInterface, warn_if_not_plugin_model

        hub = super().from_pretrained(
            model_name_or_path, checkpoint_file, data_name_or_path, bpe=bpe, **kwargs
        )
        warn_if_not_plugin_model([hub.model], cls, f"{model_name_or_path}/{checkpoint_file}")
        return RealformerRobertaHubInterface(hub.cfg, hub.task, hub.model)

    def forward(
        self,
        src_tokens,
        features_only=False,
        return_all_hiddens=False,
        classification_head_name=None,
        **kwargs,
    ):
        if not torch.jit.is_scripting():
            self.profile_admin_if_needed(
                src_tokens,
                features_only=features_only,
                return_all_hiddens=return_all_hiddens,
                classification_head_name=classification_head_name,
                **kwargs,
            )
        return super().forward(
            src_tokens,
            features_only=features_only,
            return_all_hiddens=return_all_hiddens,
            classification_head_name=classification_head_name,
            **kwargs,
        )


# Architectures: every default is in models/architectures.py (FAMILIES).

realformer_roberta_base_architecture = register_family_base_architecture("realformer_roberta")

BERT_ARCHITECTURES = register_family_architectures("realformer_roberta")
