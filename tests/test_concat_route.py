"""The concat route of residual attention (``--residual-attention-impl concat``) computes what
the eager route computes: RealFormer's (He et al. 2020, arXiv 2012.11747) layer-l softmax input
``sum_{i<=l} Q_i K_i^T / sqrt(d)`` as one fused attention over the concatenated queries and keys
of the chain. Float64, tiny shapes: forward, gradients, incremental decoding with beam
reordering, beam search with shared encoder keys, every chain (encoder, decoder self with the
causal mask, cross, the LM's causal chain), both modes, padding, fully padded rows, attention
dropout, and the cases that fall back to the eager route."""

import logging
import math

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator
from harness import (
    NO_DROPOUT,
    beam_decode_with_reordering,
    build_translation_model,
    random_batch,
)

from realformer_fairseq.errors import RealformerConfigError
from realformer_fairseq.modules.routes import (
    ConcatRealformerMultiheadAttention,
    RealformerMultiheadAttention,
)
from realformer_fairseq.modules.routes import rules as route_rules
from realformer_fairseq.modules.routes import shared as route_warnings
from realformer_fairseq.modules.routes.concat import stream_of
from realformer_fairseq.settings import read_realformer_settings

FUSED = "fused SDPA, flash"
EXACT = dict(rtol=1e-12, atol=1e-13)  # float64; the routes sum in different orders


def model_pair(arch="realformer_tiny", impl="concat", **overrides):
    """The eager route's model and the ``impl`` route's, float64, with the same weights."""
    models = []
    for route in ("eager", impl):
        torch.manual_seed(0)
        model, dictionary = build_translation_model(
            arch, init_type="default", residual_attention_impl=route, **overrides
        )
        models.append(model.double())
    models[1].load_state_dict(models[0].state_dict())
    return models[0], models[1], dictionary


def concat_modules(model):
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, ConcatRealformerMultiheadAttention)
    }


def assert_grads_equal(eager, concat):
    """Every parameter's gradient, to 1e-12 of the largest gradient (some, such as the
    key biases', are exactly zero in exact arithmetic and rounding noise here)."""
    pairs = [
        (n, p.grad, q.grad) for (n, p), q in zip(eager.named_parameters(), concat.parameters())
    ]
    scale = max(g.abs().max().item() for _, g, _ in pairs if g is not None)
    assert scale > 0
    for name, want, got in pairs:
        assert (want is None) == (got is None), name
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12 * scale, msg=name)


def three_layer_pair(mode):
    return model_pair(
        residual_attention_mode=mode, encoder_layers=3, decoder_layers=3, **NO_DROPOUT
    )


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_training_forward_and_gradients_equal_the_eager_route_on_all_three_chains(mode):
    eager, concat, dictionary = three_layer_pair(mode)
    src, src_lengths, tgt = random_batch(dictionary, bsz=3, src_len=7, tgt_len=6)
    assert src.eq(dictionary.pad()).any() and tgt.eq(dictionary.pad()).any()
    weight = torch.randn(3, 6, len(dictionary), dtype=torch.float64)
    outputs = []
    for model in (eager, concat):
        model.train()
        out, extra = model(src, src_lengths, tgt)
        (out * weight).sum().backward()
        outputs.append((out, extra["attn"][0]))
    torch.testing.assert_close(outputs[1][0], outputs[0][0], **EXACT)
    torch.testing.assert_close(outputs[1][1], outputs[0][1], **EXACT)  # alignment weights
    assert_grads_equal(eager, concat)
    kernels = {name: m.last_route for name, m in concat_modules(concat).items()}
    assert len(kernels) == 9
    # the alignment layer's cross-attention returns its probabilities: eager, by design
    assert kernels.pop("decoder.layers.2.encoder_attn").startswith("eager, because the atten")
    assert set(kernels.values()) == {FUSED}


def test_incremental_decoding_with_beam_reordering_equals_the_eager_route():
    eager, concat, dictionary = three_layer_pair("mean")
    src, src_lengths, _ = random_batch(dictionary, bsz=3, src_len=8, pad_rows=(0, 2))
    results = []
    for model in (eager, concat):
        model.eval()
        results.append(
            beam_decode_with_reordering(model, dictionary, src, src_lengths, beam=4, steps=5)
        )
    torch.testing.assert_close(results[1][0], results[0][0], **EXACT)
    torch.testing.assert_close(results[1][0], results[1][1], **EXACT)  # incremental = full
    kernels = {name: m.last_route for name, m in concat_modules(concat).items()}
    assert all(kernels[f"decoder.layers.{i}.self_attn"] == FUSED for i in range(3))


