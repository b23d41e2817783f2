"""The eager route's kept stream (``one_stream_per_chain = True``, off by default) keeps one score stream
per chain for backward and rebuilds the earlier ones (modules/routes/kept_stream.py):
RealFormer's (He et al. 2020, arXiv 2012.11747)
``S_{l-1} = S_l - Q_l K_l^T / sqrt(d)`` in backward. Float64 chains against the plain route
(the eager route as it is, ``one_stream_per_chain = False``, whose autograd keeps every layer's
probabilities): the same outputs, bitwise, and the same gradients to float64 rounding, on the
three chains (encoder with padding and a fully padded sequence, decoder with the causal mask,
cross-attention), running sum and mean, with and without attention dropout, a 1-token sentence;
what the model keeps at 2 and 4 encoder layers; every fallback said once and exact; a 60-layer
float32 chain against float64 within the tolerance docs/reference.md states; a chain whose upper
layers get no gradient rebuilds the stream from the top."""

import copy
import logging

import pytest
import torch
from harness import NO_DROPOUT, build_translation_model, random_batch

from realformer_fairseq.modules.routes import kept_stream
from realformer_fairseq.modules.routes import shared
from realformer_fairseq.modules.routes import shared as route_warnings
from studies import stream_memory, stream_precision
from studies.bench_models import dummy_dictionary
from studies.route_precision import CASES, inputs, layer_of, run_chain

LOGGER = "realformer_fairseq.modules.routes.shared"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test sees the once-per-process warnings afresh."""
    monkeypatch.setattr(route_warnings, "_SAID", set())


def chain_pair(case, mode, depth, dropout=0.0, dtype=torch.float64):
    """``depth`` layers of ``case`` twice with the same weights: the plain route's and the
    kept stream's."""
    torch.manual_seed(0)
    plain = []
    for _ in range(depth):
        module = layer_of("eager", case).to(dtype)
        module.residual_attention_mode = mode
        module.dropout_module.p = dropout
        plain.append(module.train())
    assert not any(module.kept_stream for module in plain)  # off by default
    kept = copy.deepcopy(plain)
    for module in kept:
        module.one_stream_per_chain = True
    return plain, kept


def outputs_and_gradients(layers, case, length, dtype=torch.float64):
    """The chain's last output and the gradients of its inputs and of every parameter, for a
    fixed random weighting of the output (the dropout draws seeded)."""
    query, keys, attn_mask, padding = (
        None if t is None else t.to(dtype) if t.is_floating_point() else t
        for t in inputs(case, length)
    )
    query = query.requires_grad_()
    keys = None if keys is None else keys.requires_grad_()
    torch.manual_seed(3)
    out = run_chain(layers, query, keys, attn_mask, padding)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=dtype)
    (out * weight).sum().backward()
    grads = [query.grad] + ([] if keys is None else [keys.grad])
    grads += [p.grad for module in layers for p in module.parameters()]
    return out.detach(), grads


def assert_gradients_equal(want, got, tolerance=1e-13):
    """Every gradient within ``tolerance`` x the largest (some, such as the key biases', are
    zero in exact arithmetic and rounding noise here), all finite."""
    scale = max(g.abs().max().item() for g in want)
    assert scale > 0
    for a, b in zip(want, got):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=0, atol=tolerance * scale)


@pytest.fixture
def hand_overs(monkeypatch):
    """Counts the streams handed from a layer to the next, and the kept-stream backwards."""
    counts = {"hand_over": 0, "backward": 0}
    hand_over, backward = (
        shared.StreamLink.hand_over,
        kept_stream._KeptStreamAttention.backward,
    )

    def counting_hand_over(self, *args):
        counts["hand_over"] += 1
        return hand_over(self, *args)

    def counting_backward(ctx, *grads):
        counts["backward"] += 1
        return backward(ctx, *grads)

    monkeypatch.setattr(shared.StreamLink, "hand_over", counting_hand_over)
    monkeypatch.setattr(kept_stream._KeptStreamAttention, "backward", counting_backward)
    return counts


