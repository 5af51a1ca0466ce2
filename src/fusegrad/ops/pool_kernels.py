"""Loop kernels (numba, CPU) of the pooling primitives (``avg_pool``, ``avg_pool_backward``,
``pool_index``, ``pool_take``, ``pool_scatter`` in ``ops/primitives.py``) and of the
convolution's col2im (``conv_kernels``): the work that is not a matrix product.

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


@numba.njit(cache=True, nogil=True)
def col2im(cols, out, kernel, stride, dilation):  # type: ignore[no-untyped-def]
    """Add ``cols`` (planes, k0, k1, k2, o0, o1, o2) into ``out`` (planes, S0, S1, S2) where
    im2col read each element: ``out[p, i s0 + a d0, j s1 + b d1, l s2 + c d2] += cols[p, a,
    b, c, i, j, l]``.  ``cols`` is read in order."""
    planes = cols.shape[0]
    o0, o1, o2 = cols.shape[4], cols.shape[5], cols.shape[6]
    s2 = stride[2]
    for p in range(planes):
        for a in range(kernel[0]):
            for b in range(kernel[1]):
                for c in range(kernel[2]):
                    shift = c * dilation[2]
                    for i in range(o0):
                        z = i * stride[0] + a * dilation[0]
                        for j in range(o1):
                            y = j * stride[1] + b * dilation[1]
                            if s2 == 1:  # (the common case: a loop that vectorises)
                                for m in range(o2):
                                    out[p, z, y, m + shift] += cols[p, a, b, c, i, j, m]
                            else:
                                for m in range(o2):
                                    out[p, z, y, m * s2 + shift] += cols[p, a, b, c, i, j, m]


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
