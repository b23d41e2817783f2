"""Inference dropout (``--retain-dropout``, ``--retain-dropout-modules``), as fairseq 0.12.3's
own tests/test_inference_dropout.py checks it, on fairseq's ``transformer`` and beside it on
the plugin's models (RealFormer, He et al. 2020, arXiv 2012.11747).

fairseq matches ``--retain-dropout-modules`` against each ``FairseqDropout``'s
``module_name``, the name of the fairseq class that owns it. The plugin's subclasses keep
fairseq's names (so fairseq's documented ``TransformerEncoder TransformerDecoder`` work) and
also answer to their own class names; a name that matches no module is a warning line.
"""

import argparse
import logging
import re
import sys

import pytest
import torch
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from harness import (
    USER_DIR,
    generate,
    multi30k_lines,
    random_batch,
    toy_dictionary,
    translation_train_args,
    write_lines,
)

# fairseq's own model, and the plugin's with every chain residual and with none
MODELS = {
    "transformer": TransformerModel,
    "realformer_tiny": ARCH_MODEL_REGISTRY["realformer_tiny"],
    "postln_transformer_tiny": ARCH_MODEL_REGISTRY["postln_transformer_tiny"],
}


def build(arch: str, **generation):
    """As fairseq's test: the model class's parser defaults, 2 encoder layers, 1 decoder
    layer (the plugin's archs keep their tiny sizes; fairseq's is its base size)."""
    dictionary = toy_dictionary()
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    MODELS[arch].add_args(parser)
    args = parser.parse_args([])
    args.arch, args._name = arch, arch
    args.encoder_layers, args.decoder_layers = 2, 1
    args.dropout = 0.3
    if arch == "transformer":
        args.encoder_embed_dim, args.encoder_ffn_embed_dim = 64, 128
        args.encoder_attention_heads = args.decoder_attention_heads = 2
    for key, value in generation.items():
        setattr(args, key, value)
    torch.manual_seed(0)
    model = MODELS[arch].build_model(args, task)
    model.prepare_for_inference_(convert_namespace_to_omegaconf(args))
    return model, dictionary


def retained(module) -> bool:
    return module.dropout_module.apply_during_inference


@pytest.mark.parametrize("arch", list(MODELS))
def test_sets_inference_dropout_to_true(arch):
    model, _ = build(arch, retain_dropout=True)
    assert retained(model.encoder) and retained(model.decoder)
    assert all(retained(layer) for layer in model.encoder.layers)
    assert all(retained(layer.self_attn) for layer in model.decoder.layers)


@pytest.mark.parametrize("arch", list(MODELS))
def test_inference_dropout_false_by_default(arch):
    model, _ = build(arch)
    assert not retained(model.encoder) and not retained(model.decoder)
    assert not any(retained(layer) for layer in [*model.encoder.layers, *model.decoder.layers])


@pytest.mark.parametrize("arch", list(MODELS))
def test_retain_modules_by_fairseq_names(arch):
    """fairseq's test_retain_modules: the encoder and its layers, not the decoder. fairseq
    0.12.3's own transformer fails it: its layers are ``TransformerEncoderLayerBase``, which
    the documented name does not match (fairseq names dropouts by the exact class)."""
    model, _ = build(
        arch,
        retain_dropout=True,
        retain_dropout_modules=["TransformerEncoder", "TransformerEncoderLayer"],
    )
    assert retained(model.encoder)
    fairseq_bug = arch == "transformer"
    assert all(retained(layer) != fairseq_bug for layer in model.encoder.layers)
    assert not retained(model.decoder)
    assert not any(retained(layer) for layer in model.decoder.layers)
    assert not any(retained(layer.self_attn) for layer in model.encoder.layers)


@pytest.mark.parametrize("arch", ["transformer", "realformer_tiny"])
def test_monte_carlo_dropout_changes_the_output_in_eval_mode(arch):
    """What the flag is for: two forwards of the same batch differ in eval mode, and only
    with the flag."""
    outputs = {}
    for flag in (False, True):
        modules = {"retain_dropout_modules": ["TransformerEncoder", "TransformerDecoder"]}
        model, dictionary = build(arch, retain_dropout=flag, **(modules if flag else {}))
        assert not model.training
        src, lengths, prev = random_batch(dictionary)
        with torch.no_grad():
            outputs[flag] = [model(src, lengths, prev)[0] for _ in range(2)]
    assert torch.equal(*outputs[False])
    assert not torch.allclose(*outputs[True])


@pytest.mark.parametrize("arch", list(MODELS))
def test_retain_modules_by_the_class_names_fairseq_0_12_builds(arch):
    model, _ = build(
        arch, retain_dropout=True, retain_dropout_modules=["TransformerDecoderLayerBase"]
    )
    assert all(retained(layer) for layer in model.decoder.layers)
    assert not any(retained(layer) for layer in model.encoder.layers)
    assert not retained(model.decoder) and not retained(model.encoder)


