"""Inference dropout (``--retain-dropout``, ``--retain-dropout-modules``), as fairseq 0.12.3's
own tests/test_inference_dropout.py checks it, on fairseq's ``transformer`` and beside it on
the plugin's models (RealFormer, He et al. 2020, arXiv 2012.11747).

fairseq matches ``--retain-dropout-modules`` against each ``FairseqDropout``'s
``module_name``, the name of the fairseq class that owns it. The plugin's subclasses keep
fairseq's names (so fairseq's documented ``TransformerEncoder TransformerDecoder`` work) and
also answer to their own class names; a name that matches no module is a warning line.
"""

import argparse
import logging

import pytest
import torch
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from harness import random_batch, toy_dictionary

# fairseq's own model, and the plugin's with every chain residual and with none
MODELS = {
    "transformer": TransformerModel,
    "realformer_tiny": ARCH_MODEL_REGISTRY["realformer_tiny"],
    "postln_transformer_tiny": ARCH_MODEL_REGISTRY["postln_transformer_tiny"],
}


def build(arch: str, **generation):
    """As fairseq's test: the model class's parser defaults, 2 encoder layers, 1 decoder
    layer (the plugin's archs keep their tiny sizes; fairseq's is its base size)."""
    dictionary = toy_dictionary()
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    MODELS[arch].add_args(parser)
    args = parser.parse_args([])
    args.arch, args._name = arch, arch
    args.encoder_layers, args.decoder_layers = 2, 1
    args.dropout = 0.3
    if arch == "transformer":
        args.encoder_embed_dim, args.encoder_ffn_embed_dim = 64, 128
        args.encoder_attention_heads = args.decoder_attention_heads = 2
    for key, value in generation.items():
        setattr(args, key, value)
    torch.manual_seed(0)
    model = MODELS[arch].build_model(args, task)
    model.prepare_for_inference_(convert_namespace_to_omegaconf(args))
    return model, dictionary


def retained(module) -> bool:
    return module.dropout_module.apply_during_inference


@pytest.mark.parametrize("arch", list(MODELS))
def test_sets_inference_dropout_to_true(arch):
    model, _ = build(arch, retain_dropout=True)
    assert retained(model.encoder) and retained(model.decoder)
    assert all(retained(layer) for layer in model.encoder.layers)
    assert all(retained(layer.self_attn) for layer in model.decoder.layers)


@pytest.mark.parametrize("arch", list(MODELS))
def test_inference_dropout_false_by_default(arch):
    model, _ = build(arch)
    assert not retained(model.encoder) and not retained(model.decoder)
    assert not any(retained(layer) for layer in [*model.encoder.layers, *model.decoder.layers])


@pytest.mark.parametrize("arch", list(MODELS))
def test_retain_modules_by_fairseq_names(arch):
    """fairseq's test_retain_modules: the encoder and its layers, not the decoder. fairseq
    0.12.3's own transformer fails it: its layers are ``TransformerEncoderLayerBase``, which
    the documented name does not match (fairseq names dropouts by the exact class)."""
    model, _ = build(
        arch,
        retain_dropout=True,
        retain_dropout_modules=["TransformerEncoder", "TransformerEncoderLayer"],
    )
    assert retained(model.encoder)
    fairseq_bug = arch == "transformer"
    assert all(retained(layer) != fairseq_bug for layer in model.encoder.layers)
    assert not retained(model.decoder)
    assert not any(retained(layer) for layer in model.decoder.layers)
    assert not any(retained(layer.self_attn) for layer in model.encoder.layers)


@pytest.mark.parametrize("arch", ["transformer", "realformer_tiny"])
def test_monte_carlo_dropout_changes_the_output_in_eval_mode(arch):
    """What the flag is for: two forwards of the same batch differ in eval mode, and only
    with the flag."""
    outputs = {}
    for flag in (False, True):
        modules = {"retain_dropout_modules": ["TransformerEncoder", "TransformerDecoder"]}
        model, dictionary = build(arch, retain_dropout=flag, **(modules if flag else {}))
        assert not model.training
        src, lengths, prev = random_batch(dictionary)
        with torch.no_grad():
            outputs[flag] = [model(src, lengths, prev)[0] for _ in range(2)]
    assert torch.equal(*outputs[False])
    assert not torch.allclose(*outputs[True])


@pytest.mark.parametrize("arch", list(MODELS))
def test_retain_modules_by_the_class_names_fairseq_0_12_builds(arch):
    model, _ = build(
        arch, retain_dropout=True, retain_dropout_modules=["TransformerDecoderLayerBase"]
    )
    assert all(retained(layer) for layer in model.decoder.layers)
    assert not any(retained(layer) for layer in model.encoder.layers)
    assert not retained(model.decoder) and not retained(model.encoder)


def test_plugin_class_names_select_the_same_modules():
    by_fairseq, _ = build(
        "realformer_tiny",
        retain_dropout=True,
        retain_dropout_modules=["TransformerDecoderLayer", "MultiheadAttention"],
    )
    by_plugin, _ = build(
        "realformer_tiny",
        retain_dropout=True,
        retain_dropout_modules=["RealformerDecoderLayer", "RealformerMultiheadAttention"],
    )
    for model in (by_fairseq, by_plugin):
        assert all(retained(layer) for layer in model.decoder.layers)
        assert all(retained(layer.encoder_attn) for layer in model.decoder.layers)
        assert all(retained(layer.self_attn) for layer in model.encoder.layers)
        assert not retained(model.encoder) and not retained(model.decoder)
        assert not any(retained(layer) for layer in model.encoder.layers)


def test_a_name_that_matches_no_module_is_one_warning_line(caplog):
    with caplog.at_level(logging.WARNING, logger="realformer_fairseq"):
        model, _ = build(
            "realformer_tiny",
            retain_dropout=True,
            retain_dropout_modules=["TransformerEncoder", "TransformerEncodr"],
        )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "--retain-dropout-modules TransformerEncodr: no module of this model has that name"
    )
    assert "TransformerEncoderLayer" in warnings[0] and "RealformerEncoderLayer" in warnings[0]
    assert retained(model.encoder)
