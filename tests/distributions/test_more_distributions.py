"""The distributions added after the first set (issue 29's leftovers): ContinuousBernoulli,
FisherSnedecor, GeneralizedPareto, InverseGamma, Kumaraswamy, LKJCholesky, LogisticNormal,
NegativeBinomial, Pareto, VonMises, Weibull and Wishart.

Values and gradients against ``torch.distributions`` in float64 (skipped without PyTorch) and
against ``scipy.stats`` (always); sample moments; ``rsample`` gradients by gradcheck (the draws
made again from the same seed) or, through Gamma's implicit reparameterisation, against the
derivative of the known mean; shapes, ``expand``, argument validation and the new KL pairs."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import special, stats

import fusegrad as fg
from fusegrad import distributions as D

RNG = np.random.default_rng(29)
A, B = np.array([0.5, 2.0, 3.5]), np.array([1.5, 0.7, 5.0])
POS = np.array([0.3, 1.0, 2.0])
UNIT = np.array([0.3, 0.5, 0.9])
CB_PROBS = np.array([0.2, 0.4995, 0.8])  # (the middle one is in the Taylor region)
LOW_RANK = RNG.normal(size=(2, 3, 3))
COV = LOW_RANK @ LOW_RANK.transpose(0, 2, 1) + np.eye(3)
WISHART_VALUE = (lambda m: m @ m.T + np.eye(3))(RNG.normal(size=(3, 3)))
CORR_L = np.linalg.cholesky(np.corrcoef(RNG.normal(size=(4, 10))))


def _cholesky(module, m):  # type: ignore[no-untyped-def]
    return module.linalg.cholesky(m)


# name: (constructor of (module, tensor maker) -> distribution, value, methods, tolerance)
CASES = {
    "Pareto": (
        lambda M, t, m: M.Pareto(t(A), t(B)),
        [1.0, 2.5, 4.0],
        "log_prob cdf entropy mean mode variance",
    ),
    "Pareto_icdf": (lambda M, t, m: M.Pareto(t(A), t(B)), UNIT, "icdf"),
    "Weibull": (
        lambda M, t, m: M.Weibull(t(A), t(B)),
        POS,
        "log_prob cdf entropy mean mode variance",
    ),
    "Weibull_icdf": (lambda M, t, m: M.Weibull(t(A), t(B)), UNIT, "icdf"),
    "InverseGamma": (
        lambda M, t, m: M.InverseGamma(t(B), t(A)),
        POS,
        "log_prob entropy mean mode variance",
    ),
    # (the regularised incomplete gamma function has no derivative in its first argument,
    # in PyTorch either: the concentration is a constant here)
    "InverseGamma_cdf": (lambda M, t, m: M.InverseGamma(m.tensor(B), t(A)), POS, "cdf"),
    "Kumaraswamy": (
        lambda M, t, m: M.Kumaraswamy(t(B), t(A)),
        UNIT,
        "log_prob cdf icdf entropy mean variance",
    ),
    "LogisticNormal": (
        lambda M, t, m: M.LogisticNormal(t(A), t(B)),
        [0.2, 0.3, 0.1, 0.4],
        "log_prob",
    ),
    "FisherSnedecor": (
        lambda M, t, m: M.FisherSnedecor(t(A), t([5.0, 9.0, 6.0])),
        POS,
        "log_prob mean mode variance",
    ),
    "FisherSnedecor_undefined_moments": (
        lambda M, t, m: M.FisherSnedecor(t(A), t([1.5, 3.0, 6.0])),
        POS,
        "mean variance",
    ),
    "ContinuousBernoulli": (
        lambda M, t, m: M.ContinuousBernoulli(t(CB_PROBS)),
        UNIT,
        "log_prob cdf icdf entropy mean variance",
    ),
    "ContinuousBernoulli_logits": (
        lambda M, t, m: M.ContinuousBernoulli(logits=t([-2.0, 0.001, 3.0])),
        UNIT,
        "log_prob cdf icdf entropy mean variance",
    ),
    "NegativeBinomial": (
        lambda M, t, m: M.NegativeBinomial(t([0.0, 2.5, 4.0]), t([0.3, 0.5, 0.9])),
        [0.0, 3.0, 5.0],
        "log_prob mean mode variance",
    ),
    "NegativeBinomial_logits": (
        lambda M, t, m: M.NegativeBinomial(t([1.0, 2.5, 4.0]), logits=t([0.3, -0.5, 0.9])),
        [0.0, 3.0, 5.0],
        "log_prob mean mode variance",
    ),
    "LKJCholesky": (
        lambda M, t, m: M.LKJCholesky(4, t([0.5, 2.0])),
        CORR_L,
        "log_prob",
    ),
    "Wishart_covariance": (
        lambda M, t, m: M.Wishart(t([4.5, 3.2]), covariance_matrix=t(COV)),
        WISHART_VALUE,
        "log_prob entropy mean mode variance",
    ),
    "Wishart_precision": (
        lambda M, t, m: M.Wishart(t([4.5, 3.2]), precision_matrix=t(COV)),
        WISHART_VALUE,
        "log_prob entropy mean variance",
    ),
    "Wishart_scale_tril": (
        lambda M, t, m: M.Wishart(t([4.5, 3.2]), scale_tril=_cholesky(m, t(COV))),
        WISHART_VALUE,
        "log_prob entropy mean variance",
    ),
    # (PyTorch evaluates I0 and I1 by Abramowitz and Stegun's polynomial fits, about 1e-7 off)
    "VonMises": (
        lambda M, t, m: M.VonMises(t([0.0, 1.0, -1.0]), t([0.5, 2.0, 10.0])),
        [0.3, 1.5, -0.5],
        "log_prob mean mode variance",
    ),
}
LOOSE = {"VonMises": 2e-6}
# (PyTorch writes nan into df2 before using it, so df1's gradient is nan wherever the variance
# is undefined, even with those entries left out; ours is that of the defined entries alone)
VALUES_ONLY = {"FisherSnedecor_undefined_moments"}


def _evaluate(module, dists, case: str) -> tuple:  # type: ignore[no-untyped-def]
    make, value, methods = CASES[case]
    params: list = []

    def t(a):  # type: ignore[no-untyped-def]
        leaf = module.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)
        params.append(leaf)
        return leaf

    dist = make(dists, t, module)
    v = module.tensor(np.asarray(value, dtype=np.float64))
    out = {}
    for m in methods.split():
        if m in ("log_prob", "cdf", "icdf"):
            out[m] = getattr(dist, m)(v)
        elif m == "entropy":
            out[m] = dist.entropy()
        else:
            out[m] = getattr(dist, m)
    total = sum(o[o.isfinite()].sum() for o in out.values() if o.requires_grad)
    grads = module.autograd.grad(total, params, allow_unused=True)
    return out, grads


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch(case: str) -> None:
    torch = pytest.importorskip("torch")
    ours, our_grads = _evaluate(fg, D, case)
    theirs, their_grads = _evaluate(torch, torch.distributions, case)
    rtol = LOOSE.get(case, 1e-10)
    for m in ours:
        np.testing.assert_allclose(
            ours[m].detach().numpy(), theirs[m].detach().numpy(), rtol=rtol, atol=1e-12, err_msg=m
        )
    for a, b in zip(our_grads, their_grads):
        assert (a is None) == (b is None)
        if a is not None and case not in VALUES_ONLY:
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=max(rtol, 1e-9), atol=2e-9)


def _np(t: fg.Tensor) -> np.ndarray:
    return t.detach().numpy()


def test_against_scipy() -> None:
    """The same quantities from scipy.stats, which needs no PyTorch (GeneralizedPareto only
    here: PyTorch 2.13's fails on float64 parameters)."""
    t = lambda a: fg.tensor(np.asarray(a, dtype=np.float64))  # noqa: E731
    x = t(POS)
    checks = [
        (D.Pareto(t(A), t(B)), stats.pareto(B, scale=A), t([1.0, 2.5, 4.0])),
        (D.Weibull(t(A), t(B)), stats.weibull_min(B, scale=A), x),
        (D.InverseGamma(t(B), t(A)), stats.invgamma(B, scale=A), x),
        (D.FisherSnedecor(t(A), t([5.0, 9.0, 6.0])), stats.f(A, [5.0, 9.0, 6.0]), x),
        (
            D.GeneralizedPareto(t([0.0, 1.0, -1.0]), t(A), t([0.3, 0.0, -0.2])),
            stats.genpareto([0.3, 0.0, -0.2], loc=[0.0, 1.0, -1.0], scale=A),
            t([0.3, 1.5, -0.5]),
        ),
    ]
    for dist, ref, value in checks:
        name = type(dist).__name__
        np.testing.assert_allclose(_np(dist.log_prob(value)), ref.logpdf(_np(value)), rtol=1e-10)
        np.testing.assert_allclose(_np(dist.mean), ref.mean(), rtol=1e-10, err_msg=name)
        np.testing.assert_allclose(_np(dist.variance), ref.var(), rtol=1e-9, err_msg=name)
        if name != "FisherSnedecor":  # (PyTorch's F has no cdf, icdf or entropy)
            np.testing.assert_allclose(_np(dist.cdf(value)), ref.cdf(_np(value)), rtol=1e-10)
            if name != "InverseGamma":  # (Gamma has no icdf, in PyTorch either)
                np.testing.assert_allclose(_np(dist.icdf(t(UNIT))), ref.ppf(UNIT), rtol=1e-10)
            np.testing.assert_allclose(_np(dist.entropy()), ref.entropy(), rtol=1e-9)
    vm = D.VonMises(t([0.0, 1.0, -1.0]), t([0.5, 2.0, 10.0]))
    ref = stats.vonmises([0.5, 2.0, 10.0], loc=[0.0, 1.0, -1.0])
    np.testing.assert_allclose(_np(vm.log_prob(t(UNIT))), ref.logpdf(UNIT), rtol=1e-12)
    kappa = fg.tensor([0.5, 2.0, 10.0], dtype=fg.float64, requires_grad=True)
    (g,) = fg.autograd.grad(D.VonMises(t([0.0, 1.0, -1.0]), kappa).log_prob(t(UNIT)).sum(), kappa)
    k = np.array([0.5, 2.0, 10.0])
    want = np.cos(UNIT - [0.0, 1.0, -1.0]) - special.i1e(k) / special.i0e(k)
    np.testing.assert_allclose(_np(g), want, rtol=1e-12)
    np.testing.assert_allclose(_np(vm.variance), 1 - special.i1e(k) / special.i0e(k), rtol=1e-12)
    nb = D.NegativeBinomial(t([1.0, 2.5, 4.0]), t([0.3, 0.5, 0.9]))
    k = np.array([0.0, 3.0, 5.0])
    ref = stats.nbinom([1.0, 2.5, 4.0], 1 - np.array([0.3, 0.5, 0.9]))
    np.testing.assert_allclose(_np(nb.log_prob(t(k))), ref.logpmf(k), rtol=1e-10)
    np.testing.assert_allclose(_np(nb.mean), ref.mean(), rtol=1e-10)
    np.testing.assert_allclose(_np(nb.variance), ref.var(), rtol=1e-10)
    w = D.Wishart(t(4.5), covariance_matrix=t(COV[0]))
    ref = stats.wishart(4.5, COV[0])
    np.testing.assert_allclose(w.log_prob(t(WISHART_VALUE)).item(), ref.logpdf(WISHART_VALUE))
    np.testing.assert_allclose(w.entropy().item(), ref.entropy(), rtol=1e-10)
    np.testing.assert_allclose(_np(w.mean), ref.mean(), rtol=1e-12)


def test_closed_forms_by_quadrature() -> None:
    """Kumaraswamy's mode maximises its density (PyTorch 2.13 returns nan there), its moments
    and entropy match a numerical integral; the continuous Bernoulli density integrates to 1
    and its moments match a numerical integral, also inside the Taylor region."""
    grid = np.linspace(1e-7, 1 - 1e-7, 400001)

    def integral(values: np.ndarray, grid: np.ndarray = grid) -> np.ndarray:
        return np.trapezoid(values, grid, axis=-1)

    f64 = lambda a: fg.tensor(a, dtype=fg.float64)  # noqa: E731
    k = D.Kumaraswamy(f64([2.0, 5.0, 0.5]), f64([3.0, 3.5, 2.0]))
    density = np.exp(_np(k.log_prob(fg.tensor(grid[:, None]))).T)
    mode = _np(k.mode)
    np.testing.assert_allclose(mode[:2], grid[np.argmax(density[:2], axis=-1)], atol=1e-5)
    assert np.isnan(mode[2])
    np.testing.assert_allclose(_np(k.mean), integral(grid * density), rtol=1e-6)
    np.testing.assert_allclose(
        _np(k.variance), integral(grid**2 * density) - _np(k.mean) ** 2, rtol=1e-5
    )
    # (the third density is infinite at 0: the grid integrates only the first two well)
    np.testing.assert_allclose(_np(k.entropy())[:2], integral(special.entr(density[:2])), rtol=1e-6)
    cb = D.ContinuousBernoulli(f64([0.1, 0.4999, 0.5, 0.7]))
    grid = np.linspace(0, 1, 400001)  # (finite at both ends)
    density = np.exp(_np(cb.log_prob(fg.tensor(grid[:, None]))).T)
    np.testing.assert_allclose(integral(density, grid), 1.0, rtol=1e-9)
    np.testing.assert_allclose(_np(cb.mean), integral(grid * density, grid), rtol=1e-9)
    np.testing.assert_allclose(
        _np(cb.variance), integral(grid**2 * density, grid) - _np(cb.mean) ** 2, rtol=1e-7
    )


@pytest.mark.parametrize(
    "name,make,mean,var",
    [
        ("Pareto", lambda: D.Pareto(fg.tensor(2.0), fg.tensor(5.0)), 2.5, 5 * 4 / (16 * 3)),
        (
            "Weibull",
            lambda: D.Weibull(fg.tensor(1.5), fg.tensor(2.0)),
            1.5 * math.gamma(1.5),
            2.25 * (1 - math.gamma(1.5) ** 2),
        ),
        ("InverseGamma", lambda: D.InverseGamma(fg.tensor(6.0), fg.tensor(2.0)), 0.4, 0.04),
        (
            "Kumaraswamy",
            lambda: D.Kumaraswamy(fg.tensor(2.0), fg.tensor(3.0)),
            3 * math.gamma(1.5) * math.gamma(3) / math.gamma(4.5),
            None,
        ),
        ("FisherSnedecor", lambda: D.FisherSnedecor(fg.tensor(8.0), fg.tensor(12.0)), 1.2, None),
        (
            "GeneralizedPareto",
            lambda: D.GeneralizedPareto(fg.tensor(1.0), fg.tensor(2.0), fg.tensor(0.2)),
            1 + 2 / 0.8,
            4 / (0.64 * 0.6),
        ),
        (
            "GeneralizedPareto_negative",
            lambda: D.GeneralizedPareto(fg.tensor(0.0), fg.tensor(1.0), fg.tensor(-0.5)),
            1 / 1.5,
            1 / (2.25 * 2),
        ),
        ("ContinuousBernoulli", lambda: D.ContinuousBernoulli(fg.tensor(0.8)), None, None),
        ("NegativeBinomial", lambda: D.NegativeBinomial(3.0, fg.tensor(0.4)), 2.0, 2.0 / 0.6),
        ("VonMises", lambda: D.VonMises(fg.tensor(0.5), fg.tensor(4.0)), 0.5, None),
    ],
)
def test_sample_moments(name, make, mean, var) -> None:  # type: ignore[no-untyped-def]
    fg.manual_seed(0)
    d = make()
    mean = d.mean.item() if mean is None else mean
    var = d.variance.item() if var is None else var
    x = d.sample((40000,))
    assert tuple(x.shape) == (40000, *d.batch_shape)
    assert bool(d.support.check(x).all())
    if name == "VonMises":  # (a circular variance: 1 - |E exp(i x)|)
        np.testing.assert_allclose(fg.atan2(x.sin().mean(), x.cos().mean()).item(), mean, atol=0.01)
        resultant = math.hypot(x.sin().mean().item(), x.cos().mean().item())
        np.testing.assert_allclose(1 - resultant, var, atol=0.01)
        assert bool((x >= -math.pi).all()) and bool((x < math.pi).all())
        return
    np.testing.assert_allclose(x.mean().item(), mean, atol=4 * math.sqrt(var / 40000) + 1e-3)
    np.testing.assert_allclose(x.var().item(), var, rtol=0.08)


def test_matrix_and_simplex_samples() -> None:
    fg.manual_seed(1)
    lkj = D.LKJCholesky(3, fg.tensor([0.5, 4.0]))
    L = lkj.sample((20000,))
    assert tuple(L.shape) == (20000, 2, 3, 3)
    assert bool(D.constraints.corr_cholesky.check(L).all())
    # an off-diagonal correlation of LKJ(eta) in dimension d is 2 Beta(b, b) - 1,
    # b = eta - 1 + d / 2: variance 1 / (2 b + 1)
    corr = (L @ L.transpose(-2, -1))[..., 1, 0]
    b = np.array([0.5, 4.0]) - 1 + 1.5
    np.testing.assert_allclose(_np(corr.var(0)), 1 / (2 * b + 1), rtol=0.05)
    np.testing.assert_allclose(_np(corr.mean(0)), 0.0, atol=0.02)
    w = D.Wishart(fg.tensor(5.0), covariance_matrix=fg.tensor(COV[0]))
    draws = w.rsample((40000,))
    assert bool(D.constraints.positive_definite.check(draws[:100]).all())
    np.testing.assert_allclose(_np(draws.mean(0)), 5 * COV[0], rtol=0.05, atol=0.1)
    np.testing.assert_allclose(_np(draws.var(0)), _np(w.variance), rtol=0.1, atol=0.2)
    ln = D.LogisticNormal(fg.zeros(3), fg.ones(3)).sample((5,))
    assert tuple(ln.shape) == (5, 4) and np.allclose(_np(ln.sum(-1)), 1.0)


def test_rsample_gradients_by_gradcheck() -> None:
    """Draws that are smooth functions of the parameters (the same uniform draws each time,
    from the same seed) pass gradcheck in float64."""

    def drawn(make):  # type: ignore[no-untyped-def]
        def fn(*params):  # type: ignore[no-untyped-def]
            fg.manual_seed(7)
            return make(*params).rsample((4,))

        return fn

    def leaf(a):  # type: ignore[no-untyped-def]
        return fg.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)

    cases = [
        (D.Pareto, (leaf([1.0, 2.0]), leaf([1.5, 3.0]))),
        (D.Weibull, (leaf([1.0, 2.0]), leaf([0.8, 3.0]))),
        (D.Kumaraswamy, (leaf([1.0, 2.0]), leaf([0.8, 3.0]))),
        (D.GeneralizedPareto, (leaf([0.0, 1.0]), leaf([1.0, 2.0]), leaf([0.3, -0.2]))),
        (D.ContinuousBernoulli, (leaf([0.2, 0.7]),)),
        (D.LogisticNormal, (leaf([0.1, -0.3]), leaf([0.5, 1.5]))),
    ]
    for cls, params in cases:
        assert cls(*params).has_rsample
        assert fg.autograd.gradcheck(drawn(cls), params), cls.__name__
    assert not D.VonMises(0.0, 1.0).has_rsample and not D.NegativeBinomial(2.0, 0.5).has_rsample
    with pytest.raises(NotImplementedError):
        D.VonMises(0.0, 1.0).rsample()


