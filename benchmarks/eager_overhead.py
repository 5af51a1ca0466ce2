"""Eager overhead: what fusegrad's eager mode costs per op and per backward node.

Two workloads, each run by three implementations in the same process and the same thread setting:

* ``chain200``: a 200-op elementwise chain on 1,000-element float32 vectors (20 blocks of
  ``h = x*w + b``, ``tanh``, ``*w``, ``sigmoid``, ``*0.5``, then ``x = x * exp(-h*h)``; the leaf
  ``w`` is used 40 times, ``b`` 20 times), summed to a scalar.  The tensors are so small that
  the time is almost all framework overhead: op dispatch, node creation, the backward engine.
  Reported as totals and as microseconds per forward op and per backward node.
* ``mlp``: one forward+backward of a 784-512-512-10 ReLU MLP on a batch of 128 with a
  cross-entropy loss (no optimizer step).  Here matmuls dominate and overhead should vanish.

Implementations: ``fusegrad`` eager; ``numpy``, a hand-written forward and backward (the honest
lower bound: the same numpy calls with no framework around them); ``torch`` eager when PyTorch
is importable (the column is skipped otherwise, or with ``--no-torch``).  Every repetition
clears ``.grad`` (outside the timed region), times the forward and the backward separately, and
the tables report medians after warm-up.  The implementations alternate in rounds of
back-to-back repetitions (``common.measure_interleaved``) so that background load does not favour
one of them.  Graph teardown after backward is not timed for anyone.
The three implementations' gradients are compared once, so a benchmark that silently computes
something else fails loudly.

Run from the repository root::

    python -m benchmarks.eager_overhead [--threads N] [--quick] [--no-torch] [--json PATH]

or as a script (``python benchmarks/eager_overhead.py``).  Results go to
``benchmarks/results/eager_overhead.json`` by default.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common, live, plot  # after the script path fix above

# numpy, fusegrad and torch are imported in ``main`` only, after the thread count is pinned.

CHAIN_SIZE = 1000
CHAIN_BLOCKS = 20
CHAIN_OPS_PER_BLOCK = 10
CHAIN_OPS = CHAIN_BLOCKS * CHAIN_OPS_PER_BLOCK + 1  # + the final sum
MLP_SIZES = (784, 512, 512, 10)
MLP_BATCH = 128

IMPLS = ("fusegrad", "numpy", "torch")

# (workload, metric, unit, phase, per-op divisor) -> one table row each, in this order
ROW_SPECS: tuple[tuple[str, str, str, str, str | None], ...] = (
    ("chain200", "forward", "ms", "forward", None),
    ("chain200", "backward", "ms", "backward", None),
    ("chain200", "forward+backward", "ms", "total", None),
    ("chain200", "forward per op", "µs", "forward", "ops"),
    ("chain200", "backward per node", "µs", "backward", "nodes"),
    ("mlp", "forward", "ms", "forward", None),
    ("mlp", "backward", "ms", "backward", None),
    ("mlp", "forward+backward", "ms", "total", None),
)
UNIT_SCALE = {"ms": 1e3, "µs": 1e6}

# backward per node, fusegrad / torch, on chain200: the goal set for the eager engine
TARGET_BACKWARD_PER_NODE_VS_TORCH = 3.0

DEFAULT_REPS = {"chain200": (20, 200), "mlp": (5, 50)}  # (warm-up, measured)
QUICK_REPS = {"chain200": (1, 3), "mlp": (1, 2)}


class Workload:
    """One implementation of one workload: ``step`` times one repetition, ``grads`` returns the
    gradients of the last repetition (name -> ndarray), ``nodes`` counts backward nodes."""

    def __init__(
        self,
        step: common.StepFn,
        grads: Callable[[], dict[str, Any]],
        nodes: int,
        loss: Callable[[], float],
    ) -> None:
        self.step = step
        self.grads = grads
        self.nodes = nodes
        self.loss = loss


# ---- inputs ------------------------------------------------------------------------------------


def chain_inputs(np: Any, seed: int = 0) -> dict[str, Any]:
    """x, w, b for the chain; w in [0.5, 1.5] keeps every block's values bounded."""
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal(CHAIN_SIZE).astype(np.float32),
        "w": rng.uniform(0.5, 1.5, CHAIN_SIZE).astype(np.float32),
        "b": (0.1 * rng.standard_normal(CHAIN_SIZE)).astype(np.float32),
    }


