"""Every way fairseq builds a model gives the model the config asks for.

RealFormer residual attention (He et al. 2020, arXiv 2012.11747) and ADMIN residuals
(Liu et al. 2020, arXiv 2004.08249) must reach the layers whether fairseq hands the
model an argparse Namespace (``fairseq-train``) or an omegaconf DictConfig
(``fairseq-hydra-train``, ``task.build_model``), on checkpoints saved either way and
through the hub interface; a model that disagrees with its config is refused (issue 11).

Expected structures are written here, not read from the code: ``realformer_tiny`` is
2L-2L with three residual chains (running mean) and 2*2 + 3*2 = 10 ADMIN residuals;
``realformer_bert_tiny`` (with ``init_type: admin``) is 2 layers, one residual chain
(running sum) and 2*2 = 4 ADMIN residuals.
"""

import argparse
import copy
import re
from pathlib import Path

import pytest
import torch
from harness import (
    REPO_ROOT,
    USER_DIR,
    fairseq_command,
    make_language_id_data,
    make_mlm_data,
    make_multi30k_subset,
    preprocess,
    run,
    toy_dictionary,
    translation_train_args,
)
from omegaconf import OmegaConf

from realformer_fairseq.errors import RealformerConfigError
from realformer_fairseq.models.build_checks import check_layers_match_settings
from realformer_fairseq.modules.admin import AdminResidual
from realformer_fairseq.modules.routes import RealformerMultiheadAttention
from realformer_fairseq.settings import RealformerSettings, read_realformer_settings

FAMILIES = ("translation", "masked_lm", "sentence_prediction")
HYDRA_CONFIG_DIR = REPO_ROOT / "examples" / "hydra"
CLASSIFICATION_HEAD = "sentence_classification_head"

# family -> (per-chain layer counts, residual attention mode, ADMIN residual count)
EXPECTED = {
    "translation": ({"encoder": 2, "decoder": 2, "cross": 2}, "mean", 10),
    "masked_lm": ({"encoder": 2}, "sum", 4),
    "sentence_prediction": ({"encoder": 2}, "sum", 4),
}
# the line build_model logs, counted from the built modules
EXPECTED_BUILT_LINE = {
    "translation": "built --arch realformer_tiny: residual attention layers encoder=2/2 "
    "decoder=2/2 cross=2/2 (running mean, eager route of --residual-attention-impl auto); "
    "ADMIN residuals 10/10 (--init-type admin)",
    "masked_lm": "built --arch {arch}: residual attention layers encoder=2/2 (running sum, "
    "eager route of --residual-attention-impl auto); "
    "ADMIN residuals 4/4 (--init-type admin)",
}
EXPECTED_BUILT_LINE["sentence_prediction"] = EXPECTED_BUILT_LINE["masked_lm"]


def attention_chains(model):
    """chain -> the attention module of each layer, read off the model's layers."""
    if hasattr(model, "decoder"):
        return {
            "encoder": [layer.self_attn for layer in model.encoder.layers],
            "decoder": [layer.self_attn for layer in model.decoder.layers],
            "cross": [layer.encoder_attn for layer in model.decoder.layers],
        }
    return {"encoder": [layer.self_attn for layer in model.encoder.sentence_encoder.layers]}


def assert_requested_model(model, family):
    layers, mode, n_residuals = EXPECTED[family]
    chains = attention_chains(model)
    assert {chain: len(modules) for chain, modules in chains.items()} == layers
    for chain, modules in chains.items():
        for idx, module in enumerate(modules):
            assert isinstance(module, RealformerMultiheadAttention), (chain, idx, module)
            assert module.residual_attention_mode == mode
    residuals = [m for m in model.modules() if isinstance(m, AdminResidual)]
    assert len(residuals) == n_residuals
    assert all(m.admin is True for m in residuals)
    assert model.admin_init_type == "admin"


