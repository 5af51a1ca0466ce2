"""Sampling from distributions given by tensors: ``multinomial``, ``normal``, ``poisson``.

The draws come from a ``fusegrad.Generator`` (the default one unless ``generator=`` is given),
so ``fusegrad.manual_seed`` makes them reproducible; they are not the numbers PyTorch draws.

How a compiled whole step sees them: ``normal`` draws standard normal numbers as a creation
function does (``notify_created`` with a ``redo`` that draws again, as ``randn``), then
scales and shifts them with ops, so a replay draws fresh numbers from the generator as eager
would and the arithmetic stays in the fused program.  ``multinomial`` and ``poisson`` need the
probabilities / rates themselves to draw: they read them on the host (the tracer is told, and
the step runs eagerly there), as ``bernoulli`` does.

As in PyTorch, ``normal`` and ``poisson`` outputs require grad when a parameter does, with a
zero gradient (they are not reparameterised: write ``mean + std * randn_like(std)`` for that).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import storage as _storage
from ..autograd.tracer import notify_check as _check_values
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import notify_host_read as _read
from ..autograd.tracer import state as _tracer_state
from ..device import as_device
from ..errors import DTypeError, FusegradError, ShapeError, describe
from ..random import Generator, _gen
from ..size import broadcast_shapes
from ..tensor import Tensor
from ._util import is_tensor, shape_arg, to_tensor
from .creation import _leaf
from .elementwise import add, mul, sub


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


class NormalError(FusegradError, RuntimeError):
    """A negative standard deviation (PyTorch: a RuntimeError)."""


class PoissonError(FusegradError, RuntimeError):
    """A negative or NaN Poisson rate (PyTorch: a RuntimeError)."""


class SamplingDTypeError(DTypeError, NotImplementedError):
    """``normal``/``poisson`` of integer tensors (PyTorch: NotImplementedError, "not
    implemented for 'Long'")."""


def _zero_gradient(out: Tensor, *params: Tensor) -> Tensor:
    """``out``, in the graph of the ``params`` that require grad with a zero gradient to each
    (PyTorch's rule for ``normal``/``poisson``): ``out + 0 * (p - p.detach())``, exactly ``out``
    in the forward."""
    for p in params:
        if p.requires_grad:
            out = add(out, mul(sub(p, p.detach()), 0.0))
    return out


def _standard_normal(shape: tuple, dtype: _dt.dtype, device: Any, generator: Any) -> Tensor:
    def draw() -> Tensor:
        return _leaf(_gen(generator).standard_normal(shape).astype(dtype.np), False, device)

    return _created(draw(), draw)  # type: ignore[no-any-return]


def _check_std(std: Tensor) -> None:
    def check(a: Any) -> None:
        if np.any(np.asarray(_storage.to_host(a)) < 0):
            raise NormalError("normal expects all elements of std >= 0.0")

    _check_values(std, check)


def _float_param(t: Tensor) -> None:
    if t._dtype.category != 2:
        raise SamplingDTypeError(f'"normal_kernel_cpu" not implemented for {describe(t)}')


def normal(
    mean: Any,
    std: Any = 1.0,
    size: Any = None,
    *,
    generator: Generator | None = None,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    """Normal draws, as PyTorch's four overloads: ``normal(mean_tensor, std_tensor)``
    (broadcast), ``normal(mean_tensor, std=1.0)``, ``normal(mean, std_tensor)``, and
    ``normal(mean, std, size, dtype=, device=, requires_grad=)`` with Python floats.  The
    result has the dtype of the mean tensor (else the std tensor's).  See the module docstring
    for gradients and compiled steps."""
    if not is_tensor(mean) and not is_tensor(std):
        if size is None:
            raise TypeError(
                "normal() received an invalid combination of arguments: with a float mean and "
                "a float std, size is required (normal(mean, std, size))"
            )
        s = float(std)
        if s < 0:
            raise NormalError(f"normal expects std >= 0.0, but found std {std}")
        dt = _dt.get_default_dtype() if dtype is None else _dt.as_dtype(dtype)
        z = _standard_normal(shape_arg((size,)), dt, as_device(device), generator)
        out = add(mul(z, s), float(mean))
        out = out.detach()
        if requires_grad:
            out.requires_grad_(True)
        return out
    if size is not None:
        raise TypeError("normal(): size is only accepted with a float mean and a float std")
    m = mean if is_tensor(mean) else None
    sd = std if is_tensor(std) else None
    ref = m if m is not None else sd
    assert ref is not None
    for t in (m, sd):
        if t is not None:
            _float_param(t)
    if sd is None and float(std) < 0:
        raise NormalError(f"normal expects std >= 0.0, but found std {std}")
    if sd is not None:
        _check_std(sd)
    shape = broadcast_shapes(*(tuple(t.shape) for t in (m, sd) if t is not None))
    z = _standard_normal(shape, ref.dtype, ref.device, generator)
    mean_d = m.detach() if m is not None else float(mean)
    std_d = sd.detach() if sd is not None else float(std)
    if sd is not None and sd._dtype is not ref._dtype:
        std_d = sd.detach().to(ref.dtype)
    out = add(mul(z, std_d), mean_d)
    return _zero_gradient(out, *(t for t in (m, sd) if t is not None))


def poisson(input: Any, generator: Generator | None = None) -> Tensor:
    """A Poisson draw for each rate in ``input`` (non-negative floats), in ``input``'s dtype.
    The rates are read on the host (see the module docstring)."""
    x = to_tensor(input)
    if x._dtype.category != 2:
        raise SamplingDTypeError(f'"poisson_cpu" not implemented for {describe(x)}')
    if _tracer_state.tracer is not None:
        _read(x, "poisson()")  # (rates read on the host)
    rates = np.asarray(_storage.to_host(x._data), dtype=np.float64)
    if not np.all(rates >= 0):  # (NaN too)
        raise PoissonError("invalid Poisson rate, expected rate to be non-negative")
    with np.errstate(invalid="ignore"):
        draws = _gen(generator).poisson(np.where(np.isfinite(rates), rates, 0.0))
    draws = np.where(np.isfinite(rates), draws, np.inf).astype(x.dtype.np)
    return _zero_gradient(_leaf(draws, False, x.device), x)
