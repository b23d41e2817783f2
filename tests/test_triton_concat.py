"""The triton route's concat phase (realformer_fairseq/modules/routes/triton_concat_*.py), run on
CPU tensors by Triton's interpreter, against the eager route's own stream and attention
(``add_to_stream`` / ``_attend_stream``) layer by layer over a chain (RealFormer, arXiv
2012.11747: ``S_l = sum_{i<=l} Q_i K_i^T``, softmax over the masked ``S_l`` (divided by ``l + 1``
for the running mean), ``P V_l``): every layer's output and every gradient of every layer's q,
k and v, in float64, within 1e-12 of the largest, at the interpreter's 16-wide blocks and at
the blocks an H100 launches. Needs triton; skipped without it.

TRITON_INTERPRET=1 must be set before triton is first imported in the process: this file sets
it at collection, and fails with one line where something imported triton earlier without it."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip(
    "triton", reason="triton is not installed (the triton extra: pip install -e '.[triton]')"
)

# the interpreter check (autouse) and the key padding of the kernel tests
from test_triton_kernels import interpreted, padding  # noqa: E402,F401

from realformer_fairseq.modules.routes import RealformerMultiheadAttention  # noqa: E402
from realformer_fairseq.modules.routes import triton_concat_launch  # noqa: E402
from realformer_fairseq.modules.routes import triton_concat_function as tc  # noqa: E402
from realformer_fairseq.modules.routes import triton_function as ta  # noqa: E402

pytestmark = pytest.mark.triton

HEADS = 2
HEAD_DIM = 8  # padded to the kernels' 16
TOLERANCE = 1e-12  # float64, relative to max(1, the largest reference value)


def chain_inputs(layers, bsz, tgt_len, src_len, seed=0):
    """Per layer: scaled q, k, v (float64 leaves) and the output's gradient."""
    g = torch.Generator().manual_seed(seed)
    bh = bsz * HEADS
    per_layer = []
    for _ in range(layers):
        q = (torch.randn(bh, tgt_len, HEAD_DIM, generator=g, dtype=torch.float64)
             * HEAD_DIM**-0.5).requires_grad_()  # fmt: skip
        k = torch.randn(bh, src_len, HEAD_DIM, generator=g, dtype=torch.float64).requires_grad_()
        v = torch.randn(bh, src_len, HEAD_DIM, generator=g, dtype=torch.float64).requires_grad_()
        d_out = torch.randn(bh, tgt_len, HEAD_DIM, generator=g, dtype=torch.float64)
        per_layer.append((q, k, v, d_out))
    return per_layer


def eager_chain(per_layer, kpm, attn_mask, mode, keeps=None, p=0.0):
    """The eager module's stream and attention on these heads, layer after layer: the
    outputs (no projections)."""
    module = RealformerMultiheadAttention(
        HEADS * HEAD_DIM, HEADS, mode, dropout=p, self_attention=True
    )
    module._merge_heads = lambda attn, tgt_len, bsz: attn  # the heads, before out_proj
    outs, stream = [], None
    for layer_idx, (q, k, v, _) in enumerate(per_layer):
        if keeps is not None:
            keep = keeps[layer_idx]
            module.dropout_module.forward = lambda x, keep=keep: x * keep.to(x.dtype) / (1 - p)
        bsz = q.size(0) // HEADS
        raw = module.raw_scores(q, k, bsz, bsz)
        stream = module.add_to_stream(raw, stream)
        attn, _ = module._attend_stream(
            stream, raw, v, kpm, attn_mask, bsz, bsz, layer_idx, False, False
        )
        outs.append(attn)
    return outs


def concat_chain(per_layer, kpm, mode, causal, p=0.0):
    depth = len(per_layer)
    outs, link = [], None
    for layer_idx, (q, k, v, _) in enumerate(per_layer):
        divisor = layer_idx + 1 if mode == "mean" else 1
        attn, link = tc.concat_residual_attention(
            q, k, v, link, kpm, None, HEADS, layer_idx, depth, divisor, p, causal=causal
        )
        outs.append(attn)
    return outs


