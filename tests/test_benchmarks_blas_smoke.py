"""Smoke test of ``benchmarks/blas.py --quick``: every kernel set runs in its own process, its
products pass the float64 check, and a row per set is printed.  Timing is never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_quick_mode_prints_a_row_per_kernel_set() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.blas", "--quick", "--sets", "keep,auto,Haswell"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("| keep |", "| auto |", "| Haswell |"):
        assert row in proc.stdout
