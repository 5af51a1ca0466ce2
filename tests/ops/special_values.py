"""Special floating-point values, the lowering table as one kernel over them, and the comparison
with numpy that compiled code must pass (docs/ARCHITECTURE.md, contract 8: NaN and inf included).

Shared by ``tests/compiler/test_nan_semantics.py`` (generated CPU code, the interpreter, the
scalar helpers) and ``tests/cuda/test_nan_semantics_cuda.py`` (the CUDA emitter in numba's
simulator).  Importing this module imports neither numba nor a code generator.

* ``values(dtype)``: +-0, +-inf, NaN, +-1, +-large (the largest finite), +-tiny (the smallest
  denormal) and a few ordinary numbers;
* ``grid(dtype)``: every ordered pair of those values, each with both conditions (``x``, ``y``,
  ``c`` for the binary primitives and ``where``);
* ``expression_kernel``: one fused kernel computing every ``lowering.EXPRESSIONS`` primitive of
  the grid (unary ones of ``x``, binary ones of ``(x, y)``, ``where(c, x, y)``, casts);
* ``mismatches``: where a result differs from numpy's: NaN where numpy gives NaN, the same
  infinities, the same sign of zero, and finite values equal up to ``ulp`` units in the last
  place (0: bitwise).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import fusegrad as fg
from fusegrad.compiler.codegen.lowering import EXPRESSIONS
from fusegrad.compiler.ir import Graph, Value
from fusegrad.compiler.passes.fuse import Kernel
from fusegrad.ops.registry import REGISTRY

# the primitives whose results may differ from numpy's in the last places: libm or the float32
# helpers of ``fastmath`` against numpy's own implementations (``ulp_bound``)
# primitives computed through a function that is not correctly rounded (derived from the records:
# every one whose lowering calls a scalar function, but the exact ones), and pow
_EXACT_FUNCTIONS = frozenset({"sqrt", "floor", "ceil", "trunc", "isinf"})


def _transcendental() -> tuple[str, ...]:
    from fusegrad.ops.registry import REGISTRY

    names = [
        name
        for name, prim in REGISTRY.items()
        if prim.lowering is not None
        and any(f.name not in _EXACT_FUNCTIONS for f in prim.lowering.functions)
    ]
    return (*names, "pow")


TRANSCENDENTAL = _transcendental()


def values(dtype: Any) -> np.ndarray:
    """The special values of a float dtype, and a few ordinary ones (fusegrad or numpy dtype)."""
    np_dtype = np.dtype(getattr(dtype, "np", dtype))
    info = np.finfo(np_dtype)
    big, tiny = float(info.max), float(info.smallest_subnormal)
    return np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, big, -big, tiny, -tiny, 0.5, -2.5, 3.0],
        dtype=np_dtype,
    )


def finite_in_range(dtype: Any) -> np.ndarray:
    """The values of ``values(dtype)`` that a cast to an integer type is defined for: float ->
    int of NaN, inf or an out-of-range value is undefined in numpy (a RuntimeWarning and a
    platform-specific result), as in C."""
    v = values(dtype)
    return v[np.isfinite(v) & (np.abs(v) < 2.0**31)]


def grid(dtype: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, c): every ordered pair of ``values(dtype)``, each with c = True and c = False."""
    v = values(dtype)
    n = len(v)
    x = np.repeat(v, 2 * n)
    y = np.tile(np.repeat(v, 2), n)
    c = np.tile(np.array([True, False]), n * n)
    return x, y, c


def _operands(name: str, x: Value, y: Value, c: Value) -> tuple[Value, ...]:
    arity = len(REGISTRY[name].inputs)
    if name == "where":
        return (c, x, y)
    return (x, y, x)[:arity]  # (a third operand: binary_cross_entropy_backward's target)


def expression_kernel(
    dtype: Any, n: int, *, other_floats: bool = True, casts_to_int: bool = False
) -> Kernel:
    """One flat kernel over ``n`` elements (inputs ``x``, ``y`` of ``dtype`` and ``c`` of bool, as
    ``grid`` makes them) whose outputs are every ``lowering.EXPRESSIONS`` primitive: unary ones of
    ``x``, binary ones of ``(x, y)``, ``where(c, x, y)``, and casts of ``x`` to bool and to the
    other float dtype (``other_floats``; the interpreter holds one float dtype) and of ``c`` to
    ``dtype``.  ``casts_to_int``: instead, only casts of ``x`` to int32 and int64 (for
    ``finite_in_range`` inputs)."""
    g = Graph()
    x = g.input("saved", 0, (n,), dtype)
    y = g.input("saved", 1, (n,), dtype)
    c = g.input("saved", 2, (n,), fg.bool)
    calls: list[tuple[str, tuple[Value, ...], dict]] = []
    if casts_to_int:
        calls = [("cast", (x,), {"dtype": fg.int32}), ("cast", (x,), {"dtype": fg.int64})]
    else:
        for name in EXPRESSIONS:
            if name != "cast":
                calls.append((name, _operands(name, x, y, c), {}))
        other = fg.float64 if dtype is fg.float32 else fg.float32
        calls += [("cast", (x,), {"dtype": fg.bool}), ("cast", (c,), {"dtype": dtype})]
        if other_floats:
            calls.append(("cast", (x,), {"dtype": other}))
    out = []
    for name, operands, attrs in calls:
        shape, result_dtype = REGISTRY[name].meta(
            tuple(o.shape for o in operands), tuple(o.dtype for o in operands), **attrs
        )
        out.append(g.add(name, operands, attrs, shape, result_dtype))
    return Kernel(shape=(n,), values=out, inputs=[x, y, c], outputs=list(out))


