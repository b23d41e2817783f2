"""The data side of the BERT pre-training pipeline (prepare.sh) for the RealFormer comparison (He,
Ravula, Kanagal, Ainslie 2020, arXiv 2012.11747): raw text to a held-out split, a WordPiece
vocabulary in BERT's layout and packed training instances, streaming. It imports neither fairseq
nor torch (each prepare stage is a short process).

**Input format** (google-research/bert ``create_pretraining_data.py``:185-204 and README
"Pre-training with BERT"): UTF-8 text, one sentence a line, a blank (or white-space-only) line
between documents; lines are stripped; empty documents are dropped. One difference: BERT reads
several files as one stream, so a file that does not end with a blank line runs into the next
file's first document; here the end of a file always ends a document.

**Held-out split**: whole documents. A first pass counts the documents; ``valid_docs`` of them,
drawn with a fixed seed, go to the held-out file, the rest to the training file, in their order.

**Vocabulary**: google-research/bert has no code for *learning* one (README, "Learning a new
WordPiece vocabulary"). The pieces are learnt by HuggingFace ``tokenizers``' ``WordPieceTrainer``
with the normaliser and pre-tokeniser of BERT's ``FullTokenizer`` (:class:`BertTokenizer`) and
the defaults of ``tokenizers``' ``BertWordPieceTokenizer.train`` (``min_frequency=2``,
``limit_alphabet=1000``), and written in the layout of Google's released English vocabularies
(``uncased_L-12_H-768_A-12/vocab.txt``)::

    line 1        [PAD]                      id 0
    lines 2-100   [unused0] .. [unused98]    ids 1-99
    lines 101-104 [UNK] [CLS] [SEP] [MASK]   ids 100-103
    then          [unused99] .. [unused993]  ids 104-998
    then          the learnt pieces: single characters, words, ``##`` continuations

``unused`` (default 994, Google's) sets how many ``[unusedN]`` place-holders there are (the first
99 before ``[UNK]``, the rest after ``[MASK]``); ``vocab_size`` counts every line (Google's
uncased English vocabulary has 30,522). A corpus too small for ``vocab_size`` gives fewer lines.
The learnt pieces are written in a canonical order (single characters, ``##`` + character, then
the rest, each sorted): ``tokenizers`` numbers them in an order that changes from run to run.
Its trainer also breaks frequency ties at the edge of the vocabulary in an order that can change
between runs (measured on 5,603 news sentences, 4,000 tokens: one run of five differed by two
pieces): the ``vocab`` stage is kept once done, and ``--vocab`` reuses a vocabulary.

**Tokenisation**: :class:`BertTokenizer` is BERT's ``FullTokenizer`` on ``tokenizers``, the same
construction as the plugin's :class:`realformer_fairseq.tf_import.wordpiece.BertTextTokenizer`
(``tests/test_pretrain_bert.py`` checks that both give the same pieces), without importing the
plugin (which imports fairseq: seconds per process). Pieces are written in the fairseq
dictionary's spelling (``[UNK]`` -> ``<unk>``, see :data:`FAIRSEQ_SYMBOL`).

**Instances** (``create_instances_from_document``, ``create_pretraining_data.py``:223-335, without
next-sentence prediction): each instance is consecutive whole sentences of *one* document (an
instance never crosses a document boundary), filled up to a target length of ``max_seq_len - 2``
WordPieces (room for ``<s>`` = ``[CLS]`` and ``</s>`` = ``[SEP]``); with probability
``short_seq_prob`` (BERT's 0.1), drawn once per document as BERT does, the document's target is a
random length in ``2 .. max_seq_len - 2``. As in BERT, an instance is closed once it reaches the
target or the document ends. Where BERT lets the last sentence overflow and then deletes
WordPieces from the front or back (``truncate_seq_pair``), here nothing is deleted: a sentence that
would overflow ``max_seq_len - 2`` starts the next instance, and a single sentence longer than
that is cut into consecutive pieces of ``max_seq_len - 2``. One instance is one output line of
space-joined WordPieces, the input of ``fairseq-preprocess --only-source`` and of fairseq's
``masked_lm`` task with ``--sample-break-mode eos`` (one line = one sample, ``<s>`` prepended,
``</s>`` appended: BERT's ``[CLS] ... [SEP]``).

**Memory**: documents are read one at a time and handed to worker processes in chunks, with a
bounded number of chunks in flight, so memory does not grow with the corpus (only with the
largest document and ``workers``). The random draws of a document depend on ``seed`` and the
document's index alone: the output is the same for any number of workers.
"""

