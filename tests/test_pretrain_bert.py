"""examples/pretrain_bert: BERT pre-training for the RealFormer comparison (He, Ravula, Kanagal,
Ainslie 2020, arXiv 2012.11747) from raw text to held-out masked-token accuracy.

Expected values are written here from the references: Google's released English vocabularies
(``uncased_L-12_H-768_A-12/vocab.txt``: ``[PAD]`` 0, ``[unused0]`` 1 .. ``[unused98]`` 99,
``[UNK]`` 100, ``[CLS]`` 101, ``[SEP]`` 102, ``[MASK]`` 103, ``[unused99]`` 104 .. ``[unused993]``
998, 30,522 lines), google-research/bert (``optimization.py``, ``run_pretraining.py``,
``create_pretraining_data.py``, ``modeling.py``) and Devlin et al. 2019, Appendix A.2.
"""

import functools
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import harness
import numpy as np
import pytest
import torch
from harness import REPO_ROOT, shared_data

PIPELINE = REPO_ROOT / "examples" / "pretrain_bert"
TOOLS = PIPELINE / "pretrain_tools.py"
RECIPES = PIPELINE / "recipes.py"
# kept on sys.path: the worker processes of write_instances (spawn) import pretrain_data by name
sys.path.insert(0, str(PIPELINE))
import pretrain_data  # noqa: E402

pytestmark = pytest.mark.xdist_group("pretrain_bert")

DOC_LINES = 20


def news_corpus(path: Path, lines: int = 1200) -> Path:
    """Pseudo-documents of 20 consecutive newstest2012 sentences, a blank line between."""
    text = shared_data("newstest2013", "newstest2012.en").read_text(encoding="utf-8")
    sentences = text.splitlines()[:lines]
    docs = [sentences[i : i + DOC_LINES] for i in range(0, len(sentences), DOC_LINES)]
    path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    return path


def tool(*args, check=True):
    proc = subprocess.run(
        [sys.executable, str(TOOLS), *map(str, args)], capture_output=True, text=True
    )
    if check and proc.returncode != 0:
        raise AssertionError(proc.stderr[-3000:])
    return proc


one_error_line = functools.partial(harness.one_error_line, prog="pretrain_bert")


# ------------------------------------------------------------------ vocabulary


