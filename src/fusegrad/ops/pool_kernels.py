"""Loop kernels (numba, CPU) of the pooling primitives (``avg_pool``, ``avg_pool_backward``,
``pool_index``, ``pool_take``, ``pool_scatter`` in ``ops/primitives.py``) and of the
convolution's im2col and col2im (``conv_kernels``): the work that is not a matrix product.

Every window kernel works on a canonical layout, (planes, D, H, W): an (N, C, *spatial) array
of 1, 2 or 3 spatial dims is a view of it with unit leading spatial dims, and a plane is one
(sample, channel).  A pooling window along one dim is given by two tables and a step: output
``o`` reads the input positions ``lo[o], lo[o] + step, ... < hi[o]``, already clipped to the
input (padding never holds a value: max pooling's padding is -inf and never wins, average
pooling's is zero and only counts in the divisor).  The tables cover both kinds of window:

* fixed windows (``max_pool*d`` / ``avg_pool*d``): output ``o`` starts at ``o * stride -
  padding`` and steps by ``dilation`` over ``kernel`` positions;
* adaptive windows (``adaptive_*_pool*d``): output ``o`` covers ``[floor(o * in / out),
  ceil((o + 1) * in / out))``.

Max pooling finds the position of each window's maximum in PyTorch's CPU order (a value
replaces the running maximum when it is larger or NaN, so a window holding NaN gives its last
NaN, and a window of -inf its first position); the values are then read at those positions
(``take``) and the gradient added back to them (``scatter_add``), as PyTorch's saved indices
do.  Average pooling accumulates in float64 and divides by a per-output divisor computed with
the tables.

The kernels are compiled on first use with ``cache=True``; this module (and numba with it) is
imported by the primitives' kernels on their first call, never when fusegrad is imported.
"""

from __future__ import annotations

import numba  # imported on first use only (by the pooling and convolution primitives' kernels)
from numba import uint64 as U

from .._numba_cache import fast_load, fast_loading


@numba.njit(cache=True, nogil=True)
def _valid(count, step, shift, size):  # type: ignore[no-untyped-def]
    """The range [lo, hi) of outputs ``o < count`` whose input position ``o * step + shift``
    lies inside ``[0, size)``."""
    lo = 0
    while lo < count and lo * step + shift < 0:
        lo += 1
    hi = count
    while hi > lo and (hi - 1) * step + shift >= size:
        hi -= 1
    return lo, hi


@numba.njit(cache=True, nogil=True, inline="always")
def _sizes(geometry):  # type: ignore[no-untyped-def]
    """The input sizes, kernel sizes and output sizes of the three spatial dims of a column
    kernel's ``geometry`` (``conv_kernels._geometry``)."""
    g = geometry
    return g[0, 0], g[1, 0], g[2, 0], g[0, 1], g[1, 1], g[2, 1], g[0, 2], g[1, 2], g[2, 2]


@numba.njit(cache=True, nogil=True, inline="always")
def _steps(geometry):  # type: ignore[no-untyped-def]
    """The strides, paddings and dilations of the three spatial dims (``_sizes``)."""
    g = geometry
    return g[0, 3], g[1, 3], g[2, 3], g[0, 4], g[1, 4], g[2, 4], g[0, 5], g[1, 5], g[2, 5]


