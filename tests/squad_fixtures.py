"""SQuAD-format files for the tests, built from ../shared/data (no SQuAD data is offline).

``sentence_finding``: a task a tiny model can learn. Each context is a few Multi30k English
captions (Elliott et al. 2016; ``../shared/data/enfr/multi30k``); the question is a phrase of
two or three words copied from one of them, and the answer is that whole caption (its
characters in the context, as SQuAD's ``answer_start``). With ``impossible`` > 0 (SQuAD v2.0)
that share of the questions is a phrase taken from a caption that is not in the context
(``is_impossible``, no answers). Only captions whose words the vocabulary mostly knows are used,
and only phrases of known words that occur once in the context, so that the task can be solved
by finding the phrase. Trivial baselines: the first caption always, or no answer always (v2.0).

Written here, not taken from the code under test.
"""

import json
import random
from pathlib import Path
from typing import Dict, List, Sequence

MULTI30K = ("multi30k", "train.en")
STOPWORDS = {
    "a",
    "an",
    "the",
    "is",
    "are",
    "on",
    "in",
    "of",
    "and",
    "to",
    "at",
    "with",
    "was",
    "it",
}


def load_captions(shared_enfr: Path, known_words: Sequence[str], max_unknown: float = 0.25,
                  min_words: int = 4, max_words: int = 9) -> List[str]:  # fmt: skip
    """Captions of ``min_words``..``max_words`` words (punctuation stripped from the word's
    ends to look it up), at most ``max_unknown`` of them unknown, ending with a period."""
    known = {w.lower() for w in known_words}
    captions = []
    seen = set()
    for line in (shared_enfr.joinpath(*MULTI30K)).read_text(encoding="utf-8").splitlines():
        line = " ".join(line.split())
        if not line:
            continue
        if not line.endswith("."):
            line += "."
        words = [w.strip(".,!?").lower() for w in line.split()]
        if not (min_words <= len(words) <= max_words) or line in seen:
            continue
        unknown = sum(w not in known for w in words)
        if unknown <= max_unknown * len(words):
            captions.append(line)
            seen.add(line)
    return captions


def known_phrases(caption: str, known: set, lengths=(2, 3)) -> List[str]:
    """Word n-grams of the caption whose words are all known (final period left out)."""
    words = caption.rstrip(".").split()
    out = []
    for n in lengths:
        for i in range(len(words) - n + 1):
            gram = words[i : i + n]
            if all(w.lower() in known for w in gram) and not all(
                w.lower() in STOPWORDS for w in gram
            ):
                out.append(" ".join(gram))
    return out


def _contains_phrase(text: str, phrase: str) -> bool:
    padded = " " + " ".join(w.lower() for w in text.replace(".", " ").split()) + " "
    return " " + phrase.lower() + " " in padded


def sentence_finding(captions: Sequence[str], known_words: Sequence[str], n_questions: int,
                     seed: int, sentences: int = 3, impossible: float = 0.0,
                     version: str = "1.1", title: str = "captions") -> Dict:  # fmt: skip
    """A SQuAD file (dict) of ``n_questions`` questions, one per context."""
    rng = random.Random(seed)
    known = {w.lower() for w in known_words}
    paragraphs = []
    attempts = 0
    while len(paragraphs) < n_questions:
        attempts += 1
        if attempts > 50 * n_questions:
            raise ValueError("too few usable captions for the questions asked")
        chosen = rng.sample(list(captions), sentences)
        context = " ".join(chosen)
        qid = f"{title}-{seed}-{len(paragraphs)}"
        if impossible and rng.random() < impossible:
            other = rng.choice(captions)
            phrases = [p for p in known_phrases(other, known)
                       if any(not _contains_phrase(context, w)
                              for w in p.split() if w.lower() not in STOPWORDS)]  # fmt: skip
            if other in chosen or not phrases:
                continue
            qa = {"id": qid, "question": rng.choice(phrases) + "?", "answers": [],
                  "is_impossible": True}  # fmt: skip
        else:
            target = rng.randrange(sentences)
            others = [c for i, c in enumerate(chosen) if i != target]
            phrases = [p for p in known_phrases(chosen[target], known)
                       if any(not any(_contains_phrase(c, w) for c in others)
                              for w in p.split() if w.lower() not in STOPWORDS)]  # fmt: skip
            if not phrases:
                continue
            start = len(" ".join(chosen[:target])) + (1 if target else 0)
            assert context[start : start + len(chosen[target])] == chosen[target]
            qa = {"id": qid, "question": rng.choice(phrases) + "?",
                  "answers": [{"text": chosen[target], "answer_start": start}]}  # fmt: skip
            if version == "2.0":
                qa["is_impossible"] = False
        paragraphs.append({"context": context, "qas": [qa]})
    return {"version": version if version == "1.1" else "v2.0",
            "data": [{"title": title, "paragraphs": paragraphs}]}  # fmt: skip


def first_sentence_baseline(data: Dict) -> Dict[str, str]:
    """Predictions of the trivial baseline: the context's first caption, always."""
    preds = {}
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            first = paragraph["context"].split(". ")[0]
            first = first if first.endswith(".") else first + "."
            for qa in paragraph["qas"]:
                preds[qa["id"]] = first
    return preds


def no_answer_baseline(data: Dict) -> Dict[str, str]:
    return {qa["id"]: "" for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]}


def write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def vocabulary_words(vocab_path: Path) -> List[str]:
    """The whole words of a WordPiece vocabulary (no ## pieces, no [..] tokens)."""
    words = []
    for token in vocab_path.read_text(encoding="utf-8").split("\n"):
        token = token.strip()
        if token and not token.startswith("##") and not token.startswith("["):
            words.append(token)
    return words
