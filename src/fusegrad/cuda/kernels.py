"""Data-movement kernels of the CUDA backend: strided copy (with numpy's unsafe cast and
broadcasting) and fill.  These move bytes; they hold no primitive's formula (those come from the
compiler's lowering, see ``fusegrad.cuda.ops``).

One kernel source per rank and dtype pair, built here and compiled lazily by numba-cuda, cached
in memory.  Every kernel is a grid-stride loop over the flattened destination: any geometry
(strided, offset, zero-stride broadcast sources) is indexed through the arrays' strides.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from . import is_simulator, numba_cuda

if TYPE_CHECKING:
    from .array import CudaArray  # (array.py imports this module: its arrays' copies run here)

THREADS = 256


def launch_config(n: int) -> tuple[int, int]:
    """(blocks, threads per block) for a grid-stride loop over ``n`` elements."""
    if is_simulator():
        return (min(max((n + 31) // 32, 1), 2), 32)  # the simulator runs threads in Python
    blocks = min(max((n + THREADS - 1) // THREADS, 1), _multiprocessors() * 8)
    return blocks, THREADS


@functools.cache
def _multiprocessors() -> int:
    return int(getattr(numba_cuda().get_current_device(), "MULTIPROCESSOR_COUNT", 80))


def _convert(src_dtype: np.dtype, dst_dtype: np.dtype, expr: str) -> str:
    """numpy's unsafe cast of ``expr`` (of ``src_dtype``) to ``dst_dtype`` in numba source;
    complex to real keeps the real part, real to complex gets a zero imaginary part."""
    if dst_dtype == np.bool_:
        return expr if src_dtype == np.bool_ else f"({expr} != 0)"
    if src_dtype.kind == "c" and dst_dtype.kind != "c":
        expr = f"({expr}).real"
    elif dst_dtype.kind == "c" and src_dtype.kind != "c":
        expr = f"complex(np.float64({expr}), 0.0)"
    return f"np.{dst_dtype.name}({expr})"


def _unravel(rank: int) -> list[str]:
    lines = ["        rem = i"]
    for d in reversed(range(rank)):
        lines.append(f"        i{d} = rem % shape{d}")
        if d:
            lines.append(f"        rem //= shape{d}")
    return lines


def index(rank: int) -> str:
    """The subscript of the element ``grid_loop`` is at (``()`` for 0-d arrays)."""
    return ", ".join(f"i{d}" for d in range(rank)) if rank else "()"


def grid_loop(header: str, rank: int, body: list[str], shaped: str = "dst") -> str:
    """Source of the kernel ``header`` (whose last parameter is ``n``, the element count) running
    ``body`` once per element of the array ``shaped``: a grid-stride loop over the flat index
    ``i``, with the coordinates ``i0, i1, ...`` unravelled from it."""
    return "\n".join(
        [
            header,
            *[f"    shape{d} = {shaped}.shape[{d}]" for d in range(rank)],
            "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):",
            *(_unravel(rank) if rank else []),
            *("        " + line for line in body),
        ]
    )


@functools.cache
def _copy_kernel(rank: int, src_dtype: np.dtype, dst_dtype: np.dtype) -> Any:
    idx = index(rank)
    body = [f"dst[{idx}] = {_convert(src_dtype, dst_dtype, f'src[{idx}]')}"]
    source = grid_loop("def copy(dst, src, n):", rank, body)
    return build(source, "copy", f"copy rank {rank} {src_dtype} -> {dst_dtype}")


@functools.cache
def _fill_kernel(rank: int, dst_dtype: np.dtype) -> Any:
    source = grid_loop("def fill(dst, value, n):", rank, [f"dst[{index(rank)}] = value"])
    return build(source, "fill", f"fill rank {rank} {dst_dtype}")


class _SimulatorMath:
    """``math`` for kernels run by the simulator: numpy's functions, which return inf/nan where
    the device does instead of raising like Python's ``math`` (``fmod(inf, 2)``)."""

    inf = np.inf
    fmod = staticmethod(np.fmod)
    floor = staticmethod(np.floor)
    copysign = staticmethod(np.copysign)
    isfinite = staticmethod(np.isfinite)


def _math() -> Any:
    from numba import config  # numba-cuda: loaded on the first kernel build

    if config.ENABLE_CUDASIM:
        return _SimulatorMath
    return math


def build(source: str, name: str, label: str, **names: Any) -> Any:
    """Execute ``source`` (kernel definitions written for numba-cuda) and return its function
    ``name`` as a CUDA kernel (jitted here unless the source decorates it); ``names`` are more
    globals of the source (``cmath``).  Compilation to machine code happens at the first launch,
    so this needs no GPU (the PTX tests use it)."""
    from numba import cuda  # numba-cuda: loaded on the first kernel build

    scope: dict[str, Any] = {"cuda": cuda, "np": np, "math": _math(), **names}
    exec(compile(source, f"<fusegrad.cuda {label}>", "exec"), scope)
    fn = scope[name]
    return fn if hasattr(fn, "py_func") else cuda.jit(fn)


def copy(dst: CudaArray, src: CudaArray) -> None:
    """``dst[...] = src`` for arrays of one shape (``array.copy_into`` broadcasts ``src`` first),
    cast like numpy's unsafe cast."""
    n = dst.size
    if n == 0:
        return
    kernel = _copy_kernel(dst.ndim, src.dtype, dst.dtype)
    blocks, threads = launch_config(n)
    kernel[blocks, threads](dst.kernel_array(), src.kernel_array(), n)


def fill(dst: CudaArray, value: Any) -> None:
    """Set every element of ``dst`` to the Python scalar ``value`` (cast to ``dst``'s dtype)."""
    n = dst.size
    if n == 0:
        return
    scalar = np.array(value).astype(dst.dtype)[()]  # typed: the kernel specialises on it
    kernel = _fill_kernel(dst.ndim, dst.dtype)
    blocks, threads = launch_config(n)
    kernel[blocks, threads](dst.kernel_array(), scalar, n)
