"""The triton route keeps one score stream per chain for backward and rebuilds the earlier ones
in its key-block kernel (issue 51): RealFormer's (He et al. 2020, arXiv 2012.11747)
``S_{l-1} = S_l - Q_l K_l^T / sqrt(d)``, written over ``S_l`` by the program that owns those
key columns, and the previous stream's gradient written over the incoming one.

Float64 chains of the route's modules, the kernels under Triton's interpreter, against the
eager route (the same weights; the formula the kernel tests check the kernels against) and
against the same modules with ``one_stream_per_chain = False`` (every layer keeping its own
stream, as before): the three chains (decoder self-attention with the causal mask, encoder
self-attention, cross-attention; four sequences: unpadded, right half padded, left half padded,
fully padded), running sum and mean, attention dropout, a 1-token sentence; what the model keeps
at 2 and 4 encoder layers; every fallback said once and exact; a stream the caller holds is
left as it was; a 60-layer float32 chain against float64 within the stated tolerance. Needs
triton (``pip install -e '.[triton]'``; .ci/run's triton job); skipped without it.

TRITON_INTERPRET=1 is set at collection, before anything imports triton (see
tests/test_triton_kernels.py)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import copy  # noqa: E402
import logging  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# out of the default suite, run by -m triton (.ci/run's triton job)
pytestmark = pytest.mark.triton

pytest.importorskip(
    "triton", reason="triton is not installed (the triton extra: pip install -e '.[triton]')"
)

from test_kept_stream import checkpointing_gradients  # noqa: E402

from realformer_fairseq.modules.routes import shared  # noqa: E402
from realformer_fairseq.modules.routes import shared as route_warnings
from realformer_fairseq.modules.routes import triton_function as ta  # noqa: E402
from studies import stream_memory, stream_precision  # noqa: E402
from studies.bench_models import dummy_dictionary  # noqa: E402
from studies.route_precision import CASES, inputs, layer_of, run_chain  # noqa: E402

LOGGER = "realformer_fairseq.modules.routes.shared"
EMBED = 32  # 4 heads of 8 (the kernels pad them to 16): small, for the interpreter


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test sees the once-per-process warnings afresh."""
    monkeypatch.setattr(route_warnings, "_SAID", set())


@pytest.fixture
def links(monkeypatch):
    """Counts the streams handed from a layer to the next, and the streams rebuilt in backward
    (a link that keeps a second time)."""
    counts = {"hand_over": 0, "rebuilt": 0}
    hand_over, keep = shared.StreamLink.hand_over, shared.StreamLink.keep
    kept_once = {}  # id -> link: held, so that no later link takes a freed one's id

    def counting_hand_over(self, *args):
        counts["hand_over"] += 1
        return hand_over(self, *args)

    def counting_keep(self, stream):
        if id(self) in kept_once:
            counts["rebuilt"] += 1
        kept_once[id(self)] = self
        return keep(self, stream)

    monkeypatch.setattr(shared.StreamLink, "hand_over", counting_hand_over)
    monkeypatch.setattr(shared.StreamLink, "keep", counting_keep)
    return counts


def chains(case, mode, depth, dropout=0.0):
    """``depth`` float64 layers of ``case`` three times with the same weights: the eager route,
    the triton route keeping every layer's stream, the triton route keeping one per chain."""
    torch.manual_seed(0)
    eager, own, one = [], [], []
    for _ in range(depth):
        module = layer_of("eager", case, EMBED, dropout).double().train()
        module.residual_attention_mode = mode
        eager.append(module)
        for route_layers, per_chain in ((own, False), (one, True)):
            fused = layer_of("triton", case, EMBED, dropout).double().train()
            fused.residual_attention_mode = mode
            fused.load_state_dict(module.state_dict())
            assert fused.one_stream_per_chain  # on by default
            fused.one_stream_per_chain = per_chain
            route_layers.append(fused)
    return eager, own, one


def outputs_and_gradients(layers, case, length, seed=3):
    """The chain's last output and the gradients of its inputs and of every parameter, for a
    fixed random weighting of the output (the dropout seeds drawn after ``seed``)."""
    query, keys, attn_mask, padding = inputs(case, length, EMBED)
    query = query.requires_grad_()
    keys = None if keys is None else keys.requires_grad_()
    torch.manual_seed(seed)
    out = run_chain(layers, query, keys, attn_mask, padding)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
    (out * weight).sum().backward()
    grads = [query.grad] + ([] if keys is None else [keys.grad])
    grads += [p.grad for module in layers for p in module.parameters()]
    return out.detach(), grads


def assert_gradients_equal(want, got, tolerance=1e-12):
    """Every gradient within ``tolerance`` x the largest, all finite."""
    scale = max(g.abs().max().item() for g in want)
    assert scale > 0
    for a, b in zip(want, got):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=0, atol=tolerance * scale)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("case", CASES)
