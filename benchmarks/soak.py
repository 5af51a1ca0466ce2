"""Soak tests of the compiled backward's caches: ``python -m benchmarks.soak``.

Three runs in one process, each printed as it goes:

* **batch sizes**: one model (a two-layer MLP with cross-entropy), N steps, each with a new
  batch size.  Reported: captures (one is expected: sizes are symbols), graph builds, resident
  memory (RSS) after the first tenth of the steps and at the end, and the median step time.
* **distinct graphs**: N different graph structures (chains of elementwise ops drawn from a
  seed), one backward each, with the graph cache at its default bound.  Reported: RSS after
  the cache first filled and at the end (flat: the caches are bounded), captures, cache entries.
* **miss cost**: the time of one capture (a cache miss) with few and with many graphs cached:
  equal up to noise, since a miss never scans the cache.

The process exits non-zero when the batch-size run captured more than once, when RSS grew by
more than ``--rss-slack`` MiB (default 32) between the two readings of a run, or when a
compiled gradient differed from eager.  ``--quick`` runs 60 steps / 60 graphs (a smoke test:
its figures mean little).  Timing is reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, pin_threads


def rss_mib() -> float:
    """This process's resident memory now (Linux ``/proc``; peak RSS elsewhere)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def batch_sizes(steps: int, log: Any) -> dict[str, Any]:
    import gc

    import numpy as np

    import fusegrad as fg
    import fusegrad.nn.functional as F
    from fusegrad import compiler

    compiler.reset()
    rng = np.random.default_rng(0)
    # layer sizes no batch size of the run equals (equal sizes share a symbol: another key)
    w1 = fg.tensor(rng.standard_normal((33, 65)).astype(np.float32) * 0.2, requires_grad=True)
    b1 = fg.zeros(65, requires_grad=True)
    w2 = fg.tensor(rng.standard_normal((65, 11)).astype(np.float32) * 0.2, requires_grad=True)
    params = [w1, b1, w2]
    times = []
    rss_early = 0.0
    worst = 0.0
    for step in range(steps):
        n = 100 + step  # a new batch size every step
        x = fg.tensor(rng.standard_normal((n, 33)).astype(np.float32))
        y = fg.tensor(rng.integers(0, 11, n))

        def loss(x: Any = x, y: Any = y) -> Any:
            return F.cross_entropy(F.relu(x @ w1 + b1) @ w2, y)

        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        with compiler.compiled_autograd():
            loss().backward()
        times.append(time.perf_counter() - t0)
        if step % 25 == 0:  # against eager, now and then
            got = [p.grad.numpy().copy() for p in params]
            for p in params:
                p.grad = None
            loss().backward()
            for a, p in zip(got, params):
                want = p.grad.numpy()
                worst = max(worst, float(np.abs(a - want).max() / max(1.0, np.abs(want).max())))
        if step == max(steps // 10, 1):
            gc.collect()
            rss_early = rss_mib()
        if step % max(steps // 10, 1) == 0:
            log(f"  batch sizes: step {step}/{steps}, captures {compiler.counters.captures}")
    gc.collect()
    counters = compiler.counters
    return {
        "steps": steps,
        "captures": counters.captures,
        "builds": counters.builds,
        "rss_early_mib": rss_early,
        "rss_end_mib": rss_mib(),
        "median_step_us": 1e6 * sorted(times)[len(times) // 2],
        "worst_relative_error": worst,
    }


def distinct_graphs(count: int, log: Any) -> dict[str, Any]:
    import gc

    import numpy as np

    import fusegrad as fg
    from fusegrad import compiler

    compiler.reset()
    ops = ["exp", "tanh", "sigmoid", "sin", "cos", "neg", "abs"]
    filled = compiler.config.cache_size
    rss_filled = 0.0
    for k in range(count):
        chosen = np.random.default_rng(k).integers(0, len(ops), 4 + k % 5)
        x = fg.randn(64, requires_grad=True)
        with compiler.compiled_autograd():
            h = x
            for i in chosen:
                h = getattr(h, ops[i])() * 0.5 + h
            h.sum().backward()
        if k == min(filled, count - 1) or (k == count // 4 and count <= filled):
            gc.collect()
            rss_filled = rss_mib()
        if k % max(count // 10, 1) == 0:
            log(f"  distinct graphs: {k}/{count}, cached {len(compiler.service.service.graphs)}")
    gc.collect()
    return {
        "graphs": count,
        "captures": compiler.counters.captures,
        "cached_graphs": len(compiler.service.service.graphs),
        "cache_size": filled,
        "rss_filled_mib": rss_filled,
        "rss_end_mib": rss_mib(),
    }


def miss_cost(log: Any) -> dict[str, Any]:
    import fusegrad as fg
    from fusegrad import compiler

    ops = ["exp", "tanh", "sigmoid", "sin", "cos", "neg", "abs"]

    def one_miss(k: int) -> float:
        x = fg.randn(8, requires_grad=True)
        with compiler.compiled_autograd():
            h = x
            while True:  # the base-7 digits of k choose the ops: a new structure for every k
                h = getattr(h, ops[k % 7])() + h
                k //= 7
                if not k:
                    break
            loss = h.sum()
            t0 = time.perf_counter()
            loss.backward()
            return time.perf_counter() - t0

    out = {}
    compiler.set_logs("recompiles")  # the miss reason is computed (and discarded) too
    import logging

    logging.getLogger("fusegrad.compiler").disabled = True
    try:
        for cached in (8, 240):
            compiler.reset()
            for k in range(cached):
                one_miss(k)
            samples = sorted(one_miss(100_000 + k) for k in range(15))
            assert compiler.counters.captures == cached + 15  # every call was a miss
            median = out[f"miss_us_with_{cached}_cached"] = 1e6 * samples[len(samples) // 2]
            log(f"  miss cost with {cached} graphs cached: {median:.0f} us")
    finally:
        logging.getLogger("fusegrad.compiler").disabled = False
        compiler.set_logs(None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--steps", type=int, default=1000, help="batch sizes (default 1000)")
    parser.add_argument("--graphs", type=int, default=1000, help="distinct graphs (default 1000)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="60 steps and graphs: smoke test")
    parser.add_argument("--rss-slack", type=float, default=32.0, help="allowed RSS growth, MiB")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "soak.json")
    args = parser.parse_args(argv)
    threads = pin_threads(args.threads)
    steps, graphs = (60, 60) if args.quick else (args.steps, args.graphs)

    def log(message: str) -> None:
        print(message, flush=True)

    log(f"soak: {steps} batch sizes, {graphs} distinct graphs, {args.threads} thread(s)")
    results: dict[str, Any] = {"threads": threads}
    results["batch_sizes"] = b = batch_sizes(steps, log)
    log(
        f"batch sizes: {b['steps']} steps, {b['captures']} capture(s), {b['builds']} build(s), "
        f"RSS {b['rss_early_mib']:.1f} -> {b['rss_end_mib']:.1f} MiB, "
        f"median step {b['median_step_us']:.0f} us, worst relative error "
        f"{b['worst_relative_error']:.1e}"
    )
    results["distinct_graphs"] = d = distinct_graphs(graphs, log)
    log(
        f"distinct graphs: {d['graphs']} graphs, {d['captures']} captures, "
        f"{d['cached_graphs']} cached (bound {d['cache_size']}), "
        f"RSS {d['rss_filled_mib']:.1f} -> {d['rss_end_mib']:.1f} MiB"
    )
    results["miss_cost"] = miss_cost(log)
    failures = []
    if b["captures"] != 1:
        failures.append(f"the batch-size run captured {b['captures']} times (expected 1)")
    if b["worst_relative_error"] > 1e-4:
        failures.append(f"compiled gradients differ from eager ({b['worst_relative_error']:.1e})")
    for name, early, end in (
        ("batch sizes", b["rss_early_mib"], b["rss_end_mib"]),
        ("distinct graphs", d["rss_filled_mib"], d["rss_end_mib"]),
    ):
        if end - early > args.rss_slack:
            failures.append(f"{name}: RSS grew by {end - early:.1f} MiB")
    if d["cached_graphs"] > d["cache_size"]:
        failures.append("the graph cache exceeded its bound")
    results["failures"] = failures
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    log(f"JSON written to {args.json}")
    for failure in failures:
        log(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
