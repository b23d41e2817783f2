"""The GPU check's cases (``studies.gpu_cases``, ``studies.bench_trainer``; RealFormer, He et
al. arXiv 2012.11747): every row times fairseq's own ``Trainer.train_step``, built from the
flags a user types, for the baseline and the route alike; each row says which step, which
optimizer and which SDPA kernel; the sizes of the GPU run reach fairseq's parsed arguments; a
run stopped part-way keeps the rows it measured. The smallest case runs here at toy sizes on
CPU, through the GPU's code path; the whole ``--smoke --parts cases`` run is under ``-m slow``."""

import functools
import json
import sys

import pytest
from fairseq import options
from fairseq.trainer import Trainer
from harness import run

from studies import bench_trainer, gpu_cases, gpu_check

ROUTES_WITHOUT_TRITON = ("eager", "concat", "auto")


def count_train_steps(monkeypatch):
    """Wrap fairseq's Trainer.train_step: every call recorded with its model's class."""
    calls = []
    real = Trainer.train_step

    @functools.wraps(real)  # the row names the timed function: still Trainer.train_step
    def counted(self, samples, *args, **kwargs):
        calls.append(type(self.model).__name__)
        return real(self, samples, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", counted)
    return calls


def test_the_smallest_case_times_fairseqs_train_step_for_every_row(monkeypatch, tmp_path):
    """long_2048 at smoke size (a 2-layer 32-wide encoder, 2 blocks of 32 tokens, fp16 on CPU):
    one row per route, written out as it is measured; each row's baseline and route ran
    Trainer.train_step (warm-up 1, the memory step 1, 1 timed repeat: 3 calls each; the
    baseline 2 more before the first row: its warm-up and its profile)."""
    calls = count_train_steps(monkeypatch)
    monkeypatch.setattr(gpu_cases, "route_available",
                        lambda route, device: "not here" if route == "triton" else None)  # fmt: skip
    seen = []
    case = gpu_cases.SMOKE_CASES["long_2048"]
    rows = gpu_cases.case_rows(
        "long_2048", case, "cpu", gpu_cases.SMOKE_TIMING,
        on_row=lambda key, row: seen.append((key, list(calls))),
    )  # fmt: skip
    assert [key for key, _ in seen] == [f"long_2048 fp16 {r}" for r in gpu_cases.ROUTES]
    before = 0
    for i, (key, so_far) in enumerate(seen[:3]):
        new = so_far[before:]
        expected_base = 3 + (2 if i == 0 else 0)
        assert new.count("RobertaModel") == expected_base, (key, new)
        assert new.count("RealformerRobertaModel") == 3, (key, new)
        assert len(new) == expected_base + 3, (key, new)
        before = len(so_far)
    assert seen[3][1] == seen[2][1]  # triton skipped: no step
    assert rows["long_2048 fp16 triton"]["skipped"] == "not here"
    for route in ROUTES_WITHOUT_TRITON:
        row = rows[f"long_2048 fp16 {route}"]
        assert (row["case"], row["dtype"], row["route"]) == ("long_2048", "fp16", route)
        assert row["step"] == "fairseq.trainer.Trainer.train_step"
        # --fp16: fairseq's FP16Optimizer around its Adam; on CPU not flattened
        # (--fp16-no-flatten-grads: the flat copy is made on the current CUDA device)
        assert (row["optimizer"], row["inner_optimizer"], row["flattened"]) == (
            "FP16Optimizer", "Adam", False,
        )  # fmt: skip
        assert (row["baseline_arch"], row["arch"]) == ("roberta_base", "realformer_bert_base")
        assert row["sdpa_backend"] == "math/cpu"  # fp16 on CPU: SDPA's math kernel
        assert row["batches"]["src_shapes"] == [[2, 32]]
        assert row["batch"] == {"length": 32, "sequences": 2}  # what the prediction is for
        assert "--fp16" in row["argv"] and "--fp16" in row["baseline_argv"]
        impl = {"eager": ["--residual-attention-impl", "eager"],
                "concat": ["--residual-attention-impl", "concat"], "auto": []}[route]  # fmt: skip
        tail = row["argv"][len(row["argv"]) - len(impl) :] if impl else []
        assert tail == impl and ("--residual-attention-impl" in row["argv"]) is bool(impl)
        assert len(row["train_wps"]["baseline"]) == len(row["train_wps"]["realformer"]) == 1
        assert row["updates_skipped"] == {"baseline": 0, "realformer": 0}
        assert 0.5 < row["ratios"]["peak_memory"] < 2


def test_a_run_stopped_part_way_keeps_the_rows_it_measured(monkeypatch, tmp_path):
    """The JSON is written whole after every row: a failure at the second route leaves the
    first route's row on disk."""
    monkeypatch.setitem(gpu_check.SMOKE, "cases", {"long_2048": gpu_cases.SMOKE_CASES["long_2048"]})
    real = gpu_cases.measure_pair
    measured = []

    def fails_second(*args, **kwargs):
        if measured:
            raise RuntimeError("killed")
        measured.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gpu_cases, "measure_pair", fails_second)
    out = tmp_path / "gpu_check.json"
    with pytest.raises(RuntimeError, match="killed"):
        gpu_check.main(["--smoke", "--parts", "cases", "--out", str(out)])
    report = json.loads(out.read_text())
    assert list(report["cases"]) == ["long_2048 fp16 eager"]
    row = report["cases"]["long_2048 fp16 eager"]
    assert (row["step"], row["optimizer"]) == (
        "fairseq.trainer.Trainer.train_step",
        "FP16Optimizer",
    )


