"""Two runs of one benchmark side by side: ``python -m benchmarks.compare a.json b.json``.

Reads two JSON files written by a benchmark's ``--json`` (``benchmarks.compiled``,
``benchmarks.steps``, ``benchmarks.eager_overhead``), says on which machine and commit each ran
and where their machine info differs (CPU, threads, versions), then prints one line per
workload, metric and ratio column: run A's figure, run B's, B's divided by A's and the change in
percent.  Ratio columns are the ``x/y`` keys of the rows (fusegrad's median time over a peer's);
``--times`` adds the median times themselves.  Rows are matched by workload and metric; a row
only one run has is listed apart.

The comparison is only as good as the runs: medians of one run each, on whatever else the
machine was doing.  Differences of a few percent between two runs of the same commit are noise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

# machine info compared between the runs (environment key -> words)
MACHINE_FIELDS = {
    "cpu_model": "CPU",
    "cpu_count": "logical cores",
    "threads": "threads used",
    "python": "Python",
}
RowKey = tuple[str, str]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _row_key(row: Mapping[str, Any]) -> RowKey:
    return str(row.get("workload", "?")), str(row.get("metric", ""))


def _label(columns: Mapping[str, str], key: str) -> str:
    """A column's words: the JSON's ``columns`` labels where they have them, else the key."""
    if "/" in key:
        numerator, _, denominator = key.partition("/")
        return f"{columns.get(numerator, numerator)} / {columns.get(denominator, denominator)}"
    return columns.get(key, key)


def _environment(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """The run's machine info (older ``steps`` files kept it at the top level)."""
    return payload.get("environment") or payload


def _threads(payload: Mapping[str, Any]) -> Any:
    """The thread count the run used (older files: only ``pin_threads``'s record)."""
    for value in (_environment(payload).get("threads"), payload.get("threads")):
        if isinstance(value, Mapping):
            value = value.get("requested")
        if value is not None:
            return value
    return None


def describe_run(name: str, path: Path, payload: Mapping[str, Any]) -> str:
    """One line: which file, benchmark, machine, threads, versions, commit and date."""
    env = dict(_environment(payload))
    env["threads"] = _threads(payload)
    quick = " (QUICK run: not a measurement)" if payload.get("quick") else ""
    return f"{name}: {path}{quick} — {common.describe_environment(env)}"


