"""``studies.triton_cost``, the cost model of the triton route (RealFormer, He et al. arXiv
2012.11747; issue 53) against the eager route and fairseq's fused attention: its arithmetic
checked against values computed by hand for one layer at 32 and 2048 tokens of gpu_check's
6L-6L d512 model (8192-token batches, 8 heads of 64), the causal tiles, the roofline's terms,
and the committed JSON being what the study writes. No triton, no GPU: plain arithmetic."""

import json

import pytest

from studies import triton_cost as tc
from studies.runs import REPO_ROOT

MB = 1  # bytes, written out


def layer(length, chain="encoder self-attention", index=2):
    layers = tc.chain_layers(tc.MODEL, length, tc.BATCH_TOKENS)
    return next(x for x in layers if x.chain == chain and x.index == index)


def phase_bytes(kernels):
    return sum(k.read + k.written for k in kernels)


def test_the_layers_of_one_step_are_gpu_checks_model():
    layers = tc.chain_layers(tc.MODEL, 32, tc.BATCH_TOKENS)
    assert len(layers) == 18  # three chains of six
    first = layers[0]
    # 8192 // 32 = 256 sentences, x 8 heads; 512 / 8 = 64 per head
    assert (first.bh, first.tgt, first.src, first.head_dim) == (2048, 32, 32, 64)
    assert first.scores == 2048 * 32 * 32 == 2_097_152
    assert [x.need_weights for x in layers].count(True) == 1  # the last cross-attention
    assert layers[-1].need_weights and layers[-1].chain == "cross-attention"
    assert [x.causal for x in layers] == [False] * 6 + [True] * 6 + [False] * 6


def test_one_triton_layer_at_32_tokens_by_hand():
    """Encoder self-attention, layer 2 (a previous stream read, the next layer's gradient in),
    32 tokens: blocks of 32, nothing padded. q = k = v = out = 2048 x 32 x 64 x 2 bytes =
    8,388,608; the stream 2048 x 32 x 32 x 4 = 8,388,608; row statistics 2048 x 32 x 4 =
    262,144."""
    cost = tc.triton_cost(layer(32))
    (forward,) = cost.forward
    # reads q, k, v (25,165,824) and the previous stream (8,388,608); writes the stream
    # (8,388,608), the output (8,388,608) and two row statistics (524,288)
    assert forward.read == 33_554_432 and forward.written == 17_301_504
    assert forward.flops == 4 * 64 * 2_097_152 == 536_870_912
    assert phase_bytes(cost.forward) == 50_855_936
    # delta: reads dO, O (16,777,216), writes 262,144; key blocks: reads q, k, v, dO
    # (33,554,432), three row statistics (786,432), the stream and its incoming gradient
    # (16,777,216), writes dk, dv (16,777,216), the gradient handed down (8,388,608) and the
    # previous layer's stream rebuilt over this one's (8,388,608; issue 51); dq = G K: reads k
    # and the gradient handed down (16,777,216), writes dq (8,388,608)
    assert phase_bytes(cost.backward) == 17_039_360 + 84_672_512 + 25_165_824 == 126_877_696
    # dP, dV, dK and the rebuild's q k^T in the key pass, G K in the dq pass (2 x 64 a score each)
    assert sum(k.flops for k in cost.backward) == 10 * 64 * 2_097_152
    assert cost.kept == 0  # layer 3 rebuilds its stream: the chain keeps the last layer's
    assert cost.transient == 8_388_608  # the incoming gradient, the one handed down over it
    # issue 53's first design recomputed G in its dq pass: the key pass's reads again (51,118,080)
    recomputed = tc.triton_cost(layer(32), dq_recomputed=True)
    assert phase_bytes(recomputed.backward) == 17_039_360 + 84_672_512 + 59_506_688


def test_one_fused_layer_at_32_tokens_by_hand():
    """fairseq's transformer, the same layer: cuDNN's SDPA with a materialised fp16 bias
    (2048 x 32 x 32 x 2 = 4,194,304 bytes), written once, read in forward and backward, kept."""
    cost = tc.fused_cost(layer(32))
    # bias 4,194,304; forward reads q, k, v + bias (29,360,128), writes out + lse (8,650,752)
    assert phase_bytes(cost.forward) == 4_194_304 + 29_360_128 + 8_650_752 == 42_205_184
    # backward reads q, k, v, out, dO, the bias, lse (38,010,880); writes dq, dk, dv
    assert phase_bytes(cost.backward) == 38_010_880 + 25_165_824 == 63_176_704
    assert sum(k.flops for k in cost.backward) == 1_342_177_280  # 5 products of 2 x N x 64
    assert cost.kept == 4_194_304 and cost.transient == 0


