"""The fused CPU kernel of the embedding's backward (the ``embedding_backward`` primitive of
``ops/indexing.py``): one pass that adds each looked-up row's gradient into its row of the
weight's gradient, skipping ``padding_idx`` and scaling by the inverse of each index's count
in the batch when ``scale_grad_by_freq`` (PyTorch's ``embedding_dense_backward``).  Rows are
added in the order of the indices, on one thread; the inner loop over the embedding dimension
is contiguous and vectorises.  Compiled on first use with ``cache=True``; this module (and
numba with it) is imported by the primitive's kernel on its first call, never when fusegrad
is imported.
"""

from __future__ import annotations

import numba  # this module is imported on first use only (by the embedding primitives' kernels)
import numpy as np

from .._numba_cache import fast_loading


@numba.njit(cache=True, fastmath={"contract"}, error_model="numpy")
def _scatter_rows(g, idx, padding, by_freq, out):  # type: ignore[no-untyped-def]
    rows, width = g.shape
    counts = np.zeros(out.shape[0] if by_freq else 0, np.int64)
    if by_freq:
        for i in range(rows):
            counts[idx[i]] += 1
    for i in range(rows):
        r = idx[i]
        if r == padding:
            continue
        target, source = out[r], g[i]
        if by_freq:
            scale = g.dtype.type(1.0 / counts[r])
            for d in range(width):
                target[d] += source[d] * scale
        else:
            for d in range(width):
                target[d] += source[d]


def embedding_backward(
    g: np.ndarray, idx: np.ndarray, num_weights: int, padding_idx: int | None, by_freq: bool
) -> np.ndarray:
    """(num_weights, D): the weight's gradient for the gradient ``g`` (*idx.shape, D) of
    ``weight[idx]``."""
    width = g.shape[-1]
    out = np.zeros((num_weights, width), g.dtype)
    flat_g = np.ascontiguousarray(g).reshape(-1, width)
    flat_idx = np.ascontiguousarray(idx).reshape(-1)
    padding = -1 if padding_idx is None else int(padding_idx)
    _scatter_rows(flat_g, flat_idx, padding, bool(by_freq), out)
    return out


fast_loading(globals())  # (loaded from the disk cache without numba's start-up work)
