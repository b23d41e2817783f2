"""The fairseq code this plugin re-owns still computes what fairseq 0.12.3 computes.

RealFormer (He et al. 2020, arXiv 2012.11747) needs the raw attention scores, which
fairseq's fused path never exposes, so ``RealformerMultiheadAttention`` re-owns the
eager (non-fused) path of ``MultiheadAttention.forward`` and the encoder/decoder re-own
their layer loops. These tests hold that copy to fairseq's own code with the same
weights, so that drift (a fairseq upgrade, an edit here) is caught:

- the module with ``prev_attn_scores=None`` in ``sum`` mode equals fairseq's
  ``MultiheadAttention`` forced onto its eager path (``_set_skip_embed_dim_check``),
  in training (dropout, same seed) and evaluation, with padding and future masks,
  ``need_weights`` / ``need_head_weights``, and step by step in incremental decoding
  with ``reorder_incremental_state`` between steps;
- the encoder and decoder loops with residual attention off equal fairseq's
  ``transformer`` step by step in incremental decoding with beam reordering.
"""

import pytest
import torch
from fairseq.modules import MultiheadAttention
from harness import (
    NO_DROPOUT,
    build_fairseq_tiny_transformer,
    build_translation_model,
    random_batch,
)

from realformer_fairseq.modules.routes import RealformerMultiheadAttention

EMBED_DIM, HEADS = 16, 4


def attention_pair(kind: str, dropout: float = 0.0):
    """fairseq's module on its eager path and ours in sum mode, with the same weights."""
    flags = {"self_attention": True} if kind == "self" else {"encoder_decoder_attention": True}
    torch.manual_seed(0)
    fairseq_attn = MultiheadAttention(EMBED_DIM, HEADS, dropout=dropout, **flags)
    fairseq_attn._set_skip_embed_dim_check()  # never F.multi_head_attention_forward
    ours = RealformerMultiheadAttention(
        EMBED_DIM, HEADS, residual_attention_mode="sum", dropout=dropout, **flags
    )
    ours.load_state_dict(fairseq_attn.state_dict())
    return fairseq_attn, ours


def attention_inputs(kind: str, tgt_len: int = 5, src_len: int = 7, bsz: int = 3):
    """query/key/value, a key padding mask with one padded row and, for
    self-attention, fairseq's additive future mask (-inf above the diagonal)."""
    g = torch.Generator().manual_seed(1)
    query = torch.randn(tgt_len, bsz, EMBED_DIM, generator=g)
    if kind == "self":
        key = value = query
        key_len = tgt_len
        attn_mask = torch.triu(torch.full((tgt_len, tgt_len), float("-inf")), 1)
    else:
        key = value = torch.randn(src_len, bsz, EMBED_DIM, generator=g)
        key_len = src_len
        attn_mask = None
    padding = torch.zeros(bsz, key_len, dtype=torch.bool)
    padding[1, key_len - 2 :] = True
    return query, key, value, padding, attn_mask


@pytest.mark.parametrize("kind", ["self", "cross"])
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize(
    "weights", [{"need_weights": False}, {"need_weights": True}, {"need_head_weights": True}]
)
def test_attention_equals_fairseq_eager_path(kind, training, weights):
    fairseq_attn, ours = attention_pair(kind, dropout=0.2)
    fairseq_attn.train(training)
    ours.train(training)
    query, key, value, padding, attn_mask = attention_inputs(kind)
    masks = dict(key_padding_mask=padding, attn_mask=attn_mask)

    torch.manual_seed(7)
    expected_out, expected_weights = fairseq_attn(query, key, value, **masks, **weights)
    torch.manual_seed(7)
    out, attn_weights, scores, _, _ = ours(query, key, value, **masks, **weights)

    assert torch.equal(out, expected_out)
    if weights.get("need_weights") is False:
        assert attn_weights is None and expected_weights is None
    else:
        expected_shape = (HEADS, 3, 5, query.shape[0] if kind == "self" else 7)
        if not weights.get("need_head_weights"):
            expected_shape = expected_shape[1:]
        assert expected_weights.shape == expected_shape
        assert torch.equal(attn_weights, expected_weights)
    # the stream of a chain's first layer is fairseq's raw pre-softmax scores
    raw_scores, _ = fairseq_attn(query, key, value, before_softmax=True)
    assert torch.equal(scores, raw_scores)


