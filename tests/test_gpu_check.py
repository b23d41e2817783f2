"""``studies.gpu_check``, the GPU check of RealFormer+ADMIN (He et al. 2020, arXiv 2012.11747;
Liu et al. 2020, arXiv 2008.07772) in fp16/bf16: what its checks conclude from a fairseq log,
the exact fairseq-train command of its runs (the smoke sizes reach the model), the refusal
without CUDA. The ``--smoke`` run (its own code on CPU at toy sizes: data-bin from
../shared/data/enfr, fp16 fairseq-train, speed rows for fp16 and bf16) is under ``-m slow``, so
that it cannot rot between the rare runs on a lent GPU (CI runs it)."""

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from fairseq import options
from harness import run

from realformer_fairseq.settings import triton_installed
from studies import gpu_check

if triton_installed():  # the triton part's kernels on CPU: Triton's interpreter, read at import
    os.environ.setdefault("TRITON_INTERPRET", "1")


def train_inner(loss: float) -> str:
    return f'2026-12-02 | INFO | train_inner | {{"epoch": 1, "loss": "{loss}", "ups": "3.1"}}'


ADMIN_LINE = "INFO | realformer_fairseq | ADMIN profiling done on the first training batch: 10 ..."
OVERFLOW = "INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, ..."


def test_training_checks_read_the_log_and_the_omega_file(tmp_path):
    omega = tmp_path / "omega.json"
    omega.write_text(json.dumps({"omega": {"encoder.0": 1.0, "encoder.1": 1.5}}))
    log = "\n".join(
        [ADMIN_LINE, train_inner(9.0), OVERFLOW, train_inner(7.5), OVERFLOW]
        + [train_inner(x) for x in (6.0, 5.0, 4.0)]
    )
    assert gpu_check.check_training(log, omega) == {
        "admin_line_seen": True,
        "omega_count": 2,
        "omega_finite": True,
        "losses": [9.0, 7.5, 6.0, 5.0, 4.0],
        "loss_fell": True,  # mean of the last three (5.0) below the first (9.0)
        "overflow_skips": 2,
    }
    # a rising loss, a NaN omega, no ADMIN line
    omega.write_text(json.dumps({"omega": {"encoder.0": 1.0, "encoder.1": float("nan")}}))
    bad = gpu_check.check_training("\n".join(train_inner(x) for x in (4.0, 4.5, 6.0, 3.0)), omega)
    assert (bad["admin_line_seen"], bad["omega_finite"], bad["loss_fell"]) == (False, False, False)
    missing = gpu_check.check_training(train_inner(4.0), tmp_path / "none.json")
    assert (missing["omega_count"], missing["omega_finite"], missing["loss_fell"]) == (
        0,
        False,
        False,
    )


@pytest.mark.parametrize("mode", ["full", "smoke"])
def test_the_training_runs_are_fp16_admin_radam_at_the_stated_sizes(mode):
    cfg = {"full": gpu_check.FULL, "smoke": gpu_check.SMOKE}[mode]
    for arch in gpu_check.MODELS_60_12:
        cmd = gpu_check.train_command(cfg, Path("data-bin"), arch, Path("out"))
        parser = options.get_training_parser(default_task="translation")
        args = options.parse_args_and_arch(parser, input_args=[str(c) for c in cmd[1:]])
        assert (args.arch, args.fp16, args.init_type, args.optimizer) == (
            arch,
            True,
            "admin",
            "radam",
        )
        assert args.admin_profile_out == str(Path("out") / "omega.json")
        assert (args.max_update, args.max_tokens) == (cfg["max_update"], cfg["max_tokens"])
        layers = (args.encoder_layers, args.decoder_layers, args.encoder_embed_dim)
        assert layers == {"full": (60, 12, 512), "smoke": (2, 2, 32)}[mode]
        assert args.cpu is (mode == "smoke")


