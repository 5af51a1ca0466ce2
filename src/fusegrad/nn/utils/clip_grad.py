"""Gradient clipping: ``clip_grad_norm_`` (with ``get_total_norm`` and ``clip_grads_with_norm_``,
its two halves) and ``clip_grad_value_``, as ``torch.nn.utils``.

The total norm is the ``norm_type``-norm of the per-gradient norms (so of all gradients as one
vector); gradients are scaled in place by ``min(1, max_norm / (total + 1e-6))``, a tensor
computation with no host read, as in PyTorch: a compiled step replays it.  Only
``error_if_nonfinite=True`` reads the norm on the host.  ``foreach`` is accepted and ignored
(there is no separate multi-tensor kernel here).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from ... import dtypes as _dt
from ...autograd.forward_state import state as _forward_state
from ...autograd.grad_mode import no_grad
from ...autograd.tracer import current as current_tracer
from ...errors import FusegradError
from ...ops import amax, clamp, matmul, norm, sqrt, stack, tensor
from ...ops.registry import ERROR_STATE, QUIET
from ...tensor import Tensor

_TensorOrTensors = Tensor | Iterable[Tensor]


class NonFiniteNormError(FusegradError, RuntimeError):
    """``clip_grad_norm_(..., error_if_nonfinite=True)`` met a nan or inf total norm."""


def _tensors(tensors: Any) -> list[Tensor]:
    if isinstance(tensors, Tensor):
        return [tensors]
    return list(tensors)


def _grads(parameters: Any) -> list[Tensor]:
    return [p.grad for p in _tensors(parameters) if p.grad is not None]


def _vector_norm(x: Tensor, norm_type: float) -> Tensor:
    """The ``norm_type``-norm of ``x`` as one vector (empty: 0)."""
    if x.numel() == 0:
        return tensor(0.0, dtype=x.dtype)
    if norm_type == math.inf:
        return amax(x.abs())
    if norm_type == -math.inf:
        return x.abs().amin()
    if norm_type == 0:
        return (x != 0).sum().to(x.dtype)
    if norm_type == 2.0 and x.dtype.is_floating_point and x.dtype.itemsize >= 4:
        # the root of the vector's dot product with itself, as numpy's own norm: one BLAS
        # call instead of a square, a sum and a root over the whole gradient (the LSTM-LM's
        # six gradients, 1.5 M values: 0.73 -> 0.2 ms for the total norm)
        flat = x.reshape(-1)
        return sqrt(matmul(flat, flat))
    return norm(x.reshape(-1), p=norm_type)


def _total_2_norm(ts: list[Tensor]) -> Tensor | None:
    """The total 2-norm of ``ts`` computed on their arrays: what ``_vector_norm``'s tensor ops
    compute (the root of each vector's BLAS dot product with itself, then the same over the
    stacked norms), the same kernels in the same order, without a tensor per step -- about
    eight ops per gradient (the LSTM-LM's eleven gradients: 0.85 -> 0.3 ms for the whole
    clip).  None, for the tensor ops, where those could be observed or differ: a tracer (a
    compiled step records them), forward AD, CUDA, empty tensors, other dtypes, mixed dtypes."""
    if current_tracer() is not None or _forward_state.level is not None:
        return None
    dtype = ts[0]._dtype
    if dtype not in (_dt.float32, _dt.float64):
        return None
    arrays = []
    for t in ts:
        a = t._data
        if t._dtype is not dtype or type(a) is not np.ndarray or a.size == 0:
            return None
        arrays.append(a.reshape(-1))
    token = ERROR_STATE.set(QUIET) if ERROR_STATE is not None else None
    try:
        norms = np.array([np.sqrt(np.dot(a, a)) for a in arrays], dtype.np)
        total = np.sqrt(np.dot(norms, norms))
    finally:
        if token is not None:
            ERROR_STATE.reset(token)
    return Tensor._make(np.asarray(total, dtype.np))


def get_total_norm(
    tensors: _TensorOrTensors,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """The ``norm_type``-norm of the norms of ``tensors`` (of them all as one vector)."""
    norm_type = float(norm_type)
    ts = _tensors(tensors)
    if not ts:
        return tensor(0.0)
    with no_grad():
        total = _total_2_norm(ts) if norm_type == 2.0 else None
        if total is None:
            norms = [_vector_norm(t, norm_type) for t in ts]
            total = _vector_norm(stack([n.to(norms[0].dtype) for n in norms]), norm_type)
    if error_if_nonfinite and not bool(total.isfinite()):
        raise NonFiniteNormError(
            f"The total norm of order {norm_type} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the gradients "
            "by the non-finite norm anyway, set `error_if_nonfinite=False`"
        )
    return total


def clip_grads_with_norm_(
    parameters: _TensorOrTensors,
    max_norm: float,
    total_norm: Tensor,
    foreach: bool | None = None,
) -> None:
    """Scale the gradients of ``parameters`` in place by ``min(1, max_norm / (total_norm +
    1e-6))``."""
    grads = _grads(parameters)
    if not grads:
        return
    with no_grad():
        coef = clamp(float(max_norm) / (total_norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))


def clip_grad_norm_(
    parameters: _TensorOrTensors,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Clip the gradients of ``parameters`` (a tensor or an iterable of them) so that their
    total ``norm_type``-norm is at most ``max_norm``; returns the total norm before clipping."""
    parameters = _tensors(parameters)  # (a generator is read once)
    grads = _grads(parameters)
    total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total, foreach)
    return total


def clip_grad_value_(
    parameters: _TensorOrTensors, clip_value: float, foreach: bool | None = None
) -> None:
    """Clamp the gradients of ``parameters`` in place to ``[-clip_value, clip_value]``."""
    clip_value = float(clip_value)
    with no_grad():
        for g in _grads(parameters):
            g.clamp_(-clip_value, clip_value)
