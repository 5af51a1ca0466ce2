"""Eager kernels of every primitive, registered in the op registry.

Kernels take numpy arrays that the op surface has already promoted to one dtype and checked
for shape, plus keyword attributes, and return one array.  They never allocate more than numpy
needs and never touch autograd.  The full list is small on purpose: everything else in fusegrad
is a composite of these (docs/ARCHITECTURE.md, "Conventions"), so there is one derivative rule and
one compiler
lowering per entry here.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math

import numpy as np

from .. import dtypes as _dt
from .._index_key import numpy_key  # (also the CUDA kernels': kept below both devices)
from .._pool_windows import pool_out_sizes
from ..cuda.array import to_device
from ..errors import ArgumentError, ComplexNotSupported, FusegradError
from ..size import broadcast_shapes
from . import conv_kernels  # (numpy only: its numba loops load on first use)
from .registry import (
    ERROR_STATE,
    QUIET,
    REGISTRY,
    DataDependentShape,
    Lowering,
    ScalarFunction,
    primitive,
    set_meta,
)

# IEEE edge cases (log(0) = -inf, 0/0 = nan, overflow to inf) are results, not warnings, as in
# PyTorch.  ``np.errstate`` costs about 0.8 us per call, as much as the arithmetic on small
# tensors, so kernels switch numpy's error state through the context variable behind it
# (0.1 us); numpy versions without it fall back to ``np.errstate``.  A caller that runs many
# kernels in a row (the backward engine) switches once around them (``quiet_errors``), and each
# kernel then sees the state already set and skips the switch.
_extobj_contextvar, _QUIET = ERROR_STATE, QUIET  # (the registry's: ``run`` switches it too)


def quiet_errors() -> list | None:
    """Set numpy's error state to "ignore everything" for the kernels that follow.  Returns what
    ``restore_errors`` takes to put the caller's state back, and ``as_caller`` / ``quiet_again``
    to run user code in between (a one-item list holding the caller's state): None where there
    is nothing to switch (the state was already quiet, or numpy has no context variable and
    each kernel keeps its own ``np.errstate``)."""
    if _extobj_contextvar is None:  # pragma: no cover
        return None
    caller = _extobj_contextvar.get()
    if caller is _QUIET:
        return None
    _extobj_contextvar.set(_QUIET)
    return [caller]


def restore_errors(quiet: list | None) -> None:
    """Undo ``quiet_errors``: the caller's state again (as user code last left it)."""
    if quiet is not None:
        _extobj_contextvar.set(quiet[0])  # type: ignore[union-attr]


def as_caller(quiet: list | None) -> None:
    """Inside ``quiet_errors``: the caller's state again, for user code, until ``quiet_again``."""
    if quiet is not None:
        _extobj_contextvar.set(quiet[0])  # type: ignore[union-attr]


def quiet_again(quiet: list | None) -> None:
    """After ``as_caller``: quiet again, keeping the state user code set meanwhile (an
    ``np.seterr`` in a hook lasts after ``backward()``, as it would without the switch)."""
    if quiet is not None:
        quiet[0] = _extobj_contextvar.get()  # type: ignore[union-attr]
        _extobj_contextvar.set(_QUIET)  # type: ignore[union-attr]


def _quiet(fn, arity: int | None = None):  # type: ignore[no-untyped-def]
    """``fn`` with numpy's floating-point errors ignored.  ``arity`` (1 or 2): ``fn`` is only
    ever called with that many positional arguments (a ufunc kernel), so the wrapper takes them
    by name, without packing ``*args``/``**kwargs`` (a tenth of a microsecond per call)."""
    if _extobj_contextvar is None:  # pragma: no cover

        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            with np.errstate(all="ignore"):
                return fn(*args, **kwargs)

    else:
        get, set_, reset = _extobj_contextvar.get, _extobj_contextvar.set, _extobj_contextvar.reset

        if arity == 1:

            def call(x):  # type: ignore[no-untyped-def]
                if get() is _QUIET:
                    return fn(x)
                token = set_(_QUIET)
                try:
                    return fn(x)
                finally:
                    reset(token)

        elif arity == 2:

            def call(a, b):  # type: ignore[no-untyped-def]
                if get() is _QUIET:
                    return fn(a, b)
                token = set_(_QUIET)
                try:
                    return fn(a, b)
                finally:
                    reset(token)

        else:

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


# ---- elementwise -----------------------------------------------------------------------------
#
# Each record below is the whole declaration of an elementwise primitive: eager kernel, lowering
# expression (with the scalar functions it calls), surface promotion, methods and flags.  Its
# derivative rule is in ``autograd/derivatives.py``; nothing else names it.


def _elementwise(
    name: str, inputs: str, kernel, expression: str | None, *functions: ScalarFunction, **record
) -> None:  # type: ignore[no-untyped-def]
    """Register an elementwise primitive whose eager kernel is the numpy function ``kernel``
    (run with numpy's floating-point errors ignored) and whose compiled form is ``expression``
    (None: computed by its kernel between fused loops)."""
    lowering = None if expression is None else Lowering(expression, functions)
    # a ufunc taking exactly the primitive's inputs (no attributes): the lean wrapper
    arity = len(inputs.split())
    lean = isinstance(kernel, np.ufunc) and kernel.nin == arity and arity <= 2
    wrapped = _quiet(kernel, arity if lean else None)
    ufunc = kernel if lean else None
    primitive(name, "elementwise", inputs, lowering=lowering, ufunc=ufunc, **record)(wrapped)


def _libm(name: str, python=None, numpy: bool = False) -> ScalarFunction:  # type: ignore[no-untyped-def]
    """C's ``name`` (``math.<name>`` in compiled code).  ``python`` (default: numpy's ufunc of
    the same name, which never raises) stands in for it where Python runs generated code;
    ``numpy``: the CPU calls numpy's scalar ufunc instead (it keeps the float type)."""
    fn = python if python is not None else getattr(np, name)
    return ScalarFunction(name, fn, libm=name, numpy=name if numpy else None)


# how most public elementwise ops behave: a generated surface function, a method, an in-place one
_FLOAT_OP = {"surface": "float", "method": True, "inplace": True}
_SAME_OP = {"surface": "same", "method": True, "inplace": True}
# comparisons and logical ops: bool results, never differentiable (their in-place forms write
# 0 / 1 in the target's dtype, as in PyTorch)
_PREDICATE = {"surface": "same", "method": True, "differentiable": False, "bool_result": True}

# ---- unary
_elementwise("neg", "x", np.negative, "(-{0})", method=True, inplace=True, aliases=("negative",))
_elementwise("exp", "x", np.exp, "{exp}({0})", _libm("exp"), **_FLOAT_OP)
_elementwise("expm1", "x", np.expm1, "{expm1}({0})", _libm("expm1"), **_FLOAT_OP)
_elementwise("log", "x", np.log, "{log}({0})", _libm("log"), **_FLOAT_OP)
_elementwise("log1p", "x", np.log1p, "{log1p}({0})", _libm("log1p"), **_FLOAT_OP)
_elementwise("sin", "x", np.sin, "{sin}({0})", _libm("sin"), **_FLOAT_OP)
_elementwise("cos", "x", np.cos, "{cos}({0})", _libm("cos"), **_FLOAT_OP)
_elementwise("tanh", "x", np.tanh, "{tanh}({0})", _libm("tanh"), **_FLOAT_OP)
# inverse trigonometric and hyperbolic functions: primitives rather than composites (asin as
# atan2(x, sqrt(1 - x^2)), sinh from exp, ...) because libm computes them to an ulp where the
# composites lose accuracy near 0, near +-1 or overflow early
for _name, _kernel in [
    ("asin", np.arcsin),
    ("acos", np.arccos),
    ("atan", np.arctan),
    ("sinh", np.sinh),
    ("cosh", np.cosh),
    ("asinh", np.arcsinh),
    ("acosh", np.arccosh),
    ("atanh", np.arctanh),
]:
    _aliases = () if _name in ("sinh", "cosh") else ("arc" + _name[1:],)
    _elementwise(
        _name,
        "x",
        _kernel,
        "{" + _name + "}({0})",
        _libm(_name, _kernel),
        **_FLOAT_OP,
        aliases=_aliases,
    )
_elementwise("sqrt", "x", np.sqrt, "{sqrt}({0})", _libm("sqrt", numpy=True), **_FLOAT_OP)
_elementwise("reciprocal", "x", np.reciprocal, "({one} / {0})", **_FLOAT_OP)
_elementwise("abs", "x", np.abs, "abs({0})", **_SAME_OP, aliases=("absolute",))
# sign of a bool and rounding of integers are handled by their surface functions
_elementwise("sign", "x", np.sign, "_sign({0})", method=True, inplace=True)
_elementwise(
    "floor", "x", np.floor, "{floor}({0})", _libm("floor", numpy=True), method=True, inplace=True
)
_elementwise(
    "ceil", "x", np.ceil, "{ceil}({0})", _libm("ceil", numpy=True), method=True, inplace=True
)
_elementwise(
    "trunc",
    "x",
    np.trunc,
    "{trunc}({0})",
    _libm("trunc", numpy=True),
    method=True,
    inplace=True,
    aliases=("fix",),
)


def sigmoid_scalar(x: float) -> float:
    """sigmoid(x) that never evaluates exp of a positive number (no overflow)."""
    e = math.exp(-abs(x))
    return 1.0 / (1.0 + e) if x >= 0 else e / (1.0 + e)


# A primitive (not an exp-based composite): one node whose rule reuses the output, and a kernel
# of its own.  float32 and float64 compute PyTorch's CPU formula, 1 / (1 + exp(-x)): it never
# loses relative accuracy (no cancellation; within 3.3 ulp like the stable form below), and
# where exp(-x) overflows (x below -88.7 in float32) the result is 0, as PyTorch's, instead of
# a subnormal.  Four numpy calls on one array (half the time of the stable form's seven on
# three, on a thousand items).  float16's exp overflows already at -x > 11, far from where
# sigmoid is negligible: float16 keeps the stable form of ``sigmoid_scalar`` (which compiled code
# computes for every dtype).
@primitive(
    "sigmoid",
    "elementwise",
    "x",
    lowering=Lowering("{sigmoid}({0})", (ScalarFunction("sigmoid", sigmoid_scalar),)),
    **_FLOAT_OP,
)
def _sigmoid(x):  # type: ignore[no-untyped-def]
    if x.dtype.kind == "c":  # complex: the formula itself (it has poles, no stable form)
        return 1 / (1 + np.exp(-x))
    one = _SIGMOID_ONE.get(x.dtype.char)
    if one is not None:  # float32, float64: 1 / (1 + exp(-x)), in place on one new array
        e = np.negative(x)
        if type(e) is not np.ndarray:  # a 0-d input computes on numpy scalars (no ``out=``)
            return np.asarray(np.reciprocal(np.add(np.exp(e), one)))
        np.exp(e, out=e)
        np.add(e, one, out=e)
        return np.reciprocal(e, out=e)
    if x.ndim == 0 or not x.flags.c_contiguous:
        # (a 0-d array computes on numpy scalars, which take no ``out=``; other layouts keep
        # the strides ``np.where`` gives them)
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)
    # 1 / (1 + e) where x >= 0, else e / (1 + e), with e = exp(-|x|): computed as n / (1 + e)
    # with the numerator n = max(e, x >= 0), which is 1 where x >= 0 (there e <= 1) and e
    # elsewhere (e >= 0; a NaN e stays itself), so every value is the same division of the
    # same operands as in ``np.where(x >= 0, 1 / (1 + e), e / (1 + e))``, bit for bit, in
    # seven numpy calls on three arrays instead of ten on seven, the constants as 0-d arrays
    # of x's dtype (numpy converts a Python number per call, about as long as the arithmetic
    # on a thousand items)
    constants = _SIGMOID_CONSTANTS.get(x.dtype.char)
    zero, one = constants if constants is not None else (0, 1)
    e = np.abs(x)
    np.negative(e, out=e)
    np.exp(e, out=e)
    d = np.add(e, one)
    n = np.maximum(e, np.greater_equal(x, zero), out=e)
    out = np.divide(n, d, out=n)
    return out if out.dtype == x.dtype else out.astype(x.dtype)


