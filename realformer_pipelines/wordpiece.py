"""BERT's WordPiece tokenisation (RealFormer's BERT experiments, He, Ravula, Kanagal, Ainslie
2020, arXiv 2012.11747, use Google's BERT vocabularies), without fairseq: the vocabulary checks,
:class:`BertTextTokenizer`, the casing rule and the ``realformer-wordpiece`` command, which the
pipelines run on every file they tokenise (a process importing fairseq costs 3 CPU seconds).
The fairseq side (the vocabulary as a fairseq ``Dictionary``, ``--bpe wordpiece``) is
:mod:`realformer_fairseq.tf_import.wordpiece`, whose docstring describes both.

Tokenisation. :class:`BertTextTokenizer` is BERT's ``FullTokenizer`` (google-research/bert
``tokenization.py``: ``BasicTokenizer`` + ``WordpieceTokenizer``) built from the maintained
HuggingFace ``tokenizers`` package; :func:`encode_text` writes its pieces in the fairseq
dictionary's spelling (``<unk>`` for ``[UNK]``).

``realformer-wordpiece (--model MODEL | --vocab vocab.txt) [--cased | --uncased] --inputs a.txt
--outputs a.wp``: one line in, one line out. Casing (:func:`resolve_lowercase`, the one rule): an
explicit choice, else what the model says, else the vocabulary (uncased when no ordinary token
has an upper-case letter).
"""

import argparse
import logging
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import exit_with_one_line
from .startup import console_entry_point
from .vocabulary import (  # noqa: F401 (also this module's names)
    SPECIAL_TOKENS,
    WordPieceError,
    lowercase_of_vocabulary,
    read_vocab_file,
    tokens_look_uncased,
    wordpiece_lowercase,
)

logger = logging.getLogger(__name__)

FAIRSEQ_BUILTINS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0-3 of every fairseq Dictionary
MAX_INPUT_CHARS_PER_WORD = 200  # google-research/bert WordpieceTokenizer's default
CONTINUATION_PREFIX = "##"


def fairseq_symbol(bert_token: str) -> str:
    return SPECIAL_TOKENS.get(bert_token, bert_token)


def check_vocabulary(tokens: Sequence[str], source: str) -> None:
    """A BERT vocabulary fairseq can use: no empty or spaced token, no repeat, none spelled as
    a fairseq special symbol, every BERT special token present; raises WordPieceError."""
    seen: Dict[str, int] = {}
    for bert_id, token in enumerate(tokens):
        where = f"{source} line {bert_id + 1}"
        if not token:
            raise WordPieceError(f"{where} is empty (BERT ids are line numbers)")
        if any(ch.isspace() for ch in token):
            raise WordPieceError(f"{where}: token {token!r} contains white space")
        if token in seen:
            raise WordPieceError(f"{where}: token {token!r} is also on line {seen[token] + 1}")
        if token in SPECIAL_TOKENS.values():
            raise WordPieceError(
                f"{where}: token {token!r} is a fairseq special symbol, which the BERT "
                f"special tokens {', '.join(SPECIAL_TOKENS)} become"
            )
        seen[token] = bert_id
    missing = [t for t in SPECIAL_TOKENS if t not in seen]
    if missing:
        raise WordPieceError(f"{source} has no {', '.join(missing)} token")


class BertTextTokenizer:
    """BERT's ``FullTokenizer`` (see the module docstring) over a BERT vocabulary."""

    def __init__(self, tokens: Sequence[str], lowercase: bool):
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

        self.lowercase = lowercase
        self._tokenizer = Tokenizer(
            models.WordPiece(
                vocab={t: i for i, t in enumerate(tokens)},
                unk_token="[UNK]",
                max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
                continuing_subword_prefix=CONTINUATION_PREFIX,
            )
        )
        self._tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
        )
        self._tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    @classmethod
    def from_file(cls, vocab_path: str, lowercase: bool) -> "BertTextTokenizer":
        return cls(read_vocab_file(vocab_path), lowercase)

    def bert_pieces(self, text: str) -> List[str]:
        """WordPiece strings of ``text`` as BERT writes them (``[UNK]``)."""
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def pieces(self, text: str) -> List[str]:
        """WordPiece strings of ``text`` in the fairseq dictionary's spelling (``<unk>``)."""
        return [fairseq_symbol(p) for p in self.bert_pieces(text)]

    def pieces_with_offsets(self, text: str) -> Tuple[List[str], List[Tuple[int, int]]]:
        """The fairseq-spelled pieces of ``text`` and, for each, the ``(start, end)`` character
        span of ``text`` it comes from (the ``tokenizers`` package tracks them through
        lower-casing, accent stripping and the spaces put around CJK characters; every piece
        of a word split into ``##`` continuations has its own span)."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return [fairseq_symbol(p) for p in encoding.tokens], list(encoding.offsets)

    def encode_lines(self, lines: Sequence[str]) -> List[str]:
        """Each line as space-joined fairseq-spelled pieces (batched in Rust)."""
        encodings = self._tokenizer.encode_batch(list(lines), add_special_tokens=False)
        return [" ".join(fairseq_symbol(p) for p in e.tokens) for e in encodings]


def encode_text(text: str, tokenizer: BertTextTokenizer) -> str:
    """Raw text -> space-joined WordPiece pieces in fairseq's spelling (``fairseq-preprocess``
    input for the imported model's ``dict.txt``)."""
    return " ".join(tokenizer.pieces(text))