def test_beam_search_with_keys_shared_by_the_beams_equals_the_eager_route():
    """fairseq's set_beam_size (its "beamable enc-dec attention"; fairseq 0.12's
    SequenceGenerator sets it only on models with a ``set_beam_size``, which the transformer
    lacks, so it is set on the decoder here): cross-attention keys once per sentence, the
    beams' queries folded along the query axis of the fused attention."""
    eager, concat, dictionary = three_layer_pair("mean")
    src, src_lengths, _ = random_batch(dictionary, bsz=4, src_len=8, pad_rows=(1, 3))
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    hypos = []
    for model in (eager, concat):
        model.eval()
        model.make_generation_fast_(need_attn=False)  # as fairseq-generate, no --print-alignment
        model.decoder.set_beam_size(5)
        generator = SequenceGenerator([model], dictionary, beam_size=5, max_len_b=8)
        hypos.append(generator.forward(sample))
    cross = concat.decoder.layers[0].encoder_attn
    assert cross.beam_size == 5 and cross.last_route == FUSED
    for want, got in zip(*hypos):
        for a, b in zip(want, got):
            assert torch.equal(a["tokens"], b["tokens"])
            torch.testing.assert_close(b["positional_scores"], a["positional_scores"])


def lm_causal_chain_pair(impl):
    """The LM's causal chain with right padding, float64, on the eager route and on ``impl``
    with the same weights, after one forward and backward: ``(outputs, models)``."""
    from test_lm import build_lm, lm_task

    task = lm_task()
    models = []
    for route in ("eager", impl):
        model, _ = build_lm("realformer_lm_tiny", task=task, decoder_layers=3,
                            residual_attention_impl=route, init_type="default", **NO_DROPOUT)  # fmt: skip
        models.append(model.double().train())
    models[1].load_state_dict(models[0].state_dict())
    d = task.source_dictionary
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(d.nspecial, len(d), (3, 9), generator=g)
    tokens[1, 6:] = d.pad()  # right padding: the decoder's self-attention padding mask
    outs = []
    for model in models:
        out = model(tokens)[0]
        out.square().sum().backward()
        outs.append(out)
    return outs, models


def test_lm_causal_chain_with_padding_equals_the_eager_route():
    outs, models = lm_causal_chain_pair("concat")
    torch.testing.assert_close(outs[1], outs[0], **EXACT)
    assert_grads_equal(*models)
    assert {m.last_route for m in concat_modules(models[1]).values()} == {FUSED}


def module_chain(impl, mode, n=3, embed=16, heads=4, dtype=torch.float64, dropout=0.0):
    torch.manual_seed(0)
    layers = []
    for _ in range(n):
        if impl == "eager":
            m = RealformerMultiheadAttention(
                embed, heads, residual_attention_mode=mode, self_attention=True, dropout=dropout
            )
        else:
            m = ConcatRealformerMultiheadAttention(
                embed, heads, residual_attention_mode=mode, residual_attention_impl=impl,
                self_attention=True, dropout=dropout,
            )  # fmt: skip
        layers.append(m.to(dtype))
    return layers


def run_chain(layers, x, **kwargs):
    """Outputs per layer and what the last layer hands on: (outputs, carried)."""
    outs, scores, queries, keys = [], None, None, None
    for idx, layer in enumerate(layers):  # both routes: the same call, the same five values
        out, _, scores, queries, keys = layer(
            x, x, x, prev_attn_scores=scores, layer_idx=idx,
            prev_attn_queries=queries, prev_attn_keys=keys, need_weights=False, **kwargs,
        )  # fmt: skip
        outs.append(out)
        x = out
    return outs, (scores, queries, keys)