@numba.njit(cache=True, nogil=True)
def im2col(x, cols, geometry, by_sample):  # type: ignore[no-untyped-def]
    """im2col of ``x`` (N, C, S0, S1, S2), flat, into ``cols``, flat: the element of channel
    ``c``, kernel tap ``(a, b, e)``, sample ``n`` and output ``(i, j, m)`` is ``x[n, c, i s0 + a
    d0 - p0, j s1 + b d1 - p1, m s2 + e d2 - p2]``, zero where that position is in the padding
    (which is never materialised).  ``cols`` is (N, C, k0, k1, k2, o0, o1, o2) if
    ``by_sample`` (a (C taps, L) matrix per sample) and (C, k0, k1, k2, N, o0, o1, o2)
    otherwise (one (C taps, N L) matrix for a product over the whole batch).  ``geometry``
    (4, 6) holds per spatial dim ``(size, kernel, out, stride, padding, dilation)``, then
    ``(N, C)``: ``conv_kernels._geometry``."""
    sz0, sz1, sz2, k0, k1, k2, o0, o1, o2 = _sizes(geometry)
    st0, st1, st2, p0, p1, p2, d0, d1, d2 = _steps(geometry)
    batch, channels = geometry[3, 0], geometry[3, 1]
    plane, length = sz0 * sz1 * sz2, o0 * o1 * o2
    taps, ust2 = k0 * k1 * k2, U(st2)
    for ch in range(channels):
        tap = 0
        for a in range(k0):
            for b in range(k1):
                for e in range(k2):
                    shift = e * d2 - p2
                    lo, hi = _valid(o2, st2, shift, sz2)
                    for n in range(batch):
                        base = (n * channels + ch) * plane
                        if by_sample:
                            at = ((n * channels + ch) * taps + tap) * length
                        else:
                            at = ((ch * taps + tap) * batch + n) * length
                        for i in range(o0):
                            z = i * st0 + a * d0 - p0
                            for j in range(o1):
                                y = j * st1 + b * d1 - p1
                                row = U(at + (i * o1 + j) * o2)
                                if 0 <= z < sz0 and 0 <= y < sz1 and lo < hi:
                                    # unsigned positions: numba adds no negative-index
                                    # wrap-around, which kept these short loops from
                                    # vectorising (3x slower at 8-element rows)
                                    src = U(base + (z * sz1 + y) * sz2 + shift + lo * st2)
                                    dst = row + U(lo)
                                    if st2 == 1:
                                        for m in range(U(hi - lo)):
                                            cols[dst + m] = x[src + m]
                                    else:
                                        for m in range(U(hi - lo)):
                                            cols[dst + m] = x[src + m * ust2]
                                    for m in range(U(lo)):
                                        cols[row + m] = 0
                                    for m in range(U(hi), U(o2)):
                                        cols[row + m] = 0
                                else:
                                    for m in range(U(o2)):
                                        cols[row + m] = 0
                    tap += 1


@numba.njit(cache=True, nogil=True)
def col2im(cols, out, geometry, by_sample):  # type: ignore[no-untyped-def]
    """The transpose of ``im2col`` (same flat layouts and ``geometry``): ``cols`` added into
    ``out`` (N, C, S0, S1, S2), flat, where ``im2col`` read each element; the elements that
    read padding are dropped, so ``out`` is the input's size and needs no crop."""
    sz0, sz1, sz2, k0, k1, k2, o0, o1, o2 = _sizes(geometry)
    st0, st1, st2, p0, p1, p2, d0, d1, d2 = _steps(geometry)
    batch, channels = geometry[3, 0], geometry[3, 1]
    plane, length = sz0 * sz1 * sz2, o0 * o1 * o2
    taps, ust2 = k0 * k1 * k2, U(st2)
    for n in range(batch):
        for ch in range(channels):
            base = (n * channels + ch) * plane
            tap = 0
            for a in range(k0):
                for b in range(k1):
                    for e in range(k2):
                        shift = e * d2 - p2
                        lo, hi = _valid(o2, st2, shift, sz2)
                        if by_sample:
                            at = ((n * channels + ch) * taps + tap) * length
                        else:
                            at = ((ch * taps + tap) * batch + n) * length
                        tap += 1
                        if lo >= hi:
                            continue
                        for i in range(o0):
                            z = i * st0 + a * d0 - p0
                            if z < 0 or z >= sz0:
                                continue
                            for j in range(o1):
                                y = j * st1 + b * d1 - p1
                                if 0 <= y < sz1:
                                    dst = U(base + (z * sz1 + y) * sz2 + shift + lo * st2)
                                    src = U(at + (i * o1 + j) * o2 + lo)
                                    if st2 == 1:
                                        for m in range(U(hi - lo)):
                                            out[dst + m] += cols[src + m]
                                    else:
                                        for m in range(U(hi - lo)):
                                            out[dst + m * ust2] += cols[src + m]


