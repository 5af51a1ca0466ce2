"""Row sums, maxima and minima of short float rows: one numba loop over the rows.

Why: numpy reduces along a short last axis one row at a time, about 1.7 ns an element for rows
of 32 floats (57 us for the softmax of a GPT's attention scores, 8 x 4 x 32 x 32), where a loop
over the rows takes 12 us.  Along rows of a few hundred elements or more numpy's own SIMD loop is
as fast or faster, so ``_amax``/``_amin`` (``primitives._short_rows``) call this only for rows
shorter than 256 elements, in arrays of at least 1,024.  NaN propagates as numpy's: a row
holding one has NaN for its maximum and minimum.  Row sums (``_sum``) add as numpy's pairwise
summation does, in the input's dtype (eight partial sums over blocks of eight, combined in a
fixed tree, the rest in order; halves of 8k elements above 128), so they are numpy's to the bit
(24 against 13 us for the same attention scores).

This module is imported on first use only (it brings numba), never when fusegrad loads.
"""

from __future__ import annotations

import numba  # imported on first use only (by the amax/amin primitives' kernels)
import numpy as np


def _extreme_rows(largest):  # type: ignore[no-untyped-def]
    """The row maximum (``largest``) or minimum loop; ``largest`` is a constant of the
    compiled loop (numba keys its disk cache by closure values too)."""

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def rows_extreme(x, out):  # type: ignore[no-untyped-def]
        rows, n = x.shape
        for r in range(rows):
            m = x[r, 0]
            nan = m != m
            for i in range(1, n):
                v = x[r, i]
                nan |= v != v
                # of equal values the last: +0 or -0 as it comes
                if largest:
                    m = v if v >= m else m
                else:
                    m = v if v <= m else m
            out[r] = np.nan if nan else m

    return rows_extreme


_rows_max = _extreme_rows(True)
_rows_min = _extreme_rows(False)


def _pairwise_sums(zero):  # type: ignore[no-untyped-def]
    """The row-sum loop for the float type of ``zero`` (numba types the literal by it)."""

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def pairwise(a, start, n):  # type: ignore[no-untyped-def]
        if n < 8:
            res = zero
            for i in range(n):
                res += a[start + i]
            return res
        if n <= 128:
            r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
            r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
            i = start + 8
            end = start + n - n % 8
            while i < end:
                r0 += a[i]
                r1 += a[i + 1]
                r2 += a[i + 2]
                r3 += a[i + 3]
                r4 += a[i + 4]
                r5 += a[i + 5]
                r6 += a[i + 6]
                r7 += a[i + 7]
                i += 8
            res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
            while i < start + n:
                res += a[i]
                i += 1
            return res
        half = n // 2
        half -= half % 8
        return pairwise(a, start, half) + pairwise(a, start + half, n - half)

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def rows_sum(flat, n, out):  # type: ignore[no-untyped-def]
        for r in range(out.shape[0]):
            out[r] = zero + pairwise(flat, r * n, n)  # (numpy's reduction starts from 0)

    return rows_sum


_rows_sum = {
    np.dtype(np.float32): _pairwise_sums(np.float32(0.0)),
    np.dtype(np.float64): _pairwise_sums(0.0),
}


def last_axis_sum(x: np.ndarray, keepdim: bool) -> np.ndarray:
    """The sum of each row of ``x`` along its last axis, as ``np.sum`` gives it, for a
    C-contiguous float32/float64 array with at least one element per row."""
    n = x.shape[-1]
    out = np.empty(x.size // n, x.dtype)
    _rows_sum[x.dtype](x.reshape(-1), n, out)
    shape = x.shape[:-1] + (1,) if keepdim else x.shape[:-1]
    return out.reshape(shape)


def last_axis_extreme(x: np.ndarray, largest: bool, keepdim: bool) -> np.ndarray:
    """The maximum (``largest``) or minimum of each row of ``x`` along its last axis, a
    C-contiguous float32/float64 array with at least one element per row."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    out = np.empty(rows.shape[0], x.dtype)
    (_rows_max if largest else _rows_min)(rows, out)
    shape = x.shape[:-1] + (1,) if keepdim else x.shape[:-1]
    return out.reshape(shape)
