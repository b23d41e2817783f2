"""The fairseq user's everyday tools on a model trained from the WMT'14 pipeline's data-bin
(examples/wmt14_en_fr/prepare.sh --offline on a Multi30k subset: Moses tokenisation, subword-nmt
BPE): --tensorboard-logdir event files, the hub API (from_pretrained().translate() with
tokenizer='moses' / bpe='subword_nmt'; fill_mask() / predict() of the encoder-only model), and
fairseq-interactive on raw text, including an input line longer than the model accepts."""

import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness import (
    LANGUAGE_ID_TASK,
    MLM_COMMON,
    REPO_ROOT,
    USER_DIR,
    fairseq_command,
    fairseq_preprocess,
    fairseq_train,
    parse_train_losses,
    parse_valid_loss,
    run,
    shared_data,
    train_masked_lm,
    translation_train_args,
)

MAX_POSITIONS = 64
N_TEST = 12
LONG_LINE = " ".join(["A man in a red shirt is walking down the street ."] * 8)


def write_pair(prefix: Path, split: str, start: int, n: int):
    for lang in ("en", "fr"):
        lines = shared_data("multi30k", f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
        prefix.with_name(f"{prefix.name}.{lang}").write_text(
            "\n".join(lines[start : start + n]) + "\n", encoding="utf-8"
        )
    return prefix


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """prepare.sh's data-bin (with bpecodes and the raw test side) and a 6-update realformer_tiny
    trained on it with --tensorboard-logdir, validating every 3 updates."""
    root = tmp_path_factory.mktemp("user_tools")
    src = root / "src"
    src.mkdir()
    prefixes = {
        "train": write_pair(src / "train", "train", 0, 400),
        "valid": write_pair(src / "valid", "val", 0, 40),
        "test": write_pair(src / "test", "test_2016_flickr", 0, N_TEST),
    }
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "examples" / "wmt14_en_fr" / "prepare.sh"), "--work-dir",
         str(root / "work"), "--offline", "--train", str(prefixes["train"]), "--valid",
         str(prefixes["valid"]), "--test", str(prefixes["test"]), "--bpe-size", "400",
         "--workers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    data_bin = root / "work" / "data-bin"
    save_dir = root / "ckpt"
    log = run(
        [
            fairseq_command("fairseq-train"),
            *translation_train_args(
                data_bin,
                save_dir,
                max_update=6,
                extra=[
                    "--max-tokens", "1000",
                    "--validate-interval-updates", "3",
                    "--max-source-positions", str(MAX_POSITIONS),
                    "--max-target-positions", str(MAX_POSITIONS),
                    "--skip-invalid-size-inputs-valid-test",
                    "--tensorboard-logdir", str(root / "tb"),
                ],
            ),
        ]  # fmt: skip
    )
    return {"root": root, "data_bin": data_bin, "save_dir": save_dir, "log": log}


