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

Architectures (the paper's Table 1 sizes; ``tiny`` is for tests):

==========  ======  =====  =====  =====
size        layers  width  heads  ffn
==========  ======  =====  =====  =====
tiny        2       64     2      128
small       4       512    8      2048
base        12      768    12     3072
large       24      1024   16     4096
xlarge      36      1536   24     6144
==========  ======  =====  =====  =====

with variants ``realformer_bert_*`` (Post-LN + residual attention, the paper's
system), ``postln_bert_*`` (Post-LN BERT baseline) and ``preln_bert_*`` (Pre-LN
baseline, as fairseq's ``roberta_prenorm``: no embedding LayerNorm, final LayerNorm).
"""

import logging
from typing import Any, Dict

from fairseq import utils
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import RobertaEncoder, RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.modules.transformer_sentence_encoder import init_bert_params

from ..errors import RealformerConfigError, exit_on_config_error
from ..modules.admin import AdminProfilingMixin
from ..modules.realformer_layer import parse_residual_chains
from .checkpoint_guard import ArchCheckedLoadMixin
from .realformer_transformer import (
    RealformerTransformerEncoder,
    add_realformer_args,
    realformer_flag_defaults,
    validate_realformer_args,
)

logger = logging.getLogger(__name__)

ENCODER_ONLY_CHAINS = ("encoder",)


class RealformerRobertaEncoder(RobertaEncoder):
    """fairseq's :class:`RobertaEncoder` whose sentence encoder is a
    :class:`RealformerTransformerEncoder` (residual attention, ADMIN residuals)."""

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = RealformerTransformerEncoder(args, dictionary, embed_tokens)
        encoder.apply(init_bert_params)
        return encoder


def check_encoder_only_chains(args):
    """``--residual-attention`` for an encoder-only model: ``all``, ``none`` or
    ``encoder``; naming a decoder chain is an error rather than silently ignored."""
    value = utils.safe_getattr(args, "residual_attention", "none")
    chains = parse_residual_chains(value)
    if value != "all" and chains - set(ENCODER_ONLY_CHAINS):
        raise RealformerConfigError(
            f"--residual-attention {value}: this encoder-only model has only the "
            "'encoder' chain (use 'all', 'encoder' or 'none')"
        )


@register_model("realformer_roberta")
class RealformerRobertaModel(ArchCheckedLoadMixin, AdminProfilingMixin, RobertaModel):
    """fairseq's :class:`RobertaModel` with RealFormer residual attention in its
    encoder and optional ADMIN initialisation (profiled on the first training
    batch of ``masked_lm`` or ``sentence_prediction``, or closed form)."""

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.register_admin_state(args, {"encoder": 2 * len(encoder.sentence_encoder.layers)})
        self.register_arch_check()

    @classmethod
    def add_args(cls, parser):
        RobertaModel.add_args(parser)
        add_realformer_args(parser)

    @classmethod
    @exit_on_config_error
    def build_model(cls, args, task):
        """Mirrors fairseq 0.12.3 ``RobertaModel.build_model``, which hard-codes
        ``RobertaEncoder``; this one builds a :class:`RealformerRobertaEncoder`
        after the plugin's start-up checks."""
        from omegaconf import OmegaConf

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)

        realformer_roberta_base_architecture(args)
        check_encoder_only_chains(args)
        validate_realformer_args(args, chains_used=ENCODER_ONLY_CHAINS)

        if not utils.safe_hasattr(args, "max_positions"):
            if not utils.safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample

        encoder = RealformerRobertaEncoder(args, task.source_dictionary)

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)

        return cls(args, encoder)

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", **kwargs):
        """fairseq's ``RobertaModel.from_pretrained`` (same arguments: ``data_name_or_path``,
        ``bpe``, ``bpe_codes``, ...), returning a :class:`RealformerRobertaHubInterface`."""
        from .hub_interface import RealformerRobertaHubInterface

        hub = super().from_pretrained(model_name_or_path, checkpoint_file, **kwargs)
        return RealformerRobertaHubInterface(hub.cfg, hub.task, hub.model)

    def forward(
        self,
        src_tokens,
        features_only=False,
        return_all_hiddens=False,
        classification_head_name=None,
        **kwargs,
    ):
        if self.needs_admin_profiling():
            self.admin_profile(
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


# Architectures. Defaults live here only; each arch function sets what it
# changes with safe_getattr and calls its parent last.


@register_model_architecture("realformer_roberta", "realformer_roberta")
def realformer_roberta_base_architecture(args):
    """The paper's BERT setting: residual attention with the running sum,
    Post-LN, fairseq's (BERT) init; then fairseq's RoBERTa defaults."""
    realformer_flag_defaults(args, residual_attention="encoder", mode="sum", init_type="default")
    roberta_base_architecture(args)


# size name -> (layers, width, heads, ffn)
BERT_SIZES = {
    "tiny": (2, 64, 2, 128),
    "small": (4, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
    "xlarge": (36, 1536, 24, 6144),
}

# variant prefix -> defaults for the plugin's and fairseq's flags
BERT_VARIANTS = {
    "realformer_bert": {"residual_attention": "encoder", "encoder_normalize_before": False},
    "postln_bert": {"residual_attention": "none", "encoder_normalize_before": False},
    "preln_bert": {
        "residual_attention": "none",
        "encoder_normalize_before": True,
        "layernorm_embedding": False,
    },
}


def _make_bert_architecture(variant_defaults: Dict[str, Any], layers, width, heads, ffn):
    def architecture(args):
        for key, value in variant_defaults.items():
            setattr(args, key, utils.safe_getattr(args, key, value))
        args.encoder_layers = utils.safe_getattr(args, "encoder_layers", layers)
        args.encoder_embed_dim = utils.safe_getattr(args, "encoder_embed_dim", width)
        args.encoder_attention_heads = utils.safe_getattr(args, "encoder_attention_heads", heads)
        args.encoder_ffn_embed_dim = utils.safe_getattr(args, "encoder_ffn_embed_dim", ffn)
        realformer_roberta_base_architecture(args)

    return architecture


BERT_ARCHITECTURES = {}
for _variant, _defaults in BERT_VARIANTS.items():
    for _size, _dims in BERT_SIZES.items():
        _name = f"{_variant}_{_size}"
        BERT_ARCHITECTURES[_name] = register_model_architecture("realformer_roberta", _name)(
            _make_bert_architecture(_defaults, *_dims)
        )
