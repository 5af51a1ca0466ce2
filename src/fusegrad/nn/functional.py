"""``fusegrad.nn.functional`` (``import fusegrad.nn.functional as F``): the functional API.

Losses, dropout, normalisation, convolution and pooling live in ``fusegrad.ops.functional`` (they
are composites of primitives); this module re-exports them and adds PyTorch's signatures for
the activations (``inplace=``, ``dim=None`` for softmax), so that code written for
``torch.nn.functional`` runs unchanged.  Nothing here is a new primitive.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..autograd.node_names import name_node as _name_node
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..ops import elementwise as _ew
from ..ops import functional as _fn
from ..ops import inplace as _inplace
from ..ops import reduction as _red
from ..ops.functional import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    adaptive_max_pool1d,
    adaptive_max_pool1d_with_indices,
    adaptive_max_pool2d,
    adaptive_max_pool2d_with_indices,
    adaptive_max_pool3d,
    adaptive_max_pool3d_with_indices,
    alpha_dropout,
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    batch_norm,
    bilinear,
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    channel_shuffle,
    conv1d,
    conv2d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    cosine_embedding_loss,
    cosine_similarity,
    cross_entropy,
    dropout,
    dropout1d,
    dropout2d,
    dropout3d,
    embedding,
    feature_alpha_dropout,
    fold,
    fractional_max_pool2d,
    fractional_max_pool2d_with_indices,
    fractional_max_pool3d,
    fractional_max_pool3d_with_indices,
    gaussian_nll_loss,
    group_norm,
    gumbel_softmax,
    hardshrink,
    hinge_embedding_loss,
    huber_loss,
    instance_norm,
    interpolate,
    kl_div,
    l1_loss,
    layer_norm,
    linear,
    local_response_norm,
    lp_pool1d,
    lp_pool2d,
    lp_pool3d,
    margin_ranking_loss,
    max_pool1d,
    max_pool1d_with_indices,
    max_pool2d,
    max_pool2d_with_indices,
    max_pool3d,
    max_pool3d_with_indices,
    max_unpool1d,
    max_unpool2d,
    max_unpool3d,
    mse_loss,
    multilabel_soft_margin_loss,
    nll_loss,
    normalize,
    one_hot,
    pad,
    pairwise_distance,
    pdist,
    pixel_shuffle,
    pixel_unshuffle,
    poisson_nll_loss,
    prelu,
    rms_norm,
    scaled_dot_product_attention,
    smooth_l1_loss,
    soft_margin_loss,
    softshrink,
    softsign,
    tanhshrink,
    triplet_margin_loss,
    unfold,
)
from ..ops.nn_more import (
    affine_grid,
    ctc_loss,
    embedding_bag,
    grid_sample,
    linear_cross_entropy,
    multi_margin_loss,
    multilabel_margin_loss,
    triplet_margin_with_distance_loss,
)
from ..ops.shape import flatten
from ..tensor import Tensor
from ._multi_head import multi_head_attention_forward

__all__ = [
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool1d_with_indices",
    "adaptive_max_pool2d",
    "adaptive_max_pool2d_with_indices",
    "adaptive_max_pool3d",
    "adaptive_max_pool3d_with_indices",
    "affine_grid",
    "alpha_dropout",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "batch_norm",
    "bilinear",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "celu",
    "celu_",
    "channel_shuffle",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "cosine_embedding_loss",
    "cosine_similarity",
    "cross_entropy",
    "ctc_loss",
    "dropout",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "elu",
    "elu_",
    "embedding",
    "embedding_bag",
    "feature_alpha_dropout",
    "flatten",
    "fold",
    "fractional_max_pool2d",
    "fractional_max_pool2d_with_indices",
    "fractional_max_pool3d",
    "fractional_max_pool3d_with_indices",
    "gaussian_nll_loss",
    "gelu",
    "glu",
    "grid_sample",
    "group_norm",
    "gumbel_softmax",
    "hardshrink",
    "hardsigmoid",
    "hardswish",
    "hardtanh",
    "hardtanh_",
    "hinge_embedding_loss",
    "huber_loss",
    "instance_norm",
    "interpolate",
    "kl_div",
    "l1_loss",
    "layer_norm",
    "leaky_relu",
    "leaky_relu_",
    "linear",
    "linear_cross_entropy",
    "local_response_norm",
    "log_softmax",
    "logsigmoid",
    "lp_pool1d",
    "lp_pool2d",
    "lp_pool3d",
    "margin_ranking_loss",
    "max_pool1d",
    "max_pool1d_with_indices",
    "max_pool2d",
    "max_pool2d_with_indices",
    "max_pool3d",
    "max_pool3d_with_indices",
    "max_unpool1d",
    "max_unpool2d",
    "max_unpool3d",
    "mish",
    "mse_loss",
    "multi_head_attention_forward",
    "multi_margin_loss",
    "multilabel_margin_loss",
    "multilabel_soft_margin_loss",
    "native_channel_shuffle",
    "nll_loss",
    "normalize",
    "one_hot",
    "pad",
    "pairwise_distance",
    "pdist",
    "pixel_shuffle",
    "pixel_unshuffle",
    "poisson_nll_loss",
    "prelu",
    "relu",
    "relu6",
    "relu_",
    "rms_norm",
    "rrelu",
    "rrelu_",
    "scaled_dot_product_attention",
    "selu",
    "selu_",
    "sigmoid",
    "silu",
    "smooth_l1_loss",
    "soft_margin_loss",
    "softmax",
    "softmin",
    "softplus",
    "softshrink",
    "softsign",
    "tanh",
    "tanhshrink",
    "threshold",
    "threshold_",
    "triplet_margin_loss",
    "triplet_margin_with_distance_loss",
    "unfold",
    "upsample",
    "upsample_bilinear",
    "upsample_nearest",
]


# PyTorch's in-place activations whose node has a name of its own (relu_ is ReluBackward0)
_INPLACE_NODE_NAMES = {
    "elu_": "EluBackward1",
    "leaky_relu_": "LeakyReluBackward1",
    "selu_": "EluBackward1",
    "celu_": "CeluBackward1",
    "threshold_": "ThresholdBackward1",
}


def _maybe_inplace(name: str, fn: Any, input: Tensor, inplace: bool, *args: Any) -> Tensor:
    if inplace:
        # same path as Tensor.relu_(): writes into input's storage and rebases its history
        out = _inplace(input, name, fn, *args)
        own = _INPLACE_NODE_NAMES.get(name)
        return out if own is None or out.grad_fn is None else _name_node(out, own)
    return fn(input, *args)


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    return _maybe_inplace("relu_", _ew.relu, input, inplace)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    return hardtanh(input, 0.0, 6.0, inplace)


@_torch_node_name("HardtanhBackward0")
def hardtanh(
    input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False
) -> Tensor:
    return _maybe_inplace("hardtanh_", _ew.clamp, input, inplace, min_val, max_val)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    return _maybe_inplace("leaky_relu_", _ew.leaky_relu, input, inplace, negative_slope)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    return _maybe_inplace("elu_", _ew.elu, input, inplace, alpha)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    return _ew.gelu(input, approximate)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    return _maybe_inplace("silu_", _ew.silu, input, inplace)


@_torch_node_name("MishBackward0")
def mish(input: Tensor, inplace: bool = False) -> Tensor:
    def _mish(x: Tensor) -> Tensor:
        return _ew.mul(x, _ew.tanh(_ew.softplus(x)))

    return _maybe_inplace("mish_", _mish, input, inplace)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    return _maybe_inplace("hardswish_", _fn.hardswish, input, inplace)


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    return _maybe_inplace("selu_", _fn.selu, input, inplace)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    return _maybe_inplace("celu_", _fn.celu, input, inplace, alpha)


def glu(input: Tensor, dim: int = -1) -> Tensor:
    return _fn.glu(input, dim)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    return _ew.softplus(input, beta, threshold)


def sigmoid(input: Tensor) -> Tensor:
    return _ew.sigmoid(input)


def tanh(input: Tensor) -> Tensor:
    return _ew.tanh(input)


@_torch_node_name("LogSigmoidBackward0")
def logsigmoid(input: Tensor) -> Tensor:
    # log(sigmoid(x)) = -softplus(-x), stable for large |x|
    return _ew.neg(_ew.softplus(_ew.neg(input)))


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """``x`` where ``x > threshold``, else ``value``."""
    return _maybe_inplace("threshold_", _fn.threshold, input, inplace, threshold, value)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """``relu6(x + 3) / 6``."""
    return _maybe_inplace("hardsigmoid_", _fn.hardsigmoid, input, inplace)


# in-place functional forms, as torch.nn.functional has them
def relu_(input: Tensor) -> Tensor:
    return relu(input, inplace=True)


def elu_(input: Tensor, alpha: float = 1.0) -> Tensor:
    return elu(input, alpha, inplace=True)


def leaky_relu_(input: Tensor, negative_slope: float = 0.01) -> Tensor:
    return leaky_relu(input, negative_slope, inplace=True)


def hardtanh_(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    return hardtanh(input, min_val, max_val, inplace=True)


def selu_(input: Tensor) -> Tensor:
    return selu(input, inplace=True)


def celu_(input: Tensor, alpha: float = 1.0) -> Tensor:
    return celu(input, alpha, inplace=True)


def threshold_(input: Tensor, threshold_: float, value: float) -> Tensor:
    return threshold(input, threshold_, value, inplace=True)


def _get_softmax_dim(name: str, ndim: int) -> int:
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. Change the call to include "
        "dim=X as an argument.",
        stacklevel=3,
    )
    # PyTorch's legacy rule: dim 0 for 0-, 1- and 3-D inputs, else dim 1
    return 0 if ndim in (0, 1, 3) else 1


def softmax(
    input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None
) -> Tensor:
    if dim is None:
        dim = _get_softmax_dim("softmax", input.dim())
    return _red.softmax(input, dim, dtype=dtype)


def softmin(
    input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None
) -> Tensor:
    if dim is None:
        dim = _get_softmax_dim("softmin", input.dim())
    return _red.softmax(_ew.neg(input), dim, dtype=dtype)


def log_softmax(
    input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None
) -> Tensor:
    if dim is None:
        dim = _get_softmax_dim("log_softmax", input.dim())
    return _red.log_softmax(input, dim, dtype=dtype)


native_channel_shuffle = channel_shuffle


def upsample(
    input: Tensor,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
) -> Tensor:
    """Deprecated alias of ``interpolate`` (PyTorch warns the same way)."""
    warnings.warn(
        "`nn.functional.upsample` is deprecated. Use `nn.functional.interpolate` instead.",
        stacklevel=2,
    )
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input: Tensor, size: Any = None, scale_factor: Any = None) -> Tensor:
    """Deprecated: ``interpolate(..., mode="nearest")``."""
    warnings.warn(
        "`nn.functional.upsample_nearest` is deprecated. Use `nn.functional.interpolate` instead.",
        stacklevel=2,
    )
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input: Tensor, size: Any = None, scale_factor: Any = None) -> Tensor:
    """Deprecated: ``interpolate(..., mode="bilinear", align_corners=True)``."""
    warnings.warn(
        "`nn.functional.upsample_bilinear` is deprecated. Use `nn.functional.interpolate` instead.",
        stacklevel=2,
    )
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


def rrelu(
    input: Tensor,
    lower: float = 1.0 / 8,
    upper: float = 1.0 / 3,
    training: bool = False,
    inplace: bool = False,
) -> Tensor:
    """Randomized leaky ReLU (slopes drawn from U(lower, upper) in training)."""
    return _maybe_inplace("rrelu_", _fn.rrelu, input, inplace, lower, upper, training)


def rrelu_(
    input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False
) -> Tensor:
    return rrelu(input, lower, upper, training, inplace=True)
