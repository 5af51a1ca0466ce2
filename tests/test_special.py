"""``fusegrad.special`` against PyTorch (values and gradients to 1e-10 relative in float64, 1e-5
in float32), against high-precision references where PyTorch is less accurate than scipy,
gradcheck / gradgradcheck of every differentiable function over wide ranges, PyTorch's
differentiability limits and errors, and compiled code against eager.

The op table (``tests/ops/op_table_special.py``) covers shapes, broadcasting, 0-d, empty and
non-contiguous inputs, forward AD and the float32 backward.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.special as S
from fusegrad.autograd import gradcheck, gradgradcheck

RNG = np.random.default_rng(29)


def _points(lo: float, hi: float, n: int = 400) -> np.ndarray:
    """Uniform points and, where the range allows, log-spaced ones of both signs."""
    x = [RNG.uniform(lo, hi, n)]
    if hi > 1:
        x.append(np.geomspace(1e-6, hi, n // 4))
    if lo < -1:
        x.append(-np.geomspace(1e-6, -lo, n // 4))
    x = np.concatenate(x)
    return x[(x >= lo) & (x <= hi)]


# unary functions: (name, domain) -- the values compared with PyTorch, the gradients too where
# the function is differentiable
UNARY = [
    ("i0", (-50, 50)),
    ("i0e", (-300, 300)),
    ("i1", (-50, 50)),
    ("i1e", (-300, 300)),
    ("erfcx", (-25, 1e4)),
    ("ndtri", (0, 1)),
    ("log_ndtr", (-1e3, 40)),
    ("ndtr", (-4, 40)),
    ("entr", (-1, 100)),
    ("expit", (-40, 40)),
    ("exp2", (-40, 40)),
    ("expm1", (-40, 40)),
    ("log1p", (-0.99, 40)),
    ("erf", (-6, 6)),
    ("erfc", (-6, 26)),
    ("erfinv", (-1, 1)),
    ("logit", (0, 1)),
    ("digamma", (0.01, 50)),
    ("psi", (0.01, 50)),
    ("gammaln", (0.01, 50)),
    ("sinc", (-10, 10)),
    ("modified_bessel_i0", (-50, 50)),
    ("modified_bessel_i1", (-50, 50)),
    ("modified_bessel_k0", (1e-6, 600)),
    ("modified_bessel_k1", (1e-6, 600)),
    ("scaled_modified_bessel_k0", (1e-6, 1e4)),
    ("scaled_modified_bessel_k1", (1e-6, 1e4)),
    ("spherical_bessel_j0", (-50, 50)),
]
# where PyTorch's own formula is less accurate than fusegrad's, gradients are compared to an
# absolute bound: erfcx' = 2 x erfcx(x) - 2 / sqrt(pi) and expm1' = expm1(x) + 1 cancel (both
# libraries use the formula), PyTorch's trigamma (digamma's derivative) is 5e-10 off for x > 0
# and its sinc' loses digits near 0 (fusegrad's agree with mpmath: test_special_functions.py)
GRADIENT_ATOL = {"erfcx": 1e-15, "expm1": 1e-15, "digamma": 2e-9, "psi": 2e-9, "sinc": 1e-9}
DIFFERENTIABLE = {
    "i0",
    "i0e",
    "i1",
    "i1e",
    "erfcx",
    "ndtri",
    "log_ndtr",
    "ndtr",
    "entr",
    "expit",
    "exp2",
    "expm1",
    "log1p",
    "erf",
    "erfc",
    "erfinv",
    "logit",
    "digamma",
    "psi",
    "gammaln",
    "sinc",
}


def test_every_torch_special_function_exists() -> None:
    names = set(S.__all__)
    assert len(names) == 56
    for name in names:
        assert callable(getattr(S, name)), name
    torch = pytest.importorskip("torch")
    theirs = {
        n
        for n in dir(torch.special)
        if not n.startswith("_") and callable(getattr(torch.special, n))
    } - {"Tensor"}
    assert theirs <= names, sorted(theirs - names)


@pytest.mark.parametrize("name,domain", UNARY, ids=[u[0] for u in UNARY])
def test_unary_matches_torch_float64(name: str, domain: tuple) -> None:
    torch = pytest.importorskip("torch")
    x = _points(*domain)
    ours = fg.tensor(x, requires_grad=name in DIFFERENTIABLE)
    theirs = torch.tensor(x, requires_grad=name in DIFFERENTIABLE)
    out = getattr(S, name)(ours)
    want = getattr(torch.special, name)(theirs)
    assert out.requires_grad == want.requires_grad
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-10, atol=0)
    if name in DIFFERENTIABLE:
        g = RNG.uniform(0.5, 1.5, x.shape)
        (gx,) = fg.autograd.grad(out, ours, fg.tensor(g))
        (tx,) = torch.autograd.grad(want, theirs, torch.tensor(g))
        atol = GRADIENT_ATOL.get(name, 1e-300)
        np.testing.assert_allclose(gx.numpy(), tx.numpy(), rtol=1e-10, atol=atol)


def test_ndtr_is_accurate_in_the_left_tail() -> None:
    """PyTorch computes ndtr as (1 + erf(x / sqrt 2)) / 2, which loses the left tail (0 below
    -8.3); fusegrad goes through erfc there, as scipy does."""
    mpmath = pytest.importorskip("mpmath")
    x = -np.geomspace(1.0, 37.0, 60)
    got = S.ndtr(fg.tensor(x)).numpy()
    want = np.array([float(mpmath.ncdf(mpmath.mpf(float(v)))) for v in x])
    # (the condition number of ndtr at x is about x^2: 1e-13 of rounding at -35)
    np.testing.assert_allclose(got, want, rtol=5e-13)


@pytest.mark.parametrize("name,domain", UNARY, ids=[u[0] for u in UNARY])
def test_unary_matches_torch_float32(name: str, domain: tuple) -> None:
    torch = pytest.importorskip("torch")
    x = _points(*domain).astype(np.float32)
    x = x[(x > domain[0]) & (x < domain[1])]  # (rounding to float32 may reach the ends)
    got = getattr(S, name)(fg.tensor(x)).numpy()
    want = getattr(torch.special, name)(torch.tensor(x)).numpy()
    assert got.dtype == np.float32
    # both round float32 results, each in its own way: a few float32 ulp apart, and where a
    # function crosses zero (digamma, log1p near 0) the absolute difference is what is small
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "airy_ai"])
def test_bessel_and_airy_are_accurate(name: str) -> None:
    """Against mpmath: PyTorch 2.13's own ports are off by up to 1e-6 here (fusegrad uses
    scipy's, which are accurate to rounding), so they are compared with PyTorch loosely."""
    mpmath = pytest.importorskip("mpmath")
    reference = {
        "bessel_j0": lambda v: mpmath.besselj(0, v),
        "bessel_j1": lambda v: mpmath.besselj(1, v),
        "bessel_y0": lambda v: mpmath.bessely(0, v),
        "bessel_y1": lambda v: mpmath.bessely(1, v),
        "airy_ai": mpmath.airyai,
    }[name]
    lo = 0.01 if name.startswith("bessel_y") else -30.0
    x = RNG.uniform(lo, 30.0, 200)
    got = getattr(S, name)(fg.tensor(x)).numpy()
    want = np.array([float(reference(mpmath.mpf(float(v)))) for v in x])
    # near the zeros of these oscillating functions the bound is on the absolute error
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert not getattr(S, name)(fg.tensor(x, requires_grad=True)).requires_grad
    torch = pytest.importorskip("torch")
    theirs = getattr(torch.special, name)(torch.tensor(x)).numpy()
    np.testing.assert_allclose(got, theirs, rtol=0, atol=5e-6)


