"""CUDA kernels of the convolution primitives (``convolution``, ``convolution_backward_input``,
``convolution_backward_weight``): the device forms of ``ops/conv_kernels.py``, im2col and
batched products (``cuda/matmul.py``), on a canonical layout of three spatial dims (unit dims
first).

* ``im2col``: one thread per column element (n, c, taps, outputs) reads the input at ``o *
  stride + tap * dilation - padding``, zero outside (no padded copy);
* ``col2im``: one thread per input element *pulls* the column elements that read it (for each
  tap, the output ``(z + padding - tap * dilation) / stride`` when it divides and is in range):
  no atomics, deterministic;
* the weight's gradient sums the per-sample products over the batch with one thread per weight
  element.

The transposed convolution runs the same kernels with the roles swapped, as on the CPU.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .array import CudaArray, contiguous, empty, probe_view
from .kernels import build, launch_config
from .matmul import matmul


@functools.cache
def _kernel(name: str) -> Any:
    if name == "im2col":
        lines = [
            "def im2col(x, cols, k0, k1, k2, s0, s1, s2, p0, p1, p2, d0, d1, d2, n):",
            "    o0 = cols.shape[5]",
            "    o1 = cols.shape[6]",
            "    o2 = cols.shape[7]",
            "    channels = cols.shape[1]",
            "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):",
            "        rem = i",
            "        m = rem % o2",
            "        rem //= o2",
            "        j = rem % o1",
            "        rem //= o1",
            "        l = rem % o0",
            "        rem //= o0",
            "        q = rem % k2",
            "        rem //= k2",
            "        b = rem % k1",
            "        rem //= k1",
            "        a = rem % k0",
            "        rem //= k0",
            "        c = rem % channels",
            "        s = rem // channels",
            "        z = l * s0 + a * d0 - p0",
            "        y = j * s1 + b * d1 - p1",
            "        w = m * s2 + q * d2 - p2",
            "        v = 0.0",
            "        if 0 <= z < x.shape[2] and 0 <= y < x.shape[3] and 0 <= w < x.shape[4]:",
            "            v = x[s, c, z, y, w]",
            "        cols[s, c, a, b, q, l, j, m] = v",
        ]
    elif name == "col2im":
        lines = [
            "def col2im(cols, x, s0, s1, s2, p0, p1, p2, d0, d1, d2, n):",
            "    k0 = cols.shape[2]",
            "    k1 = cols.shape[3]",
            "    k2 = cols.shape[4]",
            "    o0 = cols.shape[5]",
            "    o1 = cols.shape[6]",
            "    o2 = cols.shape[7]",
            "    S0 = x.shape[2]",
            "    S1 = x.shape[3]",
            "    S2 = x.shape[4]",
            "    channels = x.shape[1]",
            "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):",
            "        rem = i",
            "        w = rem % S2",
            "        rem //= S2",
            "        y = rem % S1",
            "        rem //= S1",
            "        z = rem % S0",
            "        rem //= S0",
            "        c = rem % channels",
            "        s = rem // channels",
            "        total = 0.0",
            "        for a in range(k0):",
            "            t0 = z + p0 - a * d0",
            "            if t0 < 0 or t0 % s0 != 0 or t0 // s0 >= o0:",
            "                continue",
            "            for b in range(k1):",
            "                t1 = y + p1 - b * d1",
            "                if t1 < 0 or t1 % s1 != 0 or t1 // s1 >= o1:",
            "                    continue",
            "                for q in range(k2):",
            "                    t2 = w + p2 - q * d2",
            "                    if t2 < 0 or t2 % s2 != 0 or t2 // s2 >= o2:",
            "                        continue",
            "                    total += cols[s, c, a, b, q, t0 // s0, t1 // s1, t2 // s2]",
            "        x[s, c, z, y, w] = total",
        ]
    elif name == "batch_sum":
        lines = [
            "def batch_sum(parts, out, n):",
            "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):",
            "        total = 0.0",
            "        for s in range(parts.shape[0]):",
            "            total += parts[s, i]",
            "        out[i] = total",
        ]
    else:  # add_bias
        lines = [
            "def add_bias(out, bias, n):",
            "    length = out.shape[2]",
            "    channels = out.shape[1]",
            "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):",
            "        c = (i // length) % channels",
            "        out[i // (length * channels), c, i % length] += bias[c]",
        ]
    return build("\n".join(lines), name, name)


def _launch(kernel: Any, n: int, *args: Any) -> None:
    if n:
        blocks, threads = launch_config(n)
        kernel[blocks, threads](*args, n)


def _lift(values: tuple, fill: int) -> tuple:
    return (fill,) * (3 - len(values)) + tuple(values)


def _as5(a: CudaArray) -> CudaArray:
    """(N, C, *spatial) -> (N, C, S0, S1, S2), contiguous, unit dims first."""
    return contiguous(a).reshape(tuple(a.shape[:2]) + _lift(tuple(a.shape[2:]), 1))


def _columns(
    x: CudaArray, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple, outs: tuple
) -> CudaArray:
    """im2col: (N, C, k0, k1, k2, o0, o1, o2)."""
    x5 = _as5(x)
    k, o = _lift(kernel, 1), _lift(outs, 1)
    cols = empty(tuple(x.shape[:2]) + k + o, x.dtype)
    _launch(
        _kernel("im2col"),
        cols.size,
        x5.kernel_array(),
        cols.kernel_array(),
        *k,
        *_lift(stride, 1),
        *_lift(padding, 0),
        *_lift(dilation, 1),
    )
    return cols


def _col2im(
    cols: CudaArray, sizes: tuple, stride: tuple, padding: tuple, dilation: tuple
) -> CudaArray:
    """The transpose of ``_columns``: (N, C, *sizes) from (N, C, k0, k1, k2, o0, o1, o2)."""
    out = empty(tuple(cols.shape[:2]) + _lift(tuple(sizes), 1), cols.dtype)
    _launch(
        _kernel("col2im"),
        out.size,
        cols.kernel_array(),
        out.kernel_array(),
        *_lift(stride, 1),
        *_lift(padding, 0),
        *_lift(dilation, 1),
    )
    return out.reshape(tuple(cols.shape[:2]) + tuple(sizes))


def _transpose_last(a: CudaArray) -> CudaArray:
    return probe_view(a, lambda p: np.swapaxes(p, -1, -2))


def _forward(x, w, stride, padding, dilation, groups, outs):  # type: ignore[no-untyped-def]
    batch, out_c = x.shape[0], w.shape[0]
    kernel = tuple(w.shape[2:])
    cols = _columns(x, kernel, stride, padding, dilation, outs)
    cols = cols.reshape((batch, groups, -1, math.prod(outs)))
    wmat = contiguous(w).reshape((groups, out_c // groups, -1))
    return matmul(wmat, cols).reshape((batch, out_c) + tuple(outs))


def _backward_input(g, w, sizes, stride, padding, dilation, groups):  # type: ignore[no-untyped-def]
    batch, out_c = g.shape[0], w.shape[0]
    kernel, outs = tuple(w.shape[2:]), tuple(g.shape[2:])
    channels = w.shape[1] * groups
    wmat = contiguous(w).reshape((groups, out_c // groups, -1))
    gmat = contiguous(g).reshape((batch, groups, out_c // groups, -1))
    cols = matmul(_transpose_last(wmat), gmat)  # (N, groups, C / groups * taps, L)
    cols = contiguous(cols).reshape((batch, channels) + _lift(kernel, 1) + _lift(outs, 1))
    return _col2im(cols, tuple(sizes), stride, padding, dilation)


def _backward_weight(g, x, kernel, stride, padding, dilation, groups):  # type: ignore[no-untyped-def]
    batch, out_c, channels = g.shape[0], g.shape[1], x.shape[1]
    outs = tuple(g.shape[2:])
    cols = _columns(x, kernel, stride, padding, dilation, outs)
    cols = cols.reshape((batch, groups, -1, math.prod(outs)))
    gmat = contiguous(g).reshape((batch, groups, out_c // groups, -1))
    parts = contiguous(matmul(gmat, _transpose_last(cols))).reshape((batch, -1))
    out = empty((parts.shape[1],), g.dtype)
    _launch(_kernel("batch_sum"), out.size, parts.kernel_array(), out.kernel_array())
    return out.reshape((out_c, channels // groups) + tuple(kernel))


def _add_bias(out: CudaArray, bias: CudaArray) -> CudaArray:
    flat = out.reshape((out.shape[0], out.shape[1], -1))
    _launch(_kernel("add_bias"), flat.size, flat.kernel_array(), contiguous(bias).kernel_array())
    return out


def convolution(x, w, *bias, stride, padding, dilation, groups, transposed, output_padding):  # type: ignore[no-untyped-def]
    """The ``convolution`` primitive on the device (see ``conv_kernels.convolution``)."""
    kernel, sizes = tuple(w.shape[2:]), tuple(x.shape[2:])
    n = len(kernel)
    if not transposed:
        outs = tuple(
            (sizes[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
            for i in range(n)
        )
        out = contiguous(_forward(x, w, stride, padding, dilation, groups, outs))
    else:
        outs = tuple(
            (sizes[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1)
            + output_padding[i] + 1
            for i in range(n)
        )  # fmt: skip
        out = _backward_input(x, w, outs, stride, padding, dilation, groups)
    return _add_bias(out, bias[0]) if bias else out


def convolution_backward_input(g, w, *, sizes, stride, padding, dilation, groups, transposed):  # type: ignore[no-untyped-def]
    if not transposed:
        return _backward_input(g, w, sizes, stride, padding, dilation, groups)
    return contiguous(_forward(g, w, stride, padding, dilation, groups, tuple(sizes)))


def convolution_backward_weight(g, x, *, kernel, stride, padding, dilation, groups, transposed):  # type: ignore[no-untyped-def]
    if not transposed:
        return _backward_weight(g, x, kernel, stride, padding, dilation, groups)
    return _backward_weight(x, g, kernel, stride, padding, dilation, groups)