def test_a_chain_rebuilds_its_streams_and_has_the_eager_routes_gradients(case, mode, links):
    eager, own, one = chains(case, mode, depth=5)
    want_out, want = outputs_and_gradients(eager, case, length=13)
    own_out, own_grads = outputs_and_gradients(own, case, length=13)
    assert links == {"hand_over": 0, "rebuilt": 0}
    got_out, got = outputs_and_gradients(one, case, length=13)
    assert links == {"hand_over": 4, "rebuilt": 4}  # the chain ran linked, rebuilt 4 streams
    assert torch.equal(got_out, own_out)  # the same forward
    torch.testing.assert_close(got_out, want_out, rtol=0, atol=1e-12)
    assert_gradients_equal(want, got)
    assert_gradients_equal(own_grads, got, tolerance=1e-13)


@pytest.mark.parametrize("case", CASES)
def test_dropout_and_a_one_token_sentence(case, links):
    """With attention dropout 0.2 (the kernel's own draw, replayed in backward from its seed):
    the same gradients as the layers that keep their own streams; and a 1-token sentence."""
    for length in (11, 1):
        _, own, one = chains(case, "mean", depth=3, dropout=0.2)
        own_out, want = outputs_and_gradients(own, case, length)
        got_out, got = outputs_and_gradients(one, case, length)
        assert torch.equal(got_out, own_out)
        assert_gradients_equal(want, got, tolerance=1e-13)
    assert links["rebuilt"] == 2 * 2


def test_a_chain_keeps_one_stream_whatever_its_depth():
    """What the realformer encoder-decoder keeps for backward on the triton route
    (studies.stream_memory's count), the same at 2 and 4 encoder layers (6 decoder layers): one
    float32 (batch*heads, T, T) stream per chain, held by the kernels' nodes; no causal mask
    (made in the kernels). And the probabilities of the last decoder layer's cross-attention
    (the softmax's output): fairseq's decoder asks every forward for the attention
    probabilities of its alignment layer (the last)."""
    dictionary = dummy_dictionary(100)
    tokens = 24  # not the width (64) nor the FFN's (256): only score-sized tensors match
    stream = f"{stream_memory.BATCH * stream_memory.SIZES['heads']}x{tokens}x{tokens} float32"
    for layers in (2, 4):
        kept = stream_memory.measure("triton", layers, tokens, dictionary)
        assert kept["held_by_route_nodes"] == [stream] * 3
        assert kept["score_sized_tensors"] == [stream] * 4


def test_activation_checkpointing_keeps_per_layer_streams_says_so_once_and_is_exact(caplog):
    """fairseq's --checkpoint-activations re-runs each layer's forward in backward, with a
    detached stream: each layer keeps its own stream then, said once."""
    grads, said = checkpointing_gradients("triton", caplog)
    assert_gradients_equal(grads[0], grads[1], tolerance=1e-12)
    assert len(said) == 1 and "--checkpoint-activations" in said[0], said
    assert said[0].startswith("residual attention, triton route: ")


def test_a_stream_used_twice_is_kept_said_once_and_exact(caplog):
    """Two layers take the first layer's stream: it is kept as it is, nobody rebuilds it."""
    case = CASES[1]
    results = []
    for per_chain in (False, True):
        _, layers, _ = chains(case, "sum", depth=3)
        for module in layers:
            module.one_stream_per_chain = per_chain
        query, _, _, padding = inputs(case, 10, EMBED)
        query.requires_grad_()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            x, _, stream, _, _ = layers[0](query, query, query, key_padding_mask=padding,
                                           need_weights=False)  # fmt: skip
            outs = [m(x, x, x, key_padding_mask=padding, prev_attn_scores=stream, layer_idx=1,
                      need_weights=False) for m in layers[1:]]  # fmt: skip
            (outs[0][0].square().sum() + outs[1][2].sum() + outs[1][0].sum()).backward()
        results.append([query.grad] + [p.grad for m in layers for p in m.parameters()])
    assert_gradients_equal(*results, tolerance=1e-13)
    said = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(said) == 1 and "more than one layer" in said[0], said
    assert "triton route" in said[0] and "keeps its own stream" in said[0]


