"""Run by every Python process of a test run as it starts (the suite puts this folder on
PYTHONPATH): a command that imports fairseq (its console scripts, the plugin's, the pipelines'
helpers that read checkpoints) hands itself to the run's fork server (tests/fork_server.py); any
other process goes on as it would have, after a few microseconds. A ``sitecustomize`` of the
environment's own, if any, still runs."""

import os
import sys

# a cheap first look (the server's module decides): a console script, a pipeline helper file or
# the pipelines' tools module (fork_server.CONSOLE_SCRIPTS, fork_server.HELPERS)
if (
    os.environ.get("REALFORMER_TEST_FORK_SERVER", "0") != "0"
    and len(sys.orig_argv) > 1
    and (
        os.path.basename(sys.orig_argv[1]).startswith(("fairseq-", "realformer-"))
        or os.path.basename(sys.orig_argv[1])
        in ("glue_tools.py", "squad_model.py", "pretrain_tools.py")
        or sys.orig_argv[1:3] == ["-m", "realformer_pipelines.tools"]
    )
):
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "realformer_test_fork_server",
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fork_server.py"),
    )
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _module.delegate()  # returns only where the process runs its command itself
    del _spec, _module


def _chain():
    """Import the sitecustomize this one hides (the next on sys.path), as Python would have."""
    import importlib

    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    this = sys.modules.pop("sitecustomize")
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        sys.modules["sitecustomize"] = this
    finally:
        sys.path[:] = saved


_chain()
