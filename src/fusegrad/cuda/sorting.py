"""CUDA kernel of the ``argsort`` primitive (sort, topk, kthvalue and median's indices).

One thread per element computes its rank in its row: the number of elements that sort before
it (smaller, or larger when descending; NaN counts as larger than every number, as on the CPU;
an equal element sorts before it when it comes first, so the order is stable), and writes its
index at that rank when the rank is below ``k``.  That is O(n) work per element, no
synchronisation and no scratch memory: fine for the rows these ops see (a vocabulary of logits
is a few ten thousand wide).  Ties of a partial ``topk`` keep their original order here; the
CPU's partial sort may order them differently (PyTorch leaves it unspecified).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .array import CudaArray, contiguous, empty, probe_view
from .kernels import build, launch_config


@functools.cache
def _rank_kernel(descending: bool) -> Any:
    before = "(b_nan and not a_nan) or b > a" if descending else "(a_nan and not b_nan) or b < a"
    lines = [
        "def argsort(x, out, m, r, k):",
        "    for t in range(cuda.grid(1), m * r, cuda.gridsize(1)):",
        "        row = t // r",
        "        i = t - row * r",
        "        a = x[row, i]",
        "        a_nan = a != a",
        "        rank = 0",
        "        for j in range(r):",
        "            b = x[row, j]",
        "            b_nan = b != b",
        f"            if {before}:",
        "                rank += 1",
        "            elif j < i and ((a_nan and b_nan) or a == b):",
        "                rank += 1",
        "        if rank < k:",
        "            out[row, rank] = i",
    ]
    return build("\n".join(lines), "argsort", "argsort")


def argsort(x: CudaArray, dim: int, descending: bool, k: int | None) -> CudaArray:
    """The positions that sort ``x`` along ``dim`` (the first ``k`` of them), int64."""
    dim %= max(x.ndim, 1)
    perm = [d for d in range(x.ndim) if d != dim] + [dim]
    rows = contiguous(probe_view(x, lambda p: np.transpose(p, perm)))
    r = x.shape[dim]
    keep = r if k is None else min(k, r)
    m = rows.size // r if r else 0
    out = empty(rows.shape[:-1] + (keep,), np.dtype(np.int64))
    if m and keep:
        blocks, threads = launch_config(m * r)
        _rank_kernel(bool(descending))[blocks, threads](
            rows.reshape((m, r)).kernel_array(), out.reshape((m, keep)).kernel_array(), m, r, keep
        )
    inverse = list(np.argsort(perm))
    return contiguous(probe_view(out, lambda p: np.transpose(p, inverse)))
