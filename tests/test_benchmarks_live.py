"""The pieces behind watchable benchmarks, in process and without running one: the streamed
table (``benchmarks.live.StreamTable``), the progress lines (``live.Progress``), the step
callback of ``common.measure_interleaved`` that drives them, and the ratio plot
(``benchmarks.plot``: which rows and peers a payload's panels take; the PNG, skipped without
matplotlib).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import common, live, plot

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def test_stream_table_prints_each_row_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    table = live.StreamTable(["workload", "time", "ratio"], widths=[10])
    table.row(["A", "1.5", "0.52×"])
    first = capsys.readouterr().out.splitlines()
    assert first == [
        "| workload   |    time |   ratio |",
        "| ---------- | ------: | ------: |",
        "| A          |     1.5 |   0.52× |",
    ]
    table.row(["a much longer label", "2", "—"])  # too wide: kept whole, still one line
    assert capsys.readouterr().out == "| a much longer label |       2 |       — |\n"
    with pytest.raises(ValueError, match="expected 3"):
        table.row(["B", "1"])
    assert table.rows == [["A", "1.5", "0.52×"], ["a much longer label", "2", "—"]]


def test_progress_plain_lines(capsys: pytest.CaptureFixture[str]) -> None:
    with live.Progress("A N=1e5", mode="plain", interval_s=0.0, position=(1, 3)) as progress:
        progress.stage("measuring")
        progress.update(5, 20)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "[A N=1e5 (1/3)] measuring…"
    assert err[1].startswith("[A N=1e5 (1/3)] measuring: 5/20 steps, ")
    assert err[2].startswith("[A N=1e5 (1/3)] done in ") and err[2].endswith(" s")
    with live.Progress("quiet", mode="off") as progress:
        progress.stage("measuring")
        progress.update(1, 1)
    assert capsys.readouterr() == ("", "")
    with pytest.raises(ValueError, match="mode"):
        live.Progress("x", mode="fancy")


def test_measure_interleaved_reports_every_step() -> None:
    calls: list[tuple[int, int]] = []
    counts = {"a": 0, "b": 0}

    def step(name: str) -> common.StepFn:
        def run() -> dict[str, float]:
            counts[name] += 1
            return {"phase": 1e-6}

        return run

    common.measure_interleaved(
        {"a": step("a"), "b": step("b")},
        warmup=2,
        reps=7,
        rounds=3,
        on_step=lambda done, total: calls.append((done, total)),
    )
    steps_run = counts["a"] + counts["b"]
    assert [done for done, _ in calls] == list(range(1, steps_run + 1))
    assert {total for _, total in calls} == {steps_run}  # the total was right from the start


def _payload() -> dict[str, Any]:
    def row(workload: str, metric: str, **ratios: float | None) -> dict[str, Any]:
        return {"workload": workload, "metric": metric, "unit": "ms", **ratios}

    return {
        "benchmark": "compiled",
        "quick": True,
        "columns": {"fg_eager": "fg eager", "numpy": "numpy", "torch": "torch"},
        "plot_panels": [
            {
                "title": "backward",
                "numerator": "fg_compiled",
                "peers": ["fg_eager", "numpy", "torch"],
                "metrics": ["backward", "backward, .grad kept"],
            },
            {"title": "all rows", "numerator": "fg_step", "peers": ["numpy"], "metrics": None},
        ],
        "rows": [
            row("A", "forward", **{"fg_compiled/numpy": 1.0, "fg_step/numpy": None}),
            row("A", "backward", **{"fg_compiled/fg_eager": 0.2, "fg_compiled/numpy": 1.5}),
            row("A", "backward, .grad kept", **{"fg_compiled/fg_eager": 0.1}),
            row("D", "forward+backward", **{"fg_step/numpy": 0.05}),
        ],
        "environment": {"cpu_model": "Test CPU", "threads": 1, "git_commit": "abc1234"},
    }


def test_panels_take_the_rows_and_peers_that_have_ratios() -> None:
    backward, every_row = plot.panels_from_payload(_payload())
    assert backward.groups == ("A\nbackward", "A\nbackward, .grad kept")
    assert dict(backward.series) == {"fg eager": [0.2, 0.1], "numpy": [1.5, None]}  # no torch
    assert every_row.groups == (
        "A\nforward",
        "A\nbackward",
        "A\nbackward, .grad kept",
        "D\nforward+backward",
    )
    assert dict(every_row.series) == {"numpy": [None, None, None, 0.05]}


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="matplotlib (the bench extra) is not installed")
def test_plot_command_draws_a_saved_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "run.json"
    source.write_text(json.dumps(_payload()), encoding="utf-8")
    png = tmp_path / "out" / "ratios.png"
    assert plot.main([str(source), str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out == f"plot written to {png}\n"


def test_plot_refuses_a_payload_without_panels(tmp_path: Path) -> None:
    source = tmp_path / "old.json"
    source.write_text(json.dumps({"benchmark": "compiled", "rows": []}), encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        plot.main([str(source), str(tmp_path / "x.png")])
    assert exit_info.value.code == 2
