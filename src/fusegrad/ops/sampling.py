"""Sampling from tensors of probabilities: ``multinomial``.

The draws come from a ``fusegrad.Generator`` (the default one unless ``generator=`` is given),
so ``fusegrad.manual_seed`` makes them reproducible; they are not the numbers PyTorch draws.
The probabilities are read on the host: inside a compiled step that is a host read (the
tracer is told, and the step runs eagerly there), as for ``bernoulli``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import storage as _storage
from ..autograd.tracer import notify_host_read as _read
from ..autograd.tracer import state as _tracer_state
from ..errors import DTypeError, ShapeError, describe
from ..random import Generator, _gen
from ..tensor import Tensor
from ._util import to_tensor
from .creation import _leaf


class MultinomialError(ShapeError, RuntimeError):
    """Bad arguments of ``multinomial`` (shape, sample count, probabilities that are no
    distribution): PyTorch raises a RuntimeError for each."""


class MultinomialDTypeError(DTypeError, RuntimeError):
    """Integer or bool probabilities (a RuntimeError in PyTorch)."""


def _check(p: np.ndarray, x: Tensor) -> None:
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise MultinomialError(
            f"multinomial: probability tensor contains either `inf`, `nan` or element < 0 "
            f"(input {describe(x)})"
        )
    if np.any(p.sum(axis=-1) <= 0):
        raise MultinomialError(
            f"multinomial: invalid multinomial distribution (sum of probabilities <= 0) "
            f"(input {describe(x)})"
        )


def multinomial(
    input: Any,
    num_samples: int,
    replacement: bool = False,
    *,
    generator: Generator | None = None,
) -> Tensor:
    """``num_samples`` category indices per row of ``input`` (1-D or 2-D, non-negative weights
    that need not sum to one), drawn with or without replacement; int64, shape
    ``(num_samples,)`` or ``(rows, num_samples)``.  Without replacement the samples of a row are
    distinct and in the order a one-by-one draw gives them; once a row's non-zero categories
    are used up, its zero-weight ones follow in index order (as PyTorch's CPU kernel)."""
    x = to_tensor(input)
    if x.ndim not in (1, 2):
        raise MultinomialError(f"multinomial: prob_dist must be 1 or 2 dim, got {describe(x)}")
    if x.dtype.category != 2:
        raise MultinomialDTypeError(
            f"multinomial only supports floating-point dtypes for input, got {describe(x)}"
        )
    n = int(num_samples)
    if n <= 0:
        raise MultinomialError(f"multinomial: cannot sample n_sample <= 0 samples (got {n})")
    categories = x.shape[-1]
    if not replacement and n > categories:
        raise MultinomialError(
            f"multinomial: cannot sample n_sample > prob_dist.size(-1) samples without "
            f"replacement ({n} > {categories})"
        )
    if _tracer_state.tracer is not None:
        _read(x, "multinomial()")  # (probabilities read on the host)
    p = np.asarray(_storage.to_host(x._data), dtype=np.float64)
    rows = p.reshape(-1, categories)
    _check(rows, x)
    rng = _gen(generator)
    if replacement:
        # inverse CDF: the first category whose cumulative weight exceeds u * total (a
        # zero-weight category never does before the one ahead of it)
        cdf = np.cumsum(rows, axis=-1)
        u = rng.random((rows.shape[0], n)) * cdf[:, -1:]
        out = np.stack([np.searchsorted(c, r, side="right") for c, r in zip(cdf, u)])
        out = np.minimum(out, categories - 1)
    else:
        # exponential race (Efraimidis-Spirakis): E / p for E ~ Exp(1); the n smallest keys, in
        # increasing order, are distributed as n draws one by one without replacement
        with np.errstate(divide="ignore"):
            keys = rng.standard_exponential(rows.shape) / rows
        out = np.argsort(keys, axis=-1, kind="stable")[:, :n]
    out = out.astype(np.int64).reshape(p.shape[:-1] + (n,))
    return _leaf(out, False, x.device)
