"""The triton route's kernels (realformer_fairseq/modules/routes/triton_kernels.py) at the blocks a GPU
launches, run on CPU tensors by Triton's interpreter with the launch table's capability patched
(``INTERPRETER_CAPABILITY``, what ``launch_config`` reads for CPU tensors): residual attention (RealFormer,
He et al. 2020, arXiv 2012.11747) against its formula and the eager route, outputs and every
gradient, at each block structure the table gives sm_80, sm_86 or sm_90: forward query blocks
wider than its key blocks (64 x 32), key-block passes of 16 queries by 32 keys (head sizes
65-128), dq blocks other than the key-block pass's (64 x 64 or 32 x 32 against 32 x 32 or
16 x 32; 32 x 32 against 16 x 16 at float32), lengths over several blocks with
ragged last ones and lengths shorter than one block, head sizes 80 and 96 (padded to 128).

The interpreter runs each block as one array whatever ``num_warps`` and ``num_stages``: the block
sizes are what it can check (tests/test_triton_compile.py compiles the full configurations). The
16-bit rows run float64 inputs (exact to 1e-12) through the blocks the table gives float16 /
bfloat16 (``launch_config`` asked for that dtype); the float32 row runs float32 and float64
inputs (float64 takes float32's row).

Also here: the route under ``torch.use_deterministic_algorithms(True)``; the chain's one stream
rebuilt in place and the stream gradient handed down in place (storage identity), by the kernel
function and by the route's modules; float64 on CUDA refused in one line.

TRITON_INTERPRET=1 is set at collection, before anything imports triton (see
tests/test_triton_kernels.py)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

# the interpreter's tests: out of the default suite, run by -m triton (.ci/run's triton job)
pytestmark = pytest.mark.triton

pytest.importorskip(
    "triton", reason="triton is not installed (the triton extra: pip install -e '.[triton]')"
)

from test_triton_kernels import (  # noqa: E402
    HEADS,
    assert_close,
    causal,
    formula,
    gradients,
    only_fill_rows,
    padding,
)

from realformer_fairseq.modules.routes import shared as route_warnings  # noqa: E402
from realformer_fairseq.modules.routes import triton_function as ta  # noqa: E402
from realformer_fairseq.modules.routes import triton_launch  # noqa: E402
from realformer_fairseq.modules.routes.eager import RealformerMultiheadAttention  # noqa: E402
from studies.route_precision import CASES as ROUTE_CASES  # noqa: E402
from studies.route_precision import inputs as chain_inputs  # noqa: E402
from studies.route_precision import layer_of, run_chain  # noqa: E402

SM80, SM86, SM90 = (8, 0), (8, 6), (9, 0)

# The (block_m, block_n) of the forward, the key-block pass and the dq pass by class of inputs,
# as the launch table is meant to give them to a GPU (written here, not read from the table).
# The key-block pass tiles the keys; the forward and the dq pass the queries, which choose the
# class ("over 64 tokens": more than 64 queries).
SHORT_16, SHORT_16_HEAD_128, LONG_16, LONG_16_HEAD_128 = (
    "16-bit, head size up to 64, up to 64 tokens",
    "16-bit, head size 65-128, up to 64 tokens",
    "16-bit, head size up to 64, over 64 tokens",
    "16-bit, head size 65-128, over 64 tokens",
)
BLOCKS = {
    SHORT_16: ((32, 32), (32, 32), (32, 32)),
    SHORT_16_HEAD_128: ((32, 32), (16, 32), (32, 32)),
    LONG_16: ((64, 32), (32, 32), (64, 64)),
    LONG_16_HEAD_128: ((64, 32), (16, 32), (32, 32)),
    "float32": ((16, 16), (16, 16), (32, 32)),
}

# (the dtype whose blocks run, input dtype, head size, BLOCKS key, calls), each at sm_80 and
# sm_90: each call a causal self-attention chain layer (left padding: rows that see only the
# fill; running mean) or cross-attention (right padding; running sum), (tgt_len, src_len): short
# lengths that still span two or more blocks of every kernel with a ragged last one, and one
# shorter than a block (20 keys in 32-wide blocks, 20 and 9 queries in 32- and 16-wide ones).
LONG = [("causal", 100, 100), ("cross", 100, 20)]
SHORT = [("causal", 50, 50), ("cross", 20, 50)]
FLOAT32 = [("causal", 37, 37), ("cross", 9, 37)]
ROWS = {
    "fp16-head64-long": (torch.float16, torch.float64, 64, LONG_16, LONG),
    "bf16-head32-long": (torch.bfloat16, torch.float64, 32, LONG_16, LONG),
    "fp16-head96-long": (torch.float16, torch.float64, 96, LONG_16_HEAD_128, LONG),
    "bf16-head80-long": (torch.bfloat16, torch.float64, 80, LONG_16_HEAD_128, LONG),
    "fp16-head128-long": (torch.float16, torch.float64, 128, LONG_16_HEAD_128, LONG),
    "fp16-head80-short": (torch.float16, torch.float64, 80, SHORT_16_HEAD_128, SHORT),
    "bf16-head64-short": (torch.bfloat16, torch.float64, 64, SHORT_16, SHORT),
    "fp32-head96": (torch.float32, torch.float32, 96, "float32", FLOAT32),
    "float64-head80": (None, torch.float64, 80, "float32", FLOAT32),
}
CASES = {
    f"sm{major}{minor}-{name}": ((major, minor), *row)
    for (major, minor) in (SM80, SM90)
    for name, row in ROWS.items()
}
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}  # relative to max(1, |reference|)


def blocks_of(capability, dtype, head_dim, length):
    """The (block_m, block_n) of the forward, key-block and dq passes the table gives."""
    return tuple(
        (cfg.block_m, cfg.block_n)
        for cfg in (
            ta.launch_config(kernel, head_dim, dtype, capability, length)
            for kernel in ("forward", "backward", "dq")
        )
    )


def test_every_block_structure_of_the_launch_table_has_a_case_here():
    """Every capability, 16-bit and float32 input, head size and length the table takes gives
    one of :data:`BLOCKS` (sm_80, sm_86, sm_89 and sm_90 alike), each run by a case below."""
    seen = {}
    for capability in (SM80, SM86, (8, 9), SM90):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for head_dim in range(1, ta.MAX_HEAD_DIM + 1):
                for length in (1, triton_launch.SHORT, triton_launch.SHORT + 1, 4096):
                    blocks = blocks_of(capability, dtype, head_dim, length)
                    seen.setdefault(blocks, (capability, dtype, head_dim, length))
    assert set(seen) == set(BLOCKS.values()), seen
    assert {case[4] for case in CASES.values()} == set(BLOCKS)


@pytest.fixture
def launched(monkeypatch):
    """Runs the kernels with the blocks of ``capability`` (and of ``table_dtype``'s row, where
    given, whatever the inputs' dtype); returns the (kernel, (block_m, block_n)) launched."""
    table = ta.launch_config
    launches = []

    def as_gpu(capability, table_dtype):
        monkeypatch.setattr(ta, "INTERPRETER_CAPABILITY", capability)

        def config(kernel, head_dim, dtype, device_capability, length):
            assert device_capability == capability
            cfg = table(kernel, head_dim, table_dtype or dtype, device_capability, length)
            launches.append((kernel, (cfg.block_m, cfg.block_n)))
            return cfg

        monkeypatch.setattr(ta, "launch_config", config)
        return launches

    return as_gpu


def head_inputs(bsz, tgt_len, src_len, head_dim, dtype, seed=0):
    """q (scaled), k, v, the previous stream (leaves), d_out and the stream's gradient."""
    g = torch.Generator().manual_seed(seed)
    bh = bsz * HEADS
    q = torch.randn(bh, tgt_len, head_dim, generator=g) * head_dim**-0.5
    k = torch.randn(bh, src_len, head_dim, generator=g)
    v = torch.randn(bh, src_len, head_dim, generator=g)
    prev = 3 * torch.randn(bh, tgt_len, src_len, generator=g)
    d_out = torch.randn(bh, tgt_len, head_dim, generator=g)
    d_stream = torch.randn(bh, tgt_len, src_len, generator=g)
    sdtype = ta.stream_dtype(dtype)
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)] + [prev.to(sdtype).requires_grad_()]
    return leaves, d_out.to(dtype), d_stream.to(sdtype)


