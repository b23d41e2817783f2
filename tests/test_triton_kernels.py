"""The triton route's kernels (realformer_fairseq/modules/routes/triton_*.py), run on CPU tensors
by Triton's interpreter, against residual attention written here from its formula (RealFormer,
He et al. 2020, arXiv 2012.11747: ``S_l = Q_l K_l^T / sqrt(d) + S_{l-1}``, softmax over the masked
``S_l`` (divided by ``l + 1`` for the running mean), dropout, ``P V``) in float64, and against the
eager route's own ``add_to_stream`` / ``_attend_stream``: every output and every gradient (q, k,
v and the previous stream), in float64 and float32, at lengths that are not multiples of the
interpreter's 16-wide blocks. Needs triton (``pip install -e '.[triton]'``); skipped without it.

TRITON_INTERPRET=1 must be set before triton is first imported in the process (triton's own
``tl.rand``, ``tl.max`` are decorated at import): this file sets it at collection, and fails
with one line where something imported triton earlier without it."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip(
    "triton", reason="triton is not installed (the triton extra: pip install -e '.[triton]')"
)

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from realformer_fairseq.modules.routes import RealformerMultiheadAttention  # noqa: E402
from realformer_fairseq.modules.routes import triton_launch  # noqa: E402
from realformer_fairseq.modules.routes import triton_function as ta  # noqa: E402
from realformer_fairseq.modules.routes.shared import MASK_VALUE as _MASK_VALUE  # noqa: E402

HEADS = 2
HEAD_DIM = 8  # padded to the kernels' 16


@pytest.fixture(autouse=True)
def interpreted():
    if not isinstance(triton.language.random.rand, InterpretedFunction):
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set in this process")


def padding(lengths, src_len, left=False):
    """(bsz, src_len) bool, True at the padded keys of sentences of ``lengths``."""
    pos = torch.arange(src_len)
    rows = [(pos < src_len - n) if left else (pos >= n) for n in lengths]
    return torch.stack(rows)


def causal(n):
    return torch.triu(torch.full((n, n), float("-inf")), 1)


def inputs(bsz, tgt_len, src_len, dtype, with_prev, seed=0):
    g = torch.Generator().manual_seed(seed)
    bh = bsz * HEADS
    q = torch.randn(bh, tgt_len, HEAD_DIM, generator=g) * HEAD_DIM**-0.5
    k = torch.randn(bh, src_len, HEAD_DIM, generator=g)
    v = torch.randn(bh, src_len, HEAD_DIM, generator=g)
    prev = 3 * torch.randn(bh, tgt_len, src_len, generator=g) if with_prev else None
    d_out = torch.randn(bh, tgt_len, HEAD_DIM, generator=g)
    d_stream = torch.randn(bh, tgt_len, src_len, generator=g)
    sdtype = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    leaves.append(prev.to(sdtype).requires_grad_() if with_prev else None)
    return leaves, d_out.to(dtype), d_stream.to(sdtype)


def formula(q, k, v, prev, key_padding_mask, attn_mask, divisor, keep=None, p=0.0):
    """Residual attention from its definition, in float64: (attn, new stream)."""
    stream = q.double() @ k.double().transpose(1, 2)
    if prev is not None:
        stream = stream + prev.double()
    logits = stream / divisor
    if attn_mask is not None:
        logits = logits + attn_mask.double().clamp(min=_MASK_VALUE)
    if key_padding_mask is not None:
        padded = key_padding_mask.repeat_interleave(HEADS, dim=0).unsqueeze(1)
        logits = logits.masked_fill(padded, _MASK_VALUE)  # replaced: no gradient to the stream
    probs = torch.softmax(logits, dim=-1)
    if keep is not None:
        probs = probs * keep / (1 - p)
    return probs @ v.double(), stream


def eager_route(q, k, v, prev, key_padding_mask, attn_mask, layer_idx, mode, keep=None, p=0.0):
    """The eager module's own stream and attention on these heads (no projections)."""
    module = RealformerMultiheadAttention(
        HEADS * HEAD_DIM, HEADS, mode, dropout=p, self_attention=True
    )
    module._merge_heads = lambda attn, tgt_len, bsz: attn  # the heads, before out_proj
    if keep is not None:
        module.dropout_module.forward = lambda x: x * keep.to(x.dtype) / (1 - p)
    bsz = q.size(0) // HEADS
    raw = module.raw_scores(q, k, bsz, bsz)
    stream = module.add_to_stream(raw, prev)
    attn, _ = module._attend_stream(
        stream, raw, v, key_padding_mask, attn_mask, bsz, bsz, layer_idx, False, False
    )
    return attn, stream


