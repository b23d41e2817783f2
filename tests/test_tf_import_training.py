"""Training from a checkpoint imported from Google's TF code (realformer-import-tf): fairseq's
sentence_prediction on sentence pairs (BERT's segment ids derived from </s>, classification head
started from the pre-trained pooler) and masked_lm continued, both with fairseq-train
--restore-file; the BERT options from scratch; refusals elsewhere."""

import random
import re
from pathlib import Path

import pytest
import torch
from harness import (
    USER_DIR,
    fairseq_command,
    fairseq_preprocess,
    fairseq_train,
    realformer_tf_fixture,
    run,
)

from realformer_fairseq.errors import RealformerConfigError
from realformer_fairseq.modules.bert import segment_ids_from_separator
from realformer_fairseq.tf_import.bert_checkpoint import convert_checkpoint

# words of the fixture's vocab.txt (so that the text is not all [UNK])
WORDS = (
    "the a cat dog sat on mat is was and it to of in red blue big small house tree run quick "
    "brown fox jump over lazy play happy sad book read write sun moon star sky water fire eat "
    "walk talk friend slow she he"
).split()


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("imported")
    convert_checkpoint(
        str(realformer_tf_fixture("model.ckpt")),
        str(realformer_tf_fixture("bert_config.json")),
        str(realformer_tf_fixture("vocab.txt")),
        str(out),
    )
    return out


def sentences(rng, n):
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))).capitalize() + "."
        for _ in range(n)
    ]


def wordpiece(imported: Path, raw: Path, out: Path):
    """Tokenise raw text with the command a user runs before fairseq-preprocess."""
    run(
        [
            fairseq_command("realformer-wordpiece"),
            "--vocab",
            imported / "vocab.txt",
            "--inputs",
            raw,
            "--outputs",
            out,
        ]
    )


def preprocess(imported: Path, prefix: Path, dest: Path, srcdict=True):
    fairseq_preprocess(
        [
            "--only-source",
            "--trainpref",
            f"{prefix}.train",
            "--validpref",
            f"{prefix}.valid",
            "--destdir",
            dest,
            "--workers",
            "1",
            *(["--srcdict", imported / "dict.txt"] if srcdict else []),
        ]
    )


@pytest.fixture(scope="module")
def pair_data(imported, tmp_path_factory):
    """Sentence pairs (label 1: B repeats A's first word) in sentence_prediction's layout,
    WordPiece-tokenised as a user does (``realformer-wordpiece`` for the first file, the same
    tokeniser in process for the others, to save start-up time)."""
    from realformer_fairseq.tf_import.wordpiece import BertTextTokenizer

    tokenizer = BertTextTokenizer.from_file(str(imported / "vocab.txt"), lowercase=True)
    root = tmp_path_factory.mktemp("pairs")
    rng = random.Random(0)
    for split, n in (("train", 64), ("valid", 16)):
        a, b = sentences(rng, n), sentences(rng, n)
        labels = [str(rng.randint(0, 1)) for _ in range(n)]
        b = [y if lab == "0" else x.split()[0].lower() + " " + y for x, y, lab in zip(a, b, labels)]
        for name, lines in (("input0", a), ("input1", b), ("label", labels)):
            if name == "input0" and split == "train":
                (root / "input0.train.raw").write_text("\n".join(lines) + "\n")
                wordpiece(imported, root / "input0.train.raw", root / "input0.train")
                continue
            if name != "label":
                lines = tokenizer.encode_lines(lines)
            (root / f"{name}.{split}").write_text("\n".join(lines) + "\n")
    for name in ("input0", "input1", "label"):
        preprocess(imported, root / name, root / "bin" / name, srcdict=name != "label")
    return root / "bin"


def model_args(imported: Path):
    return (imported / "model_args.txt").read_text().split()


