"""Test-suite hygiene shared by all tests."""

import logging

import pytest


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
