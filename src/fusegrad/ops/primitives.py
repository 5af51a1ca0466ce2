"""Eager kernels of every primitive, registered in the op registry.

Kernels take numpy arrays that the op surface has already promoted to one dtype and checked
for shape, plus keyword attributes, and return one array.  They never allocate more than numpy
needs and never touch autograd.  The full list is small on purpose: everything else in fusegrad
is a composite of these (CONVENTIONS.md), so there is one derivative rule and one compiler
lowering per entry here.
"""

from __future__ import annotations

import math

import numpy as np

from ..size import broadcast_shapes
from .registry import primitive

# IEEE edge cases (log(0) = -inf, 0/0 = nan, overflow to inf) are results, not warnings, as in
# PyTorch.  ``np.errstate`` costs about 0.8 us per call, as much as the arithmetic on small
# tensors, so kernels switch numpy's error state through the context variable behind it
# (0.2 us); numpy versions without it fall back to ``np.errstate``.
try:
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj

    _QUIET = _make_extobj(all="ignore")
except ImportError:  # pragma: no cover - numpy < 2
    _extobj_contextvar = None


def _quiet(fn):  # type: ignore[no-untyped-def]
    """``fn`` with numpy's floating-point errors ignored."""
    if _extobj_contextvar is None:  # pragma: no cover

        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            with np.errstate(all="ignore"):
                return fn(*args, **kwargs)

    else:
        get, set_, reset = _extobj_contextvar.get, _extobj_contextvar.set, _extobj_contextvar.reset

        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            if get() is _QUIET:
                return fn(*args, **kwargs)
            token = set_(_QUIET)
            try:
                return fn(*args, **kwargs)
            finally:
                reset(token)

    call.__name__ = getattr(fn, "__name__", "kernel")
    call.__doc__ = getattr(fn, "__doc__", None)
    return call


def _quiet_kernel(fn):  # type: ignore[no-untyped-def]
    """Decorator form of ``_quiet`` for kernels whose arithmetic can hit IEEE edge cases."""
    return _quiet(fn)


# ---- elementwise: unary ---------------------------------------------------------------------
def _unary(name: str, fn, differentiable: bool = True) -> None:  # type: ignore[no-untyped-def]
    primitive(name, "elementwise", "x", differentiable=differentiable)(_quiet(fn))


for _name, _fn in [
    ("neg", np.negative),
    ("exp", np.exp),
    ("expm1", np.expm1),
    ("log", np.log),
    ("log1p", np.log1p),
    ("sin", np.sin),
    ("cos", np.cos),
    ("tanh", np.tanh),
    ("sqrt", np.sqrt),
    ("reciprocal", np.reciprocal),
    ("abs", np.abs),
    ("sign", np.sign),
    ("floor", np.floor),
    ("ceil", np.ceil),
    ("trunc", np.trunc),
]:
    _unary(_name, _fn)


@primitive("sigmoid", "elementwise", "x")
def _sigmoid(x):  # type: ignore[no-untyped-def]
    # A primitive (not exp-based composite) for stability: never evaluates exp of a large
    # positive number, and its rule reuses the output.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


@primitive("erf", "elementwise", "x")
def _erf(x):  # type: ignore[no-untyped-def]
    try:
        from scipy.special import erf  # optional, vectorised

        return erf(x).astype(x.dtype, copy=False)
    except ImportError:
        return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()


@primitive("round", "elementwise", "x")
def _round(x, decimals=0):  # type: ignore[no-untyped-def]
    return np.round(x, decimals)


@primitive("cast", "elementwise", "x")
def _cast(x, dtype):  # type: ignore[no-untyped-def]
    return x.astype(dtype.np)


@primitive("clone", "elementwise", "x")
def _clone(x):  # type: ignore[no-untyped-def]
    return np.array(x, copy=True, order="C")