def assert_profiled(state_dict):
    """admin_profiled == 1; in each stack the first sublayer's omega is exactly 1
    (the profiling ratio starts at 1), every later one was profiled away from 1."""
    assert int(state_dict["admin_profiled"]) == 1
    omegas = {k: float(v) for k, v in state_dict.items() if k.endswith(".omega_init")}
    assert omegas, "no ADMIN omega in the state dict"
    firsts = [k for k in omegas if re.search(r"layers\.0\.self_attn_residual", k)]
    assert len(firsts) == (2 if any(k.startswith("decoder.") for k in omegas) else 1)
    for key, value in omegas.items():
        if key in firsts:
            assert value == 1.0, key
        else:
            assert value != 1.0, key


# ---------------------------------------------------------------------------
# data (tiny) and the console runs, once per module


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("build_paths_data")
    raw = make_multi30k_subset(root / "raw", n_train=300, n_valid=50, n_test=20)
    mlm = make_mlm_data(root / "mlm", n_train=300, n_valid=50)
    return {
        "translation": preprocess(raw, root / "bin"),
        "masked_lm": mlm,
        "sentence_prediction": make_language_id_data(
            root / "cls", mlm / "dict.txt", n_train=100, n_valid=40
        ),
    }


COMMON = [
    "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
    "--warmup-updates", "10", "--max-update", "4", "--log-format", "simple",
    "--log-interval", "1", "--num-workers", "0", "--seed", "1", "--cpu",
    "--no-epoch-checkpoints",
]  # fmt: skip


def fairseq_train_command(family, data_bin, save_dir):
    """fairseq-train (argparse) equivalents of the example hydra configs."""
    if family == "translation":
        return [fairseq_command("fairseq-train")] + translation_train_args(
            data_bin, save_dir, max_update=4
        )
    task = {
        "masked_lm": [
            "--task", "masked_lm", "--criterion", "masked_lm", "--arch", "realformer_bert_tiny",
            "--tokens-per-sample", "64", "--sample-break-mode", "complete",
        ],
        "sentence_prediction": [
            "--task", "sentence_prediction", "--criterion", "sentence_prediction",
            "--arch", "realformer_bert_tiny", "--num-classes", "2", "--max-positions", "64",
            "--init-token", "0", "--separator-token", "2",
        ],
    }[family]  # fmt: skip
    return [
        fairseq_command("fairseq-train"), data_bin, "--user-dir", USER_DIR, *task,
        "--init-type", "admin", "--batch-size", "32", "--save-dir", save_dir, *COMMON,
    ]  # fmt: skip