# (0-d zero and one per float dtype; read-only, they are shared)
_SIGMOID_CONSTANTS = {}
for _dtype in (np.float16, np.float32, np.float64):
    _pair = (np.zeros((), _dtype), np.ones((), _dtype))
    for _c in _pair:
        _c.flags.writeable = False
    _SIGMOID_CONSTANTS[np.dtype(_dtype).char] = _pair
# the dtypes that compute 1 / (1 + exp(-x)), with their 0-d one
_SIGMOID_ONE = {
    np.dtype(d).char: _SIGMOID_CONSTANTS[np.dtype(d).char][1] for d in (np.float32, np.float64)
}


def _scipy_or_scalar(scipy_name: str, scalar):  # type: ignore[no-untyped-def]
    """An eager kernel: ``scipy.special.<scipy_name>`` (vectorised; scipy is a dependency, but
    imported only here, on the kernel's first call), else ``scalar`` applied element by element
    if scipy cannot be imported."""

    def kernel(x):  # type: ignore[no-untyped-def]
        try:
            from scipy import special  # (on first use: import fusegrad stays light)

            return getattr(special, scipy_name)(x).astype(x.dtype, copy=False)
        except ImportError:
            return np.vectorize(scalar, otypes=[x.dtype])(x) if x.size else x.copy()

    return kernel


_erf_scipy = _scipy_or_scalar("erf", math.erf)
_ERF_LOOP_MIN = 64  # (below, the numba call's own cost is more than scipy's per-element one)


def _erf(x):  # type: ignore[no-untyped-def]
    """float32: the compiler's vectorisable helper in a numba loop (``ops/erf_kernels.py``,
    8x scipy's speed, 1 ulp, generated code's values); other dtypes: scipy."""
    if x.dtype == np.float32 and x.size >= _ERF_LOOP_MIN:
        from .erf_kernels import erf_f32  # numba: on first use only

        return erf_f32(x)
    return _erf_scipy(x)


primitive(
    "erf",
    "elementwise",
    "x",
    lowering=Lowering("{erf}({0})", (_libm("erf", math.erf),)),
    **_FLOAT_OP,
)(_erf)


# ---- special functions
#
# The scalar functions below are the one source of their formula: compiled code runs them as
# they are (an inlined numba function on the CPU and in the interpreter, a device function on
# CUDA) and the eager kernels apply them element by element.  They use only ``math`` and
# arithmetic, compute in float64 whatever the operand's type (the caller rounds), and guard every
# pole and non-finite input before dividing or calling ``math``, so that in Python (eager, CUDA
# simulator) they return inf or nan where libm would, instead of raising.  numba compiles them
# with their module's globals frozen: they may read constants, but call only ``math``.

_INF = math.inf
_NAN = math.nan
_PI = math.pi
_LN2 = math.log(2.0)
_EVERY_FLOAT_AN_INTEGER = 4503599627370496.0  # 2**52: no float at least this large has a fraction


def _scalar_kernel(scalar):  # type: ignore[no-untyped-def]
    """An eager kernel applying the unary Python scalar function ``scalar`` element by element
    (computed in float64 and rounded once to the operand's dtype)."""
    ufunc = np.frompyfunc(scalar, 1, 1)

    def kernel(x):  # type: ignore[no-untyped-def]
        return np.asarray(ufunc(x), dtype=np.float64).astype(x.dtype, copy=False)

    kernel.__name__ = scalar.__name__
    return kernel


def digamma_scalar(x: float) -> float:
    """digamma(x) = d/dx lgamma(x), with PyTorch's conventions: digamma(+0) = -inf,
    digamma(-0) = +inf, nan at the negative integers and at -inf, digamma(inf) = inf.

    For x < 0 the reflection digamma(x) = digamma(1 - x) - pi cot(pi x), with the cotangent of
    pi r, r = x less its nearest integer (exact, so pi r is accurate); then the recurrence
    digamma(x) = digamma(x + 1) - 1/x up to x >= 10, and the asymptotic series
    log x - 1/(2x) - sum_k B_2k / (2k x^2k) with Bernoulli numbers B_2 .. B_18 (the first term
    left out is below 1e-20 at x = 10)."""
    x = float(x) * 1.0  # float64 everywhere (numba's float() keeps a float32 a float32)
    if x != x or x == -_INF:
        return _NAN
    if x == _INF:
        return _INF
    if x == 0.0:
        return math.copysign(_INF, -x)
    result = 0.0
    if x < 0.0:
        if x <= -_EVERY_FLOAT_AN_INTEGER:
            return _NAN
        r = x - math.floor(x + 0.5)  # x less its nearest integer: exact, in [-1/2, 1/2]
        if r == 0.0:
            return _NAN
        result = -_PI / math.tan(_PI * r)  # cot has period pi
        x = 1.0 - x
    while x < 10.0:
        result -= 1.0 / x
        x += 1.0
    z = 1.0 / (x * x)
    series = z * (
        1.0 / 12.0
        - z
        * (
            1.0 / 120.0
            - z
            * (
                1.0 / 252.0
                - z
                * (
                    1.0 / 240.0
                    - z
                    * (
                        1.0 / 132.0
                        - z
                        * (
                            691.0 / 32760.0
                            - z * (1.0 / 12.0 - z * (3617.0 / 8160.0 - z * (43867.0 / 14364.0)))
                        )
                    )
                )
            )
        )
    )
    return result + math.log(x) - 0.5 / x - series


