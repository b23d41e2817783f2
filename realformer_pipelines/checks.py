"""Input checks of the pipelines: every input is present, non-empty and UTF-8, parallel files
have the same number of lines, and a binarized fairseq dataset holds every byte its index points
to. A failed check raises :class:`~realformer_pipelines.errors.InputError` naming the file and
the problem (line or byte)."""

import codecs
import os
import struct
from typing import Sequence, Tuple

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


# fairseq 0.12.3 data/indexed_dataset.py: MMapIndexedDataset.Index's header and its dtype codes
MMAP_INDEX_MAGIC = b"MMIDIDX\x00\x00"
MMAP_DTYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 8, 8: 2, 9: 4, 10: 8}


def read_mmap_index(idx_path: str) -> Tuple[int, int]:
    """(sentences, bytes of ``.bin`` they need) of a fairseq mmap index ``X.idx``, read as
    fairseq 0.12.3's ``MMapIndexedDataset.Index.__init__`` reads it (magic, version 1, dtype
    code, count, then int32 sizes and int64 pointers), without importing fairseq (2.5 CPU
    seconds a process); tests/test_pipeline.py checks it against fairseq's own reader. Raises
    InputError when the file is not such an index or is cut short."""
    import numpy as np

    if not os.path.isfile(idx_path):
        raise InputError(f"{idx_path}: missing binarized index (run prepare.sh)")
    with open(idx_path, "rb") as stream:
        head = stream.read(9 + 8 + 1 + 8)
    if head[:9] != MMAP_INDEX_MAGIC:
        raise InputError(f"{idx_path}: not a fairseq index file (dataset-impl mmap)")
    if len(head) < 26:
        raise InputError(f"{idx_path}: not a fairseq index file or truncated (header)")
    (version,) = struct.unpack("<Q", head[9:17])
    (dtype_code,) = struct.unpack("<B", head[17:18])
    (n,) = struct.unpack("<Q", head[18:26])
    if version != 1 or dtype_code not in MMAP_DTYPE_SIZES:
        raise InputError(
            f"{idx_path}: not a fairseq index file (version {version}, dtype code {dtype_code})"
        )
    if os.path.getsize(idx_path) < 26 + 12 * n:
        raise InputError(
            f"{idx_path}: not a fairseq index file or truncated ({os.path.getsize(idx_path)} "
            f"bytes for {n} sentences)"
        )
    if n == 0:
        return 0, 0
    with open(idx_path, "rb") as stream:
        stream.seek(26 + 4 * (n - 1))
        (last_size,) = np.frombuffer(stream.read(4), dtype="<i4")
        stream.seek(26 + 4 * n + 8 * (n - 1))
        (last_pointer,) = np.frombuffer(stream.read(8), dtype="<i8")
    return n, int(last_pointer) + int(last_size) * MMAP_DTYPE_SIZES[dtype_code]


def check_binarized(idx_path: str) -> int:
    """A fairseq mmap dataset (``X.idx`` + ``X.bin``) whose ``.bin`` holds every byte its index
    points to; returns the number of sentences. fairseq 0.12.3 itself reads such a file
    lazily and fails in the middle of training with a numpy traceback."""
    bin_path = idx_path[: -len(".idx")] + ".bin"
    if not os.path.isfile(bin_path):
        raise InputError(f"{bin_path}: missing (its index {idx_path} exists)")
    n, need = read_mmap_index(idx_path)
    have = os.path.getsize(bin_path)
    if have < need:
        raise InputError(
            f"{bin_path}: truncated ({have} bytes, its index {os.path.basename(idx_path)} "
            f"needs {need}); binarize again (prepare.sh --force)"
        )
    return n
