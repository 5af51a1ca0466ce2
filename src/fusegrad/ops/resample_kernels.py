"""Fused CPU kernels of ``F.interpolate``'s nearest and linear modes (the ``resample`` and
``resample_backward`` primitives of ``ops/resample.py``), for 1 to 3 spatial dims.

The input is seen as (P, D, H, W): P the batch and channel planes, missing spatial dims of
size 1.  Each spatial dim has a table per output position: two source indices and their two
weights (linear modes; PyTorch's ``area_pixel_compute_source_index``), or one source index
with weight 1 (nearest modes, the second weight 0).  The forward computes each output as
PyTorch's CPU kernel does, nested over the dims: ``l0 (w0 x[i0, j0] + w1 x[i0, j1]) + l1 (...)``
-- a non-finite input reaches only the outputs it is a neighbour of -- skipping the second
corner of a dim whose table has one (nearest modes; a dim of size 1).  The backward adds each
output's gradient, times the same weights, into its source elements (in output order, on one
thread).  Compiled on first use with ``cache=True``; imported by the primitives' kernels on
their first call, never when fusegrad is imported.
"""

from __future__ import annotations

import numba  # this module is imported on first use only (by the resampling primitives' kernels)
import numpy as np

_JIT = {"cache": True, "fastmath": {"contract"}, "error_model": "numpy"}


@numba.njit(**_JIT)
def _forward(x, di, dl, hi, hl, wi, wl, two_d, two_h, two_w, out):  # type: ignore[no-untyped-def]
    """``di`` (Do, 2) source indices and ``dl`` (Do, 2) weights of dim D, likewise H and W;
    ``two_*``: the dim's second corner counts."""
    planes = x.shape[0]
    od, oh, ow = out.shape[1], out.shape[2], out.shape[3]
    for p in range(planes):
        xp, yp = x[p], out[p]
        for a in range(od):
            for b in range(oh):
                row = yp[a, b]
                for c in range(ow):
                    w0, w1 = wi[c, 0], wi[c, 1]
                    lw0, lw1 = wl[c, 0], wl[c, 1]
                    total = 0.0
                    for s in range(2 if two_d else 1):
                        plane = xp[di[a, s]]
                        inner = 0.0
                        for t in range(2 if two_h else 1):
                            line = plane[hi[b, t]]
                            if two_w:
                                value = lw0 * line[w0] + lw1 * line[w1]
                            else:
                                value = line[w0]
                            if two_h:
                                inner += hl[b, t] * value
                            else:
                                inner = value
                        if two_d:
                            total += dl[a, s] * inner
                        else:
                            total = inner
                    row[c] = total


@numba.njit(**_JIT)
def _backward(g, di, dl, hi, hl, wi, wl, two_d, two_h, two_w, dx):  # type: ignore[no-untyped-def]
    planes = g.shape[0]
    od, oh, ow = g.shape[1], g.shape[2], g.shape[3]
    for p in range(planes):
        gp, xp = g[p], dx[p]
        for a in range(od):
            for s in range(2 if two_d else 1):
                sd = dl[a, s] if two_d else 1.0
                plane = xp[di[a, s]]
                for b in range(oh):
                    row = gp[a, b]
                    for t in range(2 if two_h else 1):
                        sh = sd * (hl[b, t] if two_h else 1.0)
                        line = plane[hi[b, t]]
                        for c in range(ow):
                            v = row[c] * sh
                            if two_w:
                                line[wi[c, 0]] += v * wl[c, 0]
                                line[wi[c, 1]] += v * wl[c, 1]
                            else:
                                line[wi[c, 0]] += v


def _tables(tables: list, rank: int) -> tuple:
    """The (index, weight, two) triples of D, H, W, the missing leading dims trivial."""
    trivial = (np.zeros((1, 2), np.int64), np.array([[1.0, 0.0]]), False)
    full = [trivial] * (3 - rank) + list(tables)
    out: list = []
    for index, weight, two in full:
        out += [np.ascontiguousarray(index, np.int64), np.ascontiguousarray(weight), bool(two)]
    return tuple(out)


def forward(x: np.ndarray, tables: list) -> np.ndarray:
    """``x`` (N, C, *spatial) resampled by ``tables`` (one (index, weight, two) per spatial
    dim); the result has the tables' lengths as its spatial sizes."""
    rank = x.ndim - 2
    sizes = tuple(t[0].shape[0] for t in tables)
    out = np.empty(x.shape[:2] + sizes, x.dtype)
    pad = (1,) * (3 - rank)
    xv = np.ascontiguousarray(x).reshape((-1,) + pad + x.shape[2:])
    ov = out.reshape((-1,) + pad + sizes)
    di, dl, td, hi, hl, th, wi, wl, tw = _tables(tables, rank)
    dl, hl, wl = (w.astype(x.dtype) for w in (dl, hl, wl))
    _forward(xv, di, dl, hi, hl, wi, wl, td, th, tw, ov)
    return out


def backward(g: np.ndarray, input_shape: tuple, tables: list) -> np.ndarray:
    """The gradient (``input_shape``) of ``forward`` for its gradient ``g``."""
    rank = g.ndim - 2
    dx = np.zeros(input_shape, g.dtype)
    pad = (1,) * (3 - rank)
    gv = np.ascontiguousarray(g).reshape((-1,) + pad + g.shape[2:])
    xv = dx.reshape((-1,) + pad + tuple(input_shape[2:]))
    di, dl, td, hi, hl, th, wi, wl, tw = _tables(tables, rank)
    dl, hl, wl = (w.astype(g.dtype) for w in (dl, hl, wl))
    _backward(gv, di, dl, hi, hl, wi, wl, td, th, tw, xv)
    return dx
