"""``studies.runs``, what every training study shares: a stored result is reused only for the run
it is of (command, data, settings), in the studies of run_seeds and in glue_pairs_margins; a
failed run never cancels the others, only fairseq's own NaN/Inf stop is a divergence, and every
study logs with times at INFO through one helper."""

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO_ROOT

from studies import runs


def study_args(work: Path, **changes) -> argparse.Namespace:
    values = dict(work_dir=work, out=work, seeds=[1, 2], variants=["A", "B"], jobs=1, force=False,
                  quick=False, data=Path("/somewhere"), max_update=4, lr=1e-3)  # fmt: skip
    return argparse.Namespace(**{**values, **changes})


class Study:
    """A run_one and its training command that record what they were asked to do."""

    def __init__(self, fail=()):
        self.calls, self.fail = [], set(fail)

    def command(self, label, seed, data, run_dir, args):
        return ["fairseq-train", data, "--max-update", args.max_update, "--save-dir", run_dir]

    def run_one(self, label, seed, data, run_dir, args):
        self.calls.append((label, seed))
        if (label, seed) in self.fail:
            raise runs.StudyError(f"{label} {seed} broke\nsecond line")
        return {"variant": label, "seed": seed, "max_update": args.max_update}

    def run(self, data, args):
        return runs.run_seeds(self.run_one, data, args, {"A": "a", "B": "b"},
                              command=self.command)  # fmt: skip


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "data-bin"
    folder.mkdir()
    (folder / "train.bin").write_bytes(b"\x01\x02")
    (folder / "preprocess.log").write_text("2026-12-07 05:00:00 | a time\n")
    return folder


def test_one_failed_run_cancels_no_other_and_all_failures_are_listed(tmp_path, data):
    study = Study(fail={("A", 1), ("B", 2)})
    with pytest.raises(runs.RunsFailed) as err:
        study.run(data, study_args(tmp_path))
    assert study.calls == [("A", 1), ("B", 1), ("A", 2), ("B", 2)]  # seed-major, all of them
    assert str(err.value).splitlines() == [
        "2 of 4 runs failed (the others are stored; the same command trains the failed ones "
        "again):",
        "A seed 1: A 1 broke",
        "B seed 2: B 2 broke",
    ]
    stored = sorted(p.parent.name for p in (tmp_path / "runs").glob("*/result.json"))
    assert stored == ["a_seed2", "b_seed1"]
    assert "A 1 broke" in runs.read_json(tmp_path / "runs" / "a_seed1" / "error.json")["error"]
    # the next start trains the failed ones only
    again = Study()
    assert [r["seed"] for r in again.run(data, study_args(tmp_path))] == [1, 1, 2, 2]
    assert again.calls == [("A", 1), ("B", 2)]
    assert not (tmp_path / "runs" / "a_seed1" / "error.json").exists()


def test_a_stored_result_is_reused_only_for_the_same_command_data_and_settings(tmp_path, data):
    Study().run(data, study_args(tmp_path))
    # which runs and how many at a time, where the folders are, the data's log: the same runs
    same = Study()
    same.run(data, study_args(tmp_path, jobs=2, seeds=[2], variants=["B"], force=False))
    (data / "preprocess.log").write_text("2026-12-07 06:00:00 | another time\n")
    same.run(data, study_args(tmp_path))
    assert same.calls == []
    # another budget: trained again, the old folder kept aside
    budget = Study()
    results = budget.run(data, study_args(tmp_path, max_update=6))
    assert budget.calls == [("A", 1), ("B", 1), ("A", 2), ("B", 2)]
    assert [r["max_update"] for r in results] == [6, 6, 6, 6]
    old = runs.read_json(tmp_path / "runs" / "a_seed1.superseded" / "result.json")
    assert old["max_update"] == 4
    # other data bytes, or a setting outside the command (here --lr): trained again
    (data / "train.bin").write_bytes(b"\x01\x03")
    other_data = Study()
    other_data.run(data, study_args(tmp_path, max_update=6, seeds=[1], variants=["A"]))
    assert other_data.calls == [("A", 1)]
    other_lr = Study()
    other_lr.run(data, study_args(tmp_path, max_update=6, seeds=[1], variants=["A"], lr=3e-3))
    assert other_lr.calls == [("A", 1)]


def test_a_result_stored_without_its_definition_is_not_reused(tmp_path, data, caplog):
    run_dir = tmp_path / "runs" / "a_seed1"
    run_dir.mkdir(parents=True)
    runs.write_json(run_dir / "result.json", {"variant": "A", "seed": 1, "max_update": 600})
    study = Study()
    assert study.run(data, study_args(tmp_path, seeds=[1], variants=["A"]))[0]["max_update"] == 4
    assert study.calls == [("A", 1)]
    assert "differs in: no definition stored" in caplog.text


