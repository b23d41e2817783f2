"""The TensorFlow checkpoint reader (realformer_fairseq.tf_import.tensor_bundle) and the
WordPiece vocabulary / tokeniser (realformer_fairseq.tf_import.wordpiece), without TensorFlow.

The reader is checked against the checkpoint written by TensorFlow itself
(../shared/data/realformer_tf, via tf.train.Saver) and against the generator's independent
numpy reader; the test writer (tests/tf_bundle_writer.py) is checked against that reader too,
then used for what the fixture does not have (shards, many blocks, other dtypes, corruption).
"""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from harness import realformer_tf_fixture
from tf_bundle_writer import write_bundle

from realformer_fairseq.tf_import.tensor_bundle import TensorBundleError, read_bundle
from realformer_fairseq.tf_import.wordpiece import (
    BertTextTokenizer,
    WordPieceError,
    WordPieceVocabulary,
    decode_pieces,
)


def fixture_dir() -> Path:
    return realformer_tf_fixture()


def reference_module():
    """The generator's numpy-only reference (reader + forward), loaded from the fixture folder."""
    path = fixture_dir() / "generator" / "reference_forward.py"
    spec = importlib.util.spec_from_file_location("realformer_reference_forward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the variables of the fixture, as listed in its README (46, tf.train.list_variables order)
FIXTURE_SHAPES = {
    "bert/embeddings/LayerNorm/beta": (32,),
    "bert/embeddings/LayerNorm/gamma": (32,),
    "bert/embeddings/position_embeddings": (64, 32),
    "bert/embeddings/token_type_embeddings": (2, 32),
    "bert/embeddings/word_embeddings": (71, 32),
    **{
        f"bert/encoder/layer_{l}/{name}": shape
        for l in range(2)
        for name, shape in {
            "attention/output/LayerNorm/beta": (32,),
            "attention/output/LayerNorm/gamma": (32,),
            "attention/output/dense/bias": (32,),
            "attention/output/dense/kernel": (32, 32),
            "attention/self/key/bias": (32,),
            "attention/self/key/kernel": (32, 32),
            "attention/self/query/bias": (32,),
            "attention/self/query/kernel": (32, 32),
            "attention/self/value/bias": (32,),
            "attention/self/value/kernel": (32, 32),
            "intermediate/dense/bias": (64,),
            "intermediate/dense/kernel": (32, 64),
            "output/LayerNorm/beta": (32,),
            "output/LayerNorm/gamma": (32,),
            "output/dense/bias": (32,),
            "output/dense/kernel": (64, 32),
        }.items()
    },
    "bert/pooler/dense/bias": (32,),
    "bert/pooler/dense/kernel": (32, 32),
    "cls/predictions/output_bias": (71,),
    "cls/predictions/transform/LayerNorm/beta": (32,),
    "cls/predictions/transform/LayerNorm/gamma": (32,),
    "cls/predictions/transform/dense/bias": (32,),
    "cls/predictions/transform/dense/kernel": (32, 32),
    "cls/seq_relationship/output_bias": (2,),
    "cls/seq_relationship/output_weights": (2, 32),
}


# ---------------------------------------------------------------------------
# the reader on TensorFlow's own file


def test_reads_every_variable_of_the_tensorflow_checkpoint():
    prefix = str(fixture_dir() / "model.ckpt")
    bundle = read_bundle(prefix)
    assert {n: e.shape for n, e in bundle.entries.items()} == FIXTURE_SHAPES
    assert bundle.num_shards == 1
    reference = reference_module().read_checkpoint(prefix)
    for name in FIXTURE_SHAPES:
        tensor = bundle.tensor(name)
        assert tensor.dtype == np.float32, name
        np.testing.assert_array_equal(tensor, reference[name], err_msg=name)
    # a LayerNorm gamma of the fixture is 1 + 0.1 N(0,1), not the initial ones
    assert not np.allclose(bundle.tensor("bert/embeddings/LayerNorm/gamma"), 1.0)


def test_prefix_may_be_given_as_the_index_or_data_file():
    d = fixture_dir()
    for path in ("model.ckpt.index", "model.ckpt.data-00000-of-00001"):
        assert read_bundle(str(d / path)).names() == sorted(FIXTURE_SHAPES)


# ---------------------------------------------------------------------------
# the test writer, checked against the generator's reader, then the reader on its files


def random_tensors(seed=0):
    rng = np.random.RandomState(seed)
    tensors = {
        f"scope_{i:02d}/var/kernel": rng.randn(3, i + 1).astype(np.float32) for i in range(40)
    }
    tensors["global_step"] = np.array(123456789012, dtype=np.int64)
    tensors["counts"] = np.arange(7, dtype=np.int32)
    return tensors


def test_writer_output_reads_back_with_the_generators_reader(tmp_path):
    tensors = random_tensors()
    prefix = str(tmp_path / "model.ckpt")
    write_bundle(prefix, tensors, block_size=256)  # many data blocks
    reference = reference_module().read_checkpoint(prefix)
    assert sorted(reference) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(reference[name], value, err_msg=name)
        np.testing.assert_array_equal(read_bundle(prefix).tensor(name), value, err_msg=name)


def test_reads_shards_blocks_and_dtypes(tmp_path):
    rng = np.random.RandomState(1)
    tensors = random_tensors(2)
    tensors.update(
        half=rng.randn(4, 5).astype(np.float16),
        double=rng.randn(6).astype(np.float64),
        brain=np.array([1.0, -2.5, 3.140625, 1e-3], dtype=np.float32),
        scalar=np.array(0.5, dtype=np.float32),
    )
    prefix = str(tmp_path / "sharded.ckpt")
    write_bundle(
        prefix, tensors, num_shards=3, block_size=100, restart_interval=4, bfloat16={"brain"}
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "sharded.ckpt.data-00000-of-00003",
        "sharded.ckpt.data-00001-of-00003",
        "sharded.ckpt.data-00002-of-00003",
        "sharded.ckpt.index",
    ]
    bundle = read_bundle(prefix)
    assert bundle.num_shards == 3
    assert sorted(bundle.names()) == sorted(tensors)
    for name, value in tensors.items():
        got = bundle.tensor(name)
        if name == "brain":  # bfloat16 keeps the upper 16 bits of the float32
            np.testing.assert_array_equal(got, [1.0, -2.5, 3.140625, 1.0234375 * 2**-10])
            assert got.dtype == np.float32
        else:
            assert got.dtype == value.dtype and got.shape == value.shape, name
            np.testing.assert_array_equal(got, value, err_msg=name)
    assert bundle.entries["global_step"].dtype_name == "int64"


# ---------------------------------------------------------------------------
# bad input: one error naming the file (and the variable)


@pytest.fixture
def small_checkpoint(tmp_path):
    prefix = str(tmp_path / "m.ckpt")
    write_bundle(
        prefix, {"a/kernel": np.ones((4, 4), np.float32), "b/bias": np.zeros(4, np.float32)}
    )
    return prefix


def test_corrupt_tensor_bytes_are_refused_naming_the_variable(small_checkpoint):
    data = Path(small_checkpoint + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[5] ^= 0x01  # inside a/kernel (written first)
    data.write_bytes(bytes(raw))
    bundle = read_bundle(small_checkpoint)
    np.testing.assert_array_equal(bundle.tensor("b/bias"), np.zeros(4))
    with pytest.raises(TensorBundleError, match=r"checksum mismatch for variable a/kernel"):
        bundle.tensor("a/kernel")


def test_truncated_data_file_is_refused(small_checkpoint):
    data = Path(small_checkpoint + ".data-00000-of-00001")
    data.write_bytes(data.read_bytes()[:70])
    with pytest.raises(TensorBundleError, match=r"truncated \(variable b/bias"):
        read_bundle(small_checkpoint).tensor("b/bias")


def test_missing_files_and_foreign_files_are_refused(small_checkpoint, tmp_path):
    with pytest.raises(TensorBundleError, match=r"no TensorFlow checkpoint index .*nothing.ckpt"):
        read_bundle(str(tmp_path / "nothing.ckpt"))
    other = tmp_path / "other.ckpt"
    (tmp_path / "other.ckpt.index").write_bytes(b"x" * 100)
    with pytest.raises(TensorBundleError, match=r"not a TensorFlow checkpoint index"):
        read_bundle(str(other))
    index = Path(small_checkpoint + ".index")
    raw = bytearray(index.read_bytes())
    raw[3] ^= 0x20  # inside the data block
    index.write_bytes(bytes(raw))
    with pytest.raises(TensorBundleError, match=r"checksum mismatch in a table block"):
        read_bundle(small_checkpoint)
    index.unlink()
    Path(small_checkpoint + ".data-00000-of-00001").unlink()
    write_bundle(small_checkpoint, {"a": np.ones(2, np.float32)})
    Path(small_checkpoint + ".data-00000-of-00001").unlink()
    with pytest.raises(
        TensorBundleError, match=r"missing checkpoint data file .*m.ckpt.data-00000-of-00001"
    ):
        read_bundle(small_checkpoint)


# ---------------------------------------------------------------------------
# WordPiece


def fixture_vocab():
    return WordPieceVocabulary.from_file(str(fixture_dir() / "vocab.txt"))


def test_vocabulary_becomes_a_fairseq_dictionary_with_bert_specials_mapped(tmp_path):
    vocab = fixture_vocab()
    d = vocab.dictionary
    # BERT ids of the fixture: [PAD]=0 [unused0..4]=1..5 [UNK]=6 [CLS]=7 [SEP]=8 [MASK]=9 the=10
    assert [vocab.fairseq_ids[i] for i in (7, 0, 8, 6)] == [d.bos(), d.pad(), d.eos(), d.unk()]
    assert (d.bos(), d.pad(), d.eos(), d.unk()) == (0, 1, 2, 3)
    assert d[vocab.fairseq_ids[9]] == "<mask>"
    assert d[vocab.fairseq_ids[10]] == "the" and d[vocab.fairseq_ids[70]] == "he"
    assert d[vocab.fairseq_ids[1]] == "[unused0]"
    # fairseq order: the four built-ins, then BERT order without them
    assert list(vocab.fairseq_ids[:11]) == [1, 4, 5, 6, 7, 8, 3, 0, 2, 9, 10]
    assert sorted(vocab.fairseq_ids) == list(range(71))
    assert list(vocab.bert_ids[vocab.fairseq_ids]) == list(range(71))
    path = tmp_path / "dict.txt"
    vocab.write_fairseq_dict(str(path))
    from fairseq.data import Dictionary

    loaded = Dictionary.load(str(path))
    assert loaded.symbols == d.symbols and len(loaded) == 71
    assert loaded.add_symbol("<mask>") == vocab.fairseq_ids[9]  # masked_lm's mask id, unchanged


def modules_assigning(name: str):
    """The package's modules that assign ``name`` at module level."""
    import ast

    package = Path(__file__).resolve().parents[1] / "realformer_fairseq"
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found.append(path.relative_to(package).as_posix())
    return found


def test_one_bert_to_fairseq_id_mapping_and_one_next_sentence_head_name(monkeypatch):
    """One home for each fact: the BERT-id -> fairseq-id mapping is
    ``wordpiece.fairseq_ids_of_bert_vocab`` (the vocabulary's own ids and the ids
    ``bert_outputs`` feeds an imported model, whose dictionary it checks), and the name of
    the next-sentence head is ``bert_checkpoint.NEXT_SENTENCE_HEAD`` (where the head is made)."""
    from fairseq.data import Dictionary

    from realformer_fairseq.tf_import import outputs, wordpiece

    mapping = wordpiece.fairseq_ids_of_bert_vocab
    calls = []

    def counted(dictionary, tokens):
        calls.append(len(tokens))
        return mapping(dictionary, tokens)

    monkeypatch.setattr(wordpiece, "fairseq_ids_of_bert_vocab", counted)
    vocab = fixture_vocab()
    assert calls == [71]  # the vocabulary's ids are the mapping's
    assert outputs.fairseq_ids_of_bert_vocab is mapping  # and bert_outputs' are too
    other = Dictionary()
    other.add_symbol("the")
    with pytest.raises(WordPieceError, match="the model's dictionary has no '\\[unused0\\]'"):
        mapping(other, vocab.tokens)
    assert modules_assigning("NEXT_SENTENCE_HEAD") == ["tf_import/bert_checkpoint.py"]


@pytest.mark.parametrize(
    "lines,message",
    [
        (["[PAD]", "[UNK]", "[CLS]", "[SEP]"], r"has no \[MASK\] token"),
        (
            ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "a"],
            r"line 7: token 'a' is also on line 6",
        ),
        (
            ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>"],
            r"line 6: token '<s>' is a fairseq",
        ),
        (["[PAD]", "", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], r"line 2 is empty"),
    ],
)
def test_unusable_vocabularies_are_refused(lines, message):
    with pytest.raises(WordPieceError, match=message):
        WordPieceVocabulary(lines)


def test_tokenizer_is_berts_full_tokenizer():
    vocab = fixture_vocab()
    uncased = BertTextTokenizer(vocab.tokens, lowercase=True)
    # worked by hand with BERT's rules: lower-case + strip accents, split on punctuation,
    # greedy longest-match WordPiece ("unknownly" -> un ##know ##n ##ly), CJK characters
    # one by one, a literal [SEP] is just punctuation and a word
    assert uncased.bert_pieces("She reads the Böok, unknowNly! [SEP] 中文") == [
        "she",
        "read",
        "##s",
        "the",
        "book",
        ",",
        "un",
        "##know",
        "##n",
        "##ly",
        "!",
        "[UNK]",
        "[UNK]",
        "[UNK]",
        "[UNK]",
        "[UNK]",
    ]
    assert uncased.pieces("The   quick fox\tjumps.") == ["the", "quick", "fox", "jump", "##s", "."]
    assert uncased.pieces("zebra") == ["<unk>"]
    # "unnn..." is un ##n ##n ...; 201 characters are longer than BERT's 200: [UNK]
    assert uncased.bert_pieces("u" + "n" * 199) == ["un"] + ["##n"] * 198
    assert uncased.bert_pieces("u" + "n" * 200) == ["[UNK]"]
    cased = BertTextTokenizer(vocab.tokens, lowercase=False)
    assert cased.bert_pieces("The book") == ["[UNK]", "book"]
    assert cased.bert_pieces("böok") == ["[UNK]"]  # accents kept when cased
    assert uncased.encode_lines(["The cat sat.", ""]) == ["the cat sat .", ""]
    assert vocab.fairseq_token_ids(uncased.pieces("the cat zebra")) == [
        vocab.fairseq_ids[10],
        vocab.fairseq_ids[12],
        3,
    ]
    assert decode_pieces("she read ##s the book") == "she reads the book"


def test_uncased_vocabulary_is_recognised():
    assert fixture_vocab().looks_uncased()
    cased = WordPieceVocabulary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "The", "the"])
    assert not cased.looks_uncased()


