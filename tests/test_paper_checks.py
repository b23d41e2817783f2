"""``studies.paper_checks`` (RealFormer paper checks, He et al. arXiv 2012.11747): a run with a
result.json of the definition asked for is reused, never retrained, one of another definition
is trained again in a fresh folder; --report-only runs nothing and reports only the stored runs
(MLM and NMT attention) of the definitions asked for, naming the others at WARNING; convergence
speed on literal curves; the NMT part reads the text the convergence study prepared and runs it
as ``python -m studies.convergence``; the study's word tokenizer splits as the runs of docs/
did."""

import json
import logging
from pathlib import Path

from harness import shared_data

from studies import convergence, runs
from studies.paper_checks import config, driver, summary, training
from studies.text import LM_PUNCTUATION, split_words


def fake_mlm_training(cmd, log_file, threads=1):
    """A fairseq-train of the MLM runs: one valid line at --max-update, loss 5 + seed/10."""
    last = int(cmd[cmd.index("--max-update") + 1])
    seed = int(cmd[cmd.index("--seed") + 1])
    stats = {"valid_loss": str(5 + seed / 10), "valid_accuracy": "10.0",
             "valid_num_updates": str(last)}  # fmt: skip
    return f"2026-12-07 05:00:00 | INFO | valid | {json.dumps(stats)}\n"


def no_training(*args, **kwargs):
    raise AssertionError("nothing may run here")


def test_finished_run_is_skipped_for_the_same_definition_only(tmp_path, monkeypatch):
    def parse(*extra):
        return config.parse_args(["--work-dir", str(tmp_path), "--out", str(tmp_path / "out"),
                                  *extra])  # fmt: skip

    trained = []

    def fake_run(cmd, log_file, threads=1):
        trained.append(cmd)
        return fake_mlm_training(cmd, log_file)

    monkeypatch.setattr(training, "run", fake_run)
    first = training.run_mlm("RealFormer", 2, 1e-3, tmp_path / "mlm-bin", parse())
    assert (first["completed_updates"], len(trained)) == (3000, 1)

    monkeypatch.setattr(training, "run", no_training)  # a finished run is not retrained
    assert training.run_mlm("RealFormer", 2, 1e-3, tmp_path / "mlm-bin", parse()) == first
    monkeypatch.setattr(training, "run", fake_run)  # another budget: trained again
    again = training.run_mlm(
        "RealFormer", 2, 1e-3, tmp_path / "mlm-bin", parse("--max-update", "40")
    )
    assert (again["completed_updates"], len(trained)) == (40, 2)


def test_a_run_of_another_definition_is_trained_in_a_fresh_folder(tmp_path, monkeypatch):
    """fairseq-train resumes from a checkpoint_last.pt in --save-dir: another definition's
    folder is moved to <run>.superseded before the run is trained again."""
    seen = []

    def fake_run(cmd, log_file, threads=1):
        save_dir = Path(cmd[cmd.index("--save-dir") + 1])
        seen.append(
            (cmd[cmd.index("--max-update") + 1], (save_dir / "checkpoint_last.pt").exists())
        )
        (save_dir / "checkpoint_last.pt").write_text(
            f"updates {cmd[cmd.index('--max-update') + 1]}"
        )
        return fake_mlm_training(cmd, log_file)

    monkeypatch.setattr(training, "run", fake_run)
    monkeypatch.setattr(training, "attention_stats", lambda *a, **k: None)
    monkeypatch.setattr(training, "load_attn", lambda out: {"stats of": out.parent.name})
    args = ["--work-dir", str(tmp_path), "--out", str(tmp_path / "out")]
    first = training.run_mlm("Post-LN", 1, 1e-3, tmp_path / "mlm-bin", config.parse_args(args))
    again = training.run_mlm(
        "Post-LN", 1, 1e-3, tmp_path / "mlm-bin", config.parse_args([*args, "--max-update", "40"])
    )
    assert seen == [(3000, False), (40, False)]
    assert (first["completed_updates"], again["completed_updates"]) == (3000, 40)
    runs_dir = tmp_path / "runs"
    assert (runs_dir / "postln_bert_lr0.001_seed1" / "checkpoint_last.pt").read_text() == (
        "updates 40"
    )
    old = runs_dir / "postln_bert_lr0.001_seed1.superseded"
    assert (old / "checkpoint_last.pt").read_text() == "updates 3000"
    assert json.loads((old / "result.json").read_text())["completed_updates"] == 3000