def mlp_inputs(np: Any, seed: int = 0) -> dict[str, Any]:
    """Batch, integer targets and 1/sqrt(fan_in)-scaled weights."""
    rng = np.random.default_rng(seed)
    data: dict[str, Any] = {
        "input": rng.standard_normal((MLP_BATCH, MLP_SIZES[0])).astype(np.float32),
        "target": rng.integers(0, MLP_SIZES[-1], MLP_BATCH).astype(np.int64),
    }
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(MLP_SIZES), start=1):
        scale = 1.0 / np.sqrt(fan_in)
        data[f"W{i}"] = (scale * rng.standard_normal((fan_in, fan_out))).astype(np.float32)
        data[f"b{i}"] = (scale * rng.standard_normal(fan_out)).astype(np.float32)
    return data


MLP_PARAMS = ("W1", "b1", "W2", "b2", "W3", "b3")


# ---- chain200 ----------------------------------------------------------------------------------


def chain_forward(x: Any, w: Any, b: Any) -> Any:
    """The chain in the torch-like API fusegrad and torch share: 10 primitive ops per block.

    The block ends by scaling its input ``x`` by ``exp(-h*h)`` (in (0.78, 1]) rather than
    replacing it, so values stay bounded and the gradient reaching early blocks stays well inside
    the float32 range: a chain whose gradient decays into subnormals would time the CPU's
    subnormal penalty instead of framework overhead."""
    for _ in range(CHAIN_BLOCKS):
        h = x * w  # mul
        h = h + b  # add
        h = h.tanh()  # tanh
        h = h * w  # mul (w again)
        h = h.sigmoid() * 0.5  # sigmoid, mul by a Python scalar
        x = x * (-h * h).exp()  # neg, mul, exp, mul
    return x.sum()


def count_nodes(root: Any) -> int:
    """Backward nodes reachable from ``root`` (a grad_fn), AccumulateGrad excluded; works for
    fusegrad and torch, which both expose ``next_functions`` and ``name()``."""
    seen = {root}
    stack = [root]
    count = 0
    while stack:
        node = stack.pop()
        if not node.name().endswith("AccumulateGrad"):  # torch: torch::autograd::AccumulateGrad
            count += 1
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return count


def chain_framework(
    make_leaf: Callable[[Any], Any], to_numpy: Callable[[Any], Any], data: dict[str, Any]
) -> Workload:
    """chain200 in fusegrad or torch (same API); ``make_leaf`` turns an array into a leaf."""
    leaves = {name: make_leaf(arr) for name, arr in data.items()}
    x, w, b = leaves["x"], leaves["w"], leaves["b"]
    last: dict[str, float] = {}

    def step() -> dict[str, float]:
        for leaf in leaves.values():
            leaf.grad = None
        t0 = common.clock()
        loss = chain_forward(x, w, b)
        t1 = common.clock()
        loss.backward()
        t2 = common.clock()
        last["loss"] = loss.item()
        return {"forward": t1 - t0, "backward": t2 - t1}

    nodes = count_nodes(chain_forward(x, w, b).grad_fn)
    return Workload(
        step,
        lambda: {name: to_numpy(leaf.grad) for name, leaf in leaves.items()},
        nodes,
        lambda: last["loss"],
    )


def chain_numpy(np: Any, data: dict[str, Any]) -> Workload:
    """chain200 by hand: the forward saves what the backward needs, one numpy call per op
    (sigmoid as ``1 / (1 + exp(-a))``, fine for the bounded values of this chain)."""
    x0, w, b = data["x"], data["w"], data["b"]
    result: dict[str, Any] = {}

    def forward() -> tuple[Any, list[tuple[Any, ...]]]:
        saved = []
        x = x0
        for _ in range(CHAIN_BLOCKS):
            a1 = x * w
            a2 = a1 + b
            a3 = np.tanh(a2)
            a4 = a3 * w
            s = 1.0 / (1.0 + np.exp(-a4))
            h = s * np.float32(0.5)
            n = -h
            m = n * h
            e = np.exp(m)
            saved.append((x, a3, s, h, n, e))
            x = x * e
        return np.sum(x), saved

    def backward(saved: list[tuple[Any, ...]]) -> dict[str, Any]:
        gx = np.ones(CHAIN_SIZE, np.float32)  # d sum / d x
        gw = np.zeros(CHAIN_SIZE, np.float32)
        gb = np.zeros(CHAIN_SIZE, np.float32)
        for x, a3, s, h, n, e in reversed(saved):
            g_m = (gx * x) * e  # the last mul (e's side), then exp
            g_h = g_m * n - g_m * h  # mul's two inputs (n = -h, h), the neg
            g_a4 = (g_h * np.float32(0.5)) * (s * (1.0 - s))  # mul by 0.5, sigmoid
            gw += g_a4 * a3
            g_a2 = (g_a4 * w) * (1.0 - a3 * a3)  # mul by w, tanh
            gb += g_a2  # add
            gw += g_a2 * x
            gx = gx * e + g_a2 * w  # the last mul (x's side) plus the first mul
        return {"x": gx, "w": gw, "b": gb}

    def step() -> dict[str, float]:
        t0 = common.clock()
        loss, saved = forward()
        t1 = common.clock()
        result["grads"] = backward(saved)
        t2 = common.clock()
        result["loss"] = float(loss)
        return {"forward": t1 - t0, "backward": t2 - t1}

    return Workload(step, lambda: result["grads"], CHAIN_OPS, lambda: result["loss"])


