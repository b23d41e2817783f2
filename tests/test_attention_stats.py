"""realformer-attention-stats (RealFormer section 4.3): per-layer/per-head attention
entropy and adjacent-layer JS divergence, checked against attention probabilities
recomputed in numpy from each layer's q/k projections, on tiny checkpoints trained
by fairseq-train (encoder-only RealFormer and Post-LN, encoder-decoder RealFormer)."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import (
    BIN,
    fairseq_preprocess,
    make_multi30k_subset,
    preprocess,
    run,
    train_masked_lm,
    train_translation,
)

from realformer_fairseq.cli import attention_stats as stats_cli
from realformer_fairseq.modules.routes import RealformerMultiheadAttention

N_LINES = 13  # batches of 4: the last one is short, every batch is padded


# ---------------------------------------------------------------------------
# numpy reference


def np_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def np_entropy(p):
    return -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(-1)


def np_js(p, q):
    m = (p + q) / 2

    def kl(a, b):
        return np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0) / b), 0.0).sum(-1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def np_layer_norm(x, ln):
    w = ln.weight.detach().double().numpy()
    b = ln.bias.detach().double().numpy()
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + ln.eps) * w + b


def reference_self_attention_probs(encoder, tokens: torch.Tensor):
    """Per layer, (heads, T, T) probabilities of one unpadded sentence, from the
    layer inputs (the model's hidden states) and the q/k projection weights:
    softmax(S_l) with S_l = q_l k_l^T / sqrt(d) (+ S_{l-1} with residual attention;
    divided by l + 1 with the running mean)."""
    with torch.no_grad():
        states = encoder(tokens[None], return_all_hiddens=True)["encoder_states"]
    probs, stream = [], None
    for idx, layer in enumerate(encoder.layers):
        attn = layer.self_attn
        x = states[idx][:, 0, :].double().numpy()  # (T, C)
        if layer.normalize_before:
            x = np_layer_norm(x, layer.self_attn_layer_norm)
        wq, bq = (
            attn.q_proj.weight.detach().double().numpy(),
            attn.q_proj.bias.detach().double().numpy(),
        )
        wk, bk = (
            attn.k_proj.weight.detach().double().numpy(),
            attn.k_proj.bias.detach().double().numpy(),
        )
        h, d = attn.num_heads, attn.head_dim
        q = ((x @ wq.T + bq) / math.sqrt(d)).reshape(-1, h, d).transpose(1, 0, 2)  # (H, T, d)
        k = (x @ wk.T + bk).reshape(-1, h, d).transpose(1, 0, 2)
        scores = q @ k.transpose(0, 2, 1)  # (H, T, T)
        if isinstance(attn, RealformerMultiheadAttention):
            stream = scores if stream is None else stream + scores
            logits = stream / (idx + 1) if attn.residual_attention_mode == "mean" else stream
        else:
            logits = scores
        probs.append(np_softmax(logits))
    return probs


def reference_stats(per_sentence_probs):
    """Means over all query tokens of all sentences, per layer and head."""
    num_layers = len(per_sentence_probs[0])
    ent = [
        np.concatenate([np_entropy(p[l]) for p in per_sentence_probs], axis=1)
        for l in range(num_layers)
    ]
    js = [None] + [
        np.concatenate([np_js(p[l], p[l - 1]) for p in per_sentence_probs], axis=1)
        for l in range(1, num_layers)
    ]
    return ent, js


# ---------------------------------------------------------------------------
# checkpoints


def _train_mlm(data_bin: Path, save_dir: Path, arch: str):
    train_masked_lm(data_bin, save_dir, arch=arch, max_update=8)
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("attn_data")
    raw = make_multi30k_subset(root / "raw", n_train=600, n_valid=50, n_test=N_LINES)
    mlm_bin = root / "mlm_bin"
    fairseq_preprocess(
        [
            "--only-source",
            "--trainpref",
            raw / "train.en",
            "--validpref",
            raw / "valid.en",
            "--destdir",
            mlm_bin,
            "--workers",
            "1",
        ]
    )
    return raw, mlm_bin, root


@pytest.fixture(scope="module")
def mlm_checkpoints(corpus):
    _, mlm_bin, root = corpus
    return {
        arch: _train_mlm(mlm_bin, root / arch, arch)
        for arch in ("realformer_bert_tiny", "postln_bert_tiny")
    }


@pytest.fixture(scope="module")
def translation_checkpoint(corpus):
    raw, _, root = corpus
    data_bin = preprocess(raw, root / "mt_bin")
    train_translation(data_bin, root / "mt_ck", arch="realformer_tiny", max_update=8)
    return root / "mt_ck" / "checkpoint_last.pt", data_bin


def read_test_lines(raw: Path, lang: str):
    return (raw / f"test.{lang}").read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------------------
# the statistics themselves


def test_entropy_and_js_closed_forms():
    uniform = np.full((3, 8), 1 / 8)
    np.testing.assert_allclose(stats_cli.attention_entropy(uniform), np.log(8))
    one_hot = np.eye(5)
    np.testing.assert_allclose(stats_cli.attention_entropy(one_hot), 0.0, atol=1e-12)
    np.testing.assert_allclose(stats_cli.js_divergence(uniform, uniform), 0.0, atol=1e-12)
    # disjoint supports: ln 2, the maximum
    np.testing.assert_allclose(stats_cli.js_divergence(one_hot[0], one_hot[1]), np.log(2))
    rng = np.random.default_rng(0)
    p, q = np_softmax(rng.normal(size=(4, 7))), np_softmax(rng.normal(size=(4, 7)))
    np.testing.assert_allclose(stats_cli.js_divergence(p, q), np_js(p, q), rtol=1e-12)
    np.testing.assert_allclose(stats_cli.js_divergence(p, q), stats_cli.js_divergence(q, p))


@pytest.mark.parametrize("arch", ["realformer_bert_tiny", "postln_bert_tiny"])
def test_encoder_only_stats_match_numpy(corpus, mlm_checkpoints, arch, tmp_path):
    raw, mlm_bin, _ = corpus
    model, task = stats_cli.load_checkpoint(str(mlm_checkpoints[arch]), str(mlm_bin))
    encoder = model.encoder.sentence_encoder
    residual = isinstance(encoder.layers[0].self_attn, RealformerMultiheadAttention)
    assert residual == (arch == "realformer_bert_tiny")

    lines = read_test_lines(raw, "en")
    stats = stats_cli.analyse(model, task, lines, batch_size=4)
    summary = stats["encoder"].summary()

    d = task.source_dictionary
    sentences = [
        torch.cat([torch.tensor([d.bos()]), d.encode_line(l, add_if_not_exist=False).long()])
        for l in lines
    ]
    ref_ent, ref_js = reference_stats(
        [reference_self_attention_probs(encoder, s) for s in sentences]
    )
    assert summary["num_queries"] == sum(len(s) for s in sentences)
    for layer in range(2):
        np.testing.assert_allclose(
            summary["entropy"]["per_head"]["mean"][layer], ref_ent[layer].mean(1), rtol=1e-5
        )
        np.testing.assert_allclose(
            summary["entropy"]["per_head"]["median"][layer],
            np.median(ref_ent[layer], 1),
            rtol=1e-5,
        )
        np.testing.assert_allclose(
            stats["encoder"].values("entropy", layer), ref_ent[layer], rtol=1e-4, atol=1e-6
        )
    assert summary["js_divergence"]["per_head"]["mean"][0] is None
    np.testing.assert_allclose(
        summary["js_divergence"]["per_head"]["mean"][1], ref_js[1].mean(1), rtol=1e-4, atol=1e-7
    )
    np.testing.assert_allclose(stats["encoder"].values("js", 1), ref_js[1], rtol=1e-3, atol=1e-6)
    assert 0 < ref_js[1].mean() < math.log(2)


def test_capture_leaves_the_model_as_it_was(corpus, mlm_checkpoints):
    _, mlm_bin, _ = corpus
    model, _ = stats_cli.load_checkpoint(str(mlm_checkpoints["postln_bert_tiny"]), str(mlm_bin))
    modules = stats_cli.attention_chains(model)["encoder"]
    tokens = torch.tensor([[0, 10, 11, 12, 13, 2], [0, 14, 15, 2, 1, 1]])
    with torch.no_grad():
        before, _ = model(tokens, features_only=True)
        with stats_cli.capture_head_weights(modules) as records:
            assert all(m.skip_embed_dim_check for m in modules)  # fairseq's non-fused path
            during, _ = model(tokens, features_only=True)
        after, _ = model(tokens, features_only=True)
    assert [r[0].shape for r in records] == [(2, 2, 6, 6)] * 2  # (heads, bsz, tgt, src)
    for r in records:
        torch.testing.assert_close(r[0].sum(-1), torch.ones(2, 2, 6))
        assert float(r[0][:, 1, :, 4:].abs().max()) == 0.0  # pad keys get nothing
    torch.testing.assert_close(during, before, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after, before)
    assert not any(m.skip_embed_dim_check for m in modules)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in modules)


def test_encoder_decoder_chains_match_numpy_and_the_decoder_attention(
    corpus, translation_checkpoint
):
    raw, _, _ = corpus
    ckpt, data_bin = translation_checkpoint
    model, task = stats_cli.load_checkpoint(str(ckpt), str(data_bin))
    src_lines, tgt_lines = read_test_lines(raw, "en"), read_test_lines(raw, "fr")
    stats = stats_cli.analyse(model, task, src_lines, tgt_lines, batch_size=4)
    assert list(stats) == ["encoder", "decoder", "cross"]

    src_d, tgt_d = task.source_dictionary, task.target_dictionary
    srcs = [src_d.encode_line(l, add_if_not_exist=False).long() for l in src_lines]
    tgts = [tgt_d.encode_line(l, add_if_not_exist=False).long() for l in tgt_lines]
    # encoder chain (running mean in this arch) against numpy
    ref_ent, ref_js = reference_stats(
        [reference_self_attention_probs(model.encoder, s) for s in srcs]
    )
    enc = stats["encoder"].summary()
    for layer in range(2):
        np.testing.assert_allclose(
            enc["entropy"]["per_head"]["mean"][layer], ref_ent[layer].mean(1), rtol=1e-5
        )
    np.testing.assert_allclose(
        enc["js_divergence"]["per_head"]["mean"][1], ref_js[1].mean(1), rtol=1e-4
    )

    # cross chain, head 0 of each layer, against the decoder's own alignment output
    # (alignment_heads=1 averages over head 0 only)
    cross_head0 = [[], []]
    with torch.no_grad():
        for s, t in zip(srcs, tgts):
            enc_out = model.encoder(s[None], src_lengths=torch.tensor([len(s)]))
            prev = torch.cat([t[-1:], t[:-1]])[None]
            for layer in range(2):
                _, extra = model.decoder(
                    prev, enc_out, features_only=True, alignment_layer=layer, alignment_heads=1
                )
                cross_head0[layer].append(np_entropy(extra["attn"][0][0].double().numpy()))
    cross = stats["cross"].summary()
    assert cross["num_queries"] == sum(len(t) for t in tgts)
    for layer in range(2):
        np.testing.assert_allclose(
            cross["entropy"]["per_head"]["mean"][layer][0],
            np.concatenate(cross_head0[layer]).mean(),
            rtol=1e-5,
        )
    # causal decoder self-attention: query t sees t + 1 keys, so H <= ln(t + 1);
    # the first query attends to itself only (entropy 0)
    dec = stats["decoder"]
    bound = np.concatenate([np.log(np.arange(1, len(t) + 1)) for t in tgts])
    for layer in range(2):
        vals = dec.values("entropy", layer)
        assert vals.shape == (2, bound.size)
        assert np.all(vals <= bound + 1e-5)
        np.testing.assert_allclose(vals[:, 0], 0.0, atol=1e-6)
        assert np.all(dec.values("js", 1) <= math.log(2) + 1e-6)


def test_command_writes_json_csv_and_plots(corpus, translation_checkpoint, tmp_path):
    raw, _, _ = corpus
    ckpt, data_bin = translation_checkpoint
    out = tmp_path / "stats"
    exe = BIN / "realformer-attention-stats"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", stats_cli.__name__]
    output = run(
        cmd
        + [
            "--path",
            ckpt,
            "--data",
            data_bin,
            "--input",
            raw / "test.en",
            "--target",
            raw / "test.fr",
            "--out-dir",
            out,
            "--batch-size",
            "5",
            "--cpu",
        ]
    )
    assert "wrote attention_stats.json" in output
    result = json.loads((out / "attention_stats.json").read_text())
    assert result["model"] == "RealformerTransformerModel"
    assert result["arch"] == "realformer_tiny"
    assert set(result["chains"]) == {"encoder", "decoder", "cross"}
    rows = (out / "attention_stats.csv").read_text().splitlines()
    assert rows[0].split(",") == list(stats_cli.CSV_FIELDS)
    assert len(rows) == 1 + 3 * 2 * 2  # chains x layers x heads
    first = rows[1].split(",")
    assert first[:3] == ["encoder", "0", "0"] and first[7] == ""  # no JS for layer 0
    enc = result["chains"]["encoder"]["entropy"]["per_head"]["mean"]
    assert float(first[4]) == pytest.approx(enc[0][0], abs=1e-6)
    assert len(result["plots"]) == 3 * 4
    for name in result["plots"]:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000, name
    assert not list(out.glob(".*.tmp"))


def test_command_encoder_only_and_errors(corpus, mlm_checkpoints, tmp_path, capsys):
    raw, mlm_bin, _ = corpus
    ckpt = str(mlm_checkpoints["realformer_bert_tiny"])
    out = tmp_path / "out"
    stats_cli.cli_main(
        [
            "--path",
            ckpt,
            "--data",
            str(mlm_bin),
            "--input",
            str(raw / "test.en"),
            "--out-dir",
            str(out),
            "--cpu",
        ]
    )
    result = json.loads((out / "attention_stats.json").read_text())
    assert list(result["chains"]) == ["encoder"]
    assert sorted(result["plots"]) == sorted(
        f"encoder_{m}_{k}.png" for m in ("entropy", "js") for k in ("violin", "heatmap")
    )

    def error_of(argv):
        with pytest.raises(SystemExit) as err:
            stats_cli.cli_main(argv)
        assert err.value.code == 1  # every console command's one-line error (was 2 here)
        return capsys.readouterr().err.strip()

    base = ["--path", ckpt, "--data", str(mlm_bin), "--out-dir", str(tmp_path / "x")]
    msg = error_of(base + ["--input", str(tmp_path / "missing.txt")])
    assert (
        msg
        == f"realformer-attention-stats: error: --input {tmp_path / 'missing.txt'}: no such file"
    )
    short = tmp_path / "short.fr"
    short.write_text("une ligne\n")
    msg = error_of(base + ["--input", str(raw / "test.en"), "--target", str(short)])
    assert "--target" in msg and "1 lines" in msg and f"has {N_LINES}" in msg
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert "no non-empty lines" in error_of(base + ["--input", str(empty)])
    msg = error_of(
        [
            "--path",
            str(tmp_path / "nope.pt"),
            "--input",
            str(raw / "test.en"),
            "--out-dir",
            str(out),
        ]
    )
    assert "no such checkpoint file" in msg
    assert not (tmp_path / "x").exists()
