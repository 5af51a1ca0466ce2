"""Indexing op surface: ``__getitem__`` (basic and advanced), gather/scatter, index_select,
masked_fill/masked_select, take_along_dim, one_hot, embedding.

``__getitem__`` normalises a Python key into a hashable *spec* (a tuple of tagged entries:
``("s", start, stop, step)`` slices, ``("i", n)`` ints, ``("n",)`` None, ``("e",)`` Ellipsis,
``("t", k)`` the k-th index tensor) plus the index tensors, which become primitive inputs.  Its
gradient (``index_add_at``) accumulates duplicate indices, as in PyTorch.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import storage as _storage
from ..autograd.forward_state import state as _forward_state
from ..autograd.grad_mode import no_grad as _no_grad
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..autograd.tracer import notify_check as _check
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import notify_host_read as _read
from ..cuda.array import CudaArray
from ..errors import DTypeError, IndexOutOfRange, ShapeError, describe
from ..size import broadcast_shapes
from ..tensor import Tensor
from ._util import P, apply, as_operand, as_size, broadcast_shape, cast, to_tensor, wrap_dim
from .creation import full
from .elementwise import add, where
from .generated import eq, mul
from .primitives import key_shape, numpy_key
from .registry import primitive, set_meta
from .views import _view_op


def _normalise_key(x: Tensor, key: Any) -> tuple[tuple, tuple]:
    if not isinstance(key, tuple):
        key = (key,)
    spec: list = []
    tensors: list = []
    consumed = 0  # dims of x used so far (for bounds checks of ints)
    has_ellipsis = any(k is Ellipsis for k in key)
    used = sum(
        1 if not (k is None or k is Ellipsis) else 0
        for k in key
        if not (isinstance(k, Tensor) and k._dtype is _dt.bool_)
    ) + sum(k.ndim for k in key if isinstance(k, Tensor) and k._dtype is _dt.bool_)
    if used > x.ndim:
        raise IndexOutOfRange(
            f"getitem: too many indices for tensor of dimension {x.ndim} (shape {tuple(x.shape)})"
        )
    for k in key:
        if k is None:
            spec.append(("n",))
        elif k is Ellipsis:
            spec.append(("e",))
            consumed = x.ndim - (used - consumed)
        elif isinstance(k, slice):
            for part in (k.start, k.stop, k.step):
                if part is not None and not isinstance(part, (numbers.Integral, Tensor)):
                    raise TypeError(f"getitem: slice indices must be integers, got {part!r}")
            step = 1 if k.step is None else int(k.step)
            if step <= 0:
                raise ValueError("getitem: step must be greater than zero")
            # (sizes that are not plain ints -- the compiler's symbolic ones -- stay as they are)
            start = None if k.start is None else as_size(k.start, "slice indices")
            stop = None if k.stop is None else as_size(k.stop, "slice indices")
            spec.append(("s", start, stop, step))
            consumed += 1
        elif isinstance(k, (bool, np.bool_)):
            t = _created(Tensor._make(np.array(bool(k))))
            spec.append(("t", len(tensors)))
            tensors.append(t)
        elif isinstance(k, (int, np.integer)) or (
            isinstance(k, Tensor) and k.ndim == 0 and k._dtype.category == 1
        ):
            i = int(k)
            size = x._data.shape[consumed] if consumed < x.ndim else 0
            if not -size <= i < size:
                raise IndexOutOfRange(
                    f"getitem: index {i} is out of bounds for dimension {consumed} with size "
                    f"{size} (tensor shape {tuple(x.shape)})"
                )
            spec.append(("i", i % size))
            consumed += 1
        else:
            if isinstance(k, Tensor):
                t = k
            else:
                arr = np.asarray(k)
                if arr.size == 0 and arr.dtype.kind == "f":
                    arr = arr.astype(np.int64)  # ``x[[]]``: an empty list selects nothing
                t = Tensor._make(arr)
                if isinstance(k, (list, tuple)):
                    # a constant of the key (a Python list: a tracer's guard sees its values;
                    # a numpy array it cannot, so that stays an untraced tensor)
                    _created(t)
            if t._dtype is _dt.uint8:
                # PyTorch's old spelling of a mask: read as bool, with its deprecation warning
                warnings.warn(
                    "indexing with dtype fusegrad.uint8 is now deprecated, please use a dtype "
                    "fusegrad.bool instead.",
                    UserWarning,
                    stacklevel=3,
                )
                t = cast(t, _dt.bool_)
            if t._data.dtype.kind == "f":
                raise IndexOutOfRange(
                    "getitem: tensors used as indices must be long, int or bool tensors, "
                    f"got {describe(t)}"
                )
            if t._dtype is not _dt.bool_ and t._data.dtype.kind in "iu":
                dim = consumed
                size = x._data.shape[dim] if dim < x.ndim else 0
                _check(t, _getitem_range(dim, size, tuple(x.shape)))
                consumed += 1
            elif t._dtype is _dt.bool_:
                dims = x._data.shape[consumed : consumed + t.ndim]
                if tuple(dims) != tuple(t.shape):
                    raise IndexOutOfRange(
                        f"getitem: the shape of the mask {tuple(t.shape)} does not match the "
                        f"shape of the indexed tensor {tuple(x.shape)} at dims "
                        f"{consumed}..{consumed + t.ndim - 1}"
                    )
                consumed += t.ndim
            spec.append(("t", len(tensors)))
            tensors.append(t)
    del has_ellipsis
    return tuple(spec), tuple(tensors)


def _split_ints(spec: tuple, tensors: tuple) -> tuple[tuple, tuple] | None:
    """PyTorch applies integer indices as basic indexing (``select``) before any advanced
    index, so they do not take part in where the advanced result dims go (numpy's rule counts
    them as advanced: ``x[1, :, idx]`` puts idx's dims first there).  For a key with both,
    returns (the ints with full slices elsewhere, the rest of the key); None otherwise."""
    if not tensors or not any(entry[0] == "i" for entry in spec):
        return None
    first: list = []
    rest: list = []
    for entry in spec:
        tag = entry[0]
        if tag == "i":
            first.append(entry)
            continue
        rest.append(entry)
        if tag == "e":
            first.append(entry)
        elif tag == "s":
            first.append(("s", None, None, 1))
        elif tag == "t":
            t = tensors[entry[1]]
            width = t.ndim if t._dtype is _dt.bool_ else 1
            first.extend([("s", None, None, 1)] * width)
        # ("n",): a new dim, added by the second step only
    return tuple(first), tuple(rest)


def getitem(input: Tensor, key: Any) -> Tensor:
    x = to_tensor(input)
    spec, tensors = _normalise_key(x, key)
    if not tensors:  # basic indexing: a view
        return _view_op(x, "getitem", {"key": spec})
    split = _split_ints(spec, tensors)
    if split is not None:
        x = _view_op(x, "getitem", {"key": split[0]})
        spec = split[1]
    return apply(P["getitem"], (x,) + tensors, {"key": spec})


def getitem_spec(x: Tensor, tensors: tuple, spec: tuple) -> Tensor:
    """``x[key]`` for an already normalised key (used by derivative rules)."""
    out = apply(P["getitem"], (x,) + tuple(tensors), {"key": spec})
    return out


def index_put_spec(x: Tensor, v: Tensor, tensors: tuple, spec: tuple) -> Tensor:
    """A copy of ``x`` with ``[key] = v`` for a normalised key (v broadcast to the target)."""
    if v.ndim == 0 and v.device != x.device:
        v = v.to(x.device)  # a 0-d value (e.g. a Python number) may be assigned on any device
    if any(t._dtype is _dt.bool_ for t in tensors):  # a mask: the target's shape is its count
        probe = np.broadcast_to(np.empty((), dtype=bool), tuple(x.shape))
        target = probe[numpy_key(spec, tuple(t._data for t in tensors))].shape
    else:
        target = key_shape(
            tuple(x.shape), tuple(t.shape for t in tensors), tuple(t._dtype for t in tensors), spec
        )
    if tuple(v.shape) != tuple(target):
        v = v.broadcast_to(target)
    return apply(P["index_put"], (x, v) + tuple(tensors), {"key": spec})


def setitem_value(x: Tensor, key: Any, value: Any) -> Tensor:
    """Out-of-place ``x[key] = value``: the value of the in-place assignment."""
    spec, tensors = _normalise_key(x, key)
    v = as_operand(value, x.dtype)
    split = _split_ints(spec, tensors)
    if split is not None:  # the ints select first (see _split_ints), then the rest assigns
        part = _view_op(x, "getitem", {"key": split[0]})
        return index_put_spec(x, index_put_spec(part, v, tensors, split[1]), (), split[0])
    return index_put_spec(x, v, tensors, spec)


def index_add_at(g: Tensor, tensors: tuple, spec: tuple, shape: tuple) -> Tensor:
    """Zeros of ``shape`` with ``g`` accumulated at ``[key]`` (the gradient of getitem)."""
    return apply(P["index_add_at"], (g,) + tuple(tensors), {"key": spec, "shape": tuple(shape)})


def gather_spec(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """``x.gather(dim, index)`` for a wrapped ``dim`` and an index already checked (derivative
    rules: the index was checked when its forward op ran)."""
    return apply(P["gather"], (x, index), {"dim": dim})


def scatter_spec(x: Tensor, dim: int, index: Tensor, src: Tensor, add: bool = False) -> Tensor:
    """``scatter`` (``scatter_add`` with ``add``) for a wrapped ``dim``, an index already
    checked and a ``src`` of the index's shape and ``x``'s dtype (derivative rules)."""
    return apply(P["scatter_add" if add else "scatter"], (x, index, src), {"dim": dim})


def _index_tensor(op: str, index: Any) -> Tensor:
    t = to_tensor(index)
    if t._dtype.category != 1:
        raise DTypeError(f"{op}: expected an int64 or int32 index tensor, got {describe(t)}")
    return t


def _getitem_range(dim: int, size: int, shape: tuple) -> Any:
    """The bounds check of an integer index tensor into dimension ``dim`` (of ``size``)."""

    def check(array: Any) -> None:
        values = _storage.to_host(array)  # (a copy when on a GPU)
        if values.size and (values.max() >= size or values.min() < -size):
            bad = values.max() if values.max() >= size else values.min()
            raise IndexOutOfRange(
                f"getitem: index {int(bad)} is out of bounds for dimension {dim} with "
                f"size {size} (tensor shape {shape})"
            )

    return check


def _check_index_range(op: str, index: Tensor, size: int, dim: int) -> None:
    """Indices of gather/scatter/index_select/embedding must lie in [0, size), as in PyTorch
    (negative indices are an error there, not counted from the end)."""

    def check(array: Any) -> None:
        if array.size:
            values = _storage.to_host(array)  # (a copy when on a GPU)
            lo, hi = int(values.min()), int(values.max())
            if lo < 0 or hi >= size:
                bad = hi if hi >= size else lo
                raise IndexOutOfRange(
                    f"{op}: index {bad} is out of bounds for dimension {dim} with size {size}"
                )

    _check(index, check)


def gather(input: Any, dim: int, index: Any) -> Tensor:
    x = to_tensor(input)
    idx = _index_tensor("gather", index)
    d = wrap_dim("gather", dim, x.ndim)
    if idx.ndim != x.ndim:
        raise ShapeError(
            f"gather: index tensor must have the same number of dimensions as input tensor "
            f"(index {describe(idx)}, input {describe(x)})"
        )
    for i in range(x.ndim):
        if i != d and idx._data.shape[i] > x._data.shape[i]:
            raise ShapeError(
                f"gather: size of index {tuple(idx.shape)} does not fit input {tuple(x.shape)} "
                f"at dimension {i} (only dimension {d} may be larger)"
            )
    _check_index_range("gather", idx, x._data.shape[d], d)
    return apply(P["gather"], (x, idx), {"dim": d})


def _scatter_args(op: str, x: Tensor, dim: int, index: Any, src: Any) -> tuple:
    idx = _index_tensor(op, index)
    d = wrap_dim(op, dim, x.ndim)
    if idx.ndim != x.ndim:
        raise ShapeError(
            f"{op}: index {describe(idx)} must have as many dims as input {describe(x)}"
        )
    _check_index_range(op, idx, x._data.shape[d], d)
    if isinstance(src, Tensor):
        s = as_operand(src, x.dtype)
        if s.shape != idx.shape:
            if any(a < b for a, b in zip(s.shape, idx.shape)) or s.ndim != idx.ndim:
                raise ShapeError(f"{op}: src {describe(s)} is smaller than index {describe(idx)}")
            s = s[tuple(slice(0, n) for n in idx.shape)]
    else:
        s = full(tuple(idx.shape), src, dtype=x.dtype, device=x.device)
    return d, idx, s


def _scatter_name(input: Any, dim: int, index: Any, src: Any = None, **kwargs: Any) -> str:
    # PyTorch's overloads: scatter(..., src: Tensor) 0, scatter(..., value: Scalar) 1
    return "ScatterBackward0" if isinstance(src, Tensor) else "ScatterBackward1"


@_torch_node_name(_scatter_name)
def scatter(input: Any, dim: int, index: Any, src: Any = None, *, value: Any = None) -> Tensor:
    x = to_tensor(input)
    d, idx, s = _scatter_args("scatter", x, dim, index, src if src is not None else value)
    return apply(P["scatter"], (x, idx, s), {"dim": d})


def scatter_add(input: Any, dim: int, index: Any, src: Any) -> Tensor:
    x = to_tensor(input)
    d, idx, s = _scatter_args("scatter_add", x, dim, index, src)
    return apply(P["scatter_add"], (x, idx, s), {"dim": d})


def _dim_index(op: str, x: Tensor, dim: int, index: Any) -> tuple[int, Tensor, tuple]:
    """Check a ``dim`` / 1-D ``index`` pair of the index_* ops; returns the wrapped dim, the
    index as a 1-D tensor and the normalised key ``x[:, ..., index]``."""
    if x.ndim == 0:
        raise ShapeError(f"{op}: expected a tensor with at least one dimension, got {describe(x)}")
    idx = _index_tensor(op, index)
    if idx.ndim > 1:
        raise ShapeError(f"{op}: index must be 0-D or 1-D, got {describe(idx)}")
    d = wrap_dim(op, dim, x.ndim)
    _check_index_range(op, idx, x._data.shape[d], d)
    return d, idx.reshape(-1), (("s", None, None, 1),) * d + (("t", 0),)


def _index_source(op: str, x: Tensor, d: int, idx: Tensor, source: Any) -> Tensor:
    """``source`` of index_add / index_copy: x's dtype and x's shape with dim ``d`` the number
    of indices."""
    src = to_tensor(source)
    if src._dtype is not x._dtype:
        raise DTypeError(
            f"{op}: self ({x.dtype.name}) and source ({src.dtype.name}) must have the same "
            "scalar type"
        )
    expected = tuple(x.shape[:d]) + (idx.shape[0],) + tuple(x.shape[d + 1 :])
    if tuple(src.shape) != expected:
        raise ShapeError(
            f"{op}: source {describe(src)} should have shape {expected} (self {describe(x)} with "
            f"dim {d} of size {idx.shape[0]}, the number of indices)"
        )
    return src


@_torch_node_name("IndexAddBackward0")
def index_add(input: Any, dim: int, index: Any, source: Any, *, alpha: Any = 1) -> Tensor:
    """``input`` with ``alpha * source`` added at ``index`` along ``dim``; repeated indices
    accumulate."""
    x = to_tensor(input)
    d, idx, key = _dim_index("index_add", x, dim, index)
    src = _index_source("index_add", x, d, idx, source)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        src = mul(src, alpha)
    return add(x, index_add_at(src, (idx,), key, tuple(x.shape)))


def index_copy(input: Any, dim: int, index: Any, source: Any) -> Tensor:
    """``input`` with the slices at ``index`` along ``dim`` replaced by ``source``'s."""
    x = to_tensor(input)
    d, idx, key = _dim_index("index_copy", x, dim, index)
    src = _index_source("index_copy", x, d, idx, source)
    return index_put_spec(x, src, (idx,), key)


def index_fill(input: Any, dim: int, index: Any, value: Any) -> Tensor:
    """``input`` with the slices at ``index`` along ``dim`` set to the scalar ``value``."""
    x = to_tensor(input)
    _, idx, key = _dim_index("index_fill", x, dim, index)
    if isinstance(value, Tensor) and value.ndim != 0:
        raise ShapeError(
            f"index_fill: only supports a 0-dimensional value tensor, but got {describe(value)}"
        )
    return index_put_spec(x, as_operand(value, x.dtype), (idx,), key)


@_torch_node_name("IndexSelectBackward0")
def index_select(input: Any, dim: int, index: Any) -> Tensor:
    x = to_tensor(input)
    idx = _index_tensor("index_select", index)
    if idx.ndim > 1:
        raise ShapeError(f"index_select: index must be 0-D or 1-D, got {describe(idx)}")
    d = wrap_dim("index_select", dim, x.ndim)
    _check_index_range("index_select", idx, x._data.shape[d] if x.ndim else 1, d)
    return getitem(x, (slice(None),) * d + (idx.reshape(-1),))


@_torch_node_name("MaskedFillBackward0")
def masked_fill(input: Any, mask: Any, value: Any) -> Tensor:
    x = to_tensor(input)
    m = to_tensor(mask)
    if m._dtype is not _dt.bool_:
        raise DTypeError(f"masked_fill: expected a bool mask, got {describe(m)}")
    if isinstance(value, Tensor) and value.ndim != 0:
        raise ShapeError(
            f"masked_fill only supports a 0-dimensional value tensor, but got tensor with "
            f"{value.ndim} dimension(s)"
        )
    v = value if isinstance(value, Tensor) else as_operand(value, x.dtype)
    out = where(m, as_operand(v, x.dtype), x)
    if out.shape != x.shape:
        raise ShapeError(
            f"masked_fill: mask {describe(m)} does not broadcast to input {describe(x)}"
        )
    return out


@_torch_node_name("MaskedSelectBackward0")
def masked_select(input: Any, mask: Any) -> Tensor:
    # ``broadcast_tensors`` (shape.py, a surface above this one: its pad uses index_select)
    x, m = to_tensor(input), to_tensor(mask)
    shape = broadcast_shape("broadcast_tensors", x, m)
    x, m = x.broadcast_to(shape), m.broadcast_to(shape)  # type: ignore[attr-defined]
    if m._dtype is not _dt.bool_:
        raise DTypeError(f"masked_select: expected a bool mask, got {describe(m)}")
    return getitem(x, m.contiguous())


def take_along_dim(input: Any, indices: Any, dim: int | None = None) -> Tensor:
    x = to_tensor(input)
    idx = _index_tensor("take_along_dim", indices)
    if dim is None:
        return gather(x.reshape(-1), 0, idx.reshape(-1))
    d = wrap_dim("take_along_dim", dim, x.ndim)
    if idx.ndim != x.ndim:
        raise ShapeError(
            f"take_along_dim: input {describe(x)} and indices {describe(idx)} should have the "
            "same number of dimensions"
        )
    xs, ix = list(x.shape), list(idx.shape)
    xs[d] = ix[d] = 1
    shape = broadcast_shapes(tuple(xs), tuple(ix))
    xb = x.broadcast_to(shape[:d] + (x.shape[d],) + shape[d + 1 :])
    ib = idx.broadcast_to(shape[:d] + (idx.shape[d],) + shape[d + 1 :])
    return gather(xb, d, ib)


def one_hot(tensor: Any, num_classes: int = -1) -> Tensor:
    idx = _index_tensor("one_hot", tensor)
    values = _storage.to_host(idx._data)  # (a copy when on a GPU)
    if num_classes < 0:
        _read(idx, "one_hot() without num_classes")
        num_classes = int(values.max()) + 1 if values.size else 0

    def check(array: Any) -> None:
        values = _storage.to_host(array)
        if values.size and (values.min() < 0 or values.max() >= num_classes):
            raise IndexOutOfRange(f"one_hot: class values must be in [0, {num_classes})")

    _check(idx, check)
    classes = _created(Tensor._make(np.arange(num_classes, dtype=np.int64))).to(idx.device)
    return eq(idx.unsqueeze(-1), classes).to(_dt.int64)


# ---- embedding: a lookup, and one scatter-add kernel backward -----------------------------------
# A primitive (not getitem, whose backward is index_add_at: numpy's ufunc.at, about 10x slower
# than a loop over rows) for the backward's speed: ``embedding_backward`` is one numba pass
# (``embedding_kernels``) that skips ``padding_idx`` and scales by inverse frequencies.


@primitive("embedding", "opaque", "weight idx")
def _embedding_kernel(weight, idx, *, padding_idx, scale_grad_by_freq):  # type: ignore[no-untyped-def]
    """``weight[idx]``: the rows of the 2-D ``weight`` at the integer ``idx`` (in range);
    ``padding_idx`` (non-negative, or None) gets no gradient, ``scale_grad_by_freq`` divides
    each row's gradient by the number of times its index occurs in ``idx``."""
    return np.take(weight, idx, axis=0)


@primitive("embedding_backward", "opaque", "g idx", differentiable=False)
def _embedding_backward_kernel(g, idx, *, num_weights, padding_idx, scale_grad_by_freq):  # type: ignore[no-untyped-def]
    """The (num_weights, D) gradient of ``embedding``'s weight for its gradient ``g``.  Not
    differentiable: the rule composes ``embedding_grad`` instead where a graph of the
    gradient is wanted (``create_graph``)."""
    from .embedding_kernels import embedding_backward  # numba: not at import

    return embedding_backward(g, idx, num_weights, padding_idx, scale_grad_by_freq)


set_meta(
    "embedding",
    lambda shapes, dtypes, padding_idx, scale_grad_by_freq: (
        tuple(shapes[1]) + (shapes[0][1],),
        dtypes[0],
    ),
)
set_meta(
    "embedding_backward",
    lambda shapes, dtypes, num_weights, padding_idx, scale_grad_by_freq: (
        (num_weights, shapes[0][-1]),
        dtypes[0],
    ),
    ("num_weights",),
)


def embedding_grad(
    g: Tensor, idx: Tensor, num_weights: Any, padding_idx: int | None, scale_grad_by_freq: bool
) -> Tensor:
    """``embedding_backward`` in differentiable ops (an ``index_add`` of the masked, scaled
    rows): the rule's form under ``create_graph``."""
    width = g.shape[-1]
    rows = g.reshape(-1, width)
    flat = idx.reshape(-1)
    if scale_grad_by_freq:
        counts = full((num_weights,), 0.0, dtype=g.dtype, device=g.device)
        counts = counts.index_add(0, flat, full(flat.shape, 1.0, dtype=g.dtype, device=g.device))
        rows = rows / counts.index_select(0, flat).unsqueeze(-1)
    if padding_idx is not None:
        rows = where(eq(flat, padding_idx).unsqueeze(-1), 0.0, rows)
    zeros = full((num_weights, width), 0.0, dtype=g.dtype, device=g.device)
    return zeros.index_add(0, flat, rows)


def _renorm_embedding_rows(weight: Tensor, idx: Tensor, max_norm: float, norm_type: float) -> None:
    """The rows of ``weight`` that ``idx`` looks up rescaled in place (without history) so that
    their ``norm_type``-norm is at most ``max_norm`` (PyTorch's embedding_renorm_)."""
    _read(idx, "embedding with max_norm")
    rows = np.unique(_storage.to_host(idx._data))
    positions = _created(Tensor._make(rows.astype(np.int64)))
    positions = positions if positions.device == weight.device else positions.to(weight.device)
    with _no_grad():
        picked = weight.index_select(0, positions)
        norms = picked.norm(norm_type, dim=1, keepdim=True)
        scale = where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
        weight.index_copy_(0, positions, picked * scale)


@_torch_node_name("EmbeddingBackward0")
def embedding(
    input: Any,
    weight: Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Tensor:
    """The rows of the 2-D ``weight`` at the integer ``input``.  ``padding_idx``'s row gets no
    gradient; ``max_norm`` renormalises the looked-up rows of ``weight`` in place first;
    ``scale_grad_by_freq`` divides each row's gradient by its index's count in ``input``.
    Sparse gradients (``sparse=True``) are not supported."""
    idx = _index_tensor("embedding", input)
    if weight.ndim != 2:
        raise ShapeError(f"embedding: weight must be 2-D, got {describe(weight)}")
    if sparse:
        raise NotImplementedError("embedding: sparse=True (sparse gradients) is not supported")
    _check_index_range("embedding", idx, weight.shape[0], 0)
    if padding_idx is not None:
        if not -weight.shape[0] <= padding_idx < weight.shape[0]:
            raise ShapeError("Padding_idx must be within num_embeddings")
        if padding_idx < 0:
            padding_idx += weight.shape[0]
    if max_norm is not None:
        _renorm_embedding_rows(weight, idx, max_norm, norm_type)
    if _fused_embedding_runs(weight, idx):
        attrs = {"padding_idx": padding_idx, "scale_grad_by_freq": bool(scale_grad_by_freq)}
        return apply(P["embedding"], (weight, idx), attrs)
    out = getitem(weight, idx)
    if scale_grad_by_freq and weight.requires_grad:
        # the rows' gradients divided by their index's count: a hook-free form, the gradient
        # passed through a product with constants of value 1 whose gradient is 1 / count
        out = _scaled_by_frequency(out, idx, weight.shape[0])
    if padding_idx is not None:
        # rows looked up at padding_idx get no gradient
        out = where(eq(idx, padding_idx).unsqueeze(-1), out.detach(), out)
    return out


def _fused_embedding_runs(weight: Tensor, idx: Tensor) -> bool:
    """The ``embedding`` primitive runs on float32 / float64 weights with no forward-AD level
    (whose tangents getitem's rule carries), the indices on the weight's device (the CPU, or
    CUDA: ``cuda/embedding.py``), in compiled programs too (as externs: a step with an
    Embedding(5000, 128) ran 0.8 ms against 6.1 ms with getitem and index_add_at); other calls
    (half dtypes, host indices of a CUDA weight) index."""
    if _forward_state.level is not None:
        return False
    w, i = weight._data, idx._data
    kind = type(w)
    if kind is not np.ndarray and kind is not CudaArray:
        return False
    return type(i) is kind and w.dtype in (np.float32, np.float64)


def _scaled_by_frequency(out: Tensor, idx: Tensor, rows: int) -> Tensor:
    """``out`` unchanged in value, its gradient divided by each index's count: ``out * s +
    out.detach() * (1 - s)`` with ``s = 1 / count`` (a constant)."""
    flat = idx.reshape(-1)
    ones = full(flat.shape, 1.0, dtype=out.dtype, device=out.device)
    counts = full((rows,), 0.0, dtype=out.dtype, device=out.device).index_add(0, flat, ones)
    scale = (1.0 / counts.index_select(0, flat)).reshape(idx.shape).unsqueeze(-1)
    return out * scale + out.detach() * (1.0 - scale)
