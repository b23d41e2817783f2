"""How the project's console commands import torch and fairseq: with Python's cyclic garbage
collector paused while they load (about 200,000 objects, which it would otherwise scan again and
again), then those objects frozen (:func:`gc.freeze`: moved to a permanent generation that the
collector never scans, which also spares the scan at exit). Measured on this project's 2-core
CPU machine: ``python -c "import fairseq"`` 3.1 s, the same with the collector paused and the
objects frozen 2.05 s. Python's documentation suggests :func:`gc.freeze` for objects that live
as long as the process, as imported modules do.

Only console commands do this: the entry point of the process itself (a console script's
``cli_main``, a script's ``if __name__ == "__main__"`` block) calls :func:`mark_console_command`
first. The same commands' ``main`` functions called from Python code (tests, notebooks,
:func:`~realformer_pipelines.errors.run_cli`) import as usual, and the collector of that process
is left as it was.
"""

import contextlib
import gc

_console_command = False


def mark_console_command() -> None:
    """This process is one of the project's console commands: freeze what it imported so far
    (a ``realformer-*`` command has imported fairseq with the package), and let
    :func:`heavy_imports` do its work."""
    global _console_command
    _console_command = True
    gc.freeze()


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
