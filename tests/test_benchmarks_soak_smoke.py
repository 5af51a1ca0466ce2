"""Smoke test of ``benchmarks/soak.py``: ``--quick`` runs end to end in its own process (it pins
threads before numpy is imported) and passes its own checks -- one capture over every batch size,
resident memory flat over both runs, the graph cache within its bound, compiled gradients equal to
eager.  Its timings are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_soak_quick_passes_its_checks(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--quick", "--json", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "1 capture(s)" in proc.stdout
    results = json.loads(out.read_text())
    assert results["failures"] == []
    assert results["batch_sizes"]["captures"] == 1
    assert results["distinct_graphs"]["captures"] == results["distinct_graphs"]["graphs"]
    assert set(results["miss_cost"]) == {"miss_us_with_8_cached", "miss_us_with_240_cached"}
