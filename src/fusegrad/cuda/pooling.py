"""CUDA kernels of the pooling primitives (``avg_pool``, ``avg_pool_backward``, ``pool_index``,
``pool_take``, ``pool_scatter``): the device forms of ``ops/pool_kernels.py``, on the same
canonical layout ((planes, S0, S1, S2), a plane one (sample, channel)) and the same window
tables (``_pool_windows.window_tables``: per dim the first and past-the-last input position of each
output's window, clipped, and a step), computed on the host and uploaded.

One thread per output (a grid-stride loop): ``pool_index`` walks its window in PyTorch's CPU
order (a value replaces the running maximum when larger or NaN); ``avg_pool`` sums it in
float64 and divides by the output's divisor; ``pool_take`` reads its plane at its index.  The
two transposes add into the input with atomic adds (as PyTorch's CUDA max pooling backward
does): ``pool_scatter`` one element per output, ``avg_pool_backward`` the share of each window
position, so their float sums may be ordered differently from run to run.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .._pool_windows import window_divisor, window_tables
from .array import CudaArray, contiguous, empty, to_device
from .kernels import build, fill, launch_config

_UNRAVEL = [
    "        rem = i",
    "        c = rem % o2",
    "        rem //= o2",
    "        b = rem % o1",
    "        rem //= o1",
    "        a = rem % o0",
    "        p = rem // o0",
]


@functools.cache
def _kernel(name: str) -> Any:
    head = {
        "pool_index": "def pool_index(x, lo0, hi0, lo1, hi1, lo2, hi2, st0, st1, st2, out, n):",
        "avg_pool": "def avg_pool(x, lo0, hi0, lo1, hi1, lo2, hi2, divisor, out, n):",
        "avg_pool_backward": (
            "def avg_pool_backward(g, lo0, hi0, lo1, hi1, lo2, hi2, divisor, gx, n):"
        ),
    }[name]
    shaped = "g" if name == "avg_pool_backward" else "out"
    lines = [
        head,
        f"    o0 = {shaped}.shape[1]",
        f"    o1 = {shaped}.shape[2]",
        f"    o2 = {shaped}.shape[3]",
        "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):",
        *_UNRAVEL,
    ]
    if name == "pool_index":
        lines += [
            "        s1 = x.shape[2]",
            "        s2 = x.shape[3]",
            "        best = x[p, lo0[a], lo1[b], lo2[c]]",
            "        at = (lo0[a] * s1 + lo1[b]) * s2 + lo2[c]",
            "        z = lo0[a]",
            "        while z < hi0[a]:",
            "            y = lo1[b]",
            "            while y < hi1[b]:",
            "                w = lo2[c]",
            "                while w < hi2[c]:",
            "                    v = x[p, z, y, w]",
            "                    if v > best or v != v:",
            "                        best = v",
            "                        at = (z * s1 + y) * s2 + w",
            "                    w += st2",
            "                y += st1",
            "            z += st0",
            "        out[p, a, b, c] = at",
        ]
    elif name == "avg_pool":
        lines += [
            "        total = 0.0",
            "        for z in range(lo0[a], hi0[a]):",
            "            for y in range(lo1[b], hi1[b]):",
            "                for w in range(lo2[c], hi2[c]):",
            "                    total += x[p, z, y, w]",
            "        out[p, a, b, c] = total / divisor[a, b, c]",
        ]
    else:
        lines += [
            "        share = g[p, a, b, c] / divisor[a, b, c]",
            "        for z in range(lo0[a], hi0[a]):",
            "            for y in range(lo1[b], hi1[b]):",
            "                for w in range(lo2[c], hi2[c]):",
            "                    cuda.atomic.add(gx, (p, z, y, w), share)",
        ]
    return build("\n".join(lines), name, name)


@functools.cache
def _flat_kernel(name: str) -> Any:
    if name == "take":
        lines = [
            "def take(x, index, out, n):",
            "    m = index.shape[1]",
            "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):",
            "        out[i // m, i % m] = x[i // m, index[i // m, i % m]]",
        ]
    else:
        lines = [
            "def scatter(g, index, out, n):",
            "    m = index.shape[1]",
            "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):",
            "        cuda.atomic.add(out, (i // m, index[i // m, i % m]), g[i // m, i % m])",
        ]
    return build("\n".join(lines), name, name)


def _launch(kernel: Any, n: int, *args: Any) -> None:
    if n:
        blocks, threads = launch_config(n)
        kernel[blocks, threads](*args, n)


def _planes(x: CudaArray) -> CudaArray:
    """(N, C, *spatial) -> (N C, S0, S1, S2), contiguous, unit dims first."""
    n = x.ndim - 2
    return contiguous(x).reshape((-1,) + (1,) * (3 - n) + tuple(x.shape[2:]))


def _device_tables(window: tuple, sizes: tuple) -> tuple[list, list, list, CudaArray]:
    """The window tables on the device, the steps, and the divisors."""
    los, his, steps = window_tables(window, sizes)
    lift = 3 - len(sizes)
    lo = [np.zeros(1, np.int64)] * lift + los
    hi = [np.ones(1, np.int64)] * lift + his
    divisor = to_device(window_divisor(window, sizes, los, his))
    return [to_device(a) for a in lo], [to_device(a) for a in hi], [1] * lift + steps, divisor


def _outs(lo: list, n: int) -> tuple:
    return tuple(int(t.shape[0]) for t in lo[3 - n :])


def pool_index(x: CudaArray, window: tuple) -> CudaArray:
    sizes = tuple(x.shape[2:])
    lo, hi, steps, _ = _device_tables(window, sizes)
    outs = _outs(lo, len(sizes))
    planes = _planes(x)
    out = empty((planes.shape[0],) + (1,) * (3 - len(sizes)) + outs, np.int64)
    args = [planes.kernel_array()]
    for d in range(3):
        args += [lo[d].kernel_array(), hi[d].kernel_array()]
    _launch(_kernel("pool_index"), out.size, *args, *steps, out.kernel_array())
    return out.reshape(tuple(x.shape[:2]) + outs)


def avg_pool(x: CudaArray, window: tuple) -> CudaArray:
    sizes = tuple(x.shape[2:])
    lo, hi, _, divisor = _device_tables(window, sizes)
    outs = _outs(lo, len(sizes))
    planes = _planes(x)
    out = empty((planes.shape[0],) + (1,) * (3 - len(sizes)) + outs, x.dtype)
    args = [planes.kernel_array()]
    for d in range(3):
        args += [lo[d].kernel_array(), hi[d].kernel_array()]
    _launch(_kernel("avg_pool"), out.size, *args, divisor.kernel_array(), out.kernel_array())
    return out.reshape(tuple(x.shape[:2]) + outs)


def avg_pool_backward(g: CudaArray, window: tuple, sizes: tuple) -> CudaArray:
    lo, hi, _, divisor = _device_tables(window, tuple(sizes))
    lift = (1,) * (3 - len(sizes))
    grads = contiguous(g).reshape((-1,) + lift + tuple(g.shape[2:]))
    gx = empty((grads.shape[0],) + lift + tuple(sizes), g.dtype)
    fill(gx, 0)
    args = [grads.kernel_array()]
    for d in range(3):
        args += [lo[d].kernel_array(), hi[d].kernel_array()]
    _launch(
        _kernel("avg_pool_backward"), grads.size, *args, divisor.kernel_array(), gx.kernel_array()
    )
    return gx.reshape(tuple(g.shape[:2]) + tuple(sizes))


def pool_take(x: CudaArray, index: CudaArray) -> CudaArray:
    planes = x.shape[0] * x.shape[1]
    flat_index = contiguous(index).reshape((planes, -1))
    out = empty(flat_index.shape, x.dtype)
    _launch(
        _flat_kernel("take"),
        out.size,
        contiguous(x).reshape((planes, -1)).kernel_array(),
        flat_index.kernel_array(),
        out.kernel_array(),
    )
    return out.reshape(tuple(index.shape))


def pool_scatter(g: CudaArray, index: CudaArray, sizes: tuple) -> CudaArray:
    planes = g.shape[0] * g.shape[1]
    flat_index = contiguous(index).reshape((planes, -1))
    out = empty((planes, int(np.prod(sizes))), g.dtype)
    fill(out, 0)
    _launch(
        _flat_kernel("scatter"),
        flat_index.size,
        contiguous(g).reshape((planes, -1)).kernel_array(),
        flat_index.kernel_array(),
        out.kernel_array(),
    )
    return out.reshape(tuple(g.shape[:2]) + tuple(sizes))