def test_dropout_really_differs_between_seeds():
    """The training comparison above is meaningful: dropout is on, so the outputs
    depend on the seed, and equality needs the same dropout mask."""
    fairseq_attn, _ = attention_pair("self", dropout=0.2)
    fairseq_attn.train()
    query, key, value, padding, attn_mask = attention_inputs("self")
    torch.manual_seed(7)
    first, _ = fairseq_attn(query, key, value, key_padding_mask=padding, attn_mask=attn_mask)
    torch.manual_seed(8)
    second, _ = fairseq_attn(query, key, value, key_padding_mask=padding, attn_mask=attn_mask)
    assert not torch.allclose(first, second, atol=1e-3)


def beam_orders(bsz: int, beam: int, steps: int, seed: int = 3):
    """Random hypothesis reorderings within each sentence, as beam search makes them."""
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.stack([torch.randperm(beam, generator=g) for _ in range(bsz)])
            + torch.arange(bsz).view(-1, 1) * beam
        ).view(-1)
        for _ in range(steps)
    ]


@pytest.mark.parametrize("kind", ["self", "cross", "cross-beam-aware"])
def test_attention_incremental_steps_with_reordering_equal_fairseq(kind):
    """``cross-beam-aware``: after fairseq's ``set_beam_size``, the beams of a sentence share
    one copy of its encoder keys (fairseq's ``beam_size`` branch: the key is reduced to one
    beam per sentence and the products are batched per sentence)."""
    fairseq_attn, ours = attention_pair("self" if kind == "self" else "cross")
    fairseq_attn.eval()
    ours.eval()
    bsz, beam, steps, src_len = 2, 3, 5, 6
    if kind == "cross-beam-aware":
        fairseq_attn.set_beam_size(beam)
        ours.set_beam_size(beam)
    g = torch.Generator().manual_seed(2)
    # every beam of a sentence sees the same encoder output (fairseq expands it)
    encoder_out = torch.randn(src_len, bsz, EMBED_DIM, generator=g).repeat_interleave(beam, 1)
    encoder_padding = torch.zeros(bsz * beam, src_len, dtype=torch.bool)
    encoder_padding[:beam, :2] = True  # first sentence's source is left-padded
    fairseq_state, our_state = {}, {}
    reorders = beam_orders(bsz, beam, steps)
    for step in range(steps):
        if step > 0:
            fairseq_attn.reorder_incremental_state(fairseq_state, reorders[step])
            ours.reorder_incremental_state(our_state, reorders[step])
        query = torch.randn(1, bsz * beam, EMBED_DIM, generator=g)
        if kind == "self":
            call = dict(key=query, value=query, key_padding_mask=None)
        else:
            call = dict(key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding)
            call["static_kv"] = True
        expected_out, expected_weights = fairseq_attn(
            query, incremental_state=fairseq_state, need_head_weights=True, **call
        )
        out, attn_weights, scores, _, _ = ours(
            query, incremental_state=our_state, need_head_weights=True, **call
        )
        assert torch.equal(out, expected_out), f"step {step}"
        assert torch.equal(attn_weights, expected_weights), f"step {step}"
        expected_keys = step + 1 if kind == "self" else src_len
        assert scores.shape == (bsz * beam * HEADS, 1, expected_keys)
        for name in ("prev_key", "prev_value"):
            theirs = fairseq_attn._get_input_buffer(fairseq_state)[name]
            mine = ours._get_input_buffer(our_state)[name]
            assert torch.equal(mine, theirs), f"{name} at step {step}"
            # the beam-aware branch ran: one cached copy per sentence, not per hypothesis
            cached_rows = bsz if kind == "cross-beam-aware" else bsz * beam
            assert mine.shape[0] == cached_rows, name


