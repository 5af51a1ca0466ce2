"""Checkpoint memory: peak memory of one forward+backward of a deep MLP, with and without
activation checkpointing (``fusegrad.utils.checkpoint``).

The model is ``LAYERS`` (default 20) blocks of ``Linear(width, width)`` + ReLU on a batch of
``batch`` float32 rows, summed to a scalar.  Without checkpointing, backward keeps every block's
saved activations alive until it reaches them; with it, only the inputs of the checkpointed
segments are kept and each segment is recomputed during backward.  Variants:

* ``plain``: no checkpointing;
* ``per-layer (non-reentrant|reentrant)``: every block checkpointed on its own;
* ``sequential sqrt (non-reentrant|reentrant)``: ``checkpoint_sequential`` with
  ``round(sqrt(LAYERS))`` segments, the classic sqrt(n)-memory schedule.

How memory is measured: ``tracemalloc`` (numpy reports its array buffers to it), started after
the model, the input and zero-filled ``.grad`` buffers exist (the second step of a training loop:
gradients accumulate in place), so the peak is what one forward+backward allocates on top:
activations, saved tensors, recomputation and the gradients in flight.  Time per step (median of
a few repetitions, tracemalloc off) shows the price: about one extra forward.  Every variant's
gradients are checked against the plain run, so a checkpoint that silently computes something
else fails loudly (exit status 1).  ``--compiled`` adds each variant with its backward inside
``fusegrad.compiler.compiled_autograd()`` (the recomputation is then part of the compiled
backward program), measured after a warm-up call.

Run from the repository root::

    python -m benchmarks.checkpoint_memory [--layers N] [--width N] [--batch N] [--quick]
                                           [--compiled]

or as a script (``python benchmarks/checkpoint_memory.py``).  Results also go to
``benchmarks/results/checkpoint_memory.json`` (``--json PATH`` to change).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import itertools
import math
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # after the script path fix above

# numpy and fusegrad are imported in ``main`` only, after the thread count is pinned.

DEFAULTS = {"layers": 20, "width": 512, "batch": 256, "reps": 3}
QUICK = {"layers": 20, "width": 32, "batch": 16, "reps": 1}
MiB = 1024.0 * 1024.0


def build_model(fg: Any, layers: int, width: int) -> Any:
    nn = fg.nn
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks)


def variants(fg: Any, model: Any, layers: int) -> dict[str, Callable[[Any], Any]]:
    """name -> forward function of the input (each returns the scalar loss)."""
    from fusegrad.utils.checkpoint import checkpoint, checkpoint_sequential

    modules = list(model.children())
    pairs = [(modules[i], modules[i + 1]) for i in range(0, len(modules), 2)]
    segments = max(1, round(math.sqrt(layers)))

    def per_layer(use_reentrant: bool) -> Callable[[Any], Any]:
        def forward(x: Any) -> Any:
            for linear, act in pairs:
                x = checkpoint(
                    lambda t, linear=linear, act=act: act(linear(t)),
                    x,
                    use_reentrant=use_reentrant,
                )
            return x.sum()

        return forward

    def sequential(use_reentrant: bool) -> Callable[[Any], Any]:
        def forward(x: Any) -> Any:
            return checkpoint_sequential(model, segments, x, use_reentrant=use_reentrant).sum()

        return forward

    return {
        "plain": lambda x: model(x).sum(),
        "per-layer (non-reentrant)": per_layer(False),
        "per-layer (reentrant)": per_layer(True),
        f"sequential {segments} segments (non-reentrant)": sequential(False),
        f"sequential {segments} segments (reentrant)": sequential(True),
    }


def step(forward: Callable[[Any], Any], x: Any, region: Callable[[], Any]) -> None:
    with region():
        forward(x).backward()


def peak_bytes(forward: Callable[[Any], Any], x: Any, region: Callable[[], Any]) -> int:
    """Peak traced allocation of one forward+backward, on top of what already exists."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        step(forward, x, region)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def median_ms(forward: Callable[[Any], Any], x: Any, reps: int, region: Callable[[], Any]) -> float:
    samples = []
    for _ in range(reps):
        gc.collect()
        start = time.perf_counter()
        step(forward, x, region)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.checkpoint_memory",
        description="Peak memory of a deep MLP forward+backward with and without checkpointing.",
    )
    parser.add_argument("--layers", type=int, default=None, help="Linear+ReLU blocks (20)")
    parser.add_argument("--width", type=int, default=None, help="features per layer (512)")
    parser.add_argument("--batch", type=int, default=None, help="rows per batch (256)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (3)")
    parser.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads (1)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="also every variant with its backward inside compiled_autograd() (after a warm-up "
        "call: capture and compilation are not measured)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=common.RESULTS_DIR / "checkpoint_memory.json",
        help="where to write the JSON results (default: %(default)s)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the report, write the JSON; returns the JSON payload."""
    args = parse_args(argv)
    threads = common.pin_threads(args.threads)

    import numpy as np

    import fusegrad as fg

    sizes = dict(QUICK if args.quick else DEFAULTS)
    for key in ("layers", "width", "batch", "reps"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)

    fg.manual_seed(0)
    model = build_model(fg, sizes["layers"], sizes["width"])
    x = fg.randn(sizes["batch"], sizes["width"])
    # the input requires grad so that the reentrant variant is valid for the first block too
    x.requires_grad_(True)
    params = [*model.parameters(), x]

    regions: list[tuple[str, Callable[[], Any]]] = [("", contextlib.nullcontext)]
    if args.compiled:
        compiler = importlib.import_module("fusegrad.compiler")
        compiler.config.background_compile = False  # (the warm-up call compiles)
        regions.append((", compiled backward", compiler.compiled_autograd))
    rows = []
    reference: list | None = None
    plain_peak = plain_ms = None
    ok = True
    for (name, forward), (suffix, region) in itertools.product(
        variants(fg, model, sizes["layers"]).items(), regions
    ):
        name += suffix
        if suffix:
            step(forward, x, region)  # (the warm-up call: capture and compile)
        for p in params:  # zero-filled .grad: gradients accumulate in place, as in step 2+
            p.grad = fg.zeros_like(p)
        peak = peak_bytes(forward, x, region)
        grads = [p.grad.numpy().copy() for p in params]
        if reference is None:
            reference = grads
        max_error = max(
            float(np.max(np.abs(g - r)) / (np.max(np.abs(r)) + 1e-30))
            for g, r in zip(grads, reference)
        )
        matches = max_error <= 1e-5
        ok = ok and matches
        ms = median_ms(forward, x, sizes["reps"], region)
        if plain_peak is None:
            plain_peak, plain_ms = peak, ms
        rows.append(
            {
                "variant": name,
                "peak_bytes": peak,
                "peak_mib": peak / MiB,
                "peak_vs_plain": common.ratio(peak, plain_peak),
                "ms": ms,
                "time_vs_plain": common.ratio(ms, plain_ms),
                "grad_max_rel_error": max_error,
                "grads_match": matches,
            }
        )

    activation_mib = sizes["batch"] * sizes["width"] * 4 / MiB
    title = "# checkpoint memory" + (
        " (QUICK: smoke test, not a measurement)" if args.quick else ""
    )
    print(title)
    print()
    print(
        f"model: {sizes['layers']} x (Linear({sizes['width']}, {sizes['width']}) + ReLU), "
        f"batch {sizes['batch']}, float32 (one activation = {activation_mib:.2f} MiB); "
        f"fusegrad {fg.__version__}; numpy {np.__version__}; threads {args.threads}"
    )
    print("peak = tracemalloc peak of one forward+backward beyond the model, input and .grad")
    print()
    table = common.markdown_table(
        ["variant", "peak MiB", "peak / plain", "ms / step", "time / plain", "grads match"],
        [
            [
                r["variant"],
                f"{r['peak_mib']:.2f}",
                common.format_number(r["peak_vs_plain"]),
                common.format_number(r["ms"]),
                common.format_number(r["time_vs_plain"]),
                "yes" if r["grads_match"] else f"NO ({r['grad_max_rel_error']:.1e})",
            ]
            for r in rows
        ],
    )
    print(table)
    payload = {
        "benchmark": "checkpoint_memory",
        "quick": args.quick,
        "sizes": sizes,
        "rows": rows,
        "all_grads_match": ok,
        "environment": common.environment({"threads": threads}),
    }
    written = common.write_json(args.json, payload)
    print()
    print(f"JSON: {written}")
    if not ok:
        print("ERROR: a checkpointed variant's gradients differ from the plain run")
    return payload


if __name__ == "__main__":
    sys.exit(0 if main()["all_grads_match"] else 1)
