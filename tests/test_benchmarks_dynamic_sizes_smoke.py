"""Smoke test of ``benchmarks/dynamic_sizes.py`` on a small GPT: it runs end to end and prints
a row per implementation, and automatic dynamic sizes record the 8 shapes twice where a
recording per size takes 8.  Timing is never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_quick_run_prints_every_row_and_two_recordings() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.dynamic_sizes", "--quick", "--no-torch"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {
        line.split(" | ")[0]: line.split(" | ")
        for line in proc.stdout.splitlines()
        if " | " in line
    }
    assert set(rows) >= {"implementation", "fg eager", "fg dynamic", "fg per size"}
    assert rows["fg dynamic"][2] == "2" and rows["fg dynamic"][3] == "1"
    assert rows["fg per size"][2] == "8"
