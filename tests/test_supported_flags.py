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
from harness import USER_DIR, build_translation_model, random_batch, toy_dictionary

from realformer_fairseq.modules.residual_attention import RealformerMultiheadAttention

TINY = ["--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128"]
TINY += ["--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
LAYERS = ["--encoder-layers", "4", "--decoder-layers", "4", "--share-all-embeddings"]
# fairseq's transformer at our tiny size; our arch with residual attention off
FAIRSEQ = ["--arch", "transformer", *TINY, *LAYERS]
OURS_OFF = ["--arch", "postln_transformer_tiny", *LAYERS]
# residual attention on (all three chains, running mean), fairseq's init
OURS_ON = ["--arch", "realformer_tiny", "--init-type", "default", *LAYERS]
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]
# the same, as the args Namespace a checkpoint carries (what --model-overrides edits)
NAMESPACE_LAYERS = dict(encoder_layers=4, decoder_layers=4, share_all_embeddings=True)
NAMESPACE_FAIRSEQ = dict(
    encoder_embed_dim=64,
    encoder_ffn_embed_dim=128,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    **NAMESPACE_LAYERS,
)

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
    vanilla, _ = build_translation_model(
        "transformer", model="transformer", **NAMESPACE_FAIRSEQ, **keep
    )
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
    "flags", [[], ["--encoder-layerdrop", "0.5", "--decoder-layerdrop", "0.5"]]
)
def test_same_seed_gives_fairseq_initial_weights(dict_dir, flags):
    """Building the model draws the same random numbers as fairseq's (LayerDrop
    included: iterating its layer list at build time would draw more)."""
    torch.manual_seed(5)
    ours, _ = build(dict_dir, *OURS_OFF, *flags)
    torch.manual_seed(5)
    vanilla, _ = build(dict_dir, *FAIRSEQ, *flags)
    theirs = vanilla.state_dict()
    assert ours.encoder.layers.__class__.__name__ == (
        "LayerDropModuleList" if flags else "ModuleList"
    )
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
            "--encoder-layers-to-keep on the command line crashes fairseq 0.12's transformer",
        ),
        (
            ["--decoder-layers-to-keep", "0,2"],
            "--decoder-layers-to-keep on the command line crashes fairseq 0.12's transformer",
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
    with pytest.raises(SystemExit) as err:
        build(dict_dir, *arch_flags, *flags)
    text = str(err.value)
    assert text.startswith("realformer_fairseq: error: " + message), text
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
    from realformer_fairseq.models.supported_flags import refuse_unsupported_flags

    args = argparse.Namespace(residual_attention=residual)
    setattr(args, flag[2:].replace("-", "_"), '{"name": "scaled_dot_product"}')
    if refused:
        with pytest.raises(RealformerConfigError, match=re.escape(flag)):
            refuse_unsupported_flags(args)
    else:
        refuse_unsupported_flags(args)
    # the encoder-only model has no decoder chains
    if flag == "--decoder-xformers-att-config":
        refuse_unsupported_flags(args, chains_used=("encoder",))
