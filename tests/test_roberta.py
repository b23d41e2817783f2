"""Encoder-only RealFormer (BERT setting of He et al. 2020, arXiv 2012.11747):
architectures, structure, masked_lm training on real English text, ADMIN
profiling in masked_lm, and sentence_prediction fine-tuning from the MLM
checkpoint via --restore-file, all through fairseq-train --user-dir."""

import argparse
import collections
import json
import math
import re
from pathlib import Path

import pytest
import torch
from fairseq.models.roberta.model import RobertaModel
from harness import (
    LANGUAGE_ID_TASK,
)
from harness import MLM_COMMON as COMMON
from harness import MLM_TOKENS_PER_SAMPLE as TOKENS_PER_SAMPLE
from harness import (
    PAPER_BERT_SIZES,
    USER_DIR,
    fairseq_train,
    make_language_id_data,
    make_mlm_data,
    parse_valid_loss,
    toy_dictionary,
)
from harness import train_masked_lm as train_mlm

from realformer_fairseq.errors import RealformerConfigError
from realformer_fairseq.models.realformer_roberta import (
    RealformerRobertaEncoder,
    RealformerRobertaModel,
)
from realformer_fairseq.models.realformer_transformer import RealformerTransformerEncoder
from realformer_fairseq.modules.admin import AdminResidual
from realformer_fairseq.modules.routes import RealformerMultiheadAttention

# ---------------------------------------------------------------------------
# data and commands


def train_classifier(
    data_bin: Path,
    save_dir: Path,
    restore: Path,
    arch="realformer_bert_tiny",
    max_update=60,
    extra=(),
):
    return fairseq_train(
        data_bin,
        *LANGUAGE_ID_TASK,
        "--arch",
        arch,
        "--restore-file",
        restore,
        "--reset-optimizer",
        "--reset-dataloader",
        "--reset-meters",
        "--lr",
        "5e-4",
        "--warmup-updates",
        "10",
        "--max-update",
        str(max_update),
        "--best-checkpoint-metric",
        "accuracy",
        "--maximize-best-checkpoint-metric",
        "--save-dir",
        save_dir,
        *COMMON,
        *extra,
    )


def parse_valid_accuracy(output: str):
    return [
        float(m) for m in re.findall(r"valid on 'valid' subset \| .*?accuracy ([\d.]+)", output)
    ]


@pytest.fixture(scope="module")
def mlm_data(tmp_path_factory):
    return make_mlm_data(tmp_path_factory.mktemp("mlm"))


@pytest.fixture(scope="module")
def language_id_data(mlm_data, tmp_path_factory):
    return make_language_id_data(tmp_path_factory.mktemp("cls"), mlm_data / "dict.txt")


@pytest.fixture(scope="module")
def mlm_run(mlm_data, tmp_path_factory):
    """One short masked_lm run of realformer_bert_tiny (shared by two tests)."""
    save_dir = tmp_path_factory.mktemp("mlm_ck")
    output = train_mlm(mlm_data, save_dir, max_update=60)
    return save_dir, output


# ---------------------------------------------------------------------------
# in-process model building


def build_model(data_bin: Path, arch: str, *extra: str):
    """parse_args_and_arch + setup_task + build_model, as fairseq-train does."""
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            str(data_bin),
            "--user-dir",
            USER_DIR,
            "--task",
            "masked_lm",
            "--arch",
            arch,
            "--tokens-per-sample",
            str(TOKENS_PER_SAMPLE),
            "--cpu",
            *extra,
        ],
    )
    task = tasks.setup_task(args)
    return task.build_model(args), task


# ---------------------------------------------------------------------------
# architectures and structure


