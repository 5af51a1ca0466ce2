"""Searching and counting op surface: searchsorted, bucketize, histc, nonzero, argwhere, unique.

None of these is differentiable (PyTorch's are not either).  ``searchsorted`` (and
``bucketize``, the same search with the arguments swapped) and ``histc`` have output shapes
fixed by their arguments: each is one opaque primitive, so compiled programs call it as an
extern between fused loops.  ``nonzero``/``argwhere``/``unique`` have output shapes that depend
on the values: they read the input on the host (inside a compiled step that is a host read,
which the tracer is told of, and the step runs eagerly there) and return new leaves.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import storage as _storage
from ..autograd.tracer import notify_host_read as _read
from ..autograd.tracer import state as _tracer_state
from ..errors import DTypeError, FusegradError, ShapeError, describe
from ..tensor import Tensor
from ._util import P, apply, cast, to_tensor, wrap_dim
from .creation import _leaf
from .primitives import HistcRangeError  # noqa: F401  (re-exported: histc's range error)


class SearchSortedError(ShapeError, RuntimeError):
    """Bad arguments of ``searchsorted``/``bucketize`` (shapes, ``side``): RuntimeErrors in
    PyTorch."""


class HistcError(FusegradError, RuntimeError):
    """Bad arguments of ``histc`` (bins, range): RuntimeErrors in PyTorch."""


class HistcDTypeError(DTypeError, NotImplementedError):
    """``histc`` of an integer or bool tensor (PyTorch: NotImplementedError, "not implemented
    for 'Long'")."""


def _side(op: str, right: bool, side: str | None) -> bool:
    """``right`` as the search uses it, from ``right=`` and ``side=`` (which must agree)."""
    if side is None:
        return bool(right)
    if side not in ("left", "right"):
        raise SearchSortedError(f"{op}: side can only be 'left' or 'right' but got {side}")
    if right and side == "left":
        raise SearchSortedError(
            f"{op}: side and right can't be set to opposites, got side of left while right was True"
        )
    return side == "right"


def searchsorted(
    sorted_sequence: Any,
    input: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Any = None,
) -> Tensor:
    """Where each value of ``input`` would be inserted into the innermost dimension of
    ``sorted_sequence`` to keep it sorted: the first position whose element is ``>= v``
    (``right=True`` or ``side="right"``: ``> v``).  A 1-D ``sorted_sequence`` serves every
    value; otherwise its leading dimensions match ``input``'s and each row is searched by the
    same row of ``input``.  ``sorter`` holds the indices that sort an unsorted sequence (the
    positions returned are in the sorted order, as PyTorch's).  int64 (``out_int32``: int32)."""
    op = "torch.searchsorted()"
    seq = to_tensor(sorted_sequence)
    values = to_tensor(input)
    use_right = _side(op, right, side)
    if seq.ndim == 0:
        raise SearchSortedError(
            f"{op}: boundaries tensor should have positive dimension, but got 0 dimension"
        )
    scalar = values.ndim == 0
    if seq.ndim > 1 and (scalar or tuple(seq.shape[:-1]) != tuple(values.shape[:-1])):
        raise SearchSortedError(
            f"{op}: boundaries tensor should be 1 dimension or the first N-1 dimensions of "
            "boundaries tensor and input value tensor must match, but we got boundaries tensor "
            f"{list(seq.shape)} and input value tensor {list(values.shape)}"
        )
    if sorter is not None:
        order = to_tensor(sorter)
        if tuple(order.shape) != tuple(seq.shape):
            raise SearchSortedError(
                f"{op}: boundary and sorter must have the same size, but got boundary tensor "
                f"{list(seq.shape)} and got sorter tensor {list(order.shape)}"
            )
        if order._dtype is not _dt.int64:
            raise SearchSortedError(
                f"{op}: sorter must be a tensor of long dtype, got {describe(order)}"
            )
        seq = apply(P["gather"], (seq, order), {"dim": seq.ndim - 1})
    common = _dt.result_type(seq, values)
    seq, values = cast(seq, common), cast(values, common)
    flat = values.reshape((1,)) if scalar else values
    out = apply(P["searchsorted"], (seq, flat), {"right": use_right, "out_int32": bool(out_int32)})
    return out.reshape(()) if scalar else out


def bucketize(
    input: Any, boundaries: Any, *, out_int32: bool = False, right: bool = False
) -> Tensor:
    """The bucket of each element of ``input`` among the 1-D ascending ``boundaries``:
    ``i`` with ``boundaries[i-1] < x <= boundaries[i]`` (``right=True``:
    ``boundaries[i-1] <= x < boundaries[i]``) -- ``searchsorted(boundaries, input)``."""
    b = to_tensor(boundaries)
    if b.ndim != 1:
        raise SearchSortedError(f"boundaries tensor must be 1 dimension, but got dim({b.ndim})")
    return searchsorted(b, input, out_int32=out_int32, right=right)


def histc(input: Any, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:
    """Counts of the elements of ``input`` in ``bins`` equal-width bins over ``[min, max]``
    (both 0, the default: the data's own minimum and maximum).  Elements outside the range
    are not counted; the top edge belongs to the last bin.  Same dtype as ``input`` (float)."""
    x = to_tensor(input)
    if x._dtype.category != 2:
        raise HistcDTypeError(f'"histogram_cpu" not implemented for {describe(x)}')
    bins = int(bins)
    if bins <= 0:
        raise HistcError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    lo, hi = float(min), float(max)
    if lo > hi:
        raise HistcError("torch.histc: max must be larger than min")
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise HistcError(f"torch.histc: range of [{lo:g}, {hi:g}] is not finite")
    return apply(P["histc"], (x,), {"bins": bins, "min": lo, "max": hi})


def _host_values(x: Tensor, what: str) -> np.ndarray:
    """``x``'s values on the host, telling this thread's tracer (the output shape depends on
    them)."""
    if _tracer_state.tracer is not None:
        _read(x, what)
    return np.asarray(_storage.to_host(x._data))


def nonzero(input: Any, *, as_tuple: bool = False) -> Any:
    """The indices of the non-zero elements of ``input``: an int64 tensor of shape
    ``(count, ndim)`` in row-major order, or (``as_tuple=True``) one 1-D tensor per dimension
    (a 0-d input counts as 1-D there)."""
    x = to_tensor(input)
    data = _host_values(x, "nonzero()")
    if as_tuple:
        found = np.nonzero(data.reshape(-1) if data.ndim == 0 else data)
        return tuple(_leaf(i.astype(np.int64), False, x.device) for i in found)
    if data.ndim == 0:
        count = int(data != 0)
        return _leaf(np.zeros((count, 0), np.int64), False, x.device)
    positions = np.argwhere(data).astype(np.int64)
    return _leaf(positions, False, x.device)


def argwhere(input: Any) -> Tensor:
    """``nonzero(input)``: the indices of the non-zero elements, one row each."""
    return nonzero(input)


def unique(
    input: Any,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: int | None = None,
) -> Any:
    """The distinct elements of ``input`` (``dim=None``: flattened) or its distinct slices
    along ``dim``, in ascending order (also with ``sorted=False``, as PyTorch on the CPU);
    with ``return_inverse`` the position of each element (slice) in that result, with
    ``return_counts`` how often each occurs.  NaNs are all distinct, as in PyTorch.  The
    result does not require grad (PyTorch's requires grad but has no backward)."""
    x = to_tensor(input)
    data = _host_values(x, "unique()")
    dev = x.device
    if dim is None:
        values, inverse, counts = np.unique(
            data.reshape(-1), return_inverse=True, return_counts=True, equal_nan=False
        )
        inverse = inverse.reshape(data.shape)
    else:
        d = wrap_dim("unique", dim, x.ndim)
        if data.shape[d] == 0:
            values = data
            inverse = np.zeros((0,), np.int64)
            counts = np.zeros((0,), np.int64)
        else:
            values, inverse, counts = np.unique(
                data, return_inverse=True, return_counts=True, axis=d, equal_nan=False
            )
            inverse = inverse.reshape(-1)
    out = _leaf(np.ascontiguousarray(values.astype(data.dtype, copy=False)), False, dev)
    if not (return_inverse or return_counts):
        return out
    parts = [out]
    if return_inverse:
        parts.append(_leaf(inverse.astype(np.int64), False, dev))
    if return_counts:
        parts.append(_leaf(counts.astype(np.int64), False, dev))
    return tuple(parts)


def unique_consecutive(
    input: Any,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: int | None = None,
) -> Any:
    """``input`` (``dim=None``: flattened) with each run of equal consecutive elements (slices
    along ``dim``) kept once, in order; ``return_inverse`` gives each element's (slice's) run,
    ``return_counts`` each run's length.  NaNs never equal each other, as in PyTorch.  Computed
    on the host; the result does not require grad."""
    x = to_tensor(input)
    data = _host_values(x, "unique_consecutive()")
    dev = x.device
    if dim is None:
        rows = data.reshape(-1, 1)
        d = 0
    else:
        d = wrap_dim("unique_consecutive", dim, x.ndim)
        rows = np.moveaxis(data, d, 0).reshape(data.shape[d], -1) if data.ndim else data
    n = rows.shape[0]
    starts = np.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    inverse = np.cumsum(starts) - 1
    counts = np.diff(np.append(np.flatnonzero(starts), n))
    if dim is None:
        values = data.reshape(-1)[starts]
        inverse = inverse.reshape(data.shape)
    else:
        values = np.moveaxis(np.moveaxis(data, d, 0)[starts], 0, d)
    out = _leaf(np.ascontiguousarray(values.astype(data.dtype, copy=False)), False, dev)
    if not (return_inverse or return_counts):
        return out
    parts = [out]
    if return_inverse:
        parts.append(_leaf(inverse.astype(np.int64), False, dev))
    if return_counts:
        parts.append(_leaf(counts.astype(np.int64), False, dev))
    return tuple(parts)
