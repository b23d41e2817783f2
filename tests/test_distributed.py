"""Data-parallel fairseq-train on CPU: two gloo ranks behave as one process.

fairseq 0.12 on CPU (see docs/guarantees.md):
- ``--ddp-backend pytorch_ddp`` (the default) passes ``device_ids=[device_id]``
  to torch's DistributedDataParallel, which refuses CPU modules; fairseq's own
  ``legacy_ddp`` all-reduces the gradients with gloo.
- torchrun's environment makes fairseq compute ``rank % torch.cuda.device_count()``
  (ZeroDivisionError without a GPU), so each rank gets ``--distributed-init-method``,
  ``--distributed-rank`` and ``--distributed-no-spawn`` explicitly.

Each rank runs fairseq's own ``cli_main``; a test-side launcher only saves that
rank's model state when training is over (fairseq writes checkpoints on rank 0
only), so that the ranks can be compared with each other and with one process
that sees the same two batches per update (``--update-freq 2``).
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import harness
import pytest
import torch

from realformer_fairseq.checkpoint_compat import fairseq_checkpoint_globals

LAUNCHER = '''"""Test-side: fairseq-train's cli_main, then save this rank's model state."""
import os
import sys

import torch
from fairseq import trainer as fairseq_trainer

if os.environ.get("REALFORMER_TEST_NO_OMEGA_BROADCAST"):
    from realformer_fairseq.modules import admin

    admin.broadcast_omega = lambda model, src=0: None  # what the test must catch

trainers = []
_init = fairseq_trainer.Trainer.__init__


def _record(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    trainers.append(self)


fairseq_trainer.Trainer.__init__ = _record
from fairseq_cli.train import cli_main  # noqa: E402

out = sys.argv.pop(1)
sys.argv[0] = "fairseq-train"
cli_main()
state = trainers[0].get_model().state_dict()
torch.save({k: v.detach().clone() for k, v in state.items()}, out)
'''

UPDATES = 4


def train_args(data_bin: Path, save_dir: Path, *extra) -> List[str]:
    """realformer_tiny (all three chains, ADMIN profiled on the first batch);
    dropout 0 so that a rank's batch sees the same arithmetic as in one process."""
    return harness.translation_train_args(
        data_bin, save_dir, max_update=UPDATES, extra=("--dropout", "0", *extra)
    )


def env(**extra) -> Dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **extra)


