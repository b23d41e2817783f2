"""Google's TF RealFormer/BERT checkpoints -> realformer_roberta (realformer-import-tf).

The expected values are TensorFlow's (../shared/data/realformer_tf/expected.npz, written by
Google's realformer.py) or, for checkpoints the tests write themselves (other depths, widths,
heads, token types, running mean, vocabulary orders, vanilla BERT), the generator's numpy-only
float64 reference (generator/reference_forward.py), never the code under test.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import realformer_tf_fixture
from test_tf_bundle import reference_module
from tf_bundle_writer import write_bundle

from realformer_fairseq.tf_import import bert_outputs
from realformer_fairseq.tf_import.bert_checkpoint import BertCheckpointError, convert_checkpoint

EXPECTED_ARRAYS = (
    "embedding_output",
    "all_encoder_layers",
    "sequence_output",
    "pooled_output",
    "attention_probs",
    "attention_stream",
    "mlm_logits",
    "mlm_log_probs",
    "nsp_logits",
    "nsp_log_probs",
)
BIN = Path(sys.executable).parent


def max_diff_at_real_positions(name, got, want, mask):
    """max |got - want| where BERT and fairseq agree by construction: real tokens (queries and
    keys); padding positions legitimately differ (fixture README)."""
    real = mask.astype(bool)
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if name in ("embedding_output", "sequence_output", "mlm_logits", "mlm_log_probs"):
        return float(np.abs(got - want)[real].max())
    if name == "all_encoder_layers":
        return float(np.abs(got - want)[:, real].max())
    if name in ("attention_probs", "attention_stream"):
        return max(
            float(np.abs(got[:, b, :, :n, :n] - want[:, b, :, :n, :n]).max())
            for b, n in enumerate(real.sum(1))
        )
    assert got.shape == want.shape
    return float(np.abs(got - want).max())


def load_hub(out_dir):
    from realformer_fairseq.models.realformer_roberta import RealformerRobertaModel

    return RealformerRobertaModel.from_pretrained(str(out_dir), checkpoint_file="model.pt").eval()


# ---------------------------------------------------------------------------
# the fixture written by Google's code


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """The fixture converted with the console command (as a user runs it); its wall time."""
    out = tmp_path_factory.mktemp("imported")
    start = time.time()
    result = subprocess.run(
        [
            str(BIN / "realformer-import-tf"),
            "--tf-checkpoint",
            str(realformer_tf_fixture("model.ckpt")),
            "--bert-config",
            str(realformer_tf_fixture("bert_config.json")),
            "--vocab",
            str(realformer_tf_fixture("vocab.txt")),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    seconds = time.time() - start
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result.stdout, seconds


def test_fixture_reproduces_every_tensorflow_array(imported):
    out, log, seconds = imported
    X = np.load(realformer_tf_fixture("expected.npz"))
    got = bert_outputs(load_hub(out), X["input_ids"], X["token_type_ids"], X["input_mask"])
    assert set(EXPECTED_ARRAYS) <= set(got)
    diffs = {
        name: max_diff_at_real_positions(name, got[name], X[name], X["input_mask"])
        for name in EXPECTED_ARRAYS
    }
    print("max |fairseq - TF| at real positions:", diffs)
    assert all(d < 1e-5 for d in diffs.values()), diffs
    assert got["mlm_log_probs"].shape == (3, 16, 71)  # BERT vocabulary order and size


def test_conversion_log_and_time(imported):
    out, log, seconds = imported
    assert seconds < 30, seconds  # a fresh process: imports dominate (about 3 s here)
    line = [l for l in log.splitlines() if "converted 46 variables" in l]
    assert len(line) == 1, log
    for part in (
        "2 layers",
        "width 32",
        "2 heads",
        "vocabulary 71 (uncased WordPiece)",
        "2 token types",
        "running sum",
        "MLM (cls/predictions)",
        "next-sentence",
    ):
        assert part in line[0], (part, line[0])
    assert sorted(p.name for p in out.iterdir()) == [
        "dict.txt",
        "model.pt",
        "model_args.txt",
        "vocab.txt",
    ]


def test_converted_weights_are_the_tensorflow_variables(imported):
    """Per parameter, against the TF variables read by the generator's reader: transposes,
    the key bias (invisible in every output), position row shift, vocabulary permutation."""
    out, _, _ = imported
    P = reference_module().read_checkpoint(str(realformer_tf_fixture("model.ckpt")))
    state = torch.load(out / "model.pt", weights_only=False)["model"]
    vocab = [l.rstrip("\n") for l in open(realformer_tf_fixture("vocab.txt"), encoding="utf-8")]
    fairseq_dict = ["<s>", "<pad>", "</s>", "<unk>"] + [
        l.split()[0] for l in open(out / "dict.txt", encoding="utf-8")
    ]
    names = {
        "[CLS]": "<s>",
        "[PAD]": "<pad>",
        "[SEP]": "</s>",
        "[UNK]": "<unk>",
        "[MASK]": "<mask>",
    }
    row = [fairseq_dict.index(names.get(t, t)) for t in vocab]  # fairseq row of each BERT id
    s = "encoder.sentence_encoder."
    eq = np.testing.assert_array_equal
    for l in range(2):
        tf, fs = f"bert/encoder/layer_{l}/attention/self/", f"{s}layers.{l}.self_attn."
        for part, proj in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            eq(state[fs + proj + ".weight"].numpy(), P[tf + part + "/kernel"].T)
            eq(state[fs + proj + ".bias"].numpy(), P[tf + part + "/bias"])
        eq(
            state[f"{s}layers.{l}.fc1.weight"].numpy(),
            P[f"bert/encoder/layer_{l}/intermediate/dense/kernel"].T,
        )
        eq(
            state[f"{s}layers.{l}.final_layer_norm.bias"].numpy(),
            P[f"bert/encoder/layer_{l}/output/LayerNorm/beta"],
        )
    positions = state[s + "embed_positions.weight"].numpy()
    assert positions.shape == (66, 32)
    eq(positions[2:], P["bert/embeddings/position_embeddings"])
    eq(positions[:2], 0)
    words = state[s + "embed_tokens.weight"].numpy()
    for bert_id in range(71):
        eq(words[row[bert_id]], P["bert/embeddings/word_embeddings"][bert_id])
        assert (
            state["encoder.lm_head.bias"][row[bert_id]] == P["cls/predictions/output_bias"][bert_id]
        )
    eq(state["encoder.lm_head.weight"].numpy(), words)
    eq(state[s + "embed_token_types.weight"].numpy(), P["bert/embeddings/token_type_embeddings"])
    eq(state["encoder.pooler.dense.weight"].numpy(), P["bert/pooler/dense/kernel"].T)
    eq(
        state["classification_heads.next_sentence.out_proj.weight"].numpy(),
        P["cls/seq_relationship/output_weights"],
    )


def test_loads_with_load_model_ensemble_and_hub(imported):
    from fairseq import checkpoint_utils

    out, _, _ = imported
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(out / "model.pt")])
    model = models[0]
    assert type(model).__name__ == "RealformerRobertaModel"
    assert cfg.model.layernorm_eps == 1e-12 and cfg.model.activation_fn == "gelu_accurate"
    hub = load_hub(out)
    for key, value in model.state_dict().items():
        if key.startswith("classification_heads"):
            continue  # load_model_ensemble registers no heads (fairseq's load_checkpoint_heads)
        torch.testing.assert_close(hub.model.state_dict()[key], value, rtol=0, atol=0)
    # raw text: BERT's tokenisation, BERT's pair layout and derived segment ids
    tokens = hub.encode("She reads the book.", "The cat sat.")
    d = hub.task.source_dictionary
    assert " ".join(d[t] for t in tokens) == "<s> she read ##s the book . </s> the cat sat . </s>"
    features = hub.extract_features(tokens)
    X = np.load(realformer_tf_fixture("expected.npz"))
    vocab = [l.rstrip("\n") for l in open(realformer_tf_fixture("vocab.txt"), encoding="utf-8")]
    ids = [vocab.index({"<s>": "[CLS]", "</s>": "[SEP]"}.get(d[t], d[t])) for t in tokens]
    types = [0] * 8 + [1] * 5
    ref = reference_module().forward(
        reference_module().read_checkpoint(str(realformer_tf_fixture("model.ckpt"))),
        json.loads(realformer_tf_fixture("bert_config.json").read_text()),
        np.array([ids]),
        np.ones((1, 13), int),
        np.array([types]),
    )
    assert np.abs(features[0].detach().numpy() - ref["sequence_output"][0]).max() < 1e-5
    # fill_mask: the model's own top predictions at the mask, BERT's spacing
    from fairseq.models.roberta.hub_interface import RobertaHubInterface

    filled = hub.fill_mask("she <mask> the book .", topk=3)
    fairseqs = RobertaHubInterface.fill_mask(hub, "she <mask> the book .", topk=3)
    # fairseq's drops a predicted </s> (Dictionary.string skips eos): it has the first two
    assert [(p, w) for _, p, w in filled][:2] == [(p, w) for _, p, w in fairseqs]
    # the fixture model's top 3 here: ##ly (a continuation: joined), jump, </s>
    assert [s for s, _, _ in filled] == [
        "shely the book .",
        "she jump the book .",
        "she </s> the book .",
    ]


# ---------------------------------------------------------------------------
# other configurations, written by the tests, checked against the numpy reference


def synthetic_checkpoint(
    folder: Path, config: dict, vocab, seed: int, heads=("mlm", "nsp"), extra=None
):
    """A BERT-layout TF checkpoint with random weights (gammas near 1, biases and betas
    visible), its bert_config.json and vocab.txt. The variable list is written out here, from
    realformer.py's variable scopes."""
    rng = np.random.RandomState(seed)
    D, F, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]

    def normal(*shape, scale=0.2):
        return (rng.randn(*shape) * scale).astype(np.float32)

    P = {
        "bert/embeddings/word_embeddings": normal(V, D),
        "bert/embeddings/position_embeddings": normal(config["max_position_embeddings"], D),
        "bert/embeddings/LayerNorm/gamma": 1 + normal(D, scale=0.1),
        "bert/embeddings/LayerNorm/beta": normal(D, scale=0.1),
        "bert/pooler/dense/kernel": normal(D, D),
        "bert/pooler/dense/bias": normal(D, scale=0.1),
    }
    if config["type_vocab_size"]:
        P["bert/embeddings/token_type_embeddings"] = normal(config["type_vocab_size"], D)
    for l in range(config["num_hidden_layers"]):
        p = f"bert/encoder/layer_{l}/"
        for name, (i, o) in {
            "attention/self/query": (D, D),
            "attention/self/key": (D, D),
            "attention/self/value": (D, D),
            "attention/output/dense": (D, D),
            "intermediate/dense": (D, F),
            "output/dense": (F, D),
        }.items():
            P[p + name + "/kernel"] = normal(i, o)
            P[p + name + "/bias"] = normal(o, scale=0.1)
        for name in ("attention/output/LayerNorm", "output/LayerNorm"):
            P[p + name + "/gamma"] = 1 + normal(D, scale=0.1)
            P[p + name + "/beta"] = normal(D, scale=0.1)
    nsp = {
        "cls/seq_relationship/output_weights": normal(2, D),
        "cls/seq_relationship/output_bias": normal(2, scale=0.1),
    }
    if "mlm" in heads:
        P.update(
            {
                "cls/predictions/transform/dense/kernel": normal(D, D),
                "cls/predictions/transform/dense/bias": normal(D, scale=0.1),
                "cls/predictions/transform/LayerNorm/gamma": 1 + normal(D, scale=0.1),
                "cls/predictions/transform/LayerNorm/beta": normal(D, scale=0.1),
                "cls/predictions/output_bias": normal(V, scale=0.1),
            }
        )
    if "nsp" in heads:
        P.update(nsp)
    written = dict(P, **(extra or {}))
    folder.mkdir(parents=True, exist_ok=True)
    write_bundle(str(folder / "model.ckpt"), written, num_shards=2)
    (folder / "bert_config.json").write_text(json.dumps(config))
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    return {**nsp, **P}  # the reference needs NSP weights even where the checkpoint has none