def masks(tgt_len=6, bsz=3):
    causal = torch.triu(torch.full((tgt_len, tgt_len), -math.inf, dtype=torch.float64), 1)
    pad = torch.zeros(bsz, tgt_len, dtype=torch.bool)
    pad[1, -2:] = True  # right padding
    pad[2, :] = True  # a fully padded sequence: its rows are all masked
    return causal, pad


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("causal_mask", [False, True])
def test_module_chain_equals_eager_with_fully_padded_rows_and_the_stream_it_stands_for(
    mode, causal_mask
):
    causal, pad = masks()
    kwargs = dict(key_padding_mask=pad, attn_mask=causal if causal_mask else None)
    x = torch.randn(6, 3, 16, dtype=torch.float64)
    want, (stream, _, _) = run_chain(module_chain("eager", mode), x, **kwargs)
    got, (none, queries, keys) = run_chain(module_chain("concat", mode), x, **kwargs)
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, **EXACT)
    # the fully padded sequence attends uniformly (the eager route's finite mask), not NaN
    assert torch.isfinite(got[-1]).all()
    assert none is None
    torch.testing.assert_close(stream_of(queries, keys), stream, **EXACT)


def test_float32_fully_padded_rows_are_uniform_as_in_the_eager_route():
    causal, pad = masks()
    x = torch.randn(6, 3, 16)
    kwargs = dict(key_padding_mask=pad, attn_mask=causal.float())
    want, _ = run_chain(module_chain("eager", "sum", dtype=torch.float32), x, **kwargs)
    got, _ = run_chain(module_chain("concat", "sum", dtype=torch.float32), x, **kwargs)
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_as_close_to_float64_as_the_eager_route(dtype):
    """Not equal to the eager route: the fused kernel sums q.k of all layers inside one
    float32 accumulation, the eager route rounds each layer's product to ``dtype`` before
    its float32 sum. Both against the float64 computation; fully masked rows as eager."""
    causal, pad = masks()
    kwargs64 = dict(key_padding_mask=pad, attn_mask=causal)
    x = torch.randn(6, 3, 16, dtype=torch.float64)
    truth, _ = run_chain(module_chain("eager", "mean"), x, **kwargs64)
    errors = {}
    for impl in ("eager", "concat"):
        layers = module_chain(impl, "mean", dtype=dtype)
        outs, _ = run_chain(layers, x.to(dtype), key_padding_mask=pad, attn_mask=causal.to(dtype))
        assert all(torch.isfinite(o).all() for o in outs)
        errors[impl] = max((o.double() - t).abs().max().item() for o, t in zip(outs, truth))
        if impl == "concat":
            assert {m.last_route for m in layers} == {FUSED}
    scale = max(t.abs().max().item() for t in truth)
    tolerance = {torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype] * scale
    assert errors["eager"] < tolerance and errors["concat"] < tolerance, errors


def test_sixty_fp16_layers_whose_sum_leaves_fp16_range_stay_finite():
    """The fused kernel accumulates the concatenated q.k in float32: a sum of scores beyond
    fp16's 65504 never exists in fp16 (the eager route keeps a float32 stream for this)."""
    embed, heads, n = 16, 2, 60
    scale = (2000.0 * (embed // heads) ** 0.5 / (embed // heads)) ** 0.5
    layers = []
    for _ in range(n):
        m = ConcatRealformerMultiheadAttention(
            embed, heads, residual_attention_mode="sum", residual_attention_impl="concat",
            self_attention=True,
        )  # fmt: skip
        with torch.no_grad():
            for proj in (m.q_proj, m.k_proj):
                proj.weight.copy_(torch.eye(embed) * scale)
                proj.bias.zero_()
        layers.append(m.half())
    x = torch.ones(4, 1, embed, dtype=torch.float16)
    queries = keys = None
    for idx, layer in enumerate(layers):
        out, _, _, queries, keys = layer(x, x, x, layer_idx=idx, need_weights=False,
                                         prev_attn_queries=queries, prev_attn_keys=keys)  # fmt: skip
        assert torch.isfinite(out).all()
    assert layer.last_route == FUSED
    total = stream_of(queries.float(), keys.float())
    assert total.min().item() > torch.finfo(torch.float16).max  # 60 x 2000 = 120000


def test_attention_dropout_on_cpu_runs_the_eager_route_with_its_dropout_draws(caplog):
    eager, concat, dictionary = model_pair(
        residual_attention_mode="mean", dropout=0.0, attention_dropout=0.3, activation_dropout=0.0
    )
    src, src_lengths, tgt = random_batch(dictionary)
    outs = []
    with caplog.at_level(logging.DEBUG, logger="realformer_fairseq.modules.routes.concat"):
        for model in (eager, concat):
            model.train()
            torch.manual_seed(5)
            out = model(src, src_lengths, tgt)[0]
            out.square().sum().backward()
            outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], **EXACT)
    assert_grads_equal(eager, concat)
    first = concat.encoder.layers[0].self_attn
    assert (
        first.last_route == "eager, because attention dropout on CPU (no fused CPU kernel draws it)"
    )
    assert concat.encoder.layers[1].self_attn.last_route == "eager, the chain's stream"
    assert "layer 0 of its chain: eager, because attention dropout on CPU" in caplog.text
    # in evaluation there is no dropout: fused again
    concat.eval()
    with torch.no_grad():
        concat(src, src_lengths, tgt)
    assert first.last_route == FUSED