def test_binary_functions_match_torch() -> None:
    torch = pytest.importorskip("torch")
    a = RNG.uniform(0.05, 40.0, 300)
    x = RNG.uniform(0.0, 60.0, 300)
    for name in ("gammainc", "gammaincc"):
        xa = fg.tensor(x, requires_grad=True)
        ta = torch.tensor(x, requires_grad=True)
        out = getattr(S, name)(fg.tensor(a), xa)
        want = getattr(torch.special, name)(torch.tensor(a), ta)
        # PyTorch and scipy evaluate P(a, x) by different series near a = x (to 2e-9)
        np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=5e-9)
        (g,) = fg.autograd.grad(out.sum(), xa)
        (tg,) = torch.autograd.grad(want.sum(), ta)
        np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-10, atol=1e-300)
    s = RNG.uniform(1.01, 12.0, 300)
    q = RNG.uniform(0.05, 20.0, 300)
    qa = fg.tensor(q, requires_grad=True)
    tq = torch.tensor(q, requires_grad=True)
    out = S.zeta(fg.tensor(s), qa)
    want = torch.special.zeta(torch.tensor(s), tq)
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-10)
    (g,) = fg.autograd.grad(out.sum(), qa)
    (tg,) = torch.autograd.grad(want.sum(), tq)
    np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-10)
    y = RNG.uniform(-0.99, 10.0, 300)
    u, v = RNG.uniform(-3, 3, 300), y
    for name in ("xlogy", "xlog1py"):
        fu, fv = fg.tensor(u, requires_grad=True), fg.tensor(np.abs(v), requires_grad=True)
        tu, tv = torch.tensor(u, requires_grad=True), torch.tensor(np.abs(v), requires_grad=True)
        out, want = getattr(S, name)(fu, fv), getattr(torch.special, name)(tu, tv)
        np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-10)
        got_grads = fg.autograd.grad(out.sum(), (fu, fv))
        want_grads = torch.autograd.grad(want.sum(), (tu, tv))
        for gg, tg in zip(got_grads, want_grads):
            np.testing.assert_allclose(gg.numpy(), tg.numpy(), rtol=1e-10)
    for n in (0, 1, 2, 3, 6):
        xs = RNG.uniform(-20, 20, 200)
        xs = xs[np.abs(xs - np.round(xs)) > 1e-3]
        out = S.polygamma(n, fg.tensor(xs)).numpy()
        want = torch.special.polygamma(n, torch.tensor(xs)).numpy()
        rtol = 1e-8 if n == 1 else 1e-10  # (trigamma: PyTorch's reflection loses digits for x < 0)
        np.testing.assert_allclose(out, want, rtol=rtol)
    m = RNG.uniform(2.0, 10.0, 50)
    np.testing.assert_allclose(
        S.multigammaln(fg.tensor(m), 3).numpy(),
        torch.special.multigammaln(torch.tensor(m), 3).numpy(),
        rtol=1e-10,
    )


POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomials_match_torch(name: str) -> None:
    """Same algorithm as PyTorch (recurrence, or the trigonometric form for large degrees), so
    the values agree to rounding also near the zeros; degrees are truncated, negative ones give
    0; tensors of degrees broadcast; the result never requires grad."""
    torch = pytest.importorskip("torch")
    x = np.concatenate([RNG.uniform(-1.5, 1.5, 300), [-1.0, 0.0, 1.0, 0.5, np.inf, -np.inf]])
    for n in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17, 40, -1, 3.7]:
        got = getattr(S, name)(fg.tensor(x), n).numpy()
        want = getattr(torch.special, name)(torch.tensor(x), n).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=f"n = {n}")
    degrees = RNG.integers(0, 12, x.size).astype(np.float64)
    got = getattr(S, name)(fg.tensor(x, requires_grad=True), fg.tensor(degrees))
    want = getattr(torch.special, name)(torch.tensor(x), torch.tensor(degrees))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-10)
    assert not got.requires_grad
    # float32 (computed in float64 here, in float32 by PyTorch) and integer promotion
    x32 = RNG.uniform(-1, 1, 100).astype(np.float32)
    got = getattr(S, name)(fg.tensor(x32), 5).numpy()
    want = getattr(torch.special, name)(torch.tensor(x32), 5).numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
    assert getattr(S, name)(fg.tensor([1, 2]), 2).dtype == fg.float32


@pytest.mark.parametrize("name", sorted(DIFFERENTIABLE - {"psi"}))
def test_gradcheck_and_gradgradcheck(name: str) -> None:
    domain = dict(UNARY)[name]
    lo, hi = max(domain[0], -8.0), min(domain[1], 8.0)
    if name in ("ndtri", "logit", "erfinv"):
        lo, hi = lo + 0.05, hi - 0.05
    if name in ("entr", "digamma", "gammaln", "log1p"):
        lo = max(lo, 0.1)
    x = fg.tensor(RNG.uniform(lo, hi, 12), requires_grad=True)
    fn = getattr(S, name)
    assert gradcheck(fn, (x,))
    assert gradgradcheck(fn, (x,))


def test_gradcheck_of_the_binary_and_order_functions() -> None:
    a = fg.tensor(RNG.uniform(0.5, 4, 6))
    x = fg.tensor(RNG.uniform(0.2, 5, 6), requires_grad=True)
    for fn in (S.gammainc, S.gammaincc):
        assert gradcheck(lambda v, fn=fn: fn(a, v), (x,))
        assert gradgradcheck(lambda v, fn=fn: fn(a, v), (x,))
    s = fg.tensor(RNG.uniform(1.5, 4, 6))
    assert gradcheck(lambda q: S.zeta(s, q), (x,))
    assert gradgradcheck(lambda q: S.zeta(s, q), (x,))
    for n in (2, 3):
        assert gradcheck(lambda v, n=n: S.polygamma(n, v), (x,))
        assert gradgradcheck(lambda v, n=n: S.polygamma(n, v), (x,))
    y = fg.tensor(RNG.uniform(-0.5, 3, 6), requires_grad=True)
    assert gradcheck(S.xlog1py, (x, y))
    assert gradgradcheck(S.xlog1py, (x, y))
    assert gradcheck(lambda v: S.multigammaln(v + 2.0, 4), (x,))


