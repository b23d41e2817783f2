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

Architectures: ``{variant}{size}`` for the sizes of :data:`LM_SIZES` (each mirrors a
fairseq ``transformer_lm*`` architecture, whose arch function is called last) and the
variants of :data:`LM_VARIANTS`:

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
from typing import Any, Dict

from fairseq import options, utils
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer_lm import (
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
    base_lm_architecture,
    transformer_lm_gpt2_small,
)
from fairseq.modules import AdaptiveInput, CharacterTokenEmbedder

from ..errors import RealformerConfigError, exit_on_config_error
from ..modules.admin import AdminProfilingMixin
from ..modules.realformer_layer import RealformerDecoderLayer, parse_residual_chains
from .checkpoint_guard import ArchCheckedLoadMixin
from .realformer_transformer import (
    RealformerTransformerDecoder,
    _wrap_layer,
    add_realformer_args,
    realformer_flag_defaults,
    validate_realformer_args,
)

logger = logging.getLogger(__name__)

DECODER_ONLY_CHAINS = ("decoder",)


class RealformerLMDecoder(RealformerTransformerDecoder):
    """The RealFormer decoder (decoder self-attention chain, ADMIN residuals)
    without cross-attention, for language models.

    fairseq's ``TransformerDecoder`` hands ``build_decoder_layer`` a
    ``TransformerConfig.from_namespace(args)``, which keeps the plugin's keys only
    when ``args`` is an argparse Namespace; from a DictConfig (fairseq-hydra-train,
    hub loading of a hydra checkpoint) they would be dropped and the layers built as
    plain fairseq layers. The layers are therefore built from the decoder's own
    ``args`` (``self.args``, set by fairseq before the layers are built).
    """

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=True)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(RealformerDecoderLayer(self.args, no_encoder_attn), self.args)


def check_decoder_only_chains(args):
    """``--residual-attention`` for a decoder-only model: ``all``, ``none`` or
    ``decoder``; naming the encoder or cross chain is an error, not ignored."""
    value = utils.safe_getattr(args, "residual_attention", "none")
    chains = parse_residual_chains(value)
    if value != "all" and chains - set(DECODER_ONLY_CHAINS):
        raise RealformerConfigError(
            f"--residual-attention {value}: this decoder-only language model has only the "
            "'decoder' chain (use 'all', 'decoder' or 'none')"
        )


@register_model("realformer_lm")
class RealformerLanguageModel(ArchCheckedLoadMixin, AdminProfilingMixin, TransformerLanguageModel):
    """fairseq's :class:`TransformerLanguageModel` with RealFormer residual
    attention in its causal self-attention chain and optional ADMIN init.

    Registered without a dataclass (as fairseq's legacy ``transformer``), so that the
    ``--arch`` functions set the sizes under fairseq-train and fairseq-hydra-train alike
    (a dataclass would fill every size with ``transformer_lm``'s defaults first).
    """

    def __init__(self, args, decoder):
        super().__init__(decoder)
        self.args = args
        self.register_admin_state(args, {"decoder": 2 * len(decoder.layers)})
        self.register_arch_check()

    @classmethod
    def hub_models(cls):
        # fairseq's transformer_lm downloads are vanilla checkpoints: loading one
        # through this class would silently give a model without residual attention
        return {}

    @classmethod
    def add_args(cls, parser):
        from fairseq.dataclass.utils import gen_parser_from_dataclass

        # as BaseFairseqModel.add_args does for transformer_lm's dataclass
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_realformer_args(parser)

    @classmethod
    @exit_on_config_error
    def build_model(cls, args, task):
        """Mirrors fairseq 0.12.3 ``TransformerLanguageModel.build_model``, which
        hard-codes ``TransformerDecoder``; this one runs the plugin's start-up checks
        and builds a :class:`RealformerLMDecoder`."""
        from omegaconf import OmegaConf

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        realformer_lm_base_architecture(args)
        check_decoder_only_chains(args)
        validate_realformer_args(args, chains_used=DECODER_ONLY_CHAINS)

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

        decoder = RealformerLMDecoder(args, task.target_dictionary, embed_tokens)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        return cls(args, decoder)

    def forward(self, src_tokens, **kwargs):
        if self.needs_admin_profiling():
            self.admin_profile(src_tokens, **kwargs)
        return super().forward(src_tokens, **kwargs)


