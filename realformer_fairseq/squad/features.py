"""SQuAD v1.1 / v2.0 examples and features as google-research/bert ``run_squad.py`` makes them,
with the answer mapped to WordPiece tokens through the tokenizer's character offsets.

RealFormer (He, Ravula, Kanagal, Ainslie 2020, arXiv 2012.11747) fine-tunes its BERT models on
SQuAD with "the standard BERT fine-tuning procedure": google-research/bert ``run_squad.py``
(Devlin et al. 2019). What this module reproduces, with the function of that file it mirrors:

* ``read_squad_examples``: every question of a SQuAD JSON file (``data`` -> ``paragraphs`` ->
  ``qas``); for training, a question must have exactly one answer unless it is impossible
  (v2.0, ``is_impossible``), and an answer whose text is not found, white space normalised, in
  the words its ``answer_start`` points to is skipped (BERT logs "Could not find answer"; the
  skipped ids are counted and kept), and so is one that covers no WordPiece of its context
  (only characters the tokenizer drops, such as a zero-width space): an answerable question is
  never trained as "no answer" (:func:`skip_answers_without_pieces`);
* ``convert_examples_to_features``: ``[CLS] question [SEP] context [SEP]`` (fairseq's
  ``<s> q </s> c </s>``; token types 0 up to the first ``</s>``, 1 after, which
  ``segment_ids_from_separator`` derives), the question cut to ``max_query_length`` pieces,
  windows of ``max_seq_length - len(question) - 3`` context pieces every ``doc_stride``
  pieces; a training window that does not contain the whole answer, and every window of an
  impossible question, is labelled ``[CLS]`` (start = end = 0: run_squad.py's code does this
  for v1.1 and v2.0 alike, although its comment says such windows are thrown out);
* ``_check_is_max_context``: the window in which a token has the most context
  (``min(left, right) + 0.01 * length``) is the only one whose prediction may start there.

The departure, on purpose (the point of this module): the context is tokenised once, whole,
by the ``tokenizers`` package, which gives each piece its character span in the original
text. The answer is the pieces that overlap its characters (run_squad.py maps characters to
white-space words, words to their first piece, then searches the word span for the answer's
pieces in ``_improve_answer_span``; the pieces are the same, tested), and the predicted text is
the original context between the first piece's first character and the last piece's last
(run_squad.py's ``get_final_text`` re-aligns detokenised pieces with the words and falls back
to whole words when the lengths differ: accents, ligatures, ``İ``). A piece's span is extended
over combining marks that follow it (a decomposed accent is part of the letter).

RoBERTa's pair layout (``<s> q </s> </s> c </s>``, for a model without token types) has one
more separator: its windows are one piece shorter.
"""

import bisect
import dataclasses
import json
import logging
import unicodedata
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import RealformerConfigError

logger = logging.getLogger(__name__)

PAIR_LAYOUTS = {"bert": 1, "roberta": 2}  # separators between the question and the context


class SquadDataError(RealformerConfigError):
    """A SQuAD file or setting that cannot be used; the message (one line) names the file and,
    where there is one, the question id."""


@dataclasses.dataclass(frozen=True)
class FeatureSettings:
    """run_squad.py's flags that shape the features (its defaults)."""

    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64
    pair_layout: str = "bert"

    @property
    def separators(self) -> int:
        return PAIR_LAYOUTS[self.pair_layout]

    @property
    def special_tokens(self) -> int:
        """``<s>``, the separator(s) after the question, ``</s>`` at the end."""
        return 2 + self.separators

    def check(self, model_positions: Optional[int] = None) -> "FeatureSettings":
        """run_squad.py's ``validate_flags_or_throw``: the sequence fits the model's positions
        and leaves room for the context after the longest question."""
        if self.pair_layout not in PAIR_LAYOUTS:
            raise SquadDataError(
                f"pair layout must be one of {', '.join(PAIR_LAYOUTS)}, got '{self.pair_layout}'"
            )
        for name in ("max_seq_length", "doc_stride", "max_query_length"):
            if getattr(self, name) < 1:
                raise SquadDataError(f"--{name.replace('_', '-')} must be at least 1")
        if model_positions is not None and self.max_seq_length > model_positions:
            raise SquadDataError(
                f"--max-seq-length {self.max_seq_length}: the model has only {model_positions} "
                "positions"
            )
        if self.max_seq_length <= self.max_query_length + self.special_tokens:
            raise SquadDataError(
                f"--max-seq-length ({self.max_seq_length}) must be greater than "
                f"--max-query-length ({self.max_query_length}) + {self.special_tokens}"
            )
        return self