@numba.njit(cache=True, nogil=True, inline="always")
def _tap_run(geometry, m):  # type: ignore[no-untyped-def]
    """For output position ``m`` along the last spatial dim: ``(w0, lo, hi)``, its first
    tap's input position ``w0`` and the taps ``[lo, hi)`` along that dim whose positions
    ``w0 + e d2`` lie inside the input (the others read padding)."""
    sz2, k2, st2, p2, d2 = (
        geometry[2, 0],
        geometry[2, 1],
        geometry[2, 3],
        geometry[2, 4],
        geometry[2, 5],
    )
    w0 = m * st2 - p2
    lo = 0
    while lo < k2 and w0 + lo * d2 < 0:
        lo += 1
    hi = k2
    while hi > lo and w0 + (hi - 1) * d2 >= sz2:
        hi -= 1
    return w0, lo, hi


def _columns_last(gather):  # type: ignore[no-untyped-def]
    """The channels-last column loop: ``gather`` (a constant of the compiled loop; numba keys
    its disk cache by closure values too) copies input runs into the columns (``im2col_last``),
    else adds the columns back into the input's positions (``col2im_last``).  Both walk the
    rows alike, one run of adjacent taps along the last dim at a time."""

    @numba.njit(cache=True, nogil=True)
    def columns_last(x, cols, geometry):  # type: ignore[no-untyped-def]
        sz0, sz1, sz2, k0, k1, k2, o0, o1, o2 = _sizes(geometry)
        st0, st1, _, p0, p1, _, d0, d1, d2 = _steps(geometry)
        batch, channels = geometry[3, 0], U(geometry[3, 1])
        span, row = U(k2) * channels, U(0)
        for n in range(batch):
            for i in range(o0):
                for j in range(o1):
                    for m in range(o2):
                        w0, lo, hi = _tap_run(geometry, m)
                        head, tail = U(lo) * channels, U(hi) * channels
                        for a in range(k0):
                            z = i * st0 + a * d0 - p0
                            for b in range(k1):
                                y = j * st1 + b * d1 - p1
                                inside = 0 <= z < sz0 and 0 <= y < sz1 and lo < hi
                                if inside:
                                    # unsigned positions: no negative-index wrap-around checks
                                    at = U(((n * sz0 + z) * sz1 + y) * sz2 + w0 + lo * d2)
                                    at *= channels
                                    run = row + head
                                    step = U(d2) * channels
                                    if gather:
                                        for q in range(head):
                                            cols[row + q] = 0
                                        if d2 == 1:
                                            for q in range(tail - head):
                                                cols[run + q] = x[at + q]
                                        else:
                                            for e in range(U(hi - lo)):
                                                for c in range(channels):
                                                    cols[run + e * channels + c] = x[
                                                        at + e * step + c
                                                    ]
                                        for q in range(tail, span):
                                            cols[row + q] = 0
                                    elif d2 == 1:
                                        for q in range(tail - head):
                                            x[at + q] += cols[run + q]
                                    else:
                                        for e in range(U(hi - lo)):
                                            for c in range(channels):
                                                x[at + e * step + c] += cols[run + e * channels + c]
                                elif gather:
                                    for q in range(span):
                                        cols[row + q] = 0
                                row += span

    return fast_load(columns_last)


_gather_last = _columns_last(True)
_scatter_last = _columns_last(False)


def im2col_last(x, cols, geometry):  # type: ignore[no-untyped-def]
    """Channels-last im2col: ``x`` (N, S0, S1, S2, C), flat, into ``cols`` (N, o0, o1, o2,
    k0, k1, k2, C), flat: a row per output position holding, per kernel tap, the C channels
    of the input position it reads (zeros in the padding).  Every copy is C contiguous
    elements, where the channel-major columns copy strided rows as short as the output's
    (``im2col``); undilated along the last dim, the taps along it read adjacent input
    positions, so one copy of up to k2 C elements serves them (DCGAN's 4x4 layers: 4x fewer
    copies; 32 channels at 16x16, one thread: 0.126 -> 0.047 ms).  Same ``geometry`` as
    ``im2col``."""
    _gather_last(x, cols, geometry)


def col2im_last(cols, out, geometry):  # type: ignore[no-untyped-def]
    """The transpose of ``im2col_last``: ``cols`` added into ``out`` (N, S0, S1, S2, C),
    flat, where ``im2col_last`` read each element; padding positions are dropped.  Each
    element's additions come in the order of the rows (as one copy per tap would add
    them): the result does not depend on the runs."""
    _scatter_last(out, cols, geometry)


