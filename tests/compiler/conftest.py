"""Compiler tests share the op table of tests/ops, and the ``fresh_compiler`` fixture."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator

import pytest

from fusegrad import compiler

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "ops"))


@pytest.fixture
def fresh_compiler() -> Iterator[None]:
    """Empty program caches and counters, and the IR verified after every pass."""
    compiler.reset()
    compiler._debug.check = True
    yield
    compiler._debug.check = False
    compiler.reset()
