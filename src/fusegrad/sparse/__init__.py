"""``fusegrad.sparse``: COO sparse tensors and their products with dense ones.

A ``SparseTensor`` holds ``indices`` (sparse_dim, nnz), int64, and ``values`` (nnz,
*dense dims), a fusegrad tensor: every operation is written over the values with the op
surface, so gradients reach the values (``sparse_coo_tensor(..., requires_grad=True)``: the
sparse tensor's ``.grad`` is sparse, with the values' gradient) and whatever they were made
from (``dense.to_sparse()`` gathers from the dense tensor).  ``mm(sparse, dense)`` (also
``fusegrad.spmm`` and ``sparse @ dense``) is an ``index_add`` of scaled rows of the dense
operand: differentiable with respect to both, as a graph-convolution layer needs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import layouts as _layouts
from .. import storage as _storage
from ..autograd.tracer import notify_host_read as _read
from ..errors import ShapeError, describe
from ..ops.creation import tensor as _tensor
from ..ops.creation import zeros
from ..size import Size
from ..tensor import Tensor

__all__ = ["SparseTensor", "addmm", "mm", "sparse_coo_tensor", "sum", "to_sparse"]


def _host(t: Tensor) -> np.ndarray:
    _read(t, "sparse indices")
    return np.asarray(_storage.to_host(t._data))


class SparseTensor:
    """A sparse COO tensor (see the module docstring); ``layout`` is ``fusegrad.sparse_coo``."""

    is_sparse = True
    is_sparse_csr = False
    layout = _layouts.sparse_coo

    def __init__(self, indices: Tensor, values: Tensor, size: tuple, coalesced: bool) -> None:
        self._indices_t = indices
        self._values_t = values
        self._size = Size(tuple(int(s) for s in size))
        self._coalesced = coalesced

    # -- metadata ---------------------------------------------------------------------------
    @property
    def shape(self) -> Size:
        return self._size

    def size(self, dim: int | None = None) -> Any:
        return self._size if dim is None else self._size[dim]

    def dim(self) -> int:
        return len(self._size)

    @property
    def ndim(self) -> int:
        return len(self._size)

    @property
    def dtype(self) -> _dt.dtype:
        return self._values_t.dtype

    @property
    def device(self) -> Any:
        return self._values_t.device

    @property
    def requires_grad(self) -> bool:
        return self._values_t.requires_grad

    def requires_grad_(self, requires_grad: bool = True) -> SparseTensor:
        self._values_t.requires_grad_(requires_grad)
        return self

    @property
    def grad(self) -> SparseTensor | None:
        """The gradient of a sparse leaf: sparse, coalesced, at its indices.  Each repeated
        index's entries get the same gradient (that of the matrix entry they add up to): it
        appears once, as in PyTorch."""
        g = self._values_t.grad
        if g is None:
            return None
        if self._coalesced or self._nnz() == 0:
            return SparseTensor(self._indices_t, g, self._size, True)
        idx = _host(self._indices_t)
        flat = np.ravel_multi_index(tuple(idx), tuple(self._size[: idx.shape[0]]))
        unique, first = np.unique(flat, return_index=True)
        pick = Tensor._make(first.astype(np.int64)).to(g.device)
        new_idx = Tensor._make(idx[:, first].astype(np.int64)).to(g.device)
        return SparseTensor(new_idx, g.index_select(0, pick), self._size, True)

    def sparse_dim(self) -> int:
        return int(self._indices_t.shape[0])

    def dense_dim(self) -> int:
        return self._values_t.ndim - 1

    def _nnz(self) -> int:
        return int(self._values_t.shape[0])

    def _indices(self) -> Tensor:
        return self._indices_t

    def _values(self) -> Tensor:
        return self._values_t

    def indices(self) -> Tensor:
        if not self._coalesced:
            raise RuntimeError(
                "Cannot get indices on an uncoalesced tensor, please call .coalesce() first"
            )
        return self._indices_t

    def values(self) -> Tensor:
        if not self._coalesced:
            raise RuntimeError(
                "Cannot get values on an uncoalesced tensor, please call .coalesce() first"
            )
        return self._values_t

    def is_coalesced(self) -> bool:
        return self._coalesced

    def numel(self) -> int:
        return int(np.prod(self._size))

    # -- conversions ------------------------------------------------------------------------
    def coalesce(self) -> SparseTensor:
        """Sorted, unique indices; the values of repeated indices summed (differentiably)."""
        if self._coalesced:
            return self
        idx = _host(self._indices_t)
        sparse_shape = tuple(self._size[: idx.shape[0]])
        if idx.shape[1] == 0:
            return SparseTensor(self._indices_t, self._values_t, self._size, True)
        flat = np.ravel_multi_index(tuple(idx), sparse_shape)
        unique, inverse = np.unique(flat, return_inverse=True)
        target = Tensor._make(inverse.astype(np.int64)).to(self.device)
        values = self._values_t
        summed = zeros(
            len(unique), *values.shape[1:], dtype=values.dtype, device=values.device
        ).index_add(0, target, values)
        new_idx = np.stack(np.unravel_index(unique, sparse_shape)).astype(np.int64)
        return SparseTensor(Tensor._make(new_idx).to(self.device), summed, self._size, True)

    def to_dense(self) -> Tensor:
        """The dense tensor (repeated indices add up); differentiable in the values."""
        idx = self._indices_t
        sparse_dims = idx.shape[0]
        key = tuple(idx[i] for i in range(sparse_dims))
        out = zeros(*self._size, dtype=self.dtype, device=self.device)
        return out.index_put(key, self._values_t, accumulate=True)

    def detach(self) -> SparseTensor:
        return SparseTensor(self._indices_t, self._values_t.detach(), self._size, self._coalesced)

    def to(self, *args: Any, **kwargs: Any) -> SparseTensor:
        values = self._values_t.to(*args, **kwargs)
        indices = self._indices_t.to(values.device)
        return SparseTensor(indices, values, self._size, self._coalesced)

    def double(self) -> SparseTensor:
        return self.to(_dt.float64)

    def float(self) -> SparseTensor:
        return self.to(_dt.float32)

    def t(self) -> SparseTensor:
        """The transpose of a 2-D sparse tensor."""
        if self.dim() != 2 or self.sparse_dim() != 2:
            raise ShapeError(f"t(): expected a 2-D sparse tensor, got size {list(self._size)}")
        flipped = self._indices_t.flip(0)
        return SparseTensor(flipped, self._values_t, self._size[::-1], False)

    def to_sparse(self, sparse_dim: int | None = None) -> SparseTensor:
        return self

    def to_sparse_coo(self) -> SparseTensor:
        return self

    # -- arithmetic -------------------------------------------------------------------------
    def mul(self, other: Any) -> SparseTensor:
        """Times a number (or a 0-d tensor): the values scaled."""
        if isinstance(other, Tensor) and other.ndim != 0:
            raise ShapeError("sparse * dense: only numbers and 0-d tensors are supported")
        return SparseTensor(self._indices_t, self._values_t * other, self._size, self._coalesced)

    __mul__ = __rmul__ = mul

    def __neg__(self) -> SparseTensor:
        return self.mul(-1)

    def __matmul__(self, other: Tensor) -> Tensor:
        return mm(self, other)

    def mm(self, other: Tensor) -> Tensor:
        return mm(self, other)

    def matmul(self, other: Tensor) -> Tensor:
        return mm(self, other)

    def __repr__(self) -> str:
        return (
            f"tensor(indices={self._indices_t!r},\n       values={self._values_t!r},\n"
            f"       size={tuple(self._size)}, nnz={self._nnz()}, layout=fusegrad.sparse_coo)"
        )


def sparse_coo_tensor(
    indices: Any,
    values: Any,
    size: Any = None,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    check_invariants: bool | None = None,
    is_coalesced: bool | None = None,
) -> SparseTensor:
    """A sparse COO tensor with ``values[k]`` at ``indices[:, k]`` (``size`` by default: one
    more than the largest index in each sparse dim, then the values' dense dims)."""
    idx = indices if isinstance(indices, Tensor) else _tensor(indices, dtype=_dt.int64)
    idx = idx.to(_dt.int64)
    vals = values if isinstance(values, Tensor) else _tensor(values, dtype=dtype)
    if dtype is not None:
        vals = vals.to(_dt.as_dtype(dtype))
    if device is not None:
        vals, idx = vals.to(device), idx.to(device)
    if idx.ndim != 2 and not (idx.ndim == 1 and idx.shape[0] == 0):
        raise ShapeError(
            f"sparse_coo_tensor: indices must be (sparse_dim, nnz), got {describe(idx)}"
        )
    if idx.ndim == 1:
        idx = idx.reshape(0, 0)
    if vals.ndim == 0 or vals.shape[0] != idx.shape[1]:
        raise ShapeError(
            f"sparse_coo_tensor: indices {describe(idx)} and values {describe(vals)} disagree "
            "on the number of specified elements"
        )
    host = _host(idx)
    if size is None:
        top = host.max(axis=1) + 1 if host.size else np.zeros(host.shape[0], np.int64)
        size = tuple(int(v) for v in top) + tuple(vals.shape[1:])
    size = tuple(int(s) for s in size)
    sparse_dims = idx.shape[0]
    if len(size) != sparse_dims + vals.ndim - 1 or tuple(size[sparse_dims:]) != tuple(
        vals.shape[1:]
    ):
        raise ShapeError(
            f"sparse_coo_tensor: size {list(size)} does not fit {sparse_dims} sparse dims and "
            f"values of shape {list(vals.shape)}"
        )
    if host.size and (host.min() < 0 or np.any(host.max(axis=1) >= np.array(size[:sparse_dims]))):
        raise ShapeError(f"sparse_coo_tensor: an index is out of bounds for size {list(size)}")
    if requires_grad:
        vals = (
            vals.detach().requires_grad_(True)
            if vals.grad_fn is not None
            else vals.requires_grad_(True)
        )
    coalesced = bool(is_coalesced) if is_coalesced is not None else host.shape[1] <= 1
    return SparseTensor(idx, vals, size, coalesced)


def to_sparse(dense: Tensor, sparse_dim: int | None = None) -> SparseTensor:
    """The nonzero entries of ``dense`` (its first ``sparse_dim`` dims sparse, all by default)
    as a coalesced sparse tensor; differentiable: the values are gathered from ``dense``."""
    if isinstance(dense, SparseTensor):
        return dense
    d = dense.ndim if sparse_dim is None else int(sparse_dim)
    if not 0 < d <= dense.ndim:
        raise ShapeError(f"to_sparse: sparse_dim must be in [1, {dense.ndim}], got {sparse_dim}")
    data = _host(dense.detach())
    present = data.reshape(data.shape[:d] + (-1,)).any(-1) if d < dense.ndim else data != 0
    where = np.nonzero(present)
    idx = Tensor._make(np.stack(where).astype(np.int64).reshape(d, -1)).to(dense.device)
    values = dense[tuple(idx[i] for i in range(d))]
    return SparseTensor(idx, values, tuple(dense.shape), True)


def mm(mat1: Any, mat2: Tensor) -> Tensor:
    """``sparse @ dense`` (2-D): each specified entry adds ``value * mat2[col]`` to its row;
    gradients reach the sparse values and ``mat2``.  A dense ``mat1`` is a plain matmul."""
    if not isinstance(mat1, SparseTensor):
        return mat1 @ mat2
    if mat1.dim() != 2 or mat1.sparse_dim() != 2 or mat2.ndim != 2:
        raise ShapeError(
            f"sparse.mm: expected a 2-D sparse matrix and a 2-D dense one, got sizes "
            f"{list(mat1.shape)} and {list(mat2.shape)}"
        )
    if mat1.shape[1] != mat2.shape[0]:
        raise ShapeError(
            f"sparse.mm: sizes {list(mat1.shape)} and {list(mat2.shape)} cannot be multiplied"
        )
    rows, cols = mat1._indices_t[0], mat1._indices_t[1]
    scaled = mat2.index_select(0, cols) * mat1._values_t.unsqueeze(1)
    out = zeros(mat1.shape[0], mat2.shape[1], dtype=scaled.dtype, device=mat2.device)
    return out.index_add(0, rows, scaled)


def addmm(
    input: Tensor, mat1: SparseTensor, mat2: Tensor, *, beta: float = 1, alpha: float = 1
) -> Tensor:
    """``beta * input + alpha * (mat1 @ mat2)`` with a sparse ``mat1``."""
    return input * beta + mm(mat1, mat2) * alpha


def sum(input: SparseTensor, dim: Any = None, dtype: Any = None) -> Tensor:  # noqa: A001
    """The sum of a sparse tensor (of all its entries, or over ``dim``), as a dense tensor."""
    dense = input.to_dense() if isinstance(input, SparseTensor) else input
    out = dense.sum() if dim is None else dense.sum(dim)
    return out if dtype is None else out.to(_dt.as_dtype(dtype))


def _sparse_mask(self: Tensor, mask: SparseTensor) -> SparseTensor:
    """``self``'s entries at ``mask``'s indices, as a sparse tensor (differentiable)."""
    m = mask.coalesce()
    idx = m._indices_t
    values = self[tuple(idx[i] for i in range(idx.shape[0]))]
    return SparseTensor(idx, values, tuple(self.shape), True)


def _dense_to_dense(self: Tensor) -> Tensor:
    return self


# the Tensor methods of this layout (installed by this layer, which sits above the op surface)
Tensor.is_sparse = False  # type: ignore[attr-defined]
Tensor.to_sparse = to_sparse  # type: ignore[attr-defined]
Tensor.to_sparse_coo = to_sparse  # type: ignore[attr-defined]
Tensor.to_dense = _dense_to_dense  # type: ignore[attr-defined]
Tensor.sparse_mask = _sparse_mask  # type: ignore[attr-defined]