import collections
import concurrent.futures
import dataclasses
import multiprocessing
import os
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from realformer_pipelines.errors import InputError
from realformer_pipelines.files import atomic_output
from realformer_pipelines.log import warn

# ------------------------------------------------------------------ WordPiece

CONTINUATION_PREFIX = "##"
MAX_INPUT_CHARS_PER_WORD = 200  # google-research/bert tokenization.py WordpieceTokenizer
# BERT special token -> fairseq symbol (realformer_fairseq.tf_import.wordpiece.SPECIAL_TOKENS)
FAIRSEQ_SYMBOL = {
    "[CLS]": "<s>",
    "[PAD]": "<pad>",
    "[SEP]": "</s>",
    "[UNK]": "<unk>",
    "[MASK]": "<mask>",
}
FAIRSEQ_BUILTINS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0-3 of every fairseq Dictionary


def read_vocab(path: str) -> List[str]:
    """The tokens of a BERT ``vocab.txt`` in id order (lines stripped, as BERT's load_vocab)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return [line.strip() for line in fh]
    except FileNotFoundError:
        raise InputError(f"{path}: no such vocabulary file") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 ({err.reason} at byte {err.start})") from None


def check_vocab(tokens: Sequence[str], source: str):
    """BERT's vocabulary rules, as the plugin's WordPieceVocabulary checks them: no empty, white
    space or duplicate token, no fairseq special symbol, every BERT special token present."""
    seen: Dict[str, int] = {}
    for number, token in enumerate(tokens, 1):
        where = f"{source} line {number}"
        if not token:
            raise InputError(f"{where} is empty (BERT ids are line numbers)")
        if any(ch.isspace() for ch in token):
            raise InputError(f"{where}: token {token!r} contains white space")
        if token in seen:
            raise InputError(f"{where}: token {token!r} is also on line {seen[token]}")
        if token in FAIRSEQ_SYMBOL.values():
            raise InputError(f"{where}: token {token!r} is a fairseq special symbol")
        seen[token] = number
    missing = [t for t in FAIRSEQ_SYMBOL if t not in seen]
    if missing:
        raise InputError(f"{source} has no {', '.join(missing)} token")


def looks_uncased(tokens: Sequence[str]) -> bool:
    """No ordinary token with an upper-case letter (Google's uncased vocabularies)."""
    return not any(
        any(ch.isupper() for ch in t) for t in tokens if not (t.startswith("[") and t.endswith("]"))
    )


def write_fairseq_dict(tokens: Sequence[str], path: str):
    """fairseq's ``dict.txt`` of a BERT vocabulary: every token but the four fairseq built-ins in
    BERT id order, specials spelt as fairseq (the dictionary realformer-import-tf writes)."""
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for token in tokens:
            symbol = FAIRSEQ_SYMBOL.get(token, token)
            if symbol not in FAIRSEQ_BUILTINS:
                fh.write(f"{symbol} 1\n")


def bert_normalizer(lowercase: bool):
    from tokenizers import normalizers

    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )


