"""Input checks of the pipelines: every input is present, non-empty and UTF-8, parallel files
have the same number of lines, and a binarized fairseq dataset holds every byte its index points
to. A failed check raises :class:`~realformer_pipelines.errors.InputError` naming the file and
the problem (line or byte)."""

import codecs
import os
from typing import Sequence

from .errors import InputError

BLOCK = 1 << 22


def count_lines_utf8(path: str) -> int:
    """Number of lines of ``path``; raises InputError if absent, empty or not UTF-8."""
    if not os.path.exists(path):
        raise InputError(f"{path}: missing input file")
    if not os.path.isfile(path):
        raise InputError(f"{path}: not a regular file")
    if os.path.getsize(path) == 0:
        raise InputError(f"{path}: empty file")
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
