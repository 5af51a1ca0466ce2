"""Deterministic reductions on CUDA for eager execution: ``prod``, ``amax``, ``amin``,
``argmax``, ``argmin``, ``all``, ``any`` — the reductions the lowering table keeps as externs
(``sum`` and ``sum_to`` come from the compiler's CUDA emitter, see ``generated``).

The reduced dims are moved last (a view) and made contiguous, giving rows of ``R`` elements, one
row per output element.  Long rows (``R > 32``) are reduced by one thread block each: every
thread folds a fixed strided subset, then a shared-memory tree combines the partials in a fixed
order; short rows by one thread each, sequentially.  Either way the order of operations does
not depend on scheduling, so results are bitwise reproducible (no atomics).  float32 products
accumulate in float64.  NaN propagates through
``amax``/``amin``; ``argmax``/``argmin`` return the first extreme (a NaN counts as the extreme),
as numpy and PyTorch do.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .array import CudaArray, contiguous, empty, probe_view
from .kernels import build, fill, launch_config

THREADS = 128
SHORT_ROW = 32


def _acc_dtype(name: str, dtype: np.dtype) -> np.dtype:
    if name in ("all", "any"):
        return np.dtype(np.bool_)
    if name == "prod":
        return np.dtype(np.int64) if dtype.kind in "biu" else np.dtype(np.float64)
    return dtype


def _out_dtype(name: str, dtype: np.dtype) -> np.dtype:
    if name in ("argmax", "argmin"):
        return np.dtype(np.int64)
    if name in ("all", "any"):
        return np.dtype(np.bool_)
    if name == "prod":
        return np.dtype(np.int64) if dtype.kind in "biu" else dtype
    return dtype


def _extreme_init(name: str, dtype: np.dtype) -> str:
    if dtype.kind == "f":
        return "-math.inf" if name == "amax" else "math.inf"
    if dtype.kind == "b":
        return "False" if name == "amax" else "True"
    info = np.iinfo(dtype)
    return str(info.min if name == "amax" else info.max)


def _nb(dtype: np.dtype) -> str:
    """numba's type name for a numpy dtype."""
    return "boolean" if dtype == np.bool_ else dtype.name


def _source(name: str, dtype: np.dtype) -> str:
    """Source of ``combine`` (device function), ``rows_block`` and ``rows_thread`` kernels."""
    acc = _acc_dtype(name, dtype)
    arg = name in ("argmax", "argmin")
    better = ">" if name in ("amax", "argmax") else "<"
    combine, init, load = "", "0", ""
    if name == "prod":
        combine, init, load = "a * b", "1", f"np.{acc.name}(x[row, j])"
    elif name in ("all", "any"):
        op = "and" if name == "all" else "or"
        combine, load = f"a {op} b", "x[row, j] != 0"
        init = "True" if name == "all" else "False"
    elif not arg:  # amax / amin: NaN wins, then the extreme
        combine = f"a if a != a else (b if b != b else (a if a {better}= b else b))"
        init, load = _extreme_init(name, dtype), "x[row, j]"
    start = init if acc == np.bool_ else f"np.{acc.name}({init})"
    lines = ["from numba import types", ""]  # cuda, np and math come from kernels.build
    if arg:
        lines += [
            '@cuda.jit(device=True, inline="always")',
            "def take_b(av, ai, bv, bi):",
            "    if bi < 0:",
            "        return False",
            "    if ai < 0:",
            "        return True",
            "    if av != av:",
            "        return bv != bv and bi < ai",
            "    if bv != bv:",
            "        return True",
            f"    return bv {better} av or (bv == av and bi < ai)",
            "",
            "@cuda.jit",
            "def rows_block(x, out, m, r):",
            "    t = cuda.threadIdx.x",
            f"    sv = cuda.shared.array({THREADS}, types.{_nb(acc)})",
            f"    si = cuda.shared.array({THREADS}, types.int64)",
            "    for row in range(cuda.blockIdx.x, m, cuda.gridDim.x):",
            "        av = x[row, 0]",
            "        ai = -1",
            f"        for j in range(t, r, {THREADS}):",
            "            if take_b(av, ai, x[row, j], j):",
            "                av = x[row, j]",
            "                ai = j",
            "        sv[t] = av",
            "        si[t] = ai",
            "        cuda.syncthreads()",
            f"        s = {THREADS // 2}",
            "        while s > 0:",
            "            if t < s and take_b(sv[t], si[t], sv[t + s], si[t + s]):",
            "                sv[t] = sv[t + s]",
            "                si[t] = si[t + s]",
            "            cuda.syncthreads()",
            "            s //= 2",
            "        if t == 0:",
            "            out[row] = si[0]",
            "        cuda.syncthreads()",
            "",
            "@cuda.jit",
            "def rows_thread(x, out, m, r):",
            "    for row in range(cuda.grid(1), m, cuda.gridsize(1)):",
            "        av = x[row, 0]",
            "        ai = -1",
            "        for j in range(r):",
            "            if take_b(av, ai, x[row, j], j):",
            "                av = x[row, j]",
            "                ai = j",
            "        out[row] = ai",
        ]
        return "\n".join(lines)
    lines += [
        '@cuda.jit(device=True, inline="always")',
        "def combine(a, b):",
        f"    return {combine}",
        "",
        "@cuda.jit",
        "def rows_block(x, out, m, r):",
        "    t = cuda.threadIdx.x",
        f"    sv = cuda.shared.array({THREADS}, types.{_nb(acc)})",
        "    for row in range(cuda.blockIdx.x, m, cuda.gridDim.x):",
        f"        acc = {start}",
        f"        for j in range(t, r, {THREADS}):",
        f"            acc = combine(acc, {load})",
        "        sv[t] = acc",
        "        cuda.syncthreads()",
        f"        s = {THREADS // 2}",
        "        while s > 0:",
        "            if t < s:",
        "                sv[t] = combine(sv[t], sv[t + s])",
        "            cuda.syncthreads()",
        "            s //= 2",
        "        if t == 0:",
        "            out[row] = sv[0]",
        "        cuda.syncthreads()",
        "",
        "@cuda.jit",
        "def rows_thread(x, out, m, r):",
        "    for row in range(cuda.grid(1), m, cuda.gridsize(1)):",
        f"        acc = {start}",
        "        for j in range(r):",
        f"            acc = combine(acc, {load})",
        "        out[row] = acc",
    ]
    return "\n".join(lines)


