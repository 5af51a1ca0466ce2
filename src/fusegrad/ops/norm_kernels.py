"""Fused CPU kernels of the normalisation layers (the ``norm_stats``, ``norm`` and
``norm_backward`` primitives of ``ops/norms.py``): batch, instance, group and layer norm, in
float32 and float64, over any batch and spatial rank.

Every layout is seen as one of two shapes (reshapes of the contiguous input, no copies):

* ``channel`` layouts (batch, instance, group norm): the input as (N, C, S), S the product of
  the spatial dims; the weight and bias are per channel.  The statistics are per channel over
  N and S (batch norm), per (sample, channel) over S (instance norm), or per (sample, group)
  over the group's channels and S (group norm);
* the ``row`` layout (layer norm): the input as (R, D), D the product of the normalised dims;
  the statistics are per row, the weight and bias per element of a row.

``moment`` computes each statistic's mean, or its biased variance about a given mean (K,);
``forward`` normalises
with them (``training``: the input's own statistics; else given ones, batch norm's running
statistics) and applies the affine map as one scale and shift per (sample, channel)
(``y = x a + b``, as PyTorch's CPU kernels do); ``backward`` computes the input's, weight's
and bias's gradients in two passes over the gradient and the input: the per-(sample,
channel) sums of ``g`` and ``g (x - mean)``, from which the weight's and bias's gradients and
three coefficients per (sample, channel) follow, then ``dx = g alpha + x beta + gamma``.  With
the input's own statistics (training) the gradient includes their dependence on the input:
``dx = rstd (g w - mean(g w) - xhat mean(g w xhat))`` over each statistic's elements.

Sums accumulate in float64, two-pass (the mean, then the centred squares) for the variance;
the summing helpers alone may reassociate (``_SUM_JIT``), so that LLVM vectorises them into
several float64 accumulators (DCGAN's 16 x 64 x 8 x 8 batch norm, one thread: the variance
22 -> 9 us, the backward 68 -> 28 us, with the backward's elementwise pass vectorised
too).  The kernels run on one thread.  They are compiled on first use with ``cache=True``;
this module (and numba with it) is imported by the primitives' kernels on their first call,
never when fusegrad is imported.
"""

from __future__ import annotations

import math

import numba  # this module is imported on first use only (by the norm primitives' kernels)
import numpy as np

from .._numba_cache import fast_loading

_JIT = {"cache": True, "fastmath": {"contract"}, "error_model": "numpy"}
# the sums alone may be reassociated: LLVM then vectorises them (float64 lanes, several
# accumulators); the elementwise passes keep their order of operations.  Not ``inline=
# "always"``: numba inlines in its own IR, where the caller's flags would replace these
_SUM_JIT = {**_JIT, "fastmath": {"contract", "reassoc"}}
# no contraction at all: ``g * w - mean(g w)`` must subtract the rounded product (as an FMA it
# leaves the product's rounding error where ``g w`` equals its mean)
_EXACT_JIT = {**_JIT, "fastmath": False}


@numba.njit(**_SUM_JIT)
def _sum(row, shift):  # type: ignore[no-untyped-def]
    """sum(row - shift), in float64."""
    total = 0.0
    for s in range(row.shape[0]):
        total += np.float64(row[s]) - shift
    return total


@numba.njit(**_SUM_JIT)
def _sum_squares(row, mean):  # type: ignore[no-untyped-def]
    """sum((row - mean)^2), in float64."""
    total = 0.0
    for s in range(row.shape[0]):
        d = np.float64(row[s]) - mean
        total += d * d
    return total


@numba.njit(**_SUM_JIT)
def _sum_products(g, x, mean):  # type: ignore[no-untyped-def]
    """(sum(g), sum(g (x - mean))), in float64."""
    sg = 0.0
    sgx = 0.0
    for s in range(g.shape[0]):
        gs = np.float64(g[s])
        sg += gs
        sgx += gs * (np.float64(x[s]) - mean)
    return sg, sgx


