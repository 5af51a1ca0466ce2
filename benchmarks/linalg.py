"""Batched ``linalg.solve`` and ``linalg.cholesky`` forward + backward: fusegrad against PyTorch.

Each workload builds a batch of well-conditioned matrices, runs the forward and ``backward()`` of
a scalar loss through the op, and reports the median time per step (after a warm-up), after
checking that fusegrad's gradients equal PyTorch's (when PyTorch is importable) to 1e-10
relative in float64.  ``--quick`` runs tiny sizes once (the smoke test's mode).

    python -m benchmarks.linalg --threads 1
    python -m benchmarks.linalg --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _workloads(batch: int, n: int, k: int) -> dict[str, tuple[Callable, list]]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((batch, n, n)) + n * np.eye(n)
    b = rng.standard_normal((batch, n, k))
    spd = a @ np.swapaxes(a, -1, -2) + n * np.eye(n)
    return {
        "solve": (lambda m, A, B: (m.linalg.solve(A, B) ** 2).sum(), [a, b]),
        "cholesky": (lambda m, A: (m.linalg.cholesky(A) ** 2).sum(), [spd]),
        "cholesky + solve_triangular": (
            lambda m, A, B: m.linalg.solve_triangular(m.linalg.cholesky(A), B, upper=False).sum(),
            [spd, b],
        ),
    }


def _step(lib: Any, fn: Callable, arrays: list) -> list:
    leaves = [lib.tensor(x, requires_grad=True) for x in arrays]
    fn(lib, *leaves).backward()
    return [t.grad.numpy() for t in leaves]


def _time(lib: Any, fn: Callable, arrays: list, reps: int) -> float:
    _step(lib, fn, arrays)  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        _step(lib, fn, arrays)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--k", type=int, default=4, help="right-hand sides")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="BLAS / PyTorch threads")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.n, args.k, args.reps = 4, 5, 2, 1
    if args.threads is not None:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)

    import fusegrad as fg
    import fusegrad.linalg  # noqa: F401  (fg.linalg)

    try:
        import torch

        if args.threads is not None:
            torch.set_num_threads(args.threads)
    except ImportError:
        torch = None

    print(
        f"batch {args.batch} of {args.n} x {args.n} matrices, {args.k} right-hand sides, float64, "
        f"median of {args.reps}; forward + backward per step"
    )
    print("| workload | fusegrad (ms) | torch (ms) | fusegrad / torch |")
    print("|---|---|---|---|")
    for name, (fn, arrays) in _workloads(args.batch, args.n, args.k).items():
        mine = _time(fg, fn, arrays, args.reps)
        row = f"| {name} | {mine * 1e3:.3f} |"
        if torch is not None:
            for g, t in zip(_step(fg, fn, arrays), _step(torch, fn, arrays)):
                np.testing.assert_allclose(g, t, rtol=1e-10, atol=1e-12 * np.abs(t).max())
            theirs = _time(torch, fn, arrays, args.reps)
            row += f" {theirs * 1e3:.3f} | {mine / theirs:.2f} |"
        else:
            row += " - | - |"
        print(row)
    print("gradients equal PyTorch's" if torch is not None else "(PyTorch not importable)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
