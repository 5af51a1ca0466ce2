"""``fusegrad.nn.functional``: losses, dropout, layer_norm, conv2d and pooling, all composites of
primitives (conv2d and pooling go through ``unfold``/im2col: an advanced-indexing gather plus a
matmul), so each is differentiable twice and visible to the compiler as ordinary primitives.
While a graph is recorded, conv2d and the norm layers run inside one node each
(``native.Convolution``, ``native.LayerNorm``, ...) that saves what PyTorch's native node saves
rather than every primitive's operands.  On CPU float32/float64 tensors the norm layers and
``interpolate``'s nearest and linear modes run fused primitives of their own instead
(``ops/norms.py``, ``ops/resample.py``), as ``embedding`` does (``ops/indexing.py``).
"""

from __future__ import annotations

import builtins
import math
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import storage as _storage
from ..autograd import grad_mode as _grad_mode
from ..autograd.forward_state import state as _forward_state
from ..autograd.grad_mode import no_grad as _no_grad
from ..autograd.node_names import name_node as _name_node
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..autograd.tracer import current as _current_tracer
from ..autograd.tracer import notify_check as _check
from ..autograd.tracer import notify_created as _created
from ..errors import AutogradError, DTypeError, IndexOutOfRange, ShapeError, describe
from ..size import broadcast_shapes as _broadcast_shapes
from ..tensor import Tensor
from . import classification as _classification
from . import convolution as _conv
from . import elementwise as _ew
from . import norms as _norms
from . import resample as _resample
from ._util import P, apply, broadcast_shape, cast, to_tensor
from .convolution import fold, unfold  # noqa: F401  (re-exported: F.fold, F.unfold)
from .creation import _gen
from .creation import full_like as _full_like
from .creation import zeros_like as _zeros_like
from .elementwise import (
    add,
    clamp,
    div,
    elu,
    gelu,
    leaky_relu,
    neg,
    relu,
    sign,
    silu,
    softplus,
    sub,
    where,
)
from .elementwise import rsqrt as _rsqrt
from .generated import abs, eq, exp, log, log1p, minimum, mul, sigmoid, sqrt, tanh
from .generated import ge as _ge
from .indexing import embedding, one_hot  # (re-exported: F.embedding, F.one_hot)
from .linalg import einsum, linear
from .reduction import log_softmax, mean, norm, softmax, sum
from .shape import pad

__all__ = [
    "relu",
    "leaky_relu",
    "elu",
    "gelu",
    "silu",
    "softplus",
    "hardswish",
    "selu",
    "celu",
    "glu",
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "linear",
    "pad",
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "dropout",
    "layer_norm",
    "batch_norm",
    "group_norm",
    "instance_norm",
    "unfold",
    "conv1d",
    "conv2d",
    "conv_transpose1d",
    "conv_transpose2d",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "interpolate",
    "one_hot",
    "embedding",
    "normalize",
    "scaled_dot_product_attention",
    "kl_div",
    "cosine_similarity",
    "pairwise_distance",
    "triplet_margin_loss",
]


def _nll_loss_name(input: Tensor, *args: Any, **kwargs: Any) -> str:
    # PyTorch: (C) and (N, C) inputs are nll_loss, (N, C, d1, ...) inputs nll_loss2d
    return "NllLossBackward0" if input.ndim <= 2 else "NllLoss2DBackward0"


def _adaptive_pool_name(input: Tensor, output_size: Any) -> str:
    # PyTorch averages a (1, 1) output with mean over the last two dims
    sizes = (output_size,) * 2 if isinstance(output_size, int) else tuple(output_size)
    return "MeanBackward1" if sizes == (1, 1) else "AdaptiveAvgPool2DBackward0"


def _interpolate_name(input: Tensor, *args: Any, mode: str = "nearest", **kwargs: Any) -> str:
    if len(args) >= 3:  # (size, scale_factor, mode, ...) given by position
        mode = args[2]
    kind = {
        "nearest": "Nearest",
        "nearest-exact": "NearestExact",
        "linear": "Linear",
        "bilinear": "Bilinear",
        "trilinear": "Trilinear",
    }.get(mode)
    if kind is None:  # area: adaptive average pooling
        return f"AdaptiveAvgPool{input.ndim - 2}DBackward0"
    return f"Upsample{kind}{input.ndim - 2}DBackward0"


def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return mean(loss)
    if reduction == "sum":
        return sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{op}: {reduction!r} is not a valid value for reduction")


def _class_dim_last(x: Tensor) -> Tensor:
    """(N, C, d1, ...) -> (N, d1, ..., C) so the class dim is last."""
    if x.ndim <= 2:
        return x
    return x.movedim(1, -1)


