"""SQuAD (issue 32): BERT's features with the tokenizer's character offsets, BERT's decoding, the
official evaluation's rules, the recipe against BERT's values, the span head, task and criterion.
Every expected value is written here from google-research/bert ``run_squad.py`` /
``optimization.py`` / README and the official ``evaluate-v2.0.py`` / ``evaluate-v1.1.py``
(computed by hand where a number is asserted), not read back from the code under test."""

import argparse
import collections
import functools
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import harness
import numpy as np
import pytest
import torch
from harness import fairseq_command, pipeline_module

from realformer_fairseq.squad import decoding, evaluation, features
from realformer_fairseq.squad.features import (
    Context,
    Example,
    FeatureSettings,
    SquadDataError,
    SquadSet,
)
from realformer_fairseq.tf_import.wordpiece import BertTextTokenizer

VOCAB = (
    "[PAD] [UNK] [CLS] [SEP] [MASK] the cat sat on mat . ( ) - , ! ' 1895 1943 le cafe de muller "
    "est ouvert 北 京 我 爱 天 安 门 un ##know ##n known japanese japan is in a ##s new york man "
    "went to store and bought gallon of milk"
).split() + [f"w{i}" for i in range(30)]


@pytest.fixture(scope="module")
def tokenizer():
    return BertTextTokenizer(VOCAB, lowercase=True)


def answer_pieces(tokenizer, context, answer, start):
    ctx = features.tokenize_context(context, tokenizer)
    span = features.char_span_to_pieces(ctx.offsets, start, start + len(answer))
    return ctx, span


# ------------------------------------------------------------------ offsets


@pytest.mark.parametrize(
    "context,answer,start,pieces,first",
    [
        # accents: uncased pieces are accent-stripped, the text keeps them
        ("Le café de Müller est ouvert.", "Müller", 11, ["muller"], 3),
        ("Le café de Müller est ouvert.", "café", 3, ["cafe"], 1),
        # a decomposed accent (e + U+0301) belongs to the letter before it
        ("Le cafe\u0301 est ouvert.", "cafe\u0301", 3, ["cafe"], 1),
        # CJK: one piece per character, no spaces in the text
        ("我爱北京天安门!", "北京", 2, ["北", "京"], 2),
        # several spaces inside the answer and around it
        ("The  cat   sat on  the mat.", "cat   sat", 5, ["cat", "sat"], 1),
        # punctuation split off a white-space word: run_squad.py's _improve_answer_span example
        ("The cat (1895-1943) sat.", "1895", 9, ["1895"], 3),
        # part of a word split into ## pieces: the pieces that hold its characters
        ("The unknown cat.", "known", 6, ["##know", "##n"], 2),
        # an answer at the very end of the context, final punctuation included
        ("The cat sat on the mat.", "the mat.", 15, ["the", "mat", "."], 4),
    ],
    ids=["accent", "accent-2", "decomposed", "cjk", "spaces", "punctuation", "inside-word", "end"],
)
def test_answer_characters_map_to_pieces_and_back(tokenizer, context, answer, start, pieces, first):
    """The pieces over the answer's characters, and the text between the first piece's first
    character and the last piece's last: the answer exactly (what decoding returns)."""
    assert context[start : start + len(answer)] == answer
    ctx, (lo, hi) = answer_pieces(tokenizer, context, answer, start)
    assert ctx.pieces[lo : hi + 1] == pieces and lo == first
    assert context[ctx.offsets[lo][0] : ctx.offsets[hi][1]] == answer


def test_pieces_are_those_of_run_squads_word_by_word_tokenisation(tokenizer):
    """run_squad.py splits the context on its white space (space, tab, CR, LF, U+202F) and
    tokenises each word; the whole context tokenised at once gives the same pieces."""
    contexts = [
        "Le café de Müller est ouvert.", "我爱北京天安门!", "The  cat\t(1895-1943)\nsat.",
        "un\u202fknown japanese men's store", "The unknown cat bought milk, and went!",
    ]  # fmt: skip
    for context in contexts:
        words = "".join(" " if c in " \t\r\n\u202f" else c for c in context).split()
        word_by_word = [p for word in words for p in tokenizer.pieces(word)]
        assert features.tokenize_context(context, tokenizer).pieces == word_by_word, context


