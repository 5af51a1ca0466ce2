"""Accuracy, special values and vectorisation of the float32 helpers in
``fusegrad.compiler.codegen.fastmath``.

Every helper runs the way generated kernels run it: called elementwise from a numba loop compiled
with the emitter's fastmath flags (``numba_cpu.FASTMATH``), and from a loop compiled with
``reassoc``/``contract``/``nsz``: the helpers must not pick up a caller's flags (numba would
otherwise pass them on, and ``reassoc`` breaks their range reduction -- ``exp(88.4)`` came out
inf), so the special-value tests under those flags check that the helpers' own flags hold.

Reference: numpy in float64 (``math.erf`` for erf, which numpy lacks), rounded to float32.  Error
is the distance in float32 ulp between the result and the reference (the distance between their
bit patterns read as ordered integers, so it counts denormal steps too).  Inputs: every 97th bit
pattern of the whole float32 line (44 million values), every value within 2**15 bit patterns of
each helper's critical points (range-reduction boundaries, overflow/underflow thresholds,
saturation points, 0, 1), and special values; for sin and cos also every 31st float32 from 2**25
up (where their reduction drops whole turns) and the float32 closest to a multiple of pi/2 in
each binade, found by an exact search.  Besides the ulp bound, NaN must map to NaN,
infinities and signed zeros must match the reference exactly.

Compiled loops are built once per module (fixtures), so the module takes seconds, not minutes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
import pytest

from fusegrad.compiler.codegen import fastmath, numba_cpu

# the flags of generated kernels, and flags a caller could have that would break the helpers
# were they inherited (numba passes a caller's flags on to a callee that sets none)
KERNEL_FASTMATH = set(numba_cpu.FASTMATH)
FOREIGN_FASTMATH = {"reassoc", "contract", "nsz"}
NAMES = sorted(fastmath.FLOAT32_HELPERS)
SWEEP_STRIDE = 97
CHUNK = 1 << 22
WINDOW = 1 << 15
F32 = np.float32
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)
DENORMAL_MIN = float(np.finfo(np.float32).smallest_subnormal)

# sin/cos: where their reduction starts dropping whole turns (2**25), where it changes rows of its
# table (2**51, 2**77, 2**103), the float32 closest to a multiple of pi/2, 1e30 (fuzz seed 301187)
# and the old Cody-Waite reduction's limit (1.7e9), both signs
SINCOS_BOUNDARIES = [
    sign * v
    for v in [1e4 * math.pi, 2.0**25, 2.0**51, 2.0**77, 2.0**103, 16367173 * 2.0**72, 1e30, 1.686e9]
    for sign in (1, -1)
]

# Points around which every float32 (+-WINDOW bit patterns) is tested, per helper.
CRITICAL_POINTS: dict[str, list[float]] = {
    "exp": [0.0, -0.0, 0.34657, -0.34657, 88.72283935546875, -87.33654, -103.97208, 1.0],
    "expm1": [0.0, -0.0, 0.34657, -0.34657, 88.72283935546875, 88.38, -17.3287, 1e-4],
    "log": [1.0, 0.70710677, 1.4142135, FLT_MIN, 0.0, FLT_MAX, 2.0, 0.5],
    "log1p": [0.0, -0.0, -1.0, -0.29289323, 0.41421357, 1e-7, -1e-7, 2**24],
    "tanh": [0.0, -0.0, fastmath.TANH_POLY_MAX, -fastmath.TANH_POLY_MAX, 9.01, -9.01, 1e-4],
    "sigmoid": [0.0, -0.0, -87.33654, -103.27893, 16.635532, -16.635532, 88.72283935546875],
    "erf": [0.0, -0.0, fastmath.ERF_POLY_MAX, -fastmath.ERF_POLY_MAX, 3.9192, -3.9192, 4.0],
    "sin": [0.0, -0.0, math.pi / 4, math.pi / 2, math.pi, 3 * math.pi / 4, 1e5, *SINCOS_BOUNDARIES],
    "cos": [0.0, -0.0, math.pi / 4, math.pi / 2, math.pi, 3 * math.pi / 4, 1e5, *SINCOS_BOUNDARIES],
    "sqrt": [0.0, -0.0, FLT_MIN, 1.0, 2.0, FLT_MAX],
}

SPECIAL_VALUES = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, DENORMAL_MIN, -DENORMAL_MIN,
     FLT_MIN - DENORMAL_MIN, -(FLT_MIN - DENORMAL_MIN), FLT_MIN, -FLT_MIN, FLT_MAX, -FLT_MAX,
     1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 88.72283935546875, 88.72284698486328, -103.97208,
     -103.97209, -87.33654, 1e-30, -1e-30, 1e30, -1e30, 3.0, -3.0, 10.0, -10.0, 100.0, -100.0],
    dtype=np.float32,
)  # fmt: skip


# ---- references and comparison ------------------------------------------------------------------


@numba.njit(error_model="numpy")
def _erf64(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        out[i] = math.erf(x[i])


def reference(name: str, x32: np.ndarray) -> np.ndarray:
    """numpy (math.erf for erf) in float64, rounded to float32."""
    with np.errstate(all="ignore"):  # signalling NaNs raise "invalid" when widened
        x = x32.astype(np.float64)
        if name == "sigmoid":
            e = np.exp(-np.abs(x))
            r = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        elif name == "erf":
            r = np.empty_like(x)
            _erf64(x, r)
        else:
            r = getattr(np, name)(x)
        return r.astype(np.float32)


@numba.njit(error_model="numpy")
def _compare(x: np.ndarray, got: np.ndarray, ref: np.ndarray) -> tuple[int, int, int]:
    """(max ulp distance over finite/infinite pairs, index of it, index of the first class
    mismatch or -1): NaN must meet NaN, infinities and zeros must match exactly (signs too)."""
    worst = 0
    worst_at = -1
    mismatch = -1
    for i in range(x.size):
        g = got[i]
        r = ref[i]
        if np.isnan(g) or np.isnan(r):
            if not (np.isnan(g) and np.isnan(r)) and mismatch < 0:
                mismatch = i
            continue
        if np.isinf(g) != np.isinf(r) or (np.isinf(r) and g != r):
            if mismatch < 0:
                mismatch = i
            continue
        gb = np.int64(np.float32(g).view(np.int32))
        rb = np.int64(np.float32(r).view(np.int32))
        if g == 0 and r == 0 and gb != rb and mismatch < 0:  # +0 vs -0
            mismatch = i
        # ordered integers: negative floats map below zero, both zeros to 0
        go = -(gb & 0x7FFFFFFF) if gb < 0 else gb
        ro = -(rb & 0x7FFFFFFF) if rb < 0 else rb
        d = int(abs(go - ro))
        if d > worst:
            worst = d
            worst_at = i
    return worst, worst_at, mismatch


def _loop_of(helper: Callable[..., Any], flags: set[str] = KERNEL_FASTMATH) -> Callable[..., Any]:
    @numba.njit(error_model="numpy", fastmath=flags)
    def loop(a, out):  # type: ignore[no-untyped-def]
        for i in range(a.size):
            out[i] = helper(a[i])

    return loop  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def loops() -> dict[str, Callable[..., Any]]:
    """One compiled ``(a, out)`` loop per helper (compiled on first call)."""
    return {name: _loop_of(getattr(fastmath, fastmath.FLOAT32_HELPERS[name])) for name in NAMES}


def _apply(loop: Callable[..., Any], x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    loop(x, out)
    return out


def _check(name: str, x: np.ndarray, got: np.ndarray, what: str) -> int:
    """Assert classes match; return the max ulp error."""
    ref = reference(name, x)
    worst, at, mismatch = _compare(x, got, ref)
    assert mismatch < 0, (
        f"{name}({x[mismatch]!r}) = {got[mismatch]!r}, numpy: {ref[mismatch]!r} ({what})"
    )
    if worst > fastmath.MAX_ULP_ERROR[name]:
        pytest.fail(
            f"{name}: {worst} ulp at x = {x[at]!r}: got {got[at]!r}, numpy {ref[at]!r} ({what}); "
            f"documented bound {fastmath.MAX_ULP_ERROR[name]}"
        )
    return int(worst)


def _bit_window(center: float) -> np.ndarray:
    c = int(np.array(center, dtype=np.float32).view(np.uint32))
    lo, hi = max(c - WINDOW, 0), min(c + WINDOW, 1 << 32)
    return np.arange(lo, hi, dtype=np.uint64).astype(np.uint32).view(np.float32)


# ---- accuracy -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_whole_float32_line(
    name: str, loops: dict[str, Callable[..., Any]], record_property: Any
) -> None:
    """Every SWEEP_STRIDE-th bit pattern: max ulp within the documented bound."""
    worst = 0
    step = CHUNK * SWEEP_STRIDE
    for start in range(0, 1 << 32, step):
        bits = np.arange(start, min(start + step, 1 << 32), SWEEP_STRIDE, dtype=np.uint64)
        x = bits.astype(np.uint32).view(np.float32)
        worst = max(worst, _check(name, x, _apply(loops[name], x), "sweep"))
    record_property("max_ulp", worst)
    print(f"{name}: max {worst} ulp over every {SWEEP_STRIDE}th float32")


@pytest.mark.parametrize("name", NAMES)
def test_critical_points_and_special_values(
    name: str, loops: dict[str, Callable[..., Any]]
) -> None:
    x = np.concatenate([SPECIAL_VALUES] + [_bit_window(c) for c in CRITICAL_POINTS[name]])
    _check(name, x, _apply(loops[name], x), "critical points / special values")


@pytest.mark.parametrize("name", NAMES)
def test_helpers_keep_their_flags_in_a_reassociating_caller(name: str) -> None:
    loop = _loop_of(getattr(fastmath, fastmath.FLOAT32_HELPERS[name]), FOREIGN_FASTMATH)
    x = np.concatenate([SPECIAL_VALUES] + [_bit_window(c) for c in CRITICAL_POINTS[name]])
    _check(name, x, _apply(loop, x), f"called from a loop compiled with {FOREIGN_FASTMATH}")


@pytest.mark.parametrize(
    ("name", "x", "expected"),
    [
        ("exp", np.inf, np.inf), ("exp", -np.inf, 0.0), ("exp", 88.72284698486328, np.inf),
        ("exp", -104.0, 0.0), ("exp", -103.0, 1e-45),
        ("expm1", -np.inf, -1.0), ("expm1", -0.0, -0.0), ("expm1", np.inf, np.inf),
        ("log", 0.0, -np.inf), ("log", -0.0, -np.inf), ("log", -1.0, np.nan),
        ("log", -np.inf, np.nan), ("log", np.inf, np.inf), ("log", DENORMAL_MIN, -103.27893),
        ("log1p", -1.0, -np.inf), ("log1p", -2.0, np.nan), ("log1p", -0.0, -0.0),
        ("log1p", np.inf, np.inf), ("log1p", DENORMAL_MIN, DENORMAL_MIN),
        ("tanh", np.inf, 1.0), ("tanh", -np.inf, -1.0), ("tanh", -0.0, -0.0), ("tanh", 10.0, 1.0),
        ("sigmoid", np.inf, 1.0), ("sigmoid", -np.inf, 0.0), ("sigmoid", -0.0, 0.5),
        ("sigmoid", -100.0, 3.8e-44),
        ("erf", np.inf, 1.0), ("erf", -np.inf, -1.0), ("erf", -0.0, -0.0), ("erf", 4.0, 1.0),
        ("sin", np.inf, np.nan), ("sin", -np.inf, np.nan), ("sin", -0.0, -0.0),
        ("sin", DENORMAL_MIN, DENORMAL_MIN), ("sin", -DENORMAL_MIN, -DENORMAL_MIN),
        ("sin", FLT_MAX, -0.521876514), ("sin", -FLT_MAX, 0.521876514),
        ("cos", np.inf, np.nan), ("cos", -np.inf, np.nan), ("cos", -0.0, 1.0), ("cos", 0.0, 1.0),
        ("cos", FLT_MAX, 0.853021026), ("cos", -FLT_MAX, 0.853021026),
        ("cos", 1e30, -0.611604798),
        ("sqrt", -1.0, np.nan), ("sqrt", -0.0, -0.0), ("sqrt", np.inf, np.inf),
    ],
)  # fmt: skip
def test_edge_values_exactly(
    name: str, x: float, expected: float, loops: dict[str, Callable[..., Any]]
) -> None:
    got = _apply(loops[name], np.array([x, np.nan], dtype=np.float32))
    assert np.isnan(got[1]), f"{name}(nan) = {got[1]!r}"
    want = np.float32(expected)
    if np.isnan(want):
        assert np.isnan(got[0]), f"{name}({x!r}) = {got[0]!r}, expected nan"
    else:
        assert got[0] == want and np.signbit(got[0]) == np.signbit(want), (
            f"{name}({x!r}) = {got[0]!r}, expected {want!r}"
        )


# ---- sin/cos over the whole line: huge arguments -------------------------------------------


@numba.njit(error_model="numpy")
def _closest_to_quarter_turns(limbs: np.ndarray, out: np.ndarray) -> None:
    """For each biased exponent e (rows of ``limbs``: 96 bits of 2/pi as three 32-bit limbs,
    starting after the digits that only add whole turns for that exponent), the mantissa M of
    the float32 M * 2**(e - 150) whose x * 2/pi is closest to an integer, and that distance in
    units of 2**-62: exact integer arithmetic (M * window mod 2**96), no floating point."""
    mask32 = np.uint64(0xFFFFFFFF)
    frac_mask = np.uint64((1 << 62) - 1)
    half = np.uint64(1 << 61)
    for e in range(limbs.shape[0]):
        w2, w1, w0 = limbs[e, 0], limbs[e, 1], limbs[e, 2]
        best = np.uint64(1 << 62)
        best_m = 0
        for m_int in range(1 << 23, 1 << 24):
            m = np.uint64(m_int)
            lo = m * w0
            mid = m * w1 + (lo >> np.uint64(32))
            hi = m * w2 + (mid >> np.uint64(32))
            frac = ((hi << np.uint64(32)) | (mid & mask32)) & frac_mask  # 62 fraction bits
            dist = np.uint64(1 << 62) - frac if frac >= half else frac
            if dist < best:
                best = dist
                best_m = m_int
        out[e, 0] = best_m
        out[e, 1] = np.int64(best)


def _closest_float32s_to_quarter_turns(first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, |x * 2/pi - k|) for the float32 closest to a multiple of pi/2 in each binade of biased
    exponent first..last (``fastmath.two_over_pi_bits`` is checked against mpmath separately)."""
    nbits = 320
    digits = fastmath.two_over_pi_bits(nbits)
    limbs = np.zeros((last - first + 1, 3), dtype=np.uint64)
    for row, e in enumerate(range(first, last + 1)):
        # digits from index e - 151 on (weight 2**-(e - 151)); those before add multiples of 4
        shift = nbits - (e - 152 + 96)
        window = (digits >> shift if shift >= 0 else digits << -shift) & ((1 << 96) - 1)
        limbs[row] = [(window >> 64) & 0xFFFFFFFF, (window >> 32) & 0xFFFFFFFF, window & 0xFFFFFFFF]
    out = np.zeros((last - first + 1, 2), dtype=np.int64)
    _closest_to_quarter_turns(limbs, out)
    x = np.array(
        [math.ldexp(int(m), e - 150) for m, e in zip(out[:, 0], range(first, last + 1))],
        dtype=np.float32,
    )
    return x, out[:, 1].astype(np.float64) * 2.0**-62


