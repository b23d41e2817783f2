"""Alignment supervision (Garg et al. 2019, fairseq's ``transformer_align``) on RealFormer
(He et al. 2020, arXiv 2012.11747): the plugin's ``realformer_transformer_align`` beside
fairseq 0.12.3's ``transformer_align`` at the same size, as fairseq's own
tests/test_binaries.py ``test_alignment`` / ``test_alignment_full_context`` run it
(``--load-alignments --criterion label_smoothed_cross_entropy_with_alignment``, then
``fairseq-generate --print-alignment``).
"""

import argparse
import random
import re

import pytest
import torch
from harness import (
    fairseq_command,
    generate,
    preprocess,
    random_batch,
    run,
    toy_dictionary,
    translation_train_args,
)
from test_supported_flags import build, copy_weights, record_chain

from realformer_fairseq.errors import RealformerConfigError
from realformer_fairseq.models.realformer_transformer_align import (
    RealformerTransformerAlignModel,
)
from realformer_fairseq.modules.admin import AdminResidual

TINY = ["--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128"]
TINY += ["--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
LAYERS = ["--encoder-layers", "3", "--decoder-layers", "3"]
ALIGN = ["--alignment-layer", "1", "--alignment-heads", "1"]
FAIRSEQ_ALIGN = ["--arch", "transformer_align", *TINY, *LAYERS, *ALIGN]
OURS_OFF = ["--arch", "postln_transformer_align_tiny", *LAYERS, *ALIGN]
OURS_ON = ["--arch", "realformer_align_tiny", "--init-type", "default", *LAYERS, *ALIGN]
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]
FULL_CONTEXT = {False: [], True: ["--full-context-alignment"]}
TRAIN_UPDATES = 100  # about 5 updates an epoch


@pytest.fixture(scope="module")
def dict_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("align-dicts")
    for name in ("dict.en.txt", "dict.fr.txt"):
        toy_dictionary().save(str(root / name))
    return root


def alignment_sample(task, seed=0):
    """A training sample with word alignments as fairseq's collater gives them: rows of
    ``alignments`` are (source position, row * tgt_len + target position); each target
    word is aligned to one source word."""
    src, src_lengths, prev = random_batch(task.source_dictionary, seed=seed, pad_rows=())
    target = torch.cat([prev[:, 1:], prev[:, :1]], dim=1)  # prev shifted back, eos last
    (bsz, tgt_len), src_len = target.shape, src.size(1)
    alignments = [
        [(t * 3 + b) % (src_len - 1), b * tgt_len + t]
        for b in range(bsz)
        for t in range(tgt_len - 1)
    ]
    return {
        "net_input": {"src_tokens": src, "src_lengths": src_lengths, "prev_output_tokens": prev},
        "target": target,
        "ntokens": target.numel(),
        "alignments": torch.tensor(alignments),
        "align_weights": torch.ones(len(alignments)),
    }


def alignment_criterion(task):
    from fairseq.criterions.label_smoothed_cross_entropy_with_alignment import (
        LabelSmoothedCrossEntropyCriterionWithAlignment,
    )

    return LabelSmoothedCrossEntropyCriterionWithAlignment(task, False, 0.1, 0.05)


# ------------------------------------------------------ in process: = fairseq's model


@pytest.mark.parametrize("full_context", [False, True], ids=["causal", "full-context"])
def test_without_residual_attention_equals_fairseq_transformer_align(dict_dir, full_context):
    """Residual attention off, ``--init-type default``: outputs, alignment attention and the
    alignment-supervised loss equal fairseq's ``transformer_align`` with the same weights."""
    flags = FULL_CONTEXT[full_context]
    torch.manual_seed(0)
    ours, task = build(dict_dir, *OURS_OFF, *flags)
    vanilla, _ = build(dict_dir, *FAIRSEQ_ALIGN, *flags)
    assert type(vanilla).__name__ == "TransformerAlignModel"
    assert isinstance(ours, RealformerTransformerAlignModel)
    for model in (ours, vanilla):
        assert (model.alignment_layer, model.alignment_heads) == (1, 1)
        assert model.full_context_alignment is full_context
    copy_weights(vanilla, ours)
    sample = alignment_sample(task)
    net_input = sample["net_input"]
    criterion = alignment_criterion(task)
    for train in (False, True):
        outs = []
        for model in (ours, vanilla):
            model.train(train)
            torch.manual_seed(3)
            with torch.no_grad():
                logits, extra = model(**net_input)
                torch.manual_seed(3)
                loss, _, logged = criterion(model, sample)
            outs.append((logits, extra["attn"][0], loss, logged["alignment_loss"]))
        (logits, attn, loss, align_loss), (v_logits, v_attn, v_loss, v_align_loss) = outs
        assert torch.equal(logits, v_logits), f"train={train}"
        assert attn.shape == (3, 6, 7) and torch.equal(attn, v_attn), f"train={train}"
        assert torch.equal(loss, v_loss) and align_loss == v_align_loss > 0
    # the alignment is layer 1's first head, not the decoder's default (last layer, all heads)
    ours.eval()
    with torch.no_grad():
        default = ours.decoder(
            net_input["prev_output_tokens"], ours.encoder(net_input["src_tokens"], None)
        )[1]["attn"][0]
    assert not torch.allclose(attn, default, atol=1e-3)