class BertTokenizer:
    """BERT's FullTokenizer over ``tokens`` (see the module docstring)."""

    def __init__(self, tokens: Sequence[str], lowercase: bool):
        from tokenizers import Tokenizer, models, pre_tokenizers

        self._tokenizer = Tokenizer(
            models.WordPiece(
                vocab={t: i for i, t in enumerate(tokens)},
                unk_token="[UNK]",
                max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
                continuing_subword_prefix=CONTINUATION_PREFIX,
            )
        )
        self._tokenizer.normalizer = bert_normalizer(lowercase)
        self._tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    def encode_lines(self, lines: Sequence[str]) -> List[List[str]]:
        """The pieces of each line, in the fairseq dictionary's spelling."""
        encodings = self._tokenizer.encode_batch(list(lines), add_special_tokens=False)
        return [[FAIRSEQ_SYMBOL.get(p, p) for p in e.tokens] for e in encodings]


# ------------------------------------------------------------------ vocabulary learning

BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
GOOGLE_UNUSED = 994  # [unused0] .. [unused993] in Google's English vocabularies
UNUSED_BEFORE_UNK = 99  # [unused0] .. [unused98] sit between [PAD] and [UNK]
GOOGLE_VOCAB_SIZE = 30522  # uncased_L-12_H-768_A-12/vocab.txt
# tokenizers' BertWordPieceTokenizer.train defaults
MIN_FREQUENCY = 2
LIMIT_ALPHABET = 1000


class VocabError(InputError):
    """A vocabulary that cannot be learnt as asked; one line."""


def bert_layout(learnt: Sequence[str], unused: int = GOOGLE_UNUSED) -> List[str]:
    """Google's layout (module docstring) around the learnt pieces ``learnt``."""
    before = min(unused, UNUSED_BEFORE_UNK)
    return [
        "[PAD]",
        *(f"[unused{i}]" for i in range(before)),
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *(f"[unused{i}]" for i in range(before, unused)),
        *learnt,
    ]


def canonical_order(token: str):
    continuation = token.startswith(CONTINUATION_PREFIX)
    stem = token[len(CONTINUATION_PREFIX) :] if continuation else token
    return (0 if len(stem) == 1 and not continuation else 1 if len(stem) == 1 else 2, token)


