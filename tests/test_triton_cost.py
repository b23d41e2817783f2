"""``studies.triton_cost``, the cost model of the triton route (RealFormer, He et al. arXiv
2012.11747) against the eager route and the attention fairseq runs: its arithmetic checked
against values computed by hand for one layer at 32 and 2048 tokens of gpu_check's 6L-6L d512
model (8192-token batches, 8 heads of 64), the launch table's configurations (read from the
kernels' source, the same as the module's where triton is installed), the causal zero tiles and
ROWMAX reads, flash where fairseq passes no mask, the roofline's terms, the fit on fp16 rows and
its check on bf16 rows with tolerances written here, a prediction for every case, and the
committed JSON being what the study writes. No GPU; triton only for the launch-table check."""

import importlib.util
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


def test_a_causal_triton_layer_at_2048_tokens_by_hand():
    """Decoder self-attention, layer 2, 2048 tokens: 4 sentences x 8 heads = 32, n = 32 x
    2048^2 = 134,217,728 scores; q = k = v = out = 8,388,608 bytes, row statistics 262,144.
    The launch table's long rows at head 64, 16-bit: forward 64 x 32, key-block pass 32 x 32,
    dq 64 x 64."""
    cost = tc.triton_cost(layer(2048, "decoder self-attention"))
    (forward,) = cost.forward
    # forward: query block i computes 2 (i + 1) key tiles of 64 x 32: 1056 tiles, 0.515625 of
    # the scores; reads q, k, v (25,165,824) and the previous stream on those tiles
    # (276,824,064); writes the whole stream, zeros above the diagonal (536,870,912), out and
    # two row statistics (8,912,896)
    assert (forward.read, forward.written) == (301_989_888, 545_783_808)
    delta, key_pass, dq = cost.backward
    # key blocks of 32 x 32: 2080 tiles, 0.5078125; reads q, dO, k, v (33,554,432), three row
    # statistics (786,432), the stream and its incoming gradient on its tiles (2 x 272,629,760)
    # and ROWMAX of the query blocks wholly before each key block (32 x 2016 blocks x 32 rows
    # x 4 = 8,257,536); writes dk, dv (16,777,216), the gradient whole (536,870,912) and the
    # rebuilt previous stream on its tiles (272,629,760)
    assert key_pass.read == 33_554_432 + 786_432 + 2 * 272_629_760 + 8_257_536
    assert key_pass.written == 16_777_216 + 536_870_912 + 272_629_760
    # dq blocks of 64 x 64: 528 tiles, 0.515625; reads k, the gradient on its tiles
    # (276,824,064) and ROWMAX (262,144); writes dq
    assert (dq.read, dq.written) == (8_388_608 + 276_824_064 + 262_144, 8_388_608)
    assert (delta.read, delta.written) == (16_777_216, 262_144)


def test_the_launch_table_is_read_from_the_kernels_source():
    table = tc.launch_table()
    config = tc.gpu_launch_config
    assert table["SHORT"] == 64
    assert tuple(config("forward", 64, 2, 2048, table)) == (64, 32, 8, 2)
    assert tuple(config("forward", 64, 2, 64, table)) == (32, 32, 4, 2)
    assert tuple(config("backward", 64, 2, 2048, table)) == (32, 32, 4, 1)
    assert tuple(config("dq", 64, 2, 2048, table)) == (64, 64, 4, 2)
    assert tuple(config("dq", 128, 2, 2048, table)) == (32, 32, 4, 1)
    assert tuple(config("delta", 64, 2, 2048, table)) == (64, 16, 4, 1)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_launch_table_read_is_the_modules():
    import torch

    from realformer_fairseq.modules.routes import triton_launch as ta

    table = tc.launch_table()
    for kernel in ta.KERNELS:
        for head_dim in (32, 64, 80, 128):
            for dtype in (torch.float16, torch.bfloat16):
                for length in (17, 64, 65, 2048):
                    mine = tc.gpu_launch_config(kernel, head_dim, 2, length, table)
                    theirs = ta.launch_config(kernel, head_dim, dtype, (9, 0), length)
                    assert tuple(mine) == tuple(theirs), (kernel, head_dim, dtype, length)


