"""Smoke test of ``benchmarks/compiled.py``: ``--quick`` runs end to end (as a module, in a
subprocess, since it pins threads before numpy is imported) and prints / writes the expected
table rows, compile-time results and JSON fields; ``python -m benchmarks`` dispatches to it.
A second tiny run (two workloads, one repetition) checks what a person watching sees: each
workload's rows are printed, flushed, before the next workload starts; the JSON carries the
machine info; ``--plot`` writes a PNG (skipped without matplotlib), and asks for matplotlib in
words when it is missing.  Nothing in the output mentions an issue number.

Only structure and correctness are asserted (rows present, gradients of every implementation
agree, no compile-time subprocess failed -- two workloads' are run --, no fallback to eager);
timing never is, nor which caches the compile-time subprocesses hit.  torch.compile is left out
(``--no-torch-compile``): its first compile alone takes longer than this test may.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "benchmarks" / "compiled.py"
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_JAX = importlib.util.find_spec("jax") is not None
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

QUICK_LABELS = [
    "A N=1e3",
    "A N=1e4",
    "B 256x1024",
    "C MLP",
    "D chain200",
    "E grad penalty",
    "F HVP",
    "G checkpointed MLP",
]
METRICS = ["forward", "backward", "forward+backward"]
A_METRICS = ["forward", "backward", "backward, .grad kept", "forward+backward"]


def _run(args: list[str], cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _tables(stdout: str) -> list[list[list[str]]]:
    """Every markdown table in ``stdout``: a list of rows of cells, header first, rule dropped."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in stdout.splitlines():
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if current is None:
                current = []
                tables.append(current)
            if not all(set(c) <= set("-:") for c in cells):
                current.append(cells)
        else:
            current = None
    return tables


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench") / "compiled.json"
    # (compile time for two workloads: each costs two fresh processes, the first compiling
    # everything cold -- the machinery is the same for every workload)
    proc = _run(
        [
            "-m",
            "benchmarks.compiled",
            "--quick",
            "--no-torch-compile",
            "--compile-time-workloads",
            "D,G",
            "--json",
            str(out),
        ]
    )
    return proc.stdout, json.loads(out.read_text(encoding="utf-8"))


def test_quick_table_has_every_row(quick_run: tuple[str, dict[str, Any]]) -> None:
    stdout, _ = quick_run
    times, compile_times = _tables(stdout)[:2]
    header = times[0]
    expected = ["fg eager", "fg compiled", "fg whole step", "numpy", "numpy fused", "numba 1-loop"]
    expected += ["torch"] if HAVE_TORCH else []
    expected += ["jax jit"] if HAVE_JAX else []
    assert header[3 : 3 + len(expected)] == expected
    assert "compiled/eager" in header and "compiled/numpy" in header
    assert "step/eager" in header and "step/numba 1-loop" in header
    for row in times[1:]:  # the whole step is one phase: forward+backward rows only
        whole = row[header.index("fg whole step")]
        assert (whole != "—") == (row[1] == "forward+backward"), row
    assert ("compiled/torch" in header) == HAVE_TORCH
    assert "torch.compile" not in header
    rows = [(r[0], r[1]) for r in times[1:]]
    assert rows == [
        (label, metric)
        for label in QUICK_LABELS
        for metric in (A_METRICS if label.startswith("A") else METRICS)
    ]
    for row in times[1:]:
        assert len(row) == len(header)
        assert row[header.index("fg compiled")] != "—", row
    assert [r[0] for r in compile_times[1:]] == QUICK_LABELS
    assert "FAILED" not in stdout.split("JSON written")[0]
    assert not re.search(r"\bissues?\b", stdout, re.IGNORECASE)
    assert "0.52× means fusegrad takes 52% of the peer's time" in stdout


def test_quick_json_structure(quick_run: tuple[str, dict[str, Any]]) -> None:
    _, payload = quick_run
    assert payload["benchmark"] == "compiled"
    assert payload["quick"] is True and payload["ok"] is True
    assert payload["threads"]["requested"] == 1
    assert payload["threads"]["env_before_numpy"] is True
    assert list(payload["workloads"]) == QUICK_LABELS
    for row in payload["rows"]:
        for impl in ("fg_eager", "fg_compiled"):
            assert row[impl] is not None and row[impl] > 0, (row["workload"], row["metric"])
        # (E and F differentiate inside their forward, G recomputes: no hand-written numpy)
        if row["metric"] != "backward, .grad kept" and row["workload"][0] not in "EFG":
            assert row["numpy"] is not None and row["fg_compiled/numpy"] is not None
        assert (row["torch"] is not None) == HAVE_TORCH
        assert row["torch_compile"] is None
    for label in QUICK_LABELS:
        check = payload["checks"][label]
        assert check["ok"], (label, check)
        assert "fg_compiled" in check["max_rel_error"]
        assert ("torch" in check["max_rel_error"]) == HAVE_TORCH
        events = payload["compiler_events"][label]
        assert events["fallbacks"] == 0 and events["captures_steady_state"] == 0, events
        assert payload["programs"][label]["kernels"] >= 1
    # cold and warm-from-disk compile, once per workload asked for, in fresh processes
    assert set(payload["compile_time"]) == {"D", "G"}
    for name, cases in payload["compile_time"].items():
        cold, warm = cases["cold"], cases["warm_disk"]
        assert "error" not in cold and "error" not in warm, (name, cases)
        # which caches a process hits (generated modules, a precompiled interpreter for small
        # tensors, ...) is the compiler tests' business; here: both ran compiled, no fallback
        for result in (cold, warm):
            assert result["counters"]["captures"] >= 1 and not result["counters"]["fallbacks"]
            assert result["first_backward_s"] > 0 and result["second_backward_s"] > 0
    bandwidth = payload["bandwidth"]
    assert bandwidth["gbps"] > 0 and bandwidth["copy"]["gbps_median"] > 0
    bound = payload["bandwidth_bound"]
    assert bound["workload"] == "A N=1e4" and bound["N"] == 10**4
    assert bound["bounds"]["naive"]["bytes"] == 6 * 4 * 10**4
    assert bound["bounds"]["minimum"]["bytes"] == 4 * 4 * 10**4
    assert payload["table"].splitlines()[0].startswith("| workload")