def test_windows_labels_and_max_context_as_run_squad(tokenizer):
    """20 context pieces, a 2-piece question, max_seq_length 16, doc_stride 4: windows of
    16 - 2 - 3 = 11 pieces at 0, 4, 8, 12 (the last one 8 long, ending the context). An answer
    over pieces 9-12 crosses the first window's end: that window and the last are labelled
    [CLS] (0, 0), the others point at it; an answer at pieces 18-19 (the very end) is only in
    the last window, just before its </s>."""
    context = " ".join(f"w{i}" for i in range(20))
    ctx = features.tokenize_context(context, tokenizer)
    settings = FeatureSettings(max_seq_length=16, doc_stride=4, max_query_length=8)
    for (lo, hi), expected in (
        ((9, 12), [(0, 0), (9, 12), (5, 8), (0, 0)]),
        ((18, 19), [(0, 0), (0, 0), (0, 0), (10, 11)]),
    ):
        start = ctx.offsets[lo][0]
        answer = context[start : ctx.offsets[hi][1]]
        example = Example(
            "q", "w0 w1", 0, answer_text=answer, answer_span=(start, start + len(answer))
        )
        feats, tokens = features.convert_examples_to_features(
            [ctx], [example], [tokenizer.pieces("w0 w1")], settings, is_training=True
        )
        assert [(f.span_start, f.span_length) for f in feats] == [
            (0, 11),
            (4, 11),
            (8, 11),
            (12, 8),
        ]
        assert [(f.start_position, f.end_position) for f in feats] == expected
        for f, toks in zip(feats, tokens):
            assert toks[:4] == ["<s>", "w0", "w1", "</s>"] and toks[-1] == "</s>"
            assert len(toks) == f.length <= 16
            if f.start_position:
                assert toks[f.start_position : f.end_position + 1] == [
                    f"w{i}" for i in range(lo, hi + 1)
                ]
        assert tokens[3][11 + 1] == "</s>" if hi == 19 else True
    # run_squad.py's _check_is_max_context docstring example (spans A, B, C of 5 words):
    # 'bought' (word 7) has the most context in span C
    spans = [(0, 5), (3, 5), (6, 5)]
    assert [features.is_max_context(spans, i, 7) for i in range(3)] == [False, False, True]
    assert features.doc_spans(12, 5, 3) == [(0, 5), (3, 5), (6, 5), (9, 3)]


def test_roberta_layout_has_two_separators(tokenizer):
    ctx = features.tokenize_context("w0 w1 w2", tokenizer)
    settings = FeatureSettings(
        max_seq_length=16, doc_stride=4, max_query_length=8, pair_layout="roberta"
    )
    feats, tokens = features.convert_examples_to_features([ctx], [Example("q", "cat", 0)],
                                                          [["cat"]], settings, False)  # fmt: skip
    assert tokens == [["<s>", "cat", "</s>", "</s>", "w0", "w1", "w2", "</s>"]]
    assert feats[0].context_offset == 4


def squad_file(tmp_path, qas, context="The cat sat on the mat.", version="1.1"):
    data = {
        "version": version,
        "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}],
    }
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def test_training_examples_read_as_run_squad(tmp_path):
    """Impossible questions (v2.0) have no span; a question whose answer text is not in the
    words its answer_start points to is skipped (run_squad.py: "Could not find answer");
    several answers for training, a bad answer_start or a repeated id stop with one line naming
    the file and the question."""
    qas = [
        {"id": "ok", "question": "Who sat?", "answers": [{"text": "The cat", "answer_start": 0}]},
        {"id": "none", "question": "Who?", "answers": [], "is_impossible": True},
        {"id": "moved", "question": "What?", "answers": [{"text": "dog", "answer_start": 4}]},
    ]
    path = squad_file(tmp_path, qas, version="v2.0")
    contexts, examples, skipped = features.read_squad_examples(path, True, True)
    assert [e.qas_id for e in examples] == ["ok", "none"] and skipped[0]["id"] == "moved"
    assert examples[0].answer_span == (0, 7) and examples[1].is_impossible
    for bad, message in (
        ({"id": "two", "question": "?", "answers": [{"text": "cat", "answer_start": 4}] * 2},
         "question two has 2 answers"),
        ({"id": "far", "question": "?", "answers": [{"text": "cat", "answer_start": 40}]},
         "question far: answer_start 40"),
        ({"id": "ok", "question": "?", "answers": [{"text": "cat", "answer_start": 4}]},
         "question id ok appears twice"),
        ({"id": "x", "question": "?", "answers": [{"text": "cat"}]}, "question x: an answer without"),
    ):  # fmt: skip
        path = squad_file(tmp_path, qas[:1] + [bad])
        with pytest.raises(SquadDataError) as err:
            features.read_squad_examples(path, False, True)
        assert path in str(err.value) and message in str(err.value) and "\n" not in str(err.value)