def test_implicit_reparameterisation_gradients() -> None:
    """InverseGamma, FisherSnedecor and Wishart draw through Gamma's implicit
    reparameterisation: the gradient of the mean of many draws is the derivative of the mean."""
    fg.manual_seed(3)
    a = fg.tensor(5.0, dtype=fg.float64, requires_grad=True)
    r = fg.tensor(2.0, dtype=fg.float64, requires_grad=True)
    x = D.InverseGamma(a, r).rsample((100000,))
    ga, gr = fg.autograd.grad(x.mean(), (a, r))
    np.testing.assert_allclose([ga.item(), gr.item()], [-2 / 16, 1 / 4], rtol=0.03)
    df2 = fg.tensor(12.0, dtype=fg.float64, requires_grad=True)
    y = D.FisherSnedecor(fg.tensor(8.0, dtype=fg.float64), df2).rsample((100000,))
    (g,) = fg.autograd.grad(y.mean(), df2)
    np.testing.assert_allclose(g.item(), -2 / 100, rtol=0.1)
    df = fg.tensor(5.0, dtype=fg.float64, requires_grad=True)
    cov = fg.tensor(COV[0], requires_grad=True)
    w = D.Wishart(df, covariance_matrix=cov).rsample((40000,))
    g_df, g_cov = fg.autograd.grad(w.mean(0).sum(), (df, cov))
    np.testing.assert_allclose(g_df.item(), COV[0].sum(), rtol=0.03)
    np.testing.assert_allclose(_np(g_cov), np.full((3, 3), 5.0), rtol=0.05)