# case -> (baseline arch, realformer arch, precision flag, layers, width, heads, tokens or blocks)
EXPECTED_CASES = {
    "wmt_big": ("transformer_vaswani_wmt_en_fr_big", "realformer_transformer", ["fp16"],
                (6, 6), 1024, 16, 4096),
    "admin_60_12": ("admin_transformer_wmt_en_fr_60_12", "realformer_wmt_en_fr_60_12", ["fp16"],
                    (60, 12), 512, 8, 4096),
    "bert_base_512": ("roberta_base", "realformer_bert_base", ["bf16", "fp16"], (12,), 768, 12,
                      (32, 512)),
    "long_2048": ("roberta_base", "realformer_bert_base", ["fp16"], (12,), 768, 12, (8, 2048)),
    "long_4096": ("roberta_base", "realformer_bert_base", ["fp16"], (12,), 768, 12, (4, 4096)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED_CASES))
def test_the_gpu_cases_reach_fairseqs_arguments_at_the_users_sizes(name):
    """On a GPU: the flags a user types (--fp16 flattened: no --fp16-no-flatten-grads; --bf16),
    the sizes, the positions for the case's length, for both models of the case."""
    base, real, dtypes, layers, width, heads, batch = EXPECTED_CASES[name]
    case = gpu_cases.CASES[name]
    assert (case["baseline"], case["realformer"], list(case["dtypes"])) == (base, real, dtypes)
    if case["task"] == "translation":
        assert case["batch"]["max_tokens"] == batch
    else:
        assert (case["batch"]["sequences"], case["batch"]["length"]) == batch
    for arch in (base, real):
        for dtype in dtypes:
            argv = bench_trainer.trainer_argv(case["task"], arch, case["sizes"], dtype,
                                              gpu_cases.max_positions(case), "cuda")  # fmt: skip
            parser = options.get_training_parser(default_task=case["task"])
            args = options.parse_args_and_arch(parser, input_args=argv)
            assert args.arch == arch and (args.fp16, args.bf16) == (
                dtype == "fp16",
                dtype == "bf16",
            )
            assert not args.fp16_no_flatten_grads and not args.cpu
            assert args.encoder_embed_dim == width and args.encoder_attention_heads == heads
            got = (args.encoder_layers,) + ((args.decoder_layers,) if len(layers) == 2 else ())
            assert got == layers
            if case["task"] == "masked_lm":
                assert args.tokens_per_sample == args.max_positions == batch[1]


def test_the_wmt_batches_are_fairseqs_from_the_newstest_length_histogram():
    """Sentence lengths drawn from newstest2012-14's (Moses tokens + eos), cut at 4096 tokens
    by fairseq's batch_by_size (padded size at most max_tokens), several lengths per run."""
    case = gpu_cases.CASES["wmt_big"]
    dictionary = bench_trainer.dictionary_for("translation", 100)
    batches = gpu_cases.case_batches(case, dictionary)
    assert len(batches) == 4
    shapes = set()
    for b in batches:
        src, tgt = b["net_input"]["src_tokens"], b["target"]
        assert src.shape[0] * max(src.shape[1], tgt.shape[1]) <= 4096
        assert src.shape[0] * max(src.shape[1], tgt.shape[1]) > 4096 // 2
        shapes.add((src.shape[1], tgt.shape[1]))
    assert len(shapes) == 4
    lengths = bench_trainer.corpus_lengths(gpu_cases.NEWSTEST)
    assert len(lengths) == 3003 + 3000 + 3003
    # newstest2012's first line pair, counted by hand from the files
    assert lengths[0][0] == len(gpu_cases.NEWSTEST[0][0].read_text().splitlines()[0].split()) + 1


