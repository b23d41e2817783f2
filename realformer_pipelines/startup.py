"""How the project's console commands import torch and fairseq: with Python's cyclic garbage
collector paused while they load (about 200,000 objects, which it would otherwise scan again and
again), then those objects frozen (:func:`gc.freeze`: moved to a permanent generation that the
collector never scans, which also spares the scan at exit). Measured on this project's 2-core
CPU machine: ``python -c "import fairseq"`` 3.1 s, the same with the collector paused and the
objects frozen 2.05 s. Python's documentation suggests :func:`gc.freeze` for objects that live
as long as the process, as imported modules do.

Only console commands do this: the entry point of the process itself (a console script's
``cli_main``, decorated with :func:`console_entry_point`; a script's ``if __name__ ==
"__main__"`` block, ``sys.exit(console_entry_point(main)())``) marks the process first. The same
commands' ``main`` functions called from Python code (tests, notebooks,
:func:`~realformer_pipelines.errors.run_cli`) import as usual, and the collector of that process
is left as it was.

A frozen object is never collected, not even by the collection at the interpreter's exit. That
costs nothing (the process ends), except where an extension module checks at exit that none of
its objects is still alive: triton's bindings (nanobind) print a "leaked instance" line for each,
27 lines after a command's one-line error. Where triton is imported, the command's exit unfreezes
first (:func:`_unfreeze_at_exit_where_triton_is_imported`), so that collection frees them; about
0.14 s of CPU at exit (measured 2026-12-07 on a process that imported fairseq and the plugin), so
only there.
"""

import atexit
import contextlib
import functools
import gc
import sys

_console_command = False


def console_entry_point(function):
    """Decorator of a console command's entry point (every console script of setup.py, and a
    script's ``if __name__ == "__main__"`` block: ``sys.exit(console_entry_point(main)())``):
    marks the process as the command (:func:`mark_console_command`), then runs ``function`` and
    returns what it returns."""

    @functools.wraps(function)
    def entry_point(*args, **kwargs):
        mark_console_command()
        return function(*args, **kwargs)

    entry_point.console_entry_point = True
    return entry_point


def mark_console_command() -> None:
    """This process is one of the project's console commands: freeze what it imported so far
    (a ``realformer-*`` command has imported fairseq with the package), and let
    :func:`heavy_imports` do its work. Called by :func:`console_entry_point`."""
    global _console_command
    if not _console_command:
        atexit.register(_unfreeze_at_exit_where_triton_is_imported)
    _console_command = True
    gc.freeze()


def _unfreeze_at_exit_where_triton_is_imported() -> None:
    """At exit (the last of the ``atexit`` functions, registered first): where triton is
    imported, the frozen objects back in the collector's care, so that the interpreter's last
    collection frees triton's objects before nanobind's check for leaks (see the module's
    docstring)."""
    if "triton" in sys.modules:
        gc.unfreeze()


@contextlib.contextmanager
def heavy_imports():
    """Around the import of torch / fairseq / the plugin inside a command: in a console command,
    the collector paused during the imports and what they loaded frozen after; elsewhere,
    nothing."""
    if not _console_command:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