@pytest.mark.parametrize("mode, dropout", [("sum", 0.2), ("mean", 0.0)])
@pytest.mark.parametrize("case", CASES)
def test_a_deep_chain_has_the_plain_routes_outputs_and_gradients(case, mode, dropout, hand_overs):
    plain, kept = chain_pair(case, mode, depth=8, dropout=dropout)
    want_out, want = outputs_and_gradients(plain, case, length=12)
    assert hand_overs == {"hand_over": 0, "backward": 0}
    got_out, got = outputs_and_gradients(kept, case, length=12)
    assert hand_overs == {"hand_over": 7, "backward": 8}  # the chain ran linked
    assert torch.equal(got_out, want_out)  # the same operations: bitwise
    assert_gradients_equal(want, got)


@pytest.mark.parametrize("case", CASES)
def test_a_one_token_sentence(case):
    plain, kept = chain_pair(case, "mean", depth=3, dropout=0.2)
    want_out, want = outputs_and_gradients(plain, case, length=1)
    got_out, got = outputs_and_gradients(kept, case, length=1)
    assert torch.equal(got_out, want_out)
    assert_gradients_equal(want, got)


def test_a_chain_keeps_one_stream_whatever_its_depth():
    """What the realformer encoder-decoder keeps for backward (studies.stream_memory's count):
    with the kept stream, one float32 (batch*heads, T, T) stream per chain and the causal mask,
    at 2 and 4 encoder layers (6 decoder layers); the eager route keeps three T x T tensors per layer (the
    probabilities, CPU dropout's float mask and the dropped probabilities)."""
    dictionary = dummy_dictionary(100)
    tokens = 24  # not the width (64) nor the FFN's (256): only score-sized tensors match
    stream = f"{stream_memory.BATCH * stream_memory.SIZES['heads']}x{tokens}x{tokens} float32"
    for layers in (2, 4):
        kept = stream_memory.measure("eager_kept_stream", layers, tokens, dictionary)
        assert kept["score_sized_tensors"] == [f"{tokens}x{tokens} float32"] + [stream] * 3
        assert kept["held_by_route_nodes"].count(stream) == 3  # the chains' last streams
        plain = stream_memory.measure("eager", layers, tokens, dictionary)
        assert plain["score_sized_tensors"] == [stream] * 3 * (layers + 6 + 6)


