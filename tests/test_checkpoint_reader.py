"""The project's one checkpoint reader (realformer_fairseq.checkpoint_compat.read_checkpoint)
through the commands of its three callers (issue 46): the pipelines' helpers
(``python -m realformer_pipelines.tools model-info``: realformer_pipelines/checkpoints.py),
GLUE's predictions (``glue_tools.py predict``: examples/glue/glue_predict.py) and pre-training's
evaluation (``pretrain_tools.py evaluate``: realformer_fairseq/pretraining/mlm_eval.py).

Each way a checkpoint file can be unusable is one line naming the file (a corrupt file, a torch
file that is no fairseq checkpoint, a pickled object fairseq never writes), an unregistered
``--arch`` says which and what registers it, and anything else (here a ``KeyError`` in one of
fairseq's upgrade steps on a file that has a model and a config) keeps its traceback: the same
in all three commands (before: "not a fairseq checkpoint" for all of them in the first, a
traceback or "cannot read the checkpoint" in the last).

Each command's ``main`` runs here, in the test's process, on every kind of file (its one error
line is what its entry point prints; a traceback is what Python prints for an exception out of
it), and each command runs once as a user types it, on one kind, for the wiring (before: 18
processes that import fairseq, one per command and kind).
"""

import fractions
import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import harness
import numpy as np
import pytest
import torch
from harness import run_main

GLUE = harness.REPO_ROOT / "examples" / "glue"
PRETRAIN = harness.REPO_ROOT / "examples" / "pretrain_bert"
OTHER_PLUGIN = "/elsewhere/other_plugin"
# what fairseq's load_checkpoint_to_cpu needs of a checkpoint besides its model and config
TRAINING_STATE = {
    "optimizer_history": [{"criterion_name": "masked_lm", "optimizer_name": "Adam",
                           "lr_scheduler_state": {}, "num_updates": 3}],
    "extra_state": {"train_iterator": None},
}  # fmt: skip


def checkpoints(folder: Path):
    """kind -> (FOLDER/KIND/checkpoint1.pt, the one error line's message, or None: a traceback
    ending in that text)."""
    made = {}

    def save(kind, obj, expected, raw=None):
        path = folder / kind / "checkpoint1.pt"
        path.parent.mkdir(parents=True)
        if raw is not None:
            path.write_bytes(raw)
        else:
            torch.save(obj, path)
        made[kind] = (path, expected.format(path=path))

    save("corrupt", None, "{path}: truncated or corrupt checkpoint (17 bytes; torch.load: "
         "Unsupported operand 110); copy or save it again, or use another checkpoint",
         raw=b"not a checkpoint\n")  # fmt: skip
    # a pickle's string that is no UTF-8 (torch's restricted unpickler: UnicodeDecodeError)
    save("corrupt_string", None, "{path}: truncated or corrupt checkpoint (12 bytes; torch.load: "
         "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte); copy or save "
         "it again, or use another checkpoint", raw=b"\x80\x02X\x04\x00\x00\x00\xff\xfe\xfd\xfc.")  # fmt: skip
    save("state_dict", {"weight": torch.zeros(2), "bias": torch.zeros(1)},
         "{path}: not a fairseq checkpoint (a dict of bias, weight, without the 'model' state "
         "and its 'cfg' / 'args')")  # fmt: skip
    save("pickled_object", {"model": {}, "cfg": {}, "ratio": fractions.Fraction(1, 3)},
         "{path}: not a fairseq checkpoint (it pickles fractions.Fraction, which fairseq does "
         "not write and torch.load's safe unpickler refuses)")  # fmt: skip
    cfg = {"model": Namespace(_name="no_such_arch", arch="no_such_arch"),
           "task": {"_name": "masked_lm"}, "common": {"user_dir": OTHER_PLUGIN}}  # fmt: skip
    save("unknown_arch", {"model": {}, "cfg": cfg, **TRAINING_STATE},
         "{path}: the checkpoint's model --arch no_such_arch is not registered; it was trained "
         f"with --user-dir {OTHER_PLUGIN}, which registers it: import that plugin first "
         f"(fairseq's commands: --user-dir {OTHER_PLUGIN})")  # fmt: skip
    # a model and a config, but neither optimizer_history nor the best_loss of fairseq's first
    # upgrade step: a KeyError there is not the file's fault one line could name
    save("upgrade_bug", {"model": {}, "cfg": cfg}, "KeyError: 'best_loss'")
    return made


def assert_outcome(proc, prog, kind, path, expected):
    if kind == "upgrade_bug":
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback (most recent call last)" in proc.stderr, proc.stderr[-3000:]
        assert proc.stderr.rstrip().endswith(expected), proc.stderr[-3000:]
        assert not harness.ERROR_LINE.search(proc.stderr), proc.stderr[-3000:]
    else:
        assert harness.one_error_line(proc, prog=prog) == expected, kind


def run(*cmd):
    return subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=harness.pipeline_env(), timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    return checkpoints(tmp_path_factory.mktemp("bad_checkpoints"))