def realformer_squad(*args):
    """``realformer-squad ARGS`` as a user types it (its console script)."""
    return subprocess.run([fairseq_command("realformer-squad"), *map(str, args)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)  # fmt: skip


def squad_features(tmp_path: Path, file_flag: str, path) -> subprocess.CompletedProcess:
    """``realformer-squad features FILE_FLAG PATH`` into ``tmp_path/bin`` with VOCAB as the
    model's vocab.txt and fairseq dict.txt, windows of 32 tokens."""
    model = tmp_path / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    (model / "dict.txt").write_text("".join(f"{t} 1\n" for t in VOCAB[5:]), encoding="utf-8")
    return realformer_squad("features", file_flag, path, "--dest", tmp_path / "bin", "--vocab",
                            model / "vocab.txt", "--uncased", "--max-seq-length", "32",
                            "--max-query-length", "8")  # fmt: skip


@pytest.mark.parametrize("version", ["1.1", "v2.0"])
def test_an_answer_of_no_wordpiece_is_skipped_not_labelled_no_answer(tmp_path, version):
    """A training answer that is a zero-width space covers no WordPiece (BERT's tokenizer drops
    format characters). run_squad.py skips a question whose answer it cannot recover from the
    document ("Could not find answer"); labelled, every window of it would be start = end = 0,
    [CLS], "no answer". realformer-squad features (prepare.sh's stage) skips it: counted in its
    line, the id logged and in squad.json, no window of it in the data-bin. Labels by hand:
    question 'the cat' (2 pieces): the context starts at position 1 + 2 + 1 = 4, the answer
    'the cat' is pieces 0-1, positions 4-5; the impossible v2.0 question is 0, 0."""
    context = "the cat sat on the mat \u200b ."
    qas = [
        {"id": "ok", "question": "the cat", "answers": [{"text": "the cat", "answer_start": 0}]},
        {"id": "zwsp", "question": "the cat", "answers": [{"text": "\u200b", "answer_start": 23}]},
    ]  # fmt: skip
    labels, line = [[4, 5]], "1 questions (training, 0 without answer, 1 skipped)"
    if version == "v2.0":
        qas.append({"id": "none", "question": "the cat", "answers": [], "is_impossible": True})
        labels, line = [[4, 5], [0, 0]], "2 questions (training, 1 without answer, 1 skipped)"
    assert context[23] == "\u200b"
    path = squad_file(tmp_path, qas, context=context, version=version)
    proc = squad_features(tmp_path, "--train-file", path)
    assert proc.returncode == 0, proc.stderr
    table = np.load(tmp_path / "bin" / "train.features.npy")
    assert table[:, 6:8].tolist() == labels  # one window per question, only ok's (and none's)
    assert line in proc.stderr
    (warning,) = [x for x in proc.stderr.splitlines() if "skipped, their answer" in x]
    assert "1 training question(s) skipped" in warning and warning.endswith(": zwsp")
    record = json.loads((tmp_path / "bin" / "train.record.json").read_text())
    assert [e["id"] for e in record["examples"]] == [q["id"] for q in qas if q["id"] != "zwsp"]
    settings = json.loads((tmp_path / "bin" / "squad.json").read_text())["subsets"]["train"]
    assert (settings["skipped_ids"], settings["skipped"], settings["examples"]) == (
        ["zwsp"], 1, len(labels))  # fmt: skip
    # features made without the skip: an answerable question without pieces stops
    tokenizer = BertTextTokenizer(VOCAB, lowercase=True)
    ctx = features.tokenize_context(context, tokenizer)
    example = Example("zwsp", "the cat", 0, answer_text="\u200b", answer_span=(23, 24))
    with pytest.raises(ValueError, match="question zwsp: its answer covers no piece"):
        features.convert_examples_to_features([ctx], [example], [["the", "cat"]],
                                              FeatureSettings(32, 8, 8), is_training=True)  # fmt: skip


def test_null_threshold_flags_that_would_do_nothing(tmp_path):
    """realformer-squad predict --tune-threshold picks the threshold from the scores: without
    --score it stops with one line before reading anything. On SQuAD v1.1 (no null answer)
    --tune-threshold and --null-score-diff-threshold are warned about before the prediction
    (here a missing checkpoint then stops it)."""
    proc = realformer_squad("predict", "--checkpoint", tmp_path / "c.pt", "--data-bin", tmp_path,
                            "--out-dir", tmp_path / "out", "--tune-threshold")  # fmt: skip
    assert one_error_line(proc, prog="realformer-squad") == (
        "--tune-threshold needs --score (the threshold is the official best_f1_thresh of the "
        "scores)"
    )
    qas = [{"id": "q", "question": "the cat", "answers": [{"text": "cat", "answer_start": 4}]}]
    assert squad_features(tmp_path, "--predict-file", squad_file(tmp_path, qas)).returncode == 0
    proc = realformer_squad("predict", "--checkpoint", tmp_path / "c.pt", "--data-bin",
                            tmp_path / "bin", "--out-dir", tmp_path / "out", "--score",
                            "--tune-threshold", "--null-score-diff-threshold", "-1")  # fmt: skip
    assert [line for line in proc.stderr.splitlines() if "warning" in line] == [
        "realformer-squad: warning: --tune-threshold: SQuAD v1.1 has no null threshold",
        "realformer-squad: warning: --null-score-diff-threshold: SQuAD v1.1 has no null threshold",
    ]


def test_a_truncated_token_file_is_one_line_of_the_squad_error(tmp_path):
    """The data-bin check uses the pipelines' truncated-.bin check (realformer_pipelines.checks)
    and raises it as the SQuAD error, which fairseq's commands turn into one line."""
    from realformer_fairseq.squad import data_bin

    qas = [{"id": "q", "question": "the cat", "answers": [{"text": "cat", "answer_start": 4}]}]
    assert squad_features(tmp_path, "--predict-file", squad_file(tmp_path, qas)).returncode == 0
    assert data_bin.check_data_bin(str(tmp_path / "bin"), ["valid"])["squad_version"] == "1.1"
    tokens = tmp_path / "bin" / "valid.bin"
    size = tokens.stat().st_size
    tokens.write_bytes(tokens.read_bytes()[:-2])
    with pytest.raises(SquadDataError) as err:
        data_bin.check_data_bin(str(tmp_path / "bin"), ["valid"])
    assert str(err.value) == (
        f"{tokens}: truncated ({size - 2} bytes, its index valid.idx needs {size}); binarize "
        "again (prepare.sh --force)"
    )


# ------------------------------------------------------------------ decoding


def toy_set(tokenizer):
    """'the cat sat on the mat' (6 pieces), question 'cat', max_seq_length 8: windows (0, 4)
    and (2, 4), context at positions 3-6. Max context: pieces 0-2 in window 0, 3-5 in window 1."""
    ctx = features.tokenize_context("the cat sat on the mat", tokenizer)
    settings = FeatureSettings(max_seq_length=8, doc_stride=2, max_query_length=4)
    example = Example("q1", "cat", 0)
    feats, tokens = features.convert_examples_to_features(
        [ctx], [example], [["cat"]], settings, False
    )
    assert [(f.span_start, f.span_length, f.context_offset) for f in feats] == [
        (0, 4, 3),
        (2, 4, 3),
    ]
    return SquadSet([ctx], [example], feats, tokens, [], True, False)


# start / end logits per window (positions 0-7: <s> cat </s> p p p p </s>)
TOY_LOGITS = {
    0: ([1.0, 0, 0, 2.0, 0, 5.0, 4.0, 0], [1.0, 0, 0, 0, 0, 3.0, 6.0, 0]),
    1: ([0.5, 0, 0, 7.0, 0, 1.0, 0, 0], [0.5, 0, 0, 0, 0, 2.0, 1.0, 0]),
}


def test_decoding_as_run_squads_write_predictions(tokenizer):
    """n_best_size 2, worked by hand: window 0's best starts are positions 5 (piece 2, 'sat')
    and 6 (piece 3, whose max-context window is 1: out), ends 6 and 5: 'sat on' 5+6=11 and
    'sat' 5+3=8; window 1's starts 3 (piece 2: max context in window 0, out) and 5 (piece 4),
    ends 5 and 6: 'the' 1+2=3, 'the mat' 1+1=2. The null score is the smallest [CLS] sum over
    windows, window 1's 0.5+0.5=1. n-best: 'sat on', 'sat', then '' appended; null odds
    1 - 11 = -10."""
    squad_set = toy_set(tokenizer)
    preds, nbest, odds = decoding.decode(squad_set, TOY_LOGITS, n_best_size=2, max_answer_length=30)
    assert preds == {"q1": "sat on"} and odds == {"q1": -10.0}
    assert [(e["text"], e["start_logit"], e["end_logit"]) for e in nbest["q1"]] == [
        ("sat on", 5.0, 6.0), ("sat", 5.0, 3.0), ("", 0.5, 0.5)]  # fmt: skip
    z = math.exp(11) + math.exp(8) + math.exp(1)
    assert [e["probability"] for e in nbest["q1"]] == pytest.approx(
        [math.exp(11) / z, math.exp(8) / z, math.exp(1) / z])  # fmt: skip
    # "" when null - best > threshold: -10 > -10.5
    preds, _, _ = decoding.decode(
        squad_set, TOY_LOGITS, n_best_size=2, null_score_diff_threshold=-10.5
    )
    assert preds == {"q1": ""}
    # max_answer_length 1: 'sat on' (2 pieces) is out, 'sat' wins, null odds 1 - 8
    preds, nbest, odds = decoding.decode(squad_set, TOY_LOGITS, n_best_size=2, max_answer_length=1)
    assert preds == {"q1": "sat"} and odds == {"q1": -7.0}
    assert [e["text"] for e in nbest["q1"]] == ["sat", "the", ""]
    # SQuAD v1.1: no null answer, no null odds
    preds, nbest, odds = decoding.decode(
        squad_set, TOY_LOGITS, n_best_size=2, version_2_with_negative=False
    )
    assert preds == {"q1": "sat on"} and odds == {} and len(nbest["q1"]) == 2
    # the text is the context's, with its spacing and case
    squad_set.contexts[0] = Context("The  CAT sat on  the mat", squad_set.contexts[0].pieces,
                                    features.tokenize_context("The  CAT sat on  the mat", tokenizer).offsets)  # fmt: skip
    preds, _, _ = decoding.decode(
        squad_set, TOY_LOGITS, n_best_size=2, version_2_with_negative=False
    )
    assert preds == {"q1": "sat on"}
    logits = {0: ([0, 0, 0, 9.0, 0, 0, 0, 0], [0, 0, 0, 0, 9.0, 0, 0, 0]), 1: TOY_LOGITS[1]}
    preds, _, _ = decoding.decode(squad_set, logits, n_best_size=1, version_2_with_negative=False)
    assert preds == {"q1": "The  CAT"}


# ------------------------------------------------------------------ the official evaluation

# five questions (v2.0) with their scores worked by hand from evaluate-v2.0.py's rules
V2_DATA = [{"paragraphs": [{"context": "...", "qas": [
    {"id": "q1", "answers": [{"text": "The Eiffel Tower"}, {"text": "Eiffel Tower"}]},
    {"id": "q2", "answers": [{"text": "Paris, France"}]},
    {"id": "q3", "answers": []},
    {"id": "q4", "answers": []},
    {"id": "q5", "answers": [{"text": "the"}, {"text": "A dog!"}]},
]}]}]  # fmt: skip
V2_PREDS = {"q1": "the eiffel tower.", "q2": "in Paris", "q3": "", "q4": "London", "q5": "dog"}
V2_NA = {"q1": 0.1, "q5": 0.2, "q2": 0.25, "q4": 0.3, "q3": 0.9}


def test_official_rules_on_hand_computed_values():
    """q1: articles and punctuation normalised away (1, 1); q2: 'in paris' vs 'paris france'
    share one word: P = R = 1/2, F1 0.5; q3: unanswerable, '' (1, 1); q4: unanswerable, an
    answer (0, 0); q5: the gold 'the' normalises to nothing and is dropped, 'A dog!' -> 'dog'
    (1, 1). Exact 3/5, F1 3.5/5; HasAns 2/3 and 2.5/3, NoAns 1/2."""
    out = evaluation.evaluate(V2_DATA, V2_PREDS)
    assert list(out) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                         "NoAns_exact", "NoAns_f1", "NoAns_total"]  # fmt: skip
    assert out["exact"] == pytest.approx(60.0) and out["f1"] == pytest.approx(70.0)
    assert out["HasAns_exact"] == pytest.approx(200 / 3) and out["HasAns_f1"] == pytest.approx(
        250 / 3
    )
    assert out["NoAns_exact"] == pytest.approx(50.0) and out["NoAns_total"] == 2
    assert evaluation.normalize_answer("  The Eiffel-Tower, a  landmark!") == "eiffeltower landmark"
    assert evaluation.compute_f1("the cat the cat", "cat cat dog") == pytest.approx(0.8)