def hydra_train_command(family, data_bin, save_dir, hydra_dir, *overrides):
    """The real fairseq-hydra-train console command on an example config."""
    return [
        fairseq_command("fairseq-hydra-train"),
        "--config-dir", HYDRA_CONFIG_DIR, "--config-name", family,
        f"task.data={data_bin}", f"common.user_dir={USER_DIR}",
        f"checkpoint.save_dir={save_dir}", f"hydra.run.dir={hydra_dir}", *overrides,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """(family, launcher) -> (save_dir, output) of a 4-update run, made on first use."""
    runs = {}

    def get(family, launcher):
        if (family, launcher) not in runs:
            root = tmp_path_factory.mktemp(f"{family}_{launcher}")
            save_dir = root / "checkpoints"
            if launcher == "fairseq-train":
                cmd = fairseq_train_command(family, data[family], save_dir)
            else:
                cmd = hydra_train_command(family, data[family], save_dir, root / "hydra")
            runs[family, launcher] = save_dir, run(cmd, timeout=600)
        return runs[family, launcher]

    return get


LAUNCHERS = ("fairseq-train", "fairseq-hydra-train")
RUNS = [(family, launcher) for family in FAMILIES for launcher in LAUNCHERS]


def arch_of(family, launcher):
    if family == "translation":
        return "realformer_tiny"
    # the masked_lm example names the model plus explicit fields
    return (
        "realformer_roberta"
        if (family, launcher) == ("masked_lm", LAUNCHERS[1])
        else ("realformer_bert_tiny")
    )


# ---------------------------------------------------------------------------
# console training: the model built in the run, its checkpoint and stored config


@pytest.mark.parametrize("family,launcher", RUNS)
def test_console_training_builds_the_requested_model(trained, family, launcher):
    save_dir, output = trained(family, launcher)
    built = [line.split("] - ")[-1].split(" | ")[-1] for line in output.splitlines()]
    built = [line[line.index("built --arch") :] for line in built if "built --arch" in line]
    assert built == [EXPECTED_BUILT_LINE[family].format(arch=arch_of(family, launcher))]
    assert output.count("ADMIN profiling done on the first training batch") == 1

    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(str(save_dir / "checkpoint_last.pt"))
    assert_profiled(state["model"])
    # the stored config says what the model did
    stored = state["cfg"]["model"]
    assert read_realformer_settings(stored, model_chains=tuple(EXPECTED[family][0])) == (
        RealformerSettings(
            residual_chains=frozenset(EXPECTED[family][0]),
            residual_attention_mode=EXPECTED[family][1],
            residual_attention_impl="auto",
            init_type="admin",
            admin_profile_out=None,
        )
    )
    if launcher == "fairseq-hydra-train":
        assert OmegaConf.is_config(stored)
    else:
        assert isinstance(stored, argparse.Namespace)


@pytest.mark.parametrize("family,launcher", RUNS)
def test_checkpoint_loading_builds_the_requested_model(trained, data, family, launcher):
    from fairseq import checkpoint_utils

    save_dir, _ = trained(family, launcher)
    path = str(save_dir / "checkpoint_last.pt")
    models, _ = checkpoint_utils.load_model_ensemble(
        [path], arg_overrides={"data": str(data[family])}
    )
    models2, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": str(data[family])}
    )
    for model in (models[0], models2[0]):
        assert_requested_model(model, family)
        assert_profiled(model.state_dict())


@pytest.mark.parametrize("family,launcher", RUNS)
def test_hub_from_pretrained_builds_the_requested_model(trained, data, family, launcher):
    from realformer_fairseq.models.realformer_roberta import RealformerRobertaModel
    from realformer_fairseq.models.realformer_transformer import RealformerTransformerModel

    save_dir, _ = trained(family, launcher)
    if family == "translation":
        hub = RealformerTransformerModel.from_pretrained(
            str(save_dir), "checkpoint_last.pt", str(data[family]), cpu=True
        )
        model = hub.models[0]
    else:
        hub = RealformerRobertaModel.from_pretrained(
            str(save_dir), "checkpoint_last.pt", str(data[family]), bpe=None, cpu=True
        )
        model = hub.model
    assert_requested_model(model, family)
    assert_profiled(model.state_dict())


# ---------------------------------------------------------------------------
# the Python API: task.build_model(cfg) with a Namespace or a DictConfig


TINY_FIELDS = {
    "translation": {
        "_name": "realformer_transformer",
        "encoder_layers": 2, "decoder_layers": 2, "encoder_embed_dim": 64,
        "decoder_embed_dim": 64, "encoder_ffn_embed_dim": 128, "decoder_ffn_embed_dim": 128,
        "encoder_attention_heads": 2, "decoder_attention_heads": 2,
    },
    "bert": {
        "_name": "realformer_roberta", "init_type": "admin", "encoder_layers": 2,
        "encoder_embed_dim": 64, "encoder_ffn_embed_dim": 128, "encoder_attention_heads": 2,
    },
}  # fmt: skip
MODEL_CONFIGS = {
    "translation": {"arch name": {"_name": "realformer_tiny"}, "model name": TINY_FIELDS["translation"]},
    "masked_lm": {
        "arch name": {"_name": "realformer_bert_tiny", "init_type": "admin"},
        "model name": TINY_FIELDS["bert"],
    },
}  # fmt: skip
MODEL_CONFIGS["sentence_prediction"] = MODEL_CONFIGS["masked_lm"]