# predicates and logical ops: bool results, never differentiable
for _name, _fn in [
    ("isnan", np.isnan),
    ("isinf", np.isinf),
    ("logical_not", np.logical_not),
]:
    _unary(_name, _fn, differentiable=False)


# ---- elementwise: binary / ternary ----------------------------------------------------------
def _binary(name: str, fn, differentiable: bool = True) -> None:  # type: ignore[no-untyped-def]
    primitive(name, "elementwise", "a b", differentiable=differentiable)(_quiet(fn))


for _name, _fn in [
    ("add", np.add),
    ("sub", np.subtract),
    ("mul", np.multiply),
    ("maximum", np.maximum),
    ("minimum", np.minimum),
    ("remainder", np.remainder),
]:
    _binary(_name, _fn)


@primitive("div", "elementwise", "a b")
@_quiet_kernel
def _div(a, b):  # type: ignore[no-untyped-def]
    out = np.true_divide(a, b)
    return out.astype(a.dtype, copy=False) if a.dtype.kind == "f" else out


@primitive("pow", "elementwise", "a b")
@_quiet_kernel
def _pow(a, b):  # type: ignore[no-untyped-def]
    if a.dtype.kind in "iu" and np.any(b < 0):
        raise ValueError("Integers to negative integer powers are not allowed.")
    return np.power(a, b)


# Differentiable with a zero gradient (PyTorch's div(rounding_mode="floor") gives zeros), so the
# result of a float floor division still takes part in autograd.
@primitive("floor_divide", "elementwise", "a b")
@_quiet_kernel
def _floor_divide(a, b):  # type: ignore[no-untyped-def]
    if a.dtype.kind in "iub" and np.any(b == 0):
        raise ZeroDivisionError("floor_divide: integer division by zero")
    return np.floor_divide(a, b)


for _name, _fn in [
    ("eq", np.equal),
    ("ne", np.not_equal),
    ("lt", np.less),
    ("le", np.less_equal),
    ("gt", np.greater),
    ("ge", np.greater_equal),
    ("logical_and", np.logical_and),
    ("logical_or", np.logical_or),
    ("logical_xor", np.logical_xor),
    ("bitwise_and", np.bitwise_and),
    ("bitwise_or", np.bitwise_or),
    ("bitwise_xor", np.bitwise_xor),
]:
    _binary(_name, _fn, differentiable=False)


@primitive("where", "elementwise", "cond a b")
def _where(cond, a, b):  # type: ignore[no-untyped-def]
    return np.where(cond, a, b)


# ---- reductions -----------------------------------------------------------------------------
@primitive("sum", "reduce", "x")
@_quiet_kernel
def _sum(x, dim, keepdim):  # type: ignore[no-untyped-def]
    dt = np.int64 if x.dtype.kind in "biu" else x.dtype
    return np.sum(x, axis=dim, keepdims=keepdim, dtype=dt)