def learn_wordpiece(
    files: Sequence[str], vocab_size: int, lowercase: bool, unused: int = GOOGLE_UNUSED
) -> List[str]:
    """The vocabulary (token strings in id order) learnt from ``files`` (read by ``tokenizers``
    in Rust, streaming). Blank lines (document boundaries) carry no text and change nothing."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if unused < 0:
        raise VocabError(f"the number of [unusedN] tokens must be >= 0, got {unused}")
    minimum = len(BERT_SPECIALS) + unused + 1
    if vocab_size < minimum:
        raise VocabError(
            f"--vocab-size {vocab_size} is too small: {len(BERT_SPECIALS)} special tokens and "
            f"{unused} [unusedN] place-holders leave no room for a learnt piece (at least "
            f"{minimum})"
        )
    for path in files:
        if not os.path.isfile(path):
            raise VocabError(f"{path}: no such file")
    tokenizer = Tokenizer(
        models.WordPiece(unk_token="[UNK]", continuing_subword_prefix=CONTINUATION_PREFIX)
    )
    tokenizer.normalizer = bert_normalizer(lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size - unused,
        min_frequency=MIN_FREQUENCY,
        limit_alphabet=LIMIT_ALPHABET,
        special_tokens=list(BERT_SPECIALS),
        continuing_subword_prefix=CONTINUATION_PREFIX,
        show_progress=False,
    )
    tokenizer.train(list(files), trainer)
    # tokenizers numbers the pieces in an order that changes from run to run (its hash maps):
    # a canonical order instead (characters, "##" + character, then the rest sorted)
    learnt = sorted(
        (token for token in tokenizer.get_vocab() if token not in BERT_SPECIALS),
        key=canonical_order,
    )
    if not learnt:
        raise VocabError(f"{', '.join(files)}: no piece learnt (no text?)")
    tokens = bert_layout(learnt, unused)
    check_vocab(tokens, "the learnt vocabulary")
    if len(tokens) < vocab_size:
        warn(
            f"WordPiece: {len(tokens)} tokens learnt where --vocab-size is {vocab_size} (the "
            f"corpus has no more pieces seen at least {MIN_FREQUENCY} times)"
        )
    return tokens


def write_vocab(tokens: Sequence[str], path: str):
    """``vocab.txt``: one token a line, line number = BERT id (atomically)."""
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write("".join(token + "\n" for token in tokens))


# ------------------------------------------------------------------ corpus

# google-research/bert create_pretraining_data.py:62-65 (short_seq_prob default)
BERT_SHORT_SEQ_PROB = 0.1
# fairseq dictionary spellings of [CLS] / [SEP] around each instance
INSTANCE_SPECIALS = 2


class CorpusError(InputError):
    """A corpus that cannot be used as BERT pre-training text; the message (one line) names the
    file and the problem."""


@dataclasses.dataclass
class CorpusStats:
    files: List[str]
    documents: int = 0
    sentences: int = 0
    blank_lines: int = 0

    def check(self):
        """Refuse a corpus without text, or one without a single blank line between documents
        (BERT's format needs them; a corpus of one document cannot be split by documents)."""
        names = ", ".join(self.files)
        if self.sentences == 0:
            raise CorpusError(f"{names}: no text (empty corpus, or blank lines only)")
        if self.documents < 2:
            raise CorpusError(
                f"{names}: no blank line between documents ({self.sentences} lines read as one "
                "document); BERT's input format is one sentence a line with a blank line between "
                "documents"
            )


def _lines(path: str) -> Iterator[Tuple[int, str]]:
    """(line number from 1, stripped line) of a UTF-8 file; one-line errors for a missing or
    undecodable file."""
    if not os.path.isfile(path):
        raise CorpusError(f"{path}: no such file")
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise CorpusError(
                    f"{path} line {number}: not UTF-8 ({err.reason} at byte {err.start})"
                ) from None
            yield number, text.strip()


def iter_documents(
    paths: Sequence[str], stats: Optional[CorpusStats] = None
) -> Iterator[List[str]]:
    """The documents of ``paths`` in order, each a list of non-empty stripped lines; a blank line
    or the end of a file ends a document; empty documents are skipped. ``stats`` (optional) is
    filled in as the documents are read."""
    for path in paths:
        document: List[str] = []
        for _, line in _lines(path):
            if line:
                document.append(line)
                continue
            if stats is not None:
                stats.blank_lines += 1
            if document:
                if stats is not None:
                    stats.documents += 1
                    stats.sentences += len(document)
                yield document
                document = []
        if document:
            if stats is not None:
                stats.documents += 1
                stats.sentences += len(document)
            yield document


def count_documents(paths: Sequence[str]) -> CorpusStats:
    """One streaming pass: documents, sentences and blank lines; checked (:meth:`CorpusStats.check`)."""
    stats = CorpusStats(files=list(paths))
    for _ in iter_documents(paths, stats):
        pass
    stats.check()
    return stats


def held_out_indices(documents: int, valid_docs: int, seed: int) -> np.ndarray:
    """Sorted indices of the ``valid_docs`` held-out documents among ``documents``, drawn with
    ``seed`` (the same corpus and seed always hold out the same documents)."""
    if valid_docs < 1:
        raise CorpusError(f"--valid-docs must be at least 1, got {valid_docs}")
    if valid_docs >= documents:
        raise CorpusError(
            f"--valid-docs {valid_docs} leaves no training document: the corpus has {documents} "
            "documents"
        )
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(documents, size=valid_docs, replace=False))