@pytest.fixture(scope="module")
def learnt_vocab(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab")
    corpus = news_corpus(root / "corpus.txt")
    uncased = pretrain_data.learn_wordpiece([str(corpus)], 3000, lowercase=True)
    cased = pretrain_data.learn_wordpiece([str(corpus)], 3000, lowercase=False)
    return corpus, uncased, cased


def test_learnt_vocabulary_has_googles_layout(learnt_vocab):
    _, tokens, _ = learnt_vocab
    assert len(tokens) == 3000
    assert tokens[0] == "[PAD]"
    assert tokens[1] == "[unused0]" and tokens[99] == "[unused98]"
    assert tokens[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tokens[104] == "[unused99]" and tokens[998] == "[unused993]"
    learnt = tokens[999:]
    assert not any(t.startswith("[") and t.endswith("]") and len(t) > 2 for t in learnt)
    assert len(set(tokens)) == len(tokens)
    continuations = [t for t in learnt if t.startswith("##")]
    assert len(continuations) > 100 and "##s" in continuations
    assert "the" in learnt and "," in learnt
    assert not any(ch.isupper() for t in learnt for ch in t)  # uncased: lower-cased


def test_cased_vocabulary_keeps_case(learnt_vocab):
    _, _, tokens = learnt_vocab
    assert any(ch.isupper() for t in tokens[999:] for ch in t)
    assert not pretrain_data.looks_uncased(tokens)


def test_learnt_vocabulary_loads_in_the_plugin_and_tokenises_like_it(learnt_vocab, tmp_path):
    """The plugin's WordPieceVocabulary (BERT's rules) accepts the file; its fairseq dict.txt is
    the one the pipeline writes; both tokenizers give the same pieces (cased and uncased)."""
    from realformer_fairseq.tf_import.wordpiece import BertTextTokenizer, WordPieceVocabulary

    corpus, uncased, cased = learnt_vocab
    for tokens, lowercase in ((uncased, True), (cased, False)):
        vocab_path = tmp_path / "vocab.txt"
        pretrain_data.write_vocab(tokens, str(vocab_path))
        plugin = WordPieceVocabulary.from_file(str(vocab_path))
        plugin.write_fairseq_dict(str(tmp_path / "plugin_dict.txt"))
        pretrain_data.write_fairseq_dict(tokens, str(tmp_path / "dict.txt"))
        assert (tmp_path / "dict.txt").read_text() == (tmp_path / "plugin_dict.txt").read_text()
        lines = [x for x in corpus.read_text(encoding="utf-8").splitlines() if x][:300]
        lines += ["Ünïcödé naïve café — 東京 ", "tabs\tand\u00a0nbsp", "x" * 250]
        ours = pretrain_data.BertTokenizer(tokens, lowercase).encode_lines(lines)
        theirs = BertTextTokenizer(tokens, lowercase).encode_lines(lines)
        assert [" ".join(p) for p in ours] == theirs
        unk = sum(p.count("<unk>") for p in ours[:300])
        assert unk < 0.01 * sum(map(len, ours[:300]))


def test_vocabulary_checks_match_the_plugin(tmp_path):
    from realformer_fairseq.errors import RealformerConfigError
    from realformer_fairseq.tf_import.wordpiece import WordPieceVocabulary

    good = pretrain_data.bert_layout(["a", "b", "##c"], unused=3)
    bad_cases = [good[:-1] + ["a"], good + ["<s>"], good + ["x y"], good + [""],
                 [t for t in good if t != "[MASK]"]]  # fmt: skip
    pretrain_data.check_vocab(good, "v")
    WordPieceVocabulary(good)
    for tokens in bad_cases:
        with pytest.raises(pretrain_data.InputError):
            pretrain_data.check_vocab(tokens, "v")
        with pytest.raises(RealformerConfigError):
            WordPieceVocabulary(tokens)


# ------------------------------------------------------------------ documents


def test_instances_never_cross_documents_and_lose_nothing(tmp_path):
    """Every instance holds whole sentences of one document (a sentence longer than the limit is
    cut in order); the instances of a document, joined, are its pieces; lengths <= max - 2."""
    rng = np.random.default_rng(0)
    docs = []
    for d in range(40):
        docs.append([" ".join(f"d{d}s{s}w{w}" for w in range(int(rng.integers(1, 40))))
                     for s in range(int(rng.integers(1, 12)))])  # fmt: skip
    docs[3].append(" ".join(f"d3long{w}" for w in range(300)))  # longer than an instance
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    words = sorted({w for d in docs for s in d for w in s.split()})
    tokens = pretrain_data.bert_layout(words, unused=0)
    vocab = tmp_path / "vocab.txt"
    pretrain_data.write_vocab(tokens, str(vocab))
    out = tmp_path / "instances.txt"
    settings = pretrain_data.InstanceSettings(str(vocab), lowercase=True, max_seq_len=64)
    stats = pretrain_data.write_instances([str(corpus)], str(out), settings)
    instances = [line.split() for line in out.read_text(encoding="utf-8").splitlines()]
    assert stats["instances"] == len(instances) and stats["long_sentences_cut"] == 1
    assert max(map(len, instances)) <= 62 and min(map(len, instances)) >= 1
    by_doc = {}
    for instance in instances:
        owners = {w.split("s")[0] if not w.startswith("d3long") else "d3" for w in instance}
        assert len(owners) == 1, instance  # one document
        by_doc.setdefault(owners.pop(), []).extend(instance)
    for d, doc in enumerate(docs):
        assert by_doc[f"d{d}"] == " ".join(doc).split()  # nothing lost, in order
    # whole sentences: an instance starts at a sentence start unless it continues a cut one
    starts = {s.split()[0] for doc in docs for s in doc}
    assert all(i[0] in starts or i[0].startswith("d3long") for i in instances)


def test_short_sequence_targets_as_bert():
    """short_seq_prob 0: instances fill up to max - 2 (closed at the sentence that reaches it);
    1: every document gets one random target in 2 .. max - 2 (drawn once per document)."""
    sentences = [[f"w{i}_{j}" for j in range(7)] for i in range(40)]  # 280 pieces
    rng = np.random.default_rng(1)
    full = pretrain_data.pack_document(sentences, 66, 0.0, rng)
    # 9 sentences of 7 = 63 pieces; the 10th would make 70 > 64 and starts the next instance
    assert [len(x) for x in full] == [63, 63, 63, 63, 28]
    short = pretrain_data.pack_document(sentences, 66, 1.0, np.random.default_rng(2))
    lengths = [len(x) for x in short]
    assert max(lengths[:-1]) - min(lengths[:-1]) <= 7 and max(lengths) <= 64
    assert sum(lengths) == 280


def test_split_keeps_whole_documents(tmp_path):
    corpus = news_corpus(tmp_path / "corpus.txt", lines=400)  # 20 documents
    stats = pretrain_data.split_documents(
        [str(corpus)], str(tmp_path / "t"), str(tmp_path / "v"), 3, 7
    )
    original = corpus.read_text(encoding="utf-8").strip().split("\n\n")
    train = (tmp_path / "t").read_text(encoding="utf-8").strip().split("\n\n")
    valid = (tmp_path / "v").read_text(encoding="utf-8").strip().split("\n\n")
    assert len(valid) == 3 and len(train) == 17 and stats["valid"]["documents"] == 3
    assert sorted(train + valid) == sorted(original)
    again = pretrain_data.split_documents(
        [str(corpus)], str(tmp_path / "t2"), str(tmp_path / "v2"), 3, 7
    )
    assert (tmp_path / "v2").read_text() == (tmp_path / "v").read_text() and again == stats


def test_workers_give_the_same_instances(tmp_path):
    corpus = news_corpus(tmp_path / "corpus.txt", lines=600)
    tokens = pretrain_data.learn_wordpiece([str(corpus)], 1500, lowercase=True, unused=10)
    pretrain_data.write_vocab(tokens, str(tmp_path / "vocab.txt"))
    settings = pretrain_data.InstanceSettings(str(tmp_path / "vocab.txt"), True, 128)
    one = pretrain_data.write_instances([str(corpus)], str(tmp_path / "1.txt"), settings, 1, 4)
    two = pretrain_data.write_instances([str(corpus)], str(tmp_path / "2.txt"), settings, 2, 4)
    assert (tmp_path / "1.txt").read_text() == (tmp_path / "2.txt").read_text()
    assert one == two and one["documents"] == 30


def test_one_line_errors_for_bad_corpora(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    one_doc = tmp_path / "one.txt"
    one_doc.write_text("a sentence .\nanother one .\n", encoding="utf-8")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"ok\n\ncaf\xe9\n")
    args = [
        "split",
        "--train",
        tmp_path / "t",
        "--valid",
        tmp_path / "v",
        "--stats",
        tmp_path / "s",
    ]
    assert "no text (empty corpus" in one_error_line(tool(*args, "--corpus", empty, check=False))
    line = one_error_line(tool(*args, "--corpus", one_doc, check=False))
    assert "no blank line between documents (2 lines read as one document)" in line
    assert "latin1.txt line 3: not UTF-8" in one_error_line(
        tool(*args, "--corpus", latin1, check=False)
    )
    assert "no such file" in one_error_line(tool(*args, "--corpus", tmp_path / "x", check=False))
    two = tmp_path / "two.txt"
    two.write_text("a .\n\nb .\n", encoding="utf-8")
    line = one_error_line(tool(*args, "--corpus", two, "--valid-docs", "2", check=False))
    assert "--valid-docs 2 leaves no training document" in line
    assert not (tmp_path / "t").exists() and not (tmp_path / "v").exists()


# ------------------------------------------------------------------ the recipe


# BERT's values, written here from the references (module docstring)
BERT_RECIPE = {
    "--task": "masked_lm",
    "--mask-prob": "0.15",  # create_pretraining_data.py masked_lm_prob
    "--leave-unmasked-prob": "0.1",  # 10 % kept
    "--random-token-prob": "0.1",  # 10 % random
    "--optimizer": "adam",
    "--adam-betas": "(0.9, 0.999)",  # optimization.py beta_1, beta_2
    "--adam-eps": "1e-06",  # optimization.py epsilon
    "--weight-decay": "0.01",  # optimization.py weight_decay_rate; paper A.2
    "--clip-norm": "1.0",  # optimization.py clip_by_global_norm
    "--lr": "0.0001",  # paper A.2; README "1e-4"
    "--lr-scheduler": "polynomial_decay",  # linear warm-up then linear decay
    "--end-learning-rate": "0.0",
    "--power": "1.0",
    "--warmup-updates": "10000",  # paper A.2
    "--total-num-update": "1000000",  # paper A.2: 1,000,000 steps
    "--dropout": "0.1",  # modeling.py hidden_dropout_prob
    "--attention-dropout": "0.1",  # modeling.py attention_probs_dropout_prob
    "--activation-dropout": "0.0",
    "--activation-fn": "gelu_accurate",  # modeling.py gelu (tanh form)
    "--layernorm-eps": "1e-12",  # tf layer_norm
    "--max-positions": "512",  # modeling.py max_position_embeddings
    "--sample-break-mode": "eos",
}


def recipe_phases(*args):
    proc = subprocess.run([sys.executable, str(RECIPES), "command", *map(str, args)],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    values = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        values[key] = shlex.split(value[1:-1]) if value.startswith("(") else shlex.split(value)[0]
    return values


def flag_values(argv):
    out, i = {}, 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = None
            i += 1
    return out


@pytest.mark.parametrize("size,arch_width", [("base", 768), ("large", 1024)])
@pytest.mark.parametrize("gpus", [1, 2, 4, 8, 16])
def test_recipe_command_is_berts(size, arch_width, gpus):
    phases = recipe_phases("--variant", "realformer", "--size", size, "--data-bin", "/d128",
                           "--seq-len", 128, "--data-bin-512", "/d512", "--seq-len-512", 512,
                           "--world", gpus)  # fmt: skip
    assert phases["ARCH"] == f"realformer_bert_{size}" and phases["PHASES"] == "2"
    for phase, seq_len, max_update in ((1, 128, "900000"), (2, 512, "1000000")):
        flags = flag_values(phases[f"PHASE{phase}_ARGS"])
        for flag, value in BERT_RECIPE.items():
            assert flags.get(flag) == value, (flag, flags.get(flag))
        assert flags["--max-update"] == max_update  # 90 % of the steps at 128, then 512
        assert flags["--tokens-per-sample"] == str(seq_len)
        assert "--fp16" in flags
        batch = gpus * int(flags["--batch-size"]) * int(flags["--update-freq"])
        assert batch == 256  # paper A.2: 256 sequences a step
    assert phases["PHASE1_DATA_BIN"] == "/d128" and phases["PHASE2_DATA_BIN"] == "/d512"


def test_recipe_one_line_errors():
    for args, message in (
        (["--variant", "realformer", "--size", "huge"], "--size must be one of tiny, small, base"),
        (["--variant", "admin", "--size", "base"], "--variant must be one of realformer, postln"),
    ):
        proc = subprocess.run(
            [sys.executable, str(RECIPES), "command", *args, "--data-bin", "d", "--seq-len",
             "128", "--world", "1"], capture_output=True, text=True)  # fmt: skip
        assert message in one_error_line(proc)


def test_short_schedule_scales_the_warm_up():
    flags = flag_values(recipe_phases("--variant", "postln", "--size", "tiny", "--data-bin", "d",
                                      "--seq-len", 128, "--world", 1, "--max-update", 2000,
                                      "--cpu")["PHASE1_ARGS"])  # fmt: skip
    assert flags["--max-update"] == flags["--total-num-update"] == "2000"
    assert flags["--warmup-updates"] == "20"  # 1 %, the recipe's 10,000 / 1,000,000
    assert "--fp16" not in flags


# ------------------------------------------------------------------ the scripts


def script(name, *args, check=True, env=None):
    proc = harness.pipeline_bash("pretrain_bert", name, *args,
                                 env=harness.pipeline_env(**(env or {})))  # fmt: skip
    if check and proc.returncode != 0:
        raise AssertionError(proc.stderr[-3000:])
    return proc


def fake_data_bin(
    root: Path, seq_len: int, vocab_text: str = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n"
):
    """What pretrain.sh reads of a data-bin: prepare.json and vocab.txt."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "vocab.txt").write_text(vocab_text, encoding="utf-8")
    (root / "prepare.json").write_text(json.dumps({"max_seq_len": seq_len, "cased": False,
                                                   "vocab": "vocab.txt"}))  # fmt: skip
    return root


def dry_run_commands(stdout: str):
    commands = [
        shlex.split(line)
        for line in stdout.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return commands


@pytest.mark.parametrize("size", ["base", "large"])
@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_pretrain_sh_dry_run_is_berts_recipe_flag_by_flag(tmp_path, size, gpus):
    d128 = fake_data_bin(tmp_path / "d128", 128)
    d512 = fake_data_bin(tmp_path / "d512", 512)
    proc = script("pretrain.sh", "--variant", "realformer", "--size", size, "--data-bin", d128,
                  "--data-bin-512", d512, "--gpus", gpus, "--save-dir", tmp_path / "ck",
                  "--dry-run")  # fmt: skip
    phases = dry_run_commands(proc.stdout)
    assert len(phases) == 2
    for argv, data_bin, seq_len, max_update in ((phases[0], d128, "128", "900000"),
                                                (phases[1], d512, "512", "1000000")):  # fmt: skip
        assert argv[0].endswith("fairseq-train") and argv[1] == str(data_bin)
        flags = flag_values(argv[2:])
        for flag, value in BERT_RECIPE.items():
            assert flags.get(flag) == value, (flag, flags.get(flag))
        assert flags["--arch"] == f"realformer_bert_{size}"
        assert flags["--max-update"] == max_update and flags["--tokens-per-sample"] == seq_len
        assert gpus * int(flags["--batch-size"]) * int(flags["--update-freq"]) == 256
        assert flags["--distributed-world-size"] == str(gpus) and "--fp16" in flags
        assert flags["--bpe"] == "wordpiece"
        assert flags["--wordpiece-vocab"] == str(d128 / "vocab.txt")
        # an uncased data-bin: the casing is stated in the checkpoint, not left to the vocabulary
        assert "--wordpiece-uncased" in flags and "--wordpiece-cased" not in flags
    assert "--reset-dataloader" in phases[1] and "--reset-dataloader" not in phases[0]


def test_pretrain_sh_one_line_errors(tmp_path):
    d128 = fake_data_bin(tmp_path / "d128", 128)
    base = ["--variant", "postln", "--data-bin", d128, "--gpus", 1, "--dry-run"]
    cases = [
        (["--size", "huge"], "--size must be one of tiny, small, base, large, xlarge, got 'huge'"),
        (
            ["--size", "base", "--", "--update-freq", "2"],
            "--update-freq after --: pretrain.sh sets it",
        ),
        (["--size", "base", "--", "--arch", "x"], "--arch after --: pretrain.sh sets it"),
        (["--size", "base", "--data-bin-512", tmp_path], "no prepare.json"),
        (["--size", "base", "--gpus", "two"], "--gpus must be a whole number"),
    ]
    for extra, message in cases:
        line = one_error_line(script("pretrain.sh", *base, *extra, check=False))
        assert message in line, line


def test_pretrain_sh_extra_replaces_a_recipe_value(tmp_path):
    d128 = fake_data_bin(tmp_path / "d128", 128)
    proc = script("pretrain.sh", "--variant", "preln", "--size", "small", "--data-bin", d128,
                  "--cpu", "--max-update", "3000", "--dry-run", "--", "--lr", "5e-4",
                  "--keep-best-checkpoints", "2")  # fmt: skip
    (argv,) = dry_run_commands(proc.stdout)
    flags = flag_values(argv)
    assert argv.count("--lr") == 1 and flags["--lr"] == "5e-4"
    assert flags["--max-update"] == flags["--total-num-update"] == "3000"
    assert flags["--warmup-updates"] == "30" and "--fp16" not in flags and "--cpu" in flags
    assert flags["--keep-best-checkpoints"] == "2"
    assert "overrides of the recipe" in proc.stderr and "--lr 0.0001 -> 5e-4" in proc.stderr


def test_prepare_sh_one_line_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    one_doc = tmp_path / "one.txt"
    one_doc.write_text("one .\ntwo .\nthree .\n", encoding="utf-8")
    cases = [
        (["--corpus", empty], "no text (empty corpus"),
        (["--corpus", one_doc], "no blank line between documents"),
        (["--corpus", tmp_path / "missing.txt"], "missing.txt: no such corpus file"),
        (["--corpus", one_doc, "--vocab", one_doc, "--vocab-size", "10"], "exclude each other"),
        (["--corpus", one_doc, "--max-seq-len", "x"], "--max-seq-len must be a whole number"),
    ]
    for args, message in cases:
        line = one_error_line(
            script("prepare.sh", "--work-dir", tmp_path / "w", *args, check=False)
        )
        assert message in line, line


# ------------------------------------------------------------------ end to end (CPU)

E2E_UPDATES = 300
E2E_SEQ_LEN = 24  # about one caption an instance: position and context matter early
# measured 2026-12-04 with these settings (load 10, 2 cores), two runs: 16.06 % and 15.40 % against
# frequency baselines of 10.55 % and 10.65 % on 1,052 masked tokens (the learnt vocabulary can
# differ by a tie, see pretrain_data); the checkpoints of one run: 10.6, 8.1, 14.1, 12.7, 15.3,
# 15.4 % at 86-300 updates
E2E_MARGIN = 3.0


# the run of the default tests, which check what the scripts write, not what the model learns:
# the same data and model, QUICK_UPDATES updates with a checkpoint every QUICK_INTERVAL
QUICK_UPDATES, QUICK_INTERVAL = 30, 10


def pretrain_and_evaluate(root: Path, updates: int, interval: int):
    """prepare.sh on Multi30k English (150 pseudo-documents of 20 captions), pretrain.sh of a tiny
    RealFormer BERT for ``updates`` updates (a checkpoint every ``interval``) and of a Post-LN one
    for 10 (another seed), then one evaluate.sh over both save dirs: all through the scripts."""
    captions = shared_data("multi30k", "train.en").read_text(encoding="utf-8").splitlines()[:3000]
    docs = ["\n".join(captions[i : i + 20]) for i in range(0, len(captions), 20)]
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    script("prepare.sh", "--corpus", corpus, "--work-dir", root / "work", "--vocab-size", 1000,
           "--unused", 0, "--max-seq-len", E2E_SEQ_LEN, "--valid-docs", 20)  # fmt: skip
    data_bin = root / "work" / "data-bin"
    for variant, n, seed in (("realformer", updates, 1), ("postln", 10, 2)):
        script("pretrain.sh", "--variant", variant, "--size", "tiny", "--data-bin", data_bin,
               "--save-dir", root / variant, "--cpu", "--batch-size", 32, "--update-freq", 1,
               "--max-update", n, "--warmup", max(1, n // 10), "--seed", seed, "--",
               "--lr", "0.005", "--save-interval-updates", interval, "--num-workers", 0)  # fmt: skip
    proc = script("evaluate.sh", "--data-bin", data_bin, "--checkpoint-dir", root / "realformer",
                  root / "postln", "--label", "RealFormer", "Post-LN", "--out-dir", root / "eval",
                  "--cpu")  # fmt: skip
    report = json.loads((root / "eval" / "mlm_accuracy.json").read_text(encoding="utf-8"))
    return data_bin, proc, report


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """The quick run (QUICK_UPDATES): every default test of the scripts."""
    root = tmp_path_factory.mktemp("pretrain_bert")
    return pretrain_and_evaluate(root, QUICK_UPDATES, QUICK_INTERVAL)


@pytest.fixture(scope="module")
def pretrained_for_accuracy(tmp_path_factory):
    """The accuracy run (E2E_UPDATES, a checkpoint every 100 updates)."""
    root = tmp_path_factory.mktemp("pretrain_bert_300")
    return pretrain_and_evaluate(root, E2E_UPDATES, 100)


def check_evaluate_output(data_bin, proc, report, updates: int):
    """evaluate.sh's lines (one per checkpoint, sorted by update), the JSON, the frequency
    baseline, the plot and the next commands for GLUE and SQuAD; returns the RealFormer run's
    checkpoints."""
    realformer, postln = report["runs"]
    assert (realformer["label"], postln["label"]) == ("RealFormer", "Post-LN")
    lines = [x for x in proc.stdout.splitlines() if "masked-token accuracy" in x]
    checkpoints = realformer["checkpoints"]
    assert len(lines) == len(checkpoints) + len(postln["checkpoints"]) and len(checkpoints) >= 3
    run_updates = [c["update"] for c in checkpoints]
    assert run_updates == sorted(run_updates) and run_updates[-1] == updates
    baseline = report["frequency_baseline"]
    assert baseline["piece"] == "a" and 8.0 < baseline["accuracy"] < 14.0
    assert f"{checkpoints[-1]['accuracy']:.2f} %" in proc.stdout
    best = report["best"]["checkpoint"]
    for pipeline in ("glue", "squad"):  # the model alone tells them its tokenizer and casing
        assert f"bash examples/{pipeline}/prepare.sh" in proc.stdout
        prepare = next(x for x in proc.stdout.splitlines() if f"{pipeline}/prepare.sh" in x)
        assert f"--model {best}" in prepare and "--wordpiece-vocab" not in prepare
        assert f"examples/{pipeline}/finetune.sh" in proc.stdout
    assert (data_bin.parent.parent / "eval" / "mlm_accuracy.png").stat().st_size > 1000
    return checkpoints


def test_end_to_end_writes_every_checkpoints_line_the_json_plot_and_next_commands(pretrained):
    """The quick run through the three scripts: what evaluate.sh writes and prints (the accuracy
    the model reaches is the slow test's)."""
    check_evaluate_output(*pretrained, QUICK_UPDATES)


def test_evaluate_prints_one_header_and_one_line_per_checkpoint(pretrained):
    """evaluate.sh's whole output: on stderr one header (the held-out split, its masking and the
    frequency baseline), on stdout one line per checkpoint, the best, the next commands. Before:
    fairseq's INFO lines three times per checkpoint, and matplotlib's DEBUG lines (importing
    fairseq sets the root logger to DEBUG)."""
    data_bin, proc, _ = pretrained
    root = data_bin.parent.parent
    number = r"\d+\.\d\d"
    assert re.fullmatch(
        rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d \| INFO \| pretrain_bert \| held-out split of "
        rf"{re.escape(str(data_bin))}: \d+ masked tokens scored \(masking seed 12345, fingerprint "
        rf"[0-9a-f]{{16}}; \d+ masked <s>/</s> not counted\); frequency baseline \('a' "
        rf"everywhere\) {number} %\n",
        proc.stderr,
    ), proc.stderr[:3000]
    lines = proc.stdout.splitlines()
    checkpoints = [root / "realformer" / f"checkpoint_1_{u}.pt" for u in (10, 20, 30)]
    checkpoints.append(root / "postln" / "checkpoint_1_10.pt")
    for line, path, update in zip(lines, checkpoints, (10, 20, 30, 10)):
        assert re.fullmatch(
            rf"{re.escape(str(path))} \(update {update}\): masked-token accuracy {number} % on "
            rf"\d+ held-out masked tokens, loss \d+\.\d{{3}} bits \(frequency baseline {number} %\)",
            line,
        ), line
    assert lines[4].startswith("best: ") and lines[5].startswith("next, GLUE and SQuAD")
    assert len(lines) == 12 and all(x.startswith("  bash examples/") for x in lines[6:])


@pytest.mark.slow
def test_end_to_end_accuracy_above_baseline(pretrained_for_accuracy):
    """A tiny RealFormer BERT pre-trained by the scripts beats the frequency baseline on held-out
    documents by E2E_MARGIN points (see E2E_MARGIN for the measurement), and its last checkpoint
    is the best; plus everything the quick run checks."""
    data_bin, proc, report = pretrained_for_accuracy
    checkpoints = check_evaluate_output(data_bin, proc, report, E2E_UPDATES)
    final = checkpoints[-1]["accuracy"]
    baseline = report["frequency_baseline"]
    assert final > baseline["accuracy"] + E2E_MARGIN, (final, baseline)
    assert report["best"]["checkpoint"] == checkpoints[-1]["checkpoint"]


def test_same_masked_positions_for_every_checkpoint_and_variant(pretrained):
    """One masking for every checkpoint of both variants (trained with different seeds: fairseq's
    own validation masks with the training seed), and the same one in another process; another
    masking seed gives another fingerprint (so the check can fail)."""
    from realformer_fairseq.pretraining import mlm_eval

    data_bin, _, report = pretrained
    counts = {c["n"] for run in report["runs"] for c in run["checkpoints"]}
    assert counts == {report["n_masked"]} and report["n_masked"] > 500
    again = mlm_eval.masked_heldout(str(data_bin), E2E_SEQ_LEN, seed=12345)
    other = mlm_eval.masked_heldout(str(data_bin), E2E_SEQ_LEN, seed=1)
    assert again.fingerprint == report["fingerprint"] and again.n_counted == report["n_masked"]
    assert other.fingerprint != again.fingerprint


def test_checkpoint_carries_the_tokenizer(pretrained):
    """pretrain.sh records the data-bin's WordPiece vocabulary (--bpe wordpiece) in the checkpoint:
    what a later step reads from the model."""
    from realformer_pipelines.model_info import read_model_info

    data_bin, _, report = pretrained
    info = read_model_info(report["best"]["checkpoint"])
    assert info.tokenizer == "wordpiece" and info.cased is False
    assert Path(info.vocab).read_text() == (data_bin / "vocab.txt").read_text()
    assert Path(info.dictionary).read_text() == (data_bin / "dict.txt").read_text()
    state = torch.load(report["best"]["checkpoint"], map_location="cpu", weights_only=False)
    assert state["cfg"]["bpe"]["wordpiece_uncased"] is True  # stated, not read from the vocabulary


def test_masking_is_berts_15_percent_80_10_10(pretrained):
    """fairseq's masked_lm with pretrain.sh's flags, measured on the training split: 15 % of the
    tokens predicted; of those 80 % [MASK], 10 % a random token, 10 % unchanged
    (google-research/bert create_pretraining_data.py)."""
    from realformer_fairseq.pretraining import mlm_eval

    data_bin, _, _ = pretrained
    masked = mlm_eval.masked_heldout(str(data_bin), E2E_SEQ_LEN, seed=3, subset="train")
    tokens = predicted = as_mask = unchanged = 0
    dictionary = (data_bin / "dict.txt").read_text(encoding="utf-8").split("\n")
    mask_idx = 4 + [line.split()[0] for line in dictionary if line].index("<mask>")
    for batch in masked.batches:
        real = batch["src_tokens"].ne(1)
        tokens += int(real.sum())
        sel = batch["masked"]
        predicted += int(sel.sum())
        as_mask += int((batch["src_tokens"][sel] == mask_idx).sum())
        unchanged += int((batch["src_tokens"][sel] == batch["target"][sel]).sum())
    random = predicted - as_mask - unchanged
    assert predicted > 5000
    assert abs(predicted / tokens - 0.15) < 0.01
    assert abs(as_mask / predicted - 0.80) < 0.02
    assert abs(unchanged / predicted - 0.10) < 0.015  # (+ the rare random draw of the original)
    assert abs(random / predicted - 0.10) < 0.015


def test_readme_tables_are_the_recipes():
    readme = (PIPELINE / "README.md").read_text(encoding="utf-8")
    for sub in ("table", "gpu-hours"):
        table = subprocess.run([sys.executable, str(RECIPES), sub], capture_output=True,
                               text=True, check=True).stdout.strip()  # fmt: skip
        assert table in readme, sub


def test_pretrain_sh_builds_the_variants(pretrained):
    """The checkpoints hold the variants asked for: residual attention (running sum) in every
    layer of RealFormer, none in Post-LN; BERT's LayerNorm epsilon and tanh GELU in both."""
    from realformer_fairseq.pretraining import mlm_eval

    data_bin, _, report = pretrained
    masked = mlm_eval.masked_heldout(str(data_bin), E2E_SEQ_LEN)
    for run, chained in zip(report["runs"], (True, False)):
        model, _, cfg = mlm_eval.load_model(run["checkpoints"][-1]["checkpoint"], masked)
        layers = model.encoder.sentence_encoder.layers
        assert len(layers) == 2 and cfg.model.encoder_normalize_before is False
        assert cfg.model.residual_attention == ("encoder" if chained else "none")
        from realformer_fairseq.modules.routes import RealformerMultiheadAttention

        attention = [layer.self_attn for layer in layers]
        assert all(isinstance(a, RealformerMultiheadAttention) == chained for a in attention)
        assert all(a.residual_attention_mode == "sum" for a in attention if chained)
        norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
        assert norms and all(m.eps == 1e-12 for m in norms)
        assert cfg.model.activation_fn == "gelu_accurate"
