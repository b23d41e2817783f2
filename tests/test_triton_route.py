"""The triton route of residual attention (``--residual-attention-impl triton``) computes what
the eager route computes: RealFormer's (He et al. 2020, arXiv 2012.11747) layer-l softmax over
the running sum (or mean) of raw scores, with the stream in and out of one fused kernel per
layer. Every chain (encoder, decoder self with the causal mask, cross, the LM's causal chain,
the encoder-only model), both modes, padding; the calls that run the eager route instead (each
reason said once); the dropout probability the kernel is given; what happens without triton
(one line; CPU paths never import it); the build check; ``auto`` never building it unmeasured.

Each model-level comparison runs twice: with ``torch`` (a pure-torch stand-in of
``triton_function.residual_attention``, written here from the eager formula, so that the
route's own wiring is tested without triton) and with ``triton`` (the real kernels under
Triton's interpreter on this CPU, ``TRITON_INTERPRET=1``; skipped where triton is not
installed, e.g. the default venv: ``pip install -e '.[triton]'``, or ``.ci/run``'s triton job).
"""

import logging
import math
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
import torch.nn.functional as F
from harness import (
    NO_DROPOUT,
    USER_DIR,
    beam_decode_with_reordering,
    build_translation_model,
    fairseq_command,
    fairseq_preprocess,
    multi30k_lines,
    parse_train_losses,
    random_batch,
    run,
    translation_train_args,
    write_lines,
)
from test_concat_route import assert_grads_equal, lm_causal_chain_pair, model_pair

from realformer_fairseq import settings
from realformer_fairseq.errors import RealformerConfigError
from realformer_fairseq.models.build_checks import check_layers_match_settings
from realformer_fairseq.modules.routes import RealformerMultiheadAttention
from realformer_fairseq.modules.routes import rules as route_rules
from realformer_fairseq.modules.routes import shared as route_warnings
from realformer_fairseq.modules.routes import triton_route
from realformer_fairseq.modules.routes.triton_route import TritonRealformerMultiheadAttention
from realformer_fairseq.settings import RealformerSettings, read_realformer_settings

TRITON = settings.triton_installed()
NO_TRITON = "triton is not installed here (pip install -e '.[triton]'; .ci/run's triton job)"
if TRITON:
    # Triton reads it when a kernel is defined (the kernel module's import): CPU tensors run
    # in its interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

FUSED = "fused Triton kernel"
EXACT = dict(rtol=1e-12, atol=1e-13)  # float64, the stand-in: the eager formula's order
CLOSE = dict(rtol=1e-9, atol=1e-10)  # float64, the kernel: blocked online softmax
MISSING_LINE = (
    "--residual-attention-impl triton needs the triton package, which is not installed in this "
    "Python: pip install -e '.[triton]' in the clone (CUDA builds of torch ship triton); a "
    "checkpoint trained with it runs the same arithmetic on the eager route with "
    "--model-overrides \"{'residual_attention_impl': 'eager'}\""
)