def reporting(monkeypatch, tmp_path):
    """driver.main with the report captured (mlm, sweep, nmt) and the MLM data a file here."""
    data_bin = tmp_path / "mlm-bin"
    data_bin.mkdir(exist_ok=True)
    if not (data_bin / "train.bin").exists():
        (data_bin / "train.bin").write_bytes(b"tokens")
    monkeypatch.setattr(driver, "prepare_mlm_data", lambda *a: data_bin)
    reported = []
    monkeypatch.setattr(
        driver,
        "report",
        lambda mlm, sweep, nmt, cfg, t0: reported.append((mlm, sweep, nmt)) or {"mlm_table": {}},
    )

    def main(*extra):
        driver.main(["--work-dir", str(tmp_path), "--out", str(tmp_path / "out"), *extra])
        return reported[-1]

    return main


def test_report_only_reports_the_mlm_runs_of_the_definition_asked_for(
    tmp_path, monkeypatch, caplog
):  # fmt: skip
    main = reporting(monkeypatch, tmp_path)
    monkeypatch.setattr(training, "run", fake_mlm_training)
    main("--only", "mlm", "--seeds", "1", "2")
    monkeypatch.setattr(training, "run", no_training)

    def losses(mlm):
        return sorted((r["variant"], r["seed"], r["final_valid_loss"]) for r in mlm)

    mlm, sweep, nmt = main("--only", "mlm", "--seeds", "1", "2", "--report-only")
    assert losses(mlm) == [
        ("Post-LN", 1, 5.1), ("Post-LN", 2, 5.2), ("Pre-LN", 1, 5.1), ("Pre-LN", 2, 5.2),
        ("RealFormer", 1, 5.1), ("RealFormer", 2, 5.2),
    ]  # fmt: skip
    assert (losses(sweep), nmt) == ([("Post-LN", 1, 5.1), ("RealFormer", 1, 5.1)], None)
    assert {r["max_update"] for r in mlm} == {3000}

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="study"):  # another budget: nothing to report
        mlm, sweep, _ = main("--only", "mlm", "--seeds", "1", "--max-update", "40", "--report-only")
    assert (mlm, sweep) == ([], [])
    warnings = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert warnings == [
        f"{tmp_path}/runs/{name}_lr0.001_seed1/result.json is another run's (differs in: "
        "command, --max-update, --valid-every): not reported"
        for name in ("postln_bert", "preln_bert", "realformer_bert")
    ]

    # another seed's data, and a run stored by a version that wrote no definition
    realformer = tmp_path / "runs" / "realformer_bert_lr0.001_seed2" / "result.json"
    stored = json.loads(realformer.read_text())
    del stored["definition"]
    realformer.write_text(json.dumps(stored))
    mlm, _, _ = main("--only", "mlm", "--seeds", "2", "--report-only")
    assert losses(mlm) == [("Post-LN", 2, 5.2), ("Pre-LN", 2, 5.2)]
    (tmp_path / "mlm-bin" / "train.bin").write_bytes(b"other tokens")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="study"):
        mlm, _, _ = main("--only", "mlm", "--seeds", "2", "--report-only")
    assert mlm == []
    warnings = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert warnings == [
        f"{tmp_path}/runs/postln_bert_lr0.001_seed2/result.json is another run's (differs in: "
        "data): not reported",
        f"{tmp_path}/runs/preln_bert_lr0.001_seed2/result.json is another run's (differs in: "
        "data): not reported",
        f"{tmp_path}/runs/realformer_bert_lr0.001_seed2/result.json is another run's (differs "
        "in: no definition stored): not reported",
    ]


def fake_nmt(monkeypatch, tmp_path):
    """run_nmt's commands faked: the convergence study leaves checkpoints that say their
    --max-update (and its prepared data); the attention statistics are counted."""
    commands, attention = [], []

    def fake_run(cmd, log_file, threads=1):
        commands.append([str(c) for c in cmd])
        work = Path(cmd[cmd.index("--work-dir") + 1])
        updates = cmd[cmd.index("--max-update") + 1]
        for prefix in ("admin_transformer", "realformer"):
            run_dir = work / "runs" / f"{prefix}_seed1"
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "checkpoint_last.pt").write_text(f"{prefix} {updates} updates")
        (work / "data-bin").mkdir(exist_ok=True)
        (work / "data-bin" / "dict.en.txt").write_text("a 1\n")
        (work / "prep" / "final").mkdir(parents=True, exist_ok=True)
        for lang in ("en", "fr"):
            (work / "prep" / "final" / f"test.{lang}").write_text(f"test {lang}\n")

    monkeypatch.setattr(training, "run", fake_run)
    monkeypatch.setattr(training, "attention_stats", lambda ckpt, *a, **k: attention.append(ckpt))
    monkeypatch.setattr(
        training, "load_attn", lambda out: {"from": (out.parent / "checkpoint_last.pt").read_text()}
    )
    return commands, attention


