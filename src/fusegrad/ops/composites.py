"""Composites that PyTorch has at the top level of ``torch`` and training scripts reach for:
elementwise helpers (``frac``, ``fmod``, ``xlogy``, ``logit``, ``fmax``, ``copysign``, ...),
small reductions (``aminmax``, ``std_mean``, ``trace``, ``nansum``), shape helpers (``ravel``,
``rot90``, ``atleast_2d``, ``tensor_split``, ``meshgrid``, ...), products (``tensordot``,
``kron``, ``addmv``, ``addr``) and a few creation functions (``logspace``, ``range``,
``tril_indices``, the window functions).

Where this sits: above the other op-surface modules, written only with their functions
(docs/ARCHITECTURE.md, "Conventions"), so every differentiable one has its gradient,
double gradient and compiled form from the primitives it is made of.  ``ops/__init__.py``
exports them; ``tests/ops/op_table.py`` checks them against numpy and PyTorch.
"""

from __future__ import annotations

import builtins
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import return_types
from .. import storage as _storage
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..autograd.tracer import notify_check as _check
from ..autograd.tracer import notify_host_read as _read
from ..device import as_device
from ..errors import ArgumentError, DTypeError, ShapeError, describe
from ..tensor import Tensor
from ._util import cast, operand, to_tensor, wrap_dim
from .complex import conj, imag
from .creation import _created, _dtype_or_default, _leaf, ones_like, randint, zeros_like
from .elementwise import add, ceil, clamp, div, floor, round, sign, sqrt, sub, trunc, where
from .generated import (
    abs,
    eq,
    ge,
    gt,
    isinf,
    isnan,
    le,
    lgamma,
    log,
    logaddexp,
    logical_and,
    logical_not,
    logical_or,
    lt,
    mul,
    pow,
    remainder,
)
from .indexing import gather, index_select
from .linalg import dot, matmul, mv, outer
from .reduction import amax, amin, any, cumsum, mean, norm, std, sum
from .shape import (
    cat,
    diagonal,
    diff,
    flip,
    movedim,
    permute,
    reshape,
    stack,
    transpose,
    unsqueeze,
)
from .sorting import sort

__all__ = [
    "frac",
    "fmod",
    "deg2rad",
    "rad2deg",
    "heaviside",
    "xlogy",
    "logit",
    "signbit",
    "copysign",
    "fmax",
    "fmin",
    "float_power",
    "logaddexp2",
    "clamp_min",
    "clamp_max",
    "positive",
    "multiply",
    "subtract",
    "isneginf",
    "isposinf",
    "isreal",
    "isin",
    "nansum",
    "nanmean",
    "aminmax",
    "std_mean",
    "trace",
    "dist",
    "ravel",
    "moveaxis",
    "fliplr",
    "flipud",
    "rot90",
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
    "tensor_split",
    "hsplit",
    "vsplit",
    "dsplit",
    "dstack",
    "column_stack",
    "row_stack",
    "diag_embed",
    "diagflat",
    "block_diag",
    "cartesian_prod",
    "meshgrid",
    "take",
    "tensordot",
    "kron",
    "vdot",
    "addmv",
    "addr",
    "chain_matmul",
    "logspace",
    "scalar_tensor",
    "randint_like",
    "tril_indices",
    "triu_indices",
    "hann_window",
    "hamming_window",
    "bartlett_window",
    "blackman_window",
    "kaiser_window",
    "adjoint",
    "fill",
    "ldexp",
    "mvlgamma",
    "trapezoid",
    "trapz",
    "cumulative_trapezoid",
    "cov",
    "corrcoef",
    "vander",
    "combinations",
    "quantile",
    "nanquantile",
    "bincount",
    "unravel_index",
]


def _float_operands(op: str, *xs: Any) -> list[Tensor]:
    """The operands as tensors of their promoted dtype, integers and bools promoted to the
    default float dtype (PyTorch's rule for ``xlogy``, ``copysign``, ``deg2rad``, ...)."""
    xs = tuple(operand(x) for x in xs)
    dt = _dt.result_type(*xs)
    if dt.category < 2:
        dt = _dt.get_default_dtype()
    return [cast(to_tensor(x, dt), dt) for x in xs]


# ---- elementwise --------------------------------------------------------------------------------
@_torch_node_name("FracBackward0")
def frac(input: Any) -> Tensor:
    x = to_tensor(input)
    if x._dtype.category < 2:
        raise DTypeError(f"frac: expected a floating point tensor, got {describe(x)}")
    return sub(x, trunc(x))


@_torch_node_name("FmodBackward0")
def fmod(input: Any, other: Any) -> Tensor:
    """C's ``fmod``: the remainder of ``input / other`` rounded toward zero, with the sign of
    ``input``.  Written as ``sign(input) * remainder(|input|, |other|)``: the remainder of
    non-negative operands is exact and equals fmod's, so the value is exact, and the gradients
    are fmod's (1 for ``input``, ``-trunc(input / other)`` for ``other``)."""
    a, b = operand(input), operand(other)
    if isinstance(b, Tensor) or isinstance(a, Tensor):
        dt = _dt.result_type(a, b)
        a, b = to_tensor(a, dt), to_tensor(b, dt)
        a, b = cast(a, dt), cast(b, dt)
    return mul(sign(a), remainder(abs(a), abs(b)))


def deg2rad(input: Any) -> Tensor:
    (x,) = _float_operands("deg2rad", input)
    return mul(x, math.pi / 180.0)


def rad2deg(input: Any) -> Tensor:
    (x,) = _float_operands("rad2deg", input)
    return mul(x, 180.0 / math.pi)


