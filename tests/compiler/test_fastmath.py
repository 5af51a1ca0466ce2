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
saturation points, 0, 1), and special values.  Besides the ulp bound, NaN must map to NaN,
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

# Points around which every float32 (+-WINDOW bit patterns) is tested, per helper.
CRITICAL_POINTS: dict[str, list[float]] = {
    "exp": [0.0, -0.0, 0.34657, -0.34657, 88.72283935546875, -87.33654, -103.97208, 1.0],
    "expm1": [0.0, -0.0, 0.34657, -0.34657, 88.72283935546875, 88.38, -17.3287, 1e-4],
    "log": [1.0, 0.70710677, 1.4142135, FLT_MIN, 0.0, FLT_MAX, 2.0, 0.5],
    "log1p": [0.0, -0.0, -1.0, -0.29289323, 0.41421357, 1e-7, -1e-7, 2**24],
    "tanh": [0.0, -0.0, fastmath.TANH_POLY_MAX, -fastmath.TANH_POLY_MAX, 9.01, -9.01, 1e-4],
    "sigmoid": [0.0, -0.0, -87.33654, -103.27893, 16.635532, -16.635532, 88.72283935546875],
    "erf": [0.0, -0.0, fastmath.ERF_POLY_MAX, -fastmath.ERF_POLY_MAX, 3.9192, -3.9192, 4.0],
    "sin": [0.0, -0.0, math.pi / 4, math.pi / 2, math.pi, 3 * math.pi / 4, 1e4 * math.pi, 1e5],
    "cos": [0.0, -0.0, math.pi / 4, math.pi / 2, math.pi, 3 * math.pi / 4, 1e4 * math.pi, 1e5],
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
    """Assert classes match; return the max ulp error (sin/cos: inside their accurate range)."""
    ref = reference(name, x)
    if name in ("sin", "cos"):
        beyond = np.abs(x) > fastmath.SINCOS_ACCURATE_MAX
        got, ref, x = got[~beyond], ref[~beyond], x[~beyond]
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
        ("sin", np.inf, np.nan), ("sin", -0.0, -0.0), ("sin", DENORMAL_MIN, DENORMAL_MIN),
        ("cos", np.inf, np.nan), ("cos", -np.inf, np.nan), ("cos", -0.0, 1.0),
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


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sincos_beyond_accurate_range_is_bounded(
    name: str, loops: dict[str, Callable[..., Any]]
) -> None:
    """Beyond SINCOS_ACCURATE_MAX the result is not accurate, but finite and in [-1, 1]."""
    lo = int(np.array(fastmath.SINCOS_ACCURATE_MAX, dtype=np.float32).view(np.uint32)) + 1
    hi = int(np.array(FLT_MAX, dtype=np.float32).view(np.uint32))
    bits = np.arange(lo, hi + 1, 101, dtype=np.uint32)
    x = np.concatenate([bits.view(np.float32), -bits.view(np.float32)])
    got = _apply(loops[name], x)
    assert np.all(np.isfinite(got)) and np.all(np.abs(got) <= 1.0)


@pytest.mark.xfail(
    strict=True,
    reason="fuzz seed 301187: float32 sin/cos beyond SINCOS_ACCURATE_MAX are not numpy's, so "
    "compiled cos(1e30) (-0.61 in numpy) moves amin's argmin and its gradient; needs an exact "
    "reduction there (Payne-Hanek) or libm for those lanes",
)
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sincos_beyond_accurate_range_match_numpy(
    name: str, loops: dict[str, Callable[..., Any]]
) -> None:
    """Compiled code must give eager's values: float32 inputs beyond SINCOS_ACCURATE_MAX are
    whole numbers, but still inputs a program can meet (a 1e30 in the fuzz's data)."""
    x = np.array([1e30, -3e12, 2.5e9, FLT_MAX], dtype=np.float32)
    want = getattr(np, name)(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(_apply(loops[name], x), want, rtol=1e-6, atol=1e-7)


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