# ---- mlp ---------------------------------------------------------------------------------------


def fusegrad_cross_entropy(fg: Any) -> tuple[Callable[[Any, Any], Any], str]:
    """fusegrad's cross_entropy: the op surface's, else nn.functional's, else log_softmax +
    gather.  Returns the function and where it came from (recorded in the JSON)."""
    for path in ("fusegrad.ops.functional", "fusegrad.nn.functional"):
        try:
            fn = importlib.import_module(path).cross_entropy
        except (ImportError, AttributeError):
            continue
        return fn, f"{path}.cross_entropy"

    def fallback(logits: Any, target: Any) -> Any:
        logp = logits.log_softmax(1)
        return -logp.gather(1, target.unsqueeze(1)).mean()

    return fallback, "log_softmax+gather"


def mlp_framework(
    make_leaf: Callable[[Any], Any],
    make_const: Callable[[Any], Any],
    to_numpy: Callable[[Any], Any],
    relu: Callable[[Any], Any],
    cross_entropy: Callable[[Any, Any], Any],
    data: dict[str, Any],
) -> Workload:
    """The MLP step in fusegrad or torch (same API)."""
    params = {name: make_leaf(data[name]) for name in MLP_PARAMS}
    inputs, target = make_const(data["input"]), make_const(data["target"])
    W1, b1, W2, b2, W3, b3 = (params[name] for name in MLP_PARAMS)
    last: dict[str, float] = {}

    def forward() -> Any:
        h1 = relu(inputs @ W1 + b1)
        h2 = relu(h1 @ W2 + b2)
        return cross_entropy(h2 @ W3 + b3, target)

    def step() -> dict[str, float]:
        for p in params.values():
            p.grad = None
        t0 = common.clock()
        loss = forward()
        t1 = common.clock()
        loss.backward()
        t2 = common.clock()
        last["loss"] = loss.item()
        return {"forward": t1 - t0, "backward": t2 - t1}

    nodes = count_nodes(forward().grad_fn)
    return Workload(
        step,
        lambda: {name: to_numpy(p.grad) for name, p in params.items()},
        nodes,
        lambda: last["loss"],
    )