def trigamma_scalar(x: float) -> float:
    """trigamma(x) = polygamma(1, x) = d/dx digamma(x): +inf at the poles (the non-positive
    integers, where both one-sided limits are +inf; PyTorch returns a huge finite value there,
    pi^2 / sin(pi x)^2 of a rounded pi x), nan at -inf, 0 at inf.

    For x <= 0 the reflection trigamma(x) = pi^2 / sin^2(pi x) - trigamma(1 - x), with the sine
    of pi r, r = x less its nearest integer; then the recurrence trigamma(x) =
    trigamma(x + 1) + 1/x^2 up to x >= 10, and the asymptotic series
    1/x + 1/(2x^2) + sum_k B_2k / x^(2k+1) with Bernoulli numbers B_2 .. B_18."""
    x = float(x) * 1.0  # float64 everywhere (numba's float() keeps a float32 a float32)
    if x != x or x == -_INF:
        return _NAN
    if x == _INF:
        return 0.0
    reflection = 0.0
    sign = 1.0
    if x <= 0.0:
        if x <= -_EVERY_FLOAT_AN_INTEGER:
            return _INF
        r = x - math.floor(x + 0.5)  # x less its nearest integer: exact, in [-1/2, 1/2]
        if r == 0.0:
            return _INF
        p = _PI / math.sin(_PI * r)  # sin^2 has period pi
        reflection = p * p
        sign = -1.0
        x = 1.0 - x
    total = 0.0
    while x < 10.0:
        total += 1.0 / x / x  # (not 1 / (x * x): x * x underflows to 0 for tiny x)
        x += 1.0
    z = 1.0 / (x * x)
    series = z * (
        1.0 / 6.0
        - z
        * (
            1.0 / 30.0
            - z
            * (
                1.0 / 42.0
                - z
                * (
                    1.0 / 30.0
                    - z
                    * (
                        5.0 / 66.0
                        - z
                        * (
                            691.0 / 2730.0
                            - z * (7.0 / 6.0 - z * (3617.0 / 510.0 - z * (43867.0 / 798.0)))
                        )
                    )
                )
            )
        )
    )
    total += (1.0 + 0.5 / x + series) / x
    return reflection + sign * total


def lgamma_scalar(x: float) -> float:
    """log |Gamma(x)| in Python: +inf at the poles (the non-positive integers) and at +-inf.
    Compiled code calls C's lgamma (``math.lgamma``: libm on the CPU, libdevice on CUDA); this
    stands in for it in the eager kernel and the CUDA simulator, through the same C function
    where the running process has it (``_c_lgamma``) — CPython's ``math.lgamma`` is a different
    algorithm, up to 1e-11 off in relative terms near its zeros at 1 and 2."""
    x = float(x) * 1.0  # float64 everywhere (numba's float() keeps a float32 a float32)
    if x != x:
        return x
    if x == _INF or x == -_INF or x <= -_EVERY_FLOAT_AN_INTEGER:
        return _INF
    if x <= 0.0 and x == math.floor(x):
        return _INF
    if x > 2.5e305:  # lgamma(x) > 1.8e308 (CPython's math.lgamma raises instead)
        return _INF
    return _c_lgamma()(x)


_C_LGAMMA: list = []


def _c_lgamma():  # type: ignore[no-untyped-def]
    """C's ``lgamma`` from the libraries of the running process (the function numba calls for
    ``math.lgamma``), found once; CPython's ``math.lgamma`` where there is none."""
    if not _C_LGAMMA:
        fn = math.lgamma
        try:
            c = ctypes.CDLL(None).lgamma
            c.restype, c.argtypes = ctypes.c_double, (ctypes.c_double,)
            fn = c
        except (AttributeError, OSError, TypeError):  # no C library to look into (Windows)
            pass
        _C_LGAMMA.append(fn)
    return _C_LGAMMA[0]


def logaddexp_scalar(a: float, b: float) -> float:
    """log(exp(a) + exp(b)) without overflow: the larger operand plus log1p(exp(-|a - b|)).
    Equal operands, infinities of one sign included, give a + log 2 (an inf - inf would be
    nan); nan in, nan out.  numpy's ``logaddexp`` computes the same formula (the eager
    kernel); this is the compiled one (CUDA has no numpy)."""
    a = float(a) * 1.0  # float64 everywhere (numba's float() keeps a float32 a float32)
    b = float(b) * 1.0
    if a == b:
        return a + _LN2
    d = a - b
    if d > 0.0:
        return a + math.log1p(math.exp(-d))
    if d < 0.0:
        return b + math.log1p(math.exp(d))
    return d  # nan


_elementwise(
    "atan2",
    "a b",
    np.arctan2,
    "{atan2}({0}, {1})",
    _libm("atan2", np.arctan2),
    **_FLOAT_OP,
    aliases=("arctan2",),
)
_elementwise("hypot", "a b", np.hypot, "{hypot}({0}, {1})", _libm("hypot"), **_FLOAT_OP)
_elementwise(
    "logaddexp",
    "a b",
    np.logaddexp,
    "{logaddexp}({0}, {1})",
    ScalarFunction("logaddexp", logaddexp_scalar),
    surface="float",
    method=True,
)
primitive(
    "erfc",
    "elementwise",
    "x",
    lowering=Lowering("{erfc}({0})", (_libm("erfc", math.erfc),)),
    **_FLOAT_OP,
)(_scalar_kernel(math.erfc))  # the C library's: scipy's erfc is up to 500 ulp off for x > 3


def erfinv_scalar(y: float) -> float:
    """The inverse error function: erfinv(+-1) = +-inf, nan outside [-1, 1], signed zeros
    kept.  A start from Winitzki's closed-form approximation (2e-3 relative), then Newton steps
    on erf(x) = |y| below 1/2 and on erfc(x) = 1 - |y| above (exact there, and accurate near 1,
    where erf(x) - |y| would cancel), each doubling the correct digits: four reach float64
    rounding."""
    y = float(y) * 1.0  # float64 everywhere (numba's float() keeps a float32 a float32)
    if y != y or y < -1.0 or y > 1.0:
        return _NAN
    a = abs(y)
    if a == 1.0:
        return math.copysign(_INF, y)
    if a == 0.0:
        return y
    log_term = math.log((1.0 - a) * (1.0 + a))
    c = 2.0 / (_PI * 0.147) + 0.5 * log_term
    x = math.sqrt(math.sqrt(c * c - log_term / 0.147) - c)
    for _ in range(4):
        slope = 2.0 / math.sqrt(_PI) * math.exp(-x * x)
        if slope == 0.0:
            break
        if a < 0.5:  # erf(x) = a: no cancellation for small a (where the start is 0)
            x -= (math.erf(x) - a) / slope
        else:  # erfc(x) = 1 - a, exact for a >= 1/2
            x += (math.erfc(x) - (1.0 - a)) / slope
    return math.copysign(x, y)


_elementwise(
    "erfinv",
    "x",
    _scalar_kernel(erfinv_scalar),
    "{erfinv}({0})",
    ScalarFunction("erfinv", erfinv_scalar),
    **_FLOAT_OP,
)
_elementwise(
    "lgamma",
    "x",
    _scalar_kernel(lgamma_scalar),
    "{lgamma}({0})",
    _libm("lgamma", lgamma_scalar),
    **_FLOAT_OP,
)
_elementwise(
    "digamma",
    "x",
    _scalar_kernel(digamma_scalar),
    "{digamma}({0})",
    ScalarFunction("digamma", digamma_scalar),
    **_FLOAT_OP,
)
# polygamma(1, x), digamma's derivative; public as ``polygamma(1, x)`` (elementwise.py)
_elementwise(
    "trigamma",
    "x",
    _scalar_kernel(trigamma_scalar),
    "{trigamma}({0})",
    ScalarFunction("trigamma", trigamma_scalar),
)


# no lowering: ``decimals`` scales by powers of ten, which numpy rounds its own way
@primitive("round", "elementwise", "x", method=True, inplace=True)
def _round(x, decimals=0):  # type: ignore[no-untyped-def]
    return np.round(x, decimals)


@primitive("cast", "elementwise", "x", lowering=Lowering("_cast_{dtype}({0})"))
def _cast(x, dtype):  # type: ignore[no-untyped-def]
    if x.dtype.kind == "c" and not dtype.is_complex:
        # complex to real keeps the real part, to bool tests for nonzero (PyTorch's casts;
        # numpy's astype would warn about the discarded imaginary part)
        x = x != 0 if dtype is _dt.bool_ else x.real
    return x.astype(dtype.np)