@dataclasses.dataclass
class Context:
    """A paragraph's text and its pieces with their character spans."""

    text: str
    pieces: List[str]
    offsets: List[Tuple[int, int]]


@dataclasses.dataclass
class Example:
    """One question (run_squad.py's ``SquadExample``). ``answer_span`` is the character span
    ``[start, end)`` of the training answer (None: impossible, or not a training example)."""

    qas_id: str
    question: str
    context_index: int
    is_impossible: bool = False
    answer_text: Optional[str] = None
    answer_span: Optional[Tuple[int, int]] = None


@dataclasses.dataclass
class Feature:
    """One window of one example (run_squad.py's ``InputFeatures`` without the arrays that
    follow from these numbers). Context piece ``span_start + i`` sits at sequence position
    ``context_offset + i``. ``start_position`` / ``end_position``: the training label (0 is
    ``<s>``, BERT's ``[CLS]``: no answer in this window); -1 when not a training feature."""

    example_index: int
    span_index: int
    span_start: int
    span_length: int
    query_length: int
    separators: int = 1
    start_position: int = -1
    end_position: int = -1

    @property
    def context_offset(self) -> int:
        return 1 + self.query_length + self.separators

    @property
    def length(self) -> int:
        """Tokens of the sequence: ``<s>``, question, separators, window, ``</s>``."""
        return self.context_offset + self.span_length + 1

    def row(self) -> List[int]:
        return [self.example_index, self.span_index, self.span_start, self.span_length,
                self.query_length, self.separators, self.start_position, self.end_position]  # fmt: skip

    @classmethod
    def from_row(cls, row: Sequence[int]) -> "Feature":
        return cls(*row)


@dataclasses.dataclass
class SquadSet:
    """The examples of one SQuAD file and their features."""

    contexts: List[Context]
    examples: List[Example]
    features: List[Feature]
    feature_tokens: List[List[str]]  # each feature's pieces, <s> ... </s> (fairseq spelling)
    skipped: List[Dict[str, str]]
    version_2_with_negative: bool
    is_training: bool

    def windows_of(self) -> Dict[int, List[int]]:
        """Each example's windows: the indices of its features, in order (an example without
        windows is absent)."""
        by_example: Dict[int, List[int]] = {}
        for i, feature in enumerate(self.features):
            by_example.setdefault(feature.example_index, []).append(i)
        return by_example


# ------------------------------------------------------------------ reading SQuAD JSON


def _is_squad_whitespace(c: str) -> bool:
    """run_squad.py's ``is_whitespace`` (its words are split on these only)."""
    return c in " \t\r\n" or ord(c) == 0x202F


def _words_covering(text: str, start: int, end: int) -> str:
    """The white-space words (run_squad.py's ``doc_tokens``) that hold characters
    ``[start, end)``, joined by one space: ``actual_text`` of read_squad_examples."""
    first = start
    while first > 0 and not _is_squad_whitespace(text[first - 1]):
        first -= 1
    last = end
    while last < len(text) and not _is_squad_whitespace(text[last]):
        last += 1
    return " ".join(
        "".join(" " if _is_squad_whitespace(c) else c for c in text[first:last]).split()
    )


