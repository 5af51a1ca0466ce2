"""More of PyTorch's op surface, written over the ops below it: bit shifts, gcd/lcm, frexp,
nextafter, histograms, ``index_put``/``put``/``masked_scatter``, ``renorm``, ``nanmedian``,
``scatter_reduce``/``index_reduce``, the ``*_scatter`` and ``*_copy`` forms, ``binomial``,
``gradient``, and the Tensor methods scripts call that are other names of existing ops.

Differentiable ops are composites of primitives (``index_put`` accumulates through
``index_add_at``, ``renorm`` is a rescale, ``*_scatter`` are index puts), so autograd and the
compiler see ordinary primitives.  Integer and bit-level ops that PyTorch does not
differentiate (shifts, gcd, frexp, nextafter, histograms, binomial draws) compute on the host
with numpy and tell a tracing compiler that they read their inputs (a graph break there, never
a wrong value).  ``scatter_reduce``'s and ``index_reduce``'s ``amax``/``amin``/``prod`` run as
one node (``autograd.native.ScatterReduce``, which hands itself over on import, as the
convolution does) whose gradient splits evenly between tied extremes, as PyTorch's.

``METHODS`` and ``INPLACE`` list the Tensor methods this module adds; ``ops/__init__.py``
installs them with the rest.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import layouts as _layouts
from .. import return_types
from .. import storage as _storage
from ..autograd import grad_mode as _grad_mode
from ..autograd.graph_base import tensor_guards_changed
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import notify_host_read as _read
from ..cuda.array import CudaArray
from ..errors import ArgumentError, AutogradError, DTypeError, ShapeError, describe
from ..tensor import Tensor, legacy_array
from ._util import as_operand, cast, operand, shape_arg, to_tensor, wrap_dim
from .creation import _gen, _leaf, zeros, zeros_like
from .elementwise import add, div, isnan, logical_not, where
from .functional import hardshrink, prelu  # noqa: F401  (Tensor methods)
from .generated import floor_divide, mul
from .indexing import (
    _normalise_key,
    _split_ints,
    gather,
    index_add_at,
    scatter_add,
    setitem_value,
)
from .indexing import (
    scatter as _scatter,
)
from .primitives import key_shape, numpy_key
from .reduction import norm
from .shape import (
    cat,
    chunk,
    diagonal,
    expand,
    narrow,
    permute,
    reshape,
    select,
    split,
    squeeze,
    stack,
    t,
    transpose,
    unbind,
    unsqueeze,
    view,
)
from .sorting import median

# ``autograd.native`` (above the op surface) hands itself over on import (see its docstring)
_native: Any = None


def install_native(module: Any) -> None:
    """Called by ``fusegrad.autograd.native`` with itself."""
    global _native
    _native = module


__all__ = [
    "scatter",  # (with reduce=; replaces the plain one as function and method)
    "binomial",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "diagonal_scatter",
    "frexp",
    "gcd",
    "gradient",
    "histogram",
    "histogramdd",
    "index_put",
    "index_reduce",
    "lcm",
    "masked_scatter",
    "nanmedian",
    "nextafter",
    "nonzero_static",
    "put",
    "renorm",
    "scatter_reduce",
    "select_scatter",
    "slice_scatter",
    "split_with_sizes",
    "unsafe_chunk",
    "unsafe_split",
    "unsafe_split_with_sizes",
]


# ---- host-computed ops (not differentiable in PyTorch either) -----------------------------------


def _host(x: Tensor, what: str) -> np.ndarray:
    """``x``'s values on the host, telling a tracing compiler that ``what`` reads them."""
    _read(x, what)
    return np.asarray(_storage.to_host(x._data))


def _result(arr: np.ndarray, like: Tensor) -> Tensor:
    """A new leaf holding ``arr`` on ``like``'s device."""
    return _created(_leaf(np.ascontiguousarray(arr), False, like.device))


def _integer_pair(op: str, input: Any, other: Any) -> tuple[Tensor, Tensor, _dt.dtype]:
    a, b = operand(input), operand(other)
    dt = _dt.result_type(a, b)
    if dt.category != 1:
        raise DTypeError(f'"{op}" not implemented for {dt.name} (got {describe(a, b)})')
    a, b = to_tensor(a, dt), to_tensor(b, dt)
    return a, b, dt


def _shift(op: str, input: Any, other: Any, left: bool) -> Tensor:
    a, b, dt = _integer_pair(op, input, other)
    x, s = _host(a, f"{op}()"), _host(b, f"{op}()")
    x, s = np.broadcast_arrays(x.astype(dt.np), s.astype(dt.np))
    bits = dt.itemsize * 8
    inside = (s >= 0) & (s < bits)
    safe = np.where(inside, s, 0).astype(dt.np)
    if left:
        out = np.where(inside, np.left_shift(x, safe), 0)
    else:
        # shifting right by the width or more: the sign (-1 or 0), as PyTorch's kernels give
        past = np.where(x < 0, -1, 0) if dt.is_signed else 0
        out = np.where(inside, np.right_shift(x, safe), past)
    return _result(out.astype(dt.np), a if isinstance(input, Tensor) else b)


def bitwise_left_shift(input: Any, other: Any) -> Tensor:
    """``input << other`` for integers (0 where the shift is the width or more)."""
    return _shift("bitwise_left_shift", input, other, True)


def bitwise_right_shift(input: Any, other: Any) -> Tensor:
    """``input >> other`` for integers: an arithmetic shift for signed dtypes."""
    return _shift("bitwise_right_shift", input, other, False)


def gcd(input: Any, other: Any) -> Tensor:
    """The greatest common divisor (non-negative; ``gcd(0, 0) = 0``) of integers."""
    a, b, dt = _integer_pair("gcd", input, other)
    out = np.gcd(_host(a, "gcd()"), _host(b, "gcd()"))
    return _result(out.astype(dt.np), a)