def test_shapes_expand_and_validation() -> None:
    t = lambda a: fg.tensor(np.asarray(a, dtype=np.float64))  # noqa: E731
    dists = [
        D.Pareto(t(A), t(B)),
        D.Weibull(t(A), t(B)),
        D.InverseGamma(t(A), t(B)),
        D.Kumaraswamy(t(A), t(B)),
        D.FisherSnedecor(t(A), t(B)),
        D.GeneralizedPareto(t(A), t(B), t([0.1, 0.0, -0.1])),
        D.ContinuousBernoulli(t([0.2, 0.5, 0.7])),
        D.ContinuousBernoulli(logits=t([0.2, 0.5, 0.7])),
        D.NegativeBinomial(t(A), t([0.2, 0.5, 0.7])),
        D.NegativeBinomial(t(A), logits=t([0.2, 0.5, 0.7])),
        D.VonMises(t(A), t(B)),
        D.LogisticNormal(t(A), t(B)),
        D.LKJCholesky(3, t(A)),
        D.Wishart(t(A) + 3, covariance_matrix=fg.tensor(COV[0])),
    ]
    for d in dists:
        name = type(d).__name__
        assert tuple(d.batch_shape) == ((3,) if name != "LogisticNormal" else ()), name
        e = d.expand((2, *d.batch_shape))
        assert type(e) is type(d) and tuple(e.batch_shape) == (2, *d.batch_shape), name
        x = e.sample((5,))
        assert tuple(x.shape) == (5, 2, *d.batch_shape, *d.event_shape), name
        assert tuple(e.log_prob(x).shape) == (5, 2, *d.batch_shape), name
        np.testing.assert_allclose(_np(e.log_prob(x)), _np(d.log_prob(x)), rtol=1e-12)
    assert tuple(D.LogisticNormal(t(A), t(B)).event_shape) == (4,)
    assert tuple(D.LogisticNormal(0.0, 1.0).event_shape) == (2,)
    assert tuple(D.LKJCholesky(3, 1.0).event_shape) == (3, 3)
    assert tuple(D.Wishart(4.0, scale_tril=fg.eye(3)).event_shape) == (3, 3)
    for make, match in [
        (lambda: D.Pareto(1.0, -1.0), "Expected parameter rate"),  # (its base, first)
        (lambda: D.Weibull(-1.0, 1.0), "Expected parameter scale"),
        (lambda: D.InverseGamma(0.0, 1.0), "Expected parameter concentration"),
        (lambda: D.Kumaraswamy(1.0, -2.0), "Expected parameter concentration0"),
        (lambda: D.FisherSnedecor(-1.0, 1.0), "Expected parameter concentration"),
        (lambda: D.GeneralizedPareto(0.0, -1.0, 0.1), "Expected parameter scale"),
        (lambda: D.NegativeBinomial(-1.0, 0.5), "Expected parameter total_count"),
        (lambda: D.NegativeBinomial(1.0, 1.0), "Expected parameter probs"),
        (lambda: D.VonMises(0.0, -1.0), "Expected parameter concentration"),
        (lambda: D.LKJCholesky(3, -1.0), "Expected parameter concentration"),
        (lambda: D.LKJCholesky(1, 1.0), "greater than or equal to 2"),
        (lambda: D.ContinuousBernoulli(1.5, validate_args=True), "probs has invalid values"),
        (lambda: D.ContinuousBernoulli(), "Either `probs` or `logits`"),
        (lambda: D.NegativeBinomial(1.0), "Either `probs` or `logits`"),
        (lambda: D.Wishart(2.0, covariance_matrix=fg.eye(3)), "expected to be greater than"),
        (lambda: D.Wishart(4.0, covariance_matrix=fg.ones(3)), "at least two-dimensional"),
        (lambda: D.Pareto(2.0, 1.0).log_prob(fg.tensor(1.0)), "within the support"),
        (lambda: D.Kumaraswamy(2.0, 1.0).log_prob(fg.tensor(1.5)), "within the support"),
        (
            lambda: D.GeneralizedPareto(0.0, 1.0, -0.5).log_prob(fg.tensor(2.5)),
            "within the support",
        ),
        (lambda: D.NegativeBinomial(2.0, 0.5).log_prob(fg.tensor(1.5)), "within the support"),
        (lambda: D.LKJCholesky(2, 1.0).log_prob(fg.eye(2) * 2), "within the support"),
    ]:
        with pytest.raises(ValueError, match=match):
            make()
    with pytest.raises(AssertionError, match="Exactly one of"):
        D.Wishart(4.0, covariance_matrix=fg.eye(3), scale_tril=fg.eye(3))
    with pytest.warns(UserWarning, match="Low df"):
        D.Wishart(2.5, covariance_matrix=fg.eye(3))
    with warnings.catch_warnings():  # (a well-conditioned Wishart draws without a warning)
        warnings.simplefilter("error")
        D.Wishart(10.0, covariance_matrix=fg.eye(3)).rsample((50,))
        D.Pareto(1.0, -1.0, validate_args=False)