@pytest.mark.parametrize("size", list(PAPER_BERT_SIZES))
def test_arch_sizes_and_paper_defaults(size):
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    expected = PAPER_BERT_SIZES[size]
    for variant in ("realformer_bert", "postln_bert", "preln_bert"):
        name = f"{variant}_{size}"
        assert ARCH_MODEL_REGISTRY[name] is RealformerRobertaModel
        args = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[name](args)
        got = (
            args.encoder_layers,
            args.encoder_embed_dim,
            args.encoder_attention_heads,
            args.encoder_ffn_embed_dim,
        )
        assert got == expected
        assert args.init_type == "default"
        if variant == "realformer_bert":
            # the paper's BERT runs: running sum (no mean), Post-LN
            assert args.residual_attention == "encoder"
            assert args.residual_attention_mode == "sum"
            assert args.encoder_normalize_before is False
            assert args.layernorm_embedding is True
        else:
            assert args.residual_attention == "none"
            assert args.residual_attention_mode is None
        if variant == "preln_bert":
            assert args.encoder_normalize_before is True
            assert args.layernorm_embedding is False


def test_structure_and_extract_features(mlm_data):
    model, task = build_model(mlm_data, "realformer_bert_tiny")
    assert isinstance(model.encoder, RealformerRobertaEncoder)
    assert isinstance(model.encoder.sentence_encoder, RealformerTransformerEncoder)
    attns = [layer.self_attn for layer in model.encoder.sentence_encoder.layers]
    assert all(isinstance(a, RealformerMultiheadAttention) for a in attns)
    assert all(a.residual_attention_mode == "sum" for a in attns)

    model.eval()
    tokens = torch.tensor([[0, 10, 11, 12, 2], [0, 13, 2, 1, 1]])
    logits, extra = model(tokens, return_all_hiddens=True)
    assert logits.shape == (2, 5, len(task.source_dictionary))
    assert len(extra["inner_states"]) == 3  # embeddings + 2 layers, T x B x C
    assert extra["inner_states"][-1].shape == (5, 2, 64)
    assert all(a.calls == 1 for a in attns)  # the residual path ran in every layer
    # the last hidden state is the features RobertaEncoder hands to its LM head
    features, _ = model(tokens, features_only=True)
    torch.testing.assert_close(features, extra["inner_states"][-1].transpose(0, 1))

    baseline, _ = build_model(mlm_data, "postln_bert_tiny")
    assert not any(
        isinstance(layer.self_attn, RealformerMultiheadAttention)
        for layer in baseline.encoder.sentence_encoder.layers
    )
    # same parameters, different attention: the residual stream changes the output
    baseline.load_state_dict(model.state_dict())
    baseline.eval()
    base_logits, base_extra = baseline(tokens, return_all_hiddens=True)
    torch.testing.assert_close(base_extra["inner_states"][1], extra["inner_states"][1])
    assert not torch.allclose(base_logits, logits, atol=1e-4)


def test_preln_variant_structure(mlm_data):
    model, _ = build_model(mlm_data, "preln_bert_tiny")
    enc = model.encoder.sentence_encoder
    assert enc.layer_norm is not None and enc.layernorm_embedding is None
    assert all(layer.normalize_before for layer in enc.layers)


def test_closed_form_admin_omega(mlm_data):
    model, _ = build_model(mlm_data, "realformer_bert_tiny", "--init-type", "admin-closed-form")
    residuals = [m for m in model.modules() if isinstance(m, AdminResidual) and m.admin]
    assert len(residuals) == 4  # 2 sublayers x 2 layers
    for m in residuals:
        # sqrt((N+1)/ln(N+1) - 1) with N = 2 sublayers x 2 layers = 4, worked out by hand
        assert float(m.omega_init) == pytest.approx(1.4514388285)
    assert int(model.admin_profiled) == 1


@pytest.mark.parametrize(
    "arch,extra,message",
    [
        (
            "realformer_bert_tiny",
            ["--residual-attention", "decoder"],
            "has only the chain(s) encoder",
        ),
        ("realformer_bert_tiny", ["--residual-attention", "encodr"], "unknown chain"),
        ("preln_bert_tiny", ["--init-type", "admin"], "--admin-allow-pre-ln"),
        ("postln_bert_tiny", ["--residual-attention-mode", "sum"], "needs residual attention on"),
    ],
)
def test_bad_flags_are_one_line_errors(mlm_data, arch, extra, message):
    """In Python the build raises the plugin's ValueError subclass with a one-line message
    (fairseq's console commands print it as one line: tests/test_reliability.py)."""
    with pytest.raises(RealformerConfigError) as err:
        build_model(mlm_data, arch, *extra)
    text = str(err.value)
    assert message in text
    assert "\n" not in text