def decode_pieces(text: str) -> str:
    """Space-joined pieces -> text: ``##`` continuations joined to the piece before (BERT's
    detokenisation; the lower-casing and accent stripping cannot be undone)."""
    text = text.replace(" " + CONTINUATION_PREFIX, "")
    return text[len(CONTINUATION_PREFIX) :] if text.startswith(CONTINUATION_PREFIX) else text


# ------------------------------------------------------------------ realformer-wordpiece

PROG = "realformer-wordpiece"


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="BERT WordPiece tokenisation of raw text, one line in, one line out, in the "
        "spelling of the fairseq dict.txt that realformer-import-tf writes (input of "
        "fairseq-preprocess --srcdict OUT_DIR/dict.txt).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model",
        help="the model (a checkpoint, or realformer-import-tf's folder): its vocab.txt and its "
        "casing, as it was trained",
    )
    source.add_argument("--vocab", help="BERT vocab.txt (casing: as the vocabulary shows)")
    case = parser.add_mutually_exclusive_group()
    case.add_argument(
        "--cased",
        action="store_true",
        help="cased model (no lower-casing); with --model, stops unless the model is cased",
    )
    case.add_argument(
        "--uncased",
        action="store_true",
        help="uncased model (lower-case, strip accents); with --model, stops unless the model is "
        "uncased",
    )
    parser.add_argument("--inputs", nargs="+", default=["-"], help="input files ('-': stdin)")
    parser.add_argument("--outputs", nargs="+", default=["-"], help="output files ('-': stdout)")
    return parser


def _lines(path: str):
    if path == "-":
        return sys.stdin
    return open(path, encoding="utf-8")


@console_entry_point
def cli_main(argv: Optional[Sequence[str]] = None):
    sys.exit(main(argv))


@exit_with_one_line(PROG)
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = get_parser().parse_args(argv)
    if len(args.inputs) != len(args.outputs):
        raise WordPieceError("give as many --outputs as --inputs")
    if args.model:
        vocab_file, lowercase = model_wordpiece(args.model, args.cased, args.uncased)
        tokens = read_vocab_file(vocab_file)
        check_vocabulary(tokens, vocab_file)
    else:
        tokens = read_vocab_file(args.vocab)
        check_vocabulary(tokens, args.vocab)
        lowercase = resolve_lowercase(tokens, cased=args.cased, uncased=args.uncased)
    tokenizer = BertTextTokenizer(tokens, lowercase)
    for src, dst in zip(args.inputs, args.outputs):
        try:
            fin = _lines(src)
        except FileNotFoundError:
            raise WordPieceError(f"no input file {src}") from None
        fout = sys.stdout if dst == "-" else open(dst, "w", encoding="utf-8")
        try:
            batch: List[str] = []
            for line in fin:
                batch.append(line.rstrip("\n"))
                if len(batch) == 10000:
                    fout.write("".join(x + "\n" for x in tokenizer.encode_lines(batch)))
                    batch = []
            fout.write("".join(x + "\n" for x in tokenizer.encode_lines(batch)))
        finally:
            if fin is not sys.stdin:
                fin.close()
            if fout is not sys.stdout:
                fout.close()
    return 0


def model_wordpiece(model: str, cased: bool = False, uncased: bool = False) -> Tuple[str, bool]:
    """(vocab.txt, lower-case?) of a model (checkpoint or model folder), as it was trained; an
    explicit ``cased`` / ``uncased`` that contradicts it raises (one line)."""
    from .model_info import check_agrees, read_model_info

    info = read_model_info(model)
    if info.tokenizer != "wordpiece" or not info.vocab or info.cased is None:
        raise WordPieceError(
            f"{info.checkpoint}: not a WordPiece model with its vocabulary (--bpe "
            f"{info.tokenizer or 'not recorded'}); give --vocab"
        )
    flag = "--cased" if cased else "--uncased" if uncased else ""
    check_agrees(info, cased=True if cased else False if uncased else None, flags=flag)
    logger.info("WordPiece: %s, as %s was trained", info.casing, info.checkpoint)
    return info.vocab, not info.cased


def resolve_lowercase(tokens: Sequence[str], cased: bool, uncased: bool) -> bool:
    """Lower-case (uncased model) with ``uncased``, not with ``cased``; with neither flag, as the
    vocabulary shows (an uncased vocabulary has no upper-case token). Logged."""
    if cased and uncased:
        raise WordPieceError("--cased and --uncased contradict each other")
    if cased or uncased:
        lowercase = uncased
        how = "--uncased" if uncased else "--cased"
    else:
        lowercase, how = lowercase_of_vocabulary(tokens)
    logger.info(
        "WordPiece: %s (%s)",
        "uncased: lower-case and strip accents" if lowercase else "cased",
        how,
    )
    return lowercase


if __name__ == "__main__":
    cli_main()