def eager(v: Value, arrays: dict[Value, np.ndarray]) -> np.ndarray:
    """The primitive's eager kernel (numpy: the reference) on the arrays of ``v``'s operands."""
    with np.errstate(all="ignore"):
        return np.asarray(REGISTRY[v.op].kernel(*[arrays[i] for i in v.inputs], **dict(v.attrs)))


def describe(v: Value) -> str:
    attrs = dict(v.attrs)
    suffix = f" to {attrs['dtype'].name}" if "dtype" in attrs else ""
    return f"{v.op}{suffix} ({', '.join(i.dtype.name for i in v.inputs)})"


def ulp_bound(op: str, dtype: Any) -> int:
    """Units in the last place a compiled ``op`` may differ from numpy's at a finite value: 0 for
    every correctly rounded primitive; the float32 helpers' documented ``MAX_ULP_ERROR`` (numpy's
    own float32 functions are within half an ulp at these points); 2 for other float32 functions
    (libm or a record's helper in float64, rounded to float32, against numpy's or the eager
    kernel's own rounding: two roundings); 1 for float64 libm against numpy's implementations."""
    if op not in TRANSCENDENTAL:
        return 0
    if np.dtype(getattr(dtype, "np", dtype)) == np.float32 and op != "pow":
        from fusegrad.compiler.codegen import fastmath

        return fastmath.MAX_ULP_ERROR.get(op, 2)
    return 1


# primitives defined on part of the line only (PyTorch refuses other operands): outside it,
# compiled code's FMA contraction (allowed: docs/ARCHITECTURE.md, contract 8) may change a
# cancelling difference beyond any ulp bound (binary_cross_entropy's ``(t - 1) a - t b`` at
# t = 3e38), so finite results there are not compared; NaN and infinities still are
DOMAINS: dict[str, tuple[float, float]] = {"binary_cross_entropy": (0.0, 1.0)}


def outside_domain_as_numpy(
    op: str, got: np.ndarray, want: np.ndarray, operands: tuple[np.ndarray, ...]
) -> np.ndarray:
    """``got`` with numpy's finite results where ``op``'s operands leave its ``DOMAINS``."""
    bounds = DOMAINS.get(op)
    if bounds is None:
        return got
    lo, hi = bounds
    inside = np.logical_and.reduce([(o >= lo) & (o <= hi) for o in operands])
    finite = np.isfinite(got) & np.isfinite(want)
    return np.where(~inside & finite, want, got)


def _ordered(a: np.ndarray) -> np.ndarray:
    """Float bit patterns as integers ordered like the floats (both zeros map to 0)."""
    bits = a.view(np.int32 if a.dtype == np.float32 else np.int64).astype(np.int64)
    magnitude = bits & (0x7FFFFFFF if a.dtype == np.float32 else 0x7FFFFFFFFFFFFFFF)
    return np.where(bits < 0, -magnitude, magnitude)


def mismatches(
    got: np.ndarray, want: np.ndarray, ulp: int = 0, inputs: tuple[np.ndarray, ...] = ()
) -> list[str]:
    """Where ``got`` differs from ``want``, in words (empty: none): the dtype, NaN vs not NaN,
    infinities, the sign of zero, and finite values more than ``ulp`` units in the last place
    apart (bool and integer results: equality).  ``inputs`` are named in each message."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return [f"dtype/shape {got.dtype}{got.shape}, numpy {want.dtype}{want.shape}"]
    if want.dtype.kind != "f":
        bad = np.flatnonzero(got != want)
    else:
        g, w = got.reshape(-1), want.reshape(-1)
        nan_g, nan_w = np.isnan(g), np.isnan(w)
        both = ~nan_g & ~nan_w
        with np.errstate(all="ignore"):
            inf_wrong = both & (np.isinf(g) | np.isinf(w)) & (g != w)
            zero_sign = both & (g == 0) & (w == 0) & (np.signbit(g) != np.signbit(w))
            finite = both & np.isfinite(g) & np.isfinite(w)
            far = finite & (np.abs(_ordered(g) - _ordered(w)) > ulp)
        bad = np.flatnonzero((nan_g != nan_w) | inf_wrong | zero_sign | far)
    flat_inputs = [np.asarray(a).reshape(-1) for a in inputs]
    messages = (
        f"at {tuple(a[i].item() for a in flat_inputs)}: got {got.reshape(-1)[i]!r}, "
        f"numpy {want.reshape(-1)[i]!r}"
        for i in bad
    )
    return list(dict.fromkeys(messages))  # each distinct case once (grids repeat operands)
