"""The plugin's error type, and where it becomes a one-line exit.

Library code (``build_model``, ``load_state_dict``, the settings reader, the importers)
raises :class:`RealformerConfigError`, a ``ValueError`` whose message is one line: a hub
user in a notebook, a sweep loop or a test harness can catch it and goes on.

Only command-line entry points turn it into ``prog: error: <message>`` and exit status 1:
the plugin's own console commands (each wraps its ``main`` in :func:`exit_with_one_line`, the
project's one helper, :mod:`realformer_pipelines.errors`, which the pipelines' tools use too),
and fairseq's console commands (``fairseq-train``, ``fairseq-hydra-train``,
``fairseq-generate``, ...), in which the model's ``build_model`` / ``load_state_dict`` are
decorated with :func:`one_line_under_fairseq_commands`. fairseq wraps what
``load_state_dict`` raises into a bare ``Exception("Cannot load model parameters ...")``
and hydra prints its own traceback for an ``Exception``, so under those commands the
error must leave as ``SystemExit``, which neither catches.
"""

import functools
import os
import sys

from realformer_pipelines.errors import InputError, exit_with_one_line  # noqa: F401


class RealformerConfigError(InputError):
    """A flag or checkpoint that this plugin cannot use; the message (one line) says why. An
    :class:`~realformer_pipelines.errors.InputError` (a ``ValueError``), the error every console
    command of the project turns into one line with the same helper."""


class RealformerCheckpointError(RealformerConfigError):
    """A checkpoint file that cannot be read (truncated, corrupt); the message names it."""


def running_a_fairseq_command() -> bool:
    """Is this process a fairseq console command (``fairseq-train``, ``fairseq-hydra-train``,
    ``fairseq-generate``, ``fairseq-interactive``, ``fairseq-eval-lm``, ``fairseq-validate``,
    ... or ``python -m fairseq_cli.<name>``)? Spawned distributed workers inherit the
    parent's ``sys.argv`` and answer as it does."""
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if program.startswith("fairseq-"):
        return True
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return bool(spec is not None and (spec.name or "").startswith("fairseq_cli."))


def one_line_under_fairseq_commands(fn):
    """Under a fairseq console command, turn :class:`RealformerConfigError` into one line
    ``realformer_fairseq: error: ...`` and exit status 1 (``SystemExit``); anywhere else
    (Python code, notebooks, tests) let it propagate."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RealformerConfigError as err:
            if running_a_fairseq_command():
                raise SystemExit(f"realformer_fairseq: error: {err}") from None
            raise

    return wrapper
