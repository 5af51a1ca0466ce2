"""Vectorisable float32 math helpers for generated CPU kernels.

Where this sits: ``numba_cpu.py`` lowers the float32 form of each transcendental primitive to a
call of one of these helpers (``FLOAT32_HELPERS`` maps primitive name -> helper name); the
float64 form stays libm (``math.exp``, ``math.log``, ..., see ``cpu_helpers.MATH64``), which is
correctly rounded or nearly so and which generated float64 code can afford.

Why they exist: this numba has no SVML, so ``math.exp`` & co. inside a loop are scalar libm calls
that LLVM cannot vectorise (a fused loop ran 18x slower with them).  Every helper here is
straight-line float/integer arithmetic -- range reduction, a minimax polynomial, exponent
manipulation through integer views of the float bits, and selects (``a if c else b``, which LLVM
turns into blend instructions) for the special cases -- so a loop calling them vectorises to
``<16 x float>`` on AVX-512 (checked by ``tests/compiler/test_fastmath.py``).

Accuracy: ``MAX_ULP_ERROR`` below, the max error in float32 ulp against numpy/libm in float64
rounded to float32, measured over every float32 input -- 1 ulp for exp, expm1, log, log1p, erf,
sin and cos, 2 for tanh and sigmoid, 0 for sqrt.  Special values follow numpy: NaN in -> NaN
out, overflow -> inf, underflow -> 0 through the denormals, ``log(0) = -inf``,
``log(x < 0) = nan``, tanh, sigmoid and erf saturate exactly to their limits, and the sign of
zero is kept where numpy keeps it.  ``sin`` and ``cos`` hold their bound over the whole float32
line: their argument reduction is exact (Payne-Hanek; the bits of 2/pi an input's exponent needs
are picked by selects from a four-row table, see ``_sincos_reduce``), so ``cos(1e30)`` is
numpy's (fuzz seed 301187: a value merely in [-1, 1] there moved an argmin).  Inputs must be
float32 (the code generator guarantees it): another type would compile a float64 variant
carrying float32 accuracy.

How they are compiled, and why: the helpers rely on exact IEEE evaluation order (Cody-Waite
reduction, the TwoSum in ``log1p``, the split scaling in ``exp``, the exact splits of the sin/cos
reduction), which ``reassoc``/``nsz`` fastmath flags would be free to rewrite (measured: with
``reassoc`` LLVM turned ``(p * 2**k1) * 2**k2`` into ``p * 2**k`` and ``exp(88.4)`` overflowed to
inf).  Generated kernels no longer use those flags (``numba_cpu``: ``contract`` only), but the
helpers do not rely on their callers' flags.  Hence:

* ``fastmath={"contract"}`` is set explicitly.  numba *inherits* a caller's fastmath flags into a
  callee that does not set its own, so leaving it out would compile the helpers with whatever
  the caller uses.  ``contract`` only lets LLVM fuse a multiply and an add into an FMA (one
  rounding instead of two): no NaN/inf/signed-zero change, and every trick above stays exact
  under it; the bounds hold with and without FMA hardware (both measured).
* ``forceinline=True`` (LLVM ``alwaysinline``), not numba's ``inline="always"``: numba's IR
  inlining would re-lower the body under the caller's flags, while LLVM inlining keeps each
  instruction's own flags.  Plain LLVM inlining is not enough either: ``fast_erf_f32`` was over
  the inliner's size threshold, stayed a call, and the loop around it did not vectorise.

``tests/compiler/test_fastmath.py`` checks the error bounds inside a loop compiled with the
emitter's flags, and that the loop vectorises.

Coefficients: fitted by ``_fastmath_fit.py`` (weighted minimax by Lawson's algorithm against
mpmath, rounded to float32 one coefficient at a time with refitting); nothing is copied from a
library.  Range-reduction constants: a standard split of ln 2, noted where used, and the binary
digits of 2/pi, computed at import from Machin's formula (``two_over_pi_bits``).
"""

from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

import numba
import numpy as np

from . import diskcache

# numba's on-disk cache of a *caller* (a generated kernel) does not notice that an inlined callee
# changed, so the code generator must put this digest of the helpers' source in its module hash.
SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]