@primitive("sum_to", "reduce", "x")
@_quiet_kernel
def _sum_to(x, shape):  # type: ignore[no-untyped-def]
    """Sum a broadcast result back to ``shape`` (leading dims and dims of size 1)."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1
    )
    out = np.sum(x, axis=axes, keepdims=True) if axes else x
    return out.reshape(shape)


@primitive("amax", "reduce", "x")
def _amax(x, dim, keepdim):  # type: ignore[no-untyped-def]
    return np.amax(x, axis=dim, keepdims=keepdim)


@primitive("amin", "reduce", "x")
def _amin(x, dim, keepdim):  # type: ignore[no-untyped-def]
    return np.amin(x, axis=dim, keepdims=keepdim)


@primitive("prod", "reduce", "x")
@_quiet_kernel
def _prod(x, dim, keepdim):  # type: ignore[no-untyped-def]
    dt = np.int64 if x.dtype.kind in "biu" else x.dtype
    return np.prod(x, axis=dim, keepdims=keepdim, dtype=dt)


@primitive("argmax", "reduce", "x", differentiable=False)
def _argmax(x, dim, keepdim):  # type: ignore[no-untyped-def]
    if dim is None:
        out = np.argmax(x.reshape(-1))
        return np.asarray(out, np.int64).reshape((1,) * x.ndim if keepdim else ())
    return np.argmax(x, axis=dim, keepdims=keepdim).astype(np.int64)


@primitive("argmin", "reduce", "x", differentiable=False)
def _argmin(x, dim, keepdim):  # type: ignore[no-untyped-def]
    if dim is None:
        out = np.argmin(x.reshape(-1))
        return np.asarray(out, np.int64).reshape((1,) * x.ndim if keepdim else ())
    return np.argmin(x, axis=dim, keepdims=keepdim).astype(np.int64)


@primitive("all", "reduce", "x", differentiable=False)
def _all(x, dim, keepdim):  # type: ignore[no-untyped-def]
    return np.all(x, axis=dim, keepdims=keepdim)


@primitive("any", "reduce", "x", differentiable=False)
def _any(x, dim, keepdim):  # type: ignore[no-untyped-def]
    return np.any(x, axis=dim, keepdims=keepdim)


@primitive("cumsum", "opaque", "x")
@_quiet_kernel
def _cumsum(x, dim):  # type: ignore[no-untyped-def]
    dt = np.int64 if x.dtype.kind in "biu" else x.dtype
    return np.cumsum(x, axis=dim, dtype=dt)


# ---- movement (views where numpy gives one) ------------------------------------------------
@primitive("reshape", "movement", "x")
def _reshape(x, shape):  # type: ignore[no-untyped-def]
    return np.reshape(x, shape)


@primitive("permute", "movement", "x")
def _permute(x, dims):  # type: ignore[no-untyped-def]
    return np.transpose(x, dims)


@primitive("broadcast_to", "movement", "x")
def _broadcast_to(x, shape):  # type: ignore[no-untyped-def]
    return np.broadcast_to(x, shape)


@primitive("flip", "movement", "x")
def _flip(x, dims):  # type: ignore[no-untyped-def]
    return np.flip(x, dims).copy()  # PyTorch's flip copies


@primitive("cat", "movement", "xs*")
def _cat(*xs, dim):  # type: ignore[no-untyped-def]
    return np.concatenate(xs, axis=dim)


@primitive("pad", "movement", "x")
def _pad(x, widths, value):  # type: ignore[no-untyped-def]
    """Constant padding; ``widths`` is numpy's ((before, after), ...) per dim."""
    return np.pad(x, widths, mode="constant", constant_values=value)


@primitive("diagonal", "movement", "x")
def _diagonal(x, offset, dim1, dim2):  # type: ignore[no-untyped-def]
    out = np.diagonal(x, offset, dim1, dim2)
    if x.flags.writeable:
        # numpy's diagonal view is read-only; PyTorch's is writable (x.diagonal().fill_(1))
        out.flags.writeable = True
    return out


def numpy_key(spec: tuple, idx: tuple) -> tuple:
    """Rebuild a numpy index from a normalised key spec and the index arrays it refers to."""
    key = []
    for entry in spec:
        tag = entry[0]
        if tag == "s":
            key.append(slice(entry[1], entry[2], entry[3]))
        elif tag == "i":
            key.append(entry[1])
        elif tag == "t":
            key.append(idx[entry[1]])
        elif tag == "n":
            key.append(None)
        else:
            key.append(Ellipsis)
    return tuple(key)


@primitive("getitem", "movement", "x idx*")
def _getitem(x, *idx, key):  # type: ignore[no-untyped-def]
    """Basic indexing (a view) or advanced indexing (a copy), numpy/PyTorch semantics."""
    k = numpy_key(key, idx)
    out = x[k]
    if not isinstance(out, np.ndarray):
        # a single element: numpy returns a scalar (a copy); ``x[k + (...,)]`` is the same
        # element as a 0-d view, so ``x[0].add_(1)`` writes through as in PyTorch
        out = x[k + (Ellipsis,)]
    return out


