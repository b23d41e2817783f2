"""Audit of the fairseq flags that the re-owned layer loops of the RealFormer models
(He et al. 2020, arXiv 2012.11747) could silently drop.

Each flag either works, or is refused at start-up with one line. "Works" means,
on models built from the exact command-line flags (``parse_args_and_arch``, as
``fairseq-train`` does): with residual attention off and ``--init-type default``
our model computes exactly what fairseq's own ``transformer`` (or ``roberta``)
computes with the flag and the same weights, and something else without the
flag; with residual attention on, the flag has the same effect on our model.
The results are tabulated in docs/guarantees.md.
"""

import math
import re

import pytest
import torch
from harness import NO_DROPOUT as NAMESPACE_NO_DROPOUT
from harness import NO_DROPOUT_FLAGS as NO_DROPOUT
from harness import (
    USER_DIR,
    build_fairseq_tiny_transformer,
    build_translation_model,
    random_batch,
    toy_dictionary,
)

from realformer_fairseq.errors import RealformerConfigError
from realformer_fairseq.modules.routes import RealformerMultiheadAttention

TINY = ["--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128"]
TINY += ["--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
LAYERS = ["--encoder-layers", "4", "--decoder-layers", "4", "--share-all-embeddings"]
# fairseq's transformer at our tiny size; our arch with residual attention off
FAIRSEQ = ["--arch", "transformer", *TINY, *LAYERS]
OURS_OFF = ["--arch", "postln_transformer_tiny", *LAYERS]
# residual attention on (all three chains, running mean), fairseq's init
OURS_ON = ["--arch", "realformer_tiny", "--init-type", "default", *LAYERS]
# the same, as the args Namespace a checkpoint carries (what --model-overrides edits);
# NAMESPACE_NO_DROPOUT and NO_DROPOUT are harness's
NAMESPACE_LAYERS = dict(encoder_layers=4, decoder_layers=4, share_all_embeddings=True)

BERT_TINY = ["--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128"]
BERT_TINY += ["--encoder-attention-heads", "2", "--encoder-layers", "4"]
FAIRSEQ_ROBERTA = ["--arch", "roberta", *BERT_TINY]
OURS_ROBERTA_OFF = ["--arch", "postln_bert_tiny", "--encoder-layers", "4"]
OURS_ROBERTA_ON = ["--arch", "realformer_bert_tiny", "--encoder-layers", "4"]


# ---------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def dict_dir(tmp_path_factory):
    """A data directory holding only dictionaries: enough to build models."""
    root = tmp_path_factory.mktemp("flag-audit-dicts")
    dictionary = toy_dictionary()
    for name in ("dict.en.txt", "dict.fr.txt", "dict.txt"):
        dictionary.save(str(root / name))
    return root


def build(dict_dir, *flags, task="translation"):
    """Parse a fairseq-train command line and build its model, as fairseq-train does."""
    from fairseq import options, tasks

    task_flags = (
        ["-s", "en", "-t", "fr"] if task == "translation" else ["--tokens-per-sample", "32"]
    )
    argv = [str(dict_dir), "--user-dir", USER_DIR, "--task", task, *task_flags, "--cpu", *flags]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    fairseq_task = tasks.setup_task(args)
    return fairseq_task.build_model(args), fairseq_task


def copy_weights(dst, src, allowed_missing=(), allowed_unexpected=()):
    """Load ``src``'s weights into ``dst``; only the listed key prefixes may differ."""
    state = {k: v for k, v in src.state_dict().items() if k != "admin_profiled"}
    missing, unexpected = dst.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "admin_profiled"]
    assert all(k.startswith(tuple(allowed_missing)) for k in missing), missing
    assert all(k.startswith(tuple(allowed_unexpected)) for k in unexpected), unexpected


def forward(model, batch, train, seed=3, **kwargs):
    src, src_lengths, tgt = batch
    model.train(train)
    torch.manual_seed(seed)
    with torch.no_grad():
        return model(src, src_lengths, tgt, **kwargs)


def layer_calls(layers, attr="self_attn"):
    """Count the calls of each layer's ``attr`` module (fires in recomputation too)."""
    counts = [0] * len(layers)
    handles = []
    for i in range(len(layers)):  # not ``for layer in layers``: LayerDrop would skip some
        layer = layers[i]

        def hook(module, args, output, i=i):
            counts[i] += 1

        handles.append(getattr(layer, attr).register_forward_hook(hook))
    return counts, handles


# Flags whose effect shows in the output of one forward (train mode: dropout on,
# fixed seed), as (flags with, flags without, prefixes of the state-dict keys that
# only one of the two has).
OUTPUT_FLAGS = {
    "encoder-layerdrop": (["--encoder-layerdrop", "0.5"], [], ()),
    "decoder-layerdrop": (["--decoder-layerdrop", "0.5"], [], ()),
    "layernorm-embedding": (["--layernorm-embedding"], [], ("encoder.layernorm", "decoder.layern")),
    "no-scale-embedding": (["--no-scale-embedding"], [], ()),
    "no-token-positional-embeddings": (["--no-token-positional-embeddings"], [], ()),
    "quant-noise-pq": (["--quant-noise-pq", "0.25"], [], ("encoder.quant", "decoder.quant")),
    # in fairseq's translation transformer --adaptive-input builds no adaptive input;
    # it only switches --quant-noise-pq off on the embeddings
    "adaptive-input": (
        ["--quant-noise-pq", "0.25", "--adaptive-input"],
        ["--quant-noise-pq", "0.25"],
        ("encoder.quant", "decoder.quant"),
    ),
}


