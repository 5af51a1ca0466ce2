"""Op surface of the special functions: the functions ``fusegrad.special`` exports, written over
the primitives of ``ops/special_functions.py`` and the elementwise primitives (``erf``,
``lgamma``, ...), with PyTorch's promotion rules and signatures.

Where this sits: a layer of the op surface like ``elementwise.py``; ``fusegrad.ops`` imports it
(exporting PyTorch's top-level ``i0``, ``igamma`` and ``igammac`` and installing their ``Tensor``
methods) and the derivative rules call it as ``F.special_ops``.  ``fusegrad.special`` is the public
namespace, with PyTorch's names (``expit``, ``gammaln``, ``psi``, ...).

Composites (``ndtr``, ``xlog1py``, ``spherical_bessel_j0``, ...) are written from primitives so
that they fuse in compiled code; a function is a primitive where its derivative has a formula
of its own in PyTorch (``log_ndtr``, ``erfcx``, ``i0e``, ...) or where no composite is accurate.
"""

from __future__ import annotations

import math
from typing import Any

from .. import dtypes as _dt
from ..errors import DTypeError, describe
from ..tensor import Tensor
from ._util import P, apply, as_operand, broadcast_shape, cast, operand, to_tensor
from .elementwise import where
from .generated import (
    _float_binary,
    _float_unary,
    abs,
    erf,
    erfc,
    isinf,
    log1p,
    logical_and,
    lt,
    mul,
    sin,
)

# ---- unary primitives ------------------------------------------------------------------------


def _unary(name: str, doc: str) -> Any:
    def fn(input: Any) -> Tensor:
        return _float_unary(name, input)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc + " Integers and bools promote to the default float dtype."
    return fn


i0 = _unary("i0", "The modified Bessel function of the first kind of order 0, I0(x).")
i0e = _unary("i0e", "The exponentially scaled I0: exp(-|x|) I0(x).")
i1 = _unary("i1", "The modified Bessel function of the first kind of order 1, I1(x).")
i1e = _unary("i1e", "The exponentially scaled I1: exp(-|x|) I1(x).")
erfcx = _unary("erfcx", "The scaled complementary error function exp(x^2) erfc(x).")
ndtri = _unary("ndtri", "The standard normal quantile function (the inverse of ndtr).")
log_ndtr = _unary("log_ndtr", "log of the standard normal CDF, accurate in both tails.")
entr = _unary("entr", "-x log x for x > 0, 0 at 0, -inf for x < 0.")
# not differentiable (PyTorch defines no derivative for them)
bessel_j0 = _unary("bessel_j0", "The Bessel function of the first kind of order 0, J0(x).")
bessel_j1 = _unary("bessel_j1", "The Bessel function of the first kind of order 1, J1(x).")
bessel_y0 = _unary("bessel_y0", "The Bessel function of the second kind of order 0, Y0(x).")
bessel_y1 = _unary("bessel_y1", "The Bessel function of the second kind of order 1, Y1(x).")
modified_bessel_k0 = _unary(
    "modified_bessel_k0", "The modified Bessel function of the second kind of order 0, K0(x)."
)
modified_bessel_k1 = _unary(
    "modified_bessel_k1", "The modified Bessel function of the second kind of order 1, K1(x)."
)
scaled_modified_bessel_k0 = _unary("scaled_modified_bessel_k0", "exp(x) K0(x).")
scaled_modified_bessel_k1 = _unary("scaled_modified_bessel_k1", "exp(x) K1(x).")
airy_ai = _unary("airy_ai", "The Airy function Ai(x).")


def modified_bessel_i0(input: Any) -> Tensor:
    """I0(x), as ``i0`` but not differentiable (PyTorch's ``special.modified_bessel_i0``)."""
    return i0(to_tensor(input).detach())


def modified_bessel_i1(input: Any) -> Tensor:
    """I1(x), as ``i1`` but not differentiable (PyTorch's ``special.modified_bessel_i1``)."""
    return i1(to_tensor(input).detach())


def spherical_bessel_j0(input: Any) -> Tensor:
    """The spherical Bessel function of the first kind of order 0, sin(x) / x: its Taylor
    series below |x| = 1/2 (where sin(x) / x loses digits to rounding, and 0 / 0 at 0), 0 at
    +-inf.  Not differentiable, as in PyTorch."""
    x = _floated(input).detach()
    x2 = x * x
    series = 1.0 + x2 * (
        -1.0 / 6.0
        + x2
        * (
            1.0 / 120.0
            + x2
            * (
                -1.0 / 5040.0
                + x2 * (1.0 / 362880.0 + x2 * (-1.0 / 39916800.0 + x2 * (1.0 / 6227020800.0)))
            )
        )
    )
    small = lt(abs(x), 0.5)
    safe = where(small, 1.0, x)
    return where(isinf(x), 0.0, where(small, series, sin(safe) / safe))


def _floated(input: Any) -> Tensor:
    x = to_tensor(input)
    if x._dtype.category < 2:
        x = cast(x, _dt.get_default_dtype())
    return x


