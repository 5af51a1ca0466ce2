"""CUDA kernels of the normalisation layers' primitives (``norm_stats``, ``norm``,
``norm_backward``): the device forms of ``ops/norm_kernels.py``, for batch, instance, group and
layer norm, float32 and float64.

Every layout is seen as (N, C, S), a reshape of the contiguous input: the channel layouts as
on the CPU (S the product of the spatial dims), layer norm as (R, 1, D) -- one "sample" per
row and one statistic per sample, so that it is group norm with one group, except that its
weight and bias are per element of a row (``row``) rather than per channel.  Statistic ``k``
holds, per sample (instance, group, layer), the elements of sample ``k // groups`` in its group
of channels, else (batch) channel ``k`` of every sample.

* ``moment``: one thread block per statistic; each thread sums a strided subset in float64,
  then a shared-memory tree combines the partials in a fixed order (no atomics: reproducible);
  the variance is two-pass, about the given mean, as on the CPU;
* ``norm``: one thread per (sample, channel) computes the scale and shift (``y = x a + b``, cast
  to the input's dtype as the CPU kernel does), then one thread per element applies them (and
  layer norm's per-element weight and bias);
* ``norm_backward``: block trees give the per-(sample, channel) sums of ``g`` and ``g (x -
  mean)`` (of ``g w`` for layer norm), one thread per statistic the means the input's gradient
  needs, one thread per (sample, channel) its three coefficients, then ``dx = g alpha + x beta +
  gamma`` elementwise; the weight's and bias's gradients are one thread each (per channel from
  the sums, per element of a row for layer norm, summing the rows in order).

Sums run in float64 whatever the dtype, as on the CPU; they are ordered differently (block
trees against the CPU's eight partial sums), so results agree to rounding.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from . import is_simulator
from .array import CudaArray, contiguous, empty, probe_view
from .kernels import build, fill, launch_config

_SOURCE = '''
from numba import types


@cuda.jit(device=True, inline="always")
def stat_of(n, c, groups, per_group, per_sample):
    if per_sample:
        return n * groups + c // per_group
    return c


@cuda.jit(device=True, inline="always")
def element(x, k, e, groups, per_sample):
    """Element ``e`` of statistic ``k``."""
    spatial = x.shape[2]
    if per_sample:
        per_group = x.shape[1] // groups
        return x[k // groups, (k % groups) * per_group + e // spatial, e % spatial]
    return x[e // spatial, k, e % spatial]


@cuda.jit
def moment(x, mean, second, groups, per_sample, out):
    t = cuda.threadIdx.x
    part = cuda.shared.array(THREADS, types.float64)
    if per_sample:
        count = (x.shape[1] // groups) * x.shape[2]
    else:
        count = x.shape[0] * x.shape[2]
    for k in range(cuda.blockIdx.x, out.shape[0], cuda.gridDim.x):
        m = 0.0
        if second:
            m = np.float64(mean[k])
        acc = 0.0
        for e in range(t, count, THREADS):
            d = np.float64(element(x, k, e, groups, per_sample)) - m
            if second:
                acc += d * d
            else:
                acc += d
        part[t] = acc
        cuda.syncthreads()
        s = THREADS // 2
        while s > 0:
            if t < s:
                part[t] += part[t + s]
            cuda.syncthreads()
            s //= 2
        if t == 0:
            out[k] = part[0] / count
        cuda.syncthreads()


@cuda.jit
def coefficients(mean, var, weight, bias, has_w, has_b, groups, per_sample, eps, a, b, n):
    """Per (sample, channel): the scale and shift of ``y = x a + b``."""
    channels = a.shape[1]
    per_group = channels // groups
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        s = i // channels
        c = i % channels
        k = stat_of(s, c, groups, per_group, per_sample)
        m = np.float64(mean[k])
        scale = 1.0 / sqrt(np.float64(var[k]) + eps)
        if has_w:
            scale *= np.float64(weight[c])
        shift = -m * scale
        if has_b:
            shift += np.float64(bias[c])
        a[s, c] = scale
        b[s, c] = shift


@cuda.jit
def apply(x, a, b, weight, bias, row, out, n):
    """``out = x a + b`` per (sample, channel); with ``row`` then ``* weight + bias`` per
    element of the row."""
    channels = x.shape[1]
    spatial = x.shape[2]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        e = i % spatial
        j = i // spatial
        c = j % channels
        s = j // channels
        v = x[s, c, e] * a[s, c] + b[s, c]
        if row:
            v = v * weight[e] + bias[e]
        out[s, c, e] = v


@cuda.jit
def sums(g, x, mean, w, row, groups, per_sample, sum_g, sum_gx):
    """Per (sample, channel), block trees: sum(g) and sum(g (x - mean)) (``row``: g w)."""
    t = cuda.threadIdx.x
    pa = cuda.shared.array(THREADS, types.float64)
    pb = cuda.shared.array(THREADS, types.float64)
    channels = x.shape[1]
    spatial = x.shape[2]
    per_group = channels // groups
    for j in range(cuda.blockIdx.x, sum_g.shape[0], cuda.gridDim.x):
        s = j // channels
        c = j % channels
        m = np.float64(mean[stat_of(s, c, groups, per_group, per_sample)])
        acc_a = 0.0
        acc_b = 0.0
        for e in range(t, spatial, THREADS):
            gv = np.float64(g[s, c, e])
            if row:
                gv *= np.float64(w[e])
            acc_a += gv
            acc_b += gv * (np.float64(x[s, c, e]) - m)
        pa[t] = acc_a
        pb[t] = acc_b
        cuda.syncthreads()
        h = THREADS // 2
        while h > 0:
            if t < h:
                pa[t] += pa[t + h]
                pb[t] += pb[t + h]
            cuda.syncthreads()
            h //= 2
        if t == 0:
            sum_g[j] = pa[0]
            sum_gx[j] = pb[0]
        cuda.syncthreads()


@cuda.jit
def stat_means(sum_g, sum_gx, var, weight, has_w, groups, per_sample, samples, channels,
               count, eps, mean_gw, mean_gwx, n):
    """Per statistic: the means of g w and of g w xhat over its elements."""
    per_group = channels // groups
    for k in range(cuda.grid(1), n, cuda.gridsize(1)):
        total = 0.0
        total_x = 0.0
        if per_sample:
            s = k // groups
            first = (k % groups) * per_group
            for c in range(first, first + per_group):
                wc = np.float64(weight[c]) if has_w else 1.0
                total += wc * sum_g[s * channels + c]
                total_x += wc * sum_gx[s * channels + c]
        else:
            wc = np.float64(weight[k]) if has_w else 1.0
            for s in range(samples):
                total += wc * sum_g[s * channels + k]
                total_x += wc * sum_gx[s * channels + k]
        r = 1.0 / sqrt(np.float64(var[k]) + eps)
        mean_gw[k] = total / count
        mean_gwx[k] = total_x * (r / count)


@cuda.jit
def grad_coefficients(mean, var, weight, has_w, mean_gw, mean_gwx, groups, per_sample, eps,
                      alpha, beta, gamma, n):
    """Per (sample, channel): dx = g alpha + x beta + gamma."""
    channels = alpha.shape[1]
    per_group = channels // groups
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        s = i // channels
        c = i % channels
        k = stat_of(s, c, groups, per_group, per_sample)
        r = 1.0 / sqrt(np.float64(var[k]) + eps)
        wc = np.float64(weight[c]) if has_w else 1.0
        bt = -r * r * mean_gwx[k]
        alpha[s, c] = r * wc
        beta[s, c] = bt
        gamma[s, c] = -bt * np.float64(mean[k]) - r * mean_gw[k]


@cuda.jit
def input_grad(g, x, w, row, training, alpha, beta, gamma, dx, n):
    channels = x.shape[1]
    spatial = x.shape[2]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        e = i % spatial
        j = i // spatial
        c = j % channels
        s = j // channels
        gv = g[s, c, e]
        if row:
            gv = gv * w[e]
        if training:
            dx[s, c, e] = gv * alpha[s, c] + (x[s, c, e] * beta[s, c] + gamma[s, c])
        else:
            dx[s, c, e] = gv * alpha[s, c]


@cuda.jit
def channel_params(sum_g, sum_gx, var, groups, per_sample, samples, eps, want_w, want_b,
                   dw, db, n):
    """Per channel: the bias's gradient (sum of sum_g) and the weight's (sum of sum_gx rstd)."""
    channels = n
    per_group = channels // groups
    for c in range(cuda.grid(1), n, cuda.gridsize(1)):
        tb = 0.0
        tw = 0.0
        for s in range(samples):
            tb += sum_g[s * channels + c]
            if want_w:
                k = stat_of(s, c, groups, per_group, per_sample)
                tw += sum_gx[s * channels + c] * (1.0 / sqrt(np.float64(var[k]) + eps))
        if want_b:
            db[c] = tb
        if want_w:
            dw[c] = tw


@cuda.jit
def row_params(g, x, mean, var, eps, want_w, want_b, dw, db, n):
    """Per element of a row (layer norm): the weight's and bias's gradients, rows in order."""
    rows = g.shape[0]
    for d in range(cuda.grid(1), n, cuda.gridsize(1)):
        tb = 0.0
        tw = 0.0
        for r in range(rows):
            gv = np.float64(g[r, d])
            tb += gv
            if want_w:
                rstd = 1.0 / sqrt(np.float64(var[r]) + eps)
                tw += gv * ((np.float64(x[r, d]) - np.float64(mean[r])) * rstd)
        if want_b:
            db[d] = tb
        if want_w:
            dw[d] = tw
'''


def threads() -> int:
    """Threads per block of the block-tree kernels (few in the simulator, which runs each
    thread in Python)."""
    return 4 if is_simulator() else 128


@functools.cache
def _kernel(name: str) -> Any:
    sqrt = np.sqrt if is_simulator() else math.sqrt  # (numpy's: NaN, not an error, below 0)
    return build(_SOURCE, name, f"norm {name}", THREADS=threads(), sqrt=sqrt)


def _launch(name: str, n: int, *args: Any) -> None:
    if n:
        blocks, count = launch_config(n)
        _kernel(name)[blocks, count](*args, n)


def _blocks(name: str, rows: int, *args: Any) -> None:
    """A block-tree kernel, one block per row (a grid-stride loop past 65535)."""
    if rows:
        _kernel(name)[min(rows, 65535), threads()](*args)


def _view(x: CudaArray, layout: str, dims: int) -> CudaArray:
    """``x`` (contiguous) as (N, C, S), or (R, 1, D) for ``layer``."""
    x = contiguous(x)
    if layout == "layer":
        width = math.prod(x.shape[x.ndim - dims :])
        return x.reshape((x.size // width if width else 0, 1, width))
    return x.reshape((x.shape[0], x.shape[1], math.prod(x.shape[2:])))


def _groups(x: CudaArray, layout: str, groups: int | None) -> tuple[int, bool]:
    """(groups, per_sample)."""
    if layout == "batch":
        return x.shape[1], False
    if layout == "instance":
        return x.shape[1], True
    if layout == "layer":
        return 1, True
    return int(groups or 1), True


def _flat(a: CudaArray) -> CudaArray:
    return contiguous(a).reshape((a.size,))


def _param(p: CudaArray | None, like: CudaArray, size: int, value: float) -> CudaArray:
    """``p`` flat, or (absent) ``size`` elements of ``value``."""
    if p is not None and p.size:
        return _flat(p)
    out = empty((max(size, 1),), like.dtype)
    fill(out, value)
    return out


def norm_stats(x: CudaArray, *mean: CudaArray, layout: str, groups: Any, dims: int) -> CudaArray:
    """Each statistic's mean, or with ``mean`` its biased variance about it, in the statistics'
    shape (``ops/norms.py``, ``_stat_shape``)."""
    v = _view(x, layout, dims)
    count, per_sample = _groups(x, layout, groups)
    stats = count * v.shape[0] if per_sample else count
    out = empty((stats,), x.dtype)
    m = _flat(mean[0]) if mean else out
    _blocks("moment", stats, v.kernel_array(), m.kernel_array(), bool(mean), count, per_sample,
            out.kernel_array())  # fmt: skip
    shape = tuple(x.shape)
    if layout == "layer":
        return out.reshape(shape[: len(shape) - dims])
    if layout == "batch":
        return out.reshape(shape[1:2])
    return out.reshape((shape[0], shape[1] if layout == "instance" else count))


def norm(x, mean, var, w, b, *, layout, groups, dims, eps, weight, bias, training):  # type: ignore[no-untyped-def]
    """The normalised ``x`` by the statistics, then the affine map (``ops/norms.py``)."""
    v = _view(x, layout, dims)
    count, per_sample = _groups(x, layout, groups)
    samples, channels, spatial = v.shape
    row = layout == "layer"
    a = empty((samples, channels), x.dtype)
    sh = empty((samples, channels), x.dtype)
    wp = _param(w if weight else None, x, spatial if row else channels, 1.0)
    bp = _param(b if bias else None, x, spatial if row else channels, 0.0)
    _launch("coefficients", a.size, _flat(mean).kernel_array(), _flat(var).kernel_array(),
            wp.kernel_array(), bp.kernel_array(), bool(weight) and not row,
            bool(bias) and not row, count, per_sample, float(eps), a.kernel_array(),
            sh.kernel_array())  # fmt: skip
    out = empty(v.shape, x.dtype)
    _launch("apply", out.size, v.kernel_array(), a.kernel_array(), sh.kernel_array(),
            wp.kernel_array(), bp.kernel_array(), row, out.kernel_array())  # fmt: skip
    return out.reshape(tuple(x.shape))


def _segment(flat: CudaArray, start: int, size: int) -> CudaArray:
    return probe_view(flat, lambda p: p[start : start + size])


def norm_backward(g, *operands, layout, groups, dims, eps, training, need, weight):  # type: ignore[no-untyped-def]
    """The gradients of ``norm`` for ``g``, flat: the input's, the weight's, the bias's, each
    where ``need`` says (``ops/norms.py``)."""
    row = layout == "layer"
    vg = _view(g, layout, dims)
    samples, channels, spatial = vg.shape
    params = spatial if row else channels
    count, per_sample = _groups(g, layout, groups)
    size_x = vg.size if need[0] else 0
    sizes = (size_x, params if need[1] else 0, params if need[2] else 0)
    flat = empty((sum(sizes),), g.dtype)
    dw = _segment(flat, sizes[0], sizes[1])
    db = _segment(flat, sizes[0] + sizes[1], sizes[2])
    if not (need[0] or need[1]):  # the bias's alone: sums of g
        stats = count * samples if per_sample else count
        zeros = empty((max(stats, 1),), np.float64)
        fill(zeros, 0.0)
        x, mean, var = vg, zeros, zeros
    else:
        x, mean, var = _view(operands[0], layout, dims), _flat(operands[1]), _flat(operands[2])
    if row:
        x2, g2 = x.reshape((samples, spatial)), vg.reshape((samples, spatial))
        _launch("row_params", params if (need[1] or need[2]) else 0, g2.kernel_array(),
                x2.kernel_array(), mean.kernel_array(), var.kernel_array(), float(eps),
                bool(need[1]), bool(need[2]), dw.kernel_array(), db.kernel_array())  # fmt: skip
        if not need[0]:
            return flat
    w = _param(operands[-1] if weight else None, g, params, 1.0)
    has_w = bool(weight) and not row
    sum_g = empty((samples * channels,), np.float64)
    sum_gx = empty((samples * channels,), np.float64)
    _blocks("sums", samples * channels, vg.kernel_array(), x.kernel_array(),
            mean.kernel_array(), w.kernel_array(), row, count, per_sample,
            sum_g.kernel_array(), sum_gx.kernel_array())  # fmt: skip
    if not row:
        _launch("channel_params", channels if (need[1] or need[2]) else 0,
                sum_g.kernel_array(), sum_gx.kernel_array(), var.kernel_array(), count,
                per_sample, samples, float(eps), bool(need[1]), bool(need[2]),
                dw.kernel_array(), db.kernel_array())  # fmt: skip
    if not need[0]:
        return flat
    stats = count * samples if per_sample else count
    mean_gw = empty((stats,), np.float64)
    mean_gwx = empty((stats,), np.float64)
    if training:
        per_stat = (channels // count) * spatial if per_sample else samples * spatial
        _launch("stat_means", stats, sum_g.kernel_array(), sum_gx.kernel_array(),
                var.kernel_array(), w.kernel_array(), has_w, count, per_sample, samples,
                channels, per_stat, float(eps), mean_gw.kernel_array(),
                mean_gwx.kernel_array())  # fmt: skip
    else:
        fill(mean_gw, 0.0)
        fill(mean_gwx, 0.0)
    alpha = empty((samples, channels), g.dtype)
    beta = empty((samples, channels), g.dtype)
    gamma = empty((samples, channels), g.dtype)
    _launch("grad_coefficients", alpha.size, mean.kernel_array(), var.kernel_array(),
            w.kernel_array(), has_w, mean_gw.kernel_array(), mean_gwx.kernel_array(), count,
            per_sample, float(eps), alpha.kernel_array(), beta.kernel_array(),
            gamma.kernel_array())  # fmt: skip
    dx = _segment(flat, 0, size_x).reshape(vg.shape)
    _launch("input_grad", size_x, vg.kernel_array(), x.kernel_array(), w.kernel_array(), row,
            bool(training), alpha.kernel_array(), beta.kernel_array(), gamma.kernel_array(),
            dx.kernel_array())  # fmt: skip
    return flat
