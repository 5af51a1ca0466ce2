"""Fused primitives of ``log_softmax`` and ``nll_loss``, the two halves of ``cross_entropy``,
and of ``softmax``: each one primitive forward and one backward kernel (numpy), where their
composites ran about six, twelve and eight eager ops (``max``, ``exp``, ``sum``, ``log``,
``gather``, ``where``, the weighted mean, ...).  A classifier's loss on a (256, 65) batch took
235 us forward and 444 us forward + backward as composites, against PyTorch's 17 and 55.

The graph is PyTorch's: ``cross_entropy`` ends in ``NllLossBackward0`` (``NllLoss2DBackward0``
for inputs with spatial dims) with one edge to ``LogSoftmaxBackward0``.  The values follow
PyTorch's CPU kernels: ``log_softmax`` is ``x - max - log(sum(exp(x - max)))`` along its dim
(so a row holding ``inf`` is NaN throughout, as in PyTorch; the composite gave ``-inf`` beside
the NaN), its gradient ``g - exp(out) sum(g)``; ``nll_loss`` is ``-w[t] x[t]`` per target, 0
where the target is ``ignore_index`` (whatever the input holds there), summed or divided by
the sum of the weights (every target ignored: NaN loss, zero gradient).  ``softmax`` keeps its
composite's values to the bit (``ops.reduction._softmax_composite``: ``exp(x - m) / sum(exp(x -
m))``, ``m`` the maximum, so a slice holding NaN, +inf or only -inf is NaN throughout, as
PyTorch's kernel gives), and its node saves its result as PyTorch's
``SoftmaxBackward0`` does (the composite's nodes saved ``exp(x - m)`` and the sum, and an
in-place write into the result went unnoticed); its gradient is PyTorch's
``out (g - sum(g out))``.

When the composites run instead (``fused_classification_runs``): inputs that are not CPU
float32 / float64 arrays of one dtype, an empty input or class dim (and a 0-d input, for
``softmax``), a forward-AD level (the composites carry the tangents), a weight that requires
grad (the composite differentiates it), and calls a compiler records or captures
(``Tracer.prefers_composites``: the composite fuses into row kernels with its neighbours).
Where a graph is recorded, the composite ``log_softmax`` and ``softmax`` run inside one node
each that saves the result as the primitive's rule does (``autograd.native.LogSoftmax``,
``Softmax``: an in-place write into the result fails its backward).  The rules compute their
gradients in the op surface where a graph of the gradient is wanted (``create_graph``); a
compiler's capture takes that form too, and there ``nll_loss`` without class weights indexes
nothing (its sizes stay symbolic), while class weights, indexed by the targets, make the
capture concrete-sized.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd.forward_state import state as _forward_state
from ..autograd.tracer import state as _tracer_state
from ..tensor import Tensor
from .registry import REGISTRY, primitive, set_meta

__all__ = ["fused_classification_runs", "log_softmax_grad", "softmax_grad"]


@primitive("log_softmax", "opaque", "x")
def _log_softmax(x, *, dim):  # type: ignore[no-untyped-def]
    """``x - max - log(sum(exp(x - max)))`` along ``dim``, PyTorch's CPU kernel's form."""
    with np.errstate(all="ignore"):
        shifted = x - np.max(x, axis=dim, keepdims=True)
        return shifted - np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True))


@primitive("log_softmax_backward", "opaque", "g out", differentiable=False)
def _log_softmax_backward(g, out, *, dim):  # type: ignore[no-untyped-def]
    """``log_softmax``'s input gradient ``g - exp(out) * sum(g)`` along ``dim``."""
    with np.errstate(all="ignore"):
        return g - np.exp(out) * np.sum(g, axis=dim, keepdims=True)


def log_softmax_grad(g: Tensor, out: Tensor, dim: int) -> Tensor:
    """``log_softmax``'s input gradient in the op surface, ``g - exp(out) sum(g)`` along
    ``dim`` (``log_softmax_backward``'s formula, differentiable and fusable): the rule's form
    where a graph of the gradient is wanted or a compiler captures it, and the backward of
    ``autograd.native.LogSoftmax``."""
    return g - out.exp() * g.sum(dim, keepdim=True)


