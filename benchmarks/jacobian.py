"""Jacobians: ``autograd.functional.jacobian`` row by row and with ``vectorize=True``.

The function is a small network layer, ``softmax(tanh(x @ W))`` for ``x`` of shape
(``rows``, ``features``) and ``W`` of shape (``features``, ``width``): its Jacobian has
``rows * width`` rows (one reverse pass each without ``vectorize``; fusegrad's vectorized path
runs them as one batched program, ``fusegrad.compiler.batching``; PyTorch's uses ``vmap``).
Times are the median of ``reps`` calls after warm-up calls (which include fusegrad's capture and
numba compile), at a fixed thread count.  fusegrad's vectorized blocks are checked against its
row-by-row ones (and PyTorch's, when importable) before anything is timed.

Run from the repository root: ``python -m benchmarks.jacobian [--threads 1] [--rows 8]
[--features 32] [--width 16] [--reps 20]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # after the script path fix above


def _median_ms(fn: Any, reps: int) -> float:
    fn()
    fn()  # (warm-up: capture, numba compile, caches)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    common.pin_threads(args.threads)
    import numpy as np

    import fusegrad as fg
    from fusegrad.autograd.functional import jacobian

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.features)).astype(np.float32)
    w = (rng.standard_normal((args.features, args.width)) / args.features**0.5).astype(np.float32)

    def layer(x: Any, w: Any) -> Any:
        return (x @ w).tanh().softmax(-1)

    ours = (fg.tensor(x), fg.tensor(w))
    loop = jacobian(layer, ours)
    vec = jacobian(layer, ours, vectorize=True)
    for a, b in zip(loop, vec):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
    rows = [
        ("fusegrad, row by row", _median_ms(lambda: jacobian(layer, ours), args.reps)),
        (
            "fusegrad, vectorize=True",
            _median_ms(lambda: jacobian(layer, ours, vectorize=True), args.reps),
        ),
    ]
    torch = None
    try:
        import torch
    except ImportError:
        pass
    if torch is not None:
        common.pin_torch_threads(torch, args.threads)
        theirs = (torch.tensor(x), torch.tensor(w))
        tj = torch.autograd.functional.jacobian
        ref = tj(layer, theirs, vectorize=True)
        for a, b in zip(vec, ref):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
        rows.append(("torch, row by row", _median_ms(lambda: tj(layer, theirs), args.reps)))
        rows.append(
            (
                "torch, vectorize=True (vmap)",
                _median_ms(lambda: tj(layer, theirs, vectorize=True), args.reps),
            )
        )
    n = args.rows * args.width
    print(
        f"# Jacobian of softmax(tanh(x @ W)), x {args.rows}x{args.features}, "
        f"W {args.features}x{args.width}: {n} rows; {args.threads} thread(s), median of "
        f"{args.reps}\n"
    )
    base = rows[1][1]
    table = [[name, f"{ms:.3f}", f"{ms / base:.1f}×"] for name, ms in rows]
    print(
        common.markdown_table(
            ["implementation", "ms per jacobian", "vs fusegrad vectorized"], table, "lrr"
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