def test_report_only_reports_the_stored_runs_of_the_definition_asked_for(tmp_path, data, caplog):
    """run_seeds(report_only=True) (lm_comparison, pretrain_comparison, glue_pairs --report-only):
    nothing runs; a stored run of another definition is left out with a WARNING naming what
    differs, a missing one is left out."""
    Study().run(data, study_args(tmp_path, seeds=[1], variants=["A", "B"]))
    report = Study()

    def report_only(**changes):
        args = study_args(tmp_path, seeds=[1, 2], **changes)
        return runs.run_seeds(report.run_one, data, args, {"A": "a", "B": "b"}, True,
                              command=report.command)  # fmt: skip

    reported = [{k: v for k, v in r.items() if k != "definition"} for r in report_only()]
    assert reported == [
        {"variant": "A", "seed": 1, "max_update": 4},
        {"variant": "B", "seed": 1, "max_update": 4},
    ]
    caplog.clear()
    assert report_only(max_update=6) == []
    assert report.calls == []
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"{tmp_path}/runs/{name}_seed1/result.json is another run's (differs in: command, "
        "--max-update): not reported"
        for name in ("a", "b")
    ]


def fake_glue_margins(monkeypatch, tmp_path):
    """studies.glue_pairs_margins with one condition and its commands faked: pre-training
    leaves a checkpoint that says its --max-update, evaluate.sh dev accuracy 97.5 (majority
    50) and test predictions 1 0 for labels 1 1; returns the scripts run, by name."""
    from studies import glue_pairs, glue_pairs_margins

    monkeypatch.setattr(glue_pairs_margins, "CONDITIONS", [("any-french", False, (1,))])

    def build_task(data_root, out, sizes, kind="translation", blank_first=False):
        out.mkdir(parents=True, exist_ok=True)
        (out / "test_labels.txt").write_text("1\n1\n")
        return {"glue_dir": out}

    def prepare_pretraining(raw, work, merges):
        (work / "mlm-bin").mkdir(parents=True, exist_ok=True)
        (work / "mlm-bin" / "train.bin").write_bytes(b"pretraining tokens")
        return work / "bpecodes", work / "mlm-bin"

    ran = []

    def run(cmd, log_file, threads=1):
        cmd = [str(c) for c in cmd]
        ran.append(Path(cmd[1] if cmd[0] == "bash" else cmd[0]).name)
        if ran[-1] == "fairseq-train":
            save = Path(cmd[cmd.index("--save-dir") + 1])
            (save / "checkpoint_last.pt").write_text(cmd[cmd.index("--max-update") + 1])
        if ran[-1] == "evaluate.sh":
            out = Path(cmd[cmd.index("--out-dir") + 1])
            out.mkdir(parents=True, exist_ok=True)
            (out / "test.txt").write_text("1\n0\n")
            dev = {"metrics": {"accuracy": 97.5}, "majority_class": {"metrics": {"accuracy": 50}}}
            results = {
                "subsets": {"valid": dev},
                "test_predictions": {"test": str(out / "test.txt")},
            }
            (out / "results.dev.json").write_text(json.dumps(results))

    monkeypatch.setattr(glue_pairs, "build_task", build_task)
    monkeypatch.setattr(glue_pairs, "prepare_pretraining", prepare_pretraining)
    monkeypatch.setattr(runs, "run", run)
    return glue_pairs_margins, ran


