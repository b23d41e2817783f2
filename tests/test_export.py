"""TorchScript export, as fairseq 0.12.3's own tests do it (tests/test_export.py,
tests/test_sequence_generator.py ``TestJitSequenceGenerator``), on the plugin's models
beside fairseq's ``transformer`` at the same size.

RealFormer (He et al. 2020, arXiv 2012.11747) threads the score streams through the layer
loops; a scripted model must compute what the eager one computes. Where every chain is
residual, no fairseq fused kernel runs in either mode and scripted equals eager exactly.
Where a chain is off, fairseq's ``MultiheadAttention`` takes its fused
``F.multi_head_attention_forward`` eagerly but its own eager path when scripted, so scores
differ in the last bits, exactly as they do for fairseq's own ``transformer`` (tested beside).
"""

import argparse
import tempfile

import pytest
import torch
from fairseq.models.roberta.model import RobertaModel
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator
from harness import build_fairseq_tiny_transformer, build_translation_model, toy_dictionary

from realformer_fairseq.models.realformer_roberta import RealformerRobertaModel

TRANSLATION_ARCHS = [
    "realformer_tiny",
    "admin_transformer_tiny",
    "postln_transformer_tiny",
    "preln_transformer_tiny",
    "transformer",  # fairseq's own, at the same size
]
# scores of eager vs scripted beam search where a fused kernel runs eagerly: fairseq's own
# transformer differs by up to ~1e-6 here
FUSED_TOLERANCE = 1e-5


def translation_model(arch: str):
    torch.manual_seed(0)
    if arch == "transformer":
        model, dictionary = build_fairseq_tiny_transformer()
    else:
        model, dictionary = build_translation_model(arch)
    return model.eval(), dictionary


def save_and_load(scripted):
    with tempfile.NamedTemporaryFile(suffix=".pt") as fh:
        scripted.save(fh.name)
        return torch.jit.load(fh.name)


def source_batch(dictionary, bsz: int = 3, src_len: int = 9):
    g = torch.Generator().manual_seed(5)
    src = torch.randint(dictionary.nspecial, len(dictionary), (bsz, src_len), generator=g)
    src[:, -1] = dictionary.eos()
    src[1, :4] = dictionary.pad()  # a left-padded row, as fairseq's collater makes them
    return {"net_input": {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1)}}


@pytest.mark.parametrize("arch", TRANSLATION_ARCHS)
def test_translation_model_scripts_and_equals_eager(arch):
    model, dictionary = translation_model(arch)
    scripted = save_and_load(torch.jit.script(model))
    net_input = source_batch(dictionary)["net_input"]
    prev = torch.randint(dictionary.nspecial, len(dictionary), (3, 6))
    prev[:, 0] = dictionary.eos()
    with torch.no_grad():
        eager_out, eager_extra = model(net_input["src_tokens"], net_input["src_lengths"], prev)
        jit_out, jit_extra = scripted(net_input["src_tokens"], net_input["src_lengths"], prev)
    if arch == "realformer_tiny":  # every chain residual: the same kernels in both modes
        assert torch.equal(jit_out, eager_out)
        assert torch.equal(jit_extra["attn"][0], eager_extra["attn"][0])
    else:
        assert not torch.equal(jit_out, torch.zeros_like(jit_out))
        torch.testing.assert_close(jit_out, eager_out, rtol=0, atol=FUSED_TOLERANCE)


@pytest.mark.parametrize("arch", TRANSLATION_ARCHS)
def test_scripted_sequence_generator_equals_eager(arch):
    """fairseq's ``TestJitSequenceGenerator`` scripts the generator (beam 2, no repeated
    bigrams); here the scripted beam search must also give the eager tokens and scores."""
    model, dictionary = translation_model(arch)
    generator = SequenceGenerator(
        [model], dictionary, beam_size=3, no_repeat_ngram_size=2, max_len_b=12
    )
    scripted = save_and_load(torch.jit.script(generator))
    sample = source_batch(dictionary)
    eager, jit = generator.forward(sample), scripted.forward(sample)
    assert len(eager) == len(jit) == 3
    for eager_hypos, jit_hypos in zip(eager, jit):
        assert len(eager_hypos) == len(jit_hypos) == 3
        for a, b in zip(eager_hypos, jit_hypos):
            assert torch.equal(a["tokens"], b["tokens"])
            if arch == "realformer_tiny":
                assert torch.equal(a["positional_scores"], b["positional_scores"])
                assert torch.equal(a["score"], b["score"])
                assert torch.equal(a["attention"], b["attention"])
            else:
                torch.testing.assert_close(
                    a["positional_scores"], b["positional_scores"], rtol=0, atol=FUSED_TOLERANCE
                )


