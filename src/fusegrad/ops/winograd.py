"""Winograd convolution F(4x4, 3x3): the forward of 3x3, stride 1, undilated, ungrouped 2-D
convolutions (``conv_kernels`` picks it by shape class).

A 3x3 correlation computes each 4x4 output tile from a 6x6 input tile with 36 products per
channel pair instead of 144 (Lavin and Gray's minimal filtering, interpolation points 0, +-1,
+-2 and infinity):

* the filter of each (out, in) channel pair becomes a 6x6 tile ``G w G^T`` (``G``: 6x3);
* each input tile (6x6, tiles 4 apart) becomes ``B^T d B`` (``B^T``: 6x6);
* for each of the 36 tile positions, the transformed filters (O, C) multiply the transformed
  tiles (C, tiles): 36 matrix products (BLAS) that sum over the input channels;
* each product tile becomes a 4x4 output tile ``A^T m A`` (``A^T``: 4x6), cropped at the
  output's edge.

That is 4x fewer multiplications than the im2col product; measured on the MNIST network's
second layer (64 x 32 x 26 x 26 to 64 channels, one thread) the forward took 13.8 ms against
im2col's 20.5 ms.  The transforms add rounding: in
float32 the result differs from the direct sum by a few units in the 5th to 6th significant
digit on unit-scale data, about 10x the direct product's own rounding (checked against a
float64 reference in ``tests/ops/test_conv_kernels.py``); float64 is exact to ~1e-13.

(The input's gradient of such a convolution is again a 3x3 correlation, of the output's
gradient zero-padded by 2 with the filters rotated and transposed, but measured no faster than
im2col: ``conv_kernels`` keeps im2col there.)

The transforms are numba loops (imported on first use, like ``pool_kernels``): one pass over
the input writes every tile's 36 values, one pass over the products writes the output.
"""

from __future__ import annotations

import numba  # imported on first use only (by the convolution primitives' kernels)
import numpy as np

from .._numba_cache import fast_loading

_SIXTH, _12TH, _24TH = 1.0 / 6.0, 1.0 / 12.0, 1.0 / 24.0


@numba.njit(cache=True, nogil=True)
def _filters(w, u):  # type: ignore[no-untyped-def]
    """``u`` (36, O, C): ``G w G^T`` of each 3x3 filter of ``w`` (O, C, 3, 3), in float64.
    ``G`` (6x3) has rows (1/4, 0, 0), (-1/6, -1/6, -1/6), (-1/6, 1/6, -1/6), (1/24, 1/12,
    1/6), (1/24, -1/12, 1/6), (0, 0, 1)."""
    t = np.empty((6, 3))
    for o in range(w.shape[0]):
        for c in range(w.shape[1]):
            for j in range(3):  # t = G w (a column at a time)
                a, b, e = 1.0 * w[o, c, 0, j], 1.0 * w[o, c, 1, j], 1.0 * w[o, c, 2, j]
                t[0, j] = 0.25 * a
                t[1, j] = -(a + b + e) * _SIXTH
                t[2, j] = -(a - b + e) * _SIXTH
                t[3, j] = a * _24TH + b * _12TH + e * _SIXTH
                t[4, j] = a * _24TH - b * _12TH + e * _SIXTH
                t[5, j] = e
            for i in range(6):  # (G w) G^T, a row at a time
                a, b, e = t[i, 0], t[i, 1], t[i, 2]
                k = 6 * i
                u[k, o, c] = 0.25 * a
                u[k + 1, o, c] = -(a + b + e) * _SIXTH
                u[k + 2, o, c] = -(a - b + e) * _SIXTH
                u[k + 3, o, c] = a * _24TH + b * _12TH + e * _SIXTH
                u[k + 4, o, c] = a * _24TH - b * _12TH + e * _SIXTH
                u[k + 5, o, c] = e


