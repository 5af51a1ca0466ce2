"""Settings for the whole suite, made before any test module imports fusegrad's compiler."""

from __future__ import annotations

import os

import pytest

# Whole steps compile synchronously in tests: whether a call runs compiled code then depends on
# what the test did, never on a background thread's timing.  The background compile is tested
# on its own (tests/compiler/test_background_compile.py switches it on).  Subprocesses the tests
# start inherit it.
os.environ.setdefault("FUSEGRAD_BACKGROUND_COMPILE", "0")
# A trial between two candidate programs is run again in every test, whatever earlier runs left
# in the disk cache (tests/compiler/test_background_compile.py switches remembering on to test it).
os.environ.setdefault("FUSEGRAD_REMEMBER_TRIALS", "0")


# The suites that run as pytest processes of their own (tests/early_suites.py: the CUDA suites,
# the autograd suite under compiled autograd) start as soon as the session knows it runs their
# tests -- in the one pytest process, or in pytest-xdist's controller when the first worker has
# collected -- and take their minutes on a free core while the rest runs; they are stopped when
# the session ends (if a failure ended it first).
import early_suites  # noqa: E402  (tests/ is on the path: rootdir conftest)


def _start_early(nodeids: list[str]) -> None:
    files = {nodeid.split("::", 1)[0] for nodeid in nodeids}
    for suite in early_suites.wanted(files):
        early_suites.start(suite)


def pytest_configure(config):  # type: ignore[no-untyped-def]
    if not hasattr(config, "workerinput"):  # (the controller, or the one process)
        early_suites.directory()  # made now: xdist's workers inherit it


def pytest_collection_finish(session):  # type: ignore[no-untyped-def]
    if not hasattr(session.config, "workerinput"):
        _start_early([item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)  # (a pytest-xdist hook: without xdist, never called)
def pytest_xdist_node_collection_finished(node, ids):  # type: ignore[no-untyped-def]
    _start_early(ids)  # (xdist's controller: a worker's collected, selected test ids)


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    early_suites.stop_all()
