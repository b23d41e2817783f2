"""scripts/benchmark_speed.py at toy size: it runs, and its JSON has the documented schema
with positive finite ratios. (The full benchmark is not part of the test suite.)"""

import json
import math
import subprocess
import sys

from harness import REPO_ROOT, run

SCRIPT = REPO_ROOT / "scripts" / "benchmark_speed.py"
VARIANTS = (
    "vanilla",
    "vanilla_eager",
    "realformer",
    "realformer_sdpa",
    "realformer_baddbmm",
    "postln",
    "admin",
)
RATIOS = (
    "realformer/vanilla",
    "vanilla_eager/vanilla",
    "realformer/vanilla_eager",
    "realformer_sdpa/vanilla",
    "realformer_sdpa/realformer",
    "realformer_baddbmm/vanilla",
    "realformer_baddbmm/realformer",
    "realformer/admin",
    "admin/postln",
    "postln/vanilla",
)


def positive_finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_benchmark_speed_toy_schema(tmp_path):
    out = tmp_path / "speed.json"
    stdout = run(
        [
            sys.executable,
            SCRIPT,
            "--configs",
            "toy",
            "--repeats",
            "2",
            "--train-steps",
            "1",
            "--json",
            out,
        ],
        timeout=300,
    )
    assert "| config | ratio |" in stdout  # the printed table
    report = json.loads(out.read_text())
    for key in ("description", "memory_method", "machine", "settings", "targets", "configs"):
        assert key in report, key
    assert report["machine"]["torch_threads"] == 1
    assert report["machine"]["cpu_model"]
    res = report["configs"]["toy"]
    assert set(res["variants"]) == set(VARIANTS)
    for name, v in res["variants"].items():
        assert len(v["train_wps"]) == 2 and all(map(positive_finite, v["train_wps"])), name
        assert 0 < v["forward_peak_bytes"] and 0 < v["step_peak_bytes"]
        assert v["persistent_bytes"] == 3 * 4 * v["params"], name
        if name in ("realformer_sdpa", "realformer_baddbmm"):
            assert v["gen_sents_per_s"] is None  # they decode through the module's own path
        else:
            assert all(map(positive_finite, v["gen_sents_per_s"])), name
    # the residual-attention model really differs from vanilla: it has ADMIN omegas
    assert res["variants"]["realformer"]["params"] > res["variants"]["vanilla"]["params"]
    assert res["variants"]["postln"]["params"] == res["variants"]["vanilla"]["params"]
    assert set(res["ratios"]) == set(RATIOS)
    for key, entry in res["ratios"].items():
        assert positive_finite(entry["train_wps"]), key
        assert positive_finite(entry["peak_memory"]), key
        assert positive_finite(entry["forward_peak_memory"]), key
        assert len(entry["train_wps_per_repeat"]) == 2, key
        if "sdpa" not in key and "baddbmm" not in key:
            assert positive_finite(entry["gen_sents_per_s"]), key
    # the ratio is the median of per-repeat ratios of the recorded throughputs
    a, b = res["variants"]["realformer"]["train_wps"], res["variants"]["vanilla"]["train_wps"]
    expected = sorted(x / y for x, y in zip(a, b))
    assert math.isclose(res["ratios"]["realformer/vanilla"]["train_wps"], sum(expected) / 2)
    # the experimental formulations compute the same function as the module's own path
    for variant in ("sdpa", "baddbmm"):
        exact = res[f"{variant}_exactness"]
        assert exact["loss_abs_diff"] <= 1e-5 * max(1.0, abs(exact["loss"])), variant
        assert exact["grad_max_abs_diff"] <= 1e-4 * max(1.0, exact["grad_max_abs"]), variant


def test_attention_micro_toy(tmp_path):
    out = tmp_path / "micro.json"
    run(
        [sys.executable, SCRIPT, "--micro", "--configs", "toy", "--micro-repeats", "3",
         "--micro-iters", "2", "--json", out],
        timeout=300,
    )  # fmt: skip
    res = json.loads(out.read_text())["attention_micro"]["toy"]
    assert set(res["ms_median"]) == {
        "fairseq_fused",
        "fairseq_eager",
        "realformer",
        "realformer_sdpa",
        "realformer_baddbmm",
    }
    assert all(map(positive_finite, res["ms_median"].values()))
    assert "realformer/fairseq_fused" in res["ratios"]
    assert all(map(positive_finite, res["ratios"].values()))


def test_benchmark_speed_rejects_bad_arguments():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--repeats", "0"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "--repeats" in proc.stderr.splitlines()[-1]