@numba.njit(**_SUM_JIT)
def _weighted_uncentred(g, x, w):  # type: ignore[no-untyped-def]
    """sum(g w x) over one row, in float64 (PyTorch's ``ds``: ``_row_backward``'s rows where
    ``g w`` is not finite)."""
    total = 0.0
    for s in range(g.shape[0]):
        total += np.float64(g[s]) * np.float64(w[s]) * np.float64(x[s])
    return total


@numba.njit(**_SUM_JIT)
def _weighted_products(g, x, w, mean):  # type: ignore[no-untyped-def]
    """(sum(g w), sum(g w (x - mean))) over one row, in float64."""
    sg = 0.0
    sgx = 0.0
    for s in range(g.shape[0]):
        gs = np.float64(g[s]) * np.float64(w[s])
        sg += gs
        sgx += gs * (np.float64(x[s]) - mean)
    return sg, sgx


# ---- channel layouts: x (N, C, S) ----------------------------------------------------------------


@numba.njit(**_JIT)
def _channel_moment(x, groups, per_sample, mean, second, out):  # type: ignore[no-untyped-def]
    """Per statistic into ``out`` (K,): the mean, or (``second``) the biased variance about
    the given ``mean`` (K,)."""
    n_count, channels, spatial = x.shape
    if per_sample:
        per_group = channels // groups
        count = per_group * spatial
        for n in range(n_count):
            for k in range(groups):
                block = x[n, k * per_group : (k + 1) * per_group].reshape(count)
                j = n * groups + k
                if second:
                    out[j] = _sum_squares(block, np.float64(mean[j])) / count
                else:
                    out[j] = _sum(block, 0.0) / count
    else:
        count = n_count * spatial
        for c in range(channels):
            total = 0.0
            for n in range(n_count):
                if second:
                    total += _sum_squares(x[n, c], np.float64(mean[c]))
                else:
                    total += _sum(x[n, c], 0.0)
            out[c] = total / count


@numba.njit(**_JIT)
def _row_moment(x, mean, second, out):  # type: ignore[no-untyped-def]
    rows, width = x.shape
    for r in range(rows):
        if second:
            out[r] = _sum_squares(x[r], np.float64(mean[r])) / width
        else:
            out[r] = _sum(x[r], 0.0) / width


@numba.njit(inline="always", **_JIT)
def _stat_of(n, c, groups, per_group, per_sample):  # type: ignore[no-untyped-def]
    """The statistic (sample, channel) belongs to."""
    if per_sample:
        return n * groups + c // per_group
    return c


@numba.njit(**_JIT)
def _channel_forward(x, stats, weight, bias, has_w, has_b, groups, per_sample, eps, out):  # type: ignore[no-untyped-def]
    n_count, channels, spatial = x.shape
    per_group = channels // groups
    for n in range(n_count):
        for c in range(channels):
            k = _stat_of(n, c, groups, per_group, per_sample)
            scale = 1.0 / math.sqrt(np.float64(stats[1, k]) + eps)
            if has_w:
                scale *= np.float64(weight[c])
            a = x.dtype.type(scale)
            # ``(x - mean) * a``, not ``x * a - mean * a``: an element equal to the mean gives
            # exactly the shift, as PyTorch's group norm (contracted into an FMA, the second
            # form left the rounding error of ``mean * a``: 2e-6 for a float32 constant row)
            m = x.dtype.type(stats[0, k])
            shift = x.dtype.type(bias[c]) if has_b else x.dtype.type(0.0)
            row, y = x[n, c], out[n, c]
            for s in range(spatial):
                y[s] = (row[s] - m) * a + shift


