"""Records of the special-function primitives behind ``fusegrad.special`` (and ``fusegrad.i0``,
``igamma``, ``polygamma`` of any order): Bessel and Airy functions, scaled error functions, the
normal distribution's quantile and log-CDF, incomplete gamma functions, Hurwitz's zeta, the
classical orthogonal polynomials and ``entr``.

Where this sits: ``fusegrad.ops`` imports this module right after ``ops/primitives.py``, whose
helpers it uses (and whose shape/dtype rule of elementwise records it gives these records), so
they are ordinary entries of the registry; their
derivative rules are in ``autograd/derivatives.py`` and their forward-mode rules in
``autograd/jvps.py``, like every other primitive's.  The public functions (promotion, PyTorch's
signatures, composites such as ``ndtr`` or ``spherical_bessel_j0``) are in ``fusegrad.special``.

Two kinds of record:

* functions whose eager kernel is ``scipy.special``'s (Cephes, as PyTorch's are, or more
  accurate than PyTorch's own port where the two differ: see ``docs/special.md``): they have no
  scalar lowering, and compiled code computes them with that kernel between fused loops (they
  are listed among the compiler's externs);
* functions written here as Python scalar functions using only ``math`` (the orthogonal
  polynomials, ``entr``): one source for the eager kernel, compiled CPU code and CUDA, as
  ``digamma`` is in ``primitives.py``.  The polynomials follow PyTorch's algorithm (the
  three-term recurrence, or the trigonometric closed form for large degrees inside ``(-1, 1)``)
  so that rounding agrees with PyTorch's, not only the mathematics.

scipy is imported on a kernel's first call, never at ``import fusegrad``.
"""

from __future__ import annotations

import math

import numpy as np

from .primitives import _elementwise_meta, _quiet
from .registry import Lowering, ScalarFunction, primitive, set_meta

_INF = math.inf
_NAN = math.nan


# ---- kernels from scipy.special ------------------------------------------------------------


def _scipy_special():  # type: ignore[no-untyped-def]
    from scipy import special  # a dependency, imported when a special function first runs

    return special


def _scipy_kernel(scipy_name: str, fix=None):  # type: ignore[no-untyped-def]
    """An eager kernel calling ``scipy.special.<scipy_name>`` on same-dtype operands, rounded
    to their dtype; ``fix(out, *operands)`` adjusts PyTorch's conventions in place."""

    def kernel(*arrays, **attrs):  # type: ignore[no-untyped-def]
        dtype = arrays[0].dtype
        out = getattr(_scipy_special(), scipy_name)(*arrays, **attrs)
        out = np.array(out, dtype=dtype, copy=True)
        if fix is not None:
            fix(out, *arrays)
        return out

    kernel.__name__ = scipy_name
    return _quiet(kernel)


def _polygamma_kernel(x, n):  # type: ignore[no-untyped-def]
    """``polygamma(n, x)`` for ``n >= 2`` (PyTorch: nan at +inf, where scipy gives 0)."""
    out = np.array(_scipy_special().polygamma(n, x), dtype=x.dtype, copy=True)
    out[x == _INF] = _NAN
    return out


def _airy_ai(x):  # type: ignore[no-untyped-def]
    return _scipy_special().airy(x)[0]


def _zeta_fix(out, x, q):  # type: ignore[no-untyped-def]
    # scipy gives nan for x < 1 and for x == 1 at q <= 0 ... PyTorch's Cephes port: inf at x == 1
    out[(x == 1.0) & ~np.isnan(q)] = _INF


_SCIPY_UNARY = {
    # name: (scipy function, differentiable)
    "i0": ("i0", True),
    "i0e": ("i0e", True),
    "i1": ("i1", True),
    "i1e": ("i1e", True),
    "erfcx": ("erfcx", True),
    "ndtri": ("ndtri", True),
    "log_ndtr": ("log_ndtr", True),
    "bessel_j0": ("j0", False),
    "bessel_j1": ("j1", False),
    "bessel_y0": ("y0", False),
    "bessel_y1": ("y1", False),
    "modified_bessel_k0": ("k0", False),
    "modified_bessel_k1": ("k1", False),
    "scaled_modified_bessel_k0": ("k0e", False),
    "scaled_modified_bessel_k1": ("k1e", False),
}

