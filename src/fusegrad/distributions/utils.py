"""Helpers of ``fusegrad.distributions``: broadcasting parameters, probabilities <-> logits,
clamping, lazily computed attributes, and the draws that need a parameter's values.

Where this sits: below every distribution class.  Draws go through fusegrad's generator and
tell the thread's tracer, as fusegrad's own random functions do (a draw that depends on
parameter values reads them on the host first).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import ops as F
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import notify_host_read as _read
from ..random import _gen
from ..runtime import finfo as _finfo
from ..tensor import Tensor

euler_constant = 0.57721566490153286060


def broadcast_all(*values: Any) -> tuple:
    """The values as tensors of one broadcast shape (numbers take the tensors' dtype, or the
    default float dtype)."""
    tensors = [v for v in values if isinstance(v, Tensor)]
    if not all(isinstance(v, (Tensor, int, float)) for v in values):
        raise ValueError(
            "Input arguments must all be instances of numbers.Number, torch.Tensor or objects "
            "implementing __torch_function__."
        )
    dtype = tensors[0].dtype if tensors else _dt.get_default_dtype()
    as_tensors = [v if isinstance(v, Tensor) else F.tensor(float(v), dtype=dtype) for v in values]
    return tuple(F.broadcast_tensors(*as_tensors))


def clamp_probs(probs: Tensor) -> Tensor:
    """Probabilities clamped to ``[eps, 1 - eps]`` of their dtype."""
    eps = _finfo(probs.dtype).eps
    return probs.clamp(min=eps, max=1 - eps)


def probs_to_logits(probs: Tensor, is_binary: bool = False) -> Tensor:
    ps_clamped = clamp_probs(probs)
    if is_binary:
        return ps_clamped.log() - (-ps_clamped).log1p()
    return ps_clamped.log()


def logits_to_probs(logits: Tensor, is_binary: bool = False) -> Tensor:
    if is_binary:
        return logits.sigmoid()
    return F.softmax(logits, dim=-1)


class lazy_property:
    """A property computed on first access and then stored on the instance (PyTorch's
    ``lazy_property``: ``probs`` from ``logits`` and the other way round)."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped
        self.__doc__ = wrapped.__doc__
        self.__name__ = wrapped.__name__

    def __get__(self, instance: Any, obj_type: Any = None) -> Any:
        if instance is None:
            return self
        value = self.wrapped(instance)
        instance.__dict__[self.wrapped.__name__] = value
        return value


def tril_matrix_to_vec(mat: Tensor, diag: int = 0) -> Tensor:
    n = mat.shape[-1]
    rows, cols = np.tril_indices(n, diag)
    return mat[..., F.tensor(rows), F.tensor(cols)]


def vec_to_tril_matrix(vec: Tensor, diag: int = 0) -> Tensor:
    n = int(
        (
            -(1 + 2 * diag)
            + math.sqrt((1 + 2 * diag) ** 2 + 8 * vec.shape[-1] + 4 * abs(diag) * (diag + 1))
        )
        / 2
        + 1e-6
    )
    rows, cols = np.tril_indices(n, diag)
    flat = F.zeros(vec.shape[:-1] + (n * n,), dtype=vec.dtype)
    index = F.tensor(rows * n + cols).expand(vec.shape[:-1] + (len(rows),))
    return flat.scatter(-1, index, vec).reshape(vec.shape[:-1] + (n, n))


def _host(t: Tensor, what: str) -> np.ndarray:
    """A parameter's values for a draw (the tracer is told: a compiled step breaks there)."""
    _read(t, what)
    return np.asarray(t.detach()._data, dtype=np.float64)


def draw(fn: Any, shape: tuple, dtype: Any, device: Any = None) -> Tensor:
    """A tensor of ``fn(rng, shape)`` (numpy draws) that a tracer may draw again."""

    def make() -> Tensor:
        values = np.asarray(fn(_gen(None), shape), dtype=dtype.np)
        return F.tensor(values) if device is None else F.tensor(values, device=device)

    return _created(make(), make)


def standard_gamma_values(concentration: Tensor, shape: tuple) -> Tensor:
    """Gamma(concentration, 1) draws of ``shape`` (the concentration broadcast to it)."""
    alpha = np.broadcast_to(_host(concentration, "Gamma.sample()"), shape)
    values = draw(lambda rng, s: rng.standard_gamma(alpha, s), shape, concentration.dtype)
    tiny = _finfo(concentration.dtype).tiny
    return values.clamp(min=tiny)  # (PyTorch: a draw never underflows to 0)