FLOAT32_HELPERS: dict[str, str] = {
    "exp": "fast_exp_f32",
    "expm1": "fast_expm1_f32",
    "log": "fast_log_f32",
    "log1p": "fast_log1p_f32",
    "tanh": "fast_tanh_f32",
    "sigmoid": "fast_sigmoid_f32",
    "erf": "fast_erf_f32",
    "sin": "fast_sin_f32",
    "cos": "fast_cos_f32",
    "sqrt": "fast_sqrt_f32",
}

# Max error in float32 ulp over *every* float32 input, measured exhaustively against numpy/libm
# float64 rounded to float32, with FMA (this machine) and without (helpers compiled with no
# contraction, every 13th input); the same maxima both ways.  tests/compiler/test_fastmath.py
# asserts these bounds on a sweep of the whole float32 line.
MAX_ULP_ERROR: dict[str, int] = {
    "exp": 1,
    "expm1": 1,
    "log": 1,
    "log1p": 1,
    "tanh": 2,
    "sigmoid": 2,
    "erf": 1,
    "sin": 1,
    "cos": 1,
    "sqrt": 0,
}

# Flags: see "How they are compiled" in the module docstring.
_jit = numba.njit(
    error_model="numpy", fastmath={"contract"}, forceinline=True, cache=True, nogil=True
)

_f32 = np.float32
_ONE = _f32(1.0)
_TWO = _f32(2.0)
_HALF = _f32(0.5)
_INF = _f32(np.inf)
_NAN = _f32(np.nan)
_SMALLEST_NORMAL = _f32(np.finfo(np.float32).tiny)  # 2**-126
_TWO_POW_23 = _f32(2.0**23)
_TWENTY_THREE = _f32(23.0)

# ln 2 split for Cody-Waite reduction: _LN2_HI has 9 significant bits (0x3f318000), so k * _LN2_HI
# is exact for |k| < 2**15 and x - k * _LN2_HI is exact (Sterbenz); _LN2_LO = ln 2 - _LN2_HI.
_LOG2E = _f32(1.4426950408889634)  # 1/ln 2
_LN2_HI = _f32(float.fromhex("0x1.63p-1"))  # 0.693359375
_LN2_LO = _f32(-2.1219444005469057e-4)

# exp: clamp so that k = rint(x / ln 2) lies in [-150, 128].  89 -> k = 128 and the result
# overflows to inf for every x above ln(FLT_MAX) = 88.7228; -104 -> k = -150, whose result rounds
# to 0 like every x below ln(2**-150) = -103.97.
_EXP_CLAMP_HI = _f32(89.0)
_EXP_CLAMP_LO = _f32(-104.0)
# exp(r) = 1 + r + r**2 * P(r), |r| <= ln(2)/2; max polynomial error 0.053 x 2**-24
_EXP_P0 = _f32(0.4999999403953552)
_EXP_P1 = _f32(0.1666652113199234)
_EXP_P2 = _f32(0.04166828840970993)
_EXP_P3 = _f32(0.008368703536689281)
_EXP_P4 = _f32(0.0013818938750773668)

# expm1: below -20 the float32 result is -1 (e**-20 < 2**-25), and k stays >= -29 so that 2**k
# and 2**k - 1 are exact.
_EXPM1_CLAMP_LO = _f32(-20.0)
# expm1(r) = r + r**2 * Q(r), |r| <= ln(2)/2; max polynomial error 0.0074 x 2**-24
_EXPM1_Q0 = _f32(0.5)
_EXPM1_Q1 = _f32(0.1666666567325592)
_EXPM1_Q2 = _f32(0.04166649281978607)
_EXPM1_Q3 = _f32(0.008333543315529823)
_EXPM1_Q4 = _f32(0.0013932365691289306)
_EXPM1_Q5 = _f32(0.00019764351600315422)

# log: x = 2**k * m with m in [sqrt(1/2), sqrt(2)) (the musl/FreeBSD bit trick: adding
# 0x3f800000 - 0x3f3504f3 to the bits carries into the exponent exactly when m >= sqrt(2)).
_LOG_OFFSET = 0x3F800000 - 0x3F3504F3
_LOG_SQRT_HALF_BITS = 0x3F3504F3
_MANTISSA_MASK = 0x007FFFFF
# log1p(f) = f - f**2/2 + f**3 * L(f), f in [sqrt(1/2) - 1, sqrt(2) - 1]; max error 0.099 x 2**-24
_LOG_L0 = _f32(0.3333333134651184)
_LOG_L1 = _f32(-0.2500082552433014)
_LOG_L2 = _f32(0.20001250505447388)
_LOG_L3 = _f32(-0.1662319004535675)
_LOG_L4 = _f32(0.14201176166534424)
_LOG_L5 = _f32(-0.13161464035511017)
_LOG_L6 = _f32(0.1276620775461197)
_LOG_L7 = _f32(-0.07636449486017227)

