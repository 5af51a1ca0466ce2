"""Smoke test of ``benchmarks/linalg.py --quick``: it runs end to end (its own check that
fusegrad's gradients equal PyTorch's passes when PyTorch is importable) and prints a row per
workload.  Timing is never asserted."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_quick_mode_runs_and_prints_every_workload() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.linalg", "--quick"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("| solve |", "| cholesky |", "| cholesky + solve_triangular |"):
        assert name in proc.stdout
    if importlib.util.find_spec("torch") is not None:
        assert "gradients equal PyTorch's" in proc.stdout