def gradients(outputs, leaves, d_out, d_stream):
    """d(q, k, v, prev) of <out, d_out> (+ <stream, d_stream> where d_stream is given)."""
    out, stream = outputs
    loss = (out * d_out.to(out.dtype)).sum()
    if d_stream is not None:
        loss = loss + (stream * d_stream.to(stream.dtype)).sum()
    wanted = [t for t in leaves if t is not None and t.requires_grad]
    return torch.autograd.grad(loss, wanted)


# (bsz, tgt_len, src_len, key padding, attn_mask, prev, divisor, stream gradient in)
CASES = {
    # cross-attention, right-padded keys, a 1-token sentence, the running sum
    "cross_right_padded": (3, 21, 37, ("right", [37, 20, 1]), None, True, 1.0, True),
    # decoder self-attention: causal -inf mask, left-padded keys, the running mean (layer 2)
    "causal_left_padded_mean": (2, 33, 33, ("left", [33, 17]), "causal", True, 3.0, True),
    # a chain's first layer (no previous stream), a fully padded sentence, no stream gradient
    "first_layer_fully_padded": (2, 18, 18, ("right", [18, 0]), None, False, 1.0, False),
    # one query, one key: a one-token sentence of a language model
    "one_token": (2, 1, 1, ("right", [1, 1]), "causal", True, 1.0, True),
}
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}  # relative to max(1, |reference|)


def run_case(name, dtype):
    bsz, tgt_len, src_len, pad, mask, with_prev, divisor, with_d_stream = CASES[name]
    leaves, d_out, d_stream = inputs(bsz, tgt_len, src_len, dtype, with_prev)
    kpm = padding(pad[1], src_len, left=pad[0] == "left")
    attn_mask = causal(tgt_len) if mask == "causal" else None
    d_stream = d_stream if with_d_stream else None
    got = ta.residual_attention(*leaves, kpm, attn_mask, HEADS, divisor, 0.0)
    assert got[0].dtype == dtype and got[1].dtype == d_stream_dtype(dtype)
    assert got[0].shape == (bsz * HEADS, tgt_len, HEAD_DIM)
    assert got[1].shape == (bsz * HEADS, tgt_len, src_len)
    want = formula(*leaves, kpm, attn_mask, divisor)
    return leaves, kpm, attn_mask, divisor, got, want, d_out, d_stream


def d_stream_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def assert_close(got, want, tol, what):
    err = (got.double() - want.double()).abs().max().item()
    scale = max(1.0, want.double().abs().max().item())
    assert err <= tol * scale, f"{what}: max abs error {err:.3g} > {tol * scale:.3g}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(CASES))
def test_kernels_match_the_formula_and_the_eager_route(name, dtype):
    leaves, kpm, attn_mask, divisor, got, want, d_out, d_stream = run_case(name, dtype)
    tol = TOLERANCE[dtype]
    assert_close(got[0], want[0], tol, "attn")
    assert_close(got[1], want[1], tol, "stream")
    got_grads = gradients(got, leaves, d_out, d_stream)
    want_grads = gradients(want, leaves, d_out, d_stream)
    for what, g, w in zip(("dq", "dk", "dv", "dprev"), got_grads, want_grads):
        assert_close(g, w, tol, what)
    # the eager module on the same heads: same stream, same attention, same gradients
    mode, layer_idx = ("mean", 2) if divisor == 3.0 else ("sum", 1)
    eager = eager_route(*leaves, kpm, attn_mask, layer_idx, mode)
    assert_close(got[0], eager[0], tol, "attn vs eager")
    assert_close(got[1], eager[1], tol, "stream vs eager")
    eager_grads = gradients(eager, leaves, d_out, d_stream)
    for what, g, w in zip(("dq", "dk", "dv", "dprev"), got_grads, eager_grads):
        assert_close(g, w, tol, what + " vs eager")