for _name, (_scipy_name, _differentiable) in _SCIPY_UNARY.items():
    primitive(_name, "elementwise", "x", differentiable=_differentiable)(_scipy_kernel(_scipy_name))


@primitive("airy_ai", "elementwise", "x", differentiable=False)
@_quiet
def _airy_ai_kernel(x):  # type: ignore[no-untyped-def]
    return np.array(_airy_ai(x), dtype=x.dtype, copy=True)


# regularized lower / upper incomplete gamma functions P(a, x), Q(a, x) (PyTorch's igamma and
# igammac): differentiable in x only, as in PyTorch
primitive("gammainc", "elementwise", "a x")(_scipy_kernel("gammainc"))
primitive("gammaincc", "elementwise", "a x")(_scipy_kernel("gammaincc"))
# Hurwitz's zeta(x, q) = sum_k (k + q)^-x: differentiable in q only, as in PyTorch
primitive("zeta", "elementwise", "x q")(_scipy_kernel("zeta", _zeta_fix))
# polygamma(n, x) of order n >= 2 (n = 0 is digamma, n = 1 trigamma: primitives.py)
primitive("polygamma", "elementwise", "x")(_quiet(_polygamma_kernel))


# ---- entr ----------------------------------------------------------------------------------


def entr_scalar(x: float) -> float:
    """-x log x for x > 0, 0 at 0, -inf for x < 0 (and nan for nan)."""
    x = float(x) * 1.0  # float64 everywhere (numba's float() keeps a float32 a float32)
    if x != x:
        return x
    if x > 0.0:
        if x == _INF:
            return -_INF
        return -x * math.log(x)
    if x == 0.0:
        return 0.0
    return -_INF


def _entr_kernel(x):  # type: ignore[no-untyped-def]
    positive = x > 0
    safe = np.where(positive, x, 1)
    out = np.where(positive, -x * np.log(safe), np.where(x == 0, 0.0, -np.inf))
    out = np.where(np.isnan(x), x, out)
    return np.asarray(out, dtype=x.dtype)


primitive(
    "entr",
    "elementwise",
    "x",
    lowering=Lowering("{entr}({0})", (ScalarFunction("entr", entr_scalar),)),
)(_quiet(_entr_kernel))


# ---- orthogonal polynomials ----------------------------------------------------------------

# degrees at least this large have no int64 value; PyTorch's conversion gives the most negative
# integer for them (as for nan), so the polynomial is 0
_NO_INT64 = 9.223372036854775807e18
#
# Each is p(x, n) for a degree n given as a float (PyTorch truncates it to an integer; a
# negative degree gives 0, and so does nan, which PyTorch's conversion turns into the most
# negative integer).  The branches and the order of operations are PyTorch's, so results agree
# to the last bit where the arithmetic is the same.


