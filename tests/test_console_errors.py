"""One helper for the one-line error of every console command (realformer_pipelines.errors,
re-exported as realformer_fairseq.errors.exit_with_one_line): each command the project installs
or ships, run as a user types it on an input that does not exist, exits with status 1 and prints
exactly one line ``PROG: error: ...`` and no traceback (before: realformer-attention-stats and
realformer-average-checkpoints exited 2, and five modules wrote the line five ways)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO_ROOT

BIN = Path(sys.executable).parent
EXAMPLES = REPO_ROOT / "examples"


def commands(missing: Path):
    """(argv, expected error line) of each console command on a missing file."""
    m = str(missing)
    return [
        ([BIN / "realformer-wordpiece", "--vocab", m],
         f"realformer-wordpiece: error: no vocabulary file {m}"),
        ([BIN / "realformer-import-tf", "--tf-checkpoint", m, "--bert-config", m, "--vocab", m,
          "--out", missing.parent / "out"],
         f"realformer-import-tf: error: no BERT config file {m}"),
        ([BIN / "realformer-attention-stats", "--path", m, "--input", m, "--out-dir",
          missing.parent / "stats", "--no-plots"],
         f"realformer-attention-stats: error: --input {m}: no such file"),
        ([BIN / "realformer-average-checkpoints", "--inputs", m, m + ".2", "--output",
          missing.parent / "avg.pt"],
         f"realformer-average-checkpoints: error: {m}: no such checkpoint file"),
        ([sys.executable, "-m", "realformer_pipelines.tools", "check", m],
         f"realformer_pipelines: error: {m}: missing input file"),
        ([sys.executable, EXAMPLES / "wmt14_en_fr" / "text_tools.py", "sgm", "--input", m,
          "--output", missing.parent / "x"],
         f"wmt14_en_fr: error: {m}: missing input file"),
        ([sys.executable, EXAMPLES / "wmt14_en_fr" / "recipes.py", "average-inputs", "--dir", m,
          "--n", "2"],
         f"wmt14_en_fr: error: {m}: 0 epoch checkpoints, the recipe averages the last 2 (train "
         "longer, or pass --allow-fewer / --average-last N)"),
        ([sys.executable, EXAMPLES / "glue" / "glue_tools.py", "split", "--task", "RTE",
          "--task-dir", missing, "--out", missing.parent / "split"],
         f"glue: error: {missing / 'train.tsv'}: missing file (RTE needs train.tsv)"),
        ([sys.executable, EXAMPLES / "glue" / "recipes.py", "shell", "--task", "XNLI"],
         "glue: error: --task must be one of MNLI, QNLI, QQP, RTE, SST-2, MRPC, CoLA, STS-B, "
         "WNLI, got 'XNLI'"),
    ]  # fmt: skip


@pytest.mark.parametrize("index", range(9))
def test_every_console_command_stops_with_one_line_and_status_1(index, tmp_path):
    argv, expected = commands(tmp_path / "missing.file")[index]
    env = dict(os.environ, REALFORMER_PIPELINE_NAME="")  # the tools' own name
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, proc.stderr
    assert errors[0] == expected


def test_no_module_writes_the_error_line_itself():
    """The text ``: error: {`` (an f-string error line) only in the one helper's module and in
    the plugin's wrapper for fairseq's own commands (one_line_under_fairseq_commands)."""
    writers = []
    for root in ("realformer_fairseq", "realformer_pipelines", "examples", "scripts"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            if re.search(r"error: \{", path.read_text(encoding="utf-8")):
                writers.append(str(path.relative_to(REPO_ROOT)))
    assert writers == ["realformer_fairseq/errors.py", "realformer_pipelines/errors.py"]
