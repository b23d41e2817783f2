"""Incremental decoding of RealFormer (He et al. 2020): step-by-step decoding with
fairseq's incremental state and beam reordering equals the full forward."""

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator
from harness import NO_DROPOUT, build_translation_model, random_batch


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
    bsz, beam, steps = 3, 4, 6
    src, src_lengths, _ = random_batch(dictionary, bsz=bsz, src_len=8, pad_rows=(0, 2))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths)
        # expand to bsz * beam hypotheses, as SequenceGenerator does
        expand = torch.arange(bsz).view(-1, 1).repeat(1, beam).view(-1)
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, expand)

        tokens = torch.full((bsz * beam, 1), dictionary.eos(), dtype=torch.long)
        incremental_state = {}
        step_logits = []
        for step in range(steps):
            if step > 0:
                # reorder hypotheses within each sentence (beam search's reordering)
                perm = torch.stack([torch.randperm(beam, generator=g) for _ in range(bsz)])
                new_order = (perm + torch.arange(bsz).view(-1, 1) * beam).view(-1)
                model.decoder.reorder_incremental_state_scripting(incremental_state, new_order)
                tokens = tokens.index_select(0, new_order)
                step_logits = [x.index_select(0, new_order) for x in step_logits]
            logits, _ = model.decoder(
                tokens, encoder_out=encoder_out, incremental_state=incremental_state
            )
            step_logits.append(logits[:, -1])
            nxt = torch.randint(dictionary.nspecial, len(dictionary), (bsz * beam, 1), generator=g)
            tokens = torch.cat([tokens, nxt], dim=1)

        full_logits, _ = model.decoder(tokens[:, :steps], encoder_out=encoder_out)
    incremental = torch.stack(step_logits, dim=1)
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
