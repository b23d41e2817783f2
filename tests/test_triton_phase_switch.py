"""The triton route's phase switch: a chain's first D layers run the concat phase (RealFormer's,
He et al. 2020, arXiv 2012.11747, ``S_l = sum_{i<=l} Q_i K_i^T`` recomputed from the chain's
queries and keys, no T x T tensor), layer D forms the stream once and runs the stream kernels.

Float64 chains of the route's modules, the kernels under Triton's interpreter, against the
eager route with the same weights, within 1e-12 of the largest gradient: the three chains, sum
and mean, padding, one token, chains that cross the switch and chains within it; the stream
formed early where a layer needs it (``need_weights``, an eager fallback); ``last_route``;
what a training forward keeps (no T x T tensor within D); activation checkpointing off the
concat phase; D from the rule for the interpreter's shapes. D is patched small here (the
rule's D at these few tokens is 0: the interpreter runs an H100's depths). Needs triton
(``pip install -e '.[triton]'``; .ci/run's triton job); skipped without it."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import logging  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# out of the default suite, run by -m triton (.ci/run's triton job)
pytestmark = pytest.mark.triton

pytest.importorskip(
    "triton", reason="triton is not installed (the triton extra: pip install -e '.[triton]')"
)

from test_kept_stream import checkpointing_gradients  # noqa: E402

from realformer_fairseq.modules.routes import rules  # noqa: E402
from realformer_fairseq.modules.routes import triton_route  # noqa: E402
from realformer_fairseq.modules.routes import shared as route_warnings  # noqa: E402
from studies.route_precision import CASES, inputs, layer_of  # noqa: E402
from studies.stream_memory import node_held_tensors  # noqa: E402

EMBED = 32  # 4 heads of 8: the rule's rows of head size 32 (the kernels pad 8 to 16)
CONCAT = "fused Triton kernel, concat phase (scores recomputed, no T x T tensor)"
FUSED = "fused Triton kernel"
LOGGER = "realformer_fairseq.modules.routes.shared"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(route_warnings, "_SAID", set())


@pytest.fixture
def switch_at(monkeypatch):
    """Sets the rule's switch depth D for every head size at 16-bit (float64 in the
    interpreter) on an H100, from one key on."""

    def patch(depth):
        table = {((9, 0), 2, h): ((1, depth),) for h in (32, 64, 128)}
        monkeypatch.setattr(rules, "CONCAT_PHASE_DEPTHS", table)

    return patch


def pair(case, mode, layers):
    """``layers`` float64 layers of ``case``: the eager route's and the triton route's, with the
    same weights."""
    torch.manual_seed(0)
    eager, fused = [], []
    for _ in range(layers):
        module = layer_of("eager", case, EMBED).double().train()
        module.residual_attention_mode = mode
        twin = layer_of("triton", case, EMBED).double().train()
        twin.residual_attention_mode = mode
        twin.load_state_dict(module.state_dict())
        eager.append(module)
        fused.append(twin)
    return eager, fused


def run(layers, case, length, need_weights_at=-1, keep=None):
    """The chain's last output, its last ``attn_scores`` as a stream (formed where the route
    returned the link), the weights of layer ``need_weights_at``, and the gradients of the
    query, the keys and every parameter for a fixed weighting of the output and the stream."""
    query, keys, attn_mask, padding = inputs(case, length, EMBED)
    query = query.requires_grad_()
    keys = None if keys is None else keys.requires_grad_()
    x, scores, weights = query, None, None
    for idx, m in enumerate(layers):
        kv = x if keys is None else keys
        x, w, scores, _, _ = m(
            x, kv, kv, key_padding_mask=padding, attn_mask=attn_mask,
            need_weights=idx == need_weights_at, prev_attn_scores=scores, layer_idx=idx,
        )  # fmt: skip
        if idx == need_weights_at:
            weights = w
    stream = layers[-1].stream_of(scores) if hasattr(layers[-1], "stream_of") else scores
    if keep is not None:
        keep.append(node_held_tensors(x.sum()))
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    stream_weight = torch.randn(stream.shape, generator=gen, dtype=stream.dtype)
    # the stream after the diagonal differs (finite either way) under the causal mask
    finite = torch.ones_like(stream, dtype=torch.bool)
    if attn_mask is not None:
        finite = torch.isfinite(attn_mask).expand_as(stream)
    loss = (x * weight).sum() + (stream * stream_weight * finite).sum() / length
    if weights is not None:
        loss = loss + weights.square().sum()
    loss.backward()
    grads = [query.grad] + ([] if keys is None else [keys.grad])
    grads += [p.grad for m in layers for p in m.parameters()]
    return x.detach(), torch.where(finite, stream, 0).detach(), weights, grads


def assert_same(want, got, tolerance=1e-12):
    """Outputs, stream, weights and gradients within ``tolerance`` x the largest of each."""
    for a, b in zip(want[:2], got[:2]):
        torch.testing.assert_close(b, a, rtol=0, atol=tolerance * a.abs().max().item())
    if want[2] is not None:
        torch.testing.assert_close(got[2], want[2], rtol=0, atol=tolerance)
    scale = max(g.abs().max().item() for g in want[3])
    assert scale > 0
    for a, b in zip(want[3], got[3]):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=0, atol=tolerance * scale)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("case", CASES)
def test_a_chain_across_the_switch_is_the_eager_route(case, mode, switch_at):
    """D = 2 of 4 layers: two concat-phase layers, the stream formed at layer 2, two
    stream-kernel layers; each sequence of the batch padded differently (none, right half,
    left half, all)."""
    switch_at(2)
    eager, fused = pair(case, mode, 4)
    want = run(eager, case, 13)
    got = run(fused, case, 13)
    assert [m.last_route for m in fused] == [CONCAT, CONCAT, FUSED, FUSED]
    assert_same(want, got)


@pytest.mark.parametrize("case", CASES)
def test_a_chain_within_the_switch_returns_its_link_and_keeps_no_t_by_t_tensor(case, switch_at):
    """D = 4, 3 layers: every layer in the concat phase; the last returns the chain's link
    (an empty tensor), whose stream ``stream_of`` forms; nothing the graph holds for backward
    has a T x T plane (saved tensors and what the route's nodes hold)."""
    switch_at(4)
    eager, fused = pair(case, "mean", 3)
    length = 13
    query, keys, attn_mask, padding = inputs(case, length, EMBED)
    kv = query if keys is None else keys
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        x, _, link, _, _ = fused[0](query.requires_grad_(), kv, kv, key_padding_mask=padding,
                                    attn_mask=attn_mask, need_weights=False)  # fmt: skip
    assert link.numel() == 0
    keep = []
    want = run(eager, case, length)
    got = run(fused, case, length, keep=keep)
    assert [m.last_route for m in fused] == [CONCAT] * 3
    assert_same(want, got)
    tgt = length // 2 + 1 if case == "cross-attention" else length
    plane = (tgt, length)
    held = [tuple(t.shape) for t in keep[0] if t.numel() > 0]
    assert not [s for s in saved + held if tuple(s[-2:]) == plane], (saved, held)


@pytest.mark.parametrize("case", CASES)
def test_one_token(case, switch_at):
    switch_at(2)
    eager, fused = pair(case, "sum", 3)
    assert_same(run(eager, case, 1), run(fused, case, 1))
    assert [m.last_route for m in fused] == [CONCAT, CONCAT, FUSED]


def test_need_weights_forms_the_stream_early(switch_at):
    """Layer 1 of a D = 3 chain returns its probabilities: the stream is formed there and the
    chain runs the stream kernels from layer 1 (fairseq's alignment layer)."""
    switch_at(3)
    case = CASES[2]
    eager, fused = pair(case, "mean", 4)
    want = run(eager, case, 11, need_weights_at=1)
    got = run(fused, case, 11, need_weights_at=1)
    assert [m.last_route for m in fused] == [CONCAT, FUSED, FUSED, FUSED]
    assert_same(want, got)


def test_an_eager_fallback_forms_the_stream_and_says_its_reason_once(switch_at, caplog):
    switch_at(3)
    case = CASES[1]
    eager, fused = pair(case, "sum", 3)
    fused[1]._why_eager = lambda heads, incremental_state: "a test's reason"
    want = run(eager, case, 9)
    with caplog.at_level(logging.WARNING):
        got = run(fused, case, 9)
    assert [m.last_route for m in fused] == [CONCAT, "eager, because a test's reason", FUSED]
    assert_same(want, got)
    said = [r.getMessage() for r in caplog.records if "a test's reason" in r.getMessage()]
    assert len(said) == 1, said


def test_without_a_gradient_the_stream_kernels_run(switch_at):
    """Under ``torch.no_grad`` (evaluation, and the first pass of activation checkpointing)
    nothing is kept for backward: the stream kernels run from layer 0, as before."""
    switch_at(3)
    case = CASES[0]
    _, fused = pair(case, "sum", 2)
    query, _, attn_mask, padding = inputs(case, 8, EMBED)
    with torch.no_grad():
        _, _, stream, _, _ = fused[0](query, query, query, key_padding_mask=padding,
                                      attn_mask=attn_mask, need_weights=False)  # fmt: skip
    assert fused[0].last_route == FUSED and stream.shape == (16, 8, 8)


def test_activation_checkpointing_stays_off_the_concat_phase_and_is_exact(switch_at, caplog):
    """realformer_tiny with and without fairseq's --checkpoint-activations, D = 2 (the
    encoder and both decoder chains cross it without checkpointing; the checkpointed layers
    re-run their forward in backward and run the stream kernels, said once)."""
    switch_at(2)
    grads, said = checkpointing_gradients("triton", caplog)
    scale = max(g.abs().max().item() for g in grads[0])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12 * scale)
    checkpointing = [s for s in said if "--checkpoint-activations" in s]
    assert len(checkpointing) == 1, said


