"""Bar charts of a benchmark's time ratios: fusegrad's time over each peer's, as grouped bars.

``python -m benchmarks.compiled --plot out.png`` (and ``benchmarks.steps``) draw their results
through ``plot_payload``; ``python -m benchmarks.plot results.json out.png`` draws a saved JSON
again.  What to draw is data in the JSON, not code here: the payload's ``plot_panels`` list
says, per panel, the numerator implementation (``fg_compiled``, ``fg_step``), the peers and
which rows (metrics) to take, and ``columns`` gives every implementation's label.  One group of
bars per row (workload, metric), one bar per peer, on a log scale with a line at 1× (below:
fusegrad takes less time than that peer).

matplotlib is an optional extra (``pip install -e ".[bench]"``); ``matplotlib_missing()`` says
so in words before a benchmark starts, so that ``--plot`` fails at once rather than after the
run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

INSTALL_HINT = 'pip install matplotlib (or pip install -e ".[bench]")'


@dataclass(frozen=True, slots=True)
class RatioPanel:
    """One subplot: ``series`` maps a peer's label to one ratio (or None) per group."""

    title: str
    groups: tuple[str, ...]
    series: Mapping[str, Sequence[float | None]]


def matplotlib_missing() -> str | None:
    """None when matplotlib can be imported, else the error message for ``--plot``."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"--plot needs matplotlib, which is not installed here: {INSTALL_HINT}"
    return None


def panels_from_payload(payload: Mapping[str, Any]) -> list[RatioPanel]:
    """The panels a benchmark's JSON asks for (``plot_panels``), filled from its ``rows``.

    A panel spec is ``{"title", "numerator", "peers", "metrics"}``: rows whose ``metric`` is in
    ``metrics`` (every row when ``metrics`` is null) become groups, labelled by workload (and
    metric, when the panel's rows have several); peers with no ratio in any group are left out.
    """
    columns = payload.get("columns", {})
    panels = []
    for spec in payload.get("plot_panels", []):
        metrics = spec.get("metrics")
        rows = [r for r in payload["rows"] if metrics is None or r.get("metric") in metrics]
        several = len({r.get("metric") for r in rows}) > 1  # then the metric names the group
        groups = tuple(
            f"{r['workload']}\n{r['metric']}" if several else str(r["workload"]) for r in rows
        )
        series: dict[str, list[float | None]] = {}
        for peer in spec["peers"]:
            values = [r.get(f"{spec['numerator']}/{peer}") for r in rows]
            if any(v is not None for v in values):
                series[columns.get(peer, peer)] = values
        if groups and series:
            panels.append(RatioPanel(spec["title"], groups, series))
    return panels


def _subtitle(payload: Mapping[str, Any]) -> str:
    env = payload.get("environment", {})
    commit = env.get("git_commit") or "?"
    quick = " — QUICK run: not a measurement" if payload.get("quick") else ""
    return (
        f"{env.get('cpu_model') or 'unknown CPU'}, {env.get('threads') or '?'} thread(s); "
        f"commit {commit}, {env.get('date') or ''}{quick}"
    )


def _drawable(value: Any) -> bool:
    """A ratio a log-scale bar can show: a positive finite number."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def plot_ratios(
    path: str | Path, panels: Sequence[RatioPanel], *, title: str, subtitle: str = ""
) -> Path:
    """Draw ``panels`` one above the other into the PNG ``path``; returns the path."""
    missing = matplotlib_missing()
    if missing is not None:
        raise RuntimeError(missing)
    if not panels:
        raise ValueError("plot_ratios: nothing to draw (no row has a ratio)")
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    peers = list(dict.fromkeys(peer for panel in panels for peer in panel.series))
    colours = {peer: plt.get_cmap("tab10")(i % 10) for i, peer in enumerate(peers)}
    widest = max(len(p.groups) * (len(p.series) + 1) for p in panels)
    figure, axes = plt.subplots(
        len(panels), 1, figsize=(max(8.0, 0.32 * widest + 2), 3.6 * len(panels) + 1.0)
    )
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, panel in zip(axes, panels):
        width = 0.8 / len(panel.series)
        shown = [v for values in panel.series.values() for v in values if _drawable(v)]
        for k, (peer, values) in enumerate(panel.series.items()):
            xs = [i - 0.4 + width * (k + 0.5) for i, v in enumerate(values) if _drawable(v)]
            ys = [v for v in values if _drawable(v)]
            bars = ax.bar(xs, ys, width, label=peer, color=colours[peer])
            ax.bar_label(
                bars,
                labels=[f"{v:.2g}×" for v in ys],
                fontsize=7,
                rotation=90,
                padding=2,
            )
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        low, high = min(shown + [1.0]), max(shown + [1.0])
        ax.set_ylim(low / 2.5, high * 8)  # room for the value labels above the bars
        ax.set_xticks(range(len(panel.groups)), panel.groups, fontsize=8)
        ax.set_ylabel("fusegrad time / peer time\n(log scale; < 1: fusegrad faster)", fontsize=8)
        ax.set_title(panel.title, fontsize=10)
        ax.legend(fontsize=7, ncols=min(len(panel.series), 4), loc="upper left")
        ax.grid(axis="y", which="major", alpha=0.3)
        if high / low < 50:  # a narrow range: label it in plain numbers, not powers of ten
            ax.yaxis.set_major_formatter(
                matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×" if v > 0 else "")
            )
            ticks = [
                t
                for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)
                if low / 2.5 <= t <= high * 8
            ]
            ax.set_yticks(ticks)
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    # the subtitle wrapped: a long CPU name must not run off the picture
    heading = [title, *textwrap.wrap(subtitle, 100)]
    figure.suptitle("\n".join(heading), fontsize=10)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.17 * len(heading) / figure.get_size_inches()[1]))
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    plt.close(figure)
    return target


def plot_payload(payload: Mapping[str, Any], path: str | Path) -> Path:
    """Draw a benchmark's JSON payload (``plot_panels`` and ``rows``) into the PNG ``path``."""
    title = f"benchmarks.{payload.get('benchmark', '?')}: time ratios against each peer"
    return plot_ratios(path, panels_from_payload(payload), title=title, subtitle=_subtitle(payload))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.plot",
        description="Draw a saved benchmark JSON (benchmarks.compiled, benchmarks.steps) as "
        "grouped bars of fusegrad's time over each peer's.",
    )
    parser.add_argument("json", type=Path, help="a results file written with --json")
    parser.add_argument("png", type=Path, help="the picture to write")
    args = parser.parse_args(argv)
    missing = matplotlib_missing()
    if missing is not None:
        parser.error(missing)
    payload = json.loads(args.json.read_text(encoding="utf-8"))
    if not payload.get("plot_panels"):
        parser.error(f"{args.json}: no plot_panels (written by an older or another benchmark)")
    path = plot_payload(payload, args.png)
    print(f"plot written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
