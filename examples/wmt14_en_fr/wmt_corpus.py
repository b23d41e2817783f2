"""The WMT'14 En-Fr corpora as fairseq's ``prepare-wmt14en2fr.sh`` assembles them (RealFormer,
He et al. 2020, arXiv 2012.11747, reports its WMT'14 En-Fr results on that data): parallel
corpora concatenated, newstest2014 taken from its SGML files, ``clean-corpus-n.perl -ratio 1.5
... 1 250`` on the training pairs, and the check of a binarized data-bin. Library functions:
they raise InputError and return counts; text_tools.py's commands print."""

import os
import re
from typing import Sequence

from realformer_pipelines.checks import check_binarized, check_parallel, count_lines_utf8
from realformer_pipelines.errors import InputError
from realformer_pipelines.files import atomic_write, read_lines


def clean_corpus(
    src_in: str,
    tgt_in: str,
    src_out: str,
    tgt_out: str,
    min_len: int = 1,
    max_len: int = 250,
    ratio: float = 1.5,
) -> tuple:
    """clean-corpus-n.perl -ratio R: drop pairs with a side outside [min, max] tokens or a token
    ratio above R (the Moses script counts words after collapsing whitespace; so does this).
    Returns (kept, total)."""
    n = check_parallel([src_in, tgt_in])
    kept = 0
    with atomic_write(src_out) as src_fh, atomic_write(tgt_out) as tgt_fh:
        for src, tgt in zip(read_lines(src_in), read_lines(tgt_in)):
            src_words, tgt_words = src.split(), tgt.split()
            ns, nt = len(src_words), len(tgt_words)
            if ns < min_len or nt < min_len or ns > max_len or nt > max_len:
                continue
            if ns / nt > ratio or nt / ns > ratio:
                continue
            src_fh.write(" ".join(src_words) + "\n")
            tgt_fh.write(" ".join(tgt_words) + "\n")
            kept += 1
        if kept == 0:  # raised inside the with: neither output is renamed into place
            raise InputError(
                f"{src_in}, {tgt_in}: no sentence pair survived cleaning "
                f"(lengths {min_len}-{max_len}, ratio {ratio})"
            )
    return kept, n


def concat_corpora(prefixes: Sequence[str], langs: Sequence[str], out: str, max_lines: int = 0):
    """Parallel corpora PREFIX.{lang} (each checked) into OUT.{lang}, optionally the first
    ``max_lines`` pairs."""
    for prefix in prefixes:
        check_parallel([f"{prefix}.{lang}" for lang in langs])
    for lang in langs:
        written = 0
        with atomic_write(f"{out}.{lang}") as fh:
            for prefix in prefixes:
                for line in read_lines(f"{prefix}.{lang}"):
                    if max_lines and written >= max_lines:
                        break
                    fh.write(line + "\n")
                    written += 1
    check_parallel([f"{out}.{lang}" for lang in langs])


def sgm_segments(input_path: str, output_path: str) -> int:
    """Segments of a WMT SGML file (``<seg id=..>text</seg>``), as fairseq's recipe extracts
    newstest2014 (grep '<seg id' | sed ...); returns their number."""
    count_lines_utf8(input_path)
    seg = re.compile(r"<seg[^>]*>\s*(.*?)\s*</seg>")
    n = 0
    with atomic_write(output_path) as out:
        for line in read_lines(input_path):
            match = seg.search(line)
            if match:
                out.write(match.group(1) + "\n")
                n += 1
        if n == 0:  # raised inside the with: nothing is renamed into place
            raise InputError(f"{input_path}: no <seg> lines (not a WMT SGML file?)")
    return n


def check_data_bin(data_bin: str, langs: Sequence[str]):
    """The data-bin's dictionaries and every binarized split are complete."""
    for lang in langs:
        count_lines_utf8(os.path.join(data_bin, f"dict.{lang}.txt"))
    indexes = sorted(
        os.path.join(data_bin, name) for name in os.listdir(data_bin) if name.endswith(".idx")
    )
    if not indexes:
        raise InputError(f"{data_bin}: no binarized data (*.idx); run prepare.sh")
    for idx in indexes:
        check_binarized(idx)
