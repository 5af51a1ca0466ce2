"""Batched matrix product on CUDA: a tiled shared-memory kernel (CuPy's ``matmul`` when CuPy is
importable and not running under numba's simulator).

``a`` (..., M, K) @ ``b`` (..., K, N) with numpy's broadcasting of the batch dims.  Operands are
broadcast to the common batch shape and flattened to 3-D (batch, rows, cols); each thread block
computes one ``TILE x TILE`` tile of one batch entry's output, staging ``TILE x TILE`` tiles of
``a`` and ``b`` through shared memory.  The sum over ``K`` runs in a fixed order (deterministic)
and accumulates in the operands' dtype, as cuBLAS does for float32.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import is_simulator
from .array import CudaArray, contiguous, empty, probe_view
from .kernels import build, fill

TILE = 16


def _nb(dtype: np.dtype) -> str:
    return "boolean" if dtype == np.bool_ else dtype.name


@functools.cache
def _kernel(dtype: np.dtype) -> Any:
    source = f"""
import numpy as np
from numba import cuda, types

@cuda.jit
def matmul(a, b, out, m, n, k):
    bt = cuda.blockIdx.z
    ty = cuda.threadIdx.y
    tx = cuda.threadIdx.x
    row = cuda.blockIdx.y * {TILE} + ty
    col = cuda.blockIdx.x * {TILE} + tx
    sa = cuda.shared.array(({TILE}, {TILE}), types.{_nb(dtype)})
    sb = cuda.shared.array(({TILE}, {TILE}), types.{_nb(dtype)})
    acc = np.{dtype.name}(0)
    for t0 in range(0, k, {TILE}):
        if row < m and t0 + tx < k:
            sa[ty, tx] = a[bt, row, t0 + tx]
        else:
            sa[ty, tx] = 0
        if col < n and t0 + ty < k:
            sb[ty, tx] = b[bt, t0 + ty, col]
        else:
            sb[ty, tx] = 0
        cuda.syncthreads()
        for j in range({TILE}):
            acc += sa[ty, j] * sb[j, tx]
        cuda.syncthreads()
    if row < m and col < n:
        out[bt, row, col] = acc
"""
    return build(source, "matmul", f"matmul {dtype}")


def _cupy() -> Any:
    if is_simulator():
        return None
    try:
        import cupy  # optional: cuBLAS through cupy where it is installed
    except ImportError:
        return None
    return cupy


def matmul(a: CudaArray, b: CudaArray) -> CudaArray:
    if a.dtype != b.dtype:
        raise RuntimeError(
            f"matmul: expected both operands to have the same dtype, got {a.dtype} and {b.dtype}"
        )
    if a.dtype == np.bool_:
        raise RuntimeError("\"addmm_cuda\" not implemented for 'Bool' (matmul of bool tensors)")
    m, k = a.shape[-2], a.shape[-1]
    k2, n = b.shape[-2], b.shape[-1]
    if k != k2:
        raise RuntimeError(
            f"matmul: shapes {a.shape} and {b.shape} cannot be multiplied ({m}x{k} and {k2}x{n})"
        )
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    nb = int(np.prod(batch)) if batch else 1
    a3 = contiguous(probe_view(a, lambda p: np.broadcast_to(p, batch + (m, k)))).reshape((nb, m, k))
    b3 = contiguous(probe_view(b, lambda p: np.broadcast_to(p, batch + (k, n)))).reshape((nb, k, n))
    out = empty((nb, m, n), a.dtype)
    if out.size:
        cupy = _cupy()
        if cupy is not None and a.dtype.kind == "f":
            ca, cb, co = (cupy.asarray(x.kernel_array()) for x in (a3, b3, out))
            cupy.matmul(ca, cb, out=co)
        elif k == 0:
            fill(out, 0)
        else:
            grid = ((n + TILE - 1) // TILE, (m + TILE - 1) // TILE, nb)
            _kernel(a.dtype)[grid, (TILE, TILE)](
                a3.kernel_array(), b3.kernel_array(), out.kernel_array(), m, n, k
            )
    return out.reshape(batch + (m, n))