def make_task(family):
    dictionary = toy_dictionary()
    if family == "translation":
        from fairseq.tasks.translation import TranslationConfig, TranslationTask

        return TranslationTask(TranslationConfig(), dictionary, dictionary)
    if family == "masked_lm":
        from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask

        return MaskedLMTask(MaskedLMConfig(data="unused", tokens_per_sample=64), dictionary)
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask

    cfg = SentencePredictionConfig(
        data="unused", num_classes=2, max_positions=64, classification_head_name=CLASSIFICATION_HEAD
    )
    return SentencePredictionTask(cfg, dictionary, toy_dictionary(2))


def one_training_step(model, family, dictionary):
    torch.manual_seed(0)
    model.train()
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (4, 9))
    if family == "translation":
        out = model(tokens, torch.full((4,), 9), tokens)[0]
    elif family == "masked_lm":
        out = model(tokens)[0]
    else:
        out = model(tokens, features_only=True, classification_head_name=CLASSIFICATION_HEAD)[0]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out.float().pow(2).mean().backward()
    optimizer.step()


@pytest.mark.parametrize("config_type", ["Namespace", "DictConfig"])
@pytest.mark.parametrize("name_kind", ["arch name", "model name"])
@pytest.mark.parametrize("family", FAMILIES)
def test_task_build_model_builds_the_requested_model(family, name_kind, config_type):
    fields = dict(MODEL_CONFIGS[family][name_kind])
    if config_type == "Namespace":
        cfg = argparse.Namespace(arch=fields["_name"], **fields)
    else:
        cfg = OmegaConf.create(fields)
    task = make_task(family)
    model = task.build_model(cfg)
    assert_requested_model(model, family)
    assert int(model.admin_profiled) == 0
    one_training_step(model, family, task.source_dictionary)
    assert_profiled(model.state_dict())


# ---------------------------------------------------------------------------
# disagreement between config and model is impossible


def test_read_settings_accepts_every_config_type():
    from fairseq.models.transformer import TransformerConfig

    values = {
        "residual_attention": "encoder,cross",
        "residual_attention_mode": "mean",
        "init_type": "admin-closed-form",
        "admin_profile_out": None,
        "admin_allow_pre_ln": False,
    }
    expected = RealformerSettings(
        residual_chains=frozenset({"encoder", "cross"}),
        residual_attention_mode="mean",
        residual_attention_impl="auto",  # the one flag read with a default where missing
        init_type="admin-closed-form",
        admin_profile_out=None,
    )
    namespace = argparse.Namespace(**values)
    for cfg in (
        namespace,
        OmegaConf.create(values),
        dict(values),
        TransformerConfig.from_namespace(namespace),
    ):
        assert read_realformer_settings(cfg) == expected, type(cfg)
    assert expected.admin and expected.residual("cross") and not expected.residual("decoder")


def test_config_that_lost_the_plugin_flags_is_refused_not_read_as_off():
    """The bug of issue 11: fairseq's TransformerConfig.from_namespace keeps only its
    own fields from a DictConfig. Reading settings from such a config is an error."""
    from fairseq.models.transformer import TransformerConfig

    lossy = TransformerConfig.from_namespace(
        OmegaConf.create({"residual_attention": "all", "init_type": "admin"})
    )
    with pytest.raises(RealformerConfigError, match="has no residual_attention"):
        read_realformer_settings(lossy)
    with pytest.raises(RealformerConfigError, match="has no init_type"):
        read_realformer_settings({"residual_attention": "none"})


