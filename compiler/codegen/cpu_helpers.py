"""Scalar helpers called from generated CPU kernels (numba, inlined).

They give generated code numpy's scalar semantics where a bare Python operator would differ:
NaN propagation of maximum/minimum (on ties numpy's choice, the second operand, so that
``maximum(+0, -0)`` is -0), ``sign`` at +-inf (+-1), +-0 (+0) and NaN (NaN), ``pow`` through
numpy's scalar ufunc, dtype-preserving casts, and a numerically stable float64 sigmoid.  float32
math functions come from ``fastmath`` (vectorisable); float64 ones are libm (``math.*``).

The CUDA emitter compiles these same Python functions as device functions, and numba's CUDA
simulator runs them as plain Python on numpy scalars: each must mean the same in all three
(``tests/compiler/test_nan_semantics.py`` checks them over +-0, +-inf, NaN and denormals)."""

from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

import numba
import numpy as np

from . import diskcache

# the helpers are inlined into generated kernels, whose numba disk cache cannot see them change:
# the emitters put this digest of their source in each generated module's hash
SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]

# inlined into every kernel that calls them, numpy error model (no division checks), cached
_helper = numba.njit(inline="always", error_model="numpy", cache=True)


@_helper
def _maximum(a, b):  # type: ignore[no-untyped-def]
    if a != a:
        return a
    if b != b:
        return b
    return a if a > b else b


@_helper
def _minimum(a, b):  # type: ignore[no-untyped-def]
    if a != a:
        return a
    if b != b:
        return b
    return a if a < b else b


@_helper
def _sign(a):  # type: ignore[no-untyped-def]
    # ``a ** 0`` is 1 in a's own type for every a, +-inf included (numba folds it to a constant);
    # ``a - a + 1`` was nan at +-inf, and a literal 1 would widen float32 to float64
    if a > 0:
        return a**0
    if a < 0:
        return -(a**0)
    if a == 0:
        return abs(a)  # +0 for both zeros, as numpy's sign
    return a  # nan


@_helper
def _pow(a, b):  # type: ignore[no-untyped-def]
    return np.power(a, b)


@_helper
def _sigmoid64(x):  # type: ignore[no-untyped-def]
    e = math.exp(-abs(x))
    return 1.0 / (1.0 + e) if x >= 0 else e / (1.0 + e)


@_helper
def _cast_float32(x):  # type: ignore[no-untyped-def]
    return np.float32(x)


@_helper
def _cast_float64(x):  # type: ignore[no-untyped-def]
    return np.float64(x)


@_helper
def _cast_int64(x):  # type: ignore[no-untyped-def]
    return np.int64(x)


@_helper
def _cast_int32(x):  # type: ignore[no-untyped-def]
    return np.int32(x)


@_helper
def _cast_bool(x):  # type: ignore[no-untyped-def]
    return x != 0


@numba.njit(cache=True, nogil=True)
def _partial_sums(count):  # type: ignore[no-untyped-def]
    """``count`` zeroed float64 partial sums for a reduction of a generated kernel.  Called, not
    inlined: numpy's ``zeros`` is then compiled once and cached with this module, instead of
    inside every kernel (a third of a second each)."""
    return np.zeros(count)


# float64 math: libm
MATH64 = {
    "exp": "math.exp",
    "expm1": "math.expm1",
    "log": "math.log",
    "log1p": "math.log1p",
    "sin": "math.sin",
    "cos": "math.cos",
    "tanh": "math.tanh",
    "sigmoid": "_sigmoid64",
    "erf": "math.erf",
}


# numba's disk cache of these helpers: a corrupt entry is a miss, never an error (``diskcache``);
# they are compiled as part of the kernels calling them, so nothing here is counted
diskcache.guard_module(sys.modules[__name__], entry_points=())