def bert_batch(vocab, lengths, pair_at, seq_len, seed):
    """input_ids / input_mask / token_type_ids of [CLS] A [SEP] (B [SEP]) rows, trailing pad."""
    rng = np.random.RandomState(seed)
    words = [i for i, t in enumerate(vocab) if not t.startswith("[")]
    ids = np.full((len(lengths), seq_len), vocab.index("[PAD]"))
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for b, (n, split) in enumerate(zip(lengths, pair_at)):
        row = [vocab.index("[CLS]")] + list(rng.choice(words, n - 2)) + [vocab.index("[SEP]")]
        if split:
            row[split] = vocab.index("[SEP]")
            types[b, split + 1 : n] = 1
        ids[b, :n] = row
        mask[b, :n] = 1
    return ids, mask, types


def shuffled_vocab(n_words: int, seed: int):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"]
    tokens = specials + [f"w{i}" for i in range(n_words)] + [f"##p{i}" for i in range(5)]
    order = np.random.RandomState(seed).permutation(len(tokens))
    return [tokens[i] for i in order]


CONFIGS = {
    # name: (bert_config.json, heads, residual attention)
    "deeper_narrow_mean_3types": (
        dict(
            vocab_size=45,
            hidden_size=24,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=40,
            max_position_embeddings=20,
            type_vocab_size=3,
            use_running_mean=True,
            hidden_act="gelu",
        ),
        ("mlm", "nsp"),
        True,
    ),
    "one_head_no_nsp_no_running_mean_key": (
        dict(
            vocab_size=45,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=1,
            intermediate_size=20,
            max_position_embeddings=24,
            type_vocab_size=2,
        ),
        ("mlm",),
        True,
    ),
    "vanilla_bert": (
        dict(
            vocab_size=45,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=16,
            type_vocab_size=2,
        ),
        ("mlm", "nsp"),
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_other_configurations_match_the_numpy_reference(tmp_path, name):
    config, heads, residual = CONFIGS[name]
    vocab = shuffled_vocab(34, seed=len(name))
    assert len(vocab) == config["vocab_size"]
    extra = {"global_step": np.array(1000, np.int64)}
    if name.startswith("deeper"):  # optimizer slots, as a checkpoint saved during training has
        extra.update(
            {
                "bert/pooler/dense/kernel/adam_m": np.zeros((24, 24), np.float32),
                "bert/pooler/dense/kernel/adam_v": np.zeros((24, 24), np.float32),
            }
        )
    P = synthetic_checkpoint(tmp_path / "tf", config, vocab, seed=7, heads=heads, extra=extra)
    result = convert_checkpoint(
        str(tmp_path / "tf" / "model.ckpt"),
        str(tmp_path / "tf" / "bert_config.json"),
        str(tmp_path / "tf" / "vocab.txt"),
        str(tmp_path / "out"),
        residual_attention=residual,
    )
    assert sorted(result.plan.skipped) == sorted(extra)
    ids, mask, types = bert_batch(vocab, lengths=[12, 9, 5], pair_at=[6, 4, 0], seq_len=12, seed=3)
    if config["type_vocab_size"] == 3:
        types[0, 10:12] = 2
    cfg = {"use_running_mean": False, **config}
    ref = reference_module().forward(P, cfg, ids, mask, types, residual=residual)
    got = bert_outputs(load_hub(tmp_path / "out"), ids, types, mask)
    assert ("nsp_logits" in got) == ("nsp" in heads)
    assert ("attention_stream" in got) == residual
    for array in EXPECTED_ARRAYS:
        if array not in got:
            continue
        d = max_diff_at_real_positions(array, got[array], ref[array], mask)
        assert d < 2e-5, (name, array, d)
    # the reference with the other mode is far away: the mode was really honoured
    if residual:
        flipped = reference_module().forward(
            P, cfg, ids, mask, types, running_mean=not cfg["use_running_mean"]
        )
        assert (
            max_diff_at_real_positions(
                "sequence_output", got["sequence_output"], flipped["sequence_output"], mask
            )
            > 1e-2
        )


# ---------------------------------------------------------------------------
# refusals: one line naming the variable


def small_config():
    return dict(
        vocab_size=45,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        type_vocab_size=2,
    )


@pytest.mark.parametrize(
    "change,message",
    [
        ("unknown", r"unknown variable output_weights \[3, 16\]"),
        ("missing", r"missing variable bert/encoder/layer_1/output/dense/bias"),
        (
            "shape",
            r"variable bert/embeddings/position_embeddings has shape \[16, 16\], "
            r"bert_config.json makes it \[32, 16\]",
        ),
        (
            "layers",
            r"unknown variable bert/encoder/layer_1/.* \(bert_config.json has "
            r"num_hidden_layers 1\)",
        ),
        ("vocab", r"vocab.txt has 44 tokens, .*bert_config.json says vocab_size 45"),
        ("config_key", r"unknown key\(s\) use_runing_mean"),
        (
            "half_mlm",
            r"missing variable cls/predictions/output_bias \(the checkpoint has other "
            r"variables of the MLM head\)",
        ),
    ],
)
def test_bad_checkpoints_are_refused_naming_what_is_wrong(tmp_path, change, message):
    config = small_config()
    vocab = shuffled_vocab(34, seed=1)
    tf = tmp_path / "tf"
    synthetic_checkpoint(tf, config, vocab, seed=1)
    from tf_bundle_writer import write_bundle as rewrite

    from realformer_fairseq.tf_import.tensor_bundle import read_bundle

    bundle = read_bundle(str(tf / "model.ckpt"))
    tensors = {n: bundle.tensor(n) for n in bundle.names()}
    if change == "unknown":
        tensors["output_weights"] = np.zeros((3, 16), np.float32)  # a run_classifier head
    elif change == "missing":
        del tensors["bert/encoder/layer_1/output/dense/bias"]
    elif change == "shape":
        config["max_position_embeddings"] = 32
    elif change == "layers":
        config["num_hidden_layers"] = 1
    elif change == "vocab":
        (tf / "vocab.txt").write_text("".join(t + "\n" for t in vocab[:-1]), encoding="utf-8")
    elif change == "config_key":
        config["use_runing_mean"] = True
    elif change == "half_mlm":
        del tensors["cls/predictions/output_bias"]
    for f in tf.glob("model.ckpt.*"):
        f.unlink()
    rewrite(str(tf / "model.ckpt"), tensors)
    (tf / "bert_config.json").write_text(json.dumps(config))
    with pytest.raises(BertCheckpointError, match=message):
        convert_checkpoint(
            str(tf / "model.ckpt"),
            str(tf / "bert_config.json"),
            str(tf / "vocab.txt"),
            str(tmp_path / "out"),
        )
    assert not (tmp_path / "out" / "model.pt").exists()


@pytest.mark.parametrize("existing", [False, True])
def test_a_failing_import_leaves_no_out_dir(tmp_path, monkeypatch, existing):
    """OUT_DIR appears whole or not at all: the import fails after dict.txt and vocab.txt are
    written (here: building the model fails) and leaves no OUT_DIR, and no temporary folder
    beside it (before: OUT_DIR with dict.txt and vocab.txt and no model.pt); an OUT_DIR that held
    other files (the download itself) keeps exactly them. Then the import succeeds."""
    from realformer_fairseq.tf_import import bert_checkpoint

    tf = tmp_path / "tf"
    synthetic_checkpoint(tf, small_config(), shuffled_vocab(34, seed=1), seed=1)
    out = tmp_path / "imports" / "out"
    if existing:
        out.mkdir(parents=True)
        (out / "README").write_text("the user's file\n")
    build = bert_checkpoint.build_fairseq_checkpoint
    written = []

    def failing_build(train_args, state, heads):
        data_dir = train_args[0]
        written.extend(sorted(os.listdir(data_dir)))  # what the import had written by then
        raise BertCheckpointError("simulated failure while building the model")

    monkeypatch.setattr(bert_checkpoint, "build_fairseq_checkpoint", failing_build)
    args = (str(tf / "model.ckpt"), str(tf / "bert_config.json"), str(tf / "vocab.txt"), str(out))
    with pytest.raises(BertCheckpointError, match="simulated failure"):
        convert_checkpoint(*args)
    assert written == ["dict.txt", "vocab.txt"]
    if existing:
        assert sorted(p.name for p in out.iterdir()) == ["README"]
    else:
        assert not out.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == (["out"] if existing else [])
    monkeypatch.setattr(bert_checkpoint, "build_fairseq_checkpoint", build)
    convert_checkpoint(*args)
    expected = ["dict.txt", "model.pt", "model_args.txt", "vocab.txt"]
    assert sorted(p.name for p in out.iterdir()) == sorted(expected + ["README"] * existing)
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]
    # the paths the model records are OUT_DIR's, not the temporary folder's
    cfg = torch.load(out / "model.pt", weights_only=False)["cfg"]
    assert cfg["task"]["data"] == str(out)
    assert cfg["bpe"]["wordpiece_vocab"] == str(out / "vocab.txt")
    assert str(out / "vocab.txt") in (out / "model_args.txt").read_text()


def test_command_line_error_is_one_line(tmp_path):
    tf = tmp_path / "tf"
    synthetic_checkpoint(
        tf,
        small_config(),
        shuffled_vocab(34, seed=1),
        seed=1,
        extra={"bert/some/new_variable": np.zeros(3, np.float32)},
    )
    args = [
        str(BIN / "realformer-import-tf"),
        "--tf-checkpoint",
        str(tf / "model.ckpt"),
        "--bert-config",
        str(tf / "bert_config.json"),
        "--vocab",
        str(tf / "vocab.txt"),
        "--out",
        str(tmp_path / "out"),
    ]
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"realformer-import-tf: error: {tf / 'model.ckpt'}: unknown variable "
        "bert/some/new_variable [3]; not a BERT/RealFormer variable, nor an optimizer slot or "
        "global_step (--skip-variable REGEX skips it)"
    )
    ok = subprocess.run(args + ["--skip-variable", r"bert/some/.*"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert re.search(r"skipped bert/some/new_variable: --skip-variable bert/some/\.\*", ok.stdout)


def test_casing_travels_with_the_checkpoint(imported, tmp_path):
    """Uncased (detected from the fixture's vocabulary) and --cased: the hub's WordPiece
    lower-cases or not, as converted, without being told again."""
    assert load_hub(imported[0]).bpe.tokenizer.lowercase is True
    convert_checkpoint(
        str(realformer_tf_fixture("model.ckpt")),
        str(realformer_tf_fixture("bert_config.json")),
        str(realformer_tf_fixture("vocab.txt")),
        str(tmp_path),
        cased=True,
    )
    hub = load_hub(tmp_path)
    assert hub.bpe.tokenizer.lowercase is False
    assert hub.bpe.encode("The book") == "<unk> book"
    # model_args.txt repeats the tokenisation with its casing (a fine-tuning command that
    # repeats it gives a checkpoint that knows it too)
    for out_dir, case in ((imported[0], "--wordpiece-uncased"), (tmp_path, "--wordpiece-cased")):
        args = (out_dir / "model_args.txt").read_text().split()
        assert args[args.index("--bpe") :][:5] == [
            "--bpe", "wordpiece", "--wordpiece-vocab", str(out_dir / "vocab.txt"), case]  # fmt: skip