def test_plugin_class_names_select_the_same_modules():
    by_fairseq, _ = build(
        "realformer_tiny",
        retain_dropout=True,
        retain_dropout_modules=["TransformerDecoderLayer", "MultiheadAttention"],
    )
    by_plugin, _ = build(
        "realformer_tiny",
        retain_dropout=True,
        retain_dropout_modules=["RealformerDecoderLayer", "RealformerMultiheadAttention"],
    )
    for model in (by_fairseq, by_plugin):
        assert all(retained(layer) for layer in model.decoder.layers)
        assert all(retained(layer.encoder_attn) for layer in model.decoder.layers)
        assert all(retained(layer.self_attn) for layer in model.encoder.layers)
        assert not retained(model.encoder) and not retained(model.decoder)
        assert not any(retained(layer) for layer in model.encoder.layers)


def test_a_name_that_matches_no_module_is_one_warning_line(caplog):
    with caplog.at_level(logging.WARNING, logger="realformer_fairseq"):
        model, _ = build(
            "realformer_tiny",
            retain_dropout=True,
            retain_dropout_modules=["TransformerEncoder", "TransformerEncodr"],
        )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "--retain-dropout-modules TransformerEncodr: no module of this model has that name"
    )
    assert "TransformerEncoderLayer" in warnings[0] and "RealformerEncoderLayer" in warnings[0]
    assert retained(model.encoder)


# every spelling fairseq accepts: the text of the command line (FairseqDropout tests
# ``module_name in text``) and a list from Python (membership); on these values the plugin's
# models keep exactly the dropouts fairseq's transformer keeps
FAIRSEQ_SPELLINGS = {
    "bare name": "TransformerEncoder",
    "comma list": "TransformerEncoder,TransformerDecoder",
    "space list": "TransformerEncoder TransformerDecoder",
    "Python list text": "['TransformerEncoder','TransformerDecoder']",
    "list": ["TransformerEncoder", "TransformerDecoder"],
    "attention text": "MultiheadAttention",
    "layer base text": "TransformerDecoderLayerBase",
    "layer base list": ["TransformerEncoderLayerBase", "MultiheadAttention"],
}
# what fairseq 0.12.3 keeps on for each, by module (written from FairseqDropout's test)
ENCODER, DECODER = {"encoder"}, {"decoder"}
ENCODER_LAYERS = {"encoder.layers.0", "encoder.layers.1"}
ATTENTION = {
    "encoder.layers.0.self_attn", "encoder.layers.1.self_attn", "decoder.layers.0.self_attn",
    "decoder.layers.0.encoder_attn",
}  # fmt: skip
FAIRSEQ_RETAINS = {
    "bare name": ENCODER,
    "comma list": ENCODER | DECODER,
    "space list": ENCODER | DECODER,
    "Python list text": ENCODER | DECODER,
    "list": ENCODER | DECODER,
    "attention text": ATTENTION,
    # "TransformerDecoder" is inside "TransformerDecoderLayerBase": fairseq keeps both on
    "layer base text": DECODER | {"decoder.layers.0"},
    "layer base list": ENCODER_LAYERS | ATTENTION,
}


def retained_modules(model):
    return {
        name for name, module in model.named_modules()
        if getattr(module, "dropout_module", None) is not None and retained(module)
    }  # fmt: skip


@pytest.mark.parametrize("spelling", list(FAIRSEQ_SPELLINGS))
@pytest.mark.parametrize("arch", list(MODELS))
def test_every_spelling_retains_what_fairseq_retains(arch, spelling):
    value = FAIRSEQ_SPELLINGS[spelling]
    model, _ = build(arch, retain_dropout=True, retain_dropout_modules=value)
    assert retained_modules(model) == FAIRSEQ_RETAINS[spelling]


# the other families beside fairseq's models of the same kind, at the same size
FAMILIES = {
    "language model": ("language_modeling", "transformer_lm", "realformer_lm", "decoder"),
    "encoder-only": ("masked_lm", "roberta", "realformer_roberta", "encoder"),
}