def heaviside(input: Any, values: Any) -> Tensor:
    """0 where ``input < 0``, ``values`` where it is 0, 1 where it is positive.  Not
    differentiable in PyTorch (its derivative is not implemented): the result is a constant."""
    x, v = to_tensor(input), to_tensor(values)
    if x._dtype is not v._dtype:
        raise DTypeError(
            "heaviside is not yet implemented for tensors with different dtypes "
            f"(got {describe(x, v)})"
        )
    x, v = x.detach(), v.detach()
    return where(eq(x, 0), v, cast(gt(x, 0), x._dtype))


@_torch_node_name("XlogyBackward0")
def xlogy(input: Any, other: Any) -> Tensor:
    """``input * log(other)``, 0 where ``input`` is 0 unless ``other`` is nan.  ``other`` is
    replaced by 1 where ``input`` is 0 and ``other <= 0`` (where the log is -inf or nan), so
    both gradients there are 0 and elsewhere they are PyTorch's (``log(other)`` and
    ``input / other``).  One difference: at ``input == other == 0`` PyTorch's gradient for
    ``other`` is ``0 / 0 = nan``, fusegrad's 0."""
    x, y = _float_operands("xlogy", input, other)
    safe = where(logical_and(eq(x, 0), le(y, 0)), 1.0, y)
    return mul(x, log(safe))


@_torch_node_name("LogitBackward0")
def logit(input: Any, eps: float | None = None) -> Tensor:
    (x,) = _float_operands("logit", input)
    if eps is not None:
        x = clamp(x, eps, 1.0 - eps)
    return log(div(x, sub(1.0, x)))


def signbit(input: Any) -> Tensor:
    """True where the sign bit is set: negative numbers and -0.0 (``1 / -0.0`` is ``-inf``)."""
    x = to_tensor(input).detach()
    if x._dtype.category < 2:
        return lt(x, 0)
    return logical_or(lt(x, 0), logical_and(eq(x, 0), lt(div(1.0, x), 0)))


@_torch_node_name("CopysignBackward0")
def copysign(input: Any, other: Any) -> Tensor:
    x, y = _float_operands("copysign", input, other)
    magnitude = abs(x)
    out = where(signbit(y), -magnitude, magnitude)
    if y.requires_grad:
        # PyTorch's gradient for ``other`` is zeros, not "unused": route ``y`` through a where
        # that never selects it (values unchanged, gradient where(False, g, 0) = 0)
        never = zeros_like(out.detach(), dtype=_dt.bool_)
        out = where(never, y, out)
    return out


def fmax(input: Any, other: Any) -> Tensor:
    """``maximum`` that ignores nan (nan only where both are); ties go to ``input``, as in
    PyTorch's gradient."""
    a, b = operand(input), operand(other)
    return where(logical_or(ge(a, b), isnan(to_tensor(b))), a, b)


def fmin(input: Any, other: Any) -> Tensor:
    a, b = operand(input), operand(other)
    return where(logical_or(le(a, b), isnan(to_tensor(b))), a, b)


def float_power(input: Any, exponent: Any) -> Tensor:
    """``pow`` in float64, whatever the operands' dtypes."""
    a = input if not isinstance(input, Tensor) else cast(input, _dt.float64)
    b = exponent if not isinstance(exponent, Tensor) else cast(exponent, _dt.float64)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError("float_power: expected at least one tensor operand")
    if not isinstance(a, Tensor):
        a = to_tensor(float(a), _dt.float64)
    return pow(a, float(b) if not isinstance(b, Tensor) else b)


def logaddexp2(input: Any, other: Any) -> Tensor:
    a, b = _float_operands("logaddexp2", input, other)
    return div(logaddexp(mul(a, math.log(2.0)), mul(b, math.log(2.0))), math.log(2.0))


def clamp_min(input: Any, min: Any) -> Tensor:  # noqa: A002  (PyTorch's argument name)
    return clamp(input, min=min)


def clamp_max(input: Any, max: Any) -> Tensor:  # noqa: A002
    return clamp(input, max=max)


def positive(input: Any) -> Tensor:
    x = to_tensor(input)
    if x._dtype is _dt.bool_:
        raise DTypeError("The `+` operator, on a bool tensor is not supported.")
    return x


def multiply(input: Any, other: Any) -> Tensor:
    return mul(input, other)


def subtract(input: Any, other: Any, *, alpha: Any = 1) -> Tensor:
    return sub(input, other, alpha=alpha)


def isneginf(input: Any) -> Tensor:
    x = to_tensor(input)
    return logical_and(isinf(x), lt(x, 0))


def isposinf(input: Any) -> Tensor:
    x = to_tensor(input)
    return logical_and(isinf(x), gt(x, 0))


def isreal(input: Any) -> Tensor:
    """True where the imaginary part is 0 (everywhere for a real tensor)."""
    x = to_tensor(input)
    if x._dtype.category == 3:
        return eq(imag(x.detach()), 0)
    return ones_like(x, dtype=_dt.bool_)


def isin(
    elements: Any, test_elements: Any, *, assume_unique: bool = False, invert: bool = False
) -> Tensor:
    """Whether each of ``elements`` is in ``test_elements``: one broadcast comparison of every
    element with every test element, reduced with ``any``."""
    e, t = to_tensor(elements).detach(), to_tensor(test_elements).detach()
    found = any(eq(unsqueeze(e, -1), reshape(t, (-1,))), -1)
    return logical_not(found) if invert else found


