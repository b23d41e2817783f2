"""Answers from start / end logits, as google-research/bert ``run_squad.py``'s
``write_predictions`` makes them (RealFormer, He et al. 2020, arXiv 2012.11747, fine-tunes and
decodes SQuAD with BERT's procedure).

For every question, over all its windows: the ``n_best_size`` (20) highest start and end
logits of each window; a pair is a candidate if both ends lie in the window's context, the
start is in its max-context window, ``end >= start`` and it spans at most
``max_answer_length`` (30) pieces; candidates are ranked by ``start + end`` logit, the first
``n_best_size`` distinct answer texts are the n-best list (probabilities: softmax of the
scores). SQuAD v2.0: the null score is ``start[0] + end[0]`` (``[CLS]``) of the window where
it is *smallest* (run_squad.py: ``score_null = min``), the null answer ``""`` joins the list,
and the question is answered ``""`` when ``null - best non-null > null_score_diff_threshold``
(0.0 by default); that difference is the question's entry of ``null_odds.json``.

The answer text is the original context from the first piece's first character to the last
piece's last (:mod:`.features`), not ``get_final_text``'s re-alignment of detokenised pieces.
Ties keep run_squad.py's order (Python's stable sorts on the same lists).

Where run_squad.py has no answer, these choose: a v1.1 question without any valid span gets
run_squad.py's nonce text ``"empty"``; a v2.0 question without one (run_squad.py would fail
on ``best_non_null_entry.start_logit``) is answered ``""`` with null odds
:data:`NO_SPAN_NULL_ODDS`.
"""

import collections
import math
from typing import List, Mapping, Sequence, Tuple

from .features import SquadSet, is_max_context

NO_SPAN_NULL_ODDS = 1e6  # run_squad.py's "large and positive" starting null score


def best_indexes(logits: Sequence[float], n_best_size: int) -> List[int]:
    """run_squad.py's ``_get_best_indexes`` (stable: among equal logits, the earlier first)."""
    ranked = sorted(enumerate(logits), key=lambda x: x[1], reverse=True)
    return [i for i, _ in ranked[:n_best_size]]


def softmax(scores: Sequence[float]) -> List[float]:
    """run_squad.py's ``_compute_softmax``."""
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


Prelim = collections.namedtuple(
    "Prelim", ["feature_index", "start_index", "end_index", "start_logit", "end_logit"]
)
Nbest = collections.namedtuple("Nbest", ["text", "start_logit", "end_logit", "offsets"])


def decode(
    squad_set: SquadSet,
    logits: Mapping[int, Tuple[Sequence[float], Sequence[float]]],
    n_best_size: int = 20,
    max_answer_length: int = 30,
    null_score_diff_threshold: float = 0.0,
    version_2_with_negative: bool = None,
    with_offsets: bool = False,
):
    """``(predictions, nbest, null_odds)``, ordered like the examples, from the start and end
    logits of every feature (``logits[i]``: feature ``i``'s, one per token of its sequence,
    padding excluded). ``null_odds`` is empty for v1.1. ``with_offsets``: each n-best entry also
    has ``offsets``, the answer's ``[start, end)`` characters in the context (None for "")."""
    if version_2_with_negative is None:
        version_2_with_negative = squad_set.version_2_with_negative
    predictions = collections.OrderedDict()
    all_nbest = collections.OrderedDict()
    null_odds = collections.OrderedDict()
    windows = squad_set.windows_of()
    for example_index, example in enumerate(squad_set.examples):
        context = squad_set.contexts[example.context_index]
        feature_ids = windows.get(example_index, [])
        spans = [(squad_set.features[i].span_start, squad_set.features[i].span_length)
                 for i in feature_ids]  # fmt: skip
        prelim: List[Prelim] = []
        score_null = 1000000.0  # large and positive
        null_feature, null_start, null_end = 0, 0.0, 0.0
        for k, i in enumerate(feature_ids):
            feature = squad_set.features[i]
            start_logits, end_logits = logits[i]
            if len(start_logits) != feature.length or len(end_logits) != feature.length:
                raise ValueError(
                    f"feature {i} of question {example.qas_id}: {len(start_logits)} logits for "
                    f"{feature.length} tokens"
                )
            if version_2_with_negative:
                feature_null = start_logits[0] + end_logits[0]
                if feature_null < score_null:
                    score_null = feature_null
                    null_feature, null_start, null_end = k, start_logits[0], end_logits[0]
            first = feature.context_offset
            last = first + feature.span_length - 1
            for start in best_indexes(start_logits, n_best_size):
                for end in best_indexes(end_logits, n_best_size):
                    if not (first <= start <= last and first <= end <= last):
                        continue
                    if not is_max_context(spans, k, feature.span_start + start - first):
                        continue
                    if end < start or end - start + 1 > max_answer_length:
                        continue
                    prelim.append(Prelim(k, start, end, start_logits[start], end_logits[end]))
        if version_2_with_negative:
            prelim.append(Prelim(null_feature, 0, 0, null_start, null_end))
        prelim.sort(key=lambda p: p.start_logit + p.end_logit, reverse=True)

        seen = set()
        nbest: List[Nbest] = []
        for p in prelim:
            if len(nbest) >= n_best_size:
                break
            if p.start_index > 0:  # a span
                feature = squad_set.features[feature_ids[p.feature_index]]
                doc_start = feature.span_start + p.start_index - feature.context_offset
                doc_end = feature.span_start + p.end_index - feature.context_offset
                offsets = (context.offsets[doc_start][0], context.offsets[doc_end][1])
                text = context.text[offsets[0] : offsets[1]]
                if text in seen:
                    continue
            else:
                text, offsets = "", None
            seen.add(text)
            nbest.append(Nbest(text, p.start_logit, p.end_logit, offsets))
        if version_2_with_negative and "" not in seen:
            nbest.append(Nbest("", null_start, null_end, None))
        if not nbest:
            nbest.append(Nbest("empty", 0.0, 0.0, None))

        probs = softmax([n.start_logit + n.end_logit for n in nbest])
        entries = []
        for n, prob in zip(nbest, probs):
            entry = collections.OrderedDict(
                [("text", n.text), ("probability", prob), ("start_logit", float(n.start_logit)),
                 ("end_logit", float(n.end_logit))]
            )  # fmt: skip
            if with_offsets:
                entry["offsets"] = list(n.offsets) if n.offsets else None
            entries.append(entry)
        all_nbest[example.qas_id] = entries
        if not version_2_with_negative:
            predictions[example.qas_id] = nbest[0].text
            continue
        best = next((n for n in nbest if n.text), None)
        if best is None:
            null_odds[example.qas_id] = NO_SPAN_NULL_ODDS
            predictions[example.qas_id] = ""
            continue
        score_diff = float(score_null - best.start_logit - best.end_logit)
        null_odds[example.qas_id] = score_diff
        predictions[example.qas_id] = "" if score_diff > null_score_diff_threshold else best.text
    return predictions, all_nbest, null_odds
