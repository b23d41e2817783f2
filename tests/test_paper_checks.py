"""Smoke test of scripts/paper_checks.py's resume logic (RealFormer paper checks,
He et al. arXiv 2012.11747): a run with a result.json is skipped, never retrained."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import paper_checks  # noqa: E402


def test_finished_run_is_skipped(tmp_path, monkeypatch):
    cfg = paper_checks.parse_args(["--work-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    run_dir = tmp_path / "runs" / "realformer_bert_lr0.001_seed2"
    run_dir.mkdir(parents=True)
    stored = {"variant": "RealFormer", "seed": 2, "lr": 0.001, "final_valid_loss": 5.0}
    (run_dir / "result.json").write_text(json.dumps(stored))

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run must not be retrained")

    monkeypatch.setattr(paper_checks, "run", no_training)
    assert paper_checks.run_mlm("RealFormer", 2, 1e-3, tmp_path / "mlm-bin", cfg) == stored


def test_updates_to_reach():
    curve = [{"update": 40, "loss": 7.0}, {"update": 80, "loss": 6.0}, {"update": 120, "loss": 5.5}]
    assert paper_checks.updates_to_reach(curve, 6.0) == 80
    assert paper_checks.updates_to_reach(curve, 5.0) is None


def test_nmt_attention_reads_the_text_convergence_prepared(tmp_path, monkeypatch):
    """The NMT part's attention input is the BPE'd test set that convergence.py's
    preparation writes (prepare_multi30k.sh --work-dir P leaves it in P/final/)."""
    import convergence

    commands = []
    monkeypatch.setattr(convergence.study, "run", lambda cmd, *a, **k: commands.append(cmd))
    work = tmp_path / "work"
    convergence.prepare_data(Path("/data"), work, 100, {})
    prep_dir = Path(commands[0][commands[0].index("--work-dir") + 1])
    assert convergence.prepared_text(work, "test", "en") == prep_dir / "final" / "test.en"

    cfg = paper_checks.parse_args(["--work-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    inputs = []
    monkeypatch.setattr(paper_checks, "run", lambda *a, **k: None)
    monkeypatch.setattr(
        paper_checks,
        "attention_stats",
        lambda ckpt, inp, *a, target=None: inputs.append((inp, target)),
    )
    monkeypatch.setattr(paper_checks, "load_attn", lambda out: {})
    (tmp_path / "nmt").mkdir()
    paper_checks.run_nmt(cfg)
    nmt_work = tmp_path / "nmt" / "work"
    assert {i for i, _ in inputs} == {nmt_work / "prep" / "final" / "test.en"}
    assert {t for _, t in inputs} == {nmt_work / "prep" / "final" / "test.fr"}


def test_report_only_reads_every_part_without_running(tmp_path, monkeypatch):
    """--report-only with the NMT part finished (its job has no LR or seed) and no MLM runs:
    nothing trains, the report is written."""
    (tmp_path / "nmt").mkdir()
    (tmp_path / "nmt" / "attn_done.json").write_text("{}")
    monkeypatch.setattr(paper_checks, "prepare_mlm_data", lambda *a: tmp_path / "mlm-bin")

    def no_training(*args, **kwargs):
        raise AssertionError("--report-only must not run anything")

    monkeypatch.setattr(paper_checks, "run", no_training)
    reported = {}
    monkeypatch.setattr(
        paper_checks,
        "report",
        lambda mlm, sweep, nmt, cfg, t0: reported.update(nmt=nmt) or {"mlm_table": {}},
    )
    paper_checks.main(
        ["--work-dir", str(tmp_path), "--out", str(tmp_path / "out"), "--report-only"]
    )
    assert reported == {"nmt": {}}
