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

from .._numba_cache import fast_load, fast_loading


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

    return fast_load(rows_extreme)


_rows_max = _extreme_rows(True)
_rows_min = _extreme_rows(False)


# the deepest split of ``_pairwise``' tree (rows of up to 2**64 elements)
_DEPTH = 64


# numpy's pairwise summation is recursive: a block of up to 128 elements is summed with eight
# partial sums, a longer one split in halves (the first a multiple of 8) whose sums are added.
# ``_pairwise`` walks the same tree with an explicit stack (the additions in the same order, so
# the same bits).  The loops are module-level functions of the zero they start from (its type
# is the rows' float type): numba keys its disk cache by a closure's variables, and a closure
# over another compiled function (and a self-recursive one) was compiled again in every
# process, 1.4 s at the first softmax.


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _block(a, start, n, zero):  # type: ignore[no-untyped-def]
    """The sum of ``a[start:start + n]``, ``n <= 128``, as numpy's pairwise sum's leaf."""
    if n < 8:
        res = zero
        for i in range(n):
            res += a[start + i]
        return res
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


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _pairwise(a, start, n, zero, starts, sizes, states, lefts):  # type: ignore[no-untyped-def]
    """The tree's sum: ``starts``/``sizes``/``states`` hold the path from the root to the node
    being summed (state 0: not split yet; 1: its left half being summed; 2: its right half,
    the left's sum in ``lefts``)."""
    top = 0
    starts[0], sizes[0], states[0] = start, n, 0
    while True:
        m = sizes[top]
        if m > 128:  # split: the left half first
            half = m // 2
            half -= half % 8
            states[top] = 1
            top += 1
            starts[top], sizes[top], states[top] = starts[top - 1], half, 0
            continue
        res = _block(a, starts[top], m, zero)
        top -= 1
        while top >= 0:  # hand the sum up the path
            if states[top] == 1:  # a left half: its right half next
                half = sizes[top] // 2
                half -= half % 8
                lefts[top] = res
                states[top] = 2
                top += 1
                starts[top] = starts[top - 1] + half
                sizes[top] = sizes[top - 1] - half
                states[top] = 0
                break
            res = lefts[top] + res
            top -= 1
        if top < 0:
            return res


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _rows_sum(flat, n, out, zero):  # type: ignore[no-untyped-def]
    """``out[r]``: the pairwise sum of row ``r`` of ``flat`` (rows of ``n``)."""
    starts = np.empty(_DEPTH, np.int64)
    sizes = np.empty(_DEPTH, np.int64)
    states = np.empty(_DEPTH, np.int64)
    lefts = np.empty(_DEPTH, flat.dtype)
    for r in range(out.shape[0]):
        # (numpy's reduction starts from 0)
        out[r] = zero + _pairwise(flat, r * n, n, zero, starts, sizes, states, lefts)


_ZERO = {np.dtype(np.float32): np.float32(0.0), np.dtype(np.float64): np.float64(0.0)}


def last_axis_sum(x: np.ndarray, keepdim: bool) -> np.ndarray:
    """The sum of each row of ``x`` along its last axis, as ``np.sum`` gives it, for a
    C-contiguous float32/float64 array with at least one element per row."""
    n = x.shape[-1]
    out = np.empty(x.size // n, x.dtype)
    _rows_sum(x.reshape(-1), n, out, _ZERO[x.dtype])
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


fast_loading(globals())  # (loaded from the disk cache without numba's start-up work)
