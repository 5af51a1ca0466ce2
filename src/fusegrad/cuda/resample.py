"""CUDA kernels of ``F.interpolate``'s nearest and linear modes (the ``resample`` and
``resample_backward`` primitives of ``ops/resample.py``): the device forms of
``ops/resample_kernels.py``, for 1 to 3 spatial dims, over the same per-dim tables
(``_resample_tables.tables``: per output position two source indices and their weights, or one
index), computed on the host and uploaded once per geometry.

As on the CPU, resampling runs one dim at a time, the last first, with the array seen as (A, n,
B) along the dim; a dim whose table copies it is skipped.  The forward is one thread per
output element, ``out[a, j, b] = l0[j] x[a, i0[j], b] + l1[j] x[a, i1[j], b]`` (the weights in
the input's dtype), so the arithmetic is the CPU kernel's.  The backward runs the adjoint of
each pass in the reverse order, one thread per element of the gradient adding its two shares
into its sources with atomic adds (as PyTorch's CUDA upsampling backward does), so sums that
meet at one source may be ordered differently from run to run.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .._resample_tables import tables as _host_tables
from .array import CudaArray, contiguous, empty, to_device
from .kernels import build, fill, launch_config

_SOURCE = """
@cuda.jit
def along(x, index, weight, two, out, n):
    m = out.shape[1]
    inner = out.shape[2]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        b = i % inner
        j = (i // inner) % m
        a = i // (inner * m)
        if two:
            first = weight[j, 0] * x[a, index[j, 0], b]
            out[a, j, b] = first + weight[j, 1] * x[a, index[j, 1], b]
        else:
            out[a, j, b] = x[a, index[j, 0], b]


@cuda.jit
def adjoint(g, index, weight, two, out, n):
    m = g.shape[1]
    inner = g.shape[2]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        b = i % inner
        j = (i // inner) % m
        a = i // (inner * m)
        v = g[a, j, b]
        if two:
            cuda.atomic.add(out, (a, index[j, 0], b), weight[j, 0] * v)
            cuda.atomic.add(out, (a, index[j, 1], b), weight[j, 1] * v)
        else:
            cuda.atomic.add(out, (a, index[j, 0], b), v)
"""


@functools.cache
def _kernel(name: str) -> Any:
    return build(_SOURCE, name, f"resample {name}")


@functools.lru_cache(maxsize=64)
def _passes(
    in_sizes: tuple, mode: str, size: tuple, scales: tuple, align_corners: bool, dtype: np.dtype
) -> tuple:
    """(axis, index, weight, two) on the device, for the dims that change, last dim first."""
    tables = _host_tables(in_sizes, mode, size, scales, align_corners)
    passes = []
    for k in range(len(tables) - 1, -1, -1):
        index, weight, two, copies = tables[k]
        if not copies:
            passes.append((2 + k, to_device(index), to_device(weight.astype(dtype)), two))
    return tuple(passes)


def _launch(name: str, n: int, *args: Any) -> None:
    if n:
        blocks, threads = launch_config(n)
        _kernel(name)[blocks, threads](*args, n)


def _as3(a: CudaArray, axis: int) -> CudaArray:
    """``a`` (contiguous) as (A, n, B) along ``axis``."""
    shape = tuple(a.shape)
    return a.reshape((math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])))


def resample(x: CudaArray, *, mode: str, size: tuple, scales: tuple, align_corners: bool) -> Any:
    """``x`` (N, C, *spatial) resampled to ``size`` (``ops/resample.py``)."""
    passes = _passes(tuple(x.shape[2:]), mode, tuple(size), tuple(scales), bool(align_corners),
                     np.dtype(x.dtype))  # fmt: skip
    out = contiguous(x)
    for axis, index, weight, two in passes:
        shape = list(out.shape)
        shape[axis] = index.shape[0]
        nxt = empty(tuple(shape), x.dtype)
        _launch("along", nxt.size, _as3(out, axis).kernel_array(), index.kernel_array(),
                weight.kernel_array(), two, _as3(nxt, axis).kernel_array())  # fmt: skip
        out = nxt
    return contiguous(out, force=True) if not passes else out


def resample_backward(
    g: CudaArray, *, mode: str, input_size: tuple, scales: tuple, align_corners: bool
) -> Any:
    """The gradient of ``resample``'s input (spatial sizes ``input_size``) for ``g``."""
    passes = _passes(tuple(input_size), mode, tuple(g.shape[2:]), tuple(scales),
                     bool(align_corners), np.dtype(g.dtype))  # fmt: skip
    grad = contiguous(g)
    for axis, index, weight, two in reversed(passes):
        shape = list(grad.shape)
        shape[axis] = input_size[axis - 2]
        nxt = empty(tuple(shape), g.dtype)
        fill(nxt, 0)
        _launch("adjoint", grad.size, _as3(grad, axis).kernel_array(), index.kernel_array(),
                weight.kernel_array(), two, _as3(nxt, axis).kernel_array())  # fmt: skip
        grad = nxt
    return contiguous(grad, force=True) if not passes else grad
