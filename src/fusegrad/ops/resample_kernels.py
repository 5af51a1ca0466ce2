"""Fused CPU kernels of ``F.interpolate``'s nearest and linear modes (the ``resample`` and
``resample_backward`` primitives of ``ops/resample.py``), for 1 to 3 spatial dims.

Resampling is separable: each spatial dim has a table per output position of two source
indices and their two weights (linear modes; PyTorch's ``area_pixel_compute_source_index``)
or one source index (nearest modes), and the kernels resample one dim at a time, the last
first.  Along a dim, the array is seen as (A, n, B) -- A the dims before, B the product of the
dims after -- and ``out[a, j, b] = l0[j] in[a, i0[j], b] + l1[j] in[a, i1[j], b]``; B is
contiguous, so every dim but the last runs as whole-row operations.  Nested this way the
arithmetic is PyTorch's CPU kernel's (``h0 (w0 x00 + w1 x01) + h1 (w0 x10 + w1 x11)``), and a
non-finite input reaches only the outputs it is a neighbour of.  The backward runs the
adjoint of each pass in the reverse order: ``gin[a, i0[j], b] += l0[j] g[a, j, b]`` (and the
same for ``i1``), in output order, on one thread.  A dim whose table copies it is skipped.
Compiled on first use with ``cache=True``; imported by the primitives' kernels on their first
call, never when fusegrad is imported.
"""

from __future__ import annotations

import numba  # this module is imported on first use only (by the resampling primitives' kernels)
import numpy as np

from .._numba_cache import fast_loading

_JIT = {"cache": True, "fastmath": {"contract"}, "error_model": "numpy"}


@numba.njit(**_JIT)
def _along(x, index, weight, two, out):  # type: ignore[no-untyped-def]
    """``x`` (A, n, B) resampled along its middle dim into ``out`` (A, m, B)."""
    outer, m, inner = out.shape
    for a in range(outer):
        for j in range(m):
            i0, i1 = index[j, 0], index[j, 1]
            l0, l1 = weight[j, 0], weight[j, 1]
            src0, src1, dst = x[a, i0], x[a, i1], out[a, j]
            if two:
                for b in range(inner):
                    dst[b] = l0 * src0[b] + l1 * src1[b]
            else:
                for b in range(inner):
                    dst[b] = src0[b]


@numba.njit(**_JIT)
def _along_last(x, index, weight, two, out):  # type: ignore[no-untyped-def]
    """``x`` (A, n) resampled along its last dim into ``out`` (A, m)."""
    outer, m = out.shape
    for a in range(outer):
        src, dst = x[a], out[a]
        if two:
            for j in range(m):
                dst[j] = weight[j, 0] * src[index[j, 0]] + weight[j, 1] * src[index[j, 1]]
        else:
            for j in range(m):
                dst[j] = src[index[j, 0]]


@numba.njit(**_JIT)
def _adjoint(g, index, weight, two, out):  # type: ignore[no-untyped-def]
    """The adjoint of ``_along``: ``g`` (A, m, B) added into ``out`` (A, n, B) (zeros)."""
    outer, m, inner = g.shape
    for a in range(outer):
        for j in range(m):
            i0, i1 = index[j, 0], index[j, 1]
            l0, l1 = weight[j, 0], weight[j, 1]
            src, dst0, dst1 = g[a, j], out[a, i0], out[a, i1]
            if two:
                for b in range(inner):
                    dst0[b] += l0 * src[b]
                for b in range(inner):
                    dst1[b] += l1 * src[b]
            else:
                for b in range(inner):
                    dst0[b] += src[b]


@numba.njit(**_JIT)
def _adjoint_last(g, index, weight, two, out):  # type: ignore[no-untyped-def]
    """The adjoint of ``_along_last``."""
    outer, m = g.shape
    for a in range(outer):
        src, dst = g[a], out[a]
        if two:
            for j in range(m):
                dst[index[j, 0]] += weight[j, 0] * src[j]
                dst[index[j, 1]] += weight[j, 1] * src[j]
        else:
            for j in range(m):
                dst[index[j, 0]] += src[j]


def _passes(shape: tuple, tables: list) -> list:
    """(axis, table) of the dims that change, last dim first."""
    passes = []
    for k in range(len(tables) - 1, -1, -1):
        index, weight, two, copies = tables[k]
        if not copies:
            passes.append((2 + k, (index, weight, two)))
    return passes


def _resample_axis(x: np.ndarray, axis: int, table: tuple, size: int) -> np.ndarray:
    index, weight, two = table
    shape = list(x.shape)
    shape[axis] = size
    out = np.empty(shape, x.dtype)
    outer = int(np.prod(x.shape[:axis]))
    w = weight.astype(x.dtype)
    if axis == x.ndim - 1:
        _along_last(x.reshape(outer, x.shape[axis]), index, w, two, out.reshape(outer, size))
    else:
        inner = int(np.prod(x.shape[axis + 1 :]))
        _along(
            x.reshape(outer, x.shape[axis], inner), index, w, two, out.reshape(outer, size, inner)
        )
    return out


def _adjoint_axis(g: np.ndarray, axis: int, table: tuple, size: int) -> np.ndarray:
    index, weight, two = table
    shape = list(g.shape)
    shape[axis] = size
    out = np.zeros(shape, g.dtype)
    outer = int(np.prod(g.shape[:axis]))
    w = weight.astype(g.dtype)
    if axis == g.ndim - 1:
        _adjoint_last(g.reshape(outer, g.shape[axis]), index, w, two, out.reshape(outer, size))
    else:
        inner = int(np.prod(g.shape[axis + 1 :]))
        _adjoint(
            g.reshape(outer, g.shape[axis], inner), index, w, two, out.reshape(outer, size, inner)
        )
    return out


def forward(x: np.ndarray, tables: list) -> np.ndarray:
    """``x`` (N, C, *spatial) resampled by ``tables`` (per spatial dim: index (m, 2), weight
    (m, 2), two corners, copies the dim)."""
    out = np.ascontiguousarray(x)
    for axis, table in _passes(x.shape, tables):
        out = _resample_axis(out, axis, table, table[0].shape[0])
    return out.copy() if out is x else out


def backward(g: np.ndarray, input_shape: tuple, tables: list) -> np.ndarray:
    """The gradient (``input_shape``) of ``forward`` for its gradient ``g``."""
    grad = np.ascontiguousarray(g)
    for axis, table in reversed(_passes(tuple(input_shape), tables)):
        grad = _adjoint_axis(grad, axis, table, input_shape[axis])
    return grad.copy() if grad is g else grad


fast_loading(globals())  # (loaded from the disk cache without numba's start-up work)
