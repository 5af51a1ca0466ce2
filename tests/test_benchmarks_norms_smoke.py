"""Smoke test of ``benchmarks/norms.py`` with one repetition on small shapes: it runs end to
end (its own check that the fused kernels' gradients equal the composites', and PyTorch's
when importable, passes) and prints a row per layer and implementation.  Timing is never
asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_one_repetition_runs_and_prints_every_row() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.norms", "--warmup", "0", "--reps", "1", "--small"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for layer in ("BatchNorm2d", "LayerNorm", "GroupNorm"):
        for implementation in ("fused", "composite"):
            assert any(
                line.startswith(f"| {layer} |") and f"| {implementation} |" in line
                for line in proc.stdout.splitlines()
            )
