#!/usr/bin/env python
"""Text steps of the WMT'14 En-Fr pipeline (called by common.sh), no Moses perl.

RealFormer (He et al., 2020, arXiv 2012.11747) reports WMT'14 En-Fr results on
fairseq's ``prepare-wmt14en2fr.sh`` data. These subcommands re-do its perl steps
with PyPI packages: Moses punctuation normalisation, non-printing-character
removal and tokenisation with aggressive hyphen splitting (``-a``) by sacremoses,
``clean-corpus-n.perl -ratio 1.5 ... 1 250``, and on the scoring side Moses
detokenisation and SacreBLEU.

Every subcommand checks its input (present, non-empty, UTF-8, parallel files of
equal length) and stops with one line naming the file and the problem; every
output is written to a temporary name next to it and renamed when complete.
"""

import argparse
import contextlib
import functools
import json
import os
import re
import sys
import tempfile
import time
import unicodedata
from typing import Iterator, List, Optional, Sequence

# "wmt14_en_fr", or the pipeline whose common.sh sourcing set it (examples/glue: "glue")
PROG = os.environ.get("REALFORMER_PIPELINE_NAME", "wmt14_en_fr")
BLOCK = 1 << 22


class InputError(Exception):
    """Bad input; printed as one line."""


# ---------------------------------------------------------------- checks


def count_lines_utf8(path: str) -> int:
    """Number of lines of ``path``; raises InputError if absent, empty or not UTF-8."""
    if not os.path.exists(path):
        raise InputError(f"{path}: missing input file")
    if not os.path.isfile(path):
        raise InputError(f"{path}: not a regular file")
    if os.path.getsize(path) == 0:
        raise InputError(f"{path}: empty file")
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    lines = 0
    offset = 0
    last = b""
    with open(path, "rb") as fh:
        while True:
            block = fh.read(BLOCK)
            if not block:
                break
            try:
                decoder.decode(block)
            except UnicodeDecodeError as err:
                with open(path, "rb") as again:
                    head = again.read(offset + err.start)
                line_no = head.count(b"\n") + 1
                raise InputError(
                    f"{path}: not valid UTF-8 at line {line_no} (byte offset {offset + err.start})"
                ) from None
            lines += block.count(b"\n")
            offset += len(block)
            last = block[-1:]
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise InputError(f"{path}: not valid UTF-8 (truncated character at end of file)") from None
    if last != b"\n":
        lines += 1
    return lines


def check_parallel(paths: Sequence[str]) -> int:
    """All files valid and of the same number of lines; returns it."""
    counts = [count_lines_utf8(p) for p in paths]
    if len(set(counts)) > 1:
        detail = ", ".join(f"{p} has {n}" for p, n in zip(paths, counts))
        raise InputError(f"misaligned parallel files: {detail} lines")
    return counts[0]