# ------------------------------------------- residual attention off: = fairseq


@pytest.mark.parametrize("flag", list(OUTPUT_FLAGS))
def test_flag_changes_the_output_as_in_fairseq_transformer(dict_dir, flag):
    with_flag, without_flag, new_keys = OUTPUT_FLAGS[flag]
    torch.manual_seed(0)
    ours, task = build(dict_dir, *OURS_OFF, *with_flag)
    vanilla, _ = build(dict_dir, *FAIRSEQ, *with_flag)
    ours_without, _ = build(dict_dir, *OURS_OFF, *without_flag)
    assert type(vanilla).__name__ == "TransformerModel"
    copy_weights(vanilla, ours)
    copy_weights(ours_without, ours, allowed_missing=new_keys, allowed_unexpected=new_keys)
    batch = random_batch(task.source_dictionary, bsz=4, src_len=9, tgt_len=8)
    for train in (False, True):
        out = forward(ours, batch, train)[0]
        assert torch.equal(out, forward(vanilla, batch, train)[0]), f"train={train}"
        if train or "layerdrop" not in flag:  # layerdrop acts in training only
            assert not torch.allclose(out, forward(ours_without, batch, train)[0], atol=1e-4)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_layerdrop_drops_the_same_layers_as_fairseq_for_a_seed(dict_dir, side):
    ours, task = build(dict_dir, *OURS_OFF, f"--{side}-layerdrop", "0.5")
    vanilla, _ = build(dict_dir, *FAIRSEQ, f"--{side}-layerdrop", "0.5")
    copy_weights(vanilla, ours)
    batch = random_batch(task.source_dictionary)
    runs = []
    for model in (ours, vanilla):
        counts, handles = layer_calls(getattr(model, side).layers)
        for seed in range(6):
            forward(model, batch, train=True, seed=seed)
        runs.append(counts)
        for h in handles:
            h.remove()
    assert runs[0] == runs[1]
    # p=0.5 over 6 forwards: each layer ran in some but not all of them
    assert all(0 < c < 6 for c in runs[0]), runs[0]


def test_layers_to_keep_prunes_the_checkpoint_as_fairseq():
    """``*_layers_to_keep`` as ``--model-overrides`` hands it to a checkpoint's
    args (a string; the command-line form is refused below): the model is built
    with the kept layers and fairseq's load path renames the checkpoint's keys."""
    full, dictionary = build_translation_model("postln_transformer_tiny", **NAMESPACE_LAYERS)
    keep = dict(encoder_layers_to_keep="0,2", decoder_layers_to_keep="1,2,3")
    ours, _ = build_translation_model("postln_transformer_tiny", **NAMESPACE_LAYERS, **keep)
    vanilla, _ = build_fairseq_tiny_transformer(**NAMESPACE_LAYERS, **keep)
    assert (len(ours.encoder.layers), len(ours.decoder.layers)) == (2, 3)
    state = {k: v for k, v in full.state_dict().items() if k != "admin_profiled"}
    for model in (ours, vanilla):
        # fairseq's load path (load_model_ensemble, --restore-file) passes the model config
        model.load_state_dict(dict(state), strict=False, model_cfg=model.args)
    torch.testing.assert_close(
        ours.encoder.layers[1].fc1.weight, full.encoder.layers[2].fc1.weight, rtol=0, atol=0
    )
    torch.testing.assert_close(
        ours.decoder.layers[0].fc1.weight, full.decoder.layers[1].fc1.weight, rtol=0, atol=0
    )
    batch = random_batch(dictionary)
    for train in (False, True):
        out = forward(ours, batch, train)[0]
        assert torch.equal(out, forward(vanilla, batch, train)[0])
        assert not torch.allclose(out, forward(full, batch, train)[0], atol=1e-4)


def test_mismatch_error_after_pruning_names_the_pruned_keys():
    """A checkpoint that does not fit a pruned model: the one error line compares
    the keys fairseq's load compared (pruned and renumbered), not the checkpoint's."""
    full, _ = build_translation_model("postln_transformer_tiny", **NAMESPACE_LAYERS)
    keep = dict(encoder_layers_to_keep="0,2", decoder_layers_to_keep="0,1,2,3")
    pruned, _ = build_translation_model(
        "admin_transformer_tiny", **NAMESPACE_LAYERS, **keep
    )  # ADMIN: omega keys the Post-LN checkpoint lacks
    with pytest.raises(RealformerConfigError) as err:
        pruned.load_state_dict(full.state_dict(), model_cfg=pruned.args)
    line = str(err.value)
    assert "\n" not in line
    assert "unexpected keys" not in line, line  # before: encoder.layers.3.* of the checkpoint
    assert "missing keys (e.g. encoder.layers.0.self_attn_residual.omega" in line, line