SENTENCE_PAIRS = [
    "--task",
    "sentence_prediction",
    "--criterion",
    "sentence_prediction",
    "--num-classes",
    "2",
    "--init-token",
    "0",  # BERT's [CLS] A [SEP] B [SEP]: no --separator-token
]
COMMON = [
    "--optimizer",
    "adam",
    "--lr",
    "1e-4",
    "--batch-size",
    "16",
    "--log-format",
    "simple",
    "--log-interval",
    "1",
    "--num-workers",
    "0",
    "--seed",
    "1",
    "--cpu",
    "--no-epoch-checkpoints",
    "--reset-optimizer",
    "--reset-dataloader",
    "--reset-meters",
]


def test_sentence_prediction_gets_berts_segment_ids(imported, pair_data):
    """fairseq's sentence_prediction batch (input0 + input1, --init-token 0) -> the ids BERT's
    create_pretraining_data / run_classifier would give: 0 for [CLS] A [SEP], 1 for B [SEP]."""
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [str(pair_data), "--user-dir", USER_DIR, *SENTENCE_PAIRS, *model_args(imported)]
    )
    task = tasks.setup_task(args)
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    batch = dataset.collater([dataset[i] for i in range(4)])
    tokens = batch["net_input"]["src_tokens"]
    d = task.source_dictionary
    got = segment_ids_from_separator(tokens, d.eos(), d.pad())
    for row, types in zip(tokens.tolist(), got.tolist()):
        symbols = [d[t] for t in row]
        assert symbols[0] == "<s>"
        first_sep = symbols.index("</s>")
        second_sep = symbols.index("</s>", first_sep + 1)
        want = [0] * (first_sep + 1) + [1] * (second_sep - first_sep)
        want += [0] * (len(symbols) - len(want))  # padding
        assert symbols[second_sep + 1 :] == ["<pad>"] * (len(symbols) - second_sep - 1)
        assert types == want, (symbols, types)
    # and the model uses exactly those ids when the task passes none
    model = task.build_model(args)
    seen = []
    model.encoder.sentence_encoder.embed_token_types.register_forward_hook(
        lambda module, inputs, output: seen.append(inputs[0])
    )
    model(**batch["net_input"], features_only=True)
    assert torch.equal(seen[0], got)


def test_fine_tune_sentence_pairs_from_the_imported_model(imported, pair_data, tmp_path):
    output = fairseq_train(
        pair_data,
        *SENTENCE_PAIRS,
        *model_args(imported),
        "--classification-head-name",
        "pairs",
        "--restore-file",
        imported / "model.pt",
        "--max-update",
        "4",
        "--save-dir",
        tmp_path,
        *COMMON,
    )
    assert f"Loaded checkpoint {imported / 'model.pt'} (epoch 1 @ 0 updates)" in output
    assert "classification head 'pairs': dense initialised from the pre-trained pooler" in output
    assert re.search(r"num_updates 4\b", output), output[-2000:]
    start = torch.load(imported / "model.pt", weights_only=False)["model"]
    tuned = torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)["model"]
    head = "classification_heads.pairs.dense.weight"
    delta = (tuned[head] - start["encoder.pooler.dense.weight"]).abs().max().item()
    assert 0 < delta < 4 * 1e-4 * 1.5  # moved from the pooler by at most ~lr per Adam step
    key = "encoder.sentence_encoder.layers.0.self_attn.k_proj.weight"
    assert 0 < (tuned[key] - start[key]).abs().max().item() < 4 * 1e-4 * 1.5


def test_masked_lm_continues_from_the_imported_model(imported, pair_data, tmp_path):
    text = pair_data / "input0"  # one WordPiece'd sentence a line, with the imported dict.txt
    output = fairseq_train(
        text,
        "--task",
        "masked_lm",
        "--criterion",
        "masked_lm",
        *model_args(imported),
        "--tokens-per-sample",
        "32",
        "--sample-break-mode",
        "eos",
        "--restore-file",
        imported / "model.pt",
        "--max-update",
        "4",
        "--save-dir",
        tmp_path / "ck",
        *COMMON,
    )
    assert f"Loaded checkpoint {imported / 'model.pt'} (epoch 1 @ 0 updates)" in output
    assert re.search(r"num_updates 4\b", output), output[-2000:]
    assert "the model has no token-type" not in output
    from realformer_fairseq.models.realformer_roberta import RealformerRobertaModel

    hub = RealformerRobertaModel.from_pretrained(
        str(tmp_path / "ck"),
        "checkpoint_last.pt",
        str(text),
        bpe="wordpiece",
        wordpiece_vocab=str(imported / "vocab.txt"),
    )
    assert hub.model.args.layernorm_eps == 1e-12 and hub.model.args.type_vocab_size == 2
    assert hub.model.encoder.sentence_encoder.embed_token_types.num_embeddings == 2