def test_differentiability_limits_and_errors_are_pytorch_s() -> None:
    a = fg.tensor([1.0, 2.0], requires_grad=True)
    x = fg.tensor([0.5, 1.5], requires_grad=True)
    out = S.gammainc(a, x)
    with pytest.raises(RuntimeError, match="the derivative for 'igamma: input' is not implemented"):
        out.sum().backward()
    assert a.grad is None and x.grad is None  # nothing was written
    with pytest.raises(RuntimeError, match="igammac: input"):
        S.gammaincc(a, x).sum().backward()
    with pytest.raises(RuntimeError, match="the derivative for 'zeta' is not implemented"):
        S.zeta(a + 1.0, x).sum().backward()
    with pytest.raises(TypeError, match="must be Tensor, not int"):
        S.gammainc(a, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be Tensor, not float"):
        S.gammainc(1.5, x)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating-point"):
        S.gammainc(fg.tensor([1, 2]), fg.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="broadcast"):
        S.zeta(fg.tensor([2.0, 3.0]), fg.tensor([1.0, 2.0, 3.0]))
    # top-level and method spellings (PyTorch's torch.igamma, Tensor.igammac_, torch.i0)
    np.testing.assert_array_equal(fg.igamma(a, x).detach().numpy(), out.detach().numpy())
    y = a.detach().clone()
    y.igammac_(x.detach())
    np.testing.assert_allclose(y.numpy(), 1.0 - out.detach().numpy(), rtol=1e-6)
    np.testing.assert_array_equal(fg.i0(x).detach().numpy(), x.i0().detach().numpy())


def test_special_values_follow_pytorch() -> None:
    inf, nan = math.inf, math.nan
    np.testing.assert_array_equal(
        S.entr(fg.tensor([-1.0, 0.0, 1.0, inf, nan])).numpy(), [-inf, 0.0, -0.0, -inf, nan]
    )
    np.testing.assert_array_equal(
        S.ndtri(fg.tensor([0.0, 1.0, -0.1, 1.1, 0.5])).numpy(), [-inf, inf, nan, nan, 0.0]
    )
    np.testing.assert_array_equal(S.polygamma(2, fg.tensor([inf, 0.0])).numpy(), [nan, -inf])
    np.testing.assert_array_equal(S.spherical_bessel_j0(fg.tensor([inf, -inf, 0.0])), [0, 0, 1])
    np.testing.assert_array_equal(
        S.zeta(fg.tensor([1.0, 2.0]), fg.tensor([1.0, 0.0])).numpy(), [inf, inf]
    )
    # gradients at the limits: entr's is +inf at 0; i1's and i1e's 1/2 at 0
    x = fg.tensor([0.0, 2.0], requires_grad=True)
    (g,) = fg.autograd.grad(S.entr(x).sum(), x)
    assert g[0].item() == inf
    for fn in (S.i1, S.i1e):
        (g,) = fg.autograd.grad(fn(x).sum(), x)
        assert g[0].item() == 0.5


def test_forward_ad_matches_reverse_mode() -> None:
    import fusegrad.autograd.forward_ad as fwAD

    x = RNG.uniform(0.2, 0.8, 5)
    t = RNG.uniform(-1, 1, 5)
    for fn in (S.i0, S.i0e, S.i1, S.i1e, S.erfcx, S.ndtri, S.log_ndtr, S.ndtr, S.entr):
        with fwAD.dual_level():
            dual = fwAD.make_dual(fg.tensor(x), fg.tensor(t))
            tangent = fwAD.unpack_dual(fn(dual)).tangent.numpy()
        leaf = fg.tensor(x, requires_grad=True)
        (g,) = fg.autograd.grad(fn(leaf).sum(), leaf)
        np.testing.assert_allclose(tangent, g.numpy() * t, rtol=1e-12, err_msg=fn.__name__)


def test_compiled_matches_eager() -> None:
    """Fused special functions (entr, ndtr, polynomials: scalar lowerings) and the ones
    computed by their scipy kernel between fused loops (i0e, log_ndtr) in one compiled step."""

    def step(x: fg.Tensor, n: fg.Tensor) -> tuple:
        y = S.entr(x) + S.ndtr(x) * S.i0e(x) - S.log_ndtr(x).exp()
        z = S.chebyshev_polynomial_t(x, n) + S.hermite_polynomial_he(x, 4)
        loss = (y * y).sum() + z.sum()
        (g,) = fg.autograd.grad(loss, x)
        return loss, g

    x = fg.tensor(RNG.uniform(0.1, 0.9, 64), requires_grad=True)
    n = fg.tensor(RNG.integers(0, 9, 64).astype(np.float64))
    eager = step(x, n)
    compiled = fg.compile(step)
    for _ in range(2):  # the recorded call, then the compiled program
        got = compiled(x, n)
        for a, b in zip(got, eager):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-12)
