"""Smoke test of ``benchmarks/conv.py`` with one repetition: it runs end to end (its own check
that the kernels' gradients equal the composites', and PyTorch's when importable, passes) and
prints a row per workload and implementation.  Timing is never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_one_repetition_runs_and_prints_every_row() -> None:
    workloads = "mnist-conv1,mnist-maxpool,dcgan-convT1,depthwise-3x3,avgpool-3x3"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.conv", "--warmup", "0", "--reps", "1"]
        + ["--workloads", workloads],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in workloads.split(","):
        for impl in ("kernels", "composite"):
            assert f"| {name} | {impl} |" in proc.stdout, proc.stdout


def test_an_unknown_workload_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.conv", "--reps", "1", "--workloads", "nope"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0 and "unknown workload 'nope'" in proc.stdout + proc.stderr