def load_squad_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise SquadDataError(f"{path}: missing file") from None
    except UnicodeDecodeError as err:
        raise SquadDataError(f"{path}: not UTF-8 ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise SquadDataError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise SquadDataError(f"{path}: not a SQuAD file (no 'data' list at the top)")
    return data


def file_version(data: dict) -> Optional[str]:
    """The file's ``version`` (SQuAD's files: "1.1", "v2.0"), without a leading v."""
    version = data.get("version")
    return str(version).lstrip("v") if version is not None else None


def iterate_questions(data: dict, path: str):
    """(paragraph index, context, qa) of every question, the structure checked: one line
    naming the file and the question id (or the article and paragraph) on a bad field."""
    paragraph_index = -1
    for a, article in enumerate(data["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise SquadDataError(f"{path}: article {a} has no 'paragraphs' list")
        for p, paragraph in enumerate(paragraphs):
            paragraph_index += 1
            where = f"{path}: article {a} paragraph {p}"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str):
                raise SquadDataError(f"{where} has no 'context' text")
            if not isinstance(paragraph.get("qas"), list):
                raise SquadDataError(f"{where} has no 'qas' list")
            for qa in paragraph["qas"]:
                if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
                    raise SquadDataError(f"{where}: a question without an 'id' string")
                qid = qa["id"]
                if not isinstance(qa.get("question"), str):
                    raise SquadDataError(f"{path}: question {qid} has no 'question' text")
                answers = qa.get("answers", [])
                if not isinstance(answers, list):
                    raise SquadDataError(f"{path}: question {qid}: 'answers' is not a list")
                for answer in answers:
                    if not (isinstance(answer, dict) and isinstance(answer.get("text"), str)
                            and isinstance(answer.get("answer_start"), int)
                            and not isinstance(answer.get("answer_start"), bool)):  # fmt: skip
                        raise SquadDataError(
                            f"{path}: question {qid}: an answer without 'text' and an integer "
                            "'answer_start'"
                        )
                impossible = qa.get("is_impossible", False)
                if not isinstance(impossible, bool):
                    raise SquadDataError(
                        f"{path}: question {qid}: 'is_impossible' is not true/false"
                    )
                yield paragraph_index, paragraph["context"], qa


def read_squad_examples(
    path: str, version_2_with_negative: bool, is_training: bool, data: Optional[dict] = None
) -> Tuple[List[str], List[Example], List[Dict[str, str]]]:
    """The contexts (one per paragraph), the examples and the skipped training questions
    (``{"id", "reason"}``) of a SQuAD file: run_squad.py's ``read_squad_examples``."""
    data = load_squad_json(path) if data is None else data
    contexts: List[str] = []
    examples: List[Example] = []
    skipped: List[Dict[str, str]] = []
    seen = set()
    for paragraph_index, context, qa in iterate_questions(data, path):
        if paragraph_index == len(contexts):
            contexts.append(context)
        qid = qa["id"]
        if qid in seen:
            raise SquadDataError(f"{path}: question id {qid} appears twice")
        seen.add(qid)
        example = Example(qid, qa["question"], paragraph_index)
        if is_training:
            example.is_impossible = bool(version_2_with_negative and qa.get("is_impossible", False))
            answers = qa.get("answers", [])
            if not example.is_impossible and len(answers) != 1:
                raise SquadDataError(
                    f"{path}: question {qid} has {len(answers)} answers; for training, each "
                    "question should have exactly 1 answer (run_squad.py)"
                    + ("" if version_2_with_negative else " (a v2.0 file? its version says so)")
                )
            if not example.is_impossible:
                text, start = answers[0]["text"], answers[0]["answer_start"]
                if not text or start < 0 or start + len(text) > len(context):
                    raise SquadDataError(
                        f"{path}: question {qid}: answer_start {start} and the answer's "
                        f"{len(text)} characters are outside its context of {len(context)}"
                    )
                actual = _words_covering(context, start, start + len(text))
                if actual.find(" ".join(text.split())) == -1:
                    skipped.append(
                        {"id": qid, "reason": f"could not find answer {text!r} in {actual!r}"}
                    )
                    continue
                example.answer_text = text
                example.answer_span = (start, start + len(text))
        examples.append(example)
    return contexts, examples, skipped


# ------------------------------------------------------------------ tokens and windows


def extend_over_marks(text: str, offsets: Sequence[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Each piece's span, its end moved over the combining marks that follow it (up to the
    next piece): ``e`` + U+0301 is one letter, which the tokenizer reads as ``e``."""
    out = []
    for i, (start, end) in enumerate(offsets):
        limit = offsets[i + 1][0] if i + 1 < len(offsets) else len(text)
        while end < limit and unicodedata.category(text[end]) in ("Mn", "Mc", "Me"):
            end += 1
        out.append((start, end))
    return out


def tokenize_context(text: str, tokenizer) -> Context:
    pieces, offsets = tokenizer.pieces_with_offsets(text)
    return Context(text, pieces, extend_over_marks(text, offsets))


def char_span_to_pieces(offsets: Sequence[Tuple[int, int]], start: int, end: int):
    """The first and last piece that overlap characters ``[start, end)``; None if none does."""
    first = bisect.bisect_right([e for _, e in offsets], start)
    last = bisect.bisect_left([s for s, _ in offsets], end) - 1
    if first >= len(offsets) or last < first:
        return None
    return first, last


def doc_spans(num_pieces: int, max_tokens_for_doc: int, doc_stride: int) -> List[Tuple[int, int]]:
    """run_squad.py's sliding windows: (start, length), every ``doc_stride`` pieces, the last
    one ending at the end of the context."""
    spans = []
    start = 0
    while start < num_pieces:
        length = min(num_pieces - start, max_tokens_for_doc)
        spans.append((start, length))
        if start + length == num_pieces:
            break
        start += min(length, doc_stride)
    return spans


def is_max_context(spans: Sequence[Tuple[int, int]], span_index: int, position: int) -> bool:
    """run_squad.py's ``_check_is_max_context``."""
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return span_index == best_index


def convert_examples_to_features(
    contexts: Sequence[Context],
    examples: Sequence[Example],
    question_pieces: Sequence[Sequence[str]],
    settings: FeatureSettings,
    is_training: bool,
) -> Tuple[List[Feature], List[List[str]]]:
    """run_squad.py's ``convert_examples_to_features``: the windows of every example and their
    pieces (fairseq spelling, ``<s>`` first, ``</s>`` last)."""
    features: List[Feature] = []
    tokens: List[List[str]] = []
    separators = ["</s>"] * settings.separators
    for example_index, (example, question) in enumerate(zip(examples, question_pieces)):
        query = list(question[: settings.max_query_length])
        context = contexts[example.context_index]
        answer = None
        if is_training and not example.is_impossible:
            span = example.answer_span
            answer = char_span_to_pieces(context.offsets, *span) if span else None
            if answer is None:  # an answerable question is never labelled "no answer"
                raise ValueError(
                    f"question {example.qas_id}: its answer covers no piece of its context "
                    "(build_squad_set skips such questions)"
                )
        max_tokens_for_doc = settings.max_seq_length - len(query) - settings.special_tokens
        for span_index, (start, length) in enumerate(
            doc_spans(len(context.pieces), max_tokens_for_doc, settings.doc_stride)
        ):
            feature = Feature(example_index, span_index, start, length, len(query),
                              settings.separators)  # fmt: skip
            if is_training:
                feature.start_position = feature.end_position = 0
                if answer is not None and start <= answer[0] and answer[1] <= start + length - 1:
                    feature.start_position = answer[0] - start + feature.context_offset
                    feature.end_position = answer[1] - start + feature.context_offset
            features.append(feature)
            tokens.append(["<s>", *query, *separators, *context.pieces[start : start + length], "</s>"])  # fmt: skip
    return features, tokens


def skip_answers_without_pieces(
    contexts: Sequence[Context], examples: Sequence[Example]
) -> Tuple[List[Example], List[Dict[str, str]]]:
    """The examples without the training answers that overlap no piece of their context (only
    characters the tokenizer drops: a zero-width space, a control character), and those
    skipped (``{"id", "reason"}``). Such an answer cannot be recovered from the tokens, which
    is run_squad.py's rule for skipping a question ("Could not find answer"); labelled, it
    would be trained as "no answer" ([CLS]). (run_squad.py itself, whose words are split on
    white space only, labels the word that holds such characters, or, for a word of them
    alone, a span that ends before it starts.)"""
    kept: List[Example] = []
    skipped: List[Dict[str, str]] = []
    for example in examples:
        span, offsets = example.answer_span, contexts[example.context_index].offsets
        if span is not None and char_span_to_pieces(offsets, *span) is None:
            skipped.append({"id": example.qas_id, "reason": f"answer {example.answer_text!r} "
                            f"(characters {span[0]}-{span[1]}) covers no piece of its context"})  # fmt: skip
            continue
        kept.append(example)
    return kept, skipped


def build_squad_set(
    path: str,
    tokenizer,
    settings: FeatureSettings,
    version_2_with_negative: bool,
    is_training: bool,
    data: Optional[dict] = None,
) -> SquadSet:
    """A SQuAD file's examples and features (``tokenizer``: a
    :class:`~realformer_fairseq.tf_import.wordpiece.BertTextTokenizer`)."""
    texts, examples, skipped = read_squad_examples(path, version_2_with_negative, is_training, data)
    contexts = [tokenize_context(text, tokenizer) for text in texts]
    examples, without_pieces = skip_answers_without_pieces(contexts, examples)
    questions = [tokenizer.pieces(example.question) for example in examples]
    features, tokens = convert_examples_to_features(
        contexts, examples, questions, settings, is_training
    )
    for these, why in (
        (skipped, "their answer not found in the words it points to (run_squad.py does the same)"),
        (without_pieces, "their answer covers no WordPiece of the context, only characters the "
         "tokenizer drops (a zero-width space ...): it cannot be recovered from the tokens"),
    ):  # fmt: skip
        if these:
            logger.warning(
                "%s: %d training question(s) skipped, %s: %s%s", path, len(these), why,
                ", ".join(s["id"] for s in these[:5]), " ..." if len(these) > 5 else "",
            )  # fmt: skip
    skipped = skipped + without_pieces
    return SquadSet(contexts, examples, features, tokens, skipped, version_2_with_negative,
                    is_training)  # fmt: skip


def example_features(question: str, context: str, tokenizer, settings: FeatureSettings) -> SquadSet:
    """The features of one question about one context, from raw text (the hub's input)."""
    ctx = tokenize_context(context, tokenizer)
    example = Example("0", question, 0)
    features, tokens = convert_examples_to_features(
        [ctx], [example], [tokenizer.pieces(question)], settings, is_training=False
    )
    return SquadSet([ctx], [example], features, tokens, [], True, False)


# ------------------------------------------------------------------ the record kept in a data-bin


def set_record(squad_set: SquadSet) -> dict:
    """What decoding needs (contexts with their piece spans, examples, windows), as JSON."""
    return {
        "version_2_with_negative": squad_set.version_2_with_negative,
        "is_training": squad_set.is_training,
        "contexts": [{"text": c.text, "offsets": [list(o) for o in c.offsets]}
                     for c in squad_set.contexts],  # fmt: skip
        "examples": [{"id": e.qas_id, "question": e.question, "context": e.context_index,
                      "is_impossible": e.is_impossible} for e in squad_set.examples],  # fmt: skip
        "features": [f.row() for f in squad_set.features],
        "skipped": squad_set.skipped,
    }


def set_from_record(record: dict) -> SquadSet:
    contexts = [
        Context(c["text"], [], [tuple(o) for o in c["offsets"]]) for c in record["contexts"]
    ]
    examples = [Example(e["id"], e["question"], e["context"], e["is_impossible"])
                for e in record["examples"]]  # fmt: skip
    features = [Feature.from_row(row) for row in record["features"]]
    return SquadSet(contexts, examples, features, [], record.get("skipped", []),
                    record["version_2_with_negative"], record["is_training"])  # fmt: skip


def piece_ids(pieces: Iterable[str], dictionary) -> List[int]:
    """fairseq ids of fairseq-spelled pieces (a piece the dictionary lacks is ``<unk>``)."""
    return [dictionary.index(p) for p in pieces]