def read_scalars(event_dir: Path, tag: str = "loss"):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list(event_dir.glob("events.out.tfevents.*"))
    assert files, f"no event file in {event_dir}"
    acc = EventAccumulator(str(event_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_event_files_hold_the_logged_train_and_valid_losses(pipeline):
    tb, log = pipeline["root"] / "tb", pipeline["log"]
    assert "tensorboard not found" not in log
    train_inner = read_scalars(tb / "train_inner")
    assert [step for step, _ in train_inner] == [1, 2, 3, 4, 5, 6]
    assert [round(v, 3) for _, v in train_inner] == pytest.approx(parse_train_losses(log), abs=1e-3)
    valid = read_scalars(tb / "valid")
    assert [step for step, _ in valid] == [3, 6]
    assert [round(v, 3) for _, v in valid] == pytest.approx(parse_valid_loss(log), abs=1e-3)
    train_epoch = read_scalars(tb / "train")  # end-of-run train stats
    assert [step for step, _ in train_epoch] == [6]


def test_fairseq_commands_log_no_false_tensorboardx_line(pipeline):
    """fairseq's text_to_speech task, imported by the task registry in every command, logged
    "Please install tensorboardX" although TensorBoard logging works (the test above): the
    install now has tensorboardX (setup.py), and nothing of fairseq's log is filtered: its
    INFO lines from the command, the task, the model and the trainer are all there."""
    log = pipeline["log"]
    assert "tensorboardX" not in log
    info_loggers = set(re.findall(r"\| INFO \| ([\w.]+) \|", log))
    assert {
        "fairseq_cli.train",
        "fairseq.tasks.translation",
        "fairseq.trainer",
        "fairseq.checkpoint_utils",
        "fairseq.data.data_utils",
    } <= info_loggers, sorted(info_loggers)
    assert re.search(r"\| INFO \| fairseq\.tasks\.translation \| \[en\] dictionary: \d+ types", log)
    assert "| INFO | fairseq_cli.train | done training in" in log


# ---------------------------------------------------------------- hub API: translation


@pytest.fixture(scope="module")
def hub(pipeline):
    from realformer_fairseq.models.realformer_transformer import RealformerTransformerModel

    data_bin = pipeline["data_bin"]
    model = RealformerTransformerModel.from_pretrained(
        str(pipeline["save_dir"]),
        checkpoint_file="checkpoint_last.pt",
        data_name_or_path=str(data_bin),
        tokenizer="moses",
        bpe="subword_nmt",
        bpe_codes=str(data_bin / "bpecodes"),
    )
    return model.eval()


def test_hub_encodes_raw_text_exactly_as_the_pipeline_binarized_it(pipeline, hub):
    """Moses tokenizer + subword-nmt BPE of the hub = prepare.sh's test-side tokenization + BPE:
    same token ids as the binarized test set, sentence for sentence."""
    raw = (pipeline["data_bin"] / "test.raw.en").read_text(encoding="utf-8").splitlines()
    assert len(raw) == N_TEST
    hub.task.load_dataset("test")
    binarized = hub.task.datasets["test"].src
    assert len(binarized) == N_TEST
    for i, line in enumerate(raw):
        assert "\u2019" not in line  # the pipeline maps it to ' on the test side, the hub does not
        assert hub.encode(line).tolist() == binarized[i].tolist(), line


def run_interactive(pipeline, lines, checkpoint=None):
    data_bin = pipeline["data_bin"]
    checkpoint = checkpoint or pipeline["save_dir"] / "checkpoint_last.pt"
    input_file = pipeline["root"] / "interactive_input.en"
    input_file.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return run(
        [
            fairseq_command("fairseq-interactive"), data_bin, "--user-dir", USER_DIR,
            "--path", checkpoint, "-s", "en", "-t", "fr",
            "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", data_bin / "bpecodes",
            "--beam", "5", "--buffer-size", "4", "--batch-size", "4",
            "--input", input_file, "--cpu",
        ]  # fmt: skip
    )


@pytest.fixture(scope="module")
def interactive(pipeline):
    """fairseq-interactive on 5 raw test lines with a too-long line as the third one."""
    raw = (pipeline["data_bin"] / "test.raw.en").read_text(encoding="utf-8").splitlines()
    lines = raw[:2] + [LONG_LINE] + raw[2:5]
    out = run_interactive(pipeline, lines)
    return lines, out


def prefixed(out: str, prefix: str):
    """{id: fields after the id} of the lines starting with PREFIX-, in output order."""
    rows = [line.split("\t") for line in out.splitlines() if line.startswith(prefix + "-")]
    return [(int(r[0][len(prefix) + 1 :]), r[1:]) for r in rows]


def test_interactive_skips_a_too_long_line_with_one_warning_and_translates_the_rest(interactive):
    lines, out = interactive
    assert "Traceback" not in out and "Size of sample" not in out
    warnings = [line for line in out.splitlines() if "source positions: skipped" in line]
    assert len(warnings) == 1, out[-3000:]
    assert "input line 3 (id 2) is " in warnings[0]
    assert f"more than the model's {MAX_POSITIONS} source positions" in warnings[0]
    # every other line translated, in input order, under its own id
    assert [i for i, _ in prefixed(out, "S")] == [0, 1, 3, 4, 5]
    assert [i for i, _ in prefixed(out, "D")] == [0, 1, 3, 4, 5]
    # and the source shown is the tokenized + BPE'd input line of that id
    sources = dict(prefixed(out, "S"))
    assert (
        sources[3][0].replace("@@ ", "")
        == "A girl in karate uniform breaking a stick with a front kick ."
    )
    assert lines[3].startswith("A girl in karate uniform")


def test_hub_translate_equals_fairseq_interactive(interactive, hub):
    lines, out = interactive
    kept = [0, 1, 3, 4, 5]
    detok = dict(prefixed(out, "D"))
    hyps = hub.translate([lines[i] for i in kept], beam=5)
    assert hyps == [detok[i][1] for i in kept]
    # scores too (interactive prints base 2): the same source tokens and the same search
    best = hub.generate([hub.encode(lines[i]) for i in kept], beam=5)
    for i, hypos in zip(kept, best):
        assert hypos[0]["score"] / math.log(2) == pytest.approx(float(detok[i][0]), abs=1e-4)


def test_hub_translate_refuses_a_too_long_sentence_with_the_limit(hub):
    with pytest.raises(Exception, match=r"max_positions=\(64, 64\)"):
        hub.translate([LONG_LINE])


def test_wrapped_make_batches_gives_fairseq_batches_when_every_line_fits(pipeline, hub):
    """Guard of interactive_compat: with no line over the limit the wrapper hands back
    fairseq's own batches (ids, tokens, lengths), and it maps ids back past a skipped line."""
    import fairseq_cli.interactive as fi
    from omegaconf import OmegaConf

    from realformer_fairseq import interactive_compat

    original = fi.make_batches
    while hasattr(original, "__wrapped__"):
        original = original.__wrapped__
    cfg = OmegaConf.create({"generation": {"constraints": None}, "dataset": {
        "max_tokens": None, "batch_size": 2, "skip_invalid_size_inputs_valid_test": False}})  # fmt: skip
    lines = (pipeline["data_bin"] / "test.raw.en").read_text(encoding="utf-8").splitlines()[:5]

    def encode(line):
        return hub.apply_bpe(hub.tokenize(line))

    limits = (MAX_POSITIONS, MAX_POSITIONS)
    wrapped = interactive_compat.skip_long_lines(original)
    got = list(wrapped(lines, cfg, hub.task, limits, encode))
    want = list(original(lines, cfg, hub.task, limits, encode))
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert g.ids.tolist() == w.ids.tolist()
        assert torch.equal(g.src_tokens, w.src_tokens) and torch.equal(g.src_lengths, w.src_lengths)
    # a second buffer with a long line in position 1: the remaining ids are 0 and 2
    got = list(wrapped([lines[0], LONG_LINE, lines[1]], cfg, hub.task, limits, encode))
    assert sorted(i for b in got for i in b.ids.tolist()) == [0, 2]


# ---------------------------------------------------------------- hub API: encoder-only models


@pytest.fixture(scope="module")
def encoder_only(pipeline):
    """On the pipeline's Moses-tokenized, BPE'd English/French (its joined dictionary): a
    realformer_bert_tiny masked LM, and a language-id classifier (English 0 / French 1)."""
    root, work, data_bin = pipeline["root"], pipeline["root"] / "work", pipeline["data_bin"]
    srcdict = data_bin / "dict.en.txt"

    def preprocess(trainpref, validpref, dest, extra=()):
        fairseq_preprocess(["--only-source", "--trainpref", trainpref, "--validpref", validpref,
                            "--destdir", dest, "--workers", "1", *extra])  # fmt: skip

    mlm_bin = root / "mlm_bin"
    preprocess(work / "final" / "train.en", work / "final" / "valid.en", mlm_bin,
               ["--srcdict", srcdict])  # fmt: skip
    mlm_log = train_masked_lm(mlm_bin, root / "mlm_ckpt", max_update=12)

    raw = root / "cls_raw"
    raw.mkdir()
    bpe = {
        (split, lang): (work / "final" / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
        for split in ("train", "valid")
        for lang in ("en", "fr")
    }
    tok = {  # the same lines before BPE, for the hub's encode()
        lang: (work / "tok" / f"valid.{lang}").read_text(encoding="utf-8").splitlines()
        for lang in ("en", "fr")
    }
    n_train, n_valid = 150, 20
    rows = {
        "train": [(x, "0") for x in bpe["train", "en"][:n_train]]
        + [(x, "1") for x in bpe["train", "fr"][n_train : 2 * n_train]],
        "valid": [(x, "0") for x in bpe["valid", "en"][:n_valid]]
        + [(x, "1") for x in bpe["valid", "fr"][n_valid : 2 * n_valid]],
    }
    valid_tok = [(x, 0) for x in tok["en"][:n_valid]] + [
        (x, 1) for x in tok["fr"][n_valid : 2 * n_valid]
    ]
    for split, pairs in rows.items():
        (raw / f"{split}.input0").write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
        (raw / f"{split}.label").write_text("".join(p[1] + "\n" for p in pairs), encoding="utf-8")
    cls_bin = root / "cls_bin"
    preprocess(
        raw / "train.input0", raw / "valid.input0", cls_bin / "input0", ["--srcdict", srcdict]
    )
    preprocess(raw / "train.label", raw / "valid.label", cls_bin / "label")
    cls_log = fairseq_train(
        cls_bin, *LANGUAGE_ID_TASK, "--arch", "realformer_bert_tiny", "--lr", "1e-3",
        "--warmup-updates", "5", "--max-update", "30", "--validate-interval-updates", "30",
        "--save-dir", root / "cls_ckpt", *MLM_COMMON,
    )  # fmt: skip
    return {
        "mlm_bin": mlm_bin,
        "mlm_dir": root / "mlm_ckpt",
        "cls_bin": cls_bin,
        "cls_dir": root / "cls_ckpt",
        "cls_log": cls_log,
        "valid_tok": valid_tok,
        "bpecodes": data_bin / "bpecodes",
    }


def load_encoder_only(encoder_only, run_name: str):
    """``RealformerRobertaModel.from_pretrained`` of the ``run_name`` run of
    ``encoder_only`` ("mlm" or "cls"), in eval mode."""
    from realformer_fairseq.models.realformer_roberta import RealformerRobertaModel

    return RealformerRobertaModel.from_pretrained(
        str(encoder_only[f"{run_name}_dir"]),
        checkpoint_file="checkpoint_last.pt",
        data_name_or_path=str(encoder_only[f"{run_name}_bin"]),
        bpe="subword_nmt",
        bpe_codes=str(encoder_only["bpecodes"]),
    ).eval()


def test_fill_mask_ranks_the_models_own_predictions(encoder_only):
    from fairseq.models.roberta.hub_interface import RobertaHubInterface

    from realformer_fairseq.models.hub_interface import RealformerRobertaHubInterface
    from realformer_fairseq.models.realformer_roberta import RealformerRobertaModel
    from realformer_fairseq.modules.routes import RealformerMultiheadAttention

    bert = load_encoder_only(encoder_only, "mlm")
    assert isinstance(bert, RealformerRobertaHubInterface)
    assert isinstance(bert.model, RealformerRobertaModel)
    assert any(isinstance(m, RealformerMultiheadAttention) for m in bert.model.modules())

    filled = bert.fill_mask("A man in an orange <mask> .", topk=3)
    assert len(filled) == 3
    # the same ranking computed by hand from the model's logits at the masked position
    d = bert.task.source_dictionary
    text = "<s> " + bert.bpe.encode("A man in an orange") + " <mask> . </s>"
    tokens = d.encode_line(text, append_eos=False, add_if_not_exist=False).long()
    position = tokens.tolist().index(bert.task.mask_idx)
    with torch.no_grad():
        logits = bert.model(tokens.unsqueeze(0))[0][0, position]
    probs, ids = logits.softmax(-1).topk(3)
    for (sentence, prob, word), want_prob, want_id in zip(filled, probs.tolist(), ids.tolist()):
        want_word = d[want_id].replace("@@", "")
        assert word == want_word
        assert prob == pytest.approx(want_prob, abs=1e-6)
        # fairseq 0.12.3 alone gives f"A man in an orange{want_word} ." (GPT-2 spacing)
        assert sentence == f"A man in an orange {want_word} ."
    assert filled[0][1] >= filled[1][1] >= filled[2][1] > 0
    # fairseq's own fill_mask: same words and probabilities, the word glued to "orange"
    fairseq_filled = RobertaHubInterface.fill_mask(bert, "A man in an orange <mask> .", topk=3)
    assert [(p, w) for _, p, w in fairseq_filled] == [(p, w) for _, p, w in filled]
    assert [s for s, _, _ in fairseq_filled] == [f"A man in an orange{w} ." for _, _, w in filled]


def test_predict_reproduces_the_validation_accuracy_fairseq_logged(encoder_only):
    clf = load_encoder_only(encoder_only, "cls")
    valid = encoder_only["valid_tok"]
    assert len(valid) == 40
    with torch.no_grad():
        predicted = [
            int(clf.predict("language_id", clf.encode(line)).argmax(-1)) for line, _ in valid
        ]
    accuracy = 100.0 * sum(p == label for p, (_, label) in zip(predicted, valid)) / len(valid)
    logged = [
        float(a)
        for a in re.findall(
            r"valid on 'valid' subset \| .*?accuracy ([\d.]+)", encoder_only["cls_log"]
        )
    ]
    assert logged and accuracy == pytest.approx(logged[-1], abs=1e-6), (accuracy, logged)
    assert accuracy >= 90.0  # English vs French is easy even after 30 updates


# ---------------------------------------------------------------- hub API: the task's languages

# a French sentence whose Moses detokenisation differs between English and French rules
# (sacremoses: "l&apos; homme" -> English "l' homme", French "l'homme")
FRENCH_TARGET = "l'homme regarde l'eau ."
FRENCH_TARGET_DETOKENIZED = "l'homme regarde l'eau."


@pytest.fixture(scope="module")
def french_model(pipeline):
    """A realformer_tiny on the pipeline's dictionary trained to answer every English sentence
    with FRENCH_TARGET (the same target for 200 sources: learnt in a few dozen updates), so that
    its translations hold the elisions that English and French detokenisation treat apart."""
    from subword_nmt.apply_bpe import BPE

    from realformer_pipelines import moses

    root, data_bin = pipeline["root"], pipeline["data_bin"]
    with open(data_bin / "bpecodes", encoding="utf-8") as fh:
        bpe = BPE(fh)
    moses.init_worker("fr", "train")
    target = bpe.process_line(moses.tokenize_line(FRENCH_TARGET))
    raw = root / "french_raw"
    raw.mkdir()
    sources = (root / "work" / "final" / "train.en").read_text(encoding="utf-8").splitlines()
    for split, lines in (("train", sources[:200]), ("valid", sources[200:220])):
        (raw / f"{split}.en").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
        (raw / f"{split}.fr").write_text((target + "\n") * len(lines), encoding="utf-8")
    dest = root / "french_bin"
    fairseq_preprocess(["-s", "en", "-t", "fr", "--trainpref", raw / "train", "--validpref",
                        raw / "valid", "--destdir", dest, "--srcdict", data_bin / "dict.en.txt",
                        "--tgtdict", data_bin / "dict.fr.txt", "--workers", "1"])  # fmt: skip
    save_dir = root / "french_ckpt"
    run([fairseq_command("fairseq-train"), *translation_train_args(
        dest, save_dir, max_update=40, extra=["--max-tokens", "1000", "--lr", "5e-3"])])  # fmt: skip
    return save_dir


def test_hub_detokenizes_french_as_fairseq_interactive_does(pipeline, french_model):
    """from_pretrained(tokenizer="moses", ...) as the README shows it, without languages: the
    tokenizer takes the task's en -> fr, and translate() equals fairseq-interactive -s en -t fr
    on raw text byte for byte (fairseq 0.12.3 alone detokenized with English rules:
    "l' homme regarde l' eau.")."""
    from realformer_fairseq.models.realformer_transformer import RealformerTransformerModel

    data_bin = pipeline["data_bin"]
    hub = RealformerTransformerModel.from_pretrained(
        str(french_model), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data_bin),
        tokenizer="moses", bpe="subword_nmt", bpe_codes=str(data_bin / "bpecodes"),
    ).eval()  # fmt: skip
    assert (hub.tokenizer.cfg.source_lang, hub.tokenizer.cfg.target_lang) == ("en", "fr")
    lines = (data_bin / "test.raw.en").read_text(encoding="utf-8").splitlines()[:6]
    hyps = hub.translate(lines, beam=5)
    assert hyps == [FRENCH_TARGET_DETOKENIZED] * len(lines), hyps
    out = run_interactive(pipeline, lines, checkpoint=french_model / "checkpoint_last.pt")
    interactive = [fields[1] for _, fields in sorted(prefixed(out, "D"))]
    assert [h.encode("utf-8") for h in hyps] == [d.encode("utf-8") for d in interactive]
    # languages given to from_pretrained are kept
    english_rules = RealformerTransformerModel.from_pretrained(
        str(french_model), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data_bin),
        tokenizer="moses", bpe="subword_nmt", bpe_codes=str(data_bin / "bpecodes"),
        source_lang="en", target_lang="en",
    ).eval()  # fmt: skip
    assert english_rules.translate(lines[:1], beam=5) == ["l' homme regarde l' eau."]


def test_hub_names_the_model_class_of_a_checkpoint_that_is_not_the_plugins(
    pipeline, french_model, caplog
):
    """RealformerTransformerModel.from_pretrained on a checkpoint of fairseq's own `transformer`
    returns fairseq's TransformerModel (as fairseq does) with one warning that says so
    (fairseq 0.12.3 alone: no word)."""
    import logging

    from fairseq.models.transformer import TransformerModel

    from realformer_fairseq.models.realformer_transformer import RealformerTransformerModel

    data_bin, save_dir = pipeline["data_bin"], pipeline["root"] / "vanilla_ckpt"
    run([fairseq_command("fairseq-train"), *translation_train_args(
        pipeline["root"] / "french_bin", save_dir, arch="transformer", max_update=1, extra=[
            "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--encoder-layers", "1",
            "--decoder-layers", "1", "--encoder-attention-heads", "2",
            "--decoder-attention-heads", "2"])])  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="realformer_fairseq"):
        hub = RealformerTransformerModel.from_pretrained(
            str(save_dir), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data_bin)
        )
    assert type(hub.models[0]) is TransformerModel
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{save_dir}/checkpoint_last.pt holds fairseq.models.transformer.transformer_legacy."
        "TransformerModel (--arch transformer), not a RealformerTransformerModel: loaded as "
        "TransformerModel, without this plugin's residual attention or ADMIN"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="realformer_fairseq"):
        RealformerTransformerModel.from_pretrained(
            str(french_model), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data_bin)
        )
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# ---------------------------------------------------------------- fairseq-interactive input