def test_weights_and_a_mask_with_a_gradient_fall_back_to_the_exact_eager_route():
    causal, pad = masks()
    pad[2, :3] = False  # no fully masked row: the mask's gradient is compared
    x = torch.randn(6, 3, 16, dtype=torch.float64)
    eager, concat = module_chain("eager", "sum", n=2), module_chain("concat", "sum", n=2)
    results = []
    for layers in (eager, concat):
        mask = causal.clone().clamp(min=-1e4).requires_grad_()
        _, (scores, q, k) = run_chain(layers[:1], x, key_padding_mask=pad)
        last = layers[1]
        extra = {} if last in eager else dict(prev_attn_queries=q, prev_attn_keys=k)
        out = last(x, x, x, key_padding_mask=pad, attn_mask=mask, need_head_weights=True,
                   prev_attn_scores=scores, layer_idx=1, **extra)  # fmt: skip
        out[0].square().sum().backward()
        results.append((out[0], out[1], mask.grad))
    assert concat[0].last_route == FUSED
    assert concat[1].last_route.startswith("eager, because the attention probabilities")
    for want, got in zip(*results):
        torch.testing.assert_close(got, want, **EXACT)
    # a mask that needs a gradient, without weights
    layer = concat[0]
    mask = causal.clamp(min=-1e4).requires_grad_()
    layer(x, x, x, attn_mask=mask, need_weights=False)
    assert layer.last_route == "eager, because the attention mask needs a gradient"


def test_activation_checkpointing_threads_the_concatenated_queries_and_keys():
    _, plain, dictionary = model_pair(**NO_DROPOUT)
    _, wrapped, _ = model_pair(checkpoint_activations=True, **NO_DROPOUT)
    wrapped.load_state_dict(plain.state_dict())
    src, src_lengths, tgt = random_batch(dictionary)
    for model in (plain, wrapped):
        model.train()
        model(src, src_lengths, tgt)[0].square().sum().backward()
    assert_grads_equal(plain, wrapped)
    assert wrapped.encoder.layers[1].self_attn.last_route == FUSED


def test_concat_model_scripts_and_equals_itself_and_the_eager_route():
    eager, concat, dictionary = three_layer_pair("mean")
    src, src_lengths, tgt = random_batch(dictionary)
    scripted = torch.jit.script(concat.eval())
    eager.eval()
    with torch.no_grad():
        want = eager(src, src_lengths, tgt)[0]
        got = concat(src, src_lengths, tgt)[0]
        jit = scripted(src, src_lengths, tgt)[0]
    assert torch.equal(jit, got)
    torch.testing.assert_close(got, want, **EXACT)


def test_impl_flag_defaults_and_errors():
    base = {"residual_attention": "all", "residual_attention_mode": "sum", "init_type": "admin"}
    assert read_realformer_settings(base).residual_attention_impl == "auto"  # missing: auto
    for impl in ("eager", "concat", "auto"):
        settings = read_realformer_settings(dict(base, residual_attention_impl=impl))
        assert settings.residual_attention_impl == impl
    with pytest.raises(RealformerConfigError, match="--residual-attention-impl flash: use one of"):
        read_realformer_settings(dict(base, residual_attention_impl="flash"))
    off = dict(base, residual_attention="none", residual_attention_mode=None)
    assert read_realformer_settings(off).residual_attention_impl is None
    with pytest.raises(RealformerConfigError, match="needs residual attention on"):
        read_realformer_settings(dict(off, residual_attention_impl="concat"))
    # the modules built for each value on a machine no measured rule matches (this one)
    for impl, cls, route in (("eager", RealformerMultiheadAttention, "eager"),
                             ("concat", ConcatRealformerMultiheadAttention, "concat"),
                             ("auto", RealformerMultiheadAttention, "eager"),
                             (None, RealformerMultiheadAttention, "eager")):  # fmt: skip
        flags = {} if impl is None else {"residual_attention_impl": impl}
        model, _ = build_translation_model("realformer_tiny", **flags)
        for m in (model.encoder.layers[0].self_attn, model.decoder.layers[1].self_attn,
                  model.decoder.layers[1].encoder_attn):  # fmt: skip
            assert type(m) is cls and m.residual_attention_impl == route


