"""The eager CUDA backend's own kernels (copy/fill, reductions, matmul, gather/scatter, cumsum,
argsort, advanced indexing) compile to PTX for compute capability 9.0 with the argument types the
backend launches them with: numba-cuda's type inference, which the simulator never runs.  Runs in
the PTX process (``FUSEGRAD_CUDA_PTX=1``, no simulator, no GPU needed)."""

from __future__ import annotations

import modes  # noqa: E402
import pytest

modes.require_ptx()

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402
from numba import types as nt  # noqa: E402

from fusegrad.cuda import advanced, arith, kernels, matmul, movement, reduce, sorting  # noqa: E402

CC = (9, 0)
DTYPES = [np.dtype(d) for d in ("float32", "float64", "int64", "int32", "bool")]


def arr(dtype: np.dtype, ndim: int, layout: str = "A") -> nt.Array:
    return nt.Array(numba.from_dtype(dtype), ndim, layout)


def compiles(kernel: object, signature: tuple) -> None:
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=CC)  # type: ignore[attr-defined]
    assert ".target sm_90" in ptx


@pytest.mark.parametrize("rank", [0, 1, 2, 4])
@pytest.mark.parametrize("src", DTYPES, ids=str)
def test_copy_kernels(rank: int, src: np.dtype) -> None:
    for dst in DTYPES:
        k = kernels._copy_kernel(rank, src, dst)
        compiles(k, (arr(dst, rank), arr(src, rank), nt.int64))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fill_kernels(dtype: np.dtype) -> None:
    for rank in (0, 1, 3):
        compiles(
            kernels._fill_kernel(rank, dtype), (arr(dtype, rank), numba.from_dtype(dtype), nt.int64)
        )


@pytest.mark.parametrize("name", ["prod", "amax", "amin", "argmax", "argmin", "all", "any"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduction_kernels(name: str, dtype: np.dtype) -> None:
    block, thread = reduce._kernels(name, dtype)
    out = arr(reduce._out_dtype(name, dtype), 1, "C")
    for k in (block, thread):
        compiles(k, (arr(dtype, 2, "C"), out, nt.int64, nt.int64))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_matmul_kernel(dtype: str) -> None:
    d = np.dtype(dtype)
    three = arr(d, 3, "C")
    compiles(matmul._kernel(d), (three, three, three, nt.int64, nt.int64, nt.int64))


@pytest.mark.parametrize("rank,dim", [(1, 0), (2, 1), (3, 0)])
def test_gather_scatter_cumsum_kernels(rank: int, dim: int) -> None:
    f32, i64 = np.dtype("float32"), np.dtype("int64")
    compiles(
        movement._gather_kernel(rank, dim),
        (arr(f32, rank), arr(i64, rank), arr(f32, rank, "C"), nt.int64, nt.int64),
    )
    for add in (False, True):
        compiles(
            movement._scatter_kernel(rank, dim, add),
            (arr(f32, rank, "C"), arr(i64, rank), arr(f32, rank), nt.int64),
        )
    for acc in ("float32", "int64"):
        compiles(
            movement._cumsum_kernel(acc),
            (arr(np.dtype(acc), 2, "C"), arr(np.dtype(acc), 2, "C"), nt.int64, nt.int64),
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("descending", [False, True])
def test_argsort_kernels(dtype: np.dtype, descending: bool) -> None:
    compiles(
        sorting._rank_kernel(descending),
        (arr(dtype, 2, "C"), arr(np.dtype("int64"), 2, "C"), nt.int64, nt.int64, nt.int64),
    )


def test_advanced_indexing_kernels() -> None:
    f32, i64 = np.dtype("float32"), np.dtype("int64")
    ks = advanced._kernels()
    one = arr(f32, 1, "C")
    idx = arr(i64, 1, "C")
    compiles(ks["gather"], (one, idx, one, nt.int64))
    compiles(ks["scatter"], (one, idx, idx, one, nt.int64))
    compiles(ks["segments"], (one, idx, idx, idx, one, nt.int64))


@pytest.mark.parametrize("name", ["remainder", "floor_divide", "round", "bitwise_and"])
def test_elementwise_extern_kernels(name: str) -> None:
    kinds = ["int64", "int32"] if name.startswith("bitwise") else ["float32", "float64", "int64"]
    for dtype in map(np.dtype, kinds):
        count = 1 if name == "round" else 2
        for rank in (1, 2):
            k = arith._kernel(name, (dtype,) * count, dtype, rank, 1 if name == "round" else 0)
            compiles(k, (arr(dtype, rank, "C"), *[arr(dtype, rank)] * count, nt.int64))


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_kernels(dtype: str) -> None:
    """Every complex kernel (``fusegrad.cuda.complex``) with complex, float, integer and bool
    operands, the casts both ways, and copy/fill of complex arrays."""
    from fusegrad.cuda import complex as cx

    c = np.dtype(dtype)
    real = np.empty(0, c).real.dtype
    results = {"abs": real, "isnan": np.dtype(bool), "isinf": np.dtype(bool)}
    for name in cx._UNARY:
        out = results.get(name, c)
        compiles(cx._kernel(name, (c,), out, 2), (arr(out, 2), arr(c, 2), nt.int64))
    for name in cx._BINARY:
        out = np.dtype(bool) if name in ("eq", "ne") else c
        for other in (c, real, np.dtype("int64"), np.dtype("bool")):
            for pair in ((c, other), (other, c)):
                compiles(
                    cx._kernel(name, pair, out, 1),
                    (arr(out, 1), arr(pair[0], 1), arr(pair[1], 1), nt.int64),
                )
    for src in [*DTYPES, np.dtype("complex64"), np.dtype("complex128")]:
        compiles(cx._kernel("cast", (src,), c, 1), (arr(c, 1), arr(src, 1), nt.int64))
        compiles(kernels._copy_kernel(1, src, c), (arr(c, 1), arr(src, 1), nt.int64))
        if src.kind != "c":
            compiles(cx._kernel("cast", (c,), src, 1), (arr(src, 1), arr(c, 1), nt.int64))
            compiles(kernels._copy_kernel(1, c, src), (arr(src, 1), arr(c, 1), nt.int64))
    compiles(
        cx._kernel("complex", (real, real), c, 1),
        (arr(c, 1), arr(real, 1), arr(real, 1), nt.int64),
    )
    bool_ = np.dtype("bool")
    compiles(
        cx._kernel("where", (bool_, c, real), c, 2),
        (arr(c, 2), arr(bool_, 2), arr(c, 2), arr(real, 2), nt.int64),
    )
    compiles(kernels._fill_kernel(1, c), (arr(c, 1), numba.from_dtype(c), nt.int64))
    # element moves of complex values: advanced indexing, gather
    one, idx = arr(c, 1, "C"), arr(np.dtype("int64"), 1, "C")
    ks = advanced._kernels()
    compiles(ks["gather"], (one, idx, one, nt.int64))
    compiles(ks["scatter"], (one, idx, idx, one, nt.int64))
    compiles(ks["segments"], (one, idx, idx, idx, one, nt.int64))
    compiles(
        movement._gather_kernel(2, 1),
        (arr(c, 2), arr(np.dtype("int64"), 2), arr(c, 2, "C"), nt.int64, nt.int64),
    )