@pytest.mark.parametrize("flag", ["--checkpoint-activations", "--offload-activations"])
def test_activation_checkpointing_recomputes_layers_as_in_fairseq(dict_dir, flag):
    ours, task = build(dict_dir, *OURS_OFF, flag)
    vanilla, _ = build(dict_dir, *FAIRSEQ, flag)
    plain, _ = build(dict_dir, *OURS_OFF)
    copy_weights(vanilla, ours)
    copy_weights(plain, ours)
    offload = flag == "--offload-activations"  # offloading implies checkpointing
    for model in (ours, vanilla):
        for layer in [*model.encoder.layers, *model.decoder.layers]:
            assert layer.forward.func.__name__ == "_checkpointed_forward"
            assert layer.forward.args[1] is offload  # fairseq's offload_to_cpu
    batch = random_batch(task.source_dictionary)
    outputs, calls = [], []
    for model in (ours, vanilla, plain):
        counts, handles = layer_calls(model.encoder.layers)
        model.train()
        torch.manual_seed(3)
        out = model(*batch)[0]
        out.float().square().mean().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        outputs.append((out.detach(), grads))
        calls.append(counts[:])
        for h in handles:
            h.remove()
    # checkpointing runs every layer a second time in the backward pass
    assert calls == [[2] * 4, [2] * 4, [1] * 4]
    (out_ours, grads_ours), (out_vanilla, grads_vanilla), (out_plain, _) = outputs
    assert torch.equal(out_ours, out_vanilla) and torch.equal(out_ours, out_plain)
    assert grads_ours.keys() == grads_vanilla.keys()
    for name, grad in grads_ours.items():
        torch.testing.assert_close(grad, grads_vanilla[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize(
    "ours_flags, fairseq_flags, task, layerdrop",
    [
        (OURS_OFF, FAIRSEQ, "translation", []),
        (
            OURS_OFF,
            FAIRSEQ,
            "translation",
            ["--encoder-layerdrop", "0.5", "--decoder-layerdrop", "0.5"],
        ),
        (
            OURS_ON,
            FAIRSEQ,
            "translation",
            ["--encoder-layerdrop", "0.5", "--decoder-layerdrop", "0.5"],
        ),
        (OURS_ROBERTA_ON, FAIRSEQ_ROBERTA, "masked_lm", ["--encoder-layerdrop", "0.5"]),
    ],
    ids=["translation", "translation-layerdrop", "residual-on-layerdrop", "roberta-layerdrop"],
)
def test_same_seed_gives_fairseq_initial_weights(
    dict_dir, ours_flags, fairseq_flags, task, layerdrop
):
    """Building the model draws the same random numbers as fairseq's, LayerDrop
    included: iterating its layer list after the build (to check the chains)
    would draw more, and see only some of the layers."""
    torch.manual_seed(5)
    ours, _ = build(dict_dir, *ours_flags, *layerdrop, task=task)
    ours_rng = torch.random.get_rng_state()
    torch.manual_seed(5)
    vanilla, _ = build(dict_dir, *fairseq_flags, *layerdrop, task=task)
    assert torch.equal(ours_rng, torch.random.get_rng_state())
    layers = ours.encoder.sentence_encoder.layers if task == "masked_lm" else ours.encoder.layers
    assert type(layers).__name__ == ("LayerDropModuleList" if layerdrop else "ModuleList")
    if ours_flags is OURS_OFF:
        theirs = vanilla.state_dict()
        different = [k for k, v in theirs.items() if not torch.equal(v, ours.state_dict()[k])]
        assert different == []


def test_tie_adaptive_weights_drops_the_output_dim_projection_as_in_fairseq(dict_dir):
    """In fairseq's translation transformer --tie-adaptive-weights (without
    --adaptive-softmax-cutoff, refused below) only removes the projection to
    --decoder-output-dim: the features keep the embedding width."""
    output_dim = ["--decoder-output-dim", "32"]
    ours, task = build(dict_dir, *OURS_OFF, *output_dim, "--tie-adaptive-weights")
    vanilla, _ = build(dict_dir, *FAIRSEQ, *output_dim, "--tie-adaptive-weights")
    ours_without, _ = build(dict_dir, *OURS_OFF, *output_dim)
    vanilla_without, _ = build(dict_dir, *FAIRSEQ, *output_dim)
    copy_weights(vanilla, ours)
    copy_weights(ours_without, ours, allowed_missing=("decoder.project_out_dim",))
    copy_weights(vanilla_without, ours_without)
    assert ours.decoder.project_out_dim is None and ours_without.decoder.project_out_dim
    batch = random_batch(task.source_dictionary, bsz=3, src_len=7, tgt_len=6)
    for train in (False, True):
        features = forward(ours, batch, train, features_only=True)[0]
        assert features.shape == (3, 6, 64)
        assert torch.equal(features, forward(vanilla, batch, train, features_only=True)[0])
        without = forward(ours_without, batch, train, features_only=True)[0]
        assert without.shape == (3, 6, 32)
        assert torch.equal(without, forward(vanilla_without, batch, train, features_only=True)[0])


def test_alignment_layer_and_heads_as_in_fairseq(dict_dir):
    """``--alignment-layer/--alignment-heads`` are flags of fairseq's
    ``transformer_align`` only (argparse refuses them for ``transformer`` and for
    ours); the decoder arguments they set, and the default attention that
    ``--print-alignment`` reads, equal fairseq's."""
    from fairseq import options

    with pytest.raises(SystemExit):
        options.parse_args_and_arch(
            options.get_training_parser(),
            ["x", "--user-dir", USER_DIR, "--task", "translation", *OURS_OFF]
            + ["--alignment-layer", "1"],
        )
    ours, task = build(dict_dir, *OURS_OFF)
    vanilla, _ = build(dict_dir, *FAIRSEQ)
    copy_weights(vanilla, ours)
    batch = random_batch(task.source_dictionary)
    attns = {}
    for kwargs in ({}, {"alignment_layer": 1, "alignment_heads": 1}):
        ours_attn = forward(ours, batch, train=False, **kwargs)[1]["attn"][0]
        vanilla_attn = forward(vanilla, batch, train=False, **kwargs)[1]["attn"][0]
        assert ours_attn.shape == (3, 6, 7)
        assert torch.equal(ours_attn, vanilla_attn)
        attns[bool(kwargs)] = ours_attn
    assert not torch.allclose(attns[False], attns[True], atol=1e-4)


# ------------------------------------------------------- refused at start-up


@pytest.mark.parametrize(
    "arch_flags",
    [OURS_OFF, OURS_ON, ["--arch", "realformer_tiny"]],
    ids=["residual-off", "residual-on", "realformer-admin"],
)
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--cross-self-attention"], "--cross-self-attention is not supported"),
        (["--base-layers", "1"], "--base-layers is not supported"),
        (
            ["--encoder-layers-to-keep", "0,2"],
            "--encoder-layers-to-keep as a list (command line or config) crashes fairseq",
        ),
        (
            ["--decoder-layers-to-keep", "0,2"],
            "--decoder-layers-to-keep as a list (command line or config) crashes fairseq",
        ),
        (
            ["--tie-adaptive-weights", "--adaptive-softmax-cutoff", "10,20"],
            "--tie-adaptive-weights with --adaptive-softmax-cutoff needs adaptive input",
        ),
    ],
    ids=[
        "cross-self-attention",
        "base-layers",
        "encoder-layers-to-keep-list",
        "decoder-layers-to-keep-list",
        "tie-adaptive-weights-with-adaptive-softmax",
    ],
)
def test_unsupported_flag_is_one_error_line(dict_dir, arch_flags, flags, message):
    with pytest.raises(RealformerConfigError) as err:
        build(dict_dir, *arch_flags, *flags)
    text = str(err.value)
    assert text.startswith(message), text
    assert "\n" not in text