KL_PAIRS = [
    ("ContinuousBernoulli", "ContinuousBernoulli"),
    ("Pareto", "Pareto"),
    ("Beta", "ContinuousBernoulli"),
    ("Uniform01", "ContinuousBernoulli"),
    ("Uniform", "ContinuousBernoulli"),
    ("ContinuousBernoulli", "Exponential"),
    ("ContinuousBernoulli", "Normal"),
    ("ContinuousBernoulli", "Uniform"),
    ("Pareto", "Exponential"),
    ("Pareto", "Gamma"),
    ("Pareto", "Normal"),
    ("Uniform", "Pareto"),
    ("Beta", "Pareto"),
    ("ContinuousBernoulli", "Pareto"),
    ("Exponential", "ContinuousBernoulli"),
    ("Gamma", "Pareto"),
    ("Normal", "ContinuousBernoulli"),
    ("Laplace", "Pareto"),
    ("Gumbel", "ContinuousBernoulli"),
    ("Pareto", "Beta"),
    ("Pareto", "Uniform"),
]
KL_MAKERS = {
    "ContinuousBernoulli": lambda M, t, s: M.ContinuousBernoulli(t([0.2, 0.4995, 0.8]) * s),
    "Pareto": lambda M, t, s: M.Pareto(t([0.5, 2.0, 3.5]) * s, t([1.5, 2.7, 5.0]) * s),
    "Beta": lambda M, t, s: M.Beta(t([0.5, 2.0, 3.5]) * s, t([1.5, 2.7, 5.0])),
    "Uniform": lambda M, t, s: M.Uniform(t([0.5, 2.0, -3.5]) * s, t([1.5, 2.7, 5.0]) * s),
    "Uniform01": lambda M, t, s: M.Uniform(t([0.1, 0.2, -3.5]) * s, t([0.5, 0.7, 5.0]) * s),
    "Exponential": lambda M, t, s: M.Exponential(t([0.5, 2.0, 3.5]) * s),
    "Gamma": lambda M, t, s: M.Gamma(t([0.5, 2.0, 3.5]) * s, t([1.5, 2.7, 5.0])),
    "Normal": lambda M, t, s: M.Normal(t([0.5, 2.0, 3.5]) * s, t([1.5, 2.7, 5.0])),
    "Laplace": lambda M, t, s: M.Laplace(t([0.5, 2.0, 3.5]) * s, t([1.5, 2.7, 5.0])),
    "Gumbel": lambda M, t, s: M.Gumbel(t([0.5, 2.0, 3.5]) * s, t([1.5, 2.7, 5.0])),
}


@pytest.mark.parametrize("p,q", KL_PAIRS)
def test_kl_divergence_matches_torch(p: str, q: str) -> None:
    torch = pytest.importorskip("torch")
    values, grads = [], []
    for module, dists in ((fg, D), (torch, torch.distributions)):
        leaves: list = []

        def t(a, module=module, leaves=leaves):  # type: ignore[no-untyped-def]
            leaf = module.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)
            leaves.append(leaf)
            return leaf

        kl = dists.kl_divergence(KL_MAKERS[p](dists, t, 1.0), KL_MAKERS[q](dists, t, 1.1))
        values.append(kl.detach().numpy())
        finite = kl[kl.isfinite()].sum()
        if finite.requires_grad:
            grads.append([g for g in module.autograd.grad(finite, leaves, allow_unused=True)])
    np.testing.assert_allclose(values[0], values[1], rtol=1e-10, atol=1e-12)
    if len(grads) == 2:
        for a, b in zip(*grads):
            if a is not None and b is not None:
                # (PyTorch's trigamma, behind Beta's entropy gradient, is 5e-10 off)
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=2e-9)