@numba.njit(**_JIT)
def _channel_backward(  # type: ignore[no-untyped-def]
    g, x, stats, weight, has_w, groups, per_sample, eps, training, need_x, dx, dw, db
):
    """The gradients of ``_channel_forward``: ``dx`` (N, C, S) when ``need_x``, ``dw`` and
    ``db`` (C,) (empty arrays when not wanted)."""
    n_count, channels, spatial = x.shape
    per_group = channels // groups
    stat_count = stats.shape[1]
    sum_g = np.empty((n_count, channels))
    sum_gx = np.empty((n_count, channels))  # sum of g (x - mean)
    rstd = np.empty(stat_count)
    for k in range(stat_count):
        rstd[k] = 1.0 / math.sqrt(np.float64(stats[1, k]) + eps)
    for n in range(n_count):
        for c in range(channels):
            k = _stat_of(n, c, groups, per_group, per_sample)
            sg, sgx = _sum_products(g[n, c], x[n, c], np.float64(stats[0, k]))
            sum_g[n, c] = sg
            sum_gx[n, c] = sgx
    if db.shape[0]:
        for c in range(channels):
            total = 0.0
            for n in range(n_count):
                total += sum_g[n, c]
            db[c] = total
    if dw.shape[0]:
        for c in range(channels):
            total = 0.0
            for n in range(n_count):
                total += sum_gx[n, c] * rstd[_stat_of(n, c, groups, per_group, per_sample)]
            dw[c] = total
    if not need_x:
        return
    # per statistic: the means of g w and of g w xhat over its elements (training only)
    mean_gw = np.zeros(stat_count)
    mean_gwx = np.zeros(stat_count)
    if training:
        count = (per_group * spatial) if per_sample else (n_count * spatial)
        for n in range(n_count):
            for c in range(channels):
                k = _stat_of(n, c, groups, per_group, per_sample)
                wc = np.float64(weight[c]) if has_w else 1.0
                mean_gw[k] += wc * sum_g[n, c]
                mean_gwx[k] += wc * sum_gx[n, c]
        for k in range(stat_count):
            mean_gw[k] /= count
            mean_gwx[k] *= rstd[k] / count
    # the three coefficients per (sample, channel), then one loop nest per case: with the
    # ``training`` test inside the nest, LLVM vectorised neither row loop (3-4x slower)
    coefficients = np.empty((4, n_count, channels))
    for n in range(n_count):
        for c in range(channels):
            k = _stat_of(n, c, groups, per_group, per_sample)
            r = rstd[k]
            wc = np.float64(weight[c]) if has_w else 1.0
            beta = -r * r * mean_gwx[k]
            coefficients[0, n, c] = r * wc
            coefficients[1, n, c] = beta
            coefficients[2, n, c] = -beta * np.float64(stats[0, k])
            # mean(g w) / w, the term ``g`` is reduced by (``r w (g - mean(g w) / w)``); a zero
            # weight has a zero gradient anyway
            coefficients[3, n, c] = mean_gw[k] / wc if wc != 0.0 else 0.0
    if training:
        for n in range(n_count):
            for c in range(channels):
                a = x.dtype.type(coefficients[0, n, c])
                b = x.dtype.type(coefficients[1, n, c])
                c1 = x.dtype.type(coefficients[2, n, c])
                m = x.dtype.type(coefficients[3, n, c])
                gr, xr, out = g[n, c], x[n, c], dx[n, c]
                # each difference before its product (as ``_row_backward``): exactly 0 where
                # ``g`` and ``x`` are constant over a statistic's elements
                for s in range(spatial):
                    out[s] = (gr[s] - m) * a + (xr[s] * b + c1)
    else:
        for n in range(n_count):
            for c in range(channels):
                a = x.dtype.type(coefficients[0, n, c])
                gr, out = g[n, c], dx[n, c]
                for s in range(spatial):
                    out[s] = gr[s] * a


# ---- the row layout: x (R, D) ------------------------------------------------------------------


@numba.njit(**_JIT)
def _row_forward(x, stats, weight, bias, eps, out):  # type: ignore[no-untyped-def]
    """``weight`` and ``bias`` (D,): ones and zeros where the call has none."""
    rows, width = x.shape
    for r in range(rows):
        a = x.dtype.type(1.0 / math.sqrt(np.float64(stats[1, r]) + eps))
        m = x.dtype.type(stats[0, r])  # (``(x - mean) * a``: as in ``_channel_forward``)
        row, y = x[r], out[r]
        for d in range(width):
            y[d] = ((row[d] - m) * a) * weight[d] + bias[d]