def chain_gradients(outs, per_layer):
    loss = sum((out * d_out).sum() for out, (_, _, _, d_out) in zip(outs, per_layer))
    leaves = [t for q, k, v, _ in per_layer for t in (q, k, v)]
    return torch.autograd.grad(loss, leaves)


def assert_close(got, want, what, tol=TOLERANCE):
    err = (got.double() - want.double()).abs().max().item()
    scale = max(1.0, want.double().abs().max().item())
    assert err <= tol * scale, f"{what}: max abs error {err:.3g} > {tol * scale:.3g}"


@pytest.fixture(params=["interpreter", "h100"], ids=["interpreter_blocks", "h100_blocks"])
def blocks(request, monkeypatch):
    """The blocks the kernels launch with: the interpreter's 16 x 16, or the ones an H100
    launches for 16-bit inputs of this head size (64 x 32 forward, 16 x 32 key-block pass,
    32 x 32 query-block pass), run here on float64."""
    if request.param == "h100":
        launch = triton_concat_launch.concat_launch_config
        monkeypatch.setattr(
            tc,
            "concat_launch_config",
            lambda kernel, head_dim, dtype, capability: launch(
                kernel, head_dim, torch.float16, (9, 0)
            ),
        )
    return request.param


def test_the_h100_blocks_differ_from_the_interpreters():
    """What ``blocks`` patches in: an H100's 16-bit tiles, not the interpreter's 16 x 16."""
    h100 = [
        triton_concat_launch.concat_launch_config(k, HEAD_DIM, torch.float16, (9, 0))[:2]
        for k in ("concat_forward", "concat_backward", "concat_dq")
    ]
    assert h100 == [(64, 32), (32, 32), (32, 32)]
    for k in ("concat_forward", "concat_backward", "concat_dq"):
        assert triton_concat_launch.concat_launch_config(k, HEAD_DIM, torch.float64, None)[:2] == (
            16,
            16,
        )


# (layers, bsz, tgt_len, src_len, key padding (side, lengths), causal)
CHAINS = {
    # an encoder chain: right padding, a fully padded sentence, a 1-token sentence, 37 tokens
    "encoder_right_padded": (3, 3, 37, 37, ("right", [37, 0, 1]), False),
    # an encoder chain with left padding
    "encoder_left_padded": (3, 2, 21, 21, ("left", [21, 9]), False),
    # a decoder chain under the causal mask, left padding (rows that see only the fill)
    "decoder_causal_left_padded": (3, 2, 33, 33, ("left", [33, 17]), True),
    # a decoder chain, right padding and a fully padded sentence
    "decoder_causal_fully_padded": (2, 2, 19, 19, ("right", [19, 0]), True),
    # cross-attention: 21 queries over 37 keys, right padding, a 1-token source
    "cross_attention": (3, 3, 21, 37, ("right", [37, 20, 1]), False),
    # one query, one key
    "one_token": (2, 2, 1, 1, ("right", [1, 1]), True),
}


def causal_mask(n):
    return torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), 1)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("name", list(CHAINS))
def test_concat_chain_is_the_eager_route(name, mode, blocks):
    layers, bsz, tgt_len, src_len, (side, lengths), causal = CHAINS[name]
    per_layer = chain_inputs(layers, bsz, tgt_len, src_len)
    kpm = padding(lengths, src_len, left=side == "left")
    want = eager_chain(per_layer, kpm, causal_mask(tgt_len) if causal else None, mode)
    got = concat_chain(per_layer, kpm, mode, causal)
    for layer_idx, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == torch.float64 and g.shape == w.shape
        assert torch.isfinite(g).all()
        assert_close(g, w, f"layer {layer_idx} attn")
    got_grads = chain_gradients(got, per_layer)
    want_grads = chain_gradients(want, per_layer)
    largest = max(w.abs().max().item() for w in want_grads)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        what = f"layer {i // 3} d{'qkv'[i % 3]}"
        err = (g - w).abs().max().item()
        assert err <= TOLERANCE * max(1.0, largest), f"{what}: max abs error {err:.3g}"


