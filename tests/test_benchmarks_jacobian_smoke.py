"""Smoke test of ``benchmarks/jacobian.py``: it runs end to end with small sizes (its own check
that the vectorized Jacobian equals the row-by-row one, and PyTorch's when importable, passes)
and prints a row per implementation.  Timing is never asserted."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_runs_and_prints_every_implementation() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.jacobian", "--rows", "2", "--features", "3"]
        + ["--width", "4", "--reps", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8 rows" in proc.stdout
    assert "| fusegrad, row by row" in proc.stdout
    assert "| fusegrad, vectorize=True" in proc.stdout
    if importlib.util.find_spec("torch") is not None:
        assert "| torch, vectorize=True (vmap)" in proc.stdout