def default_valid_docs(documents: int) -> int:
    """5 % of the documents, at least 1 and at most 1,000."""
    return max(1, min(1000, documents // 20))


def _write_document(fh, document: List[str], first: bool):
    if not first:
        fh.write("\n")
    fh.write("".join(line + "\n" for line in document))


def split_documents(
    paths: Sequence[str],
    train_out: str,
    valid_out: str,
    valid_docs: Optional[int],
    seed: int,
) -> Dict:
    """Write the training and held-out documents (same format: a blank line between documents)
    to ``train_out`` / ``valid_out`` (each written to a temporary name, then renamed). Returns the
    counts. ``valid_docs=None``: :func:`default_valid_docs`."""
    stats = count_documents(paths)
    if valid_docs is None:
        valid_docs = default_valid_docs(stats.documents)
    held_out = set(held_out_indices(stats.documents, valid_docs, seed).tolist())
    counts = {"train": [0, 0], "valid": [0, 0]}  # documents, sentences
    tmp = {name: f"{path}.tmp" for name, path in (("train", train_out), ("valid", valid_out))}
    try:
        with (
            open(tmp["train"], "w", encoding="utf-8") as train,
            open(tmp["valid"], "w", encoding="utf-8") as valid,
        ):
            for index, document in enumerate(iter_documents(paths)):
                name = "valid" if index in held_out else "train"
                _write_document(valid if name == "valid" else train, document, not counts[name][0])
                counts[name][0] += 1
                counts[name][1] += len(document)
        os.replace(tmp["train"], train_out)
        os.replace(tmp["valid"], valid_out)
    finally:
        for path in tmp.values():
            if os.path.exists(path):
                os.remove(path)
    return {
        "files": list(paths),
        "documents": stats.documents,
        "sentences": stats.sentences,
        "valid_docs": valid_docs,
        "split_seed": seed,
        "train": {"documents": counts["train"][0], "sentences": counts["train"][1]},
        "valid": {"documents": counts["valid"][0], "sentences": counts["valid"][1]},
    }


# ------------------------------------------------------------------ instances


def document_rng(seed: int, index: int) -> np.random.Generator:
    """The random numbers of document ``index`` (independent of how documents are chunked)."""
    return np.random.default_rng([seed, index])


def pack_document(
    sentences: Sequence[Sequence[str]], max_seq_len: int, short_seq_prob: float, rng
) -> List[List[str]]:
    """The instances of one document (see the module docstring): lists of WordPieces, each at
    most ``max_seq_len - 2`` long, made of consecutive whole sentences (a sentence longer than
    that is cut into consecutive pieces); empty sentences are skipped."""
    max_num_tokens = max_seq_len - INSTANCE_SPECIALS
    if max_num_tokens < 2:
        raise CorpusError(
            f"--max-seq-len must be at least {INSTANCE_SPECIALS + 2}, got {max_seq_len}"
        )
    # BERT draws the target once per document (create_pretraining_data.py:239-241)
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_num_tokens + 1))
    instances: List[List[str]] = []
    current: List[str] = []
    for sentence in sentences:
        for start in range(0, len(sentence), max_num_tokens):
            segment = list(sentence[start : start + max_num_tokens])
            if current and len(current) + len(segment) > max_num_tokens:
                instances.append(current)
                current = []
            current.extend(segment)
            if len(current) >= target:
                instances.append(current)
                current = []
    if current:
        instances.append(current)
    return instances


@dataclasses.dataclass
class InstanceSettings:
    vocab_path: str
    lowercase: bool
    max_seq_len: int
    short_seq_prob: float = BERT_SHORT_SEQ_PROB
    seed: int = 12345  # google-research/bert create_pretraining_data.py:54 (random_seed)


_WORKER_TOKENIZER = None


def _init_worker(vocab_path: str, lowercase: bool):
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = BertTokenizer(read_vocab(vocab_path), lowercase)


