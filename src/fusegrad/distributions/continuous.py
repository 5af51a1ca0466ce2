"""Univariate continuous distributions: Normal, Uniform, Exponential, Laplace, Cauchy, Gumbel,
StudentT, Gamma, Chi2 (PyTorch's formulas for ``log_prob``,
``cdf``, ``icdf``, ``entropy`` and moments).

Where this sits: over ``Distribution`` and the op surface; ``LogNormal``/``HalfNormal`` are
transformed distributions (``transformed.py``).  Reparameterised sampling: location-scale
families transform standard draws; ``Gamma`` (and through it ``Chi2``, ``Beta`` and
``Dirichlet``) uses implicit reparameterisation: the draw's derivative with respect to the
concentration is ``-dF/dalpha / dF/dx`` of its CDF ``F`` (``_standard_gamma``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import ops as F
from ..autograd import grad_mode as _grad_mode
from ..autograd.function import Function
from ..runtime import finfo as _finfo
from ..size import Size
from ..tensor import Tensor
from . import constraints
from .distribution import Distribution, ExponentialFamily
from .utils import broadcast_all, euler_constant, standard_gamma_values

__all__ = [
    "Cauchy",
    "Chi2",
    "Exponential",
    "Gamma",
    "Gumbel",
    "Laplace",
    "Normal",
    "StudentT",
    "Uniform",
]


def _shape(sample_shape: Any) -> Size:
    return sample_shape if isinstance(sample_shape, Size) else Size(tuple(sample_shape))


def _expand_params(
    self: Distribution, cls: type, batch_shape: Any, names: tuple, _instance: Any
) -> Any:
    new = self._get_checked_instance(cls, _instance)
    batch_shape = Size(tuple(batch_shape))
    for name in names:
        setattr(new, name, getattr(self, name).expand(batch_shape))
    Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
    new._validate_args = self._validate_args
    return new


class Normal(ExponentialFamily):
    """The normal distribution with mean ``loc`` and standard deviation ``scale``."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True
    _mean_carrier_measure = 0

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def stddev(self) -> Tensor:
        return self.scale

    @property
    def variance(self) -> Tensor:
        return self.stddev.pow(2)

    def __init__(self, loc: Any, scale: Any, validate_args: bool | None = None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> Normal:
        return _expand_params(self, Normal, batch_shape, ("loc", "scale"), _instance)

    def sample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        with _grad_mode.no_grad():
            return F.normal(self.loc.expand(shape), self.scale.expand(shape))

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        eps = F.randn(shape, dtype=self.loc.dtype)
        return self.loc + eps * self.scale

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        var = self.scale**2
        log_scale = self.scale.log()
        return -((value - self.loc) ** 2) / (2 * var) - log_scale - math.log(math.sqrt(2 * math.pi))

    def cdf(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 * (1 + F.erf((value - self.loc) * self.scale.reciprocal() / math.sqrt(2)))

    def icdf(self, value: Tensor) -> Tensor:
        return self.loc + self.scale * F.erfinv(2 * value - 1) * math.sqrt(2)

    def entropy(self) -> Tensor:
        return 0.5 + 0.5 * math.log(2 * math.pi) + self.scale.log()

    @property
    def _natural_params(self) -> tuple:
        return (self.loc / self.scale.pow(2), -0.5 * self.scale.pow(2).reciprocal())

    def _log_normalizer(self, x: Tensor, y: Tensor) -> Tensor:
        return -0.25 * x.pow(2) / y + 0.5 * (-math.pi / y).log()


class Uniform(Distribution):
    """The uniform distribution on ``[low, high)``."""

    arg_constraints = {
        "low": constraints.dependent(is_discrete=False, event_dim=0),
        "high": constraints.dependent(is_discrete=False, event_dim=0),
    }
    has_rsample = True

    @property
    def mean(self) -> Tensor:
        return (self.high + self.low) / 2

    @property
    def mode(self) -> Tensor:
        return F.full_like(self.high, math.nan)

    @property
    def stddev(self) -> Tensor:
        return (self.high - self.low) / 12**0.5

    @property
    def variance(self) -> Tensor:
        return (self.high - self.low).pow(2) / 12

    def __init__(self, low: Any, high: Any, validate_args: bool | None = None) -> None:
        self.low, self.high = broadcast_all(low, high)
        super().__init__(self.low.shape, validate_args=validate_args)
        if self._validate_args and not bool(F.lt(self.low, self.high).all()):
            raise ValueError("Uniform is not defined when low>= high")

    def expand(self, batch_shape: Any, _instance: Any = None) -> Uniform:
        return _expand_params(self, Uniform, batch_shape, ("low", "high"), _instance)

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> Any:
        return constraints.interval(self.low, self.high)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        rand = F.rand(shape, dtype=self.low.dtype)
        return self.low + rand * (self.high - self.low)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        lb = self.low.le(value).to(self.low.dtype)
        ub = self.high.gt(value).to(self.low.dtype)
        return (lb * ub).log() - (self.high - self.low).log()

    def cdf(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        result = (value - self.low) / (self.high - self.low)
        return result.clamp(min=0, max=1)

    def icdf(self, value: Tensor) -> Tensor:
        return value * (self.high - self.low) + self.low

    def entropy(self) -> Tensor:
        return (self.high - self.low).log()


class Exponential(ExponentialFamily):
    """The exponential distribution with rate ``rate``."""

    arg_constraints = {"rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True
    _mean_carrier_measure = 0

    @property
    def mean(self) -> Tensor:
        return self.rate.reciprocal()

    @property
    def mode(self) -> Tensor:
        return F.zeros_like(self.rate)

    @property
    def stddev(self) -> Tensor:
        return self.rate.reciprocal()

    @property
    def variance(self) -> Tensor:
        return self.rate.pow(-2)

    def __init__(self, rate: Any, validate_args: bool | None = None) -> None:
        (self.rate,) = broadcast_all(rate)
        super().__init__(self.rate.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> Exponential:
        return _expand_params(self, Exponential, batch_shape, ("rate",), _instance)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        u = F.rand(shape, dtype=self.rate.dtype)
        # -log(1 - u) of a uniform u in [0, 1): an exponential draw that is never infinite
        return -(-u).log1p() / self.rate

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return self.rate.log() - self.rate * value

    def cdf(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return 1 - (-self.rate * value).exp()

    def icdf(self, value: Tensor) -> Tensor:
        return -(-value).log1p() / self.rate

    def entropy(self) -> Tensor:
        return 1.0 - self.rate.log()

    @property
    def _natural_params(self) -> tuple:
        return (-self.rate,)

    def _log_normalizer(self, x: Tensor) -> Tensor:
        return -(-x).log()


class Laplace(Distribution):
    """The Laplace distribution with location ``loc`` and scale ``scale``."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        return 2 * self.scale.pow(2)

    @property
    def stddev(self) -> Tensor:
        return (2**0.5) * self.scale

    def __init__(self, loc: Any, scale: Any, validate_args: bool | None = None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> Laplace:
        return _expand_params(self, Laplace, batch_shape, ("loc", "scale"), _instance)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        finfo = _finfo(self.loc.dtype)
        u = F.rand(shape, dtype=self.loc.dtype) * 2 - 1
        u = u.clamp(min=finfo.eps - 1, max=1)  # (PyTorch's open interval (-1, 1))
        return self.loc - self.scale * u.sign() * (-u.abs()).log1p()

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return -(2 * self.scale).log() - (value - self.loc).abs() / self.scale

    def cdf(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return (
            0.5 - 0.5 * (value - self.loc).sign() * (-(value - self.loc).abs() / self.scale).expm1()
        )

    def icdf(self, value: Tensor) -> Tensor:
        term = value - 0.5
        return self.loc - self.scale * term.sign() * (-2 * term.abs()).log1p()

    def entropy(self) -> Tensor:
        return 1 + (2 * self.scale).log()


class Cauchy(Distribution):
    """The Cauchy distribution with location ``loc`` and scale ``scale``."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc: Any, scale: Any, validate_args: bool | None = None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> Cauchy:
        return _expand_params(self, Cauchy, batch_shape, ("loc", "scale"), _instance)

    @property
    def mean(self) -> Tensor:
        return F.full(self._extended_shape(), math.nan, dtype=self.loc.dtype)

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        return F.full(self._extended_shape(), math.inf, dtype=self.loc.dtype)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        u = F.rand(shape, dtype=self.loc.dtype)
        eps = (math.pi * (u - 0.5)).tan()  # a standard Cauchy draw
        return self.loc + eps * self.scale

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return (
            -math.log(math.pi) - self.scale.log() - (((value - self.loc) / self.scale) ** 2).log1p()
        )

    def cdf(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return F.atan((value - self.loc) / self.scale) / math.pi + 0.5

    def icdf(self, value: Tensor) -> Tensor:
        return (math.pi * (value - 0.5)).tan() * self.scale + self.loc

    def entropy(self) -> Tensor:
        return math.log(4 * math.pi) + self.scale.log()


class StudentT(Distribution):
    """Student's t distribution with ``df`` degrees of freedom, ``loc`` and ``scale``."""

    arg_constraints = {
        "df": constraints.positive,
        "loc": constraints.real,
        "scale": constraints.positive,
    }
    support = constraints.real
    has_rsample = True

    @property
    def mean(self) -> Tensor:
        m = self.loc.clone()
        return F.where(self.df <= 1, math.nan, m)

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        m = self.scale.pow(2) * self.df / (self.df - 2)
        m = F.where(self.df <= 2, math.inf, m)
        return F.where(self.df <= 1, math.nan, m)

    def __init__(
        self, df: Any, loc: Any = 0.0, scale: Any = 1.0, validate_args: bool | None = None
    ) -> None:
        self.df, self.loc, self.scale = broadcast_all(df, loc, scale)
        self._chi2 = Chi2(self.df)
        super().__init__(self.df.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> StudentT:
        new = _expand_params(self, StudentT, batch_shape, ("df", "loc", "scale"), _instance)
        new._chi2 = self._chi2.expand(Size(tuple(batch_shape)))
        return new

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        # X ~ Normal(0, 1), Z ~ Chi2(df): Y = X / sqrt(Z / df) ~ StudentT(df)
        shape = self._extended_shape(_shape(sample_shape))
        x = F.randn(shape, dtype=self.df.dtype)
        z = self._chi2.rsample(sample_shape)
        y = x * (z / self.df).rsqrt()
        return self.loc + self.scale * y

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        y = (value - self.loc) / self.scale
        z = (
            self.scale.log()
            + 0.5 * self.df.log()
            + 0.5 * math.log(math.pi)
            + F.lgamma(0.5 * self.df)
            - F.lgamma(0.5 * (self.df + 1.0))
        )
        return -0.5 * (self.df + 1.0) * (y**2.0 / self.df).log1p() - z

    def entropy(self) -> Tensor:
        lbeta = F.lgamma(0.5 * self.df) + math.lgamma(0.5) - F.lgamma(0.5 * (self.df + 1))
        return (
            self.scale.log()
            + 0.5 * (self.df + 1) * (F.digamma(0.5 * (self.df + 1)) - F.digamma(0.5 * self.df))
            + 0.5 * self.df.log()
            + lbeta
        )


class Gumbel(Distribution):
    """The Gumbel distribution with location ``loc`` and scale ``scale``."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc: Any, scale: Any, validate_args: bool | None = None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> Gumbel:
        return _expand_params(self, Gumbel, batch_shape, ("loc", "scale"), _instance)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        finfo = _finfo(self.loc.dtype)
        u = F.rand(shape, dtype=self.loc.dtype).clamp(min=finfo.tiny, max=1 - finfo.eps)
        return self.loc - self.scale * (-u.log()).log()

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        y = (self.loc - value) / self.scale
        return (y - y.exp()) - self.scale.log()

    def cdf(self, value: Tensor) -> Tensor:
        return (-(-(value - self.loc) / self.scale).exp()).exp()

    def icdf(self, value: Tensor) -> Tensor:
        return self.loc - self.scale * (-value.log()).log()

    @property
    def mean(self) -> Tensor:
        return self.loc + self.scale * euler_constant

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def stddev(self) -> Tensor:
        return (math.pi / math.sqrt(6)) * self.scale

    @property
    def variance(self) -> Tensor:
        return self.stddev.pow(2)

    def entropy(self) -> Tensor:
        return self.scale.log() + (1 + euler_constant)


# ---- Gamma and its family: implicit reparameterisation --------------------------------------


def standard_gamma_grad(x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """d x / d alpha of a Gamma(alpha, 1) draw x, by the implicit function theorem:
    -(dP/dalpha)(alpha, x) / p(x; alpha), with P the regularised lower incomplete gamma
    function and p the density.  dP/dalpha is the derivative of P's series
    sum_n exp((alpha + n) log x - x - lgamma(alpha + n + 1)), summed until its terms are
    negligible (in log space; about x + 40 sqrt(x) + 60 terms)."""
    from scipy import special  # (scipy: a dependency, imported on the first draw's gradient)

    x = np.asarray(x, dtype=np.float64)
    alpha = np.asarray(alpha, dtype=np.float64)
    x, alpha = np.broadcast_arrays(x, alpha)
    log_x = np.log(x)
    total = np.zeros_like(x)
    n_max = int(np.max(x + 40 * np.sqrt(x) + 60)) if x.size else 0
    for n in range(n_max):
        a = alpha + n
        log_term = a * log_x - x - special.gammaln(a + 1)
        term = np.exp(log_term) * (log_x - special.digamma(a + 1))
        total += term
        if n > 10 and np.all((np.abs(term) <= 1e-17 * np.abs(total)) | (log_term < -745)):
            break
    log_density = (alpha - 1) * log_x - x - special.gammaln(alpha)
    return -total / np.exp(log_density)


class _StandardGamma(Function):
    """``draw`` (Gamma(concentration, 1) samples) as a function of ``concentration``, with the
    implicit-reparameterisation derivative (PyTorch's ``_standard_gamma`` backward)."""

    @staticmethod
    def forward(ctx: Any, concentration: Tensor, draw: Tensor) -> Tensor:
        ctx.save_for_backward(concentration, draw)
        return draw.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        concentration, draw = ctx.saved_tensors
        slope = standard_gamma_grad(draw.detach().numpy(), concentration.detach().numpy())
        slope_t = F.tensor(slope.astype(draw.dtype.np))
        return grad * slope_t, None


def _standard_gamma(concentration: Tensor, shape: tuple) -> Tensor:
    draw = standard_gamma_values(concentration, tuple(shape))
    return _StandardGamma.apply(concentration.expand(tuple(shape)), draw)


class Gamma(ExponentialFamily):
    """The Gamma distribution with ``concentration`` (shape) and ``rate``."""

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True
    _mean_carrier_measure = 0

    @property
    def mean(self) -> Tensor:
        return self.concentration / self.rate

    @property
    def mode(self) -> Tensor:
        return ((self.concentration - 1) / self.rate).clamp(min=0)

    @property
    def variance(self) -> Tensor:
        return self.concentration / self.rate.pow(2)

    def __init__(self, concentration: Any, rate: Any, validate_args: bool | None = None) -> None:
        self.concentration, self.rate = broadcast_all(concentration, rate)
        super().__init__(self.concentration.shape, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> Gamma:
        return _expand_params(self, Gamma, batch_shape, ("concentration", "rate"), _instance)

    def rsample(self, sample_shape: Any = ()) -> Tensor:
        shape = self._extended_shape(_shape(sample_shape))
        value = _standard_gamma(self.concentration, shape) / self.rate.expand(shape)
        tiny = _finfo(value.dtype).tiny
        return value.clamp(min=tiny)

    def log_prob(self, value: Tensor) -> Tensor:
        value = F.as_tensor(value, dtype=self.rate.dtype)
        if self._validate_args:
            self._validate_sample(value)
        return (
            F.xlogy(self.concentration, self.rate)
            + F.xlogy(self.concentration - 1, value)
            - self.rate * value
            - F.lgamma(self.concentration)
        )

    def entropy(self) -> Tensor:
        return (
            self.concentration
            - self.rate.log()
            + F.lgamma(self.concentration)
            + (1.0 - self.concentration) * F.digamma(self.concentration)
        )

    @property
    def _natural_params(self) -> tuple:
        return (self.concentration - 1, -self.rate)

    def _log_normalizer(self, x: Tensor, y: Tensor) -> Tensor:
        return F.lgamma(x + 1) + (x + 1) * (-y.reciprocal()).log()

    def cdf(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return F.special_ops.gammainc(self.concentration, self.rate * value)


class Chi2(Gamma):
    """The chi-squared distribution with ``df`` degrees of freedom (Gamma(df / 2, 1 / 2))."""

    arg_constraints = {"df": constraints.positive}

    def __init__(self, df: Any, validate_args: bool | None = None) -> None:
        (df,) = broadcast_all(df)
        super().__init__(0.5 * df, F.full_like(df, 0.5), validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> Chi2:
        new = self._get_checked_instance(Chi2, _instance)
        return super().expand(batch_shape, new)  # type: ignore[return-value]

    @property
    def df(self) -> Tensor:
        return self.concentration * 2