def test_bert_options_from_scratch_build_what_they_say():
    from fairseq import options, tasks
    from harness import toy_dictionary

    from realformer_fairseq.models.realformer_roberta import RealformerRobertaModel

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            "/nonexistent",
            "--user-dir",
            USER_DIR,
            "--task",
            "masked_lm",
            "--arch",
            "realformer_bert_tiny",
            "--layernorm-eps",
            "1e-12",
            "--type-vocab-size",
            "2",
            "--bert-pooler",
            "--activation-fn",
            "gelu_accurate",
            "--tokens-per-sample",
            "16",
        ],
    )
    from fairseq.tasks.masked_lm import MaskedLMTask

    task = MaskedLMTask(args, toy_dictionary())
    model = task.build_model(args)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 2 * 2 + 1 + 1 and all(n.eps == 1e-12 for n in norms)
    assert model.encoder.sentence_encoder.embed_token_types.weight.shape == (2, 64)
    assert model.encoder.pooler.dense.weight.shape == (64, 64)
    model.register_classification_head("x", num_classes=3)
    assert type(model.classification_heads["x"]).__name__ == "BertClassificationHead"
    # without the options: fairseq's model, as before
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [
            "/nonexistent",
            "--user-dir",
            USER_DIR,
            "--task",
            "masked_lm",
            "--arch",
            "realformer_bert_tiny",
            "--tokens-per-sample",
            "16",
        ],
    )
    plain = MaskedLMTask(args, toy_dictionary()).build_model(args)
    assert isinstance(plain, RealformerRobertaModel)
    assert all(n.eps == 1e-5 for n in plain.modules() if isinstance(n, torch.nn.LayerNorm))
    assert not any("pooler" in k or "token_types" in k for k in plain.state_dict())
    plain.register_classification_head("x", num_classes=3)
    assert type(plain.classification_heads["x"]).__name__ == "RobertaClassificationHead"


@pytest.mark.parametrize(
    "flag", [["--type-vocab-size", "2"], ["--bert-pooler"], ["--layernorm-eps", "1e-12"]]
)
def test_bert_options_are_refused_where_nothing_would_carry_them_out(flag):
    from fairseq import options
    from harness import toy_dictionary

    from realformer_fairseq.models.realformer_transformer import RealformerTransformerModel

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["/nonexistent", "--user-dir", USER_DIR, "--arch", "realformer_tiny", *flag]
    )
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    d = toy_dictionary()
    with pytest.raises(RealformerConfigError, match=f"{flag[0]} is an option of the encoder-only"):
        RealformerTransformerModel.build_model(args, TranslationTask(TranslationConfig(), d, d))


def test_restore_with_other_numerics_is_one_line(imported, pair_data, tmp_path):
    """Same shapes, other computation (fairseq's LayerNorm eps and erf GELU): refused."""
    args = model_args(imported)
    for flag in ("--layernorm-eps", "--activation-fn"):
        i = args.index(flag)
        del args[i : i + 2]
    with pytest.raises(RuntimeError) as err:
        fairseq_train(
            pair_data,
            *SENTENCE_PAIRS,
            *args,
            "--restore-file",
            imported / "model.pt",
            "--max-update",
            "1",
            "--save-dir",
            tmp_path,
            *COMMON,
        )
    last = str(err.value).strip().splitlines()[-1]
    assert last == (
        "realformer_fairseq: error: the checkpoint was made with --layernorm-eps 1e-12 "
        "--activation-fn gelu_accurate, this model has --layernorm-eps 1e-05 --activation-fn "
        "gelu: pass the checkpoint's flags (a realformer-import-tf folder lists every model flag "
        "in model_args.txt)"
    ), last
