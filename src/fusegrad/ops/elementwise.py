"""Elementwise op surface, hand-written part: arithmetic with options (``add``'s ``alpha``,
``div``'s ``rounding_mode``), ops with dtype rules of their own (``neg``, ``sign``, rounding of
integers, bitwise ops), ``where``, and composites (activations, ``clamp``, ``isclose``, ...).

The plain elementwise primitives (``exp``, ``mul``, ``eq``, ``atan2``, ...) have no function here:
theirs are generated from their records (``ops/generated.py``), and this module imports the
ones its composites use.  Each function promotes its arguments (PyTorch rules,
``dtypes.result_type``), checks that shapes broadcast, and calls one primitive through
``registry.apply``; activations and the like are composites of those primitives
(docs/ARCHITECTURE.md, "Conventions").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..autograd.forward_state import state as _forward_state
from ..autograd.node_names import name_node as _name_node
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..autograd.tracer import notify_host_read as _read
from ..autograd.tracer import state as _tracer_state
from ..autograd.tracer import tracer_threads as _tracer_threads
from ..errors import ArgumentError, DTypeError, describe
from ..tensor import Tensor
from ._util import P, apply, as_operand, broadcast_shape, cast, is_number, operand, to_tensor
from .generated import (  # generated from the records; used by the composites below
    _binary,
    _fast_binary,
    _float_binary,
    _float_unary,
    abs,
    cos,
    digamma,
    eq,
    erf,
    exp,
    expm1,
    floor_divide,
    gt,
    isinf,
    isnan,
    le,
    log,
    log1p,
    logical_and,
    logical_not,
    logical_or,
    lt,
    mul,
    reciprocal,
    sigmoid,
    sin,
    sqrt,
    tanh,
)
from .registry import run as _run

_CLAMP_SENTINEL = object()


# ---- arithmetic -------------------------------------------------------------------------------
def _scaled(other: Any, alpha: Any) -> Any:
    """``alpha * other`` for add/sub; a Python number stays a (weak) Python number."""
    if is_number(alpha) and alpha == 1:
        return other
    if is_number(other) and is_number(alpha):
        return other * alpha
    return mul(other, alpha)


def add(input: Any, other: Any, *, alpha: Any = 1) -> Tensor:
    if type(alpha) is int and alpha == 1:
        return _binary("add", input, other)
    return _binary("add", input, _scaled(operand(other), alpha))


def sub(input: Any, other: Any, *, alpha: Any = 1) -> Tensor:
    if (
        type(alpha) is int
        and alpha == 1
        and not (isinstance(input, Tensor) and input._dtype is _dt.bool_)
    ):
        out = _fast_binary("sub", input, other)
        if out is not None:
            return out
    input, other = operand(input), _scaled(operand(other), alpha)
    dt = _dt.result_type(input, other)
    if dt is _dt.bool_:
        raise DTypeError(
            "sub: subtraction of bool tensors is not supported; use logical_xor instead "
            f"(got {describe(input, other)})"
        )
    return _binary("sub", input, other, dt)


@_torch_node_name("RsubBackward1")
def rsub(input: Any, other: Any) -> Tensor:
    return sub(other, input)


def div(input: Any, other: Any, *, rounding_mode: str | None = None) -> Tensor:
    input, other = operand(input), operand(other)
    if rounding_mode is None:
        return _float_binary("div", input, other)
    if rounding_mode == "floor":
        return floor_divide(input, other)
    if rounding_mode == "trunc":
        dt = _dt.result_type(input, other)
        q = _float_binary("div", input, other)
        if dt.category < 2:
            q = cast(q.detach(), _dt.float64)  # exact for int32; int64 up to 2**53
        return cast(trunc(q), dt)
    raise ArgumentError(
        f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
        f"'{rounding_mode}'"
    )


_NEG = P["neg"]


def neg(input: Any) -> Tensor:
    x = to_tensor(input)
    if x._dtype is _dt.bool_:
        raise DTypeError("neg: negation, the `-` operator, on a bool tensor is not supported")
    if _forward_state.level is None and (not _tracer_threads or _tracer_state.calls is None):
        return _run(_NEG, (x,), {})  # (``apply``'s decision in line: ``-g`` in many rules)
    return apply(_NEG, (x,), {})


@_torch_node_name("PowBackward0")
def square(input: Any) -> Tensor:
    return mul(input, input)


def sign(input: Any) -> Tensor:
    x = to_tensor(input)
    if x._dtype is _dt.bool_:
        return _int_identity(x)  # sign(True) = True, sign(False) = False
    return apply(P["sign"], (x,), {})


def where(condition: Any, input: Any, other: Any) -> Tensor:
    cond = to_tensor(condition)
    if cond._dtype is not _dt.bool_:
        raise DTypeError(f"where: expected condition to be a bool tensor, got {describe(cond)}")
    input, other = operand(input), operand(other)
    dt = _dt.result_type(input, other)
    a, b = as_operand(input, dt), as_operand(other, dt)
    broadcast_shape("where", cond, a, b)
    return apply(P["where"], (cond, a, b), {})


def _lerp_name(input: Any, end: Any, weight: Any) -> str:
    # PyTorch's overloads: lerp(Tensor, Tensor, Scalar) 0, lerp(Tensor, Tensor, Tensor) 1
    return "LerpBackward1" if isinstance(weight, Tensor) else "LerpBackward0"


@_torch_node_name(_lerp_name)
def lerp(input: Any, end: Any, weight: Any) -> Tensor:
    return add(input, mul(weight, sub(end, input)))


# ---- math functions -----------------------------------------------------------------------------


@_torch_node_name("Exp2Backward0")
def exp2(input: Any) -> Tensor:
    return exp(mul(_floatify(input), math.log(2.0)))


@_torch_node_name("Log2Backward0")
def log2(input: Any) -> Tensor:
    return mul(log(input), 1.0 / math.log(2.0))


@_torch_node_name("Log10Backward0")
def log10(input: Any) -> Tensor:
    return mul(log(input), 1.0 / math.log(10.0))


@_torch_node_name("RsqrtBackward0")
def rsqrt(input: Any) -> Tensor:
    return reciprocal(sqrt(input))


@_torch_node_name("TanBackward0")
def tan(input: Any) -> Tensor:
    x = _floatify(input)
    return div(sin(x), cos(x))


def polygamma(n: int, input: Any) -> Tensor:
    """The ``n``-th derivative of digamma: ``n = 0`` is ``digamma``, ``n = 1`` trigamma and
    higher orders the ``polygamma`` primitive (``ops/special_functions.py``); each is
    differentiable, its derivative being the next order."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"polygamma(): argument 'n' must be int, not {type(n).__name__}")
    if n < 0:
        raise ValueError("polygamma(n, x) does not support negative n.")
    if n == 0:
        return digamma(input)
    if n == 1:
        return _float_unary("trigamma", input)
    x = _floatify(input)
    return apply(P["polygamma"], (x,), {"n": n})


