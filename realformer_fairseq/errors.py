"""One-line start-up errors for bad flag combinations."""

import functools


class RealformerConfigError(ValueError):
    """A flag or checkpoint that this plugin cannot use; the message says why."""


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