# ---------------------------------------------------------------------------
# training through fairseq-train


def test_mlm_training_lowers_valid_loss(mlm_run):
    save_dir, output = mlm_run
    losses = parse_valid_loss(output)
    assert len(losses) >= 3, output[-2000:]
    assert losses[-1] < losses[0] - 0.5, losses
    assert "model: RealformerRobertaModel" in output
    assert (save_dir / "checkpoint_best.pt").exists()


def test_mlm_admin_profiling(mlm_data, language_id_data, tmp_path):
    omega_file = tmp_path / "omega.json"
    output = train_mlm(
        mlm_data,
        tmp_path / "ck",
        max_update=6,
        extra=["--init-type", "admin", "--admin-profile-out", str(omega_file)],
    )
    assert output.count("ADMIN profiling done") == 1
    omegas = json.loads(omega_file.read_text())["omega"]
    assert sorted(omegas) == sorted(
        f"encoder.sentence_encoder.layers.{i}.{sub}_residual"
        for i in range(2)
        for sub in ("self_attn", "ffn")
    )
    first = omegas["encoder.sentence_encoder.layers.0.self_attn_residual"]
    assert first == 1.0  # the running ratio starts at 1
    later = [v for k, v in omegas.items() if not k.endswith("layers.0.self_attn_residual")]
    assert all(v > 1.0 for v in later)  # variance grows along the Post-LN stack

    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "ck" / "checkpoint_last.pt"))
    weights = state["model"]
    assert int(weights["admin_profiled"]) == 1
    for name, value in omegas.items():
        assert float(weights[f"{name}.omega_init"]) == pytest.approx(value)
    assert parse_valid_loss(output), output[-2000:]

    # fine-tuning an ADMIN MLM checkpoint keeps its omega: no second profiling
    restore = tmp_path / "ck" / "checkpoint_last.pt"
    output = train_classifier(
        language_id_data,
        tmp_path / "cls_ck",
        restore,
        max_update=5,
        extra=["--init-type", "admin"],
    )
    assert f"Loaded checkpoint {restore}" in output
    assert "ADMIN profiling done" not in output
    cls = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "cls_ck" / "checkpoint_last.pt"))
    assert int(cls["model"]["admin_profiled"]) == 1
    for name, value in omegas.items():
        assert float(cls["model"][f"{name}.omega_init"]) == pytest.approx(value)


def test_sentence_prediction_from_mlm_checkpoint(language_id_data, mlm_run, tmp_path):
    mlm_dir, _ = mlm_run
    restore = mlm_dir / "checkpoint_best.pt"
    output = train_classifier(language_id_data, tmp_path / "cls_ck", restore, max_update=60)
    assert f"Loaded checkpoint {restore}" in output
    # the new head was added to the MLM state dict, nothing else was missing
    assert "Overwriting classification_heads.language_id.out_proj.weight" in output
    accuracies = parse_valid_accuracy(output)
    assert accuracies and accuracies[-1] >= 90.0, (accuracies, output[-2000:])

    from fairseq import checkpoint_utils

    mlm = checkpoint_utils.load_checkpoint_to_cpu(str(restore))["model"]
    cls = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "cls_ck" / "checkpoint_best.pt"))
    assert "classification_heads.language_id.dense.weight" in cls["model"]
    assert cls["cfg"]["model"].arch == "realformer_bert_tiny"
    # fine-tuning started from the MLM encoder: the embeddings moved only a little
    key = "encoder.sentence_encoder.embed_tokens.weight"
    drift = (cls["model"][key] - mlm[key]).norm() / mlm[key].norm()
    assert drift < 0.5, float(drift)

    # the attention analysis reads the classifier too (<s> = --init-token 0 prepended)
    from realformer_fairseq.cli import attention_stats

    model, task = attention_stats.load_checkpoint(
        str(tmp_path / "cls_ck" / "checkpoint_best.pt"), str(language_id_data)
    )
    lines = (language_id_data.parent / "cls_raw" / "valid.input0").read_text().splitlines()[:10]
    summary = attention_stats.analyse(model, task, lines)["encoder"].summary()
    assert summary["num_queries"] == sum(len(line.split()) + 2 for line in lines)