@primitive("softmax", "opaque", "x")
def _softmax(x, *, dim):  # type: ignore[no-untyped-def]
    """``exp(x - m) / sum(exp(x - m))`` along ``dim``, ``m`` the maximum, PyTorch's kernel's
    form (a slice holding NaN, +inf or only -inf is NaN throughout, as PyTorch's): the
    composite's operations in its order, so its bits.  The maximum is the
    ``amax`` primitive's kernel (many short rows: one loop, ``ops/reduce_kernels.py``); the
    sum numpy's, which that module's short-row sum equals to the bit and which measured faster
    on the 2-core development machine (rows of 5 to 255, float32 and float64: 10-113 against
    20-183 us per 32768 elements, one thread)."""
    with np.errstate(all="ignore"):
        m = REGISTRY["amax"].kernel(x, dim=(dim,), keepdim=True)
        e = np.subtract(x, m)
        np.exp(e, out=e)
        return np.divide(e, np.sum(e, axis=dim, keepdims=True), out=e)


@primitive("softmax_backward", "opaque", "g out", differentiable=False)
def _softmax_backward(g, out, *, dim):  # type: ignore[no-untyped-def]
    """``softmax``'s input gradient ``out * (g - sum(g * out))`` along ``dim``."""
    with np.errstate(all="ignore"):
        product = np.multiply(g, out)
        difference = np.subtract(g, np.sum(product, axis=dim, keepdims=True), out=product)
        return np.multiply(out, difference, out=difference)


def softmax_grad(g: Tensor, out: Tensor, dim: int | None) -> Tensor:
    """``softmax``'s input gradient in the op surface, ``out (g - sum(g out))`` along ``dim``
    (every dim for None: a 0-d ``out``), ``softmax_backward``'s formula, differentiable and
    fusable: the rule's form where a graph of the gradient is wanted or a compiler captures
    it, and the backward of ``autograd.native.Softmax``."""
    total = (g * out).sum(dim, keepdim=True) if dim is not None else (g * out).sum()
    return out * (g - total)


def _targets(target: np.ndarray, ignore_index: int, classes: int) -> tuple:
    """``(ignored, safe)``: where the target is ``ignore_index`` (None: nowhere), and the
    targets with those replaced by 0; raises PyTorch's error for a target out of range."""
    ignored = target == ignore_index
    if ignored.any():
        safe = np.where(ignored, 0, target)
    else:
        ignored, safe = None, target
    if safe.size and (safe.min() < 0 or safe.max() >= classes):
        bad = (safe < 0) | (safe >= classes)
        raise IndexError(
            f"nll_loss: Target {int(safe[bad].flat[0])} is out of bounds (number of classes "
            f"{classes})"
        )
    return ignored, safe


def _picked(x: np.ndarray, safe: np.ndarray) -> np.ndarray:
    """``x[n, safe[n, ...], ...]``: each target's element along the class dim 1."""
    if x.ndim == 2:
        return x[np.arange(x.shape[0]), safe]
    return np.take_along_axis(x, safe[:, None], axis=1)[:, 0]


def _weights(weight: np.ndarray, safe: np.ndarray, ignored: Any, dtype: Any) -> np.ndarray:
    """Each target's weight, 0 where it is ignored."""
    w = weight[safe].astype(dtype, copy=False)
    return w if ignored is None else np.where(ignored, 0, w).astype(dtype, copy=False)