def pretend_gpu(monkeypatch, name="NVIDIA H200", capability=(9, 0), version="2.11.0+cu130"):
    """This process as one on a GPU machine, for the rule lookup at build time."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda idx=0: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=0: capability)
    monkeypatch.setattr(route_rules.torch, "__version__", version)


def test_the_measured_rule_is_the_h200_measurement():
    """Two runs of studies/gpu_check.py part 4 on one NVIDIA H200, torch 2.11.0+cu130 (issue
    35's, and docs/benchmarks/gpu_check_h200.json): switch depth D = 4 best at 2,048 tokens
    in all eight chains of the second run (0.70, 0.88, 0.73, 0.86 x all-eager time for fp16
    L6, fp16 L12, bf16 L6, bf16 L12) and every case of the first; at 512 D = 4 gave 1.10,
    1.00, 1.01, 0.94 (no reliable win); fp16 and bf16; self-attention chains."""
    (rule,) = route_rules.CONCAT_RULES
    assert (rule.device_name, rule.capability, rule.torch_version) == ("H200", (9, 0), "2.11")
    assert set(rule.dtypes) == {torch.float16, torch.bfloat16}
    assert set(rule.chains) == {"encoder", "decoder"}
    assert (rule.min_length, rule.depth) == (2048, 4)
    assert "H200" in rule.source and "torch 2.11.0+cu130" in rule.source


class FakeQueries:
    """What auto_runs_fused reads of the queries: their device type and dtype."""

    def __init__(self, device_type, dtype):
        self.device = torch.device(device_type)
        self.dtype = dtype


def test_auto_fuses_the_first_four_layers_from_2048_tokens_on_cuda_in_half_precision():
    (rule,) = route_rules.CONCAT_RULES
    m = ConcatRealformerMultiheadAttention(
        256, 4, residual_attention_mode="mean", residual_attention_impl="auto", rule=rule,
        self_attention=True,
    )  # fmt: skip
    fused = {
        (layer, length, device, str(dtype))
        for layer in range(8)
        for length in (128, 512, 2047, 2048, 4096)
        for device in ("cpu", "cuda")
        for dtype in (torch.float16, torch.bfloat16, torch.float32)
        if m.auto_runs_fused(layer, length, FakeQueries(device, dtype))
    }
    want = {
        (layer, length, "cuda", dtype)
        for layer in (0, 1, 2, 3)
        for length in (2048, 4096)
        for dtype in ("torch.float16", "torch.bfloat16")
    }
    assert fused == want
    with pytest.raises(ValueError, match="auto route needs its measured rule"):
        ConcatRealformerMultiheadAttention(
            256, 4, residual_attention_mode="mean", residual_attention_impl="auto",
            self_attention=True,
        )  # fmt: skip


def test_auto_builds_the_concat_route_only_where_the_rule_matches_the_gpu(monkeypatch):
    pretend_gpu(monkeypatch)
    model, _ = build_translation_model("realformer_tiny")
    layer = model.decoder.layers[1]
    for m in (model.encoder.layers[0].self_attn, layer.self_attn):
        assert type(m) is ConcatRealformerMultiheadAttention
        assert (m.residual_attention_impl, m.auto_depth, m.auto_min_length) == ("auto", 4, 2048)
    assert type(layer.encoder_attn) is RealformerMultiheadAttention  # cross: not measured
    assert layer.encoder_attn.residual_attention_impl == "eager"
    # an unmeasured torch, GPU or architecture: the eager route everywhere
    for other in (dict(version="2.13.0+cu130"), dict(name="NVIDIA A100-SXM4-80GB",
                  capability=(8, 0)), dict(name="NVIDIA H100 80GB HBM3")):  # fmt: skip
        pretend_gpu(monkeypatch, **other)
        model, _ = build_translation_model("realformer_tiny")
        assert {type(m) for m in model.modules() if hasattr(m, "residual_attention_impl")} == {
            RealformerMultiheadAttention
        }, other


def test_a_cpu_build_on_a_gpu_host_never_asks_cuda_for_its_device(monkeypatch):
    """Issue 46, item 6: ``auto`` looked up its rule with ``torch.cuda.get_device_name(0)``
    whenever CUDA was available, also for a ``--cpu`` build (which then initialises CUDA on a
    GPU host, or fails where the GPU is busy or broken). The build's device comes first."""

    def no_cuda(*args, **kwargs):
        raise RuntimeError("a CPU build asked CUDA for its device")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", no_cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", no_cuda)
    model, _ = build_translation_model("realformer_tiny", cpu=True)  # fairseq's --cpu
    assert {type(m) for m in model.modules() if hasattr(m, "residual_attention_impl")} == {
        RealformerMultiheadAttention
    }
    for chain in ("encoder", "decoder", "cross"):
        assert route_rules.built_route("auto", chain, cpu=True) == "eager"
    # the same build without --cpu does ask (the rule of a GPU build is the GPU's)
    with pytest.raises(RuntimeError, match="a CPU build asked CUDA"):
        build_translation_model("realformer_tiny")
    # where the model is built is not part of what it computes
    base = {"residual_attention": "all", "residual_attention_mode": "sum", "init_type": "admin"}
    on_cpu = read_realformer_settings(dict(base, cpu=True))
    assert on_cpu.cpu and on_cpu == read_realformer_settings(base)