@pytest.mark.parametrize(
    "residual, flag, refused",
    [
        ("encoder", "--encoder-xformers-att-config", True),
        ("cross", "--encoder-xformers-att-config", True),  # fairseq gives it to cross-attn
        ("decoder", "--encoder-xformers-att-config", False),
        ("decoder", "--decoder-xformers-att-config", True),
        ("encoder,cross", "--decoder-xformers-att-config", False),
    ],
)
def test_xformers_config_is_refused_on_residual_chains(residual, flag, refused):
    """The refusal alone (xformers is not installed here: the accepted cases are
    checked on the flags, not built)."""
    import argparse

    from realformer_fairseq.errors import RealformerConfigError
    from realformer_fairseq.models.build_checks import settings_for_build

    args = argparse.Namespace(
        residual_attention=residual, residual_attention_mode="sum", init_type="default"
    )
    setattr(args, flag[2:].replace("-", "_"), '{"name": "scaled_dot_product"}')
    chains = ("encoder", "decoder", "cross")
    if refused:
        with pytest.raises(RealformerConfigError, match=re.escape(flag)):
            settings_for_build(args, chains, "the model")
    else:
        settings_for_build(args, chains, "the model")
    # the encoder-only model has no decoder chains
    if flag == "--decoder-xformers-att-config":
        args.residual_attention = "all"
        settings_for_build(args, ("encoder",), "the model")


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_layers_to_keep_as_a_hydra_list_is_refused(side):
    """A hydra/yaml config can give the list form without the command line
    (``layers_to_keep: [0, 2]``): the same refusal, not fairseq's AttributeError."""
    from omegaconf import OmegaConf

    from realformer_fairseq.errors import RealformerConfigError
    from realformer_fairseq.models.build_checks import settings_for_build

    cfg = OmegaConf.create(
        {
            f"{side}_layers_to_keep": [0, 2],
            "residual_attention": "all",
            "residual_attention_mode": "mean",
            "init_type": "admin",
        }
    )
    with pytest.raises(RealformerConfigError, match=f"^--{side}-layers-to-keep as a list"):
        settings_for_build(cfg, ("encoder", "decoder", "cross"), "the model")


def test_layers_to_keep_on_the_command_line_crashes_fairseq_transformer(dict_dir):
    """Why the command-line form is refused: fairseq 0.12.3's own transformer
    parses it into a list and then calls ``.split(",")`` on it."""
    with pytest.raises(AttributeError, match="split"):
        build(dict_dir, *FAIRSEQ, "--encoder-layers-to-keep", "0,2")


def test_layers_to_keep_of_one_side_is_refused_as_fairseq_drops_the_other_side():
    """fairseq 0.12.3's prune_state_dict keeps only the layers of the sides it
    prunes: with encoder_layers_to_keep alone, its own transformer loses every
    decoder layer of the checkpoint. Ours refuses that at start-up."""
    full, _ = build_fairseq_tiny_transformer(**NAMESPACE_LAYERS)
    vanilla, _ = build_fairseq_tiny_transformer(encoder_layers_to_keep="0,2", **NAMESPACE_LAYERS)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\)[^\n]*decoder\.layers\.0\."):
        vanilla.load_state_dict(full.state_dict(), model_cfg=vanilla.args)
    for side, other in (("encoder", "decoder"), ("decoder", "encoder")):
        with pytest.raises(RealformerConfigError) as err:
            build_translation_model(
                "postln_transformer_tiny", **NAMESPACE_LAYERS, **{f"{side}_layers_to_keep": "0,2"}
            )
        assert str(err.value).startswith(f"{side}_layers_to_keep without {other}_layers_to_keep")


# ------------------------------------------- residual attention on: the effect


def record_chain(modules):
    """Keyword inputs and outputs of every call of each residual attention module."""
    records = [[] for _ in modules]
    handles = []
    for rec, module in zip(records, modules):
        assert isinstance(module, RealformerMultiheadAttention)

        def hook(mod, args, kwargs, output, rec=rec):
            rec.append({"layer_idx": kwargs["layer_idx"], "scores": output[2]})

        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    return records, handles