@primitive("nll_loss", "opaque", "x target weight")
def _nll_loss(x, target, weight, *, ignore_index, reduction, weighted):  # type: ignore[no-untyped-def]
    """``-weight[t] * x[n, t, ...]`` for each target ``t`` of ``target`` (N, ...) along the
    class dim 1 of ``x`` (N, C, ...); 0 where ``t == ignore_index``; ``reduction`` ``none``,
    ``sum``, or ``mean`` (divided by the sum of the targets' weights).  An unbatched ``x``
    (C,) takes a 0-d ``target``.  ``weighted`` False: ``weight`` is ones (no class weights;
    the rule then indexes nothing)."""
    if x.ndim == 1:
        out = _nll_loss(
            x[None],
            target[None],
            weight,
            ignore_index=ignore_index,
            reduction=reduction,
            weighted=weighted,
        )
        return out[0] if reduction == "none" else out
    ignored, safe = _targets(target, ignore_index, x.shape[1])
    with np.errstate(all="ignore"):
        w = _weights(weight, safe, ignored, x.dtype)
        loss = -(_picked(x, safe) * w)
        if ignored is not None:  # (0 whatever the input holds there, as PyTorch's)
            loss = np.where(ignored, 0, loss).astype(x.dtype, copy=False)
        if reduction == "none":
            return loss
        total = loss.sum()
        if reduction == "sum":
            return np.asarray(total, x.dtype)
        return np.asarray(total / w.sum(), x.dtype)


@primitive("nll_loss_backward", "opaque", "g target weight", differentiable=False)
def _nll_loss_backward(g, target, weight, *, ignore_index, reduction, weighted, classes):  # type: ignore[no-untyped-def]
    """``nll_loss``'s input gradient for its gradient ``g``: ``-weight[t] * g`` (over the sum
    of the weights for ``mean``) at each target's class, zeros elsewhere and for ignored
    targets; (N, ``classes``, ...), or (``classes``,) for a 0-d ``target``."""
    if target.ndim == 0:
        g2 = g[None] if reduction == "none" else g
        out = _nll_loss_backward(
            g2,
            target[None],
            weight,
            ignore_index=ignore_index,
            reduction=reduction,
            weighted=weighted,
            classes=classes,
        )
        return out[0]
    ignored, safe = _targets(target, ignore_index, classes)
    out = np.zeros((target.shape[0], classes, *target.shape[1:]), g.dtype)
    with np.errstate(all="ignore"):
        w = _weights(weight, safe, ignored, g.dtype)
        coef = -(w * g)
        if reduction == "mean":
            coef = coef / w.sum()
        if ignored is not None:
            coef = np.where(ignored, 0, coef)
        coef = coef.astype(g.dtype, copy=False)
    if out.ndim == 2:
        out[np.arange(out.shape[0]), safe] = coef
    else:
        np.put_along_axis(out, safe[:, None], coef[:, None], axis=1)
    return out


set_meta("softmax", lambda shapes, dtypes, dim: (tuple(shapes[0]), dtypes[0]))
set_meta("softmax_backward", lambda shapes, dtypes, dim: (tuple(shapes[0]), dtypes[0]))
set_meta("log_softmax", lambda shapes, dtypes, dim: (tuple(shapes[0]), dtypes[0]))
set_meta("log_softmax_backward", lambda shapes, dtypes, dim: (tuple(shapes[0]), dtypes[0]))
set_meta(
    "nll_loss",
    lambda shapes, dtypes, ignore_index, reduction, weighted: (
        tuple(shapes[1]) if reduction == "none" else (),
        dtypes[0],
    ),
)
set_meta(
    "nll_loss_backward",
    lambda shapes, dtypes, ignore_index, reduction, weighted, classes: (
        (shapes[1][0], classes, *shapes[1][1:]) if len(shapes[1]) else (classes,),
        dtypes[0],
    ),
    ("classes",),
)


def fused_classification_runs(x: Tensor, *others: Tensor | None) -> bool:
    """Whether ``softmax``, ``log_softmax`` or ``nll_loss`` of ``x`` with ``others`` (target,
    weight; None for absent ones) run the fused primitives (see the module docstring)."""
    if _forward_state.level is not None:
        return False
    tracer = _tracer_state.tracer
    if tracer is not None and tracer.prefers_composites:
        return False
    data = x._data
    if type(data) is not np.ndarray or data.dtype not in (np.float32, np.float64):
        return False
    if not data.size:
        return False
    for t in others:
        if t is not None and type(t._data) is not np.ndarray:
            return False
    return True
