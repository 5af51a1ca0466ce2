"""Smoke test of ``benchmarks/recurrent.py`` with one repetition: it runs end to end (its own
check that the fused kernels' gradients equal the per-step ops', and PyTorch's when importable,
passes) and prints a row per cell and implementation.  Timing is never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_one_repetition_runs_and_prints_every_row() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.recurrent", "--warmup", "0", "--reps", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("| LSTM | fused |", "| LSTM | per-step |", "| GRU | fused |", "| GRU | per-step |"):
        assert row in proc.stdout