def test_no_answer_threshold_and_best_thresholds():
    """--na-prob-thresh 0.2: q2 (0.25) and q4 (0.3) and q3 (0.9) are scored as '': q2 0, q4 1,
    q3 1: exact = F1 = 4/5. best thresholds: start at 2 (the unanswerable questions), by
    increasing value q1 +1 (0.1), q5 +1 (0.2: 4), q2 exact +0 / F1 +0.5 (0.25: 4.5), q4 -1,
    q3 0: best_exact 4/5 at 0.2, best_f1 4.5/5 at 0.25."""
    out = evaluation.evaluate(V2_DATA, V2_PREDS, V2_NA, na_prob_thresh=0.2)
    assert out["exact"] == pytest.approx(80.0) and out["f1"] == pytest.approx(80.0)
    assert out["NoAns_exact"] == pytest.approx(100.0) and out["HasAns_f1"] == pytest.approx(200 / 3)
    assert (out["best_exact"], out["best_exact_thresh"]) == (pytest.approx(80.0), 0.2)
    assert (out["best_f1"], out["best_f1_thresh"]) == (pytest.approx(90.0), 0.25)
    assert list(out)[-4:] == ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]


def v11_script_scores(dataset, predictions):
    """evaluate-v1.1.py's rules, written out independently: exact_match and F1 (no special
    case for empty answers) as the maximum over every gold answer, in percent."""
    import re
    import string

    def norm(s):
        s = "".join(c for c in s.lower() if c not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

    def f1(pred, gold):
        p, g = norm(pred).split(), norm(gold).split()
        same = sum((collections.Counter(p) & collections.Counter(g)).values())
        return (
            0
            if same == 0
            else 2 * (same / len(p)) * (same / len(g)) / (same / len(p) + same / len(g))
        )

    em = f = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                golds = [a["text"] for a in qa["answers"]]
                em += max(norm(predictions[qa["id"]]) == norm(g) for g in golds)
                f += max(f1(predictions[qa["id"]], g) for g in golds)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f / total}