def test_the_eager_layer_keeps_the_float32_softmax_and_the_fp16_probabilities():
    n = 2_097_152
    cost = tc.eager_cost(layer(32))
    assert cost.kept == 6 * n  # 4 + 2 bytes a score; with dropout its bool mask too
    assert tc.eager_cost(layer(32), dropout=0.1).kept == 7 * n
    names = [k.name for k in cost.forward]
    assert names == [
        "q k^T (bmm, fp16)", "to float32", "stream += previous (add_)",
        "/ (layer + 1) (running mean)", "masked_fill (key padding)", "softmax",
        "to fp16 (type_as)", "P V (bmm)",
    ]  # fmt: skip
    # forward: q k^T reads q, k (16,777,216) writes 2N; to float32 2N -> 4N; add_ 8N -> 4N;
    # division 4N -> 4N; masked_fill 4N -> 4N; softmax 4N -> 4N; to fp16 4N -> 2N; P V reads
    # 2N + v (8,388,608), writes out (8,388,608)
    assert phase_bytes(cost.forward) == 16_777_216 + 2 * 8_388_608 + n * (
        2 + 6 + 12 + 8 + 8 + 8 + 6 + 2
    )


def test_causal_tiles():
    # 256 tokens, 128 x 64 blocks: the first query block needs 2 of 4 key blocks, the second 4
    assert tc.block_fraction(256, 256, 128, 64, True) == 6 * 128 * 64 / 256**2 == 0.75
    # 2048: query block i needs 2 (i + 1) key blocks, 2 x (1 + ... + 16) = 272 of 512 tiles
    assert tc.block_fraction(2048, 2048, 128, 64, True) == 272 * 128 * 64 / 2048**2 == 0.53125
    assert tc.block_fraction(40, 40, 32, 32, False) == 4 * 32 * 32 / 1600  # padded tiles
    assert tc.design_blocks(32) == ((32, 32), (32, 32))
    assert tc.design_blocks(2048) == ((128, 64), (64, 64))


def test_a_kernel_takes_the_longest_of_its_roofline_terms_or_the_launch_floor():
    h200 = tc.GPUS["H200"]
    # at 32 tokens the fused forward's 50.9 MB take 11.8 us on 4.3 TB/s: Triton's floor wins
    (small,) = tc.triton_cost(layer(32)).forward
    assert small.seconds(h200) == 15e-6
    # at 2048: 32 x 2048 x 2048 = 134,217,728 scores; reads q, k, v (25,165,824) and the
    # stream (536,870,912), writes the stream, out and row statistics (545,783,808): memory
    # bound (its 34.4 GFLOP take 43.6 us at 788 TFLOP/s, its exponentials 34.4 us)
    (big,) = tc.triton_cost(layer(2048)).forward
    assert big.read + big.written == 1_107_820_544
    assert big.seconds(h200) == pytest.approx(1_107_820_544 / 4.3e12, rel=1e-12)
    assert big.seconds(tc.GPUS["H100 SXM"]) == pytest.approx(1_107_820_544 / 3.0e12, rel=1e-12)


def test_a_route_against_itself_is_one_and_the_eager_check_is_close_to_the_h200():
    same = tc.predict_against("fused", tc.MODEL, 512, tc.BATCH_TOKENS, tc.GPUS["H200"], 0.06, 4e9)
    assert (same["speed"], same["memory"], same["extra_step_ms"]) == (1.0, 1.0, 0.0)
    # the model's eager route against what the H200 measured (gpu_check_h200.json): within
    # 0.05 in speed ratio and 6 % in peak memory at every measured length
    checks = tc.study()["eager_check"]
    assert [c["tokens"] for c in checks] == [128, 512, 2048]
    for c in checks:
        assert abs(c["predicted_speed"] - c["measured_speed"]) < 0.05, c
        assert abs(c["predicted_memory"] / c["measured_memory"] - 1) < 0.06, c


def test_the_committed_json_is_what_the_study_writes():
    committed = json.loads((REPO_ROOT / "docs" / "benchmarks" / "triton_cost.json").read_text())
    assert committed == json.loads(json.dumps(tc.study(), default=str))


def test_the_json_rows_carry_each_layer_with_its_hand_computed_bytes():
    report = tc.study()
    row = next(r for r in report["rows"] if (r["route"], r["tokens"]) == ("triton", 32))
    assert len(row["layers"]) == 18 and row["batch_sentences"] == 256
    (layer2,) = [
        x for x in row["layers"] if (x["chain"], x["index"]) == ("encoder self-attention", 2)
    ]
    # backward as by hand above; it keeps nothing T x T (its stream is rebuilt by layer 3), the
    # chain's last layer keeps one stream
    assert layer2["forward"]["bytes"] == 50_855_936 and layer2["backward"]["bytes"] == 126_877_696
    assert layer2["kept_bytes"] == 0
    (last,) = [
        x for x in row["layers"] if (x["chain"], x["index"]) == ("encoder self-attention", 5)
    ]
    assert last["kept_bytes"] == 8_388_608
    assert layer2["forward"]["ms"]["H200"] == pytest.approx(15e-3)  # the launch floor, 15 us
    assert set(row["gpus"]) == {"H100 SXM", "H200"}