KINDS = ["corrupt", "corrupt_string", "state_dict", "pickled_object", "unknown_arch", "upgrade_bug"]


def model_info_argv(path):
    return ["model-info", "--model", path]


@pytest.mark.parametrize("kind", KINDS)
def test_pipelines_model_info(bad, kind, monkeypatch):
    from realformer_pipelines import tools

    monkeypatch.delenv("REALFORMER_PIPELINE_NAME", raising=False)  # the tools' own name
    path, expected = bad[kind]
    proc = run_main(tools.main, *model_info_argv(path))
    assert_outcome(proc, "realformer_pipelines", kind, path, expected)


def write_mmap(prefix: Path, sentences):
    from fairseq.data.indexed_dataset import MMapIndexedDatasetBuilder

    builder = MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for tokens in sentences:
        builder.add_item(torch.tensor(tokens, dtype=torch.int64))
    builder.finalize(f"{prefix}.idx")


@pytest.fixture(scope="module")
def glue_data_bin(tmp_path_factory):
    """A complete CoLA data-bin of prepare.sh's layout (glue_data.check_data_bin passes): one
    example per subset."""
    root = tmp_path_factory.mktemp("cola") / "data-bin"
    for part in ("input0", "label", "glue"):
        (root / part).mkdir(parents=True)
    (root / "input0" / "dict.txt").write_text("a 3\nb 2\n", encoding="utf-8")
    (root / "label" / "dict.txt").write_text("0 1\n1 1\n", encoding="utf-8")
    for subset in ("train", "valid", "test"):
        (root / "glue" / f"{subset}.index").write_text("0\n", encoding="utf-8")
        write_mmap(root / "input0" / subset, [[4, 5, 2]])
        if subset != "test":
            write_mmap(root / "label" / subset, [[4, 2]])
    return root


def glue_predict_argv(path, data_bin, out):
    return ["predict", "--task", "CoLA", "--checkpoint", path, "--data-bin", data_bin,
            "--subsets", "valid", "--out-dir", out, "--cpu"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_glue_predict(bad, glue_data_bin, kind, tmp_path):
    path, expected = bad[kind]
    glue_tools = harness.pipeline_module("glue", "glue_tools")
    proc = run_main(glue_tools.main, *glue_predict_argv(path, glue_data_bin, tmp_path / "pred"))
    assert_outcome(proc, "glue", kind, path, expected)


@pytest.fixture(scope="module")
def mlm_data_bin(tmp_path_factory):
    """What pretrain_tools.py evaluate reads of prepare.sh's data-bin: dict.txt, the held-out
    split (valid), prepare.json."""
    root = tmp_path_factory.mktemp("mlm") / "data-bin"
    root.mkdir()
    (root / "dict.txt").write_text("a 9\nb 5\nc 3\n", encoding="utf-8")
    write_mmap(root / "valid", [[4, 5, 6, 4, 2], [4, 4, 5, 2]] * 4)
    (root / "prepare.json").write_text(json.dumps(
        {"max_seq_len": 16, "most_frequent_id": 4, "most_frequent_piece": "a"}))  # fmt: skip
    return root


def pretrain_evaluate_argv(path, data_bin, out):
    return ["evaluate", "--data-bin", data_bin, "--checkpoint-dir", path.parent, "--out-dir", out,
            "--cpu"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_pretrain_bert_evaluate(bad, mlm_data_bin, kind, tmp_path):
    path, expected = bad[kind]
    pretrain_tools = harness.pipeline_module("pretrain_bert", "pretrain_tools")
    proc = run_main(
        pretrain_tools.main, *pretrain_evaluate_argv(path, mlm_data_bin, tmp_path / "e")
    )
    assert_outcome(proc, "pretrain_bert", kind, path, expected)


@pytest.mark.parametrize("command", ["model-info", "glue", "pretrain_bert"])
def test_each_command_as_typed(bad, glue_data_bin, mlm_data_bin, command, tmp_path):
    """The wiring: each command as its pipeline runs it, on one kind each (a one-line error
    through each entry point, and a traceback through one)."""
    if command == "model-info":
        path, expected = bad["pickled_object"]
        proc = run(sys.executable, "-m", "realformer_pipelines.tools", *model_info_argv(path))
        assert_outcome(proc, "realformer_pipelines", "pickled_object", path, expected)
    elif command == "glue":
        path, expected = bad["corrupt"]
        proc = run(sys.executable, GLUE / "glue_tools.py",
                   *glue_predict_argv(path, glue_data_bin, tmp_path / "pred"))  # fmt: skip
        assert_outcome(proc, "glue", "corrupt", path, expected)
    else:
        path, expected = bad["upgrade_bug"]
        proc = run(sys.executable, PRETRAIN / "pretrain_tools.py",
                   *pretrain_evaluate_argv(path, mlm_data_bin, tmp_path / "eval"))  # fmt: skip
        assert_outcome(proc, "pretrain_bert", "upgrade_bug", path, expected)
