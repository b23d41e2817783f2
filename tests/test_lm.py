"""Decoder-only RealFormer language models (He et al. 2020, arXiv 2012.11747; ADMIN,
Liu et al. 2020, arXiv 2004.08249) on fairseq's ``language_modeling`` task:
architectures and the built model, equality with fairseq's ``transformer_lm``,
incremental decoding (beam search and sampling) against the full forward, long
sequences, start-up errors. End-to-end runs are in ``test_lm_end_to_end.py``."""

import argparse

import pytest
import torch
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.models.transformer_lm import (
    TransformerLanguageModel,
    base_lm_architecture,
    transformer_lm_gpt2_small,
)
from fairseq.modules import MultiheadAttention
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask
from harness import NO_DROPOUT, toy_dictionary

from realformer_fairseq.errors import RealformerConfigError
from realformer_fairseq.models.realformer_lm import RealformerLanguageModel, RealformerLMDecoder
from realformer_fairseq.modules.admin import AdminResidual, admin_closed_form_omega
from realformer_fairseq.modules.routes import RealformerMultiheadAttention


def lm_task(dictionary=None, tokens_per_sample=1024):
    dictionary = dictionary or toy_dictionary()
    return LanguageModelingTask(
        LanguageModelingConfig(tokens_per_sample=tokens_per_sample), dictionary
    )


def arch_args(arch: str, **overrides) -> argparse.Namespace:
    args = argparse.Namespace(arch=arch, _name=arch, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def build_lm(arch: str = "realformer_lm_tiny", task=None, seed: int = 1, **overrides):
    task = task or lm_task()
    torch.manual_seed(seed)
    args = arch_args(arch, **overrides)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task), task


def profile_admin(model, dictionary, seed=0):
    """One training forward: ADMIN profiles omega (as fairseq-train's first step)."""
    g = torch.Generator().manual_seed(seed)
    model.train()
    model(torch.randint(dictionary.nspecial, len(dictionary), (3, 10), generator=g))
    model.eval()


# ---------------------------------------------------------------------------
# architectures and the built model

# arch -> (layers, width, ffn, heads, residual attention mode, Pre-LN, ADMIN)
EXPECTED_TINY = {
    "realformer_lm_tiny": (2, 64, 128, 2, "sum", False, True),
    "admin_transformer_lm_tiny": (2, 64, 128, 2, None, False, True),
    "postln_transformer_lm_tiny": (2, 64, 128, 2, None, False, False),
    "preln_transformer_lm_tiny": (2, 64, 128, 2, None, True, False),
}


@pytest.mark.parametrize("arch", sorted(EXPECTED_TINY))
def test_tiny_archs_build_the_expected_layers(arch):
    layers, width, ffn, heads, mode, pre_ln, admin = EXPECTED_TINY[arch]
    model, _ = build_lm(arch)
    assert isinstance(model, RealformerLanguageModel)
    assert isinstance(model.decoder, RealformerLMDecoder)
    assert len(model.decoder.layers) == layers
    for layer in model.decoder.layers:
        assert layer.encoder_attn is None  # no cross-attention
        attn = layer.self_attn
        if mode is None:
            assert type(attn) is MultiheadAttention
        else:
            assert isinstance(attn, RealformerMultiheadAttention)
            assert attn.residual_attention_mode == mode
        assert attn.embed_dim == width and attn.num_heads == heads
        assert layer.fc1.out_features == ffn
        assert layer.normalize_before is pre_ln
        for residual in (layer.self_attn_residual, layer.ffn_residual):
            assert isinstance(residual, AdminResidual) and residual.admin is admin
    # fairseq: final LayerNorm only with Pre-LN
    assert (model.decoder.layer_norm is not None) is pre_ln
    assert model.admin_init_type == ("admin" if admin else "default")


# (size suffix, fairseq arch) -> (layers, width, ffn, heads, activation, attention dropout)
EXPECTED_SIZES = {
    ("", "transformer_lm"): (6, 512, 2048, 8, "relu", 0.0),
    ("_gpt2_small", "transformer_lm_gpt2_small"): (24, 1024, 4096, 16, "gelu", 0.1),
}
VARIANTS = {
    # variant -> (residual attention, init, Pre-LN)
    "realformer_lm": ("decoder", "admin", False),
    "admin_transformer_lm": ("none", "admin", False),
    "postln_transformer_lm": ("none", "default", False),
    "preln_transformer_lm": ("none", "default", True),
}