def test_nmt_attention_is_reused_and_reported_for_its_definition_only(
    tmp_path, monkeypatch, caplog
):  # fmt: skip
    """The NMT attention statistics (nmt/attn_done.json) of another --nmt-updates, or of
    checkpoints that changed since, are neither reused nor reported."""
    main = reporting(monkeypatch, tmp_path)
    commands, attention = fake_nmt(monkeypatch, tmp_path)
    args = ["--work-dir", str(tmp_path), "--out", str(tmp_path / "out")]
    at_1500 = {
        "ADMIN": {"from": "admin_transformer 1500 updates"},
        "RealFormer+ADMIN": {"from": "realformer 1500 updates"},
    }
    assert training.run_nmt(config.parse_args(args)) == at_1500
    assert len(attention) == 2
    # the convergence study runs again (it reuses its own runs); the statistics are reused
    assert training.run_nmt(config.parse_args(args)) == at_1500
    assert (len(commands), len(attention)) == (2, 2)

    monkeypatch.setattr(training, "run", no_training)
    monkeypatch.setattr(training, "attention_stats", no_training)
    assert main("--only", "nmt", "--report-only")[2] == at_1500
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="study"):
        assert main("--only", "nmt", "--nmt-updates", "100", "--report-only")[2] is None
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{tmp_path}/nmt/attn_done.json is another run's (differs in: command, --nmt-updates): "
        "not reported"
    ]

    commands, attention = fake_nmt(monkeypatch, tmp_path)  # trained again for 100 updates
    assert training.run_nmt(config.parse_args([*args, "--nmt-updates", "100"])) == {
        "ADMIN": {"from": "admin_transformer 100 updates"},
        "RealFormer+ADMIN": {"from": "realformer 100 updates"},
    }
    assert len(attention) == 2
    monkeypatch.setattr(training, "run", no_training)
    assert main("--only", "nmt", "--nmt-updates", "100", "--report-only")[2] == {
        "ADMIN": {"from": "admin_transformer 100 updates"},
        "RealFormer+ADMIN": {"from": "realformer 100 updates"},
    }
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="study"):
        assert main("--only", "nmt", "--report-only")[2] is None
        # a checkpoint that changed since its statistics were computed
        nmt_runs = tmp_path / "nmt" / "work" / "runs"
        (nmt_runs / "realformer_seed1" / "checkpoint_last.pt").write_text("retrained")
        assert main("--only", "nmt", "--nmt-updates", "100", "--report-only")[2] is None
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{tmp_path}/nmt/attn_done.json is another run's (differs in: command, --nmt-updates): "
        "not reported",
        f"{tmp_path}/nmt/attn_done.json is another run's (differs in: data): not reported",
    ]


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
        "-m", "studies.convergence", "--data", str(runs.DEFAULT_DATA),
        "--work-dir", str(nmt_work), "--out", str(tmp_path / "nmt"),
        "--variants", "ADMIN", "RealFormer+ADMIN", "--seeds", "1", "--max-update", "1500",
        "--valid-every", "375", "--jobs", "2", "--keep-checkpoints",
    ]  # fmt: skip
    assert {i for i, _ in inputs} == {nmt_work / "prep" / "final" / "test.en"}
    assert {t for _, t in inputs} == {nmt_work / "prep" / "final" / "test.fr"}


def test_report_only_reads_every_part_without_running(tmp_path, monkeypatch):
    """--report-only with an NMT part stored by a version that wrote no definition (its job has
    no LR or seed) and no MLM runs: nothing is prepared or trained, the report is written,
    without them."""
    (tmp_path / "nmt").mkdir()
    (tmp_path / "nmt" / "attn_done.json").write_text("{}")
    monkeypatch.setattr(driver, "prepare_mlm_data", no_training)  # nor prepare the data
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
    assert reported == {"nmt": None}


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
