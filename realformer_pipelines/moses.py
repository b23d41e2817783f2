"""Moses tokenisation in Python, equal to the perl scripts line for line (no perl).

RealFormer (He et al., 2020, arXiv 2012.11747) reports WMT'14 En-Fr results on fairseq's
``prepare-wmt14en2fr.sh`` data, whose text steps are Moses perl scripts: punctuation
normalisation, non-printing-character removal and tokenisation with aggressive hyphen splitting
(``-a``). sacremoses does the same, but for three places where it differs from the perl
scripts (fixed here: see :func:`_perl_tokenizer_class`); tests/test_pipeline.py compares every
line of real Moses perl output. The GLUE pipeline tokenises its English text the same way.

:func:`init_worker` / :func:`tokenize_line` are the pair a ``multiprocessing`` pool runs;
:func:`tokenize_file` the whole step (progress logged), :func:`detokenize_file` Moses
detokenisation.
"""

import functools
import os
import re
import sys
import unicodedata
from typing import Optional, Tuple

from .checks import count_lines_utf8
from .files import atomic_write, read_lines
from .log import Progress, progress_lines

_WORKER = {}
# the sacremoses release whose output these fixes make equal to Moses perl (setup.py pins it;
# prepare.sh puts the version into the tokenize stage's marker)
SACREMOSES_VERSION = "0.2.0"
PERL_FIXES = 2  # raise when the fixes below change: prepare.sh then redoes the tokenize stage


def _widened(classes: dict) -> dict:
    """Each of ``classes`` ({name: characters}) plus, as ``a-b`` ranges, every code point whose
    general category PERL_CLASSES[name] accepts that it lacks (never fewer characters than
    sacremoses has). One pass over the code points (about 0.3 s)."""
    have = {name: set(chars) for name, chars in classes.items()}
    ranges = {name: [] for name in classes}
    for code in range(sys.maxunicode + 1):
        category = unicodedata.category(chr(code))
        if category[0] not in "LN":
            continue
        for name, spans in ranges.items():
            if PERL_CLASSES[name](category) and chr(code) not in have[name]:
                if spans and spans[-1][1] == code - 1:
                    spans[-1][1] = code
                else:
                    spans.append([code, code])
    return {
        name: chars + "".join(f"{chr(a)}-{chr(b)}" if b > a else chr(a) for a, b in ranges[name])
        for name, chars in classes.items()
    }


# tokenizer.perl's character classes as Perl 5.36 (Unicode 14.0, as Python 3.11's unicodedata)
# defines them, by general category: \p{IsAlnum} = Alphabetic or Decimal_Number, \p{IsAlpha} =
# Alphabetic (every letter, L*, is Alphabetic), \p{IsN} = Number. sacremoses 0.2.0's tables hold
# only the BMP code points listed one by one in UnicodeData.txt, so they miss the ranges listed
# as First/Last pairs (CJK Unified Ideographs U+3400-4DBF and U+4E00-9FFF, Hangul syllables
# U+AC00-D7A3, ...), every letter outside the BMP and letters added after its Unicode version:
# it split a run of such letters into single characters (東京 -> 東 京) where tokenizer.perl
# keeps it whole. Every letter and number of Python's table is added; nothing is removed.
PERL_CLASSES = {
    "IsAlnum": lambda category: category[0] == "L" or category == "Nd",
    "IsAlpha": lambda category: category[0] == "L",
    "IsN": lambda category: category[0] == "N",
}


@functools.lru_cache(maxsize=None)
def _perl_tokenizer_class(perl_classes: bool):
    """sacremoses' MosesTokenizer plus the one rule of tokenizer.perl it lacks: the last word of
    a line that ends with a dot has the dot split off, whatever the word (``etc.``, ``U.S.A.``,
    ``FoxNews.com.``), before the non-breaking-prefix rules are asked; with ``perl_classes``,
    also tokenizer.perl's character classes (PERL_CLASSES) in every rule built from them."""
    from sacremoses import MosesTokenizer

    class PerlTokenizer(MosesTokenizer):
        def handles_nonbreaking_prefixes(self, text):
            words = text.split()
            text = super().handles_nonbreaking_prefixes(text)
            # the last word ends the output, unchanged or already split ("X .")
            if words and re.fullmatch(r"\S+\.", words[-1]) and not text.endswith(" ."):
                text = text[:-1] + " ."
            return text

    if not perl_classes:
        return PerlTokenizer
    classes = {name: getattr(MosesTokenizer, name) for name in PERL_CLASSES}
    widened = _widened(classes)

    def widen_rule(rule):  # (compiled pattern, replacement) with the classes replaced
        pattern, replacement = rule
        text = pattern.pattern
        for name, chars in classes.items():
            text = text.replace(chars, widened[name])
        return (
            re.compile(text, pattern.flags) if text != pattern.pattern else pattern
        ), replacement

    def is_rule(value):
        return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], re.Pattern)

    for name, chars in widened.items():
        setattr(PerlTokenizer, name, chars)
    for name in dir(MosesTokenizer):
        value = getattr(MosesTokenizer, name)
        if is_rule(value):
            setattr(PerlTokenizer, name, widen_rule(value))
        elif isinstance(value, list) and value and all(map(is_rule, value)):
            setattr(PerlTokenizer, name, [widen_rule(rule) for rule in value])
    return PerlTokenizer