# ---- composites ------------------------------------------------------------------------------


def ndtr(input: Any) -> Tensor:
    """The standard normal CDF, (1 + erf(x / sqrt 2)) / 2: through erf near 0 and through erfc
    of |x| / sqrt 2 in the tails (where 1 + erf would lose the small values)."""
    x = _floated(input)
    a = x * math.sqrt(0.5)
    z = abs(a)
    tail = 0.5 * erfc(z)
    return where(lt(z, math.sqrt(0.5)), 0.5 + 0.5 * erf(a), where(a > 0, 1.0 - tail, tail))


def xlog1py(input: Any, other: Any) -> Tensor:
    """``input * log1p(other)``, 0 where ``input`` is 0 unless ``other`` is nan (``other`` is
    replaced by 0 there when ``log1p`` would be -inf or nan, so that both gradients are 0)."""
    x, y = _float_operands("xlog1py", input, other)
    safe = where(logical_and(x == 0, y <= -1.0), 0.0, y)
    return mul(x, log1p(safe))


def _float_operands(op: str, a: Any, b: Any) -> tuple[Tensor, Tensor]:
    a, b = operand(a), operand(b)
    dt = _dt.result_type(a, b)
    if dt.category < 2:
        dt = _dt.get_default_dtype()
    a, b = as_operand(a, dt), as_operand(b, dt)
    broadcast_shape(op, a, b)
    return a, b


# ---- binary primitives -----------------------------------------------------------------------


def _tensor_operands(op: str, input: Any, other: Any) -> tuple[Tensor, Tensor]:
    """PyTorch's igamma/igammac want two float tensors (no Python numbers, no integers)."""
    for position, name, value in ((1, "input", input), (2, "other", other)):
        if not isinstance(value, Tensor):
            raise TypeError(
                f"special_{op}(): argument '{name}' (position {position}) must be Tensor, "
                f"not {type(value).__name__}"
            )
    dt = _dt.result_type(input, other)
    if dt.category < 2:
        raise DTypeError(f"{op}: expected floating-point tensors, got {describe(input, other)}")
    input, other = as_operand(input, dt), as_operand(other, dt)
    broadcast_shape(op, input, other)
    return input, other


def gammainc(input: Tensor, other: Tensor) -> Tensor:
    """The regularized lower incomplete gamma function P(input, other); differentiable in
    ``other`` only, as in PyTorch."""
    a, x = _tensor_operands("gammainc", input, other)
    return apply(P["gammainc"], (a, x), {})


def gammaincc(input: Tensor, other: Tensor) -> Tensor:
    """The regularized upper incomplete gamma function Q(input, other) = 1 - P; differentiable
    in ``other`` only, as in PyTorch."""
    a, x = _tensor_operands("gammaincc", input, other)
    return apply(P["gammaincc"], (a, x), {})


igamma = gammainc
igammac = gammaincc


def zeta(input: Any, other: Any) -> Tensor:
    """Hurwitz's zeta function sum_k (k + other)^-input; differentiable in ``other`` only, as
    in PyTorch."""
    return _float_binary("zeta", input, other)


def _polynomial(name: str, doc: str) -> Any:
    def fn(input: Any, n: Any) -> Tensor:
        return _float_binary(name, input, n)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        doc + " ``n`` (a number or a tensor, broadcast with ``input``) is truncated to an "
        "integer degree; a negative degree gives 0.  Not differentiable, as in PyTorch."
    )
    return fn


chebyshev_polynomial_t = _polynomial("chebyshev_polynomial_t", "Chebyshev T_n(x).")
chebyshev_polynomial_u = _polynomial("chebyshev_polynomial_u", "Chebyshev U_n(x).")
chebyshev_polynomial_v = _polynomial("chebyshev_polynomial_v", "Chebyshev V_n(x).")
chebyshev_polynomial_w = _polynomial("chebyshev_polynomial_w", "Chebyshev W_n(x).")
shifted_chebyshev_polynomial_t = _polynomial(
    "shifted_chebyshev_polynomial_t", "Shifted Chebyshev T_n(2x - 1)."
)
shifted_chebyshev_polynomial_u = _polynomial(
    "shifted_chebyshev_polynomial_u", "Shifted Chebyshev U_n(2x - 1)."
)
shifted_chebyshev_polynomial_v = _polynomial(
    "shifted_chebyshev_polynomial_v", "Shifted Chebyshev V_n(2x - 1)."
)
shifted_chebyshev_polynomial_w = _polynomial(
    "shifted_chebyshev_polynomial_w", "Shifted Chebyshev W_n(2x - 1)."
)
hermite_polynomial_h = _polynomial("hermite_polynomial_h", "Physicists' Hermite H_n(x).")
hermite_polynomial_he = _polynomial("hermite_polynomial_he", "Probabilists' Hermite He_n(x).")
laguerre_polynomial_l = _polynomial("laguerre_polynomial_l", "Laguerre L_n(x).")
legendre_polynomial_p = _polynomial("legendre_polynomial_p", "Legendre P_n(x).")
