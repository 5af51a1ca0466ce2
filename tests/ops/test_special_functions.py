"""The special functions added with their records (lgamma, digamma, polygamma(1, x), erfc,
atan2, hypot, logaddexp): accuracy against high-precision references, float32 against PyTorch,
and the limits of their differentiability.  Values, gradients and special values against numpy
and PyTorch are the op table's (``op_table.py``); compiled against eager is
``tests/compiler/test_lowering.py``'s."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg

mpmath = pytest.importorskip("mpmath")  # installed with torch (through sympy)
mpmath.mp.prec = 120

# (function, high-precision reference, ranges, max error in ulp of the value, in ulp of 1)
ACCURACY = [
    (fg.lgamma, lambda v: mpmath.loggamma(v).real, [(1e-3, 50.0), (-20.0, -0.01)], 4, 4),
    (fg.digamma, mpmath.digamma, [(1e-3, 1.2), (2.0, 1e6), (-50.0, -0.01)], 16, 8),
    (lambda x: fg.polygamma(1, x), lambda v: mpmath.polygamma(1, v), [(1e-3, 1e6)], 4, 0),
    (lambda x: fg.polygamma(1, x), lambda v: mpmath.polygamma(1, v), [(-50.0, -0.01)], 8, 0),
    (fg.erfc, mpmath.erfc, [(-6.0, 26.0)], 4, 0),
]


@pytest.mark.parametrize("case", range(len(ACCURACY)))
def test_float64_is_accurate_to_a_few_ulp(case: int) -> None:
    """Relative error in ulp, except where the function crosses zero (digamma near 1.46, lgamma
    near 1 and 2), where the bound is on the absolute error, in ulp of 1."""
    fn, ref, ranges, ulps, ulps_of_one = ACCURACY[case]
    rng = np.random.default_rng(case)
    for lo, hi in ranges:
        x = rng.uniform(lo, hi, 300)
        if lo > 0:  # and every decade
            x = np.concatenate([x, np.geomspace(lo, hi, 50)])
        x = x[(x >= lo) & (x <= hi) & (x != np.round(x))]
        got = fn(fg.tensor(x, dtype=fg.float64)).numpy()
        want = np.array([float(ref(mpmath.mpf(float(v)))) for v in x])
        error = np.abs(got - want)
        allowed = np.maximum(ulps * np.spacing(np.abs(want)), ulps_of_one * np.spacing(1.0))
        worst = int(np.argmax(error / allowed))
        assert np.all(error <= allowed), (x[worst], got[worst], want[worst])


def test_float32_agrees_with_torch_to_rounding() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(0.05, 30, 200), rng.uniform(-8, -0.05, 200)])
    x = x.astype(np.float32)
    y = rng.uniform(-5, 5, x.size).astype(np.float32)
    positive = x > 0
    pairs = [
        (fg.lgamma, torch.lgamma, x),
        (fg.digamma, torch.digamma, x),
        # PyTorch's float32 trigamma of negative x is off by up to 5% (sin(pi x) of an
        # unreduced float32 pi x): compared for positive x only
        (lambda t: fg.polygamma(1, t), lambda t: torch.polygamma(1, t), x[positive]),
        (fg.erfc, torch.erfc, x),
    ]
    for ours, theirs, points in pairs:
        got = ours(fg.tensor(points)).numpy()
        want = theirs(torch.tensor(points)).numpy()
        # PyTorch computes these in float32 arithmetic (a few float32 ulp), fusegrad in float64
        # rounded once; near a zero of the function the absolute difference is what is small
        np.testing.assert_allclose(got, want, rtol=4e-6, atol=2e-6)
    for ours, theirs in [(fg.atan2, torch.atan2), (fg.hypot, torch.hypot)]:
        got = ours(fg.tensor(x), fg.tensor(y)).numpy()
        want = theirs(torch.tensor(x), torch.tensor(y)).numpy()
        np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)
    got = fg.logaddexp(fg.tensor(x), fg.tensor(y)).numpy()
    want = torch.logaddexp(torch.tensor(x), torch.tensor(y)).numpy()
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=3e-7)


def test_lgamma_is_the_c_library_function() -> None:
    """Eager lgamma calls the C library's (what compiled code calls), not CPython's own
    ``math.lgamma``, which is up to 1e-11 off (relative) near the zeros at 1 and 2."""
    x = np.array([1.0 + 1e-9, 2.0 - 3e-10, 0.999, 1.9999, 2.5])
    got = fg.lgamma(fg.tensor(x, dtype=fg.float64)).numpy()
    want = np.array([float(mpmath.loggamma(mpmath.mpf(v)).real) for v in x])
    np.testing.assert_array_less(np.abs(got - want), 3 * np.spacing(np.abs(want)))


def test_digamma_is_differentiable_to_any_order() -> None:
    """Its derivatives are polygamma(1, x), polygamma(2, x), ... (as in PyTorch)."""
    x = fg.tensor([0.5, 2.0], dtype=fg.float64, requires_grad=True)
    (g,) = fg.autograd.grad(fg.digamma(x).sum(), x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), [math.pi**2 / 2, math.pi**2 / 6 - 1])
    (h,) = fg.autograd.grad(g.sum(), x, create_graph=True)
    want = [float(mpmath.polygamma(2, v)) for v in (0.5, 2.0)]
    np.testing.assert_allclose(h.detach().numpy(), want, rtol=1e-13)
    (k,) = fg.autograd.grad(h.sum(), x)
    want = [float(mpmath.polygamma(3, v)) for v in (0.5, 2.0)]
    np.testing.assert_allclose(k.numpy(), want, rtol=1e-13)
    # lgamma's second derivative is polygamma(1, x)
    (g,) = fg.autograd.grad(fg.lgamma(x).sum(), x, create_graph=True)
    (h,) = fg.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(h.numpy(), fg.polygamma(1, x).detach().numpy())


def test_polygamma_orders() -> None:
    x = fg.tensor([0.5, 3.0], dtype=fg.float64)
    np.testing.assert_array_equal(fg.polygamma(0, x).numpy(), fg.digamma(x).numpy())
    np.testing.assert_array_equal(x.polygamma(1).numpy(), fg.polygamma(1, x).numpy())
    y = x * 1.0
    y.polygamma_(1)
    np.testing.assert_array_equal(y.numpy(), fg.polygamma(1, x).numpy())
    with pytest.raises(ValueError, match="does not support negative n"):
        fg.polygamma(-1, x)
    want = [float(mpmath.polygamma(2, v)) for v in (0.5, 3.0)]
    np.testing.assert_allclose(fg.polygamma(2, x).numpy(), want, rtol=1e-13)
    with pytest.raises(TypeError, match="must be int"):
        fg.polygamma(1.0, x)  # type: ignore[arg-type]