@numba.njit(cache=True, nogil=True)
def max_pool_index(x, lo0, hi0, lo1, hi1, lo2, hi2, step, where):  # type: ignore[no-untyped-def]
    """The flat position (in its plane) of the maximum of each window of ``x`` (planes, S0,
    S1, S2), into ``where`` (planes, O0, O1, O2)."""
    planes, s1, s2 = x.shape[0], x.shape[2], x.shape[3]
    unit = step[0] == 1 and step[1] == 1 and step[2] == 1
    for p in range(planes):
        for i in range(lo0.shape[0]):
            for j in range(lo1.shape[0]):
                for m in range(lo2.shape[0]):
                    best = x[p, lo0[i], lo1[j], lo2[m]]
                    at = (lo0[i] * s1 + lo1[j]) * s2 + lo2[m]
                    if unit:  # (the common case: loops with unit steps run faster)
                        for z in range(lo0[i], hi0[i]):
                            for y in range(lo1[j], hi1[j]):
                                for w in range(lo2[m], hi2[m]):
                                    v = x[p, z, y, w]
                                    if v > best or v != v:
                                        best = v
                                        at = (z * s1 + y) * s2 + w
                    else:
                        for z in range(lo0[i], hi0[i], step[0]):
                            for y in range(lo1[j], hi1[j], step[1]):
                                for w in range(lo2[m], hi2[m], step[2]):
                                    v = x[p, z, y, w]
                                    if v > best or v != v:
                                        best = v
                                        at = (z * s1 + y) * s2 + w
                    where[p, i, j, m] = at


@numba.njit(cache=True, nogil=True)
def take(x, index, out):  # type: ignore[no-untyped-def]
    """``out[p, o] = x[p, index[p, o]]`` over planes ``p``."""
    for p in range(index.shape[0]):
        for o in range(index.shape[1]):
            out[p, o] = x[p, index[p, o]]


@numba.njit(cache=True, nogil=True)
def scatter_add(g, index, out):  # type: ignore[no-untyped-def]
    """``out[p, index[p, o]] += g[p, o]`` over planes ``p`` (the transpose of ``take``)."""
    for p in range(index.shape[0]):
        for o in range(index.shape[1]):
            out[p, index[p, o]] += g[p, o]


@numba.njit(cache=True, nogil=True)
def avg_pool(x, lo0, hi0, lo1, hi1, lo2, hi2, divisor, out):  # type: ignore[no-untyped-def]
    """The sum of each window of ``x`` (planes, S0, S1, S2) (unit steps), over ``divisor``
    (O0, O1, O2), into ``out`` (planes, O0, O1, O2); summed in float64."""
    planes = x.shape[0]
    for p in range(planes):
        for i in range(lo0.shape[0]):
            for j in range(lo1.shape[0]):
                for m in range(lo2.shape[0]):
                    total = 0.0
                    for z in range(lo0[i], hi0[i]):
                        for y in range(lo1[j], hi1[j]):
                            for w in range(lo2[m], hi2[m]):
                                total += x[p, z, y, w]
                    out[p, i, j, m] = total / divisor[i, j, m]


@numba.njit(cache=True, nogil=True)
def avg_pool_backward(g, lo0, hi0, lo1, hi1, lo2, hi2, divisor, gx):  # type: ignore[no-untyped-def]
    """The transpose of ``avg_pool``: each output's gradient over its divisor added to every
    position of its window, in ``gx`` (planes, S0, S1, S2)."""
    planes = g.shape[0]
    for p in range(planes):
        for i in range(lo0.shape[0]):
            for j in range(lo1.shape[0]):
                for m in range(lo2.shape[0]):
                    share = g[p, i, j, m] / divisor[i, j, m]
                    for z in range(lo0[i], hi0[i]):
                        for y in range(lo1[j], hi1[j]):
                            for w in range(lo2[m], hi2[m]):
                                gx[p, z, y, w] += share