# ---------------------------------------------------------------- output helpers


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: str):
    """Open a temp file next to ``path``; rename it to ``path`` only on success."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give what open() would
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_lines(path: str) -> Iterator[str]:
    """Lines without their newline; UTF-8 errors become an InputError naming the line."""
    with open(path, encoding="utf-8", errors="strict", newline="\n") as fh:
        line_no = 0
        try:
            for line_no, line in enumerate(fh, 1):
                yield line.rstrip("\n").rstrip("\r")
        except UnicodeDecodeError:
            raise InputError(f"{path}: not valid UTF-8 at line {line_no + 1}") from None


# ---------------------------------------------------------------- progress


class Progress:
    """fairseq-style log lines on stderr while a long CPU stage runs, every
    $REALFORMER_PROGRESS_SECONDS seconds (default 30) and once at the end:
    ``... | INFO | wmt14_en_fr | tokenize train.en: 1200000 lines, 52000 lines/s``."""

    def __init__(self, what: str, unit: str = "lines"):
        self.what, self.unit, self.n = what, unit, 0
        self.every = float(os.environ.get("REALFORMER_PROGRESS_SECONDS", "30"))
        self.start = self.last = time.monotonic()

    def update(self, k: int = 1):
        self.n += k
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self.log(now)

    def log(self, now: Optional[float] = None, end: str = ""):
        elapsed = max((now or time.monotonic()) - self.start, 1e-9)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        print(
            f"{stamp} | INFO | {PROG} | {self.what}: {self.n} {self.unit}, "
            f"{self.n / elapsed:.0f} {self.unit}/s{end}",
            file=sys.stderr,
            flush=True,
        )

    def done(self):
        self.log(end=" (done)")


def progress_lines(lines: Iterator[str], progress: Progress) -> Iterator[str]:
    for line in lines:
        yield line
        progress.update()


# ---------------------------------------------------------------- tokenise


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


def tokenizer_version() -> str:
    """What the tokenize stage's marker records: the sacremoses release and our fixes' version;
    a different sacremoses gets a warning (the line-for-line equality is tested on 0.2.0)."""
    import sacremoses

    if sacremoses.__version__ != SACREMOSES_VERSION:
        print(
            f"{PROG}: warning: sacremoses {sacremoses.__version__} installed; the tokenisation is "
            f"tested equal to Moses perl with {SACREMOSES_VERSION} (pip install -e .)",
            file=sys.stderr,
        )
    return f"sacremoses-{sacremoses.__version__}+perl-fixes-{PERL_FIXES}"


def cmd_tokenize(args):
    count_lines_utf8(args.input)
    progress = Progress(f"tokenize {os.path.basename(args.input)}")
    lines = progress_lines(read_lines(args.input), progress)
    with atomic_write(args.output) as out:
        if args.workers > 1:
            import multiprocessing as mp

            with mp.Pool(args.workers, _init_worker, (args.lang, args.mode)) as pool:
                for tok in pool.imap(_tokenize_line, lines, chunksize=2000):
                    out.write(tok + "\n")
        else:
            _init_worker(args.lang, args.mode)
            for line in lines:
                out.write(_tokenize_line(line) + "\n")
    progress.done()


# ---------------------------------------------------------------- BPE (subword-nmt)


class _CountingWriter:
    """The code file learn_bpe writes to: counts the merges (one line each) for the log."""

    def __init__(self, out, progress: Progress):
        self.out, self.progress = out, progress

    def write(self, text: str):
        self.out.write(text)
        if not text.startswith("#version"):
            self.progress.update(text.count("\n"))


def cmd_learn_bpe(args):
    """subword-nmt learn-bpe -s N on the concatenation of the inputs, in the given order (the
    reference: train.en then train.fr), with progress lines for reading and merging."""
    from subword_nmt.learn_bpe import learn_bpe

    for path in args.inputs:
        count_lines_utf8(path)
    reading = Progress(f"learn-bpe read {'+'.join(os.path.basename(p) for p in args.inputs)}")

    def lines():
        for path in args.inputs:
            with open(path, encoding="utf-8", newline="\n") as fh:
                yield from progress_lines(fh, reading)
        reading.done()

    merging = Progress("learn-bpe", unit="merges")
    with atomic_write(args.output) as out:
        learn_bpe(lines(), _CountingWriter(out, merging), args.symbols)
    merging.done()


def _init_bpe(codes: str):
    from subword_nmt.apply_bpe import BPE

    with open(codes, encoding="utf-8") as fh:
        _WORKER["bpe"] = BPE(fh)


def _apply_bpe_line(line: str) -> str:
    return _WORKER["bpe"].process_line(line)


def cmd_apply_bpe(args):
    """subword-nmt apply-bpe -c CODES (default separator @@, all merges), with progress."""
    count_lines_utf8(args.codes)
    count_lines_utf8(args.input)
    progress = Progress(f"apply-bpe {os.path.basename(args.input)}")
    with open(args.input, encoding="utf-8", newline="\n") as fh, atomic_write(args.output) as out:
        lines = progress_lines(fh, progress)
        if args.workers > 1:
            import multiprocessing as mp

            with mp.Pool(args.workers, _init_bpe, (args.codes,)) as pool:
                for seg in pool.imap(_apply_bpe_line, lines, chunksize=2000):
                    out.write(seg)
        else:
            _init_bpe(args.codes)
            for line in lines:
                out.write(_apply_bpe_line(line))
    progress.done()


def cmd_detokenize(args):
    from sacremoses import MosesDetokenizer

    count_lines_utf8(args.input)
    detok = MosesDetokenizer(lang=args.lang)
    with atomic_write(args.output) as out:
        for line in read_lines(args.input):
            out.write(detok.detokenize(line.split(), unescape=True) + "\n")


# ---------------------------------------------------------------- clean


def cmd_clean(args):
    """clean-corpus-n.perl -ratio R: drop pairs with a side outside [min, max]
    tokens or a token ratio above R (the Moses script counts words after
    collapsing whitespace; so does this)."""
    n = check_parallel([args.src_in, args.tgt_in])
    kept = 0
    with atomic_write(args.src_out) as src_out, atomic_write(args.tgt_out) as tgt_out:
        for src, tgt in zip(read_lines(args.src_in), read_lines(args.tgt_in)):
            src_words, tgt_words = src.split(), tgt.split()
            ns, nt = len(src_words), len(tgt_words)
            if ns < args.min_len or nt < args.min_len or ns > args.max_len or nt > args.max_len:
                continue
            if ns / nt > args.ratio or nt / ns > args.ratio:
                continue
            src_out.write(" ".join(src_words) + "\n")
            tgt_out.write(" ".join(tgt_words) + "\n")
            kept += 1
        if kept == 0:  # raised inside the with: neither output is renamed into place
            raise InputError(
                f"{args.src_in}, {args.tgt_in}: no sentence pair survived cleaning "
                f"(lengths {args.min_len}-{args.max_len}, ratio {args.ratio})"
            )
    print(f"clean: kept {kept} of {n} pairs ({args.src_in}, {args.tgt_in})", file=sys.stderr)


# ---------------------------------------------------------------- assemble raw data


def cmd_concat(args):
    """Concatenate parallel corpora PREFIX.{src,tgt} (each checked) into OUT.{src,tgt},
    optionally keeping the first --max-lines pairs."""
    langs = (args.src, args.tgt)
    for prefix in args.prefixes:
        check_parallel([f"{prefix}.{lang}" for lang in langs])
    for lang in langs:
        written = 0
        with atomic_write(f"{args.out}.{lang}") as out:
            for prefix in args.prefixes:
                for line in read_lines(f"{prefix}.{lang}"):
                    if args.max_lines and written >= args.max_lines:
                        break
                    out.write(line + "\n")
                    written += 1
    check_parallel([f"{args.out}.{lang}" for lang in langs])


def cmd_sgm(args):
    """Segments of a WMT SGML file (``<seg id=..>text</seg>``), as fairseq's recipe
    extracts newstest2014 (grep '<seg id' | sed ...)."""
    count_lines_utf8(args.input)
    seg = re.compile(r"<seg[^>]*>\s*(.*?)\s*</seg>")
    n = 0
    with atomic_write(args.output) as out:
        for line in read_lines(args.input):
            match = seg.search(line)
            if match:
                out.write(match.group(1) + "\n")
                n += 1
    if n == 0:
        os.remove(args.output)
        raise InputError(f"{args.input}: no <seg> lines (not a WMT SGML file?)")


# ---------------------------------------------------------------- fairseq data-bin


def check_binarized(idx_path: str) -> int:
    """A fairseq mmap dataset (``X.idx`` + ``X.bin``) whose ``.bin`` holds every byte its index
    points to; returns the number of sentences. fairseq 0.12.3 itself reads such a file
    lazily and fails in the middle of training with a numpy traceback."""
    import logging
    import struct

    # importing fairseq logs "Please install tensorboardX" (its speech task) at INFO
    logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    bin_path = idx_path[: -len(".idx")] + ".bin"
    if not os.path.isfile(bin_path):
        raise InputError(f"{bin_path}: missing (its index {idx_path} exists)")
    try:
        index = MMapIndexedDataset.Index(idx_path)
    except (AssertionError, ValueError, KeyError, struct.error) as err:
        raise InputError(f"{idx_path}: not a fairseq index file or truncated ({err})") from None
    n = len(index)
    need = int(index._pointers[-1]) + int(index._sizes[-1]) * index._dtype_size if n else 0
    have = os.path.getsize(bin_path)
    if have < need:
        raise InputError(
            f"{bin_path}: truncated ({have} bytes, its index {os.path.basename(idx_path)} "
            f"needs {need}); binarize again (prepare.sh --force)"
        )
    return n


def cmd_check_data_bin(args):
    """The data-bin's dictionaries and every binarized split are complete."""
    for lang in (args.src, args.tgt):
        count_lines_utf8(os.path.join(args.data_bin, f"dict.{lang}.txt"))
    indexes = sorted(
        os.path.join(args.data_bin, name)
        for name in os.listdir(args.data_bin)
        if name.endswith(".idx")
    )
    if not indexes:
        raise InputError(f"{args.data_bin}: no binarized data (*.idx); run prepare.sh")
    for idx in indexes:
        check_binarized(idx)


