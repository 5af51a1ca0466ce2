"""``fusegrad.special``: every function of ``torch.special``, with PyTorch's names, signatures,
promotion and derivatives (``docs/special.md``).

Where this sits: the public namespace only.  The functions are the op surface's
(``fusegrad.ops.special_ops`` for the special functions proper, ``fusegrad.ops`` for those PyTorch
also has at top level: ``erf``, ``lgamma``, ``softmax``, ...); their primitives are recorded in
``fusegrad/ops/special_functions.py`` and differentiated by the one derivative table.
"""

from __future__ import annotations

from typing import Any

from .. import ops as _ops
from ..ops.special_ops import (
    airy_ai,
    bessel_j0,
    bessel_j1,
    bessel_y0,
    bessel_y1,
    chebyshev_polynomial_t,
    chebyshev_polynomial_u,
    chebyshev_polynomial_v,
    chebyshev_polynomial_w,
    entr,
    erfcx,
    gammainc,
    gammaincc,
    hermite_polynomial_h,
    hermite_polynomial_he,
    i0,
    i0e,
    i1,
    i1e,
    laguerre_polynomial_l,
    legendre_polynomial_p,
    log_ndtr,
    modified_bessel_i0,
    modified_bessel_i1,
    modified_bessel_k0,
    modified_bessel_k1,
    ndtr,
    ndtri,
    scaled_modified_bessel_k0,
    scaled_modified_bessel_k1,
    shifted_chebyshev_polynomial_t,
    shifted_chebyshev_polynomial_u,
    shifted_chebyshev_polynomial_v,
    shifted_chebyshev_polynomial_w,
    spherical_bessel_j0,
    xlog1py,
    zeta,
)
from ..tensor import Tensor

# the functions PyTorch's special namespace shares with its top level
digamma = _ops.digamma
psi = _ops.digamma
erf = _ops.erf
erfc = _ops.erfc
erfinv = _ops.erfinv
exp2 = _ops.exp2
expit = _ops.sigmoid
expm1 = _ops.expm1
gammaln = _ops.lgamma
log1p = _ops.log1p
logit = _ops.logit
multigammaln = _ops.mvlgamma
polygamma = _ops.polygamma
sinc = _ops.sinc
xlogy = _ops.xlogy


def round(input: Any, *, decimals: int = 0) -> Tensor:  # noqa: A001  (PyTorch's name)
    """Round half to even (to ``decimals`` decimal places)."""
    return _ops.round(input, decimals=decimals)


def logsumexp(input: Any, dim: Any, keepdim: bool = False) -> Tensor:
    """log(sum(exp(input))) over ``dim``, computed without overflow."""
    return _ops.logsumexp(input, dim, keepdim)


def softmax(input: Any, dim: int, *, dtype: Any = None) -> Tensor:
    """Softmax over ``dim`` (after a cast to ``dtype`` when given)."""
    return _ops.softmax(input, dim, dtype=dtype)


def log_softmax(input: Any, dim: int, *, dtype: Any = None) -> Tensor:
    """Log-softmax over ``dim`` (after a cast to ``dtype`` when given)."""
    return _ops.log_softmax(input, dim, dtype=dtype)


__all__ = [
    "airy_ai",
    "bessel_j0",
    "bessel_j1",
    "bessel_y0",
    "bessel_y1",
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "digamma",
    "entr",
    "erf",
    "erfc",
    "erfcx",
    "erfinv",
    "exp2",
    "expit",
    "expm1",
    "gammainc",
    "gammaincc",
    "gammaln",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "i0",
    "i0e",
    "i1",
    "i1e",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
    "log1p",
    "log_ndtr",
    "log_softmax",
    "logit",
    "logsumexp",
    "modified_bessel_i0",
    "modified_bessel_i1",
    "modified_bessel_k0",
    "modified_bessel_k1",
    "multigammaln",
    "ndtr",
    "ndtri",
    "polygamma",
    "psi",
    "round",
    "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "sinc",
    "softmax",
    "spherical_bessel_j0",
    "xlog1py",
    "xlogy",
    "zeta",
]