def machine_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Machine info that differs between the runs, in words (commit and date not counted)."""
    env_a, env_b = _environment(a), _environment(b)

    def said(value: Any) -> str:
        return "unknown" if value is None else str(value)

    out = []
    for key, words in MACHINE_FIELDS.items():
        va = _threads(a) if key == "threads" else env_a.get(key)
        vb = _threads(b) if key == "threads" else env_b.get(key)
        if va != vb:
            out.append(f"{words} {said(va)} vs {said(vb)}")
    versions_a, versions_b = env_a.get("versions", {}), env_b.get("versions", {})
    for name in sorted(set(versions_a) | set(versions_b)):
        if versions_a.get(name) != versions_b.get(name):
            out.append(f"{name} {said(versions_a.get(name))} vs {said(versions_b.get(name))}")
    if bool(a.get("quick")) != bool(b.get("quick")):
        out.append(f"quick {bool(a.get('quick'))} vs {bool(b.get('quick'))}")
    return out


def _columns(payload: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], times: bool) -> list:
    """The row keys to compare: every ratio column (``x/y``), and with ``times`` the median
    times (the JSON's ``implementations``, else every other numeric key)."""
    keys: dict[str, None] = {}
    implementations = payload.get("implementations")
    for row in rows:
        for key, value in row.items():
            if not (_number(value) or value is None) or key in ("workload", "metric", "unit"):
                continue
            if "/" in key:
                keys[key] = None
            elif times and (implementations is None or key in implementations):
                keys.setdefault("time:" + key, None)
    ordered = [k for k in keys if k.startswith("time:")] + [k for k in keys if "/" in k]
    return ordered


def _format(value: float | None, is_ratio: bool) -> str:
    if value is None:
        return "—"
    return common.format_number(value) + ("×" if is_ratio else "")


def compare(a: Mapping[str, Any], b: Mapping[str, Any], *, times: bool = False) -> dict[str, Any]:
    """The comparison as data: ``lines`` (one per row and column: figures, B/A, change in
    percent) and the rows only one run has."""
    rows_a = {_row_key(r): r for r in a.get("rows", [])}
    rows_b = {_row_key(r): r for r in b.get("rows", [])}
    shared = [k for k in rows_a if k in rows_b]
    columns = _columns(a, [rows_a[k] for k in shared], times)
    columns += [c for c in _columns(b, [rows_b[k] for k in shared], times) if c not in columns]
    labels = {**a.get("columns", {}), **b.get("columns", {})}
    lines = []
    for key in shared:
        ra, rb = rows_a[key], rows_b[key]
        for column in columns:
            is_ratio = not column.startswith("time:")
            field = column if is_ratio else column[len("time:") :]
            va, vb = ra.get(field), rb.get(field)
            if va is None and vb is None:
                continue
            change = common.ratio(vb, va) if _number(va) and _number(vb) else None
            if change is not None and not math.isfinite(change):
                change = None
            unit = ra.get("unit") or rb.get("unit")
            label = _label(labels, field)
            if not is_ratio:
                label += f" ({unit})" if unit else " (s)"
            lines.append(
                {
                    "workload": key[0],
                    "metric": key[1],
                    "column": label,
                    "ratio": is_ratio,
                    "a": va,
                    "b": vb,
                    "b_over_a": change,
                }
            )
    return {
        "lines": lines,
        "only_a": [k for k in rows_a if k not in rows_b],
        "only_b": [k for k in rows_b if k not in rows_a],
    }


def render(result: Mapping[str, Any]) -> str:
    """The comparison's lines as a markdown table."""
    headers = ["workload", "metric", "figure", "A", "B", "B/A", "change"]
    body = []
    for line in result["lines"]:
        change = line["b_over_a"]
        body.append(
            [
                line["workload"],
                line["metric"] or "—",
                line["column"],
                _format(line["a"], line["ratio"]),
                _format(line["b"], line["ratio"]),
                common.format_number(change) if change is not None else "—",
                f"{(change - 1) * 100:+.1f}%" if change is not None else "—",
            ]
        )
    return common.markdown_table(headers, body, ["l", "l", "l", "r", "r", "r", "r"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare",
        description="Compare two JSON results of one benchmark (written with --json): per "
        "workload and ratio column, both runs' figures and the change.",
    )
    parser.add_argument("a", type=Path, help="the first run (the reference, 'A')")
    parser.add_argument("b", type=Path, help="the second run ('B')")
    parser.add_argument(
        "--times", action="store_true", help="compare the median times too, not only ratios"
    )
    args = parser.parse_args(argv)
    payloads = []
    for path in (args.a, args.b):
        try:
            payloads.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as e:
            parser.error(f"cannot read {path}: {e}")
    a, b = payloads
    if a.get("benchmark") != b.get("benchmark"):
        parser.error(
            f"{args.a} is a run of {a.get('benchmark')!r} and {args.b} of "
            f"{b.get('benchmark')!r}: only runs of one benchmark compare"
        )
    result = compare(a, b, times=args.times)
    print(f"# benchmarks.{a.get('benchmark')}: run B against run A")
    print()
    print(describe_run("A", args.a, a))
    print(describe_run("B", args.b, b))
    differences = machine_differences(a, b)
    print(
        "machine info differs: " + "; ".join(differences)
        if differences
        else "same CPU, thread count and versions (commit and date may differ)"
    )
    print()
    print(
        "Ratio columns (×) are fusegrad's median time over the named peer's, within one run: "
        "0.52× = fusegrad takes 52% of the peer's time."
        + (" Times are medians in the row's unit." if args.times else "")
        + " 'B/A' is run B's figure divided by run A's and 'change' the same in percent: "
        "below 1 (negative) B's figure is lower -- for a ratio, fusegrad gained on that peer."
    )
    print()
    if result["lines"]:
        print(render(result))
    else:
        print("no row is in both runs")
    for name, keys in (("A", result["only_a"]), ("B", result["only_b"])):
        for workload, metric in keys:
            print(f"only in {name}: {workload} {metric}".rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