def test_dropout_is_the_eager_route_with_the_kernels_own_mask():
    """Dropout in the concat phase draws the stream kernels' Philox mask for the seed each
    layer draws from torch's generator: replayed by ``dropout_keep_mask`` and handed to the
    eager route, outputs and gradients agree, a fully padded sentence and causal rows that see
    only the fill included."""
    p = 0.3
    layers, bsz, tgt_len, src_len = 3, 2, 21, 21
    per_layer = chain_inputs(layers, bsz, tgt_len, src_len, seed=1)
    kpm = padding([0, 9], src_len, left=True)
    torch.manual_seed(1234)
    got = concat_chain(per_layer, kpm, "mean", True, p=p)
    torch.manual_seed(1234)
    seeds = [ta.draw_dropout_seed() for _ in range(layers)]
    keeps = [ta.dropout_keep_mask(s, bsz * HEADS, tgt_len, src_len, p, "cpu") for s in seeds]
    assert len({k.sum().item() for k in keeps}) == layers  # a new mask per layer
    dropped = sum((~k).sum().item() for k in keeps) / (layers * keeps[0].numel())
    assert 0.2 < dropped < 0.4
    want = eager_chain(per_layer, kpm, causal_mask(tgt_len), "mean", keeps=keeps, p=p)
    for layer_idx, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"layer {layer_idx} attn")
    got_grads = chain_gradients(got, per_layer)
    want_grads = chain_gradients(want, per_layer)
    largest = max(w.abs().max().item() for w in want_grads)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        err = (g - w).abs().max().item()
        assert err <= TOLERANCE * largest, f"layer {i // 3} d{'qkv'[i % 3]}: {err:.3g}"