@primitive("index_put", "movement", "x v idx*")
def _index_put(x, v, *idx, key):  # type: ignore[no-untyped-def]
    """A copy of ``x`` with ``out[key] = v`` (last write wins for duplicate indices)."""
    out = np.array(x, copy=True)
    out[numpy_key(key, idx)] = v
    return out


@primitive("index_add_at", "movement", "g idx*")
@_quiet_kernel
def _index_add_at(g, *idx, key, shape):  # type: ignore[no-untyped-def]
    """Zeros of ``shape`` with ``g`` added at ``x[key]``; duplicate indices accumulate."""
    out = np.zeros(shape, dtype=g.dtype)
    k = numpy_key(key, idx)
    if idx:
        np.add.at(out, k, g)
    else:
        out[k] = g
    return out


def _scatter_key(index: np.ndarray, dim: int) -> tuple:
    grids = np.indices(index.shape, sparse=True)
    return tuple(index if d == dim else grids[d] for d in range(index.ndim))


@primitive("gather", "movement", "x index")
def _gather(x, index, dim):  # type: ignore[no-untyped-def]
    return x[_scatter_key(index, dim)]


@primitive("scatter_add", "movement", "x index src")
@_quiet_kernel
def _scatter_add(x, index, src, dim):  # type: ignore[no-untyped-def]
    out = np.array(x, copy=True)
    np.add.at(out, _scatter_key(index, dim), src)
    return out


@primitive("scatter", "movement", "x index src")
def _scatter(x, index, src, dim):  # type: ignore[no-untyped-def]
    out = np.array(x, copy=True)
    out[_scatter_key(index, dim)] = src
    return out


# ---- opaque -----------------------------------------------------------------------------
@primitive("matmul", "opaque", "a b")
@_quiet_kernel
def _matmul(a, b):  # type: ignore[no-untyped-def]
    """Batched matrix product of operands with at least 2 dims (numpy broadcasting of batch)."""
    return np.matmul(a, b)


@primitive("to_device", "opaque", "x")
def _to_device(x, device, source):  # type: ignore[no-untyped-def]
    """A copy of ``x`` on ``device`` ("cpu" or "cuda:0"); ``source`` is where ``x`` lives (the
    derivative copies the gradient back there)."""
    if device == "cpu":
        return x.to_host() if hasattr(x, "to_host") else x
    from ..cuda.array import to_device

    return to_device(x)


# ---- shape/dtype rules ------------------------------------------------------------------------
# ``meta(shapes, dtypes, **attrs) -> (shape, dtype)``: what each primitive produces, computed from
# input shapes and dtypes alone.  The compiler's capture runs derivative rules on symbolic values
# (shapes, no data) and uses these; the IR verifier checks every value against them.  They are
# plain integer arithmetic and comparisons, never numpy, so that they work on the compiler's
# symbolic sizes (``fusegrad.compiler.symbolic``) as well as on ints.

_BOOL_RESULT = {
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "logical_xor",
    "logical_not",
    "isnan",
    "isinf",
}


def _dtypes():  # type: ignore[no-untyped-def]
    from .. import dtypes as _dt

    return _dt


def _elementwise_meta(name: str):  # type: ignore[no-untyped-def]
    def meta(shapes, dtypes, **attrs):  # type: ignore[no-untyped-def]
        shape = broadcast_shapes(*shapes) if len(shapes) > 1 else tuple(shapes[0])
        if name in _BOOL_RESULT:
            return shape, _dtypes().bool_
        if name == "cast":
            return shape, attrs["dtype"]
        if name == "where":
            return shape, dtypes[1]
        return shape, dtypes[0]

    return meta