@pytest.mark.parametrize("size,fairseq_arch", sorted(EXPECTED_SIZES))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sizes_are_fairseqs_transformer_lm_sizes(variant, size, fairseq_arch):
    """Arch functions only (no 24-layer model is built)."""
    layers, width, ffn, heads, activation, attention_dropout = EXPECTED_SIZES[(size, fairseq_arch)]
    chains, init_type, pre_ln = VARIANTS[variant]
    ours = arch_args(variant + size)
    # "transformer_lm" is registered with a dataclass (its arch function is a no-op)
    theirs = argparse.Namespace()
    {
        "transformer_lm": base_lm_architecture,
        "transformer_lm_gpt2_small": transformer_lm_gpt2_small,
    }[fairseq_arch](theirs)
    for key, value in (
        ("decoder_layers", layers),
        ("decoder_embed_dim", width),
        ("decoder_ffn_embed_dim", ffn),
        ("decoder_attention_heads", heads),
        ("activation_fn", activation),
        ("attention_dropout", attention_dropout),
        ("dropout", 0.1),
    ):
        assert getattr(ours, key) == value == getattr(theirs, key), key
    assert ours.residual_attention == chains
    assert ours.residual_attention_mode == ("sum" if chains != "none" else None)
    assert ours.init_type == init_type
    assert ours.decoder_normalize_before is pre_ln
    assert theirs.decoder_normalize_before is True  # fairseq's LMs are always Pre-LN


@pytest.mark.parametrize("arch", sorted(EXPECTED_TINY))
def test_a_dictconfig_builds_the_same_model(arch):
    """fairseq-hydra-train and checkpoint loading hand build_model a DictConfig, which
    fairseq's TransformerConfig.from_namespace does not copy the plugin's keys from."""
    from fairseq.models import build_model
    from omegaconf import OmegaConf

    layers, width, ffn, heads, mode, pre_ln, admin = EXPECTED_TINY[arch]
    cfg = OmegaConf.create({"_name": arch, "max_target_positions": 64})
    model = build_model(cfg, lm_task())
    assert isinstance(model, RealformerLanguageModel) and len(model.decoder.layers) == layers
    for layer in model.decoder.layers:
        if mode is None:
            assert type(layer.self_attn) is MultiheadAttention
        else:
            assert isinstance(layer.self_attn, RealformerMultiheadAttention)
            assert layer.self_attn.residual_attention_mode == mode
        assert layer.self_attn.embed_dim == width and layer.self_attn.num_heads == heads
        assert layer.fc1.out_features == ffn and layer.normalize_before is pre_ln
        assert layer.self_attn_residual.admin is admin and layer.ffn_residual.admin is admin
    assert model.decoder.max_positions() == 64


def test_flags_override_the_arch_defaults():
    model, _ = build_lm(
        "preln_transformer_lm_tiny",
        residual_attention="decoder",
        residual_attention_mode="mean",
        decoder_layers=3,
    )
    assert len(model.decoder.layers) == 3
    for layer in model.decoder.layers:
        assert isinstance(layer.self_attn, RealformerMultiheadAttention)
        assert layer.self_attn.residual_attention_mode == "mean"
        assert layer.normalize_before is True
    model, _ = build_lm("realformer_lm_tiny", residual_attention="none", init_type="default")
    assert all(type(layer.self_attn) is MultiheadAttention for layer in model.decoder.layers)
    assert not any(r.admin for r in model.modules() if isinstance(r, AdminResidual))


def test_admin_closed_form_counts_two_sublayers_per_lm_layer():
    model, _ = build_lm("realformer_lm_tiny", init_type="admin-closed-form", decoder_layers=3)
    omegas = [float(r.omega_init) for r in model.modules() if isinstance(r, AdminResidual)]
    # N = 6 residual sublayers: sqrt(7 / ln 7 - 1) = 1.6116 (N = 9, as 3 * layers: 1.8284)
    assert omegas == pytest.approx([1.6116] * 6, abs=1e-4)
    assert omegas == pytest.approx([admin_closed_form_omega(6)] * 6)
    assert int(model.admin_profiled) == 1


