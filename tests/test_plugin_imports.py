"""The plugin (RealFormer residual attention, He et al. 2020, arXiv 2012.11747, as a fairseq
``--user-dir``) imports nothing from the project's studies (``studies/``) and no matplotlib: its
own install has neither. Run in fresh interpreters, from the repository root with the root on
``sys.path``, so that a stray ``import studies`` would succeed and be seen, not fail."""

import json
import os
import subprocess
import sys

from harness import REPO_ROOT

IMPORT_EVERY_MODULE = """
import importlib, importlib.util, json, pkgutil, sys
{block}
import realformer_fairseq
names = [m.name for m in pkgutil.walk_packages(realformer_fairseq.__path__, "realformer_fairseq.")]
# modules of an optional extra, imported where it is installed: module -> the package it needs
optional = {{"realformer_fairseq.modules.routes.triton_function": "triton", "realformer_fairseq.modules.routes.triton_kernels": "triton",
            "realformer_fairseq.modules.routes.triton_concat_function": "triton", "realformer_fairseq.modules.routes.triton_concat_kernels": "triton"}}
for name in names:
    if name in optional and importlib.util.find_spec(optional[name]) is None:
        continue
    importlib.import_module(name)
loaded = sorted(m for m, mod in sys.modules.items() if mod and m.split(".")[0] in ("studies", "matplotlib"))
print(json.dumps({{"modules": names, "loaded": loaded}}))
"""
# importing matplotlib raises ImportError, as where the plots extra is not installed
BLOCK_MATPLOTLIB = "sys.modules['matplotlib'] = None"


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip


def import_every_module(block: str = "") -> dict:
    proc = python(IMPORT_EVERY_MODULE.format(block=block))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_no_plugin_module_imports_the_studies_or_matplotlib():
    assert python("import studies").returncode == 0  # importable here, so a stray import shows
    result = import_every_module()
    # the walk reached the whole package, the command modules included
    for name in (
        "realformer_fairseq.atomic_files",
        "realformer_fairseq.cli.attention_stats",
        "realformer_fairseq.cli.attention_plots",
        "realformer_fairseq.cli.average_checkpoints",
        "realformer_fairseq.models.realformer_lm",
        "realformer_fairseq.modules.routes.eager",
    ):
        assert name in result["modules"], name
    assert result["loaded"] == []


def test_without_matplotlib_the_plugin_imports_and_attention_stats_says_so_in_one_line(tmp_path):
    """Without the plots extra every plugin module imports; the command stops at once, before
    reading anything, with one line naming the extra; with --no-plots it needs no matplotlib
    (it goes on to the input)."""
    run_cli = IMPORT_EVERY_MODULE.format(block=BLOCK_MATPLOTLIB)
    run_cli += "from realformer_fairseq.cli.attention_stats import cli_main\ncli_main(sys.argv[1:])"
    argv = ["--path", str(tmp_path / "none.pt"), "--input", str(tmp_path / "none.txt")]
    argv += ["--out-dir", str(tmp_path / "out")]
    proc = python(run_cli, *argv)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    imported = json.loads(proc.stdout.strip().splitlines()[0])
    assert "realformer_fairseq.cli.attention_plots" in imported["modules"]
    assert imported["loaded"] == []
    # (fairseq's import may log an INFO line first)
    assert proc.stderr.strip().splitlines()[-1] == (
        "realformer-attention-stats: error: the plots need matplotlib, which is not installed: "
        "pip install 'realformer-fairseq[plots]' (scripts/install.sh installs it), or pass "
        "--no-plots"
    )
    proc = python(run_cli, *argv, "--no-plots")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"realformer-attention-stats: error: --input {tmp_path / 'none.txt'}: no such file"
    )
    assert not (tmp_path / "out").exists()