def build_family_model(task_name: str, arch: str, side: str, value):
    """``arch`` parsed by fairseq-train's parser (2 layers, 32 wide) and built by its task,
    then prepared for inference with ``--retain-dropout-modules value``."""
    from fairseq import options
    from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask
    from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask

    dictionary = toy_dictionary()
    if task_name == "masked_lm":
        dictionary.add_symbol("<mask>")
        task = MaskedLMTask(MaskedLMConfig(tokens_per_sample=16), dictionary)
    else:
        task = LanguageModelingTask(
            LanguageModelingConfig(tokens_per_sample=16), dictionary, dictionary
        )
    argv = ["/unused", "--user-dir", USER_DIR, "--task", task_name, "--arch", arch]
    for key, size in (("layers", 2), ("embed-dim", 32), ("ffn-embed-dim", 64)):
        argv += [f"--{side}-{key}", str(size)]
    argv += [f"--{side}-attention-heads", "2", "--tokens-per-sample", "16", "--dropout", "0.3"]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    model = task.build_model(args)
    args.retain_dropout, args.retain_dropout_modules = True, value
    model.prepare_for_inference_(convert_namespace_to_omegaconf(args))
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_other_families_retain_what_fairseqs_model_of_their_kind_retains(family):
    """One command-line text that selects layers and attention by name and, being inside the
    layers' names, the stack's own dropout too."""
    value = "['TransformerEncoderLayerBase','TransformerDecoderLayerBase','MultiheadAttention']"
    task_name, fairseq_arch, plugin_arch, side = FAMILIES[family]
    fairseqs = build_family_model(task_name, fairseq_arch, side, value)
    ours = build_family_model(task_name, plugin_arch, side, value)
    assert retained_modules(ours) == retained_modules(fairseqs)
    stack = "encoder.sentence_encoder" if side == "encoder" else "decoder"
    assert retained_modules(ours) == {
        stack, f"{stack}.layers.0", f"{stack}.layers.1",
        f"{stack}.layers.0.self_attn", f"{stack}.layers.1.self_attn",
    }  # fmt: skip


def test_the_command_line_hands_the_model_a_string():
    """Why the spellings above are strings: fairseq-generate's parser and config keep the
    value as typed (GenerationConfig.retain_dropout_modules is ``Any``)."""
    from fairseq import options

    for value in ("TransformerEncoder", "['TransformerEncoder','TransformerDecoder']"):
        parser = options.get_generation_parser()
        args = options.parse_args_and_arch(
            parser, ["data", "--retain-dropout", "--retain-dropout-modules", value]
        )
        assert convert_namespace_to_omegaconf(args).generation.retain_dropout_modules == value


def test_a_name_found_only_inside_a_longer_one_is_one_warning_line(caplog):
    with caplog.at_level(logging.WARNING, logger="realformer_fairseq"):
        model, _ = build(
            "realformer_tiny", retain_dropout=True,
            retain_dropout_modules="TransformerDecoderLayerBase",
        )  # fmt: skip
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "--retain-dropout-modules 'TransformerDecoderLayerBase': fairseq finds module names "
        "anywhere inside this text, so the dropout of TransformerDecoder stays on too, as on "
        "fairseq's own models"
    ]
    assert retained(model.decoder)


# ---------------------------------------------------------------------------
# through the command users type: fairseq-generate --retain-dropout --retain-dropout-modules,
# on a tiny trained checkpoint of fairseq's transformer and of the plugin's realformer_tiny

# fairseq 0.12.3's GenerationConfig declares retain_dropout_modules ``Any``: from the command
# line the model receives the text as typed, and FairseqDropout tests ``module_name in text``
# (fairseq/modules/fairseq_dropout.py). What that selects on fairseq's transformer, as
# fairseq's log names the dropouts ("Enabling dropout during inference for module: NAME"):
# the encoder's and the decoder's own dropout (module_name TransformerEncoder /
# TransformerDecoder), not their layers' (TransformerEncoderLayerBase, ... are not inside
# the text), not the attention's (MultiheadAttention).
CLI_SPELLINGS = {
    "bare name": ("TransformerEncoder", {"encoder.dropout_module"}),
    "Python list": (
        "['TransformerEncoder','TransformerDecoder']",
        {"encoder.dropout_module", "decoder.dropout_module"},
    ),
}
TINY_FAIRSEQ_TRANSFORMER = [
    "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2",
    "--decoder-attention-heads", "2",
]  # fmt: skip
CLI_ARCHS = {"transformer": TINY_FAIRSEQ_TRANSFORMER, "realformer_tiny": []}
TEST_SENTENCES = 3  # the test set holds them twice: lines i and i + 3 are the same pair


