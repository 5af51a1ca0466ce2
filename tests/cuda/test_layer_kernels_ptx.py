"""The CUDA kernels of the layers with fused primitives (``cuda/norms.py``,
``cuda/embedding.py``, ``cuda/resample.py``, ``cuda/recurrent.py``) compile to PTX for compute
capability 9.0 with the argument types they are launched with (numba-cuda's type inference,
which the simulator never runs; shared-memory block trees, float64 accumulation of float32
inputs, integer and float atomic adds included).  Runs in the PTX process
(``FUSEGRAD_CUDA_PTX=1``, no simulator, no GPU needed)."""

from __future__ import annotations

import modes  # noqa: E402
import pytest

modes.require_ptx()

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402
from numba import types as nt  # noqa: E402

from fusegrad.cuda import embedding, norms, recurrent, resample  # noqa: E402

B, I64, F64 = nt.boolean, nt.int64, nt.float64


def _arr(dtype: str, ndim: int) -> nt.Array:
    return nt.Array(numba.from_dtype(np.dtype(dtype)), ndim, "A")


def _compiles(kernel: object, signature: tuple) -> None:
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))  # type: ignore[attr-defined]
    assert ".target sm_90" in ptx


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_norm_kernels_compile(dtype: str) -> None:
    x3, x2, x1 = _arr(dtype, 3), _arr(dtype, 2), _arr(dtype, 1)
    acc = _arr("float64", 1)
    _compiles(norms._kernel("moment"), (x3, x1, B, I64, B, x1))
    _compiles(norms._kernel("coefficients"), (x1, x1, x1, x1, B, B, I64, B, F64, x2, x2, I64))
    _compiles(norms._kernel("apply"), (x3, x2, x2, x1, x1, B, x3, I64))
    _compiles(norms._kernel("sums"), (x3, x3, x1, x1, B, I64, B, acc, acc))
    _compiles(norms._kernel("sums"), (x3, x3, acc, x1, B, I64, B, acc, acc))  # (bias alone)
    _compiles(
        norms._kernel("stat_means"),
        (acc, acc, x1, x1, B, I64, B, I64, I64, I64, F64, acc, acc, I64),
    )
    _compiles(
        norms._kernel("grad_coefficients"),
        (x1, x1, x1, B, acc, acc, I64, B, F64, x2, x2, x2, I64),
    )
    _compiles(norms._kernel("input_grad"), (x3, x3, x1, B, B, x2, x2, x2, x3, I64))
    _compiles(norms._kernel("channel_params"), (acc, acc, x1, I64, B, I64, F64, B, B, x1, x1, I64))
    _compiles(
        norms._kernel("channel_params"), (acc, acc, acc, I64, B, I64, F64, B, B, x1, x1, I64)
    )  # (bias alone)
    _compiles(norms._kernel("row_params"), (x2, x2, x1, x1, F64, B, B, x1, x1, I64))
    _compiles(norms._kernel("row_params"), (x2, x2, acc, acc, F64, B, B, x1, x1, I64))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("index", ["int32", "int64"])
def test_embedding_kernels_compile(dtype: str, index: str) -> None:
    x2, x1, i1 = _arr(dtype, 2), _arr(dtype, 1), _arr(index, 1)
    counts = _arr("int64", 1)
    _compiles(embedding._kernel("take"), (x2, i1, x2, I64))
    _compiles(embedding._kernel("count"), (i1, counts, I64))
    _compiles(embedding._kernel("inverse"), (counts, x1, I64))
    _compiles(embedding._kernel("scatter"), (x2, i1, I64, B, x1, x2, I64))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_resample_kernels_compile(dtype: str) -> None:
    x3, index, weight = _arr(dtype, 3), _arr("int64", 2), _arr(dtype, 2)
    _compiles(resample._kernel("along"), (x3, index, weight, B, x3, I64))
    _compiles(resample._kernel("adjoint"), (x3, index, weight, B, x3, I64))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_recurrent_kernels_compile(dtype: str) -> None:
    a, v = _arr(dtype, 2), _arr(dtype, 1)
    scalar = numba.from_dtype(np.dtype(dtype))
    _compiles(recurrent._kernel("lstm_step"), (a, a, I64, v, v, a, a, a, a, a, B, I64))
    _compiles(recurrent._kernel("gru_step"), (a, a, I64, v, v, a, a, a, I64))
    _compiles(recurrent._kernel("rnn_step"), (a, a, I64, v, v, B, scalar, a, a, I64))
    _compiles(recurrent._kernel("copy_rows"), (a, I64, a, I64, I64))
    _compiles(recurrent._kernel("add_rows"), (a, a, a, I64))
    _compiles(recurrent._kernel("state_grad"), (a, I64, a, a, I64))
    _compiles(
        recurrent._kernel("lstm_back"),
        (a, a, I64, I64, I64, a, a, a, B, a, a, scalar, I64),
    )
    _compiles(
        recurrent._kernel("gru_back"), (a, a, a, a, I64, I64, I64, a, a, a, a, a, scalar, I64)
    )
    _compiles(recurrent._kernel("rnn_back"), (a, a, I64, B, a, a, scalar, scalar, I64))
    _compiles(recurrent._kernel("column_sum"), (a, v, I64))