def _process_chunk(args) -> Tuple[List[str], Dict[str, int], Dict[str, int]]:
    """Tokenise and pack one chunk of documents: (instance lines, piece counts, stats)."""
    first_index, documents, settings = args
    flat = [line for document in documents for line in document]
    pieces_of = _WORKER_TOKENIZER.encode_lines(flat)
    lines: List[str] = []
    counts: collections.Counter = collections.Counter()
    stats = collections.Counter()
    position = 0
    for offset, document in enumerate(documents):
        sentences = [p for p in pieces_of[position : position + len(document)] if p]
        position += len(document)
        stats["empty_sentences"] += len(document) - len(sentences)
        stats["long_sentences"] += sum(
            len(s) > settings.max_seq_len - INSTANCE_SPECIALS for s in sentences
        )
        rng = document_rng(settings.seed, first_index + offset)
        for instance in pack_document(
            sentences, settings.max_seq_len, settings.short_seq_prob, rng
        ):
            lines.append(" ".join(instance))
            counts.update(instance)
            stats["instances"] += 1
            stats["pieces"] += len(instance)
        stats["documents"] += 1
        stats["sentences"] += len(document)
    return lines, dict(counts), dict(stats)


def _chunks(paths: Sequence[str], docs_per_chunk: int, settings) -> Iterator[Tuple]:
    chunk: List[List[str]] = []
    first = 0
    for index, document in enumerate(iter_documents(paths)):
        if not chunk:
            first = index
        chunk.append(document)
        if len(chunk) == docs_per_chunk:
            yield first, chunk, settings
            chunk = []
    if chunk:
        yield first, chunk, settings


def _ordered_results(tasks: Iterable[Tuple], workers: int, settings: InstanceSettings):
    """The results of :func:`_process_chunk` on ``tasks`` in order, with at most ``2 * workers``
    chunks in flight (``multiprocessing.Pool.imap`` would read the whole input ahead)."""
    if workers <= 1:
        _init_worker(settings.vocab_path, settings.lowercase)
        for task in tasks:
            yield _process_chunk(task)
        return
    # spawn, not fork: a process that used tokenizers' thread pool (learning the vocabulary,
    # a first tokenisation) deadlocks its forked children; each worker builds its own tokenizer.
    # A worker that dies breaks the pool (BrokenProcessPool) instead of being restarted.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker,
        initargs=(settings.vocab_path, settings.lowercase),
    ) as pool:  # fmt: skip
        pending = collections.deque()
        for task in tasks:
            pending.append(pool.submit(_process_chunk, task))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def write_instances(
    paths: Sequence[str],
    out_path: str,
    settings: InstanceSettings,
    workers: int = 1,
    docs_per_chunk: int = 64,
) -> Dict:
    """Tokenise and pack the documents of ``paths`` into ``out_path`` (one instance a line; a
    temporary name renamed when complete). Returns counts and the WordPiece frequencies
    (``piece_counts``, most frequent first)."""
    if settings.max_seq_len < INSTANCE_SPECIALS + 2:
        raise CorpusError(
            f"--max-seq-len must be at least {INSTANCE_SPECIALS + 2}, got {settings.max_seq_len}"
        )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false" if workers > 1 else "true")
    counts: collections.Counter = collections.Counter()
    stats: collections.Counter = collections.Counter()
    tmp = f"{out_path}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            for lines, chunk_counts, chunk_stats in _ordered_results(
                _chunks(paths, docs_per_chunk, settings), workers, settings
            ):
                out.write("".join(line + "\n" for line in lines))
                counts.update(chunk_counts)
                stats.update(chunk_stats)
        if stats["instances"] == 0:
            raise CorpusError(f"{', '.join(paths)}: no WordPiece in any document")
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    result = {k: int(stats[k]) for k in ("documents", "sentences", "instances", "pieces")}
    result["empty_sentences"] = int(stats["empty_sentences"])
    result["long_sentences_cut"] = int(stats["long_sentences"])
    result["piece_counts"] = dict(counts.most_common())
    return result