def filters(w: np.ndarray) -> np.ndarray:
    """(O, C, 3, 3) filters -> (36, O, C) transformed filters ``G w G^T`` (computed in float64,
    rounded once to ``w``'s dtype)."""
    u = np.empty((36, w.shape[0], w.shape[1]), w.dtype)
    _filters(np.ascontiguousarray(w), u)
    return u


@numba.njit(cache=True, nogil=True)
def _row(d0, d1, d2, d3, d4, d5):  # type: ignore[no-untyped-def]
    """``B^T`` applied to six values (one column of a tile)."""
    return (
        4.0 * d0 - 5.0 * d2 + d4,
        -4.0 * d1 - 4.0 * d2 + d3 + d4,
        4.0 * d1 - 4.0 * d2 - d3 + d4,
        -2.0 * d1 - d2 + 2.0 * d3 + d4,
        2.0 * d1 - d2 - 2.0 * d3 + d4,
        4.0 * d1 - 5.0 * d3 + d5,
    )


@numba.njit(cache=True, nogil=True)
def tiles(xp, out, th, tw):  # type: ignore[no-untyped-def]
    """``out`` (36, C, N * th * tw): ``B^T d B`` of every 6x6 tile ``d`` of ``xp`` (N, C, 4 th +
    2, 4 tw + 2), tiles 4 apart, in (sample, tile row, tile column) order.  Per row of tiles:
    ``B^T`` down the six rows for every column at once, then ``B`` along each tile's six
    columns for every tile of the row at once (loops over contiguous data)."""
    n_samples, channels, width = xp.shape[0], xp.shape[1], xp.shape[3]
    per = th * tw
    t = np.empty((6, width), dtype=xp.dtype)
    for c in range(channels):  # (channel outer: the 36 planes of ``out`` fill in order)
        for n in range(n_samples):
            for ty in range(th):
                y0 = 4 * ty
                for x in range(width):
                    r0, r1, r2, r3, r4, r5 = _row(
                        xp[n, c, y0, x],
                        xp[n, c, y0 + 1, x],
                        xp[n, c, y0 + 2, x],
                        xp[n, c, y0 + 3, x],
                        xp[n, c, y0 + 4, x],
                        xp[n, c, y0 + 5, x],
                    )
                    t[0, x], t[1, x], t[2, x] = r0, r1, r2
                    t[3, x], t[4, x], t[5, x] = r3, r4, r5
                col0 = n * per + ty * tw
                for i in range(6):
                    k = 6 * i
                    for tx in range(tw):
                        x0 = 4 * tx
                        r0, r1, r2, r3, r4, r5 = _row(
                            t[i, x0],
                            t[i, x0 + 1],
                            t[i, x0 + 2],
                            t[i, x0 + 3],
                            t[i, x0 + 4],
                            t[i, x0 + 5],
                        )
                        col = col0 + tx
                        out[k, c, col], out[k + 1, c, col], out[k + 2, c, col] = r0, r1, r2
                        out[k + 3, c, col], out[k + 4, c, col], out[k + 5, c, col] = r3, r4, r5


@numba.njit(cache=True, nogil=True)
def _out_row(m0, m1, m2, m3, m4, m5):  # type: ignore[no-untyped-def]
    """``A^T`` applied to six values."""
    a = m1 + m2
    b = m1 - m2
    c = m3 + m4
    d = m3 - m4
    return (1.0 * (m0 + a + c), b + 2.0 * d, a + 4.0 * c, b + 8.0 * d + m5)


