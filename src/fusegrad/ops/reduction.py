"""Reduction op surface: sum, mean, prod, max/min (values + indices), amax/amin, argmax/argmin,
var/std, norm, logsumexp, softmax/log_softmax, cumsum, cumprod, logcumsumexp, all/any.

Primitives: sum, amax, amin, prod, argmax, argmin, cumsum, all, any.  mean, var, std, norm,
logsumexp and max/min with ``dim`` are composites; softmax and log_softmax are fused primitives
on CPU float32/float64 (``ops/classification.py``) and composites elsewhere (inside one node
where a graph is recorded: ``autograd.native``).
"""

from __future__ import annotations

import builtins as _builtins
import math
from collections import namedtuple
from typing import Any

from .. import dtypes as _dt
from ..autograd.node_names import name_node as _name_node
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..autograd.tracer import notify_created as _created
from ..errors import DTypeError, ShapeError, describe
from ..tensor import Tensor
from . import classification as _classification
from ._util import P, apply, cast, to_tensor, wrap_dim, wrap_dims
from .elementwise import add, div, isfinite, sub, where
from .generated import abs, eq, exp, log, logaddexp, maximum, minimum, mul, ne, sqrt
from .shape import cat, pad

_values_indices = namedtuple("_values_indices", ["values", "indices"])


def _reduce(name: str, x: Tensor, dim: Any, keepdim: bool) -> Tensor:
    dims = wrap_dims(name, dim, x.ndim)
    if x.ndim == 0:
        dims = None
    return apply(P[name], (x,), {"dim": dims, "keepdim": bool(keepdim)})