def layerdrop_kept_layers(seed, num_layers=4, p=0.5):
    """The layers LayerDropModuleList keeps on the first draw after ``seed`` (its
    ``torch.empty(n).uniform_() > p``), written out independently."""
    torch.manual_seed(seed)
    draws = torch.empty(num_layers).uniform_()
    return [i for i in range(num_layers) if draws[i] > p]


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_layerdrop_with_residual_attention_leaves_the_layer_out_of_the_stream(dict_dir, side):
    """A dropped layer adds no scores to its chains, and the running mean divides
    by the layers that ran: the forward equals that of the model pruned to the
    kept layers (``--*-layers-to-keep``), as LayerDrop means it to."""
    torch.manual_seed(0)
    ours, task = build(dict_dir, *OURS_ON, *NO_DROPOUT, f"--{side}-layerdrop", "0.5")
    # with dropout off, LayerDrop's draw is the only random number of a forward;
    # pick a seed that drops a layer that is not the last one
    seed = next(
        s
        for s in range(100)
        if 2 <= len(layerdrop_kept_layers(s)) < 4 and layerdrop_kept_layers(s) != [0, 1, 2]
    )
    kept = layerdrop_kept_layers(seed)
    layers = getattr(ours, side).layers
    chains = [[layers[i].self_attn for i in range(4)]]
    if side == "decoder":
        chains.append([layers[i].encoder_attn for i in range(4)])
    recorded = [record_chain(chain) for chain in chains]
    batch = random_batch(task.source_dictionary)
    out = forward(ours, batch, train=True, seed=seed)[0]
    for records, handles in recorded:
        for h in handles:
            h.remove()
        assert [i for i in range(4) if records[i]] == kept
        assert [records[i][0]["layer_idx"] for i in kept] == list(range(len(kept)))

    pruned, _ = build_translation_model(
        "realformer_tiny",
        init_type="default",
        **NAMESPACE_NO_DROPOUT,
        **NAMESPACE_LAYERS,
        **{
            "encoder_layers_to_keep": "0,1,2,3",
            "decoder_layers_to_keep": "0,1,2,3",
            f"{side}_layers_to_keep": ",".join(map(str, kept)),
        },
    )
    state = {k: v for k, v in ours.state_dict().items()}
    pruned.load_state_dict(state, model_cfg=pruned.args)
    torch.testing.assert_close(out, forward(pruned, batch, train=False)[0], rtol=0, atol=1e-6)
    assert not torch.allclose(out, forward(ours, batch, train=False)[0], atol=1e-4)


def test_admin_profiling_profiles_every_layer_under_layerdrop():
    """ADMIN's omega comes from one pass over the full stack: LayerDrop is paused
    while profiling (a dropped layer would keep omega = 1 and the ratio chain
    would skip it), and works again afterwards."""
    torch.manual_seed(0)
    plain, dictionary = build_translation_model(
        "realformer_tiny", **NAMESPACE_LAYERS, **NAMESPACE_NO_DROPOUT
    )
    dropping, _ = build_translation_model(
        "realformer_tiny",
        encoder_layerdrop=0.5,
        decoder_layerdrop=0.5,
        **NAMESPACE_LAYERS,
        **NAMESPACE_NO_DROPOUT,
    )
    dropping.load_state_dict(plain.state_dict())
    batch = random_batch(dictionary)
    omegas = []
    for model in (plain, dropping):
        assert model.needs_admin_profiling()
        forward(model, batch, train=True, seed=1)
        assert int(model.admin_profiled) == 1
        omegas.append({k: v for k, v in model.state_dict().items() if k.endswith("omega_init")})
    assert len(omegas[0]) == 2 * 4 + 3 * 4
    assert omegas[0].keys() == omegas[1].keys()
    for key, value in omegas[0].items():
        assert torch.equal(value, omegas[1][key]), key
    # the profiled values are not the initial 1 (except the first sublayer of a stack)
    assert sum(float(v) != 1.0 for v in omegas[1].values()) == 20 - 2
    assert dropping.encoder.layers.training and dropping.decoder.layers.training
    counts, handles = layer_calls(dropping.encoder.layers)
    for seed in range(6):
        forward(dropping, batch, train=True, seed=seed)
    for h in handles:
        h.remove()
    assert sum(counts) < 6 * 4  # LayerDrop is on again


def test_layers_to_keep_with_residual_attention_keeps_admin_omega():
    """Pruning a profiled RealFormer+ADMIN checkpoint: omega and the profiled flag
    follow their layers, and the chain runs over the kept layers only."""
    torch.manual_seed(0)
    full, dictionary = build_translation_model("realformer_tiny", **NAMESPACE_LAYERS)
    batch = random_batch(dictionary)
    forward(full, batch, train=True)  # profiles omega
    keep = dict(encoder_layers_to_keep="1,3", decoder_layers_to_keep="0,2")
    pruned, _ = build_translation_model("realformer_tiny", **NAMESPACE_LAYERS, **keep)
    pruned.load_state_dict(full.state_dict(), model_cfg=pruned.args)
    # the same model written by hand: two layers each, keys renamed here
    manual, _ = build_translation_model(
        "realformer_tiny", encoder_layers=2, decoder_layers=2, share_all_embeddings=True
    )
    renames = {"encoder.layers.1.": "encoder.layers.0.", "encoder.layers.3.": "encoder.layers.1."}
    renames.update(
        {"decoder.layers.0.": "decoder.layers.0.", "decoder.layers.2.": "decoder.layers.1."}
    )
    state = {}
    for key, value in full.state_dict().items():
        match = re.match(r"(encoder|decoder)\.layers\.\d+\.", key)
        if not match:
            state[key] = value
        elif match.group(0) in renames:
            state[renames[match.group(0)] + key[match.end() :]] = value
    manual.load_state_dict(state)
    assert int(pruned.admin_profiled) == 1 and not pruned.needs_admin_profiling()
    assert float(pruned.encoder.layers[1].ffn_residual.omega_init) == float(
        full.encoder.layers[3].ffn_residual.omega_init
    )
    assert float(full.encoder.layers[3].ffn_residual.omega_init) != 1.0
    out = forward(pruned, batch, train=False)[0]
    assert torch.equal(out, forward(manual, batch, train=False)[0])
    assert not torch.allclose(out, forward(full, batch, train=False)[0], atol=1e-4)


