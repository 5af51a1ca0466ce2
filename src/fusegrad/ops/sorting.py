"""Sorting op surface: sort, argsort, msort, topk, kthvalue, median; cummax, cummin, mode.

One primitive, ``argsort`` (non-differentiable: the positions of the sorted elements, or of the
first ``k``), underlies them all.  The values are ``gather(x, dim, indices)``, so gradients
scatter to the selected positions through gather's rule, as PyTorch's ``sort``/``topk``/
``kthvalue``/``median`` backward do, and compiled programs call the primitive as an extern
between fused loops.  Order: NaN is larger than every number (last ascending, first descending);
equal elements keep their original order in ``sort``/``argsort`` (always stable; PyTorch leaves
the order of ties unspecified unless ``stable=True``).  ``topk``/``kthvalue`` with ``k`` short of
the dimension find their elements by a partial sort, so which of several equal elements they
pick (and the order of ties among them) is unspecified, as in PyTorch.

``cummax``/``cummin`` and ``mode`` follow the same pattern with their own non-differentiable
index primitives (``cummax_index``, ``mode_index``): the values are a gather, so the gradient
goes to the positions of the running extremes / of the mode, as in PyTorch.
"""

from __future__ import annotations

from typing import Any

from .. import return_types
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..errors import IndexOutOfRange, describe
from ..tensor import Tensor
from ._util import P, apply, to_tensor, wrap_dim
from .elementwise import where
from .generated import isnan


class SelectionOutOfRange(IndexOutOfRange, RuntimeError):
    """``k`` outside the selected dimension (topk, kthvalue): PyTorch raises a RuntimeError."""


def _argsort_prim(x: Tensor, dim: int, descending: bool, k: int | None) -> Tensor:
    return apply(P["argsort"], (x,), {"dim": dim, "descending": bool(descending), "k": k})


def _gather(x: Tensor, dim: int, idx: Tensor) -> Tensor:
    # indices made by argsort are in range: no bound check (it would read them on the host)
    return apply(P["gather"], (x, idx), {"dim": dim})


def _prepare(op: str, input: Any, dim: Any) -> tuple[Tensor, int, bool]:
    """``(x, dim, was_0d)``: a 0-d input is sorted as one element of shape (1,)."""
    x = to_tensor(input)
    d = wrap_dim(op, dim, x.ndim)
    if x.ndim == 0:
        return x.reshape((1,)), 0, True
    return x, d, False


def _finish(values: Tensor, indices: Tensor, zero_d: bool) -> tuple[Tensor, Tensor]:
    if zero_d:
        return values.reshape(()), indices.reshape(())
    return values, indices


@_torch_node_name("SortBackward0")
def sort(
    input: Any,
    dim: int = -1,
    descending: bool = False,
    stable: bool = False,
) -> return_types.sort:
    """``(values, indices)`` of ``input`` sorted along ``dim`` (``stable`` is accepted; every
    sort here is stable)."""
    x, d, zero_d = _prepare("sort", input, dim)
    idx = _argsort_prim(x, d, descending, None)
    return return_types.sort(*_finish(_gather(x, d, idx), idx, zero_d))