# (bsz, length, key padding, prev, divisor, stream gradient in): self-attention chains under
# the causal mask made in the kernels (``causal=True``)
CAUSAL_CASES = {
    # left padding: the first rows of the second sentence see only padding (the fill), so
    # attend to every key, the ones after them included
    "left_padded_mean": (2, 33, ("left", [33, 17]), True, 3.0, True),
    # right padding, a fully padded sentence: blocks after the diagonal skipped but there
    "right_padded_and_empty": (3, 50, ("right", [50, 31, 0]), True, 1.0, True),
    # a chain's first layer, one token
    "one_token_first_layer": (2, 1, ("right", [1, 1]), False, 1.0, False),
}


def only_fill_rows(kpm, length):
    """(bsz*heads, length, 1): the rows whose keys up to the query are all padded."""
    seen_only_padding = kpm.cumprod(dim=1).bool()  # key 0 .. i all padded
    return seen_only_padding[:, :length].repeat_interleave(HEADS, dim=0).unsqueeze(-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(CAUSAL_CASES))
def test_the_causal_mask_made_in_the_kernels_is_the_eager_routes(name, dtype):
    """``causal=True``: attention and gradients of the formula and of the eager module with the
    -inf causal mask; the stream is theirs on and before the diagonal and 0 after it; the
    stream gradient arriving after the diagonal passes on only in rows that see only the fill
    (as the eager route's, whose fill absorbs the stream there). An eager layer that reads this
    stream gives the eager route's attention and gradients, through both layers."""
    bsz, length, pad, with_prev, divisor, with_d_stream = CAUSAL_CASES[name]
    leaves, d_out, d_stream = inputs(bsz, length, length, dtype, with_prev)
    kpm = padding(pad[1], length, left=pad[0] == "left")
    mask = causal(length)
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    tol = TOLERANCE[dtype]
    got = ta.residual_attention(*leaves, kpm, None, HEADS, divisor, 0.0, causal=True)
    want = formula(*leaves, kpm, mask, divisor)
    mode, layer_idx = ("mean", 2) if divisor == 3.0 else ("sum", 1)
    eager = eager_route(*leaves, kpm, mask, layer_idx, mode)
    assert (got[1][:, future] == 0).all()
    passed_on = ~future | only_fill_rows(kpm, length)
    d_stream_in = d_stream if with_d_stream else None
    d_stream_passed = d_stream.masked_fill(~passed_on, 0) if with_d_stream else None
    got_grads = gradients(got, leaves, d_out, d_stream_in)
    for reference, label in ((want, ""), (eager, " vs eager")):
        assert_close(got[0], reference[0], tol, "attn" + label)
        assert_close(got[1], reference[1].masked_fill(future, 0), tol, "stream" + label)
        want_grads = gradients(reference, leaves, d_out, d_stream_passed)
        for what, g, w in zip(("dq", "dk", "dv", "dprev"), got_grads, want_grads):
            assert_close(g, w, tol, what + label)
    # the next layer eager, reading this stream or the eager route's
    g = torch.Generator().manual_seed(5)
    nxt = [(torch.randn(t.shape, generator=g) * 0.5).to(dtype).requires_grad_() for t in leaves[:3]]
    d_out2 = torch.randn(d_out.shape, generator=g).to(dtype)
    results = []
    for run in (
        lambda: ta.residual_attention(*leaves, kpm, None, HEADS, divisor, 0.0, causal=True),
        lambda: eager_route(*leaves, kpm, mask, layer_idx, mode),
    ):
        first = run()
        second = eager_route(*nxt, first[1], kpm, mask, layer_idx + 1, mode)
        loss = (first[0] * d_out).sum() + (second[0] * d_out2).sum()
        wanted = [t for t in leaves + nxt if t is not None]
        results.append((second[0], torch.autograd.grad(loss, wanted)))
    assert_close(results[0][0], results[1][0], tol, "next eager layer's attn")
    for i, (a, b) in enumerate(zip(results[0][1], results[1][1])):
        assert_close(a, b, tol, f"gradient {i} through the next eager layer")