def eager_route(head_dim, q, k, v, prev, key_padding_mask, attn_mask, layer_idx, mode):
    """The eager module's own stream and attention on these heads (no projections)."""
    module = RealformerMultiheadAttention(HEADS * head_dim, HEADS, mode, self_attention=True)
    module._merge_heads = lambda attn, tgt_len, bsz: attn  # the heads, before out_proj
    bsz = q.size(0) // HEADS
    raw = module.raw_scores(q, k, bsz, bsz)
    stream = module.add_to_stream(raw, prev)
    attn, _ = module._attend_stream(
        stream, raw, v, key_padding_mask, attn_mask, bsz, bsz, layer_idx, False, False
    )
    return attn, stream


def check_call(kind, tgt_len, src_len, head_dim, dtype):
    """One layer, outputs and gradients (q, k, v, the previous stream), against the formula and
    the eager module."""
    tol = TOLERANCE[dtype]
    leaves, d_out, d_stream = head_inputs(2, tgt_len, src_len, head_dim, dtype)
    if kind == "causal":
        # the second sentence's first rows see only padding: they attend to every key
        kpm = padding([src_len, src_len // 2], src_len, left=True)
        mask, divisor, layer_idx, mode = causal(src_len), 3.0, 2, "mean"
        got = ta.residual_attention(*leaves, kpm, None, HEADS, divisor, 0.0, causal=True)
        future = torch.ones(tgt_len, src_len, dtype=torch.bool).triu(1)
        assert (got[1][:, future] == 0).all()
        passed_on = ~future | only_fill_rows(kpm, tgt_len)
        d_stream_passed = d_stream.masked_fill(~passed_on, 0)
    else:
        kpm = padding([src_len, src_len // 3 + 1], src_len)
        mask, divisor, layer_idx, mode = None, 1.0, 1, "sum"
        got = ta.residual_attention(*leaves, kpm, None, HEADS, divisor, 0.0)
        future = torch.zeros(tgt_len, src_len, dtype=torch.bool)
        d_stream_passed = d_stream
    assert got[0].shape == (2 * HEADS, tgt_len, head_dim) and got[0].dtype == dtype
    got_grads = gradients(got, leaves, d_out, d_stream)
    want = formula(*leaves, kpm, mask, divisor)
    eager = eager_route(head_dim, *leaves, kpm, mask, layer_idx, mode)
    for reference, label in ((want, f"{kind}"), (eager, f"{kind} vs eager")):
        assert_close(got[0], reference[0], tol, f"attn ({label})")
        assert_close(got[1], reference[1].masked_fill(future, 0), tol, f"stream ({label})")
        want_grads = gradients(reference, leaves, d_out, d_stream_passed)
        for what, g, w in zip(("dq", "dk", "dv", "dprev"), got_grads, want_grads):
            assert_close(g, w, tol, f"{what} ({label})")


@pytest.mark.parametrize("name", list(CASES))
def test_the_blocks_a_gpu_launches_give_the_formulas_and_the_eager_routes_values(name, launched):
    capability, table_dtype, dtype, head_dim, structure, calls = CASES[name]
    launches = launched(capability, table_dtype)
    for kind, tgt_len, src_len in calls:
        check_call(kind, tgt_len, src_len, head_dim, dtype)
    forward, backward, dq = BLOCKS[structure]
    want = {("forward", forward), ("backward", backward), ("dq", dq), ("delta", (64, 16))}
    assert set(launches) == want
    assert len(launches) == 4 * len(calls)  # each call: the forward and the backward's three


def test_forward_and_backward_are_bitwise_the_same_under_deterministic_algorithms(monkeypatch):
    """Two layers of the triton route's module (a decoder's causal chain, float32, attention
    dropout, the padded sequences of studies.route_precision) at sm_90's blocks, forward and
    backward twice under ``torch.use_deterministic_algorithms(True)``: no operation of the route
    refuses the flag, the results (output, input and parameter gradients) are bitwise the same
    both times, and all finite (the flag fills ``torch.empty`` with NaN: a buffer the kernels
    leave unwritten shows). On CPU the interpreter runs the programs one after another, so this
    cannot see a race: the compile test checks the GPU code has no atomics."""
    monkeypatch.setattr(ta, "INTERPRETER_CAPABILITY", SM90)
    monkeypatch.setattr(route_warnings, "_SAID", set())
    case = "decoder self-attention (causal)"
    torch.manual_seed(0)
    layers = [layer_of("triton", case, 32, dropout=0.1).float().train() for _ in range(2)]
    query, keys, attn_mask, pad = chain_inputs(case, 17, 32)
    query, attn_mask = query.float(), attn_mask.float()

    def run():
        torch.manual_seed(5)
        x = query.clone().requires_grad_()
        for layer in layers:
            layer.zero_grad(set_to_none=True)
        out = run_chain(layers, x, keys, attn_mask, pad)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        assert [m.last_kernel for m in layers] == ["fused Triton kernel"] * 2
        grads = [x.grad] + [p.grad for m in layers for p in m.parameters()]
        return [out.detach()] + grads

    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first, second = run(), run()
    finally:
        torch.use_deterministic_algorithms(was)
    assert len(first) == 1 + 1 + 2 * 8  # the output, the query's and each layer's 8 gradients
    for a, b in zip(first, second):
        assert torch.isfinite(a).all() and torch.equal(a, b)


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class RecordedKernel:
    """A kernel whose launches record their arguments by name, tensors as the address of their
    storage (holding no tensor: a reference held here would make the route copy)."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            named = dict(zip(self.kernel.arg_names, args), **kwargs)
            self.launches.append(
                {n: storage(a) if isinstance(a, torch.Tensor) else a for n, a in named.items()}
            )
            return launch(*args, **kwargs)

        return run


def test_the_chain_rebuilds_one_stream_in_place_and_hands_its_gradient_down_in_place(
    monkeypatch,
):
    """Four layers of one chain: every layer's backward (the key-block pass) rebuilds the
    previous stream in the same buffer (``STREAM``: one storage for the four launches), a copy
    of the chain's last stream, which the caller holds and which keeps its values; each layer
    below the top writes the previous stream's gradient over the gradient it got (``DS`` is
    ``DSTREAM``'s storage), the buffer the layer above wrote (one storage for the layers below
    the top). Fails where ``writable_stream`` copies a stream nobody else holds, or where the
    gradient is not written over."""
    recorded = RecordedKernel(ta._backward_kernel)
    monkeypatch.setattr(ta, "_backward_kernel", recorded)
    g = torch.Generator().manual_seed(0)
    length, head_dim, depth = 21, 8, 4
    kpm = padding([length, 13], length)
    leaves, streams = [], []
    prev = None
    outs = []
    for _ in range(depth):
        q, k, v = (torch.randn(2 * HEADS, length, head_dim, generator=g, dtype=torch.float64)
                   .requires_grad_() for _ in range(3))  # fmt: skip
        leaves += [q, k, v]
        out, prev = ta.residual_attention(
            q * head_dim**-0.5, k, v, prev, kpm, None, HEADS, 1.0, 0.0
        )
        outs.append(out)
        streams.append(prev)
    top = streams[-1]
    top_before = top.detach().clone()
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    loss = loss + (top * torch.randn(top.shape, generator=g, dtype=top.dtype)).sum()
    del streams[:-1]  # the caller holds only the last stream, as a model returns it
    loss.backward()
    launches = recorded.launches
    assert len(launches) == depth
    assert all(call["REBUILD"] for call in launches[:-1]) and not launches[-1]["REBUILD"]
    rebuilt = {call["STREAM"] for call in launches}
    assert len(rebuilt) == 1, "each layer's backward copied the stream it rebuilds"
    assert rebuilt != {storage(top)}  # the caller's stream: copied once, left as it was
    assert torch.equal(top, top_before)
    below_top = launches[1:]
    assert all(c["DS"] == c["DSTREAM"] for c in below_top), "a gradient was copied"
    assert len({c["DS"] for c in launches}) == 1  # the top layer's, handed down
    assert all(leaf.grad is not None and torch.isfinite(leaf.grad).all() for leaf in leaves)


@pytest.mark.parametrize("case", ROUTE_CASES)
def test_the_routes_modules_rebuild_one_stream_and_hand_the_gradient_down_in_place(
    case, monkeypatch
):
    """The same through the route's modules (``--residual-attention-impl triton``), four layers
    of each chain: one storage for every rebuild, each layer below the top writing the
    previous stream's gradient over the one it got."""
    recorded = RecordedKernel(ta._backward_kernel)
    monkeypatch.setattr(ta, "_backward_kernel", recorded)
    monkeypatch.setattr(route_warnings, "_SAID", set())
    torch.manual_seed(0)
    layers = [layer_of("triton", case, 32).double().train() for _ in range(4)]
    query, keys, attn_mask, pad = chain_inputs(case, 12, 32)
    run_chain(layers, query.requires_grad_(), keys, attn_mask, pad).sum().backward()
    assert [m.last_kernel for m in layers] == ["fused Triton kernel"] * 4
    launches = recorded.launches
    assert len(launches) == 4
    assert len({call["STREAM"] for call in launches}) == 1
    assert [call["DS"] == call["DSTREAM"] for call in launches] == [False, True, True, True]


class PretendCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: what ``_check`` reads of a CUDA tensor."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_float64_on_cuda_is_refused_in_one_line():
    """The launch table has no float64 row (float64 runs in the interpreter only): float64 CUDA
    tensors stop with one line before any kernel; float32 CUDA tensors pass the same check."""
    q = torch.zeros(2, 5, 8, dtype=torch.float64).as_subclass(PretendCuda)
    assert q.device.type == "cuda"
    with pytest.raises(ValueError) as err:
        ta.residual_attention(q, q, q, None, None, None, 1, 1.0, 0.0)
    assert str(err.value) == "the triton kernels take float64 in the interpreter only, not on CUDA"
    single = torch.zeros(2, 5, 8).as_subclass(PretendCuda)
    assert ta._check(single, single, single, None, None, None, 1, 1.0, 0.0, False) is None


def test_the_kernels_read_and_write_fairseqs_layout_without_a_copy(monkeypatch):
    """q, k, v as the route's module projects them (fairseq's ``(length, bsz*heads, head_dim)``
    in memory) reach the kernels as they are (the forward's ``Q``, ``K``, ``V`` are their
    storages); the output, ``dq``, ``dk`` and ``dv`` come back in that layout, so the merge of
    the heads (``transpose(0, 1).contiguous()``) is the output itself. A tensor in another
    layout is copied once and gives the same values."""
    recorded = RecordedKernel(ta._forward_kernel)
    monkeypatch.setattr(ta, "_forward_kernel", recorded)
    g = torch.Generator().manual_seed(0)
    bsz_heads, tgt_len, src_len, head_dim = 6, 9, 11, 8
    q, k, v = (
        torch.randn(length, bsz_heads, head_dim, generator=g, dtype=torch.float64)
        .transpose(0, 1).requires_grad_()
        for length in (tgt_len, src_len, src_len)
    )  # fmt: skip
    out, _ = ta.residual_attention(q, k, v, None, None, None, 3, 1.0, 0.0)
    assert recorded.launches[0]["Q"] == storage(q)
    assert (recorded.launches[0]["K"], recorded.launches[0]["V"]) == (storage(k), storage(v))
    assert out.shape == (bsz_heads, tgt_len, head_dim)
    assert out.transpose(0, 1).is_contiguous() and not out.is_contiguous()
    assert out.transpose(0, 1).contiguous().data_ptr() == out.data_ptr()
    d_out = torch.randn(out.shape, generator=g, dtype=out.dtype)  # contiguous: copied
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), d_out)
    for grad in (dq, dk, dv):
        assert grad.transpose(0, 1).is_contiguous() and not grad.is_contiguous()
    # the same inputs as contiguous (bsz*heads, length, head_dim) tensors: copied, same values
    leaves = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    out2, _ = ta.residual_attention(*leaves, None, None, None, 3, 1.0, 0.0)
    assert recorded.launches[1]["Q"] != storage(leaves[0])
    assert torch.equal(out2, out)
    for a, b in zip(torch.autograd.grad(out2, leaves, d_out), (dq, dk, dv)):
        assert torch.equal(a, b)