@numba.njit(**_EXACT_JIT)
def _row_backward(g, x, stats, w, eps, need_x, dx, dw, db):  # type: ignore[no-untyped-def]
    """``w`` (D,): ones where the call has no weight.  One pass over the rows per gradient
    (the tests of what is wanted outside the loops, so that LLVM vectorises each: with them
    inside one loop over the rows it vectorised none, 3.5 -> 2.3 ms on 4096 x 768); each
    element's sums in the rows' order, as before."""
    rows, width = x.shape
    want_w, want_b = dw.shape[0] > 0, db.shape[0] > 0
    acc_w = np.zeros(width)
    acc_b = np.zeros(width)
    if want_b:
        for r in range(rows):
            gr = g[r]
            for d in range(width):
                acc_b[d] += gr[d]
    if want_w:
        for r in range(rows):
            mean = np.float64(stats[0, r])
            rstd = 1.0 / math.sqrt(np.float64(stats[1, r]) + eps)
            gr, xr = g[r], x[r]
            for d in range(width):
                acc_w[d] += np.float64(gr[d]) * ((np.float64(xr[d]) - mean) * rstd)
    if need_x:
        for r in range(rows):
            mean = np.float64(stats[0, r])
            rstd = 1.0 / math.sqrt(np.float64(stats[1, r]) + eps)
            gr, xr = g[r], x[r]
            sgw, sgwx = _weighted_products(gr, xr, w, mean)
            mean_gw = sgw / width
            mean_gwx = sgwx * rstd / width
            beta = -rstd * rstd * mean_gwx
            a = x.dtype.type(rstd)
            b = x.dtype.type(beta)
            # ``rstd (g w - mean(g w)) + beta (x - mean)``, each difference taken before its
            # product: where ``g w`` is constant along the row and ``x`` too (a row of one
            # element) the gradient is exactly 0, as PyTorch's (``g w * a + (x * b + c)``
            # with ``c = -beta mean - rstd mean(g w)``, contracted into FMAs, left rounding
            # errors of the products: 3e-14 for a float64 layer norm over one element)
            m_gw = x.dtype.type(mean_gw)
            c1 = x.dtype.type(-beta * mean)
            if not math.isfinite(sgw):
                # ``g w`` infinite or NaN somewhere in the row (``x`` finite: else the
                # statistics are NaN already): PyTorch's coefficients, ``a g w + b x + c``
                # with ``b = (mean(g w) mean - mean(g w x)) rstd^3`` (uncentred, so its
                # infinities follow the signs of ``x``, not of ``x - mean``) and ``c = -b
                # mean - mean(g w) rstd``, no shift: each is infinite or NaN here, so only
                # which terms are infinite matters, and the infinities and NaNs fall where
                # PyTorch's do (the centred form put them elsewhere: fuzz seed 301666's
                # infinite weight).  ``ops.norms.training_input_gradient``: the composites'.
                mean_gwx_raw = _weighted_uncentred(gr, xr, w) / width
                torch_b = (mean_gw * mean - mean_gwx_raw) * (rstd * rstd * rstd)
                torch_c = -(torch_b * mean) - mean_gw * rstd
                m_gw = x.dtype.type(0.0)
                b = x.dtype.type(torch_b)
                c1 = x.dtype.type(torch_c)
            out = dx[r]
            for d in range(width):
                out[d] = (gr[d] * w[d] - m_gw) * a + (xr[d] * b + c1)
    if want_w:
        for d in range(width):
            dw[d] = acc_w[d]
    if want_b:
        for d in range(width):
            db[d] = acc_b[d]


# ---- entry points: arrays in their natural shapes ----------------------------------------------


def _view(x: np.ndarray, layout: str, dims: int) -> np.ndarray:
    """``x`` (contiguous) as (N, C, S) for the channel layouts, (R, D) for ``layer``."""
    if layout == "layer":
        width = math.prod(x.shape[x.ndim - dims :])
        return x.reshape(-1, width) if width else x.reshape(x.size, 0)
    return x.reshape(x.shape[0], x.shape[1], -1) if x.size else x.reshape(*x.shape[:2], 0)


def _groups(x: np.ndarray, layout: str, groups: int | None) -> tuple[int, bool]:
    """(groups, per_sample) of a channel layout."""
    if layout == "batch":
        return x.shape[1], False
    if layout == "instance":
        return x.shape[1], True
    return int(groups or 1), True


