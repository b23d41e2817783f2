"""Files that appear whole or not at all: the one atomic-write helper of the project.

Everything the plugin, its console commands and the studies write (ADMIN's ``--admin-profile-out``
JSON, averaged checkpoints, attention statistics and plots, study reports and logs) is written
to a temporary file in the destination's folder and renamed over the destination, so that an
interrupted run never leaves a half-written file under the final name. No imports from the rest
of the package.
"""

import contextlib
import json
import os
import tempfile
from typing import Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def atomic_output(path: PathLike) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on a normal exit it replaces ``path``, on an
    exception it is removed and ``path`` is left as it was. The file gets the mode an ordinary
    ``open()`` would give (``mkstemp`` makes files private to the owner)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text_atomic(path: PathLike, text: str):
    with atomic_output(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)


def write_json_atomic(path: PathLike, obj, **dump_options):
    """``json.dump(obj, indent=1, **dump_options)`` plus a final newline, atomically."""
    write_text_atomic(path, json.dumps(obj, indent=1, **dump_options) + "\n")