def checkpointing_gradients(impl, caplog, kept_stream_on=False):
    """The parameters' gradients of realformer_tiny (float64, route ``impl``, the same weights)
    without and with fairseq's --checkpoint-activations (``kept_stream`` set on the second
    where ``kept_stream_on``), and the kept streams' WARNING lines."""
    models = []
    for checkpoint in (False, True):
        torch.manual_seed(0)
        model, dictionary = build_translation_model(
            "realformer_tiny", init_type="default", checkpoint_activations=checkpoint,
            residual_attention_impl=impl, **NO_DROPOUT,
        )  # fmt: skip
        models.append(model.double().train())
    for module in models[1].modules():
        if kept_stream_on and hasattr(module, "kept_stream"):
            module.one_stream_per_chain = True
    models[1].load_state_dict(models[0].state_dict())
    src, src_lengths, tgt = random_batch(dictionary)
    grads = []
    for model in models:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            model(src, src_lengths, tgt)[0].square().mean().backward()
        grads.append([p.grad for p in model.parameters()])
    return grads, [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_activation_checkpointing_keeps_per_layer_tensors_says_so_once_and_is_exact(caplog):
    """fairseq's --checkpoint-activations re-runs each layer's forward in backward, with a
    detached stream: those layers run the plain route."""
    grads, said = checkpointing_gradients("eager", caplog, kept_stream_on=True)
    assert_gradients_equal(grads[0], grads[1], tolerance=1e-12)
    assert len(said) == 1 and "--checkpoint-activations" in said[0], said


def test_a_stream_used_twice_is_kept_said_once_and_exact(caplog):
    """Two layers take the first layer's stream: it is kept as it is, nobody rebuilds it."""
    results = []
    for kept in (False, True):
        torch.manual_seed(0)
        layers = [layer_of("eager", CASES[1]).double() for _ in range(3)]
        for module in layers:
            module.one_stream_per_chain = kept
        query, _, _, padding = inputs(CASES[1], 10)
        query.requires_grad_()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            x, _, stream, _, _ = layers[0](query, query, query, key_padding_mask=padding)
            outs = [m(x, x, x, key_padding_mask=padding, prev_attn_scores=stream, layer_idx=1)
                    for m in layers[1:]]  # fmt: skip
            (outs[0][0].square().sum() + outs[1][2].sum() + outs[1][0].sum()).backward()
        results.append([query.grad] + [p.grad for m in layers for p in m.parameters()])
    assert_gradients_equal(*results)
    said = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(said) == 1 and "more than one layer" in said[0], said


def test_a_stream_from_the_caller_and_the_probabilities_asked_for_are_exact(caplog):
    """A previous stream that no kept-stream layer made (a leaf needing a gradient): the layer
    keeps its own, said once; the probabilities (need_weights) carry their gradient."""
    results = []
    for kept in (False, True):
        torch.manual_seed(0)
        layers = [layer_of("eager", CASES[0]).double() for _ in range(2)]
        for module in layers:
            module.one_stream_per_chain = kept
        query, _, attn_mask, padding = inputs(CASES[0], 10)
        query.requires_grad_()
        prev = torch.randn(4 * 4, 10, 10, dtype=torch.float64, requires_grad=True)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            x, weights, stream, _, _ = layers[0](
                query, query, query, key_padding_mask=padding, attn_mask=attn_mask,
                prev_attn_scores=prev, layer_idx=1, need_weights=True, need_head_weights=True,
            )  # fmt: skip
            x, mean_weights, _, _, _ = layers[1](
                x, x, x, key_padding_mask=padding, attn_mask=attn_mask, prev_attn_scores=stream,
                layer_idx=2, need_weights=True,
            )  # fmt: skip
        assert weights.shape == (4, 4, 10, 10) and mean_weights.shape == (4, 10, 10)
        (x.square().sum() + weights[:, :, :, 3].sum() + mean_weights.square().sum()).backward()
        results.append([query.grad, prev.grad] + [p.grad for m in layers for p in m.parameters()])
    assert_gradients_equal(*results)
    said = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(said) == 1 and "not made by a kept-stream layer" in said[0], said


def test_a_second_backward_or_a_changed_stream_raises():
    _, kept = chain_pair(CASES[1], "sum", depth=3)
    query, _, _, padding = inputs(CASES[1], 6)
    out = run_chain(kept, query.requires_grad_(), None, None, padding)
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError) as raised:
        out.sum().backward()
    assert str(raised.value) == (
        "residual attention: the chain's kept score stream is gone: a second backward through "
        "the same graph (retain_graph=True); set the attention modules' one_stream_per_chain to "
        "False for this"
    )
    x, _, stream, _, _ = kept[0](query, query, query, key_padding_mask=padding)
    with torch.no_grad():
        stream.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        (x.sum() + stream.sum()).backward()


def test_a_stream_the_caller_holds_keeps_its_values():
    """The chain's last stream, held by the caller through backward (a model that returns it),
    is copied before the rebuild writes the streams below over it: it keeps its values."""
    _, kept = chain_pair(CASES[1], "sum", depth=3)
    query, _, _, padding = inputs(CASES[1], 6)
    x, stream, streams = query.requires_grad_(), None, []
    for idx, module in enumerate(kept):
        x, _, stream, _, _ = module(x, x, x, key_padding_mask=padding, prev_attn_scores=stream,
                                    layer_idx=idx)  # fmt: skip
        streams.append(stream)
    before = [s.detach().clone() for s in streams]
    (x.sum() + stream.square().sum()).backward()
    for held, value in zip(streams, before):
        assert torch.equal(held.detach(), value)