def test_admin_profiles_once_on_the_first_training_forward():
    model, task = build_lm("realformer_lm_tiny")
    assert int(model.admin_profiled) == 0
    profile_admin(model, task.source_dictionary)
    assert int(model.admin_profiled) == 1
    omegas = [float(r.omega_init) for r in model.modules() if isinstance(r, AdminResidual)]
    assert len(omegas) == 4 and omegas[0] == 1.0 and all(w > 1.0 for w in omegas[1:])
    before = [r.omega_init.clone() for r in model.modules() if isinstance(r, AdminResidual)]
    profile_admin(model, task.source_dictionary, seed=5)  # never again
    after = [r.omega_init for r in model.modules() if isinstance(r, AdminResidual)]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


# ---------------------------------------------------------------------------
# equality with fairseq's transformer_lm (guards the re-owned build_model)


def fairseq_lm(task, normalize_before: bool):
    args = argparse.Namespace(**NO_DROPOUT)
    base_lm_architecture(args)
    args.decoder_layers, args.decoder_embed_dim = 2, 64
    args.decoder_input_dim = args.decoder_output_dim = 64
    args.decoder_ffn_embed_dim, args.decoder_attention_heads = 128, 2
    args.decoder_normalize_before = normalize_before  # fairseq's arch forces True
    return TransformerLanguageModel.build_model(args, task)


@pytest.mark.parametrize("arch", ["preln_transformer_lm_tiny", "postln_transformer_lm_tiny"])
def test_baselines_equal_fairseqs_transformer_lm(arch):
    model, task = build_lm(arch, **NO_DROPOUT)
    reference = fairseq_lm(task, normalize_before=arch.startswith("preln"))
    ours_state = {k: v for k, v in model.state_dict().items() if k != "admin_profiled"}
    assert sorted(reference.state_dict()) == sorted(ours_state)
    reference.load_state_dict(ours_state)
    tokens = torch.randint(4, 44, (3, 12), generator=torch.Generator().manual_seed(0))
    tokens[1, 9:] = task.source_dictionary.pad()
    model.train(), reference.train()  # no dropout: train mode exercises the training path
    ours, theirs = model(tokens)[0], reference(tokens)[0]
    assert torch.equal(ours, theirs)


# ---------------------------------------------------------------------------
# incremental decoding == full forward


def full_forward_lprobs(model, tokens):
    """log p(tokens[t] | tokens[:t]) for every t, one full (non-incremental) forward
    of ``[eos] + tokens[:-1]``."""
    eos = model.decoder.dictionary.eos()
    prev = torch.cat([torch.full((tokens.size(0), 1), eos), tokens[:, :-1]], dim=1)
    with torch.no_grad():
        lprobs = model.get_normalized_probs(model(prev), log_probs=True)
    return lprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


LM_CASES = [
    ("realformer_lm_tiny", {}),
    ("realformer_lm_tiny", {"residual_attention_mode": "mean", "decoder_layers": 4}),
    ("preln_transformer_lm_tiny", {"residual_attention": "decoder"}),
    ("admin_transformer_lm_tiny", {}),
]


