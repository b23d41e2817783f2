"""Decoder-only RealFormer LMs (He et al. 2020, arXiv 2012.11747) end to end through
fairseq's own commands: fairseq-preprocess --only-source, fairseq-train --task
language_modeling, fairseq-eval-lm (perplexity against a full-forward computation of
the same text, every --sample-break-mode), hub from_pretrained().sample(), and
fairseq-hydra-train. One tiny trained checkpoint per module."""

import math
import re
from pathlib import Path

import pytest
import torch
from harness import (
    USER_DIR,
    fairseq_command,
    fairseq_preprocess,
    parse_train_losses,
    run,
    shared_data,
)

from realformer_fairseq.models.realformer_lm import RealformerLanguageModel
from realformer_fairseq.modules.admin import AdminResidual
from realformer_fairseq.modules.routes import RealformerMultiheadAttention
from studies.text import LM_PUNCTUATION, split_words

N_TRAIN, N_VALID = 1000, 100
TRAIN_UPDATES = 30


def tokenize(line: str) -> str:
    return split_words(line, LM_PUNCTUATION)  # as studies.lm_comparison


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    """Multi30k English (lower-cased, punctuation split), word-level dictionary."""
    root = tmp_path_factory.mktemp("lm_data")
    for split, name, n in (("train", "train", N_TRAIN), ("valid", "val", N_VALID)):
        with open(shared_data("multi30k", f"{name}.en"), encoding="utf-8") as fh:
            lines = [tokenize(line) for _, line in zip(range(n), fh)]
        (root / f"{split}.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    data_bin = root / "bin"
    fairseq_preprocess(
        [
            "--only-source",
            "--trainpref", root / "train.txt", "--validpref", root / "valid.txt",
            "--destdir", data_bin, "--thresholdsrc", "2", "--workers", "1",
        ]
    )  # fmt: skip
    return root, data_bin


def train_lm_args(data_bin: Path, save_dir: Path, arch: str = "realformer_lm_tiny"):
    return [
        data_bin, "--user-dir", USER_DIR, "--task", "language_modeling", "--arch", arch,
        "--tokens-per-sample", "64", "--sample-break-mode", "complete",
        "--max-target-positions", "1024",  # so that eval-lm can use 1024-token blocks
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
        "--criterion", "cross_entropy", "--max-tokens", "512",
        "--max-update", str(TRAIN_UPDATES), "--disable-validation",
        "--save-dir", save_dir, "--no-epoch-checkpoints",
        "--log-format", "simple", "--log-interval", "1",
        "--num-workers", "0", "--seed", "1", "--cpu",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def trained(lm_data, tmp_path_factory):
    _, data_bin = lm_data
    save_dir = tmp_path_factory.mktemp("lm_ck")
    output = run([fairseq_command("fairseq-train"), *train_lm_args(data_bin, save_dir)])
    return save_dir / "checkpoint_last.pt", output


def load(checkpoint: Path):
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    return models[0].eval(), cfg, task


def assert_realformer_admin_lm(model, layers=2):
    """The built model is the RealFormer+ADMIN LM of realformer_lm_tiny, profiled."""
    assert isinstance(model, RealformerLanguageModel)
    assert len(model.decoder.layers) == layers
    for layer in model.decoder.layers:
        assert isinstance(layer.self_attn, RealformerMultiheadAttention)
        assert layer.self_attn.residual_attention_mode == "sum"
        assert layer.encoder_attn is None and layer.normalize_before is False
        assert layer.self_attn_residual.admin and layer.ffn_residual.admin
    assert int(model.admin_profiled) == 1
    omegas = [float(m.omega_init) for m in model.modules() if isinstance(m, AdminResidual)]
    assert len(omegas) == 2 * layers and omegas[0] == 1.0 and all(w > 1.0 for w in omegas[1:])


def test_train_builds_and_profiles_the_realformer_lm(trained):
    checkpoint, output = trained
    assert output.count("ADMIN profiling done on the first training batch: 4 sublayers") == 1
    losses = parse_train_losses(output)
    assert len(losses) == TRAIN_UPDATES
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0
    model, cfg, _ = load(checkpoint)
    assert cfg.model.arch == "realformer_lm_tiny"
    assert_realformer_admin_lm(model)


# ---------------------------------------------------------------------------
# fairseq-eval-lm == a full forward of the same text


def blocks_of(sentences, mode: str, block: int):
    """(start, end) offsets into the concatenated token stream, as fairseq's
    TokenBlockDataset cuts them for --sample-break-mode ``mode``."""
    sizes = [len(s) for s in sentences]
    if mode == "eos":
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [(s, s + n) for s, n in zip(starts, sizes)]
    if mode == "none":
        total = sum(sizes)
        return [(s, min(s + block, total)) for s in range(0, total, block)]
    assert mode == "complete"  # whole sentences, greedily packed up to ``block``
    out, start, cur = [], 0, 0
    for n in sizes:
        if cur + n > block and cur > 0:
            out.append((start, start + cur))
            start, cur = start + cur, 0
        cur += n
    out.append((start, start + cur))
    return out


def full_forward_loss_base2(
    model, dictionary, lines, mode: str, block: int, context: int = 0
) -> float:
    """Mean -log2 p(token) over the text, each block scored by one full forward of
    ``[token before the block, or eos] + block[:-1]`` (no incremental state), preceded by
    the ``context`` input tokens before the block (``--context-window``; they are not
    scored)."""
    sentences = [dictionary.encode_line(x, add_if_not_exist=False) for x in lines]
    stream = torch.cat(sentences)
    inputs = torch.cat([torch.tensor([dictionary.eos()]), stream[:-1]])  # stream shifted by one
    nll, count = 0.0, 0
    with torch.no_grad():
        for start, end in blocks_of(sentences, mode, block):
            target = stream[start:end].unsqueeze(0)
            prev = inputs[max(0, start - context) : end].unsqueeze(0)
            lprobs = model.get_normalized_probs(model(prev), log_probs=True)
            lprobs = lprobs[:, prev.size(1) - target.size(1) :]
            nll -= lprobs.gather(-1, target.unsqueeze(-1)).sum().item()
            count += target.numel()
    assert count == stream.numel()
    return nll / count / math.log(2)


def eval_lm_command(data_bin, checkpoint, mode: str, block: int):
    return [
        data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "valid",
        "--sample-break-mode", mode, "--tokens-per-sample", str(block),
        "--max-tokens", "2048", "--num-workers", "0", "--cpu",
    ]  # fmt: skip


def eval_lm_in_process(data_bin, checkpoint, mode: str, block: int, extra=()) -> float:
    """fairseq-eval-lm's own main (what the console script runs), in this process:
    its unrounded base-2 loss."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import eval_lm

    parser = options.get_eval_lm_parser()
    argv = [str(a) for a in [*eval_lm_command(data_bin, checkpoint, mode, block), *extra]]
    args = options.parse_args_and_arch(parser, argv)
    return eval_lm.main(convert_namespace_to_omegaconf(args))["loss"]


def eval_lm_cli(data_bin, checkpoint, mode: str, block: int):
    """The fairseq-eval-lm command: (tokens evaluated, printed base-2 loss)."""
    out = run(
        [fairseq_command("fairseq-eval-lm"), *eval_lm_command(data_bin, checkpoint, mode, block)]
    )
    tokens = re.search(r"Evaluated ([\d,]+) tokens", out)
    loss = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", out)
    assert tokens and loss, out[-2000:]
    return int(tokens.group(1).replace(",", "")), float(loss.group(1))


@pytest.mark.parametrize(
    "mode,block", [("eos", 1024), ("none", 1024), ("none", 50), ("complete", 1024)]
)
def test_eval_lm_perplexity_equals_a_full_forward(lm_data, trained, mode, block):
    root, data_bin = lm_data
    checkpoint, _ = trained
    model, _, task = load(checkpoint)
    lines = (root / "valid.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == N_VALID
    expected = full_forward_loss_base2(model, task.source_dictionary, lines, mode, block)
    assert math.isfinite(expected) and 4.0 < expected < 12.0  # trained for a few updates
    assert eval_lm_in_process(data_bin, checkpoint, mode, block) == pytest.approx(
        expected, abs=1e-5
    )


def test_eval_lm_context_window_scores_each_block_after_its_context(lm_data, trained):
    """``fairseq-eval-lm --context-window 25`` (fairseq's ``test_transformer_lm``): blocks of
    ``--tokens-per-sample`` minus 25 tokens, each scored after the 25 tokens before it."""
    root, data_bin = lm_data
    checkpoint, _ = trained
    model, _, task = load(checkpoint)
    lines = (root / "valid.txt").read_text(encoding="utf-8").splitlines()
    d = task.source_dictionary
    with_context = full_forward_loss_base2(model, d, lines, "none", 25, context=25)
    without = full_forward_loss_base2(model, d, lines, "none", 25)
    assert with_context < without - 0.01  # the context helps the trained model
    loss = eval_lm_in_process(data_bin, checkpoint, "none", 50, extra=["--context-window", "25"])
    assert loss == pytest.approx(with_context, abs=1e-5)


# ---------------------------------------------------------------------------
# hub


def test_hub_from_pretrained_samples_and_scores(lm_data, trained):
    _, data_bin = lm_data
    checkpoint, _ = trained
    hub = RealformerLanguageModel.from_pretrained(
        str(checkpoint.parent), checkpoint_file=checkpoint.name, data_name_or_path=str(data_bin)
    )
    assert_realformer_admin_lm(hub.models[0])
    torch.manual_seed(1)
    sampled = hub.sample("a man is", beam=1, sampling=True, sampling_topk=20, max_len_b=8)
    assert sampled.startswith("a man is ") and len(sampled.split()) > 3
    beam_a = hub.sample(["a man is", "two dogs"], beam=4, max_len_b=8)
    beam_b = hub.sample(["a man is", "two dogs"], beam=4, max_len_b=8)
    assert beam_a == beam_b and beam_a[1].startswith("two dogs")
    # hub scoring (fairseq's SequenceScorer) equals a full forward
    sentence = "a man is riding a bike ."
    scored = hub.score(sentence)
    tokens = hub.task.source_dictionary.encode_line(sentence, add_if_not_exist=False).long()
    tokens = tokens[:-1]  # the hub scores the words, without the final eos
    assert torch.equal(scored["tokens"], tokens) and len(tokens) == 7
    model = hub.models[0]
    prev = torch.cat([torch.tensor([hub.task.source_dictionary.eos()]), tokens[:-1]])
    with torch.no_grad():
        lprobs = model.get_normalized_probs(model(prev.unsqueeze(0)), log_probs=True)[0]
    full = lprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(scored["positional_scores"], full, atol=1e-5, rtol=0)


def test_from_pretrained_has_no_fairseq_lm_downloads():
    """fairseq's transformer_lm.* hub names are vanilla checkpoints: not offered."""
    assert RealformerLanguageModel.hub_models() == {}


# ---------------------------------------------------------------------------
# fairseq-hydra-train

HYDRA_CONFIG = """# @package _group_
common:
  user_dir: {user_dir}
  cpu: true
  log_format: simple
  log_interval: 1
  seed: 1
task:
  _name: language_modeling
  data: {data}
  tokens_per_sample: 64
  sample_break_mode: complete
model:
  _name: realformer_lm_tiny
  max_target_positions: 1024
criterion: cross_entropy
optimizer:
  _name: adam
  adam_betas: (0.9,0.98)
lr_scheduler:
  _name: inverse_sqrt
  warmup_updates: 5
optimization:
  max_update: 10
  lr: [0.002]
dataset:
  max_tokens: 512
  num_workers: 0
  disable_validation: true
checkpoint:
  save_dir: {save_dir}
  no_epoch_checkpoints: true
"""


def test_hydra_train_builds_the_same_model(lm_data, tmp_path):
    """fairseq-hydra-train hands the model a DictConfig (and the checkpoint stores
    one): the layers must still be RealFormer + ADMIN, and eval-lm must load it."""
    _, data_bin = lm_data
    save_dir = tmp_path / "ck"
    (tmp_path / "lm.yaml").write_text(
        HYDRA_CONFIG.format(user_dir=USER_DIR, data=data_bin, save_dir=save_dir),
        encoding="utf-8",
    )
    output = run(
        [
            fairseq_command("fairseq-hydra-train"),
            "--config-dir", tmp_path, "--config-name", "lm",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        cwd=tmp_path,
    )  # fmt: skip
    assert output.count("ADMIN profiling done on the first training batch: 4 sublayers") == 1
    assert "num_updates=10" in output
    model, cfg, task = load(save_dir / "checkpoint_last.pt")
    assert not isinstance(cfg.model, dict) and cfg.model._name == "realformer_lm_tiny"
    assert_realformer_admin_lm(model)
    assert model.decoder.max_positions() == 1024
    # the fairseq-eval-lm command on the hydra checkpoint: every valid token, and the
    # loss of a full forward
    n_tokens, loss = eval_lm_cli(data_bin, save_dir / "checkpoint_last.pt", "eos", 1024)
    lines = (lm_data[0] / "valid.txt").read_text(encoding="utf-8").splitlines()
    assert n_tokens == sum(len(x.split()) + 1 for x in lines)
    expected = full_forward_loss_base2(model, task.source_dictionary, lines, "eos", 1024)
    assert loss == pytest.approx(expected, abs=1e-4)  # printed with 4 decimals
