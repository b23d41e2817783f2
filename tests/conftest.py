"""Test-suite hygiene shared by all tests, and what lets the suite run on several pytest-xdist
workers at once (pyproject.toml's addopts: ``-n auto --dist loadgroup``; ``-n 0`` runs it in
one process).

Parallel safety, in one place:

* every worker runs torch on one thread, and the commands it starts get ``OMP_NUM_THREADS=1`` /
  ``MKL_NUM_THREADS=1`` unless the caller set them: two workers on two cores, not four threads
  fighting over two cores;
* each worker starts a fork server (tests/fork_server.py): the commands that import fairseq
  start from a process that has torch, scikit-learn, scipy and fairseq imported, most of their
  CPU before they read an argument (``REALFORMER_TEST_FORK_SERVER=0``: every command fresh);
* tests that share a fixture wider than one test (module, class or session scope: a trained
  model, a data-bin, the README's quick-start folder) run on one worker, in file order: this
  file gives each of them an ``xdist_group`` named after the fixtures they share (a test may also
  carry its own ``@pytest.mark.xdist_group``), so each such fixture is built once a run, not once
  per worker, and tests that rely on the order of their file (the README's command blocks on one
  quick-start folder) keep it;
* what several workers need at once and is costly is built once per run under a file lock
  (:func:`built_once`), in the run's temporary folder;
* the rest is each test's own: ``tmp_path`` for files (never the checkout), ``monkeypatch`` for
  the environment, a free port for anything that listens.
"""

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest

WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... in an xdist worker

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# the run's shared folder (harness.run_dir, harness.built_once): made here, in the process that
# starts the run, so that the workers it starts inherit it; removed when that process ends
RUN_DIR_VARIABLE = "REALFORMER_TEST_RUN_DIR"  # = harness.RUN_DIR_VARIABLE
_own_run_dir = None
if not os.environ.get(RUN_DIR_VARIABLE):
    _own_run_dir = tempfile.mkdtemp(prefix="realformer-tests-")
    os.environ[RUN_DIR_VARIABLE] = _own_run_dir


_fork_server = None


def _runs_tests(config):
    """A worker, or the one process of ``-n 0`` (not the controller of the workers)."""
    return bool(WORKER) or not (config.getoption("dist", "no") != "no" and config.getoption("tx"))


def pytest_configure(config):
    if _runs_tests(config):
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        _start_fork_server()


def _start_fork_server():
    """This process's fork server (tests/fork_server.py), which its commands and their commands
    (every process started after this inherits the environment set here) find by
    REALFORMER_TEST_FORK_SERVER; REALFORMER_TEST_FORK_SERVER=0 beforehand: none."""
    global _fork_server
    import subprocess
    import sys

    import fork_server

    if os.environ.get(fork_server.SOCKET_VARIABLE) == "0":
        return
    address = os.path.join(os.environ[RUN_DIR_VARIABLE], f"fork-server-{WORKER or 'main'}")
    os.environ[fork_server.SOCKET_VARIABLE] = address
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (fork_server.HOOK_DIR, os.environ.get("PYTHONPATH")) if p
    )
    with open(address + ".log", "ab") as log:
        _fork_server = subprocess.Popen(
            [sys.executable, fork_server.__file__, address],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def pytest_unconfigure(config):
    if _fork_server is not None:
        _fork_server.kill()
        _fork_server.wait()
    if _own_run_dir:
        shutil.rmtree(_own_run_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def restore_root_logging():
    """Console commands run in-process (``cli_main``) reconfigure the root logger
    with ``force=True`` on pytest's captured stderr, which is closed after the
    test; put the previous handlers back so later tests do not log into it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


# ---------------------------------------------------------------------------
# grouping the tests that share a fixture onto one worker


def _shared_fixtures(item):
    """The fixtures wider than a test that ``item`` uses, defined by this test suite (not by
    pytest or a plugin: their baseid is empty), as "path::name"."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    shared = []
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if not defs:
            continue
        fixturedef = defs[-1]
        if fixturedef.scope != "function" and fixturedef.baseid:
            module = Path(fixturedef.func.__code__.co_filename).name
            shared.append(f"{module}::{name}")
    return shared


def _group_names(item):
    """The item's xdist_group names (one, once collection_modifyitems below has run)."""
    return sorted(
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Give every test that shares a fixture of module, class or session scope with another
    test, directly or through a chain of such fixtures, one ``xdist_group``: with
    ``--dist loadgroup`` the group runs on one worker, in collection order."""
    parent = {}

    def find(key):
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    keys = {}
    for item in items:
        # a test that asks for a shared fixture lazily (request.getfixturevalue) joins its
        # group with @pytest.mark.xdist_group("FILE::FIXTURE"), the name given here
        keys[item] = _group_names(item) + _shared_fixtures(item)
        for other in keys[item][1:]:
            parent[find(other)] = find(keys[item][0])
    members = {}
    for item in items:
        if keys[item]:
            members.setdefault(find(keys[item][0]), []).append(item)
    for group in members.values():
        explicit = sorted({name for item in group for name in _group_names(item)})
        if len(explicit) > 1:
            raise pytest.UsageError(
                f"tests {group[0].nodeid} and others share a fixture but carry different "
                f"xdist_group marks {explicit}: give them one"
            )
        if explicit:
            name = explicit[0]
        else:
            fixtures = sorted({f for item in group for f in _shared_fixtures(item)})
            name = fixtures[0] if len(fixtures) == 1 else f"{fixtures[0]}+{len(fixtures) - 1}"
        for item in group:
            if not _group_names(item):
                item.add_marker(pytest.mark.xdist_group(name))


# ---------------------------------------------------------------------------
# the scheduler of --dist loadgroup: the groups above, passed from the workers (which collect) to
# the controller (which schedules) in a file of the run's folder. xdist's own loadgroup passes them
# as a suffix of each test id, which pytest >= 9.2 no longer lets a plugin change: every group was
# silently spread over the workers (pytest-dev/pytest-xdist#1386).

GROUPS_FOLDER = "xdist-groups"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    """In a worker, before it reports its collection: test id -> group of the grouped tests."""
    if WORKER:
        groups = {}
        for item in session.items:
            names = _group_names(item)
            if names:
                groups[item.nodeid] = names[0]
        folder = Path(os.environ[RUN_DIR_VARIABLE]) / GROUPS_FOLDER
        folder.mkdir(exist_ok=True)
        tmp = folder / f".{WORKER}.json.tmp"
        tmp.write_text(json.dumps(groups), encoding="utf-8")
        tmp.replace(folder / f"{WORKER}.json")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        """xdist's loadgroup scheduling (a group is one unit of work, run by one worker in
        collection order; the largest units first) on the groups the workers wrote."""

        groups = None

        def _split_scope(self, nodeid):
            if self.groups is None:
                self.groups = {}
                for path in sorted(
                    (Path(os.environ[RUN_DIR_VARIABLE]) / GROUPS_FOLDER).glob("*.json")
                ):
                    self.groups.update(json.loads(path.read_text(encoding="utf-8")))
            return self.groups.get(nodeid, nodeid)

    return SharedFixtureScheduling(config, log)
