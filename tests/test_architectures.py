"""The registered architectures: names, sizes and defaults (issue 13's table).

Sizes are RealFormer's (He et al. 2020, arXiv 2012.11747): NMT width 512/2048/8 heads
at 6L-6L, 18L-18L, 60L-12L, and its BERT Table 1 sizes; the decoder-only LMs mirror
fairseq's ``transformer_lm`` sizes. Expected values are written here (the BERT sizes
in ``harness.PAPER_BERT_SIZES``, shared with test_roberta); the arch functions must give
the same on an argparse Namespace and a DictConfig.
"""

import argparse

import pytest
from harness import PAPER_BERT_SIZES as BERT_SIZES
from omegaconf import OmegaConf, open_dict

import realformer_fairseq  # noqa: F401 (registers the architectures)

# size -> (encoder layers, decoder layers, width, ffn, heads, share_all_embeddings)
NMT_SIZES = {
    "wmt_en_fr": (6, 6, 512, 2048, 8, True),
    "wmt_en_fr_18_18": (18, 18, 512, 2048, 8, True),
    "wmt_en_fr_60_12": (60, 12, 512, 2048, 8, True),
    "tiny": (2, 2, 64, 128, 2, False),
}
# variant -> (residual_attention, residual_attention_mode, init_type, normalize_before)
NMT_VARIANTS = {
    "realformer": ("all", "mean", "admin", False),
    "admin_transformer": ("none", None, "admin", False),
    "postln_transformer": ("none", None, "default", False),
    "preln_transformer": ("none", None, "default", True),
}
# variant -> (residual_attention, residual_attention_mode, normalize_before, layernorm_embedding)
BERT_VARIANTS = {
    "realformer_bert": ("encoder", "sum", False, True),
    "postln_bert": ("none", None, False, True),
    "preln_bert": ("none", None, True, False),
}

# size suffix -> (layers, width, heads, ffn): fairseq's transformer_lm sizes
LM_SIZES = {
    "_tiny": (2, 64, 2, 128),
    "": (6, 512, 8, 2048),
    "_gpt2_small": (24, 1024, 16, 4096),
}
# variant -> (residual_attention, residual_attention_mode, init_type, normalize_before);
# Post-LN unless the variant is Pre-LN (fairseq's base_lm_architecture forces Pre-LN)
LM_VARIANTS = {
    "realformer_lm": ("decoder", "sum", "admin", False),
    "admin_transformer_lm": ("none", None, "admin", False),
    "postln_transformer_lm": ("none", None, "default", False),
    "preln_transformer_lm": ("none", None, "default", True),
}


def expected_flags(residual, mode, init):
    """What every family's arch sets besides its sizes: dropout 0.1 and the plugin's flags."""
    return {
        "dropout": 0.1, "residual_attention": residual, "residual_attention_mode": mode,
        "init_type": init, "admin_allow_pre_ln": False, "admin_profile_out": None,
    }  # fmt: skip


def expected_nmt(variant, size):
    enc, dec, width, ffn, heads, share = NMT_SIZES[size]
    residual, mode, init, pre_ln = NMT_VARIANTS[variant]
    return {
        "encoder_layers": enc, "decoder_layers": dec, "encoder_embed_dim": width,
        "decoder_embed_dim": width, "encoder_ffn_embed_dim": ffn, "decoder_ffn_embed_dim": ffn,
        "encoder_attention_heads": heads, "decoder_attention_heads": heads,
        "share_all_embeddings": share, "encoder_normalize_before": pre_ln,
        "decoder_normalize_before": pre_ln, **expected_flags(residual, mode, init),
    }  # fmt: skip


def expected_bert(variant, size):
    layers, width, heads, ffn = BERT_SIZES[size]
    residual, mode, pre_ln, ln_embedding = BERT_VARIANTS[variant]
    return {
        "encoder_layers": layers, "encoder_embed_dim": width, "encoder_attention_heads": heads,
        "encoder_ffn_embed_dim": ffn, "encoder_normalize_before": pre_ln,
        "layernorm_embedding": ln_embedding, **expected_flags(residual, mode, "default"),
    }  # fmt: skip