def test_bpe_wordpiece_casing_follows_the_vocabulary_unless_told(tmp_path):
    """fairseq's --bpe wordpiece, built through fairseq's BPE registry as every fairseq command
    and the hub build it: without a casing flag a cased vocabulary gives a cased tokeniser (before:
    always uncased), an uncased one an uncased tokeniser; --wordpiece-cased / --wordpiece-uncased
    decide; a checkpoint of before --wordpiece-uncased stored wordpiece_cased=False for its
    uncased models, which stays uncased."""
    import argparse

    from fairseq.data import encoders

    cased_vocab = tmp_path / "cased.txt"
    cased_vocab.write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "The", "the", "cat"]) + "\n",
        encoding="utf-8",
    )
    uncased_vocab = fixture_dir() / "vocab.txt"

    def bpe(vocab, **flags):
        return encoders.build_bpe(
            argparse.Namespace(bpe="wordpiece", wordpiece_vocab=str(vocab), **flags)
        )

    assert bpe(cased_vocab).encode("The cat") == "The cat"
    assert bpe(cased_vocab, wordpiece_cased=None).encode("The cat") == "The cat"
    assert bpe(cased_vocab, wordpiece_uncased=True).encode("The cat") == "the cat"
    assert bpe(cased_vocab, wordpiece_cased=False).encode("The cat") == "the cat"  # old checkpoints
    assert bpe(uncased_vocab).encode("The cat") == "the cat"
    assert bpe(uncased_vocab, wordpiece_cased=True).encode("The cat") == "<unk> cat"