def mlp_numpy(np: Any, data: dict[str, Any]) -> Workload:
    """The MLP step by hand: matmuls, ReLU masks, a stable log-softmax and its gradient."""
    X, y = data["input"], data["target"]
    W1, b1, W2, b2, W3, b3 = (data[name] for name in MLP_PARAMS)
    rows = np.arange(MLP_BATCH)
    result: dict[str, Any] = {}

    def step() -> dict[str, float]:
        t0 = common.clock()
        z1 = X @ W1 + b1
        h1 = np.maximum(z1, 0)
        z2 = h1 @ W2 + b2
        h2 = np.maximum(z2, 0)
        logits = h2 @ W3 + b3
        shifted = logits - logits.max(axis=1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        loss = -logp[rows, y].mean()
        t1 = common.clock()
        g = np.exp(logp)
        g[rows, y] -= 1.0
        g *= np.float32(1.0 / MLP_BATCH)
        gW3, gb3 = h2.T @ g, g.sum(axis=0)
        g2 = (g @ W3.T) * (z2 > 0)
        gW2, gb2 = h1.T @ g2, g2.sum(axis=0)
        g1 = (g2 @ W2.T) * (z1 > 0)
        gW1, gb1 = X.T @ g1, g1.sum(axis=0)
        t2 = common.clock()
        result["grads"] = {"W1": gW1, "b1": gb1, "W2": gW2, "b2": gb2, "W3": gW3, "b3": gb3}
        result["loss"] = float(loss)
        return {"forward": t1 - t0, "backward": t2 - t1}

    # no graph, so no node count (0: left out of the report's node counts)
    return Workload(step, lambda: result["grads"], 0, lambda: result["loss"])


# ---- driver ------------------------------------------------------------------------------------


def build_workloads(
    np: Any, fg: Any, torch: Any | None
) -> tuple[dict[str, dict[str, Workload]], dict[str, str]]:
    """All (workload, implementation) pairs, plus notes for the report."""
    notes: dict[str, str] = {}
    chain_data, mlp_data = chain_inputs(np), mlp_inputs(np)
    fg_ce, notes["fusegrad_cross_entropy"] = fusegrad_cross_entropy(fg)
    fg_relu = importlib.import_module("fusegrad.ops.functional").relu

    def fg_leaf(a: Any) -> Any:
        return fg.tensor(a, requires_grad=True)

    def fg_numpy(t: Any) -> Any:
        return t.numpy()

    workloads: dict[str, dict[str, Workload]] = {
        "chain200": {
            "fusegrad": chain_framework(fg_leaf, fg_numpy, chain_data),
            "numpy": chain_numpy(np, chain_data),
        },
        "mlp": {
            "fusegrad": mlp_framework(fg_leaf, fg.tensor, fg_numpy, fg_relu, fg_ce, mlp_data),
            "numpy": mlp_numpy(np, mlp_data),
        },
    }
    if torch is not None:

        def torch_leaf(a: Any) -> Any:
            return torch.from_numpy(a.copy()).requires_grad_(True)

        def torch_const(a: Any) -> Any:
            return torch.from_numpy(a.copy())

        def torch_numpy(t: Any) -> Any:
            return t.detach().numpy()

        ce = torch.nn.functional.cross_entropy
        workloads["chain200"]["torch"] = chain_framework(torch_leaf, torch_numpy, chain_data)
        workloads["mlp"]["torch"] = mlp_framework(
            torch_leaf, torch_const, torch_numpy, torch.relu, ce, mlp_data
        )
    return workloads, notes


def check_gradients(np: Any, impls: dict[str, Workload], rtol: float) -> dict[str, Any]:
    """Compare every implementation's gradients and loss with numpy's, relative to the
    largest reference magnitude.  Runs after timing, so the last repetition's values are used."""
    reference = impls["numpy"].grads()
    ref_loss = impls["numpy"].loss()
    report: dict[str, Any] = {"rtol": rtol, "ok": True, "max_rel_error": {}}
    for name, impl in impls.items():
        if name == "numpy":
            continue
        grads = impl.grads()
        worst = abs(impl.loss() - ref_loss) / max(abs(ref_loss), 1e-12)
        for key, ref in reference.items():
            got = grads.get(key)
            if got is None or got.shape != ref.shape:
                worst = float("inf")
                break
            scale = max(float(np.max(np.abs(ref))), 1e-12)
            worst = max(worst, float(np.max(np.abs(got - ref))) / scale)
        report["max_rel_error"][name] = worst
        if not worst <= rtol:
            report["ok"] = False
    return report


def build_rows(
    stats: dict[str, dict[str, dict[str, common.Stats]]], nodes: dict[str, dict[str, int]]
) -> list[dict[str, Any]]:
    """Rows of the report: per (workload, metric) the median of each implementation in the row's
    unit and the ratios fusegrad/numpy and fusegrad/torch."""
    rows = []
    for workload, metric, unit, phase, per in ROW_SPECS:
        if workload not in stats:
            continue
        values: dict[str, float | None] = {}
        full: dict[str, Any] = {}
        for impl in IMPLS:
            phase_stats = stats[workload].get(impl, {}).get(phase)
            if phase_stats is None:
                values[impl] = None
                full[impl] = None
                continue
            divisor = 1
            if per == "ops":
                divisor = CHAIN_OPS
            elif per == "nodes":
                divisor = nodes[workload].get(impl) or CHAIN_OPS
            scaled = phase_stats.scaled(UNIT_SCALE[unit] / divisor)
            values[impl] = scaled.median
            full[impl] = common.stats_dict(scaled)
        rows.append(
            {
                "workload": workload,
                "metric": metric,
                "unit": unit,
                **values,
                "fusegrad/numpy": common.ratio(values["fusegrad"], values["numpy"]),
                "fusegrad/torch": common.ratio(values["fusegrad"], values["torch"]),
                "stats": full,
            }
        )
    return rows


def table_headers(have_torch: bool) -> tuple[list[str], list[str]]:
    """The table's headers and alignments; the torch columns only when torch runs."""
    headers = ["workload", "metric", "unit", "fusegrad", "numpy"]
    headers += ["torch"] if have_torch else []
    headers.append("fusegrad/numpy")
    headers += ["fusegrad/torch"] if have_torch else []
    return headers, ["l", "l", "l"] + ["r"] * (len(headers) - 3)


def table_cells(row: dict[str, Any], have_torch: bool) -> list[str]:
    cells = [row["workload"], row["metric"], row["unit"]]
    cells += [common.format_number(row["fusegrad"]), common.format_number(row["numpy"])]
    if have_torch:
        cells.append(common.format_number(row["torch"]))
    cells.append(common.format_number(row["fusegrad/numpy"], 2) + "×")
    if have_torch:
        cells.append(common.format_number(row["fusegrad/torch"], 2) + "×")
    return cells


def render_table(rows: Sequence[dict[str, Any]], have_torch: bool) -> str:
    """The markdown table; the torch columns are left out when torch did not run."""
    headers, align = table_headers(have_torch)
    return common.markdown_table(headers, [table_cells(r, have_torch) for r in rows], align)


PLOT_PANELS = [
    {
        "title": "eager overhead: fusegrad eager time / peer's time",
        "numerator": "fusegrad",
        "peers": ["numpy", "torch"],
        "metrics": None,
    }
]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.eager_overhead",
        description="fusegrad eager overhead vs hand-written numpy and PyTorch eager.",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="BLAS/OpenMP/torch threads (default 1)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a few repetitions only: a smoke test, not a measurement",
    )
    parser.add_argument("--warmup", type=int, default=None, help="override warm-up repetitions")
    parser.add_argument(
        "--reps", type=int, default=None, help="override measured repetitions (both workloads)"
    )
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch column")
    parser.add_argument(
        "--json",
        type=Path,
        default=common.RESULTS_DIR / "eager_overhead.json",
        help="where to write the JSON results (default: %(default)s)",
    )
    parser.add_argument(
        "--plot", type=Path, default=None, metavar="PNG", help="draw the ratios into this PNG"
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "plain", "off"),
        default="auto",
        help="progress on stderr: a tqdm bar on a terminal when tqdm is installed, plain lines "
        "otherwise (auto); always plain lines; none",
    )
    args = parser.parse_args(argv)
    if args.plot is not None and (missing := plot.matplotlib_missing()) is not None:
        parser.error(missing)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the report, write the JSON; returns the JSON payload."""
    args = parse_args(argv)
    threads = common.pin_threads(args.threads)

    import numpy as np

    import fusegrad as fg

    torch: Any = None
    torch_note = "skipped (--no-torch)"
    if not args.no_torch:
        try:
            torch = importlib.import_module("torch")
        except ImportError as e:
            torch_note = f"skipped (not importable: {e})"
        else:
            threads["torch"] = common.pin_torch_threads(torch, args.threads)
            torch_note = torch.__version__

    workloads, notes = build_workloads(np, fg, torch)
    reps_table = QUICK_REPS if args.quick else DEFAULT_REPS
    have_torch = torch is not None
    environment = common.environment(threads=args.threads)
    repetitions: dict[str, dict[str, int]] = {}
    for workload in workloads:
        warmup, reps = reps_table[workload]
        warmup = args.warmup if args.warmup is not None else warmup
        reps = args.reps if args.reps is not None else reps
        repetitions[workload] = {"warmup": warmup, "reps": reps}

    live.emit(
        "# fusegrad eager overhead"
        + (" (QUICK: smoke test, not a measurement)" if args.quick else "")
    )
    live.emit()
    live.emit(f"machine: {common.describe_environment(environment)}")
    live.emit(
        f"threads: {args.threads} (BLAS/OpenMP env{' + torch' if have_torch else ''}); "
        f"torch: {torch_note}"
    )
    live.emit(
        "repetitions (warm-up/measured): "
        + ", ".join(f"{w} {r['warmup']}/{r['reps']}" for w, r in repetitions.items())
    )
    live.emit(
        f"chain200: {CHAIN_OPS} ops forward (200 elementwise + sum) on {CHAIN_SIZE} float32; "
        f"mlp: {'-'.join(map(str, MLP_SIZES))}, batch {MLP_BATCH}, ReLU, cross_entropy "
        f"(fusegrad: {notes['fusegrad_cross_entropy']})"
    )
    live.emit(
        "Times: median wall time in the row's unit (per call; 'per op' / 'per node': divided "
        "by the forward's ops / each framework's backward nodes). " + live.RATIO_CONVENTION
    )
    live.emit()

    stats: dict[str, dict[str, dict[str, common.Stats]]] = {}
    nodes: dict[str, dict[str, int]] = {}
    checks: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    headers, align = table_headers(have_torch)
    stream = live.StreamTable(headers, align, widths=[8, 17, 4])
    stream.start()
    for index, (workload, impls) in enumerate(workloads.items(), 1):
        warmup, reps = repetitions[workload]["warmup"], repetitions[workload]["reps"]
        with live.Progress(
            workload, mode=args.progress, position=(index, len(workloads))
        ) as progress:
            progress.stage(f"measuring {len(impls)} implementations, {warmup}+{reps} repetitions")
            steps = {name: impl.step for name, impl in impls.items()}
            stats[workload] = common.measure_interleaved(
                steps, warmup=warmup, reps=reps, on_step=progress.update
            )
            nodes[workload] = {name: impl.nodes for name, impl in impls.items() if impl.nodes}
            checks[workload] = check_gradients(np, impls, rtol=2e-3)
            wl_rows = build_rows({workload: stats[workload]}, nodes)
            for row in wl_rows:
                stream.row(table_cells(row, have_torch))
            rows += wl_rows

    table = render_table(rows, have_torch)
    chain_row = next(r for r in rows if r["metric"] == "backward per node")
    target = {
        "metric": "chain200 backward per node, fusegrad/torch",
        "target": TARGET_BACKWARD_PER_NODE_VS_TORCH,
        "value": chain_row["fusegrad/torch"],
        "met": (
            chain_row["fusegrad/torch"] is not None
            and chain_row["fusegrad/torch"] <= TARGET_BACKWARD_PER_NODE_VS_TORCH
        ),
    }
    live.emit()
    live.emit(
        "chain200 backward nodes (numpy: nominal): "
        + ", ".join(f"{k} {v}" for k, v in nodes["chain200"].items())
    )
    if target["value"] is not None:
        live.emit(
            f"target: {target['metric']} <= {target['target']:g}×: "
            f"{target['value']:.2f}× ({'met' if target['met'] else 'NOT met'})"
        )
    for workload, check in checks.items():
        errors = ", ".join(f"{k} {v:.1e}" for k, v in check["max_rel_error"].items())
        status = "ok" if check["ok"] else "MISMATCH"
        live.emit(
            f"gradient check {workload} vs numpy (max relative error, rtol {check['rtol']:g}): "
            f"{status} ({errors})"
        )

    payload = {
        "benchmark": "eager_overhead",
        "quick": args.quick,
        "threads": threads,
        "repetitions": repetitions,
        "workloads": {
            "chain200": {"size": CHAIN_SIZE, "ops": CHAIN_OPS, "nodes": nodes["chain200"]},
            "mlp": {
                "sizes": list(MLP_SIZES),
                "batch": MLP_BATCH,
                "nodes": nodes["mlp"],
                "fusegrad_cross_entropy": notes["fusegrad_cross_entropy"],
            },
        },
        "implementations": [impl for impl in IMPLS if impl != "torch" or have_torch],
        "columns": {impl: impl for impl in IMPLS},
        "plot_panels": PLOT_PANELS,
        "torch": torch_note,
        "rows": rows,
        "target": target,
        "checks": checks,
        "table": table,
        "environment": environment,
    }
    path = common.write_json(args.json, payload)
    live.emit(f"\nJSON written to {path} (compare two runs: python -m benchmarks.compare A B)")
    if args.plot is not None:
        live.emit(f"plot written to {plot.plot_payload(payload, args.plot)}")
    return payload


if __name__ == "__main__":
    payload = main()
    sys.exit(0 if all(check["ok"] for check in payload["checks"].values()) else 1)