@pytest.mark.parametrize(
    "flag", ["layernorm-embedding", "no-scale-embedding", "no-token-positional-embeddings"]
)
def test_embedding_flag_with_residual_attention(dict_dir, flag):
    """The flag changes the layers' input exactly as in fairseq's model (= ours with
    residual attention off), and so the residual model's output."""
    with_flag, without_flag, new_keys = OUTPUT_FLAGS[flag]
    torch.manual_seed(0)
    on, task = build(dict_dir, *OURS_ON, *with_flag)
    off, _ = build(dict_dir, *OURS_OFF, *with_flag)
    on_without, _ = build(dict_dir, *OURS_ON, *without_flag)
    copy_weights(off, on)
    copy_weights(on_without, on, allowed_missing=new_keys, allowed_unexpected=new_keys)
    batch = random_batch(task.source_dictionary)
    out, extra = forward(on, batch, train=False)
    out_off, extra_off = forward(off, batch, train=False)
    assert torch.equal(extra["inner_states"][0], extra_off["inner_states"][0])  # decoder input
    src, src_lengths, _ = batch
    for model in (on, off):
        model.train()
    torch.manual_seed(3)
    enc_on = on.encoder(src, src_lengths, return_all_hiddens=True)["encoder_states"][0]
    torch.manual_seed(3)
    enc_off = off.encoder(src, src_lengths, return_all_hiddens=True)["encoder_states"][0]
    assert torch.equal(enc_on, enc_off)  # encoder input, dropout on
    assert not torch.allclose(out, out_off, atol=1e-4)  # residual attention is on
    assert not torch.allclose(out, forward(on_without, batch, train=False)[0], atol=1e-4)


def zeroed_block_fraction(weight, original, block_size=8):
    """Fraction of ``block_size`` input blocks that quant noise zeroed; the others
    must be the original scaled by 1 / (1 - p) = 2 (fairseq's quant_noise, p=0.5)."""
    blocks = weight.view(weight.size(0), -1, block_size)
    zeroed = (blocks == 0).all(-1)
    kept = ~zeroed
    torch.testing.assert_close(blocks[kept], 2 * original.view_as(blocks)[kept], rtol=1e-6, atol=0)
    return zeroed.float().mean().item()


def test_quant_noise_reaches_every_residual_attention_projection(dict_dir):
    """fairseq's quant noise is a hook on each projection. In training fairseq's
    fused attention path (encoder and decoder self-attention) reads the weights
    without calling the projections, so there the noise never fires; the residual
    attention calls q/k/v/out_proj, so it fires on all of them, as in fairseq's
    own non-fused path (cross-attention)."""
    on, task = build(dict_dir, *OURS_ON, "--quant-noise-pq", "0.5")
    off, _ = build(dict_dir, *OURS_OFF, "--quant-noise-pq", "0.5")
    batch = random_batch(task.source_dictionary)
    projections = ("q_proj", "k_proj", "v_proj", "out_proj")

    def weights(model, attr):
        return {
            f"{side}.{i}.{attr}.{proj}": getattr(getattr(layer, attr), proj).weight
            for side, layers in (
                ("encoder", model.encoder.layers),
                ("decoder", model.decoder.layers),
            )
            for i, layer in enumerate(layers[j] for j in range(len(layers)))
            if getattr(layer, attr, None) is not None
            for proj in projections
        }

    on_weights = {**weights(on, "self_attn"), **weights(on, "encoder_attn")}
    assert len(on_weights) == (4 + 4 + 4) * 4
    before = {k: w.detach().clone() for k, w in on_weights.items()}
    forward(on, batch, train=False)
    assert all(torch.equal(w, before[k]) for k, w in on_weights.items())  # training only
    forward(on, batch, train=True)
    for key, w in on_weights.items():
        assert 0.35 < zeroed_block_fraction(w.detach(), before[key]) < 0.65, key

    off_self = weights(off, "self_attn")
    off_before = {k: w.detach().clone() for k, w in off_self.items()}
    forward(off, batch, train=True)
    assert all(torch.equal(w, off_before[k]) for k, w in off_self.items())


def test_activation_checkpointing_with_residual_attention_recomputes_every_chain(dict_dir):
    ours, task = build(dict_dir, *OURS_ON, "--offload-activations")
    calls = []
    handles = []
    for layers, attr in (
        (ours.encoder.layers, "self_attn"),
        (ours.decoder.layers, "self_attn"),
        (ours.decoder.layers, "encoder_attn"),
    ):
        counts, hs = layer_calls(layers, attr)
        calls.append(counts)
        handles += hs
    ours.train()
    torch.manual_seed(3)
    ours(*random_batch(task.source_dictionary))[0].square().mean().backward()
    for h in handles:
        h.remove()
    assert calls == [[2] * 4] * 3
    assert all(layer.forward.args[1] is True for layer in ours.encoder.layers)  # offload


