"""``fusegrad.distributions`` against ``torch.distributions``: log_prob, cdf, icdf, entropy,
mean, mode, variance and their gradients (float64, 1e-10), KL divergences, transforms and the
constraint registries; sampling by moments; reparameterised gradients (including Gamma's
implicit ones) against their known expectations; shapes, expand and argument validation."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import distributions as D

torch = pytest.importorskip("torch")
TD = torch.distributions
RNG = np.random.default_rng(3)

LOC, SCALE = RNG.normal(size=3), RNG.uniform(0.5, 2, 3)
LOW, HIGH = RNG.normal(size=3), RNG.normal(size=3) + 3
RATE, CONC = RNG.uniform(0.5, 2, 3), RNG.uniform(0.5, 3, 3)
DF, P = RNG.uniform(0.5, 5, 3), RNG.uniform(0.1, 0.9, 3)
PROBS = RNG.uniform(0.1, 1, (2, 4))
CONC_K = RNG.uniform(0.5, 3, (2, 4))
SIMPLEX = RNG.dirichlet(np.ones(4), 2)
MIX_LOC, MIX_SCALE = RNG.normal(size=4), RNG.uniform(0.5, 2, 4)

# name: (constructor of (module, tensor) -> (distribution, parameters), value, methods)
CASES = {
    "Normal": (
        lambda M, t: _with(M.Normal, t(LOC), t(SCALE)),
        RNG.normal(size=3),
        "log_prob cdf entropy mean mode variance stddev",
    ),
    "Normal_icdf": (
        lambda M, t: _with(M.Normal, t(LOC), t(SCALE)),
        RNG.uniform(0.1, 0.9, 3),
        "icdf",
    ),
    "Uniform": (
        lambda M, t: _with(M.Uniform, t(LOW), t(HIGH)),
        LOW + 0.5,
        "log_prob cdf icdf_u entropy mean variance",
    ),
    "Exponential": (
        lambda M, t: _with(M.Exponential, t(RATE)),
        RATE,
        "log_prob cdf entropy mean mode variance",
    ),
    "Laplace": (
        lambda M, t: _with(M.Laplace, t(LOC), t(SCALE)),
        RNG.normal(size=3),
        "log_prob cdf entropy mean variance",
    ),
    "Cauchy": (
        lambda M, t: _with(M.Cauchy, t(LOC), t(SCALE)),
        RNG.normal(size=3),
        "log_prob cdf entropy",
    ),
    "Gumbel": (
        lambda M, t: _with(M.Gumbel, t(LOC), t(SCALE)),
        RNG.normal(size=3),
        "log_prob cdf entropy mean variance",
    ),
    "StudentT": (
        lambda M, t: _with(M.StudentT, t(DF), t(LOC), t(SCALE)),
        RNG.normal(size=3),
        "log_prob entropy mean variance",
    ),
    "Gamma": (
        lambda M, t: _with(M.Gamma, t(CONC), t(RATE)),
        RNG.uniform(0.1, 3, 3),
        "log_prob entropy mean mode variance",
    ),
    "Chi2": (
        lambda M, t: _with(M.Chi2, t(DF)),
        RNG.uniform(0.1, 3, 3),
        "log_prob entropy mean variance",
    ),
    "Beta": (
        lambda M, t: _with(M.Beta, t(CONC), t(RATE)),
        RNG.uniform(0.1, 0.9, 3),
        "log_prob entropy mean variance",
    ),
    "Dirichlet": (
        lambda M, t: _with(M.Dirichlet, t(CONC_K)),
        SIMPLEX,
        "log_prob entropy mean variance",
    ),
    "Bernoulli": (
        lambda M, t: _with(M.Bernoulli, t(P)),
        [0.0, 1.0, 1.0],
        "log_prob entropy mean variance",
    ),
    "Bernoulli_logits": (
        lambda M, t: _with(lambda a: M.Bernoulli(logits=a), t(LOC)),
        [0.0, 1.0, 1.0],
        "log_prob entropy mean variance",
    ),
    "Categorical": (lambda M, t: _with(M.Categorical, t(PROBS)), [1.0, 3.0], "log_prob entropy"),
    "Categorical_logits": (
        lambda M, t: _with(lambda a: M.Categorical(logits=a), t(PROBS)),
        [1.0, 3.0],
        "log_prob entropy",
    ),
    "OneHotCategorical": (
        lambda M, t: _with(M.OneHotCategorical, t(PROBS)),
        np.eye(4)[[1, 3]],
        "log_prob entropy mean variance",
    ),
    "Binomial": (
        lambda M, t: _with(lambda a: M.Binomial(5, a), t(P)),
        [0.0, 3.0, 5.0],
        "log_prob entropy mean variance",
    ),
    "Poisson": (lambda M, t: _with(M.Poisson, t(RATE)), [0.0, 3.0, 5.0], "log_prob mean variance"),
    "Geometric": (
        lambda M, t: _with(M.Geometric, t(P)),
        [0.0, 3.0, 5.0],
        "log_prob entropy mean variance",
    ),
    "Multinomial": (
        lambda M, t: _with(lambda a: M.Multinomial(5, a), t(PROBS)),
        [[1.0, 2.0, 0.0, 2.0], [0, 0, 5, 0]],
        "log_prob mean variance",
    ),
    "LogNormal": (
        lambda M, t: _with(M.LogNormal, t(LOC), t(SCALE)),
        RNG.uniform(0.1, 3, 3),
        "log_prob cdf entropy mean variance",
    ),
    "HalfNormal": (
        lambda M, t: _with(M.HalfNormal, t(SCALE)),
        RNG.uniform(0.1, 3, 3),
        "log_prob cdf entropy mean variance",
    ),
    "HalfCauchy": (
        lambda M, t: _with(M.HalfCauchy, t(SCALE)),
        RNG.uniform(0.1, 3, 3),
        "log_prob cdf entropy",
    ),
    "RelaxedBernoulli": (
        lambda M, t: _with(lambda a: M.RelaxedBernoulli(t([0.7], False), a), t(P)),
        RNG.uniform(0.1, 0.9, 3),
        "log_prob",
    ),
    "RelaxedOneHotCategorical": (
        lambda M, t: _with(lambda a: M.RelaxedOneHotCategorical(t(0.7, False), a), t(PROBS)),
        SIMPLEX,
        "log_prob",
    ),
    "Independent": (
        lambda M, t: _with(lambda a, b: M.Independent(M.Normal(a, b), 1), t(LOC), t(SCALE)),
        RNG.normal(size=3),
        "log_prob entropy mean variance",
    ),
    "MixtureSameFamily": (
        lambda M, t: _with(
            lambda w, a, b: M.MixtureSameFamily(M.Categorical(w), M.Normal(a, b)),
            t(PROBS[0]),
            t(MIX_LOC),
            t(MIX_SCALE),
        ),
        RNG.normal(size=3),
        "log_prob cdf mean variance",
    ),
    "TransformedDistribution": (
        lambda M, t: _with(
            lambda a, b: M.TransformedDistribution(
                M.Normal(a, b),
                [M.transforms.TanhTransform(), M.transforms.AffineTransform(1.0, 2.0)],
            ),
            t(LOC),
            t(SCALE),
        ),
        RNG.uniform(-0.9, 2.9, 3),
        "log_prob",
    ),
}


def _with(cls, *params):  # type: ignore[no-untyped-def]
    return cls(*params), list(params)


def _evaluate(lib: str, case: str) -> tuple:
    make, value, methods = CASES[case]
    module = fg if lib == "fg" else torch
    dists = D if lib == "fg" else TD
    dist, params = make(
        dists, lambda a, g=True: module.tensor(np.asarray(a, dtype=np.float64), requires_grad=g)
    )
    v = module.tensor(np.asarray(value, dtype=np.float64))
    out = {}
    for m in methods.split():
        if m in ("log_prob", "cdf", "icdf"):
            out[m] = getattr(dist, m)(v)
        elif m == "icdf_u":
            out[m] = dist.icdf(module.tensor(np.asarray([0.1, 0.5, 0.9])))
        elif m == "entropy":
            out[m] = dist.entropy()
        else:
            out[m] = getattr(dist, m)
    total = sum(o.sum() for o in out.values() if o.requires_grad)
    grads = module.autograd.grad(total, params, allow_unused=True)
    return out, grads


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch(case: str) -> None:
    ours, our_grads = _evaluate("fg", case)
    theirs, their_grads = _evaluate("torch", case)
    for m in ours:
        np.testing.assert_allclose(
            ours[m].detach().numpy(), theirs[m].detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=m
        )
    # (PyTorch's trigamma, behind Dirichlet's and Beta's entropy gradients, is 5e-10 off)
    atol = 2e-9 if case in ("Dirichlet", "Beta") else 1e-12
    for a, b in zip(our_grads, their_grads):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=atol)


KL_PAIRS = {
    "Normal": lambda M, t: M.Normal(t(LOC), t(SCALE)),
    "Gamma": lambda M, t: M.Gamma(t(CONC), t(RATE)),
    "Beta": lambda M, t: M.Beta(t(CONC), t(RATE)),
    "Dirichlet": lambda M, t: M.Dirichlet(t(CONC_K)),
    "Categorical": lambda M, t: M.Categorical(t(PROBS)),
    "OneHotCategorical": lambda M, t: M.OneHotCategorical(t(PROBS)),
    "Bernoulli": lambda M, t: M.Bernoulli(t(P)),
    "Laplace": lambda M, t: M.Laplace(t(LOC), t(SCALE)),
    "Exponential": lambda M, t: M.Exponential(t(RATE)),
    "Poisson": lambda M, t: M.Poisson(t(RATE)),
    "Uniform": lambda M, t: M.Uniform(t(LOW), t(HIGH)),
    "Gumbel": lambda M, t: M.Gumbel(t(LOC), t(SCALE)),
    "Cauchy": lambda M, t: M.Cauchy(t(LOC), t(SCALE)),
    "Geometric": lambda M, t: M.Geometric(t(P)),
    "HalfNormal": lambda M, t: M.HalfNormal(t(SCALE)),
    "LogNormal": lambda M, t: M.LogNormal(t(LOC), t(SCALE)),
    "Independent": lambda M, t: M.Independent(M.Normal(t(LOC), t(SCALE)), 1),
}


@pytest.mark.parametrize("name", sorted(KL_PAIRS))
def test_kl_divergence_matches_torch(name: str) -> None:
    values, grads = [], []
    for module, dists in ((fg, D), (torch, TD)):
        leaves: list = []

        def t(a, scale=1.0, module=module, leaves=leaves):  # type: ignore[no-untyped-def]
            leaf = module.tensor(
                np.asarray(a, dtype=np.float64) * scale + (scale - 1) / 2, requires_grad=True
            )
            leaves.append(leaf)
            return leaf

        p = KL_PAIRS[name](dists, t)
        q = KL_PAIRS[name](dists, lambda a: t(a, 1.05))
        kl = dists.kl_divergence(p, q)
        values.append(kl.detach().numpy())
        grads.append([g.numpy() for g in module.autograd.grad(kl[kl.isfinite()].sum(), leaves)])
    np.testing.assert_allclose(values[0], values[1], rtol=1e-10, atol=1e-12)
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=2e-9)


def test_mixed_kl_pairs_and_the_registry() -> None:
    for make_p, make_q in [
        (lambda M, t: M.Exponential(t(RATE)), lambda M, t: M.Gamma(t(CONC), t(RATE))),
        (lambda M, t: M.Gamma(t(CONC), t(RATE)), lambda M, t: M.Normal(t(LOC), t(SCALE))),
        (lambda M, t: M.Normal(t(LOC), t(SCALE)), lambda M, t: M.Laplace(t(LOC), t(SCALE))),
        (lambda M, t: M.Uniform(t(LOW), t(HIGH)), lambda M, t: M.Normal(t(LOC), t(SCALE))),
    ]:
        ours = D.kl_divergence(make_p(D, fg.tensor), make_q(D, fg.tensor))
        theirs = TD.kl_divergence(make_p(TD, torch.tensor), make_q(TD, torch.tensor))
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-10)
    with pytest.raises(NotImplementedError, match="No KL"):
        D.kl_divergence(D.Normal(0.0, 1.0), D.Categorical(fg.ones(3)))

    class MyNormal(D.Normal):
        pass

    @D.register_kl(MyNormal, D.Normal)
    def _kl(p, q):  # type: ignore[no-untyped-def]
        return fg.tensor(42.0)

    assert D.kl_divergence(MyNormal(0.0, 1.0), D.Normal(0.0, 1.0)).item() == 42.0
    # a subclass without its own entry uses its base class's
    np.testing.assert_allclose(
        D.kl_divergence(D.Normal(0.0, 1.0), MyNormal(1.0, 1.0)).item(), 0.5, rtol=1e-12
    )


@pytest.mark.parametrize(
    "name,make,mean,var",
    [
        (
            "Normal",
            lambda: D.Normal(fg.tensor([1.0, -2.0]), fg.tensor([0.5, 2.0])),
            [1, -2],
            [0.25, 4],
        ),
        ("Uniform", lambda: D.Uniform(fg.tensor(-1.0), fg.tensor(3.0)), 1, 16 / 12),
        (
            "Gamma",
            lambda: D.Gamma(fg.tensor([0.4, 3.0]), fg.tensor([1.0, 2.0])),
            [0.4, 1.5],
            [0.4, 0.75],
        ),
        ("Beta", lambda: D.Beta(fg.tensor(2.0), fg.tensor(5.0)), 2 / 7, 10 / (49 * 8)),
        ("Exponential", lambda: D.Exponential(fg.tensor(2.0)), 0.5, 0.25),
        ("Laplace", lambda: D.Laplace(fg.tensor(1.0), fg.tensor(0.5)), 1.0, 0.5),
        (
            "Gumbel",
            lambda: D.Gumbel(fg.tensor(1.0), fg.tensor(0.5)),
            1 + 0.5 * 0.5772156649,
            (math.pi * 0.5) ** 2 / 6,
        ),
        ("Bernoulli", lambda: D.Bernoulli(fg.tensor(0.3)), 0.3, 0.21),
        ("Binomial", lambda: D.Binomial(10, fg.tensor(0.3)), 3.0, 2.1),
        ("Poisson", lambda: D.Poisson(fg.tensor(4.0)), 4.0, 4.0),
        ("Geometric", lambda: D.Geometric(fg.tensor(0.4)), 1.5, 3.75),
        ("StudentT", lambda: D.StudentT(fg.tensor(6.0)), 0.0, 1.5),
        (
            "LogNormal",
            lambda: D.LogNormal(fg.tensor(0.0), fg.tensor(0.5)),
            math.exp(0.125),
            (math.exp(0.25) - 1) * math.exp(0.25),
        ),
    ],
)
def test_sample_moments(name, make, mean, var) -> None:  # type: ignore[no-untyped-def]
    fg.manual_seed(0)
    d = make()
    x = d.sample((40000,))
    assert tuple(x.shape) == (40000, *d.batch_shape)
    m = x.mean(0).numpy()
    np.testing.assert_allclose(m, mean, atol=4 * np.sqrt(np.max(var) / 40000) + 1e-3)
    np.testing.assert_allclose(x.var(0).numpy(), var, rtol=0.06, atol=1e-3)


def test_categorical_and_dirichlet_samples() -> None:
    fg.manual_seed(1)
    probs = fg.tensor([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]])
    x = D.Categorical(probs).sample((20000,))
    assert tuple(x.shape) == (20000, 2) and x.dtype == fg.int64
    freq = np.stack([(x.numpy() == k).mean(0) for k in range(3)], -1)
    np.testing.assert_allclose(freq, probs.numpy(), atol=0.015)
    oh = D.OneHotCategorical(probs).sample((5,))
    assert tuple(oh.shape) == (5, 2, 3) and np.all(oh.numpy().sum(-1) == 1)
    conc = fg.tensor([1.0, 2.0, 3.0])
    s = D.Dirichlet(conc).sample((20000,))
    np.testing.assert_allclose(s.mean(0).numpy(), [1 / 6, 2 / 6, 3 / 6], atol=0.01)
    counts = D.Multinomial(10, fg.tensor([0.2, 0.8])).sample((3,))
    assert np.all(counts.numpy().sum(-1) == 10)
    mix = D.MixtureSameFamily(
        D.Categorical(fg.tensor([0.5, 0.5])),
        D.Normal(fg.tensor([-5.0, 5.0]), fg.tensor([0.1, 0.1])),
    )
    xs = mix.sample((4000,)).numpy()
    assert abs((xs > 0).mean() - 0.5) < 0.05 and np.all(np.abs(np.abs(xs) - 5) < 1)


def test_reparameterised_gradients() -> None:
    """Location-scale families by the chain rule; Gamma (and Beta, Dirichlet through it) by
    implicit reparameterisation: d E[x] / d alpha = 1 / rate, d E[x^2] / d alpha = (2 alpha + 1)
    / rate^2, checked on many draws."""
    fg.manual_seed(2)
    loc = fg.tensor([0.5], dtype=fg.float64, requires_grad=True)
    scale = fg.tensor([2.0], dtype=fg.float64, requires_grad=True)
    x = D.Normal(loc, scale).rsample((1000,))
    gl, gs = fg.autograd.grad((x * x).mean(), (loc, scale))
    eps = (x.detach() - 0.5) / 2.0
    np.testing.assert_allclose(gl.numpy(), [2 * x.detach().mean().item()], rtol=1e-10)
    np.testing.assert_allclose(gs.numpy(), [(2 * x.detach() * eps).mean().item()], rtol=1e-10)
    alpha = fg.tensor([0.3, 1.0, 4.0, 30.0], requires_grad=True)
    rate = fg.tensor([1.0, 2.0, 1.0, 0.5], requires_grad=True)
    x = D.Gamma(alpha, rate).rsample((40000,))
    g_alpha, g_rate = fg.autograd.grad(x.mean(0).sum(), (alpha, rate), retain_graph=True)
    np.testing.assert_allclose(g_alpha.numpy(), 1 / rate.detach().numpy(), rtol=0.03)
    np.testing.assert_allclose(g_rate.numpy(), -(alpha / rate**2).detach().numpy(), rtol=0.03)
    (g2,) = fg.autograd.grad((x * x).mean(0).sum(), alpha)
    want = (2 * alpha.detach().numpy() + 1) / rate.detach().numpy() ** 2
    np.testing.assert_allclose(g2.numpy(), want, rtol=0.04)
    a = fg.tensor(2.0, requires_grad=True)
    b = fg.tensor(3.0, requires_grad=True)
    y = D.Beta(a, b).rsample((40000,))
    ga, gb = fg.autograd.grad(y.mean(), (a, b))
    np.testing.assert_allclose([ga.item(), gb.item()], [3 / 25, -2 / 25], rtol=0.06)
    for d in (
        D.Uniform(loc, loc + scale),
        D.Laplace(loc, scale),
        D.Exponential(scale),
        D.Gumbel(loc, scale),
        D.Cauchy(loc, scale),
        D.StudentT(scale, loc),
        D.LogNormal(loc, scale),
        D.RelaxedBernoulli(fg.tensor(0.5), probs=scale / 4),
        D.Independent(D.Normal(loc, scale), 1),
    ):
        assert d.has_rsample and d.rsample((3,)).requires_grad, type(d).__name__
    st = D.OneHotCategoricalStraightThrough(probs=fg.tensor([0.2, 0.8], requires_grad=True))
    s = st.rsample()
    assert s.requires_grad and set(np.unique(s.detach().numpy())) <= {0.0, 1.0}


def test_implicit_gamma_gradient_is_exact() -> None:
    """The implicit derivative against a finite difference of the quantile function (scipy)."""
    from scipy import special

    from fusegrad.distributions.continuous import standard_gamma_grad

    alpha = np.array([0.05, 0.3, 1.0, 2.5, 10.0, 150.0])
    x = special.gammaincinv(alpha, 0.37)
    h = 1e-6 * alpha
    fd = (special.gammaincinv(alpha + h, 0.37) - special.gammaincinv(alpha - h, 0.37)) / (2 * h)
    np.testing.assert_allclose(standard_gamma_grad(x, alpha), fd, rtol=1e-6)


def test_shapes_expand_and_validation() -> None:
    d = D.Normal(fg.zeros(3), fg.ones(3))
    assert tuple(d.batch_shape) == (3,) and tuple(d.event_shape) == ()
    assert tuple(d.sample((2, 4)).shape) == (2, 4, 3)
    e = d.expand((5, 3))
    assert tuple(e.batch_shape) == (5, 3) and tuple(e.log_prob(fg.zeros(5, 3)).shape) == (5, 3)
    mvn_like = D.Independent(D.Normal(fg.zeros(2, 3), fg.ones(2, 3)), 1)
    assert tuple(mvn_like.batch_shape) == (2,) and tuple(mvn_like.event_shape) == (3,)
    dr = D.Dirichlet(fg.ones(2, 4)).expand((3, 2))
    assert tuple(dr.sample().shape) == (3, 2, 4)
    with pytest.raises(ValueError, match="Expected parameter scale"):
        D.Normal(fg.zeros(2), fg.tensor([1.0, -1.0]))
    D.Normal(fg.zeros(2), fg.tensor([1.0, -1.0]), validate_args=False)
    with pytest.raises(ValueError, match="within the support"):
        D.Exponential(fg.tensor(1.0)).log_prob(fg.tensor(-1.0))
    with pytest.raises(ValueError, match="Either `probs` or `logits`"):
        D.Bernoulli()
    with pytest.raises(ValueError, match="low>= high"):
        D.Uniform(fg.tensor(1.0), fg.tensor(0.0))
    with pytest.raises(ValueError, match="broadcastable"):
        D.Normal(fg.zeros(3), fg.ones(3)).log_prob(fg.zeros(4))
    assert tuple(D.Bernoulli(fg.tensor([0.3, 0.6])).enumerate_support().shape) == (2, 2)
    assert tuple(D.Categorical(fg.ones(2, 3)).enumerate_support(expand=False).shape) == (3, 1)
    assert D.Normal(0.0, 1.0).perplexity().item() == pytest.approx(
        math.exp(0.5 + 0.5 * math.log(2 * math.pi))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        D.Distribution.set_default_validate_args(False)
        try:
            D.Normal(fg.zeros(2), fg.tensor([1.0, -1.0]))
        finally:
            D.Distribution.set_default_validate_args(True)


TRANSFORMS = {
    "Exp": lambda M: M.ExpTransform(),
    "Sigmoid": lambda M: M.SigmoidTransform(),
    "Tanh": lambda M: M.TanhTransform(),
    "Softplus": lambda M: M.SoftplusTransform(),
    "Affine": lambda M: M.AffineTransform(1.5, -2.0),
    "Power": lambda M: M.PowerTransform(2.5),
    "StickBreaking": lambda M: M.StickBreakingTransform(),
    "Compose": lambda M: M.ComposeTransform([M.ExpTransform(), M.AffineTransform(1.0, 3.0)]),
    "Inverse": lambda M: M.ExpTransform().inv,
    "Independent": lambda M: M.IndependentTransform(M.SigmoidTransform(), 1),
    "Reshape": lambda M: M.ReshapeTransform((4,), (2, 2)),
    "Cat": lambda M: M.CatTransform(
        [M.ExpTransform(), M.SigmoidTransform()], dim=-1, lengths=[2, 2]
    ),
    "Stack": lambda M: M.StackTransform(
        [M.ExpTransform(), M.TanhTransform(), M.ExpTransform(), M.SigmoidTransform()], dim=-1
    ),
    "CorrCholesky": lambda M: M.CorrCholeskyTransform(),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_transforms_match_torch(name: str) -> None:
    x = RNG.normal(size=(3, 6 if name == "CorrCholesky" else 4)) * 0.7
    if name in ("Power", "Inverse"):
        x = np.abs(x) + 0.1
    results = []
    for module, M in ((fg, D.transforms), (torch, TD.transforms)):
        t = TRANSFORMS[name](M)
        xt = module.tensor(x, requires_grad=True)
        y = t(xt)
        ld = t.log_abs_det_jacobian(xt, y) if name != "Reshape" else y.sum() * 0
        back = t.inv(y.detach().clone())
        (g,) = module.autograd.grad(y.sum() + ld.sum(), xt)
        results.append([y.detach().numpy(), ld.detach().numpy(), back.detach().numpy(), g.numpy()])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)
    # (PowerTransform's exponent is a float32 tensor, as in PyTorch: its inverse is that close)
    np.testing.assert_allclose(results[0][2], x, rtol=1e-6 if name == "Power" else 1e-8, atol=1e-10)


def test_constraint_registries() -> None:
    C = D.constraints
    raw = fg.tensor(RNG.normal(size=(3, 4)))
    for constraint in (
        C.positive,
        C.unit_interval,
        C.interval(-2.0, 3.0),
        C.greater_than(1.0),
        C.less_than(-1.0),
        C.simplex,
        C.real,
        C.independent(C.positive, 1),
    ):
        for registry in (D.biject_to, D.transform_to):
            y = registry(constraint)(raw)
            assert bool(constraint.check(y).all()), (constraint, registry)
    assert isinstance(D.biject_to(C.simplex), D.StickBreakingTransform)
    assert isinstance(D.transform_to(C.simplex), D.SoftmaxTransform)
    assert bool(
        C.lower_cholesky.check(D.transform_to(C.lower_cholesky)(fg.tensor(RNG.normal(size=(3, 3)))))
    )
    with pytest.raises(NotImplementedError, match="Cannot transform"):
        D.biject_to(C.boolean)
    assert C.boolean.check(fg.tensor([0.0, 1.0, 0.5])).tolist() == [True, True, False]
    assert C.integer_interval(0, 3).check(fg.tensor([0.0, 3.0, 4.0, 1.5])).tolist() == [
        True,
        True,
        False,
        False,
    ]
    assert C.one_hot.check(fg.tensor([[0.0, 1.0], [1.0, 1.0]])).tolist() == [True, False]


def test_multivariate_normals_match_torch() -> None:
    if not hasattr(fg.linalg, "cholesky"):
        pytest.skip("needs fusegrad.linalg's cholesky and solve_triangular (issue 29, items 1-3)")
    a = RNG.normal(size=(2, 3, 3))
    cov = a @ a.transpose(0, 2, 1) + 3 * np.eye(3)
    loc = RNG.normal(size=(2, 3))
    value = RNG.normal(size=(4, 2, 3))
    for kind in ("covariance_matrix", "scale_tril", "precision_matrix"):
        param = {
            "covariance_matrix": cov,
            "scale_tril": np.linalg.cholesky(cov),
            "precision_matrix": np.linalg.inv(cov),
        }[kind]
        out = []
        for module, M in ((fg, D), (torch, TD)):
            mean = module.tensor(loc, requires_grad=True)
            c = module.tensor(param, requires_grad=True)
            d = M.MultivariateNormal(mean, **{kind: c})
            lp = d.log_prob(module.tensor(value))
            ent = d.entropy()
            grads = module.autograd.grad(lp.sum() + ent.sum(), (mean, c))
            out.append(
                [
                    lp.detach().numpy(),
                    ent.detach().numpy(),
                    d.covariance_matrix.detach().numpy(),
                    *[g.numpy() for g in grads],
                ]
            )
        for x, y in zip(*out):
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-10)
    w, dg = RNG.normal(size=(3, 2)), RNG.uniform(0.5, 2, 3)
    out = []
    for module, M in ((fg, D), (torch, TD)):
        d = M.LowRankMultivariateNormal(module.tensor(loc), module.tensor(w), module.tensor(dg))
        q = M.MultivariateNormal(module.tensor(loc), covariance_matrix=module.tensor(cov))
        out.append(
            [
                d.log_prob(module.tensor(value)).numpy(),
                d.entropy().numpy(),
                M.kl_divergence(q, q).numpy(),
                M.kl_divergence(d, d).numpy(),
            ]
        )
    for x, y in zip(*out):
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-10)


def test_every_listed_name_exists() -> None:
    assert set(TD.__all__) <= set(D.__all__)