# ---------------------------------------------------------------- fairseq output


def cmd_extract_hyp(args):
    """H- lines (or S/T) of fairseq-generate output, in test-set order."""
    count_lines_utf8(args.input)
    prefix = {"hyp": "H", "ref": "T", "src": "S"}[args.kind]
    items = {}
    for line in read_lines(args.input):
        if not line.startswith(prefix + "-"):
            continue
        parts = line.split("\t")
        idx = int(parts[0][len(prefix) + 1 :])
        items[idx] = parts[-1] if len(parts) > 1 else ""
    if not items:
        raise InputError(f"{args.input}: no {prefix}- lines (is it fairseq-generate output?)")
    missing = sorted(set(range(max(items) + 1)) - set(items))
    if missing:
        raise InputError(
            f"{args.input}: {len(missing)} sentence ids missing (first {missing[0]}); "
            "generation incomplete?"
        )
    with atomic_write(args.output) as out:
        for i in range(len(items)):
            out.write(items[i] + "\n")


def parse_fairseq_bleu(path: str) -> Optional[dict]:
    """The ``BLEU4 = ...`` line fairseq-generate prints (tokenized BLEU)."""
    text = open(path, encoding="utf-8", errors="replace").read()
    match = re.search(r"Generate (\S+) with beam=(\d+): (BLEU4? = ([\d.]+).*)", text)
    if not match:
        return None
    return {
        "score": float(match.group(4)),
        "line": match.group(3).strip(),
        "subset": match.group(1),
        "beam": int(match.group(2)),
    }


