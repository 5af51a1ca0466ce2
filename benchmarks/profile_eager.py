"""Where fusegrad's eager time goes on the chain200 workload of ``benchmarks.eager_overhead``.

Three views, printed as markdown:

1. **Categories.**  The forward and the backward are profiled separately with cProfile (each
   repetition builds a fresh graph and drops it, as in the benchmark).  Every profiled function is
   put in a category by its file (``registry.apply``, ``ops/_util``, ``dtypes``, ``autograd/node``,
   ``autograd/engine``, ...); time spent in C builtins (``isinstance``, ``ContextVar.set``, ...)
   is charged to its callers' categories.  Shares are then scaled to the *unprofiled* median time
   per op / per node, so the microseconds are estimates with the profiler's own overhead
   removed proportionally.  numpy ufunc calls are not seen by cProfile: their time is inside
   the kernel wrappers of ``ops/primitives.py``.
2. **Top functions** by own time, with calls per op / node.
3. **Component costs** (``--micro``): ``timeit`` of the pieces one op or one backward node is made
   of (a raw ufunc, the errstate wrapper, ``result_type``, ``Tensor._make``, ``OpNode``, one rule),
   a cost model for the suggestions in the eager-overhead report.

Run from the repository root: ``python -m benchmarks.profile_eager [--reps N] [--micro]``.
The thread count is pinned to 1 as in the benchmark.  Profiling is for reading, not for CI.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # after the script path fix above

# (category, predicate on (file, function name)); the first match wins
FuncKey = tuple[str, int, str]
CATEGORIES: tuple[tuple[str, Callable[[str, str], bool]], ...] = (
    ("numpy errstate around kernels", lambda f, n: "_ufunc_config" in f or "ContextVar" in n),
    (
        "kernels (numpy ufuncs + ops/primitives.py wrappers)",
        lambda f, n: f.endswith("primitives.py"),
    ),
    ("registry.apply", lambda f, n: f.endswith("ops/registry.py")),
    (
        "op surface (ops/elementwise, reduction, Tensor operators)",
        lambda f, n: "/ops/" in f and not f.endswith(("_util.py", "registry.py")),
    ),
    ("ops/_util (as_operand, scalar_tensor, broadcast_shape)", lambda f, n: f.endswith("_util.py")),
    ("dtypes.result_type", lambda f, n: f.endswith("dtypes.py")),
    ("Tensor creation (tensor.py)", lambda f, n: f.endswith(("/tensor.py", "/size.py"))),
    ("autograd/node.py (OpNode, SavedTensor)", lambda f, n: f.endswith("autograd/node.py")),
    (
        "autograd/engine.py (+ backward() entry)",
        lambda f, n: f.endswith(("autograd/engine.py", "autograd/__init__.py")),
    ),
    ("derivative rules (derivatives.py)", lambda f, n: f.endswith("derivatives.py")),
    ("grad mode / anomaly checks", lambda f, n: f.endswith(("grad_mode.py", "anomaly.py"))),
    ("benchmark harness", lambda f, n: "benchmarks" in f),
)
OTHER = "other"


def categorize(key: FuncKey) -> str | None:
    """The category of a profiled function; None for C builtins (charged to their callers)."""
    filename, _, name = key
    for category, matches in CATEGORIES:
        if matches(filename, name):
            return category
    if filename == "~":
        return None
    return OTHER


def category_times(stats: pstats.Stats) -> dict[str, float]:
    """Own time per category; a builtin's own time is split among its callers by the time each
    caller spent in it, resolved through chains of builtins (bounded walk)."""
    raw: dict[FuncKey, Any] = stats.stats  # type: ignore[attr-defined]
    totals: dict[str, float] = {}
    for key, (_, _, tottime, _, _callers) in raw.items():
        shares: list[tuple[FuncKey, float]] = [(key, tottime)]
        for _ in range(8):  # builtins calling builtins: a few levels at most
            pending: list[tuple[FuncKey, float]] = []
            for func, amount in shares:
                category = categorize(func)
                if category is not None:
                    totals[category] = totals.get(category, 0.0) + amount
                    continue
                func_callers = raw[func][4] if func in raw else {}
                weight = sum(entry[2] for entry in func_callers.values())
                if not func_callers or weight <= 0:
                    totals[OTHER] = totals.get(OTHER, 0.0) + amount
                    continue
                for caller, entry in func_callers.items():
                    pending.append((caller, amount * entry[2] / weight))
            shares = pending
            if not shares:
                break
        for _, amount in shares:
            totals[OTHER] = totals.get(OTHER, 0.0) + amount
    return totals


def profile_chain(np: Any, fg: Any, reps: int, warmup: int) -> dict[str, Any]:
    """Profile chain200 forward and backward separately; also time them unprofiled and count
    garbage collections per phase."""
    from benchmarks import eager_overhead as bench

    data = bench.chain_inputs(np)
    x, w, b = (fg.tensor(data[name], requires_grad=True) for name in ("x", "w", "b"))
    nodes = bench.count_nodes(bench.chain_forward(x, w, b).grad_fn)

    def step(profilers: tuple[Any, Any] | None = None) -> dict[str, float]:
        for leaf in (x, w, b):
            leaf.grad = None
        if profilers:
            profilers[0].enable()
        t0 = common.clock()
        loss = bench.chain_forward(x, w, b)
        t1 = common.clock()
        if profilers:
            profilers[0].disable()
            profilers[1].enable()
        t2 = common.clock()
        loss.backward()
        t3 = common.clock()
        if profilers:
            profilers[1].disable()
        return {"forward": t1 - t0, "backward": t3 - t2}

    timing = common.measure(step, warmup=warmup, reps=reps)

    collections: dict[str, list[int]] = {"forward": [0, 0, 0], "backward": [0, 0, 0]}
    phase = ["forward"]

    def on_gc(event: str, info: dict[str, int]) -> None:
        if event == "start" and phase[0] in collections:
            collections[phase[0]][info["generation"]] += 1

    profilers = (cProfile.Profile(), cProfile.Profile())
    gc.callbacks.append(on_gc)
    try:
        for _ in range(reps):
            for leaf in (x, w, b):
                leaf.grad = None
            phase[0] = "forward"
            profilers[0].enable()
            loss = bench.chain_forward(x, w, b)
            profilers[0].disable()
            phase[0] = "backward"
            profilers[1].enable()
            loss.backward()
            profilers[1].disable()
            phase[0] = "teardown"
            del loss
    finally:
        gc.callbacks.remove(on_gc)
    return {
        "nodes": nodes,
        "ops": bench.CHAIN_OPS,
        "reps": reps,
        "timing": timing,
        "stats": {name: pstats.Stats(p) for name, p in zip(("forward", "backward"), profilers)},
        "collections": collections,
    }


def _profiled_total(stats: pstats.Stats) -> float:
    return sum(entry[2] for entry in stats.stats.values())  # type: ignore[attr-defined]


def category_table(result: dict[str, Any]) -> str:
    """Categories with their share and estimated µs per forward op / backward node."""
    per_unit = {
        "forward": result["timing"]["forward"].median / result["ops"] * 1e6,
        "backward": result["timing"]["backward"].median / result["nodes"] * 1e6,
    }
    shares: dict[str, dict[str, float]] = {}
    for phase in ("forward", "backward"):
        stats = result["stats"][phase]
        total = _profiled_total(stats)
        for category, seconds in category_times(stats).items():
            shares.setdefault(category, {})[phase] = seconds / total
    order = sorted(shares, key=lambda c: -shares[c].get("backward", 0.0))
    rows = []
    for category in order:
        cells = [category]
        for phase in ("forward", "backward"):
            share = shares[category].get(phase, 0.0)
            cells += [common.format_number(share * per_unit[phase], 2), f"{100 * share:.0f}%"]
        rows.append(cells)
    rows.append(
        [
            "**total (unprofiled median)**",
            common.format_number(per_unit["forward"], 3),
            "100%",
            common.format_number(per_unit["backward"], 3),
            "100%",
        ]
    )
    headers = ["where", "fwd µs/op", "fwd %", "bwd µs/node", "bwd %"]
    return common.markdown_table(headers, rows)


def top_functions(result: dict[str, Any], phase: str, limit: int) -> str:
    """The functions with the most own time in one phase, calls per op / node."""
    stats = result["stats"][phase]
    raw = stats.stats  # type: ignore[attr-defined]
    total = _profiled_total(stats)
    unit = result["ops"] if phase == "forward" else result["nodes"]
    ranked = sorted(raw.items(), key=lambda item: -item[1][2])[:limit]
    rows = []
    for (filename, line, name), (_, ncalls, tottime, cumtime, _) in ranked:
        short = filename.split("/src/fusegrad/")[-1].split("site-packages/")[-1]
        where = name if filename == "~" else f"{short}:{line}({name})"
        rows.append(
            [
                where,
                common.format_number(ncalls / result["reps"] / unit, 3),
                f"{100 * tottime / total:.1f}%",
                f"{100 * cumtime / total:.1f}%",
            ]
        )
    per = "op" if phase == "forward" else "node"
    return common.markdown_table(["function", f"calls/{per}", "own %", "cumulative %"], rows)


def micro_costs(np: Any, fg: Any) -> list[tuple[str, float]]:
    """``timeit`` of the pieces of one op and one backward node (best of 5, µs per call)."""
    from fusegrad import dtypes
    from fusegrad.autograd.node import OpNode
    from fusegrad.ops import _util
    from fusegrad.ops.registry import REGISTRY, RULES, apply
    from fusegrad.tensor import Tensor

    a, b = fg.randn(1000), fg.randn(1000)
    ra, rb = fg.randn(1000, requires_grad=True), fg.randn(1000, requires_grad=True)
    out = ra * rb
    g = fg.randn(1000)
    nodes = {
        "mul": out.grad_fn,
        "tanh": ra.tanh().grad_fn,
        "sigmoid": ra.sigmoid().grad_fn,
        "exp": ra.exp().grad_fn,
        "neg": (-ra).grad_fn,
    }
    namespace = {
        "np": np,
        "fg": fg,
        "a": a,
        "b": b,
        "ra": ra,
        "rb": rb,
        "out": out,
        "g": g,
        "ad": a._data,
        "bd": b._data,
        "P": REGISTRY,
        "RULES": RULES,
        "apply": apply,
        "dtypes": dtypes,
        "_util": _util,
        "Tensor": Tensor,
        "OpNode": OpNode,
        "nodes": nodes,
    }
    cases = [
        ("np.multiply(a, b), 1000 float32 (the kernel itself)", "np.multiply(ad, bd)"),
        ("mul kernel incl. np.errstate wrapper (primitives._quiet)", "P['mul'].kernel(ad, bd)"),
        ("Tensor._make(array)", "Tensor._make(ad)"),
        ("dtypes.result_type(tensor, tensor)", "dtypes.result_type(a, b)"),
        ("dtypes.result_type(1.0, tensor)", "dtypes.result_type(1.0, a)"),
        (
            "_util.as_operand(1.0, float32) (a wrapped-number tensor)",
            "_util.as_operand(1.0, dtypes.float32)",
        ),
        ("_util.broadcast_shape(op, tensor, tensor)", "_util.broadcast_shape('mul', a, b)"),
        ("registry.apply(mul), inputs not requiring grad", "apply(P['mul'], (a, b), {})"),
        ("a * b, inputs not requiring grad (full op surface)", "a * b"),
        ("1.0 - a, input not requiring grad (scalar operand)", "1.0 - a"),
        ("registry.apply(mul) recording a node", "apply(P['mul'], (ra, rb), {})"),
        ("ra * rb recording a node (full op surface)", "ra * rb"),
        (
            "OpNode.__init__ (mul, saves a and b)",
            "OpNode(P['mul'], RULES['mul'], {}, (ra, rb), (out,))",
        ),
        (
            "OpNode.saved_values() of tanh (rebuilds the output tensor)",
            "nodes['tanh'].saved_values()",
        ),
    ]
    rule_cases = [
        (
            f"{name} backward node .apply (its rule, under no_grad)",
            f"nodes['{name}'].apply((g,), True)",
        )
        for name in nodes
    ]

    def best_of_5(stmt: str) -> float:
        timer = timeit.Timer(stmt, globals=namespace)
        number, _ = timer.autorange()
        return min(timer.repeat(repeat=5, number=number)) / number * 1e6

    results = [(label, best_of_5(stmt)) for label, stmt in cases]
    with fg.no_grad():  # as in the engine without create_graph
        results += [(label, best_of_5(stmt)) for label, stmt in rule_cases]
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_eager",
        description="Profile fusegrad eager forward/backward on the 200-op chain.",
    )
    parser.add_argument("--reps", type=int, default=200, help="profiled repetitions")
    parser.add_argument("--warmup", type=int, default=20, help="unprofiled warm-up repetitions")
    parser.add_argument("--top", type=int, default=15, help="rows of the top-functions tables")
    parser.add_argument("--micro", action="store_true", help="also time the components")
    parser.add_argument(
        "--dump",
        type=Path,
        default=None,
        help="write the raw cProfile stats to DUMP.forward / DUMP.backward",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    common.pin_threads(1)
    import numpy as np

    import fusegrad as fg

    result = profile_chain(np, fg, args.reps, args.warmup)
    timing = result["timing"]
    print("# fusegrad eager profile: chain200 (1 thread)\n")
    print(
        f"forward {timing['forward'].median * 1e3:.3f} ms ({result['ops']} ops), "
        f"backward {timing['backward'].median * 1e3:.3f} ms ({result['nodes']} nodes), "
        f"unprofiled medians of {args.reps}"
    )
    for phase in ("forward", "backward"):
        gens = result["collections"][phase]
        print(
            f"gc collections during {phase} per repetition: "
            + ", ".join(f"gen{i} {n / args.reps:.2f}" for i, n in enumerate(gens))
        )
    apply_calls = sum(
        entry[1]
        for key, entry in result["stats"]["backward"].stats.items()  # type: ignore[attr-defined]
        if key[0].endswith("ops/registry.py") and key[2] == "apply"
    )
    print(
        f"primitive calls (registry.apply) per backward node: "
        f"{apply_calls / args.reps / result['nodes']:.2f}"
    )
    print("\n## Where the time goes (own time by category, builtins charged to callers)\n")
    print(category_table(result))
    for phase in ("forward", "backward"):
        print(f"\n## Top functions, {phase} (own time)\n")
        print(top_functions(result, phase, args.top))
    if args.micro:
        print("\n## Component costs (timeit, best of 5)\n")
        rows = [[label, common.format_number(us, 3)] for label, us in micro_costs(np, fg)]
        print(common.markdown_table(["component", "µs/call"], rows))
    if args.dump is not None:
        for phase, stats in result["stats"].items():
            stats.dump_stats(f"{args.dump}.{phase}")


if __name__ == "__main__":
    main()
