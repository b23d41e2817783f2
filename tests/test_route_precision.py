"""The precision check of the two routes of RealFormer's residual attention (He et al. 2020,
arXiv 2012.11747), ``studies.route_precision`` (part 0 of ``studies.gpu_check``): both routes
pass on every SDPA kernel this CPU has, and the check fails, with exit status 1, on a planted
wrong route: the one an H200 showed (issue 35: a kernel that turns the mask fill into -inf,
without the route's own handling of fully masked rows, returned zeros for fully padded
sequences), and a running mean divided by the wrong count."""

import math

import pytest
import torch
import torch.nn.functional as F

from realformer_fairseq.modules.routes import concat as residual_attention
from studies import gpu_check, route_precision

SDPA = F.scaled_dot_product_attention  # torch's, before any test replaces it

CPU_KERNELS = {  # what the concat route runs on this CPU with each SDPA kernel enabled
    "math": {"eager, because no fused kernel for these shapes and dtype (SDPA would use math)",
             "eager, the chain's stream"},
    "flash": {"fused SDPA, flash"},
    "efficient": {"eager, because no fused kernel for these shapes and dtype (SDPA would use "
                  "math)", "eager, the chain's stream"},
    "cudnn": {"eager, because no fused kernel for these shapes and dtype (SDPA would use math)",
              "eager, the chain's stream"},
}  # fmt: skip


def errors_of(report, route, kernel=None):
    """{(dtype, case, sequence): error} of one route (and kernel)."""
    out = {}
    for dtype, rows in report["dtypes"].items():
        cases = rows[route] if kernel is None else rows[route][kernel]
        for case, errors in cases.items():
            for seq in route_precision.SEQUENCES:
                out[(dtype, case, seq)] = errors[seq]
    return out


def test_both_routes_pass_on_every_cpu_kernel():
    report = route_precision.check("cpu", ["float32", "fp16", "bf16"], length=8)
    assert report["passed"] is True
    for dtype in ("float32", "fp16", "bf16"):
        for kernel, ran in CPU_KERNELS.items():
            for case in route_precision.CASES:
                assert set(report["dtypes"][dtype]["concat"][kernel][case]["ran"]) == ran
    # float32: both routes within 1e-5 of float64 on every sequence (5e-7 measured)
    for route, kernel in (("eager", None), ("concat", "flash"), ("concat", "math")):
        for key, error in errors_of(report, route, kernel).items():
            if key[0] == "float32":
                assert error < 1e-5, (route, kernel, key, error)


def kernel_that_makes_the_fill_minus_infinity(q, k, v, attn_mask=None, **kwargs):
    """What the memory-efficient and cuDNN kernels did on an H200 with a fill of
    finfo(float32).min: scaled by log2(e) it is -inf, and a row of -inf gives no weights
    (zeros) where the eager route gives the mean of the values."""
    if attn_mask is not None:
        attn_mask = attn_mask.masked_fill(attn_mask <= -1e30, float("-inf"))
    return torch.nan_to_num(SDPA(q, k, v, attn_mask=attn_mask, **kwargs))


@pytest.fixture
def h200_failure(monkeypatch):
    monkeypatch.setattr(
        residual_attention.F, "scaled_dot_product_attention",
        kernel_that_makes_the_fill_minus_infinity,
    )  # fmt: skip
    monkeypatch.setattr(
        residual_attention.ConcatRealformerMultiheadAttention,
        "_fully_masked_rows_as_eager", lambda self, out, mask, fill, v4: out,
    )  # fmt: skip


def test_the_check_fails_on_the_route_the_h200_showed(h200_failure):
    report = route_precision.check("cpu", ["float32"], length=8)
    assert report["passed"] is False
    flash = errors_of(report, "concat", "flash")
    for case in route_precision.CASES:
        assert flash[("float32", case, "fully padded")] > 0.3, case  # zeros, not the mean
        assert flash[("float32", case, "unpadded")] < 1e-5, case
    # with the causal mask the first rows of a left-padded sequence see only padding
    assert flash[("float32", "decoder self-attention (causal)", "left half padded")] > 0.3
    # the eager route and the routes that ran eager are untouched
    assert max(errors_of(report, "eager").values()) < 1e-5
    assert max(errors_of(report, "concat", "math").values()) < 1e-5
    lines = route_precision.summary_lines(report)
    assert [line.split(" (")[0] for line in lines if line.startswith("FAIL")] == [
        "FAIL precision float32 concat, SDPA flash"
    ]


def test_the_route_handles_such_a_kernel_itself():
    """The same kernel with the route as it is: fully masked rows are set by the route."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            residual_attention.F, "scaled_dot_product_attention",
            kernel_that_makes_the_fill_minus_infinity,
        )  # fmt: skip
        report = route_precision.check("cpu", ["float32"], length=8)
    assert report["passed"] is True


def test_the_check_fails_on_a_running_mean_divided_by_the_wrong_count(monkeypatch):
    def off_by_one(q, k, v, attn_mask=None, dropout_p=0.0, scale=None):
        return SDPA(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            scale=None if scale is None else scale * 2 / (2 + scale),
        )  # 1/(l+2)

    monkeypatch.setattr(residual_attention.F, "scaled_dot_product_attention", off_by_one)
    report = route_precision.check("cpu", ["float32"], length=8)
    assert report["passed"] is False
    assert max(errors_of(report, "concat", "flash").values()) > 1e-3


def test_gpu_check_exits_1_on_a_planted_wrong_route_and_0_on_the_real_ones(
    tmp_path, monkeypatch, capsys
):
    args = ["--smoke", "--parts", "precision", "--out", str(tmp_path / "check.json"),
            "--work-dir", str(tmp_path / "work")]  # fmt: skip
    assert gpu_check.main(args) == 0
    assert "PASS precision_of_both_routes_on_every_kernel" in capsys.readouterr().out
    monkeypatch.setattr(
        residual_attention.F, "scaled_dot_product_attention",
        kernel_that_makes_the_fill_minus_infinity,
    )  # fmt: skip
    monkeypatch.setattr(
        residual_attention.ConcatRealformerMultiheadAttention,
        "_fully_masked_rows_as_eager", lambda self, out, mask, fill, v4: out,
    )  # fmt: skip
    assert gpu_check.main(args) == 1
    out = capsys.readouterr().out
    assert "FAIL precision_of_both_routes_on_every_kernel" in out
    assert "FAIL precision fp16 concat, SDPA flash" in out


def test_the_tolerances_are_stated_per_dtype():
    assert route_precision.TOLERANCE == {"float32": 1e-4, "fp16": 1e-2, "bf16": 5e-2}
    assert all(math.isfinite(t) for t in route_precision.TOLERANCE.values())