# ---------------------------------------------------------------- scoring


def sacrebleu_score(hyp_path: str, ref_path: str, tokenize: Optional[str] = None, **kwargs) -> dict:
    from sacrebleu.metrics import BLEU, CHRF

    n = check_parallel([hyp_path, ref_path])
    hyps = list(read_lines(hyp_path))
    refs = list(read_lines(ref_path))
    bleu = BLEU(tokenize=tokenize, **kwargs)
    result = bleu.corpus_score(hyps, [refs])
    out = {
        "score": result.score,
        "counts": list(result.counts),
        "totals": list(result.totals),
        "precisions": list(result.precisions),
        "bp": result.bp,
        "sys_len": result.sys_len,
        "ref_len": result.ref_len,
        "signature": str(bleu.get_signature()),
        "segments": n,
        "hyp": os.path.abspath(hyp_path),
        "ref": os.path.abspath(ref_path),
    }
    out["line"] = f"BLEU|{out['signature']} = {str(result).split(' = ', 1)[1]}"
    if tokenize != "none":
        chrf = CHRF()
        out["chrf2"] = chrf.corpus_score(hyps, [refs]).score
        out["chrf2_signature"] = str(chrf.get_signature())
    return out


def cmd_score(args):
    results = {}
    if args.results and os.path.exists(args.results) and args.merge:
        with open(args.results, encoding="utf-8") as fh:
            results = json.load(fh)
    hyp = args.hyp
    if args.detok_lang:
        detok_out = args.detok_output or (args.hyp + ".detok")
        cmd_detokenize(argparse.Namespace(lang=args.detok_lang, input=args.hyp, output=detok_out))
        hyp = detok_out
    results["sacrebleu"] = sacrebleu_score(hyp, args.ref)
    if args.tok_hyp and args.tok_ref:
        # tokenized BLEU (= multi-bleu.perl / fairseq's BLEU4): no further tokenisation,
        # no smoothing
        results["tokenized_bleu_sacrebleu"] = sacrebleu_score(
            args.tok_hyp, args.tok_ref, tokenize="none", smooth_method="none", force=True
        )
    if args.fairseq_log:
        parsed = parse_fairseq_bleu(args.fairseq_log)
        if parsed is None:
            raise InputError(f"{args.fairseq_log}: no 'Generate ... BLEU4 =' line")
        results["tokenized_bleu_fairseq"] = parsed
    for key, value in args.meta or []:
        results.setdefault("meta", {})[key] = value
    if args.averaged:
        results["averaged_checkpoints"] = [os.path.abspath(p) for p in args.averaged]
    text = json.dumps(results, indent=1, ensure_ascii=False)
    if args.results:
        with atomic_write(args.results) as out:
            out.write(text + "\n")
    if "tokenized_bleu_fairseq" in results:
        print(f"tokenized BLEU (fairseq): {results['tokenized_bleu_fairseq']['line']}")
    print(f"SacreBLEU (detokenized): {results['sacrebleu']['line']}")


