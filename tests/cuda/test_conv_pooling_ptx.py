"""The convolution and pooling kernels of the CUDA backend (``cuda/convolution.py``,
``cuda/pooling.py``) compile to PTX for compute capability 9.0 with the argument types they are
launched with (numba-cuda's type inference, which the simulator never runs; ``cuda.atomic.add``
on float32 and float64 included).  Runs in the PTX process (``FUSEGRAD_CUDA_PTX=1``, no
simulator, no GPU needed)."""

from __future__ import annotations

import modes  # noqa: E402
import pytest

modes.require_ptx()

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402
from numba import types as nt  # noqa: E402

from fusegrad.cuda import convolution, pooling  # noqa: E402


def _arr(dtype: str, ndim: int) -> nt.Array:
    return nt.Array(numba.from_dtype(np.dtype(dtype)), ndim, "A")


def _compiles(kernel: object, signature: tuple) -> None:
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))  # type: ignore[attr-defined]
    assert ".target sm_90" in ptx


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pooling_kernels_compile(dtype: str) -> None:
    x, i64, tables = _arr(dtype, 4), nt.int64, (_arr("int64", 1),) * 6
    divisor = _arr("float64", 3)
    _compiles(pooling._kernel("pool_index"), (x, *tables, i64, i64, i64, _arr("int64", 4), i64))
    _compiles(pooling._kernel("avg_pool"), (x, *tables, divisor, x, i64))
    _compiles(pooling._kernel("avg_pool_backward"), (x, *tables, divisor, x, i64))
    flat = _arr(dtype, 2)
    _compiles(pooling._flat_kernel("take"), (flat, _arr("int64", 2), flat, i64))
    _compiles(pooling._flat_kernel("scatter"), (flat, _arr("int64", 2), flat, i64))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_convolution_kernels_compile(dtype: str) -> None:
    i64 = nt.int64
    x, cols = _arr(dtype, 5), _arr(dtype, 8)
    _compiles(convolution._kernel("im2col"), (x, cols, *(i64,) * 12, i64))
    _compiles(convolution._kernel("col2im"), (cols, x, *(i64,) * 9, i64))
    _compiles(convolution._kernel("batch_sum"), (_arr(dtype, 2), _arr(dtype, 1), i64))
    _compiles(convolution._kernel("add_bias"), (_arr(dtype, 3), _arr(dtype, 1), i64))