def expected_lm(variant, size):
    layers, width, heads, ffn = LM_SIZES[size]
    residual, mode, init, pre_ln = LM_VARIANTS[variant]
    return {
        "decoder_layers": layers, "decoder_embed_dim": width, "decoder_attention_heads": heads,
        "decoder_ffn_embed_dim": ffn, "decoder_input_dim": width, "decoder_output_dim": width,
        "decoder_normalize_before": pre_ln, **expected_flags(residual, mode, init),
    }  # fmt: skip


EXPECTED = {
    "realformer_transformer": {
        **expected_nmt("realformer", "wmt_en_fr"),
        "share_all_embeddings": False,
    },
    "realformer_roberta": {**expected_bert("realformer_bert", "base")},
}
for _variant in NMT_VARIANTS:
    for _size in NMT_SIZES:
        EXPECTED[f"{_variant}_{_size}"] = expected_nmt(_variant, _size)
# fairseq's transformer_align defaults (one head of decoder layer 4), at the NMT sizes; the
# tiny size supervises its first of two decoder layers
ALIGN_LAYER = {"wmt_en_fr": 4, "wmt_en_fr_18_18": 4, "wmt_en_fr_60_12": 4, "tiny": 0}


def expected_align(variant, size):
    alignment = {"alignment_heads": 1, "full_context_alignment": False}
    return {**expected_nmt(variant, size), **alignment, "alignment_layer": ALIGN_LAYER[size]}


EXPECTED["realformer_transformer_align"] = {
    **EXPECTED["realformer_transformer"],
    **expected_align("realformer", "wmt_en_fr"),
    "share_all_embeddings": False,
}
for _variant in NMT_VARIANTS:
    for _size in NMT_SIZES:
        EXPECTED[f"{_variant}_align_{_size}"] = expected_align(_variant, _size)
for _variant in BERT_VARIANTS:
    for _size in BERT_SIZES:
        EXPECTED[f"{_variant}_{_size}"] = expected_bert(_variant, _size)
for _variant in LM_VARIANTS:
    for _size in LM_SIZES:
        EXPECTED[f"{_variant}{_size}"] = expected_lm(_variant, _size)


def resolve(name, config_type, **given):
    from fairseq.models import ARCH_CONFIG_REGISTRY

    if config_type == "Namespace":
        args = argparse.Namespace(**given)
        ARCH_CONFIG_REGISTRY[name](args)
        return vars(args)
    cfg = OmegaConf.create({"_name": name, **given})
    with open_dict(cfg):  # as fairseq's models.build_model applies an arch
        ARCH_CONFIG_REGISTRY[name](cfg)
    return OmegaConf.to_container(cfg)


def test_every_architecture_name_is_registered_and_no_other():
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    ours = {
        name
        for name, model in ARCH_MODEL_NAME_REGISTRY.items()
        if model
        in (
            "realformer_transformer",
            "realformer_transformer_align",
            "realformer_roberta",
            "realformer_lm",
        )
    }
    assert ours == set(EXPECTED)
    assert len(ours) == 2 * (1 + 4 * 4) + 1 + 3 * 5 + 4 * 3


@pytest.mark.parametrize("config_type", ["Namespace", "DictConfig"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_architecture_defaults(name, config_type):
    resolved = resolve(name, config_type)
    assert {key: resolved.get(key) for key in EXPECTED[name]} == EXPECTED[name]


@pytest.mark.parametrize("config_type", ["Namespace", "DictConfig"])
def test_given_values_win_and_the_decoder_width_follows_the_encoder(config_type):
    resolved = resolve(
        "realformer_tiny",
        config_type,
        encoder_embed_dim=256,
        init_type="default",
        residual_attention="encoder",
    )
    assert resolved["encoder_embed_dim"] == 256
    assert resolved["decoder_embed_dim"] == 256
    assert resolved["encoder_ffn_embed_dim"] == 128
    assert resolved["init_type"] == "default"
    assert resolved["residual_attention"] == "encoder"
    assert resolved["residual_attention_mode"] == "mean"
    assert resolve("preln_bert_tiny", config_type, residual_attention="encoder")[
        "residual_attention_mode"
    ] == ("sum")
    lm = resolve("preln_transformer_lm_tiny", config_type, decoder_normalize_before=False)
    assert lm["decoder_normalize_before"] is False  # not forced back to Pre-LN by fairseq
    assert resolve("realformer_lm", config_type, decoder_layers=3)["decoder_layers"] == 3