# ---------------------------------------------------------------- sentencepiece (option)


def _spm():
    try:
        import sentencepiece
    except ImportError:
        raise InputError(
            "--bpe sentencepiece needs the sentencepiece package (pip install sentencepiece)"
        )
    return sentencepiece


def cmd_spm_train(args):
    """A joint sentencepiece BPE model of --size pieces on the given files."""
    spm = _spm()
    for path in args.inputs:
        count_lines_utf8(path)
    folder = os.path.dirname(os.path.abspath(args.model))
    tmp_prefix = tempfile.mkdtemp(prefix=".spm.", dir=folder)
    try:
        spm.SentencePieceTrainer.train(
            input=",".join(args.inputs),
            model_prefix=os.path.join(tmp_prefix, "m"),
            vocab_size=args.size,
            model_type="bpe",
            character_coverage=1.0,
            input_sentence_size=args.sample,
            shuffle_input_sentence=True,
        )
        os.replace(os.path.join(tmp_prefix, "m.model"), args.model)
    finally:
        import shutil

        shutil.rmtree(tmp_prefix, ignore_errors=True)


def cmd_spm_encode(args):
    spm = _spm()
    if not os.path.isfile(args.model) or os.path.getsize(args.model) == 0:
        raise InputError(f"{args.model}: missing or empty sentencepiece model file")
    proc = spm.SentencePieceProcessor(model_file=args.model)
    count_lines_utf8(args.input)
    with atomic_write(args.output) as out:
        for line in read_lines(args.input):
            out.write(" ".join(proc.encode(line, out_type=str)) + "\n")


# ---------------------------------------------------------------- main


