"""One helper for the one-line error of every console command (realformer_pipelines.errors,
re-exported as realformer_fairseq.errors.exit_with_one_line): each command the project installs
or ships, run as a user types it on an input that does not exist, exits with status 1 and prints
exactly one line ``PROG: error: ...`` and no traceback (before: realformer-attention-stats and
realformer-average-checkpoints exited 2, and five modules wrote the line five ways).

Every entry point goes through one wrapper (realformer_pipelines.startup.console_entry_point:
the process is the command, its imports frozen), and where triton is imported the one line is
still the last (before: 27 lines of triton's nanobind "leaked instance" warnings after it)."""

import ast
import importlib
import importlib.util
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


# setup.py's console scripts, written out: a new one is added here, and goes through the wrapper
CONSOLE_SCRIPTS = {
    "realformer-average-checkpoints": "realformer_fairseq.cli.average_checkpoints:cli_main",
    "realformer-attention-stats": "realformer_fairseq.cli.attention_stats:cli_main",
    "realformer-import-tf": "realformer_fairseq.cli.import_tf:cli_main",
    "realformer-wordpiece": "realformer_pipelines.wordpiece:cli_main",
    "realformer-squad": "realformer_fairseq.cli.squad:cli_main",
    "realformer-squad-eval": "realformer_fairseq.cli.squad_eval:cli_main",
}


def test_every_entry_point_goes_through_the_console_wrapper():
    """Each console script of setup.py is a function decorated with console_entry_point; each
    script's ``__main__`` block calls one of them or ``console_entry_point(main)()``; no module
    marks the process itself (mark_console_command outside startup.py)."""
    setup = ast.parse((REPO_ROOT / "setup.py").read_text(encoding="utf-8"))
    scripts = [
        node.value
        for node in ast.walk(setup)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "=" in node.value
        and ":" in node.value and node.value.startswith("realformer-")
    ]  # fmt: skip
    assert dict(script.split("=") for script in scripts) == CONSOLE_SCRIPTS
    for name, target in CONSOLE_SCRIPTS.items():
        module, function = target.split(":")
        entry_point = getattr(importlib.import_module(module), function)
        assert getattr(entry_point, "console_entry_point", False) is True, name
    modules_with_a_console_script = {t.split(":")[0] for t in CONSOLE_SCRIPTS.values()}
    mains = []
    for root in ("realformer_fairseq", "realformer_pipelines", "examples"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            relative = path.relative_to(REPO_ROOT)
            if relative.as_posix() != "realformer_pipelines/startup.py":
                assert "mark_console_command()" not in text, relative
            if 'if __name__ == "__main__":' not in text:
                continue
            block = text.split('if __name__ == "__main__":')[1]
            module = ".".join(relative.with_suffix("").parts)
            if block.strip() == "cli_main()":
                assert module in modules_with_a_console_script, relative
            else:
                assert "sys.exit(console_entry_point(main)())" in block, relative
            mains.append(relative.as_posix())
    assert len(mains) == 15, mains  # the six console scripts' modules and nine pipeline scripts


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="needs triton (the [triton] extra, as CUDA builds of torch have; .ci/run runs the "
    "default suite in its triton venv too)",
)
def test_with_triton_imported_a_commands_one_line_is_the_last(tmp_path):
    """Issue 53: the wrapper freezes what the command imported (gc.freeze), and a frozen object
    outlives the interpreter's last collection; triton's bindings (nanobind) print a "leaked
    instance" line for each of theirs still alive at exit (before: 4 lines after ``import
    triton``, 27 with the plugin's kernels)."""
    missing = tmp_path / "missing.txt"
    probe = "import sys, triton\nfrom realformer_pipelines.wordpiece import cli_main\ncli_main()"
    proc = subprocess.run([sys.executable, "-c", probe, "--vocab", str(missing)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"realformer-wordpiece: error: no vocabulary file {missing}"
    ]
