"""Incremental decoding of RealFormer (He et al. 2020): step-by-step decoding with
fairseq's incremental state and beam reordering equals the full forward."""

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator
from harness import (
    NO_DROPOUT,
    beam_decode_with_reordering,
    build_translation_model,
    random_batch,
)


@pytest.mark.parametrize(
    "arch,overrides",
    [
        ("realformer_tiny", {"residual_attention_mode": "mean"}),
        (
            "realformer_tiny",
            {"residual_attention_mode": "sum", "encoder_layers": 3, "decoder_layers": 3},
        ),
        (
            "realformer_tiny",
            {
                "residual_attention": "decoder,cross",
                "decoder_normalize_before": True,
                "encoder_normalize_before": True,
            },
        ),
        ("postln_transformer_tiny", {}),
    ],
)
def test_incremental_decoding_with_beam_reordering_equals_full_forward(arch, overrides):
    torch.manual_seed(0)
    model, dictionary = build_translation_model(
        arch, init_type="default", **NO_DROPOUT, **overrides
    )
    model.eval()
    src, src_lengths, _ = random_batch(dictionary, bsz=3, src_len=8, pad_rows=(0, 2))
    incremental, full_logits = beam_decode_with_reordering(
        model, dictionary, src, src_lengths, beam=4, steps=6
    )
    torch.testing.assert_close(incremental, full_logits, atol=1e-5, rtol=0)


def test_sequence_generator_beam5_lenpen_scores_equal_full_forward_rescoring():
    torch.manual_seed(0)
    model, dictionary = build_translation_model(
        "realformer_tiny", init_type="default", **NO_DROPOUT
    )
    model.eval()
    src, src_lengths, _ = random_batch(dictionary, bsz=4, src_len=8, pad_rows=(1, 3))
    generator = SequenceGenerator([model], dictionary, beam_size=5, len_penalty=0.8, max_len_b=10)
    hypos = generator.forward({"net_input": {"src_tokens": src, "src_lengths": src_lengths}})
    assert len(hypos) == 4 and all(len(h) == 5 for h in hypos)
    # rescoring the best hypothesis with a full forward gives the generator's
    # positional scores (incremental and full paths agree inside beam search)
    for i, sent in enumerate(hypos):
        best = sent[0]
        target = best["tokens"].unsqueeze(0)
        prev = torch.cat([torch.tensor([[dictionary.eos()]]), target[:, :-1]], dim=1)
        with torch.no_grad():
            out = model(src[i : i + 1], src_lengths[i : i + 1], prev)
            lprobs = model.get_normalized_probs(out, log_probs=True)
        positional = lprobs.gather(-1, target.unsqueeze(-1)).view(-1)
        torch.testing.assert_close(positional, best["positional_scores"], atol=1e-4, rtol=0)