@pytest.mark.parametrize("full_context", [False, True], ids=["causal", "full-context"])
def test_alignment_with_residual_attention_is_the_residual_softmax(dict_dir, full_context):
    """Residual attention on: the supervised alignment is the softmax of the running mean of
    the cross-attention scores at ``--alignment-layer`` (the distribution the layer used), of
    its first ``--alignment-heads`` heads; with ``--full-context-alignment``, that of the
    second pass, without the future mask."""
    ours, task = build(dict_dir, *OURS_ON, *NO_DROPOUT, *FULL_CONTEXT[full_context])
    sample = alignment_sample(task)
    modules = [ours.decoder.layers[i].encoder_attn for i in range(3)]
    records, handles = record_chain(modules)
    ours.eval()
    with torch.no_grad():
        attn = ours(**sample["net_input"])[1]["attn"][0]
    for h in handles:
        h.remove()
    with torch.no_grad():
        causal_attn = ours.decoder(
            sample["net_input"]["prev_output_tokens"],
            ours.encoder(sample["net_input"]["src_tokens"], None),
            alignment_layer=1,
            alignment_heads=1,
        )[1]["attn"][0]
    assert [len(r) for r in records] == [2 if full_context else 1] * 3
    record = records[1][-1]
    assert record["layer_idx"] == 1
    bsz, src_len = sample["net_input"]["src_tokens"].shape
    logits = (record["scores"] / 2).view(bsz, 2, -1, src_len)  # running mean of layers 0, 1
    expected = torch.softmax(logits, dim=-1)[:, 0]
    torch.testing.assert_close(attn, expected, rtol=0, atol=1e-6)
    if full_context:
        assert not torch.allclose(attn, causal_attn, atol=1e-4)
    else:
        assert torch.equal(attn, causal_attn)


def test_admin_profiling_with_full_context_alignment_profiles_one_pass(dict_dir):
    """ADMIN profiles omega on the one pass that ``realformer_tiny`` runs: the full-context
    alignment pass would run every decoder sublayer again on the continued ratio chain."""
    torch.manual_seed(0)
    ours, task = build(dict_dir, "--arch", "realformer_align_tiny", "--full-context-alignment")
    plain, _ = build(dict_dir, "--arch", "realformer_tiny")
    copy_weights(plain, ours)
    net_input = alignment_sample(task)["net_input"]
    omegas = []
    for model in (ours, plain):
        model.train()
        torch.manual_seed(5)
        model(net_input["src_tokens"], net_input["src_lengths"], net_input["prev_output_tokens"])
        assert int(model.admin_profiled) == 1
        omegas.append(
            [float(m.omega_init) for m in model.modules() if isinstance(m, AdminResidual)]
        )
    assert len(omegas[0]) == 10 and omegas[0] == omegas[1]
    assert all(w > 1.0 for w in omegas[0][1:4] + omegas[0][5:])


