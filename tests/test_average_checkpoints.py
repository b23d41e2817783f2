"""realformer-average-checkpoints on real tiny fairseq checkpoints (a few updates of
fairseq-train with --optimizer radam, every epoch checkpoint kept)."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness import USER_DIR, fairseq_command, make_multi30k_subset, preprocess, run

from realformer_fairseq.checkpoint_compat import fairseq_checkpoint_globals
from realformer_fairseq.cli import average_checkpoints as avg

PROG = [sys.executable, "-m", "realformer_fairseq.cli.average_checkpoints"]


def load(path):
    with torch.serialization.safe_globals(fairseq_checkpoint_globals()):
        return torch.load(path, map_location="cpu", weights_only=True)


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class Result:
    def __init__(self, returncode, stderr):
        self.returncode, self.stderr = returncode, stderr


def average(*args):
    """The command in-process (a subprocess per call costs seconds of imports); stderr as text."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = avg.main([str(a) for a in args])
        except SystemExit as stop:  # the one-line error's exit
            code = stop.code
    return Result(code, err.getvalue())


def average_subprocess(*args):
    return subprocess.run(
        [*PROG, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("avg")
    raw = make_multi30k_subset(root / "raw", n_train=160, n_valid=16, n_test=16)
    data_bin = preprocess(raw, root / "bin")
    save = root / "ckpt"
    run(
        [
            fairseq_command("fairseq-train"), data_bin, "--user-dir", USER_DIR,
            "--task", "translation", "--arch", "realformer_tiny", "--share-all-embeddings",
            "--optimizer", "radam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3",
            "--lr-scheduler", "polynomial_decay", "--warmup-updates", "2",
            "--total-num-update", "100", "--end-learning-rate", "0",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--max-tokens", "1000", "--max-epoch", "4", "--save-dir", save,
            "--save-interval-updates", "2", "--disable-validation",
            "--log-format", "simple", "--num-workers", "0", "--seed", "1", "--cpu",
        ]
    )  # fmt: skip
    return save


def test_real_checkpoints_were_written_with_radam(ckpt_dir):
    epochs = sorted(ckpt_dir.glob("checkpoint[0-9]*.pt"))
    assert [p.name for p in epochs] == [f"checkpoint{i}.pt" for i in range(1, 5)]
    state = load(ckpt_dir / "checkpoint4.pt")
    assert state["cfg"]["optimizer"]["_name"] == "radam"
    assert tuple(eval(state["cfg"]["optimizer"]["adam_betas"])) == (0.9, 0.98)


def test_average_last_epochs_is_the_mean_and_loads(ckpt_dir, tmp_path):
    before = {p: sha(p) for p in ckpt_dir.glob("*.pt")}
    out = tmp_path / "avg.pt"
    proc = average("--inputs", ckpt_dir, "--num-epoch-checkpoints", "2", "--output", out)
    assert proc.returncode == 0, proc.stderr
    averaged = load(out)
    a, b = load(ckpt_dir / "checkpoint3.pt"), load(ckpt_dir / "checkpoint4.pt")
    assert averaged["averaged_checkpoints"] == [
        str((ckpt_dir / "checkpoint3.pt").resolve()),
        str((ckpt_dir / "checkpoint4.pt").resolve()),
    ]
    n_float = 0
    for name, value in averaged["model"].items():
        if value.is_floating_point():
            n_float += 1
            expected = ((a["model"][name].double() + b["model"][name].double()) / 2).to(value.dtype)
            torch.testing.assert_close(value, expected, rtol=0, atol=0)
        else:
            assert torch.equal(value, b["model"][name])
    assert n_float > 10
    # two different checkpoints: the average is neither of them
    name = "encoder.layers.0.fc1.weight"
    assert not torch.equal(averaged["model"][name], b["model"][name])
    # inputs untouched, no temp file left next to the output
    assert before == {p: sha(p) for p in ckpt_dir.glob("*.pt")}
    assert [p.name for p in tmp_path.iterdir()] == ["avg.pt"]
    # fairseq (through the plugin's torch>=2.6 loader) builds a model from it
    from fairseq import checkpoint_utils

    models, _cfg, _task = checkpoint_utils.load_model_ensemble_and_task(
        [str(out)], arg_overrides={"data": str(ckpt_dir.parent / "bin")}
    )
    torch.testing.assert_close(models[0].state_dict()[name], averaged["model"][name])


def test_upper_bound_update_checkpoints_and_files(ckpt_dir, tmp_path):
    out = tmp_path / "a.pt"
    proc = average("--inputs", ckpt_dir, "--num-epoch-checkpoints", "2",
                   "--checkpoint-upper-bound", "2", "--output", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [Path(p).name for p in load(out)["averaged_checkpoints"]] == [
        "checkpoint1.pt", "checkpoint2.pt"
    ]  # fmt: skip
    updates = sorted(ckpt_dir.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.split("_")[2]))
    assert len(updates) >= 3
    proc = average("--inputs", ckpt_dir, "--num-update-checkpoints", "3", "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert [Path(p).name for p in load(out)["averaged_checkpoints"]] == [
        p.name for p in updates[-3:]
    ]
    files = [ckpt_dir / "checkpoint1.pt", ckpt_dir / "checkpoint4.pt"]
    proc = average("--inputs", *files, "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert [Path(p).name for p in load(out)["averaged_checkpoints"]] == [f.name for f in files]


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "realformer-average-checkpoints"
    if not exe.exists():
        pytest.skip("console script not installed (pip install -e .)")
    proc = subprocess.run([exe, "--help"], stdout=subprocess.PIPE, text=True)
    assert proc.returncode == 0 and "--num-epoch-checkpoints" in proc.stdout


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 1  # every console command's one-line error (was 2 here)
    lines = [l for l in proc.stderr.splitlines() if "error:" in l]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("realformer-average-checkpoints: error: ")
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert str(needle) in lines[0], lines[0]


def test_refuses_to_overwrite_an_input(ckpt_dir, tmp_path):
    target = ckpt_dir / "checkpoint4.pt"
    digest = sha(target)
    proc = average_subprocess(
        "--inputs", ckpt_dir, "--num-epoch-checkpoints", "2", "--output", target
    )
    assert_one_line_error(proc, target, "one of the inputs")
    # the same file under another name (symlink) is caught too
    link = tmp_path / "link.pt"
    link.symlink_to(target)
    proc = average("--inputs", ckpt_dir / "checkpoint3.pt", target, "--output", link)
    assert_one_line_error(proc, "one of the inputs")
    assert sha(target) == digest


def _modified_copy(src, dst, edit):
    state = load(src)
    edit(state)
    torch.save(state, dst)
    return dst


def test_refuses_different_architectures(ckpt_dir, tmp_path):
    def rename_arch(state):  # same parameters, different model (no residual attention)
        state["cfg"]["model"].arch = "admin_transformer_tiny"
        state["cfg"]["model"].residual_attention = "none"
        state["cfg"]["model"]._name = "admin_transformer_tiny"

    other = _modified_copy(ckpt_dir / "checkpoint3.pt", tmp_path / "admin.pt", rename_arch)
    out = tmp_path / "out.pt"
    proc = average("--inputs", ckpt_dir / "checkpoint4.pt", other, "--output", out)
    assert_one_line_error(proc, other, ckpt_dir / "checkpoint4.pt", "admin_transformer_tiny",
                          "refusing")  # fmt: skip
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


def test_refuses_different_parameter_shapes_and_names(ckpt_dir, tmp_path):
    name = "encoder.layers.0.fc1.weight"

    def widen(state):
        w = state["model"][name]
        state["model"][name] = torch.zeros(w.shape[0] * 2, w.shape[1], dtype=w.dtype)

    def drop(state):
        del state["model"][name]

    out = tmp_path / "out.pt"
    wide = _modified_copy(ckpt_dir / "checkpoint3.pt", tmp_path / "wide.pt", widen)
    proc = average("--inputs", ckpt_dir / "checkpoint4.pt", wide, "--output", out)
    assert_one_line_error(proc, wide, name, "shape")
    fewer = _modified_copy(ckpt_dir / "checkpoint3.pt", tmp_path / "fewer.pt", drop)
    proc = average("--inputs", ckpt_dir / "checkpoint4.pt", fewer, "--output", out)
    assert_one_line_error(proc, fewer, name)
    assert not out.exists()


def test_bad_inputs_give_one_line_errors(ckpt_dir, tmp_path):
    out = tmp_path / "out.pt"
    proc = average("--inputs", ckpt_dir, "--num-epoch-checkpoints", "9", "--output", out)
    assert_one_line_error(proc, ckpt_dir, "found 4")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    proc = average("--inputs", ckpt_dir / "checkpoint4.pt", junk, "--output", out)
    assert_one_line_error(proc, junk, "cannot be read")
    proc = average("--inputs", tmp_path / "nope.pt", "--output", out)
    assert_one_line_error(proc, tmp_path / "nope.pt", "no such checkpoint")
    assert not out.exists()


def test_non_float_tensors_must_agree():
    a = {"model": {"w": torch.ones(2), "step": torch.tensor([1])}, "cfg": None}
    b = {"model": {"w": torch.zeros(2), "step": torch.tensor([2])}, "cfg": None}
    with pytest.raises(avg.AverageError, match="non-float tensor step differs"):
        avg.average_states(["a.pt", "b.pt"], [a, b])
    b["model"]["step"] = torch.tensor([1])
    out = avg.average_states(["a.pt", "b.pt"], [a, b])
    torch.testing.assert_close(out["w"], torch.full((2,), 0.5))
