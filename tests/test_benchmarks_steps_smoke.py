"""Smoke test of ``benchmarks/steps.py`` (whole training steps): ``--quick`` on the MLP with SGD,
in a subprocess (it pins threads before numpy is imported), without PyTorch to stay fast.

Checks what a person sees and what the JSON keeps, never the timings: the header (machine,
ratio convention) comes before any measurement, the row is printed -- flushed -- while the
workload's progress is still open, the parameters of every compiled variant match eager's, the
JSON has the machine info and the fields ``benchmarks.compare`` / ``benchmarks.plot`` read, and
``--plot`` writes a PNG (skipped without matplotlib).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture(scope="module")
def steps_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, Any], Path]:
    folder = tmp_path_factory.mktemp("steps")
    out, png = folder / "steps.json", folder / "steps.png"
    args = ["-m", "benchmarks.steps", "--quick", "--no-torch", "--workloads", "C+SGD"]
    args += ["--progress", "plain", "--json", str(out)]
    args += ["--plot", str(png)] if HAVE_MATPLOTLIB else []
    # stderr merged into a block-buffered stdout: rows not flushed would come after progress
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
    return proc.stdout.splitlines(), json.loads(out.read_text(encoding="utf-8")), png


def test_row_is_printed_while_the_workload_runs(
    steps_run: tuple[list[str], dict[str, Any], Path],
) -> None:
    lines, _, _ = steps_run

    def first(prefix: str) -> int:
        return next(i for i, line in enumerate(lines) if line.startswith(prefix))

    machine = first("machine: ")
    header = first("| workload")
    measuring = first("[C+SGD (1/1)] measuring")
    row = first("| C+SGD ")
    done = first("[C+SGD (1/1)] done in")
    assert machine < header < measuring < row < done, lines
    cells = [c.strip() for c in lines[row].strip("|").split("|")]
    headers = [c.strip() for c in lines[header].strip("|").split("|")]
    assert headers[:6] == ["workload", "unit", "fg eager", "fg compiled bwd"] + [
        "fg compile(model)",
        "fg whole step",
    ]
    assert "torch" not in headers
    assert cells[1] == "ms" and all(c.endswith("×") for c in cells[6:9]), cells
    assert any("0.52× means fusegrad takes 52% of the peer's time" in line for line in lines)


def test_json_machine_info_and_checks(steps_run: tuple[list[str], dict[str, Any], Path]) -> None:
    _, payload, _ = steps_run
    assert payload["benchmark"] == "steps" and payload["quick"] is True
    env = payload["environment"]
    assert env["threads"] == 1 and env["cpu_count"] >= 1 and "cpu_model" in env
    assert env["versions"]["numpy"] and env["versions"]["numba"] and env["python"]
    assert "git_commit" in env and env["date"]
    assert payload["implementations"] == ["fg_eager", "fg_compiled", "fg_module", "fg_step"]
    (row,) = payload["rows"]
    assert row["workload"] == "C+SGD" and row["fg_step/fg_eager"] > 0
    check = payload["checks"]["C+SGD"]
    assert max(check["max_rel_param_difference"].values()) < 1e-3, check
    assert check["step_runs"] > 0 and not check["step_breaks"]
    # compile(model) keeps less for its backward than eager's nodes save
    saved = check["compile_model_saved_bytes"]
    assert 0 < saved["program"] < saved["eager"], saved
    assert payload["plot_panels"][0]["numerator"] == "fg_step"


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="matplotlib (the bench extra) is not installed")
def test_plot_writes_a_png(steps_run: tuple[list[str], dict[str, Any], Path]) -> None:
    lines, _, png = steps_run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {png}" in lines