def test_fairseqs_attention_is_flash_where_it_passes_no_mask():
    """A BERT-base encoder layer on full 512-token blocks (32 x 12 heads = 384, head 64): no
    padding, no causal mask, so SDPA runs flash: reads q, k, v (75,497,472), writes out and
    the log-sum-exp (25,952,256), keeps nothing score-sized. With padding: the bias kernel."""
    model = dict(enc_layers=12, dec_layers=0, width=768, ffn=3072, heads=12, vocab=50265)
    shape = dict(bsz=32, src_len=512, tgt_len=0, src_padded=False, tgt_padded=False)
    layers = tc.case_layers(shape, model)
    assert len(layers) == 12 and {x.causal for x in layers} == {False}
    cost = tc.baseline_cost(layers[3])
    (forward,) = cost.forward
    assert forward.name == "flash forward"
    assert (forward.read, forward.written) == (75_497_472, 25_952_256)
    assert cost.kept == 0
    padded = tc.case_layers(dict(shape, src_padded=True), model)[3]
    assert tc.baseline_cost(padded).forward[0].name == "materialise the bias (bsz*heads, T, S)"


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


def test_the_fit_is_on_fp16_rows_and_its_check_on_bf16_rows_within_tolerances_set_before():
    """The launch floor and the rest of the step's memory fitted to gpu_check_h200.json's fp16
    rows; the bf16 rows, not fitted on, checked within tolerances written here (and in the
    module) before the residuals were computed: the vanilla step within 25 %, the eager route's
    speed ratio within 0.08, its peak memory ratio within 10 %."""
    fit = tc.fit_and_check()
    assert tc.CHECK_TOLERANCES == dict(
        vanilla_step_relative=0.25, eager_speed_absolute=0.08, eager_memory_relative=0.10
    )
    assert "fp16 rows" in fit["fitted_to"]
    assert [r["tokens"] for r in fit["fit_rows"]] == [r["tokens"] for r in fit["check_rows"]]
    assert [r["tokens"] for r in fit["check_rows"]] == [128, 512, 2048]
    measured = json.loads((REPO_ROOT / "docs" / "benchmarks" / "gpu_check_h200.json").read_text())
    rows = measured["routes"]["models"]
    for r in fit["check_rows"]:  # the check's measurements are the bf16 rows
        row = rows[f"6L-6L d512 bf16 len{r['tokens']}"]
        assert (
            r["eager_speed"]["measured"] == row["ratios"]["realformer_eager/vanilla"]["train_wps"]
        )
        assert r["within_tolerance"] == {"vanilla_step": True, "eager_speed": True,
                                         "eager_memory": True}, r  # fmt: skip
    assert fit["check_passed"]
    assert 1e-6 <= fit["fitted"]["torch_launch_floor_s"] <= 60e-6


def test_every_case_and_route_is_predicted_on_both_gpus():
    from studies import gpu_cases

    cases = json.loads((REPO_ROOT / "docs" / "benchmarks" / "triton_cost.json").read_text())[
        "cases"
    ]
    expected = {f"{n} {d} {r}" for n, c in gpu_cases.CASES.items() for d in c["dtypes"]
                for r in ("eager", "concat", "auto", "triton")}  # fmt: skip
    assert set(cases) == expected
    for key, c in cases.items():
        assert set(c["gpus"]) == {"H100 SXM", "H200"}
        for gpu, p in c["gpus"].items():
            if c["route"] in ("eager", "triton"):
                assert p["modelled"] and 0 < p["speed"] < 1.5, (key, gpu)
                # --fp16 builds the flattened FP16Optimizer, --bf16 the per-tensor one
                assert p["optimizer"] == {"fp16": "flat", "bf16": "per_tensor"}[c["dtype"]]
            if c["route"] == "concat":
                assert not p["modelled"] and p["why"] == "the concat route has no cost model"


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


