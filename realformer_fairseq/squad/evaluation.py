"""The official SQuAD evaluation (Rajpurkar, Jia, Liang 2018, ``evaluate-v2.0.py``, the script
google-research/bert's README and the SQuAD leaderboard use), as a library.

Rules of the v2.0 script, reproduced here:

* an answer is normalised by lower-casing, removing every character of
  ``string.punctuation``, the words ``a``, ``an``, ``the`` and extra white space, in that order;
* exact match and F1 (over the normalised words, with multiplicity) of a prediction are the
  maximum over the question's gold answers whose normalised text is not empty; a question
  without such an answer (v2.0: unanswerable) has the one gold answer ``""``; F1 against an
  empty answer is 1 if both are empty, else 0;
* with no-answer probabilities (``na_probs``, BERT's ``null_odds.json``), a question whose
  value exceeds ``na_prob_thresh`` (1.0 by default) is scored as answered ``""``;
* ``HasAns_*`` / ``NoAns_*``: the same over the answerable / unanswerable questions;
  ``best_exact`` / ``best_f1`` and their thresholds: the best score over thresholds at the
  no-answer values (``find_best_thresh``: questions by increasing value, a tie kept in the
  order of the probability file, the threshold starting at 0.0 with every question answered
  ``""``).

The official v1.1 script (``evaluate-v1.1.py``) reports ``exact_match`` / ``f1`` with the same
normalisation and maxima; on v1.1 data its numbers equal ``exact`` / ``f1`` here when every
question is predicted and no gold answer normalises to nothing (the v1.1 script keeps such an
answer, against which only an empty prediction scores; SQuAD v1.1's files have none). A
prediction file that misses a question is refused here (the v2.0 script prints "Missing
prediction" and then fails on that question's ``HasAns``/``NoAns`` sum; the v1.1 script
scores it 0).
"""

import collections
import re
import string
from typing import List, Mapping, Optional

from ..errors import RealformerConfigError

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


class SquadEvalError(RealformerConfigError):
    """A data or prediction file that cannot be scored; the message names the file (and the
    question)."""


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra white space (the official rule)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def answer_tokens(s: str) -> List[str]:
    return normalize_answer(s).split() if s else []


def compute_exact(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def compute_f1(gold: str, pred: str) -> float:
    gold_tokens, pred_tokens = answer_tokens(gold), answer_tokens(pred)
    if not gold_tokens or not pred_tokens:
        return float(gold_tokens == pred_tokens)
    same = sum((collections.Counter(gold_tokens) & collections.Counter(pred_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_answers(dataset: list, path: str = "data") -> "collections.OrderedDict[str, List[str]]":
    """Question id -> the texts of its answers, in file order (the ``data`` list of a SQuAD
    file); one line naming the file and the question for a malformed entry."""
    out: "collections.OrderedDict[str, List[str]]" = collections.OrderedDict()
    if not isinstance(dataset, list):
        raise SquadEvalError(f"{path}: not a SQuAD file (no 'data' list at the top)")
    for a, article in enumerate(dataset):
        for p, paragraph in enumerate((article or {}).get("paragraphs", None) or []):
            for qa in (paragraph or {}).get("qas", None) or []:
                qid = qa.get("id") if isinstance(qa, dict) else None
                if not isinstance(qid, str):
                    raise SquadEvalError(
                        f"{path}: article {a} paragraph {p}: a question without an id"
                    )
                answers = qa.get("answers", [])
                if not isinstance(answers, list) or not all(
                    isinstance(x, dict) and isinstance(x.get("text"), str) for x in answers
                ):
                    raise SquadEvalError(
                        f"{path}: question {qid}: 'answers' is not a list of texts"
                    )
                if qid in out:
                    raise SquadEvalError(f"{path}: question id {qid} appears twice")
                out[qid] = [x["text"] for x in answers]
    if not out:
        raise SquadEvalError(f"{path}: no questions")
    return out


def raw_scores(golds: Mapping[str, List[str]], preds: Mapping[str, str]):
    exact, f1 = {}, {}
    for qid, answers in golds.items():
        texts = [a for a in answers if normalize_answer(a)] or [""]
        pred = preds[qid]
        exact[qid] = max(compute_exact(a, pred) for a in texts)
        f1[qid] = max(compute_f1(a, pred) for a in texts)
    return exact, f1


def apply_no_ans_threshold(scores, na_probs, has_ans, thresh):
    return {
        qid: float(not has_ans[qid]) if na_probs[qid] > thresh else s for qid, s in scores.items()
    }


def eval_dict(exact, f1, qids: Optional[List[str]] = None):
    qids = list(exact) if qids is None else qids
    total = len(qids)
    return collections.OrderedDict(
        [("exact", 100.0 * sum(exact[k] for k in qids) / total),
         ("f1", 100.0 * sum(f1[k] for k in qids) / total), ("total", total)]
    )  # fmt: skip


def find_best_thresh(preds, scores, na_probs, has_ans):
    """The official ``find_best_thresh``: (best score in percent, its threshold)."""
    score = best = sum(1 for k in has_ans if not has_ans[k])
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        score += diff
        if score > best:
            best, best_thresh = score, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def evaluate(
    dataset: list,
    preds: Mapping[str, str],
    na_probs: Optional[Mapping[str, float]] = None,
    na_prob_thresh: float = 1.0,
    data_path: str = "data",
    pred_path: str = "predictions",
    na_prob_path: str = "na_probs",
) -> "collections.OrderedDict[str, float]":
    """The official v2.0 script's output dictionary, same keys in the same order."""
    golds = gold_answers(dataset, data_path)
    if not isinstance(preds, Mapping):
        raise SquadEvalError(f"{pred_path}: not a JSON object of question id -> answer text")
    for qid in golds:
        if qid not in preds:
            raise SquadEvalError(f"{pred_path}: no prediction for question {qid} of {data_path}")
        if not isinstance(preds[qid], str):
            raise SquadEvalError(f"{pred_path}: the prediction for question {qid} is not a text")
    with_probs = na_probs is not None
    if with_probs:
        if not isinstance(na_probs, Mapping):
            raise SquadEvalError(f"{na_prob_path}: not a JSON object of question id -> number")
        for qid in golds:
            value = na_probs.get(qid)
            if value is None:
                raise SquadEvalError(f"{na_prob_path}: no value for question {qid} of {data_path}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SquadEvalError(f"{na_prob_path}: the value of question {qid} is not a number")
    else:
        na_probs = {k: 0.0 for k in preds}
    has_ans = {qid: bool(answers) for qid, answers in golds.items()}
    has_ans_qids = [k for k, v in has_ans.items() if v]
    no_ans_qids = [k for k, v in has_ans.items() if not v]
    exact_raw, f1_raw = raw_scores(golds, preds)
    exact = apply_no_ans_threshold(exact_raw, na_probs, has_ans, na_prob_thresh)
    f1 = apply_no_ans_threshold(f1_raw, na_probs, has_ans, na_prob_thresh)
    out = eval_dict(exact, f1)
    for prefix, qids in (("HasAns", has_ans_qids), ("NoAns", no_ans_qids)):
        if qids:
            for key, value in eval_dict(exact, f1, qids).items():
                out[f"{prefix}_{key}"] = value
    if with_probs:
        # the official script iterates every entry of the probability file
        probs = {k: v for k, v in na_probs.items() if k in has_ans}
        out["best_exact"], out["best_exact_thresh"] = find_best_thresh(
            preds, exact_raw, probs, has_ans
        )
        out["best_f1"], out["best_f1_thresh"] = find_best_thresh(preds, f1_raw, probs, has_ans)
    return out
