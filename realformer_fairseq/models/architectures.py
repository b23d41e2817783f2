"""Every architecture the plugin registers, in one table.

RealFormer (He, Ravula, Kanagal, Ainslie 2020, arXiv 2012.11747) on ADMIN-initialised
transformers (Liu et al. 2020, arXiv 2004.08249 / 2008.07772). The sizes are the paper's:
its NMT width (512/2048, 8 heads) at 6L-6L, 18L-18L and the 60L-12L of its WMT'14 En-Fr
result, and its BERT sizes (Table 1); ``tiny`` ones are for tests on CPU.

A *family* is one registered fairseq model with:

- ``base``: the defaults of the architecture named after the model (e.g. ``--arch
  realformer_transformer``): the plugin's flags, then fairseq's own base architecture
  function (``fairseq_base``) for everything else;
- ``sizes``: layer counts and widths (plus norm placement, embedding sharing, dropout
  where a size fixes them);
- ``variants``: the plugin's flags and norm placement per variant.

Each ``{variant}_{size}`` (``{variant}`` for the size ``""``) is registered as an architecture whose defaults are, by
precedence: the command line / config, the variant, the size, the family's base, fairseq's
base. A family may give a size its own fairseq base function (``size_fairseq_base``; the
LM's ``gpt2_small`` mirrors fairseq's ``transformer_lm_gpt2_small``). ``residual_attention_mode`` in ``base`` is the default only where some chain is
residual. A value ``SameAs("key")`` takes the (already resolved) value of another key.

The translation family's entries are in :mod:`.translation_table` (a module that imports
nothing, which the WMT'14 pipeline reads without importing fairseq); the others are below.

To add a family (as the decoder-only LM, ``realformer_lm*``, was), add an entry to
``FAMILIES`` and call ``register_family_base_architecture("<model name>")`` and
``register_family_architectures("<model name>")`` in the model's module after its
``@register_model`` class; nothing else changes.
"""

import dataclasses
from typing import Any, Callable, Dict, Optional

from fairseq import utils
from fairseq.models import register_model_architecture
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.models.transformer import base_architecture as transformer_base_architecture
from fairseq.models.transformer_align import transformer_align as transformer_align_architecture
from fairseq.models.transformer_lm import base_lm_architecture, transformer_lm_gpt2_small

from ..settings import FLAG_KEYS
from .translation_table import (
    TRANSLATION_BASE,
    TRANSLATION_SIZES,
    TRANSLATION_VARIANTS,
    SameAs,
    arch_name,
)


@dataclasses.dataclass(frozen=True)
class Family:
    base: Dict[str, Any]
    fairseq_base: Callable
    sizes: Dict[str, Dict[str, Any]]
    variants: Dict[str, Dict[str, Any]]
    # size -> fairseq arch function used instead of ``fairseq_base`` for that size
    size_fairseq_base: Dict[str, Callable] = dataclasses.field(default_factory=dict)


def keep_normalize_before(fairseq_arch: Callable) -> Callable:
    """fairseq's ``base_lm_architecture`` sets ``decoder_normalize_before = True``
    unconditionally (so every fairseq ``transformer_lm*`` is Pre-LN); keep the value
    the variant, the family's base or the user chose."""

    def architecture(args):
        normalize_before = utils.safe_getattr(args, "decoder_normalize_before", False)
        fairseq_arch(args)
        args.decoder_normalize_before = normalize_before

    architecture.__name__ = f"{fairseq_arch.__name__}_keep_normalize_before"
    return architecture


FAMILIES: Dict[str, Family] = {
    "realformer_transformer": Family(
        base=TRANSLATION_BASE,
        fairseq_base=transformer_base_architecture,
        sizes=TRANSLATION_SIZES,
        variants=TRANSLATION_VARIANTS,
    ),
    # the same with alignment supervision (Garg et al. 2019), as fairseq's transformer_align
    # (model: realformer_transformer_align): fairseq's defaults (one head of layer 4,
    # --alignment-heads 1 --alignment-layer 4); ``tiny`` has no layer 4 and supervises its
    # first (of two) layer, the penultimate one as layer 4 is of fairseq's six
    "realformer_transformer_align": Family(
        base={
            **TRANSLATION_BASE,
            "alignment_heads": 1,
            "alignment_layer": 4,
            "full_context_alignment": False,
        },
        fairseq_base=transformer_align_architecture,
        sizes={
            **TRANSLATION_SIZES,
            "tiny": {**TRANSLATION_SIZES["tiny"], "alignment_layer": 0},
        },
        variants={f"{name}_align": flags for name, flags in TRANSLATION_VARIANTS.items()},
    ),
    # encoder-only masked LM / sentence prediction (model: realformer_roberta)
    "realformer_roberta": Family(
        base={
            "residual_attention": "encoder",
            "residual_attention_mode": "sum",  # the paper's BERT setting
            "init_type": "default",  # fairseq's BERT init
            "admin_profile_out": None,
            "admin_allow_pre_ln": False,
        },
        fairseq_base=roberta_base_architecture,
        sizes={
            name: {
                "encoder_layers": layers,
                "encoder_embed_dim": width,
                "encoder_attention_heads": heads,
                "encoder_ffn_embed_dim": ffn,
            }
            for name, (layers, width, heads, ffn) in {
                "tiny": (2, 64, 2, 128),
                "small": (4, 512, 8, 2048),
                "base": (12, 768, 12, 3072),
                "large": (24, 1024, 16, 4096),
                "xlarge": (36, 1536, 24, 6144),
            }.items()
        },
        variants={
            # the paper's system: Post-LN BERT + residual attention (running sum)
            "realformer_bert": {"residual_attention": "encoder", "encoder_normalize_before": False},
            "postln_bert": {"residual_attention": "none", "encoder_normalize_before": False},
            # as fairseq's roberta_prenorm: no embedding LayerNorm, final LayerNorm
            "preln_bert": {
                "residual_attention": "none",
                "encoder_normalize_before": True,
                "layernorm_embedding": False,
            },
        },
    ),
    # decoder-only language model (model: realformer_lm). Size "" is the model's own
    # arch (``realformer_lm``, registered by the model's module) and fairseq's
    # ``transformer_lm`` size; each size mirrors a fairseq ``transformer_lm*`` arch,
    # called last with the Post-/Pre-LN choice kept.
    "realformer_lm": Family(
        base={
            "residual_attention": "decoder",
            "residual_attention_mode": "sum",
            "init_type": "admin",
            "admin_profile_out": None,
            "admin_allow_pre_ln": False,
            "decoder_normalize_before": False,
        },
        fairseq_base=keep_normalize_before(base_lm_architecture),
        sizes={
            "tiny": {
                "decoder_layers": 2,
                "decoder_embed_dim": 64,
                "decoder_ffn_embed_dim": 128,
                "decoder_attention_heads": 2,
            },
            "": {},  # fairseq transformer_lm: 6 layers, 512/2048, 8 heads
            "gpt2_small": {},  # fairseq transformer_lm_gpt2_small: 24 layers, 1024/4096, 16 heads
        },
        variants={
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
        },
        size_fairseq_base={"gpt2_small": keep_normalize_before(transformer_lm_gpt2_small)},
    ),
}