def test_one_concat_phase_layer_by_hand():
    """The concat phase's layer 1 (two slices) of one head of 64 over 64 tokens, at an H100's
    16-bit blocks (forward 64 x 32, key-block pass 16 x 32, query-block pass 32 x 32): one
    slice is 64 x 64 x 2 = 8,192 bytes, the row statistics 64 x 4 = 256, the float32 gradient
    buffers' slices 0..1 of q (or k) 2 x 64 x 64 x 4 = 32,768; 4,096 scores. FLOPs per score:
    forward 2 x 2 x 64 (the tile over two slices) + 2 x 64 (P V) = 384; key-block pass 4 x 2 x
    64 + 4 x 64 = 768; query-block pass 4 x 2 x 64 + 2 x 64 = 640: 1,792 = 28 d. No T x T
    byte: per score, each pass reads the (2 + 1) x 64 slice and value columns once per query
    (or key) block, here from the L2 past the first (one block of 64 rows reads them from
    memory: 64 x 192 x 2 / 64 per score)."""
    layer = tc.Layer("encoder self-attention", 1, 3, 1, 64, 64, 64, 1, False, False)
    cost = tc.concat_cost(layer)
    copies, forward = cost.forward
    delta, key_pass, dq_pass, hand_down = cost.backward
    assert (copies.read, copies.written) == (16_384, 16_384)
    # q's two slices (16,384) + 4,096 x 192 x 2 / 64 (24,576); out + rowmax + rowsum
    assert (forward.read, forward.written, forward.flops) == (40_960, 8_704, 1_572_864)
    assert forward.exps == 4_096 and forward.int_ops == 0
    assert (delta.read, delta.written) == (16_384, 256)
    # k, its slice 0, v (24,576) + 4,096 x (192 x 2 + 12) / 64 (25,344) + dk slices (32,768)
    assert (key_pass.read, key_pass.written, key_pass.flops) == (82_688, 40_960, 3_145_728)
    # q's slices, dO (24,576) + 3 rows (768) + 4,096 x 384 / 64 (24,576) + dq slices (32,768)
    assert (dq_pass.read, dq_pass.written, dq_pass.flops) == (82_688, 32_768, 2_621_440)
    assert (hand_down.read, hand_down.written) == (32_768, 49_152)
    assert cost.kept == 0 and cost.transient == 0
    # read at every block from memory instead: the key-block pass's blocks of 32 keys read
    # 4,096 x 396 / 32 = 50,688, the query-block pass's of 32 queries 4,096 x 384 / 32 = 49,152
    per_block = tc.concat_cost(layer, per_block=True)
    assert per_block.backward[1].read == 24_576 + 50_688 + 32_768
    assert per_block.backward[2].read == 24_576 + 768 + 49_152 + 32_768
    # dropout: the stream kernels' Philox mask, 64 integer operations per 4 elements
    assert tc.concat_cost(layer, dropout=0.1).forward[1].int_ops == 16 * 4_096
    # the stream formed from two slices as built: per slice q k^T in fp16, its float32 copy
    # added (10 bytes read, 10 written per score); it is kept by the layer that takes it
    formed = tc.stream_formed_cost(layer, 2)
    assert [(k.read, k.written, k.flops) for k in formed.forward] == [(40_960, 40_960, 524_288)] * 2
    assert formed.kept == 16_384


def test_the_switch_depths_in_the_rules_are_the_studys():
    """routes/rules.py's table is what ``--switch-depths`` derives for an H100 with the stream
    formed as built (0 everywhere: forming it costs about one stream-kernel layer per slice);
    with the stream formed by one kernel the study's depths are written here."""
    import torch

    from realformer_fairseq.modules.routes import rules

    dtypes = {2: torch.float16, 4: torch.float32}
    derived = tc.switch_depths("H100 SXM")
    assert len(derived) == 18 and set(derived.values()) == {0}
    for (width, head, length), depth in derived.items():
        assert rules.concat_phase_depth(head, length, dtypes[width], (9, 0)) == depth
    fused = tc.switch_depths("H100 SXM", "fused")
    assert (fused[(2, 64, 512)], fused[(2, 64, 2048)], fused[(2, 32, 2048)]) == (6, 10, 22)
    assert fused[(2, 64, 128)] == 0 and fused[(4, 64, 2048)] == 0
    assert tc.switch_depths("H200", "fused")[(2, 64, 2048)] == 6


def test_the_triton_cases_carry_each_phase_alone():
    cases = json.loads((REPO_ROOT / "docs" / "benchmarks" / "triton_cost.json").read_text())[
        "cases"
    ]
    bert = cases["bert_base_512 fp16 triton"]["gpus"]["H100 SXM"]
    assert bert["switch_depths"] == [0]
    assert set(bert["phases"]) == set(tc.TRITON_PHASES)
    # the switch as built (D = 0) is the stream kernels alone
    assert bert["speed"] == bert["phases"]["triton stream kernels"]["speed"]
    assert bert["phases"]["triton concat kernels"]["attention_peak_bytes"]["route"] == 0
    # 32 sentences x 12 heads x 512 x 512 scores: the chain's float32 stream kept, and the
    # one its last layer's backward hands down, 4 + 4 bytes each
    assert bert["phases"]["triton stream kernels"]["attention_peak_bytes"]["route"] == (
        32 * 12 * 512 * 512 * 8
    )