def test_two_over_pi_digits_match_mpmath() -> None:
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workprec(400):
        want = int(mpmath.floor(2 / mpmath.pi * mpmath.mpf(2) ** 320))
    assert fastmath.two_over_pi_bits(320) == want  # the exact search's digits
    assert fastmath.two_over_pi_bits(256) == want >> 64  # the module's
    # the table's pieces are those digits, 29 at a time, each exact in float64
    table = fastmath.sincos_table()
    for row in range(fastmath.SINCOS_ROWS):
        for j in range(fastmath.SINCOS_PIECES):
            end = fastmath.SINCOS_ROW_SPAN * row + fastmath.SINCOS_PIECE_BITS * (j + 1)
            piece = (want >> (320 - end)) & ((1 << fastmath.SINCOS_PIECE_BITS) - 1)
            assert table[row, j] == math.ldexp(piece, -end)


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sincos_closest_to_multiples_of_pi_over_2(
    name: str, loops: dict[str, Callable[..., Any]]
) -> None:
    """The float32s with the most cancellation in the reduction: in every binade from 0.5 up, the
    one closest to a multiple of pi/2 (and every float32 within 2**10 bit patterns of it), both
    signs.  The closest of all, 16367173 * 2**72, is 2**-29.86 (in units of pi/2) from one, the
    bound ``fastmath._sincos_reduce`` relies on."""
    x, dist = _closest_float32s_to_quarter_turns(126, 254)
    assert math.log2(dist.min()) == pytest.approx(-29.8575, abs=1e-3)
    assert x[np.argmin(dist)] == np.float32(16367173 * 2.0**72)
    centres = x.view(np.uint32).astype(np.int64)
    bits = (centres[:, None] + np.arange(-1024, 1025)).reshape(-1)
    near = bits[bits < 0x7F800000].astype(np.uint32).view(np.float32)
    near = np.concatenate([near, -near])
    _check(name, near, _apply(loops[name], near), "closest to multiples of pi/2")


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sincos_dense_in_the_large_binades(
    name: str, loops: dict[str, Callable[..., Any]], record_property: Any
) -> None:
    """Every 31st float32 from 2**25 (where the reduction starts dropping whole turns) to the
    largest, alternately negated: 28 million inputs through every row of the reduction's table."""
    lo = int(np.array(2.0**25, dtype=np.float32).view(np.uint32))
    hi = int(np.array(FLT_MAX, dtype=np.float32).view(np.uint32))
    worst = 0
    for start in range(lo, hi + 1, CHUNK * 31):
        bits = np.arange(start, min(start + CHUNK * 31, hi + 1), 31, dtype=np.uint32)
        x = bits.view(np.float32).copy()
        x[1::2] *= -1
        worst = max(worst, _check(name, x, _apply(loops[name], x), "large binades"))
    record_property("max_ulp", worst)


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sincos_huge_arguments_match_eager(name: str, loops: dict[str, Callable[..., Any]]) -> None:
    """Compiled code gives eager's values for inputs a program can meet however large (fuzz seed
    301187: compiled cos(1e30) was not numpy's -0.61 and moved amin's argmin and its gradient).
    Eager float32 sin/cos is numpy's float32 loop: within one ulp of it."""
    x = np.array([1e30, -1e30, -3e12, 2.5e9, FLT_MAX, -FLT_MAX, 16367173 * 2.0**72], np.float32)
    got = _apply(loops[name], x)
    eager = getattr(np, name)(x)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - eager.view(np.int32).astype(np.int64))
    assert np.all(np.sign(got) == np.sign(eager)) and ulps.max() <= 1, (x, got, eager)


