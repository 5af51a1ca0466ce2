"""Smoke test of ``benchmarks/eager_overhead.py``: its ``--quick`` mode runs end to end, as a
module and as a script, and prints / writes the expected table rows and JSON fields.

Only structure and correctness are asserted (rows present, gradient cross-check passed); timing
never is (docs/ARCHITECTURE.md, "Conventions": timing belongs in ``benchmarks/``).  The benchmark
runs in a subprocess
because it must pin BLAS threads before numpy is imported.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "benchmarks" / "eager_overhead.py"

EXPECTED_ROWS = [
    ("chain200", "forward"),
    ("chain200", "backward"),
    ("chain200", "forward+backward"),
    ("chain200", "forward per op"),
    ("chain200", "backward per node"),
    ("mlp", "forward"),
    ("mlp", "backward"),
    ("mlp", "forward+backward"),
]
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _run(args: list[str], cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _table_rows(stdout: str) -> list[list[str]]:
    """Cells of the markdown table's body rows (header and rule lines dropped)."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    assert len(lines) >= 2, f"no markdown table in output:\n{stdout}"
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def _header(stdout: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if line.startswith("|"))
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench") / "eager_overhead.json"
    proc = _run(
        ["-m", "benchmarks.eager_overhead", "--quick", "--threads", "1", "--json", str(out)]
    )
    return proc.stdout, json.loads(out.read_text(encoding="utf-8"))


def test_quick_table_has_every_row(quick_run: tuple[str, dict[str, Any]]) -> None:
    stdout, _ = quick_run
    header = _header(stdout)
    expected_impls = ["fusegrad", "numpy"] + (["torch"] if HAVE_TORCH else [])
    assert header[3 : 3 + len(expected_impls)] == expected_impls
    assert "fusegrad/numpy" in header
    assert ("fusegrad/torch" in header) == HAVE_TORCH
    rows = _table_rows(stdout)
    assert [(r[0], r[1]) for r in rows] == EXPECTED_ROWS
    for row in rows:
        assert len(row) == len(header)
        assert all(cell and cell != "—" for cell in row), row


def test_quick_json_structure(quick_run: tuple[str, dict[str, Any]]) -> None:
    _, payload = quick_run
    assert payload["benchmark"] == "eager_overhead"
    assert payload["quick"] is True
    assert payload["threads"]["requested"] == 1
    assert payload["threads"]["env_before_numpy"] is True
    assert [(r["workload"], r["metric"]) for r in payload["rows"]] == EXPECTED_ROWS
    impls = ["fusegrad", "numpy"] + (["torch"] if HAVE_TORCH else [])
    assert payload["implementations"] == impls
    for row in payload["rows"]:
        for impl in impls:
            assert row[impl] is not None and row[impl] > 0, (row["metric"], impl)
            assert row["stats"][impl]["reps"] >= 1
        assert row["fusegrad/numpy"] is not None
        assert (row["fusegrad/torch"] is not None) == HAVE_TORCH
    # at least one backward node per op (200 elementwise ops + the sum); more if an op that is a
    # primitive today (sigmoid) becomes a composite
    assert payload["workloads"]["chain200"]["nodes"]["fusegrad"] >= 201
    if HAVE_TORCH:
        assert payload["workloads"]["chain200"]["nodes"]["torch"] == 201
    # every implementation computed the same gradients as the hand-written numpy one
    for workload in ("chain200", "mlp"):
        check = payload["checks"][workload]
        assert check["ok"], check
        assert set(check["max_rel_error"]) == set(impls) - {"numpy"}
    assert payload["target"]["target"] == 3.0
    assert payload["table"].splitlines()[0].startswith("| workload")


def test_quick_without_torch_drops_the_column(tmp_path: Path) -> None:
    out = tmp_path / "no_torch.json"
    proc = _run(
        [
            "-m",
            "benchmarks.eager_overhead",
            "--quick",
            "--no-torch",
            "--reps",
            "1",
            "--warmup",
            "0",
            "--json",
            str(out),
        ]
    )
    assert "torch" not in _header(proc.stdout)
    assert [(r[0], r[1]) for r in _table_rows(proc.stdout)] == EXPECTED_ROWS
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert payload["implementations"] == ["fusegrad", "numpy"]
    assert all(row["torch"] is None for row in payload["rows"])
    assert payload["target"]["met"] is False and payload["target"]["value"] is None


def test_runs_as_a_script_from_another_directory(tmp_path: Path) -> None:
    proc = _run([str(SCRIPT), "--help"], cwd=tmp_path)
    assert "--quick" in proc.stdout and "--threads" in proc.stdout
