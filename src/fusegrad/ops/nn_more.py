"""More of ``torch.nn.functional``: ``embedding_bag``, ``ctc_loss``, the multi-class margin
losses, ``triplet_margin_with_distance_loss``, ``affine_grid``, ``grid_sample`` and
``linear_cross_entropy``, all composites of primitives (so twice differentiable where PyTorch
is, and visible to the compiler as ordinary ops).

* ``embedding_bag``: the bag rows looked up, then summed into their bags by ``index_add``
  (``mean`` divides by the bag sizes, ``max`` is ``scatter_reduce``'s ``amax``).
* ``ctc_loss``: the forward (alpha) recursion of Graves et al. in log space over the time
  steps, vectorised over the batch and the extended label positions; its gradient is
  autograd's (PyTorch's kernel returns the gradient with respect to the logits before
  ``log_softmax``: through a ``log_softmax`` both agree).
* ``grid_sample``: coordinates unnormalised, padded (zeros, border, reflection) and sampled
  with nearest, bilinear (trilinear in 3-D) or bicubic weights from gathered taps; the gradient
  reaches both the input and the grid (through the weights), as PyTorch's.
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .. import dtypes as _dt
from .. import storage as _storage
from ..autograd.grad_mode import no_grad
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import notify_host_read as _read
from ..errors import ArgumentError, ShapeError, describe
from ..tensor import Tensor
from ._util import cast, to_tensor
from .creation import _leaf, zeros
from .elementwise import clamp, floor, where
from .extra import scatter_reduce
from .functional import _legacy, _reduce, cross_entropy, pairwise_distance
from .generated import abs, exp, log
from .indexing import embedding, gather
from .linalg import linear
from .reduction import amax, sum
from .shape import cat, stack

__all__ = [
    "LinearCrossEntropyOptions",
    "affine_grid",
    "ctc_loss",
    "embedding_bag",
    "grid_sample",
    "linear_cross_entropy",
    "multi_margin_loss",
    "multilabel_margin_loss",
    "triplet_margin_with_distance_loss",
]


def _host(x: Tensor, what: str) -> np.ndarray:
    _read(x, what)
    return np.asarray(_storage.to_host(x._data))


def _index(values: np.ndarray, like: Tensor) -> Tensor:
    return _created(_leaf(np.ascontiguousarray(values, dtype=np.int64), False, like.device))


def _constant(values: np.ndarray, like: Tensor) -> Tensor:
    return _created(_leaf(np.ascontiguousarray(values, dtype=like.dtype.np), False, like.device))


# ---- embedding_bag -------------------------------------------------------------------------------


def embedding_bag(
    input: Any,
    weight: Tensor,
    offsets: Any = None,
    max_norm: float | None = None,
    norm_type: float = 2,
    scale_grad_by_freq: bool = False,
    mode: str = "mean",
    sparse: bool = False,
    per_sample_weights: Any = None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> Tensor:
    """Sums, means or maxima of bags of embeddings: the rows of a 2-D ``input`` are bags, or
    ``offsets`` start the bags of a 1-D one.  ``per_sample_weights`` scale each row (``sum``
    only); rows at ``padding_idx`` are left out (and an empty bag gives zeros)."""
    idx = to_tensor(input)
    w = to_tensor(weight)
    if mode not in ("sum", "mean", "max"):
        raise ArgumentError(f"embedding_bag: mode has to be one of sum, mean or max, got {mode}")
    if w.ndim != 2:
        raise ShapeError(f"embedding_bag: weight has to be a 2D Tensor, got {describe(w)}")
    if idx.dtype.category != 1:
        raise ShapeError(f"embedding_bag: expected an integer index tensor, got {describe(idx)}")
    if per_sample_weights is not None and mode != "sum":
        raise ArgumentError(
            "embedding_bag: per_sample_weights was not None. per_sample_weights is only "
            f"supported for mode='sum' (got mode='{mode}'). Please open a feature request on "
            "GitHub."
        )
    if idx.ndim == 2:
        if offsets is not None:
            raise ShapeError("if input is 2D, then offsets has to be None")
        bags, length = idx.shape
        flat = idx.reshape(-1)
        bag_of = np.repeat(np.arange(bags), length)
    elif idx.ndim == 1:
        if offsets is None:
            raise ShapeError("offsets has to be a 1D Tensor but got None")
        starts = _host(to_tensor(offsets), "embedding_bag()").astype(np.int64)
        if starts.ndim != 1:
            raise ShapeError(f"offsets has to be a 1D Tensor, got {starts.ndim}D")
        n = idx.shape[0]
        if include_last_offset:
            if starts.size == 0:
                raise ShapeError("embedding_bag: include_last_offset needs at least one offset")
            starts = starts[:-1]
        if starts.size and (starts[0] != 0 or np.any(np.diff(starts) < 0) or starts[-1] > n):
            raise ShapeError(
                f"embedding_bag: offsets must start at 0, not decrease and stay within the "
                f"input's {n} entries (got {starts.tolist()})"
            )
        bags = starts.size
        flat = idx
        bag_of = np.searchsorted(starts, np.arange(n), side="right") - 1
    else:
        raise ShapeError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {idx.ndim}")
    if max_norm is not None:
        _renorm_rows(w, flat, max_norm, norm_type)
    keep = np.ones(flat.shape[0], bool)
    if padding_idx is not None:
        pad = padding_idx + w.shape[0] if padding_idx < 0 else padding_idx
        keep = _host(flat, "embedding_bag()") != pad
    rows = embedding(flat, w)
    if per_sample_weights is not None:
        psw = to_tensor(per_sample_weights)
        if tuple(psw.shape) != tuple(idx.shape):
            raise ShapeError(
                f"embedding_bag: per_sample_weights {describe(psw)} must have the input's "
                f"shape {list(idx.shape)}"
            )
        rows = rows * cast(psw.reshape(-1), w.dtype).unsqueeze(1)
    positions = np.nonzero(keep)[0]
    if positions.size != flat.shape[0]:
        rows = rows.index_select(0, _index(positions, w))
    bag_ids = bag_of[positions]
    bag_index = _index(bag_ids, w)
    width = w.shape[1]
    out = zeros(bags, width, dtype=w.dtype, device=w.device)
    if mode == "max":
        spread = bag_index.unsqueeze(1).expand(bag_ids.size, width)
        return scatter_reduce(out, 0, spread, rows, "amax", include_self=False)
    total = out.index_add(0, bag_index, rows)
    if mode == "sum":
        return total
    counts = np.bincount(bag_ids, minlength=bags).astype(np.float64)
    return total / _constant(np.maximum(counts, 1.0)[:, None], w)


def _renorm_rows(weight: Tensor, index: Tensor, max_norm: float, norm_type: float) -> None:
    """Rows of ``weight`` that ``index`` looks up, rescaled in place (without history) so that
    their ``norm_type``-norm is at most ``max_norm`` (PyTorch's embedding_renorm_)."""
    rows = np.unique(_host(index, "embedding max_norm"))
    with no_grad():
        picked = weight[_index(rows, weight)]
        norms = picked.norm(norm_type, dim=1, keepdim=True)
        scale = where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
        weight[_index(rows, weight)] = picked * scale


# ---- losses --------------------------------------------------------------------------------------


def _safe_logsumexp(parts: list[Tensor]) -> Tensor:
    """``log(sum(exp(parts)))`` elementwise over the list, -inf (with zero gradients, never
    NaN) where every part is -inf: the CTC recursion's unreachable states."""
    stacked = stack(parts, 0)
    top = amax(stacked, 0).detach()
    top = where(top == -math.inf, 0.0, top)
    total = sum(exp(stacked - top), 0)
    empty = total == 0
    return where(empty, -math.inf, log(where(empty, 1.0, total)) + top)


@_torch_node_name("CtcLossBackward0")
def ctc_loss(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Any,
    target_lengths: Any,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
) -> Tensor:
    """The Connectionist Temporal Classification loss of (T, N, C) (or unbatched (T, C))
    log-probabilities against (N, S) padded or 1-D concatenated targets: minus the log of the
    total probability of the alignments (blanks and repeats collapsed) that give each target.
    ``mean`` divides each loss by its target length, then averages over the batch."""
    lp = to_tensor(log_probs)
    unbatched = lp.ndim == 2
    if unbatched:
        lp = lp.unsqueeze(1)
    if lp.ndim != 3:
        raise ShapeError(f"ctc_loss: log_probs must be (T, N, C) or (T, C), got {describe(lp)}")
    steps, batch, classes = lp.shape
    tgt = _host(to_tensor(targets), "ctc_loss()").astype(np.int64)
    in_len = np.atleast_1d(_host(to_tensor(input_lengths), "ctc_loss()")).astype(np.int64)
    tg_len = np.atleast_1d(_host(to_tensor(target_lengths), "ctc_loss()")).astype(np.int64)
    if unbatched:
        tgt = tgt.reshape(1, -1)
    if in_len.shape != (batch,) or tg_len.shape != (batch,):
        raise ShapeError(
            f"ctc_loss: expected {batch} input and target lengths, got {in_len.shape[0]} and "
            f"{tg_len.shape[0]}"
        )
    if np.any(in_len > steps) or np.any(in_len < 0):
        raise ShapeError(f"ctc_loss: input lengths must be in [0, {steps}], got {in_len.tolist()}")
    # each sample's labels: a row of a padded (N, S) target, or its part of the concatenation
    if tgt.ndim == 1 and not unbatched:
        ends = np.cumsum(tg_len)
        labels = [tgt[e - n : e] for e, n in zip(ends, tg_len)]
    else:
        labels = [tgt[n, : tg_len[n]] for n in builtins.range(batch)]
    if builtins.any(np.any((lab < 0) | (lab >= classes) | (lab == blank)) for lab in labels):
        raise ArgumentError("ctc_loss: target labels must be in [0, C) and differ from the blank")
    width = 2 * int(tg_len.max(initial=0)) + 1
    extended = np.full((batch, width), blank, np.int64)
    can_skip = np.zeros((batch, width), bool)  # s may come from s - 2 (a new, non-blank label)
    for n, lab in enumerate(labels):
        extended[n, 1 : 2 * len(lab) : 2] = lab
        s = np.arange(3, 2 * len(lab), 2)
        can_skip[n, s] = lab[1:] != lab[:-1]
    ext_index = _index(extended, lp)
    # lp_ext[t, n, s] = lp[t, n, extended[n, s]]
    lp_ext = gather(lp, 2, ext_index.unsqueeze(0).expand(steps, batch, width))
    neg = _constant(np.full((batch, 1), -math.inf), lp)
    skip_mask = _index(can_skip.astype(np.int64), lp) == 1
    start = np.full((batch, width), -math.inf)
    alpha = where(
        _index((np.arange(width)[None, :] < 2).repeat(batch, 0).astype(np.int64), lp) == 1,
        lp_ext[0],
        _constant(start, lp),
    )
    if width > 1:  # an empty target: position 1 is padding, not a first label
        first_label = np.zeros((batch, width), bool)
        first_label[:, 1] = tg_len == 0
        alpha = where(_index(first_label.astype(np.int64), lp) == 1, -math.inf, alpha)
    alive = _host_lengths(in_len, lp)
    for t in builtins.range(1, steps):
        one = cat([neg, alpha[:, :-1]], 1)
        two = cat([neg, neg, alpha[:, :-2]], 1)[:, :width] if width > 1 else one
        two = where(skip_mask, two, -math.inf)
        step = _safe_logsumexp([alpha, one, two]) + lp_ext[t]
        alpha = where(alive[t].unsqueeze(1), step, alpha)
    last = _index(2 * tg_len, lp).unsqueeze(1)
    before = _index(np.maximum(2 * tg_len - 1, 0), lp).unsqueeze(1)
    end_a = gather(alpha, 1, last).squeeze(1)
    end_b = where(
        _index((tg_len > 0).astype(np.int64), lp) == 1,
        gather(alpha, 1, before).squeeze(1),
        -math.inf,
    )
    loss = -_safe_logsumexp([end_a, end_b])
    if np.any(in_len == 0):  # no time steps: only an empty target has an alignment (of p 1)
        none = _index(((in_len == 0) & (tg_len > 0)).astype(np.int64), lp) == 1
        sure = _index(((in_len == 0) & (tg_len == 0)).astype(np.int64), lp) == 1
        loss = where(sure, 0.0, where(none, math.inf, loss))
    if zero_infinity:
        loss = where(loss == math.inf, 0.0, loss)
    if unbatched:
        loss = loss.squeeze(0)
    if reduction == "mean":
        lengths = _constant(np.maximum(tg_len, 1).astype(np.float64), lp)
        return (loss / (lengths.squeeze(0) if unbatched else lengths)).mean()
    return _reduce(loss, reduction, "ctc_loss")


def _host_lengths(lengths: np.ndarray, like: Tensor) -> Tensor:
    """(T, N) bool: whether time step t is within sample n's input."""
    steps = like.shape[0]
    return _index((np.arange(steps)[:, None] < lengths[None, :]).astype(np.int64), like) == 1


def multi_margin_loss(
    input: Tensor,
    target: Tensor,
    p: int = 1,
    margin: float = 1.0,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """The multi-class hinge loss: ``sum over i != y of max(0, margin - x[y] + x[i]) ** p``
    (times ``weight[y]``), over the C classes."""
    reduction = _legacy(size_average, reduce, reduction)
    if p not in (1, 2):
        raise ArgumentError("only p == 1 and p == 2 supported")
    x, y = to_tensor(input), to_tensor(target)
    unbatched = x.ndim <= 1
    x2 = x.reshape(1, -1) if unbatched else x
    if x2.ndim != 2 or y.numel() != x2.shape[0]:
        raise ShapeError(
            f"multi_margin_loss: expected (N, C) or (C,) input and N targets, got {describe(x, y)}"
        )
    y2 = y.reshape(-1, 1)
    picked = gather(x2, 1, y2)
    hinge = clamp(margin - picked + x2, min=0.0)
    if p == 2:
        hinge = hinge * hinge
    if weight is not None:
        hinge = hinge * gather(to_tensor(weight), 0, y2.reshape(-1)).unsqueeze(1)
    own = _index(np.arange(x2.shape[1]), x2).unsqueeze(0) == y2
    loss = sum(where(own, 0.0, hinge), 1) / x2.shape[1]
    if unbatched:
        loss = loss.squeeze(0)
    return _reduce(loss, reduction, "multi_margin_loss")


def multilabel_margin_loss(
    input: Tensor,
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """The multi-label hinge loss: for each target class j (a row of ``target`` lists them,
    ended by the first -1) and each other class i, ``max(0, 1 - (x[j] - x[i]))``, summed and
    divided by the C classes."""
    reduction = _legacy(size_average, reduce, reduction)
    x, y = to_tensor(input), to_tensor(target)
    unbatched = x.ndim <= 1
    x2 = x.reshape(1, -1) if unbatched else x
    labels = _host(y, "multilabel_margin_loss()").reshape(x2.shape)
    classes = x2.shape[1]
    is_target = np.zeros(x2.shape, bool)
    listed = np.zeros(x2.shape, bool)  # position k of a row is a target entry (before the -1)
    for n, row in enumerate(labels):
        for k, c in enumerate(row):
            if c < 0:
                break
            is_target[n, c] = True
            listed[n, k] = True
    safe = np.where(listed, labels, 0)
    picked = gather(x2, 1, _index(safe, x2))  # (N, C): x at each listed target
    margins = clamp(1.0 - picked.unsqueeze(2) + x2.unsqueeze(1), min=0.0)  # (N, k, i)
    mask = listed[:, :, None] & ~is_target[:, None, :]
    loss = sum(margins * _constant(mask.astype(np.float64), x2), (1, 2)) / classes
    if unbatched:
        loss = loss.squeeze(0)
    return _reduce(loss, reduction, "multilabel_margin_loss")


def triplet_margin_with_distance_loss(
    anchor: Tensor,
    positive: Tensor,
    negative: Tensor,
    *,
    distance_function: Any = None,
    margin: float = 1.0,
    swap: bool = False,
    reduction: str = "mean",
) -> Tensor:
    """``max(d(a, p) - d(a, n) + margin, 0)`` for any distance ``d`` (``pairwise_distance``
    by default); ``swap`` uses ``min(d(a, n), d(p, n))`` as the negative distance."""
    if margin <= 0:
        raise ArgumentError(f"triplet_margin_with_distance_loss: expected margin > 0, got {margin}")
    d = distance_function if distance_function is not None else pairwise_distance
    a, pos, neg = to_tensor(anchor), to_tensor(positive), to_tensor(negative)
    d_pos, d_neg = d(a, pos), d(a, neg)
    if swap:
        d_neg = where(d_neg < d(pos, neg), d_neg, d(pos, neg))
    loss = clamp(d_pos - d_neg + margin, min=0.0)
    return _reduce(loss, reduction, "triplet_margin_with_distance_loss")


@dataclass
class LinearCrossEntropyOptions:
    """How ``linear_cross_entropy`` may trade memory for time (PyTorch computes the logits in
    chunks of ``batch_chunk_size`` rows).  fusegrad accepts the options and computes the same
    values in one piece: the results do not depend on them."""

    allow_retain_graph: bool = False
    batch_chunk_size: int | None = None
    chunking_method: str | None = "auto"
    acc_policy: Literal["accurate", "balanced", "compact", "auto"] = "auto"
    acc_dtype: Any = None


def linear_cross_entropy(
    input: Tensor,
    linear_weight: Tensor,
    target: Tensor,
    *,
    linear_bias: Tensor | None = None,
    weight: Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
    options: LinearCrossEntropyOptions | None = None,
) -> Tensor:
    """``cross_entropy(linear(input, linear_weight, linear_bias), target, ...)``; a
    ``linear_weight`` of shape (C, d_1, ..., d_K, in) gives K-dimensional logits."""
    x, w = to_tensor(input), to_tensor(linear_weight)
    if x.ndim not in (1, 2):
        raise ShapeError(f"expected input with dimensionality 1 or 2, got {x.ndim}")
    if w.ndim < 2:
        raise ShapeError(f"expected linear_weight with dimensionality at least 2, got {w.ndim}")
    if x.shape[-1] != w.shape[-1]:
        raise ShapeError(
            "expected equal input and linear_weight last dimensions (in_features), got "
            f"{x.shape[-1]} and {w.shape[-1]}, respectively"
        )
    classes, out_features = w.shape[0], tuple(w.shape[1:-1])
    if linear_bias is not None and tuple(linear_bias.shape) != (classes, *out_features):
        raise ShapeError(
            f"expected linear_bias shape {(classes, *out_features)}, got {tuple(linear_bias.shape)}"
        )
    if out_features and x.ndim == 1:
        raise ShapeError("K-dimensional loss needs a batched (N, in_features) input")
    flat_w = w.reshape(-1, w.shape[-1])
    flat_b = None if linear_bias is None else to_tensor(linear_bias).reshape(-1)
    logits = linear(x, flat_w, flat_b).reshape(*x.shape[:-1], classes, *out_features)
    return cross_entropy(
        logits,
        target,
        weight=weight,
        reduction=reduction,
        ignore_index=-100 if ignore_index is None else ignore_index,
        label_smoothing=label_smoothing,
    )


# ---- spatial transformers ----------------------------------------------------------------------


def affine_grid(theta: Tensor, size: Any, align_corners: bool | None = None) -> Tensor:
    """The sampling grid of a batch of affine maps: (N, 2, 3) ``theta`` and size (N, C, H, W)
    give (N, H, W, 2) coordinates in [-1, 1]; (N, 3, 4) and (N, C, D, H, W) give (N, D, H,
    W, 3).  Differentiable with respect to ``theta``."""
    th = to_tensor(theta)
    size = [int(v) for v in size]
    corners = bool(align_corners)
    if th.dtype.category != 2:
        raise ShapeError(f"Expected theta to have floating point type, but got {describe(th)}")
    spatial = len(size) - 2
    if spatial not in (2, 3) or tuple(th.shape) != (size[0], spatial, spatial + 1):
        raise ShapeError(
            f"Expected a batch of {spatial}D affine matrices of shape Nx{spatial}x{spatial + 1} "
            f"for size {size}. Got {list(th.shape)}."
        )

    def axis(n: int) -> np.ndarray:
        if n <= 1:
            return np.zeros(n)
        steps = np.linspace(-1.0, 1.0, n)
        return steps if corners else steps * (n - 1) / n

    dims = list(reversed(size[2:]))  # x (W) first, then y (H), then z (D)
    mesh = np.meshgrid(*[axis(n) for n in dims], indexing="ij")  # each (W, H[, D])
    coords = np.stack([*mesh, np.ones_like(mesh[0])], -1)  # (W, H[, D], spatial + 1)
    coords = np.transpose(coords, tuple(reversed(range(spatial))) + (spatial,))
    base = _constant(coords.reshape(-1, spatial + 1), th)  # (D*H*W, spatial + 1)
    grid = base @ th.mT  # (N, points, spatial)
    return grid.reshape(size[0], *size[2:], spatial)


def _unnormalise(coord: Tensor, size: int, corners: bool) -> Tensor:
    if corners:
        return (coord + 1) * ((size - 1) / 2)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord: Tensor, low2: int, high2: int) -> Tensor:
    """PyTorch's ``reflect_coordinates``: ``coord`` reflected into [low2 / 2, high2 / 2]."""
    if low2 == high2:
        return coord * 0
    low, span = low2 / 2, (high2 - low2) / 2
    moved = abs(coord - low)
    extra = moved.fmod(span)
    flips = floor(moved / span).detach()
    even = flips.fmod(2) == 0
    return where(even, extra + low, span - extra + low)


def _padded(coord: Tensor, size: int, padding: str, corners: bool) -> Tensor:
    """A source coordinate after the padding mode (border and reflection clip into range)."""
    if padding == "border":
        return clamp(coord, 0, size - 1)
    if padding == "reflection":
        coord = _reflect(coord, 0, 2 * (size - 1)) if corners else _reflect(coord, -1, 2 * size - 1)
        return clamp(coord, 0, size - 1)
    return coord


def _taps(flat: Tensor, sizes: tuple, points: list[Tensor], zero_outside: bool) -> Tensor:
    """Input values at integer ``points`` (one coordinate tensor per spatial dim, innermost
    last, each (N, P)), gathered from ``flat`` (N, C, volume); out-of-range points read 0 when
    ``zero_outside``, else are clamped."""
    index = None
    inside = None
    for coord, size in zip(points, sizes):
        ok = (coord >= 0) & (coord <= size - 1)
        inside = ok if inside is None else inside & ok
        c = clamp(coord, 0, size - 1)
        index = c if index is None else index * size + c
    idx = cast(index, _dt.int64)
    n, channels = flat.shape[0], flat.shape[1]
    values = gather(flat, 2, idx.unsqueeze(1).expand(n, channels, idx.shape[1]))
    if zero_outside:
        values = where(inside.unsqueeze(1), values, 0.0)
    return values


def _cubic_weights(t: Tensor) -> list[Tensor]:
    """PyTorch's cubic convolution coefficients (A = -0.75) for taps at -1, 0, 1, 2."""
    a = -0.75

    def near(x: Tensor) -> Tensor:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: Tensor) -> Tensor:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def grid_sample(
    input: Tensor,
    grid: Tensor,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool | None = None,
) -> Tensor:
    """Samples (N, C, H, W) ``input`` at the (N, Ho, Wo, 2) ``grid``'s (x, y) locations in
    [-1, 1] (or (N, C, D, H, W) at (N, Do, Ho, Wo, 3) (x, y, z)): ``mode`` nearest, bilinear
    (trilinear in 3-D) or bicubic (2-D); ``padding_mode`` zeros, border or reflection."""
    x, g = to_tensor(input), to_tensor(grid)
    corners = bool(align_corners)
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ArgumentError(
            f"nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or "
            f"'bicubic', but got: '{mode}'"
        )
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ArgumentError(
            "nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or "
            f"'reflection', but got: '{padding_mode}'"
        )
    spatial = x.ndim - 2
    if (
        spatial not in (2, 3)
        or g.ndim != x.ndim
        or g.shape[-1] != spatial
        or g.shape[0] != x.shape[0]
    ):
        raise ShapeError(
            f"grid_sample(): expected a 4-D or 5-D input and a grid of the same rank with "
            f"{spatial} coordinates per point and the input's batch, got {describe(x, g)}"
        )
    if mode == "bicubic" and spatial != 2:
        raise ArgumentError("grid_sample(): bicubic interpolation only supports 4D input")
    g = cast(g, x.dtype)
    n, channels = x.shape[0], x.shape[1]
    sizes = tuple(x.shape[2:])  # (H, W) or (D, H, W)
    out_shape = tuple(g.shape[1:-1])
    flat = x.reshape(n, channels, -1)
    gp = g.reshape(n, -1, spatial)
    # grid's last dim lists x (W), y (H)[, z (D)]: coords[i] goes with sizes[i]
    coords = [gp[..., spatial - 1 - i] for i in builtins.range(spatial)]
    zeros_mode = padding_mode == "zeros"
    if mode == "bicubic":
        raw = [_unnormalise(c, s, corners) for c, s in zip(coords, sizes)]
        base = [floor(c).detach() for c in raw]
        weights = [_cubic_weights(c - b) for c, b in zip(raw, base)]
        out = None
        for i in builtins.range(4):
            for j in builtins.range(4):
                tap = [base[0] + (i - 1), base[1] + (j - 1)]
                tap = [_padded(t, s, padding_mode, corners) for t, s in zip(tap, sizes)]
                value = _taps(flat, sizes, tap, zeros_mode)
                term = value * (weights[0][i] * weights[1][j]).unsqueeze(1)
                out = term if out is None else out + term
        return out.reshape(n, channels, *out_shape)
    src = [
        _padded(_unnormalise(c, s, corners), s, padding_mode, corners)
        for c, s in zip(coords, sizes)
    ]
    if mode == "nearest":
        nearest = [c.round() for c in src]
        out = _taps(flat, sizes, nearest, zeros_mode).reshape(n, channels, *out_shape)
        if g.requires_grad:
            # PyTorch's gradient for the grid is zeros here, not "unused": route the grid
            # through a where that never selects it
            never = zeros(tuple(out.shape), dtype=_dt.bool_, device=out.device)
            out = where(never, g[..., 0].unsqueeze(1), out)
        return out
    low = [floor(c).detach() for c in src]
    frac = [c - f for c, f in zip(src, low)]
    out = None
    for corner in np.ndindex(*(2,) * spatial):
        tap = [f + k for f, k in zip(low, corner)]
        weight = None
        for k, t in zip(corner, frac):
            part = t if k else 1 - t
            weight = part if weight is None else weight * part
        term = _taps(flat, sizes, tap, zeros_mode) * weight.unsqueeze(1)
        out = term if out is None else out + term
    return out.reshape(n, channels, *out_shape)
