"""``fusegrad.distributions``: PyTorch's ``torch.distributions`` -- the ``Distribution`` base
(batch and event shapes, ``sample``/``rsample``, ``log_prob``, ``cdf``/``icdf``, ``entropy``,
moments, ``expand``, argument validation), constraints and transforms, the distributions, and
``kl_divergence`` with its registry (``docs/distributions.md``).

Where this sits: above the op surface, ``fusegrad.special`` and ``fusegrad.linalg`` (for the
multivariate normals); loaded on first use of ``fusegrad.distributions``.
"""

from __future__ import annotations

from . import constraints, transforms
from .constraint_registry import biject_to, transform_to
from .continuous import Cauchy, Chi2, Exponential, Gamma, Gumbel, Laplace, Normal, StudentT, Uniform
from .continuous_extra import ContinuousBernoulli, FisherSnedecor, GeneralizedPareto, VonMises
from .discrete import (
    Bernoulli,
    Binomial,
    Categorical,
    Geometric,
    Multinomial,
    NegativeBinomial,
    OneHotCategorical,
    OneHotCategoricalStraightThrough,
    Poisson,
)
from .distribution import Distribution, ExponentialFamily
from .kl import kl_divergence, register_kl
from .matrix import LKJCholesky, Wishart
from .multivariate import Beta, Dirichlet, LowRankMultivariateNormal, MultivariateNormal
from .transformed import (
    HalfCauchy,
    HalfNormal,
    Independent,
    LogNormal,
    MixtureSameFamily,
    RelaxedBernoulli,
    RelaxedOneHotCategorical,
    TransformedDistribution,
)
from .transformed_families import InverseGamma, Kumaraswamy, LogisticNormal, Pareto, Weibull
from .transforms import (
    AbsTransform,
    AffineTransform,
    CatTransform,
    ComposeTransform,
    CorrCholeskyTransform,
    CumulativeDistributionTransform,
    ExpTransform,
    IndependentTransform,
    LowerCholeskyTransform,
    PositiveDefiniteTransform,
    PowerTransform,
    ReshapeTransform,
    SigmoidTransform,
    SoftmaxTransform,
    SoftplusTransform,
    StackTransform,
    StickBreakingTransform,
    TanhTransform,
    Transform,
    identity_transform,
)

__all__ = [
    "AbsTransform",
    "AffineTransform",
    "Bernoulli",
    "Beta",
    "Binomial",
    "CatTransform",
    "Categorical",
    "Cauchy",
    "Chi2",
    "ComposeTransform",
    "ContinuousBernoulli",
    "CorrCholeskyTransform",
    "CumulativeDistributionTransform",
    "Dirichlet",
    "Distribution",
    "ExpTransform",
    "Exponential",
    "ExponentialFamily",
    "FisherSnedecor",
    "Gamma",
    "GeneralizedPareto",
    "Geometric",
    "Gumbel",
    "HalfCauchy",
    "HalfNormal",
    "Independent",
    "IndependentTransform",
    "InverseGamma",
    "Kumaraswamy",
    "LKJCholesky",
    "Laplace",
    "LogNormal",
    "LogisticNormal",
    "LowRankMultivariateNormal",
    "LowerCholeskyTransform",
    "MixtureSameFamily",
    "Multinomial",
    "MultivariateNormal",
    "NegativeBinomial",
    "Normal",
    "OneHotCategorical",
    "OneHotCategoricalStraightThrough",
    "Pareto",
    "Poisson",
    "PositiveDefiniteTransform",
    "PowerTransform",
    "RelaxedBernoulli",
    "RelaxedOneHotCategorical",
    "ReshapeTransform",
    "SigmoidTransform",
    "SoftmaxTransform",
    "SoftplusTransform",
    "StackTransform",
    "StickBreakingTransform",
    "StudentT",
    "TanhTransform",
    "Transform",
    "TransformedDistribution",
    "Uniform",
    "VonMises",
    "Weibull",
    "Wishart",
    "biject_to",
    "constraints",
    "identity_transform",
    "kl_divergence",
    "register_kl",
    "transform_to",
    "transforms",
]