# tanh(x) = x + x**3 * T(x**2) for |x| < 0.625 (max polynomial error 0.003 x 2**-24);
# above, tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.287, which has no cancellation.
# tanh(10) rounds to 1 in float32, so |x| is clamped there to keep exp in its normal range.
TANH_POLY_MAX = 0.625
_TANH_POLY_MAX = _f32(TANH_POLY_MAX)
_TANH_CLAMP = _f32(10.0)
_MINUS_TWO = _f32(-2.0)
_TANH_T0 = _f32(-0.3333333134651184)
_TANH_T1 = _f32(0.13333220779895782)
_TANH_T2 = _f32(-0.05394817888736725)
_TANH_T3 = _f32(0.021706894040107727)
_TANH_T4 = _f32(-0.008190012536942959)
_TANH_T5 = _f32(0.002152681117877364)

# erf(x) = x + x * E(x**2) for |x| < 1 (max polynomial error 0.024 x 2**-24; storing
# 2/sqrt(pi) - 1 rather than 2/sqrt(pi) avoids the latter's 0.9 x 2**-24 rounding); above,
# erf(|x|) = 1 - exp(H(|x| - 2)) with H a fit of log(erfc) on [1, 4] (max error in erf
# 0.012 x 2**-24): log(erfc) is smooth and slowly curving there, unlike erfc itself, so 8
# coefficients suffice, and from 1 on erfc <= 0.16 so the rounding of exp(H) costs at most a
# fifth of an ulp of erf.  erf(x) rounds to 1 in float32 from x = 3.92 on, so |x| is clamped at 4.
ERF_POLY_MAX = 1.0
ERF_TAIL_CENTRE = 2.0
ERF_SATURATE = 4.0
_ERF_POLY_MAX = _f32(ERF_POLY_MAX)
_ERF_TAIL_CENTRE = _f32(ERF_TAIL_CENTRE)
_ERF_SATURATE = _f32(ERF_SATURATE)
_ERF_E0 = _f32(0.12837916612625122)  # 2/sqrt(pi) - 1
_ERF_E1 = _f32(-0.3761262595653534)
_ERF_E2 = _f32(0.11283578723669052)
_ERF_E3 = _f32(-0.026853347197175026)
_ERF_E4 = _f32(0.005187162198126316)
_ERF_E5 = _f32(-0.0007997853099368513)
_ERF_E6 = _f32(7.806903158780187e-05)
_ERF_H0 = _f32(-5.364941120147705)
_ERF_H1 = _f32(-4.4181599617004395)
_ERF_H2 = _f32(-0.9237529039382935)
_ERF_H3 = _f32(-0.016479894518852234)
_ERF_H4 = _f32(0.0035551260225474834)
_ERF_H5 = _f32(-0.0007168095326051116)
_ERF_H6 = _f32(0.00016818041331134737)
_ERF_H7 = _f32(-8.542414434487e-06)

# sin/cos: reduction and polynomials in float64 (one rounding at the end, so <= 1 ulp).
# Payne-Hanek reduction over the whole float32 line (see _sincos_reduce).  A finite float32 is
# x = M * 2**(E - 150) with M an integer < 2**24 and E its biased exponent; the binary digits b_i
# of 2/pi (weight 2**-i) with i <= E - 152 add only multiples of 4 (whole turns) to x * 2/pi, so
# those are dropped.  Exponents share rows of SINCOS_ROW_SPAN: row r serves E in
# [152 + 26r, 178 + 26r) (row 0 also every E below, where nothing is dropped) and holds the
# SINCOS_PIECES pieces of SINCOS_PIECE_BITS digits that follow the dropped ones of its first
# exponent:  piece j = sum of b_i * 2**-i for 26r + 29j < i <= 26r + 29(j + 1).  A 29-bit piece
# times a 24-bit M is exact in float64.  The 116 digits of a row cover the 25 exponents past its
# first, M's 24 digits and the quadrant's 2, and 65 more: the digits left out weigh < 2**-65 in
# the reduced argument.  A row is picked by selects, not loaded per lane: a per-exponent table
# read by a gather (3 pieces per lane) vectorises too, but a loop of sin took 2.3x the time of
# the Cody-Waite helper this replaces (which was wrong from 1.7e9 on), the selects 1.7x.
SINCOS_PIECE_BITS = 29
SINCOS_PIECES = 4
SINCOS_ROW_SPAN = 26
SINCOS_ROWS = 4  # rows start at E = 152, 178, 204, 230: 230 + 26 > 255
_SINCOS_FIRST_EXPONENT = 152  # biased exponent of 2**25, from which digits are dropped


