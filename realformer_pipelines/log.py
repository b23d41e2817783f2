"""fairseq-style log lines of the pipelines' Python steps, on stderr, named after the pipeline
(``$REALFORMER_PIPELINE_NAME``, which ``examples/common/pipeline.sh`` exports)::

    2024-01-01 12:00:00 | INFO | wmt14_en_fr | tokenize train.en: 1200000 lines, 52000 lines/s

Progress bars (carriage-return updates) only on a terminal (:func:`bar_on_stderr`); a log
redirected to a file gets the periodic lines of :class:`Progress` instead.
"""

import os
import sys
import time
from typing import Iterable, Iterator, Optional


def pipeline_name() -> str:
    """The running pipeline's name (log lines, ``NAME: error: ...`` lines)."""
    return os.environ.get("REALFORMER_PIPELINE_NAME", "") or "realformer_pipelines"


def log(message: str, level: str = "INFO"):
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    print(f"{stamp} | {level} | {pipeline_name()} | {message}", file=sys.stderr, flush=True)


def warn(message: str):
    log(message, "WARNING")


def bar_on_stderr() -> bool:
    """Whether a progress bar may draw on stderr: only on a terminal (as fairseq's own
    ``progress_bar`` decides); redirected, its carriage-return updates would fill the log."""
    return sys.stderr.isatty()


class Progress:
    """Log lines while a long CPU step runs, every $REALFORMER_PROGRESS_SECONDS seconds
    (default 30) and once at the end: ``tokenize train.en: 1200000 lines, 52000 lines/s``.
    ``periodic=False``: only the line at the end (a progress bar shows the rest)."""

    def __init__(self, what: str, unit: str = "lines", periodic: bool = True):
        self.what, self.unit, self.n = what, unit, 0
        every = float(os.environ.get("REALFORMER_PROGRESS_SECONDS", "30"))
        self.every = every if periodic else float("inf")
        self.start = self.last = time.monotonic()

    def update(self, k: int = 1):
        self.n += k
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self.log(now)

    def log(self, now: Optional[float] = None, end: str = ""):
        elapsed = max((now or time.monotonic()) - self.start, 1e-9)
        log(f"{self.what}: {self.n} {self.unit}, {self.n / elapsed:.0f} {self.unit}/s{end}")

    def done(self):
        self.log(end=" (done)")


def progress_lines(lines: Iterable[str], progress: Progress) -> Iterator[str]:
    for line in lines:
        yield line
        progress.update()
