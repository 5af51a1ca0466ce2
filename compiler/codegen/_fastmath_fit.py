"""Derive the polynomial coefficients used by ``fastmath.py`` (a developer tool, not a runtime
module; nothing imports it).

Run ``python -m fusegrad.compiler.codegen._fastmath_fit`` (needs ``mpmath``) to print every
coefficient of ``fastmath.py`` as the constant definition found there, each table with the
approximation error of its fit, measured on the fitting grid in units of 2**-24 relative (half an
ulp at the bottom of a binade).  ``tests/compiler/test_fastmath.py`` checks that the module's
constants are the ones this derives.

Method: a weighted minimax fit by Lawson's algorithm (iteratively reweighted least squares, which
converges to the Chebyshev/minimax solution on a discrete grid) over 1,000 Chebyshev-distributed
points, with reference values from mpmath at 40 digits.  Float32 tables are then rounded one
coefficient at a time, lowest order first, refitting the remaining ones after each rounding, so
that later coefficients absorb the rounding error of earlier ones (a cheap stand-in for the
lattice-reduction rounding of Brisebarre and Chevillard).  The error measured here is that of the
polynomial only; rounding during evaluation is measured by ``tests/compiler/test_fastmath.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

_HALF_ULP = 2.0**-24


def _chebyshev_grid(lo: float, hi: float, n: int = 1000) -> np.ndarray:
    """``n`` Chebyshev points on ``[lo, hi]``: dense near the ends, where minimax errors peak."""
    t = np.cos(np.pi * (np.arange(n) + 0.5) / n)
    return np.sort((lo + hi) / 2 + (hi - lo) / 2 * t)


def _lawson(
    design: np.ndarray, target: np.ndarray, scale: np.ndarray, iterations: int = 100
) -> np.ndarray:
    """Coefficients ``c`` minimising ``max |(design @ c - target) / scale|`` (Lawson's IRLS)."""
    a = design / scale[:, None]
    b = target / scale
    weights = np.full(b.shape, 1.0 / b.size)
    coef = np.zeros(a.shape[1])
    for _ in range(iterations):
        root = np.sqrt(weights)
        coef = np.linalg.lstsq(a * root[:, None], b * root, rcond=None)[0]
        error = np.abs(a @ coef - b)
        weights = weights * error
        weights /= weights.sum()
    return coef


@dataclass(frozen=True, slots=True)
class FitProblem:
    """Approximate ``target`` by ``sum_k c_k * xs**(step*k)`` (k < ``count``) with the error
    weighted by ``1/scale``; ``float32``: the coefficients are to be rounded to float32."""

    xs: np.ndarray
    target: np.ndarray
    scale: np.ndarray
    step: int
    count: int
    float32: bool

    def columns(self) -> np.ndarray:
        return np.stack([self.xs ** (self.step * k) for k in range(self.count)], axis=1)

    def error(self, coefficients: list[float]) -> float:
        """Weighted max error of ``coefficients`` on the grid, in units of ``2**-24``."""
        values = self.columns() @ np.array(coefficients, dtype=np.float64)
        return float(np.max(np.abs((values - self.target) / self.scale)) / _HALF_ULP)


def fit(problem: FitProblem) -> tuple[list[float], float]:
    """Minimax coefficients of ``problem`` (rounded to float32 one at a time when asked) and
    their weighted max error in units of ``2**-24``."""
    columns = problem.columns()
    fixed: list[float] = []
    for k in range(problem.count if problem.float32 else 1):
        rest = problem.target - columns[:, :k] @ np.array(fixed, dtype=np.float64).reshape(k)
        coef = _lawson(columns[:, k:], rest, problem.scale)
        if not problem.float32:
            fixed = coef.tolist()
            break
        fixed.append(float(np.float32(coef[0])))
    return fixed, problem.error(fixed)


def fit_problems() -> dict[str, FitProblem]:
    """Every table of ``fastmath.py`` as a fitting problem; needs mpmath (40-digit references)."""
    import mpmath  # type: ignore[import-untyped]  # (a development tool's own dependency)

    mp: Any = mpmath  # untyped: arithmetic on mpf values is not checked
    mp.mp.dps = 40

    def ref(fn: Callable[[Any], Any], xs: np.ndarray) -> np.ndarray:
        return np.array([float(fn(mp.mpf(float(x)))) for x in xs])

    out: dict[str, FitProblem] = {}
    ln2_half = float(mp.log(2) / 2) * 1.002  # margin: the reduced argument can overshoot a bit

    # exp(r) = 1 + r + r**2 * P(r) on |r| <= ln(2)/2 (after Cody-Waite reduction by ln 2)
    xs = _chebyshev_grid(-ln2_half, ln2_half)
    xs = xs[xs != 0]
    target = ref(lambda r: (mp.exp(r) - 1 - r) / r**2, xs)
    out["exp"] = FitProblem(xs, target, ref(mp.exp, xs) / xs**2, 1, 5, True)

    # expm1(r) = r + r**2 * Q(r) on the same interval, error relative to expm1(r)
    target = ref(lambda r: (mp.expm1(r) - r) / r**2, xs)
    out["expm1"] = FitProblem(xs, target, ref(mp.expm1, xs) / xs**2, 1, 6, True)

    # log1p(f) = f - f**2/2 + f**3 * L(f) on f in [sqrt(1/2) - 1, sqrt(2) - 1]
    xs = _chebyshev_grid(float(mp.sqrt(0.5) - 1) * 1.001, float(mp.sqrt(2) - 1) * 1.001)
    xs = xs[xs != 0]
    target = ref(lambda f: (mp.log1p(f) - f + f**2 / 2) / f**3, xs)
    out["log"] = FitProblem(xs, target, ref(mp.log1p, xs) / xs**3, 1, 8, True)

    # tanh(x) = x + x**3 * T(x**2) on [0, TANH_POLY_MAX]
    xs = _chebyshev_grid(0.0, TANH_POLY_MAX)[1:]
    target = ref(lambda x: (mp.tanh(x) - x) / x**3, xs)
    out["tanh"] = FitProblem(xs, target, ref(mp.tanh, xs) / xs**3, 2, 6, True)

    # erf(x) = x + x * E(x**2) on [0, ERF_POLY_MAX]: the leading 2/sqrt(pi) - 1 is stored, not
    # 2/sqrt(pi), whose float32 rounding alone would cost 0.9 x 2**-24 near 0
    xs = _chebyshev_grid(0.0, ERF_POLY_MAX)[1:]
    target = ref(lambda x: mp.erf(x) / x - 1, xs)
    out["erf_small"] = FitProblem(xs, target, ref(lambda x: mp.erf(x) / x, xs), 2, 7, True)

    # erf(x) = 1 - exp(H(x - ERF_TAIL_CENTRE)) on [ERF_POLY_MAX, ERF_SATURATE]: H = log(erfc).
    # An absolute error d in H is a relative error d in erfc, i.e. d * erfc/erf in erf.
    xs = _chebyshev_grid(ERF_POLY_MAX * 0.999, ERF_SATURATE)
    target = ref(lambda x: mp.log(mp.erfc(x)), xs)
    scale = ref(lambda x: mp.erf(x) / mp.erfc(x), xs)
    out["erf_tail"] = FitProblem(xs - ERF_TAIL_CENTRE, target, scale, 1, 8, True)

    # sin(r) = r * (1 + r**2 * S(r**2)), cos(r) = 1 - r**2/2 + r**4 * C(r**2) on |r| <= pi/4,
    # evaluated in float64 (coefficients not rounded to float32)
    xs = _chebyshev_grid(0.0, float(mp.pi / 4) * 1.002)[1:]
    target = ref(lambda r: (mp.sin(r) / r - 1) / r**2, xs)
    out["sin"] = FitProblem(xs, target, ref(mp.sin, xs) / xs**3, 2, 4, False)
    target = ref(lambda r: (mp.cos(r) - 1 + r**2 / 2) / r**4, xs)
    out["cos"] = FitProblem(xs, target, ref(mp.cos, xs) / xs**4, 2, 4, False)
    return out


# Interval ends shared with fastmath.py (the test checks that they agree).
TANH_POLY_MAX = 0.625
ERF_POLY_MAX = 1.0
ERF_TAIL_CENTRE = 2.0
ERF_SATURATE = 4.0


# table -> prefix of its constants in fastmath.py (_EXP_P0, _EXP_P1, ...)
CONSTANT_PREFIXES = {
    "exp": "_EXP_P",
    "expm1": "_EXPM1_Q",
    "log": "_LOG_L",
    "tanh": "_TANH_T",
    "erf_small": "_ERF_E",
    "erf_tail": "_ERF_H",
    "sin": "_SIN_S",
    "cos": "_COS_C",
}


def coefficient_tables() -> dict[str, tuple[list[float], float]]:
    """Table name -> (coefficients, max polynomial error in units of 2**-24); needs mpmath."""
    return {name: fit(problem) for name, problem in fit_problems().items()}


def main() -> None:
    for name, (coefs, error) in coefficient_tables().items():
        prefix = CONSTANT_PREFIXES[name]
        float32 = name not in ("sin", "cos")
        print(f"# {name}: max polynomial error {error:.4f} x 2**-24 relative")
        for k, c in enumerate(coefs):
            print(f"{prefix}{k} = _f32({c!r})" if float32 else f"{prefix}{k} = {c!r}")


if __name__ == "__main__":
    main()