@numba.njit(cache=True, nogil=True)
def untile(m, y, th, tw):  # type: ignore[no-untyped-def]
    """``y`` (N, O, H, W) from the products ``m`` (36, O, N * th * tw): each 4x4 output tile
    ``A^T m A``, cropped where it passes the output's edge.  Per output channel: ``A^T`` down
    the six rows of every tile at once (a loop over the contiguous tiles), then ``A`` along
    each tile's rows into the output."""
    n_samples, out_c, height, width = y.shape[0], y.shape[1], y.shape[2], y.shape[3]
    count = m.shape[2]
    p = np.empty((4, 6, count), dtype=m.dtype)
    for o in range(out_c):
        for b in range(6):
            for col in range(count):
                r0, r1, r2, r3 = _out_row(
                    m[b, o, col],
                    m[6 + b, o, col],
                    m[12 + b, o, col],
                    m[18 + b, o, col],
                    m[24 + b, o, col],
                    m[30 + b, o, col],
                )
                p[0, b, col], p[1, b, col], p[2, b, col], p[3, b, col] = r0, r1, r2, r3
        col = 0
        for n in range(n_samples):
            for ty in range(th):
                y0 = 4 * ty
                rows = min(4, height - y0)
                for tx in range(tw):
                    x0 = 4 * tx
                    for i in range(rows):
                        r0, r1, r2, r3 = _out_row(
                            p[i, 0, col],
                            p[i, 1, col],
                            p[i, 2, col],
                            p[i, 3, col],
                            p[i, 4, col],
                            p[i, 5, col],
                        )
                        if x0 + 3 < width:
                            y[n, o, y0 + i, x0] = r0
                            y[n, o, y0 + i, x0 + 1] = r1
                            y[n, o, y0 + i, x0 + 2] = r2
                            y[n, o, y0 + i, x0 + 3] = r3
                        else:
                            if x0 < width:
                                y[n, o, y0 + i, x0] = r0
                            if x0 + 1 < width:
                                y[n, o, y0 + i, x0 + 1] = r1
                            if x0 + 2 < width:
                                y[n, o, y0 + i, x0 + 2] = r2
                    col += 1


def correlate(x: np.ndarray, u: np.ndarray, padding: tuple, chunk_bytes: int) -> np.ndarray:
    """The 3x3 correlation of ``x`` (N, C, H, W), zero-padded by ``padding`` (py, px), with
    the transformed filters ``u`` (36, O, C): (N, O, H + 2 py - 2, W + 2 px - 2).

    The samples go a few at a time, about ``chunk_bytes`` of transformed tiles and products
    each, through buffers made once: the whole batch's (33 MB on the MNIST network's second
    layer) left the caches between the transforms and the products, and its fresh pages
    cost as much as the work (one thread: 22.2 ms whole, 10.3 in chunks of 2 to 4 samples)."""
    batch, channels, height, width = x.shape
    out_c = u.shape[1]
    out_h, out_w = height + 2 * padding[0] - 2, width + 2 * padding[1] - 2
    th, tw = -(-out_h // 4), -(-out_w // 4)
    per_sample = 36 * (channels + out_c) * th * tw * x.itemsize
    step = max(1, min(batch, chunk_bytes // per_sample))
    y = np.empty((batch, out_c, out_h, out_w), x.dtype)
    # the padded samples, grown at the bottom and right so that every tile is whole (the
    # border stays zero: each chunk writes the same interior)
    xp = np.zeros((step, channels, 4 * th + 2, 4 * tw + 2), x.dtype)
    v = np.empty((36, channels, step * th * tw), x.dtype)
    m = np.empty((36, out_c, step * th * tw), x.dtype)
    inner = (slice(padding[0], padding[0] + height), slice(padding[1], padding[1] + width))
    for lo in range(0, batch, step):
        n = min(step, batch - lo)
        if n < step:  # the last, shorter chunk: buffers of its size
            v = np.empty((36, channels, n * th * tw), x.dtype)
            m = np.empty((36, out_c, n * th * tw), x.dtype)
        xp[(slice(0, n), slice(None)) + inner] = x[lo : lo + n]
        tiles(xp[:n], v, th, tw)
        np.matmul(u, v, out=m)  # (36, O, tiles)
        untile(m, y[lo : lo + n], th, tw)
    return y


fast_loading(globals())  # (loaded from the disk cache without numba's start-up work)
