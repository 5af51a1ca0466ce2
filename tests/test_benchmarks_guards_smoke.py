"""Smoke test of ``benchmarks/guards.py`` (the whole-step guard on its own), in a subprocess (it
pins threads before numpy is imported), with a few repetitions: it runs, its own check that the
fast guard passes and finds the walk's entry holds for both steps, and it prints a header and
one row per step with the four figures.  Never the timings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_guards_benchmark_runs_and_prints_a_row_per_step() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.guards", "--reps", "3"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("step | full walk"))
    rows = [line.split(" | ") for line in lines[header + 1 :] if " | " in line]
    assert [r[0] for r in rows] == ["GPT+AdamW", "16 elements"]
    for row in rows:
        walk, fast, _, call = (float(c.rstrip("×")) for c in row[1:])
        assert walk > 0 and fast > 0 and call > 0
