"""Resuming fairseq-train from checkpoint_last.pt continues the same run.

An uninterrupted run of N updates is compared with one stopped after K updates
and restarted (same command, larger ``--max-update``): the training losses of
updates K+1..N and the final parameters are bit-identical, and ADMIN's omega is
not profiled again (``admin_profiled`` and ``omega_init`` are in the state dict).

fairseq detail: ``FairseqTask.get_batch_iterator`` orders the examples under the
numpy seed ``seed + epoch`` of the epoch in which the batch iterator is *built*;
an uninterrupted run builds it once (epoch 1) and reuses it, while a run resumed
in epoch >= 2 builds it anew, so equal-length sentences tie-break differently
and the batches differ. ``--update-epoch-batch-itr True`` rebuilds the batches
every epoch, resumed or not, which makes resuming in any epoch exact; without it
resuming is exact within epoch 1 (tested both ways; the epoch boundary in -m slow).
"""

import os
import re
import subprocess
from pathlib import Path
from typing import Dict, Tuple

import harness
import pytest
import torch

from realformer_fairseq.checkpoint_compat import fairseq_checkpoint_globals

PROFILED = "ADMIN profiling done"
REBUILD_BATCHES = ("--update-epoch-batch-itr", "True")


def train(data_bin: Path, save_dir: Path, *stop_and_extra) -> str:
    """realformer_tiny with ADMIN profiling and dropout 0.1, logging every update."""
    cmd = [
        harness.fairseq_command("fairseq-train"),
        *harness.translation_train_args(
            data_bin, save_dir, extra=("--dropout", "0.1", *stop_and_extra), epoch_checkpoints=True
        ),
    ]
    # every run fresh: runs compared for determinism must not share the fork server's hash seed
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **harness.FRESH_PROCESS)
    proc = subprocess.run(
        [str(c) for c in cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.returncode == 0, f"fairseq-train failed:\n{proc.stdout[-4000:]}"
    return proc.stdout


def losses_by_update(log: str) -> Dict[int, Tuple[str, str, str]]:
    """num_updates -> (epoch, loss, nll_loss) as fairseq prints them (train_inner)."""
    pattern = (
        r"train_inner \| epoch (\d+):.*? loss=([\d.]+), nll_loss=([\d.]+),.*?num_updates=(\d+)"
    )
    return {int(m.group(4)): m.group(1, 2, 3) for m in re.finditer(pattern, log)}


def load_model_state(path: Path) -> Dict[str, torch.Tensor]:
    with torch.serialization.safe_globals(fairseq_checkpoint_globals()):
        return torch.load(path, map_location="cpu")["model"]


def assert_same_state(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]):
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def omega_init(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if k.endswith("omega_init")}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    raw = harness.make_multi30k_subset(root / "raw", n_train=400, n_valid=50, n_test=10)
    return harness.preprocess(raw, root / "data-bin")


@pytest.fixture(scope="module")
def reference(data_bin, tmp_path_factory):
    """Uninterrupted: two epochs, batches rebuilt every epoch; keeps
    checkpoint1.pt (end of epoch 1) and checkpoint_last.pt (end of epoch 2)."""
    save_dir = tmp_path_factory.mktemp("uninterrupted")
    log = train(data_bin, save_dir, "--max-epoch", "2", *REBUILD_BATCHES)
    losses = losses_by_update(log)
    per_epoch = sum(1 for epoch, _, _ in losses.values() if int(epoch) == 1)
    assert per_epoch >= 4, f"need >= 4 updates per epoch for this test, got {per_epoch}"
    assert max(losses) == 2 * per_epoch
    return {"log": log, "save_dir": save_dir, "per_epoch": per_epoch}


def check_resume(reference, first: str, resumed: str, k: int, n: int):
    assert first.count(PROFILED) == 1
    assert PROFILED not in resumed, "ADMIN omega was profiled again after resuming"
    loaded = rf"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ {k} updates\)"
    assert re.search(loaded, resumed), "the second run did not resume from checkpoint_last.pt"
    ref = losses_by_update(reference["log"])
    got = losses_by_update(resumed)
    assert sorted(got) == list(range(k + 1, n + 1))
    for update in range(k + 1, n + 1):
        assert (
            got[update] == ref[update]
        ), f"update {update}: resumed {got[update]} vs {ref[update]}"


def test_resume_mid_epoch(data_bin, reference, tmp_path):
    """Stop inside epoch 1, resume to its end: default fairseq flags."""
    n = reference["per_epoch"]
    k = n - 2
    first = train(data_bin, tmp_path, "--max-update", str(k))
    after_k = load_model_state(tmp_path / "checkpoint_last.pt")
    assert int(after_k["admin_profiled"]) == 1
    resumed = train(data_bin, tmp_path, "--max-update", str(n))
    check_resume(reference, first, resumed, k, n)
    final = load_model_state(tmp_path / "checkpoint_last.pt")
    assert_same_state(final, load_model_state(reference["save_dir"] / "checkpoint1.pt"))
    assert_same_state(omega_init(final), omega_init(after_k))


@pytest.mark.slow
def test_resume_at_epoch_boundary(data_bin, reference, tmp_path):
    """Stop at the end of epoch 1, resume through epoch 2 (batches rebuilt per epoch). -m slow
    (16 s of CPU: two fresh fairseq-train runs); the default suite resumes mid-epoch."""
    k = reference["per_epoch"]
    first = train(data_bin, tmp_path, "--max-update", str(k), *REBUILD_BATCHES)
    after_k = load_model_state(tmp_path / "checkpoint_last.pt")
    resumed = train(data_bin, tmp_path, "--max-epoch", "2", *REBUILD_BATCHES)
    check_resume(reference, first, resumed, k, 2 * k)
    final = load_model_state(tmp_path / "checkpoint_last.pt")
    assert_same_state(final, load_model_state(reference["save_dir"] / "checkpoint_last.pt"))
    assert_same_state(omega_init(final), omega_init(after_k))
    assert any(float(v) != 1.0 for v in omega_init(final).values()), "omega was never profiled"