def set_defaults(args, defaults: Dict[str, Any]):
    """Set each key that ``args`` (Namespace or DictConfig) does not have or has as None."""
    for key, value in defaults.items():
        if utils.safe_getattr(args, key, None) is None:
            if isinstance(value, SameAs):
                value = utils.safe_getattr(args, value.key, None)
            setattr(args, key, value)


def realformer_flag_defaults(args, residual_attention: str, mode: str, init_type: str):
    """Defaults of the plugin's own flags; ``mode`` and ``residual_attention_impl`` (``auto``)
    only where some chain is on (a checkpoint saved before the impl flag existed gets ``auto``,
    which computes what it computed then).

    ``residual_attention`` is not parsed here: fairseq calls arch functions while
    parsing the command line, outside build_model's one-line errors;
    ``read_realformer_settings`` checks the value."""
    set_defaults(
        args,
        {
            "residual_attention": residual_attention,
            "init_type": init_type,
            "admin_profile_out": None,
            "admin_allow_pre_ln": False,
        },
    )
    if args.residual_attention not in (None, "", "none"):
        args.residual_attention_mode = utils.safe_getattr(args, "residual_attention_mode", mode)
        args.residual_attention_impl = utils.safe_getattr(args, "residual_attention_impl", "auto")
    else:
        args.residual_attention_mode = utils.safe_getattr(args, "residual_attention_mode", None)
        args.residual_attention_impl = utils.safe_getattr(args, "residual_attention_impl", None)


def family_base_architecture(family_name: str, size: Optional[str] = None) -> Callable:
    """The arch function named after the model: the family's plugin-flag defaults,
    then fairseq's base architecture (the size's own one where the family gives one)."""
    family = FAMILIES[family_name]
    fairseq_base = family.size_fairseq_base.get(size, family.fairseq_base)

    def architecture(args):
        realformer_flag_defaults(
            args,
            residual_attention=family.base["residual_attention"],
            mode=family.base["residual_attention_mode"],
            init_type=family.base["init_type"],
        )
        set_defaults(args, {k: v for k, v in family.base.items() if k not in FLAG_KEYS})
        fairseq_base(args)

    architecture.__name__ = f"{family_name}_base_architecture"
    return architecture


def register_family_base_architecture(family_name: str, size: Optional[str] = None) -> Callable:
    """Register :func:`family_base_architecture` as the arch named after the model
    ``family_name`` (registered already); returns the arch function."""
    return register_model_architecture(family_name, family_name)(
        family_base_architecture(family_name, size)
    )


def make_architecture(family_name: str, variant: str, size: str) -> Callable:
    """The arch function of ``{variant}_{size}``: variant, then size, then the base."""
    family = FAMILIES[family_name]
    base = family_base_architecture(family_name, size)

    def architecture(args):
        set_defaults(args, family.variants[variant])
        set_defaults(args, family.sizes[size])
        base(args)

    architecture.__name__ = f"{arch_name(variant, size)}_architecture"
    return architecture


def architecture_names(family_name: str):
    family = FAMILIES[family_name]
    return [arch_name(variant, size) for variant in family.variants for size in family.sizes]


def register_family_architectures(family_name: str) -> Dict[str, Callable]:
    """Register ``{variant}_{size}`` for every entry of the family (the model
    ``family_name`` must be registered already); returns name -> arch function. The
    base architecture (named after the model) is registered by the model's module, and
    an entry whose name is the model's (``realformer_lm``) is left to it."""
    registered = {}
    family = FAMILIES[family_name]
    for variant in family.variants:
        for size in family.sizes:
            name = arch_name(variant, size)
            if name == family_name:
                continue
            registered[name] = register_model_architecture(family_name, name)(
                make_architecture(family_name, variant, size)
            )
    return registered
