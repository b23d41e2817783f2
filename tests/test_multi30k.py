"""scripts/prepare_multi30k.sh, the one preparation of Multi30k En-Fr (the data of the
quick start, the convergence study of RealFormer, He et al. 2020, arXiv 2012.11747, the
smoke run and these tests): what it makes, checked on the lines the tests train on, and that
each of those users calls it, with which arguments, and prepares nothing itself."""

import os
import re
import shutil
import subprocess
from pathlib import Path

from harness import MULTI30K_PREPARED_LINES, REPO_ROOT, SHARED_DATA, prepared_multi30k


def lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def test_lowercased_moses_tokenised_with_joint_bpe():
    work = prepared_multi30k()
    # Multi30k train line 1: "Two young, White males are outside near many bushes." and
    # "Deux jeunes hommes blancs sont dehors près de buissons."; test line 2 has "l'herbe"
    assert lines(work / "tok" / "train.en")[0] == (
        "two young , white males are outside near many bushes ."
    )
    assert lines(work / "tok" / "train.fr")[0] == (
        "deux jeunes hommes blancs sont dehors près de buissons ."
    )
    assert lines(work / "tok" / "test.fr")[1] == (
        "un terrier de boston court sur l&apos; herbe verdoyante devant une clôture blanche ."
    )
    # BPE only splits words: removing the joiners gives the tokenised text back
    for split in ("valid", "test"):
        for lang in ("en", "fr"):
            bpe = lines(work / "final" / f"{split}.{lang}")
            assert len(bpe) == MULTI30K_PREPARED_LINES[split]
            unsplit = [re.sub(r"@@ ", "", line) for line in bpe]
            assert unsplit == lines(work / "tok" / f"{split}.{lang}")
            assert any("@@ " in line for line in bpe)
    # one joint code file for both languages, 3000 merges (plus the version line)
    assert len(lines(work / "bpe" / "codes")) == 3000 + 1


def test_train_pairs_are_cleaned_but_stay_aligned():
    work = prepared_multi30k()
    en, fr = lines(work / "final" / "train.en"), lines(work / "final" / "train.fr")
    assert len(en) == len(fr) == 2295  # of the first 2400: length ratio 1.5 drops 105
    for src, tgt in zip(en, fr):
        assert max(len(src.split()), len(tgt.split())) <= 1.5 * min(
            len(src.split()), len(tgt.split())
        )


STUB = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$(dirname "${BASH_SOURCE[0]}")/prepare.args"
exit 3
"""


def tree_with_stub(root: Path, *files: str) -> Path:
    """``files`` of the repository copied under ``root`` (same layout), with
    scripts/prepare_multi30k.sh a stub that records its arguments and fails (exit 3)."""
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / name, root / name)
    (root / "scripts").mkdir(exist_ok=True)
    (root / "scripts" / "prepare_multi30k.sh").write_text(STUB)
    return root


def run_bash(script: Path, *args, env=None):
    return subprocess.run(
        ["bash", str(script), *map(str, args)], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, **(env or {})),
    )  # fmt: skip


def recorded(root: Path):
    return (root / "scripts" / "prepare.args").read_text(encoding="utf-8").splitlines()


def test_the_quick_start_prepares_with_the_script_and_nothing_else(tmp_path):
    """It calls prepare_multi30k.sh with the quick start's settings, first, and stops when
    that fails: nothing of its own is prepared or trained."""
    root = tree_with_stub(tmp_path / "repo", "scripts/quickstart.sh")
    fake_bin = tmp_path / "bin"  # the quick start's python, asked for the plugin's folder only
    fake_bin.mkdir()
    (fake_bin / "python").write_text("#!/bin/sh\necho /plugin\n")
    (fake_bin / "python").chmod(0o755)
    work = tmp_path / "work"
    proc = run_bash(
        root / "scripts" / "quickstart.sh",
        work,
        5,
        env={"VENV_BIN": str(fake_bin), "REALFORMER_SHARED_DATA": str(SHARED_DATA)},
    )
    assert proc.returncode == 1, proc.stderr
    assert recorded(root) == [
        "--work-dir", str(work / "prep"), "--dest", str(work / "data-bin"),
        "--data", str(SHARED_DATA), "--bpe-size", "3000", "--max-train-lines", "12000",
        "--max-valid-lines", "500", "--max-test-lines", "300",
    ]  # fmt: skip
    assert sorted(p.name for p in work.iterdir()) == ["prepare.log"]


def test_the_smoke_run_prepares_with_the_script_and_nothing_else(tmp_path):
    root = tree_with_stub(
        tmp_path / "repo", "examples/wmt14_en_fr/smoke.sh", "examples/wmt14_en_fr/stages.sh",
        "examples/common/pipeline.sh",
    )  # fmt: skip
    work = tmp_path / "work"
    proc = run_bash(root / "examples" / "wmt14_en_fr" / "smoke.sh", "--work-dir", work,
                    "--data", SHARED_DATA)  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert recorded(root) == [
        "--work-dir", str(work / "prep"), "--data", str(SHARED_DATA), "--cased",
        "--dest", str(work / "data-bin"),
        "--valid", str(SHARED_DATA / "newstest2013" / "newstest2013"),
        "--test", str(SHARED_DATA / "newstest2014" / "newstest2014-fren"),
        "--max-train-lines", "8000", "--max-valid-lines", "300", "--max-test-lines", "300",
        "--bpe-size", "3000", "--workers", "1",
    ]  # fmt: skip
    assert not work.exists() or not any(work.iterdir())


def test_the_convergence_study_and_the_test_harness_call_the_script(tmp_path, monkeypatch):
    import harness

    from studies import convergence

    script = REPO_ROOT / "scripts" / "prepare_multi30k.sh"
    commands = []
    monkeypatch.setattr(convergence.runs, "run", lambda cmd, *a, **k: commands.append(cmd))
    data_bin = convergence.prepare_data(Path("/data"), tmp_path, 4000, {"valid": 400})
    assert data_bin == tmp_path / "data-bin"
    assert [str(c) for c in commands.pop()] == [
        "bash", str(script), "--work-dir", str(tmp_path / "prep"), "--dest", str(data_bin),
        "--data", "/data", "--bpe-size", "4000", "--workers", "2", "--max-valid-lines", "400",
    ]  # fmt: skip

    # as in a fresh test run
    monkeypatch.setattr(harness, "_multi30k_work", None)
    monkeypatch.setattr(harness, "_built", {})
    monkeypatch.setenv(harness.RUN_DIR_VARIABLE, str(tmp_path / "run"))
    monkeypatch.setattr(harness, "run", lambda cmd, **k: commands.append(cmd))
    work = harness.prepared_multi30k()
    assert [str(c) for c in commands.pop()] == [
        "bash", str(script), "--work-dir", str(work), "--data", str(SHARED_DATA),
        "--bpe-size", "3000", "--workers", "1", "--max-train-lines", "2400",
        "--max-valid-lines", "200", "--max-test-lines", "100", "--until", "clean",
    ]  # fmt: skip