# ---- vectorisation ------------------------------------------------------------------------------

VECTOR_FLOAT = re.compile(r"<(\d+) x (float|double)>")


@pytest.mark.parametrize("name", NAMES)
def test_helper_loops_vectorise_and_inline(name: str, loops: dict[str, Callable[..., Any]]) -> None:
    loop = loops[name]
    _apply(loop, np.ones(4, dtype=np.float32))  # compile if not yet
    ir = loop.inspect_llvm(loop.signatures[0])  # type: ignore[attr-defined]
    widths = {int(m.group(1)) for m in VECTOR_FLOAT.finditer(ir)}
    assert widths and max(widths) >= 4, f"{name}: the loop did not vectorise"
    called = re.findall(r"call [^\n]*@([^\s(]+)", ir)
    # mangled names of the helper module's functions contain "codegen8fastmath"
    assert not [c for c in called if "codegen8fastmath" in c], f"{name}: helper not inlined"


def test_fused_exp_loop_vectorises_but_libm_loop_calls_expf() -> None:
    """Why the helpers exist: ``math.exp`` in a loop becomes a call to libm's scalar ``expf``
    per element (numba here has no SVML).  LLVM does vectorise the IR of that loop to the
    ``llvm.exp.v16f32`` intrinsic, but the backend expands it into 16 ``expf`` calls, so the
    check is on the machine code; the helper's loop has vector arithmetic and no call."""
    fast_exp_f32 = fastmath.fast_exp_f32

    @numba.njit(error_model="numpy", fastmath=KERNEL_FASTMATH)
    def with_helper(a, b, out):  # type: ignore[no-untyped-def]
        for i in range(a.size):
            out[i] = fast_exp_f32(a[i]) * b[i]

    @numba.njit(error_model="numpy", fastmath=KERNEL_FASTMATH)
    def with_libm(a, b, out):  # type: ignore[no-untyped-def]
        for i in range(a.size):
            out[i] = math.exp(a[i]) * b[i]

    a = np.linspace(-5, 5, 64, dtype=np.float32)
    b = np.full(64, 2.0, dtype=np.float32)
    out_helper, out_libm = np.empty_like(a), np.empty_like(a)
    with_helper(a, b, out_helper)
    with_libm(a, b, out_libm)
    np.testing.assert_allclose(out_helper, out_libm, rtol=3e-7)

    ir = with_helper.inspect_llvm(with_helper.signatures[0])
    assert re.search(r"fmul [^\n]*<(4|8|16) x float>", ir), "helper loop: no vector multiply"
    expf = re.compile(r"(?<!\w)expf(?!\w)")  # the libm symbol, not a name containing it
    assert not expf.search(with_helper.inspect_asm(with_helper.signatures[0]))
    libm_asm = with_libm.inspect_asm(with_libm.signatures[0])
    assert expf.search(libm_asm), "expected scalar libm expf calls in the math.exp loop"