def chebyshev_t_scalar(x: float, n: float) -> float:
    """Chebyshev polynomial of the first kind T_n(x)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if abs(x) == 1.0:
        if x > 0.0 or k % 2 == 0:
            return 1.0
        return -1.0
    if k > 6 and abs(x) < 1.0:
        return math.cos(k * math.acos(x))
    if k == 0:
        return 1.0
    if k == 1:
        return x
    p = 1.0
    q = x
    r = 0.0
    for _ in range(2, k + 1):
        r = (x + x) * q - p
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def chebyshev_u_scalar(x: float, n: float) -> float:
    """Chebyshev polynomial of the second kind U_n(x)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if abs(x) == 1.0:
        if x > 0.0 or k % 2 == 0:
            return k + 1.0
        return -(k + 1.0)
    if k > 8 and abs(x) < 1.0:
        t = math.acos(x)
        if math.sin(t) != 0.0:
            return math.sin((k + 1) * t) / math.sin(t)
        return (k + 1) * math.cos((k + 1) * t) / x
    if k == 0:
        return 1.0
    if k == 1:
        return x + x
    p = 1.0
    q = x + x
    r = 0.0
    for _ in range(2, k + 1):
        r = (x + x) * q - p
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def chebyshev_v_scalar(x: float, n: float) -> float:
    """Chebyshev polynomial of the third kind V_n(x)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if abs(x) == 1.0:
        if x > 0.0:
            return 1.0
        if k % 2 == 0:
            return k + k + 1.0
        return -(k + k + 1.0)
    if k > 8 and abs(x) < 1.0:
        t = math.acos(x)
        if math.sin(t / 2.0) != 1.0:
            return math.cos((k + 0.5) * t) / math.cos(t / 2.0)
        if k % 2 == 0:
            return k + k + 1.0
        return -(k + k + 1.0)
    if k == 0:
        return 1.0
    if k == 1:
        return x + x - 1.0
    p = 1.0
    q = x + x - 1.0
    r = 0.0
    for _ in range(2, k + 1):
        r = (x + x) * q - p
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def chebyshev_w_scalar(x: float, n: float) -> float:
    """Chebyshev polynomial of the fourth kind W_n(x)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if abs(x) == 1.0:
        if x > 0.0:
            return k + k + 1.0
        if k % 2 == 0:
            return 1.0
        return -1.0
    if k > 8 and abs(x) < 1.0:
        t = math.acos(x)
        if math.cos(t / 2.0) != 1.0:
            return math.sin((k + 0.5) * t) / math.sin(t / 2.0)
        if x > 0.0:
            return k + k + 1.0
        if k % 2 == 0:
            return 1.0
        return -1.0
    if k == 0:
        return 1.0
    if k == 1:
        return x + x + 1.0
    p = 1.0
    q = x + x + 1.0
    r = 0.0
    for _ in range(2, k + 1):
        r = (x + x) * q - p
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def shifted_chebyshev_t_scalar(x: float, n: float) -> float:
    """Shifted Chebyshev polynomial of the first kind T*_n(x) = T_n(2x - 1)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if x == 1.0:
        return 1.0
    if x == 0.0:
        if k % 2 == 0:
            return 1.0
        return -1.0
    y = x + x - 1.0
    if k > 6 and abs(y) < 1.0:
        return math.cos(k * math.acos(y))
    if k == 0:
        return 1.0
    if k == 1:
        return y
    p = 1.0
    q = y
    r = 0.0
    for _ in range(2, k + 1):
        r = (y + y) * q - p
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def shifted_chebyshev_u_scalar(x: float, n: float) -> float:
    """Shifted Chebyshev polynomial of the second kind U*_n(x) = U_n(2x - 1)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if x == 1.0:
        return k + 1.0
    if x == 0.0:
        if k % 2 == 0:
            return k + 1.0
        return -(k + 1.0)
    y = x + x - 1.0
    if k > 6 and abs(y) < 1.0:
        t = math.acos(y)
        if math.sin(t) != 0.0:
            return math.sin((k + 1) * t) / math.sin(t)
        return (k + 1) * math.cos((k + 1) * t) / y
    if k == 0:
        return 1.0
    if k == 1:
        return y + y
    p = 1.0
    q = y + y
    r = 0.0
    for _ in range(2, k + 1):
        r = (y + y) * q - p
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def shifted_chebyshev_v_scalar(x: float, n: float) -> float:
    """Shifted Chebyshev polynomial of the third kind V*_n(x) = V_n(2x - 1)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if x == 1.0:
        return 1.0
    if x == 0.0:
        if k % 2 == 0:
            return k + k + 1.0
        return -(k + k + 1.0)
    y = x + x - 1.0
    if k > 6 and abs(y) < 1.0:
        t = math.acos(y)
        if math.sin(t / 2.0) != 1.0:
            return math.cos((k + 0.5) * t) / math.cos(t / 2.0)
        if k % 2 == 0:
            return k + k + 1.0
        return -(k + k + 1.0)
    if k == 0:
        return 1.0
    if k == 1:
        return y + y - 1.0
    p = 1.0
    q = y + y - 1.0
    r = 0.0
    for _ in range(2, k + 1):
        r = (y + y) * q - p
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def shifted_chebyshev_w_scalar(x: float, n: float) -> float:
    """Shifted Chebyshev polynomial of the fourth kind W*_n(x) = W_n(2x - 1)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if x == 1.0:
        return k + k + 1.0
    if x == 0.0:
        if k % 2 == 0:
            return 1.0
        return -1.0
    y = x + x - 1.0
    if k > 4 and abs(y) < 1.0:
        t = math.acos(y)
        if math.cos(t / 2.0) != 1.0:
            return math.sin((k + 0.5) * t) / math.sin(t / 2.0)
        if k % 2 == 0:
            return 1.0
        return -1.0
    if k == 0:
        return 1.0
    if k == 1:
        return y + y + 1.0
    p = 1.0
    q = y + y + 1.0
    r = 0.0
    for _ in range(2, k + 1):
        r = (y + y) * q - p
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def hermite_h_scalar(x: float, n: float) -> float:
    """Physicists' Hermite polynomial H_n(x)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if k == 0:
        return 1.0
    if k == 1:
        return x + x
    p = 1.0
    q = x + x
    r = 0.0
    for j in range(2, k + k, 2):
        r = (x + x) * q - j * p
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def hermite_he_scalar(x: float, n: float) -> float:
    """Probabilists' Hermite polynomial He_n(x)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if k == 0:
        return 1.0
    if k == 1:
        return x
    p = 1.0
    q = x
    r = 0.0
    for j in range(1, k):
        r = x * q - j * p
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def laguerre_l_scalar(x: float, n: float) -> float:
    """Laguerre polynomial L_n(x)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if abs(x) == 0.0:
        return 1.0
    if k == 0:
        return 1.0
    if k == 1:
        return 1.0 - x
    p = 1.0
    q = 1.0 - x
    r = 0.0
    for j in range(1, k):
        r = (((j + j) + (1.0 - x)) * q - j * p) / (j + 1)
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def legendre_p_scalar(x: float, n: float) -> float:
    """Legendre polynomial P_n(x)."""
    x = float(x) * 1.0
    n = float(n) * 1.0
    if n != n or n < 0.0 or n >= _NO_INT64:  # (as PyTorch's int64 conversion: negative)
        return 0.0
    k = int(n)
    if abs(x) == 1.0:
        if x > 0.0 or k % 2 == 0:
            return 1.0
        return -1.0
    if k == 0:
        return 1.0
    if k == 1:
        return x
    p = 1.0
    q = x
    r = 0.0
    for j in range(1, k):
        r = ((j + j + 1) * x * q - j * p) / (j + 1)
        p = q
        q = r
        if r != r:  # (nan stays nan: the rest of the recurrence changes nothing)
            break
    return r


def _binary_scalar_kernel(scalar):  # type: ignore[no-untyped-def]
    """An eager kernel applying the Python scalar function ``scalar(x, n)`` elementwise
    (computed in float64 and rounded once to the operands' dtype)."""
    ufunc = np.frompyfunc(scalar, 2, 1)

    def kernel(x, n):  # type: ignore[no-untyped-def]
        out = ufunc(x, n)
        return np.asarray(out, dtype=np.float64).astype(x.dtype, copy=False)

    kernel.__name__ = scalar.__name__
    return kernel


POLYNOMIALS = {
    "chebyshev_polynomial_t": chebyshev_t_scalar,
    "chebyshev_polynomial_u": chebyshev_u_scalar,
    "chebyshev_polynomial_v": chebyshev_v_scalar,
    "chebyshev_polynomial_w": chebyshev_w_scalar,
    "shifted_chebyshev_polynomial_t": shifted_chebyshev_t_scalar,
    "shifted_chebyshev_polynomial_u": shifted_chebyshev_u_scalar,
    "shifted_chebyshev_polynomial_v": shifted_chebyshev_v_scalar,
    "shifted_chebyshev_polynomial_w": shifted_chebyshev_w_scalar,
    "hermite_polynomial_h": hermite_h_scalar,
    "hermite_polynomial_he": hermite_he_scalar,
    "laguerre_polynomial_l": laguerre_l_scalar,
    "legendre_polynomial_p": legendre_p_scalar,
}

for _name, _scalar in POLYNOMIALS.items():
    # not differentiable, as in PyTorch (which defines no derivative for them)
    primitive(
        _name,
        "elementwise",
        "x n",
        differentiable=False,
        lowering=Lowering("{" + _name + "}({0}, {1})", (ScalarFunction(_name, _scalar),)),
    )(_quiet(_binary_scalar_kernel(_scalar)))

# the records without a scalar lowering (computed by their eager kernel in compiled code)
SCIPY_KERNELS = (*_SCIPY_UNARY, "airy_ai", "gammainc", "gammaincc", "zeta", "polygamma")

for _name in (*SCIPY_KERNELS, "entr", *POLYNOMIALS):
    set_meta(_name, _elementwise_meta(_name))