def test_causal_with_dropout_keeps_the_mask_in_rows_that_see_only_the_fill():
    """Dropout under the causal mask made in the kernels, with left padding (rows that see only
    the fill attend to every key, their blocks after the diagonal computed apart): the formula
    with the mask of :func:`expected_keep`, output and gradients, in float64."""
    p, bsz, length = 0.25, 2, 37
    leaves, d_out, _ = inputs(bsz, length, length, torch.float64, with_prev=True, seed=3)
    kpm = padding([37, 14], length, left=True)
    torch.manual_seed(11)
    keep = expected_keep(ta.draw_dropout_seed(), bsz * HEADS, length, length, p)
    torch.manual_seed(11)
    got = ta.residual_attention(*leaves, kpm, None, HEADS, 1.0, p, causal=True)
    want = formula(*leaves, kpm, causal(length), 1.0, keep=keep, p=p)
    assert_close(got[0], want[0], 1e-12, "attn")
    got_grads = gradients(got, leaves, d_out, None)
    want_grads = gradients(want, leaves, d_out, None)
    for what, g, w in zip(("dq", "dk", "dv", "dprev"), got_grads, want_grads):
        assert_close(g, w, 1e-12, what)


def test_causal_needs_self_attention_without_a_mask():
    q = torch.zeros(2, 3, 8)
    with pytest.raises(ValueError, match="causal takes self-attention"):
        ta.residual_attention(q, torch.zeros(2, 4, 8), torch.zeros(2, 4, 8), None, None, None,
                              1, 1.0, 0.0, causal=True)  # fmt: skip
    with pytest.raises(ValueError, match="and an attn_mask"):
        ta.residual_attention(q, q, q, None, None, causal(3), 1, 1.0, 0.0, causal=True)


def test_masked_keys_get_no_probability_and_fully_padded_rows_are_uniform():
    """A fully padded sentence attends to the mean of its values (the eager route's fill), a
    1-token sentence to its one value; padded keys pass no gradient into the stream."""
    leaves, d_out, d_stream = inputs(3, 5, 20, torch.float64, with_prev=True)
    kpm = padding([20, 0, 1], 20)
    out, stream = ta.residual_attention(*leaves, kpm, None, HEADS, 1.0, 0.0)
    v = leaves[2]
    uniform = v[2:4].mean(dim=1, keepdim=True).expand(-1, 5, -1)
    assert torch.allclose(out[2:4], uniform, atol=1e-12)
    assert torch.allclose(out[4:6], v[4:6, :1].expand(-1, 5, -1), atol=1e-12)
    dq, dk, dv, dprev = gradients((out, stream), leaves, d_out, None)
    assert dprev[2:4].abs().max() == 0  # the whole sentence is padded
    assert dprev[4:6, :, 1:].abs().max() == 0  # padded keys
    assert dprev[4:6, :, 0].abs().max() < 1e-12  # the softmax of one key has no gradient
    # the full sentence: every row passes a gradient into the stream, at every key
    assert (dprev[0:2].abs() > 0).all()