def lcm(input: Any, other: Any) -> Tensor:
    """The least common multiple (non-negative) of integers."""
    a, b, dt = _integer_pair("lcm", input, other)
    out = np.lcm(_host(a, "lcm()"), _host(b, "lcm()"))
    return _result(out.astype(dt.np), a)


def frexp(input: Any) -> tuple[Tensor, Tensor]:
    """``(mantissa, exponent)`` with ``input = mantissa * 2 ** exponent`` and ``0.5 <=
    |mantissa| < 1`` (int32 exponents)."""
    x = to_tensor(input)
    if x.dtype.category != 2:
        raise DTypeError(f"torch.frexp() only supports floating-point dtypes, got {describe(x)}")
    mantissa, exponent = np.frexp(_host(x, "frexp()"))
    return return_types.frexp(
        _result(mantissa.astype(x.dtype.np), x), _result(exponent.astype(np.int32), x)
    )


def nextafter(input: Any, other: Any) -> Tensor:
    """The next representable float after ``input`` towards ``other``."""
    a, b = operand(input), operand(other)
    dt = _dt.result_type(a, b)
    if dt.category != 2:
        raise DTypeError(f'"nextafter" not implemented for {dt.name}')
    a, b = cast(to_tensor(a, dt), dt), cast(to_tensor(b, dt), dt)
    out = np.nextafter(_host(a, "nextafter()"), _host(b, "nextafter()"))
    return _result(out.astype(dt.np), a)


def _histogram_args(x: Tensor, weight: Any) -> tuple[np.ndarray, np.ndarray | None]:
    if x.dtype.category != 2:
        raise DTypeError(f"torch.histogram: input tensor must be floating point, got {describe(x)}")
    w = None if weight is None else _host(to_tensor(weight), "histogram()")
    return _host(x, "histogram()"), w


def histogram(
    input: Any,
    bins: Any = 100,
    *,
    range: Sequence[float] | None = None,  # noqa: A002  (PyTorch's argument name)
    weight: Any = None,
    density: bool = False,
) -> tuple[Tensor, Tensor]:
    """``(hist, bin_edges)`` of the flattened input: ``bins`` equal bins over ``range`` (the
    data's minimum and maximum by default), or the given edges (a 1-D tensor)."""
    x = to_tensor(input)
    values, w = _histogram_args(x, weight)
    edges: Any = bins
    if isinstance(bins, Tensor):
        edges = _host(bins, "histogram()")
    counts, out_edges = np.histogram(
        values.reshape(-1),
        bins=edges,
        range=None if range is None else (float(range[0]), float(range[1])),
        weights=None if w is None else w.reshape(-1),
        density=density,
    )
    return return_types.histogram(
        _result(counts.astype(x.dtype.np), x), _result(out_edges.astype(x.dtype.np), x)
    )


def histogramdd(
    input: Any,
    bins: Any = 10,
    *,
    range: Sequence[float] | None = None,  # noqa: A002
    weight: Any = None,
    density: bool = False,
) -> tuple[Tensor, list[Tensor]]:
    """The D-dimensional histogram of the rows of an (N, D) input: ``(hist, [edges per
    dim])``; ``range`` lists (min, max) pairs flat, as PyTorch's."""
    x = to_tensor(input)
    values, w = _histogram_args(x, weight)
    dims = values.shape[-1]
    if isinstance(bins, Tensor) or (
        isinstance(bins, (list, tuple)) and bins and isinstance(bins[0], Tensor)
    ):
        bins = [_host(b, "histogramdd()") for b in bins]
    ranges = None
    if range is not None:
        ranges = [(float(range[2 * i]), float(range[2 * i + 1])) for i in builtins.range(dims)]
    counts, edges = np.histogramdd(
        values.reshape(-1, dims),
        bins=bins,
        range=ranges,
        weights=None if w is None else w.reshape(-1),
        density=density,
    )
    return return_types.histogramdd(
        _result(counts.astype(x.dtype.np), x), [_result(e.astype(x.dtype.np), x) for e in edges]
    )


def binomial(count: Any, prob: Any, generator: Any = None) -> Tensor:
    """Draws of Binomial(``count``, ``prob``), elementwise (floats, as PyTorch's)."""
    n, p = to_tensor(count), to_tensor(prob)
    if n.dtype.category != 2 or p.dtype.category != 2:
        raise DTypeError(f"binomial: expected floating point count and prob, got {describe(n, p)}")
    counts, probs = np.broadcast_arrays(_host(n, "binomial()"), _host(p, "binomial()"))
    draws = _gen(generator).binomial(counts.astype(np.int64), probs)
    return _result(draws.astype(n.dtype.np), n)


def nonzero_static(input: Any, *, size: int, fill_value: int = -1) -> Tensor:
    """``nonzero(input)`` padded with ``fill_value`` (or cut) to exactly ``size`` rows."""
    x = to_tensor(input)
    found = np.argwhere(_host(x, "nonzero_static()"))
    out = np.full((int(size), x.ndim), int(fill_value), np.int64)
    count = builtins.min(int(size), found.shape[0])
    out[:count] = found[:count]
    return _result(out, x)


# ---- differentiable composites ----------------------------------------------------------------


def _key_target(shape: tuple, tensors: tuple, spec: tuple) -> tuple:
    """The shape ``x[key]`` has, for an ``x`` of ``shape`` and a normalised key."""
    if builtins.any(t._dtype is _dt.bool_ for t in tensors):  # a mask: its count decides
        probe = np.broadcast_to(np.empty((), dtype=bool), shape)
        return probe[numpy_key(spec, tuple(_storage.to_host(t._data) for t in tensors))].shape
    shapes = tuple(t.shape for t in tensors)
    return tuple(key_shape(shape, shapes, tuple(t._dtype for t in tensors), spec))