def sum(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    x = to_tensor(input)
    if dtype is not None:
        x = cast(x, _dt.as_dtype(dtype))
    return _reduce("sum", x, dim, keepdim)


def _count(x: Tensor, dims: tuple | None) -> int:
    if dims is None:
        return x.numel()
    n = 1
    for d in dims:
        n *= x._data.shape[d]
    return n


def mean(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    x = to_tensor(input)
    if dtype is not None:
        x = cast(x, _dt.as_dtype(dtype))
    if x._dtype.category < 2:
        raise DTypeError(
            "mean(): could not infer output dtype. Input dtype must be either a floating point "
            f"or complex dtype. Got: {x._dtype.name}"
        )
    dims = wrap_dims("mean", dim, x.ndim) if x.ndim else None
    n = _count(x, dims)
    if n == 0:
        # the mean of nothing is nan; built as 0 * sum + nan so that no nan reaches gradients
        out = add(mul(sum(x, dims, keepdim), 0.0), math.nan)
    else:
        out = div(sum(x, dims, keepdim), n)
    return _name_node(out, "MeanBackward0" if dim is None else "MeanBackward1")


@_torch_node_name("VarBackward0")
def var(
    input: Any,
    dim: Any = None,
    unbiased: bool | None = None,
    keepdim: bool = False,
    *,
    correction: float | None = None,
) -> Tensor:
    x = to_tensor(input)
    if x._dtype.category < 2:
        raise DTypeError(f"var: expected a floating point or complex tensor, got {describe(x)}")
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    dims = wrap_dims("var", dim, x.ndim) if x.ndim else None
    n = _count(x, dims)
    centred = sub(x, mean(x, dims, keepdim=True))
    if centred._dtype.category == 3:  # |x - mean|^2: the variance of complex values is real
        centred = abs(centred)
    ssq = sum(mul(centred, centred), dims, keepdim)
    denom = n - correction
    return div(ssq, denom) if denom > 0 else mul(ssq, math.inf if n else math.nan)


@_torch_node_name("StdBackward0")
def std(
    input: Any,
    dim: Any = None,
    unbiased: bool | None = None,
    keepdim: bool = False,
    *,
    correction: float | None = None,
) -> Tensor:
    # where the variance is 0 the gradient is 0, not inf * 0 = nan (PyTorch's std_backward)
    return _safe_sqrt(var(input, dim, unbiased, keepdim, correction=correction))


def var_mean(input: Any, dim: Any = None, *, correction: float = 1, keepdim: bool = False) -> tuple:
    return var(input, dim, keepdim=keepdim, correction=correction), mean(input, dim, keepdim)


def prod(input: Any, dim: int | None = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    x = to_tensor(input)
    if dtype is not None:
        x = cast(x, _dt.as_dtype(dtype))
    return _reduce("prod", x, dim, keepdim)


def _check_nonempty(op: str, x: Tensor, dims: tuple | None) -> None:
    # (``builtins.any``: this module's ``any`` is the reduction)
    if x.numel() == 0 and (dims is None or _builtins.any(x._data.shape[d] == 0 for d in dims)):
        raise ShapeError(
            f"{op}(): Expected reduction dim to be specified for input.numel() == 0 (or the "
            f"reduced dim has size 0); input {describe(x)}"
        )


def amax(input: Any, dim: Any = (), keepdim: bool = False) -> Tensor:
    x = to_tensor(input)
    dims = None if dim == () or dim is None else wrap_dims("amax", dim, x.ndim)
    _check_nonempty("amax", x, dims)
    return apply(P["amax"], (x,), {"dim": dims if x.ndim else None, "keepdim": bool(keepdim)})


def amin(input: Any, dim: Any = (), keepdim: bool = False) -> Tensor:
    x = to_tensor(input)
    dims = None if dim == () or dim is None else wrap_dims("amin", dim, x.ndim)
    _check_nonempty("amin", x, dims)
    return apply(P["amin"], (x,), {"dim": dims if x.ndim else None, "keepdim": bool(keepdim)})


def argmax(input: Any, dim: int | None = None, keepdim: bool = False) -> Tensor:
    x = to_tensor(input)
    d = None if dim is None or x.ndim == 0 else wrap_dim("argmax", dim, x.ndim)
    _check_nonempty("argmax", x, None if d is None else (d,))
    return apply(P["argmax"], (x,), {"dim": d, "keepdim": bool(keepdim)})


def argmin(input: Any, dim: int | None = None, keepdim: bool = False) -> Tensor:
    x = to_tensor(input)
    d = None if dim is None or x.ndim == 0 else wrap_dim("argmin", dim, x.ndim)
    _check_nonempty("argmin", x, None if d is None else (d,))
    return apply(P["argmin"], (x,), {"dim": d, "keepdim": bool(keepdim)})


def _max_min(op: str, x: Any, dim: Any, keepdim: bool) -> Any:
    x = to_tensor(x)
    if isinstance(dim, Tensor):  # max(a, b): elementwise
        return (maximum if op == "max" else minimum)(x, dim)
    if dim is None:  # PyTorch's max() / min() overloads: MaxBackward1, MinBackward1
        whole = amax(x) if op == "max" else amin(x)
        return _name_node(whole, "MaxBackward1" if op == "max" else "MinBackward1")
    d = wrap_dim(op, dim, x.ndim)
    if x.ndim == 0:
        return _values_indices(x.reshape(()), _created(Tensor._make(__import__("numpy").array(0))))
    idx = argmax(x, d, keepdim=True) if op == "max" else argmin(x, d, keepdim=True)
    # values via gather: the gradient goes to the selected index only (as PyTorch's max(dim))
    values = x.gather(d, idx)
    if not keepdim:
        values, idx = values.squeeze(d), idx.squeeze(d)
    _name_node(values, "MaxBackward0" if op == "max" else "MinBackward0")
    return _values_indices(values, idx)


def max(input: Any, dim: Any = None, keepdim: bool = False) -> Any:
    return _max_min("max", input, dim, keepdim)


def min(input: Any, dim: Any = None, keepdim: bool = False) -> Any:
    return _max_min("min", input, dim, keepdim)


def all(input: Any, dim: Any = None, keepdim: bool = False) -> Tensor:
    return _reduce("all", to_tensor(input), dim, keepdim)


def any(input: Any, dim: Any = None, keepdim: bool = False) -> Tensor:
    return _reduce("any", to_tensor(input), dim, keepdim)


def count_nonzero(input: Any, dim: Any = None) -> Tensor:
    return sum(ne(to_tensor(input), 0), dim)


def cumsum(input: Any, dim: int, *, dtype: Any = None) -> Tensor:
    x = to_tensor(input)
    if dtype is not None:
        x = cast(x, _dt.as_dtype(dtype))
    d = wrap_dim("cumsum", dim, x.ndim)  # (a 0-d tensor takes dim 0 or -1 only)
    if x.ndim == 0:
        return x.clone()
    return apply(P["cumsum"], (x,), {"dim": d})


@_torch_node_name("LinalgVectorNormBackward0")
def norm(input: Any, p: Any = "fro", dim: Any = None, keepdim: bool = False) -> Tensor:
    x = to_tensor(input)
    if x._dtype.category < 2:
        raise DTypeError(f"norm: expected a floating point or complex tensor, got {describe(x)}")
    if x._dtype.category == 3:
        x = abs(x)  # every p-norm of complex values is the norm of their moduli
    dims = wrap_dims("norm", dim, x.ndim) if x.ndim else None
    if p in ("fro", 2, 2.0):
        return _safe_sqrt(sum(mul(x, x), dims, keepdim))
    if p in (math.inf, "inf"):
        return amax(abs(x), dims if dims is not None else (), keepdim)
    if p in (-math.inf, "-inf"):
        return amin(abs(x), dims if dims is not None else (), keepdim)
    if p == 1:
        return sum(abs(x), dims, keepdim)
    if p == 0:
        return sum(cast(ne(x, 0), x.dtype), dims, keepdim)
    if isinstance(p, (int, float)):
        a = abs(x)
        s = sum(_safe_pow(a, p), dims, keepdim)
        return where(eq(s, 0), 0.0, _safe_pow(where(eq(s, 0), 1.0, s), 1.0 / p))
    raise ValueError(f"norm: unsupported norm type {p!r}")


def _safe_pow(a: Tensor, p: float) -> Tensor:
    # a**p with a zero gradient at a == 0 (the subgradient PyTorch uses for p-norms)
    zero = eq(a, 0)
    return where(zero, 0.0, where(zero, 1.0, a) ** p)


def _safe_sqrt(s: Tensor) -> Tensor:
    # sqrt with gradient 0 (not inf * 0 = nan) at s == 0, as PyTorch's norm backward
    zero = eq(s, 0)
    return where(zero, 0.0, sqrt(where(zero, 1.0, s)))


@_torch_node_name("LogsumexpBackward0")
def logsumexp(input: Any, dim: Any, keepdim: bool = False) -> Tensor:
    x = to_tensor(input)
    if x._dtype.category != 2:
        x = cast(x, _dt.get_default_dtype())
    dims = wrap_dims("logsumexp", dim, x.ndim) if x.ndim else None
    if x.numel() == 0:
        return log(sum(exp(x), dims, keepdim))
    # shift by the (detached) max for stability; an all -inf or inf slice is not shifted
    m = amax(x, dims if dims is not None else (), keepdim=True).detach()
    m = where(isfinite(m), m, 0.0)
    out = add(log(sum(exp(sub(x, m)), dims, keepdim=True)), m)
    if not keepdim:
        out = out.squeeze(dims) if dims is not None else out.reshape(())
    return out


@_torch_node_name("SoftmaxBackward0")
def softmax(input: Any, dim: int, dtype: Any = None) -> Tensor:
    x = to_tensor(input)
    if dtype is not None:
        x = cast(x, _dt.as_dtype(dtype))
    if x._dtype.category != 2:
        raise DTypeError(f"softmax: expected a floating point tensor, got {describe(x)}")
    d = wrap_dim("softmax", dim, x.ndim) if x.ndim else None
    if d is not None and _classification.fused_classification_runs(x):
        return apply(P["softmax"], (x,), {"dim": d})
    if _native is not None and _native.records_softmax(x):
        # one node that saves the result, as the fused primitive's (``autograd.native``)
        return _native.Softmax.apply(x, d)
    return _softmax_composite(x, d)


def _softmax_composite(x: Tensor, d: int | None) -> Tensor:
    """``softmax`` of a float ``x`` along the (wrapped) dim ``d`` (None for a 0-d ``x``) in
    primitives: ``exp(x - m) / sum(exp(x - m))``, ``m`` the detached maximum (a slice holding
    NaN, +inf or only -inf is NaN throughout, as PyTorch's kernel gives), the fused
    primitive's values to the bit (``ops/classification.py``)."""
    dims = (d,) if d is not None else None
    m = amax(x, dims if dims else (), keepdim=True).detach() if x.numel() else x.detach()
    e = exp(sub(x, m))
    return div(e, sum(e, dims, keepdim=True))


@_torch_node_name("LogSoftmaxBackward0")
def log_softmax(input: Any, dim: int, dtype: Any = None) -> Tensor:
    x = to_tensor(input)
    if dtype is not None:
        x = cast(x, _dt.as_dtype(dtype))
    if x._dtype.category != 2:
        raise DTypeError(f"log_softmax: expected a floating point tensor, got {describe(x)}")
    if x.ndim == 0:
        return sub(x, x)
    d = wrap_dim("log_softmax", dim, x.ndim)
    if not x.shape[d]:
        return sub(x, logsumexp(x, d, keepdim=True))
    if _classification.fused_classification_runs(x):
        return apply(P["log_softmax"], (x,), {"dim": d})
    if _native is not None and _native.records_log_softmax(x):
        # one node that saves the result, as the fused primitive's (``autograd.native``)
        return _native.LogSoftmax.apply(x, d)
    return _log_softmax_composite(x, d)


def _log_softmax_composite(x: Tensor, d: int) -> Tensor:
    """``log_softmax`` of a float ``x`` along the (wrapped, non-empty) dim ``d`` in primitives,
    PyTorch's kernel's form (the fused primitive's): ``x - max - log(sum(exp(x - max)))``, the
    max a constant shift, so that a slice holding inf (or only -inf) is NaN throughout."""
    shifted = sub(x, amax(x, (d,), keepdim=True).detach())
    return sub(shifted, log(sum(exp(shifted), (d,), keepdim=True)))


# ``autograd.native`` (above the op surface) hands itself over on import (see its docstring)
_native: Any = None


def install_native(module: Any) -> None:
    """Called by ``fusegrad.autograd.native`` with itself."""
    global _native
    _native = module


@_torch_node_name("CumprodBackward0")
def cumprod(input: Any, dim: int, *, dtype: Any = None) -> Tensor:
    """Running products along ``dim``, one multiply per position.  Not ``exp(cumsum(log x))``:
    that has no gradient where ``x`` holds a zero, while this chain of products is exact there
    (and twice differentiable).  Integer and bool inputs accumulate in int64, as PyTorch's."""
    x = to_tensor(input)
    if dtype is not None:
        x = cast(x, _dt.as_dtype(dtype))
    elif x._dtype.category < 2:
        x = cast(x, _dt.int64)
    d = wrap_dim("cumprod", dim, x.ndim)  # (a 0-d tensor takes dim 0 or -1 only)
    if x.ndim == 0:
        return x.clone()
    n = x.shape[d]
    if n == 0:
        return x.clone()
    running = x.narrow(d, 0, 1)
    parts = [running]
    for i in range(1, n):
        running = mul(running, x.narrow(d, i, 1))
        parts.append(running)
    return cat(parts, d) if n > 1 else running.clone()


@_torch_node_name("LogcumsumexpBackward0")
def logcumsumexp(input: Any, dim: int) -> Tensor:
    """``log(cumsum(exp(x)))`` along ``dim``, without overflow or underflow: a parallel prefix
    scan of ``logaddexp`` (Hillis-Steele, ``ceil(log2 n)`` elementwise steps, each combining
    every element with the one ``2**k`` places before it; the first ``2**k`` are combined with
    -inf padding, which leaves them as they are).  Not ``log(cumsum(exp(x - max)))``: that
    underflows to -inf for a prefix far below the row's maximum.  A composite, so it compiles
    into fused loops and differentiates twice."""
    x = to_tensor(input)
    if x._dtype.category != 2:
        raise DTypeError(f"logcumsumexp: expected a floating point tensor, got {describe(x)}")
    if x.ndim == 0:
        return x.clone()
    d = wrap_dim("logcumsumexp", dim, x.ndim)
    n = x.shape[d]
    out = x
    step = 1
    while step < n:
        widths = [0, 0] * (x.ndim - 1 - d) + [step, 0]  # F.pad order: last dim first
        before = pad(out.narrow(d, 0, n - step), widths, value=-math.inf)
        out = logaddexp(out, before)
        step *= 2
    return out if out is not x else x.clone()
