"""Scalar helpers called from generated CPU kernels (numba, inlined).

They give generated code numpy's scalar semantics where a bare Python operator would differ:
NaN propagation of maximum/minimum, ``sign(nan) = nan``, ``pow`` through numpy's scalar ufunc,
dtype-preserving casts, and a numerically stable float64 sigmoid.  float32 math functions come
from ``fastmath`` (vectorisable); float64 ones are libm (``math.*``).
"""

from __future__ import annotations

import math
import sys

import numba
import numpy as np

from . import diskcache

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
    if a > 0:
        return a - a + 1
    if a < 0:
        return a - a - 1
    return a  # 0, -0 and nan are their own sign


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
