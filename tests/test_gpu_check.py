"""scripts/gpu_check.py --smoke: the GPU check's own code on CPU at toy sizes, so that it cannot
rot between the rare runs on a lent GPU. Data-bin from ../shared/data/enfr, fp16 fairseq-train
of the 60L-12L archs (overridden to 2L-2L), speed rows for fp16 and bf16 at two lengths."""

import json
import math
import subprocess
import sys

import pytest
import torch
from harness import REPO_ROOT, run

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.py"
ROWS = {f"2L-2L d32 {dtype} len{length}" for dtype in ("fp16", "bf16") for length in (8, 16)}
ARCHS = ("realformer_wmt_en_fr_60_12", "admin_transformer_wmt_en_fr_60_12")


def test_gpu_check_smoke(tmp_path):
    out = tmp_path / "gpu_check.json"
    stdout = run(
        [sys.executable, SCRIPT, "--smoke", "--out", out, "--work-dir", tmp_path / "work"],
        timeout=600,
    )
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
    for arch in ARCHS:
        result = training["runs"][arch]
        assert result["admin_line_seen"], arch
        assert result["omega_count"] == 10, arch  # 2 encoder x 2 + 2 decoder x 3 sublayers
        assert len(result["losses"]) == 5, arch  # 20 updates, logged every 4
        assert result["losses"][-1] < result["losses"][0], arch
    assert set(report["speed"]) == ROWS
    for name, row in report["speed"].items():
        for key in ("ratio_train_wps", "ratio_gen_sents_per_s", "ratio_peak_memory"):
            assert math.isfinite(row[key]) and row[key] > 0, (name, key)
        assert set(row["train_wps"]) == {"vanilla", "realformer"}
        assert row["peak_memory_bytes"]["realformer"] > row["peak_memory_bytes"]["vanilla"] > 0


def test_gpu_check_refuses_full_run_without_cuda():
    """Without a GPU the full check stops at once with an argparse error."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: run the full check instead")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].endswith(
        "no CUDA device; use --smoke for the CPU smoke run"
    )