# the first letter or number sacremoses 0.2.0's classes lack is U+0560
_BEYOND_SACREMOSES_START = re.compile("[\u0560-\U0010ffff]")


@functools.lru_cache(maxsize=None)
def _sacremoses_classes():
    from sacremoses import MosesTokenizer

    return {name: frozenset(getattr(MosesTokenizer, name)) for name in PERL_CLASSES}


def _needs_perl_classes(line: str) -> bool:
    """Whether ``line`` holds a letter or number that sacremoses' classes lack (the only lines
    on which the widened classes can change the output)."""
    if not _BEYOND_SACREMOSES_START.search(line):
        return False
    have = _sacremoses_classes()
    for char in _BEYOND_SACREMOSES_START.findall(line):
        category = unicodedata.category(char)
        if category[0] in "LN" and any(
            PERL_CLASSES[name](category) and char not in have[name] for name in PERL_CLASSES
        ):
            return True
    return False


class _MosesPerlTokenizer:
    """tokenizer.perl in Python (see _perl_tokenizer_class). The widened classes cost about
    0.5 s to build (one pass over the code points, then the rules recompiled), so they are built
    the first time a line needs them; other lines give the same tokens either way."""

    def __init__(self, lang: str):
        self.lang = lang
        self.sacremoses_classes = _perl_tokenizer_class(False)(lang=lang)
        self.perl_classes = None

    def tokenize(self, text: str, **kwargs):
        if not _needs_perl_classes(text):
            return self.sacremoses_classes.tokenize(text, **kwargs)
        if self.perl_classes is None:
            self.perl_classes = _perl_tokenizer_class(True)(lang=self.lang)
        return self.perl_classes.tokenize(text, **kwargs)


def _moses_tokenizer(lang: str):
    return _MosesPerlTokenizer(lang)


def remove_non_printing(line: str) -> str:
    """remove-non-printing-char.perl: every \\p{C} character (control, format, private use,
    surrogate, unassigned) becomes a space (sacremoses deletes them)."""
    return "".join(" " if unicodedata.category(c)[0] == "C" else c for c in line)


def _init_worker(lang: str, mode: str):
    from sacremoses import MosesPunctNormalizer

    _WORKER["norm"] = MosesPunctNormalizer(lang=lang, perl_parity=True)
    _WORKER["tok"] = _moses_tokenizer(lang)
    _WORKER["mode"] = mode


def _tokenize_line(line: str) -> str:
    if _WORKER["mode"] == "train":
        # normalize-punctuation.perl sees the line with its newline: its quote/period swap
        # s/(\.+)"(\s*[^<])/"$1$2/ then also fires at the end of the line (rendu." -> rendu".)
        line = _WORKER["norm"].normalize(line + "\n")
        # | remove-non-printing-char.perl
        line = remove_non_printing(line)
    else:
        # the reference applies only sed "s/’/'/g" to the test set
        line = line.replace("\u2019", "'")
    # as is: tokenizer.perl's last rule (s/\.\' ?$/ . ' /) leaves a trailing space
    return _WORKER["tok"].tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True)


def tokenizer_version() -> Tuple[str, Optional[str]]:
    """What a tokenize stage's marker records (the sacremoses release and our fixes' version),
    and a warning when another sacremoses than the tested one is installed (None if not). The
    installed release is read from its package metadata: importing sacremoses (joblib, numpy)
    would cost a process 0.3 CPU seconds for one string."""
    from importlib import metadata

    installed = metadata.version("sacremoses")
    warning = None
    if installed != SACREMOSES_VERSION:
        warning = (
            f"sacremoses {installed} installed; the tokenisation is tested equal to "
            f"Moses perl with {SACREMOSES_VERSION} (pip install -e .)"
        )
    return f"sacremoses-{installed}+perl-fixes-{PERL_FIXES}", warning


# the names a multiprocessing pool runs (public: tests and other pipelines call them)
init_worker = _init_worker
tokenize_line = _tokenize_line


def tokenize_file(lang: str, mode: str, input_path: str, output_path: str, workers: int = 1):
    """Every line of ``input_path`` tokenised (``mode`` train: normalise + remove non-printing
    + tokenise -a; test: ’ -> ' + tokenise -a) into ``output_path``; progress logged."""
    count_lines_utf8(input_path)
    progress = Progress(f"tokenize {os.path.basename(input_path)}")
    lines = progress_lines(read_lines(input_path), progress)
    with atomic_write(output_path) as out:
        if workers > 1:
            import multiprocessing as mp

            with mp.Pool(workers, _init_worker, (lang, mode)) as pool:
                for tok in pool.imap(_tokenize_line, lines, chunksize=2000):
                    out.write(tok + "\n")
        else:
            _init_worker(lang, mode)
            for line in lines:
                out.write(_tokenize_line(line) + "\n")
    progress.done()


def detokenize_file(lang: str, input_path: str, output_path: str):
    """Moses detokenisation (sacremoses, entities unescaped) of every line."""
    from sacremoses import MosesDetokenizer

    count_lines_utf8(input_path)
    detok = MosesDetokenizer(lang=lang)
    with atomic_write(output_path) as out:
        for line in read_lines(input_path):
            out.write(detok.detokenize(line.split(), unescape=True) + "\n")
