"""Families that are simple distributions pushed through fixed transforms, as PyTorch defines
them: Pareto (exp of an exponential, scaled), Weibull (a power of a unit exponential, scaled),
InverseGamma (the reciprocal of a Gamma draw), Kumaraswamy (powers of a uniform) and
LogisticNormal (a normal vector through the stick-breaking transform onto the simplex).

Where this sits: over ``TransformedDistribution`` (``transformed.py``), whose ``log_prob``,
``cdf``, ``icdf`` and ``rsample`` they inherit; each adds its closed-form moments and entropy.
Gradients of ``rsample`` follow from the base draw's (InverseGamma's through Gamma's implicit
reparameterisation).
"""

from __future__ import annotations

import math
from typing import Any

from .. import ops as F
from ..size import Size
from ..tensor import Tensor
from . import constraints
from .continuous import Exponential, Gamma, Normal, Uniform
from .transformed import TransformedDistribution
from .transforms import AffineTransform, ExpTransform, PowerTransform, StickBreakingTransform
from .utils import broadcast_all, euler_constant

__all__ = ["InverseGamma", "Kumaraswamy", "LogisticNormal", "Pareto", "Weibull"]


class Pareto(TransformedDistribution):
    """The Pareto (type I) distribution with ``scale`` (the lower end of the support) and
    shape ``alpha``: ``scale * exp(E)`` for ``E ~ Exponential(alpha)``."""

    arg_constraints = {"alpha": constraints.positive, "scale": constraints.positive}
    has_rsample = True

    def __init__(self, scale: Any, alpha: Any, validate_args: bool | None = None) -> None:
        self.scale, self.alpha = broadcast_all(scale, alpha)
        base_dist = Exponential(self.alpha, validate_args=validate_args)
        steps = [ExpTransform(), AffineTransform(loc=0, scale=self.scale)]
        super().__init__(base_dist, steps, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> Pareto:
        new = self._get_checked_instance(Pareto, _instance)
        new.scale = self.scale.expand(tuple(batch_shape))
        new.alpha = self.alpha.expand(tuple(batch_shape))
        return super().expand(batch_shape, _instance=new)  # type: ignore[return-value]

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> Any:
        return constraints.greater_than_eq(self.scale)

    @property
    def mean(self) -> Tensor:
        # infinite for alpha <= 1 (the clamp makes the division by zero give inf, as PyTorch's)
        a = self.alpha.clamp(min=1)
        return a * self.scale / (a - 1)

    @property
    def mode(self) -> Tensor:
        return self.scale

    @property
    def variance(self) -> Tensor:
        a = self.alpha.clamp(min=2)  # infinite for alpha <= 2
        return self.scale.pow(2) * a / ((a - 1).pow(2) * (a - 2))

    def entropy(self) -> Tensor:
        return (self.scale / self.alpha).log() + (1 + self.alpha.reciprocal())


class Weibull(TransformedDistribution):
    """The two-parameter Weibull distribution with ``scale`` (lambda) and ``concentration``
    (k): ``scale * E ** (1 / k)`` for a unit exponential ``E``."""

    arg_constraints = {"scale": constraints.positive, "concentration": constraints.positive}
    support = constraints.positive
    has_rsample = True

    def __init__(self, scale: Any, concentration: Any, validate_args: bool | None = None) -> None:
        self.scale, self.concentration = broadcast_all(scale, concentration)
        self.concentration_reciprocal = self.concentration.reciprocal()
        base_dist = Exponential(F.ones_like(self.scale), validate_args=validate_args)
        super().__init__(base_dist, self._steps(), validate_args=validate_args)

    def _steps(self) -> list:
        return [
            PowerTransform(exponent=self.concentration_reciprocal),
            AffineTransform(loc=0, scale=self.scale),
        ]

    def expand(self, batch_shape: Any, _instance: Any = None) -> Weibull:
        new = self._get_checked_instance(Weibull, _instance)
        batch_shape = Size(tuple(batch_shape))
        new.scale = self.scale.expand(batch_shape)
        new.concentration = self.concentration.expand(batch_shape)
        new.concentration_reciprocal = new.concentration.reciprocal()
        # (the transforms hold the parameters: rebuilt from the expanded ones)
        TransformedDistribution.__init__(
            new, self.base_dist.expand(batch_shape), new._steps(), validate_args=False
        )
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self) -> Tensor:
        return self.scale * F.lgamma(1 + self.concentration_reciprocal).exp()

    @property
    def mode(self) -> Tensor:
        k = self.concentration
        return self.scale * ((k - 1) / k) ** k.reciprocal()

    @property
    def variance(self) -> Tensor:
        inv_k = self.concentration_reciprocal
        return self.scale.pow(2) * (F.lgamma(1 + 2 * inv_k).exp() - (2 * F.lgamma(1 + inv_k)).exp())

    def entropy(self) -> Tensor:
        inv_k = self.concentration_reciprocal
        return euler_constant * (1 - inv_k) + (self.scale * inv_k).log() + 1


