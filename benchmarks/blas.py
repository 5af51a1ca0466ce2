"""float32 GEMM speed per OpenBLAS kernel set: the measurement behind ``fusegrad._blas``.

Each kernel set runs in its own process (``FUSEGRAD_BLAS_KERNELS=<set>``, or ``keep`` for
OpenBLAS's own choice), timing numpy's ``a @ b`` on the shapes fusegrad's benchmark programs
multiply (convolution columns, LSTM steps, attention and MLP layers), and prints GFLOP/s per
shape; PyTorch's matmul is the last column when it is importable.  Every result is checked
against a float64 product first.

    python -m benchmarks.blas --threads 1
    python -m benchmarks.blas --quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

# (M, K, N): DCGAN's and MNIST's convolution columns, the LSTM-LM's recurrent step and
# decoder, GPT's and the Transformer's layers, square ones
SHAPES = (
    (64, 512, 1024),
    (1024, 512, 64),
    (128, 1024, 256),
    (16, 100, 2048),
    (20, 200, 800),
    (700, 200, 2000),
    (2048, 64, 576),
    (256, 64, 256),
    (512, 512, 512),
)
QUICK_SHAPES = ((8, 16, 32), (33, 17, 9))


def _gflops(matmul: Any, np: Any, m: int, k: int, n: int, quick: bool) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    got = np.asarray(matmul(a, b), dtype=np.float64)
    if not np.allclose(got, exact, rtol=1e-4, atol=1e-4 * np.sqrt(k)):
        raise AssertionError(f"{m}x{k}x{n}: the product differs from float64's")
    reps = 1 if quick else max(5, int(2e8 / (2 * m * k * n)))
    best = float("inf")
    for _ in range(1 if quick else 5):
        start = time.perf_counter()
        for _ in range(reps):
            matmul(a, b)
        best = min(best, (time.perf_counter() - start) / reps)
    return 2 * m * k * n / best / 1e9


def _child(kernels: str, quick: bool) -> None:
    """One kernel set: import fusegrad (which applies the setting), time numpy's products."""
    os.environ["FUSEGRAD_BLAS_KERNELS"] = kernels
    import numpy as np

    import fusegrad  # noqa: F401  (applies FUSEGRAD_BLAS_KERNELS)
    from fusegrad import _blas

    sets = sorted(set(v for v in _blas.tune().values() if v)) or ["(no switchable OpenBLAS)"]
    shapes = QUICK_SHAPES if quick else SHAPES
    result = {"sets": sets, "gflops": [_gflops(np.matmul, np, *s, quick) for s in shapes]}
    if kernels == "keep":
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

            def product(a: Any, b: Any) -> Any:
                return torch.from_numpy(a) @ torch.from_numpy(b)

            result["torch"] = [_gflops(product, np, *s, quick) for s in shapes]
    print(json.dumps(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="BLAS / PyTorch threads")
    parser.add_argument("--sets", default="keep,auto,Haswell,SkylakeX", help="kernel sets")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one repetition")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(args.child, args.quick)
        return 0
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(args.threads)
    env.pop("OPENBLAS_CORETYPE", None)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    print(f"float32 GEMM, GFLOP/s (best of 5), {args.threads} thread(s); M x K x N")
    header = " | ".join(f"{m}x{k}x{n}" for m, k, n in shapes)
    print(f"| FUSEGRAD_BLAS_KERNELS | kernel set | {header} |")
    print("|---|---|" + "---:|" * len(shapes))
    torch_row = None
    for kernels in args.sets.split(","):
        cmd = [sys.executable, "-m", "benchmarks.blas", "--child", kernels]
        proc = subprocess.run(
            cmd + (["--quick"] if args.quick else []),
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            print(f"| {kernels} | failed: {proc.stderr.strip().splitlines()[-1:]} |")
            return 1
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        cells = " | ".join(f"{g:.0f}" for g in result["gflops"])
        print(f"| {kernels} | {', '.join(result['sets'])} | {cells} |", flush=True)
        torch_row = result.get("torch", torch_row)
    if torch_row is not None:
        print(f"| (PyTorch) | its own | {' | '.join(f'{g:.0f}' for g in torch_row)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