def torch_residual_attention(
    q, k, v, prev_attn_scores, key_padding_mask, attn_mask, num_heads, softmax_divisor,
    dropout_p, mask_value=-1e30, causal=False, one_stream_per_chain=True,
):  # fmt: skip
    """The kernel's contract in plain torch (the eager route's formula): the new stream
    ``prev + q k^T`` (float32, float64 for float64), the softmax of ``stream / divisor`` plus the
    masks (fill ``mask_value``), attention dropout, times ``v``. ``causal``: the causal mask,
    and the stream 0 after the diagonal, its gradient there passed on only in rows that see
    only the fill."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if causal:
        assert attn_mask is None
        attn_mask = torch.full((q.size(1), k.size(1)), float("-inf"), dtype=dtype).triu(1)
    stream = torch.bmm(q, k.transpose(1, 2)).to(dtype)
    if prev_attn_scores is not None:
        stream = stream + prev_attn_scores
    logits = stream / softmax_divisor
    if attn_mask is not None:
        logits = logits + attn_mask.to(dtype).clamp(min=mask_value)
    if key_padding_mask is not None:
        bh, tgt_len, src_len = logits.shape
        padding = key_padding_mask.view(-1, 1, 1, src_len)
        logits = logits.view(-1, num_heads, tgt_len, src_len).masked_fill(padding, mask_value)
        logits = logits.view(bh, tgt_len, src_len)
    probs = F.dropout(torch.softmax(logits, dim=-1), dropout_p, training=True)
    if causal:
        future = torch.ones_like(attn_mask, dtype=torch.bool).triu(1)
        only_fill = (logits.max(dim=-1, keepdim=True).values <= mask_value).detach()
        zero_passing_gradient = stream - stream.detach()
        above = torch.where(only_fill, zero_passing_gradient, torch.zeros_like(stream))
        stream = torch.where(future, above, stream)
    return torch.bmm(probs.to(v.dtype), v), stream


@pytest.fixture(params=["torch", "triton"])
def kernel(request, monkeypatch):
    """The route's kernel: the stand-in (its calls recorded in ``.calls``) or the real one."""
    route_warnings._SAID.clear()
    if request.param == "triton":
        if not TRITON:
            pytest.skip(NO_TRITON)
        return types.SimpleNamespace(name="triton", calls=[], tolerance=CLOSE)
    calls = []

    def recorded(*args, **kwargs):
        calls.append(dict(divisor=args[7], dropout_p=args[8], **kwargs))
        return torch_residual_attention(*args, **kwargs)

    stand_in = types.ModuleType("triton_attention_stand_in")
    stand_in.residual_attention = recorded
    stand_in.RUNS_IN_INTERPRETER = True  # as the kernels' module under TRITON_INTERPRET=1
    stand_in.MAX_HEAD_DIM = 128  # as the kernels'
    monkeypatch.setattr(triton_route, "kernel_module", lambda: stand_in)
    monkeypatch.setattr(settings, "triton_installed", lambda: True)
    return types.SimpleNamespace(name="torch", calls=calls, tolerance=EXACT)


def triton_pair(arch="realformer_tiny", **overrides):
    """The eager route's model and the triton route's, float64, with the same weights."""
    return model_pair(arch, "triton", **overrides)


def triton_modules(model):
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, TritonRealformerMultiheadAttention)
    }