def test_the_chain_rebuilds_its_one_stream_in_place(monkeypatch):
    """Four layers: each rebuild (a link kept again, by the backward of the layer above it)
    writes into one buffer, a copy of the chain's last stream, which the caller holds (storage
    identity). Fails where ``writable_stream`` copies a stream nobody else holds."""
    rebuilt, kept_once, keep = [], {}, shared.StreamLink.keep

    def recording_keep(self, stream):
        if id(self) in kept_once:
            rebuilt.append(stream.untyped_storage().data_ptr())  # the address: no reference
        kept_once[id(self)] = self  # held, so that no later link takes a freed one's id
        return keep(self, stream)

    monkeypatch.setattr(shared.StreamLink, "keep", recording_keep)
    _, kept = chain_pair(CASES[1], "sum", depth=4)
    query, _, _, padding = inputs(CASES[1], 6)
    x, stream = query.requires_grad_(), None
    for idx, module in enumerate(kept):
        x, _, stream, _, _ = module(x, x, x, key_padding_mask=padding, prev_attn_scores=stream,
                                    layer_idx=idx)  # fmt: skip
    (x.sum() + stream.square().sum()).backward()
    assert len(rebuilt) == 3  # S_3, S_2, S_1
    assert len(set(rebuilt)) == 1, "a layer's backward copied the stream it rebuilds"
    assert rebuilt[0] != stream.untyped_storage().data_ptr()  # the caller's: copied once


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_layers_above_without_gradient_leave_the_stream_rebuilt_from_the_top(mode, hand_overs):
    """Layers 2 and 3 take the streams of 1 and 2, but only layer 1's output reaches the loss
    (as in transformer_align's --full-context-alignment pass): their backward never runs, and
    layer 1 rebuilds its stream from layer 3's kept one; layer 0's comes from layer 1."""
    results = []
    for kept in (False, True):
        torch.manual_seed(0)
        layers = [layer_of("eager", CASES[0]).double() for _ in range(4)]
        for module in layers:
            module.one_stream_per_chain = kept
            module.residual_attention_mode = mode
        query, _, attn_mask, padding = inputs(CASES[0], 10)
        query.requires_grad_()
        x, stream, outs = query, None, []
        for idx, module in enumerate(layers):
            x, _, stream, _, _ = module(
                x, x, x, key_padding_mask=padding, attn_mask=attn_mask,
                prev_attn_scores=stream, layer_idx=idx,
            )  # fmt: skip
            outs.append(x)
        outs[1].square().sum().backward()
        results.append([query.grad] + [p.grad for m in layers[:2] for p in m.parameters()])
    assert hand_overs == {"hand_over": 3, "backward": 2}
    assert_gradients_equal(*results)


# max |error| / max |value| of a 60-layer float32 chain against float64 (gradients; rebuilt
# streams against the forward's) that the tests hold: docs/reference.md, "The eager route's kept
# stream" (measured: 1e-6 at most, as the plain route's float32 gradients)
FLOAT32_60_LAYERS = 1e-5


@pytest.mark.parametrize(
    "depth", [16, pytest.param(60, marks=pytest.mark.slow)]  # 60: 3.5 s of CPU
)
def test_a_deep_float32_chain_is_within_the_float32_tolerance_of_float64(depth):
    """The rebuilt stream is off by a rounding per layer; over the paper's 60 layers (16 in
    the default suite) the gradients stay within the float32 tolerance (encoder chain,
    running sum, 8 tokens)."""
    case, length = CASES[1], 8
    reference = stream_precision.chain(case, "sum", depth)
    truth = stream_precision.run(reference, case, length, torch.float64)
    kept = [m.float() for m in copy.deepcopy(reference)]
    for module in kept:
        module.one_stream_per_chain = True
    got = stream_precision.run(kept, case, length, torch.float32)
    assert stream_precision.gradient_error(got, truth) < FLOAT32_60_LAYERS


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("case", CASES)
def test_60_layer_rebuilt_streams_and_gradients_within_the_stated_tolerance(case, mode):
    """studies.stream_precision's measurement: every rebuilt stream of the 60 layers, and
    the gradients, within the tolerance, on each chain (16 tokens, four sequences)."""
    row = stream_precision.measure(case, mode)
    assert row["stream_rebuilt_vs_forward_float32"] < FLOAT32_60_LAYERS
    assert row["gradient_kept_stream_float32"] < FLOAT32_60_LAYERS
    assert row["gradient_plain_float32"] < FLOAT32_60_LAYERS
