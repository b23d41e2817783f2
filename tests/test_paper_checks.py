"""``studies.paper_checks`` (RealFormer paper checks, He et al. arXiv 2012.11747): a run with a
result.json is skipped, never retrained; convergence speed on literal curves; the NMT part reads
the text the convergence study prepared and runs it as ``python -m studies.convergence``;
--report-only runs nothing; the study's word tokenizer splits as the runs of docs/ did."""

import json
from pathlib import Path

from harness import shared_data

from studies import convergence
from studies.paper_checks import config, driver, summary, training
from studies.text import LM_PUNCTUATION, split_words


def test_finished_run_is_skipped_for_the_same_definition_only(tmp_path, monkeypatch):
    def parse(*extra):
        return config.parse_args(["--work-dir", str(tmp_path), "--out", str(tmp_path / "out"),
                                  *extra])  # fmt: skip

    trained = []

    def fake_run(cmd, log_file, threads=1):
        trained.append(cmd)
        last = int(cmd[cmd.index("--max-update") + 1])
        stats = {"valid_loss": "5.0", "valid_accuracy": "10.0", "valid_num_updates": str(last)}
        return f"2026-12-07 05:00:00 | INFO | valid | {json.dumps(stats)}\n"

    monkeypatch.setattr(training, "run", fake_run)
    first = training.run_mlm("RealFormer", 2, 1e-3, tmp_path / "mlm-bin", parse())
    assert (first["completed_updates"], len(trained)) == (3000, 1)

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run must not be retrained")

    monkeypatch.setattr(training, "run", no_training)
    assert training.run_mlm("RealFormer", 2, 1e-3, tmp_path / "mlm-bin", parse()) == first
    monkeypatch.setattr(training, "run", fake_run)  # another budget: trained again
    again = training.run_mlm(
        "RealFormer", 2, 1e-3, tmp_path / "mlm-bin", parse("--max-update", "40")
    )
    assert (again["completed_updates"], len(trained)) == (40, 2)


def test_updates_to_reach():
    curve = [{"update": 40, "loss": 7.0}, {"update": 80, "loss": 6.0}, {"update": 120, "loss": 5.5}]
    assert summary.updates_to_reach(curve, 6.0) == 80
    assert summary.updates_to_reach(curve, 5.0) is None


def test_nmt_part_runs_the_convergence_study_and_reads_its_text(tmp_path, monkeypatch):
    """The NMT part's attention input is the BPE'd test set that convergence's preparation
    writes (prepare_multi30k.sh --work-dir P leaves it in P/final/)."""
    commands = []
    monkeypatch.setattr(convergence.runs, "run", lambda cmd, *a, **k: commands.append(cmd))
    work = tmp_path / "work"
    convergence.prepare_data(Path("/data"), work, 100, {})
    prep_dir = Path(commands[0][commands[0].index("--work-dir") + 1])
    assert convergence.prepared_text(work, "test", "en") == prep_dir / "final" / "test.en"

    cfg = config.parse_args(["--work-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    started, inputs = [], []
    monkeypatch.setattr(training, "run", lambda cmd, *a, **k: started.append(cmd))
    monkeypatch.setattr(
        training, "attention_stats", lambda ckpt, inp, *a, target=None: inputs.append((inp, target))
    )
    monkeypatch.setattr(training, "load_attn", lambda out: {})
    (tmp_path / "nmt").mkdir()
    training.run_nmt(cfg)
    nmt_work = tmp_path / "nmt" / "work"
    assert [str(c) for c in started[0][1:]] == [
        "-m", "studies.convergence", "--work-dir", str(nmt_work), "--out", str(tmp_path / "nmt"),
        "--variants", "ADMIN", "RealFormer+ADMIN", "--seeds", "1", "--max-update", "1500",
        "--valid-every", "375", "--jobs", "2", "--keep-checkpoints",
    ]  # fmt: skip
    assert {i for i, _ in inputs} == {nmt_work / "prep" / "final" / "test.en"}
    assert {t for _, t in inputs} == {nmt_work / "prep" / "final" / "test.fr"}


def test_report_only_reads_every_part_without_running(tmp_path, monkeypatch):
    """--report-only with the NMT part finished (its job has no LR or seed) and no MLM runs:
    nothing trains, the report is written."""
    (tmp_path / "nmt").mkdir()
    (tmp_path / "nmt" / "attn_done.json").write_text("{}")
    monkeypatch.setattr(driver, "prepare_mlm_data", lambda *a: tmp_path / "mlm-bin")

    def no_training(*args, **kwargs):
        raise AssertionError("--report-only must not run anything")

    monkeypatch.setattr(training, "run", no_training)
    monkeypatch.setattr(driver, "run_mlm", no_training)
    monkeypatch.setattr(driver, "run_nmt", no_training)
    reported = {}
    monkeypatch.setattr(
        driver,
        "report",
        lambda mlm, sweep, nmt, cfg, t0: reported.update(nmt=nmt) or {"mlm_table": {}},
    )
    driver.main(["--work-dir", str(tmp_path), "--out", str(tmp_path / "out"), "--report-only"])
    assert reported == {"nmt": {}}


def test_the_word_tokenizer_splits_as_the_studies_did():
    """paper_checks split every punctuation character (``\\w+|[^\\w\\s]``); the LM studies only
    ``.,!?;:"()`` (re.sub(r'([.,!?;:"()])', r' \\1 ', ...)): the same outputs, written out."""
    line = "Tom's \"old\" car (red), isn't it?  Yes: 3.5-ton!"
    assert split_words(line) == "tom ' s \" old \" car ( red ) , isn ' t it ? yes : 3 . 5 - ton !"
    assert split_words(line, LM_PUNCTUATION) == (
        "tom's \" old \" car ( red ) , isn't it ? yes : 3 . 5-ton !"
    )
    # and on the first lines of the data the LM studies tokenise
    import re

    with open(shared_data("multi30k", "train.en"), encoding="utf-8") as fh:
        lines = [next(fh) for _ in range(200)]
    for x in lines:
        assert split_words(x, LM_PUNCTUATION) == " ".join(
            re.sub(r"([.,!?;:\"()])", r" \1 ", x.lower()).split()
        )
        assert split_words(x) == " ".join(re.findall(r"\w+|[^\w\s]", x.lower()))