@_torch_node_name(_nll_loss_name)
def nll_loss(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    logp = to_tensor(input)
    tgt = to_tensor(target)
    if tgt._dtype.category != 1:
        raise DTypeError(f"nll_loss: expected an integer class-index target, got {describe(tgt)}")
    fused = _fused_nll_loss(logp, tgt, weight, ignore_index, reduction)
    if fused is not None:
        return fused
    if logp.ndim == 1:
        logp, tgt = logp.unsqueeze(0), tgt.unsqueeze(0)
        squeeze = True
    else:
        squeeze = False
    if logp.ndim < 2 or tgt.shape != logp.shape[:1] + logp.shape[2:]:
        raise ShapeError(
            f"nll_loss: expected target of shape {tuple(logp.shape[:1] + logp.shape[2:])} for "
            f"input {describe(logp)}, got {describe(tgt)}"
        )
    n_classes = logp.shape[1]
    ignored = tgt == ignore_index
    safe = where(ignored, 0, tgt)

    def check(array: Any) -> None:
        targets = _storage.to_host(array)  # one copy when on a GPU: the check is on the host
        bad = (targets < 0) | (targets >= n_classes)
        if bad.any():
            raise IndexError(
                f"nll_loss: Target {int(targets[bad].flat[0])} is out of bounds "
                f"(number of classes {n_classes})"
            )

    _check(safe, check)
    picked = _class_dim_last(logp).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    if weight is not None:
        w = to_tensor(weight)[safe]
    else:
        w = _created(Tensor._make(_storage.full_like(safe._data, 1, logp.dtype.np)))
    w = where(ignored, 0.0, w)
    # (an ignored target adds 0 whatever the input holds there, as PyTorch's kernel)
    loss = where(ignored, 0.0, neg(picked) * w)
    if squeeze and reduction == "none":
        loss = loss.squeeze(0)
    if reduction == "mean":
        return _weighted_mean(sum(loss), sum(w))
    return _reduce(loss, reduction, "nll_loss")


def _fused_nll_loss(
    logp: Tensor, tgt: Tensor, weight: Any, ignore_index: int, reduction: str
) -> Tensor | None:
    """``nll_loss`` as its fused primitive (``ops/classification``), or None where the
    composite runs (``fused_classification_runs``, a weight that requires grad or is not a
    (C,) vector, shapes the composite's checks refuse)."""
    if logp.ndim == 0 or reduction not in ("mean", "sum", "none"):
        return None
    classes = logp.shape[0] if logp.ndim == 1 else logp.shape[1]
    expected = () if logp.ndim == 1 else logp.shape[:1] + logp.shape[2:]
    w = None if weight is None else to_tensor(weight)
    if not classes or tuple(tgt.shape) != tuple(expected):
        return None
    if w is not None and (w.requires_grad or tuple(w.shape) != (classes,)):
        return None
    if not _classification.fused_classification_runs(logp, tgt, w):
        return None
    attrs = {"ignore_index": int(ignore_index), "reduction": reduction, "weighted": w is not None}
    if w is None:
        w = _created(Tensor._make(np.ones(classes, logp.dtype.np)))
    elif w.dtype != logp.dtype:
        w = cast(w, logp.dtype)
    return apply(P["nll_loss"], (logp, tgt, w), attrs)


def _weighted_mean(total: Tensor, denom: Tensor) -> Tensor:
    # every target ignored: the loss is nan (0 / 0) as in PyTorch, but its gradient is 0, not nan
    none_left = denom == 0
    return where(none_left, math.nan, total / where(none_left, 1.0, denom))


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    x = to_tensor(input)
    tgt = to_tensor(target)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    class_dim = 0 if x.ndim == 1 else 1
    logp = log_softmax(x, class_dim)
    n_classes = x.shape[class_dim]
    w = to_tensor(weight) if weight is not None else None
    if tgt._dtype.category == 2:  # class probabilities
        if tgt.shape != x.shape:
            raise ShapeError(
                f"cross_entropy: probability target {describe(tgt)} must match input {describe(x)}"
            )
        if label_smoothing:
            tgt = tgt * (1 - label_smoothing) + label_smoothing / n_classes
        terms = logp * tgt
        if w is not None:
            shape = [1] * x.ndim
            shape[class_dim] = n_classes
            terms = terms * w.reshape(shape)
        loss = neg(sum(terms, class_dim))
        if reduction == "mean":
            return sum(loss) / (loss.numel() if loss.numel() else math.nan)
        return _reduce(loss, reduction, "cross_entropy")
    nll = nll_loss(logp, tgt, w, ignore_index, reduction)
    if not label_smoothing:
        return nll
    # smoothing term: -sum_c w_c log p_c / C per element, ignored positions excluded
    lp = logp.unsqueeze(0) if logp.ndim == 1 else logp
    t = tgt.unsqueeze(0) if tgt.ndim == 0 else tgt
    if w is not None:
        shape = [1] * lp.ndim
        shape[1] = n_classes
        lp = lp * w.reshape(shape)
    smooth = neg(sum(lp, 1)) / n_classes
    ignored = t == ignore_index
    smooth = where(ignored, 0.0, smooth)
    if reduction == "mean":
        if w is not None:
            denom = sum(where(ignored, 0.0, w[where(ignored, 0, t)]))
        else:
            denom = sum((~ignored).to(x.dtype))
        smooth_red = _weighted_mean(sum(smooth), denom)
    elif reduction == "sum":
        smooth_red = sum(smooth)
    else:
        smooth_red = smooth.squeeze(0) if tgt.ndim == 0 else smooth
    return nll * (1 - label_smoothing) + smooth_red * label_smoothing


@_torch_node_name("MseLossBackward0")
def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    d = sub(input, target)
    return _reduce(d * d, reduction, "mse_loss")


def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return _reduce(abs(sub(input, target)), reduction, "l1_loss")


class LossArgumentError(ShapeError, RuntimeError):
    """A bad scalar argument of a loss (``beta``, ``delta``): PyTorch raises a RuntimeError."""


@_torch_node_name("SmoothL1LossBackward0")
def smooth_l1_loss(
    input: Tensor,
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    beta: float = 1.0,
) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere (d = input - target)."""
    beta = float(beta)
    if beta < 0:
        raise LossArgumentError("smooth_l1_loss does not support negative values for beta.")
    reduction = _legacy(size_average, reduce, reduction)
    if beta == 0.0:  # the L1 loss (the quadratic branch would divide by zero in the gradient)
        return l1_loss(input, target, reduction=reduction)
    d = sub(input, target)
    a = abs(d)
    loss = where(a < beta, d * d * (0.5 / beta), sub(a, 0.5 * beta))
    return _reduce(loss, reduction, "smooth_l1_loss")


@_torch_node_name("HuberLossBackward0")
def huber_loss(
    input: Tensor,
    target: Tensor,
    reduction: str = "mean",
    delta: float = 1.0,
    weight: Tensor | None = None,
) -> Tensor:
    """0.5 d^2 where |d| < delta, delta (|d| - 0.5 delta) elsewhere (d = input - target);
    ``weight`` multiplies the elementwise loss before the reduction."""
    delta = float(delta)
    if delta <= 0:
        raise LossArgumentError("huber_loss does not support non-positive values for delta.")
    d = sub(input, target)
    a = abs(d)
    loss = where(a < delta, d * d * 0.5, (a - 0.5 * delta) * delta)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "huber_loss")


def kl_div(
    input: Tensor,
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    log_target: bool = False,
) -> Tensor:
    """Pointwise KL divergence ``target * (log(target) - input)`` with ``input`` given as log
    probabilities (``log_target=True``: ``target`` too, ``exp(target) * (target - input)``);
    ``0 * log(0)`` is 0, as PyTorch's ``xlogy``.  ``reduction="batchmean"`` divides the sum by
    the batch size (``input.size(0)``), the KL divergence's definition; ``"mean"`` (the
    default) divides by the element count and warns, as PyTorch does."""
    reduction = _legacy(size_average, reduce, reduction)
    x, t = to_tensor(input), to_tensor(target)
    if log_target:
        loss = exp(t) * sub(t, x)
    else:
        t_log_t = where(eq(t, 0), 0.0, t * log(t))  # xlogy(t, t): 0 where t == 0
        loss = sub(t_log_t, t * x)
    if reduction == "batchmean":
        total = sum(loss)
        return total / x.shape[0] if x.ndim else total
    if reduction == "mean":
        warnings.warn(
            "reduction: 'mean' divides the total loss by both the batch size and the support "
            "size.'batchmean' divides only by the batch size, and aligns with the KL div math "
            "definition.'mean' will be changed to behave the same as 'batchmean' in the next "
            "major release.",
            UserWarning,
            stacklevel=2,
        )
    return _reduce(loss, reduction, "kl_div")


def cosine_similarity(x1: Any, x2: Any, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """Cosine of the angle between ``x1`` and ``x2`` along ``dim`` (broadcast first), by
    PyTorch's current formula: each input divided by its own norm clamped below at ``eps``,
    then the product summed -- so the result stays in [-1, 1].  As in PyTorch the clamp does
    not enter the gradient (its norm is clamped outside autograd): the gradient is that of
    ``x1 / n1 * x2 / n2`` with ``n`` the clamped norms taken as the norms."""
    a, b = to_tensor(x1), to_tensor(x2)
    common = _dt.result_type(a, b)
    if common.category != 2:
        raise DTypeError(
            "cosine_similarity: expected common dtype to be floating point, yet common dtype "
            f"is {common.name} ({describe(a, b)})"
        )
    a, b = cast(a, common), cast(b, common)
    shape = broadcast_shape("cosine_similarity", a, b)
    a, b = a.broadcast_to(shape), b.broadcast_to(shape)  # type: ignore[attr-defined]

    def clamped_norm(v: Tensor) -> Tensor:
        n = norm(v, 2, dim, keepdim=True)
        held = n.detach()
        return add(n, sub(clamp(held, min=eps), held))  # the value clamped, the gradient n's

    return sum((a / clamped_norm(a)) * (b / clamped_norm(b)), dim)


def pairwise_distance(
    x1: Any, x2: Any, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False
) -> Tensor:
    """The ``p``-norm of ``x1 - x2 + eps`` over the last dimension (PyTorch's formula, the
    ``eps`` keeping the norm's gradient finite where the inputs coincide)."""
    a, b = to_tensor(x1), to_tensor(x2)
    diff = add(sub(a, b), eps)
    if diff.ndim == 0:
        return norm(diff, p, 0, keepdim=keepdim) if keepdim else abs(diff)
    return norm(diff, p, -1, keepdim=keepdim)


def triplet_margin_loss(
    anchor: Tensor,
    positive: Tensor,
    negative: Tensor,
    margin: float = 1.0,
    p: float = 2,
    eps: float = 1e-6,
    swap: bool = False,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """``max(d(a, p) - d(a, n) + margin, 0)`` with ``d`` the ``pairwise_distance`` (``p``,
    ``eps``); ``swap=True`` uses ``min(d(a, n), d(p, n))`` as the negative distance (the
    distance swap of Balntas et al.)."""
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    reduction = _legacy(size_average, reduce, reduction)
    a, pos, neg = to_tensor(anchor), to_tensor(positive), to_tensor(negative)
    if not (a.ndim == pos.ndim == neg.ndim):
        raise ShapeError(
            "The anchor, positive, and negative tensors are expected to have the same number "
            f"of dimensions, but got: anchor {a.ndim}D, positive {pos.ndim}D, and negative "
            f"{neg.ndim}D inputs"
        )
    d_pos = pairwise_distance(a, pos, p, eps)
    d_neg = pairwise_distance(a, neg, p, eps)
    if swap:
        d_neg = minimum(d_neg, pairwise_distance(pos, neg, p, eps))
    loss = clamp(sub(add(d_pos, float(margin)), d_neg), min=0.0)
    return _reduce(loss, reduction, "triplet_margin_loss")


def _legacy(size_average: bool | None, reduce: bool | None, reduction: str) -> str:
    """PyTorch's deprecated ``size_average``/``reduce`` arguments as a ``reduction``."""
    if size_average is None and reduce is None:
        return reduction
    if reduce is False:
        return "none"
    return "sum" if size_average is False else "mean"


@_torch_node_name("BinaryCrossEntropyBackward0")
def binary_cross_entropy(
    input: Tensor, target: Tensor, weight: Tensor | None = None, reduction: str = "mean"
) -> Tensor:
    """PyTorch's ``(t - 1) max(log1p(-p), -100) - t max(log p, -100)``, times ``weight``
    (broadcast to the input's shape, never differentiated), reduced.  One primitive
    (``ops/primitives.py``, "binary cross entropy") whose rule is PyTorch's: the input's
    gradient ``g (p - t) / max((1 - p) p, 1e-12)``, finite where ``p`` saturates, the target's
    ``-g logit(p)``."""
    p, t = to_tensor(input), to_tensor(target)
    if p.shape != t.shape:
        raise ShapeError(
            f"binary_cross_entropy: target {describe(t)} must have the same size as input "
            f"{describe(p)}"
        )
    common = _dt.result_type(p, t)
    if common.category < 2:  # (integer or bool operands: the loss is the default float dtype)
        common = _dt.get_default_dtype()
    if p._dtype is not common:
        p = cast(p, common)
    if t._dtype is not common:
        t = cast(t, common)
    w = None
    if weight is not None:
        w = to_tensor(weight)
        if w.requires_grad and _grad_mode.is_grad_enabled():
            raise AutogradError(
                "The function 'binary_cross_entropy' is not differentiable with respect to "
                "argument 'weight'. This input cannot have requires_grad True."
            )
        if _broadcast_shapes(tuple(w.shape), tuple(p.shape)) != tuple(p.shape):
            raise ShapeError(
                f"binary_cross_entropy: output with shape {list(p.shape)} doesn't match the "
                f"broadcast shape {list(_broadcast_shapes(tuple(w.shape), tuple(p.shape)))} "
                f"(input {describe(p)}, weight {describe(w)})"
            )
    loss = apply(P["binary_cross_entropy"], (p, t), {})
    if w is not None:
        loss = loss * w
    return _reduce(loss, reduction, "binary_cross_entropy")


@_torch_node_name("BinaryCrossEntropyWithLogitsBackward0")
def binary_cross_entropy_with_logits(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    reduction: str = "mean",
    pos_weight: Tensor | None = None,
) -> Tensor:
    x, t = to_tensor(input), to_tensor(target)
    if x.shape != t.shape:
        raise ShapeError(
            f"binary_cross_entropy_with_logits: target {describe(t)} must have the same size as "
            f"input {describe(x)}"
        )
    # log(1 + exp(-|x|)) + max(-x, 0) = -log(sigmoid(x)), computed without overflow
    log_sig_neg = add(log1p(exp(neg(abs(x)))), relu(neg(x)))
    if pos_weight is not None:
        coef = add(mul(sub(pos_weight, 1.0), t), 1.0)
        loss = add(mul(sub(1.0, t), x), mul(coef, log_sig_neg))
    else:
        loss = add(mul(sub(1.0, t), x), log_sig_neg)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")


def dropout(
    input: Tensor,
    p: float = 0.5,
    training: bool = True,
    inplace: bool = False,
    generator: Any = None,
) -> Tensor:
    x = to_tensor(input)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return mul(x, 0.0)
    shape, np_dtype = tuple(x.shape), x.dtype.np

    def draw(shape: tuple = shape) -> Tensor:  # (another shape: a step over sizes redraws)
        keep = _scaled_keep(_keep_draw(_gen(generator), shape, p), p, np_dtype)
        return Tensor._make(_storage.placed_like(keep, x._data))

    draw.resizable = True  # type: ignore[attr-defined]
    return mul(x, _created(draw(), draw))


def _keep_draw(rng: np.random.Generator, shape: tuple, p: float) -> np.ndarray:
    """Dropout's keep-or-drop draws: True with probability ``1 - p``, each element from 32
    random bits (two per 64-bit output of the generator: half the draws of ``rng.random``, and
    no conversion to float; 73 against 37 us for 32,768 elements).  An element is kept when its
    bits, read as a fraction of 2**32, are at least ``p``: ``ceil(p * 2**32)`` is the smallest
    such integer (exact: a scaling by a power of two), so p = 0 keeps all and p = 1 none."""
    n = math.prod(shape)
    bits = rng.bit_generator.random_raw((n + 1) // 2).view(np.uint32)[:n]
    threshold = math.ceil(p * 2.0**32)
    if threshold >= 2**32:
        return np.zeros(shape, dtype=bool)
    return (bits >= np.uint32(threshold)).reshape(shape)


def _scaled_keep(keep: np.ndarray, p: float, np_dtype: Any) -> np.ndarray:
    """Dropout's mask ``keep / (1 - p)`` in ``np_dtype``.  float32 and float64 multiply by the
    scale rounded to their own type, one pass and the same values to the bit (the quotient of
    1 by ``1 - p`` in float64, then rounded); other dtypes divide in float64 and convert."""
    if np_dtype == np.float32 or np_dtype == np.float64:
        return keep * np_dtype.type(1.0 / (1.0 - p))
    return (keep / (1.0 - p)).astype(np_dtype)


def _feature_dropout(x: Tensor, p: float, training: bool, spatial: int, generator: Any) -> Tensor:
    """Channel dropout: one keep-or-drop draw per (sample, channel), shared by its ``spatial``
    trailing dims; an input of ``spatial + 1`` dims is one unbatched sample."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return mul(x, 0.0)
    shape = tuple(x.shape)
    if len(shape) == spatial + 1:
        mask_shape = shape[:1] + (1,) * spatial
    else:
        mask_shape = shape[:2] + (1,) * max(len(shape) - 2, 0)
    np_dtype = x.dtype.np

    def draw(mask_shape: tuple = mask_shape) -> Tensor:  # (see ``dropout``)
        keep = _scaled_keep(_keep_draw(_gen(generator), mask_shape, p), p, np_dtype)
        return Tensor._make(_storage.placed_like(keep, x._data))

    draw.resizable = True  # type: ignore[attr-defined]
    return mul(x, _created(draw(), draw))


def _feature_dropout_input(op: str, x: Tensor, spatial: int) -> None:
    if x.ndim in (spatial + 1, spatial + 2):
        return
    plain = {1: "2D or 3D", 2: "3D or 4D", 3: "4D or 5D"}[spatial]
    warnings.warn(
        f"{op}: Received a {x.ndim}-D input to {op}, which is deprecated and will result in an "
        "error in a future release. To retain the behavior and silence this warning, please use "
        f"dropout instead. Note that {op} exists to provide channel-wise dropout on inputs with "
        f"{spatial} spatial dimensions, a channel dimension, and an optional batch dimension "
        f"(i.e. {plain} inputs).",
        stacklevel=3,
    )


def _alpha_dropout(x: Tensor, p: float, training: bool, feature: bool) -> Tensor:
    """SELU's dropout (PyTorch's ``_dropout_impl`` with alpha): dropped values go to SELU's
    negative saturation and the result is rescaled so mean and variance are kept:
    ``x * a m + alpha a (m - 1) + alpha a p`` for a keep mask ``m``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return mul(x, 0.0)
    shape = tuple(x.shape)
    if feature:
        shape = shape[:2] + (1,) * max(len(shape) - 2, 0)
    np_dtype = x.dtype.np
    alpha = 1.7580993408473766
    a = 1.0 / math.sqrt((alpha * alpha * p + 1) * (1 - p))

    def draw() -> Tensor:
        keep = (_gen(None).random(shape) >= p).astype(np_dtype)
        return Tensor._make(_storage.placed_like(keep, x._data))

    keep = _created(draw(), draw)
    shift = add(mul(sub(keep, 1.0), alpha * a), alpha * a * p)
    return add(mul(x, mul(keep, a)), shift)


def alpha_dropout(
    input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False
) -> Tensor:
    """Alpha dropout (for SELU networks), element by element."""
    return _alpha_dropout(to_tensor(input), p, training, False)


def feature_alpha_dropout(
    input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False
) -> Tensor:
    """Alpha dropout of whole channels."""
    return _alpha_dropout(to_tensor(input), p, training, True)


def _lp_finish(pooled: Tensor, window: int, norm_type: float) -> Tensor:
    # PyTorch's (sign(out) * relu(|out|) * window) ** (1 / p) of the average of x ** p
    signed = mul(sign(pooled), relu(abs(pooled)))
    return mul(signed, float(window)) ** (1.0 / norm_type)


def lp_pool1d(
    input: Tensor, norm_type: float, kernel_size: int, stride: Any = None, ceil_mode: bool = False
) -> Tensor:
    """Power-average pooling over the last dim: ``(sum of x^p over a window)^(1/p)``."""
    x = to_tensor(input)
    k = _single("lp_pool1d", "kernel_size", kernel_size)
    pooled = avg_pool1d(x**norm_type, k, stride, 0, ceil_mode)
    return _lp_finish(pooled, k, norm_type)


def lp_pool2d(
    input: Tensor, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False
) -> Tensor:
    """Power-average pooling over the last two dims: ``(sum of x^p over a window)^(1/p)``."""
    x = to_tensor(input)
    kh, kw = _pair(kernel_size)
    pooled = avg_pool2d(x**norm_type, (kh, kw), stride, 0, ceil_mode)
    return _lp_finish(pooled, kh * kw, norm_type)


@_torch_node_name("PdistBackward0")
def pdist(input: Tensor, p: float = 2.0) -> Tensor:
    """The ``p``-norm distances between the rows of an (N, M) input, pairs i < j in row-major
    order (``N (N - 1) / 2`` values); zero distances get a zero gradient."""
    x = to_tensor(input)
    if x.ndim != 2:
        raise ShapeError(f"pdist only supports 2D tensors, got: {x.ndim}D")
    rows, cols = np.triu_indices(x.shape[0], 1)
    first = _created(Tensor._make(rows.astype(np.int64)))
    second = _created(Tensor._make(cols.astype(np.int64)))
    if x.device != first.device:
        first, second = first.to(x.device), second.to(x.device)
    diff = sub(x.index_select(0, first), x.index_select(0, second))
    return norm(diff, p, dim=1)


def dropout1d(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:
    """Zeroes whole channels of an (N, C, L) or (C, L) input with probability ``p``."""
    x = to_tensor(input)
    if x.ndim not in (2, 3):
        raise ShapeError(
            f"dropout1d: Expected 2D or 3D input, but received a {x.ndim}D input. Note that "
            "dropout1d exists to provide channel-wise dropout on inputs with 1 spatial "
            "dimension, a channel dimension, and an optional batch dimension (i.e. 2D or 3D "
            "inputs)."
        )
    return _feature_dropout(x, p, training, 1, None)


def dropout2d(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:
    """Zeroes whole channels of an (N, C, H, W) input with probability ``p``; a 3-D input is
    (N, C, L), with PyTorch's warning."""
    x = to_tensor(input)
    if x.ndim == 3:
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D "
            "dropout behavior is desired - input is interpreted as shape (N, C, L), where C is "
            "the channel dim. This behavior will change in a future release to interpret the "
            "input as one without a batch dimension, i.e. shape (C, H, W). To maintain the 1D "
            "channel-wise dropout behavior, please switch to using dropout1d instead.",
            stacklevel=2,
        )
        return _feature_dropout(x, p, training, 3, None)  # (never "unbatched": N, C, 1)
    _feature_dropout_input("dropout2d", x, 2)
    return _feature_dropout(x, p, training, 2, None)


def dropout3d(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:
    """Zeroes whole channels of an (N, C, D, H, W) or (C, D, H, W) input with probability
    ``p``."""
    x = to_tensor(input)
    _feature_dropout_input("dropout3d", x, 3)
    return _feature_dropout(x, p, training, 3, None)


def max_pool1d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """``max_pool2d`` over a unit height: an (N, C, L) or (C, L) input."""
    x = to_tensor(input)
    if x.ndim not in (2, 3):
        raise ShapeError(f"max_pool1d: Expected 2D or 3D input, got {describe(x)}")
    one = _single("max_pool1d", "kernel_size", kernel_size)
    out = max_pool2d(
        x.unsqueeze(-2),
        (1, one),
        (1, _single("max_pool1d", "stride", stride if stride is not None else one)),
        (0, _single("max_pool1d", "padding", padding)),
        (1, _single("max_pool1d", "dilation", dilation)),
        ceil_mode,
        return_indices,
    )
    if return_indices:
        return out[0].squeeze(-2), out[1].squeeze(-2)
    return out.squeeze(-2)


def avg_pool1d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Tensor:
    """``avg_pool2d`` over a unit height: an (N, C, L) or (C, L) input."""
    x = to_tensor(input)
    if x.ndim not in (2, 3):
        raise ShapeError(f"avg_pool1d: Expected 2D or 3D input, got {describe(x)}")
    one = _single("avg_pool1d", "kernel_size", kernel_size)
    out = avg_pool2d(
        x.unsqueeze(-2),
        (1, one),
        (1, _single("avg_pool1d", "stride", stride if stride is not None else one)),
        (0, _single("avg_pool1d", "padding", padding)),
        ceil_mode,
        count_include_pad,
    )
    return out.squeeze(-2)


@_torch_node_name("PixelShuffleBackward0")
def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """(*, C r^2, H, W) -> (*, C, H r, W r): each channel group of r^2 becomes an r x r block."""
    x = to_tensor(input)
    r = int(upscale_factor)
    if x.ndim < 3:
        raise ShapeError(
            f"pixel_shuffle expects input to have at least 3 dimensions, but got input with "
            f"{x.ndim} dimension(s)"
        )
    *lead, c, h, w = x.shape
    if c % (r * r):
        raise ShapeError(
            "pixel_shuffle expects its input's 'channel' dimension to be divisible by the square "
            f"of upscale_factor, but input.size(-3)={c} is not divisible by {r * r}"
        )
    n = len(lead)
    y = x.reshape(*lead, c // (r * r), r, r, h, w)
    y = y.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)  # (*, C, H, r, W, r)
    return y.reshape(*lead, c // (r * r), h * r, w * r)


@_torch_node_name("PixelUnshuffleBackward0")
def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """(*, C, H r, W r) -> (*, C r^2, H, W): the inverse of ``pixel_shuffle``."""
    x = to_tensor(input)
    r = int(downscale_factor)
    if x.ndim < 3:
        raise ShapeError(
            f"pixel_unshuffle expects input to have at least 3 dimensions, but got input with "
            f"{x.ndim} dimension(s)"
        )
    *lead, c, h, w = x.shape
    if h % r or w % r:
        raise ShapeError(
            "pixel_unshuffle expects height and width to be divisible by downscale_factor, but "
            f"input.size(-2)={h} and input.size(-1)={w} are not both divisible by {r}"
        )
    n = len(lead)
    y = x.reshape(*lead, c, h // r, r, w // r, r)
    y = y.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)  # (*, C, r, r, H, W)
    return y.reshape(*lead, c * r * r, h // r, w // r)


@_torch_node_name("ChannelShuffleBackward0")
def channel_shuffle(input: Tensor, groups: int) -> Tensor:
    """(N, g k, *) -> channels interleaved across the ``groups`` (ShuffleNet)."""
    x = to_tensor(input)
    g = int(groups)
    if x.ndim < 3:
        raise ShapeError(
            f"channel_shuffle expects input to have at least 3 dimensions, but got input with "
            f"{x.ndim} dimension(s)"
        )
    if g <= 0 or x.shape[1] % g:
        raise ShapeError(
            f"Number of channels must be divisible by groups. Got {x.shape[1]} channels and "
            f"{g} groups."
        )
    n, c, *rest = x.shape
    return x.reshape(n, g, c // g, *rest).transpose(1, 2).reshape(n, c, *rest)


# ---- margin and likelihood losses (composites; PyTorch's formulas) ----------------------------


def margin_ranking_loss(
    input1: Tensor,
    input2: Tensor,
    target: Tensor,
    margin: float = 0.0,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """``max(0, -y (x1 - x2) + margin)``."""
    reduction = _legacy(size_average, reduce, reduction)
    x1, x2, y = to_tensor(input1), to_tensor(input2), to_tensor(target)
    if not (x1.ndim == x2.ndim == y.ndim):
        raise ShapeError(
            f"margin_ranking_loss : All input tensors should have same dimension but got sizes: "
            f"input1: {list(x1.shape)}, input2: {list(x2.shape)}, target: {list(y.shape)} "
        )
    loss = clamp(add(neg(mul(y, sub(x1, x2))), margin), min=0.0)
    return _reduce(loss, reduction, "margin_ranking_loss")


def hinge_embedding_loss(
    input: Tensor,
    target: Tensor,
    margin: float = 1.0,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """``x`` where ``y == 1``, ``max(0, margin - x)`` where ``y == -1``."""
    reduction = _legacy(size_average, reduce, reduction)
    x, y = to_tensor(input), to_tensor(target)
    margin_part = where(y != 1, clamp(sub(margin, x), min=0.0), 0.0)
    self_part = where(y != -1, x, 0.0)
    return _reduce(add(margin_part, self_part), reduction, "hinge_embedding_loss")


@_torch_node_name("SoftMarginLossBackward0")
def soft_margin_loss(
    input: Tensor,
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """``log(1 + exp(-y x))``, computed as ``softplus(-y x)``."""
    reduction = _legacy(size_average, reduce, reduction)
    loss = softplus(neg(mul(to_tensor(target), to_tensor(input))))
    return _reduce(loss, reduction, "soft_margin_loss")


def multilabel_soft_margin_loss(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Per sample, the mean over classes of ``-(y log sigmoid(x) + (1 - y) log sigmoid(-x))``."""
    reduction = _legacy(size_average, reduce, reduction)
    x, y = to_tensor(input), to_tensor(target)
    # log sigmoid(x) = -softplus(-x), stable for large |x|
    loss = add(mul(y, softplus(neg(x))), mul(sub(1.0, y), softplus(x)))
    if weight is not None:
        loss = mul(loss, weight)
    loss = div(sum(loss, x.ndim - 1), x.shape[-1])
    return _reduce(loss, reduction, "multilabel_soft_margin_loss")


def cosine_embedding_loss(
    input1: Tensor,
    input2: Tensor,
    target: Tensor,
    margin: float = 0.0,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """``1 - cos(x1, x2)`` where ``y == 1``, ``max(0, cos(x1, x2) - margin)`` where
    ``y == -1`` (the cosine with PyTorch's 1e-12 added to each squared norm)."""
    reduction = _legacy(size_average, reduce, reduction)
    x1, x2, y = to_tensor(input1), to_tensor(input2), to_tensor(target)
    d = x1.ndim - 1
    eps = 1e-12
    dot = sum(mul(x1, x2), d)
    denom = sqrt(mul(add(sum(mul(x1, x1), d), eps), add(sum(mul(x2, x2), d), eps)))
    cos = div(dot, denom)
    pos = where(y == 1, sub(1.0, cos), 0.0)
    neg_part = where(y == -1, clamp(sub(cos, margin), min=0.0), 0.0)
    return _reduce(add(pos, neg_part), reduction, "cosine_embedding_loss")


def poisson_nll_loss(
    input: Tensor,
    target: Tensor,
    log_input: bool = True,
    full: bool = False,
    size_average: bool | None = None,
    eps: float = 1e-8,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Poisson negative log likelihood: ``exp(x) - y x`` (``log_input``) or
    ``x - y log(x + eps)``; ``full`` adds Stirling's term where ``y > 1``."""
    reduction = _legacy(size_average, reduce, reduction)
    x, y = to_tensor(input), to_tensor(target)
    if log_input:
        loss = sub(exp(x), mul(y, x))
    else:
        loss = sub(x, mul(y, log(add(x, eps))))
    if full:
        safe = where(y > 1, y, 2.0)
        stirling = add(sub(mul(safe, log(safe)), safe), mul(log(mul(safe, 2 * math.pi)), 0.5))
        loss = add(loss, where(y > 1, stirling, 0.0))
    return _reduce(loss, reduction, "poisson_nll_loss")


def rms_norm(
    input: Tensor,
    normalized_shape: Any,
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing ``normalized_shape`` dims;
    ``eps=None`` is the dtype's machine epsilon, as PyTorch's."""
    x = to_tensor(input)
    shape = (
        (int(normalized_shape),)
        if isinstance(normalized_shape, int)
        else tuple(int(s) for s in normalized_shape)
    )
    if not shape or tuple(x.shape[x.ndim - len(shape) :]) != shape or len(shape) > x.ndim:
        raise ShapeError(
            f"Given normalized_shape={list(shape)}, expected input with shape "
            f"[*, {', '.join(str(s) for s in shape)}], but got input of size{list(x.shape)}"
        )
    if eps is None:
        eps = float(np.finfo(x.dtype.np).eps)
    dims = tuple(range(x.ndim - len(shape), x.ndim))
    scale = _rsqrt(add(mean(mul(x, x), dims, keepdim=True), eps))
    out = mul(x, scale)
    return out if weight is None else mul(out, weight)


def gaussian_nll_loss(
    input: Tensor,
    target: Tensor,
    var: Any,
    full: bool = False,
    eps: float = 1e-6,
    reduction: str = "mean",
) -> Tensor:
    """``0.5 (log(var) + (x - y)^2 / var)`` (``+ 0.5 log(2 pi)`` when ``full``); ``var`` is
    clamped to ``eps`` for the value only (the gradient passes as if unclamped, as PyTorch's
    in-place clamp under no_grad does)."""
    x, y = to_tensor(input), to_tensor(target)
    v = to_tensor(var) if isinstance(var, Tensor) else _full_like(x, float(var))
    if tuple(v.shape) != tuple(x.shape):
        if tuple(x.shape[:-1]) == tuple(v.shape):
            v = v.unsqueeze(-1)  # one variance per sample: homoscedastic over the last dim
        elif tuple(x.shape[:-1]) == tuple(v.shape[:-1]) and v.shape[-1] == 1:
            pass
        else:
            raise ValueError("var is of incorrect size")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not a valid value for reduction")

    def no_negative(array: Any) -> None:  # (checked again on every replay of a compiled step)
        if (np.asarray(_storage.to_host(array)) < 0).any():
            raise ValueError("var has negative entry/entries")

    _check(v, no_negative)
    with _no_grad():
        lifted = sub(clamp(v, min=eps), v)
    v = add(v, lifted)
    loss = mul(add(log(v), div(mul(sub(x, y), sub(x, y)), v)), 0.5)
    if full:
        loss = add(loss, 0.5 * math.log(2 * math.pi))
    return _reduce(loss, reduction, "gaussian_nll_loss")


@_torch_node_name("PreluKernelBackward0")
def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """``x`` where ``x > 0``, else ``weight * x``; ``weight`` one value or one per channel
    (dim 1)."""
    x, w = to_tensor(input), to_tensor(weight)
    if w.numel() != 1:
        channels = x.shape[1] if x.ndim >= 2 else 1
        if w.numel() != channels:
            raise ShapeError(
                "Mismatch of parameter numbers and input channel size. Found parameter numbers "
                f"= {w.numel()} and channel size = {channels}."
            )
        w = w.reshape((channels,) + (1,) * (x.ndim - 2))
    return where(x > 0, x, mul(w, x))


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y_o = x1^T W_o x2 + b_o`` over the last dims (an einsum)."""
    out = einsum("...i,oij,...j->...o", to_tensor(input1), to_tensor(weight), to_tensor(input2))
    return out if bias is None else add(out, bias)


def max_pool1d_with_indices(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = True,
) -> Any:
    """``max_pool1d(..., return_indices=True)``."""
    return max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool2d_with_indices(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = True,
) -> Any:
    """``max_pool2d(..., return_indices=True)``."""
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


@_torch_node_name("RreluWithNoiseBackward0")
def rrelu(
    input: Tensor,
    lower: float = 1.0 / 8,
    upper: float = 1.0 / 3,
    training: bool = False,
    generator: Any = None,
) -> Tensor:
    """Randomized leaky ReLU: negative inputs times a slope drawn from U(lower, upper) per
    element in training, times ``(lower + upper) / 2`` otherwise."""
    x = to_tensor(input)
    if not training:
        return where(x >= 0, x, mul(x, (lower + upper) / 2))
    shape, np_dtype = tuple(x.shape), x.dtype.np

    def draw() -> Tensor:
        slopes = _gen(generator).uniform(lower, upper, shape)
        return Tensor._make(_storage.placed_like(np.asarray(slopes, dtype=np_dtype), x._data))

    return where(x >= 0, x, mul(x, _created(draw(), draw)))


def local_response_norm(
    input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0
) -> Tensor:
    """``x / (k + alpha * mean of x^2 over a window of ``size`` channels)^beta``; the window is
    zero-padded at the ends (``size // 2`` before, ``(size - 1) // 2`` after), as PyTorch's."""
    x = to_tensor(input)
    if x.ndim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {x.ndim} dimensions)")
    if x.numel() == 0:
        return x
    channels = x.shape[1]
    square = mul(x, x)
    widths = [0] * (2 * (x.ndim - 2)) + [size // 2, (size - 1) // 2]
    padded = pad(square, widths)
    window = padded.narrow(1, 0, channels)
    for j in range(1, size):
        window = add(window, padded.narrow(1, j, channels))
    div_ = add(mul(window, alpha / size), k) ** beta
    return div(x, div_)


def gumbel_softmax(
    logits: Tensor, tau: float = 1, hard: bool = False, eps: float = 1e-10, dim: int = -1
) -> Tensor:
    """``softmax((logits + g) / tau)`` with Gumbel(0, 1) noise ``g`` (drawn through the
    generator path dropout uses, so a compiled step redraws it); ``hard``: the one-hot of the
    arg max in the forward, the soft sample's gradient (straight-through)."""
    x = to_tensor(logits)
    shape, np_dtype = tuple(x.shape), x.dtype.np

    def draw() -> Tensor:
        exponential = -np.log1p(-_gen(None).random(shape))  # Exp(1) samples
        gumbel = (-np.log(exponential)).astype(np_dtype)
        return Tensor._make(_storage.placed_like(gumbel, x._data))

    y_soft = softmax(div(add(x, _created(draw(), draw)), tau), dim)
    if not hard:
        return y_soft
    index = y_soft.argmax(dim, keepdim=True)
    y_hard = _zeros_like(x).scatter(dim, index, 1.0)
    return add(sub(y_hard, y_soft.detach()), y_soft)


@_torch_node_name("NativeLayerNormBackward0")
def layer_norm(
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    x = to_tensor(input)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(x.shape[x.ndim - len(shape) :]) != shape:
        raise ShapeError(
            f"layer_norm: normalized_shape {list(shape)} does not match the trailing dims of "
            f"input {describe(x)}"
        )
    dims = tuple(range(x.ndim - len(shape), x.ndim))
    w = None if weight is None else to_tensor(weight)
    b = None if bias is None else to_tensor(bias)
    if _norms.fused_norm_runs(x, w, b, rows=True) and all(
        p is None or p.shape == shape for p in (w, b)
    ):
        mean, var = _norms.norm_stats(x, "layer", None, len(shape))
        return _norms.norm(x, mean, var, w, b, "layer", eps, True, None, len(shape))
    if _records(x, w, b):
        lead = tuple(range(x.ndim - len(shape)))
        return _native.LayerNorm.apply(x, w, b, eps, None, dims, None, lead, None, None, None)
    return _native.normalize(x, w, b, eps, None, dims, None)[0]


# ---- more activations (composites; nn.functional adds their ``inplace=`` forms) --------------

# SELU's constants (Klambauer et al. 2017), as PyTorch spells them
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def softsign(input: Tensor) -> Tensor:
    """``x / (1 + |x|)``."""
    x = _ew.to_tensor(input)
    return _ew.div(x, _ew.add(_ew.abs(x), 1.0))


def tanhshrink(input: Tensor) -> Tensor:
    """``x - tanh(x)``."""
    x = _ew.to_tensor(input)
    return _ew.sub(x, _ew.tanh(x))


@_torch_node_name("HardshrinkBackward0")
def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd``, else 0 (gradient 0 at ``|x| == lambd``, as PyTorch)."""
    x = _ew.to_tensor(input)
    return _ew.where(_ew.gt(_ew.abs(x), lambd), x, 0.0)


@_torch_node_name("SoftshrinkBackward0")
def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, else 0."""
    x = _ew.to_tensor(input)
    if lambd < 0:
        raise RuntimeError(
            f"lambda must be in range [0, inf] for input dtype {x.dtype}, but found {lambd}"
        )
    shrunk = _ew.where(_ew.gt(x, lambd), _ew.sub(x, lambd), _ew.add(x, lambd))
    return _ew.where(_ew.gt(_ew.abs(x), lambd), shrunk, 0.0)


@_torch_node_name("ThresholdBackward0")
def threshold(input: Tensor, threshold: float, value: float) -> Tensor:
    """``x`` where ``x > threshold``, else ``value`` (``inplace`` in nn.functional)."""
    return _ew.where(_ew.gt(_ew.to_tensor(input), threshold), input, value)


@_torch_node_name("HardsigmoidBackward0")
def hardsigmoid(input: Tensor) -> Tensor:
    """``relu6(x + 3) / 6`` (``inplace`` in nn.functional)."""
    x = _ew.to_tensor(input)
    # x / 6 + 1/2 on (-3, 3), 0 below, 1 above; the gradient is 0 at -3 and 3, as PyTorch's
    inside = _ew.logical_and(_ew.gt(x, -3.0), _ew.lt(x, 3.0))
    outside = _ew.where(_ge(x, 3.0), 1.0, 0.0)
    return _ew.where(inside, _ew.add(_ew.div(x, 6.0), 0.5), outside)


@_torch_node_name("HardswishBackward0")
def hardswish(input: Tensor) -> Tensor:
    """x * relu6(x + 3) / 6, written piecewise so that the gradient at the kinks is PyTorch's:
    0 at x = -3 and 1 at x = 3 (a clamp would pass the gradient there: -0.5 and 1.5)."""
    x = to_tensor(input)
    return where(x <= -3.0, 0.0, where(x < 3.0, x * add(x, 3.0) / 6.0, x))


@_torch_node_name("EluBackward0")
def selu(input: Tensor) -> Tensor:
    return elu(to_tensor(input), _SELU_ALPHA) * _SELU_SCALE


@_torch_node_name("CeluBackward0")
def celu(input: Tensor, alpha: float = 1.0) -> Tensor:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)) = alpha * elu(x / alpha)."""
    if alpha == 0:
        raise ShapeError("ZeroDivisionError: alpha cannot be 0 for CELU")  # a RuntimeError
    return elu(to_tensor(input) / alpha, 1.0) * alpha


@_torch_node_name("GluBackward0")
def glu(input: Tensor, dim: int = -1) -> Tensor:
    """a * sigmoid(b), where a and b are the two halves of ``input`` along ``dim``."""
    x = to_tensor(input)
    if x.ndim == 0:
        raise ShapeError("glu does not support scalars because halving size must be even")
    d = dim + x.ndim if dim < 0 else dim
    if not 0 <= d < x.ndim:
        raise IndexOutOfRange(
            f"Dimension out of range (expected to be in range of [{-x.ndim}, {x.ndim - 1}], "
            f"but got {dim})"
        )
    if x.shape[d] % 2:
        raise ShapeError(f"Halving dimension must be even, but dimension {d} is size {x.shape[d]}")
    a, b = x.chunk(2, d)
    return a * sigmoid(b)


# ---- batch, group and instance normalisation --------------------------------------------------
# On CPU float32/float64 tensors each runs the fused primitives of ``ops/norms.py`` (the
# statistics, then the normalisation; one backward kernel), as layer_norm does; otherwise
# composites like layer_norm's: a mean and a centred sum of squares per channel (or group).
# Running statistics are buffers updated in place under no_grad, as PyTorch's are, so a
# whole-step compile replays the update.


class NormArgumentError(ShapeError):
    """A bad input or statistics shape of a normalisation (PyTorch raises RuntimeError, or
    ValueError for too few values per channel: ShapeError is both)."""


def _channel_shape(x: Tensor) -> list[int]:
    """(1, C, 1, ...): a per-channel vector broadcast against an (N, C, *) input."""
    return [1, x.shape[1]] + [1] * (x.ndim - 2)


def _check_channel_vector(op: str, name: str, v: Tensor | None, channels: int) -> None:
    if v is not None and v.numel() != channels:
        raise NormArgumentError(f"{op}: {name} should contain {channels} elements not {v.numel()}")


def _update_running(running: Tensor | None, batch_value: Tensor, momentum: float | Tensor) -> None:
    """``running = (1 - momentum) * running + momentum * batch_value``, in place, without
    history; ``momentum`` may be a tensor (the cumulative average's 1 / num_batches_tracked,
    kept on the tensor side so a compiled step never reads it on the host)."""
    if running is None:
        return
    with _no_grad():
        update = batch_value.detach().reshape(running.shape).to(running.dtype)
        running.mul_(1.0 - momentum).add_(update * momentum)


def _affine(x: Tensor, weight: Any, bias: Any) -> Tensor:
    """``x * weight + bias`` with per-channel (dim 1) weight and bias, either may be None."""
    shape = _channel_shape(x)
    if weight is not None:
        x = x * to_tensor(weight).reshape(shape)
    if bias is not None:
        x = x + to_tensor(bias).reshape(shape)
    return x


def _with_running_stats(
    x: Tensor, running_mean: Tensor, running_var: Tensor, eps: float, weight: Any, bias: Any
) -> Tensor:
    """Normalisation by given statistics (eval mode)."""
    w = None if weight is None else to_tensor(weight)
    b = None if bias is None else to_tensor(bias)
    # (the fused kernel where no graph is recorded: its node would keep the input, which the
    # composite's nodes do not need for the input's gradient)
    if _norms.fused_norm_runs(x, w, b, running_mean, running_var) and not _records(x, w, b):
        rm, rv = running_mean.reshape(-1), running_var.reshape(-1)
        return _norms.norm(x, rm, rv, w, b, "batch", eps, False)
    shape = _channel_shape(x)
    scale = (running_var.reshape(shape) + eps).rsqrt()
    return _affine(sub(x, running_mean.reshape(shape)) * scale, weight, bias)


def _norm_inputs(
    op: str, input: Any, running_mean: Any, running_var: Any, weight: Any, bias: Any
) -> tuple:
    """``batch_norm``/``instance_norm``'s checked arguments: the (N, C, *) input, the running
    statistics as tensors (or None) and the channel count; every per-channel vector has C
    elements."""
    x = to_tensor(input)
    if x.ndim < 2:
        raise NormArgumentError(
            f"{op}: expected an input of at least 2 dims (N, C, *), got {describe(x)}"
        )
    channels = x.shape[1]
    rm = None if running_mean is None else to_tensor(running_mean)
    rv = None if running_var is None else to_tensor(running_var)
    for name, v in (("running_mean", rm), ("running_var", rv), ("weight", weight), ("bias", bias)):
        _check_channel_vector(op, name, None if v is None else to_tensor(v), channels)
    return x, rm, rv, channels


@_torch_node_name("NativeBatchNormBackward0")
def batch_norm(
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalises each channel (dim 1) of an (N, C, *) input over the batch and spatial dims.

    In training the batch's statistics are used (biased variance) and the running statistics,
    when given, move towards them by ``momentum`` (unbiased variance), in place; otherwise the
    running statistics normalise."""
    x, rm, rv, channels = _norm_inputs("batch_norm", input, running_mean, running_var, weight, bias)
    if not training:
        if rm is None or rv is None:
            raise NormArgumentError(
                f"batch_norm: running_{'mean' if rm is None else 'var'} must be defined in "
                "evaluation mode"
            )
        return _with_running_stats(x, rm, rv, eps, weight, bias)
    count = x.numel() // channels if channels else 0
    if count <= 1:
        raise NormArgumentError(
            f"Expected more than 1 value per channel when training, got input size {tuple(x.shape)}"
        )
    w = None if weight is None else to_tensor(weight)
    b = None if bias is None else to_tensor(bias)
    if _norms.fused_norm_runs(x, w, b, rm, rv):
        mean, var = _norms.norm_stats(x, "batch")
        out = _norms.norm(x, mean, var, w, b, "batch", eps, True)
        _update_from_stats(mean, var, rm, rv, momentum, count)
        return out
    dims = (0,) + tuple(range(2, x.ndim))
    return _batch_norm_training(x, weight, bias, eps, dims, (rm, rv, momentum))


def _update_from_stats(
    mean: Tensor,
    var: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    momentum: Any,
    count: int,
) -> None:
    """Move the running statistics towards ``norm_stats``'s mean and (unbiased) variance; an
    instance norm's, (N, C), averaged over the samples."""
    if running_mean is None and running_var is None:
        return
    with _no_grad():
        var = var * (count / (count - 1))
        if mean.ndim == 2:  # (N, C): averaged over the samples
            mean, var = mean.mean(0), var.mean(0)
        _update_running(running_mean, mean, momentum)
        _update_running(running_var, var, momentum)


def _batch_norm_training(
    x: Tensor, weight: Any, bias: Any, eps: float, dims: tuple, running: tuple
) -> Tensor:
    """Per-channel (dim 1) statistics over ``dims``; the running ones move towards them."""
    w = None if weight is None else to_tensor(weight)
    b = None if bias is None else to_tensor(bias)
    shape = (1, -1) + (1,) * (x.ndim - 2)  # (per channel: no size to key a compiled backward on)
    if _records(x, w, b):
        return _native.BatchNorm.apply(x, w, b, eps, None, dims, shape, dims, *running)
    return _native.normalize(x, w, b, eps, None, dims, shape, running)[0]


@_torch_node_name("ViewBackward0")
def instance_norm(
    input: Tensor,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalises each (sample, channel) of an (N, C, *) input over its spatial dims.  Running
    statistics, when given, move towards the batch mean of the instances' statistics."""
    x, rm, rv, channels = _norm_inputs(
        "instance_norm", input, running_mean, running_var, weight, bias
    )
    if not use_input_stats:
        if rm is None or rv is None:
            raise NormArgumentError(
                "Expected running_mean and running_var to be defined when use_input_stats is false"
            )
        return _with_running_stats(x, rm, rv, eps, weight, bias)
    count = math.prod(x.shape[2:])
    if count <= 1:
        raise NormArgumentError(
            f"Expected more than 1 spatial element when training, got input size {tuple(x.shape)}"
        )
    w = None if weight is None else to_tensor(weight)
    b = None if bias is None else to_tensor(bias)
    if _norms.fused_norm_runs(x, w, b, rm, rv):
        mean, var = _norms.norm_stats(x, "instance")
        out = _norms.norm(x, mean, var, w, b, "instance", eps, True)
        _update_from_stats(mean, var, rm, rv, momentum, count)
        return out
    # as PyTorch: batch_norm of the (1, N * C, *) input, the affine parameters repeated per
    # sample; the running statistics move towards the mean of the instances' statistics
    n = x.shape[0]
    merged = x.reshape(1, n * channels, *x.shape[2:])
    w = None if weight is None else to_tensor(weight).repeat(n)
    b = None if bias is None else to_tensor(bias).repeat(n)
    dims = (0,) + tuple(range(2, x.ndim))
    out = _batch_norm_training(merged, w, b, eps, dims, (rm, rv, momentum))
    return out.reshape(x.shape)


@_torch_node_name("NativeGroupNormBackward0")
def group_norm(
    input: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Splits the C channels of an (N, C, *) input into ``num_groups`` groups and normalises
    each (sample, group) over its channels and spatial dims; then a per-channel affine."""
    x = to_tensor(input)
    if x.ndim < 2:
        raise NormArgumentError(
            f"Expected at least 2 dimensions for input tensor but received {x.ndim}"
        )
    channels = x.shape[1]
    if num_groups <= 0 or channels % num_groups:
        raise NormArgumentError(
            "Expected number of channels in input to be divisible by num_groups, but got input "
            f"of shape {list(x.shape)} and num_groups={num_groups}"
        )
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None and to_tensor(v).numel() != channels:
            raise NormArgumentError(
                f"Expected {name} to be a vector of size equal to the number of channels in "
                f"input, but got {name} of shape {list(to_tensor(v).shape)} and input of shape "
                f"{list(x.shape)}"
            )
    w = None if weight is None else to_tensor(weight)
    b = None if bias is None else to_tensor(bias)
    if _norms.fused_norm_runs(x, w, b):
        mean, var = _norms.norm_stats(x, "group", num_groups)
        return _norms.norm(x, mean, var, w, b, "group", eps, True, num_groups)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if _records(x, w, b):
        per_channel = (0,) + tuple(range(2, x.ndim))
        return _native.GroupNorm.apply(
            x, w, b, eps, num_groups, (2,), shape, per_channel, None, None, None
        )
    return _native.normalize(x, w, b, eps, num_groups, (2,), shape)[0]


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    x = to_tensor(input)
    n = x.norm(p, dim, keepdim=True)
    return x / clamp(n, min=eps)


# ---- adaptive average pooling and interpolation ------------------------------------------------
# Both are separable: each spatial dim is resampled on its own, by a reshape-mean, a strided
# slice, a repeat or (for uneven windows and linear weights) a small constant matrix multiplied
# along that dim.  Every path is ordinary primitives (twice differentiable, compiled as such),
# and none needs a scatter in its backward except nearest resampling by an uneven factor (an
# index gather).


def _constant(x: Tensor, array: np.ndarray) -> Tensor:
    """A constant (not requiring grad) of ``x``'s float dtype, on ``x``'s device."""
    t = _created(Tensor._make(np.ascontiguousarray(array, dtype=x.dtype.np)))
    return t if x.device == t.device else t.to(x.device)


def _along(x: Tensor, dim: int, matrix: np.ndarray) -> Tensor:
    """``x`` with ``matrix`` (out, in) applied to dim ``dim`` (in long, out long after)."""
    m = _constant(x, matrix)
    if dim == x.ndim - 1:
        return x @ m.mT
    if dim == x.ndim - 2:
        return m @ x
    return (x.movedim(dim, -1) @ m.mT).movedim(-1, dim)


def _adaptive_max(x: Tensor, dim: int, out: int) -> Tensor:
    """PyTorch's adaptive max along ``dim``: output i is the maximum of input
    [floor(i * n / out), ceil((i + 1) * n / out)); windows are gathered (a short one repeats
    its last element) so the gradient reaches the one selected element, as max(dim) sends it."""
    n = x.shape[dim]
    if out == n:
        return x.clone()
    if out > 0 and n % out == 0:
        return x.unflatten(dim, (out, n // out)).max(dim + 1).values
    bounds = [((i * n) // out, -((-(i + 1) * n) // out)) for i in range(out)]
    width = builtins.max(stop - start for start, stop in bounds)
    index = np.array(
        [[builtins.min(start + j, stop - 1) for j in range(width)] for start, stop in bounds],
        dtype=np.int64,
    )
    positions = _created(Tensor._make(index.reshape(-1)))
    positions = positions if x.device == positions.device else positions.to(x.device)
    windows = x.index_select(dim, positions)
    return windows.unflatten(dim, (out, width)).max(dim + 1).values


def _adaptive_sizes(op: str, x: Tensor, output_size: Any, dims: int) -> tuple:
    sizes = (output_size,) * dims if isinstance(output_size, int) else tuple(output_size)
    if len(sizes) != dims:
        raise ValueError(f"{op}: output_size must be an int or {dims} values, got {output_size}")
    spatial = x.shape[x.ndim - dims :]
    return tuple(int(n if s is None else s) for s, n in zip(sizes, spatial))


@_torch_node_name("AdaptiveMaxPool2DBackward0")
def adaptive_max_pool2d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """Max over PyTorch's adaptive windows of the last two dims ((N, C, H, W) or (C, H, W))."""
    x = to_tensor(input)
    if x.ndim not in (3, 4):
        raise ShapeError(
            f"adaptive_max_pool2d(): Expected 3D or 4D tensor, but got {list(x.shape)}"
        )
    if return_indices:
        return _conv.adaptive_max_pool(x, 2, output_size, True, "adaptive_max_pool2d")
    oh, ow = _adaptive_sizes("adaptive_max_pool2d", x, output_size, 2)
    if _conv.kernel_ok(x) and x.numel():
        return _conv.adaptive_pool(x, 2, (oh, ow), "max", False)
    return _adaptive_max(_adaptive_max(x, x.ndim - 2, oh), x.ndim - 1, ow)


def adaptive_max_pool1d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """Max over PyTorch's adaptive windows of the last dim ((N, C, L) or (C, L))."""
    x = to_tensor(input)
    if x.ndim not in (2, 3):
        raise ShapeError(
            f"adaptive_max_pool1d(): Expected 2D or 3D tensor, but got {list(x.shape)}"
        )
    (size,) = _adaptive_sizes("adaptive_max_pool1d", x, output_size, 1)
    if return_indices:
        values, indices = _conv.adaptive_max_pool(x, 1, (size,), True, "adaptive_max_pool1d")
        return _name_node(values, "SqueezeBackward1"), indices
    if _conv.kernel_ok(x) and x.numel():
        return _name_node(_conv.adaptive_pool(x, 1, (size,), "max", False), "SqueezeBackward1")
    return _name_node(_adaptive_max(x, x.ndim - 1, size), "SqueezeBackward1")


@_torch_node_name("AdaptiveMaxPool3DBackward0")
def adaptive_max_pool3d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """Max over PyTorch's adaptive windows of the last three dims ((N, C, D, H, W) or (C, D,
    H, W)); separable (a maximum over a box is the maximum over each dim in turn)."""
    x = to_tensor(input)
    if x.ndim not in (4, 5):
        raise ShapeError(
            f"adaptive_max_pool3d(): Expected 4D or 5D tensor, but got {list(x.shape)}"
        )
    if return_indices:
        return _conv.adaptive_max_pool(x, 3, output_size, True, "adaptive_max_pool3d")
    sizes = _adaptive_sizes("adaptive_max_pool3d", x, output_size, 3)
    if _conv.kernel_ok(x) and x.numel():
        return _conv.adaptive_pool(x, 3, sizes, "max", False)
    for k, size in enumerate(sizes):
        x = _adaptive_max(x, x.ndim - 3 + k, size)
    return x


def adaptive_max_pool1d_with_indices(
    input: Tensor, output_size: Any, return_indices: bool = True
) -> Any:
    return adaptive_max_pool1d(input, output_size, True)


def adaptive_max_pool2d_with_indices(
    input: Tensor, output_size: Any, return_indices: bool = True
) -> Any:
    return adaptive_max_pool2d(input, output_size, True)


def adaptive_max_pool3d_with_indices(
    input: Tensor, output_size: Any, return_indices: bool = True
) -> Any:
    return adaptive_max_pool3d(input, output_size, True)


def _adaptive_average(x: Tensor, dim: int, out: int) -> Tensor:
    """PyTorch's adaptive average along ``dim``: output i averages input
    [floor(i * n / out), ceil((i + 1) * n / out))."""
    n = x.shape[dim]
    if out == n:
        return x
    if out > 0 and n % out == 0:  # even windows: a reshape and a mean
        return mean(x.unflatten(dim, (out, n // out)), dim + 1)
    matrix = np.zeros((out, n))
    for i in range(out):
        start, stop = (i * n) // out, -((-(i + 1) * n) // out)
        matrix[i, start:stop] = 1.0 / (stop - start)
    return _along(x, dim, matrix)


@_torch_node_name(_adaptive_pool_name)
def adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor:
    x = to_tensor(input)
    if x.ndim not in (3, 4):
        raise ShapeError(
            f"adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got {list(x.shape)}"
        )
    sizes = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,) * 2
    if len(sizes) != 2:
        raise ShapeError("adaptive_avg_pool2d: output_size must be 2")
    for d in range(1 if x.ndim == 4 else 0, x.ndim):
        if x.shape[d] == 0:
            raise ShapeError(
                "adaptive_avg_pool2d(): Expected input to have non-zero size for non-batch "
                f"dimensions, but input has sizes {list(x.shape)} with dimension {d} being empty"
            )
    if _conv.kernel_ok(x):
        spatial = x.shape[x.ndim - 2 :]
        outs = tuple(int(n if v is None else v) for v, n in zip(sizes, spatial))
        return _conv.adaptive_pool(x, 2, outs, "avg", False)
    for k, size in enumerate(sizes):
        dim = x.ndim - 2 + k
        x = _adaptive_average(x, dim, x.shape[dim] if size is None else int(size))
    return x


@_torch_node_name("SqueezeBackward1")
def adaptive_avg_pool1d(input: Tensor, output_size: Any) -> Tensor:
    x = to_tensor(input)
    if x.ndim not in (2, 3):
        raise ShapeError(
            f"adaptive_avg_pool1d: Expected 2 to 3 dimensions, but got {x.ndim}-dimensional tensor"
        )
    sizes = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,)
    if len(sizes) != 1:
        raise ShapeError(
            "adaptive_avg_pool1d() argument 'output_size' should contain one int "
            f"(got {len(sizes)})"
        )
    if _conv.kernel_ok(x) and x.shape[-1]:
        return _conv.adaptive_pool(x, 1, (int(sizes[0]),), "avg", False)
    return _adaptive_average(x, x.ndim - 1, int(sizes[0]))


@_torch_node_name("AdaptiveAvgPool3DBackward0")
def adaptive_avg_pool3d(input: Tensor, output_size: Any) -> Tensor:
    """Averages over PyTorch's adaptive windows of the last three dims."""
    x = to_tensor(input)
    if x.ndim not in (4, 5):
        raise ShapeError(
            f"adaptive_avg_pool3d(): Expected 4D or 5D tensor, but got {list(x.shape)}"
        )
    for d in range(1 if x.ndim == 5 else 0, x.ndim):
        if x.shape[d] == 0:
            raise ShapeError(
                "adaptive_avg_pool3d(): Expected input to have non-zero size for non-batch "
                f"dimensions, but input has sizes {list(x.shape)} with dimension {d} being empty"
            )
    sizes = _adaptive_sizes("adaptive_avg_pool3d", x, output_size, 3)
    if _conv.kernel_ok(x):
        return _conv.adaptive_pool(x, 3, sizes, "avg", False)
    for k, size in enumerate(sizes):
        x = _adaptive_average(x, x.ndim - 3 + k, size)
    return x


_INTERPOLATE_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "area")
_LINEAR_RANK = {"linear": 3, "bilinear": 4, "trilinear": 5}


@_torch_node_name(_interpolate_name)
def interpolate(
    input: Tensor,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> Tensor:
    """Resamples the spatial dims of an (N, C, d1, ...) input (1 to 3 spatial dims) to ``size``
    or ``scale_factor`` times its size, by ``mode``: nearest, nearest-exact, linear, bilinear,
    trilinear (``align_corners``) or area (adaptive average pooling), as PyTorch computes them.

    On CPU float32 / float64 tensors the nearest and linear modes run one fused kernel forward
    and one backward (``ops/resample.py``): each output reads only its neighbours, as
    PyTorch's.  Elsewhere (CUDA tensors, forward AD, the linear modes inside compiled
    programs) linear weights are applied as a constant matrix per dim: a non-finite input value
    then reaches every output of its row through a zero weight (nan)."""
    x = to_tensor(input)
    rank = _LINEAR_RANK.get(mode)
    if align_corners is not None and rank is None:
        raise ValueError(
            "align_corners option can only be set with the interpolating modes: "
            "linear | bilinear | bicubic | trilinear"
        )
    if mode not in _INTERPOLATE_MODES or x.ndim not in (3, 4, 5):
        raise NotImplementedError(
            f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {x.ndim}D) for the "
            f"modes: nearest | linear | bilinear | trilinear | area | nearest-exact (got {mode})"
            + (
                "; bicubic and lanczos are not implemented in fusegrad"
                if mode in ("bicubic", "lanczos")
                else ""
            )
        )
    if rank is not None and x.ndim != rank:
        raise NotImplementedError(f"Got {x.ndim}D input, but {mode} mode needs {rank}D input")
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not implemented in fusegrad")
    spatial = x.ndim - 2
    in_sizes = [int(v) for v in x.shape[2:]]
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    scales: list[float | None] = [None] * spatial
    if size is not None:
        out_sizes = list(size) if isinstance(size, (tuple, list)) else [size] * spatial
        if len(out_sizes) != spatial:
            raise ValueError(
                "Input and output must have the same number of spatial dimensions, but got input "
                f"with spatial dimensions of {in_sizes} and output size of {tuple(size)}. Please "
                "provide input tensor in (N, C, d1, d2, ...,dK) format and output size in "
                "(o1, o2, ...,oK) format."
            )
        out_sizes = [int(v) for v in out_sizes]
    elif scale_factor is not None:
        factors = (
            list(scale_factor)
            if isinstance(scale_factor, (tuple, list))
            else [scale_factor] * spatial
        )
        if len(factors) != spatial:
            raise ValueError(
                "Input and scale_factor must have the same number of spatial dimensions, but got "
                f"input with spatial dimensions of {in_sizes} and scale_factor of shape "
                f"{tuple(scale_factor)}. Please provide input tensor in (N, C, d1, d2, ...,dK) "
                "format and scale_factor in (s1, s2, ...,sK) format."
            )
        out_sizes = [math.floor(n * float(f)) for n, f in zip(in_sizes, factors)]
        if not recompute_scale_factor:
            scales = [float(f) for f in factors]  # the kernels use the given factor, not n / out
    else:
        raise ValueError("either size or scale_factor should be defined")
    if any(o <= 0 for o in out_sizes) or any(n <= 0 for n in in_sizes):
        raise ShapeError(
            f"interpolate: Input and output sizes should be greater than 0, but got input "
            f"{tuple(in_sizes)} output {tuple(out_sizes)}"
        )
    if mode != "area" and _resample.fused_resample_runs(x, linear=rank is not None):
        kind = "linear" if rank is not None else mode
        return _resample.resample(x, kind, tuple(out_sizes), tuple(scales), bool(align_corners))
    for k in range(spatial):
        dim, n, out = 2 + k, in_sizes[k], out_sizes[k]
        if mode != "area" and _resample.keeps_dim(
            "linear" if rank is not None else mode, spatial, n, out
        ):
            continue  # (as PyTorch's kernels: the dim is copied as it is)
        if mode == "area":
            x = _adaptive_average(x, dim, out)
        elif rank is not None:
            x = _along(x, dim, _linear_matrix(n, out, scales[k], bool(align_corners)))
        else:
            source = _resample.nearest_source(n, out, scales[k], mode == "nearest-exact")
            x = _nearest(x, dim, source)
    return x.clone() if x is input else x  # (a new tensor, also where every dim is copied)


def _linear_matrix(n: int, out: int, scale: float | None, align_corners: bool) -> np.ndarray:
    """(out, n): each output's two source weights (``resample.linear_source``)."""
    index, weight = _resample.linear_source(n, out, scale, align_corners)
    matrix = np.zeros((out, n))
    rows = np.arange(out)
    matrix[rows, index[:, 0]] += weight[:, 0]  # one element per row each time: no duplicate
    matrix[rows, index[:, 1]] += weight[:, 1]  # indices (at the last input both are the same)
    return matrix


def _nearest(x: Tensor, dim: int, source: np.ndarray) -> Tensor:
    """``x`` indexed by ``source`` along ``dim``: a repeat or a strided slice when the indices
    are one (their gradients are a sum and a slice write), else an index gather."""
    n, out = x.shape[dim], len(source)
    if out % n == 0 and np.array_equal(source, np.repeat(np.arange(n), out // n)):
        k = out // n
        shape = list(x.shape)
        expanded = shape[: dim + 1] + [k] + shape[dim + 1 :]
        merged = shape[:dim] + [out] + shape[dim + 1 :]
        return x.unsqueeze(dim + 1).expand(*expanded).reshape(merged)
    step = int(source[1] - source[0]) if out > 1 else 1
    if step > 0 and np.array_equal(source, source[0] + step * np.arange(out)):
        lead = (slice(None),) * dim
        return x[lead + (slice(int(source[0]), int(source[-1]) + 1, step),)]
    index = _created(Tensor._make(source.astype(np.int64)))
    return x.index_select(dim, index if x.device == index.device else index.to(x.device))


# ---- convolution and pooling via im2col ----------------------------------------------------------


# ``fusegrad.autograd.native``: conv2d and the norm layers as single nodes (custom Functions,
# so a layer above this one), handed over by that module when it is imported
_native: Any = None


def install_native(module: Any) -> None:
    """Called by ``fusegrad.autograd.native`` with itself (see its docstring)."""
    global _native
    _native = module


def _records(*tensors: Tensor | None) -> bool:
    """Whether a call on ``tensors`` records a backward node: grad mode on, one of them
    requiring grad, and no forward-AD level (whose tangents come from the composites'
    primitives).  conv2d and the norm layers then run as one node of ``native``, which saves
    only what PyTorch's native node saves (and only for the gradients that will be needed)."""
    if not _grad_mode.is_grad_enabled() or _forward_state.level is not None:
        return False
    tracer = _current_tracer()
    if tracer is not None and tracer.primitive_nodes:  # (vmap: see ``Tracer.primitive_nodes``)
        return False
    return any(t is not None and t.requires_grad for t in tensors)


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else (int(v[0]), int(v[1]))


def _single(op: str, name: str, v: Any) -> int:
    if isinstance(v, (int, np.integer)):
        return int(v)
    if len(v) != 1:
        raise ShapeError(
            f"{op}: expected {name} to be a single integer value or a list of 1 values to match "
            f"the convolution dimensions, but got {name}={list(v)}"
        )
    return int(v[0])


# Convolution and pooling over 1, 2 and 3 spatial dims are written once, in ``convolution``;
# these are PyTorch's entry points (1-D pooling runs as 2-D over a unit height, as PyTorch's
# does, so its node is a ``SqueezeBackward1``).


@_torch_node_name("ConvolutionBackward0")
def conv1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """1-D convolution of (N, C, L) or (C, L) inputs by an (O, C / groups, k) weight."""
    return _conv.convolution(input, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


@_torch_node_name("ConvolutionBackward0")
def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """2-D convolution of (N, C, H, W) or (C, H, W) inputs by an (O, C / groups, kh, kw)
    weight."""
    return _conv.convolution(input, weight, bias, stride, padding, dilation, groups, 2, "conv2d")


@_torch_node_name("ConvolutionBackward0")
def conv3d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """3-D convolution of (N, C, D, H, W) or (C, D, H, W) inputs by an (O, C / groups, kd,
    kh, kw) weight."""
    return _conv.convolution(input, weight, bias, stride, padding, dilation, groups, 3, "conv3d")


def conv_transpose1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Tensor:
    """The transposed 1-D convolution of (N, C_in, L) or (C_in, L) inputs with weight (C_in,
    C_out / groups, k)."""
    return _conv.conv_transpose(
        input,
        weight,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
        1,
        "conv_transpose1d",
    )


def conv_transpose2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Tensor:
    """The transposed 2-D convolution (conv2d's gradient with respect to its input) of (N,
    C_in, H, W) or (C_in, H, W) input with weight (C_in, C_out / groups, kh, kw)."""
    return _conv.conv_transpose(
        input,
        weight,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
        2,
        "conv_transpose2d",
    )


def conv_transpose3d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Tensor:
    """The transposed 3-D convolution of (N, C_in, D, H, W) or (C_in, D, H, W) input with
    weight (C_in, C_out / groups, kd, kh, kw)."""
    return _conv.conv_transpose(
        input,
        weight,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
        3,
        "conv_transpose3d",
    )


def max_pool2d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    return _conv.max_pool(
        input, 2, kernel_size, stride, padding, dilation, ceil_mode, return_indices, "max_pool2d"
    )


def max_pool3d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    return _conv.max_pool(
        input, 3, kernel_size, stride, padding, dilation, ceil_mode, return_indices, "max_pool3d"
    )


def max_pool3d_with_indices(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = True,
) -> Any:
    """``max_pool3d(..., return_indices=True)``."""
    return max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


@_torch_node_name("AvgPool2DBackward0")
def avg_pool2d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    return _conv.avg_pool(
        input,
        2,
        kernel_size,
        stride,
        padding,
        ceil_mode,
        count_include_pad,
        divisor_override,
        "avg_pool2d",
    )


@_torch_node_name("AvgPool3DBackward0")
def avg_pool3d(
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    return _conv.avg_pool(
        input,
        3,
        kernel_size,
        stride,
        padding,
        ceil_mode,
        count_include_pad,
        divisor_override,
        "avg_pool3d",
    )


def lp_pool3d(
    input: Tensor, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False
) -> Tensor:
    """Power-average pooling over the last three dims: ``(sum of x^p over a window)^(1/p)``."""
    return _conv.lp_pool(input, 3, norm_type, kernel_size, stride, ceil_mode, "lp_pool3d")


def _max_unpool_name(
    input: Tensor, indices: Tensor, kernel_size: Any, *args: Any, **kw: Any
) -> str:
    return f"MaxUnpool{to_tensor(indices).ndim - 2 if to_tensor(indices).ndim > 2 else 1}DBackward0"


def max_unpool1d(
    input: Tensor,
    indices: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    output_size: Any = None,
) -> Tensor:
    """The inverse of ``max_pool1d``: values put back at their indices, zeros elsewhere."""
    out = _conv.max_unpool(
        input, indices, 1, kernel_size, stride, padding, output_size, "max_unpool1d"
    )
    return _name_node(out, "MaxUnpool1DBackward0")


def max_unpool2d(
    input: Tensor,
    indices: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    output_size: Any = None,
) -> Tensor:
    """The inverse of ``max_pool2d``: values put back at their indices, zeros elsewhere."""
    out = _conv.max_unpool(
        input, indices, 2, kernel_size, stride, padding, output_size, "max_unpool2d"
    )
    return _name_node(out, "MaxUnpool2DBackward0")


def max_unpool3d(
    input: Tensor,
    indices: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    output_size: Any = None,
) -> Tensor:
    """The inverse of ``max_pool3d``: values put back at their indices, zeros elsewhere."""
    out = _conv.max_unpool(
        input, indices, 3, kernel_size, stride, padding, output_size, "max_unpool3d"
    )
    return _name_node(out, "MaxUnpool3DBackward0")


def fractional_max_pool2d(
    input: Tensor,
    kernel_size: Any,
    output_size: Any = None,
    output_ratio: Any = None,
    return_indices: bool = False,
    _random_samples: Tensor | None = None,
) -> Any:
    """Max over windows of ``kernel_size`` at pseudo-random starts (PyTorch's sequence for the
    same ``_random_samples``) that give ``output_size`` or ``output_ratio`` outputs."""
    return _conv.fractional_max_pool(
        input,
        2,
        kernel_size,
        output_size,
        output_ratio,
        return_indices,
        _random_samples,
        "fractional_max_pool2d",
    )


def fractional_max_pool3d(
    input: Tensor,
    kernel_size: Any,
    output_size: Any = None,
    output_ratio: Any = None,
    return_indices: bool = False,
    _random_samples: Tensor | None = None,
) -> Any:
    """3-D ``fractional_max_pool2d``."""
    return _conv.fractional_max_pool(
        input,
        3,
        kernel_size,
        output_size,
        output_ratio,
        return_indices,
        _random_samples,
        "fractional_max_pool3d",
    )


def fractional_max_pool2d_with_indices(
    input: Tensor,
    kernel_size: Any,
    output_size: Any = None,
    output_ratio: Any = None,
    return_indices: bool = True,
    _random_samples: Tensor | None = None,
) -> Any:
    return fractional_max_pool2d(
        input, kernel_size, output_size, output_ratio, True, _random_samples
    )


def fractional_max_pool3d_with_indices(
    input: Tensor,
    kernel_size: Any,
    output_size: Any = None,
    output_ratio: Any = None,
    return_indices: bool = True,
    _random_samples: Tensor | None = None,
) -> Any:
    return fractional_max_pool3d(
        input, kernel_size, output_size, output_ratio, True, _random_samples
    )


# ---- attention -------------------------------------------------------------------------------


class AttentionDTypeError(DTypeError, RuntimeError):
    """Query, key, value or mask dtypes that scaled_dot_product_attention does not accept
    (PyTorch raises RuntimeError; TypeError is fusegrad's dtype error)."""


def _check_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool
) -> None:
    if not (q.dtype == k.dtype == v.dtype):
        raise AttentionDTypeError(
            "scaled_dot_product_attention: expected query, key, and value to have the same "
            f"dtype, but got query {describe(q)}, key {describe(k)} and value {describe(v)}"
        )
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise ShapeError(
            "scaled_dot_product_attention: expected query, key, and value to all be at least 2 "
            f"dimensional, but got query {describe(q)}, key {describe(k)} and value {describe(v)}"
        )
    if not q.dtype.is_floating_point:
        raise AttentionDTypeError(
            f"scaled_dot_product_attention: expected floating point inputs, got {describe(q)}"
        )
    if mask is not None and mask.dtype.name not in ("bool", "float32") and mask.dtype != q.dtype:
        raise AttentionDTypeError(
            "scaled_dot_product_attention: expected attn_mask dtype to be bool or float or to "
            f"match query dtype, but got attn_mask {describe(mask)} and query {describe(q)}"
        )
    if is_causal and mask is not None:
        raise ShapeError(
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when "
            "is_causal=True"
        )
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """softmax(query @ key^T * scale + bias) @ value, PyTorch's math: ``scale`` defaults to
    1/sqrt(E) (E = query.size(-1)); a bool ``attn_mask`` keeps the positions where it is True, a
    float one is added to the scores; ``is_causal`` keeps the lower triangle of the (L, S)
    scores (top-left aligned); batch dims broadcast; ``enable_gqa`` repeats key/value heads
    (dim -3) to query's count.  A row whose every position is masked gives zeros and a zero
    gradient, as PyTorch's safe softmax does (not NaN).  On the CPU, where it pays (see
    ``_fused_attention_pays``), one fused kernel (the ``attention`` primitive); otherwise a
    composite of matmul, softmax and where.
    """
    q, k, v = to_tensor(query), to_tensor(key), to_tensor(value)
    mask = None if attn_mask is None else to_tensor(attn_mask)
    _check_attention(q, k, v, mask, dropout_p, is_causal)
    if enable_gqa and q.ndim >= 3 and k.ndim >= 3:
        heads, kv_heads = q.shape[-3], k.shape[-3]
        if kv_heads == 0 or heads % kv_heads or v.shape[-3] != kv_heads:
            raise ShapeError(
                "scaled_dot_product_attention: number of heads in key and value must divide "
                f"the number of heads in query, got query {describe(q)}, key {describe(k)} "
                f"and value {describe(v)}"
            )
        if heads != kv_heads:
            k = k.repeat_interleave(heads // kv_heads, -3)
            v = v.repeat_interleave(heads // kv_heads, -3)
    length, source = q.shape[-2], k.shape[-2]
    factor = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if _fused_attention_pays(q, k, v, mask, dropout_p, is_causal):
        return _fused_attention(q, k, v, mask, float(factor), is_causal)
    if not sdpa_backends.math:
        raise RuntimeError(  # (PyTorch's words when no allowed backend takes the call)
            "No available kernel. Aborting execution. (nn.attention.sdpa_kernel allows no "
            "backend that runs this call: fusegrad's are MATH and, for CPU float32/float64 "
            "calls without dropout, FLASH_ATTENTION / EFFICIENT_ATTENTION)"
        )
    scores = mul(q @ k.mT, factor)
    if is_causal:
        keep = _created(Tensor._make(np.tri(length, source, 0, dtype=bool))).to(q.device)
        scores = where(keep, scores, -math.inf)
    fully_masked = None
    if mask is not None:
        if mask.dtype.name == "bool":
            scores = where(mask, scores, -math.inf)
            fully_masked = ~mask.any(-1, keepdim=True)
        else:
            scores = add(scores, mask.to(scores.dtype))
            fully_masked = (mask == -math.inf).all(-1, keepdim=True)
        # safe softmax: a row with nothing to attend to gets zero weights; its scores are
        # replaced before the softmax so that neither the output nor the gradient is NaN
        scores = where(fully_masked, 0.0, scores)
    weights = softmax(scores, -1)
    if fully_masked is not None:
        weights = where(fully_masked, 0.0, weights)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return weights @ v


# Where the fused kernel pays.  Forward + backward at one thread (CPU time, the 2-core machine
# loaded by other work), float32, B=8, H=4, E=32 (GPT-like), best of 5 (a /tmp script, not a
# benchmark file), composite vs fused:
#   L=S=64: 4.9 vs 5.6 ms; 128: 16.8 vs 19.3 ms; 256: 49 vs 71 ms
#   is_causal (the kernel skips the masked half): 64: 5.9 vs 3.7 ms; 128: 18.7 vs 12.1 ms;
#   256: 57 vs 40 ms
# Without a causal mask numpy's BLAS matmuls beat the kernel's vectorised loops (no register
# blocking), so the kernel runs for causal attention, and for any call whose score tensors
# (N * L * S) would be too large to hold comfortably: its memory is O(L + S) per slab.
_FUSED_MIN_SCORES = 1 << 26


class _SdpaBackends(threading.local):
    """Which attention paths ``nn.attention.sdpa_kernel`` allows, per thread: ``math`` (the
    composite) and ``fused`` (the fused CPU kernel, PyTorch's flash / efficient backends)."""

    def __init__(self) -> None:
        self.math = True
        self.fused = True


sdpa_backends = _SdpaBackends()


def _fused_attention_pays(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, causal: bool
) -> bool:
    """Whether the fused CPU kernel runs this call: CPU tensors of float32/float64 with one
    batch shape and equal head dims, no dropout, causal attention or scores of at least
    ``_FUSED_MIN_SCORES`` elements (see above), a mask that needs no gradient, and no
    forward-AD level (whose rules the composite has).
    Everything else (CUDA, dropout, enable_gqa's repeated heads, broadcast batch dims, float16)
    runs the composite."""
    if not sdpa_backends.fused:  # (``nn.attention.sdpa_kernel`` allowed the math path only)
        return False
    if dropout_p > 0.0 or q.device.type != "cpu" or q.dtype.name not in ("float32", "float64"):
        return False
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) or q.ndim < 2:
        return False
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]) or 0 in q.shape or 0 in k.shape:
        return False
    if not causal and q.numel() // q.shape[-1] * k.shape[-2] < _FUSED_MIN_SCORES:
        return False
    if mask is not None and (mask.requires_grad or mask.ndim > q.ndim or mask.ndim < 1):
        return False
    return _forward_state.level is None


def _fused_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, causal: bool
) -> Tensor:
    """The ``attention`` primitive on (N, L, E) slabs; the mask as (1 or N, L, S) slabs (bool,
    or a bias in q's dtype)."""
    batch, length, source, width = tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1]
    slabs = int(np.prod(batch)) if batch else 1
    inputs = [x.reshape(slabs, x.shape[-2], width) for x in (q, k, v)]
    if mask is not None:
        scores_shape = batch + (length, source)
        try:
            full = _broadcast_shapes(tuple(mask.shape), scores_shape)
        except ValueError:
            full = None
        if full != scores_shape:
            raise ShapeError(
                f"scaled_dot_product_attention: attn_mask {describe(mask)} does not broadcast "
                f"to the scores' shape {batch + (length, source)}"
            )
        m = mask if mask.dtype.name == "bool" else mask.to(q.dtype)
        head = tuple(m.shape[:-2])
        if all(d == 1 for d in head):
            m = m.reshape((1,) + tuple(m.shape[-2:])).expand(1, length, source)
        else:
            m = m.expand(*batch, length, source).reshape(slabs, length, source)
        inputs.append(m.contiguous())
    packed = apply(P["attention"], tuple(inputs), {"scale": scale, "causal": causal})
    return packed.narrow(2, 0, width).reshape(*batch, length, width)
