"""Smoke test of ``benchmarks/checkpoint_memory.py``: its ``--quick --compiled`` mode runs end to
end as a module, checks every checkpointed variant's gradients (eager and with compiled backward)
against the plain run and writes its JSON.

Memory figures are not asserted here (tiny sizes, and measurements belong in ``benchmarks/``);
that checkpointing frees activations is asserted directly in ``test_depth_checkpoint.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_checkpoint_memory_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "checkpoint_memory.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.checkpoint_memory",
            "--quick",
            "--compiled",
            "--json",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "| plain " in proc.stdout and "sequential" in proc.stdout
    payload = json.loads(out.read_text())
    assert payload["all_grads_match"] is True
    names = [row["variant"] for row in payload["rows"]]
    assert names[0] == "plain" and names[1] == "plain, compiled backward" and len(names) == 10
    assert all(row["peak_bytes"] > 0 for row in payload["rows"])
