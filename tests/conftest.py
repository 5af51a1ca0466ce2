"""Settings for the whole suite, made before any test module imports fusegrad's compiler."""

from __future__ import annotations

import os

# Whole steps compile synchronously in tests: whether a call runs compiled code then depends on
# what the test did, never on a background thread's timing.  The background compile is tested
# on its own (tests/compiler/test_background_compile.py switches it on).  Subprocesses the tests
# start inherit it.
os.environ.setdefault("FUSEGRAD_BACKGROUND_COMPILE", "0")
