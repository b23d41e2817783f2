"""The triton route's kernels (realformer_fairseq/modules/triton_attention.py), run on CPU tensors
by Triton's interpreter, against residual attention written here from its formula (RealFormer,
He et al. 2020, arXiv 2012.11747: ``S_l = Q_l K_l^T / sqrt(d) + S_{l-1}``, softmax over the masked
``S_l`` (divided by ``l + 1`` for the running mean), dropout, ``P V``) in float64, and against the
eager route's own ``_add_to_stream`` / ``_attend_stream``: every output and every gradient (q, k,
v and the previous stream), in float64 and float32, at lengths that are not multiples of the
interpreter's 16-wide blocks. Needs triton (``pip install -e '.[triton]'``); skipped without it.

TRITON_INTERPRET=1 must be set before triton is first imported in the process (triton's own
``tl.rand``, ``tl.max`` are decorated at import): this file sets it at collection, and fails
with one line where something imported triton earlier without it."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip(
    "triton", reason="triton is not installed (the triton extra: pip install -e '.[triton]')"
)

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from realformer_fairseq.modules import triton_attention as ta  # noqa: E402
from realformer_fairseq.modules.residual_attention import (  # noqa: E402
    _MASK_VALUE,
    RealformerMultiheadAttention,
)

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
    raw = module._raw_scores(q, k, bsz, bsz)
    stream = module._add_to_stream(raw, prev)
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
    assert dprev[0:2].abs().min() >= 0 and dprev[0:2].abs().max() > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_dropout_is_the_eager_route_with_the_kernels_own_mask(dtype):
    """The kernels draw one mask per call from their seed (torch's CPU generator), regenerate it
    in backward, and compute the eager route with that mask: outputs and every gradient."""
    p = 0.25
    bsz, tgt_len, src_len = 2, 19, 35
    leaves, d_out, d_stream = inputs(bsz, tgt_len, src_len, dtype, with_prev=True, seed=1)
    kpm = padding([35, 22], src_len)
    torch.manual_seed(7)
    seed = ta.draw_dropout_seed()
    keep = ta.dropout_keep_mask(seed, bsz * HEADS, tgt_len, src_len, p, "cpu")
    assert keep.shape == (bsz * HEADS, tgt_len, src_len) and keep.dtype == torch.bool
    assert 0.65 < keep.float().mean().item() < 0.85  # Bernoulli(1 - p)
    other = ta.dropout_keep_mask(seed + 1, bsz * HEADS, tgt_len, src_len, p, "cpu")
    assert (other != keep).any()
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