def test_the_interpreter_runs_an_h100s_depth(monkeypatch):
    """The rule's D for the interpreter (capability None) is the H100's row for the same head
    size and length; float64 takes the 16-bit rows, float32 its own; the table as derived
    (D = 0 in every row, docs/benchmarks.md) and a table with depths."""
    f16, f64, f32 = torch.float16, torch.float64, torch.float32
    assert triton_route.INTERPRETER_CAPABILITY is None
    assert rules.concat_phase_depth(64, 2048, f64, None) == 0
    monkeypatch.setattr(rules, "CONCAT_PHASE_DEPTHS", {
        ((9, 0), 2, 64): ((128, 2), (512, 7), (2048, 10)),
        ((8, 0), 2, 64): ((128, 5),),
        ((9, 0), 4, 64): ((128, 1),),
    })  # fmt: skip
    for length, depth in ((100, 0), (128, 2), (511, 2), (512, 7), (4096, 10)):
        assert rules.concat_phase_depth(64, length, f64, None) == depth
        assert rules.concat_phase_depth(64, length, f16, (9, 0)) == depth
    assert rules.concat_phase_depth(33, 512, f64, None) == 7  # padded to 64
    assert rules.concat_phase_depth(64, 512, f32, None) == 1
    assert rules.concat_phase_depth(64, 512, f16, (8, 0)) == 5
    assert rules.concat_phase_depth(64, 512, f16, (8, 6)) == 0  # no row


def test_chains_within_the_switch_keep_no_t_by_t_tensor_whatever_the_encoders_depth():
    """What the realformer encoder-decoder keeps for backward (studies.stream_memory's count,
    every chain in the concat phase: its ``triton_concat_phase`` rows), the same at 2 and 6
    encoder layers: nothing T x T from the encoder's and the decoder's self-attention chains;
    the cross-attention chain's last layer returns its probabilities (fairseq's alignment
    layer), so it forms the stream, which its node keeps, and keeps the probabilities."""
    from studies import stream_memory
    from studies.bench_models import dummy_dictionary

    dictionary = dummy_dictionary(100)
    tokens = 24  # not the width (64) nor the FFN's (256): only score-sized tensors match
    stream = f"{stream_memory.BATCH * stream_memory.SIZES['heads']}x{tokens}x{tokens} float32"
    for layers in (2, 6):
        kept = stream_memory.measure("triton_concat_phase", layers, tokens, dictionary)
        assert kept["score_sized_tensors"] == [stream] * 2
        assert [t for t in kept["held_by_route_nodes"] if t == stream] == [stream]
    # the rule's table is back as it was
    assert rules.concat_phase_depth(64, 2048, torch.float64, None) == 0