def test_a_stream_of_an_eager_layer_is_kept_said_once_and_exact(caplog):
    """A layer on the eager route in the chain (here the eager module itself, as where a call
    falls back) hands the next layer a stream the kernel did not make: that layer keeps its own,
    said once; the layer before the eager one keeps its own (nobody takes it over)."""
    case = CASES[0]
    results = []
    for per_chain in (False, True):
        eager, layers, _ = chains(case, "mean", depth=3)
        layers[1] = eager[1]
        for module in layers[::2]:
            module.one_stream_per_chain = per_chain
        query, _, attn_mask, padding = inputs(case, 10, EMBED)
        query.requires_grad_()
        x, stream = query, None
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            for idx, module in enumerate(layers):
                x, _, stream, _, _ = module(
                    x, x, x, key_padding_mask=padding, attn_mask=attn_mask, need_weights=False,
                    prev_attn_scores=stream, layer_idx=idx,
                )  # fmt: skip
        assert layers[0].last_kernel == layers[2].last_kernel == ta_fused()
        x.square().sum().backward()
        results.append([query.grad] + [p.grad for m in layers for p in m.parameters()])
    assert_gradients_equal(*results, tolerance=1e-13)
    said = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(said) == 1 and "not made by the kernel" in said[0], said


def ta_fused():
    from realformer_fairseq.modules.routes.triton_route import FUSED

    return FUSED


def test_a_second_backward_raises_unless_each_layer_keeps_its_own():
    case = CASES[1]
    query, _, _, padding = inputs(case, 6, EMBED)
    for per_chain in (True, False):
        _, _, layers = chains(case, "sum", depth=3)
        for module in layers:
            module.one_stream_per_chain = per_chain
        out = run_chain(layers, query.clone().requires_grad_(), None, None, padding)
        out.sum().backward(retain_graph=True)
        if per_chain:
            with pytest.raises(RuntimeError, match="kept score stream is gone"):
                out.sum().backward()
        else:
            out.sum().backward()


def test_the_streams_a_caller_holds_keep_their_values_and_hooks_see_their_gradient():
    """The chain's last stream, held by the caller through backward, is copied before the
    rebuild, never changed; a gradient hook on a stream in the chain gets the gradient the
    layers that keep their own streams give it, not the one written over it later."""
    case = CASES[1]
    query, _, _, padding = inputs(case, 9, EMBED)
    seen = {}
    for per_chain in (False, True):
        _, _, layers = chains(case, "sum", depth=4)
        for module in layers:
            module.one_stream_per_chain = per_chain
        x, stream, streams = query.clone().requires_grad_(), None, []
        for idx, module in enumerate(layers):
            x, _, stream, _, _ = module(x, x, x, key_padding_mask=padding, need_weights=False,
                                        prev_attn_scores=stream, layer_idx=idx)  # fmt: skip
            streams.append(stream)
            if idx == 1:
                hooked = []
                stream.register_hook(hooked.append)
        before = [s.detach().clone() for s in streams]
        (x.square().sum() + stream.square().sum()).backward()
        for held, value in zip(streams, before):
            assert torch.equal(held.detach(), value)
        seen[per_chain] = hooked[0].clone()
    torch.testing.assert_close(seen[True], seen[False], rtol=0, atol=1e-12)


def test_layers_above_without_gradient_leave_the_stream_rebuilt_from_the_top(links):
    """Layers 2 and 3 take the streams of 1 and 2, but only layer 1's output reaches the loss
    (as in transformer_align's --full-context-alignment pass): their backward never runs, and
    layer 1 rebuilds its stream from layer 3's kept one, in torch; layer 0's comes from layer
    1's kernel."""
    case = CASES[0]
    results = []
    for per_chain in (False, True):
        _, layers, _ = chains(case, "mean", depth=4)
        for module in layers:
            module.one_stream_per_chain = per_chain
        query, _, attn_mask, padding = inputs(case, 10, EMBED)
        query.requires_grad_()
        x, stream, outs = query, None, []
        for idx, module in enumerate(layers):
            x, _, stream, _, _ = module(
                x, x, x, key_padding_mask=padding, attn_mask=attn_mask, need_weights=False,
                prev_attn_scores=stream, layer_idx=idx,
            )  # fmt: skip
            outs.append(x)
        outs[1].square().sum().backward()
        results.append([query.grad] + [p.grad for m in layers[:2] for p in m.parameters()])
    assert links["hand_over"] == 3
    assert_gradients_equal(*results, tolerance=1e-13)


# max |error| / max |value| over a 60-layer float32 chain that the tests hold, as for the eager
# route's rebuild (tests/test_kept_stream.py; docs/reference.md)
FLOAT32_60_LAYERS = 1e-5


def test_a_60_layer_float32_chain_is_within_the_stated_tolerance_of_float64():
    """studies.stream_precision's triton row of the encoder chain, running sum: the rebuilt
    streams and the gradients of a 60-layer float32 chain against float64 eager, within the
    tolerance tests/test_kept_stream.py holds the eager route's rebuild to."""
    row = stream_precision.measure(CASES[1], "sum", route="triton", length=8)
    assert row["stream_rebuilt_vs_forward_float32"] < FLOAT32_60_LAYERS
    assert row["gradient_kept_stream_float32"] < FLOAT32_60_LAYERS
    assert row["gradient_plain_float32"] < FLOAT32_60_LAYERS
