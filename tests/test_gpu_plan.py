"""The first GPU run, planned to the minute without a GPU (``studies.gpu_check --plan``,
``studies.gpu_plan``; RealFormer, He et al. arXiv 2012.11747): the parts in run order (the
triton route's exactness in training, the cases, the rest) with estimated seconds, Triton's
compiles from the seconds measured per kernel for sm_90, the last line ``estimated N s``, a
non-zero exit over the budget; on a GPU the same order, and parts that no longer fit are
skipped and said."""

import json
import re

import pytest

from studies import gpu_check, gpu_plan


def plan_output(capsys, *args):
    code = gpu_check.main(["--plan", *args])
    return code, capsys.readouterr()


def test_the_plan_fits_540_seconds_in_run_order(capsys):
    code, out = plan_output(capsys, "--budget", "540")
    lines = out.out.strip().splitlines()
    assert code == 0, out.err
    match = re.fullmatch(r"estimated (\d+) s", lines[-1])
    assert match and int(match.group(1)) <= 540
    names = [line.split(":")[0] for line in lines[1:-1]]
    assert names == [
        "start-up", "triton_training", "cases wmt_big", "cases admin_60_12",
        "cases bert_base_512", "cases long_2048", "cases long_4096", "precision", "train",
        "speed", "routes",
    ]  # fmt: skip
    # N is the start-up and the parts that run; the rest say they are skipped
    ran = [int(re.match(r".*?: (\d+) s \(", x).group(1)) for x in lines[1:-1] if "skipped" not in x]
    assert abs(sum(ran) - int(match.group(1))) <= len(ran)  # rounding of each line
    assert lines[-2].startswith("routes: skipped to stay within the budget (estimated ")


def test_the_plan_fails_when_the_budget_cannot_hold_the_required_parts(capsys):
    # one second short of the start-up and triton_training, as the full plan estimates them
    _, full = plan_output(capsys, "--budget", "100000")
    seconds = {
        line.split(":")[0]: int(re.match(r".*?: (\d+) s \(", line).group(1))
        for line in full.out.strip().splitlines()[1:-1]
    }
    budget = seconds["start-up"] + seconds["triton_training"] - 1
    code, out = plan_output(capsys, "--budget", str(budget))
    assert code == 1
    assert "triton_training: skipped to stay within the budget" in out.out
    assert out.err.strip().startswith(f"over the budget of {budget} s")
    assert re.fullmatch(r"estimated \d+ s", out.out.strip().splitlines()[-1])


def test_triton_compiles_are_estimated_from_the_measured_seconds_per_kernel():
    """The training check compiles, per dtype (fp16, bf16), per mask kind (causal, key
    padding) and configuration row (its lengths 45 and 337/811: short and long), two forward
    kernels, three key-block passes and a dq pass; and delta once per dtype."""
    measured = json.loads(gpu_plan.COMPILE_TIMES.read_text())
    assert measured["target"].startswith("sm_90") and measured["command"] and measured["date"]
    m = measured["median_seconds_per_kernel"]
    by_hand = 2 * (2 * 2 * (2 * m["forward"] + 3 * m["backward"] + m["dq"]) + m["delta"])
    seconds, why = gpu_plan.triton_training_estimate(gpu_check.FULL, m)
    assert seconds == pytest.approx(by_hand + 10.0)
    assert why.startswith(f"compiles {by_hand:.0f} s")


def test_a_budget_skips_what_no_longer_fits_and_says_so(monkeypatch, capsys):
    clock = [100.0]
    monkeypatch.setattr(gpu_plan.time, "time", lambda: clock[0])
    budget = gpu_plan.Budget(60)
    assert budget.allows("triton_training", 50)
    clock[0] += 45  # 15 s left
    assert not budget.allows("cases wmt_big", 20)
    assert budget.allows("cases long_2048", 15)
    assert budget.skipped == ["skipped cases wmt_big: estimated 20 s, 15 s of the budget left"]
    assert capsys.readouterr().out.strip() == budget.skipped[0]
    assert gpu_plan.Budget(None).allows("anything", 1e9)


def test_a_run_under_a_budget_skips_the_cases_that_do_not_fit_and_records_them(tmp_path, capsys):
    """On CPU at smoke sizes with a 1-second budget: no case fits (each builds models for a
    second or more), none runs, every one is said and written to the JSON's "skipped"."""
    out = tmp_path / "run.json"
    assert gpu_check.main(["--smoke", "--parts", "cases", "--budget", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert "cases" not in report
    names = [line.split(":")[0] for line in report["skipped"]]
    assert names == [f"skipped cases {n}" for n in gpu_check.SMOKE["cases"]]
    printed = capsys.readouterr().out
    assert all(line in printed for line in report["skipped"])
    assert report["parts"] == ["cases"]