def saved_shapes(run):
    """The shapes of every tensor autograd saves for backward while ``run()`` builds its graph."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = run()
    return shapes, result


def test_a_chain_in_the_concat_phase_keeps_no_t_by_t_tensor():
    """Saved for backward by four layers of 40 tokens: nothing with a (40, 40) plane, nor in
    the chain buffers its nodes hold; the eager chain on the same heads saves one per layer
    (the check can fail)."""
    layers, bsz, length = 4, 2, 40
    per_layer = chain_inputs(layers, bsz, length, length)
    kpm = padding([40, 23], length)

    def square(shape):
        return len(shape) >= 2 and shape[-2:] == (length, length)

    eager_shapes, _ = saved_shapes(lambda: eager_chain(per_layer, kpm, None, "sum"))
    assert sum(map(square, eager_shapes)) >= layers
    shapes, outs = saved_shapes(lambda: concat_chain(per_layer, kpm, "sum", False))
    assert shapes and not any(map(square, shapes)), shapes
    node = outs[-1].grad_fn
    held = [node.buffers.queries, node.buffers.keys]
    assert [tuple(t.shape) for t in held] == [(bsz * HEADS, length, layers * HEAD_DIM)] * 2
    assert all(t.numel() < bsz * HEADS * length * length for t in held)


def test_what_a_caller_holds_is_unchanged_and_a_second_backward_agrees():
    """The chain's buffers are copies: the caller's q and k keep their values and versions;
    the gradients handed out are new tensors; a second backward through the same graph
    (``retain_graph=True``) starts from zero gradient buffers and gives the same gradients."""
    per_layer = chain_inputs(3, 2, 18, 18)
    before = [(t.clone(), t._version) for q, k, _, _ in per_layer for t in (q, k)]
    outs = concat_chain(per_layer, padding([18, 5], 18), "sum", False)
    loss = sum((out * d_out).sum() for out, (_, _, _, d_out) in zip(outs, per_layer))
    leaves = [t for q, k, v, _ in per_layer for t in (q, k, v)]
    first = torch.autograd.grad(loss, leaves, retain_graph=True)
    second = torch.autograd.grad(loss, leaves)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    assert len({g.data_ptr() for g in first}) == len(first)
    for (value, version), t in zip(before, [t for q, k, _, _ in per_layer for t in (q, k)]):
        assert torch.equal(value, t) and t._version == version


def test_layers_out_of_order_stop_with_one_line():
    (q, k, v, _), (q1, k1, v1, _) = chain_inputs(2, 1, 5, 5)
    _, link = tc.concat_residual_attention(q, k, v, None, None, None, HEADS, 0, 2, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"^concat phase: layer 1 outside the chain's 1 layers$"):
        tc.concat_residual_attention(q1, k1, v1, link, None, None, HEADS, 1, 1, 1.0, 0.0)
    with pytest.raises(ValueError, match="needs the previous layer's link"):
        tc.concat_residual_attention(q1, k1, v1, None, None, None, HEADS, 1, 2, 1.0, 0.0)
    tc.concat_residual_attention(q1, k1, v1, link, None, None, HEADS, 1, 2, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"^concat phase: layer 1 of a chain ran after 2 layers"):
        tc.concat_residual_attention(q1, k1, v1, link, None, None, HEADS, 1, 2, 1.0, 0.0)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_a_chain_that_crosses_into_the_stream_kernels_is_the_eager_route(mode, causal):
    """Two concat-phase layers, the stream formed once from their buffers, then two layers of
    the stream kernels reading it: every output, the last stream and every gradient as the
    eager chain's (left padding, a fully padded sentence, 23 tokens)."""
    layers, switch, bsz, length = 4, 2, 2, 23
    per_layer = chain_inputs(layers, bsz, length, length, seed=2)
    kpm = padding([0, 11], length, left=True)
    mask = causal_mask(length) if causal else None
    outs, link = [], None
    for layer_idx, (q, k, v, _) in enumerate(per_layer[:switch]):
        divisor = layer_idx + 1 if mode == "mean" else 1
        attn, link = tc.concat_residual_attention(
            q, k, v, link, kpm, None, HEADS, layer_idx, switch, divisor, 0.0, causal=causal
        )
        outs.append(attn)
    stream = tc.stream_of_concat_phase(link)
    assert stream.dtype == torch.float64 and stream.shape == (bsz * HEADS, length, length)
    for layer_idx, (q, k, v, _) in enumerate(per_layer[switch:], start=switch):
        divisor = layer_idx + 1 if mode == "mean" else 1
        attn, stream = ta.residual_attention(
            q, k, v, stream, kpm, None, HEADS, divisor, 0.0, causal=causal
        )
        outs.append(attn)
    want = eager_chain(per_layer, kpm, mask, mode)
    for layer_idx, (g, w) in enumerate(zip(outs, want)):
        assert_close(g, w, f"layer {layer_idx} attn")
    got_grads = chain_gradients(outs, per_layer)
    want_grads = chain_gradients(want, per_layer)
    largest = max(w.abs().max().item() for w in want_grads)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        err = (g - w).abs().max().item()
        assert err <= TOLERANCE * largest, f"layer {i // 3} d{'qkv'[i % 3]}: {err:.3g}"