def nansum(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    x = to_tensor(input)
    if x._dtype.category == 2:
        x = where(isnan(x), 0.0, x)
    return sum(x, dim, keepdim, dtype=dtype) if dim is not None else sum(x, dtype=dtype)


def nanmean(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    x = to_tensor(input)
    if x._dtype.category < 2:
        raise DTypeError(
            f"nanmean(): expected input to have floating point dtype but got {x.dtype}"
        )
    count = nansum(cast(logical_not(isnan(x)), x._dtype), dim, keepdim)
    return div(nansum(x, dim, keepdim, dtype=dtype), count)


# ---- reductions ---------------------------------------------------------------------------------
def aminmax(input: Any, *, dim: int | None = None, keepdim: bool = False) -> Any:
    x = to_tensor(input)
    if dim is None:
        lo, hi = amin(x), amax(x)
        if keepdim:
            lo, hi = reshape(lo, (1,) * x.ndim), reshape(hi, (1,) * x.ndim)
        return return_types.aminmax(lo, hi)
    return return_types.aminmax(amin(x, dim, keepdim), amax(x, dim, keepdim))


def std_mean(input: Any, dim: Any = None, *, correction: float = 1, keepdim: bool = False) -> tuple:
    return std(input, dim, keepdim=keepdim, correction=correction), mean(input, dim, keepdim)


@_torch_node_name("TraceBackward0")
def trace(input: Any) -> Tensor:
    x = to_tensor(input)
    if x.ndim != 2:
        raise ShapeError(f"trace: expected a matrix, but got tensor with dim {x.ndim}")
    return sum(diagonal(x))


def dist(input: Any, other: Any, p: float = 2) -> Tensor:
    return norm(sub(input, other), p)


# ---- shape --------------------------------------------------------------------------------------
def ravel(input: Any) -> Tensor:
    return reshape(to_tensor(input), (-1,))


def moveaxis(input: Any, source: Any, destination: Any) -> Tensor:
    return movedim(input, source, destination)


def fliplr(input: Any) -> Tensor:
    x = to_tensor(input)
    if x.ndim < 2:
        raise ShapeError("Input must be >= 2-d.")
    return flip(x, (1,))


def flipud(input: Any) -> Tensor:
    x = to_tensor(input)
    if x.ndim < 1:
        raise ShapeError("Input must be >= 1-d.")
    return flip(x, (0,))


def rot90(input: Any, k: int = 1, dims: Sequence[int] = (0, 1)) -> Tensor:
    x = to_tensor(input)
    if len(dims) != 2:
        raise ShapeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if x.ndim < 2:
        raise ShapeError(f"expected total dims >= 2, but got total dims = {x.ndim}")
    d0, d1 = wrap_dim("rot90", dims[0], x.ndim), wrap_dim("rot90", dims[1], x.ndim)
    if d0 == d1:
        raise ShapeError(
            f"expected rotation dims to be different, but got dim0 = {d0} and dim1 = {d1}"
        )
    k %= 4
    if k == 1:
        return transpose(flip(x, (d1,)), d0, d1)
    if k == 2:
        return flip(x, (d0, d1))
    if k == 3:
        return transpose(flip(x, (d0,)), d0, d1)
    return x.clone()


def _atleast(shape_of: Any, tensors: tuple) -> Any:
    single = len(tensors) == 1 and not isinstance(tensors[0], (list, tuple))
    items = tensors[0] if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else tensors
    out = tuple(reshape(t, shape_of(t)) for t in map(to_tensor, items))
    return out[0] if single else out


def atleast_1d(*tensors: Any) -> Any:
    return _atleast(lambda t: t.shape if t.ndim >= 1 else (1,), tensors)


def atleast_2d(*tensors: Any) -> Any:
    return _atleast(
        lambda t: t.shape if t.ndim >= 2 else (1,) * (2 - t.ndim) + tuple(t.shape), tensors
    )


def atleast_3d(*tensors: Any) -> Any:
    def shape_of(t: Tensor) -> tuple:
        s = tuple(t.shape)
        if t.ndim == 0:
            return (1, 1, 1)
        if t.ndim == 1:
            return (1, s[0], 1)
        if t.ndim == 2:
            return s + (1,)
        return s

    return _atleast(shape_of, tensors)


def tensor_split(input: Any, indices_or_sections: Any, dim: int = 0) -> tuple:
    """Split into ``n`` nearly equal parts (the first ``size % n`` one longer) or at the given
    indices, as views (numpy's ``array_split``)."""
    x = to_tensor(input)
    if x.ndim == 0:
        raise ShapeError(
            "tensor_split expected at least a 1-dimensional tensor, but got a tensor with 0 dims"
        )
    d = wrap_dim("tensor_split", dim, x.ndim)
    size = x.shape[d]
    spec = indices_or_sections
    if isinstance(spec, Tensor):
        spec = spec.tolist()
    if isinstance(spec, int):
        if spec <= 0:
            raise ValueError(f"number of sections must be larger than 0, got {spec}")
        base, extra = divmod(size, spec)
        bounds, start = [], 0
        for i in builtins.range(spec):
            start += base + (1 if i < extra else 0)
            bounds.append(start)
        bounds = bounds[:-1]
    else:
        bounds = [int(i) for i in spec]
    out, start = [], 0
    for end in [*bounds, size]:
        lo, hi = (
            builtins.min(builtins.max(start, 0), size),
            builtins.min(builtins.max(end, 0), size),
        )
        out.append(x.narrow(d, lo, builtins.max(hi - lo, 0)))
        start = end
    return tuple(out)


def _split_n(op: str, x: Tensor, spec: Any, dim: int, min_dims: int) -> tuple:
    if x.ndim < min_dims:
        raise ShapeError(
            f"torch.{op} requires a tensor with at least {min_dims} dimension, but got a tensor "
            f"with {x.ndim} dimensions!"
        )
    if isinstance(spec, int) and spec != 0 and x.shape[dim] % spec != 0:
        raise ShapeError(
            f"torch.{op} attempted to split along dimension {dim}, but the size of the "
            f"dimension {x.shape[dim]} is not divisible by the split_size {spec}!"
        )
    return tensor_split(x, spec, dim)


def hsplit(input: Any, indices_or_sections: Any) -> tuple:
    x = to_tensor(input)
    return _split_n("hsplit", x, indices_or_sections, 1 if x.ndim > 1 else 0, 1)


def vsplit(input: Any, indices_or_sections: Any) -> tuple:
    return _split_n("vsplit", to_tensor(input), indices_or_sections, 0, 2)


def dsplit(input: Any, indices_or_sections: Any) -> tuple:
    return _split_n("dsplit", to_tensor(input), indices_or_sections, 2, 3)


def dstack(tensors: Sequence[Any]) -> Tensor:
    return cat(atleast_3d(tuple(tensors)), 2)


def column_stack(tensors: Sequence[Any]) -> Tensor:
    ts = [to_tensor(t) for t in tensors]
    return cat([reshape(t, (t.numel(), 1)) if t.ndim < 2 else t for t in ts], 1)


def row_stack(tensors: Sequence[Any]) -> Tensor:
    return cat(atleast_2d(tuple(tensors)), 0)


@_torch_node_name("DiagEmbedBackward0")
def diag_embed(input: Any, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """Batched diagonal matrices: the last dim of ``input`` becomes the ``offset`` diagonal of
    the planes ``(dim1, dim2)``.  Built as ``input[..., None] * eye`` (an outer product with a
    shifted identity), so the gradient is the diagonal of the incoming one."""
    x = to_tensor(input)
    n = x.shape[-1] if x.ndim else 1
    m = n + builtins.abs(offset)
    ndim = x.ndim + 1
    d1, d2 = wrap_dim("diag_embed", dim1, ndim), wrap_dim("diag_embed", dim2, ndim)
    if d1 == d2:
        raise ShapeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    rows = np.arange(n) + builtins.max(-offset, 0)
    cols = np.arange(n) + builtins.max(offset, 0)
    place = np.zeros((n, m, m))
    place[np.arange(n), rows, cols] = 1.0
    plane = matmul(unsqueeze(x, -2), _constant(place.reshape(n, m * m), x))
    plane = reshape(plane, tuple(x.shape[:-1]) + (m, m))
    # the planes are the last two dims now; move them to (d1, d2)
    rest = [i for i in builtins.range(ndim) if i not in (d1, d2)]
    order = [0] * ndim
    for src, dst in enumerate(rest + [d1, d2]):
        order[dst] = src
    return permute(plane, tuple(order))


def diagflat(input: Any, offset: int = 0) -> Tensor:
    return diag_embed(reshape(to_tensor(input), (-1,)), offset)


def block_diag(*tensors: Any) -> Tensor:
    ts = [to_tensor(t) for t in tensors]
    mats = []
    for i, t in enumerate(ts):
        if t.ndim > 2:
            raise ShapeError(
                f"torch.block_diag: Input tensors must have 2 or fewer dimensions. Input {i} has "
                f"{t.ndim} dimensions"
            )
        mats.append(reshape(t, (1, -1) if t.ndim == 1 else (1, 1) if t.ndim == 0 else t.shape))
    if not mats:
        return to_tensor(np.zeros((0, 0)), _dt.get_default_dtype())
    dt = _dt.result_type(*mats)
    width = builtins.sum(m.shape[1] for m in mats)
    rows, col = [], 0
    for m in mats:
        m = cast(m, dt)
        left = _constant(np.zeros((m.shape[0], col)), m)
        right = _constant(np.zeros((m.shape[0], width - col - m.shape[1])), m)
        rows.append(cat([left, m, right], 1))
        col += m.shape[1]
    return cat(rows, 0)


def meshgrid(*tensors: Any, indexing: str | None = None) -> tuple:
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing is None:
        warnings.warn(
            "torch.meshgrid: in an upcoming release, it will be required to pass the indexing "
            "argument.",
            UserWarning,
            stacklevel=2,
        )
        indexing = "ij"
    if indexing not in ("ij", "xy"):
        raise ArgumentError(
            f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: {indexing}'
        )
    ts = [to_tensor(t) for t in tensors]
    for t in ts:
        if t.ndim > 1:
            raise ShapeError(
                f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got: {t.ndim}D"
            )
    ts = [reshape(t, (-1,)) for t in ts]
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t.shape[0] for t in ts)
    out = []
    for i, t in enumerate(ts):
        view = [1] * len(ts)
        view[i] = -1
        out.append(reshape(t, tuple(view)).expand(*shape))
    if swap:
        out[0], out[1] = out[1], out[0]
    return tuple(out)


def cartesian_prod(*tensors: Any) -> Tensor:
    ts = [to_tensor(t) for t in tensors]
    if len(ts) == 1:
        return ts[0]
    grids = meshgrid(*ts, indexing="ij")
    return stack([reshape(g, (-1,)) for g in grids], 1)


def take(input: Any, index: Any) -> Tensor:
    x, idx = to_tensor(input), to_tensor(index)
    flat = reshape(x, (-1,))
    n = flat.shape[0]
    idx = where(lt(idx, 0), add(idx, n), idx) if idx.numel() else idx
    return reshape(index_select(flat, 0, reshape(idx, (-1,))), tuple(idx.shape))


# ---- products -----------------------------------------------------------------------------------
def tensordot(a: Any, b: Any, dims: Any = 2, out: Any = None) -> Tensor:
    """Contract ``dims`` of ``a`` with ``dims`` of ``b``: both permuted and reshaped to
    matrices, one ``matmul``, reshaped back."""
    x, y = to_tensor(a), to_tensor(b)
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        if dims < 0:
            raise ValueError(f"tensordot expects dims >= 0, but got dims={dims}")
        da, db = list(builtins.range(x.ndim - dims, x.ndim)), list(builtins.range(dims))
    else:
        da, db = dims
        da = [da] if isinstance(da, int) else list(da)
        db = [db] if isinstance(db, int) else list(db)
    if len(da) != len(db):
        raise ShapeError("both dimension lists should have same length")
    da = [wrap_dim("tensordot", d, x.ndim) for d in da]
    db = [wrap_dim("tensordot", d, y.ndim) for d in db]
    for i, j in zip(da, db):
        if x.shape[i] != y.shape[j]:
            raise ShapeError(
                f"contracted dimensions need to match, but first has size {x.shape[i]} in dim "
                f"{i} and second has size {y.shape[j]} in dim {j}"
            )
    free_a = [d for d in builtins.range(x.ndim) if d not in da]
    free_b = [d for d in builtins.range(y.ndim) if d not in db]
    k = int(np.prod([x.shape[d] for d in da]))
    left = reshape(permute(x, tuple(free_a + da)), (-1, k))
    right = reshape(permute(y, tuple(db + free_b)), (k, -1))
    shape = tuple(x.shape[d] for d in free_a) + tuple(y.shape[d] for d in free_b)
    return reshape(matmul(left, right), shape)


@_torch_node_name("KronBackward0")
def kron(input: Any, other: Any) -> Tensor:
    x, y = to_tensor(input), to_tensor(other)
    n = builtins.max(x.ndim, y.ndim)
    xs = (1,) * (n - x.ndim) + tuple(x.shape)
    ys = (1,) * (n - y.ndim) + tuple(y.shape)
    xv = reshape(x, tuple(v for s in xs for v in (s, 1)))
    yv = reshape(y, tuple(v for s in ys for v in (1, s)))
    return reshape(mul(xv, yv), tuple(a * b for a, b in zip(xs, ys)))


def vdot(input: Any, other: Any) -> Tensor:
    """``sum(conj(input) * other)`` of two 1-D tensors."""
    return dot(conj(to_tensor(input)), other)


def _scaled_add(op: str, input: Any, product: Tensor, beta: Any, alpha: Any) -> Tensor:
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        product = mul(product, alpha)
    if isinstance(beta, (int, float)) and beta == 0:
        # PyTorch ignores ``input`` when beta is 0 (nan and inf in it do not propagate)
        return add(zeros_like(to_tensor(input).detach(), dtype=product.dtype), product)
    x = to_tensor(input)
    return add(x if beta == 1 else mul(x, beta), product)


def addmv(input: Any, mat: Any, vec: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return _scaled_add("addmv", input, mv(mat, vec), beta, alpha)


def addr(input: Any, vec1: Any, vec2: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return _scaled_add("addr", input, outer(vec1, vec2), beta, alpha)


def chain_matmul(*matrices: Any, out: Any = None) -> Tensor:
    if not matrices:
        raise ShapeError("chain_matmul(): Expected one or more matrices")
    result = to_tensor(matrices[0])
    for m in matrices[1:]:
        result = matmul(result, m)
    return result


# ---- creation -----------------------------------------------------------------------------------
def logspace(
    start: float,
    end: float,
    steps: int,
    base: float = 10.0,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    arr = np.power(float(base), np.linspace(float(start), float(end), int(steps)))
    return _created(
        _leaf(arr.astype(_dtype_or_default(dtype).np), requires_grad, as_device(device))
    )


def range(  # noqa: A001  (PyTorch's name)
    start: float = 0,
    end: float | None = None,
    step: float = 1,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    """Deprecated in PyTorch (``end`` is included): values ``start, start + step, ..., end``.
    Not in ``__all__``: it would shadow the builtin in modules that star-import the op surface;
    ``fusegrad/__init__.py`` exports it by name."""
    warnings.warn(
        "torch.range is deprecated and will be removed in a future release because its behavior "
        "is inconsistent with Python's range builtin. Instead, use torch.arange, which produces "
        "values in [start, end).",
        UserWarning,
        stacklevel=2,
    )
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("step must be nonzero")
    n = int(math.floor((end - start) / step)) + 1
    arr = start + step * np.arange(builtins.max(n, 0), dtype=np.float64)
    return _created(
        _leaf(arr.astype(_dtype_or_default(dtype).np), requires_grad, as_device(device))
    )


def scalar_tensor(
    s: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    arr = np.array(s, dtype=_dtype_or_default(dtype).np)
    return _created(_leaf(arr, requires_grad, as_device(device)))


def randint_like(
    input: Any,
    low: int = 0,
    high: int | None = None,
    *,
    generator: Any = None,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    x = to_tensor(input)
    if high is None:
        low, high = 0, low
    return randint(
        low,
        high,
        tuple(x.shape),
        generator=generator,
        dtype=dtype if dtype is not None else x.dtype,
        device=device if device is not None else x.device,
    ).requires_grad_(requires_grad)


def _triangle_indices(
    which: Any, row: int, col: int, offset: int, dtype: Any, device: Any
) -> Tensor:
    rows, cols = which(row, offset, col)
    arr = np.stack([rows, cols]).astype(_dt.as_dtype(dtype).np if dtype is not None else np.int64)
    return _created(_leaf(arr, False, as_device(device)))


def tril_indices(
    row: int,
    col: int,
    offset: int = 0,
    *,
    dtype: Any = None,
    device: Any = None,
    layout: Any = None,
) -> Tensor:
    return _triangle_indices(np.tril_indices, row, col, offset, dtype, device)


def triu_indices(
    row: int,
    col: int,
    offset: int = 0,
    *,
    dtype: Any = None,
    device: Any = None,
    layout: Any = None,
) -> Tensor:
    return _triangle_indices(np.triu_indices, row, col, offset, dtype, device)


def _window(
    name: str,
    window_length: int,
    periodic: bool,
    dtype: Any,
    device: Any,
    requires_grad: bool,
    fn: Any,
) -> Tensor:
    dt = _dtype_or_default(dtype)
    if dt.category < 2:
        raise DTypeError(f"{name} expects floating point dtypes, got: {dt}")
    if window_length < 0:
        raise ValueError(
            f"{name} requires non-negative window length, got window_length={window_length}"
        )
    if window_length <= 1:
        arr = np.ones(window_length)
    else:
        # a periodic window is the symmetric window of one more point, without its last
        n = window_length + 1 if periodic else window_length
        arr = fn(n)[:window_length]
    return _created(_leaf(arr.astype(dt.np), requires_grad, as_device(device)))


def _cosine_sum(*coefficients: float) -> Any:
    def fn(n: int) -> np.ndarray:
        k = np.arange(n) * (2.0 * np.pi / (n - 1))
        return builtins.sum(c * np.cos(i * k) * (-1) ** i for i, c in enumerate(coefficients))

    return fn


def hann_window(
    window_length: int,
    periodic: bool = True,
    *,
    dtype: Any = None,
    device: Any = None,
    layout: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    return _window(
        "hann_window", window_length, periodic, dtype, device, requires_grad, _cosine_sum(0.5, 0.5)
    )


def hamming_window(
    window_length: int,
    periodic: bool = True,
    alpha: float = 0.54,
    beta: float = 0.46,
    *,
    dtype: Any = None,
    device: Any = None,
    layout: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    return _window(
        "hamming_window",
        window_length,
        periodic,
        dtype,
        device,
        requires_grad,
        _cosine_sum(alpha, beta),
    )


def blackman_window(
    window_length: int,
    periodic: bool = True,
    *,
    dtype: Any = None,
    device: Any = None,
    layout: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    return _window(
        "blackman_window",
        window_length,
        periodic,
        dtype,
        device,
        requires_grad,
        _cosine_sum(0.42, 0.5, 0.08),
    )


def bartlett_window(
    window_length: int,
    periodic: bool = True,
    *,
    dtype: Any = None,
    device: Any = None,
    layout: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    return _window(
        "bartlett_window", window_length, periodic, dtype, device, requires_grad, np.bartlett
    )


def kaiser_window(
    window_length: int,
    periodic: bool = True,
    beta: float = 12.0,
    *,
    dtype: Any = None,
    device: Any = None,
    layout: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    return _window(
        "kaiser_window",
        window_length,
        periodic,
        dtype,
        device,
        requires_grad,
        lambda n: np.kaiser(n, beta),
    )


# ---- more numerics -------------------------------------------------------------------------
def adjoint(input: Any) -> Tensor:
    """The conjugate transpose of the last two dims (their transpose for real tensors)."""
    x = to_tensor(input)
    if x.ndim < 2:
        raise ShapeError(
            "tensor.adjoint() is only supported on matrices or batches of matrices. "
            f"Got {x.ndim}-D tensor."
        )
    return conj(transpose(x, -2, -1))


def _constant(values: np.ndarray, like: Tensor, dtype: Any = None) -> Tensor:
    """A constant made from the arguments (shapes, Python numbers) on ``like``'s device, in
    ``like``'s dtype unless given, announced to a recording tracer (a whole step replays it)."""
    t = to_tensor(values, like._dtype if dtype is None else dtype)
    if t.device != like.device:
        t = t.to(like.device)
    return _created(t)


def fill(input: Any, value: Any) -> Tensor:
    """A new tensor like ``input`` filled with ``value`` (a number or a 0-d tensor, which gets
    the gradient summed; ``input`` gets none)."""
    x = to_tensor(input)
    v = to_tensor(value)
    if v.ndim != 0:
        raise ShapeError(
            f"fill only supports 0-dimension value tensor but got tensor with {v.ndim} dimensions."
        )
    return where(ones_like(x, dtype=_dt.bool_), cast(v, x._dtype), x.detach())


def ldexp(input: Any, other: Any) -> Tensor:
    """``input * 2 ** other``."""
    x, e = _float_operands("ldexp", input, other)
    return mul(x, pow(2.0, e))


def mvlgamma(input: Any, p: int) -> Tensor:
    """The multivariate log-gamma of dimension ``p``:
    ``p (p - 1) / 4 log(pi) + sum_j lgamma(x - j / 2)``, j = 0 .. p - 1."""
    (x,) = _float_operands("mvlgamma", input)
    if p < 1:
        raise ValueError(f"p has to be greater than or equal to 1, but got {p}")

    def domain(array: Any) -> None:  # (a whole step checks each call's values again)
        if (_storage.to_host(array) <= (p - 1) / 2).any():
            raise ValueError(f"All elements must be greater than (p-1)/2 = {(p - 1) / 2}")

    _check(x, domain)
    total = lgamma(x)
    for j in builtins.range(1, p):
        total = add(total, lgamma(sub(x, j / 2)))
    return add(total, p * (p - 1) / 4 * math.log(math.pi))


def _trapezoid_parts(y: Tensor, x: Any, dx: Any, dim: int) -> tuple[Tensor, Any]:
    """The pairwise means of ``y`` along ``dim`` and the spacings (a number or a tensor)."""
    d = wrap_dim("trapezoid", dim, y.ndim)
    n = y.shape[d]
    means = div(add(y.narrow(d, 1, n - 1), y.narrow(d, 0, n - 1)), 2.0)
    if x is None:
        return means, 1.0 if dx is None else dx
    if dx is not None:
        raise TypeError("trapezoid: received both x and dx; pass one of them")
    xs = to_tensor(x)
    if xs.ndim == 1:
        if xs.shape[0] != n:
            raise ShapeError(
                f"trapezoid: There must be one `x` value for each sample point, got {xs.shape[0]}"
                f" x values and {n} samples"
            )
        view = [1] * y.ndim
        view[d] = n - 1
        return means, reshape(diff(xs), tuple(view))
    return means, diff(xs, dim=d)


def trapezoid(y: Any, x: Any = None, *, dx: Any = None, dim: int = -1) -> Tensor:
    t = to_tensor(y)
    if t.shape[wrap_dim("trapezoid", dim, t.ndim)] == 0:
        return sum(t, dim)
    means, spacing = _trapezoid_parts(t, x, dx, dim)
    return sum(mul(means, spacing), dim)


def trapz(y: Any, x: Any = None, *, dx: Any = None, dim: int = -1) -> Tensor:
    return trapezoid(y, x, dx=dx, dim=dim)


def cumulative_trapezoid(y: Any, x: Any = None, *, dx: Any = None, dim: int = -1) -> Tensor:
    t = to_tensor(y)
    d = wrap_dim("cumulative_trapezoid", dim, t.ndim)
    if t.shape[d] == 0:
        return t.narrow(d, 0, 0)
    means, spacing = _trapezoid_parts(t, x, dx, d)
    return cumsum(mul(means, spacing), d)


def cov(input: Any, *, correction: int = 1, fweights: Any = None, aweights: Any = None) -> Tensor:
    """The covariance of the rows of ``input`` (variables) over its columns (observations),
    with optional integer frequency and float observation weights, as numpy's ``cov``."""
    x = to_tensor(input)
    if x.ndim > 2:
        raise ShapeError(
            f"cov(): expected input to have two or fewer dimensions but got an input "
            f"with {x.ndim} dimensions"
        )
    if x._dtype.category < 2:
        x = cast(x, _dt.get_default_dtype())
    x = reshape(x, (1, -1)) if x.ndim < 2 else x
    observations = x.shape[1]
    w = None
    if fweights is not None:
        w = cast(to_tensor(fweights), x._dtype)
    if aweights is not None:
        a = cast(to_tensor(aweights), x._dtype)
        w = a if w is None else mul(w, a)
    if w is None:
        total = to_tensor(float(observations), x._dtype)
        average = mean(x, 1, True)
        factor = sub(total, correction)
        centred = sub(x, average)
        product = matmul(centred, transpose(centred, 0, 1))
    else:
        total = sum(w)
        average = div(sum(mul(x, w), 1, True), total)
        if aweights is None or correction == 0:
            factor = sub(total, correction)
        else:
            factor = sub(
                total, div(mul(sum(mul(w, cast(to_tensor(aweights), x._dtype))), correction), total)
            )
        centred = sub(x, average)
        product = matmul(mul(centred, w), transpose(centred, 0, 1))
    factor = clamp(factor, min=0.0)
    out = div(product, factor)
    return reshape(out, ()) if out.shape == (1, 1) else out


def corrcoef(input: Any) -> Tensor:
    c = cov(input)
    if c.ndim == 0:
        return div(c, c)
    d = sqrt(diagonal(c))
    out = div(div(c, unsqueeze(d, 1)), unsqueeze(d, 0))
    return clamp(out, -1.0, 1.0)


def vander(x: Any, N: int | None = None, increasing: bool = False) -> Tensor:  # noqa: N803
    t = to_tensor(x)
    if t.ndim != 1:
        raise ShapeError("x must be a one-dimensional tensor.")
    n = t.shape[0] if N is None else int(N)
    if n < 0:
        raise ValueError("N must be non-negative.")
    if n == 0:
        return reshape(t, (-1, 1)).narrow(1, 0, 0)
    # columns 1, x, x*x, ...: a running product (as PyTorch: exact at x = 0 and for integers)
    columns = [ones_like(t)]
    for _ in builtins.range(1, n):
        columns.append(mul(columns[-1], t))
    out = stack(columns, 1)
    return out if increasing else flip(out, (1,))


def combinations(input: Any, r: int = 2, with_replacement: bool = False) -> Tensor:
    import itertools  # (standard library; only this function uses it)

    x = to_tensor(input)
    if x.ndim != 1:
        raise ShapeError(f"Expect a 1D vector, but got shape {list(x.shape)}")
    if r < 0:
        raise ValueError(f"Expect a non-negative number, but got {r}")
    if r == 0:
        return x.narrow(0, 0, 0)
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = list(pick(builtins.range(x.shape[0]), r))
    index = np.array(rows, dtype=np.int64).reshape(-1)
    chosen = index_select(x, 0, _constant(index, x, _dt.int64))
    return reshape(chosen, (len(rows), r))


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(
    op: str, input: Any, q: Any, dim: Any, keepdim: bool, interpolation: str, ignore_nan: bool
) -> Tensor:
    x = to_tensor(input)
    if x._dtype.category < 2:
        raise DTypeError(f"{op}() input tensor must be either float or double dtype")
    if interpolation not in _INTERPOLATIONS:
        raise ValueError(
            f"{op}() interpolation must be one of linear, lower, higher, midpoint or nearest. "
            f"Got {interpolation}"
        )
    qs = to_tensor(q, x._dtype).detach() if isinstance(q, Tensor) else _constant(np.asarray(q), x)
    scalar_q = qs.ndim == 0
    if qs.ndim > 1:
        raise ShapeError(f"{op}() q must be a scalar or 1D tensor")
    qv = reshape(cast(qs, x._dtype), (-1,))

    def in_range(array: Any) -> None:
        values = _storage.to_host(array)
        if not ((values >= 0) & (values <= 1)).all():
            raise ValueError(f"{op}() q values must be in the range [0, 1]")

    _check(qv, in_range)
    if dim is None:
        rows, d = reshape(x, (1, -1)), 1
        kept = (1,) * x.ndim
        reduced: tuple = ()
    else:
        d = wrap_dim(op, dim, builtins.max(x.ndim, 1))
        rows = x if x.ndim else reshape(x, (1,))
        kept = tuple(1 if i == d else s for i, s in enumerate(rows.shape))
        reduced = tuple(s for i, s in enumerate(rows.shape) if i != d)
        rows, d = movedim(rows, d, -1), rows.ndim - 1
    if rows.shape[-1] == 0:
        raise ShapeError(f"{op}() input tensor must be non-empty")
    ordered = sort(rows, -1).values  # NaN last
    nan_row = any(isnan(rows.detach()), -1, True)
    count = sum(logical_not(isnan(rows.detach())), -1, True) if ignore_nan else None
    last = cast(count, x._dtype) if ignore_nan else _constant(np.asarray(float(rows.shape[-1])), x)
    last = clamp(sub(last, 1.0), min=0.0)
    pos = mul(last, qv).expand(*rows.shape[:-1], qv.shape[0])  # (..., nq)
    lo, hi = floor(pos), ceil(pos)
    if interpolation == "nearest":
        lo = hi = round(pos)
    take_lo = gather(ordered, -1, cast(lo, _dt.int64))
    take_hi = gather(ordered, -1, cast(hi, _dt.int64))
    if interpolation in ("lower", "nearest"):
        out = take_lo
    elif interpolation == "higher":
        out = take_hi
    elif interpolation == "midpoint":
        out = div(add(take_lo, take_hi), 2.0)
    else:
        out = add(take_lo, mul(sub(take_hi, take_lo), sub(pos, lo)))
    invalid = eq(count, 0) if ignore_nan else nan_row
    out = where(invalid, math.nan, out)
    # (..., nq) -> (nq, *reduced or kept)
    out = movedim(out, -1, 0)
    shape = kept if keepdim else reduced
    out = reshape(out, (qv.shape[0],) + tuple(shape))
    return reshape(out, tuple(shape)) if scalar_q else out


def quantile(
    input: Any, q: Any, dim: Any = None, keepdim: bool = False, *, interpolation: str = "linear"
) -> Tensor:
    """The ``q``-quantiles along ``dim`` (all elements when None), interpolated between the
    sorted values (PyTorch's five ``interpolation`` modes); nan where the slice holds a nan.
    Gradients reach the selected elements through the sort."""
    return _quantile("quantile", input, q, dim, keepdim, interpolation, ignore_nan=False)


def nanquantile(
    input: Any, q: Any, dim: Any = None, keepdim: bool = False, *, interpolation: str = "linear"
) -> Tensor:
    """``quantile`` ignoring nan values (nan only where a slice has nothing else)."""
    return _quantile("nanquantile", input, q, dim, keepdim, interpolation, ignore_nan=True)


def _read_host(t: Tensor, what: str) -> np.ndarray:
    """``t``'s values on the host, telling a tracing compiler that ``what`` reads them."""
    _read(t, what)
    return _storage.to_host(t._data)


def bincount(input: Any, weights: Any = None, minlength: int = 0) -> Tensor:
    """Counts (or sums of ``weights``) of each value of a 1-D non-negative integer tensor;
    computed on the host (its length depends on the values), not differentiable."""
    x = to_tensor(input)
    if x.ndim != 1 or x._dtype.category != 1:
        raise ShapeError(
            f"bincount only supports 1-d non-negative integral inputs, got {describe(x)}"
        )
    values = np.asarray(_read_host(x, "bincount()"))
    if values.size and values.min() < 0:
        raise ValueError("bincount only supports 1-d non-negative integral inputs.")
    if weights is None:
        counts = np.bincount(values, minlength=minlength).astype(np.int64)
        return _created(_leaf(counts, False, x.device))
    w = to_tensor(weights)
    wv = np.asarray(_read_host(w, "bincount()"))
    dt = w._dtype if w._dtype in (_dt.float32, _dt.float64) else _dt.float64
    sums = np.bincount(values, weights=wv, minlength=minlength).astype(dt.np)
    return _created(_leaf(sums, False, x.device))


def unravel_index(indices: Any, shape: Any) -> tuple:
    idx = to_tensor(indices)
    if idx._dtype.category != 1:
        raise TypeError(f"expected 'indices' to be integer dtype, but got {idx.dtype}")
    dims = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if builtins.any(s < 0 for s in dims):
        raise ValueError("'shape' cannot have negative values, but got " + str(dims))
    total = int(np.prod(dims))

    def in_bounds(array: Any) -> None:
        values = _storage.to_host(array)
        if ((values < -total) | (values >= total)).any():
            raise IndexError("index out of bounds for the given shape")

    _check(idx, in_bounds)
    flat = where(lt(idx, 0), add(idx, total), idx)
    coords = []
    for size in reversed(dims):
        coords.append(remainder(flat, size) if size else flat)
        flat = flat.div(size, rounding_mode="floor") if size else flat
    return tuple(reversed(coords))
