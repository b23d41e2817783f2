"""The one error of the project's command-line tools, and where it becomes one line.

Library code raises :class:`InputError` (a ``ValueError`` whose message is one line: a bad
input file, a flag that contradicts the model, ...); only a console command's entry point turns
it into ``PROG: error: <message>`` on stderr and exit status 1, with :func:`exit_with_one_line`
(a decorator of the command's ``main``) or :func:`run_cli` (an argparse parser whose
sub-commands set ``fn``). Neither changes the process: a ``main`` called from Python code
(tests, notebooks) leaves it as it was; only the console-script entry point itself
(``cli_main``, a script's ``if __name__ == "__main__"`` block) goes through
:func:`realformer_pipelines.startup.console_entry_point`. The plugin's
:class:`realformer_fairseq.errors.RealformerConfigError` is an :class:`InputError`, so the same
helper serves every console command of the project.
"""

import functools
import os
import sys
from typing import List, Optional

# the exit status of every one-line error (argparse's own usage errors keep argparse's 2)
EXIT_STATUS = 1


class InputError(ValueError):
    """Bad input (a file, a flag, a checkpoint); the message is one line that names it."""


def one_line(err: BaseException) -> str:
    """The message of ``err`` on one line (white space runs joined)."""
    return " ".join(str(err).split())


def exit_with_one_line(prog: str):
    """Decorator for a console command's ``main``: an :class:`InputError` (or an ``OSError``:
    a file that cannot be read or written) becomes ``prog: error: <message>`` on stderr and exit
    status 1 (a closed pipe on stdout: exit status 1 without a line); anything else is a bug and
    keeps its traceback."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except BrokenPipeError:  # the reader went away (| head): no error line to write
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise SystemExit(EXIT_STATUS) from None
            except (InputError, OSError) as err:
                print(f"{prog}: error: {one_line(err)}", file=sys.stderr, flush=True)
                raise SystemExit(EXIT_STATUS) from None

        return wrapper

    return decorate


def run_cli(parser, argv: Optional[List[str]] = None, prog: Optional[str] = None) -> int:
    """Parse ``argv`` with ``parser`` and run the sub-command's ``fn(args)``; an error is one
    line ``PROG: error: ...`` (``prog``, default the parser's) and exit status 1. Returns 0."""

    @exit_with_one_line(prog or parser.prog)
    def main():
        args = parser.parse_args(argv)
        args.fn(args)
        return 0

    return main()