def test_subset_without_torch_and_dispatch_from_package(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    proc = _run(
        [
            "-m",
            "benchmarks",
            "--suites",
            "compiled",
            "--quick",
            "--no-torch",
            "--workloads",
            "D",
            "--no-compile-time",
            "--reps",
            "1",
            "--warmup",
            "0",
            "--json",
            str(out),
        ]
    )
    header = _tables(proc.stdout)[0][0]
    assert "torch" not in header and "numpy fused" not in header
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert list(payload["workloads"]) == ["D chain200"]
    assert payload["compile_time"] == {} and payload["bandwidth_bound"] is None
    assert payload["checks"]["D chain200"]["ok"]


def test_runs_as_a_script_from_another_directory(tmp_path: Path) -> None:
    proc = _run([str(SCRIPT), "--help"], cwd=tmp_path)
    assert "--quick" in proc.stdout and "--workloads" in proc.stdout


# ---- what a person watching sees ------------------------------------------------------------


@pytest.fixture(scope="module")
def streamed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path, Path]:
    """Two workloads, one repetition, stderr merged into stdout: if stdout were not flushed
    per row, every row would come after all the (flushed) progress lines on stderr."""
    folder = tmp_path_factory.mktemp("stream")
    out, png = folder / "run.json", folder / "ratios.png"
    args = ["-m", "benchmarks.compiled", "--quick", "--no-torch", "--no-compile-time"]
    args += ["--workloads", "A,D", "--reps", "1", "--warmup", "0", "--progress", "plain"]
    args += ["--json", str(out)] + (["--plot", str(png)] if HAVE_MATPLOTLIB else [])
    # stdout block-buffered, as it is by default through a pipe: the flushes must be explicit
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout
    return proc.stdout.splitlines(), out, png


def test_rows_stream_in_order_as_each_workload_finishes(
    streamed_run: tuple[list[str], Path, Path],
) -> None:
    lines, _, _ = streamed_run
    labels = ["A N=1e3", "A N=1e4", "D chain200"]

    def first(prefix: str) -> int:
        return next(i for i, line in enumerate(lines) if line.startswith(prefix))

    header = first("| workload")
    for k, label in enumerate(labels):
        start = first(f"[{label} ({k + 1}/3)]")  # progress: the workload starts
        done = first(f"[{label} ({k + 1}/3)] done in")
        rows = [i for i, line in enumerate(lines) if line.startswith(f"| {label} ")]
        metrics = [lines[i].split("|")[2].strip() for i in rows[:4]]
        # the time table's rows of this workload (the compile table's row comes later)
        expected = A_METRICS if label.startswith("A") else METRICS
        assert metrics[: len(expected)] == expected, lines
        # printed after the table header, after the workload started and before it ended
        assert header < start < min(rows) and max(rows[: len(expected)]) < done, lines
        if k + 1 < len(labels):  # ... so before the next workload's first progress line
            assert max(rows[: len(expected)]) < first(f"[{labels[k + 1]} ({k + 2}/3)]")
    assert any("measuring" in line and "repetitions" in line for line in lines)


def test_json_has_the_machine_info(streamed_run: tuple[list[str], Path, Path]) -> None:
    _, out, _ = streamed_run
    payload = json.loads(out.read_text(encoding="utf-8"))
    env = payload["environment"]
    assert env["threads"] == 1 and env["cpu_count"] >= 1
    assert "cpu_model" in env and "physical_cores" in env
    assert env["python"].count(".") == 2
    for library in ("numpy", "numba", "fusegrad"):
        assert env["versions"][library], library
    assert "torch" in env["versions"]  # installed version, or None
    assert "git_commit" in env and "git_dirty" in env
    assert datetime.datetime.fromisoformat(env["date"]).tzinfo is not None
    # what benchmarks.compare and benchmarks.plot read
    assert payload["columns"]["fg_compiled"] == "fg compiled"
    assert payload["implementations"][:2] == ["fg_eager", "fg_compiled"]
    assert {p["numerator"] for p in payload["plot_panels"]} == {"fg_compiled", "fg_step"}
    assert "fg_compiled/numpy" in payload["rows"][0]


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="matplotlib (the bench extra) is not installed")
def test_plot_writes_a_png(streamed_run: tuple[list[str], Path, Path]) -> None:
    lines, _, png = streamed_run
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 400 and height >= 300
    assert any(line == f"plot written to {png}" for line in lines)


def test_plot_without_matplotlib_says_what_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"  # as if it were not installed
        "from benchmarks import compiled\n"
        f"compiled.main(['--quick', '--plot', {str(tmp_path / 'x.png')!r}])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--plot needs matplotlib" in proc.stderr and "pip install" in proc.stderr
    assert proc.stdout == ""  # refused before measuring anything