@primitive("clone", "elementwise", "x", lowering=Lowering("{0}"), method=True)
def _clone(x):  # type: ignore[no-untyped-def]
    return np.array(x, copy=True, order="C")


# predicates and logical ops: bool results, never differentiable
_elementwise("isnan", "x", np.isnan, "({0} != {0})", **_PREDICATE)
_elementwise("isinf", "x", np.isinf, "{isinf}({0})", _libm("isinf"), **_PREDICATE)
_elementwise("logical_not", "x", np.logical_not, "(not {0})", **_PREDICATE, inplace=True)

# ---- binary / ternary
_elementwise("add", "a b", np.add, "({0} + {1})", method=True, inplace=True)
_elementwise("sub", "a b", np.subtract, "({0} - {1})", method=True, inplace=True)
_elementwise("mul", "a b", np.multiply, "({0} * {1})", **_SAME_OP)
# NaN-propagating, unlike Python's max
_elementwise("maximum", "a b", np.maximum, "_maximum({0}, {1})", surface="same", method=True)
_elementwise("minimum", "a b", np.minimum, "_minimum({0}, {1})", surface="same", method=True)
# no lowering: Python's % and numba's differ from numpy's for negative operands and zeros
_elementwise("remainder", "a b", np.remainder, None, **_SAME_OP)


@primitive(
    "div",
    "elementwise",
    "a b",
    lowering=Lowering("({0} / {1})"),
    method=True,
    inplace=True,
    aliases=("true_divide", "divide"),
)
@_quiet_kernel
def _div(a, b):  # type: ignore[no-untyped-def]
    out = np.true_divide(a, b)
    return out.astype(a.dtype, copy=False) if a.dtype.kind == "f" else out


@primitive("pow", "elementwise", "a b", lowering=Lowering("_pow({0}, {1})"), **_SAME_OP)
@_quiet_kernel
def _pow(a, b):  # type: ignore[no-untyped-def]
    if a.dtype.kind in "iu" and np.any(b < 0):
        raise ArgumentError("Integers to negative integer powers are not allowed.")
    return np.power(a, b)


# Differentiable with a zero gradient (PyTorch's div(rounding_mode="floor") gives zeros), so the
# result of a float floor division still takes part in autograd.  No lowering: integer division
# by zero raises here.
@primitive("floor_divide", "elementwise", "a b", **_SAME_OP)
@_quiet_kernel
def _floor_divide(a, b):  # type: ignore[no-untyped-def]
    if a.dtype.kind in "iub" and np.any(b == 0):
        raise ZeroDivisionError("floor_divide: integer division by zero")
    return np.floor_divide(a, b)


_COMPARE = {**_PREDICATE, "inplace": True}
_elementwise("eq", "a b", np.equal, "({0} == {1})", **_COMPARE)
_elementwise("ne", "a b", np.not_equal, "({0} != {1})", **_COMPARE, aliases=("not_equal",))
_elementwise("lt", "a b", np.less, "({0} < {1})", **_COMPARE, aliases=("less",))
_elementwise("le", "a b", np.less_equal, "({0} <= {1})", **_COMPARE, aliases=("less_equal",))
_elementwise("gt", "a b", np.greater, "({0} > {1})", **_COMPARE, aliases=("greater",))
_elementwise("ge", "a b", np.greater_equal, "({0} >= {1})", **_COMPARE, aliases=("greater_equal",))
_elementwise("logical_and", "a b", np.logical_and, "(bool({0}) and bool({1}))", **_COMPARE)
_elementwise("logical_or", "a b", np.logical_or, "(bool({0}) or bool({1}))", **_COMPARE)
_elementwise("logical_xor", "a b", np.logical_xor, "(bool({0}) != bool({1}))", **_COMPARE)
# integer and bool only (checked by their surface functions); no lowering: the compiler's
# kernels are float or bool
for _name, _fn in [
    ("bitwise_and", np.bitwise_and),
    ("bitwise_or", np.bitwise_or),
    ("bitwise_xor", np.bitwise_xor),
]:
    _elementwise(_name, "a b", _fn, None, method=True, inplace=True, differentiable=False)


# (no method from the record: ``Tensor.where(condition, other)`` takes the tensor as the values
# where ``condition`` holds, ``extra.OTHER_METHODS``)
@primitive("where", "elementwise", "cond a b", lowering=Lowering("({1} if {0} else {2})"))
def _where(cond, a, b):  # type: ignore[no-untyped-def]
    if a.size >= _WHERE_BY_BITS_MIN and _where_by_bits_applies(cond, a, b):
        return _where_by_bits(cond, a, b)
    return np.where(cond, a, b)


# ``np.where`` copies element by element with a data-dependent branch: on a large random mask
# (ReLU's, forward and backward) it runs about three times as long as a multiplication.  On
# C-contiguous numeric arrays of one dtype with a 2-, 4- or 8-byte item, the same selection
# is made on the items' bits, without branches: ``((a ^ b) & M) ^ b`` with M all ones where
# ``cond`` holds, which is ``a``'s bits there and ``b``'s elsewhere (NaN payloads and signed
# zeros included).  Below this size ``np.where`` is as fast.
_WHERE_BY_BITS_MIN = 4096
_INT_OF_ITEMSIZE = {2: np.int16, 4: np.int32, 8: np.int64}


def _where_by_bits_applies(cond, a, b) -> bool:  # type: ignore[no-untyped-def]
    """Whether ``_where_by_bits`` gives ``np.where``'s result: plain numpy arrays, ``a`` and
    ``b`` of one native numeric dtype, each either 0-d or of ``cond``'s shape, all
    C-contiguous."""
    if type(cond) is not np.ndarray or type(a) is not np.ndarray or type(b) is not np.ndarray:
        return False
    dt = a.dtype
    if (
        cond.dtype != np.bool_
        or b.dtype != dt
        or dt.kind not in "fiu"
        or dt.itemsize not in _INT_OF_ITEMSIZE
        or not dt.isnative
        or not cond.flags.c_contiguous
    ):
        return False
    shape = cond.shape
    for x in (a, b):
        if x.ndim and (x.shape != shape or not x.flags.c_contiguous):
            return False
    return True


def _where_by_bits(cond, a, b):  # type: ignore[no-untyped-def]
    it = _INT_OF_ITEMSIZE[a.dtype.itemsize]
    # M: -1 (all bits set) where cond is true -- any nonzero byte, as np.where reads it
    truth = np.not_equal(cond, False)
    mask = np.negative(truth.view(np.uint8), dtype=it)
    out = np.empty(cond.shape, a.dtype)
    bits_a, bits_b, bits_out = a.view(it), b.view(it), out.view(it)
    if b.ndim == 0 and not bits_b:  # (``where(cond, x, 0)``: ReLU and its gradient)
        np.bitwise_and(bits_a, mask, out=bits_out)
    else:
        mixed = np.bitwise_xor(bits_a, bits_b)
        np.bitwise_and(mixed, mask, out=mixed)
        np.bitwise_xor(mixed, bits_b, out=bits_out)
    return out


# ---- binary cross entropy --------------------------------------------------------------------
#
# ``F.binary_cross_entropy`` as two primitives rather than a composite of logs, so that its
# gradient is PyTorch's formula and not the chain rule through the logs: the chain rule
# multiplies 0 by log's 1/0 where a probability saturates (p = 0 with target 0, p = 1 with
# target 1) and gives NaN, where PyTorch's gradient is g (p - t) / max((1 - p) p, 1e-12),
# finite (0 there).  The forward is one kernel instead of ten ops.  Both are elementwise with a
# lowering, so compiled code fuses them with their neighbours and CUDA runs them from the same
# expressions.  The constants are PyTorch's CPU kernel's: the logs stop at -100 (a saturated
# probability gives a loss of 0 or 100, not inf), and 1e-12 bounds the gradient's denominator
# -- held as a float32 there, so float64 gradients too divide by float32(1e-12), which is
# 9.999999960041972e-13 (at p = 0 with target 1 the gradient is -1000000003995.8029).

_BCE_LOG_BOUND = -100.0
_BCE_EPSILON = 9.999999960041972e-13  # float(np.float32(1e-12))
_BCE_CONSTANTS: dict[str, tuple] = {}  # dtype char -> (-100, 1, 1e-12) as read-only 0-d arrays


def _bce_constants(dtype):  # type: ignore[no-untyped-def]
    constants = _BCE_CONSTANTS.get(dtype.char)
    if constants is None:
        constants = tuple(
            np.array(v, dtype) for v in (_BCE_LOG_BOUND, 1.0, _BCE_EPSILON)
        )  # (0-d arrays: numpy converts a Python number on every call otherwise)
        for c in constants:
            c.flags.writeable = False
        _BCE_CONSTANTS[dtype.char] = constants
    return constants


