"""Advanced indexing on CUDA: ``getitem`` with index tensors, ``index_put`` and
``index_add_at`` (the backward of advanced indexing, duplicates accumulate).

numpy semantics (broadcast index arrays, the placement of advanced dims, boolean masks) are
computed by numpy itself on the *host*, from the index arrays alone: indexing
``np.broadcast_to(np.arange(n_d), shape)`` (a zero-stride view of a tiny array) with the key gives
the ``d``-th coordinate of every selected element, and the coordinates with the strides give
each element's position in the device buffer.  Only index arrays and these positions cross the
bus (index tensors on the GPU are copied to the host; PyTorch accepts host index tensors for
device data, and so does this); the data stays on the device, moved by one kernel per op:

* ``getitem``: a gather, ``out[i] = buffer[position[i]]``;
* ``index_put``: a copy of ``x``, then a scatter of the values; where indices repeat, the last
  write in C order wins (numpy's rule), resolved on the host before the launch;
* ``index_add_at``: zeros, then one thread per distinct target summing its sources in C order
  (positions sorted stably on the host): deterministic, no atomics.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .array import CudaArray, contiguous, copy_into, empty, probe_view, to_device
from .kernels import build, fill, launch_config


def host_index(a: Any) -> np.ndarray:
    return a.to_host() if type(a) is CudaArray else np.asarray(a)


def positions(shape: tuple, strides: tuple, offset: int, itemsize: int, key: tuple) -> np.ndarray:
    """Element positions (in units of ``itemsize`` from the buffer start) of ``array[key]``
    for an array of this geometry: an int64 array of the result's shape."""
    total = np.full((), offset // itemsize, np.int64)
    for d, (n, st) in enumerate(zip(shape, strides)):
        ar = np.arange(n, dtype=np.int64).reshape((n,) + (1,) * (len(shape) - d - 1))
        coord = np.broadcast_to(ar, shape)[key]
        total = total + coord * (st // itemsize)
    return np.ascontiguousarray(total, dtype=np.int64)


@functools.cache
def _kernels() -> dict[str, Any]:
    gather = """
def gather(buf, pos, out, n):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        out[i] = buf[pos[i]]
"""
    scatter = """
def scatter(buf, tgt, src_pos, vals, n):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        buf[tgt[i]] = vals[src_pos[i]]
"""
    segments = """
def segments(buf, tgt, starts, order, vals, n):
    for u in range(cuda.grid(1), n, cuda.gridsize(1)):
        acc = buf[tgt[u]]
        for k in range(starts[u], starts[u + 1]):
            acc += vals[order[k]]
        buf[tgt[u]] = acc
"""
    return {
        "gather": build(gather, "gather", "gather"),
        "scatter": build(scatter, "scatter", "scatter"),
        "segments": build(segments, "segments", "segments"),
    }


def _launch(name: str, n: int, *args: Any) -> None:
    if n:
        blocks, threads = launch_config(n)
        _kernels()[name][blocks, threads](*args, n)


def _flat(a: CudaArray) -> Any:
    """A 1-D device array over ``a``'s whole buffer (positions index into it)."""
    return a.buffer


def getitem(x: CudaArray, key: tuple) -> CudaArray:
    pos = positions(x.shape, x.strides, x.offset, x.itemsize, key)
    out = empty(pos.shape, x.dtype)
    if pos.size:
        _launch(
            "gather",
            pos.size,
            _flat(x),
            to_device(pos.reshape(-1)).buffer,
            out.reshape((out.size,)).kernel_array(),
        )
    return out


def index_put(x: CudaArray, v: CudaArray, key: tuple) -> CudaArray:
    out = contiguous(x, force=True)
    pos = positions(out.shape, out.strides, 0, out.itemsize, key)
    tgt, target_shape = pos.reshape(-1), pos.shape
    if not tgt.size:
        return out
    vals = empty((tgt.size,), x.dtype)
    copy_into(vals.reshape(target_shape), probe_view(v, lambda p: np.broadcast_to(p, target_shape)))
    # last write wins: keep the last occurrence of every target (C order)
    rev_unique, rev_first = np.unique(tgt[::-1], return_index=True)
    src_pos = (tgt.size - 1 - rev_first).astype(np.int64)
    _launch(
        "scatter",
        len(rev_unique),
        out.buffer,
        to_device(rev_unique.astype(np.int64)).buffer,
        to_device(src_pos).buffer,
        vals.buffer,
    )
    return out


def index_add_at(g: CudaArray, key: tuple, shape: tuple) -> CudaArray:
    out = empty(tuple(shape), g.dtype)
    fill(out, 0)
    tgt = positions(out.shape, out.strides, 0, out.itemsize, key)
    if not tgt.size:
        return out
    vals = contiguous(probe_view(g, lambda p: np.broadcast_to(p, tgt.shape)))
    flat_tgt = tgt.reshape(-1)
    order = np.argsort(flat_tgt, kind="stable").astype(np.int64)
    uniq, starts = np.unique(flat_tgt[order], return_index=True)
    bounds = np.append(starts, flat_tgt.size).astype(np.int64)
    _launch(
        "segments",
        len(uniq),
        out.buffer,
        to_device(uniq.astype(np.int64)).buffer,
        to_device(bounds).buffer,
        to_device(order).buffer,
        vals.reshape((vals.size,)).kernel_array(),
    )
    return out