def run_console_entry_point(module, argv):
    """A fairseq console script's entry point (``fairseq_cli.MODULE:cli_main``) in this
    process, on ``argv`` as the script would receive it."""
    import importlib

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [f"fairseq-{module}", *map(str, argv)])
        importlib.import_module(f"fairseq_cli.{module}").cli_main()


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    """fairseq-preprocess on 300 Multi30k pairs (words, no BPE), then two updates of
    fairseq-train for each of CLI_ARCHS, dropout 0.3 (both in this process: the commands'
    entry points): (data_bin, {arch: checkpoint})."""
    root = tmp_path_factory.mktemp("retain-dropout-cli")
    raw = root / "raw"
    raw.mkdir()
    for lang in ("en", "fr"):
        write_lines(raw / f"train.{lang}", multi30k_lines(lang, "train", 0, 300))
        write_lines(raw / f"valid.{lang}", multi30k_lines(lang, "train", 300, 20))
        write_lines(raw / f"test.{lang}", multi30k_lines(lang, "train", 320, TEST_SENTENCES) * 2)
    data_bin = root / "bin"
    run_console_entry_point(
        "preprocess",
        ["--source-lang", "en", "--target-lang", "fr", "--joined-dictionary", "--workers", "1",
         "--destdir", data_bin, *(f"--{s}pref={raw / s}" for s in ("train", "valid", "test"))],
    )  # fmt: skip
    checkpoints = {}
    for arch, flags in CLI_ARCHS.items():
        save_dir = root / arch
        args = translation_train_args(data_bin, save_dir, arch, max_update=2)
        run_console_entry_point(
            "train", [*args, *flags, "--dropout", "0.3", "--disable-validation"]
        )
        checkpoints[arch] = save_dir / "checkpoint_last.pt"
    return data_bin, checkpoints


def retain_dropout_args(modules: str, seed: int):
    return ["--beam", "2", "--seed", str(seed), "--retain-dropout", "--retain-dropout-modules", modules]  # fmt: skip


def retained_and_scored(output: str):
    """From fairseq-generate's output: the dropouts fairseq's log says it kept on, and each
    test line's hypothesis and scores (``H-i`` and ``P-i`` lines) by line number."""
    enabled = set(re.findall(r"Enabling dropout during inference for module: (\S+)", output))
    scored = {}
    for line in output.splitlines():
        match = re.match(r"([HP])-(\d+)\t(.*)", line)
        if match:
            scored.setdefault(int(match.group(2)), []).append(match.group(3))
    assert sorted(scored) == list(range(2 * TEST_SENTENCES)), output[-2000:]
    return enabled, scored


def fairseq_generate_in_process(data_bin, checkpoint, args, monkeypatch, capsys, caplog):
    """fairseq-generate's console entry point (``fairseq_cli.generate:cli_main``, what the
    ``fairseq-generate`` script runs) on the command line of :func:`harness.generate`, in
    this process: the same parsing, without the interpreter start of every run."""
    from fairseq_cli.generate import cli_main

    command = [
        "fairseq-generate", str(data_bin), "--user-dir", USER_DIR, "--path", str(checkpoint),
        "--gen-subset", "test", "--batch-size", "32", "--required-batch-size-multiple", "1",
        "--remove-bpe", "--num-workers", "0", "--cpu", *args,
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", command)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        cli_main()
    log = "\n".join(record.getMessage() for record in caplog.records)
    return retained_and_scored(capsys.readouterr().out + "\n" + log)


@pytest.mark.parametrize("spelling", list(CLI_SPELLINGS))
def test_fairseq_generate_retains_the_dropout_fairseq_retains(
    tiny_checkpoints, spelling, monkeypatch, capsys, caplog
):
    """The issue-30 bug: the plugin's resolver read the command line's text as a list of
    characters, so Monte-Carlo dropout never switched on for the plugin's models (outputs
    equal across seeds) while fairseq's transformer's did. Now both keep the same dropouts on
    for the same text, and both outputs change with --seed."""
    data_bin, checkpoints = tiny_checkpoints
    modules, expected = CLI_SPELLINGS[spelling]
    for arch, checkpoint in checkpoints.items():
        runs = [
            fairseq_generate_in_process(
                data_bin, checkpoint, retain_dropout_args(modules, seed), monkeypatch, capsys,
                caplog,
            )
            for seed in (1, 2)
        ]  # fmt: skip
        (enabled, first), (enabled_again, second) = runs
        assert enabled == enabled_again == expected, (arch, enabled)
        assert first != second, f"{arch}: --retain-dropout-modules {modules} kept dropout off"


def test_the_fairseq_generate_command_retains_dropout_on_the_plugins_model(tiny_checkpoints):
    """The console script itself, in its own process, given the Python-list spelling as one
    argument (what a shell passes for the quoted text): the dropouts fairseq's transformer
    keeps on, and the same sentence, twice in the test set, gets two different scorings
    (dropout is on at inference)."""
    data_bin, checkpoints = tiny_checkpoints
    modules, expected = CLI_SPELLINGS["Python list"]
    output = generate(data_bin, checkpoints["realformer_tiny"], retain_dropout_args(modules, 1))
    enabled, scored = retained_and_scored(output)
    assert enabled == expected
    assert all(scored[i] != scored[i + TEST_SENTENCES] for i in range(TEST_SENTENCES))