@pytest.mark.parametrize("arch,overrides", LM_CASES)
def test_incremental_steps_with_reordering_equal_the_full_forward(arch, overrides):
    model, task = build_lm(arch, **overrides)
    d = task.source_dictionary
    profile_admin(model, d)
    g = torch.Generator().manual_seed(1)
    n, steps = 4, 11
    tokens = torch.randint(d.nspecial, len(d), (n, steps), generator=g)
    prev = torch.cat([torch.full((n, 1), d.eos()), tokens[:, :-1]], dim=1)
    incremental_state, rows = {}, torch.arange(n)
    step_lprobs = []
    with torch.no_grad():
        for t in range(steps):
            if t > 0:  # reorder the hypotheses, as beam search does
                order = torch.randperm(n, generator=g)
                model.decoder.reorder_incremental_state_scripting(incremental_state, order)
                rows = rows[order]
                step_lprobs = [x[order] for x in step_lprobs]
            out = model.decoder(prev[rows, : t + 1], incremental_state=incremental_state)
            lp = model.get_normalized_probs(out, log_probs=True)[:, -1]  # (n, vocab)
            step_lprobs.append(lp.gather(-1, tokens[rows, t : t + 1]).squeeze(-1))
    incremental = torch.stack(step_lprobs, dim=1)
    full = full_forward_lprobs(model, tokens[rows])
    torch.testing.assert_close(incremental, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch,overrides", LM_CASES[:3])
@pytest.mark.parametrize(
    "search", [{"beam": 4}, {"beam": 3, "sampling": True}, {"beam": 2, "sampling": True}]
)
def test_generator_scores_equal_full_forward_rescoring(arch, overrides, search):
    """fairseq's SequenceGenerator through the language_modeling task, as hub
    ``sample()`` runs it: beam search and sampling; every hypothesis's positional
    scores (incremental) equal a full-forward rescoring to 1e-5."""
    from fairseq.dataclass.configs import GenerationConfig

    model, task = build_lm(arch, **overrides)
    d = task.source_dictionary
    profile_admin(model, d)
    gen_cfg = GenerationConfig(
        beam=search["beam"], sampling=search.get("sampling", False), max_len_b=14, min_len=3
    )
    generator = task.build_generator([model], gen_cfg)
    torch.manual_seed(3)
    prefix = torch.randint(d.nspecial, len(d), (2, 4), generator=torch.Generator().manual_seed(2))
    sample = {"net_input": {"src_tokens": prefix, "src_lengths": torch.tensor([4, 4])}}
    with torch.no_grad():
        hypos = task.inference_step(generator, [model], sample, prefix_tokens=prefix)
    assert len(hypos) == 2 and all(len(h) == search["beam"] for h in hypos)
    checked = 0
    for i, sent in enumerate(hypos):
        for hypo in sent:
            assert torch.equal(hypo["tokens"][:4], prefix[i])
            assert len(hypo["tokens"]) >= 5
            full = full_forward_lprobs(model, hypo["tokens"].unsqueeze(0))[0]
            torch.testing.assert_close(hypo["positional_scores"], full, atol=1e-5, rtol=0)
            checked += 1
    assert checked == 2 * search["beam"]


# ---------------------------------------------------------------------------
# long sequences, padding


def test_1024_tokens_with_padding_give_finite_outputs_and_gradients():
    model, task = build_lm("realformer_lm_tiny", residual_attention_mode="mean")
    d = task.source_dictionary
    tokens = torch.randint(
        d.nspecial, len(d), (2, 1024), generator=torch.Generator().manual_seed(0)
    )
    tokens[1, 700:] = d.pad()  # --sample-break-mode complete/eos pad the batch
    model.train()
    out = model(tokens)[0]  # first call profiles ADMIN, then trains
    assert int(model.admin_profiled) == 1
    assert out.shape == (2, 1024, len(d)) and torch.isfinite(out).all()
    lprobs = model.get_normalized_probs((out, None), log_probs=True)
    loss = -lprobs[:, :-1].gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    loss[tokens[:, 1:].eq(d.pad())] = 0
    loss.sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len([p for p in model.parameters() if p.requires_grad])
    assert all(torch.isfinite(grad).all() for grad in grads)


# ---------------------------------------------------------------------------
# start-up errors


@pytest.mark.parametrize(
    "arch,overrides,message",
    [
        (
            "realformer_lm_tiny",
            {"residual_attention": "encoder"},
            "this decoder-only language model has only the chain(s) decoder",
        ),
        (
            "realformer_lm_tiny",
            {"residual_attention": "decoder,cross"},
            "this decoder-only language model has only the chain(s) decoder",
        ),
        (
            "preln_transformer_lm_tiny",
            {"init_type": "admin"},
            "--init-type admin is for Post-LN models",
        ),
        (
            "postln_transformer_lm_tiny",
            {"residual_attention_mode": "mean"},
            "--residual-attention-mode mean needs residual attention on",
        ),
    ],
)
def test_bad_flags_are_one_line_errors(arch, overrides, message):
    with pytest.raises(RealformerConfigError) as err:
        build_lm(arch, **overrides)
    text = str(err.value)
    assert message in text
    assert "\n" not in text