def philox4x32(seed, counters):
    """Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
    the four 32-bit outputs of each 64-bit counter (low word, high word, 0, 0) under the 64-bit
    key ``seed``, in numpy."""
    mask32 = np.uint64(0xFFFFFFFF)
    counters = np.asarray(counters, dtype=np.uint64)
    c0, c1 = counters & mask32, counters >> np.uint64(32)
    c2, c3 = np.zeros_like(c0), np.zeros_like(c0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        product0 = np.uint64(0xD2511F53) * c0  # exact: both factors below 2**32
        product2 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (
            (product2 >> np.uint64(32)) ^ c1 ^ k0,
            product2 & mask32,
            (product0 >> np.uint64(32)) ^ c3 ^ k1,
            product0 & mask32,
        )
        k0 = (k0 + np.uint64(0x9E3779B9)) & mask32
        k1 = (k1 + np.uint64(0xBB67AE85)) & mask32
    return c0, c1, c2, c3


def test_philox_matches_the_published_known_answer():
    """Random123's known-answer test of philox4x32-10 (counter 0, key 0), so that the generator
    below is Philox, not a copy of the kernel's arithmetic."""
    words = [int(w[0]) for w in philox4x32(0, [0])]
    assert words == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def expected_keep(seed, bsz_heads, tgt_len, src_len, p):
    """The dropout mask the kernels promise (True = kept): key ``n`` of row ``r = bh * tgt_len +
    i`` takes Philox output ``n % 4`` of counter ``r * ceil(src_len / 4) + n // 4``, kept where
    its top 31 bits are at least ``round(p * 2**31)``."""
    groups = -(-src_len // 4)
    rows = np.arange(bsz_heads * tgt_len, dtype=np.uint64)[:, None]
    cols = np.arange(src_len, dtype=np.uint64)[None, :]
    words = philox4x32(seed, rows * np.uint64(groups) + cols // np.uint64(4))
    bits = np.choose((cols % np.uint64(4)).astype(np.int64), words)
    keep = (bits >> np.uint64(1)) >= np.uint64(round(p * 2**31))
    return torch.from_numpy(keep.reshape(bsz_heads, tgt_len, src_len))


def test_the_keep_rate_of_the_mask_is_one_minus_p():
    """1 - p within 0.006 on 200,000 draws (about 5 standard deviations at p = 0.25, 0.1);
    neighbouring keys (one Philox call) and rows are not correlated beyond that either."""
    for p in (0.1, 0.25):
        keep = expected_keep(12345, 4, 250, 200, p)
        assert abs(keep.double().mean().item() - (1 - p)) < 0.006
        both = (keep[..., 0::2] & keep[..., 1::2]).double().mean().item()
        assert abs(both - (1 - p) ** 2) < 0.006


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_dropout_is_the_eager_route_with_the_mask_of_a_generator_written_here(dtype):
    """The kernels draw one mask per call from their seed (torch's CPU generator): the mask of
    :func:`expected_keep`, which differs between heads, is regenerated in backward (every
    gradient is the eager route's with that mask), and a second call draws another."""
    p = 0.25
    bsz, tgt_len, src_len = 2, 19, 35
    leaves, d_out, d_stream = inputs(bsz, tgt_len, src_len, dtype, with_prev=True, seed=1)
    kpm = padding([35, 22], src_len)
    torch.manual_seed(7)
    seed = ta.draw_dropout_seed()
    keep = expected_keep(seed, bsz * HEADS, tgt_len, src_len, p)
    assert (keep[0] != keep[1]).float().mean() > 0.2  # two heads of one sentence differ
    # the replay helper (studies/route_precision.py) draws the same mask
    assert torch.equal(ta.dropout_keep_mask(seed, bsz * HEADS, tgt_len, src_len, p, "cpu"), keep)
    torch.manual_seed(7)  # the call draws the same seed
    got = ta.residual_attention(*leaves, kpm, None, HEADS, 1.0, p)
    tol = TOLERANCE[dtype]
    want = formula(*leaves, kpm, None, 1.0, keep=keep, p=p)
    eager = eager_route(*leaves, kpm, None, 1, "sum", keep=keep, p=p)
    no_dropout = formula(*leaves, kpm, None, 1.0)
    assert (got[0].double() - no_dropout[0]).abs().max() > 0.1  # dropout did drop
    got_grads = gradients(got, leaves, d_out, d_stream)
    for reference, label in ((want, ""), (eager, " vs eager")):
        assert_close(got[0], reference[0], tol, "attn" + label)
        assert_close(got[1], reference[1], tol, "stream" + label)
        want_grads = gradients(reference, leaves, d_out, d_stream)
        for what, g, w in zip(("dq", "dk", "dv", "dprev"), got_grads, want_grads):
            assert_close(g, w, tol, what + label)
    again = ta.residual_attention(*leaves, kpm, None, HEADS, 1.0, p)  # the next call's seed
    assert (again[0].double() - got[0].double()).abs().max() > 0.1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_inputs_keep_a_float32_stream(dtype):
    """float16/bfloat16 q, k, v: float32 accumulation, a float32 stream, outputs in the inputs'
    dtype, close to float64 within the half type's rounding."""
    leaves, d_out, d_stream = inputs(2, 17, 23, dtype, with_prev=True, seed=2)
    kpm = padding([23, 9], 23)
    out, stream = ta.residual_attention(*leaves, kpm, causal(23)[:17], HEADS, 2.0, 0.0)
    assert out.dtype == dtype and stream.dtype == torch.float32
    want = formula(*leaves, kpm, causal(23)[:17], 2.0)
    tol = {torch.float16: 1e-2, torch.bfloat16: 4e-2}[dtype]
    assert_close(out, want[0], tol, "attn")
    assert_close(stream, want[1], tol, "stream")
    got_grads = gradients((out, stream), leaves, d_out, d_stream)
    want_grads = gradients(want, leaves, d_out, d_stream)
    for what, g, w in zip(("dq", "dk", "dv", "dprev"), got_grads, want_grads):
        assert g.dtype == (torch.float32 if what == "dprev" else dtype)
        assert_close(g, w, tol, what)


@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (9, 0)], ids=["sm80", "sm86", "sm90"])
def test_short_sequences_get_small_blocks(capability):
    """The launch table: at 32 tokens no block the route launches is more than 32 wide (never
    mostly padding); from 65 tokens on, the 16-bit forward's query blocks are 64 wide."""
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for head_dim in (16, 32, 64, 100, 128):
            for kernel in ("forward", "backward", "dq"):
                cfg = triton_launch.launch_config(kernel, head_dim, dtype, capability, 32)
                width = cfg.block_n if kernel == "backward" else cfg.block_m
                assert width <= 32, (dtype, head_dim, kernel, cfg)
            long = triton_launch.launch_config("forward", head_dim, dtype, capability, 65)
            assert long.block_m == (64 if dtype != torch.float32 else 16)
    with pytest.raises(ValueError, match="head sizes up to 128, got 130"):
        triton_launch.launch_config("forward", 130, torch.float16, (9, 0), 512)


def test_the_grid_folds_batch_times_heads_into_its_first_axis():
    """CUDA's second and third grid axes stop at 65,535: 70,000 heads of 100 tokens in 16-wide
    blocks are one axis of 7 x 70,000 programs."""
    assert ta._grid(100, 16, 70000) == (7 * 70000,)


def test_bad_inputs_stop_with_one_line():
    q = torch.zeros(4, 3, 8)
    k = torch.zeros(4, 5, 8)
    with pytest.raises(ValueError, match=r"previous layer scores \[4, 3, 4\]"):
        ta.residual_attention(q, k, k, torch.zeros(4, 3, 4), None, None, 2, 1.0, 0.0)
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        ta.residual_attention(q, k, k, None, torch.zeros(4, 5, dtype=torch.bool), None, 2, 1.0, 0.0)
    with pytest.raises(ValueError, match="not a multiple of num_heads"):
        ta.residual_attention(q, k, k, None, None, None, 3, 1.0, 0.0)
    with pytest.raises(ValueError, match="share a dtype"):
        ta.residual_attention(q, k.double(), k, None, None, None, 2, 1.0, 0.0)
    big = torch.zeros(2, 3, 200)
    with pytest.raises(ValueError, match="head sizes up to 128, got 200"):
        ta.residual_attention(big, big, big, None, None, None, 1, 1.0, 0.0)