@primitive(
    "binary_cross_entropy",
    "elementwise",
    "p t",
    lowering=Lowering(
        "(({1} - {one}) * _maximum({log1p}(-{0}), np.{dtype}(-100.0))"
        " - {1} * _maximum({log}({0}), np.{dtype}(-100.0)))",
        (_libm("log1p"), _libm("log")),
    ),
)
@_quiet_kernel
def _binary_cross_entropy(p, t):  # type: ignore[no-untyped-def]
    """``(t - 1) max(log1p(-p), -100) - t max(log(p), -100)``, PyTorch's unreduced loss (log1p
    keeps a tiny ``p``'s loss exact)."""
    bound, one, _ = _bce_constants(p.dtype)
    if p.ndim == 0 or p.shape != t.shape:  # (0-d: numpy scalars take no ``out=``)
        first = (t - one) * np.maximum(np.log1p(-p), bound)
        return np.asarray(first - t * np.maximum(np.log(p), bound), dtype=p.dtype)
    first = np.negative(p)
    np.log1p(first, out=first)
    np.maximum(first, bound, out=first)
    second = np.log(p)
    np.maximum(second, bound, out=second)
    np.multiply(t, second, out=second)
    np.multiply(first, np.subtract(t, one), out=first)
    return np.subtract(first, second, out=first)


@primitive(
    "binary_cross_entropy_backward",
    "elementwise",
    "g p t",
    lowering=Lowering(
        "({0} * ({1} - {2}) / _maximum(({one} - {1}) * {1}, np.{dtype}(9.999999960041972e-13)))"
    ),
)
@_quiet_kernel
def _binary_cross_entropy_backward(g, p, t):  # type: ignore[no-untyped-def]
    """``binary_cross_entropy``'s input gradient ``g (p - t) / max((1 - p) p, eps)``, ``eps``
    float32's 1e-12 (see above)."""
    _, one, eps = _bce_constants(p.dtype)
    if p.ndim == 0 or not (p.shape == t.shape == g.shape):
        return np.asarray(g * (p - t) / np.maximum((one - p) * p, eps), dtype=p.dtype)
    denominator = np.subtract(one, p)
    np.multiply(denominator, p, out=denominator)
    np.maximum(denominator, eps, out=denominator)
    numerator = np.subtract(p, t)
    np.multiply(g, numerator, out=numerator)
    return np.divide(numerator, denominator, out=numerator)


# ---- reductions -----------------------------------------------------------------------------
@primitive("sum", "reduce", "x", method=True)
@_quiet_kernel
def _sum(x, dim, keepdim):  # type: ignore[no-untyped-def]
    if _short_rows(x, dim):
        return _row_reduce(x, "sum", keepdim)
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


def _short_rows(x, dim) -> bool:  # type: ignore[no-untyped-def]
    """Whether ``sum``/``amax``/``amin`` of ``x`` over ``dim`` reduces many short float32 or
    float64 rows along the last axis (``reduce_kernels``: numpy takes each such row on its
    own)."""
    if type(x) is not np.ndarray or x.ndim == 0 or x.dtype.kind != "f" or x.itemsize not in (4, 8):
        return False
    if type(dim) is tuple:
        if len(dim) != 1:
            return False
        dim = dim[0]
    if dim is None or dim % x.ndim != x.ndim - 1 or not x.flags.c_contiguous:
        return False
    n = x.shape[-1]
    return 0 < n < 256 and x.size >= 1024


def _row_reduce(x, kind, keepdim):  # type: ignore[no-untyped-def]
    """``x``'s short rows summed, or their maximum or minimum (``reduce_kernels``)."""
    from fusegrad.ops.reduce_kernels import last_axis_extreme, last_axis_sum  # (numba)

    if kind == "sum":
        return last_axis_sum(x, keepdim)
    return last_axis_extreme(x, kind == "max", keepdim)


@primitive("amax", "reduce", "x", method=True)
def _amax(x, dim, keepdim):  # type: ignore[no-untyped-def]
    if _short_rows(x, dim):
        return _row_reduce(x, "max", keepdim)
    return np.amax(x, axis=dim, keepdims=keepdim)


@primitive("amin", "reduce", "x", method=True)
def _amin(x, dim, keepdim):  # type: ignore[no-untyped-def]
    if _short_rows(x, dim):
        return _row_reduce(x, "min", keepdim)
    return np.amin(x, axis=dim, keepdims=keepdim)


@primitive("prod", "reduce", "x", method=True)
@_quiet_kernel
def _prod(x, dim, keepdim):  # type: ignore[no-untyped-def]
    dt = np.int64 if x.dtype.kind in "biu" else x.dtype
    return np.prod(x, axis=dim, keepdims=keepdim, dtype=dt)


@primitive("argmax", "reduce", "x", differentiable=False, method=True)
def _argmax(x, dim, keepdim):  # type: ignore[no-untyped-def]
    if dim is None:
        out = np.argmax(x.reshape(-1))
        return np.asarray(out, np.int64).reshape((1,) * x.ndim if keepdim else ())
    return np.argmax(x, axis=dim, keepdims=keepdim).astype(np.int64)


@primitive("argmin", "reduce", "x", differentiable=False, method=True)
def _argmin(x, dim, keepdim):  # type: ignore[no-untyped-def]
    if dim is None:
        out = np.argmin(x.reshape(-1))
        return np.asarray(out, np.int64).reshape((1,) * x.ndim if keepdim else ())
    return np.argmin(x, axis=dim, keepdims=keepdim).astype(np.int64)


@primitive("all", "reduce", "x", differentiable=False, method=True)
def _all(x, dim, keepdim):  # type: ignore[no-untyped-def]
    return np.all(x, axis=dim, keepdims=keepdim)


@primitive("any", "reduce", "x", differentiable=False, method=True)
def _any(x, dim, keepdim):  # type: ignore[no-untyped-def]
    return np.any(x, axis=dim, keepdims=keepdim)


@primitive("cumsum", "opaque", "x", method=True)
@_quiet_kernel
def _cumsum(x, dim):  # type: ignore[no-untyped-def]
    dt = np.int64 if x.dtype.kind in "biu" else x.dtype
    return np.cumsum(x, axis=dim, dtype=dt)


def _sorted_positions(x: np.ndarray, descending: bool) -> np.ndarray:
    """Stable sort order along the last axis, NaN counted as larger than every number
    (PyTorch's order).  Descending: the ascending stable sort of the reversed row, reversed
    again, keeps equal elements in their original order and puts NaN first."""
    if not descending:
        return np.argsort(x, axis=-1, kind="stable")
    n = x.shape[-1]
    flipped = np.argsort(x[..., ::-1], axis=-1, kind="stable")
    return (n - 1) - flipped[..., ::-1]


@primitive("argsort", "opaque", "x", differentiable=False)
def _argsort(x, dim, descending, k):  # type: ignore[no-untyped-def]
    """Indices that sort ``x`` along ``dim`` (stable; NaN after every number ascending, before
    every number descending), or only the first ``k`` of them (``k`` not None: topk, kthvalue),
    found by a partial sort.  sort/topk/kthvalue/median take their values with ``gather``, whose
    rule scatters the gradient to the selected positions."""
    rows = np.moveaxis(x, dim, -1)
    n = rows.shape[-1]
    if k is None or k >= n:
        order = _sorted_positions(rows, descending)
    elif k == 0:
        order = np.zeros(rows.shape[:-1] + (0,), np.int64)
    else:
        # the k smallest (largest) by a partition, then those k sorted
        if descending:
            part = np.argpartition(rows, n - k, axis=-1)[..., n - k :]
        else:
            part = np.argpartition(rows, k - 1, axis=-1)[..., :k]
        chosen = np.take_along_axis(rows, part, axis=-1)
        order = np.take_along_axis(part, _sorted_positions(chosen, descending), axis=-1)
    return np.ascontiguousarray(np.moveaxis(order.astype(np.int64, copy=False), -1, dim))


def _attention_kernels():  # type: ignore[no-untyped-def]
    """The fused attention kernels (forward, backward), imported on first use."""
    from .attention_kernels import attention_backward, attention_forward  # numba: not at import

    return attention_forward, attention_backward


@primitive("attention", "opaque", "q k v mask*")
def _attention(q, k, v, *mask, scale, causal):  # type: ignore[no-untyped-def]
    """Fused scaled dot-product attention of slabs ``q`` (N, L, E), ``k`` (N, S, E), ``v``
    (N, S, E), with an optional mask (M, L, S), M 1 or N: bool (True attends) or an additive
    float bias in the inputs' dtype; ``causal`` keeps keys ``j <= i``.  Returns (N, L, E + 1):
    the outputs, then each row's logsumexp (+inf for a row with nothing to attend to), which
    the backward recomputes the weights from.  One numba kernel (``attention_kernels``)."""
    return _attention_kernels()[0](q, k, v, mask[0] if mask else None, scale, causal)