def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("check", help="files present, non-empty, UTF-8, equal line counts")
    s.add_argument("files", nargs="+")
    s.set_defaults(fn=lambda a: print(check_parallel(a.files)))

    s = sub.add_parser("tokenize", help="Moses normalise + tokenise -a (sacremoses)")
    s.add_argument("--lang", required=True)
    s.add_argument("--mode", choices=["train", "test"], default="train")
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(fn=cmd_tokenize)

    s = sub.add_parser("learn-bpe", help="subword-nmt learn-bpe on the inputs, with progress")
    s.add_argument("--symbols", type=int, required=True)
    s.add_argument("--output", required=True)
    s.add_argument("inputs", nargs="+")
    s.set_defaults(fn=cmd_learn_bpe)

    s = sub.add_parser("apply-bpe", help="subword-nmt apply-bpe, with progress")
    s.add_argument("--codes", required=True)
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(fn=cmd_apply_bpe)

    s = sub.add_parser("tokenizer-version", help="the tokeniser's version (stage marker)")
    s.set_defaults(fn=lambda a: print(tokenizer_version()))

    s = sub.add_parser("detokenize", help="Moses detokenise (sacremoses)")
    s.add_argument("--lang", required=True)
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_detokenize)

    s = sub.add_parser("clean", help="clean-corpus-n: length and ratio filter")
    for name in ("src-in", "tgt-in", "src-out", "tgt-out"):
        s.add_argument(f"--{name}", required=True)
    s.add_argument("--min-len", type=int, default=1)
    s.add_argument("--max-len", type=int, default=250)
    s.add_argument("--ratio", type=float, default=1.5)
    s.set_defaults(fn=cmd_clean)

    s = sub.add_parser("concat", help="concatenate parallel corpora PREFIX.{src,tgt}")
    s.add_argument("--src", required=True)
    s.add_argument("--tgt", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--max-lines", type=int, default=0)
    s.add_argument("prefixes", nargs="+")
    s.set_defaults(fn=cmd_concat)

    s = sub.add_parser("sgm", help="segments of a WMT SGML file")
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_sgm)

    s = sub.add_parser("check-data-bin", help="dictionaries and binarized splits complete")
    s.add_argument("--src", default="en")
    s.add_argument("--tgt", default="fr")
    s.add_argument("data_bin")
    s.set_defaults(fn=cmd_check_data_bin)

    s = sub.add_parser("extract", help="H-/T-/S- lines of fairseq-generate output, in order")
    s.add_argument("--kind", choices=["hyp", "ref", "src"], default="hyp")
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_extract_hyp)

    s = sub.add_parser("score", help="SacreBLEU (+ tokenized BLEU) into a JSON results file")
    s.add_argument("--hyp", required=True)
    s.add_argument("--ref", required=True, help="raw (untokenized) reference")
    s.add_argument("--detok-lang", help="detokenize --hyp with sacremoses first")
    s.add_argument("--detok-output")
    s.add_argument("--tok-hyp")
    s.add_argument("--tok-ref")
    s.add_argument("--fairseq-log", help="fairseq-generate output with its BLEU4 line")
    s.add_argument("--results")
    s.add_argument("--merge", action="store_true")
    s.add_argument("--meta", nargs=2, action="append", metavar=("KEY", "VALUE"))
    s.add_argument("--averaged", nargs="*", default=[], help="the checkpoints averaged")
    s.set_defaults(fn=cmd_score)

    s = sub.add_parser("spm-train", help="sentencepiece BPE model (the --bpe sentencepiece option)")
    s.add_argument("--size", type=int, required=True)
    s.add_argument("--model", required=True)
    s.add_argument("--sample", type=int, default=10_000_000)
    s.add_argument("inputs", nargs="+")
    s.set_defaults(fn=cmd_spm_train)

    s = sub.add_parser("spm-encode", help="segment with a sentencepiece model")
    s.add_argument("--model", required=True)
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_spm_encode)

    return p


def run_cli(
    parser: argparse.ArgumentParser, argv: Optional[List[str]] = None, prog: Optional[str] = None
) -> int:
    """Run the sub-command ``parser`` selects; bad input is one error line ``PROG: error: ...``
    (``prog``, default this pipeline's name), exit 1."""
    args = parser.parse_args(argv)
    try:
        args.fn(args)
    except InputError as err:
        print(f"{prog or PROG}: error: {err}", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_cli(get_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