def run_command(cmd: List) -> str:
    """Run ``cmd`` (``env()``, 10 minutes at most); assert that it succeeded; its output."""
    proc = subprocess.run(
        cmd,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


def run_ranks(launcher: Path, out_dir: Path, args: List[str], world_size=2, **extra_env):
    """Start ``world_size`` fairseq-train ranks (gloo, tcp://); return their logs."""
    init = f"tcp://127.0.0.1:{harness.free_port()}"
    procs = []
    for rank in range(world_size):
        cmd = [sys.executable, launcher, out_dir / f"rank{rank}.pt", *args]
        cmd += ["--distributed-world-size", str(world_size), "--distributed-rank", str(rank)]
        cmd += ["--distributed-init-method", init, "--distributed-no-spawn"]
        cmd += ["--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
        procs.append(
            subprocess.Popen(
                [str(c) for c in cmd],
                env=env(**extra_env),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=600)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{log[-4000:]}"
        assert f"distributed init (rank {rank})" in log
    return logs


def losses(log: str) -> List[str]:
    """Per-update losses (fairseq's format, or logging's default one that a
    launcher importing fairseq first ends up with: ``INFO:train_inner:...``)."""
    return re.findall(r"train_inner(?: \| |:)epoch .*? loss=([\d.]+),", log)


def load(path: Path) -> Dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu")


def omega_init(state):
    return {k: v for k, v in state.items() if k.endswith("omega_init")}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    raw = harness.make_multi30k_subset(root / "raw", n_train=400, n_valid=50, n_test=10)
    data_bin = harness.preprocess(raw, root / "data-bin")
    launcher = root / "launch_rank.py"
    launcher.write_text(LAUNCHER, encoding="utf-8")
    # one process, two batches per update: the global batch of two ranks
    single_dir = root / "single"
    single_dir.mkdir()
    single_log = run_command(
        [sys.executable, launcher, single_dir / "state.pt"]
        + train_args(data_bin, single_dir, "--update-freq", "2")
    )
    assert single_log.count("ADMIN profiling done") == 1
    return {
        "data_bin": data_bin,
        "launcher": launcher,
        "single_log": single_log,
        "single_state": load(single_dir / "state.pt"),
    }


@pytest.mark.slow
def test_two_gloo_ranks_agree_with_each_other_and_with_one_process(setup, tmp_path):
    """-m slow (25 s of CPU: three fresh fairseq-train processes), as this file's other tests."""
    profile = tmp_path / "omega.json"
    args = train_args(setup["data_bin"], tmp_path, "--admin-profile-out", str(profile))
    logs = run_ranks(setup["launcher"], tmp_path, args)
    rank0, rank1 = load(tmp_path / "rank0.pt"), load(tmp_path / "rank1.pt")

    # every parameter and buffer (ADMIN's omega_init, admin_profiled) identical across ranks
    assert rank0.keys() == rank1.keys()
    different = [k for k in rank0 if not torch.equal(rank0[k], rank1[k])]
    assert not different, f"ranks disagree on {different[:5]}"
    omegas = omega_init(rank0)
    assert len(omegas) == 10 and int(rank0["admin_profiled"]) == 1
    assert any(float(v) != 1.0 for v in omegas.values()), "omega was never profiled"
    assert logs[0].count("ADMIN profiling done") == 1  # rank 0 logs at INFO
    # --admin-profile-out (written by rank 0) holds the omega every rank uses
    written = json.loads(profile.read_text(encoding="utf-8"))["omega"]
    assert {f"{name}.omega_init": value for name, value in written.items()} == {
        k: float(v) for k, v in omegas.items()
    }

    # and equal to one process with the same global batch
    single = setup["single_state"]
    assert single.keys() == rank0.keys()
    for k in single:
        torch.testing.assert_close(rank0[k], single[k], rtol=1e-5, atol=1e-6, msg=k)
    assert losses(logs[0]) == losses(setup["single_log"])
    assert len(losses(logs[0])) == UPDATES

    # fairseq's checkpoint (written by rank 0) holds the same state
    with torch.serialization.safe_globals(fairseq_checkpoint_globals()):
        ckpt = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu")["model"]
    assert all(torch.equal(ckpt[k], rank0[k]) for k in rank0)


@pytest.mark.slow
def test_without_omega_broadcast_the_ranks_would_disagree(setup, tmp_path):
    """The check above can fail: with broadcast_omega disabled, each rank keeps
    the omega profiled on its own first batch."""
    run_ranks(
        setup["launcher"],
        tmp_path,
        train_args(setup["data_bin"], tmp_path),
        REALFORMER_TEST_NO_OMEGA_BROADCAST="1",
    )
    rank0, rank1 = load(tmp_path / "rank0.pt"), load(tmp_path / "rank1.pt")
    differ = [k for k in omega_init(rank0) if not torch.equal(rank0[k], rank1[k])]
    assert differ, "ranks agree on omega even without the broadcast: the test above proves nothing"


@pytest.mark.slow
def test_torchrun_cpu_command(setup, tmp_path):
    """The torchrun command of docs/guarantees.md (CPU, gloo) trains like one process."""
    bin_dir = Path(sys.executable).parent
    args = " ".join(shlex.quote(a) for a in train_args(setup["data_bin"], tmp_path))
    script = (
        f"exec {shlex.quote(str(bin_dir / 'fairseq-train'))} {args} --distributed-world-size 2 "
        "--distributed-backend gloo --ddp-backend legacy_ddp "
        "--distributed-init-method env:// --distributed-rank $RANK --distributed-no-spawn"
    )
    log = run_command(
        [
            str(bin_dir / "torchrun"),
            "--nproc_per_node",
            "2",
            "--master_port",
            str(harness.free_port()),
            "--no-python",
            "bash",
            "-c",
            script,
        ]
    )
    assert "distributed init (rank 1): env://" in log
    assert losses(log) == losses(setup["single_log"])