def test_interactive_translates_every_line_of_an_input_with_a_byte_that_is_not_utf8(pipeline):
    """One Latin-1 byte in line 3 of --input FILE (and of stdin): one warning naming the line,
    and every line translated under its own id, line 3 with U+FFFD for the byte (fairseq 0.12.3
    alone: UnicodeDecodeError traceback and no translation at all from --input)."""
    raw = (pipeline["data_bin"] / "test.raw.en").read_text(encoding="utf-8").splitlines()[:5]
    data = [line.encode("utf-8") for line in raw]
    data[2] = "A man drinks caf\xe9 .".encode("latin-1")
    input_file = pipeline["root"] / "latin1_input.en"
    input_file.write_bytes(b"".join(line + b"\n" for line in data))
    data_bin = pipeline["data_bin"]
    command = [
        fairseq_command("fairseq-interactive"), data_bin, "--user-dir", USER_DIR,
        "--path", pipeline["save_dir"] / "checkpoint_last.pt", "-s", "en", "-t", "fr",
        "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", data_bin / "bpecodes",
        "--beam", "2", "--cpu",
    ]  # fmt: skip
    for how, out in (
        ("--input", run([*command, "--input", input_file])),
        ("stdin", run(["bash", "-c", " ".join(shlex.quote(str(c)) for c in command) + " < "
                       + shlex.quote(str(input_file))])),  # fmt: skip
    ):
        assert "Traceback" not in out, (how, out[-2000:])
        warnings = [line for line in out.splitlines() if "not valid UTF-8" in line]
        assert (
            len(warnings) == 1
            and "input line 3 (id 2) is not valid UTF-8 (1 byte(s): 0xe9 at "
            "character 17): translated with U+FFFD in their place" in warnings[0]
        ), (how, warnings)
        assert [i for i, _ in prefixed(out, "D")] == [0, 1, 2, 3, 4], how
        # U+FFFD is no letter for the tokenizer: "caf" then U+FFFD, unknown to the dictionary
        sources = dict(prefixed(out, "S"))
        assert sources[2][0].replace("@@ ", "") == "A man drinks caf <unk> .", how


def test_plugin_buffered_read_equals_fairseqs_on_utf8_input(pipeline, tmp_path):
    """The re-owned buffered_read gives fairseq 0.12.3's buffers on valid UTF-8 (tabs, CRLF,
    blank lines, a last line without newline), for buffer sizes 1, 3 and 64."""
    import fairseq_cli.interactive as fi

    from realformer_fairseq import interactive_compat

    text = "a b\r\n\tc d \n\nélan «vital»\ne\tf\nlast"
    path = tmp_path / "in.txt"
    path.write_bytes(text.encode("utf-8"))
    fairseq_buffered_read = fi.buffered_read
    if fairseq_buffered_read is interactive_compat.buffered_read:
        import importlib

        fairseq_buffered_read = importlib.reload(fi).buffered_read
        interactive_compat.install()
    for size in (1, 3, 64):
        want = list(fairseq_buffered_read(str(path), size))
        assert list(interactive_compat.buffered_read(str(path), size)) == want
        assert sum(len(b) for b in want) == 6