def warnings_of(caplog):
    """The route's WARNING lines."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == triton_route.logger.name
    ]


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_training_forward_and_gradients_equal_the_eager_route_on_all_three_chains(kernel, mode):
    eager, routed, dictionary = triton_pair(
        residual_attention_mode=mode, encoder_layers=3, decoder_layers=3, **NO_DROPOUT
    )
    src, src_lengths, tgt = random_batch(dictionary, bsz=3, src_len=7, tgt_len=6)
    assert src.eq(dictionary.pad()).any() and tgt.eq(dictionary.pad()).any()
    weight = torch.randn(3, 6, len(dictionary), dtype=torch.float64)
    outputs = []
    for model in (eager, routed):
        model.train()
        out, extra = model(src, src_lengths, tgt)
        (out * weight).sum().backward()
        outputs.append((out, extra["attn"][0]))
    torch.testing.assert_close(outputs[1][0], outputs[0][0], **kernel.tolerance)
    torch.testing.assert_close(outputs[1][1], outputs[0][1], **kernel.tolerance)  # alignment
    assert_grads_equal(eager, routed)
    kernels = {name: m.last_route for name, m in triton_modules(routed).items()}
    assert len(kernels) == 9
    # the alignment layer's cross-attention returns its probabilities (compared above): from
    # the kernel's stream, the kernel runs there too
    assert set(kernels.values()) == {FUSED}
    if kernel.name == "torch":  # 9 kernel calls in the forward; the running mean's divisors
        divisors = [c["divisor"] for c in kernel.calls]
        want = [1.0, 2.0, 3.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0] if mode == "mean" else [1.0] * 9
        assert divisors == want
        assert {c["dropout_p"] for c in kernel.calls} == {0.0}
        assert {c["mask_value"] for c in kernel.calls} == {-1e30}


def test_lm_causal_chain_with_padding_equals_the_eager_route(kernel):
    outs, models = lm_causal_chain_pair("triton")
    torch.testing.assert_close(outs[1], outs[0], **kernel.tolerance)
    assert_grads_equal(*models)
    assert {m.last_route for m in triton_modules(models[1]).values()} == {FUSED}


def test_encoder_only_model_equals_the_eager_route(kernel):
    from test_roberta import build_bert

    flags = dict(dropout=0, attention_dropout=0, activation_dropout=0)
    eager = build_bert("argparse", residual_attention_impl="eager", **flags).double().train()
    routed = build_bert("argparse", residual_attention_impl="triton", **flags).double().train()
    routed.load_state_dict(eager.state_dict())
    d = routed.encoder.dictionary
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(d.nspecial, len(d), (3, 12), generator=g)
    tokens[2, 8:] = d.pad()
    outs = []
    for model in (eager, routed):
        out = model(tokens)[0]
        out.square().sum().backward()
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], **kernel.tolerance)
    assert_grads_equal(eager, routed)
    assert {m.last_route for m in triton_modules(routed).values()} == {FUSED}


def causal_chain(cls, mode, loss_of, weights_of=lambda idx: {"need_weights": False}):
    """Three self-attention layers of ``cls`` (seeded), the causal mask, right padding, a fully
    padded sequence and left padding whose first rows see only padding; backward of
    ``loss_of(output, streams, weights)``. Returns the output, the streams, the weights (each
    layer's call asks for them as ``weights_of(layer index)`` says), the gradients of the input
    and of every parameter, and the layers."""
    from test_concat_route import masks

    causal, pad = masks()
    pad[0, :2] = True
    torch.manual_seed(0)
    layers = [cls(16, 4, residual_attention_mode=mode, self_attention=True).double()
              for _ in range(3)]  # fmt: skip
    x = torch.randn(6, 3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x.requires_grad_()
    y, scores, streams, weights = x, None, [], []
    for idx, m in enumerate(layers):
        y, w, scores, _, _ = m(y, y, y, key_padding_mask=pad, attn_mask=causal,
                               prev_attn_scores=scores, layer_idx=idx, **weights_of(idx))  # fmt: skip
        streams.append(scores)
        weights.append(w)
    loss_of(y, streams, weights).backward()
    grads = [x.grad] + [p.grad for m in layers for p in m.parameters()]
    return y, streams, weights, grads, layers


def assert_chain_gradients_equal(got_grads, want_grads):
    scale = max(g.abs().max().item() for g in want_grads)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11 * scale)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_module_chain_with_causal_mask_and_fully_padded_rows_equals_eager(kernel, mode):
    """Three layers, right padding and a fully padded sequence (under the causal mask, the
    left-padded rows see only masked keys): outputs, streams and every gradient (the
    parameters' and the input's, through the kernel's backward and the stream's). The causal
    mask is made in the kernel: the stream is the eager route's on and before the diagonal and
    0 after it (the loss reads the last stream on and before it)."""

    def loss_of(y, streams, _):
        weight = torch.randn(
            y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2)
        )
        return (y * weight).sum() + streams[-1].tril().sin().sum()

    want, want_streams, _, want_grads, _ = causal_chain(RealformerMultiheadAttention, mode, loss_of)
    got, got_streams, _, got_grads, layers = causal_chain(
        TritonRealformerMultiheadAttention, mode, loss_of
    )
    assert {m.last_route for m in layers} == {FUSED}
    torch.testing.assert_close(got, want, **kernel.tolerance)
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    for a, b in zip(got_streams, want_streams):
        assert (a[:, future] == 0).all()
        torch.testing.assert_close(a, b.masked_fill(future, 0), **kernel.tolerance)
    assert_chain_gradients_equal(got_grads, want_grads)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_the_probabilities_asked_for_are_the_eager_routes_with_their_gradient(kernel, mode):
    """``need_weights`` (fairseq's alignment layer) and ``need_head_weights`` on the kernel: the
    probabilities are the eager route's masked softmax of the kernel's stream (causal mask,
    left padding whose first rows see only padding, a fully padded sequence), and their
    gradient reaches every parameter and the input through the stream, as on the eager route."""

    def weights_of(idx):
        return {"need_weights": idx > 0, "need_head_weights": idx == 2}

    def loss_of(y, _, weights):
        assert weights[0] is None
        assert weights[1].shape == (3, 6, 6) and weights[2].shape == (4, 3, 6, 6)  # fairseq's
        g = torch.Generator().manual_seed(2)
        loss = (y * torch.randn(y.shape, dtype=torch.float64, generator=g)).sum()
        for w in weights[1:]:
            loss = loss + (w * torch.randn(w.shape, dtype=torch.float64, generator=g)).sum()
        return loss

    want, _, want_weights, want_grads, _ = causal_chain(
        RealformerMultiheadAttention, mode, loss_of, weights_of
    )
    got, _, got_weights, got_grads, layers = causal_chain(
        TritonRealformerMultiheadAttention, mode, loss_of, weights_of
    )
    assert {m.last_route for m in layers} == {FUSED}
    torch.testing.assert_close(got, want, **kernel.tolerance)
    for a, b in zip(got_weights[1:], want_weights[1:]):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, **kernel.tolerance)
    assert_chain_gradients_equal(got_grads, want_grads)


def test_incremental_decoding_runs_the_eager_route_and_says_so_once(kernel, caplog):
    eager, routed, dictionary = triton_pair(
        residual_attention_mode="mean", encoder_layers=3, decoder_layers=3, **NO_DROPOUT
    )
    src, src_lengths, _ = random_batch(dictionary, bsz=3, src_len=8, pad_rows=(0, 2))
    results = []
    with caplog.at_level(logging.WARNING, logger="realformer_fairseq.modules.routes.triton_route"):
        for model in (eager, routed, routed):
            model.eval()
            results.append(
                beam_decode_with_reordering(model, dictionary, src, src_lengths, beam=4, steps=5)
            )
    for got in results[1:]:
        torch.testing.assert_close(got[0], results[0][0], **kernel.tolerance)
        torch.testing.assert_close(got[1], results[0][1], **kernel.tolerance)
    layer = routed.decoder.layers[0]
    assert routed.encoder.layers[0].self_attn.last_route == FUSED
    assert layer.self_attn.last_route == FUSED  # the full forward at the end, no state
    # the full forward's cross-attention (fairseq's need_attn in evaluation) asks for its
    # probabilities: the kernel serves it
    assert layer.encoder_attn.last_route == FUSED
    assert warnings_of(caplog) == [
        "--residual-attention-impl triton: runs the eager route where decoding incrementally "
        "(incremental_state) (said once per process)",
    ]


def test_keys_shared_by_the_beams_run_the_eager_route(kernel, caplog):
    """fairseq's set_beam_size (see the concat route's test): cross-attention keys once per
    sentence, a call the kernel does not take."""
    from fairseq.sequence_generator import SequenceGenerator

    eager, routed, dictionary = triton_pair(residual_attention_mode="mean", **NO_DROPOUT)
    src, src_lengths, tgt = random_batch(dictionary, bsz=2, src_len=8, pad_rows=(1,))
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    hypos = []
    with caplog.at_level(logging.WARNING, logger="realformer_fairseq.modules.routes.triton_route"):
        for model in (eager, routed):
            model.eval()
            model.make_generation_fast_(need_attn=False)
            model.decoder.set_beam_size(3)
            generator = SequenceGenerator([model], dictionary, beam_size=3, max_len_b=6)
            hypos.append(generator.forward(sample))
        # without incremental state: a full forward of the beams against shared keys
        expand = torch.arange(2).repeat_interleave(3)
        prev = tgt[expand]
        want = eager(src[expand], src_lengths[expand], prev)[0]
        got = routed(src[expand], src_lengths[expand], prev)[0]
    torch.testing.assert_close(got, want, **kernel.tolerance)
    for a, b in zip(*hypos):
        for x, y in zip(a, b):
            assert torch.equal(x["tokens"], y["tokens"])
    assert routed.decoder.layers[0].encoder_attn.last_route == (
        "eager, because the beams share the encoder's keys (set_beam_size)"
    )
    assert "where the beams share the encoder's keys (set_beam_size)" in "".join(
        warnings_of(caplog)
    )


def test_torchscript_runs_the_eager_route_and_says_so(kernel, caplog):
    eager, routed, dictionary = triton_pair(residual_attention_mode="mean", **NO_DROPOUT)
    src, src_lengths, tgt = random_batch(dictionary)
    with caplog.at_level(logging.WARNING, logger="realformer_fairseq.modules.routes.triton_route"):
        scripted = torch.jit.script(routed.eval())
    assert warnings_of(caplog) == [
        "--residual-attention-impl triton: runs the eager route where the model is scripted "
        "(TorchScript) (said once per process)"
    ]
    with torch.no_grad():
        want = eager.eval()(src, src_lengths, tgt)[0]
        jit = scripted(src, src_lengths, tgt)[0]
    torch.testing.assert_close(jit, want, **EXACT)  # the eager route's own code


def test_cpu_tensors_without_the_interpreter_and_masks_with_a_gradient_run_eager(
    kernel, monkeypatch
):
    torch.manual_seed(0)
    m = TritonRealformerMultiheadAttention(
        16, 4, residual_attention_mode="sum", self_attention=True
    ).double()
    x = torch.randn(5, 2, 16, dtype=torch.float64)
    mask = torch.zeros(5, 5, dtype=torch.float64, requires_grad=True)
    m(x, x, x, attn_mask=mask, need_weights=False)
    assert m.last_route == "eager, because the attention mask needs a gradient"
    m(x, x, x, need_weights=False)
    assert m.last_route == FUSED
    monkeypatch.setattr(triton_route.kernel_module(), "RUNS_IN_INTERPRETER", False)
    m(x, x, x, need_weights=False)
    assert m.last_route == (
        "eager, because tensors are on cpu, not CUDA, without Triton's interpreter "
        "(TRITON_INTERPRET=1 when triton is imported)"
    )


def test_the_kernel_gets_the_dropout_that_fairseqs_dropout_would_apply(kernel):
    """Training: the module's attention dropout; evaluation: none; evaluation with fairseq's
    --retain-dropout (FairseqDropout.apply_during_inference): the module's again."""
    if kernel.name != "torch":
        pytest.skip("reads the stand-in's recorded calls")
    torch.manual_seed(0)
    m = TritonRealformerMultiheadAttention(
        16, 4, residual_attention_mode="sum", self_attention=True, dropout=0.3
    )
    x = torch.randn(5, 2, 16)
    m.train()(x, x, x, need_weights=False)
    m.eval()(x, x, x, need_weights=False)
    m.dropout_module.make_generation_fast_("attention", retain_dropout=True)
    m.eval()(x, x, x, need_weights=False)
    assert [c["dropout_p"] for c in kernel.calls] == [0.3, 0.0, 0.3]
    assert m.last_route == FUSED


def test_the_decoder_chains_causal_mask_is_made_in_the_kernel(kernel):
    """The decoder's self-attention gets fairseq's -inf future mask: the kernel is called with
    causal=True and no mask tensor; cross-attention and the encoder get theirs as before."""
    if kernel.name != "torch":
        pytest.skip("reads the stand-in's recorded calls")
    _, routed, dictionary = triton_pair(decoder_layers=2, encoder_layers=1, **NO_DROPOUT)
    src, src_lengths, tgt = random_batch(dictionary, bsz=2, src_len=5, tgt_len=6)
    routed.train()(src, src_lengths, tgt)
    causal = [c.get("causal", False) for c in kernel.calls]
    # encoder layer, then per decoder layer: self-attention, cross-attention (the last one's
    # returns its probabilities, from the kernel's stream)
    assert causal == [False, True, False, True, False]


def test_causal_masks_are_recognised_once_per_mask():
    n = 5
    future = torch.triu(torch.full((n, n), float("-inf")), 1)
    assert triton_route.is_causal_mask(future, -1e30)
    assert triton_route.is_causal_mask(future.clamp(min=-1e30), -1e30)
    assert not triton_route.is_causal_mask(future.clamp(min=-1e8), -1e30)  # not the fill
    assert not triton_route.is_causal_mask(future[:4], -1e30)  # not square
    assert not triton_route.is_causal_mask(torch.zeros(n, n), -1e30)
    other = future.clone()
    other[3, 1] = float("-inf")  # a key before the query masked
    assert not triton_route.is_causal_mask(other, -1e30)
    big = torch.triu(torch.full((8, 8), float("-inf")), 1)
    assert triton_route.is_causal_mask(big[:6, :6], -1e30)  # fairseq slices its cached mask
    big[2, 3] = 0.0  # changed in place: checked again
    assert not triton_route.is_causal_mask(big[:6, :6], -1e30)


def test_head_sizes_above_the_kernels_are_refused_when_the_model_is_built(kernel):
    with pytest.raises(RealformerConfigError) as err:
        TritonRealformerMultiheadAttention(
            512, 2, residual_attention_mode="sum", self_attention=True
        )
    assert str(err.value) == (
        "--residual-attention-impl triton: the kernels take head sizes up to 128, this "
        "model's is 256 (512 / 2 heads); --residual-attention-impl eager runs it"
    )


# ---------------------------------------------------------------- without triton


def test_without_triton_the_route_is_one_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # Python's way to block an import
    assert not settings.triton_installed()
    base = {"residual_attention": "all", "residual_attention_mode": "sum", "init_type": "admin"}
    with pytest.raises(RealformerConfigError) as err:
        read_realformer_settings(dict(base, residual_attention_impl="triton"))
    assert str(err.value) == MISSING_LINE
    with pytest.raises(RealformerConfigError) as err:
        triton_route.kernel_module()
    assert str(err.value) == MISSING_LINE
    with pytest.raises(RealformerConfigError, match="needs the triton package"):
        build_translation_model("realformer_tiny", residual_attention_impl="triton")


# the plugin imported and models of every other route built (the CPU paths), recording every
# attempt to find or import triton
NO_TRITON_IMPORT = textwrap.dedent("""
    import sys

    class Recorder:
        seen = []

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "triton":
                self.seen.append(name)
            return None

    sys.meta_path.insert(0, Recorder())
    sys.path.insert(0, sys.argv[1])
    from harness import build_translation_model

    import realformer_fairseq  # noqa: F401
    from realformer_fairseq.models import build_checks  # noqa: F401
    from realformer_fairseq.modules.routes import triton_route  # noqa: F401

    for impl in ("eager", "concat", "auto"):
        model, _ = build_translation_model("realformer_tiny", residual_attention_impl=impl)
    print("triton:", Recorder.seen, sorted(m for m in sys.modules if m.startswith("triton")))
    """)


def test_cpu_paths_never_import_triton():
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    out = run([sys.executable, "-c", NO_TRITON_IMPORT, tests_dir], timeout=300)
    assert out.strip().splitlines()[-1] == "triton: [] []"


@pytest.fixture(scope="module")
def tiny_bin(tmp_path_factory):
    """A data-bin of 48 short Multi30k pairs (raw words), for a few updates."""
    root = tmp_path_factory.mktemp("triton_route")
    raw = root / "raw"
    raw.mkdir()
    for lang in ("en", "fr"):
        lines = [line for line in multi30k_lines(lang, "train", 0, 400)]
        write_lines(raw / f"train.{lang}", lines[:48])
        write_lines(raw / f"valid.{lang}", lines[48:56])
    data_bin = root / "data-bin"
    fairseq_preprocess(
        ["--source-lang", "en", "--target-lang", "fr", "--trainpref", raw / "train",
         "--validpref", raw / "valid", "--destdir", data_bin, "--joined-dictionary",
         "--workers", "1"]
    )  # fmt: skip
    return data_bin


def without_triton(command: str):
    """``command`` (a fairseq console script) as a user types it in a Python without triton:
    here, where triton is not installed, the command itself; in the triton job, a Python that
    blocks its import."""
    if not TRITON:
        return [fairseq_command(command)]
    module = {"fairseq-train": "train", "fairseq-generate": "generate"}[command]
    blocked = (
        f"import sys; sys.modules['triton'] = None; sys.argv[0] = '{command}'; "
        f"from fairseq_cli.{module} import cli_main; cli_main()"
    )
    return [sys.executable, "-c", blocked]


def test_fairseq_train_without_triton_stops_with_one_line(tiny_bin, tmp_path):
    """fairseq-train as a user types it, in a Python where triton cannot be imported."""
    args = translation_train_args(tiny_bin, tmp_path / "ck", max_update=1,
                                  extra=["--residual-attention-impl", "triton"])  # fmt: skip
    proc = subprocess.run([*without_triton("fairseq-train"), *map(str, args)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert errors == [f"realformer_fairseq: error: {MISSING_LINE}"]


def test_a_triton_checkpoint_without_triton_names_the_override_that_runs_it(tiny_bin, tmp_path):
    """A model trained on a GPU with the triton route, decoded where triton is missing: one line
    that names the override, and with it the same translations as the eager route's model."""
    save = tmp_path / "ck"
    run([fairseq_command("fairseq-train"), *translation_train_args(tiny_bin, save, max_update=1)])
    eager_ckpt = save / "checkpoint_last.pt"
    state = torch.load(eager_ckpt, map_location="cpu", weights_only=False)
    assert state["cfg"]["model"].residual_attention_impl == "auto"  # eager on a CPU build
    state["cfg"]["model"].residual_attention_impl = "triton"  # as the GPU run saved it
    triton_ckpt = tmp_path / "triton.pt"
    torch.save(state, triton_ckpt)
    decode = [tiny_bin, "--user-dir", USER_DIR, "--gen-subset", "valid", "--beam", "2",
              "--batch-size", "8", "--required-batch-size-multiple", "1", "--cpu",
              "--num-workers", "0"]  # fmt: skip
    plain = [*without_triton("fairseq-generate"), *map(str, decode)]
    proc = subprocess.run([*plain, "--path", str(triton_ckpt)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert [line for line in proc.stderr.splitlines() if ": error: " in line] == [
        f"realformer_fairseq: error: {MISSING_LINE}"
    ]
    override = ["--model-overrides", "{'residual_attention_impl': 'eager'}"]
    by_override = run([*plain, "--path", str(triton_ckpt), *override])
    by_eager = run([*plain, "--path", str(eager_ckpt)])
    hypotheses = [line for line in by_eager.splitlines() if line.startswith("H-")]
    assert len(hypotheses) == 8
    assert [line for line in by_override.splitlines() if line.startswith("H-")] == hypotheses


# ---------------------------------------------------------------- build check and auto


def settings_with(impl):
    return RealformerSettings(
        residual_chains=frozenset({"encoder", "decoder", "cross"}),
        residual_attention_mode="mean",
        residual_attention_impl=impl,
        init_type="default",
        admin_profile_out=None,
    )


def test_the_build_check_refuses_a_model_of_another_route(kernel):
    from test_build_paths import attention_chains

    eager, routed, _ = triton_pair()
    check_layers_match_settings(settings_with("triton"), attention_chains(routed), routed)
    for model, impl, message in (
        (eager, "triton", "has RealformerMultiheadAttention with the eager route, the config "
         "asks for --residual-attention-impl triton, which builds the triton route"),
        (routed, "eager", "has TritonRealformerMultiheadAttention with the triton route, the "
         "config asks for --residual-attention-impl eager, which builds the eager route"),
        (routed, "auto", "has TritonRealformerMultiheadAttention with the triton route, the "
         "config asks for --residual-attention-impl auto, which builds the eager route"),
    ):  # fmt: skip
        with pytest.raises(RealformerConfigError, match="chain 'encoder' layer 0 " + message):
            check_layers_match_settings(settings_with(impl), attention_chains(model), model)


def test_auto_never_builds_the_triton_route_until_a_measurement_exists(kernel, monkeypatch):
    from test_concat_route import pretend_gpu

    assert route_rules.TRITON_RULES == ()
    assert "not measured on a GPU" in route_rules.__doc__
    for gpu in (dict(), dict(name="NVIDIA H100 80GB HBM3"),
                dict(name="NVIDIA A100-SXM4-80GB", capability=(8, 0))):  # fmt: skip
        pretend_gpu(monkeypatch, **gpu)
        for chain in settings.RESIDUAL_CHAINS:
            assert route_rules.built_route("auto", chain) != "triton"
    # a measured row (made up here) is what would make auto build it, in its dtypes only
    pretend_gpu(monkeypatch, name="NVIDIA H100 80GB HBM3")
    row = route_rules.TritonRule(
        device_name="H100", capability=(9, 0), torch_version="2.11", dtypes=(torch.float16,),
        chains=("encoder",), source="made up for this test",
    )  # fmt: skip
    monkeypatch.setattr(route_rules, "TRITON_RULES", (row,))
    monkeypatch.setattr(route_rules, "triton_installed", lambda: True)
    assert [route_rules.built_route("auto", c) for c in settings.RESIDUAL_CHAINS] == [
        "triton", "eager", "eager"
    ]  # fmt: skip
    assert route_rules.built_route("auto", "encoder", cpu=True) == "eager"
    model, dictionary = build_translation_model("realformer_tiny", **NO_DROPOUT)
    first = model.encoder.layers[0].self_attn
    assert type(first) is TritonRealformerMultiheadAttention
    assert type(model.decoder.layers[0].self_attn) is RealformerMultiheadAttention
    src, src_lengths, tgt = random_batch(dictionary)
    model(src, src_lengths, tgt)  # float32: not a measured dtype
    assert first.last_route == (
        "eager, because auto: torch.float32 is not a dtype of its measured triton rule"
    )


# ---------------------------------------------------------------- fairseq-train


@pytest.mark.skipif(not TRITON, reason=NO_TRITON)
def test_fairseq_train_with_the_triton_route_logs_the_losses_of_the_eager_route(tiny_bin, tmp_path):
    """A real fairseq-train of realformer_tiny on CPU, the kernels under Triton's interpreter,
    against the same command with the eager route: the same loss at every update (the log's
    three decimals; dropout off, so that both compute the same function)."""
    losses = {}
    for impl in ("eager", "triton"):
        args = translation_train_args(
            tiny_bin, tmp_path / impl, max_update=3,
            extra=["--residual-attention-impl", impl, "--dropout", "0", "--attention-dropout",
                   "0", "--max-tokens", "200", "--no-save", "--disable-validation"],
        )  # fmt: skip
        out = run([fairseq_command("fairseq-train"), *args], env={"TRITON_INTERPRET": "1"})
        assert f"{impl} route of --residual-attention-impl {impl}" in out
        losses[impl] = parse_train_losses(out)
    assert len(losses["eager"]) == 3
    assert all(math.isfinite(x) for x in losses["triton"])
    assert losses["triton"] == pytest.approx(losses["eager"], abs=1.5e-3)
    # --checkpoint-activations re-runs each layer in backward: the layers keep their own streams
    # (issue 51), said once, and train the same losses
    args = translation_train_args(
        tiny_bin, tmp_path / "checkpointed", max_update=3,
        extra=["--residual-attention-impl", "triton", "--checkpoint-activations", "--dropout",
               "0", "--attention-dropout", "0", "--max-tokens", "200", "--no-save",
               "--disable-validation"],
    )  # fmt: skip
    out = run([fairseq_command("fairseq-train"), *args], env={"TRITON_INTERPRET": "1"})
    said = [line for line in out.splitlines() if "keeps its own stream" in line]
    assert len(said) == 1 and "--checkpoint-activations" in said[0], said
    assert parse_train_losses(out) == pytest.approx(losses["eager"], abs=1.5e-3)