@functools.cache
def _kernels(name: str, dtype: np.dtype) -> tuple[Any, Any]:
    source, label = _source(name, dtype), f"reduce {name} {dtype}"
    return build(source, "rows_block", label), build(source, "rows_thread", label)


def _axes(name: str, a: CudaArray, attrs: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(reduced axes, output shape)."""
    dim, keepdim = attrs["dim"], attrs["keepdim"]
    if dim is None:
        axes = tuple(range(a.ndim))
    else:
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        axes = tuple(sorted({int(d) % max(a.ndim, 1) for d in dims})) if a.ndim else ()
    if keepdim:
        out_shape = tuple(1 if d in axes else s for d, s in enumerate(a.shape))
    else:
        out_shape = tuple(s for d, s in enumerate(a.shape) if d not in axes)
    return axes, out_shape


def run(name: str, a: CudaArray, attrs: dict) -> CudaArray:
    axes, out_shape = _axes(name, a, attrs)
    kept = [d for d in range(a.ndim) if d not in axes]
    rows = int(np.prod([a.shape[d] for d in kept])) if kept else 1
    r = int(np.prod([a.shape[d] for d in axes])) if axes else 1
    if r == 0 and name in ("amax", "amin", "argmax", "argmin"):
        raise RuntimeError(
            f"{name}(): Expected reduction dim to be specified for input.numel() == 0 "
            f"(input shape {a.shape}); cannot reduce over a zero-size dimension"
        )
    perm = kept + list(axes)
    src = a if perm == list(range(a.ndim)) else probe_view(a, lambda p: np.transpose(p, perm))
    rows2d = contiguous(src).reshape((rows, r))
    out = empty((rows,), _out_dtype(name, a.dtype))
    if rows == 0:
        return out.reshape(out_shape)
    if r == 0:
        fill(out, 0 if name == "any" else 1)
        return out.reshape(out_shape)
    block_kernel, thread_kernel = _kernels(name, a.dtype)
    x, o = rows2d.kernel_array(), out.kernel_array()
    if r > SHORT_ROW:
        blocks = min(rows, 65535)
        block_kernel[blocks, THREADS](x, o, rows, r)
    else:
        blocks, threads = launch_config(rows)
        thread_kernel[blocks, threads](x, o, rows, r)
    return out.reshape(out_shape)
