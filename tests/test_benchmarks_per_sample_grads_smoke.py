"""Smoke test of ``benchmarks/per_sample_grads.py --quick``: it runs end to end (its own checks
that vmap(grad) equals the loop over samples, and torch.func's when importable, pass) and
prints a row per implementation.  Timing is never asserted."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_quick_mode_runs_and_prints_every_implementation() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.per_sample_grads", "--quick"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "batch 4" in proc.stdout
    assert "| fusegrad, vmap(grad)" in proc.stdout
    assert "| fusegrad, compile(vmap(grad))" in proc.stdout
    assert "| fusegrad, loop over samples" in proc.stdout
    if importlib.util.find_spec("torch") is not None:
        assert "| torch.func, vmap(grad)" in proc.stdout