def test_v11_data_scores_equal_the_v11_script():
    """SQuAD v1.1-style questions with several gold answers: exact / f1 equal evaluate-v1.1.py's
    exact_match / f1. By hand: q1 'Broncos' matches 'The Broncos' (1, 1); q2 'Levi's Stadium in
    Santa Clara' vs 'Santa Clara, California': 2 common words, P 2/5, R 2/3, F1 1/2 (0, 0.5);
    q3 'Carolina Panthers' vs 'the Panthers' / 'Carolina Panthers' (1, 1)."""
    data = [{"paragraphs": [{"context": "...", "qas": [
        {"id": "q1", "answers": [{"text": "Denver Broncos"}, {"text": "Denver Broncos"}, {"text": "The Broncos"}]},
        {"id": "q2", "answers": [{"text": "Santa Clara, California"}]},
        {"id": "q3", "answers": [{"text": "the Panthers"}, {"text": "Carolina Panthers"}]},
    ]}]}]  # fmt: skip
    preds = {"q1": "Broncos", "q2": "Levi's Stadium in Santa Clara", "q3": "Carolina  Panthers"}
    ours = evaluation.evaluate(data, preds)
    theirs = v11_script_scores(data, preds)
    assert theirs == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(250 / 3)}
    assert ours["exact"] == pytest.approx(theirs["exact_match"]) and ours["f1"] == pytest.approx(
        theirs["f1"]
    )
    assert "NoAns_total" not in ours and ours["HasAns_total"] == 3


