"""fairseq-train --user-dir realformer_fairseq, then fairseq-generate (beam 5,
lenpen 0.8) and fairseq-interactive on the checkpoint, with no environment
variable for torch.load's weights_only default; and the checkpoint loader's
allow-list."""

import os
import pickle

import pytest
import torch
from harness import (
    USER_DIR,
    fairseq_command,
    generate,
    make_multi30k_subset,
    parse_bleu,
    parse_train_losses,
    preprocess,
    run,
    train_translation,
)

CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    raw = make_multi30k_subset(root / "raw", n_train=2000, n_valid=100, n_test=43)
    data_bin = preprocess(raw, root / "bin")
    log = train_translation(data_bin, root / "ckpt", arch="realformer_tiny", max_update=40)
    return root, data_bin, root / "ckpt" / "checkpoint_last.pt", log


def test_train_logs_profiling_and_the_loss_goes_down(trained):
    _, _, checkpoint, log = trained
    assert "ADMIN profiling done" in log
    losses = parse_train_losses(log)
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0
    assert checkpoint.exists()


def test_generate_with_beam5_lenpen_on_a_plugin_checkpoint(trained, monkeypatch):
    _, data_bin, checkpoint, _ = trained
    for key in [k for k in os.environ if k.startswith("TORCH_FORCE")]:
        monkeypatch.delenv(key)
    out = generate(data_bin, checkpoint, extra=("--beam", "5", "--lenpen", "0.8"))
    hyps = [line for line in out.splitlines() if line.startswith("H-")]
    assert len(hyps) == 43  # all of them (see --required-batch-size-multiple in harness)
    assert parse_bleu(out) >= 0.0
    assert "Unsupported global" not in out


def test_interactive_translates_stdin(trained):
    root, data_bin, checkpoint, _ = trained
    lines = (root / "raw" / "test.en").read_text(encoding="utf-8").splitlines()[:3]
    proc_out = run(
        [
            "bash",
            "-c",
            f"printf '%s\\n' {' '.join(repr(x) for x in lines)} | {fairseq_command('fairseq-interactive')} "
            f"{data_bin} --user-dir {USER_DIR} --path {checkpoint} -s en -t fr --beam 5 --cpu",
        ],
        env=CLEAN_ENV,
    )
    assert len([line for line in proc_out.splitlines() if line.startswith("H-")]) == 3


def test_plain_torch_load_refuses_the_checkpoint_and_the_plugin_loader_accepts_it(trained):
    from fairseq import checkpoint_utils

    _, _, checkpoint, _ = trained
    # torch >= 2.6 default: weights_only=True refuses fairseq's pickled config...
    with pytest.raises(pickle.UnpicklingError):
        torch.load(checkpoint)
    # ...and the plugin's wrapped loader reads it with the restricted unpickler
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    assert "model" in state and state["cfg"]["model"].arch == "realformer_tiny"


class _NotAllowed:
    def __reduce__(self):
        return (os.getcwd, ())


def test_plugin_loader_still_refuses_unknown_globals(tmp_path):
    from fairseq import checkpoint_utils

    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": _NotAllowed()}, path)
    with pytest.raises(pickle.UnpicklingError):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