def test_built_model_that_disagrees_with_settings_is_refused():
    model = make_task("translation").build_model(OmegaConf.create({"_name": "realformer_tiny"}))
    chains = attention_chains(model)
    settings = read_realformer_settings(
        {"residual_attention": "all", "residual_attention_mode": "mean", "init_type": "admin"}
    )
    check_layers_match_settings(settings, chains, model)  # agrees: no error
    cases = [
        (
            {"residual_attention": "decoder,cross", "residual_attention_mode": "mean"},
            "chain 'encoder' layer 0 has RealformerMultiheadAttention, but residual "
            "attention is off for this chain",
        ),
        (
            {"residual_attention": "all", "residual_attention_mode": "sum"},
            "chain 'encoder' layer 0 uses the running mean, the config asks for the running sum",
        ),
        (
            {"residual_attention": "all", "residual_attention_mode": "mean",
             "residual_attention_impl": "concat"},
            "chain 'encoder' layer 0 has RealformerMultiheadAttention with the eager route, "
            "the config asks for --residual-attention-impl concat, which builds the concat "
            "route on this machine",
        ),  # fmt: skip
        (
            {
                "residual_attention": "all",
                "residual_attention_mode": "mean",
                "init_type": "default",
            },
            "an ADMIN residual has admin=True, but --init-type is default",
        ),
    ]
    for values, message in cases:
        settings = read_realformer_settings({"init_type": "admin", **values})
        with pytest.raises(RealformerConfigError) as err:
            check_layers_match_settings(settings, chains, model, model_name="--arch x")
        assert str(err.value) == f"--arch x disagrees with its config: {message}"
    # a concat model against auto, which builds the eager route on a machine without a
    # measured rule (this one)
    concat = make_task("translation").build_model(
        OmegaConf.create({"_name": "realformer_tiny", "residual_attention_impl": "concat"})
    )
    with pytest.raises(RealformerConfigError) as err:
        check_layers_match_settings(settings_auto(), attention_chains(concat), concat, "--arch x")
    assert str(err.value) == (
        "--arch x disagrees with its config: chain 'encoder' layer 0 has "
        "ConcatRealformerMultiheadAttention with the concat route, the config asks for "
        "--residual-attention-impl auto, which builds the eager route on this machine"
    )


def settings_auto():
    return read_realformer_settings(
        {"residual_attention": "all", "residual_attention_mode": "mean", "init_type": "admin",
         "residual_attention_impl": "auto"}
    )  # fmt: skip


def test_a_build_path_that_drops_a_flag_stops_with_one_error_line(monkeypatch):
    """Simulate a layer that ignores its residual switch: build_model refuses the
    model (a RealformerConfigError, one ``realformer_fairseq: error:`` line under a fairseq
    command) instead of training a baseline."""
    import dataclasses

    from realformer_fairseq.models import realformer_transformer

    original = realformer_transformer.RealformerEncoderLayer

    def dropping_layer(cfg):
        dropped = dataclasses.replace(
            cfg.realformer, residual_chains=cfg.realformer.residual_chains - {"encoder"}
        )
        layer_cfg = copy.copy(cfg)
        layer_cfg.realformer = dropped
        return original(layer_cfg)

    monkeypatch.setattr(realformer_transformer, "RealformerEncoderLayer", dropping_layer)
    with pytest.raises(RealformerConfigError) as err:
        make_task("translation").build_model(OmegaConf.create({"_name": "realformer_tiny"}))
    assert str(err.value) == (
        "--arch realformer_tiny disagrees with its config: chain "
        "'encoder' layer 0 has MultiheadAttention, but residual attention is on for this chain"
    )


def test_hydra_bad_flag_is_one_error_line(data, tmp_path):
    """fairseq-hydra-train with a bad model field: exit 1, one error line, no traceback."""
    cmd = hydra_train_command(
        "translation",
        data["translation"],
        tmp_path / "ck",
        tmp_path / "hydra",
        "+model.residual_attention=encodr",
    )
    with pytest.raises(RuntimeError) as err:
        run(cmd, timeout=300)
    text = str(err.value)
    assert "command failed (1)" in text
    assert "Traceback" not in text
    last = text.strip().splitlines()[-1]
    assert last == (
        "realformer_fairseq: error: --residual-attention: unknown chain(s) ['encodr']; use "
        "'all', 'none' or a comma list of encoder, decoder, cross"
    )


def test_example_hydra_configs_exist():
    names = sorted(p.name for p in Path(HYDRA_CONFIG_DIR).glob("*.yaml"))
    assert names == ["masked_lm.yaml", "sentence_prediction.yaml", "translation.yaml"]