@primitive("attention_backward", "opaque", "g q k v out mask*", differentiable=False)
def _attention_backward(g, q, k, v, out, *mask, scale, causal):  # type: ignore[no-untyped-def]
    """The gradients of ``attention`` for its (N, L, E + 1) gradient ``g`` (the logsumexp
    column's included), from its inputs and output: (N, L + 2 S, E), the gradients of q, k and
    v stacked along dim 1.  Not differentiable: the rule computes a differentiable composite
    instead where a graph of the gradient is wanted (``create_graph``)."""
    return _attention_kernels()[1](g, q, k, v, out, mask[0] if mask else None, scale, causal)


def _recurrent_kernels():  # type: ignore[no-untyped-def]
    """The fused recurrent-layer kernels (forward, backward), imported on first use."""
    from .recurrent_kernels import rnn_backward, rnn_forward  # numba: not at import

    return rnn_forward, rnn_backward


# One primitive per recurrent layer and direction over the whole sequence (not a composite of
# per-step ops) for speed: the op loop ran about ten eager ops per time step, 7x-10x slower than
# PyTorch's fused kernels (issue 27).  ``state`` holds c0 (LSTM only), then w_hr when ``proj``
# (an LSTM's projection), then b_hh when ``bias``, then b_ih when ``input_bias``.
@primitive("rnn_sequence", "opaque", "x_gates w_hh h0 state*")
def _rnn_sequence(x_gates, w_hh, h0, *state, mode, reverse, bias, input_bias, proj, batch_sizes):  # type: ignore[no-untyped-def]
    """The recurrence of one LSTM / GRU / RNN layer in one direction: ``x_gates`` (T, N, G H)
    is the input projection ``x W_ih^T`` of every step, ``w_hh`` (G H, P), ``h0`` (N, P), then
    c0 (N, H) for ``mode="LSTM"``, w_hr (P, H) when ``proj``, b_hh (G H) when ``bias`` and
    b_ih (G H, added to ``x_gates``) when ``input_bias``; P is H except for an LSTM's
    projection; ``reverse`` runs from the last step to the first.  Returns one flat buffer of
    the T N rows' values in two parts: the outputs h (T, N, P) first, contiguous (what reads
    the layer's output reads it without a copy), then what the backward needs (T, N, S H;
    LSTM: c, i, f, g, o, S = 5; GRU: r, z, n, hn, S = 4; RNN: nothing, S = 0).  With
    ``batch_sizes`` (a PackedSequence's, longest sequence first) ``x_gates`` holds the packed
    rows instead, (sum of batch_sizes, G H): step t has ``batch_sizes[t]`` rows, and so has
    the result.  One numba kernel (``recurrent_kernels``)."""
    c0 = state[0] if mode == "LSTM" else None
    w_hr = state[1] if proj else None
    b_ih = state[-1] if input_bias else None
    b_hh = state[-2 if input_bias else -1] if bias else None
    return _recurrent_kernels()[0](
        mode, x_gates, w_hh, h0, c0, b_hh, reverse, w_hr, batch_sizes, b_ih
    )


@primitive(
    "rnn_sequence_backward", "opaque", "g_h g_s out_h out_s w_hh h0 state*", differentiable=False
)
def _rnn_sequence_backward(
    g_h, g_s, out_h, out_s, w_hh, h0, *state, mode, reverse, proj, batch_sizes
):  # type: ignore[no-untyped-def]
    """The gradients of ``rnn_sequence`` for the gradient of its flat packed result, both in
    their two parts (rows, P) and (rows, S H): ``g_h``, ``g_s`` the gradient's, ``out_h``,
    ``out_s`` the result's (``state``: c0 for the LSTM, then w_hr when ``proj``); flat:
    x_gates, h0, c0 (LSTM), w_hh, w_hr (``proj``), b_hh.  (The parts as inputs of their own:
    their row count is the first size, so a compiled backward stays symbolic in it.)  Not
    differentiable: the rule computes a differentiable composite instead where a graph of the
    gradient is wanted (``create_graph``)."""
    c0 = state[0] if mode == "LSTM" else None
    w_hr = state[1] if proj else None
    return _recurrent_kernels()[1](
        mode, g_h, g_s, out_h, out_s, w_hh, h0, c0, reverse, w_hr, batch_sizes
    )


# Convolution and pooling as single primitives with kernels of their own (not composites of
# strided slices, stacks and matmuls) for speed: the composites ran the MNIST CNN at 3.1x
# PyTorch eager and saved their im2col columns (issue 27).  The backward kernels are their own
# primitives, not differentiable: the rules use the op-surface composites (``ops/convolution.py``)
# where a graph of the gradient is wanted (``create_graph``).  float32 and float64 only (the op
# surface runs the composites otherwise); CUDA tensors run ``cuda/convolution.py`` and
# ``cuda/pooling.py``.
@primitive("convolution", "opaque", "x w bias*")
def _convolution(x, w, *bias, stride, padding, dilation, groups, transposed, output_padding):  # type: ignore[no-untyped-def]
    """An n-d convolution (cross-correlation) of ``x`` (N, C, *spatial) by ``w`` (O, C /
    groups, *kernel), or its transpose (``transposed``: ``w`` is (C, O / groups, *kernel)),
    plus an optional bias (O,).  Zero padding; im2col and BLAS (``conv_kernels``)."""
    return conv_kernels.convolution(
        x,
        w,
        *bias,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        transposed=transposed,
        output_padding=output_padding,
    )


@primitive("convolution_backward_input", "opaque", "g w", differentiable=False)
def _convolution_backward_input(g, w, sizes, stride, padding, dilation, groups, transposed):  # type: ignore[no-untyped-def]
    """The input's gradient of ``convolution`` (input spatial sizes ``sizes``) for the
    gradient ``g`` of its output."""
    return conv_kernels.convolution_backward_input(
        g,
        w,
        sizes=sizes,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        transposed=transposed,
    )


@primitive("convolution_backward_weight", "opaque", "g x", differentiable=False)
def _convolution_backward_weight(g, x, kernel, stride, padding, dilation, groups, transposed):  # type: ignore[no-untyped-def]
    """The weight's gradient of ``convolution`` (kernel sizes ``kernel``) for the gradient
    ``g`` of its output and its input ``x``."""
    return conv_kernels.convolution_backward_weight(
        g,
        x,
        kernel=kernel,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        transposed=transposed,
    )


@primitive("avg_pool", "opaque", "x")
def _avg_pool(x, window):  # type: ignore[no-untyped-def]
    """Average pooling of ``x`` (N, C, *spatial) over ``window``: ``("fixed", kernel, stride,
    padding, dilation, ceil_mode, count_include_pad, divisor_override)`` or ``("adaptive",
    output_size)`` (``conv_kernels``)."""
    return conv_kernels.avg_pool(x, window=window)


@primitive("avg_pool_backward", "opaque", "g")
def _avg_pool_backward(g, window, sizes):  # type: ignore[no-untyped-def]
    """Average pooling's input gradient (input spatial sizes ``sizes``): linear in ``g``, so
    differentiable (its own gradient is an average pooling)."""
    return conv_kernels.avg_pool_backward(g, window=window, sizes=sizes)


# Max pooling is ``pool_take(x, pool_index(x))``: the positions of the maxima once, then the
# values at them.  The backward scatters to the same positions (``pool_scatter``), as PyTorch's
# saved indices do, instead of searching the windows again; take and scatter are each other's
# transposes, so both are differentiable without a composite.
@primitive("pool_index", "opaque", "x", differentiable=False)
def _pool_index(x, window):  # type: ignore[no-untyped-def]
    """The flat position of each max-pooling window's maximum in its input plane (PyTorch's
    pooling indices), (N, C, *out) int64."""
    return conv_kernels.pool_index(x, window=window)


@primitive("pool_take", "opaque", "x index")
def _pool_take(x, index):  # type: ignore[no-untyped-def]
    """``x`` (N, C, *spatial) at the flat positions ``index`` (N, C, *out) of each plane."""
    return conv_kernels.pool_take(x, index)


@primitive("pool_scatter", "opaque", "g index")
def _pool_scatter(g, index, sizes):  # type: ignore[no-untyped-def]
    """The transpose of ``pool_take``: zeros (N, C, *sizes) with each element of ``g`` (N, C,
    *out) added at its plane's flat position ``index``."""
    return conv_kernels.pool_scatter(g, index, sizes=sizes)


