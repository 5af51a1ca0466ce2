"""More univariate continuous distributions, with PyTorch's parameters and formulas:
ContinuousBernoulli, FisherSnedecor, GeneralizedPareto and VonMises.

Where this sits: over ``Distribution`` and ``continuous.py`` (FisherSnedecor's draws are a ratio
of Gamma draws, so their gradients come from Gamma's implicit reparameterisation).
ContinuousBernoulli and GeneralizedPareto draw by the inverse CDF of a uniform draw, so
``rsample`` is differentiable; VonMises has no ``rsample`` (as in PyTorch) and draws with
numpy's von Mises sampler on the parameters' host values.

One deliberate difference: VonMises's normaliser uses the exact modified Bessel functions
(``special.i0e``/``i1e``), where PyTorch evaluates Abramowitz and Stegun's polynomial fits
(relative error about 1e-7), so ``log_prob`` and ``variance`` agree with PyTorch's to about 1e-7.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import ops as F
from .. import special as _special
from ..autograd import grad_mode as _grad_mode
from ..nn import functional as NF
from ..runtime import finfo as _finfo
from ..size import Size
from ..tensor import Tensor
from . import constraints
from .continuous import Gamma, _expand_params, _shape
from .distribution import Distribution, ExponentialFamily
from .utils import (
    _host,
    broadcast_all,
    clamp_probs,
    draw,
    lazy_property,
    logits_to_probs,
    probs_to_logits,
)

__all__ = ["ContinuousBernoulli", "FisherSnedecor", "GeneralizedPareto", "VonMises"]


class ContinuousBernoulli(ExponentialFamily):
    """The continuous Bernoulli distribution on [0, 1] (Loaiza-Ganem and Cunningham, 2019),
    density ``C(p) p^x (1 - p)^(1 - x)``, parameterised by ``probs`` in (0, 1) or ``logits``.

    Near ``probs = 0.5`` the closed forms of the normaliser and moments cancel badly; inside
    ``lims`` (default (0.499, 0.501)) their Taylor expansions about 0.5 are used instead, as in
    PyTorch."""

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.unit_interval
    _mean_carrier_measure = 0
    has_rsample = True

    def __init__(
        self,
        probs: Any = None,
        logits: Any = None,
        lims: tuple = (0.499, 0.501),
        validate_args: bool | None = None,
    ) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        if probs is not None:
            is_scalar = isinstance(probs, (int, float))
            (self.probs,) = broadcast_all(probs)
            # (checked before the clamp below would hide a bad value, as PyTorch does)
            if validate_args is not None and not bool(
                self.arg_constraints["probs"].check(self.probs).all()
            ):
                raise ValueError("The parameter probs has invalid values")
            self.probs = clamp_probs(self.probs)
            param = self.probs
        else:
            is_scalar = isinstance(logits, (int, float))
            (self.logits,) = broadcast_all(logits)
            param = self.logits
        self._param = param
        self._lims = lims
        batch_shape = Size(()) if is_scalar else param.shape
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> ContinuousBernoulli:
        new = self._get_checked_instance(ContinuousBernoulli, _instance)
        new._lims = self._lims
        batch_shape = Size(tuple(batch_shape))
        if "probs" in self.__dict__:
            new.probs = self.probs.expand(batch_shape)
            new._param = new.probs
        if "logits" in self.__dict__:
            new.logits = self.logits.expand(batch_shape)
            new._param = new.logits
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @lazy_property
    def logits(self) -> Tensor:
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self) -> Tensor:
        return clamp_probs(logits_to_probs(self.logits, is_binary=True))

    @property
    def param_shape(self) -> Size:
        return self._param.shape

    def _stable(self) -> Tensor:
        """Where ``probs`` is far enough from 0.5 for the closed forms."""
        return (self.probs <= self._lims[0]) | (self.probs > self._lims[1])

    def _cut_probs(self) -> Tensor:
        # (inside the unstable region a harmless stand-in, so the unused branch stays finite)
        return F.where(self._stable(), self.probs, self._lims[0])

    def _cont_bern_log_norm(self) -> Tensor:
        """log C(p), the log normalising constant as a function of ``probs``."""
        p = self._cut_probs()
        below = F.where(p <= 0.5, p, 0.0)
        above = F.where(p >= 0.5, p, 1.0)
        log_norm = ((-p).log1p() - p.log()).abs().log() - F.where(
            p <= 0.5, (-2.0 * below).log1p(), (2.0 * above - 1.0).log()
        )
        x = (self.probs - 0.5).pow(2)
        taylor = math.log(2.0) + (4.0 / 3.0 + 104.0 / 45.0 * x) * x
        return F.where(self._stable(), log_norm, taylor)

    @property
    def mean(self) -> Tensor:
        p = self._cut_probs()
        closed = p / (2.0 * p - 1.0) + 1.0 / ((-p).log1p() - p.log())
        x = self.probs - 0.5
        taylor = 0.5 + (1.0 / 3.0 + 16.0 / 45.0 * x.pow(2)) * x
        return F.where(self._stable(), closed, taylor)

    @property
    def variance(self) -> Tensor:
        p = self._cut_probs()
        closed = p * (p - 1.0) / (1.0 - 2.0 * p).pow(2) + 1.0 / ((-p).log1p() - p.log()).pow(2)
        x = (self.probs - 0.5).pow(2)
        taylor = 1.0 / 12.0 - (1.0 / 15.0 - 128.0 / 945.0 * x) * x
        return F.where(self._stable(), closed, taylor)

    @property
    def stddev(self) -> Tensor:
        return self.variance.sqrt()

    def sample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        u = F.rand(shape, dtype=self.probs.dtype)
        with _grad_mode.no_grad():
            return self.icdf(u)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        return self.icdf(F.rand(shape, dtype=self.probs.dtype))

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        bce = NF.binary_cross_entropy_with_logits(logits, value, reduction="none")
        return -bce + self._cont_bern_log_norm()

    def cdf(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        p = self._cut_probs()
        closed = (p.pow(value) * (1.0 - p).pow(1.0 - value) + p - 1.0) / (2.0 * p - 1.0)
        inside = F.where(self._stable(), closed, value)
        return F.where(value <= 0.0, 0.0, F.where(value >= 1.0, 1.0, inside))

    def icdf(self, value: Tensor) -> Tensor:
        p = self._cut_probs()
        closed = ((-p + value * (2.0 * p - 1.0)).log1p() - (-p).log1p()) / (p.log() - (-p).log1p())
        return F.where(self._stable(), closed, value)

    def entropy(self) -> Tensor:
        log_q = (-self.probs).log1p()
        log_p = self.probs.log()
        return self.mean * (log_q - log_p) - self._cont_bern_log_norm() - log_q

    @property
    def _natural_params(self) -> tuple:
        return (self.logits,)

    def _log_normalizer(self, x: Tensor) -> Tensor:
        """The log normaliser as a function of the natural parameter (the logits)."""
        stable = (x <= self._lims[0] - 0.5) | (x > self._lims[1] - 0.5)
        cut = F.where(stable, x, self._lims[0] - 0.5)
        log_norm = cut.expm1().abs().log() - cut.abs().log()
        taylor = 0.5 * x + x.pow(2) / 24.0 - x.pow(4) / 2880.0
        return F.where(stable, log_norm, taylor)


class FisherSnedecor(Distribution):
    """The F distribution with ``df1`` and ``df2`` degrees of freedom: the ratio of two
    independent chi-squared draws, each divided by its degrees of freedom."""

    arg_constraints = {"df1": constraints.positive, "df2": constraints.positive}
    support = constraints.positive
    has_rsample = True

    def __init__(self, df1: Any, df2: Any, validate_args: bool | None = None) -> None:
        self.df1, self.df2 = broadcast_all(df1, df2)
        # Gamma(df / 2, rate=df) is chi2(df) / (2 df): the 2s cancel in the ratio
        self._gamma1 = Gamma(self.df1 * 0.5, self.df1)
        self._gamma2 = Gamma(self.df2 * 0.5, self.df2)
        super().__init__(self.df1.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> FisherSnedecor:
        new = _expand_params(self, FisherSnedecor, batch_shape, ("df1", "df2"), _instance)
        new._gamma1 = self._gamma1.expand(new.batch_shape)
        new._gamma2 = self._gamma2.expand(new.batch_shape)
        return new

    @property
    def mean(self) -> Tensor:
        df2 = self.df2
        return F.where(df2 > 2, df2 / (df2 - 2), math.nan)

    @property
    def mode(self) -> Tensor:
        mode = (self.df1 - 2) / self.df1 * self.df2 / (self.df2 + 2)
        return F.where(self.df1 > 2, mode, math.nan)

    @property
    def variance(self) -> Tensor:
        df1, df2 = self.df1, self.df2
        var = 2 * df2.pow(2) * (df1 + df2 - 2) / (df1 * (df2 - 2).pow(2) * (df2 - 4))
        return F.where(df2 > 4, var, math.nan)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        tiny = _finfo(self.df1.dtype).tiny
        x1 = self._gamma1.rsample(sample_shape).reshape(shape)
        x2 = self._gamma2.rsample(sample_shape).reshape(shape).clamp(min=tiny)
        return (x1 / x2).clamp(min=tiny)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        half1, half2 = self.df1 * 0.5, self.df2 * 0.5
        ratio = self.df1 / self.df2
        log_beta = F.lgamma(half1 + half2) - F.lgamma(half1) - F.lgamma(half2)
        return (
            log_beta
            + half1 * ratio.log()
            + (half1 - 1) * value.log()
            - (half1 + half2) * (ratio * value).log1p()
        )


class GeneralizedPareto(Distribution):
    """The generalized Pareto distribution with ``loc``, ``scale`` and ``concentration`` (xi):
    survival function ``(1 + xi z) ** (-1 / xi)`` of ``z = (x - loc) / scale`` (``exp(-z)`` at
    xi = 0).  Its support is ``[loc, inf)`` for xi >= 0 and ``[loc, loc - scale / xi]`` for
    xi < 0."""

    arg_constraints = {
        "loc": constraints.real,
        "scale": constraints.positive,
        "concentration": constraints.real,
    }
    has_rsample = True

    def __init__(
        self, loc: Any, scale: Any, concentration: Any, validate_args: bool | None = None
    ) -> None:
        self.loc, self.scale, self.concentration = broadcast_all(loc, scale, concentration)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> GeneralizedPareto:
        names = ("loc", "scale", "concentration")
        return _expand_params(self, GeneralizedPareto, batch_shape, names, _instance)

    def _zero_and_safe(self) -> tuple:
        """Where xi counts as 0 (``isclose``, as PyTorch's), and xi with those entries made 1
        so that the unused branch stays finite."""
        xi = self.concentration
        at_zero = F.isclose(xi, F.zeros_like(xi))
        return at_zero, F.where(at_zero, 1.0, xi)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        return self.icdf(F.rand(shape, dtype=self.loc.dtype))

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        z = (value - self.loc) / self.scale
        at_zero, xi = self._zero_and_safe()
        y = xi.reciprocal() + F.ones_like(z)
        # (y == 0 at xi = -1, where the density is uniform: no log term)
        nonzero = F.where(y == 0, y, y * (xi * z).log1p())
        return -self.scale.log() - F.where(at_zero, z, nonzero)

    def log_survival_function(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        z = (value - self.loc) / self.scale
        at_zero, xi = self._zero_and_safe()
        return F.where(at_zero, -z, -(xi * z).log1p() / xi)

    def log_cdf(self, value: Tensor) -> Tensor:
        return (-self.log_survival_function(value).exp()).log1p()

    def cdf(self, value: Tensor) -> Tensor:
        return self.log_cdf(value).exp()

    def icdf(self, value: Tensor) -> Tensor:
        at_zero, xi = self._zero_and_safe()
        log_u = (-value).log1p()
        nonzero = self.loc + self.scale / xi * (-xi * log_u).expm1()
        return F.where(at_zero, self.loc - self.scale * log_u, nonzero)

    @property
    def mean(self) -> Tensor:
        valid = self.concentration < 1
        xi = F.where(valid, self.concentration, 0.5)
        return F.where(valid, self.loc + self.scale / (1 - xi), math.nan)

    @property
    def variance(self) -> Tensor:
        valid = self.concentration < 0.5
        xi = F.where(valid, self.concentration, 0.25)
        return F.where(valid, self.scale**2 / ((1 - xi) ** 2 * (1 - 2 * xi)), math.nan)

    @property
    def mode(self) -> Tensor:
        return self.loc

    def entropy(self) -> Tensor:
        return (self.scale.log() + self.concentration + 1).expand(self._batch_shape)

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> Any:
        upper = F.where(
            self.concentration < 0, self.loc - self.scale / self.concentration, math.inf
        )
        return constraints.interval(self.loc, upper)


def _log_bessel_i0(x: Tensor) -> Tensor:
    """log I0(x) for x > 0, through the exponentially scaled Bessel function (no overflow)."""
    return _special.i0e(x).log() + x


class VonMises(Distribution):
    """The von Mises distribution on the circle with mean direction ``loc`` and
    ``concentration``: density ``exp(kappa cos(x - loc)) / (2 pi I0(kappa))``.  ``loc`` and
    values may be any real numbers (angles modulo 2 pi); draws lie in [-pi, pi)."""

    arg_constraints = {"loc": constraints.real, "concentration": constraints.positive}
    support = constraints.real
    has_rsample = False

    def __init__(self, loc: Any, concentration: Any, validate_args: bool | None = None) -> None:
        self.loc, self.concentration = broadcast_all(loc, concentration)
        super().__init__(self.loc.shape, (), validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> VonMises:
        return _expand_params(self, VonMises, batch_shape, ("loc", "concentration"), _instance)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        kappa = self.concentration
        return kappa * (value - self.loc).cos() - math.log(2 * math.pi) - _log_bessel_i0(kappa)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        """Draws by numpy's von Mises sampler (rejection sampling, in float64), wrapped to
        [-pi, pi)."""
        shape = tuple(self._extended_shape(_shape(sample_shape)))
        loc = np.broadcast_to(_host(self.loc, "VonMises.sample()"), shape)
        kappa = np.broadcast_to(_host(self.concentration, "VonMises.sample()"), shape)

        def von_mises(rng: Any, size: tuple) -> np.ndarray:
            centred = rng.vonmises(np.zeros(size), kappa, size)
            return np.mod(centred + math.pi + loc, 2 * math.pi) - math.pi

        with _grad_mode.no_grad():
            return draw(von_mises, shape, self.loc.dtype)

    @property
    def mean(self) -> Tensor:
        """The circular mean: ``loc``."""
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @lazy_property
    def variance(self) -> Tensor:  # type: ignore[override]
        """The circular variance, ``1 - I1(kappa) / I0(kappa)``."""
        kappa = self.concentration
        return 1 - _special.i1e(kappa) / _special.i0e(kappa)
