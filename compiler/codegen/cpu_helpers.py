"""Scalar helpers called from generated CPU kernels and the interpreter (numba, inlined).

Two kinds:

* target helpers that every lowering may name directly: numpy's scalar semantics where a bare
  Python operator would differ (NaN propagation of ``_maximum``/``_minimum``,
  ``sign(nan) = nan``, ``_pow`` through numpy's scalar ufunc, dtype-preserving casts);
* the primitives' own scalar functions without a C library equivalent
  (``lowering.HELPER_FUNCTIONS``: sigmoid, digamma, ...), compiled here from their one Python
  source in ``fusegrad.ops`` and bound as ``_<name>`` (``RECORD_HELPERS``).

``MATH64`` is how the CPU spells every scalar function for non-float32 operands, derived from
the records: numpy's scalar ufunc where the record names one, else libm (``math.*``), else the
compiled helper.  float32 operands use ``fastmath``'s vectorisable helpers where it has one.

The target helpers give numpy's scalar semantics at the special values too: NaN propagation of
``_maximum``/``_minimum`` (on ties numpy's choice, the second operand, so that
``maximum(+0, -0)`` is -0), ``_sign`` at +-inf (+-1), +-0 (+0) and NaN (NaN).  The CUDA emitter
compiles these same Python functions as device functions, and numba's CUDA simulator runs them as
plain Python on numpy scalars: each must mean the same in all three
(``tests/compiler/test_nan_semantics.py`` checks them over +-0, +-inf, NaN and denormals).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import numba
import numpy as np

from fusegrad.ops.registry import ScalarFunction

from . import diskcache
from .lowering import FUNCTIONS, HELPER_FUNCTIONS, helper_name

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
def _cast_int16(x):  # type: ignore[no-untyped-def]
    return np.int16(x)


@_helper
def _cast_int8(x):  # type: ignore[no-untyped-def]
    return np.int8(x)


@_helper
def _cast_uint8(x):  # type: ignore[no-untyped-def]
    return np.uint8(x)


@_helper
def _cast_bool(x):  # type: ignore[no-untyped-def]
    return x != 0


@numba.njit(cache=True, nogil=True)
def _partial_sums(count):  # type: ignore[no-untyped-def]
    """``count`` zeroed float64 partial sums for a reduction of a generated kernel.  Called, not
    inlined: numpy's ``zeros`` is then compiled once and cached with this module, instead of
    inside every kernel (a third of a second each)."""
    return np.zeros(count)


# the lanes of ``_buffer_sum`` (``numba_cpu.SHORT_ROW_LANES``: the rows it serves are short)
BUFFER_SUM_LANES = 16


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})
def _buffer_sum(buf, n, lanes):  # type: ignore[no-untyped-def]
    """The sum of ``buf[:n]`` in ``BUFFER_SUM_LANES`` float64 partial sums (scratch ``lanes``):
    whole blocks with element ``lane`` of each adding into partial sum ``lane``, the rest into a
    tail, the partial sums added pairwise (lane j and j + half, halving), then the tail -- the
    order a generated kernel spells inline (``numba_cpu._blocked_loop``, ``_combine_lanes``), so
    the same bits.  A row kernel's row buffers call it (``_RowKernel.split_row_sums``) instead
    of repeating those loops per sum: numba then types and lowers them once, not in every
    kernel (a layer norm's kernels compiled 15-27% faster)."""
    for lane in range(BUFFER_SUM_LANES):
        lanes[lane] = 0.0
    tail = 0.0
    blocks_end = n - n % BUFFER_SUM_LANES
    for block in range(0, blocks_end, BUFFER_SUM_LANES):
        for lane in range(BUFFER_SUM_LANES):
            lanes[lane] += buf[block + lane]
    for i in range(blocks_end, n):
        tail += buf[i]
    half = BUFFER_SUM_LANES // 2
    while half > 0:
        for lane in range(half):
            lanes[lane] += lanes[lane + half]
        half //= 2
    return lanes[0] + tail


# the CPU emitter's own helpers for its reductions (no CUDA counterpart)
CPU_REDUCTION_HELPERS = ("_partial_sums", "_buffer_sum")

# the target helpers generated modules import by name
TARGET_HELPERS = (
    "_cast_bool",
    "_cast_float32",
    "_cast_float64",
    "_cast_int16",
    "_cast_int32",
    "_cast_int64",
    "_cast_int8",
    "_cast_uint8",
    "_maximum",
    "_minimum",
    "_partial_sums",
    "_buffer_sum",
    "_pow",
    "_sign",
)

# The records' scalar functions without a libm equivalent, compiled from their Python source:
# generated name -> numba function.  Like ``fastmath``'s helpers, and for the same reason, they
# are inlined by LLVM (``forceinline``) with flags of their own (``contract`` only): numba's
# ``inline="always"`` would re-lower them under the calling kernel's ``reassoc``/``nsz``, free
# to reorder arithmetic whose order they choose (a recurrence, a series, ``x - floor(x + 0.5)``)
# and to compute differently in generated kernels and in the interpreter (``contract`` only).
# numpy's error model: a division by zero gives inf or nan, as in the sources' guarded branches.
RECORD_HELPERS: dict[str, Any] = {
    helper_name(fn): numba.njit(forceinline=True, fastmath={"contract"}, error_model="numpy")(
        fn.python
    )
    for fn in HELPER_FUNCTIONS.values()
}
globals().update(RECORD_HELPERS)  # importable by generated modules (from cpu_helpers import ...)
assert not set(RECORD_HELPERS) & set(TARGET_HELPERS), "a record's helper shadows a target helper"


def spell64(fn: ScalarFunction) -> str:
    """The CPU's spelling of ``fn`` for non-float32 operands."""
    if fn.numpy is not None:
        return f"np.{fn.numpy}"
    if fn.libm is not None:
        return f"math.{fn.libm}"
    return helper_name(fn)


MATH64: dict[str, str] = {name: spell64(fn) for name, fn in FUNCTIONS.items()}


# numba's disk cache of these helpers: a corrupt entry is a miss, never an error (``diskcache``);
# they are compiled as part of the kernels calling them, so nothing here is counted
diskcache.guard_module(sys.modules[__name__], entry_points=())