def test_glue_pairs_margins_reuses_only_the_runs_of_its_configuration(
    tmp_path, monkeypatch, caplog
):
    margins, ran = fake_glue_margins(monkeypatch, tmp_path)
    argv = ["--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "out")]

    def accuracies(report):
        return [
            (r["task"], r["seed"], r["dev_accuracy"], r["test_accuracy"]) for r in report["runs"]
        ]

    assert accuracies(margins.main(argv)) == [("any-french", 1, 97.5, 50.0)]
    assert ran == ["fairseq-train", "prepare.sh", "finetune.sh", "evaluate.sh"]
    ran.clear()
    assert accuracies(margins.main(argv)) == [("any-french", 1, 97.5, 50.0)]
    assert ran == ["prepare.sh"]  # prepare.sh skips its own finished stages

    ran.clear()  # another fine-tuning budget: fine-tuned again, the old folder kept aside
    monkeypatch.setattr(margins, "FINETUNE", ["--lr", "5e-4", "--max-update", "400"])
    caplog.clear()
    margins.main(argv)
    assert ran == ["prepare.sh", "finetune.sh", "evaluate.sh"]
    run_dir = tmp_path / "work" / "any-french-seed1"
    assert (
        "--max-update 500"
        in runs.read_json(run_dir.with_name(run_dir.name + ".superseded") / "result.json")[
            "definition"
        ]["command"]
    )
    assert f"{run_dir}/result.json is another run's (differs in: command): not reused" in (
        caplog.text
    )
    ran.clear()  # another pre-training: pre-trained again, and its fine-tuning (other weights)
    monkeypatch.setattr(
        margins, "MLM", argparse.Namespace(**{**vars(margins.MLM), "mlm_updates": 50})
    )
    caplog.clear()
    margins.main(argv)
    assert ran == ["fairseq-train", "prepare.sh", "finetune.sh", "evaluate.sh"]
    assert (tmp_path / "work" / "mlm" / "checkpoint_last.pt").read_text() == "50"
    assert f"{run_dir}/result.json is another run's (differs in: data): not reused" in caplog.text
    ran.clear()  # a result stored by a version that wrote no definition
    stored = runs.read_json(run_dir / "result.json")
    runs.write_json(run_dir / "result.json", {k: v for k, v in stored.items() if k != "definition"})
    margins.main(argv)
    assert ran == ["prepare.sh", "finetune.sh", "evaluate.sh"]


# fairseq 0.12's tracebacks' last lines (fairseq/trainer.py, optim/dynamic_loss_scaler.py)
GRADIENTS = "FloatingPointError: gradients are Nan/Inf"
LOSS_SCALE = (
    "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding. "
    "Try lowering the learning rate, using gradient clipping or increasing the batch size."
)
WORKERS = "FloatingPointError: Fatal error: gradients are inconsistent between workers. Try"


@pytest.mark.parametrize(
    "last_line,stop",
    [(GRADIENTS, GRADIENTS), (LOSS_SCALE, LOSS_SCALE), (WORKERS, None),
     ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough "
      "memory", None), ("OSError: [Errno 28] No space left on device", None)],
)  # fmt: skip
def test_only_fairseqs_own_nan_inf_stop_is_a_divergence(last_line, stop):
    log = f"2026-12-07 05:00:00 | INFO | train_inner | {{}}\nTraceback (most recent call last):\n"
    assert runs.nan_inf_stop(f'{log}  File "trainer.py", line 970\n{last_line}\n') == stop


def test_a_killed_command_says_which_signal(tmp_path):
    with pytest.raises(runs.CommandFailed) as err:
        runs.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                 tmp_path / "x.log")  # fmt: skip
    assert err.value.returncode == -9
    assert str(err.value).startswith(f"command killed by signal SIGKILL, log {tmp_path / 'x.log'}")


# the studies that run through studies.runs, and the file of each one's ``__main__``
STUDIES = {
    "convergence": "convergence.py", "lm_comparison": "lm_comparison.py",
    "glue_pairs": "glue_pairs.py", "glue_pairs_margins": "glue_pairs_margins.py",
    "pretrain_comparison": "pretrain_comparison.py", "nmt_depth": "nmt_depth.py",
    "paper_checks": "paper_checks/__main__.py", "benchmark_speed": "benchmark_speed.py",
    "benchmark_lm": "benchmark_lm.py",
}  # fmt: skip
# one process start each (about 7 s here): one in the default suite, the others -m slow
PROCESS_CHECKED = [pytest.param(s, marks=[] if s == "lm_comparison" else pytest.mark.slow)
                   for s in ("convergence", "lm_comparison", "glue_pairs", "pretrain_comparison",
                             "nmt_depth")]  # fmt: skip


@pytest.mark.parametrize("study", STUDIES)
def test_every_study_starts_through_the_one_entry_helper(study):
    """Its ``__main__`` is ``runs.main_entry(\"studies.NAME\", main)``: logging with times at
    INFO (``configure_logging``) and a StudyError as the exit message."""
    tree = ast.parse((REPO_ROOT / "studies" / STUDIES[study]).read_text(encoding="utf-8"))
    calls = [
        node for node in ast.walk(tree) if isinstance(node, ast.Call)
        and ast.unparse(node.func) in ("runs.main_entry", "main_entry")
    ]  # fmt: skip
    assert [ast.unparse(c) for c in calls] in (
        [f"runs.main_entry('studies.{study}', main)"],
        [f"main_entry('studies.{study}', main)"],
    )
    assert "basicConfig" not in ast.unparse(tree)


@pytest.mark.parametrize("study", PROCESS_CHECKED)
def test_every_study_logs_with_times_at_info_and_exits_in_one_line(tmp_path, study):
    """Missing data: the study's first line is its work folder, with a time, at INFO (fairseq's
    import left the root logger at DEBUG without times), and the error is one line."""
    cmd = [sys.executable, "-m", f"studies.{study}", "--quick", "--data", str(tmp_path / "none"),
           "--work-dir", str(tmp_path / "work")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    assert re.match(rf"{stamp} \| INFO \| study \| work dir {tmp_path / 'work'}\n", proc.stdout), (
        proc.stdout + proc.stderr
    )
    assert "DEBUG" not in proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"studies.{study}: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