def moment(
    x: np.ndarray, mean: np.ndarray | None, layout: str, groups: int | None, dims: int
) -> np.ndarray:
    """(K,) flat: each statistic's mean of ``x``, or with ``mean`` given its biased variance
    (about that mean)."""
    x = np.ascontiguousarray(x)
    v = _view(x, layout, dims)
    second = mean is not None
    if layout == "layer":
        out = np.empty(v.shape[0], x.dtype)
        m = np.ascontiguousarray(mean).reshape(-1) if second else out
        _row_moment(v, m, second, out)
        return out
    count, per_sample = _groups(x, layout, groups)
    out = np.empty(count * x.shape[0] if per_sample else count, x.dtype)
    m = np.ascontiguousarray(mean).reshape(-1) if second else out
    _channel_moment(v, count, per_sample, m, second, out)
    return out


def _param(p: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    return np.empty(0, dtype) if p is None else np.ascontiguousarray(p, dtype).reshape(-1)


def forward(
    x: np.ndarray,
    statistics: np.ndarray,
    weight: np.ndarray | None,
    bias: np.ndarray | None,
    layout: str,
    groups: int | None,
    dims: int,
    eps: float,
) -> np.ndarray:
    """The normalised ``x`` by ``statistics`` (2 K,: means, then variances), then the affine
    map."""
    x = np.ascontiguousarray(x)
    st = np.ascontiguousarray(statistics).reshape(2, -1)
    w, b = _param(weight, x.dtype), _param(bias, x.dtype)
    out = np.empty(x.shape, x.dtype)
    v, o = _view(x, layout, dims), _view(out, layout, dims)
    if layout == "layer":
        width = v.shape[1]
        w = w if weight is not None else np.ones(width, x.dtype)
        b = b if bias is not None else np.zeros(width, x.dtype)
        _row_forward(v, st, w, b, float(eps), o)
    else:
        count, per_sample = _groups(x, layout, groups)
        _channel_forward(
            v, st, w, b, weight is not None, bias is not None, count, per_sample, float(eps), o
        )
    return out


def backward(
    g: np.ndarray,
    x: np.ndarray,
    statistics: np.ndarray,
    weight: np.ndarray | None,
    layout: str,
    groups: int | None,
    dims: int,
    eps: float,
    training: bool,
    need: tuple[bool, bool, bool],
) -> np.ndarray:
    """The gradients of ``forward`` for its gradient ``g``, flat: the input's (when
    ``need[0]``), the weight's (``need[1]``), the bias's (``need[2]``), each in the layout's
    parameter size (C, or D for ``layer``).  Where only the bias's is wanted, ``x`` and
    ``statistics`` are not read (they may be empty)."""
    if not need[0] and not need[1]:
        rows = _view(np.ascontiguousarray(g), layout, dims)
        return rows.sum(0 if layout == "layer" else (0, 2), dtype=np.float64).astype(g.dtype)
    x = np.ascontiguousarray(x)
    g = np.ascontiguousarray(g, x.dtype)
    st = np.ascontiguousarray(statistics).reshape(2, -1)
    params = math.prod(x.shape[x.ndim - dims :]) if layout == "layer" else x.shape[1]
    sizes = (x.size if need[0] else 0, params if need[1] else 0, params if need[2] else 0)
    flat = np.empty(sum(sizes), x.dtype)
    dw = flat[sizes[0] : sizes[0] + sizes[1]]
    db = flat[sizes[0] + sizes[1] :]
    w = _param(weight, x.dtype)
    vg, vx = _view(g, layout, dims), _view(x, layout, dims)
    if need[0]:
        vdx = _view(flat[: sizes[0]].reshape(x.shape), layout, dims)
    else:
        vdx = np.empty((0,) * vx.ndim, x.dtype)
    if layout == "layer":
        w = w if weight is not None else np.ones(vx.shape[1], x.dtype)
        _row_backward(vg, vx, st, w, float(eps), need[0], vdx, dw, db)
    else:
        count, per_sample = _groups(x, layout, groups)
        _channel_backward(
            vg, vx, st, w, weight is not None, count, per_sample, float(eps), bool(training),
            need[0], vdx, dw, db,
        )  # fmt: skip
    return flat


fast_loading(globals())  # (loaded from the disk cache without numba's start-up work)