def unigram_entropy_bits(train_txt: Path, dict_txt: Path) -> float:
    vocab = {line.split()[0] for line in dict_txt.read_text(encoding="utf-8").splitlines()}
    counts = collections.Counter()
    for line in train_txt.read_text(encoding="utf-8").splitlines():
        counts.update(w if w in vocab else "<unk>" for w in line.split())
        counts["</s>"] += 1
    total = sum(counts.values())
    return -sum(n / total * math.log2(n / total) for n in counts.values())


@pytest.mark.slow
def test_mlm_few_hundred_updates_beats_unigram(tmp_path):
    """400 updates on 5000 English sentences: valid MLM loss (bits) keeps falling
    and ends below the unigram entropy, i.e. the model uses the context."""
    data_bin = make_mlm_data(tmp_path, n_train=5000, n_valid=300)
    output = train_mlm(
        data_bin,
        tmp_path / "ck",
        max_update=400,
        extra=["--dropout", "0.0", "--attention-dropout", "0.0", "--no-save"],
    )
    losses = parse_valid_loss(output)
    assert len(losses) >= 3 and losses[-1] < losses[0] - 0.1, losses
    assert losses[-1] <= min(losses) + 0.02, losses  # still improving at the end
    unigram = unigram_entropy_bits(tmp_path / "mlm_raw" / "train.txt", data_bin / "dict.txt")
    assert losses[-1] < unigram, (losses, unigram)


def test_build_model_without_arch_builds_as_fairseq_roberta():
    """fairseq's ``RobertaModel.build_model`` builds from a Namespace that names no arch
    (its base architecture fills the rest); so does the plugin's, with its family's
    defaults (residual attention on the encoder, running sum) and the same parameters."""
    from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask

    dictionary = toy_dictionary()
    dictionary.add_symbol("<mask>")
    task = MaskedLMTask(MaskedLMConfig(tokens_per_sample=16), dictionary)
    sizes = dict(encoder_layers=2, encoder_embed_dim=32, encoder_ffn_embed_dim=64)
    theirs = RobertaModel.build_model(argparse.Namespace(encoder_attention_heads=2, **sizes), task)
    ours = RealformerRobertaModel.build_model(
        argparse.Namespace(encoder_attention_heads=2, **sizes), task
    )
    layers = ours.encoder.sentence_encoder.layers
    # the family's default route is auto: the plain eager module on a machine without a
    # measured rule for its GPU (this one)
    assert [type(layer.self_attn) for layer in layers] == [RealformerMultiheadAttention] * 2
    assert layers[1].self_attn.residual_attention_mode == "sum"
    assert layers[1].self_attn.residual_attention_impl == "eager"
    shapes = {k: v.shape for k, v in ours.state_dict().items() if k != "admin_profiled"}
    assert shapes == {k: v.shape for k, v in theirs.state_dict().items()}


# ---------------------------------------------------------------------------
# the plugin's flags are read once, by the settings module, whatever the config type

BERT_OPTION_FLAGS = {"layernorm_eps": 1e-12, "type_vocab_size": 2, "bert_pooler": True}
# what a model with these options computes, written from the flags (record of load_state_dict)
BERT_OPTION_RECORD = {
    "layernorm_eps": 1e-12,
    "activation_fn": "gelu_accurate",
    "pooler_activation_fn": "tanh",  # fairseq's roberta default
    "residual_attention": "encoder",
    "residual_attention_mode": "sum",  # the realformer_bert_* default (the paper's BERT)
    "encoder_normalize_before": False,
}


