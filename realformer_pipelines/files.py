"""Files that appear whole or not at all, and lines read with the error that names them: the
one atomic-write helper of the project (the plugin's ``realformer_fairseq.atomic_files``, its
importer and every pipeline use these).

Everything is written to a temporary name in the destination's folder and renamed over the
destination when complete, so that an interrupted or failing step never leaves a half-written
file, or a half-filled folder, under the final name. No imports beyond the standard library.
"""

import contextlib
import json
import os
import shutil
import tempfile
from typing import IO, Iterator, List, Union

from .errors import InputError

PathLike = Union[str, "os.PathLike[str]"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path: PathLike) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on a normal exit it replaces ``path``, on an
    exception it is removed and ``path`` is left as it was. The file gets the mode an ordinary
    ``open()`` would give (``mkstemp`` makes files private to the owner)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def atomic_write(path: PathLike) -> Iterator[IO[str]]:
    """A UTF-8 text file (``\\n`` line ends) open for writing under a temporary name next to
    ``path``, renamed to ``path`` only when the ``with`` block ends without an exception."""
    with atomic_output(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            yield fh


def write_text_atomic(path: PathLike, text: str):
    with atomic_write(path) as fh:
        fh.write(text)


def write_json_atomic(path: PathLike, obj, **dump_options):
    """``json.dump(obj, indent=1, **dump_options)`` plus a final newline, atomically."""
    write_text_atomic(path, json.dumps(obj, indent=1, **dump_options) + "\n")


@contextlib.contextmanager
def atomic_directory(path: PathLike, overwrite: bool = False) -> Iterator[str]:
    """Yield a temporary folder next to ``path`` to fill; on a normal exit it becomes ``path``
    (an existing ``path`` is replaced only with ``overwrite``, else :class:`InputError` before
    anything is written), on an exception it is removed and ``path`` is left as it was."""
    path = os.path.abspath(os.fspath(path))
    if os.path.lexists(path) and not overwrite:
        raise InputError(f"{path} exists (pass --overwrite to replace it)")
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.chmod(tmp, 0o777 & ~_umask())
    old = None
    try:
        yield tmp
        if os.path.lexists(path):  # overwrite: the old folder goes only once the new one is in
            old = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".old")
            os.rmdir(old)
            os.replace(path, old)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old, path)
                old = None
                raise
        else:
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and os.path.lexists(old):
            if os.path.isdir(old) and not os.path.islink(old):
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.remove(old)


def read_lines(path: PathLike) -> Iterator[str]:
    """Lines without their newline; UTF-8 errors become an InputError naming the line."""
    with open(path, encoding="utf-8", errors="strict", newline="\n") as fh:
        line_no = 0
        try:
            for line_no, line in enumerate(fh, 1):
                yield line.rstrip("\n").rstrip("\r")
        except UnicodeDecodeError:
            raise InputError(f"{path}: not valid UTF-8 at line {line_no + 1}") from None


def read_column(path: PathLike) -> List[str]:
    """Every line of a one-column file (labels, predictions, indices)."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: missing file")
    return list(read_lines(path))