def two_over_pi_bits(nbits: int) -> int:
    """floor(2/pi * 2**nbits) as a Python integer, from Machin's formula
    pi = 16 atan(1/5) - 4 atan(1/239) in fixed point with 64 guard bits: exact unless some 50
    digits after the last are all ones or all zeros (tests/compiler/test_fastmath.py compares
    the lengths used here and there with mpmath)."""
    w = nbits + 64
    one = 1 << w

    def atan_inv(n: int) -> int:  # atan(1/n) * 2**w, each term truncated
        power = one // n
        total = power
        k = 1
        while power:
            power //= n * n
            term = power // (2 * k + 1)
            total = total - term if k % 2 else total + term
            k += 1
        return total

    pi_w = 16 * atan_inv(5) - 4 * atan_inv(239)  # pi * 2**w, within a few hundred units
    return ((2 << (2 * w)) // pi_w) >> 64


def sincos_table() -> np.ndarray:
    """(SINCOS_ROWS, SINCOS_PIECES) float64 pieces of 2/pi (see above); each exact."""
    nbits = 256  # the last row ends at digit 26 * 3 + 29 * 4 = 194
    digits = two_over_pi_bits(nbits)
    mask = (1 << SINCOS_PIECE_BITS) - 1
    table = np.empty((SINCOS_ROWS, SINCOS_PIECES), dtype=np.float64)
    for row in range(SINCOS_ROWS):
        for j in range(SINCOS_PIECES):
            end = SINCOS_ROW_SPAN * row + SINCOS_PIECE_BITS * (j + 1)  # last digit's index
            table[row, j] = math.ldexp((digits >> (nbits - end)) & mask, -end)
    return table


_SINCOS = sincos_table()  # read at constant indices only: numba folds them into the code
_SINCOS_SPLIT = 1.5 * 2.0**25  # (p + this) - this rounds |p| < 2**24 to a multiple of 2**-27
_PIO2 = math.pi / 2
_QUARTER = 0.25
_FOUR = 4.0
# sin(r) = r * (1 + r**2 * S(r**2)), cos(r) = 1 - r**2/2 + r**4 * C(r**2), |r| <= pi/4
_SIN_S0 = -0.1666666664037805
_SIN_S1 = 0.00833332925609964
_SIN_S2 = -0.00019839296541984252
_SIN_S3 = 2.717971273915199e-06
_COS_C0 = 0.04166666661871802
_COS_C1 = -0.001388888343415959
_COS_C2 = 2.479944289386193e-05
_COS_C3 = -2.7204335746030877e-07


# ---- bit-level building blocks ----------------------------------------------------------------
# ``np.float32(x).view(np.int32)`` on a scalar lowers to an LLVM bitcast, which vectorises.
# numba widens int32 arithmetic to int64, so results are narrowed with np.int32 before a view.


@_jit
def _float_bits(x: np.float32) -> np.int32:
    return np.float32(x).view(np.int32)


@_jit
def _pow2(n: int | np.integer) -> np.float32:
    """2**n as float32 for integer n in [-126, 127], built from the exponent field."""
    return np.int32((n + 127) << 23).view(np.float32)


@_jit
def _at_most(x: np.float32, limit: np.float32) -> np.float32:
    """``x`` capped at ``limit``; NaN becomes ``limit`` (a select, so the NaN behaviour is ours,
    not that of ``min``); callers that care restore NaN at the end."""
    return x if x < limit else limit  # noqa: FURB136


@_jit
def _at_least(x: np.float32, limit: np.float32) -> np.float32:
    """``x`` raised to ``limit``; NaN becomes ``limit`` (see ``_at_most``)."""
    return x if x > limit else limit  # noqa: FURB136


@_jit
def _exp_reduce(x: np.float32) -> tuple[np.float32, np.float32]:
    """(p, k) with exp(x) = p * 2**k, k = rint(x / ln 2), p = exp(r) for |r| <= ln(2)/2."""
    k = np.rint(x * _LOG2E)
    # Cody-Waite: x - k*_LN2_HI is exact, so r carries only the rounding of k*_LN2_LO
    r = (x - k * _LN2_HI) - k * _LN2_LO
    poly = _EXP_P0 + r * (_EXP_P1 + r * (_EXP_P2 + r * (_EXP_P3 + r * _EXP_P4)))
    return _ONE + (r + r * r * poly), k


@_jit
def _exp_normal_range(x: np.float32) -> np.float32:
    """exp(x) for x in [-87, 88] (normal results only; no special cases)."""
    p, k = _exp_reduce(x)
    return p * _pow2(np.int32(k))


# ---- public helpers (float32 in, float32 out) -------------------------------------------------


@_jit
def fast_exp_f32(x: np.float32) -> np.float32:
    """exp(x) in float32, <= 1 ulp; inf above 88.72, denormals down to -103.97, then 0."""
    xc = _at_least(_at_most(x, _EXP_CLAMP_HI), _EXP_CLAMP_LO)  # NaN: restored at the end
    p, kf = _exp_reduce(xc)
    k = np.int32(kf)
    # 2**k for k in [-150, 128] is not a float32, but its halves are: p * 2**k1 is exact (normal),
    # and the product with 2**k2 rounds once, so overflow to inf and denormal results come out
    # of one correctly rounded multiplication.
    k1 = k >> 1
    y = (p * _pow2(k1)) * _pow2(k - k1)
    return x if np.isnan(x) else y


@_jit
def fast_expm1_f32(x: np.float32) -> np.float32:
    """exp(x) - 1 in float32, <= 1 ulp (relative accuracy near 0); -inf -> -1, expm1(-0) = -0."""
    xc = _at_least(_at_most(x, _EXP_CLAMP_HI), _EXPM1_CLAMP_LO)  # NaN: restored at the end
    kf = np.rint(xc * _LOG2E)
    r = (xc - kf * _LN2_HI) - kf * _LN2_LO
    poly = _EXPM1_Q0 + r * (
        _EXPM1_Q1 + r * (_EXPM1_Q2 + r * (_EXPM1_Q3 + r * (_EXPM1_Q4 + r * _EXPM1_Q5)))
    )
    em1 = r + r * r * poly  # expm1(r), relative accuracy kept for tiny r
    k = np.int32(kf)
    # expm1(x) = 2**k * expm1(r) + (2**k - 1); 2**k - 1 is exact for k in [-29, 24] and the
    # exact value is irrelevant beyond.  k = 128 (x > 88.38) is done as 2 * (k = 127 result).
    t = _pow2(k if k < 128 else 127)
    y = t * em1 + (t - _ONE)
    y = y * _TWO if k > 127 else y
    y = y if x != 0 else x  # keeps the sign of zero: expm1(-0) = -0
    return x if np.isnan(x) else y


@_jit
def _log_parts(u: np.float32) -> tuple[np.float32, np.float32]:
    """(k, f) with u = 2**k * (1 + f), f in [sqrt(1/2) - 1, sqrt(2) - 1), for normal u > 0."""
    bits = np.int64(_float_bits(u)) + _LOG_OFFSET
    k = np.float32((bits >> 23) - 127)
    m = np.int32((bits & _MANTISSA_MASK) + _LOG_SQRT_HALF_BITS).view(np.float32)
    return k, m - _ONE


@_jit
def _log1p_reduced(f: np.float32) -> tuple[np.float32, np.float32]:
    """(f**2/2, f**3 * L(f)): log1p(f) = f - f**2/2 + f**3 * L(f), summed by the caller."""
    poly = _LOG_L0 + f * (
        _LOG_L1
        + f
        * (_LOG_L2 + f * (_LOG_L3 + f * (_LOG_L4 + f * (_LOG_L5 + f * (_LOG_L6 + f * _LOG_L7)))))
    )
    f2 = f * f
    return _HALF * f2, f2 * f * poly


@_jit
def fast_log_f32(x: np.float32) -> np.float32:
    """log(x) in float32, <= 1 ulp (denormal inputs too); log(0) = -inf, log(x < 0) = nan."""
    # denormals: scale by 2**23 into the normal range first (exact), and take 23 off k
    tiny = x < _SMALLEST_NORMAL
    xs = x * _TWO_POW_23 if tiny else x
    k, f = _log_parts(xs)
    k = k - _TWENTY_THREE if tiny else k
    half_f2, tail = _log1p_reduced(f)
    # k * _LN2_HI is exact; the small terms are summed first so that only the last additions
    # round at the result's magnitude
    y = k * _LN2_HI + (f + ((tail - half_f2) + k * _LN2_LO))
    y = -_INF if x == 0 else y
    y = _NAN if x < 0 else y
    return x if (x == _INF) | np.isnan(x) else y


@_jit
def fast_log1p_f32(x: np.float32) -> np.float32:
    """log(1 + x) in float32, <= 1 ulp (relative accuracy near 0); -1 -> -inf, < -1 -> nan."""
    u = _ONE + x
    # TwoSum (Knuth): c = (1 + x) - u exactly, the part of x that rounding u dropped; the result
    # is log(u) + log(1 + c/u) ~ log(u) + c/u.  Branch-free and exact for any magnitudes.
    x_part = u - _ONE
    one_part = u - x_part
    c = (_ONE - one_part) + (x - x_part)
    k, f = _log_parts(u)  # u >= 2**-24 for x > -1, so u is normal
    half_f2, tail = _log1p_reduced(f)
    # every small term is summed before f, which is then added with one rounding: f + c/u alone
    # cancels for tiny x, and f - f**2/2 alone can round in a binade above the result's, each
    # costing a whole ulp
    y = k * _LN2_HI + (f + ((c / u + (tail - half_f2)) + k * _LN2_LO))
    y = y if x != 0 else x  # log1p(-0) = -0
    y = -_INF if x == -_ONE else y
    y = _NAN if x < -_ONE else y
    return x if (x == _INF) | np.isnan(x) else y


@_jit
def fast_tanh_f32(x: np.float32) -> np.float32:
    """tanh(x) in float32, <= 2 ulp; exactly +-1 from |x| >= 9.01, tanh(-0) = -0."""
    ax = abs(x)
    x2 = x * x
    poly = _TANH_T0 + x2 * (
        _TANH_T1 + x2 * (_TANH_T2 + x2 * (_TANH_T3 + x2 * (_TANH_T4 + x2 * _TANH_T5)))
    )
    small = x + x * x2 * poly
    e = _exp_normal_range(_MINUS_TWO * _at_most(ax, _TANH_CLAMP))
    large = (_ONE - e) / (_ONE + e)
    large = large if x > 0 else -large
    y = small if ax < _TANH_POLY_MAX else large
    y = y if x != 0 else x  # tanh(-0) = -0 (the polynomial's x + (+0) would lose the sign)
    return x if np.isnan(x) else y


@_jit
def fast_sigmoid_f32(x: np.float32) -> np.float32:
    """1 / (1 + exp(-x)) in float32, <= 2 ulp, never overflowing: with e = exp(-|x|) in (0, 1],
    1/(1 + e) for x >= 0 and e/(1 + e) for x < 0 (relative accuracy kept in the tail)."""
    e = fast_exp_f32(-abs(x))
    numerator = _ONE if x >= 0 else e  # NaN: e is NaN
    return numerator / (_ONE + e)


@_jit
def fast_erf_f32(x: np.float32) -> np.float32:
    """erf(x) in float32, <= 1 ulp; exactly +-1 from |x| >= 3.92, erf(-0) = -0."""
    ax = abs(x)
    x2 = x * x
    small = x + x * (
        _ERF_E0
        + x2
        * (
            _ERF_E1
            + x2 * (_ERF_E2 + x2 * (_ERF_E3 + x2 * (_ERF_E4 + x2 * (_ERF_E5 + x2 * _ERF_E6))))
        )
    )
    t = _at_least(_at_most(ax, _ERF_SATURATE), _ERF_POLY_MAX) - _ERF_TAIL_CENTRE  # NaN, inf -> 4
    h = _ERF_H0 + t * (
        _ERF_H1
        + t
        * (_ERF_H2 + t * (_ERF_H3 + t * (_ERF_H4 + t * (_ERF_H5 + t * (_ERF_H6 + t * _ERF_H7)))))
    )
    large = _ONE - _exp_normal_range(h)  # h in [-17.4, -1.5]
    large = large if x > 0 else -large
    y = small if ax < _ERF_POLY_MAX else large
    return x if np.isnan(x) else y


@_jit
def _sincos_piece(d: int | np.integer, j: int) -> float:
    """Piece ``j`` of the row of ``d = E - 152`` (selects, which vectorise to blends)."""
    c = _SINCOS[0, j]
    c = _SINCOS[1, j] if d >= SINCOS_ROW_SPAN else c
    c = _SINCOS[2, j] if d >= 2 * SINCOS_ROW_SPAN else c
    return _SINCOS[3, j] if d >= 3 * SINCOS_ROW_SPAN else c


@_jit
def _sincos_reduce(x: np.float32) -> tuple[float, float, float]:
    """(sin r, cos r, q) in float64 with x = r + (4n + q) * pi/2, |r| <= pi/4 (+ 2**-27).

    x * 2/pi = p1 + p2 + p3 + p4 (mod 4) with p_j = x * piece_j, each product exact.  With
    d = E - 152 in [0, 26) past the row's first exponent, p1 < 2**51 is a multiple of
    2**(d - 27), p2 < 2**22 one of 2**(d - 56), p3 < 2**-7, p4 < 2**-36.  p1 - k1, its
    fraction, is exact; p2 is split at 2**-27 (p2_hi, exact, and p2 - p2_hi) so that
    t = (p1 - k1) + p2_hi is exact (multiples of 2**-27 below 2**23; for d < 0, |x| < 2**25,
    it is exact from |x| >= 1 on, and below that nothing cancels); k2 = rint(t + p3) and
    t - k2 are exact; the last three additions either cancel exactly (Sterbenz) or round
    relative to a result of their own size.  So f = x * 2/pi - k carries an absolute error
    below 2**-65 + 2**-52 |f|, while |f| >= 2**-29.86 for every float32 with k != 0 (the
    closest, x = 16367173 * 2**72, found by an exhaustive search in exact integer arithmetic,
    which the tests repeat).  NaN and +-inf give NaN (inf - inf)."""
    d = ((_float_bits(x) >> 23) & 0xFF) - _SINCOS_FIRST_EXPONENT
    xd = np.float64(x)
    p1 = xd * _sincos_piece(d, 0)
    p2 = xd * _sincos_piece(d, 1)
    p3 = xd * _sincos_piece(d, 2)
    p4 = xd * _sincos_piece(d, 3)
    k1 = np.rint(p1)
    p2_hi = (p2 + _SINCOS_SPLIT) - _SINCOS_SPLIT
    t = (p1 - k1) + p2_hi
    k2 = np.rint(t + p3)
    f = (((t - k2) + (p2 - p2_hi)) + p3) + p4  # x * 2/pi - k, |f| <= 1/2 + 2**-28
    k = k1 + k2  # < 2**52: exact
    r = f * _PIO2
    q = k - _FOUR * np.floor(k * _QUARTER)  # k mod 4, exact in float64
    r2 = r * r
    s = r + r * (r2 * (_SIN_S0 + r2 * (_SIN_S1 + r2 * (_SIN_S2 + r2 * _SIN_S3))))
    c = 1.0 - 0.5 * r2 + (r2 * r2) * (_COS_C0 + r2 * (_COS_C1 + r2 * (_COS_C2 + r2 * _COS_C3)))
    return s, c, q


@_jit
def fast_sin_f32(x: np.float32) -> np.float32:
    """sin(x) in float32, <= 1 ulp over every finite float32; sin(+-inf) = nan."""
    s, c, q = _sincos_reduce(x)
    odd = (q == 1.0) | (q == 3.0)
    y = c if odd else s
    y = -y if q >= 2.0 else y
    result = np.float32(y)  # the one rounding to float32
    return result if x != 0 else x  # sin(-0) = -0


@_jit
def fast_cos_f32(x: np.float32) -> np.float32:
    """cos(x) in float32, <= 1 ulp over every finite float32; cos(+-inf) = nan."""
    s, c, q = _sincos_reduce(x)
    odd = (q == 1.0) | (q == 3.0)
    y = s if odd else c
    y = -y if (q == 1.0) | (q == 2.0) else y
    return np.float32(y)


@_jit
def fast_sqrt_f32(x: np.float32) -> np.float32:
    """sqrt(x), correctly rounded: numba lowers it to the ``llvm.sqrt`` intrinsic, which
    vectorises (vsqrtps), so it needs no polynomial; here to keep the table uniform."""
    return np.sqrt(x)


# numba's disk cache of these helpers: a corrupt entry is a miss, never an error (``diskcache``);
# they are compiled as part of the kernels calling them, so nothing here is counted
diskcache.guard_module(sys.modules[__name__], entry_points=())
