"""BERT's WordPiece vocabulary and tokenisation for fairseq models imported from Google's
BERT / RealFormer checkpoints (He, Ravula, Kanagal, Ainslie 2020, arXiv 2012.11747).

Vocabulary. A BERT ``vocab.txt`` (one token a line, line number = id) becomes a fairseq
:class:`~fairseq.data.Dictionary`: ``[CLS] [PAD] [SEP] [UNK]`` are fairseq's own
``<s> <pad> </s> <unk>`` (ids 0-3, which every fairseq dictionary has first), ``[MASK]`` is
``<mask>`` (the symbol fairseq's ``masked_lm`` and ``sentence_prediction`` tasks add), and every
other token keeps its string and its BERT order after the four. :class:`WordPieceVocabulary`
holds the two id mappings (``fairseq_ids[bert_id]``, ``bert_ids[fairseq_id]``).

Tokenisation. :class:`BertTextTokenizer` is BERT's ``FullTokenizer`` (google-research/bert
``tokenization.py``: ``BasicTokenizer`` + ``WordpieceTokenizer``) built from the maintained
HuggingFace ``tokenizers`` package: ``BertNormalizer`` (drop control characters, spaces around
CJK characters, and for uncased models lower-case + strip accents), ``BertPreTokenizer``
(split on white space and punctuation), and the ``WordPiece`` model (greedy longest match,
``##`` continuations, ``[UNK]`` for a word that does not split or is longer than 200
characters, as in Google's code). Special tokens in the text are not special (``"[SEP]"`` is
``[ ##sep ]``-like pieces, as in BERT).

* :func:`encode_text` / :meth:`BertTextTokenizer.pieces`: raw text -> WordPiece strings in
  the fairseq dictionary's spelling (``<unk>`` for ``[UNK]``), space-joined: the input of
  ``fairseq-preprocess --srcdict dict.txt``; :meth:`WordPieceVocabulary.fairseq_token_ids`
  turns pieces into fairseq ids.
* ``--bpe wordpiece --wordpiece-vocab vocab.txt [--wordpiece-cased | --wordpiece-uncased]``:
  the same, registered as a fairseq BPE (hub ``encode()`` / ``fill_mask()``,
  ``fairseq-interactive``, ``--mask-whole-words``).
* ``realformer-wordpiece (--model MODEL | --vocab vocab.txt) [--cased | --uncased] --inputs
  a.txt --outputs a.wp``: the same for files, one line in, one line out.

The parts that need no fairseq (the tokenizer, the vocabulary checks, the casing rule and the
``realformer-wordpiece`` command) are :mod:`realformer_pipelines.wordpiece`, imported here under
the same names: the command then starts without importing fairseq (3 CPU seconds a file).

Casing (:func:`resolve_lowercase`, the one rule): an explicit choice (``--cased`` /
``--uncased``, ``--wordpiece-cased`` / ``--wordpiece-uncased``), else what the model says (the
``--bpe wordpiece`` settings ``realformer-import-tf`` stores in ``model.pt``), else the
vocabulary (uncased when no ordinary token has an upper-case letter, as Google's uncased
vocabularies; the cased ones have thousands). A checkpoint written before
``--wordpiece-uncased`` existed stores ``wordpiece_cased: false`` for its uncased models: that
still means uncased.
"""

import contextlib
import dataclasses
from typing import Iterable, List, Optional, Sequence

import numpy as np
from fairseq.data import Dictionary
from fairseq.data.encoders import register_bpe
from fairseq.dataclass import FairseqDataclass

from realformer_pipelines import wordpiece as _plain
from realformer_pipelines.wordpiece import (  # noqa: F401  (this module's names, as before)
    CONTINUATION_PREFIX,
    FAIRSEQ_BUILTINS,
    MAX_INPUT_CHARS_PER_WORD,
    SPECIAL_TOKENS,
    BertTextTokenizer,
    check_vocabulary,
    cli_main,
    decode_pieces,
    encode_text,
    fairseq_symbol,
    lowercase_of_vocabulary,
    model_wordpiece,
    read_vocab_file,
    resolve_lowercase,
    tokens_look_uncased,
    wordpiece_lowercase,
)

from ..errors import RealformerConfigError


class WordPieceError(RealformerConfigError, _plain.WordPieceError):
    """A vocabulary the plugin cannot use (the message is one line): the plugin's error type
    (what fairseq's commands turn into one line), and the WordPiece error of the
    fairseq-free tokenizer, which this module's classes raise as this one."""


@contextlib.contextmanager
def plugin_error():
    """The fairseq-free tokenizer's WordPieceError, raised as the plugin's."""
    try:
        yield
    except _plain.WordPieceError as err:
        if isinstance(err, WordPieceError):
            raise
        raise WordPieceError(str(err)) from None


