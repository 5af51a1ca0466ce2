"""Distributions over matrices: LKJCholesky (Cholesky factors of random correlation matrices)
and Wishart (random positive-definite matrices), with PyTorch's parameters and formulas.

Where this sits: over ``multivariate.py`` (Beta draws for the onion method, the precision-to-
Cholesky helper), ``continuous.py`` (Chi2 draws for Bartlett's decomposition, whose implicit
reparameterisation makes Wishart's ``rsample`` differentiable in ``df``) and
``fusegrad.linalg``.

One deliberate difference: PyTorch 2.13's ``Wishart.rsample`` warns "Singular sample detected."
on every call (its test is inverted); here it warns, and redraws, only where a draw is not
positive definite.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from .. import linalg as _linalg
from .. import ops as F
from ..runtime import finfo as _finfo
from ..size import Size
from ..size import broadcast_shapes as _broadcast_shapes
from ..tensor import Tensor
from . import constraints
from .continuous import Chi2, _shape
from .distribution import Distribution, ExponentialFamily
from .multivariate import Beta, _precision_to_scale_tril
from .utils import broadcast_all, lazy_property

__all__ = ["LKJCholesky", "Wishart"]

_LOG_2 = math.log(2)


class LKJCholesky(Distribution):
    """The LKJ distribution over lower Cholesky factors ``L`` of ``dim x dim`` correlation
    matrices: the correlation matrix ``L L^T`` has density proportional to
    ``det(L L^T) ** (concentration - 1)`` (uniform over correlation matrices at 1).  Draws use
    the onion method of Lewandowski, Kurowicka and Joe (2009)."""

    arg_constraints = {"concentration": constraints.positive}
    support = constraints.corr_cholesky

    def __init__(
        self, dim: int, concentration: Any = 1.0, validate_args: bool | None = None
    ) -> None:
        if dim < 2:
            raise ValueError(
                f"Expected dim to be an integer greater than or equal to 2. Found dim={dim}."
            )
        self.dim = dim
        (self.concentration,) = broadcast_all(concentration)
        self._beta = self._row_betas(self.concentration)
        super().__init__(self.concentration.shape, (dim, dim), validate_args=validate_args)

    def _row_betas(self, concentration: Tensor) -> Beta:
        """The laws of the squared norms of the rows' off-diagonal parts: Beta(i / 2,
        eta + (dim - 1 - i) / 2) for row i >= 1 (row 0's is a placeholder: that row has no
        off-diagonal part)."""
        dtype = concentration.dtype
        offset = F.cat([F.zeros(1, dtype=dtype), F.arange(self.dim - 1, dtype=dtype)])
        marginal = concentration + 0.5 * (self.dim - 2)
        return Beta(offset + 0.5, marginal.unsqueeze(-1) - 0.5 * offset)

    def expand(self, batch_shape: Any, _instance: Any = None) -> LKJCholesky:
        new = self._get_checked_instance(LKJCholesky, _instance)
        batch_shape = Size(tuple(batch_shape))
        new.dim = self.dim
        new.concentration = self.concentration.expand(batch_shape)
        new._beta = self._beta.expand(tuple(batch_shape) + (self.dim,))
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def sample(self, sample_shape: Any = ()) -> Tensor:
        # Row i of L is (sqrt(y_i) u_i, sqrt(1 - y_i)) with u_i uniform on the unit sphere of
        # dimension i and y_i the Beta draw: the squared norm of the off-diagonal part.
        sample_shape = _shape(sample_shape)
        y = self._beta.sample(sample_shape).unsqueeze(-1)
        normal = F.randn(tuple(self._extended_shape(sample_shape)), dtype=y.dtype).tril(-1)
        norms = normal.norm(dim=-1, keepdim=True)
        # (row 0 has no off-diagonal part: 0 / 0 there is replaced by 0)
        on_sphere = F.where(norms > 0, normal / F.where(norms > 0, norms, 1.0), 0.0)
        w = y.sqrt() * on_sphere
        tiny = _finfo(w.dtype).tiny
        diagonal = (1 - (w * w).sum(-1)).clamp(min=tiny).sqrt()
        return w + F.diag_embed(diagonal)

    def log_prob(self, value: Tensor) -> Tensor:
        # density of L: prod_i L_ii ** (2 (eta - 1) + dim - i) for i = 2..dim (1-based; the
        # Jacobian of L -> L L^T contributes L_ii ** (dim - i)), over the normaliser of
        # Lewandowski et al. (2009), p. 1999
        if self._validate_args:
            self._validate_sample(value)
        diagonal = value.diagonal(dim1=-1, dim2=-2)[..., 1:]
        index = F.arange(2, self.dim + 1, dtype=self.concentration.dtype)
        order = 2 * (self.concentration - 1).unsqueeze(-1) + self.dim - index
        unnormalized = (order * diagonal.log()).sum(-1)
        dm1 = self.dim - 1
        alpha = self.concentration + 0.5 * dm1
        log_normalizer = (
            0.5 * dm1 * math.log(math.pi) + F.mvlgamma(alpha - 0.5, p=dm1) - F.lgamma(alpha) * dm1
        )
        return unnormalized - log_normalizer


def _mvdigamma(x: Tensor, p: int) -> Tensor:
    """The multivariate digamma function: sum_{i < p} digamma(x - i / 2)."""
    if not bool(x.gt((p - 1) / 2).all()):
        raise AssertionError("Wrong domain for multivariate digamma function.")
    halves = F.arange(p, dtype=x.dtype) / 2
    return F.digamma(x.unsqueeze(-1) - halves).sum(-1)


def _cholesky_solve(B: Tensor, L: Tensor) -> Tensor:
    """(L L^T)^-1 B for lower-triangular L (two triangular solves)."""
    Y = _linalg.solve_triangular(L, B, upper=False)
    return _linalg.solve_triangular(L.transpose(-2, -1), Y, upper=True)


class Wishart(ExponentialFamily):
    """The Wishart distribution of ``df`` degrees of freedom and scale matrix given as one of
    ``covariance_matrix``, ``precision_matrix`` or ``scale_tril`` (its lower Cholesky factor):
    the law of ``sum_k x_k x_k^T`` for ``df`` draws ``x_k ~ N(0, covariance_matrix)``, for any
    real ``df > dim - 1``.  ``rsample`` uses Bartlett's decomposition."""

    support = constraints.positive_definite
    has_rsample = True
    _mean_carrier_measure = 0

    @property
    def arg_constraints(self) -> dict:  # type: ignore[override]
        return {
            "covariance_matrix": constraints.positive_definite,
            "precision_matrix": constraints.positive_definite,
            "scale_tril": constraints.lower_cholesky,
            "df": constraints.greater_than(self.event_shape[-1] - 1),
        }

    def __init__(
        self,
        df: Any,
        covariance_matrix: Tensor | None = None,
        precision_matrix: Tensor | None = None,
        scale_tril: Tensor | None = None,
        validate_args: bool | None = None,
    ) -> None:
        given = [m for m in (covariance_matrix, precision_matrix, scale_tril) if m is not None]
        if len(given) != 1:
            # (an AssertionError, as PyTorch's Wishart raises; MultivariateNormal's is a
            # ValueError)
            raise AssertionError(
                "Exactly one of covariance_matrix or precision_matrix or scale_tril may be "
                "specified."
            )
        param = given[0]
        if param.ndim < 2:
            raise ValueError(
                "scale_tril must be at least two-dimensional, with optional leading batch "
                "dimensions"
            )
        if isinstance(df, (int, float)):
            batch_shape = Size(tuple(param.shape[:-2]))
            self.df = F.tensor(float(df), dtype=param.dtype)
        else:
            batch_shape = Size(_broadcast_shapes(tuple(param.shape[:-2]), tuple(df.shape)))
            self.df = df.expand(batch_shape)
        event_shape = Size(tuple(param.shape[-2:]))
        p = event_shape[-1]
        if bool(self.df.le(p - 1).any()):
            raise ValueError(f"Value of df={df} expected to be greater than ndim - 1 = {p - 1}.")
        matrix_shape = tuple(batch_shape) + (-1, -1)
        if scale_tril is not None:
            self.scale_tril = param.expand(matrix_shape)
        elif covariance_matrix is not None:
            self.covariance_matrix = param.expand(matrix_shape)
        else:
            self.precision_matrix = param.expand(matrix_shape)
        if bool(self.df.lt(p).any()):
            warnings.warn(
                "Low df values detected. Singular samples are highly likely to occur for "
                "ndim - 1 < df < ndim.",
                stacklevel=2,
            )
        super().__init__(batch_shape, event_shape, validate_args=validate_args)
        self._batch_dims = [-(x + 1) for x in range(len(self._batch_shape))]
        if scale_tril is not None:
            self._unbroadcasted_scale_tril = scale_tril
        elif covariance_matrix is not None:
            self._unbroadcasted_scale_tril = _linalg.cholesky(covariance_matrix)
        else:
            self._unbroadcasted_scale_tril = _precision_to_scale_tril(param)
        self._dist_chi2 = self._bartlett_chi2(self.df, batch_shape)

    def _bartlett_chi2(self, df: Tensor, batch_shape: Size) -> Chi2:
        """Chi2(df - i) for i = 0..p-1: the squared diagonal of Bartlett's factor."""
        p = self._event_shape[-1]
        dtype = self._unbroadcasted_scale_tril.dtype
        steps = F.arange(p, dtype=dtype).expand(tuple(batch_shape) + (-1,))
        return Chi2(df.unsqueeze(-1) - steps)

    def expand(self, batch_shape: Any, _instance: Any = None) -> Wishart:
        new = self._get_checked_instance(Wishart, _instance)
        batch_shape = Size(tuple(batch_shape))
        cov_shape = tuple(batch_shape) + tuple(self.event_shape)
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril.expand(cov_shape)
        new.df = self.df.expand(batch_shape)
        new._batch_dims = [-(x + 1) for x in range(len(batch_shape))]
        for name in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if name in self.__dict__:
                setattr(new, name, self.__dict__[name].expand(cov_shape))
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._dist_chi2 = new._bartlett_chi2(new.df, batch_shape)
        new._validate_args = self._validate_args
        return new

    @lazy_property
    def scale_tril(self) -> Tensor:
        return self._unbroadcasted_scale_tril.expand(
            tuple(self._batch_shape) + tuple(self._event_shape)
        )

    @lazy_property
    def covariance_matrix(self) -> Tensor:
        L = self._unbroadcasted_scale_tril
        return (L @ L.transpose(-2, -1)).expand(tuple(self._batch_shape) + tuple(self._event_shape))

    @lazy_property
    def precision_matrix(self) -> Tensor:
        L = self._unbroadcasted_scale_tril
        eye = F.eye(self._event_shape[-1], dtype=L.dtype)
        return _cholesky_solve(eye, L).expand(tuple(self._batch_shape) + tuple(self._event_shape))

    def _df_matrix(self) -> Tensor:
        return self.df.reshape(tuple(self._batch_shape) + (1, 1))

    @property
    def mean(self) -> Tensor:
        return self._df_matrix() * self.covariance_matrix

    @property
    def mode(self) -> Tensor:
        factor = self.df - self.covariance_matrix.shape[-1] - 1
        factor = F.where(factor <= 0, math.nan, factor)
        return factor.reshape(tuple(self._batch_shape) + (1, 1)) * self.covariance_matrix

    @property
    def variance(self) -> Tensor:
        V = self.covariance_matrix
        diagonal = V.diagonal(dim1=-2, dim2=-1)
        return self._df_matrix() * (V.pow(2) + diagonal.unsqueeze(-1) * diagonal.unsqueeze(-2))

    def _bartlett_sampling(self, sample_shape: Size) -> Tensor:
        """L A A^T L^T with A lower triangular: sqrt(chi2(df - i)) on the diagonal, standard
        normals below it."""
        p = self._event_shape[-1]
        eps = _finfo(self._unbroadcasted_scale_tril.dtype).eps
        diagonal = self._dist_chi2.rsample(sample_shape).sqrt().clamp(min=eps)
        shape = tuple(sample_shape) + tuple(self._batch_shape) + (p, p)
        below = F.randn(shape, dtype=diagonal.dtype).tril(-1)
        chol = self._unbroadcasted_scale_tril @ (below + F.diag_embed(diagonal))
        return chol @ chol.transpose(-2, -1)

    def rsample(self, sample_shape: Any = (), max_try_correction: int | None = None) -> Tensor:
        """Draws by Bartlett's decomposition.  Draws that are not numerically positive
        definite (likely for ``df`` below the dimension) are redrawn up to
        ``max_try_correction`` times (default 10), with a warning; some may stay singular
        (their ``log_prob`` is then -inf)."""
        if max_try_correction is None:
            max_try_correction = 10
        sample_shape = _shape(sample_shape)
        sample = self._bartlett_sampling(sample_shape)
        singular = ~self.support.check(sample)
        if not bool(singular.any()):
            return sample
        warnings.warn("Singular sample detected.", stacklevel=2)
        for _ in range(max_try_correction):
            redraw = self._bartlett_sampling(sample_shape)
            sample = F.where(singular.unsqueeze(-1).unsqueeze(-1), redraw, sample)
            singular = singular & ~self.support.check(redraw)
            if not bool(singular.any()):
                break
        return sample

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        nu = self.df
        p = self._event_shape[-1]
        L = self._unbroadcasted_scale_tril
        log_det_scale = L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        trace = _cholesky_solve(value, L).diagonal(dim1=-2, dim2=-1).sum(-1)
        return (
            -nu * (p * _LOG_2 / 2 + log_det_scale)
            - F.mvlgamma(nu / 2, p=p)
            + (nu - p - 1) / 2 * _linalg.slogdet(value).logabsdet
            - trace / 2
        )

    def entropy(self) -> Tensor:
        nu = self.df
        p = self._event_shape[-1]
        log_det_scale = self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return (
            (p + 1) * (p * _LOG_2 / 2 + log_det_scale)
            + F.mvlgamma(nu / 2, p=p)
            - (nu - p - 1) / 2 * _mvdigamma(nu / 2, p=p)
            + nu * p / 2
        )

    @property
    def _natural_params(self) -> tuple:
        p = self._event_shape[-1]
        return -self.precision_matrix / 2, (self.df - p - 1) / 2

    def _log_normalizer(self, x: Tensor, y: Tensor) -> Tensor:
        p = self._event_shape[-1]
        shifted = y + (p + 1) / 2
        return shifted * (-_linalg.slogdet(-2 * x).logabsdet + _LOG_2 * p) + F.mvlgamma(
            shifted, p=p
        )
