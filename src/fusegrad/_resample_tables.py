"""The per-dim source tables of the resampling primitives (``resample``, ``resample_backward``
in ``ops/resample.py``: ``F.interpolate``'s nearest and linear modes), numpy only.  Kept below
both devices: the CPU kernels (``ops/resample_kernels.py``) and the CUDA ones
(``cuda/resample.py``) read the same tables."""

from __future__ import annotations

import numpy as np


def nearest_source(n: int, out: int, scale: float | None, exact: bool) -> np.ndarray:
    """The input index each output copies, computed in float32 as PyTorch's kernels do (so that
    a product landing just below an integer floors the same way)."""
    step = np.float32(1.0 / scale if scale is not None and scale > 0 else n / out)
    j = np.arange(out, dtype=np.float32)
    src = np.floor((j + np.float32(0.5)) * step if exact else j * step).astype(np.int64)
    return np.minimum(src, n - 1)


def linear_source(n: int, out: int, scale: float | None, align_corners: bool) -> tuple:
    """(index (out, 2), weight (out, 2)): each output's two sources and weights (PyTorch's
    area_pixel_compute_source_index; at the last input both indices are the same)."""
    j = np.arange(out, dtype=np.float64)
    if align_corners:
        src = j * ((n - 1) / (out - 1) if out > 1 else 0.0)
    else:
        step = 1.0 / scale if scale is not None and scale > 0 else n / out
        src = np.maximum(step * (j + 0.5) - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    frac = src - lo
    return np.stack([lo, hi], 1), np.stack([1.0 - frac, frac], 1)


def keeps_dim(mode: str, rank: int, n: int, out: int) -> bool:
    """Whether a spatial dim whose size does not change is copied as it is, whatever the scale
    factor says: PyTorch's CPU kernels do so for every mode and rank but nearest over 1 or 3
    spatial dims (which then read input ``floor(j / scale)``, as for any size)."""
    return out == n and not (mode == "nearest" and rank in (1, 3))


def tables(in_sizes: tuple, mode: str, size: tuple, scales: tuple, align_corners: bool) -> list:
    """Per spatial dim: (index (out, 2), weight (out, 2), two corners, copies the dim)."""
    out_tables = []
    rank = len(in_sizes)
    for n, out, scale in zip(in_sizes, size, scales):
        if keeps_dim(mode, rank, n, out):
            index = np.stack([np.arange(n), np.arange(n)], 1)
            weight = np.zeros((n, 2))
            weight[:, 0] = 1.0
            out_tables.append((index, weight, False, True))
        elif mode == "linear":
            index, weight = linear_source(n, out, scale, align_corners)
            out_tables.append((index, weight, True, False))
        else:
            src = nearest_source(n, out, scale, mode == "nearest-exact")
            index = np.stack([src, src], 1)
            weight = np.zeros((out, 2))
            weight[:, 0] = 1.0
            out_tables.append((index, weight, False, False))
    return out_tables