def test_gpu_check_refuses_full_run_without_cuda(capsys):
    """Without a GPU the full check stops at once with an argparse error."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: run the full check instead")
    with pytest.raises(SystemExit) as err:
        gpu_check.main([])
    assert err.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith("no CUDA device; use --smoke for the CPU smoke run")
    )


@pytest.mark.slow
def test_gpu_check_smoke(tmp_path):
    out = tmp_path / "gpu_check.json"
    stdout = run(
        [sys.executable, "-m", "studies.gpu_check", "--smoke", "--out", out,
         "--work-dir", tmp_path / "work"],
        timeout=600,
    )  # fmt: skip
    assert "| size, dtype, length |" in stdout and "PASS loss_fell" in stdout
    report = json.loads(out.read_text())
    assert report["smoke"] is True
    training = report["training"]
    assert training["checks"] == {
        "admin_line_seen": True,
        "omega_finite": True,
        "loss_fell": True,
        "overflow_skips_not_above_admin": True,
    }
    for arch in gpu_check.MODELS_60_12:
        result = training["runs"][arch]
        assert result["omega_count"] == 10, arch  # 2 encoder x 2 + 2 decoder x 3 sublayers
        assert len(result["losses"]) == 5, arch  # 20 updates, logged every 4
    rows = {f"2L-2L d32 {dtype} len{length}" for dtype in ("fp16", "bf16") for length in (8, 16)}
    assert set(report["speed"]) == rows
    for name, row in report["speed"].items():
        assert set(row["ratios"]) == {"realformer/vanilla"}
        for key, value in row["ratios"]["realformer/vanilla"].items():
            assert math.isfinite(value) and value > 0, (name, key)
        assert set(row["train_wps"]) == {"vanilla", "realformer"}
        memory = row["peak_memory_bytes"]
        assert (
            row["ratios"]["realformer/vanilla"]["peak_memory"]
            == memory["realformer"] / memory["vanilla"]
        )


def test_routes_part_measures_the_three_routes(monkeypatch, capsys):
    """Part 4 at smoke sizes on CPU (the same code as on a GPU): every route beside fairseq's
    transformer, the kernels that ran, the switch depths; the concat route fused where it
    could (the CPU's flash kernel), the eager variant and auto (eager on a machine without a
    measured rule: the plain module, no kernel to report) never. The triton route's part
    (its own test below) is one skipped line where triton is not installed."""
    monkeypatch.setattr(gpu_check, "triton_installed", lambda: False)
    result = gpu_check.routes_part(gpu_check.SMOKE)
    skipped = (
        "triton route: skipped, triton is not installed (pip install -e '.[triton]' in the "
        "clone (CUDA builds of torch ship triton))"
    )
    assert result["triton"] == {"skipped": skipped}
    assert capsys.readouterr().out.splitlines() == [skipped]
    rows = result["models"]
    assert set(rows) == {f"2L-2L d32 {d} len{n}" for d in ("fp16", "bf16") for n in (8, 16)}
    for name, row in rows.items():
        assert row["batch_sentences"] == {"len8": 8, "len16": 4}[name.split()[-1]]  # 64 tokens
        assert set(row["ratios"]) == {
            f"{v}/vanilla" for v in ("realformer_eager", "realformer_concat", "realformer")
        }
        for r in row["ratios"].values():
            for key, value in r.items():
                if key != "gen_sents_per_s":  # not measured in part 4
                    assert 1 / 50 < value < 50, (name, key, value)
        assert row["kernels"]["realformer_eager"] == [] and row["kernels"]["realformer"] == []
        assert row["kernels"]["realformer_concat"] == [  # the last layer's alignment weights
            "eager, because the attention probabilities are asked for (need_weights)",
            "fused SDPA, flash",
        ], name
        # studies.triton_cost's prediction beside the measurement, scaled to this row's own
        # vanilla (CPU: the H100's ceilings, said so); the eager route modelled, the others not
        predicted = row["predicted"]
        assert set(predicted) == {"gpu", "realformer_eager"}, name
        assert predicted["gpu"] == "H100 SXM (assumed for cpu)"
        eager, measured = predicted["realformer_eager"], row["ratios"]["realformer_eager/vanilla"]
        assert (
            eager["measured_over_predicted_speed"]
            == measured["train_wps"] / eager["predicted_speed"]
        )
        assert (
            eager["measured_over_predicted_memory"]
            == measured["peak_memory"] / eager["predicted_memory"]
        )
        assert 0 < eager["predicted_speed"] < 1 < eager["predicted_memory"], (name, eager)
    gpu_check.print_predictions(result)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("measured / predicted (studies.triton_cost, H100 SXM (assumed")
    assert len(lines) == 3 + 4  # the header, a row per dtype and length
    row = rows["2L-2L d32 fp16 len8"]
    r, pr = row["ratios"]["realformer_eager/vanilla"], row["predicted"]["realformer_eager"]
    assert lines[3] == (
        f"| routes 2L-2L d32 fp16 len8 | realformer_eager/vanilla | {r['train_wps']:.3f} / "
        f"{pr['predicted_speed']:.3f} = {pr['measured_over_predicted_speed']:.2f} | "
        f"{r['peak_memory']:.2f} / {pr['predicted_memory']:.2f} = "
        f"{pr['measured_over_predicted_memory']:.2f} | {pr['measured_extra_step_ms']:.1f} / "
        f"{pr['predicted_extra_step_ms']:.1f} |"
    )
    for name, rule_rows in result["rule"].items():
        assert [r["length"] for r in rule_rows] == [8, 16], name
        for r in rule_rows:
            assert set(r["time_ratio_vs_eager"]) == {0, 1, 2}
            assert r["concat_kernels"] == ["fused SDPA, flash"], name
            assert r["best_switch_depth"] in (0, 1, 2)


@pytest.mark.triton
@pytest.mark.skipif(
    not triton_installed(), reason="triton is not installed (pip install -e '.[triton]')"
)
def test_triton_part_measures_the_triton_route_and_its_precision():
    """Part 4's triton route at smoke sizes, its kernels under Triton's interpreter: speed and
    memory rows against vanilla and the eager route, fp16 and bf16, with studies.triton_cost's
    predictions; the kernel ran in every residual attention, the alignment layer's
    cross-attention (its probabilities asked for) included; the float32 errors against float64
    eager within the tolerance; and the part in training (dropout, run twice)."""
    result = gpu_check.triton_part(gpu_check.SMOKE)
    rows = result["models"]
    assert set(rows) == {f"2L-2L d32 {d} len16" for d in ("fp16", "bf16")}
    for name, row in rows.items():
        assert set(row["ratios"]) == {"realformer_eager/vanilla", "realformer_triton/vanilla"}
        for r in row["ratios"].values():
            assert 0 < r["train_wps"] and 1 / 50 < r["peak_memory"] < 50, (name, r)
        assert row["kernels"]["realformer_triton"] == ["fused Triton kernel"], name
        assert set(row["predicted"]) == {"gpu", "realformer_eager", "realformer_triton"}
    precision = result["precision"]
    assert precision["passed"] and set(precision["dtypes"]) == {"float32"}
    for case in precision["dtypes"]["float32"].values():
        assert case["ran"] == ["fused Triton kernel"]
        assert max(case["output"].values()) < 1e-4 and max(case["gradient"].values()) < 1e-4
    # in training: attention dropout 0.1, 17 tokens (two blocks of 16 in the interpreter, the
    # last ragged), fp16 and bf16, against float64 eager with the kernels' own masks; two runs
    # from one seed identical; the masks visibly drop (a wrong mask would be off by as much)
    training = gpu_check.triton_training_part(gpu_check.SMOKE)  # a GPU run's first part
    assert training["passed"] and (training["lengths"], training["dropout"]) == ([17], 0.1)
    assert (training["head_size"], training["layers"]) == (16, 2)
    assert set(training["dtypes"]) == {"fp16", "bf16"}
    for dtype, tol in (("fp16", 1e-2), ("bf16", 5e-2)):
        cases = training["dtypes"][dtype]
        assert set(cases) == {
            "decoder self-attention (causal), length 17",
            "encoder self-attention, length 17",
            "cross-attention, length 17",
        }
        for name, case in cases.items():
            assert case["ran"] == ["fused Triton kernel"] and case["run_to_run"] == 0.0, name
            assert max(case["output"].values()) < tol and max(case["gradient"].values()) < tol
            assert case["dropout_effect"] > 0.1, name