def argsort(input: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The indices that sort ``input`` along ``dim`` (int64; stable)."""
    x, d, zero_d = _prepare("argsort", input, dim)
    idx = _argsort_prim(x, d, descending, None)
    return idx.reshape(()) if zero_d else idx


def msort(input: Any) -> Tensor:
    """``input`` sorted along its first dimension."""
    return sort(input, dim=0).values


@_torch_node_name("TopkBackward0")
def topk(
    input: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
) -> return_types.topk:
    """The ``k`` largest (``largest=False``: smallest) elements along ``dim`` and their indices,
    in sorted order (also with ``sorted=False``, whose order PyTorch leaves unspecified)."""
    x, d, zero_d = _prepare("topk", input, dim)
    k = int(k)
    size = x._data.shape[d]
    if not 0 <= k <= size:
        raise SelectionOutOfRange(
            f"topk(): selected index k out of range (k = {k}, size of dim {d} = {size}; "
            f"input {describe(to_tensor(input))})"
        )
    idx = _argsort_prim(x, d, largest, k)
    return return_types.topk(*_finish(_gather(x, d, idx), idx, zero_d))


@_torch_node_name("KthvalueBackward0")
def kthvalue(input: Any, k: int, dim: int = -1, keepdim: bool = False) -> return_types.kthvalue:
    """The ``k``-th smallest element (1-based) along ``dim`` and its index."""
    x, d, zero_d = _prepare("kthvalue", input, dim)
    k = int(k)
    size = x._data.shape[d]
    if not 1 <= k <= size:
        raise SelectionOutOfRange(
            f"kthvalue(): selected number k out of range for dimension {d} (k = {k}, size "
            f"{size}; input {describe(to_tensor(input))})"
        )
    idx = _argsort_prim(x, d, False, k).narrow(d, k - 1, 1)
    values = _gather(x, d, idx)
    if zero_d:
        return return_types.kthvalue(values.reshape(()), idx.reshape(()))
    if not keepdim:
        values, idx = values.squeeze(d), idx.squeeze(d)
    return return_types.kthvalue(values, idx)


def _median_index(x: Tensor, d: int) -> Tensor:
    """The index (kept dim) of the lower median along ``d``, or of a NaN where a row has one
    (PyTorch's median is NaN there; ``nanmedian`` is the one that skips them)."""
    n = x._data.shape[d]
    order = _argsort_prim(x, d, False, None)
    mid = order.narrow(d, (n - 1) // 2, 1)
    if not x.is_floating_point():
        return mid
    last = order.narrow(d, n - 1, 1)  # NaN sorts last: the last index is a NaN if any is
    return where(isnan(_gather(x, d, last)), last, mid)


@_torch_node_name(lambda input, dim=None, keepdim=False: f"MedianBackward{0 if dim is None else 1}")
def median(input: Any, dim: Any = None, keepdim: bool = False) -> Any:
    """``median(x)``: the lower median of all elements (a tensor); ``median(x, dim)``:
    ``(values, indices)`` of the lower median along ``dim``.  NaN if the elements hold one."""
    x = to_tensor(input)
    if dim is None:
        flat = x.reshape((-1,))
        if flat._data.shape[0] == 0:
            return flat.sum() * float("nan")  # PyTorch: the median of nothing is nan
        return _gather(flat, 0, _median_index(flat, 0)).reshape(())
    x, d, zero_d = _prepare("median", x, dim)
    if x._data.shape[d] == 0:
        raise IndexOutOfRange(
            f"median(): Expected reduction dim {d} to have non-zero size (input {describe(x)})"
        )
    idx = _median_index(x, d)
    values = _gather(x, d, idx)
    if zero_d:
        return return_types.median(values.reshape(()), idx.reshape(()))
    if not keepdim:
        values, idx = values.squeeze(d), idx.squeeze(d)
    return return_types.median(values, idx)


def _cumulative_extreme(op: str, input: Any, dim: Any, largest: bool) -> tuple[Tensor, Tensor]:
    x, d, zero_d = _prepare(op, input, dim)
    idx = apply(P["cummax_index"], (x,), {"dim": d, "largest": largest})
    return _finish(_gather(x, d, idx), idx, zero_d)


@_torch_node_name("CummaxBackward0")
def cummax(input: Any, dim: int) -> return_types.cummax:
    """``(values, indices)``: the running maximum along ``dim`` and where it sits (the latest
    of equal elements; a NaN, once met, stays the maximum).  The gradient goes to those
    positions."""
    return return_types.cummax(*_cumulative_extreme("cummax", input, dim, True))


@_torch_node_name("CumminBackward0")
def cummin(input: Any, dim: int) -> return_types.cummin:
    """``(values, indices)``: the running minimum along ``dim`` (as ``cummax``)."""
    return return_types.cummin(*_cumulative_extreme("cummin", input, dim, False))


@_torch_node_name("ModeBackward0")
def mode(input: Any, dim: int = -1, keepdim: bool = False) -> return_types.mode:
    """``(values, indices)``: the most frequent value along ``dim`` (the smallest of equally
    frequent ones) and the position of its last occurrence, as PyTorch's CPU kernel gives it.
    The gradient goes to that position."""
    x, d, zero_d = _prepare("mode", input, dim)
    if x._data.shape[d] == 0:
        raise IndexOutOfRange(
            f"mode(): Expected reduction dim {d} to have non-zero size (input {describe(x)})"
        )
    idx = apply(P["mode_index"], (x,), {"dim": d})
    values = _gather(x, d, idx)
    if zero_d:
        return return_types.mode(values.reshape(()), idx.reshape(()))
    if not keepdim:
        values, idx = values.squeeze(d), idx.squeeze(d)
    return return_types.mode(values, idx)