def test_ensemble_model_scripts():
    model, _ = translation_model("realformer_tiny")
    other, _ = translation_model("admin_transformer_tiny")
    torch.jit.script(EnsembleModel([model, other]))


def test_beam_aware_cross_attention_generates_what_plain_beam_search_generates():
    """``decoder.set_beam_size(beam)`` (fairseq's beamable encoder-decoder attention: one
    copy of a sentence's encoder keys for all its beams) gives the same hypotheses, with
    scores equal up to the rounding of fairseq's batched einsum."""
    model, dictionary = translation_model("realformer_tiny")
    sample = source_batch(dictionary)
    plain = SequenceGenerator([model], dictionary, beam_size=3, max_len_b=12).forward(sample)
    model.decoder.set_beam_size(3)
    assert all(layer.encoder_attn.beam_size == 3 for layer in model.decoder.layers)
    beamable = SequenceGenerator([model], dictionary, beam_size=3, max_len_b=12).forward(sample)
    for plain_hypos, beam_hypos in zip(plain, beamable):
        for a, b in zip(plain_hypos, beam_hypos):
            assert torch.equal(a["tokens"], b["tokens"])
            torch.testing.assert_close(a["score"], b["score"], rtol=0, atol=1e-6)


def test_language_model_scripts_and_equals_eager():
    """fairseq 0.12.3's ``transformer_lm`` does not script (``forward(src_tokens, **kwargs)``);
    the plugin's language model does. (fairseq's scripted ``SequenceGenerator`` needs an
    encoder: it does not script decoder-only models, fairseq's or ours.)"""
    from test_lm import build_lm, fairseq_lm, lm_task

    with pytest.raises(torch.jit.frontend.NotSupportedError, match="variable number"):
        torch.jit.script(fairseq_lm(lm_task(), normalize_before=True))
    model, task = build_lm("realformer_lm_tiny")
    model.eval()
    scripted = save_and_load(torch.jit.script(model))
    tokens = torch.randint(4, len(task.source_dictionary), (2, 7))
    with torch.no_grad():
        eager_out, eager_extra = model(tokens, return_all_hiddens=True)
        jit_out, jit_extra = scripted(tokens, return_all_hiddens=True)
        assert torch.equal(jit_out, eager_out)
        for eager_state, jit_state in zip(eager_extra["inner_states"], jit_extra["inner_states"]):
            assert torch.equal(jit_state, eager_state)
        features = model.decoder.extract_features(tokens, None)[0]
        assert torch.equal(scripted(tokens, features_only=True)[0], features)


@pytest.mark.parametrize("model_class", [RobertaModel, RealformerRobertaModel])
def test_roberta_does_not_script_in_fairseq_0_12_nor_here(model_class):
    """Said in docs/guarantees.md: fairseq's ``RobertaModel.forward`` takes ``**kwargs``."""
    from fairseq.models import ARCH_CONFIG_REGISTRY
    from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask

    dictionary = toy_dictionary()
    dictionary.add_symbol("<mask>")
    task = MaskedLMTask(MaskedLMConfig(tokens_per_sample=16), dictionary)
    arch = "roberta_base" if model_class is RobertaModel else "realformer_bert_tiny"
    args = argparse.Namespace(arch=arch, encoder_layers=2, encoder_embed_dim=32)
    args.encoder_ffn_embed_dim, args.encoder_attention_heads = 64, 2
    ARCH_CONFIG_REGISTRY[arch](args)
    model = model_class.build_model(args, task)
    with pytest.raises(torch.jit.frontend.NotSupportedError, match="variable number of arguments"):
        torch.jit.script(model)