# ---- direct convolution of one input channel per group (depthwise) ---------------------------
# Where each of several groups has one input channel (C / groups = 1 < groups: depthwise and
# channel-multiplier convolutions) im2col leaves a (1, taps) by (taps, L) product per sample
# and group: thousands of BLAS calls with no work in them (5x PyTorch's time at 64 x 64 x 32 x
# 32, 3x3).  These loops do the same sums directly.  ``xp`` is the zero-padded input (N, C,
# P0, P1, P2), ``w`` the weight (O, K0, K1, K2) with output channel o reading input channel
# o // (O / C).  Indexing the 5-d arrays in the innermost loop (rather than taking a row view
# per output row) matters: the views cost more than the arithmetic on 32-wide rows.


@numba.njit(cache=True, nogil=True)
def depthwise_forward(xp, w, out, stride, dilation):  # type: ignore[no-untyped-def]
    """``out`` (N, O, O0, O1, O2), zeroed: the convolution."""
    mult = out.shape[1] // xp.shape[1]
    s0, s1, s2 = stride[0], stride[1], stride[2]
    d0, d1, d2 = dilation[0], dilation[1], dilation[2]
    for n in range(out.shape[0]):
        for o in range(out.shape[1]):
            c = o // mult
            for a in range(w.shape[1]):
                for b in range(w.shape[2]):
                    for q in range(w.shape[3]):
                        wv = w[o, a, b, q]
                        for i in range(out.shape[2]):
                            z = i * s0 + a * d0
                            for j in range(out.shape[3]):
                                y = j * s1 + b * d1
                                shift = q * d2
                                if s2 == 1:  # (a loop that vectorises)
                                    for m in range(out.shape[4]):
                                        out[n, o, i, j, m] += wv * xp[n, c, z, y, m + shift]
                                else:
                                    for m in range(out.shape[4]):
                                        out[n, o, i, j, m] += wv * xp[n, c, z, y, m * s2 + shift]


@numba.njit(cache=True, nogil=True)
def depthwise_backward_input(g, w, gxp, stride, dilation):  # type: ignore[no-untyped-def]
    """``gxp`` (N, C, P0, P1, P2), zeroed: the padded input's gradient for ``g`` (N, O, ...)."""
    mult = g.shape[1] // gxp.shape[1]
    s0, s1, s2 = stride[0], stride[1], stride[2]
    d0, d1, d2 = dilation[0], dilation[1], dilation[2]
    for n in range(g.shape[0]):
        for o in range(g.shape[1]):
            c = o // mult
            for a in range(w.shape[1]):
                for b in range(w.shape[2]):
                    for q in range(w.shape[3]):
                        wv = w[o, a, b, q]
                        for i in range(g.shape[2]):
                            z = i * s0 + a * d0
                            for j in range(g.shape[3]):
                                y = j * s1 + b * d1
                                shift = q * d2
                                if s2 == 1:  # (a loop that vectorises)
                                    for m in range(g.shape[4]):
                                        gxp[n, c, z, y, m + shift] += wv * g[n, o, i, j, m]
                                else:
                                    for m in range(g.shape[4]):
                                        gxp[n, c, z, y, m * s2 + shift] += wv * g[n, o, i, j, m]


@numba.njit(cache=True, nogil=True)
def depthwise_backward_weight(g, xp, gw, stride, dilation):  # type: ignore[no-untyped-def]
    """``gw`` (O, K0, K1, K2): the weight's gradient for ``g`` (N, O, ...), summed in float64."""
    mult = g.shape[1] // xp.shape[1]
    s0, s1, s2 = stride[0], stride[1], stride[2]
    d0, d1, d2 = dilation[0], dilation[1], dilation[2]
    for o in range(g.shape[1]):
        c = o // mult
        for a in range(gw.shape[1]):
            for b in range(gw.shape[2]):
                for q in range(gw.shape[3]):
                    total = 0.0
                    for n in range(g.shape[0]):
                        for i in range(g.shape[2]):
                            z = i * s0 + a * d0
                            for j in range(g.shape[3]):
                                y = j * s1 + b * d1
                                shift = q * d2
                                if s2 == 1:
                                    for m in range(g.shape[4]):
                                        total += g[n, o, i, j, m] * xp[n, c, z, y, m + shift]
                                else:
                                    for m in range(g.shape[4]):
                                        total += g[n, o, i, j, m] * xp[n, c, z, y, m * s2 + shift]
                    gw[o, a, b, q] = total


fast_loading(globals())  # (loaded from the disk cache without numba's start-up work)
