"""The translation family's sizes and variants (``realformer_transformer``, and
``realformer_transformer_align`` built on them): the paper's NMT width (512/2048, 8 heads) at
6L-6L, 18L-18L and the 60L-12L of its WMT'14 En-Fr result (RealFormer, He et al. 2020, arXiv
2012.11747, Table 7), on ADMIN (Liu et al. 2020, arXiv 2004.08249).

Part of the one architecture table (:mod:`realformer_fairseq.models.architectures` registers
these entries with fairseq's base architecture functions). This module imports nothing, so
that examples/wmt14_en_fr/recipes.py reads it from its file without importing fairseq (2.5 CPU
seconds a command); tests/test_pipeline.py checks that what it reads here is what the
plugin registers.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class SameAs:
    """A default that copies another key's resolved value (e.g. the decoder's width
    follows ``--encoder-embed-dim``)."""

    key: str


# The paper's NMT width (Post-LN, shared embeddings, dropout 0.1); decoder as encoder.
NMT_WIDTH = {
    "encoder_embed_dim": 512,
    "encoder_ffn_embed_dim": 2048,
    "encoder_attention_heads": 8,
    "decoder_embed_dim": SameAs("encoder_embed_dim"),
    "decoder_ffn_embed_dim": SameAs("encoder_ffn_embed_dim"),
    "decoder_attention_heads": 8,
    "encoder_normalize_before": False,
    "decoder_normalize_before": False,
    "share_all_embeddings": True,
    "dropout": 0.1,
}

# encoder-decoder translation (model: realformer_transformer)
TRANSLATION_BASE = {
    "residual_attention": "all",
    # Google's realformer.py: the running mean "is found to be helpful for deep
    # RealFormer models with 30+ layers" (the 60L-12L); its own default is the sum
    "residual_attention_mode": "mean",
    "init_type": "admin",
    "admin_profile_out": None,
    "admin_allow_pre_ln": False,
}
TRANSLATION_SIZES = {
    "wmt_en_fr": {**NMT_WIDTH, "encoder_layers": 6, "decoder_layers": 6},
    "wmt_en_fr_18_18": {**NMT_WIDTH, "encoder_layers": 18, "decoder_layers": 18},
    "wmt_en_fr_60_12": {**NMT_WIDTH, "encoder_layers": 60, "decoder_layers": 12},
    "tiny": {
        "encoder_embed_dim": 64,
        "encoder_ffn_embed_dim": 128,
        "encoder_attention_heads": 2,
        "decoder_embed_dim": SameAs("encoder_embed_dim"),
        "decoder_ffn_embed_dim": SameAs("encoder_ffn_embed_dim"),
        "decoder_attention_heads": 2,
        "encoder_layers": 2,
        "decoder_layers": 2,
    },
}
TRANSLATION_VARIANTS = {
    # the paper's system: RealFormer (running mean, all three chains) + ADMIN
    "realformer": {"residual_attention": "all", "init_type": "admin"},
    # baselines at the same sizes
    "admin_transformer": {"residual_attention": "none", "init_type": "admin"},
    "postln_transformer": {"residual_attention": "none", "init_type": "default"},
    "preln_transformer": {
        "residual_attention": "none",
        "init_type": "default",
        "encoder_normalize_before": True,
        "decoder_normalize_before": True,
    },
}


def arch_name(variant: str, size: str) -> str:
    """``{variant}_{size}``; ``{variant}`` for the size ``""``."""
    return f"{variant}_{size}" if size else variant