class InverseGamma(TransformedDistribution):
    """The inverse Gamma distribution: ``1 / X`` for ``X ~ Gamma(concentration, rate)``."""

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.positive
    has_rsample = True

    def __init__(self, concentration: Any, rate: Any, validate_args: bool | None = None) -> None:
        base_dist = Gamma(concentration, rate, validate_args=validate_args)
        minus_one = F.full((), -1.0, dtype=base_dist.rate.dtype)
        super().__init__(base_dist, PowerTransform(minus_one), validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> InverseGamma:
        new = self._get_checked_instance(InverseGamma, _instance)
        return super().expand(batch_shape, _instance=new)  # type: ignore[return-value]

    @property
    def concentration(self) -> Tensor:
        return self.base_dist.concentration

    @property
    def rate(self) -> Tensor:
        return self.base_dist.rate

    @property
    def mean(self) -> Tensor:
        result = self.rate / (self.concentration - 1)
        return F.where(self.concentration > 1, result, math.inf)

    @property
    def mode(self) -> Tensor:
        return self.rate / (self.concentration + 1)

    @property
    def variance(self) -> Tensor:
        a = self.concentration
        result = self.rate.square() / ((a - 1).square() * (a - 2))
        return F.where(a > 2, result, math.inf)

    def entropy(self) -> Tensor:
        a = self.concentration
        return a + self.rate.log() + F.lgamma(a) - (1 + a) * F.digamma(a)


def _kumaraswamy_moment(a: Tensor, b: Tensor, n: int) -> Tensor:
    """E[X^n] of Kumaraswamy(a, b): b * B(1 + n / a, b)."""
    first = 1 + n / a
    return b * (F.lgamma(first) + F.lgamma(b) - F.lgamma(first + b)).exp()


class Kumaraswamy(TransformedDistribution):
    """The Kumaraswamy distribution on [0, 1] with ``concentration1`` (a) and
    ``concentration0`` (b): ``(1 - U ** (1 / b)) ** (1 / a)`` for a uniform ``U``."""

    arg_constraints = {
        "concentration1": constraints.positive,
        "concentration0": constraints.positive,
    }
    support = constraints.unit_interval
    has_rsample = True

    def __init__(
        self, concentration1: Any, concentration0: Any, validate_args: bool | None = None
    ) -> None:
        self.concentration1, self.concentration0 = broadcast_all(concentration1, concentration0)
        base_dist = Uniform(
            F.zeros_like(self.concentration0),
            F.ones_like(self.concentration0),
            validate_args=validate_args,
        )
        steps = [
            PowerTransform(exponent=self.concentration0.reciprocal()),
            AffineTransform(loc=1.0, scale=-1.0),
            PowerTransform(exponent=self.concentration1.reciprocal()),
        ]
        super().__init__(base_dist, steps, validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> Kumaraswamy:
        new = self._get_checked_instance(Kumaraswamy, _instance)
        new.concentration1 = self.concentration1.expand(tuple(batch_shape))
        new.concentration0 = self.concentration0.expand(tuple(batch_shape))
        return super().expand(batch_shape, _instance=new)  # type: ignore[return-value]

    @property
    def mean(self) -> Tensor:
        return _kumaraswamy_moment(self.concentration1, self.concentration0, 1)

    @property
    def mode(self) -> Tensor:
        # ((a - 1) / (a b - 1)) ** (1 / a) where a, b >= 1 (not both 1); nan elsewhere.
        # (PyTorch 2.13's formula takes log1p(-b) and so returns nan for every b > 1.)
        a, b = self.concentration1, self.concentration0
        defined = (a >= 1) & (b >= 1) & ((a > 1) | (b > 1))
        mode = ((a - 1) / (a * b - 1)).clamp(min=0) ** a.reciprocal()
        return F.where(defined, mode, math.nan)

    @property
    def variance(self) -> Tensor:
        a, b = self.concentration1, self.concentration0
        return _kumaraswamy_moment(a, b, 2) - self.mean.pow(2)

    def entropy(self) -> Tensor:
        a, b = self.concentration1, self.concentration0
        harmonic_b = F.digamma(b + 1) + euler_constant  # the harmonic number H_b
        return (1 - b.reciprocal()) + (1 - a.reciprocal()) * harmonic_b - a.log() - b.log()


class LogisticNormal(TransformedDistribution):
    """The logistic-normal distribution on the simplex: a ``Normal(loc, scale)`` vector of
    length K - 1 pushed through the stick-breaking transform to K probabilities."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, loc: Any, scale: Any, validate_args: bool | None = None) -> None:
        base_dist = Normal(loc, scale, validate_args=validate_args)
        if not base_dist.batch_shape:  # (scalars make one-component vectors, as in PyTorch)
            base_dist = base_dist.expand((1,))
        super().__init__(base_dist, StickBreakingTransform(), validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> LogisticNormal:
        new = self._get_checked_instance(LogisticNormal, _instance)
        return super().expand(batch_shape, _instance=new)  # type: ignore[return-value]

    @property
    def loc(self) -> Tensor:
        return self.base_dist.base_dist.loc

    @property
    def scale(self) -> Tensor:
        return self.base_dist.base_dist.scale
