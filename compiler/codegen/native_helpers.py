"""The numba functions a native program segment calls for the steps that are not fused kernels:
reductions over any dims, a batched matrix product, row gathers and scatters
(``codegen.native_cpu`` emits the calls; docs/ARCHITECTURE.md, "Native programs").

Each works on arrays the emitter has already brought into a canonical layout (the reduced dims
last and contiguous, the batch dims flattened, ...), so one function serves every rank.  They
compute what the primitives' eager kernels compute (``ops/primitives.py``), with these choices:

* an index out of range raises a bare ``IndexError``: the program then runs the segment's steps
  again one by one, and eager's kernel raises its own error (``program._run``);

* sums accumulate in float64 (integers in int64) and round once, as the fused kernels'
  reductions do: the result may differ from numpy's pairwise float32 sum in the last bits,
  within the compiled-vs-eager tolerances (docs/numerics.md);
* ``amax`` propagates NaN as numpy's does (a NaN anywhere in a row is the row's maximum);
* products are BLAS's, in the operands' dtype: the gemm of numpy's own OpenBLAS where numpy
  ships one (``GEMM``), else numba's ``np.dot`` (scipy's BLAS); a matrix's transpose reaches
  BLAS as its transposed operand, not as a copy (``transpose2``).

``cache=True``: compiled once per machine, then loaded from numba's cache.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Any

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import types
from numba.extending import overload

_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}


@numba.njit(**_JIT)
def sum_rows_f(x: np.ndarray, out: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """``out[i] = sum(x[i, :])`` for a 2-d C-contiguous float ``x``, accumulated in float64."""
    rows, cols = x.shape
    for i in range(rows):
        acc = 0.0
        for j in range(cols):
            acc += x[i, j]
        out[i] = acc
    return out


@numba.njit(**_JIT)
def sum_rows_i(x: np.ndarray, out: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """``out[i] = sum(x[i, :])`` for a 2-d C-contiguous integer or bool ``x``, in int64."""
    rows, cols = x.shape
    for i in range(rows):
        acc = 0
        for j in range(cols):
            acc += np.int64(x[i, j])
        out[i] = acc
    return out


@numba.njit(**_JIT)
def max_rows(x: np.ndarray, out: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """``out[i] = max(x[i, :])`` (NaN if the row holds one, as numpy's ``amax``)."""
    rows, cols = x.shape
    for i in range(rows):
        m = x[i, 0]
        for j in range(1, cols):
            v = x[i, j]
            if m == m and (v > m or v != v):
                m = v
        out[i] = m
    return out


@numba.njit(**_JIT)
def take_rows(x: np.ndarray, index: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """``x[index]`` for a 2-d ``x`` and a 1-d integer ``index`` (negative values wrap)."""
    rows = x.shape[0]
    out = np.empty((index.shape[0], x.shape[1]), x.dtype)
    for i in range(index.shape[0]):
        k = index[i]
        if k < 0:
            k += rows
        if k < 0 or k >= rows:
            raise IndexError("index out of range")
        out[i, :] = x[k, :]
    return out


@numba.njit(**_JIT)
def add_rows_at(out: np.ndarray, index: np.ndarray, src: np.ndarray) -> np.ndarray:
    """``out[index[i]] += src[i]`` for every i, in order (repeated indices accumulate)."""
    rows = out.shape[0]
    for i in range(index.shape[0]):  # pragma: no cover - numba
        k = index[i]
        if k < 0:
            k += rows
        if k < 0 or k >= rows:
            raise IndexError("index out of range")
        out[k, :] += src[i, :]
    return out


@numba.njit(**_JIT)
def gather_last(x: np.ndarray, index: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """``out[i, j] = x[i, index[i, j]]`` for 2-d ``x`` and ``index`` (rows shared)."""
    cols = x.shape[1]
    out = np.empty(index.shape, x.dtype)
    for i in range(index.shape[0]):
        for j in range(index.shape[1]):
            k = index[i, j]
            if k < 0:
                k += cols
            if k < 0 or k >= cols:
                raise IndexError("index out of range")
            out[i, j] = x[i, k]
    return out


@numba.njit(**_JIT)
def scatter_add_last(
    x: np.ndarray, index: np.ndarray, src: np.ndarray
) -> np.ndarray:  # pragma: no cover - numba
    """A copy of 2-d ``x`` with ``out[i, index[i, j]] += src[i, j]``, in order."""
    cols = x.shape[1]
    out = x.copy()
    for i in range(index.shape[0]):
        for j in range(index.shape[1]):
            k = index[i, j]
            if k < 0:
                k += cols
            if k < 0 or k >= cols:
                raise IndexError("index out of range")
            out[i, k] += src[i, j]
    return out


# ---- movement and products, one small function each: a segment calls them instead of holding
# numpy's implementations inline (its compile time is then that of a list of calls; each helper
# is compiled once per argument type and kept in numba's disk cache)


@numba.njit(**_JIT)
def reshape(a: np.ndarray, shape: tuple) -> np.ndarray:  # pragma: no cover - numba
    """``a`` with ``shape`` (a copy when ``a`` is not C-contiguous, as numpy's reshape)."""
    return np.ascontiguousarray(a).reshape(shape)


@numba.njit(**_JIT)
def permute(a: np.ndarray, dims: tuple) -> np.ndarray:  # pragma: no cover - numba
    return a.transpose(dims)


@numba.njit(**_JIT)
def transpose2(a: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """A matrix's transpose: of a C-contiguous matrix, typed F-contiguous (``permute`` types
    any permutation as of any layout), so that a product reads it as BLAS's transposed
    operand instead of copying it (``blas_operand``)."""
    return a.T


def blas_operand(a: np.ndarray) -> np.ndarray:  # pragma: no cover - numba (overloaded below)
    """``a`` as BLAS can read it: itself when numba types it C- or F-contiguous (a weight's
    transpose, ``transpose2``: BLAS's transposed operand, no copy), else a C-contiguous copy."""
    raise NotImplementedError("blas_operand runs in numba code only")


@overload(blas_operand)
def _blas_operand(a):  # type: ignore[no-untyped-def]  # (unannotated: numba matches its names)
    if isinstance(a, types.Array) and a.layout in ("C", "F"):
        return lambda a: a
    return lambda a: np.ascontiguousarray(a)


@numba.njit(**_JIT)
def broadcast(a: np.ndarray, shape: tuple) -> np.ndarray:  # pragma: no cover - numba
    return np.broadcast_to(a, shape)


# ---- products: BLAS's gemm through the library numpy's own products call, where numpy ships
# one (its bundled OpenBLAS, 64-bit integers: ``scipy_cblas_?gemm64_``), else numba's np.dot
# (scipy's BLAS).  Measured at one thread: numba's np.dot took 3-5% longer than numpy's ``@``
# on the LSTM-LM's decoder (700x200 by 200x10000: 27.7 against 26.7 ms) and the MLP's layers,
# enough for a trial to keep the program of steps over its native segments; the gemm call
# takes numpy's time.  The symbols are registered with LLVM at import (by name: cached
# segments link to them in every process).
def _numpy_blas() -> str | None:
    """The shared library of numpy's bundled OpenBLAS, or None."""
    folder = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    found = sorted(glob.glob(os.path.join(folder, "libscipy_openblas64_*.so")))
    return found[0] if found else None


def _register_gemm() -> bool:
    path = _numpy_blas()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(path)
        for name, symbol in (
            ("fusegrad_sgemm", "scipy_cblas_sgemm64_"),
            ("fusegrad_dgemm", "scipy_cblas_dgemm64_"),
        ):
            llvm.add_symbol(name, ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
    except (OSError, AttributeError):
        return False
    return True


# (CBLAS's arguments: order, transposes, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc; the
# arrays as addresses)
def _gemm_type(real: Any) -> Any:
    return types.void(
        types.int32,
        types.int32,
        types.int32,
        types.int64,
        types.int64,
        types.int64,
        real,
        types.intp,
        types.int64,
        types.intp,
        types.int64,
        real,
        types.intp,
        types.int64,
    )


GEMM = _register_gemm()
_sgemm = types.ExternalFunction("fusegrad_sgemm", _gemm_type(types.float32))
_dgemm = types.ExternalFunction("fusegrad_dgemm", _gemm_type(types.float64))
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


@numba.njit(**_JIT)
def _gemm_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """``out[:] = a @ b`` for C- or F-contiguous matrices ``a``, ``b`` and a C-contiguous
    ``out`` of float32 or float64, by one gemm call (an F matrix is the transposed operand)."""
    m, k = a.shape
    n = b.shape[1]
    ta = _NO_TRANS if a.flags.c_contiguous else _TRANS
    tb = _NO_TRANS if b.flags.c_contiguous else _TRANS
    lda = k if ta == _NO_TRANS else m
    ldb = n if tb == _NO_TRANS else k
    if a.itemsize == 4:
        _sgemm(
            _ROW_MAJOR,
            ta,
            tb,
            m,
            n,
            k,
            np.float32(1.0),
            a.ctypes.data,
            lda,
            b.ctypes.data,
            ldb,
            np.float32(0.0),
            out.ctypes.data,
            n,
        )
    else:
        _dgemm(
            _ROW_MAJOR,
            ta,
            tb,
            m,
            n,
            k,
            1.0,
            a.ctypes.data,
            lda,
            b.ctypes.data,
            ldb,
            0.0,
            out.ctypes.data,
            n,
        )


@numba.njit(**_JIT)
def _product_gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    x, y = blas_operand(a), blas_operand(b)
    out = np.empty((x.shape[0], y.shape[1]), x.dtype)
    if x.shape[1] == 0:
        out[:] = 0
    elif out.size:
        _gemm_into(x, y, out)
    return out


@numba.njit(**_JIT)
def _product_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    return np.dot(blas_operand(a), blas_operand(b))


# what a segment's products call (``GEMM``: numpy's BLAS, else numba's np.dot)
product = _product_gemm if GEMM else _product_dot


@numba.njit(**_JIT)
def matmul2(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """``a @ b`` of two matrices."""
    return product(a, b)


@numba.njit(**_JIT)
def matmul_rows(a: np.ndarray, b: np.ndarray, rows: int, shape: tuple) -> np.ndarray:
    """``a @ b`` for a batch of rows ``a`` and one matrix ``b``: one product of all the rows
    (``rows`` of them), reshaped to ``shape``."""
    flat = np.ascontiguousarray(a).reshape((rows, a.shape[-1]))
    return product(flat, b).reshape(shape)


@numba.njit(**_JIT)
def matmul_batch(a: np.ndarray, b: np.ndarray, batch: int, shape: tuple) -> np.ndarray:
    """``a @ b`` for operands of one batch shape (``batch`` matrices each), as ``shape``."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    a3 = np.ascontiguousarray(a).reshape((batch, m, k))
    b3 = np.ascontiguousarray(b).reshape((batch, k, n))
    out = np.empty((batch, m, n), a.dtype)
    for i in range(batch):
        out[i] = product(a3[i], b3[i])
    return out.reshape(shape)


@numba.njit(**_JIT)
def rows_of(a: np.ndarray, perm: tuple, rows: int, cols: int) -> np.ndarray:
    """``a`` with its dims in the order ``perm``, C-contiguous, as a (rows, cols) matrix: the
    canonical layout of the reductions, gathers and scatters above."""
    return np.ascontiguousarray(a.transpose(perm)).reshape((rows, cols))