def fairseq_ids_of_bert_vocab(dictionary, vocab_tokens: Sequence[str]) -> np.ndarray:
    """``ids[bert_id]`` = the id in ``dictionary`` of BERT token ``bert_id`` (specials mapped by
    :func:`fairseq_symbol`): the one BERT-to-fairseq id mapping (the vocabulary's own
    dictionary, an imported model's); refuses a dictionary that lacks a token."""
    ids = np.array([dictionary.index(fairseq_symbol(t)) for t in vocab_tokens], np.int64)
    unk = dictionary.unk()
    lost = [t for t, i in zip(vocab_tokens, ids) if i == unk and fairseq_symbol(t) != "<unk>"]
    if lost:
        raise WordPieceError(
            f"the model's dictionary has no {lost[0]!r} (and {len(lost) - 1} more BERT tokens): "
            "not the dictionary of this vocabulary"
        )
    return ids


class WordPieceVocabulary:
    """A BERT vocabulary and the fairseq dictionary made from it (see the module docstring)."""

    def __init__(self, tokens: Sequence[str], source: str = "vocab.txt"):
        self.tokens = list(tokens)
        self.source = source
        self._check()
        self.dictionary = Dictionary()  # <s> <pad> </s> <unk>
        for token in self.tokens:
            symbol = fairseq_symbol(token)
            if symbol not in FAIRSEQ_BUILTINS:
                self.dictionary.add_symbol(symbol, n=1)
        self.fairseq_ids = fairseq_ids_of_bert_vocab(self.dictionary, self.tokens)
        self.bert_ids = np.empty(len(self.tokens), np.int64)
        self.bert_ids[self.fairseq_ids] = np.arange(len(self.tokens))
        assert len(self.dictionary) == len(self.tokens)

    @classmethod
    def from_file(cls, path: str) -> "WordPieceVocabulary":
        with plugin_error():
            return cls(read_vocab_file(path), source=path)

    def _check(self):
        with plugin_error():
            check_vocabulary(self.tokens, self.source)

    def __len__(self):
        return len(self.tokens)

    def write_fairseq_dict(self, path: str):
        """``dict.txt`` for fairseq (``symbol count``, without the four built-in symbols)."""
        self.dictionary.save(path)

    def bert_token_ids(self, pieces: Iterable[str]) -> List[int]:
        """BERT ids of WordPiece strings in either spelling (``[UNK]`` or ``<unk>``)."""
        fairseq_ids = self.fairseq_token_ids(pieces)
        return [int(self.bert_ids[i]) for i in fairseq_ids]

    def fairseq_token_ids(self, pieces: Iterable[str]) -> List[int]:
        """fairseq ids of WordPiece strings (BERT or fairseq spelling); unknown -> ``<unk>``."""
        return [self.dictionary.index(fairseq_symbol(p)) for p in pieces]

    def looks_uncased(self) -> bool:
        return tokens_look_uncased(self.tokens)


# ------------------------------------------------------------------ fairseq --bpe wordpiece


@dataclasses.dataclass
class WordPieceBPEConfig(FairseqDataclass):
    wordpiece_vocab: Optional[str] = dataclasses.field(
        default=None, metadata={"help": "BERT vocab.txt (one WordPiece token a line)"}
    )
    # None: not given (the vocabulary decides); False: a checkpoint of before
    # --wordpiece-uncased, whose uncased models stored false
    wordpiece_cased: Optional[bool] = dataclasses.field(
        default=None,
        metadata={
            "help": "cased model: no lower-casing or accent stripping (BERT's "
            "do_lower_case=False); default: as the vocabulary shows (uncased when no ordinary "
            "token has an upper-case letter)"
        },
    )
    wordpiece_uncased: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "uncased model: lower-case and strip accents (BERT's do_lower_case=True), "
            "whatever the vocabulary shows"
        },
    )


@register_bpe("wordpiece", dataclass=WordPieceBPEConfig)
class WordPieceBPE:
    """fairseq BPE ``wordpiece``: BERT's tokenisation (:class:`BertTextTokenizer`); pieces are
    written in the fairseq dictionary's spelling."""

    def __init__(self, cfg):
        if not cfg.wordpiece_vocab:
            raise WordPieceError("--bpe wordpiece needs --wordpiece-vocab vocab.txt")
        with plugin_error():
            self.vocab_tokens = read_vocab_file(cfg.wordpiece_vocab)  # BERT id order
            lowercase, _ = wordpiece_lowercase(cfg, self.vocab_tokens)
        self.tokenizer = BertTextTokenizer(self.vocab_tokens, lowercase=lowercase)

    def encode(self, x: str) -> str:
        return encode_text(x, self.tokenizer)

    def decode(self, x: str) -> str:
        return decode_pieces(x)

    def is_beginning_of_word(self, x: str) -> bool:
        return not x.startswith(CONTINUATION_PREFIX)