def run_eval(*args):
    """The console command as users type it."""
    exe = Path(sys.executable).parent / "realformer-squad-eval"
    return subprocess.run([str(exe), *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip


def eval_in_process(capsys, *args):
    """realformer-squad-eval's main in this process: (exit status, stdout, stderr)."""
    from realformer_fairseq.cli import squad_eval

    capsys.readouterr()
    try:
        code = squad_eval.main([str(a) for a in args])
    except SystemExit as err:
        code = err.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def test_squad_eval_command_prints_one_json_line(tmp_path, capsys):
    """realformer-squad-eval DATA PRED --na-prob-file NA: one JSON line with the official keys
    (the values of the test above); a missing prediction, a file that is not JSON: one line
    naming the file (and the question)."""
    data = tmp_path / "dev.json"
    data.write_text(json.dumps({"version": "v2.0", "data": V2_DATA}))
    pred = tmp_path / "pred.json"
    pred.write_text(json.dumps(V2_PREDS))
    na = tmp_path / "na.json"
    na.write_text(json.dumps(V2_NA))
    proc = run_eval(data, pred, "--na-prob-file", na, "--na-prob-thresh", "0.2",
                    "--out-file", tmp_path / "e.json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert (
        out["exact"] == pytest.approx(80.0) and out["best_f1_thresh"] == 0.25 and out["total"] == 5
    )
    assert json.loads((tmp_path / "e.json").read_text()) == out
    pred.write_text(json.dumps({k: v for k, v in V2_PREDS.items() if k != "q4"}))
    proc = eval_in_process(capsys, data, pred)
    assert one_error_line(proc) == f"{pred}: no prediction for question q4 of {data}"
    pred.write_text("{not json")
    assert one_error_line(eval_in_process(capsys, data, pred)).startswith(
        f"{pred}: not a JSON prediction file"
    )


one_error_line = functools.partial(harness.one_error_line, prog="realformer-squad-eval")


# ------------------------------------------------------------------ the recipe


@pytest.mark.parametrize("version,examples,batch,updates,warmup", [
    # SQuAD v1.1 train has 87,599 questions, v2.0 130,319; README.md's Cloud TPU commands:
    # --train_batch_size=24 (v1.1 and v2.0); run_squad.py: int(n / batch * 2.0), int(0.1 * steps)
    ("1.1", 87599, 24, 7299, 729),
    ("2.0", 130319, 24, 10859, 1085),
])  # fmt: skip
def test_recipe_is_berts(version, examples, batch, updates, warmup):
    squad_recipe = pipeline_module("squad", "recipes")

    flags = {f: v for f, v, _ in squad_recipe.recipe(version, examples)}
    assert flags["--batch-size"] == str(batch)
    assert (flags["--max-update"], flags["--total-num-update"], flags["--warmup-updates"]) == (
        str(updates), str(updates), str(warmup))  # fmt: skip
    bert = {"--lr": 3e-5, "--adam-eps": 1e-6, "--weight-decay": 0.01, "--clip-norm": 1.0,
            "--end-learning-rate": 0.0, "--power": 1.0}  # fmt: skip
    for flag, value in bert.items():
        assert float(flags[flag]) == value, flag
    assert flags["--adam-betas"] == "(0.9,0.999)" and flags["--optimizer"] == "adam"
    assert flags["--lr-scheduler"] == "polynomial_decay" and flags["--criterion"] == "squad_span"
    assert "--disable-validation" in flags and flags["--required-batch-size-multiple"] == "1"
    assert (
        squad_recipe.MAX_SEQ_LENGTH,
        squad_recipe.DOC_STRIDE,
        squad_recipe.MAX_QUERY_LENGTH,
    ) == (384, 128, 64)
    assert (squad_recipe.N_BEST_SIZE, squad_recipe.MAX_ANSWER_LENGTH) == (20, 30)
    assert squad_recipe.NULL_SCORE_DIFF_THRESHOLD == 0.0 and squad_recipe.EPOCHS == 2.0
    for flag, value, source in squad_recipe.recipe(version, examples):
        assert source, flag


# google-research/bert's lines that recipes.py cites, as in commit eedf571 (FILE:LINE:text)
BERT_LINES = Path(__file__).parent / "data" / "google_research_bert_eedf571.txt"
CITATION = re.compile(r"(README\.md|run_squad\.py|optimization\.py)?:(\d+)(?:-(\d+))?")
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?")


def pinned_bert_lines():
    pinned = {}
    for line in BERT_LINES.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            name, number, text = line.split(":", 2)
            pinned[name, int(number)] = text
    return pinned


def cited_lines(source):
    """(file, line) of every line a recipe source cites (``:N`` alone: the file cited before)."""
    cited, name = [], None
    for m in CITATION.finditer(source):
        name = m.group(1) or name
        first = int(m.group(2))
        cited += [(name, n) for n in range(first, int(m.group(3) or first) + 1)]
    return cited


def recipe_entries():
    squad_recipe = pipeline_module("squad", "recipes")
    return [(flag, value, source) for version in ("1.1", "2.0")
            for flag, value, source in squad_recipe.recipe(version)] + [
        (flag, value, source) for flag, value, source in squad_recipe.FEATURES + squad_recipe.DECODING
    ]  # fmt: skip


def test_recipe_values_are_in_the_lines_they_cite():
    """Every number of a recipe value is in the google-research/bert lines its source cites, as
    pinned in tests/data (their text at commit eedf571, not the recipe's own table); every cited
    line is pinned."""
    pinned = pinned_bert_lines()
    checked = set()
    for flag, value, source in recipe_entries():
        lines = cited_lines(source)
        missing = [f"{name}:{n}" for name, n in lines if (name, n) not in pinned]
        assert not missing, f"{flag}: {source} cites lines not pinned in {BERT_LINES}: {missing}"
        numbers = NUMBER.findall(value or "")
        if not lines or not numbers or NUMBER.sub("", value).strip("(), "):
            continue  # no citation, a name, or a formula
        found = {float(x) for key in lines for x in NUMBER.findall(pinned[key])}
        assert {float(x) for x in numbers} <= found, (flag, value, [pinned[k] for k in lines])
        checked.add(flag)
    assert checked == {
        "--batch-size", "--adam-betas", "--adam-eps", "--weight-decay", "--clip-norm", "--lr",
        "--end-learning-rate", "--power", "--max-seq-length", "--doc-stride", "--max-query-length",
        "--n-best-size", "--max-answer-length", "--null-score-diff-threshold",
    }  # fmt: skip


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_both_versions_take_bert_readmes_cloud_tpu_command(version):
    """The batch, learning rate and epochs of each version are cited from one README.md command:
    the Cloud TPU one that trains on that version's file (the README's v2.0 command is a TPU
    one; its v1.1 GPU command, batch 12, is not used)."""
    pinned = pinned_bert_lines()
    sources = {
        flag: source for flag, _, source in pipeline_module("squad", "recipes").recipe(version)
    }
    readme = [n for flag in ("--batch-size", "--lr", "--total-num-update")
              for name, n in cited_lines(sources[flag]) if name == "README.md"]  # fmt: skip
    assert len(readme) == 3
    first = last = readme[0]  # the command: the lines that continue with a backslash
    while pinned.get(("README.md", first - 1), "").endswith("\\"):
        first -= 1
    while pinned[("README.md", last)].endswith("\\"):
        last += 1
    command = [pinned["README.md", n] for n in range(first, last + 1)]
    assert command[0] == "python run_squad.py \\" and set(readme) <= set(range(first, last + 1))
    assert f"  --train_file=$SQUAD_DIR/train-v{version}.json \\" in command
    assert "  --use_tpu=True \\" in command
    assert [pinned["README.md", n] for n in readme] == [
        "  --train_batch_size=24 \\", "  --learning_rate=3e-5 \\", "  --num_train_epochs=2.0 \\"]  # fmt: skip


# ------------------------------------------------------------------ span head and criterion


def test_span_head_loss_is_run_squads(tmp_path):
    """The criterion's loss is run_squad.py's (start loss + end loss) / 2, each
    -mean(sum(one_hot * log_softmax)) (here summed over the batch, as fairseq divides by the
    sample size), with padding left out of the softmax."""
    from realformer_fairseq.criterions.squad_span import SquadSpanCriterion
    from realformer_fairseq.modules.span_head import SpanHead

    torch.manual_seed(0)
    head = SpanHead(8)
    assert head.out_proj.weight.abs().max() <= 0.04 and head.out_proj.bias.abs().sum() == 0
    features_ = torch.randn(2, 5, 8)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    start, end = head(features_, padding)
    assert torch.isinf(start[1, 3:]).all() and torch.isfinite(start[0]).all()

    class Model:
        def __call__(self, src_tokens, src_lengths, span_head_name):
            assert span_head_name == "squad_span"
            return (start, end), {}

    class Task:
        class cfg:
            span_head_name = "squad_span"

    criterion = SquadSpanCriterion(Task())
    target = torch.tensor([[1, 3], [0, 2]])
    sample = {
        "net_input": {"src_tokens": None, "src_lengths": None},
        "target": target,
        "ntokens": 8,
    }
    loss, size, log = criterion(Model(), sample)
    logits = head.out_proj(features_)
    expected = 0.0
    for b, n in ((0, 5), (1, 3)):
        for k in (0, 1):
            expected -= torch.log_softmax(logits[b, :n, k], -1)[target[b, k]] / 2
    assert size == 2 and float(loss) == pytest.approx(float(expected), rel=1e-6)


# ------------------------------------------------------------------ the model: span heads


@pytest.fixture(scope="module")
def tiny_squad(tmp_path_factory):
    """The TF fixture imported (a model written by Google's realformer.py code, 64 positions,
    uncased 71-token vocabulary) and a small SQuAD v2.0 data-bin of its vocabulary."""
    from harness import realformer_tf_fixture

    from realformer_fairseq.cli import squad as squad_cli
    from realformer_fairseq.tf_import.bert_checkpoint import convert_checkpoint

    root = tmp_path_factory.mktemp("tiny_squad")
    convert_checkpoint(str(realformer_tf_fixture("model.ckpt")), str(realformer_tf_fixture("bert_config.json")),
                       str(realformer_tf_fixture("vocab.txt")), str(root / "model"))  # fmt: skip
    context = "the cat sat on the mat . she read the book ."
    qas = [
        {"id": "a", "question": "who sat?", "answers": [{"text": "the cat", "answer_start": 0}],
         "is_impossible": False},
        {"id": "b", "question": "the fox?", "answers": [], "is_impossible": True},
    ]  # fmt: skip
    data = {
        "version": "v2.0",
        "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}],
    }
    (root / "train.json").write_text(json.dumps(data))
    assert squad_cli.main(["features", "--train-file", str(root / "train.json"), "--predict-file",
                           str(root / "train.json"), "--dest", str(root / "bin"), "--vocab",
                           str(root / "model" / "vocab.txt"), "--max-seq-length", "32",
                           "--doc-stride", "8", "--max-query-length", "8"]) == 0  # fmt: skip
    return root


def squad_model(root):
    """The imported model built by task squad (span head registered), weights from model.pt."""
    from fairseq import checkpoint_utils, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import open_dict

    state = checkpoint_utils.load_checkpoint_to_cpu(str(root / "model" / "model.pt"))
    cfg = state["cfg"]
    with open_dict(cfg):
        cfg.task = convert_namespace_to_omegaconf(
            argparse.Namespace(task="squad", data=str(root / "bin"))
        ).task
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return model, task, state


def test_span_head_is_kept_like_fairseqs_classification_heads(tiny_squad):
    """As fairseq 0.12.3's RobertaModel.upgrade_state_dict_named treats classification heads:
    a head the checkpoint lacks keeps its fresh values (fine-tuning from a pre-trained model), a
    checkpoint's head is loaded where the model has it, and dropped (with a warning) where it
    has not unless load_checkpoint_heads (the hub) registers it. A model without span heads has
    the state dict it had before."""
    import copy

    model, task, state = squad_model(tiny_squad)
    fresh = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("span_heads.")}
    assert sorted(fresh) == [
        "span_heads.squad_span.out_proj.bias",
        "span_heads.squad_span.out_proj.weight",
    ]
    pretrained = copy.deepcopy(state["model"])
    assert not any(k.startswith("span_heads.") for k in pretrained)
    # fairseq's own path, side by side: a new classification head is filled in the same way
    model.register_classification_head("probe", num_classes=2)
    model.upgrade_state_dict_named(pretrained, "")
    model.load_state_dict(pretrained, strict=True)
    for k, v in fresh.items():
        assert torch.equal(model.state_dict()[k], v), k
    assert "classification_heads.probe.out_proj.weight" in pretrained
    # a checkpoint with the head: loaded as it is
    trained = copy.deepcopy(model.state_dict())
    trained["span_heads.squad_span.out_proj.weight"] += 1.0
    other, _, _ = squad_model(tiny_squad)
    other.register_classification_head("probe", num_classes=2)
    other.upgrade_state_dict_named(trained, "")
    other.load_state_dict(trained, strict=True)
    assert torch.equal(other.span_heads.squad_span.out_proj.weight,
                       fresh["span_heads.squad_span.out_proj.weight"] + 1.0)  # fmt: skip
    # into a model without that head: dropped, or registered with load_checkpoint_heads
    del other.span_heads["squad_span"]
    dropped = copy.deepcopy(trained)
    other.upgrade_state_dict_named(dropped, "")
    assert not any(k.startswith("span_heads.") for k in dropped)
    other.args.load_checkpoint_heads = True
    kept = copy.deepcopy(trained)
    other.upgrade_state_dict_named(kept, "")
    other.load_state_dict(kept, strict=True)
    assert torch.equal(
        other.span_heads.squad_span.out_proj.weight,
        trained["span_heads.squad_span.out_proj.weight"],
    )


def test_squad_task_refuses_what_contradicts_the_data_bin(tiny_squad):
    """An explicit task flag that contradicts the data-bin, and a data-bin whose windows are
    longer than the model's positions: one line each."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from realformer_fairseq.errors import RealformerConfigError

    args = argparse.Namespace(task="squad", data=str(tiny_squad / "bin"), casing="cased")
    with pytest.raises(RealformerConfigError) as err:
        tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    assert (
        str(err.value)
        == f"--casing cased (given, or a fine-tuned checkpoint's): the SQuAD data-bin "
        f"{tiny_squad / 'bin'} was made with uncased"
    )
    settings = json.loads((tiny_squad / "bin" / "squad.json").read_text())
    assert settings["max_seq_length"] == 32 and settings["casing"] == "uncased"
