"""Fast float32 math helpers vs libm vs numpy: nanoseconds per element, one thread.

For each primitive with a helper in ``fusegrad.compiler.codegen.fastmath``, three ways to apply it
to 1e6 float32 elements (output preallocated, so only compute and memory traffic are timed):

* ``helper``: a numba loop ``out[i] = fast_<name>_f32(a[i])``, compiled the way generated kernels
  are (``error_model="numpy"`` and the emitter's fastmath flags); LLVM vectorises it;
* ``math``: the same loop with ``math.<name>`` (libm's float32 function: this numba has no SVML,
  so it is a scalar call per element and the loop does not vectorise);
* ``numpy``: the numpy ufunc on float32 with ``out=`` (numpy has its own SIMD code for several of
  these); sigmoid is numpy's usual two-pass composite, erf is scipy's when scipy is importable.

Also one fused loop, ``out[i] = exp(a[i]) * b[i]``, the shape of a generated backward kernel.

Run from the repository root::

    python -m benchmarks.fastmath_bench [--quick] [--json PATH]

Results: a markdown table on stdout and JSON (default ``benchmarks/results/fastmath.json``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # after the script path fix above

N = 1_000_000
# emitter flags (compiler/codegen/numba_cpu.py): the helpers must stay fast and exact under them
KERNEL_FASTMATH = {"reassoc", "contract", "nsz"}

# primitive -> (low, high) of the uniform random inputs: typical activations / arguments
INPUT_RANGES: dict[str, tuple[float, float]] = {
    "exp": (-10.0, 10.0),
    "expm1": (-5.0, 5.0),
    "log": (1e-3, 100.0),
    "log1p": (-0.9, 10.0),
    "tanh": (-5.0, 5.0),
    "sigmoid": (-10.0, 10.0),
    "erf": (-4.0, 4.0),
    "sin": (-10.0, 10.0),
    "cos": (-10.0, 10.0),
    "sqrt": (0.0, 100.0),
}


def _loops(names: list[str]) -> dict[str, dict[str, Callable[..., Any]]]:
    """Compiled ``(a, out)`` loops per primitive: helper, math, and the numpy call."""
    import math

    import numba
    import numpy as np

    from fusegrad.compiler.codegen import fastmath

    def loop_of(scalar: Callable[..., Any]) -> Callable[..., Any]:
        @numba.njit(error_model="numpy", fastmath=KERNEL_FASTMATH)
        def loop(a, out):  # type: ignore[no-untyped-def]
            for i in range(a.size):
                out[i] = scalar(a[i])

        return loop  # type: ignore[no-any-return]

    @numba.njit(error_model="numpy", fastmath=KERNEL_FASTMATH)
    def libm_sigmoid(x):  # type: ignore[no-untyped-def]
        e = math.exp(-abs(x))
        return np.float32(1.0) / (np.float32(1.0) + e) if x >= 0 else e / (np.float32(1.0) + e)

    libm: dict[str, Callable[..., Any]] = {
        "exp": math.exp,
        "expm1": math.expm1,
        "log": math.log,
        "log1p": math.log1p,
        "tanh": math.tanh,
        "sigmoid": libm_sigmoid,
        "erf": math.erf,
        "sin": math.sin,
        "cos": math.cos,
        "sqrt": math.sqrt,
    }

    def numpy_sigmoid(a: Any, out: Any) -> None:
        np.negative(a, out=out)
        np.exp(out, out=out)
        out += np.float32(1.0)
        np.reciprocal(out, out=out)

    def ufunc_call(ufunc: Any) -> Callable[..., Any]:
        return lambda a, out: ufunc(a, out=out)

    numpy_fns: dict[str, Callable[..., Any] | None] = {
        name: ufunc_call(getattr(np, name))
        for name in ("exp", "expm1", "log", "log1p", "tanh", "sin", "cos", "sqrt")
    }
    numpy_fns["sigmoid"] = numpy_sigmoid
    try:
        from scipy.special import erf as scipy_erf  # type: ignore[import-untyped]
    except ImportError:
        numpy_fns["erf"] = None
    else:
        numpy_fns["erf"] = lambda a, out: scipy_erf(a, out=out)

    out: dict[str, dict[str, Callable[..., Any]]] = {}
    for name in names:
        helper = getattr(fastmath, fastmath.FLOAT32_HELPERS[name])
        impls = {"helper": loop_of(helper), "math": loop_of(libm[name])}
        if numpy_fns[name] is not None:
            impls["numpy"] = numpy_fns[name]  # type: ignore[assignment]
        out[name] = impls
    return out


def _fused_loops() -> dict[str, Callable[..., Any]]:
    import math

    import numba
    import numpy as np

    from fusegrad.compiler.codegen.fastmath import fast_exp_f32

    @numba.njit(error_model="numpy", fastmath=KERNEL_FASTMATH)
    def helper(a, b, out):  # type: ignore[no-untyped-def]
        for i in range(a.size):
            out[i] = fast_exp_f32(a[i]) * b[i]

    @numba.njit(error_model="numpy", fastmath=KERNEL_FASTMATH)
    def libm(a, b, out):  # type: ignore[no-untyped-def]
        for i in range(a.size):
            out[i] = math.exp(a[i]) * b[i]

    def numpy_version(a: Any, b: Any, out: Any) -> None:
        np.exp(a, out=out)
        np.multiply(out, b, out=out)

    return {"helper": helper, "math": libm, "numpy": numpy_version}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions (smoke test)")
    parser.add_argument("--json", type=Path, default=common.RESULTS_DIR / "fastmath.json")
    args = parser.parse_args(argv)
    threads = common.pin_threads(1)  # before numpy is imported

    import numpy as np

    warmup, reps = (1, 3) if args.quick else (3, 30)
    rng = np.random.default_rng(0)
    names = list(INPUT_RANGES)
    loops = _loops(names)
    impls = ("helper", "math", "numpy")
    results: dict[str, dict[str, float | None]] = {}

    def time_call(fn: Callable[..., Any], *args: Any) -> float:
        """Median ns per element of ``fn(*args)``."""

        def step() -> dict[str, float]:
            start = common.clock()
            fn(*args)
            return {"call": common.clock() - start}

        return common.measure(step, warmup=warmup, reps=reps)["call"].median / N * 1e9

    for name in names:
        low, high = INPUT_RANGES[name]
        a = rng.uniform(low, high, N).astype(np.float32)
        out = np.empty_like(a)
        results[name] = {}
        for impl in impls:
            fn = loops[name].get(impl)
            results[name][impl] = None if fn is None else time_call(fn, a, out)

    fused = _fused_loops()
    a = rng.uniform(-10.0, 10.0, N).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, N).astype(np.float32)
    out = np.empty_like(a)
    label = "exp(a) * b (fused loop)"
    results[label] = {impl: time_call(fn, a, b, out) for impl, fn in fused.items()}

    headers = [
        "primitive",
        "helper ns/elem",
        "math.* ns/elem",
        "numpy ns/elem",
        "math / helper",
        "numpy / helper",
    ]
    rows = []
    for name, row in results.items():
        rows.append(
            [
                name,
                common.format_number(row["helper"]),
                common.format_number(row["math"]),
                common.format_number(row["numpy"]),
                common.format_number(common.ratio(row["math"], row["helper"])),
                common.format_number(common.ratio(row["numpy"], row["helper"])),
            ]
        )
    print(f"float32, N = {N:,}, 1 thread, median of {reps} calls\n")
    print(common.markdown_table(headers, rows))
    common.write_json(
        args.json,
        {
            "benchmark": "fastmath",
            "n": N,
            "reps": reps,
            "threads": threads,
            "ns_per_element": results,
            "environment": common.environment(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
