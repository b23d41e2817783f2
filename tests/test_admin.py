"""ADMIN initialisation (Liu et al. 2020, arXiv 2004.08249): profiled omega against
a hand computation, closed form, one-run profiling inside fairseq-train, omega in
the state dict, and the deep Post-LN model it exists for."""

import json
import math

import numpy as np
import pytest
import torch
from harness import (
    NO_DROPOUT,
    build_translation_model,
    make_multi30k_subset,
    parse_train_losses,
    preprocess,
    random_batch,
    train_translation,
)

from realformer_fairseq.modules.admin import AdminResidual, admin_closed_form_omega


def np_var(t):
    return float(np.var(t.detach().double().numpy()))


def omegas(model):
    return {
        n: float(m.omega_init)
        for n, m in model.named_modules()
        if isinstance(m, AdminResidual) and m.admin
    }


def hand_profiled_omegas(model, src, src_lengths, tgt):
    """The reference's recurrence written out sublayer by sublayer for a 1L-1L
    Post-LN model: omega_i = r; r <- sqrt(np.var(x * omega_i) + np.var(f_i(x))),
    r = 1 at the start of each stack."""
    enc, dec = model.encoder, model.decoder
    expected = {}

    def step(name, r, residual, branch):
        expected[name] = r
        return math.sqrt(np_var(residual * r) + np_var(branch))

    pad = src.eq(enc.padding_idx)
    x, _ = enc.forward_embedding(src)
    x = (x * (1 - pad.unsqueeze(-1).type_as(x))).transpose(0, 1)
    layer = enc.layers[0]
    a = layer.self_attn(query=x, key=x, value=x, key_padding_mask=pad, need_weights=False)[0]
    r = step("encoder.layers.0.self_attn_residual", 1.0, x, a)
    x = layer.self_attn_layer_norm(x * 1.0 + a)
    f = layer.fc2(layer.activation_fn(layer.fc1(x)))
    omega = r
    r = step("encoder.layers.0.ffn_residual", omega, x, f)
    enc_out = layer.final_layer_norm(x * omega + f)

    y = dec.embed_scale * dec.embed_tokens(tgt) + dec.embed_positions(tgt)
    y = y.transpose(0, 1)
    layer = dec.layers[0]
    tgt_pad = tgt.eq(dec.padding_idx)
    a = layer.self_attn(
        query=y,
        key=y,
        value=y,
        key_padding_mask=tgt_pad,
        attn_mask=dec.buffered_future_mask(y),
        need_weights=False,
    )[0]
    r = step("decoder.layers.0.self_attn_residual", 1.0, y, a)
    y = layer.self_attn_layer_norm(y * 1.0 + a)
    c = layer.encoder_attn(
        query=y,
        key=enc_out,
        value=enc_out,
        key_padding_mask=pad,
        static_kv=True,
        need_weights=False,
    )[0]
    omega = r
    r = step("decoder.layers.0.encoder_attn_residual", omega, y, c)
    y = layer.encoder_attn_layer_norm(y * omega + c)
    f = layer.fc2(layer.activation_fn(layer.fc1(y)))
    step("decoder.layers.0.ffn_residual", r, y, f)
    return expected


def test_profiled_omega_equals_hand_computation():
    torch.manual_seed(0)
    model, dictionary = build_translation_model(
        "admin_transformer_tiny", encoder_layers=1, decoder_layers=1, **NO_DROPOUT
    )
    src, src_lengths, tgt = random_batch(dictionary, bsz=4, src_len=9, tgt_len=7, pad_rows=(1, 2))
    with torch.no_grad():
        expected = hand_profiled_omegas(model, src, src_lengths, tgt)
    assert not bool(model.admin_profiled)
    model.train()
    model(src, src_lengths, tgt)  # the first training forward profiles
    assert bool(model.admin_profiled)
    got = omegas(model)
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == pytest.approx(expected[name], rel=1e-5), name
    # first sublayer of each stack starts at 1; the others grew
    assert got["encoder.layers.0.self_attn_residual"] == 1.0
    assert got["decoder.layers.0.ffn_residual"] > 1.0

    # a second training forward does not profile again
    before = omegas(model)
    model(src, src_lengths, tgt)
    assert omegas(model) == before


def test_eval_forward_does_not_profile():
    model, dictionary = build_translation_model("realformer_tiny")
    src, src_lengths, tgt = random_batch(dictionary)
    model.eval()
    with torch.no_grad():
        model(src, src_lengths, tgt)
    assert not bool(model.admin_profiled)
    assert set(omegas(model).values()) == {1.0}