def test_auto_on_a_matching_gpu_machine_runs_eager_on_cpu(monkeypatch):
    """A model built on a GPU machine whose rule matches, but run on the CPU: eager."""
    pretend_gpu(monkeypatch)
    _, auto, dictionary = model_pair(impl="auto", **NO_DROPOUT)
    auto.float().train()
    src, src_lengths, tgt = random_batch(dictionary, 1, 16, 4, pad_rows=())
    auto(src, src_lengths, tgt)
    kernels = {m.last_route for m in concat_modules(auto).values()}
    assert kernels == {"eager, because auto: its measured rule runs the eager route here",
                       "eager, the chain's stream"}  # fmt: skip


def test_an_explicit_concat_route_that_cannot_fuse_warns_once(caplog):
    _, concat, dictionary = model_pair(attention_dropout=0.1)
    concat.float().train()
    src, src_lengths, tgt = random_batch(dictionary)
    route_warnings._SAID.clear()
    with caplog.at_level(logging.WARNING, logger="realformer_fairseq.modules.routes.concat"):
        for _ in range(3):
            concat(src, src_lengths, tgt)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "--residual-attention-impl concat: runs the eager route where attention dropout on "
        "CPU (no fused CPU kernel draws it) (said once per process)"
    ]


def test_layerdrop_leaves_a_dropped_layer_out_of_the_concatenation_as_out_of_the_stream():
    """--encoder-layerdrop: the same seed drops the same layers; the concatenation holds the
    layers that ran, numbered as they ran, as the eager route's stream and running mean."""
    eager, concat, dictionary = model_pair(
        encoder_layers=4, decoder_layers=1, encoder_layerdrop=0.5, **NO_DROPOUT
    )
    src, src_lengths, tgt = random_batch(dictionary)
    outs = []
    for model in (eager, concat):
        model.train()
        torch.manual_seed(11)
        out = model(src, src_lengths, tgt)[0]
        out.square().sum().backward()
        outs.append(out)
    ran = [
        m.calls
        for m in concat.encoder.layers.modules()
        if isinstance(m, ConcatRealformerMultiheadAttention)
    ]
    assert 0 < sum(ran) < 4  # some layers dropped, not all
    torch.testing.assert_close(outs[1], outs[0], **EXACT)
    assert_grads_equal(eager, concat)


def test_both_routes_take_and_return_the_same_values():
    """One call site per attention in the layers: the eager and the concat module take the
    same arguments and return the same five values (the eager route's queries and keys None)."""
    import inspect

    assert inspect.signature(RealformerMultiheadAttention.forward) == inspect.signature(
        ConcatRealformerMultiheadAttention.forward
    )
    torch.manual_seed(0)
    eager = RealformerMultiheadAttention(8, 2, residual_attention_mode="sum", self_attention=True)
    x = torch.randn(3, 2, 8)
    out = eager(x, x, x, need_weights=False)
    assert len(out) == 5 and out[2].shape == (2 * 2, 3, 3) and out[3] is None and out[4] is None
    with pytest.raises(ValueError, match="carries no concatenated queries and keys"):
        eager(x, x, x, prev_attn_queries=torch.zeros(4, 3, 4), prev_attn_keys=torch.zeros(4, 3, 4))
