"""``python -m benchmarks.compare a.json b.json`` on two results files built here (no benchmark
runs): it names each run's machine and commit, says where the machine info differs, and prints
per workload, metric and ratio column both figures, B/A and the change in percent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import compare

REPO_ROOT = Path(__file__).resolve().parent.parent


def _payload(
    commit: str, ratio_b: float, time_b: float, *, threads: int = 1, numpy: str = "2.4.6"
) -> dict[str, Any]:
    """A ``benchmarks.compiled``-shaped results file with two rows (and one row of its own)."""
    return {
        "benchmark": "compiled",
        "quick": False,
        "implementations": ["fg_eager", "fg_compiled", "torch"],
        "columns": {"fg_eager": "fg eager", "fg_compiled": "fg compiled", "torch": "torch"},
        "rows": [
            {
                "workload": "A N=1e5",
                "metric": "backward",
                "unit": "µs",
                "fg_eager": 400.0,
                "fg_compiled": time_b,
                "torch": 200.0,
                "fg_compiled/fg_eager": time_b / 400.0,
                "fg_compiled/torch": ratio_b,
                "stats": {"fg_eager": {"median": 400.0}},
            },
            {
                "workload": "D chain200",
                "metric": "forward+backward",
                "unit": "µs",
                "fg_eager": 9000.0,
                "fg_compiled": 4000.0,
                "torch": None,
                "fg_compiled/fg_eager": 4000.0 / 9000.0,
                "fg_compiled/torch": None,
            },
            {"workload": f"only {commit}", "metric": "backward", "fg_compiled/fg_eager": 1.0},
        ],
        "environment": {
            "date": "2026-12-01T10:00:00+00:00",
            "cpu_model": "Test CPU 9000",
            "cpu_count": 2,
            "physical_cores": 2,
            "threads": threads,
            "python": "3.11.7",
            "versions": {"numpy": numpy, "numba": "0.68.1", "fusegrad": "0.1.0", "torch": None},
            "git_commit": commit,
            "git_dirty": False,
        },
    }


def _write(folder: Path, name: str, payload: dict[str, Any]) -> Path:
    path = folder / name
    path.write_text(json.dumps(payload), encoding="utf-8")
    return path


def _table(stdout: str) -> dict[tuple[str, str, str], list[str]]:
    """The comparison table as {(workload, metric, figure): [A, B, B/A, change]}."""
    out = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 7 and not set(cells[3]) <= set("-:"):
            out[(cells[0], cells[1], cells[2])] = cells[3:]
    return out


def test_compare_prints_both_figures_and_the_change(tmp_path: Path) -> None:
    a = _write(tmp_path, "a.json", _payload("aaaa111", ratio_b=0.5, time_b=100.0))
    b = _write(tmp_path, "b.json", _payload("bbbb222", ratio_b=0.4, time_b=80.0, threads=2))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare", str(a), str(b)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"A: {a}" in out and "commit aaaa111" in out and "Test CPU 9000" in out
    assert f"B: {b}" in out and "commit bbbb222" in out
    assert "machine info differs: threads used 1 vs 2" in out
    assert "0.52× = fusegrad takes 52% of the peer's time" in out
    table = _table(out)
    assert table[("workload", "metric", "figure")] == ["A", "B", "B/A", "change"]
    assert table[("A N=1e5", "backward", "fg compiled / torch")] == [
        "0.500×",
        "0.400×",
        "0.800",
        "-20.0%",
    ]
    assert table[("A N=1e5", "backward", "fg compiled / fg eager")] == [
        "0.250×",
        "0.200×",
        "0.800",
        "-20.0%",
    ]
    # the same figure in both runs: no change; a ratio neither run has: no line
    assert table[("D chain200", "forward+backward", "fg compiled / fg eager")][2:] == [
        "1.00",
        "+0.0%",
    ]
    assert ("D chain200", "forward+backward", "fg compiled / torch") not in table
    # ratios only unless --times
    assert not any(key[2].startswith("fg compiled (") for key in table)
    assert "only in A: only aaaa111 backward" in out and "only in B: only bbbb222 backward" in out


def test_times_flag_adds_the_medians_with_their_unit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _write(tmp_path, "a.json", _payload("aaaa111", ratio_b=0.5, time_b=100.0))
    b = _write(tmp_path, "b.json", _payload("bbbb222", ratio_b=0.5, time_b=150.0, numpy="2.5.0"))
    assert compare.main([str(a), str(b), "--times"]) == 0
    out = capsys.readouterr().out
    table = _table(out)
    assert table[("A N=1e5", "backward", "fg compiled (µs)")] == ["100", "150", "1.50", "+50.0%"]
    assert "\nmachine info differs: numpy 2.4.6 vs 2.5.0\n" in out


def test_runs_of_different_benchmarks_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = _payload("bbbb222", 0.5, 100.0)
    steps["benchmark"] = "steps"
    a = _write(tmp_path, "a.json", _payload("aaaa111", 0.5, 100.0))
    b = _write(tmp_path, "b.json", steps)
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(a), str(b)])
    assert exit_info.value.code == 2
    assert "only runs of one benchmark compare" in capsys.readouterr().err


def test_older_files_without_machine_info_still_compare() -> None:
    """Files written before the machine info: threads as pin_threads's record, steps' info
    at the top level; the comparison says 'unknown' where a run does not tell."""
    old = _payload("aaaa111", 0.5, 100.0)
    env = old.pop("environment")
    old.update({"python": env["python"], "versions": env["versions"], "threads": {"requested": 1}})
    new = _payload("bbbb222", 0.25, 100.0)
    assert compare.machine_differences(old, new) == [
        "CPU unknown vs Test CPU 9000",
        "logical cores unknown vs 2",
    ]
    lines = compare.compare(old, new)["lines"]
    torch_line = next(x for x in lines if x["column"] == "fg compiled / torch")
    assert torch_line["b_over_a"] == pytest.approx(0.5)
