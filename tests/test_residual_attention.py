"""RealFormer residual attention (He et al. 2020, arXiv 2012.11747): the module
against a loop-based reference of the formula, vanilla equivalence when off, and
proof that fairseq's fused attention path never takes over."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from harness import (
    NO_DROPOUT,
    build_fairseq_tiny_transformer,
    build_translation_model,
    random_batch,
)

from realformer_fairseq.modules.routes.concat import stream_of
from realformer_fairseq.modules.routes.eager import RealformerMultiheadAttention


def record_attention(module, records):
    """Capture the keyword inputs and the outputs of every call of ``module``."""

    def pre_hook(mod, args, kwargs):
        records.append({"kwargs": dict(kwargs)})

    def post_hook(mod, args, kwargs, output):
        records[-1]["output"] = output

    return [
        module.register_forward_pre_hook(pre_hook, with_kwargs=True),
        module.register_forward_hook(post_hook, with_kwargs=True),
    ]


def reference_chain(modules, records, mode):
    """The paper's formula written out with loops over layers, batch and heads:
    S_l = q_l k_l^T / sqrt(d) + S_{l-1}; P_l = softmax(mask(S_l / n_l)), n_l = l+1
    for the running mean, 1 for the sum. Returns per-layer (output, stream)."""
    results = []
    stream = None
    for layer, (mod, rec) in enumerate(zip(modules, records)):
        kw = rec["kwargs"]
        query, key, value = kw["query"], kw["key"], kw["value"]
        tgt_len, bsz, _ = query.shape
        src_len = key.shape[0]
        heads, d = mod.num_heads, mod.head_dim
        scores = torch.zeros(bsz, heads, tgt_len, src_len, dtype=torch.float64)
        context = torch.zeros(tgt_len, bsz, heads * d, dtype=torch.float64)
        q_all = F.linear(query, mod.q_proj.weight, mod.q_proj.bias)
        k_all = F.linear(key, mod.k_proj.weight, mod.k_proj.bias)
        v_all = F.linear(value, mod.v_proj.weight, mod.v_proj.bias)
        for b in range(bsz):
            for h in range(heads):
                q = q_all[:, b, h * d : (h + 1) * d]
                k = k_all[:, b, h * d : (h + 1) * d]
                scores[b, h] = q @ k.T / math.sqrt(d)
        stream = scores if stream is None else stream + scores
        divisor = (layer + 1) if mode == "mean" else 1
        for b in range(bsz):
            for h in range(heads):
                logits = stream[b, h] / divisor
                if kw.get("attn_mask") is not None:
                    logits = logits + kw["attn_mask"]
                if kw.get("key_padding_mask") is not None:
                    logits = logits.masked_fill(
                        kw["key_padding_mask"][b].bool()[None, :], -math.inf
                    )
                probs = torch.softmax(logits, dim=-1)
                context[:, b, h * d : (h + 1) * d] = probs @ v_all[:, b, h * d : (h + 1) * d]
        output = F.linear(context, mod.out_proj.weight, mod.out_proj.bias)
        results.append((output, stream.reshape(bsz * heads, tgt_len, src_len)))
    return results


@pytest.mark.parametrize("impl", ["eager", "concat"])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_module_matches_loop_reference_on_all_three_chains(mode, impl):
    """Both routes against the loop reference; the concat route's stream is the one its
    carried queries and keys stand for (``stream_of``) where the chain is fused."""
    torch.manual_seed(0)
    model, dictionary = build_translation_model(
        "realformer_tiny",
        init_type="default",
        residual_attention_mode=mode,
        residual_attention_impl=impl,
        encoder_layers=3,
        decoder_layers=3,
        **NO_DROPOUT,
    )
    model = model.double().eval()
    chains = {
        "encoder": [layer.self_attn for layer in model.encoder.layers],
        "decoder": [layer.self_attn for layer in model.decoder.layers],
        "cross": [layer.encoder_attn for layer in model.decoder.layers],
    }
    records = {name: [] for name in chains}
    handles = []
    for name, modules in chains.items():
        for mod in modules:
            assert isinstance(mod, RealformerMultiheadAttention)
            rec = []
            records[name].append(rec)
            handles += record_attention(mod, rec)
    src, src_lengths, tgt = random_batch(dictionary, bsz=3, src_len=7, tgt_len=6)
    with torch.no_grad():
        model(src, src_lengths, tgt)
    for h in handles:
        h.remove()

    for name, modules in chains.items():
        recs = [r[0] for r in records[name]]
        assert all(len(r) == 1 for r in records[name])
        # padding and the future mask really are present in this batch
        if name == "decoder":
            assert recs[0]["kwargs"]["attn_mask"] is not None
        assert recs[0]["kwargs"]["key_padding_mask"] is not None
        reference = reference_chain(modules, recs, mode)
        for layer, (rec, (ref_out, ref_stream)) in enumerate(zip(recs, reference)):
            out, scores = rec["output"][0], rec["output"][2]
            if impl == "concat" and scores is None:
                scores = stream_of(*rec["output"][3:])
            torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=0, msg=f"{name} layer {layer}")
            torch.testing.assert_close(scores, ref_stream, atol=1e-6, rtol=0)
            # the stream is the running *sum* of raw scores: finite everywhere,
            # including at masked positions
            assert torch.isfinite(scores).all()


def _copy_weights(dst, src):
    state = {k: v for k, v in src.state_dict().items() if k != "admin_profiled"}
    missing, unexpected = dst.load_state_dict(state, strict=False)
    assert not unexpected and not [k for k in missing if k != "admin_profiled"]


def test_residual_off_equals_fairseq_transformer_exactly():
    torch.manual_seed(0)
    ours, dictionary = build_translation_model(
        "postln_transformer_tiny",
        init_type="default",
        encoder_layers=3,
        decoder_layers=2,
        share_all_embeddings=True,
    )
    vanilla, _ = build_fairseq_tiny_transformer(
        encoder_layers=3, decoder_layers=2, share_all_embeddings=True
    )
    assert type(vanilla).__name__ == "TransformerModel"
    _copy_weights(vanilla, ours)
    src, src_lengths, tgt = random_batch(dictionary)
    for train in (False, True):
        ours.train(train)
        vanilla.train(train)
        torch.manual_seed(3)
        out_ours = ours(src, src_lengths, tgt)[0]
        torch.manual_seed(3)
        out_vanilla = vanilla(src, src_lengths, tgt)[0]
        assert torch.equal(out_ours, out_vanilla), f"train={train}"


def test_residual_on_takes_its_own_path_and_changes_the_output(monkeypatch):
    torch.manual_seed(0)
    realformer, dictionary = build_translation_model(
        "realformer_tiny", init_type="default", **NO_DROPOUT
    )
    plain, _ = build_translation_model(
        "realformer_tiny", init_type="default", residual_attention="none", **NO_DROPOUT
    )
    _copy_weights(plain, realformer)
    src, src_lengths, tgt = random_batch(dictionary)
    realformer.train()
    plain.train()
    out_plain = plain(src, src_lengths, tgt)[0]

    # in training fairseq would hand attention to F.multi_head_attention_forward:
    # make that path fail loudly, then run the residual model
    def fused_path_taken(*args, **kwargs):
        raise AssertionError("fused attention path used with residual attention on")

    monkeypatch.setattr(F, "multi_head_attention_forward", fused_path_taken)
    attn_modules = [m for m in realformer.modules() if isinstance(m, RealformerMultiheadAttention)]
    assert len(attn_modules) == 2 + 2 * 2
    before = [m.calls for m in attn_modules]
    out_real = realformer(src, src_lengths, tgt)[0]
    assert [m.calls - b for m, b in zip(attn_modules, before)] == [1] * len(attn_modules)
    assert not torch.allclose(out_real, out_plain, atol=1e-4)

    # and the plain model really does use the fused path (so the patch bites)
    with pytest.raises(AssertionError, match="fused attention path"):
        plain(src, src_lengths, tgt)


def test_gradient_flows_through_the_stream():
    torch.manual_seed(0)
    layer1 = RealformerMultiheadAttention(16, 4, residual_attention_mode="sum", self_attention=True)
    layer2 = RealformerMultiheadAttention(16, 4, residual_attention_mode="sum", self_attention=True)
    x = torch.randn(5, 2, 16)

    def layer1_score_grad(loss_weight):
        layer1.zero_grad()
        _, _, scores1, _, _ = layer1(x, x, x)
        scores1.retain_grad()
        out2, _, _, _, _ = layer2(x, x, x, prev_attn_scores=scores1, layer_idx=1)
        (out2 * loss_weight).sum().backward()
        return scores1.grad.clone(), layer1.q_proj.weight.grad.clone()

    g_a, wq_a = layer1_score_grad(torch.ones(16))
    g_b, wq_b = layer1_score_grad(torch.linspace(-1, 2, 16))
    # layer 1 gets gradient only from layer 2's loss, through the stream
    assert g_a.abs().sum() > 0 and wq_a.abs().sum() > 0
    assert not torch.allclose(g_a, g_b)
    assert not torch.allclose(wq_a, wq_b)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_gradients_match_the_formula_written_out(mode):
    """Backward through a 3-layer chain with a causal mask and padding equals autograd
    through the formula in plain tensor ops (float64): in-place adds in the module
    must not change any gradient."""
    torch.manual_seed(0)
    embed, heads, tgt_len, bsz = 16, 4, 5, 2
    d = embed // heads
    layers = [
        RealformerMultiheadAttention(
            embed, heads, residual_attention_mode=mode, self_attention=True
        ).double()
        for _ in range(3)
    ]
    x = torch.randn(tgt_len, bsz, embed, dtype=torch.float64, requires_grad=True)
    causal = torch.triu(torch.full((tgt_len, tgt_len), -math.inf, dtype=torch.float64), 1)
    pad = torch.zeros(bsz, tgt_len, dtype=torch.bool)
    pad[1, -2:] = True  # right padding: no fully masked row under the causal mask
    weight = torch.randn(tgt_len, bsz, embed, dtype=torch.float64)

    def module_loss():
        h, scores, loss = x, None, 0.0
        for idx, layer in enumerate(layers):
            h, _, scores, _, _ = layer(
                h, h, h, key_padding_mask=pad, attn_mask=causal,
                prev_attn_scores=scores, layer_idx=idx,
            )  # fmt: skip
            loss = loss + (h * weight).sum()
        return loss

    def formula_loss():
        def heads_first(t):  # (T, B, E) -> (B, H, T, d)
            return t.reshape(tgt_len, bsz, heads, d).permute(1, 2, 0, 3)

        h, stream, loss = x, 0.0, 0.0
        for idx, layer in enumerate(layers):
            q = heads_first(F.linear(h, layer.q_proj.weight, layer.q_proj.bias))
            k = heads_first(F.linear(h, layer.k_proj.weight, layer.k_proj.bias))
            v = heads_first(F.linear(h, layer.v_proj.weight, layer.v_proj.bias))
            stream = stream + q @ k.transpose(-1, -2) / math.sqrt(d)
            logits = stream / (idx + 1 if mode == "mean" else 1) + causal
            logits = logits.masked_fill(pad[:, None, None, :], -math.inf)
            context = (torch.softmax(logits, -1) @ v).permute(2, 0, 1, 3)
            h = F.linear(context.reshape(tgt_len, bsz, embed), *layer.out_proj.parameters())
            loss = loss + (h * weight).sum()
        return loss

    params = [x] + [p for layer in layers for p in layer.parameters()]
    grads = torch.autograd.grad(module_loss(), params)
    expected = torch.autograd.grad(formula_loss(), params)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9)
    assert grads[0].abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_deep_stack_keeps_a_finite_float32_stream(dtype):
    torch.manual_seed(0)
    first = RealformerMultiheadAttention(32, 4, residual_attention_mode="sum", self_attention=True)
    with torch.no_grad():  # large scores: each layer's fit in fp16, their sum does not
        first.q_proj.weight.mul_(32)
        first.k_proj.weight.mul_(32)
    layers = [copy.deepcopy(first).to(dtype) for _ in range(60)]
    x = torch.randn(9, 2, 32).to(dtype)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, :4] = True
    scores = None
    for idx, layer in enumerate(layers):
        out, _, scores, _, _ = layer(
            x, x, x, key_padding_mask=pad, prev_attn_scores=scores, layer_idx=idx
        )
        assert out.dtype == dtype and torch.isfinite(out).all()
    assert scores.dtype == torch.float32 and torch.isfinite(scores).all()
    assert scores.abs().max() > torch.finfo(torch.float16).max  # the sum left fp16's range


def test_bf16_model_forward_backward_is_finite():
    torch.manual_seed(0)
    model, dictionary = build_translation_model("realformer_tiny", init_type="default")
    model = model.to(torch.bfloat16).train()
    src, src_lengths, tgt = random_batch(dictionary)
    out = model(src, src_lengths, tgt)[0]
    out.float().logsumexp(-1).mean().backward()
    assert torch.isfinite(out.float()).all()
    # every parameter got a gradient (none may be skipped as "no gradient"), all finite
    assert [name for name, p in model.named_parameters() if p.grad is None] == []
    for name, p in model.named_parameters():
        assert p.grad.dtype == torch.bfloat16 and torch.isfinite(p.grad.float()).all(), name
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())


def test_activation_checkpointing_threads_the_streams_unchanged():
    """--checkpoint-activations wraps each layer; the score streams still pass."""
    torch.manual_seed(0)
    plain, dictionary = build_translation_model(
        "realformer_tiny", init_type="default", **NO_DROPOUT
    )
    wrapped, _ = build_translation_model(
        "realformer_tiny", init_type="default", checkpoint_activations=True, **NO_DROPOUT
    )
    wrapped.load_state_dict(plain.state_dict())
    src, src_lengths, tgt = random_batch(dictionary)
    plain.train()
    wrapped.train()
    out_plain = plain(src, src_lengths, tgt)[0]
    out_wrapped = wrapped(src, src_lengths, tgt)[0]
    assert torch.equal(out_plain, out_wrapped)
    out_plain.square().mean().backward()
    out_wrapped.square().mean().backward()
    named = list(zip(plain.named_parameters(), wrapped.named_parameters()))
    assert [n for (n, p), _ in named if p.grad is None] == []  # not None == None
    for (name, p), (_, q) in named:
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