def test_tie_adaptive_weights_with_residual_attention(dict_dir):
    ours, task = build(dict_dir, *OURS_ON, "--decoder-output-dim", "32", "--tie-adaptive-weights")
    assert ours.decoder.project_out_dim is None
    features = forward(ours, random_batch(task.source_dictionary), False, features_only=True)[0]
    assert features.shape == (3, 6, 64)


def test_alignment_with_residual_attention_is_the_residual_softmax(dict_dir):
    """The alignment the decoder returns is the cross-attention distribution that the
    residual model used: softmax over the running mean of the cross stream."""
    ours, task = build(dict_dir, *OURS_ON)
    batch = random_batch(task.source_dictionary)
    modules = [ours.decoder.layers[i].encoder_attn for i in range(4)]
    records, handles = record_chain(modules)
    attn = forward(ours, batch, train=False, alignment_layer=1, alignment_heads=1)[1]["attn"][0]
    for h in handles:
        h.remove()
    stream = records[1][0]["scores"]  # running sum after layers 0 and 1
    assert records[1][0]["layer_idx"] == 1
    src = batch[0]
    bsz, src_len = src.shape
    logits = (stream / 2).view(bsz, 2, -1, src_len)
    pad = src.eq(task.source_dictionary.pad()).view(bsz, 1, 1, src_len)
    expected = torch.softmax(logits.masked_fill(pad, -math.inf), dim=-1)[:, 0]
    torch.testing.assert_close(attn, expected, rtol=0, atol=1e-6)


# ---------------------------------------------- the encoder-only RoBERTa model


def bert_tokens(dictionary, bsz=3, length=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (bsz, length), generator=g)
    tokens[:, 0], tokens[:, -1] = dictionary.bos(), dictionary.eos()
    tokens[1, length - 3 :] = dictionary.pad()
    return tokens


ROBERTA_FLAGS = {
    # fairseq's RoBERTa turns --layernorm-embedding and --no-scale-embedding on
    "defaults": ([], None, ()),
    "encoder-layerdrop": (["--encoder-layerdrop", "0.5"], [], ()),
    "quant-noise-pq": (["--quant-noise-pq", "0.25"], [], ("encoder.sentence_encoder.quant",)),
}


@pytest.mark.parametrize("arch_flags", [FAIRSEQ_ROBERTA, OURS_ROBERTA_ON], ids=["fairseq", "ours"])
@pytest.mark.parametrize(
    "flag",
    [
        "--no-token-positional-embeddings",
        "--adaptive-input",
        "--checkpoint-activations",
        "--offload-activations",
        "--no-scale-embedding",
    ],
)
def test_roberta_has_no_such_flag_as_in_fairseq_roberta(dict_dir, arch_flags, flag):
    """RoBERTa's parser (fairseq's and so ours) does not take these flags."""
    from fairseq import options

    argv = [str(dict_dir), "--user-dir", USER_DIR, "--task", "masked_lm", *arch_flags, flag]
    with pytest.raises(SystemExit) as err:
        options.parse_args_and_arch(options.get_training_parser(), argv)
    assert err.value.code == 2  # argparse: unrecognized arguments


@pytest.mark.parametrize("flag", list(ROBERTA_FLAGS))
def test_roberta_flag_as_in_fairseq_roberta(dict_dir, flag):
    with_flag, without_flag, new_keys = ROBERTA_FLAGS[flag]
    torch.manual_seed(0)
    ours, task = build(dict_dir, *OURS_ROBERTA_OFF, *with_flag, task="masked_lm")
    vanilla, _ = build(dict_dir, *FAIRSEQ_ROBERTA, *with_flag, task="masked_lm")
    assert type(vanilla).__name__ == "RobertaModel"
    enc = ours.encoder.sentence_encoder
    assert enc.layernorm_embedding is not None and enc.embed_scale == 1.0
    copy_weights(vanilla, ours)
    tokens = bert_tokens(task.source_dictionary)
    if without_flag is not None:
        ours_without, _ = build(dict_dir, *OURS_ROBERTA_OFF, *without_flag, task="masked_lm")
        copy_weights(ours_without, ours, allowed_missing=new_keys, allowed_unexpected=new_keys)
    for train in (False, True):
        outs = []
        for model in (ours, vanilla) + ((ours_without,) if without_flag is not None else ()):
            model.train(train)
            torch.manual_seed(3)
            with torch.no_grad():
                outs.append(model(tokens)[0])
        assert torch.equal(outs[0], outs[1]), f"train={train}"
        if without_flag is not None and (train or flag != "encoder-layerdrop"):
            assert not torch.allclose(outs[0], outs[2], atol=1e-4)


def test_roberta_layers_to_keep_as_in_fairseq_roberta(dict_dir):
    """RoBERTa's parser keeps --encoder-layers-to-keep a string: it works there."""
    full, task = build(dict_dir, *OURS_ROBERTA_ON, task="masked_lm")
    keep = ["--encoder-layers-to-keep", "0,3"]
    on, _ = build(dict_dir, *OURS_ROBERTA_ON, *keep, task="masked_lm")
    off, _ = build(dict_dir, *OURS_ROBERTA_OFF, *keep, task="masked_lm")
    vanilla, _ = build(dict_dir, *FAIRSEQ_ROBERTA, *keep, task="masked_lm")
    state = {k: v for k, v in full.state_dict().items() if k != "admin_profiled"}
    for model in (on, off, vanilla):
        assert len(model.encoder.sentence_encoder.layers) == 2
        model.load_state_dict(dict(state), strict=False, model_cfg=model.args)
    layers = on.encoder.sentence_encoder.layers
    assert torch.equal(layers[1].fc1.weight, full.encoder.sentence_encoder.layers[3].fc1.weight)
    tokens = bert_tokens(task.source_dictionary)
    outs = []
    for model in (on, off, vanilla, full):
        model.eval()
        with torch.no_grad():
            outs.append(model(tokens)[0])
    assert torch.equal(outs[1], outs[2])  # residual off = fairseq's roberta
    assert not torch.allclose(outs[0], outs[1], atol=1e-4)  # residual on: a 2-layer chain
    assert not torch.allclose(outs[0], outs[3], atol=1e-4)