def _accumulated(shape: tuple, dtype: _dt.dtype, v: Tensor, tensors: tuple, spec: tuple) -> Tensor:
    """Zeros of ``shape`` with ``v`` (broadcast to ``[key]``'s shape) added at ``key``."""
    target = _key_target(shape, tensors, spec)
    if tuple(v.shape) != target:
        v = expand(v, target)
    return index_add_at(cast(v, dtype), tensors, spec, shape)


def index_put(input: Any, indices: Sequence[Any], values: Any, accumulate: bool = False) -> Tensor:
    """``input`` with ``input[indices] = values`` (``accumulate``: added, repeated indices
    summing), out of place; differentiable with respect to both."""
    x = to_tensor(input)
    key = tuple(indices)
    if not accumulate:
        return setitem_value(x, key, values)
    spec, tensors = _normalise_key(x, key)
    v = as_operand(values, x.dtype)
    shape = tuple(x.shape)
    split = _split_ints(spec, tensors)
    if split is None:
        return add(x, _accumulated(shape, x.dtype, v, tensors, spec))
    # integer indices select first (PyTorch's placement, as in getitem): accumulate into that
    # part, then put the part back where it came from
    first, rest = split
    part = _key_target(shape, (), first)
    placed = _accumulated(part, x.dtype, v, tensors, rest)
    return add(x, index_add_at(placed, (), first, shape))


def put(input: Any, index: Any, source: Any, accumulate: bool = False) -> Tensor:
    """``input`` with the elements at flat positions ``index`` (negative ones count from the
    end) set to ``source`` (``accumulate``: added), out of place."""
    x = to_tensor(input)
    idx = to_tensor(index)
    flat = reshape(x, (-1,))
    values = reshape(to_tensor(source, x.dtype), (-1,))
    out = index_put(flat, [reshape(idx, (-1,))], values, accumulate)
    return reshape(out, tuple(x.shape))


def masked_scatter(input: Any, mask: Any, source: Any) -> Tensor:
    """``input`` with the positions where ``mask`` (broadcast) is True filled, in row-major
    order, with the first elements of ``source``."""
    x, m, src = to_tensor(input), to_tensor(mask), to_tensor(source)
    if m.dtype is not _dt.bool_:
        raise DTypeError(f"masked_scatter_ only supports boolean masks, but got {describe(m)}")
    m = expand(m, tuple(x.shape)) if tuple(m.shape) != tuple(x.shape) else m
    count = int(_host(m, "masked_scatter()").sum())
    if count > src.numel():
        raise ShapeError(
            f"masked_scatter: expected source to have at least {count} elements (the mask's "
            f"True count), got {describe(src)}"
        )
    taken = narrow(reshape(src, (-1,)), 0, 0, count)
    return setitem_value(x, m, cast(taken, x.dtype))