def test_omega_survives_state_dict_round_trip_and_is_not_reprofiled():
    torch.manual_seed(0)
    model, dictionary = build_translation_model("realformer_tiny", **NO_DROPOUT)
    src, src_lengths, tgt = random_batch(dictionary)
    model.train()
    model(src, src_lengths, tgt)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, AdminResidual) and m.admin:
                m.omega_delta.add_(torch.randn_like(m.omega_delta) * 0.01)  # as if trained
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert "admin_profiled" in state
    assert any(k.endswith("omega_init") for k in state) and any(
        k.endswith("omega_delta") for k in state
    )

    torch.manual_seed(123)
    fresh, _ = build_translation_model("realformer_tiny", **NO_DROPOUT)
    fresh.load_state_dict(state)
    fresh.train()
    src2, src_lengths2, tgt2 = random_batch(dictionary, seed=5)
    fresh(src2, src_lengths2, tgt2)  # would re-profile if the flag were lost
    for k, v in fresh.state_dict().items():
        if "omega" in k or k == "admin_profiled":
            assert torch.equal(v, state[k]), k


def test_closed_form_omega():
    # omega = sqrt((N+1)/ln(N+1) - 1), values worked out by hand for N = 12, 4, 6
    assert admin_closed_form_omega(12) == pytest.approx(2.0170092187)
    model, _ = build_translation_model("realformer_tiny", init_type="admin-closed-form")
    got = omegas(model)
    enc = [v for k, v in got.items() if k.startswith("encoder.")]
    dec = [v for k, v in got.items() if k.startswith("decoder.")]
    # 2 encoder layers: N = 2 * 2 = 4; 2 decoder layers: N = 3 * 2 = 6
    assert len(enc) == 4 and enc == pytest.approx([1.4514388285] * 4)
    assert len(dec) == 6 and dec == pytest.approx([1.6116104978] * 6)
    assert bool(model.admin_profiled)  # nothing to profile at training time


def test_default_init_has_no_omega_parameters():
    model, _ = build_translation_model("realformer_tiny", init_type="default")
    assert not any("omega" in k for k in model.state_dict())


@pytest.fixture(scope="module")
def multi30k_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("admin_data")
    raw = make_multi30k_subset(root / "raw", n_train=1000, n_valid=100, n_test=50)
    return preprocess(raw, root / "bin")


def test_fairseq_train_profiles_in_one_run_and_writes_the_ratios(multi30k_bin, tmp_path):
    out = train_translation(
        multi30k_bin,
        tmp_path / "ckpt",
        arch="realformer_tiny",
        max_update=6,
        extra=["--admin-profile-out", str(tmp_path / "omega.json")],
    )
    assert out.count("ADMIN profiling done") == 1
    profile = json.loads((tmp_path / "omega.json").read_text())
    assert len(profile["omega"]) == 2 * 2 + 3 * 2
    ckpt = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", weights_only=False)
    model_state = ckpt["model"]
    assert int(model_state["admin_profiled"]) == 1
    for name, value in profile["omega"].items():
        assert float(model_state[f"{name}.omega_init"]) == pytest.approx(value)

    # resuming from checkpoint_last.pt does not profile again and keeps omega_init
    out2 = train_translation(multi30k_bin, tmp_path / "ckpt", arch="realformer_tiny", max_update=9)
    assert "ADMIN profiling done" not in out2
    assert "num_updates=9" in out2 or "num_updates 9" in out2
    state2 = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", weights_only=False)["model"]
    for k, v in model_state.items():
        if k.endswith("omega_init"):
            assert torch.equal(v, state2[k]), k


@pytest.mark.slow
def test_deep_60_12_post_ln_trains_with_admin(multi30k_bin, tmp_path):
    """The paper's 60L-12L depth at tiny width, in one fairseq-train command."""
    common = [
        "--encoder-embed-dim",
        "32",
        "--encoder-ffn-embed-dim",
        "64",
        "--encoder-attention-heads",
        "2",
        "--decoder-attention-heads",
        "2",
        "--max-tokens",
        "1500",
        "--lr",
        "2e-3",
        "--no-save",
    ]
    out = train_translation(
        multi30k_bin,
        tmp_path / "admin",
        arch="realformer_wmt_en_fr_60_12",
        max_update=25,
        extra=[
            "--init-type",
            "admin",
            "--admin-profile-out",
            str(tmp_path / "omega.json"),
            *common,
        ],
    )
    assert out.count("ADMIN profiling done") == 1
    losses = parse_train_losses(out)
    assert len(losses) == 25 and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    profile = json.loads((tmp_path / "omega.json").read_text())
    assert len(profile["omega"]) == 2 * 60 + 3 * 12
    # omega grows with depth along each stack
    assert (
        profile["omega"]["encoder.layers.59.ffn_residual"]
        > profile["omega"]["encoder.layers.1.ffn_residual"]
    )