def test_roberta_layerdrop_with_residual_attention_numbers_the_layers_that_ran(dict_dir):
    ours, task = build(
        dict_dir, *OURS_ROBERTA_ON, "--encoder-layerdrop", "0.5", *NO_DROPOUT, task="masked_lm"
    )
    layers = ours.encoder.sentence_encoder.layers
    records, handles = record_chain([layers[i].self_attn for i in range(4)])
    tokens = bert_tokens(task.source_dictionary)
    ours.train()
    renumbered = 0
    for seed in range(4):
        before = [len(rec) for rec in records]
        torch.manual_seed(seed)
        with torch.no_grad():
            ours(tokens)
        ran = [i for i in range(4) if len(records[i]) > before[i]]
        # with dropout off LayerDrop's draw is the forward's only random number
        assert ran == layerdrop_kept_layers(seed)
        assert [records[i][-1]["layer_idx"] for i in ran] == list(range(len(ran)))
        renumbered += ran != list(range(len(ran)))
    for h in handles:
        h.remove()
    assert renumbered > 0  # some forward dropped a layer before a kept one


def test_tie_adaptive_weights_with_adaptive_softmax_crashes_fairseq_transformer(dict_dir):
    """Why the combination is refused: fairseq's translation transformer ties the
    adaptive softmax to its token embedding, an nn.Embedding without bands."""
    flags = ["--tie-adaptive-weights", "--adaptive-softmax-cutoff", "10,20"]
    with pytest.raises(AttributeError, match="weights_for_band"):
        build(dict_dir, *FAIRSEQ, *flags)


@pytest.mark.parametrize(
    "overrides",
    [
        {"layernorm_embedding": True},
        {"no_scale_embedding": True},
        {"no_token_positional_embeddings": True},
        {"quant_noise_pq": 0.25},
        {"decoder_output_dim": 32, "tie_adaptive_weights": True},
        {"encoder_layers_to_keep": "0,3", "decoder_layers_to_keep": "1,2"},
    ],
    ids=[
        "layernorm-embedding",
        "no-scale-embedding",
        "no-token-positional-embeddings",
        "quant-noise-pq",
        "tie-adaptive-weights",
        "layers-to-keep",
    ],
)
def test_incremental_decoding_with_the_flag_equals_the_full_forward(overrides):
    """The re-owned decoder loop applies the flag in incremental decoding
    (``fairseq-generate``) as in the full forward, residual attention on."""
    torch.manual_seed(0)
    model, dictionary = build_translation_model(
        "realformer_tiny", init_type="default", **NAMESPACE_LAYERS, **overrides
    )
    model.eval()
    src, src_lengths, tgt = random_batch(dictionary, bsz=3, src_len=8, tgt_len=6, pad_rows=())
    with torch.no_grad():
        full = model(src, src_lengths, tgt, features_only=True)[0]
        encoder_out = model.encoder(src, src_lengths)
        incremental_state = {}
        steps = [
            model.decoder(
                tgt[:, : t + 1],
                encoder_out=encoder_out,
                incremental_state=incremental_state,
                features_only=True,
            )[0][:, -1]
            for t in range(tgt.size(1))
        ]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("flag", ["--scale-attn", "--scale-fc", "--scale-heads", "--scale-resids"])
@pytest.mark.parametrize("arch", ["realformer_lm_tiny", "postln_transformer_lm_tiny"])
def test_normformer_flags_are_refused_on_the_language_model(dict_dir, arch, flag):
    """fairseq 0.12.3's NormFormer flags (transformer_lm only) add LayerNorms and scales in
    the decoder layer's forward, which the plugin re-owns without them."""
    with pytest.raises(RealformerConfigError) as err:
        build(dict_dir, "--arch", arch, flag, task="language_modeling")
    assert str(err.value).startswith(f"{flag} (NormFormer) is not supported"), str(err.value)
    fairseq_model, _ = build(
        dict_dir,
        "--arch",
        "transformer_lm",
        "--decoder-layers",
        "1",
        flag,
        task="language_modeling",
    )  # the flag builds in fairseq's own model
    assert fairseq_model is not None


def test_multilingual_translation_task_is_refused_with_one_line():
    """fairseq's multilingual_translation task needs a FairseqMultiModel; fairseq itself ends
    in a ValueError traceback after building the model."""
    import argparse

    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks.multilingual_translation import MultilingualTranslationTask

    dictionary = toy_dictionary()
    args = argparse.Namespace(
        lang_pairs="en-fr",
        source_lang=None,
        target_lang=None,
        encoder_langtok=None,
        decoder_langtok=False,
        arch="realformer_tiny",
        _name="realformer_tiny",
    )
    task = MultilingualTranslationTask(args, {"en": dictionary, "fr": dictionary}, True)
    with pytest.raises(RealformerConfigError, match="^--task multilingual_translation needs"):
        ARCH_MODEL_REGISTRY["realformer_tiny"].build_model(args, task)
