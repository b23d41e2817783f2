"""One-line start-up errors for bad flag combinations."""

import functools
import sys

PROG = "realformer_fairseq"
_HOOK_FLAG = "_realformer_one_line"


class RealformerConfigError(ValueError):
    """A flag or checkpoint that this plugin cannot use; the message says why."""


class RealformerCheckpointError(RealformerConfigError):
    """A checkpoint file that cannot be read (truncated, corrupt); the message names it."""


def exit_on_config_error(fn):
    """Turn a RealformerConfigError raised at start-up into one error line
    (``realformer_fairseq: error: ...``, printed by Python on stderr) and exit
    status 1, instead of a stack trace. ``SystemExit`` is no ``Exception``, so
    fairseq's ``except Exception`` handlers (e.g. around checkpoint loading)
    let it through."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RealformerConfigError as err:
            raise SystemExit(f"realformer_fairseq: error: {err}") from None

    return wrapper


def install_one_line_excepthook():
    """An uncaught :class:`RealformerConfigError` ends the process with the one line
    ``realformer_fairseq: error: ...`` on stderr (exit status 1, as for any uncaught exception)
    instead of a traceback: what a console command (``fairseq-generate``, ``fairseq-train``, ...)
    shows. Other exceptions go to the previous hook unchanged, and code that catches the error (a
    notebook, a sweep loop, a test) gets the exception itself (idempotent)."""
    previous = sys.excepthook
    if getattr(previous, _HOOK_FLAG, False):
        return

    def one_line_excepthook(exc_type, exc, tb):
        if issubclass(exc_type, RealformerConfigError):
            sys.stderr.write(f"{PROG}: error: {exc}\n")
        else:
            previous(exc_type, exc, tb)

    setattr(one_line_excepthook, _HOOK_FLAG, True)
    sys.excepthook = one_line_excepthook