# ---- tables -------------------------------------------------------------------------------------


def test_registry_covers_the_lowering_table() -> None:
    """Every float32 helper replaces a scalar function the records' lowerings call (the CPU
    emitter spells that function with it), exists, and has a measured error bound."""
    from fusegrad.compiler.codegen import lowering, numba_cpu

    assert set(fastmath.FLOAT32_HELPERS) <= set(lowering.FUNCTIONS)
    for name, helper in fastmath.FLOAT32_HELPERS.items():
        assert callable(getattr(fastmath, helper)), name
        assert name in fastmath.MAX_ULP_ERROR
        assert numba_cpu.SPELLING.float32[name] == f"fastmath.{helper}"


def test_coefficients_are_the_derived_ones() -> None:
    """fastmath.py's tables are those ``_fastmath_fit`` derives (reproducible, not copied): each
    is as good as a fresh fit on the fit's own grid, and close to its coefficients.  (High-order
    minimax coefficients are weakly determined, so another BLAS may move their last digits.)"""
    pytest.importorskip("mpmath")
    from fusegrad.compiler.codegen import _fastmath_fit as fit

    assert fit.TANH_POLY_MAX == fastmath.TANH_POLY_MAX
    assert fit.ERF_POLY_MAX == fastmath.ERF_POLY_MAX
    assert fit.ERF_TAIL_CENTRE == fastmath.ERF_TAIL_CENTRE
    assert fit.ERF_SATURATE == fastmath.ERF_SATURATE
    for table, problem in fit.fit_problems().items():
        derived, derived_error = fit.fit(problem)
        prefix = fit.CONSTANT_PREFIXES[table]
        module = [float(getattr(fastmath, f"{prefix}{k}")) for k in range(problem.count)]
        assert not hasattr(fastmath, f"{prefix}{problem.count}"), f"{table}: extra coefficient"
        assert problem.error(module) <= derived_error * 1.05 + 0.005, table
        np.testing.assert_allclose(module, derived, rtol=1e-3, err_msg=table)