@pytest.mark.parametrize(
    "dtype,tol",
    [(torch.float32, 2e-5), (torch.float16, 2e-2), (torch.bfloat16, 6e-2)],
    ids=["float32", "float16", "bfloat16"],
)
def test_lower_precision_chains_through_the_switch_stay_near_float64_eager(dtype, tol):
    """Three concat-phase layers, the stream formed, three stream-kernel layers, on inputs of
    ``dtype`` against the float64 eager chain on the same (rounded) values: outputs and
    gradients within ``tol`` of the largest (float32 as the stream kernels' own bound; 16-bit:
    one rounding of P and of the outputs)."""
    layers, switch, bsz, length = 6, 3, 2, 19
    exact = chain_inputs(layers, bsz, length, length, seed=3)
    rounded = [
        tuple(t.detach().to(dtype).double().requires_grad_() for t in (q, k, v)) + (d,)
        for q, k, v, d in exact
    ]
    low = [
        tuple(t.detach().to(dtype).requires_grad_() for t in (q, k, v)) + (d.to(dtype),)
        for q, k, v, d in rounded
    ]
    kpm = padding([19, 7], length)
    outs, link = [], None
    for layer_idx, (q, k, v, _) in enumerate(low[:switch]):
        attn, link = tc.concat_residual_attention(
            q, k, v, link, kpm, None, HEADS, layer_idx, switch, layer_idx + 1, 0.0
        )
        outs.append(attn)
    stream = tc.stream_of_concat_phase(link)
    assert stream.dtype == torch.float32
    for layer_idx, (q, k, v, _) in enumerate(low[switch:], start=switch):
        attn, stream = ta.residual_attention(q, k, v, stream, kpm, None, HEADS, layer_idx + 1, 0.0)
        outs.append(attn)
    want = eager_chain(rounded, kpm, None, "mean")
    for layer_idx, (g, w) in enumerate(zip(outs, want)):
        assert g.dtype == dtype
        assert_close(g, w, f"layer {layer_idx} attn", tol)
    got_grads = chain_gradients(outs, low)
    want_grads = chain_gradients(want, rounded)
    largest = max(w.abs().max().item() for w in want_grads)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        assert g.dtype == dtype
        err = (g.double() - w).abs().max().item()
        assert err <= tol * max(1.0, largest), f"layer {i // 3} d{'qkv'[i % 3]}: {err:.3g}"


def test_an_additive_mask_is_clamped_to_the_fill_as_on_the_eager_route():
    """An additive attention mask read by the kernels (-inf, fairseq's -1e8 and finite
    biases), with right padding: every output and gradient as the eager chain's."""
    layers, bsz, tgt_len, src_len = 3, 2, 17, 29
    per_layer = chain_inputs(layers, bsz, tgt_len, src_len, seed=4)
    kpm = padding([29, 12], src_len)
    g = torch.Generator().manual_seed(5)
    mask = torch.randn(tgt_len, src_len, generator=g, dtype=torch.float64)
    mask[torch.rand(tgt_len, src_len, generator=g) < 0.2] = float("-inf")
    mask[torch.rand(tgt_len, src_len, generator=g) < 0.1] = -1e8
    mask[3] = float("-inf")  # a row that sees only the fill
    outs, link = [], None
    for layer_idx, (q, k, v, _) in enumerate(per_layer):
        attn, link = tc.concat_residual_attention(
            q, k, v, link, kpm, mask, HEADS, layer_idx, layers, 1.0, 0.0
        )
        outs.append(attn)
    want = eager_chain(per_layer, kpm, mask, "sum")
    for layer_idx, (o, w) in enumerate(zip(outs, want)):
        assert torch.isfinite(o).all()
        assert_close(o, w, f"layer {layer_idx} attn")
    got_grads = chain_gradients(outs, per_layer)
    want_grads = chain_gradients(want, per_layer)
    largest = max(w.abs().max().item() for w in want_grads)
    for i, (o, w) in enumerate(zip(got_grads, want_grads)):
        err = (o - w).abs().max().item()
        assert err <= TOLERANCE * largest, f"layer {i // 3} d{'qkv'[i % 3]}: {err:.3g}"


