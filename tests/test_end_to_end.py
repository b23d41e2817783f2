"""fairseq-train --user-dir realformer_fairseq, then fairseq-generate (beam 5,
lenpen 0.8) and fairseq-interactive on the checkpoint, with no environment
variable for torch.load's weights_only default; and the checkpoint loader's
allow-list."""

import os
import pickle
import re
import subprocess

import pytest
import sacrebleu
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
    translation_train_args,
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


def generated_lines(generate_output: str, kind: str):
    """The ``H`` (hypothesis) or ``T`` (reference) texts of fairseq-generate, in test-set order."""
    texts = {}
    for line in generate_output.splitlines():
        if line.startswith(f"{kind}-"):
            fields = line.split("\t")
            texts[int(fields[0][2:])] = fields[-1]
    return [texts[i] for i in sorted(texts)]


def test_generate_beam5_lenpen_loads_the_plugin_checkpoint_and_scores_its_hypotheses(
    trained, monkeypatch
):
    _, data_bin, checkpoint, _ = trained
    for key in [k for k in os.environ if k.startswith("TORCH_FORCE")]:
        monkeypatch.delenv(key)
    out = generate(data_bin, checkpoint, extra=("--beam", "5", "--lenpen", "0.8"))
    hyps = generated_lines(out, "H")
    refs = generated_lines(out, "T")
    assert len(hyps) == len(refs) == 43  # all (see --required-batch-size-multiple in harness)
    assert "Unsupported global" not in out
    # fairseq's BLEU line is the score of the hypotheses it printed: recomputed here with
    # SacreBLEU on the same tokenized text (no further tokenisation, no smoothing)
    bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", smooth_method="none", force=True)
    assert parse_bleu(out) == pytest.approx(bleu.score, abs=0.01)
    line = re.search(
        r"BLEU4 = [\d.]+, ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) .*syslen=(\d+), reflen=(\d+)", out
    )
    assert line, out[-2000:]
    printed_precisions = [float(line.group(i)) for i in range(1, 5)]
    assert printed_precisions == pytest.approx(bleu.precisions, abs=0.06)
    assert (int(line.group(5)), int(line.group(6))) == (bleu.sys_len, bleu.ref_len)
    # the checkpoint's weights (and ADMIN omega) were really used: this model with its
    # initial weights (measured with --lr 1e-12) decodes degenerate repetitions with a
    # unigram precision of 0.0 on these 43 sentences; after its 40 updates, 25.2
    assert bleu.precisions[0] > 15.0


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


def run_status(cmd, env=None):
    """(exit status, stdout + stderr) of a command that may fail."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=full_env)  # fmt: skip
    return proc.returncode, proc.stdout


def test_truncated_checkpoint_is_one_line_in_every_command_and_an_exception_in_the_hub(
    trained, tmp_path
):
    """A checkpoint cut to half its size: fairseq-generate, realformer-attention-stats and a
    fairseq-train resuming from it stop with one line naming the file and its size, exit 1; the
    hub raises RealformerCheckpointError, a ValueError (fairseq 0.12.3 alone: a RuntimeError
    traceback of torch's zip reader everywhere)."""
    from realformer_fairseq.errors import RealformerCheckpointError
    from realformer_fairseq.models.realformer_transformer import RealformerTransformerModel

    root, data_bin, checkpoint, _ = trained
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    truncated = save_dir / "checkpoint_last.pt"
    data = checkpoint.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    line = (
        f"realformer_fairseq: error: {truncated}: truncated or corrupt checkpoint "
        f"({len(data) // 2} bytes; torch.load: PytorchStreamReader failed reading zip archive: "
        "failed finding central directory); copy or save it again, or use another checkpoint"
    )
    (tmp_path / "input.bpe").write_text("a man .\n", encoding="utf-8")
    commands = {
        "generate": [fairseq_command("fairseq-generate"), data_bin, "--user-dir", USER_DIR,
                     "--path", truncated, "--cpu", "--beam", "2"],
        "attention-stats": [fairseq_command("realformer-attention-stats"), "--path", truncated,
                            "--input", tmp_path / "input.bpe", "--out-dir", tmp_path / "stats",
                            "--cpu", "--no-plots"],
        "resume": [fairseq_command("fairseq-train"),
                   *translation_train_args(data_bin, save_dir, max_update=45)],
    }  # fmt: skip
    for name, cmd in commands.items():
        status, out = run_status(cmd)
        assert "Traceback" not in out, (name, out[-3000:])
        assert status == 1, (name, out[-2000:])  # every console command's one-line error: 1
        want = line
        if name == "attention-stats":  # the plugin's own command: its own name
            want = line.replace("realformer_fairseq:", "realformer-attention-stats:")
        assert out.strip().splitlines()[-1] == want, (name, out[-2000:])
    with pytest.raises(RealformerCheckpointError) as err:
        RealformerTransformerModel.from_pretrained(
            str(save_dir), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data_bin)
        )
    assert isinstance(err.value, ValueError) and f"realformer_fairseq: error: {err.value}" == line