def floor(input: Any) -> Tensor:
    x = to_tensor(input)
    return _int_identity(x) if x._dtype.category < 2 else apply(P["floor"], (x,), {})


def ceil(input: Any) -> Tensor:
    x = to_tensor(input)
    return _int_identity(x) if x._dtype.category < 2 else apply(P["ceil"], (x,), {})


def trunc(input: Any) -> Tensor:
    x = to_tensor(input)
    return _int_identity(x) if x._dtype.category < 2 else apply(P["trunc"], (x,), {})


def _int_identity(x: Tensor) -> Tensor:
    """Rounding an integer tensor: the same values in a new tensor (never ``x`` itself, so that
    writing into the result cannot change ``x``)."""
    return apply(P["clone"], (x,), {})


def round(input: Any, *, decimals: int = 0) -> Tensor:
    x = to_tensor(input)
    if x._dtype.category < 2 and decimals >= 0:
        return _int_identity(x)
    return apply(P["round"], (x,), {"decimals": int(decimals)})


def _floatify(x: Any) -> Tensor:
    x = to_tensor(x)
    return cast(x, _dt.get_default_dtype()) if x._dtype.category < 2 else x


# ---- activations (composites) ---------------------------------------------------------------
@_torch_node_name("ReluBackward0")
def relu(input: Any) -> Tensor:
    x = to_tensor(input)
    # where(x > 0, x, 0): the gradient at 0 is 0, as in PyTorch
    return where(gt(x, 0), x, 0)


@_torch_node_name("LeakyReluBackward0")
def leaky_relu(input: Any, negative_slope: float = 0.01) -> Tensor:
    x = to_tensor(input)
    return where(gt(x, 0), x, mul(x, negative_slope))


@_torch_node_name("EluBackward0")
def elu(input: Any, alpha: float = 1.0) -> Tensor:
    x = to_tensor(input)
    return where(gt(x, 0), x, mul(expm1(x), alpha))


@_torch_node_name("GeluBackward0")
def gelu(input: Any, approximate: str = "none") -> Tensor:
    x = _floatify(input)
    if approximate == "none":
        return mul(mul(x, 0.5), add(erf(mul(x, 1.0 / math.sqrt(2.0))), 1.0))
    if approximate == "tanh":
        inner = mul(add(x, mul(mul(mul(x, x), x), 0.044715)), math.sqrt(2.0 / math.pi))
        return mul(mul(x, 0.5), add(tanh(inner), 1.0))
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


@_torch_node_name("SiluBackward0")
def silu(input: Any) -> Tensor:
    x = _floatify(input)
    return mul(x, sigmoid(x))