def test_print_alignment_without_full_context_is_the_beam_search_attention(dict_dir):
    """fairseq 0.12.3's ``SequenceGeneratorWithAlignment`` (``--print-alignment``) re-runs the
    model's forward only under ``--full-context-alignment``; otherwise it takes the attention
    beam search kept, the decoder's default (last layer, mean of all heads), not the
    supervised head: for fairseq's ``transformer_align`` as for ours (said in the docs)."""
    from fairseq.sequence_generator import SequenceGeneratorWithAlignment

    torch.manual_seed(0)
    ours, task = build(dict_dir, *OURS_OFF)
    vanilla, _ = build(dict_dir, *FAIRSEQ_ALIGN)
    copy_weights(vanilla, ours)
    d = task.target_dictionary
    src, src_lengths, _ = random_batch(d, bsz=2, pad_rows=())
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    alignments, differs = [], 0
    for model in (ours, vanilla):
        model.eval()
        generator = SequenceGeneratorWithAlignment([model], d, beam_size=2, max_len_b=6)
        hypos = generator.generate([model], sample)
        alignments.append([h[0]["alignment"] for h in hypos])
        for i, sentence in enumerate(hypos):
            tokens = sentence[0]["tokens"].unsqueeze(0)
            prev = torch.cat([tokens[:, -1:], tokens[:, :-1]], dim=1)
            with torch.no_grad():
                enc = model.encoder(src[i : i + 1], src_lengths[i : i + 1])
                default = model.decoder(prev, enc)[1]["attn"][0][0]
                supervised = model(src[i : i + 1], src_lengths[i : i + 1], prev)[1]["attn"][0][0]
            words = range(tokens.size(1) - 1)
            expected = [(int(default[t, :-1].argmax()), t) for t in words]
            assert [tuple(map(int, pair)) for pair in sentence[0]["alignment"]] == expected
            differs += expected != [(int(supervised[t, :-1].argmax()), t) for t in words]
    assert alignments[0] == alignments[1] and differs > 0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--alignment-layer", "2"], r"^--alignment-layer 2 is not a decoder layer of --arch "),
        (["--alignment-layer", "-1"], r"^--alignment-layer -1 is not a decoder layer"),
        (["--alignment-heads", "3"], r"^--alignment-heads 3 is not a number of heads"),
        (["--alignment-heads", "0"], r"^--alignment-heads 0 is not a number of heads"),
    ],
)
def test_alignment_layer_or_heads_the_decoder_lacks_is_one_error_line(dict_dir, flags, message):
    with pytest.raises(RealformerConfigError, match=message) as err:
        build(dict_dir, "--arch", "realformer_align_tiny", *flags)
    assert "\n" not in str(err.value)


def test_alignment_layer_beyond_the_decoder_breaks_fairseq_transformer_align(dict_dir):
    """Why the plugin refuses it: fairseq's model returns no alignment attention and its
    alignment criterion fails with a traceback."""
    vanilla, task = build(dict_dir, "--arch", "transformer_align", *TINY, "--decoder-layers", "2")
    assert vanilla.alignment_layer == 4  # fairseq's default
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'shape'"):
        alignment_criterion(task)(vanilla, alignment_sample(task))


@pytest.mark.parametrize("flags", [FAIRSEQ_ALIGN, OURS_ON], ids=["fairseq", "ours"])
def test_transformer_align_does_not_script_in_fairseq_0_12_nor_here(dict_dir, flags):
    """Said in docs/guarantees.md: fairseq's ``TransformerAlignModel.forward_decoder`` takes
    ``**extra_args``, which TorchScript does not compile; ours mirrors it."""
    model, _ = build(dict_dir, *flags)
    with pytest.raises(torch.jit.frontend.NotSupportedError, match="variable number of arguments"):
        torch.jit.script(model)


def test_default_alignment_settings_are_fairseqs():
    from fairseq.models import ARCH_CONFIG_REGISTRY

    for arch, layer in (("realformer_transformer_align", 4), ("realformer_align_wmt_en_fr", 4)):
        args = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[arch](args)
        assert (args.alignment_layer, args.alignment_heads, args.full_context_alignment) == (
            layer,
            1,
            False,
        )
    args = argparse.Namespace()
    ARCH_CONFIG_REGISTRY["realformer_align_tiny"](args)
    assert (args.alignment_layer, args.decoder_layers) == (0, 2)


# --------------------------------------------- fairseq-train / fairseq-generate


