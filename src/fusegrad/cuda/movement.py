"""CUDA kernels of the movement primitives that copy: ``cat``, ``pad``, ``gather``, ``scatter``,
``scatter_add``, and the opaque ``cumsum``.

``cat`` and ``pad`` are device copies into slices of the output (views computed by numpy on a
probe).  ``gather`` / ``scatter`` / ``scatter_add`` are one kernel each per rank and dtype, a
grid-stride loop over the *output*: ``scatter_add`` *pulls* — every output element sums, in
index order, the sources whose index points at it — so it needs no atomics and is
deterministic; ``scatter`` keeps the last source in index order, as numpy's assignment does on
the CPU.  ``cumsum`` scans each row sequentially (one thread per row).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .array import CudaArray, contiguous, copy_into, empty, from_probe, probe_view
from .kernels import build, fill, grid_loop, launch_config
from .kernels import index as subscript


def _slice(a: CudaArray, key: tuple) -> CudaArray:
    probe = a.probe()
    return from_probe(a, probe, probe[key])


def cat(arrays: list[CudaArray], dim: int) -> CudaArray:
    shape = list(arrays[0].shape)
    shape[dim] = sum(a.shape[dim] for a in arrays)
    dtype = np.result_type(*[a.dtype for a in arrays])
    out = empty(tuple(shape), dtype)
    start = 0
    for a in arrays:
        stop = start + a.shape[dim]
        if stop > start:
            key = (slice(None),) * dim + (slice(start, stop),)
            copy_into(_slice(out, key), a)
        start = stop
    return out


def pad(a: CudaArray, widths: tuple, value: Any) -> CudaArray:
    shape = tuple(s + lo + hi for s, (lo, hi) in zip(a.shape, widths))
    out = empty(shape, a.dtype)
    fill(out, value)
    key = tuple(slice(lo, lo + s) for s, (lo, _) in zip(a.shape, widths))
    if a.size:
        copy_into(_slice(out, key), a)
    return out


@functools.cache
def _gather_kernel(rank: int, dim: int) -> Any:
    idx = [f"i{d}" for d in range(rank)]
    src = list(idx)
    src[dim] = "j"
    body = [
        f"j = index[{subscript(rank)}]",
        "if j < 0:",
        "    j += size",
        f"out[{subscript(rank)}] = x[{', '.join(src)}]",
    ]
    source = grid_loop("def gather(x, index, out, n, size):", rank, body, "out")
    return build(source, "gather", "gather")


@functools.cache
def _scatter_kernel(rank: int, dim: int, add: bool) -> Any:
    """out[p] (a copy of x) gets the sources whose index along ``dim`` points at p[dim]."""
    idx = [f"i{d}" for d in range(rank)]
    at_j = list(idx)
    at_j[dim] = "j"
    inside = " and ".join(f"i{d} < ishape{d}" for d in range(rank) if d != dim) or "True"
    update = "acc = acc + src[{0}]" if add else "acc = src[{0}]"
    header = "\n".join(
        ["def scatter(out, index, src, n):"]
        + [f"    ishape{d} = index.shape[{d}]" for d in range(rank)]
    )
    body = [
        f"if not ({inside}):",
        "    continue",
        f"acc = out[{subscript(rank)}]",
        f"for j in range(ishape{dim}):",
        f"    k = index[{', '.join(at_j)}]",
        "    if k < 0:",
        f"        k += shape{dim}",
        f"    if k == i{dim}:",
        "        " + update.format(", ".join(at_j)),
        f"out[{subscript(rank)}] = acc",
    ]
    return build(grid_loop(header, rank, body, "out"), "scatter", "scatter")


def gather(x: CudaArray, index: CudaArray, dim: int) -> CudaArray:
    out = empty(index.shape, x.dtype)
    n = out.size
    if n:
        blocks, threads = launch_config(n)
        _gather_kernel(x.ndim, dim % max(x.ndim, 1))[blocks, threads](
            x.kernel_array(), index.kernel_array(), out.kernel_array(), n, x.shape[dim]
        )
    return out


def scatter(x: CudaArray, index: CudaArray, src: CudaArray, dim: int, add: bool) -> CudaArray:
    out = contiguous(x, force=True)
    if src.dtype != x.dtype:
        cast = empty(src.shape, x.dtype)
        copy_into(cast, src)
        src = cast
    n = out.size
    if n and index.size:
        blocks, threads = launch_config(n)
        _scatter_kernel(x.ndim, dim % max(x.ndim, 1), add)[blocks, threads](
            out.kernel_array(), index.kernel_array(), src.kernel_array(), n
        )
    return out


@functools.cache
def _cumsum_kernel(acc: str) -> Any:
    lines = [
        "def cumsum(x, out, m, r):",
        "    for row in range(cuda.grid(1), m, cuda.gridsize(1)):",
        f"        acc = np.{acc}(0)",
        "        for j in range(r):",
        "            acc += x[row, j]",
        "            out[row, j] = acc",
    ]
    return build("\n".join(lines), "cumsum", "cumsum")


def cumsum(x: CudaArray, dim: int) -> CudaArray:
    """Inclusive prefix sum along ``dim`` (integers accumulate in int64, as on the CPU)."""
    out_dtype = np.dtype(np.int64) if x.dtype.kind in "biu" else x.dtype
    if x.ndim == 0:
        out = empty((), out_dtype)
        copy_into(out, x)
        return out
    dim %= x.ndim
    perm = [d for d in range(x.ndim) if d != dim] + [dim]
    rows2d = contiguous(probe_view(x, lambda p: np.transpose(p, perm)))
    r = x.shape[dim]
    m = rows2d.size // r if r else 0
    out = empty(rows2d.shape, out_dtype)
    if m and r:
        blocks, threads = launch_config(m)
        _cumsum_kernel(out_dtype.name)[blocks, threads](
            rows2d.reshape((m, r)).kernel_array(), out.reshape((m, r)).kernel_array(), m, r
        )
    inverse = list(np.argsort(perm))
    return contiguous(probe_view(out, lambda p: np.transpose(p, inverse)))