def test_wordpiece_command_line(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("The cat sat on the mat.\nShe reads a book\n", encoding="utf-8")
    out = tmp_path / "out.wp"
    exe = shutil.which("realformer-wordpiece", path=str(Path(sys.executable).parent))
    result = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            exe,
            "--vocab",
            str(fixture_dir() / "vocab.txt"),
            "--inputs",
            str(src),
            "--outputs",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert out.read_text() == "the cat sat on the mat .\nshe read ##s a book\n"
    # the pipelines run it on every file they tokenise: it starts without fairseq (3 CPU s)
    imported = {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines()}
    assert "tokenizers" in imported and not {"fairseq", "torch"} & imported
    bad = subprocess.run(
        [exe, "--vocab", str(tmp_path / "none.txt")], capture_output=True, text=True
    )
    assert bad.returncode == 1
    assert (
        bad.stderr.strip().splitlines()[-1]
        == f"realformer-wordpiece: error: no vocabulary file {tmp_path / 'none.txt'}"
    )


def test_reads_a_sharded_checkpoint_written_by_tensorflow():
    """tests/data/tf_sharded: 3 shards, bfloat16 and int64, written by TF's sharded Saver
    (tests/data/tf_sharded/make_tf_sharded.py says how)."""
    folder = Path(__file__).parent / "data" / "tf_sharded"
    bundle = read_bundle(str(folder / "tf.ckpt"))
    assert bundle.num_shards == 3
    assert {n: (e.dtype_name, e.shape) for n, e in bundle.entries.items()} == {
        "bert/a": ("float32", (4, 6)),
        "bert/b": ("float32", (7,)),
        "bert/c": ("bfloat16", (2, 3)),
        "global_step": ("int64", ()),
    }
    assert len({e.shard_id for e in bundle.entries.values()}) == 3
    values = np.load(folder / "tf_values.npz")
    for name in bundle.names():
        np.testing.assert_array_equal(bundle.tensor(name), values[name.replace("/", "__")])