def reversal_data(root, n_train=300, n_valid=30, n_test=12, seed=0):
    """Word-level "translation" by reversal and upper-casing, with its word alignments
    ("i-j", source word i to target word j) in fairseq's format, for train and valid."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(16)]
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        src, tgt, align = [], [], []
        for _ in range(n):
            sentence = [rng.choice(words) for _ in range(rng.randint(3, 7))]
            src.append(" ".join(sentence))
            tgt.append(" ".join(w.upper() for w in reversed(sentence)))
            align.append(" ".join(f"{i}-{len(sentence) - 1 - i}" for i in range(len(sentence))))
        for suffix, lines in (("en", src), ("fr", tgt), ("align", align)):
            if suffix != "align" or split != "test":
                (root / f"{split}.{suffix}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def align_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("align-run")
    (root / "raw").mkdir()
    raw = reversal_data(root / "raw")
    data_bin = preprocess(raw, root / "bin", extra=["--align-suffix", "align"])
    save_dir = root / "ck"
    train_out = run(
        [
            fairseq_command("fairseq-train"),
            *translation_train_args(
                data_bin,
                save_dir,
                arch="realformer_align_tiny",
                max_update=TRAIN_UPDATES,
                extra=[
                    "--load-alignments", "--full-context-alignment",
                    "--criterion", "label_smoothed_cross_entropy_with_alignment",
                    "--max-tokens", "500", "--lr", "5e-3", "--validate-interval", "5",
                ],
            ),
        ]
    )  # fmt: skip
    checkpoint = save_dir / "checkpoint_last.pt"
    generate_out = generate(data_bin, checkpoint, extra=["--beam", "3", "--print-alignment"])
    return data_bin, checkpoint, train_out, generate_out


def test_fairseq_train_supervises_the_alignment(align_run):
    from fairseq import checkpoint_utils

    _, checkpoint, train_out, _ = align_run
    assert "built --arch realformer_align_tiny: residual attention layers " in train_out
    assert train_out.count("ADMIN profiling done on the first training batch: 10 sublayers") == 1
    train = re.findall(r"train_inner \| .*? alignment_loss=([\d.]+)", train_out)
    assert len(train) == TRAIN_UPDATES and all(float(x) > 0 for x in train)
    # every 5th epoch a validation, on the same sentences: the valid alignments were loaded,
    # and the supervised attention comes closer to them
    valid = [
        float(x)
        for x in re.findall(r"valid on 'valid' subset \| .*? alignment_loss ([\d.]+)", train_out)
    ]
    assert len(valid) >= 3 and all(x > 0 for x in valid)
    assert valid[-1] < valid[0] - 0.05, valid
    models, _ = checkpoint_utils.load_model_ensemble([str(checkpoint)])
    model = models[0]
    assert isinstance(model, RealformerTransformerAlignModel)
    assert (model.alignment_layer, model.alignment_heads, model.full_context_alignment) == (
        0,
        1,
        True,
    )
    assert int(model.admin_profiled) == 1


def test_generate_print_alignment_prints_the_supervised_attention(align_run):
    """Each ``A-`` line of ``fairseq-generate --print-alignment`` is, for each target word,
    the source word of largest attention in the supervised head (layer 0, head 0, full
    context), computed here from the decoder of the loaded checkpoint."""
    from fairseq import checkpoint_utils

    data_bin, checkpoint, _, out = align_run
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    model = models[0].eval()
    d = task.source_dictionary
    sources = dict(re.findall(r"^S-(\d+)\t(.*)$", out, flags=re.M))
    hypotheses = dict((i, h) for i, _, h in re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", out, flags=re.M))
    alignments = dict(re.findall(r"^A-(\d+)\t(.*)$", out, flags=re.M))
    assert len(sources) == len(hypotheses) == len(alignments) == 12
    differs_from_the_default = 0
    for i, alignment in alignments.items():
        src = d.encode_line(sources[i], add_if_not_exist=False).long().unsqueeze(0)
        hyp = d.encode_line(hypotheses[i], add_if_not_exist=False).long().unsqueeze(0)
        prev = torch.cat([hyp[:, -1:], hyp[:, :-1]], dim=1)  # eos first
        with torch.no_grad():
            enc = model.encoder(src, torch.tensor([src.size(1)]))
            attns = [
                model.decoder(prev, enc, **kwargs)[1]["attn"][0][0]
                for kwargs in (
                    dict(alignment_layer=0, alignment_heads=1, full_context_alignment=True),
                    {},  # the decoder's default: last layer, mean of all heads
                )
            ]
        words = hyp.size(1) - 1
        expected, default = (
            " ".join(f"{a[t, :-1].argmax().item()}-{t}" for t in range(words)) for a in attns
        )
        assert alignment == expected, i
        differs_from_the_default += expected != default
    assert differs_from_the_default > 0