@_torch_node_name("SoftplusBackward0")
def softplus(input: Any, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    x = _floatify(input)
    bx = mul(x, beta) if beta != 1 else x
    # log(1 + exp(bx)) computed stably as m + log1p(exp(bx - 2 m)), m = max(bx, 0) (so that
    # bx - 2 m = -|bx|); linear above threshold.  m takes bx's branch at 0, so the gradient
    # there is 1 - 1/2 = sigmoid(0), as PyTorch's (relu and abs, whose gradients are 0 at 0,
    # gave 0)
    m = where(lt(bx, 0), _like(0, bx), bx)
    soft = add(m, log1p(exp(sub(bx, mul(m, 2)))))
    if beta != 1:
        soft = div(soft, beta)
    return where(gt(bx, threshold), x, soft)


def clamp(input: Any, min: Any = None, max: Any = None) -> Tensor:
    x = to_tensor(input)
    if min is None and max is None:
        raise ArgumentError("torch.clamp: At least one of 'min' or 'max' must not be None")
    # where-based so that the gradient passes at a bound (x == min goes to the x branch) and NaN
    # inputs stay NaN, as in PyTorch.
    out = x
    if min is not None:
        out = where(lt(out, min), _like(min, out), out)
    if max is not None:
        out = where(gt(out, max), _like(max, out), out)
    if out._dtype.category == 2 and out.requires_grad:
        # a NaN input stays NaN but gets no gradient (PyTorch: grad * (min <= x <= max))
        out = where(isnan(x), x.detach(), out)
    # PyTorch's overloads: clamp(Tensor, Tensor?, Tensor?) is ClampBackward0, numbers 1
    tensors = isinstance(min, Tensor) or isinstance(max, Tensor)
    return _name_node(out, "ClampBackward0" if tensors else "ClampBackward1")


clip = clamp


def _like(v: Any, ref: Tensor) -> Any:
    return v if isinstance(v, Tensor) else as_operand(v, _dt.result_type(ref, v))


@_torch_node_name("NanToNumBackward0")
def nan_to_num(
    input: Any, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None
) -> Tensor:
    x = to_tensor(input)
    if x._dtype.category < 2:
        return x
    info = np.finfo(x._dtype.np)
    big = float(info.max) if posinf is None else posinf
    small = float(info.min) if neginf is None else neginf
    out = where(isnan(x), nan, x)
    out = where(eq(x, math.inf), big, out)
    return where(eq(x, -math.inf), small, out)


# ---- comparisons and logic ---------------------------------------------------------------------


def _bitwise(name: str, a: Any, b: Any) -> Tensor:
    a, b = operand(a), operand(b)
    dt = _dt.result_type(a, b)
    if dt.category == 2:
        raise DTypeError(f"{name}: expected integer or bool tensors, got {describe(a, b)}")
    return _binary(name, a, b, dt)


def bitwise_and(input: Any, other: Any) -> Tensor:
    return _bitwise("bitwise_and", input, other)


def bitwise_or(input: Any, other: Any) -> Tensor:
    return _bitwise("bitwise_or", input, other)


def bitwise_xor(input: Any, other: Any) -> Tensor:
    return _bitwise("bitwise_xor", input, other)


def bitwise_not(input: Any) -> Tensor:
    x = to_tensor(input)
    if x._dtype is _dt.bool_:
        return logical_not(x)
    if x._dtype.category != 1:
        raise DTypeError(f"bitwise_not: expected an integer or bool tensor, got {describe(x)}")
    return sub(neg(x), 1)


def isfinite(input: Any) -> Tensor:
    x = to_tensor(input)
    return logical_not(logical_or(isnan(x), isinf(x)))


def isclose(
    input: Any, other: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False
) -> Tensor:
    """``|input - other| <= atol + rtol * |other|`` where that difference is finite, or equal
    (infinities of the same sign), or both nan with ``equal_nan``: PyTorch's rule, so ``inf``
    is not close to ``-inf`` and no finite number is close to an infinity."""
    a, b = to_tensor(input).detach(), to_tensor(other).detach()
    if a.dtype is not b.dtype and isinstance(input, Tensor) and isinstance(other, Tensor):
        raise ArgumentError(  # (PyTorch: a RuntimeError)
            f"isclose: {a.dtype.name} did not match {b.dtype.name} ({describe(a, b)})"
        )
    if rtol < 0 or atol < 0:
        raise ArgumentError(
            f"isclose: rtol and atol must be non-negative, got rtol={rtol}, atol={atol}"
        )
    close = eq(a, b)
    if equal_nan:
        close = logical_or(close, logical_and(isnan(a), isnan(b)))
    if a.dtype is _dt.bool_:
        return close
    error = abs(sub(a, b))
    within = le(error, add(mul(abs(b), rtol), atol))
    return logical_or(close, logical_and(isfinite(error), within))


def allclose(
    input: Any, other: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False
) -> bool:
    close = isclose(input, other, rtol, atol, equal_nan)
    return _read(close, "allclose()", bool(close._data.all()))


def equal(input: Any, other: Any) -> bool:
    a, b = to_tensor(input), to_tensor(other)
    same = a.shape == b.shape and bool((a._data == b._data).all())
    if _tracer_state.tracer is not None:
        _read(a, "equal()")
        _read(b, "equal()")
    return same


def sinc(input: Any) -> Tensor:
    """``sin(pi x) / (pi x)``, 1 at 0; integers promote to the default float dtype.  The
    division runs on a denominator that is never 0 so that the gradient at 0 is 0 (the true
    derivative), not nan."""
    x = _floatify(input)
    zero = eq(x, 0)
    px = mul(where(zero, 1.0, x), math.pi)
    return where(zero, 1.0, div(sin(px), px))