def _reduced_shape(shape: tuple, dim, keepdim: bool) -> tuple:  # type: ignore[no-untyped-def]
    if dim is None:
        return (1,) * len(shape) if keepdim else ()
    if keepdim:
        return tuple(1 if i in dim else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dim)


def _reduce_meta(kind: str):  # type: ignore[no-untyped-def]
    def meta(shapes, dtypes, dim, keepdim):  # type: ignore[no-untyped-def]
        _dt = _dtypes()
        dims = (dim,) if isinstance(dim, int) else dim
        shape = _reduced_shape(tuple(shapes[0]), dims, keepdim)
        if kind == "index":
            return shape, _dt.int64
        if kind == "bool":
            return shape, _dt.bool_
        if kind == "accumulate" and dtypes[0].category < 2:
            return shape, _dt.int64
        return shape, dtypes[0]

    return meta


def _slice_length(size, start, stop, step):  # type: ignore[no-untyped-def]
    """len(range(size)[start:stop:step]) for step > 0, in integer arithmetic only (sizes may be
    symbolic: see ``size.broadcast_shapes``)."""
    if start is None:
        start = 0
    elif start < 0:
        start = max(start + size, 0)
    else:
        start = min(start, size)
    if stop is None:
        stop = size
    elif stop < 0:
        stop = max(stop + size, 0)
    else:
        stop = min(stop, size)
    if stop <= start:
        return 0
    return (stop - start + step - 1) // step if step != 1 else stop - start


def key_shape(shape: tuple, idx_shapes: tuple, idx_dtypes: tuple, key: tuple) -> tuple:
    """The shape of ``x[key]`` for an ``x`` of ``shape`` and index tensors of the given shapes
    (numpy's rules: a slice keeps a dim, an int drops one, None adds one; integer index tensors
    -- and ints, when there is one -- broadcast together, their result placed where the first
    of them is when they are adjacent in the key, else in front)."""
    if any(d.name == "bool" for d in idx_dtypes):
        from .registry import DataDependentShape

        raise DataDependentShape("indexing with a boolean mask has a data-dependent shape")
    consuming = sum(1 for e in key if e[0] in ("s", "i", "t"))
    full = ("s", None, None, 1)
    # (position in the key as written, entry): an Ellipsis stands for full slices, and
    # separates the advanced indices around it even when it stands for no dim (as in numpy)
    entries: list = []
    for k, e in enumerate(key):
        if e[0] == "e":
            entries.extend((k, full) for _ in range(len(shape) - consuming))
        else:
            entries.append((k, e))
    used = sum(1 for _, e in entries if e[0] in ("s", "i", "t"))
    entries.extend((len(key), full) for _ in range(len(shape) - used))
    has_array = any(e[0] == "t" for _, e in entries)
    out: list = []
    advanced: list = []  # (position in the key, position in out, index shape)
    dim = 0
    for k, e in entries:
        tag = e[0]
        if tag == "n":
            out.append(1)
        elif tag == "s":
            out.append(_slice_length(shape[dim], e[1], e[2], e[3]))
            dim += 1
        elif tag == "i":
            if has_array:
                advanced.append((k, len(out), ()))
            dim += 1
        else:
            advanced.append((k, len(out), tuple(idx_shapes[e[1]])))
            dim += 1
    if not advanced:
        return tuple(out)
    block = list(broadcast_shapes(*(a[2] for a in advanced)))
    positions = [a[0] for a in advanced]
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    at = advanced[0][1] if adjacent else 0
    return tuple(out[:at] + block + out[at:])


def _diagonal_shape(shape: tuple, offset: int, dim1: int, dim2: int) -> tuple:
    a, b = shape[dim1], shape[dim2]
    length = min(a, b - offset) if offset >= 0 else min(a + offset, b)
    rest = tuple(s for i, s in enumerate(shape) if i not in (dim1, dim2))
    return rest + (max(length, 0),)