# Architectures. Defaults live here only; each arch function sets what it
# changes with safe_getattr and calls its parent (fairseq's arch function) last.


def _keep_normalize_before(fairseq_arch):
    """fairseq's ``base_lm_architecture`` sets ``decoder_normalize_before = True``
    unconditionally; keep the value the variant (or the user) chose."""

    def architecture(args):
        normalize_before = utils.safe_getattr(args, "decoder_normalize_before", False)
        fairseq_arch(args)
        args.decoder_normalize_before = normalize_before

    return architecture


@register_model_architecture("realformer_lm", "realformer_lm")
def realformer_lm_base_architecture(args):
    """RealFormer (decoder chain, running sum) on Post-LN + ADMIN; then fairseq's
    ``transformer_lm`` defaults (512/2048, 6 layers, 8 heads), Post-LN kept."""
    realformer_flag_defaults(args, residual_attention="decoder", mode="sum", init_type="admin")
    args.decoder_normalize_before = utils.safe_getattr(args, "decoder_normalize_before", False)
    _keep_normalize_before(base_lm_architecture)(args)


# size suffix -> (fairseq transformer_lm arch function it mirrors, defaults set before it)
LM_SIZES = {
    "_tiny": (
        base_lm_architecture,
        {
            "decoder_layers": 2,
            "decoder_embed_dim": 64,
            "decoder_ffn_embed_dim": 128,
            "decoder_attention_heads": 2,
        },
    ),
    "": (base_lm_architecture, {}),  # fairseq transformer_lm
    "_gpt2_small": (transformer_lm_gpt2_small, {}),  # 24 layers, 1024/4096, 16 heads
}

# variant prefix -> defaults for the plugin's and fairseq's flags
LM_VARIANTS = {
    # RealFormer (decoder self-attention chain, running sum) + ADMIN on Post-LN
    "realformer_lm": {
        "residual_attention": "decoder",
        "init_type": "admin",
        "decoder_normalize_before": False,
    },
    # baselines at the same sizes
    "admin_transformer_lm": {
        "residual_attention": "none",
        "init_type": "admin",
        "decoder_normalize_before": False,
    },
    "postln_transformer_lm": {
        "residual_attention": "none",
        "init_type": "default",
        "decoder_normalize_before": False,
    },
    "preln_transformer_lm": {  # fairseq's transformer_lm*
        "residual_attention": "none",
        "init_type": "default",
        "decoder_normalize_before": True,
    },
}


def _make_lm_architecture(variant_defaults: Dict[str, Any], fairseq_arch, size_defaults):
    def architecture(args):
        for key, value in {**variant_defaults, **size_defaults}.items():
            setattr(args, key, utils.safe_getattr(args, key, value))
        realformer_flag_defaults(args, residual_attention="none", mode="sum", init_type="default")
        _keep_normalize_before(fairseq_arch)(args)

    return architecture


LM_ARCHITECTURES = {}
for _variant, _defaults in LM_VARIANTS.items():
    for _size, (_fairseq_arch, _size_defaults) in LM_SIZES.items():
        _name = f"{_variant}{_size}"
        if _name == "realformer_lm":  # the model's own base arch, registered above
            LM_ARCHITECTURES[_name] = realformer_lm_base_architecture
            continue
        LM_ARCHITECTURES[_name] = register_model_architecture("realformer_lm", _name)(
            _make_lm_architecture(_defaults, _fairseq_arch, _size_defaults)
        )