@primitive("cummax_index", "opaque", "x", differentiable=False)
def _cummax_index(x, dim, largest):  # type: ignore[no-untyped-def]
    """Position of the running maximum (``largest=False``: minimum) along ``dim`` (cummax /
    cummin's indices; their values are a gather).  As PyTorch's CPU kernel: an element equal
    to the running extreme takes its place (the latest of ties), and a NaN, once met, is the
    extreme from then on (each later NaN taking its place)."""
    if x.size == 0:
        return np.zeros(x.shape, np.int64)
    rows = np.moveaxis(x, dim, -1)
    running = (np.maximum if largest else np.minimum).accumulate(rows, axis=-1)
    # an element equal to the running extreme at its own position (or a NaN) is a candidate;
    # the running extreme at i sits at the latest candidate up to i (a later, larger extreme
    # is itself a later candidate)
    candidate = rows == running
    if rows.dtype.kind == "f":
        candidate |= np.isnan(rows)
    positions = np.where(candidate, np.arange(rows.shape[-1]), -1)
    out = np.maximum.accumulate(positions, axis=-1).astype(np.int64, copy=False)
    return np.ascontiguousarray(np.moveaxis(out, -1, dim))


@primitive("mode_index", "opaque", "x", differentiable=False)
def _mode_index(x, dim):  # type: ignore[no-untyped-def]
    """Position (size 1 along ``dim``) of the mode of each row along ``dim``: the smallest of
    the most frequent values, at its last occurrence (PyTorch's CPU result; mode's values are
    a gather).  Rows holding NaN: NaN counts as one value larger than every number."""
    rows = np.moveaxis(x, dim, -1)
    lead = rows.shape[:-1]
    flat = rows.reshape(-1, rows.shape[-1])
    out = np.zeros(flat.shape[0], np.int64)
    for r, row in enumerate(flat):
        order = np.argsort(row, kind="stable")
        s = row[order]
        same = s[1:] == s[:-1]
        if s.dtype.kind == "f":
            same |= np.isnan(s[1:]) & np.isnan(s[:-1])
        starts = np.flatnonzero(np.concatenate(([True], ~same)))
        counts = np.diff(np.append(starts, s.shape[0]))
        run = int(np.argmax(counts))  # the first longest run: the smallest value
        out[r] = order[starts[run] + counts[run] - 1]  # stable: its last occurrence
    return np.ascontiguousarray(np.moveaxis(out.reshape(lead + (1,)), -1, dim))


@primitive("searchsorted", "opaque", "sorted_sequence values", differentiable=False)
def _searchsorted(sorted_sequence, values, right, out_int32):  # type: ignore[no-untyped-def]
    """Insertion positions of ``values`` in the rows of ``sorted_sequence`` (1-D: one sequence
    for all values; else the leading dims match and each row of values searches its row):
    the first position whose element is ``>= v`` (``right``: ``> v``).  A NaN value goes
    last, as in PyTorch; a sequence holding NaN is searched as sorted with NaN last (numpy's
    order; PyTorch's binary search gives other positions there)."""
    side = "right" if right else "left"
    dt = np.int32 if out_int32 else np.int64
    if sorted_sequence.ndim == 1:
        return np.searchsorted(sorted_sequence, values, side=side).astype(dt)
    seq = sorted_sequence.reshape(-1, sorted_sequence.shape[-1])
    vals = values.reshape(-1, values.shape[-1])
    out = np.empty(vals.shape, dt)
    for r in range(seq.shape[0]):
        out[r] = np.searchsorted(seq[r], vals[r], side=side)
    return out.reshape(values.shape)


class HistcRangeError(FusegradError, RuntimeError):
    """``histc`` over the data's own range, which is not finite (PyTorch: a RuntimeError)."""