def _set_metas() -> None:
    from .registry import REGISTRY, set_meta

    _dt = _dtypes()
    for name, prim in list(REGISTRY.items()):
        if prim.kind == "elementwise":
            set_meta(name, _elementwise_meta(name))
    for name in ("sum", "amax", "amin", "all", "any", "prod", "argmax", "argmin"):
        kind = {
            "argmax": "index",
            "argmin": "index",
            "all": "bool",
            "any": "bool",
            "sum": "accumulate",
            "prod": "accumulate",
        }.get(name, "same")
        set_meta(name, _reduce_meta(kind))
    set_meta("sum_to", lambda shapes, dtypes, shape: (tuple(shape), dtypes[0]), ("shape",))
    set_meta(
        "cumsum",
        lambda shapes, dtypes, dim: (
            tuple(shapes[0]),
            _dt.int64 if dtypes[0].category < 2 else dtypes[0],
        ),
    )
    set_meta("reshape", lambda shapes, dtypes, shape: (tuple(shape), dtypes[0]), ("shape",))
    set_meta("broadcast_to", lambda shapes, dtypes, shape: (tuple(shape), dtypes[0]), ("shape",))
    set_meta(
        "permute",
        lambda shapes, dtypes, dims: (tuple(shapes[0][d] for d in dims), dtypes[0]),
    )
    set_meta(
        "diagonal",
        lambda shapes, dtypes, offset, dim1, dim2: (
            _diagonal_shape(tuple(shapes[0]), offset, dim1, dim2),
            dtypes[0],
        ),
    )
    set_meta("flip", lambda shapes, dtypes, dims: (tuple(shapes[0]), dtypes[0]))

    def cat_meta(shapes, dtypes, dim):  # type: ignore[no-untyped-def]
        out = list(shapes[0])
        out[dim] = sum(s[dim] for s in shapes)
        return tuple(out), dtypes[0]

    set_meta("cat", cat_meta)
    set_meta(
        "pad",
        lambda shapes, dtypes, widths, value: (
            tuple(s + b + a for s, (b, a) in zip(shapes[0], widths)),
            dtypes[0],
        ),
        ("widths",),
    )
    set_meta(
        "getitem",
        lambda shapes, dtypes, key: (
            key_shape(tuple(shapes[0]), tuple(shapes[1:]), tuple(dtypes[1:]), key),
            dtypes[0],
        ),
        ("key",),
    )

    def index_put_meta(shapes, dtypes, key):  # type: ignore[no-untyped-def]
        key_shape(tuple(shapes[0]), tuple(shapes[2:]), tuple(dtypes[2:]), key)
        return tuple(shapes[0]), dtypes[0]

    set_meta("index_put", index_put_meta, ("key",))

    def index_add_at_meta(shapes, dtypes, key, shape):  # type: ignore[no-untyped-def]
        key_shape(tuple(shape), tuple(shapes[1:]), tuple(dtypes[1:]), key)
        return tuple(shape), dtypes[0]

    set_meta("index_add_at", index_add_at_meta, ("key", "shape"))
    set_meta("gather", lambda shapes, dtypes, dim: (tuple(shapes[1]), dtypes[0]))
    for name in ("scatter", "scatter_add"):
        set_meta(name, lambda shapes, dtypes, dim: (tuple(shapes[0]), dtypes[0]))

    def matmul_meta(shapes, dtypes):  # type: ignore[no-untyped-def]
        a, b = shapes
        batch = broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
        return tuple(batch) + (a[-2], b[-1]), dtypes[0]

    set_meta("matmul", matmul_meta)
    set_meta("to_device", lambda shapes, dtypes, device, source: (tuple(shapes[0]), dtypes[0]))
    missing = [name for name, prim in REGISTRY.items() if prim.meta is None]
    if missing:
        raise AssertionError(f"primitives without a shape/dtype rule: {missing}")


_set_metas()
