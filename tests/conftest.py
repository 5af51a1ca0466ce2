"""Settings for the whole suite, made before any test module imports fusegrad's compiler."""

from __future__ import annotations

import os

# Whole steps compile synchronously in tests: whether a call runs compiled code then depends on
# what the test did, never on a background thread's timing.  The background compile is tested
# on its own (tests/compiler/test_background_compile.py switches it on).  Subprocesses the tests
# start inherit it.
os.environ.setdefault("FUSEGRAD_BACKGROUND_COMPILE", "0")


# The CUDA suites (tests/test_cuda_suites.py) run in pytest processes of their own for minutes:
# started once collection has chosen them, they use the second core while this process runs the
# rest, and are stopped when the session ends (if a failure ended it first).
_cuda_suites = None


def pytest_collection_finish(session):  # type: ignore[no-untyped-def]
    global _cuda_suites
    for item in session.items:
        if item.path.name == "test_cuda_suites.py":
            _cuda_suites = item.module
            _cuda_suites.start_early()
            break


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    if _cuda_suites is not None:
        _cuda_suites.stop_all()
