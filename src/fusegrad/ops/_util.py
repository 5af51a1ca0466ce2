"""Helpers shared by the op surface: argument conversion, promotion, shape and dim checks.

These never compute tensor values; they prepare the arguments of ``registry.apply``.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..autograd.tracer import notify_created as _created
from ..errors import DTypeError, IndexOutOfRange, ShapeError, describe
from ..size import broadcast_shapes
from ..tensor import Tensor, _to_array
from .registry import REGISTRY, apply

P = REGISTRY  # short alias used by the op surface modules


def is_tensor(x: object) -> bool:
    return isinstance(x, Tensor)


# the largest finite value of the float dtypes numpy warns about when a Python float
# overflows them on conversion
_NARROW_MAX = {np.dtype(np.float32): 3.4028234663852886e38, np.dtype(np.float16): 65504.0}


def scalar_tensor(value: Any, dtype: _dt.dtype) -> Tensor:
    """A Python number as a 0-d "wrapped number" tensor (weak in type promotion).  A float
    beyond the dtype's range becomes +-inf without a warning, as PyTorch's ``x * 1e300``."""
    np_dtype = dtype.np
    limit = _NARROW_MAX.get(np_dtype)
    if limit is not None and type(value) is float and abs(value) > limit:
        with np.errstate(over="ignore"):
            t = Tensor._make(np.array(value, dtype=np_dtype))
    else:
        t = Tensor._make(np.array(value, dtype=np_dtype))
    t._wrapped_number = True
    return t


def to_tensor(x: Any, dtype: _dt.dtype | None = None) -> Tensor:
    """Tensors pass through; numbers become wrapped scalars; arrays and lists become tensors."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, complex, np.number, np.bool_)):
        return scalar_tensor(x, dtype if dtype is not None else _dt.result_type(x))
    if _other_integral(x):
        # the compiler's symbolic size: its value, which the capture then guards
        return to_tensor(int(x), dtype)
    return Tensor._make(_to_array(x, dtype))  # ``tensor(x, dtype=dtype)``: a new CPU leaf


def _other_integral(x: object) -> bool:
    """An integral number that is no Python or numpy int (a symbolic size of the compiler)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, int, np.integer, np.bool_))


def is_number(x: object) -> bool:
    return isinstance(x, (bool, int, float, complex, np.number, np.bool_))


def operand(x: Any) -> Any:
    """Tensors and Python/numpy numbers pass through (numbers stay weak in promotion); arrays,
    lists and other data become tensors."""
    if isinstance(x, Tensor) or is_number(x):
        return x
    if _other_integral(x):
        return int(x)  # (a symbolic size: see ``to_tensor``)
    return to_tensor(x)


def cast(t: Tensor, dtype: _dt.dtype) -> Tensor:
    if t._dtype is dtype:
        return t
    if t._dtype.category == 3 and dtype.category != 3:
        # PyTorch's words (its copy kernel warns on every such cast); internal code takes
        # ``real`` explicitly instead
        warnings.warn(
            "Casting complex values to real discards the imaginary part", UserWarning, stacklevel=3
        )
    if t._wrapped_number:
        # a tracer that recorded ``t`` (a runtime scalar: ``optim.hyper``) sees the new
        # scalar as ``t``'s value cast, not as a constant
        return _created(scalar_tensor(t._data.item(), dtype), t)
    return apply(P["cast"], (t,), {"dtype": dtype})


def as_operand(x: Any, dtype: _dt.dtype) -> Tensor:
    if isinstance(x, Tensor):
        return cast(x, dtype)
    if isinstance(x, (bool, int, float, complex, np.number, np.bool_)):
        return scalar_tensor(x, dtype)
    return cast(to_tensor(x), dtype)


def broadcast_shape(op: str, *tensors: Tensor) -> tuple:
    shapes = [t._data.shape for t in tensors]
    first = shapes[0]
    if all(s == first for s in shapes):
        return first
    try:
        return broadcast_shapes(*shapes)
    except ValueError:
        detail = ""
        ndim = max(len(s) for s in shapes)
        for i in range(1, ndim + 1):
            sizes = [s[-i] if i <= len(s) else 1 for s in shapes]
            distinct = sorted({n for n in sizes if n != 1})
            if len(distinct) > 1:
                detail = f" (dim -{i}: {' vs '.join(str(n) for n in distinct)})"
                break
        shown = " and ".join(str(tuple(s)) for s in shapes)
        raise ShapeError(f"{op}: shapes {shown} cannot broadcast{detail}") from None


def require_float(op: str, t: Tensor) -> None:
    if t._dtype.category != 2:
        raise DTypeError(f"{op}: expected a floating point tensor, got {describe(t)}")


def wrap_dim(op: str, dim: Any, ndim: int) -> int:
    bound = max(ndim, 1)
    if isinstance(dim, Tensor):
        dim = int(dim)
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {dim!r}")
    if not -bound <= dim < bound:
        raise IndexOutOfRange(
            f"{op}: Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], "
            f"but got {dim})"
        )
    return int(dim) % bound


def wrap_dims(op: str, dim: Any, ndim: int) -> tuple[int, ...] | None:
    """``None`` (all dims) or a sorted tuple of distinct non-negative dims."""
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)) and len(dim) == 0:
        return None  # PyTorch: an empty dim list reduces over all dims
    if isinstance(dim, (list, tuple)):
        dims = tuple(wrap_dim(op, d, ndim) for d in dim)
        if len(set(dims)) != len(dims):
            raise ShapeError(f"{op}: dim {tuple(dim)} appears multiple times in the list of dims")
        return tuple(sorted(dims))
    return (wrap_dim(op, dim, ndim),)


def as_size(s: Any, what: str = "shape entries") -> Any:
    """A size argument as an int.  Any ``numbers.Integral`` is accepted; one that is not a plain
    or numpy int (the compiler's symbolic sizes are such) is kept as it is, so that arithmetic on
    it stays symbolic."""
    if type(s) is int:
        return s
    if isinstance(s, Tensor):
        return int(s)
    if isinstance(s, np.integer):
        return int(s)
    if isinstance(s, numbers.Integral) and not isinstance(s, bool):
        return s
    raise TypeError(f"{what} must be ints, got {s!r}")


def shape_arg(shape: Sequence[Any] | Iterable[Any]) -> tuple[int, ...]:
    """Accept ``f(2, 3)``, ``f((2, 3))`` and ``f([2, 3])`` shapes."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):  # type: ignore[arg-type]
        shape = shape[0]  # type: ignore[index]
    return tuple(as_size(s) for s in shape)
