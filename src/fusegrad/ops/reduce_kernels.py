"""Row maxima and minima of short float rows: one numba loop per row.

Why: numpy reduces along a short last axis one row at a time, about 1.7 ns an element for rows
of 32 floats (57 us for the softmax of a GPT's attention scores, 8 x 4 x 32 x 32), where a loop
over the rows takes 12 us.  Along rows of a few hundred elements or more numpy's own SIMD loop is
as fast or faster, so ``_amax``/``_amin`` (``primitives._short_rows``) call this only for rows
shorter than 256 elements, in arrays of at least 1,024.  NaN propagates as numpy's: a row
holding one has NaN for its maximum and minimum.

This module is imported on first use only (it brings numba), never when fusegrad loads.
"""

from __future__ import annotations

import numba  # imported on first use only (by the amax/amin primitives' kernels)
import numpy as np


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _rows_max(x, out):  # type: ignore[no-untyped-def]
    rows, n = x.shape
    for r in range(rows):
        m = x[r, 0]
        nan = m != m
        for i in range(1, n):
            v = x[r, i]
            nan |= v != v
            m = v if v >= m else m  # (of equal values the last: +0 or -0 as it comes)
        out[r] = np.nan if nan else m


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _rows_min(x, out):  # type: ignore[no-untyped-def]
    rows, n = x.shape
    for r in range(rows):
        m = x[r, 0]
        nan = m != m
        for i in range(1, n):
            v = x[r, i]
            nan |= v != v
            m = v if v <= m else m
        out[r] = np.nan if nan else m


def last_axis_extreme(x: np.ndarray, largest: bool, keepdim: bool) -> np.ndarray:
    """The maximum (``largest``) or minimum of each row of ``x`` along its last axis, a
    C-contiguous float32/float64 array with at least one element per row."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    out = np.empty(rows.shape[0], x.dtype)
    (_rows_max if largest else _rows_min)(rows, out)
    shape = x.shape[:-1] + (1,) if keepdim else x.shape[:-1]
    return out.reshape(shape)