def masked_lm_task():
    from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask

    dictionary = toy_dictionary()
    dictionary.add_symbol("<mask>")
    return MaskedLMTask(MaskedLMConfig(tokens_per_sample=16), dictionary)


def build_bert(config_type: str, **flags):
    """realformer_bert_tiny with ``flags`` built as fairseq-train builds it (its parser, an
    argparse Namespace) or as fairseq-hydra-train does (a DictConfig naming the arch)."""
    from fairseq import options
    from omegaconf import OmegaConf

    flags = {"activation_fn": "gelu_accurate", **flags}
    if config_type == "argparse":
        argv = ["/unused", "--user-dir", USER_DIR, "--task", "masked_lm", "--tokens-per-sample"]
        argv += ["16"]  # the task's (the DictConfig's max_positions comes from the task)
        argv += ["--arch", "realformer_bert_tiny"]
        for key, value in flags.items():
            option = "--" + key.replace("_", "-")
            argv += [option] if value is True else [option, str(value)]
        cfg = options.parse_args_and_arch(options.get_training_parser(), argv)
    else:
        cfg = OmegaConf.create({"_name": "realformer_bert_tiny", **flags})
    torch.manual_seed(0)
    return masked_lm_task().build_model(cfg)


def bert_record(model):
    return model.state_dict()._metadata[""]["realformer_bert_options"]


def test_argparse_and_dictconfig_builds_give_the_same_bert_model():
    built = {kind: build_bert(kind, **BERT_OPTION_FLAGS) for kind in ("argparse", "DictConfig")}
    ours, hydra = built["argparse"], built["DictConfig"]
    assert ours.encoder.args.realformer == hydra.encoder.args.realformer
    assert ours.encoder.args.realformer.layernorm_eps == 1e-12
    state, hydra_state = ours.state_dict(), hydra.state_dict()
    assert list(state) == list(hydra_state)
    assert all(torch.equal(state[k], hydra_state[k]) for k in state)
    assert bert_record(ours) == bert_record(hydra) == BERT_OPTION_RECORD
    assert ours.encoder.pooler is not None and hydra.encoder.pooler is not None
    eps = {m.eps for m in ours.modules() if isinstance(m, torch.nn.LayerNorm)}
    assert eps == {m.eps for m in hydra.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-12}


def test_the_record_of_bert_options_comes_from_the_settings_not_the_config_object():
    """The model's record of what it computes is read from the settings it was built with:
    a model config that no longer holds a flag (``model.args`` is the caller's object)
    changes nothing; a config that holds no settings at all is an error, not defaults."""
    from realformer_fairseq.models.realformer_roberta import bert_computation

    model = build_bert("argparse", **BERT_OPTION_FLAGS)
    for key in ("layernorm_eps", "residual_attention", "residual_attention_mode"):
        delattr(model.args, key)
    assert bert_record(model) == BERT_OPTION_RECORD
    with pytest.raises(RealformerConfigError, match="RealformerTransformerConfig"):
        bert_computation(argparse.Namespace(activation_fn="gelu_accurate"))


def test_a_checkpoint_of_residual_attention_encoder_restores_into_residual_attention_all():
    """``--residual-attention all`` is every chain of the model: for the encoder-only model,
    ``encoder``. A checkpoint recorded with one loads into a model built with the other (the
    record was compared as typed: a false 'the checkpoint was made with' refusal)."""
    source = build_bert("argparse", residual_attention="encoder", **BERT_OPTION_FLAGS)
    state = source.state_dict()
    target = build_bert("DictConfig", residual_attention="all", **BERT_OPTION_FLAGS)
    target.load_state_dict(state)
    # a record written as typed by an earlier plugin version ("all") loads as well
    state._metadata[""]["realformer_bert_options"]["residual_attention"] = "all"
    build_bert("argparse", **BERT_OPTION_FLAGS).load_state_dict(state)
    # and one that differs is still refused
    state._metadata[""]["realformer_bert_options"]["residual_attention"] = "none"
    with pytest.raises(RealformerConfigError, match="--residual-attention none"):
        target.load_state_dict(state)