def test_the_sdpa_backend_is_read_from_the_profilers_names():
    assert bench_trainer.sdpa_backend(["aten::_flash_attention_forward", "x"], "cuda:0") == "flash"
    assert (
        bench_trainer.sdpa_backend(["void pytorch_flash::flash_fwd_kernel<...>"], "cuda") == "flash"
    )
    assert bench_trainer.sdpa_backend(["fmha_cutlassF_f16_aligned_64x64"], "cuda") == "efficient"
    assert bench_trainer.sdpa_backend(["cudnn_generated_fort_native_sdpa_sm90"], "cuda") == "cudnn"
    assert (
        bench_trainer.sdpa_backend(["aten::_scaled_dot_product_attention_math"], "cpu")
        == "math/cpu"
    )
    assert (
        bench_trainer.sdpa_backend(["aten::_scaled_dot_product_flash_attention_for_cpu"], "cpu")
        == "flash/cpu"
    )
    assert bench_trainer.sdpa_backend(["aten::bmm", "aten::softmax"], "cpu") == "none"
    # fairseq's translation step: cuDNN for self-attention, memory-efficient for cross
    both = ["cudnn_generated_fort_native_sdpa_sm90", "fmha_cutlassB_f16_aligned_64x64"]
    assert bench_trainer.sdpa_backend(both, "cuda") == "cudnn+efficient"


@pytest.mark.slow
def test_smoke_cases_run_every_case_through_fairseqs_step(tmp_path):
    """``python -m studies.gpu_check --smoke --parts cases``: every case, dtype and route."""
    out = tmp_path / "cases.json"
    stdout = run([sys.executable, "-m", "studies.gpu_check", "--smoke", "--parts", "cases",
                  "--out", out], timeout=900)  # fmt: skip
    report = json.loads(out.read_text())
    expected = {f"{name} {dtype} {route}" for name, (_, _, dtypes, *_rest) in EXPECTED_CASES.items()
                for dtype in dtypes for route in gpu_cases.ROUTES}  # fmt: skip
    assert set(report["cases"]) == expected
    for key, row in report["cases"].items():
        assert f"| {key} |" in stdout
        if "skipped" in row:
            assert row["route"] == "triton", key
            continue
        assert row["step"] == "fairseq.trainer.Trainer.train_step", key
        assert row["optimizer"] == "FP16Optimizer", key


@pytest.mark.parametrize(
    "dtype,optimizer,overrides",
    [
        ("bf16", "FP16Optimizer", ["common.tpu=False (fairseq 0.12 sets it with --bf16)"]),
        ("memory_efficient_fp16", "MemoryEfficientFP16Optimizer", []),
    ],
)
def test_the_precision_flags_build_fairseqs_optimizers(dtype, optimizer, overrides):
    """--bf16 (which fairseq 0.12 turns into --tpu: undone, and said) and
    --memory-efficient-fp16 build the optimizers fairseq-train builds from them; one step."""
    case = gpu_cases.SMOKE_CASES["long_2048"]
    dictionary = bench_trainer.dictionary_for("masked_lm", case["vocab"])
    bench = gpu_cases.build(case, "realformer_bert_base", dtype, "cpu", dictionary)
    assert (bench.optimizer_name, bench.overrides) == (optimizer, overrides)
    bench.train_step(gpu_cases.case_batches(case, dictionary)[0])
    assert bench.trainer.get_num_updates() == 1


def test_a_case_that_runs_out_of_memory_is_retried_at_its_fallback(monkeypatch):
    """admin_60_12: 60L-12L out of memory -> 18L-6L, said in the rows (fallback_used)."""
    import torch

    tried = []

    def fake_rows(name, case, dtype, device, timing, routes, on_row, predict, fallback_used,
                  rows_done):  # fmt: skip
        tried.append((case["sizes"]["enc_layers"], case["sizes"]["dec_layers"], fallback_used))
        if not fallback_used:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return {f"{name} {dtype} eager": {"sizes": case["sizes"], "fallback_used": fallback_used}}

    monkeypatch.setattr(gpu_cases, "dtype_rows", fake_rows)
    rows = gpu_cases.case_rows("admin_60_12", gpu_cases.CASES["admin_60_12"], "cuda",
                               gpu_cases.TIMING)  # fmt: skip
    assert tried == [(60, 12, False), (18, 6, True)]
    assert rows["admin_60_12 fp16 eager"]["fallback_used"] is True