def test_a_stream_formed_twice_passes_both_gradients_down():
    """The stream formed twice from one chain (two readers) and the layers' outputs in one
    loss: every gradient as the same loss on the eager chain's stream (float64, 1e-12)."""
    layers, bsz, length = 2, 2, 13
    per_layer = chain_inputs(layers, bsz, length, length, seed=6)
    g = torch.Generator().manual_seed(7)
    weights = [torch.randn(bsz * HEADS, length, length, generator=g, dtype=torch.float64)
               for _ in range(2)]  # fmt: skip
    outs, link = [], None
    for layer_idx, (q, k, v, _) in enumerate(per_layer):
        attn, link = tc.concat_residual_attention(
            q, k, v, link, None, None, HEADS, layer_idx, layers, 1.0, 0.0
        )
        outs.append(attn)
    first, second = tc.stream_of_concat_phase(link), tc.stream_of_concat_phase(link)
    loss = (first * weights[0]).sum() + (second * weights[1]).sum()
    loss = loss + sum((o * d).sum() for o, (_, _, _, d) in zip(outs, per_layer))
    leaves = [t for q, k, v, _ in per_layer for t in (q, k, v)]
    got = torch.autograd.grad(loss, leaves, allow_unused=True)
    stream = sum(q @ k.transpose(1, 2) for q, k, _, _ in per_layer)
    want_outs = eager_chain(per_layer, None, None, "sum")
    want_loss = (stream * weights[0]).sum() + (stream * weights[1]).sum()
    want_loss = want_loss + sum((o * d).sum() for o, (_, _, _, d) in zip(want_outs, per_layer))
    want = torch.autograd.grad(want_loss, leaves)
    largest = max(w.abs().max().item() for w in want)
    for i, (o, w) in enumerate(zip(got, want)):
        assert o is not None, f"layer {i // 3} d{'qkv'[i % 3]}: no gradient"
        err = (o - w).abs().max().item()
        assert err <= TOLERANCE * largest, f"layer {i // 3} d{'qkv'[i % 3]}: {err:.3g}"


# max |error| / max |value| over a 60-layer float32 chain, the stream route's bound
# (tests/test_triton_kept_stream.py, tests/test_kept_stream.py)
FLOAT32_60_LAYERS = 1e-5


def test_a_60_layer_float32_chain_through_the_switch_is_within_the_stream_routes_bound():
    """15 concat-phase layers (the switch depth the cost model gives head size 64 on an
    H100), the stream formed, 45 layers of the stream kernels: float32 against the float64
    eager chain on the same values, every output and gradient within 1e-5 of the largest."""
    layers, switch, bsz, length = 60, 15, 2, 8
    exact = chain_inputs(layers, bsz, length, length, seed=8)
    rounded = [
        tuple(t.detach().float().double().requires_grad_() for t in (q, k, v)) + (d,)
        for q, k, v, d in exact
    ]
    low = [
        tuple(t.detach().float().requires_grad_() for t in (q, k, v)) + (d.float(),)
        for q, k, v, d in rounded
    ]
    kpm = padding([8, 5], length)
    outs, link = [], None
    for layer_idx, (q, k, v, _) in enumerate(low[:switch]):
        attn, link = tc.concat_residual_attention(
            q, k, v, link, kpm, None, HEADS, layer_idx, switch, 1.0, 0.0
        )
        outs.append(attn)
    stream = tc.stream_of_concat_phase(link)
    for q, k, v, _ in low[switch:]:
        attn, stream = ta.residual_attention(q, k, v, stream, kpm, None, HEADS, 1.0, 0.0)
        outs.append(attn)
    want = eager_chain(rounded, kpm, None, "sum")
    largest = max(w.abs().max().item() for w in want)
    err = max((o.double() - w).abs().max().item() for o, w in zip(outs, want))
    assert err <= FLOAT32_60_LAYERS * largest, f"outputs: {err:.3g} of {largest:.3g}"
    got_grads = chain_gradients(outs, low)
    want_grads = chain_gradients(want, rounded)
    largest = max(w.abs().max().item() for w in want_grads)
    err = max((o.double() - w).abs().max().item() for o, w in zip(got_grads, want_grads))
    assert err <= FLOAT32_60_LAYERS * largest, f"gradients: {err:.3g} of {largest:.3g}"
