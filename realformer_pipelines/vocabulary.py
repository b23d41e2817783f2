"""BERT ``vocab.txt`` files and their casing (RealFormer's BERT experiments, arXiv 2012.11747,
use Google's BERT vocabularies): what :mod:`.wordpiece` and :mod:`.model_info` both read, so
that neither imports the other for it.
"""

from typing import List, Sequence, Tuple

from .errors import InputError

# BERT special token -> fairseq symbol
SPECIAL_TOKENS = {
    "[CLS]": "<s>",
    "[PAD]": "<pad>",
    "[SEP]": "</s>",
    "[UNK]": "<unk>",
    "[MASK]": "<mask>",
}


class WordPieceError(InputError):
    """A vocabulary that cannot be used; the message is one line."""


def read_vocab_file(path: str) -> List[str]:
    """The tokens of a BERT ``vocab.txt`` in id order (each line stripped, as BERT's
    ``load_vocab`` does)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f]
    except FileNotFoundError:
        raise WordPieceError(f"no vocabulary file {path}") from None
    except UnicodeDecodeError as err:
        raise WordPieceError(f"{path}: not UTF-8 ({err.reason} at byte {err.start})") from None


def tokens_look_uncased(tokens: Sequence[str]) -> bool:
    """True when no ordinary token has an upper-case letter (Google's uncased vocabularies;
    the cased ones have thousands)."""
    return not any(
        any(ch.isupper() for ch in t)
        for t in tokens
        if t not in SPECIAL_TOKENS and not (t.startswith("[") and t.endswith("]"))
    )


def wordpiece_lowercase(cfg, tokens: Sequence[str]) -> Tuple[bool, str]:
    """(lower-case?, why) of a ``--bpe wordpiece`` config (``wordpiece_cased`` /
    ``wordpiece_uncased``, in a checkpoint or on the command line) over its vocabulary's
    ``tokens``; see the module docstring."""
    get = cfg.get if isinstance(cfg, dict) else lambda key, default: getattr(cfg, key, default)
    cased, uncased = get("wordpiece_cased", None), get("wordpiece_uncased", False)
    if cased and uncased:
        raise WordPieceError("--wordpiece-cased and --wordpiece-uncased contradict each other")
    if cased:
        return False, "--wordpiece-cased"
    if uncased:
        return True, "--wordpiece-uncased"
    if cased is False:  # stored by a checkpoint of before --wordpiece-uncased: its uncased models
        return True, "wordpiece_cased: false"
    return lowercase_of_vocabulary(tokens)


def lowercase_of_vocabulary(tokens: Sequence[str]) -> Tuple[bool, str]:
    lowercase = tokens_look_uncased(tokens)
    return lowercase, "the vocabulary has %s upper-case token" % ("no" if lowercase else "an")