def model_pair(variant: str):
    """Our model with residual attention off and fairseq's ``transformer`` with the
    same weights (3L-2L, 64 wide, 2 heads)."""
    sizes = dict(encoder_layers=3, decoder_layers=2, share_all_embeddings=True, **NO_DROPOUT)
    norm_before = variant == "preln"
    torch.manual_seed(0)
    ours, dictionary = build_translation_model(
        f"{variant}_transformer_tiny", init_type="default", **sizes
    )
    vanilla, _ = build_fairseq_tiny_transformer(
        encoder_normalize_before=norm_before, decoder_normalize_before=norm_before, **sizes
    )
    assert type(vanilla).__name__ == "TransformerModel"
    assert ours.encoder.layers[0].normalize_before is norm_before
    state = {k: v for k, v in ours.state_dict().items() if k != "admin_profiled"}
    missing, unexpected = vanilla.load_state_dict(state, strict=False)
    assert not missing and not unexpected
    return ours.eval(), vanilla.eval(), dictionary


@pytest.mark.parametrize("variant", ["postln", "preln"])
def test_decoder_loop_incremental_with_reordering_equals_fairseq_transformer(variant):
    ours, vanilla, dictionary = model_pair(variant)
    bsz, beam, steps = 2, 3, 5
    src, src_lengths, _ = random_batch(dictionary, bsz=bsz, src_len=8, pad_rows=(0,))
    expand = torch.arange(bsz).view(-1, 1).repeat(1, beam).view(-1)
    reorders = beam_orders(bsz, beam, steps)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        our_enc = ours.encoder(src, src_lengths, return_all_hiddens=True)
        vanilla_enc = vanilla.encoder(src, src_lengths, return_all_hiddens=True)
        for key in ("encoder_out", "encoder_padding_mask", "encoder_states", "src_lengths"):
            assert len(our_enc[key]) == len(vanilla_enc[key]), key
            for mine, theirs in zip(our_enc[key], vanilla_enc[key]):
                assert torch.equal(mine, theirs), key
        assert len(our_enc["encoder_states"]) == 3 + 1
        our_enc = ours.encoder.reorder_encoder_out(our_enc, expand)
        vanilla_enc = vanilla.encoder.reorder_encoder_out(vanilla_enc, expand)

        tokens = torch.full((bsz * beam, 1), dictionary.eos(), dtype=torch.long)
        our_state, vanilla_state = {}, {}
        for step in range(steps):
            if step > 0:
                ours.decoder.reorder_incremental_state_scripting(our_state, reorders[step])
                vanilla.decoder.reorder_incremental_state_scripting(vanilla_state, reorders[step])
                tokens = tokens.index_select(0, reorders[step])
            our_logits, our_extra = ours.decoder(
                tokens, encoder_out=our_enc, incremental_state=our_state
            )
            logits, extra = vanilla.decoder(
                tokens, encoder_out=vanilla_enc, incremental_state=vanilla_state
            )
            assert our_logits.shape == (bsz * beam, 1, len(dictionary))
            assert torch.equal(our_logits, logits), f"step {step}"
            assert torch.equal(our_extra["attn"][0], extra["attn"][0]), f"step {step}"
            assert len(our_extra["inner_states"]) == 2 + 1
            for mine, theirs in zip(our_extra["inner_states"], extra["inner_states"]):
                assert torch.equal(mine, theirs), f"step {step}"
            nxt = torch.randint(dictionary.nspecial, len(dictionary), (bsz * beam, 1), generator=g)
            tokens = torch.cat([tokens, nxt], dim=1)
