"""CUDA kernels of the embedding's primitives (``embedding``, ``embedding_backward``): the
device forms of ``ops/embedding_kernels.py`` and of the lookup.

* ``embedding``: one thread per output element copies ``weight[idx[i], d]``;
* ``embedding_backward``: one scatter-add kernel, one thread per element of the gradient,
  adding it into its row of the weight's gradient with an atomic add (as PyTorch's CUDA
  ``embedding_dense_backward`` accumulates), skipping ``padding_idx``; with
  ``scale_grad_by_freq`` each index's count in the batch is counted first (integer atomic
  adds) and every row's gradient is multiplied by the inverse count, cast to the gradient's
  dtype as the CPU kernel does.  The float atomics add in an order that may change from run to
  run, so repeated indices' sums agree with the CPU's to rounding.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .array import CudaArray, contiguous, empty
from .kernels import build, fill, launch_config

_SOURCE = """
@cuda.jit
def take(weight, idx, out, n):
    width = out.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        out[i // width, i % width] = weight[idx[i // width], i % width]


@cuda.jit
def count(idx, counts, n):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        cuda.atomic.add(counts, idx[i], 1)


@cuda.jit
def inverse(counts, scale, n):
    for r in range(cuda.grid(1), n, cuda.gridsize(1)):
        if counts[r]:
            scale[r] = 1.0 / counts[r]


@cuda.jit
def scatter(g, idx, padding, by_freq, scale, out, n):
    width = g.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        j = i // width
        d = i % width
        r = idx[j]
        if r != padding:
            if by_freq:
                cuda.atomic.add(out, (r, d), g[j, d] * scale[r])
            else:
                cuda.atomic.add(out, (r, d), g[j, d])
"""


@functools.cache
def _kernel(name: str) -> Any:
    return build(_SOURCE, name, f"embedding {name}")


def _launch(name: str, n: int, *args: Any) -> None:
    if n:
        blocks, threads = launch_config(n)
        _kernel(name)[blocks, threads](*args, n)


def embedding(weight: CudaArray, idx: CudaArray) -> CudaArray:
    """``weight[idx]``: (*idx.shape, D)."""
    width = weight.shape[1]
    flat_idx = contiguous(idx).reshape((idx.size,))
    out = empty((idx.size, width), weight.dtype)
    _launch("take", out.size, contiguous(weight).kernel_array(), flat_idx.kernel_array(),
            out.kernel_array())  # fmt: skip
    return out.reshape(tuple(idx.shape) + (width,))


def embedding_backward(
    g: CudaArray, idx: CudaArray, *, num_weights: int, padding_idx: Any, scale_grad_by_freq: bool
) -> CudaArray:
    """(num_weights, D): the weight's gradient for the gradient ``g`` (*idx.shape, D) of
    ``weight[idx]``."""
    width = g.shape[-1]
    out = empty((num_weights, width), g.dtype)
    fill(out, 0)
    flat_g = contiguous(g).reshape((idx.size, width))
    flat_idx = contiguous(idx).reshape((idx.size,))
    scale = empty((max(num_weights, 1) if scale_grad_by_freq else 1,), g.dtype)
    if scale_grad_by_freq:
        counts = empty((max(num_weights, 1),), np.int64)
        fill(counts, 0)
        _launch("count", flat_idx.size, flat_idx.kernel_array(), counts.kernel_array())
        _launch("inverse", num_weights, counts.kernel_array(), scale.kernel_array())
    padding = -1 if padding_idx is None else int(padding_idx)
    _launch("scatter", flat_g.size, flat_g.kernel_array(), flat_idx.kernel_array(), padding,
            bool(scale_grad_by_freq), scale.kernel_array(), out.kernel_array())  # fmt: skip
    return out