@primitive("histc", "opaque", "x", differentiable=False)
def _histc(x, bins, min, max):  # type: ignore[no-untyped-def]
    """Histogram of ``x`` in ``bins`` equal bins over ``[min, max]`` (``min == max``: over the
    data's own range, widened by one either side when that is a point, as PyTorch does);
    elements outside the range (and NaN) are not counted; the last bin is closed."""
    lo, hi = float(min), float(max)
    data = x.reshape(-1).astype(np.float64)
    if lo == hi and data.size:
        lo, hi = float(data.min()), float(data.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise HistcRangeError(f"torch.histc: range of [{lo:g}, {hi:g}] is not finite")
    if lo == hi:
        lo, hi = lo - 1.0, hi + 1.0
    keep = (data >= lo) & (data <= hi)
    data = data[keep]
    # PyTorch's bin: (v - min) * bins / (max - min), the top edge going into the last bin
    pos = ((data - lo) * bins / (hi - lo)).astype(np.int64)
    pos = np.minimum(pos, bins - 1)
    return np.bincount(pos, minlength=bins).astype(x.dtype)


# ---- movement (views where numpy gives one) ------------------------------------------------
@primitive("reshape", "movement", "x", method=True)
def _reshape(x, shape):  # type: ignore[no-untyped-def]
    return np.reshape(x, shape)


@primitive("permute", "movement", "x", method=True)
def _permute(x, dims):  # type: ignore[no-untyped-def]
    return np.transpose(x, dims)


@primitive("broadcast_to", "movement", "x", method=True)
def _broadcast_to(x, shape):  # type: ignore[no-untyped-def]
    return np.broadcast_to(x, shape)


@primitive("flip", "movement", "x", method=True)
def _flip(x, dims):  # type: ignore[no-untyped-def]
    return np.flip(x, dims).copy()  # PyTorch's flip copies


@primitive("cat", "movement", "xs*")
def _cat(*xs, dim):  # type: ignore[no-untyped-def]
    return np.concatenate(xs, axis=dim)


@primitive("pad", "movement", "x")
def _pad(x, widths, value):  # type: ignore[no-untyped-def]
    """Constant padding; ``widths`` is numpy's ((before, after), ...) per dim."""
    return np.pad(x, widths, mode="constant", constant_values=value)


@primitive("diagonal", "movement", "x", method=True)
def _diagonal(x, offset, dim1, dim2):  # type: ignore[no-untyped-def]
    out = np.diagonal(x, offset, dim1, dim2)
    if x.flags.writeable:
        # numpy's diagonal view is read-only; PyTorch's is writable (x.diagonal().fill_(1))
        out.flags.writeable = True
    return out


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


@primitive("gather", "movement", "x index", method=True)
def _gather(x, index, dim):  # type: ignore[no-untyped-def]
    return x[_scatter_key(index, dim)]


@primitive("scatter_add", "movement", "x index src", method=True, inplace=True)
@_quiet_kernel
def _scatter_add(x, index, src, dim):  # type: ignore[no-untyped-def]
    out = np.array(x, copy=True)
    np.add.at(out, _scatter_key(index, dim), src)
    return out


@primitive("scatter", "movement", "x index src", method=True, inplace=True)
def _scatter(x, index, src, dim):  # type: ignore[no-untyped-def]
    out = np.array(x, copy=True)
    out[_scatter_key(index, dim)] = src
    return out


# ---- opaque -----------------------------------------------------------------------------
@primitive("matmul", "opaque", "a b", method=True)
@_quiet_kernel
def _matmul(a, b):  # type: ignore[no-untyped-def]
    """Batched matrix product of operands with at least 2 dims (numpy broadcasting of batch).
    float16/bfloat16 operands multiply in float32 (BLAS; float32 accumulation, as PyTorch's
    CPU half matmul) and round back once."""
    if a.dtype.itemsize == 2 and a.dtype.kind in "fV":
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    if a.ndim == 2 and b.ndim == 2 and a.shape[0] == 1 and b.shape[1] == 1:
        # a vector's dot product (``dot``, a 1-D ``matmul``): BLAS's dot, not a 1 x 1 matrix
        # product (a 400,000-value gradient's squared norm: 35 -> 18 us)
        return np.asarray(np.dot(a[0], b[:, 0])).reshape(1, 1)
    if a.shape[-1] == 1 and b.ndim > 2:
        # stacked outer products (per-sample weight gradients under vmap): numpy's matmul
        # loops over the batch; einsum's broadcast product is the same single multiply, 4x
        # faster
        return np.einsum("...i,...j->...ij", a[..., 0], b[..., 0, :])
    if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous and a.size:
        # one matrix over a batch (a linear layer on (B, T, C)): one product of all B T rows;
        # numpy's stacked matmul makes one BLAS call per batch entry (one thread: 6.7 against
        # 5.3 ms on the LSTM-LM's decoder, (35, 20, 200) by (200, 2000))
        rows = a.reshape(-1, a.shape[-1]) @ b
        return rows.reshape(*a.shape[:-1], b.shape[-1])
    if b.ndim > 2 and not any(b.strides[:-2]) and a.ndim >= 2 and b.size:
        # ``b`` is one matrix broadcast over the batch (an expanded weight under vmap): one
        # matrix product of all rows of ``a`` instead of one per batch entry
        batch = broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
        if tuple(batch) == tuple(a.shape[:-2]):
            matrix = b[(0,) * (b.ndim - 2)]
            rows = a.reshape(-1, a.shape[-1]) @ matrix
            return rows.reshape(*a.shape[:-1], matrix.shape[-1])
    return np.matmul(a, b)


@primitive("to_device", "opaque", "x")
def _to_device(x, device, source):  # type: ignore[no-untyped-def]
    """A copy of ``x`` on ``device`` ("cpu" or "cuda:0"); ``source`` is where ``x`` lives (the
    derivative copies the gradient back there)."""
    if device == "cpu":
        return x.to_host() if hasattr(x, "to_host") else x
    return to_device(x)


# ---- shape/dtype rules ------------------------------------------------------------------------
# ``meta(shapes, dtypes, **attrs) -> (shape, dtype)``: what each primitive produces, computed from
# input shapes and dtypes alone.  The compiler's capture runs derivative rules on symbolic values
# (shapes, no data) and uses these; the IR verifier checks every value against them.  They are
# plain integer arithmetic and comparisons, never numpy, so that they work on the compiler's
# symbolic sizes (``fusegrad.compiler.symbolic``) as well as on ints.


def _elementwise_meta(name: str):  # type: ignore[no-untyped-def]
    bool_result = REGISTRY[name].bool_result

    def meta(shapes, dtypes, **attrs):  # type: ignore[no-untyped-def]
        shape = broadcast_shapes(*shapes) if len(shapes) > 1 else tuple(shapes[0])
        if bool_result:
            return shape, _dt.bool_
        if name == "cast":
            return shape, attrs["dtype"]
        if name == "where":
            return shape, dtypes[1]
        if name == "abs":
            return shape, dtypes[0].to_real()  # |z| of a complex z is real
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


# ---- complex operands --------------------------------------------------------------------------
# numpy computes these for complex arrays too (ordering them lexicographically, rounding each
# part, ...), where PyTorch refuses complex tensors; their kernels refuse them as PyTorch does.
# The other primitives take complex operands (docs/complex.md).
REAL_ONLY = frozenset(
    "sign floor ceil trunc round erf erfc erfinv lgamma digamma trigamma atan2 hypot logaddexp "
    "maximum minimum remainder floor_divide lt le gt ge amax amin argmax argmin argsort "
    "cummax_index mode_index searchsorted histc attention attention_backward rnn_sequence "
    "rnn_sequence_backward convolution convolution_backward_input convolution_backward_weight "
    "avg_pool avg_pool_backward pool_index pool_take pool_scatter binary_cross_entropy "
    "binary_cross_entropy_backward".split()
)


def _complex_refused(name: str, kernel):  # type: ignore[no-untyped-def]
    def refuse(*arrays, **attrs):  # type: ignore[no-untyped-def]
        for a in arrays:
            if getattr(a, "dtype", None) is not None and a.dtype.kind == "c":
                shapes = ", ".join(f"{tuple(x.shape)} {x.dtype}" for x in arrays)
                raise ComplexNotSupported(
                    f"{name} is not supported for complex inputs (got {shapes})"
                )
        return kernel(*arrays, **attrs)

    refuse.__name__ = getattr(kernel, "__name__", name)
    refuse.__doc__ = kernel.__doc__
    return refuse


def _refuse_complex() -> None:
    for name in REAL_ONLY:
        prim = REGISTRY[name]
        REGISTRY[name] = dataclasses.replace(
            prim, kernel=_complex_refused(name, prim.kernel), ufunc=None
        )


def _set_metas() -> None:
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

    def argsort_meta(shapes, dtypes, dim, descending, k):  # type: ignore[no-untyped-def]
        out = list(shapes[0])
        if k is not None:
            out[dim] = k
        return tuple(out), _dt.int64

    set_meta("argsort", argsort_meta)
    set_meta(
        "attention",
        lambda shapes, dtypes, scale, causal: (
            tuple(shapes[0][:2]) + (shapes[0][2] + 1,),
            dtypes[1],
        ),
    )
    set_meta(
        "attention_backward",
        lambda shapes, dtypes, scale, causal: (
            (shapes[1][0], shapes[1][1] + 2 * shapes[2][1], shapes[1][2]),
            dtypes[1],
        ),
    )

    def rnn_sequence_meta(shapes, dtypes, mode, reverse, bias, input_bias, proj, batch_sizes):  # type: ignore[no-untyped-def]
        rows = 1
        for d in shapes[0][:-1]:
            rows = rows * d
        size = shapes[1][1]  # (P: H, or an LSTM's projection); then P + S H values per row
        if mode == "LSTM":
            width = size + 5 * shapes[3][1]
        else:
            width = size + (4 * size if mode == "GRU" else 0)
        return (rows * width,), dtypes[0]

    def rnn_sequence_backward_meta(shapes, dtypes, mode, reverse, proj, batch_sizes):  # type: ignore[no-untyped-def]
        # (g_h, g_s, out_h, out_s, w_hh, h0, state*)
        (gates, size), batch, rows = shapes[4], shapes[5][0], shapes[0][0]
        total = rows * gates + batch * size + gates * size + gates
        if mode == "LSTM":
            hidden = shapes[6][1]
            total += batch * hidden + (size * hidden if proj else 0)
        return (total,), dtypes[1]

    set_meta("rnn_sequence", rnn_sequence_meta)
    set_meta("rnn_sequence_backward", rnn_sequence_backward_meta)

    def convolution_meta(
        shapes, dtypes, stride, padding, dilation, groups, transposed, output_padding
    ):  # type: ignore[no-untyped-def]
        x, w = shapes[0], shapes[1]
        kernel, sizes = tuple(w[2:]), tuple(x[2:])
        if transposed:
            outs = conv_kernels.transpose_sizes(
                sizes, kernel, stride, padding, dilation, output_padding
            )
            return (x[0], w[1] * groups) + tuple(outs), dtypes[0]
        outs = conv_kernels.out_sizes(sizes, kernel, stride, padding, dilation)
        return (x[0], w[0]) + tuple(outs), dtypes[0]

    def convolution_backward_input_meta(
        shapes, dtypes, sizes, stride, padding, dilation, groups, transposed
    ):  # type: ignore[no-untyped-def]
        g, w = shapes
        channels = w[0] if transposed else w[1] * groups
        return (g[0], channels) + tuple(sizes), dtypes[0]

    def convolution_backward_weight_meta(
        shapes, dtypes, kernel, stride, padding, dilation, groups, transposed
    ):  # type: ignore[no-untyped-def]
        g, x = shapes
        if transposed:  # (C, O / groups, *kernel): x has C channels, g has O
            return (x[1], g[1] // groups) + tuple(kernel), dtypes[0]
        return (g[1], x[1] // groups) + tuple(kernel), dtypes[0]

    def avg_pool_meta(shapes, dtypes, window):  # type: ignore[no-untyped-def]
        x = shapes[0]
        outs = pool_out_sizes(window, tuple(x[2:]))
        return tuple(x[:2]) + tuple(outs), dtypes[0]

    set_meta("convolution", convolution_meta)
    set_meta("convolution_backward_input", convolution_backward_input_meta)
    set_meta("convolution_backward_weight", convolution_backward_weight_meta)
    set_meta("avg_pool", avg_pool_meta)
    set_meta(
        "avg_pool_backward",
        lambda shapes, dtypes, window, sizes: (tuple(shapes[0][:2]) + tuple(sizes), dtypes[0]),
    )
    set_meta(
        "pool_index",
        lambda shapes, dtypes, window: (avg_pool_meta(shapes, dtypes, window)[0], _dt.int64),
    )
    set_meta("pool_take", lambda shapes, dtypes: (tuple(shapes[1]), dtypes[0]))
    set_meta(
        "pool_scatter",
        lambda shapes, dtypes, sizes: (tuple(shapes[0][:2]) + tuple(sizes), dtypes[0]),
    )
    set_meta("cummax_index", lambda shapes, dtypes, dim, largest: (tuple(shapes[0]), _dt.int64))

    def mode_index_meta(shapes, dtypes, dim):  # type: ignore[no-untyped-def]
        out = list(shapes[0])
        out[dim] = 1
        return tuple(out), _dt.int64

    set_meta("mode_index", mode_index_meta)
    set_meta(
        "searchsorted",
        lambda shapes, dtypes, right, out_int32: (
            tuple(shapes[1]),
            _dt.int32 if out_int32 else _dt.int64,
        ),
    )
    set_meta("histc", lambda shapes, dtypes, bins, min, max: ((bins,), dtypes[0]))
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
    _refuse_complex()
    missing = [name for name, prim in REGISTRY.items() if prim.meta is None]
    if missing:
        raise AssertionError(f"primitives without a shape/dtype rule: {missing}")


_set_metas()