def renorm(input: Any, p: float, dim: int, maxnorm: float) -> Tensor:
    """Each slice along ``dim`` rescaled so that its ``p``-norm is at most ``maxnorm``."""
    x = to_tensor(input)
    if x.dtype.category != 2:
        raise DTypeError(f"renorm: expected a floating point tensor, got {describe(x)}")
    if maxnorm < 0:
        raise ArgumentError(f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    d = wrap_dim("renorm", dim, x.ndim)
    others = tuple(i for i in builtins.range(x.ndim) if i != d)
    norms = norm(x, p, dim=others, keepdim=True) if others else x.abs()
    # PyTorch's factor: maxnorm / (norm + 1e-7) where the norm exceeds maxnorm, 1 elsewhere
    # (differentiated through the norm, as PyTorch's renorm_backward is)
    factor = where(norms > maxnorm, div(maxnorm, add(norms, 1e-7)), 1.0)
    return mul(x, factor)


def nanmedian(input: Any, dim: Any = None, keepdim: bool = False) -> Any:
    """``median`` that ignores NaN (NaN only where a slice holds nothing else): the lower
    median of the non-NaN elements; ``(values, indices)`` along ``dim``."""
    x = to_tensor(input)
    if dim is None:
        flat = reshape(x, (-1,))
        keep = logical_not(isnan(flat))
        values = flat[keep]
        if values.numel() == 0:
            return flat.sum() * float("nan") if flat.numel() else median(flat)
        return median(values)
    d = wrap_dim("nanmedian", dim, x.ndim)
    data = _host(x.detach(), "nanmedian()")
    moved = np.moveaxis(data, d, -1)
    order = np.argsort(np.where(np.isnan(moved), np.inf, moved), axis=-1, kind="stable")
    valid = (~np.isnan(moved)).sum(-1)
    pick = np.where(valid > 0, (valid - 1) // 2, 0)
    idx = np.take_along_axis(order, pick[..., None], -1)[..., 0]
    idx = np.where(valid > 0, idx, np.argmax(np.isnan(moved), -1))
    index = _result(np.expand_dims(idx, d).astype(np.int64), x)
    values = gather(x, d, index)
    if not keepdim:
        values, index = squeeze(values, d), squeeze(index, d)
    return return_types.nanmedian(values, index)


def scatter(
    input: Any,
    dim: int,
    index: Any,
    src: Any = None,
    *,
    value: Any = None,
    reduce: str | None = None,
) -> Tensor:
    """``scatter``, with PyTorch's (deprecated) ``reduce="add"`` or ``"multiply"``: the
    scattered values are added to, or multiply, what is there."""
    if reduce is None:
        return _scatter(input, dim, index, src, value=value)
    if reduce not in ("add", "multiply"):
        raise ArgumentError(f"reduce argument must be either add or multiply, got {reduce}")
    x, idx = to_tensor(input), to_tensor(index)
    s = src if src is not None else value
    if not isinstance(s, Tensor):
        s = zeros(tuple(idx.shape), dtype=x.dtype, device=x.device) + s
    if reduce == "add":
        return scatter_add(x, dim, idx, s)
    return scatter_reduce(x, dim, idx, s, "prod")


# ---- scatter_reduce / index_reduce --------------------------------------------------------------

_SCATTER_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def scatter_reduce(
    input: Any, dim: int, index: Any, src: Any, reduce: str, *, include_self: bool = True
) -> Tensor:
    """``input`` with each ``src[i]`` reduced (``sum``, ``prod``, ``mean``, ``amax``,
    ``amin``) into position ``index[i]`` along ``dim`` (with the value there when
    ``include_self``; positions nothing is scattered to keep ``input``'s value)."""
    x, idx, s = to_tensor(input), to_tensor(index), to_tensor(src)
    if reduce not in _SCATTER_REDUCES:
        raise ArgumentError(
            f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}"
        )
    if idx.dtype is not _dt.int64:
        raise DTypeError(f"scatter_reduce(): Expected dtype int64 for index, got {describe(idx)}")
    d = wrap_dim("scatter_reduce", dim, x.ndim)
    if idx.ndim != x.ndim or builtins.any(i > n for i, n in zip(idx.shape, s.shape)):
        raise ShapeError(
            f"scatter_reduce(): index {describe(idx)} must have the rank of input {describe(x)} "
            f"and be no larger than src {describe(s)}"
        )
    if tuple(s.shape) != tuple(idx.shape):  # (only the index's part of src takes part)
        s = s[tuple(slice(0, n) for n in idx.shape)]
    s = cast(s, x.dtype)
    if reduce in ("sum", "mean"):
        ones = zeros_like(s, dtype=x.dtype) + 1
        base = x if include_self else scatter(x, d, idx, zeros_like(s, dtype=x.dtype))
        total = scatter_add(base, d, idx, s)
        if reduce == "sum":
            return total
        count = scatter_add(zeros_like(x) + (1 if include_self else 0), d, idx, ones)
        count = where(count == 0, 1, count)
        out = div(total, count)
        return out if x.dtype.category == 2 else cast(floor_divide(total, count), x.dtype)
    return _native.ScatterReduce.apply(x, s, idx, d, reduce, include_self)


def index_reduce(
    input: Any, dim: int, index: Any, source: Any, reduce: str, *, include_self: bool = True
) -> Tensor:
    """``input`` with the slices of ``source`` reduced (``prod``, ``mean``, ``amax``,
    ``amin``) into the slices at ``index`` along ``dim``."""
    x, idx, s = to_tensor(input), to_tensor(index), to_tensor(source)
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise ArgumentError(
            f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin, got {reduce}."
        )
    if idx.ndim != 1:
        raise ShapeError(f"index_reduce_(): Index is supposed to be a vector, got {describe(idx)}")
    d = wrap_dim("index_reduce", dim, x.ndim)
    # the 1-D index spread over source's shape: scatter_reduce along dim does the rest
    shape = [1] * s.ndim
    shape[d] = idx.shape[0]
    spread = expand(reshape(cast(idx, _dt.int64), tuple(shape)), tuple(s.shape))
    return scatter_reduce(x, d, spread, s, reduce, include_self=include_self)


def scatter_reduce_host(
    x: np.ndarray, src: np.ndarray, index: np.ndarray, dim: int, reduce: str, include_self: bool
) -> np.ndarray:
    """``scatter_reduce``'s values for ``prod``/``amax``/``amin`` with numpy's ``ufunc.at``
    (``autograd.native.ScatterReduce``'s forward)."""
    ufunc = {"prod": np.multiply, "amax": np.maximum, "amin": np.minimum}[reduce]
    out = x.copy()
    grid = list(np.indices(index.shape, sparse=True))
    grid[dim] = index
    key = tuple(grid)
    if not include_self:
        identity = {"prod": 1, "amax": -np.inf, "amin": np.inf}[reduce]
        if out.dtype.kind != "f" and reduce != "prod":
            info = np.iinfo(out.dtype)
            identity = info.min if reduce == "amax" else info.max
        touched = np.zeros(out.shape, bool)
        touched[key] = True
        out[touched] = identity
    ufunc.at(out, key, src[tuple(slice(0, n) for n in index.shape)])
    return out


# ---- the *_scatter forms: a slice of a copy replaced -------------------------------------------


def _embed(x: Tensor, src: Any, key: tuple, op: str) -> Tensor:
    s = to_tensor(src, x.dtype)
    target = tuple(x[key].shape)
    if tuple(s.shape) != target:
        raise ShapeError(
            f"{op}: expected src to have a size equal to the slice of self {list(target)}, got "
            f"{list(s.shape)}"
        )
    return setitem_value(x, key, cast(s, x.dtype))


def select_scatter(input: Any, src: Any, dim: int, index: int) -> Tensor:
    """A copy of ``input`` with ``input.select(dim, index)`` replaced by ``src``."""
    x = to_tensor(input)
    d = wrap_dim("select_scatter", dim, x.ndim)
    return _embed(x, src, (slice(None),) * d + (int(index),), "select_scatter")


def slice_scatter(
    input: Any,
    src: Any,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> Tensor:
    """A copy of ``input`` with the slice ``start:end:step`` along ``dim`` replaced by ``src``."""
    x = to_tensor(input)
    d = wrap_dim("slice_scatter", dim, x.ndim)
    return _embed(x, src, (slice(None),) * d + (slice(start, end, step),), "slice_scatter")


def diagonal_scatter(input: Any, src: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """A copy of ``input`` with ``input.diagonal(offset, dim1, dim2)`` replaced by ``src``."""
    x = to_tensor(input)
    s = to_tensor(src, x.dtype)
    current = diagonal(x, offset, dim1, dim2)
    if tuple(s.shape) != tuple(current.shape):
        raise ShapeError(
            f"diagonal_scatter: expected src to have a size equal to the diagonal "
            f"{list(current.shape)}, got {list(s.shape)}"
        )
    # with dim1 and dim2 moved last, the diagonal is [..., rows, cols], laid out as
    # ``diagonal`` lays it out (its own dim last)
    a, b = wrap_dim("diagonal_scatter", dim1, x.ndim), wrap_dim("diagonal_scatter", dim2, x.ndim)
    n = current.shape[-1]
    rows = _result((np.arange(n) + builtins.max(-offset, 0)).astype(np.int64), x)
    cols = _result((np.arange(n) + builtins.max(offset, 0)).astype(np.int64), x)
    moved = x.movedim((a, b), (-2, -1))
    out = setitem_value(moved, (Ellipsis, rows, cols), cast(s, x.dtype))
    return out.movedim((-2, -1), (a, b))


# ---- other names and copies of view ops ---------------------------------------------------------


def split_with_sizes(input: Any, split_sizes: Sequence[int], dim: int = 0) -> tuple:
    """``split`` into parts of the given sizes (which must add up to the dim's size)."""
    x = to_tensor(input)
    d = wrap_dim("split_with_sizes", dim, x.ndim)
    sizes = [int(v) for v in split_sizes]
    if builtins.sum(sizes) != x.shape[d]:
        raise ShapeError(
            f"split_with_sizes expects split_sizes to sum exactly to {x.shape[d]} (input tensor's "
            f"size at dimension {d}), but got split_sizes={sizes}"
        )
    return split(x, sizes, d)


def unsafe_split(input: Any, split_size: int, dim: int = 0) -> tuple:
    """``split`` (PyTorch's variant whose parts may be modified in place)."""
    return tuple(part.clone() for part in split(input, split_size, dim))


def unsafe_split_with_sizes(input: Any, split_sizes: Sequence[int], dim: int = 0) -> tuple:
    """``split_with_sizes`` whose parts may be modified in place."""
    return tuple(part.clone() for part in split_with_sizes(input, split_sizes, dim))


def unsafe_chunk(input: Any, chunks: int, dim: int = 0) -> tuple:
    """``chunk`` whose parts may be modified in place."""
    return tuple(part.clone() for part in chunk(input, chunks, dim))


def _copy_of(view_fn: Any, name: str) -> Any:
    def copy(input: Any, *args: Any, **kwargs: Any) -> Any:
        out = view_fn(to_tensor(input), *args, **kwargs)
        if isinstance(out, (tuple, list)):
            return type(out)(o.clone() for o in out)
        return out.clone()

    copy.__name__ = name
    copy.__qualname__ = name
    copy.__doc__ = f"``{name[:-5]}`` as a new tensor (a copy, not a view)."
    return copy


def _tensor_unfold(input: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """``Tensor.unfold``: every ``size``-long window along ``dimension``, ``step`` apart, as a
    new last dim (the dim itself becomes the window count)."""
    x = to_tensor(input)
    d = wrap_dim("unfold", dimension, builtins.max(x.ndim, 1))
    if x.ndim == 0:
        x = x.reshape(1)
    n = x.shape[d]
    if size > n or size < 0 or step <= 0:
        raise ShapeError(
            f"unfold: maximum size for tensor at dimension {d} is {n} but size is {size} (step "
            f"{step} must be positive)"
        )
    count = (n - size) // step + 1
    lead = (slice(None),) * d
    span = (count - 1) * step + 1
    parts = [x[lead + (slice(a, a + span, step),)] for a in builtins.range(size)]
    if not parts:  # size 0: empty windows
        shape = tuple(x.shape[:d]) + (count,) + tuple(x.shape[d + 1 :]) + (0,)
        return zeros(shape, dtype=x.dtype, device=x.device)
    return stack(parts, x.ndim)


def gradient(input: Any, *, spacing: Any = 1, dim: Any = None, edge_order: int = 1) -> tuple:
    """Central differences of ``input`` along each of ``dim`` (all dims by default), one-sided
    (first or second order, ``edge_order``) at the ends: numpy's ``gradient``.  ``spacing`` is
    one step for every dim, one per dim, or per-dim coordinate tensors (uneven steps).
    Differentiable with respect to ``input``."""
    x = to_tensor(input)
    if x.dtype.category != 2:
        x = cast(x, _dt.get_default_dtype())
    if dim is None:
        dims = list(builtins.range(x.ndim))
    elif isinstance(dim, (int, np.integer)):
        dims = [wrap_dim("gradient", dim, x.ndim)]
    else:
        dims = [wrap_dim("gradient", d, x.ndim) for d in dim]
    if edge_order not in (1, 2):
        raise ArgumentError(
            f"torch.gradient only supports edge_order=1 and edge_order=2, got {edge_order}"
        )
    if isinstance(spacing, (list, tuple)):
        steps = list(spacing)
        if len(steps) == 1 and len(dims) > 1:
            steps = steps * len(dims)
        if len(steps) != len(dims):
            raise ShapeError(
                f"torch.gradient expected spacing to be unspecified, a scalar or a list of length "
                f"{len(dims)}, but got a list of length {len(steps)}"
            )
    else:
        steps = [spacing] * len(dims)
    out = []
    for d, step in zip(dims, steps):
        n = x.shape[d]
        if n < edge_order + 1:
            raise ShapeError(
                f"torch.gradient expected each dimension size to be at least edge_order+1 "
                f"(dim {d} has {n})"
            )
        out.append(_gradient_along(x, d, step, edge_order))
    return tuple(out)


def _gradient_along(x: Tensor, d: int, step: Any, edge_order: int) -> Tensor:
    n = x.shape[d]

    def part(start: int, stop: int | None) -> Tensor:
        return x[(slice(None),) * d + (slice(start, stop),)]

    def coeff(values: np.ndarray) -> Tensor:
        shape = [1] * x.ndim
        shape[d] = values.shape[0]
        return _result(values.reshape(shape).astype(x.dtype.np), x)

    if isinstance(step, Tensor):
        coords = _host(step, "gradient()").astype(np.float64)
        if coords.shape != (n,):
            raise ShapeError(f"torch.gradient: coordinates for dim {d} must have {n} entries")
        dx = np.diff(coords)
    else:
        dx = np.full(n - 1, float(step))
    hs, hd = dx[:-1], dx[1:]
    # interior: numpy's second-order formula for uneven steps (the central difference when even)
    a = -hd / (hs * (hs + hd))
    b = (hd - hs) / (hs * hd)
    c = hs / (hd * (hs + hd))
    interior = add(
        add(mul(part(0, n - 2), coeff(a)), mul(part(1, n - 1), coeff(b))),
        mul(part(2, None), coeff(c)),
    )
    if edge_order == 1:
        first = div(x.narrow(d, 1, 1) - x.narrow(d, 0, 1), float(dx[0]))
        last = div(x.narrow(d, n - 1, 1) - x.narrow(d, n - 2, 1), float(dx[-1]))
    else:
        h1, h2 = float(dx[0]), float(dx[1])
        first = (
            x.narrow(d, 0, 1) * (-(2 * h1 + h2) / (h1 * (h1 + h2)))
            + x.narrow(d, 1, 1) * ((h1 + h2) / (h1 * h2))
            + x.narrow(d, 2, 1) * (-h1 / (h2 * (h1 + h2)))
        )
        h1, h2 = float(dx[-2]), float(dx[-1])
        last = (
            x.narrow(d, n - 3, 1) * (h2 / (h1 * (h1 + h2)))
            + x.narrow(d, n - 2, 1) * (-(h2 + h1) / (h1 * h2))
            + x.narrow(d, n - 1, 1) * ((2 * h2 + h1) / (h2 * (h1 + h2)))
        )
    return cat([first, interior, last], d)


# ---- Tensor-only methods --------------------------------------------------------------------


def _type_as(self: Tensor, other: Tensor) -> Tensor:
    """``self`` in ``other``'s dtype (``self`` when it already is)."""
    return self if self.dtype is other.dtype else cast(self, other.dtype)


def _new(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """The legacy ``self.new(...)``: ``Tensor(...)`` in ``self``'s dtype and device."""
    arr = legacy_array(args, self.dtype, "new")
    return _created(_leaf(arr, False, self.device))


def _ndimension(self: Tensor) -> int:
    return self.ndim


def _storage_offset(self: Tensor) -> int:
    """Elements between the start of the storage this tensor views and its first element."""
    data = self._data
    if isinstance(data, CudaArray):
        return data.offset // data.itemsize
    base = data
    while isinstance(base.base, np.ndarray):
        base = base.base
    start = data.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return start // data.itemsize


def _is_set_to(self: Tensor, other: Tensor) -> bool:
    """Whether both tensors view the same memory with the same geometry."""
    a, b = self._data, other._data
    if isinstance(a, CudaArray) or isinstance(b, CudaArray):
        return (
            isinstance(a, CudaArray)
            and isinstance(b, CudaArray)
            and a.buffer is b.buffer
            and (a.offset, a.shape, a.strides, a.dtype) == (b.offset, b.shape, b.strides, b.dtype)
        )
    return (
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.shape == b.shape
        and a.strides == b.strides
        and a.dtype == b.dtype
    )


def _dim_order(self: Tensor) -> tuple:
    """The dims from outermost to innermost in memory (by stride, ties in dim order)."""
    strides = self.stride()
    return tuple(sorted(builtins.range(self.ndim), key=lambda i: (-strides[i], i)))


def _resize(self: Tensor, *sizes: Any) -> Tensor:
    """``resize_``: this tensor takes the given shape, keeping its first elements (new ones
    are uninitialised, here zeros); the storage is replaced, so views of the old one stop
    sharing it.  Refused on a tensor that requires grad, as in PyTorch."""
    shape = tuple(int(v) for v in shape_arg(sizes))
    if self.requires_grad and _grad_mode.is_grad_enabled():
        raise AutogradError("cannot resize variables that require grad")
    if builtins.any(v < 0 for v in shape):
        raise ShapeError(f"resize_: negative dimension in {list(shape)}")
    if shape == tuple(self.shape):
        return self
    old = np.ascontiguousarray(_storage.to_host(self._data)).reshape(-1)
    new = np.zeros(math.prod(shape), old.dtype)
    keep = builtins.min(old.size, new.size)
    new[:keep] = old[:keep]
    arr = new.reshape(shape)
    self._data = arr if self.device.type == "cpu" else _leaf(arr, False, self.device)._data
    tensor_guards_changed(self)
    self._bump()
    return self


def _resize_as(self: Tensor, other: Tensor) -> Tensor:
    return _resize(self, *other.shape)


def _fill_diagonal(self: Tensor, fill_value: Any, wrap: bool = False) -> Tensor:
    """The main diagonal (all dims equal indices; for a tall matrix with ``wrap``, again every
    ``cols + 1`` rows) set to ``fill_value``, out of place (``fill_diagonal_``'s value)."""
    if self.ndim < 2:
        raise ShapeError(f"fill_diagonal_: dimensions must larger than 1 (got {describe(self)})")
    if self.ndim > 2 and len(set(self.shape)) != 1:
        raise ShapeError("fill_diagonal_: all dimensions of input must be of equal length")
    n = builtins.min(self.shape)
    positions = [np.arange(n)] * self.ndim
    if wrap and self.ndim == 2 and self.shape[0] > self.shape[1] + 1:
        rows, cols = self.shape
        flat = np.arange(0, rows * cols, cols + 1)
        positions = [flat // cols, flat % cols]
    key = tuple(_result(p.astype(np.int64), self) for p in positions)
    return setitem_value(self, key, fill_value)


def _elementwise_python(self: Tensor, fn: Any, *others: Tensor) -> Tensor:
    """``fn`` applied to each element (with the matching elements of ``others``, broadcast to
    ``self``'s shape): CPU tensors only, as in PyTorch."""
    if self.is_cuda or builtins.any(o.is_cuda for o in others):
        raise ArgumentError("apply_/map_ are only implemented on CPU tensors")
    args = [_host(self, "apply_()")] + [
        np.broadcast_to(_host(o, "map_()"), tuple(self.shape)) for o in others
    ]
    out = np.frompyfunc(fn, len(args), 1)(*args) if args[0].size else args[0].copy()
    return _result(np.asarray(out, dtype=self.dtype.np).reshape(tuple(self.shape)), self)


def _apply(self: Tensor, fn: Any) -> Tensor:
    return _elementwise_python(self, fn)


def _map(self: Tensor, other: Tensor, fn: Any) -> Tensor:
    return _elementwise_python(self, fn, to_tensor(other))


def _map2(self: Tensor, x: Tensor, y: Tensor, fn: Any) -> Tensor:
    return _elementwise_python(self, fn, to_tensor(x), to_tensor(y))


def _drawn(self: Tensor, sample: Any, generator: Any) -> Tensor:
    """A tensor of ``self``'s shape and dtype drawn by ``sample(rng, shape)``."""
    shape, dtype = tuple(self.shape), self.dtype.np

    def draw() -> Tensor:
        return Tensor._make(np.asarray(sample(_gen(generator), shape)).astype(dtype))

    t = _created(draw(), draw)
    return t if t.device == self.device else t.to(self.device)


def _random(self: Tensor, start: Any = None, to: Any = None, *, generator: Any = None) -> Tensor:
    """``random_()``: integers uniform in [0, 2**mantissa bits) (one argument: [0, to), two:
    [from, to)), as values of ``self``'s dtype."""
    if to is None and start is not None:
        start, to = 0, start
    if start is None:
        start = 0
        if self.dtype.category == 2:
            to = 2 ** (np.finfo(self.dtype.np).nmant + 1) + 1
        elif self.dtype is _dt.bool_:
            to = 2
        else:
            to = int(np.iinfo(self.dtype.np).max) + 1
    lo, hi = int(start), int(to)
    if lo >= hi:
        raise ArgumentError(
            f"random_ expects 'from' to be less than 'to', but got from={lo} >= to={hi}"
        )
    return _drawn(self, lambda rng, shape: rng.integers(lo, hi, shape), generator)


def _cauchy(
    self: Tensor, median: float = 0.0, sigma: float = 1.0, *, generator: Any = None
) -> Tensor:
    return _drawn(self, lambda rng, shape: median + sigma * rng.standard_cauchy(shape), generator)


def _exponential(self: Tensor, lambd: float = 1.0, *, generator: Any = None) -> Tensor:
    return _drawn(self, lambda rng, shape: rng.exponential(1.0 / lambd, shape), generator)


def _geometric(self: Tensor, p: float, *, generator: Any = None) -> Tensor:
    return _drawn(self, lambda rng, shape: rng.geometric(p, shape), generator)


def _log_normal(
    self: Tensor, mean: float = 1.0, std: float = 2.0, *, generator: Any = None
) -> Tensor:
    return _drawn(self, lambda rng, shape: rng.lognormal(mean, std, shape), generator)


def _bernoulli_fill(self: Tensor, p: Any = 0.5, *, generator: Any = None) -> Tensor:
    if isinstance(p, Tensor):
        probs = np.broadcast_to(_host(p, "bernoulli_()"), tuple(self.shape))
        return _drawn(self, lambda rng, shape: rng.random(shape) < probs, generator)
    return _drawn(self, lambda rng, shape: rng.random(shape) < float(p), generator)


def _view_inplace(name: str, view_fn: Any) -> Any:
    """An in-place view op (``squeeze_``, ``t_``, ...): the tensor itself takes the view's
    shape (and, when it records history, the view's node)."""

    def method(self: Tensor, *args: Any) -> Tensor:
        if self.requires_grad and self.grad_fn is None and _grad_mode.is_grad_enabled():
            raise AutogradError(
                "a leaf Variable that requires grad is being used in an in-place operation."
            )
        out = view_fn(self, *args)
        self._data = out._data
        tensor_guards_changed(self)
        if out.grad_fn is not None and _grad_mode.is_grad_enabled():
            self._set_history(out.grad_fn, out._output_nr)
        self._bump()
        return self

    method.__name__ = name
    method.__doc__ = f"``{name[:-1]}`` applied to this tensor in place (its shape changes)."
    return method


def _false(self: Tensor) -> bool:
    return False


def _nbytes(self: Tensor) -> int:
    return self.numel() * self.dtype.itemsize


def _itemsize(self: Tensor) -> int:
    return self.dtype.itemsize


def _is_cpu(self: Tensor) -> bool:
    return not self.is_cuda


def _is_nonzero(self: Tensor) -> bool:
    if self.numel() != 1:
        raise ArgumentError(
            "Boolean value of Tensor with more than one value is ambiguous"
            if self.numel()
            else "Boolean value of Tensor with no values is ambiguous"
        )
    return bool(self)


def _is_same_size(self: Tensor, other: Tensor) -> bool:
    return tuple(self.shape) == tuple(other.shape)


def _is_signed(self: Tensor) -> bool:
    return self.dtype.is_signed


def _is_complex(self: Tensor) -> bool:
    return self.dtype.is_complex


# methods that are the op-surface function of the same name (installed by ``ops/__init__``)
METHOD_NAMES = (
    "addmv addr adjoint aminmax bincount clamp_max clamp_min copysign corrcoef cov deg2rad "
    "diag_embed diagflat dist dsplit fliplr flipud float_power fmax fmin fmod frac heaviside "
    "hsplit isneginf isposinf isreal kron ldexp logaddexp2 logit moveaxis multiply mvlgamma "
    "nanmean nanquantile nansum positive quantile rad2deg ravel rot90 sgn signbit subtract "
    "take tensor_split trace vdot vsplit xlogy bitwise_left_shift bitwise_right_shift gcd lcm "
    "frexp nextafter histogram index_put put masked_scatter renorm nanmedian scatter_reduce "
    "index_reduce select_scatter slice_scatter diagonal_scatter split_with_sizes unsafe_chunk "
    "unsafe_split unsafe_split_with_sizes bernoulli nonzero_static"
).split()

# in-place methods: name -> the function whose result is written into the tensor
INPLACE_NAMES = (
    "addbmm addmm baddbmm addmv addr copysign cumprod cumsum deg2rad float_power fmod frac "
    "heaviside ldexp logit "
    "multiply mvlgamma rad2deg sgn sinc subtract tril triu xlogy bitwise_left_shift "
    "bitwise_right_shift gcd lcm nextafter index_put put masked_scatter renorm scatter_reduce "
    "index_reduce"
).split()


def _tensor_where(self: Tensor, condition: Any, other: Any) -> Tensor:
    """``x.where(condition, y)``: PyTorch's ``torch.where(condition, x, y)`` (the tensor is the
    values where ``condition`` holds, not the condition)."""
    return where(condition, self, other)


# other methods, and properties, of Tensor
OTHER_METHODS: dict[str, Any] = {
    "where": _tensor_where,
    "type_as": _type_as,
    "new": _new,
    "ndimension": _ndimension,
    "storage_offset": _storage_offset,
    "is_set_to": _is_set_to,
    "dim_order": _dim_order,
    "resize_": _resize,
    "resize_as_": _resize_as,
    "unfold": _tensor_unfold,
    "narrow_copy": None,  # (filled below: narrow's copy)
    "const_data_ptr": lambda self: self.data_ptr(),
    "hardshrink": hardshrink,
    "prelu": prelu,
    "is_nonzero": _is_nonzero,
    "is_same_size": _is_same_size,
    "is_signed": _is_signed,
    "is_complex": _is_complex,
    "squeeze_": _view_inplace("squeeze_", squeeze),
    "unsqueeze_": _view_inplace("unsqueeze_", unsqueeze),
    "t_": _view_inplace("t_", t),
    "transpose_": _view_inplace("transpose_", transpose),
    "swapaxes_": _view_inplace("swapaxes_", transpose),
    "swapdims_": _view_inplace("swapdims_", transpose),
}
INPLACE_OTHER: dict[str, Any] = {
    "fill_diagonal_": _fill_diagonal,
    "apply_": _apply,
    "map_": _map,
    "map2_": _map2,
    "random_": _random,
    "cauchy_": _cauchy,
    "exponential_": _exponential,
    "geometric_": _geometric,
    "log_normal_": _log_normal,
    "bernoulli_": _bernoulli_fill,
}
PROPERTIES: dict[str, Any] = {
    "layout": lambda self: _layouts.strided,
    "is_cpu": _is_cpu,
    "itemsize": _itemsize,
    "nbytes": _nbytes,
    # devices and layouts fusegrad has no tensors on: always False
    **{
        name: _false
        for name in (
            "is_xpu is_mps is_meta is_ipu is_xla is_mtia is_maia is_vulkan is_mkldnn "
            "is_quantized is_nested is_sparse_csr"
        ).split()
    },
}

# the copies of view ops (PyTorch's functionalization names)
_COPIES = {
    "alias_copy": lambda x: x.view_as(x),
    "detach_copy": lambda x: x.detach(),
    "diagonal_copy": diagonal,
    "expand_copy": expand,
    "narrow_copy": narrow,
    "permute_copy": permute,
    "select_copy": select,
    "slice_copy": lambda x, dim=0, start=None, end=None, step=1: x[
        (slice(None),) * wrap_dim("slice_copy", dim, x.ndim) + (slice(start, end, step),)
    ],
    "split_copy": split,
    "split_with_sizes_copy": split_with_sizes,
    "squeeze_copy": squeeze,
    "t_copy": t,
    "transpose_copy": transpose,
    "unbind_copy": unbind,
    "unfold_copy": _tensor_unfold,
    "unsqueeze_copy": unsqueeze,
    "view_copy": view,
}
for _name, _fn in _COPIES.items():
    globals()[_name] = _copy_of(_fn, _name)
OTHER_METHODS["narrow_copy"] = globals()["narrow_copy"]
__all__ += list(_COPIES)

# the in-place forms PyTorch has at top level, as ``fusegrad.<name>(x)`` = ``x.<name>()``
# (``ops/__init__`` makes the ones whose Tensor method exists)
TOP_LEVEL_INPLACE = (
    "abs_ acos_ acosh_ addmv_ arccos_ arccosh_ arcsin_ arcsinh_ arctan_ arctanh_ asin_ asinh_ "
    "atan_ atanh_ ceil_ clamp_ clamp_max_ clamp_min_ clip_ cos_ cosh_ deg2rad_ detach_ erf_ "
    "erfc_ exp2_ exp_ expm1_ fill_ fix_ floor_ frac_ gcd_ i0_ index_put_ lcm_ ldexp_ log10_ "
    "log1p_ log2_ log_ logit_ nan_to_num_ neg_ negative_ rad2deg_ reciprocal_ resize_as_ "
    "round_ rsqrt_ sigmoid_ sin_ sinc_ sinh_ sqrt_ square_ tan_ tanh_ trunc_ xlogy_ zero_ "
    "relu_"
).split()
