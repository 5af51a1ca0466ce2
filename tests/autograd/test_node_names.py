"""Node names as PyTorch's: ``y.grad_fn.name()`` (and ``grad_fn=<...>`` in a tensor's repr)
for the common ops, primitives and composites alike, against a table of PyTorch's names, and
against torch itself when it is importable.  Where fusegrad's graph differs, the case is in
``DIFFERENT`` with the reason, and docs/node_names.md has it in its table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fusegrad

REPO_ROOT = Path(__file__).resolve().parents[2]


def _x(lib: Any, *shape: int, seed: int = 0) -> Any:
    data = np.random.default_rng(seed).standard_normal(shape)
    return lib.tensor(data, requires_grad=True)


def _i(lib: Any, values: Any) -> Any:
    return lib.tensor(np.asarray(values, dtype=np.int64))


# (case, PyTorch's node name, the call in either library: fn(lib, F) -> tensor)
CASES: list[tuple[str, str, Callable[[Any, Any], Any]]] = [
    # arithmetic and math (primitives)
    ("add", "AddBackward0", lambda L, F: _x(L, 3, 4) + _x(L, 3, 4, seed=1)),
    ("sub", "SubBackward0", lambda L, F: _x(L, 3, 4) - 1.5),
    ("rsub", "RsubBackward1", lambda L, F: 1.5 - _x(L, 3, 4)),
    ("mul", "MulBackward0", lambda L, F: _x(L, 3, 4) * 2.0),
    ("div", "DivBackward0", lambda L, F: _x(L, 3, 4) / _x(L, 4, seed=1)),
    ("neg", "NegBackward0", lambda L, F: -_x(L, 3)),
    ("pow_scalar", "PowBackward0", lambda L, F: _x(L, 3) ** 2),
    ("pow_tensor", "PowBackward1", lambda L, F: _x(L, 3).abs() ** _x(L, 3, seed=1)),
    ("pow_base_scalar", "PowBackward2", lambda L, F: 2.0 ** _x(L, 3)),
    ("square", "PowBackward0", lambda L, F: _x(L, 3).square()),
    ("exp", "ExpBackward0", lambda L, F: _x(L, 3).exp()),
    ("log", "LogBackward0", lambda L, F: _x(L, 3).abs().log()),
    ("log1p", "Log1PBackward0", lambda L, F: _x(L, 3).abs().log1p()),
    ("sqrt", "SqrtBackward0", lambda L, F: _x(L, 3).abs().sqrt()),
    ("rsqrt", "RsqrtBackward0", lambda L, F: _x(L, 3).abs().rsqrt()),
    ("abs", "AbsBackward0", lambda L, F: _x(L, 3).abs()),
    ("sin", "SinBackward0", lambda L, F: _x(L, 3).sin()),
    ("tanh", "TanhBackward0", lambda L, F: _x(L, 3).tanh()),
    ("sigmoid", "SigmoidBackward0", lambda L, F: _x(L, 3).sigmoid()),
    ("clamp", "ClampBackward1", lambda L, F: _x(L, 3).clamp(-0.5, 0.5)),
    ("clamp_min", "ClampBackward1", lambda L, F: _x(L, 3).clamp(min=0.0)),
    ("clamp_tensors", "ClampBackward0", lambda L, F: _x(L, 3).clamp(L.zeros(3), L.ones(3))),
    ("where", "WhereBackward0", lambda L, F: L.where(_x(L, 3).detach() > 0, _x(L, 3), 0.0)),
    ("maximum", "MaximumBackward0", lambda L, F: L.maximum(_x(L, 3), _x(L, 3, seed=1))),
    ("to_dtype", "ToCopyBackward0", lambda L, F: _x(L, 3).to(L.float32)),
    ("float", "ToCopyBackward0", lambda L, F: _x(L, 3).float()),
    ("clone", "CloneBackward0", lambda L, F: _x(L, 3).clone()),
    ("contiguous", "CloneBackward0", lambda L, F: _x(L, 3, 4).t().contiguous()),
    # activations
    ("relu", "ReluBackward0", lambda L, F: F.relu(_x(L, 3, 4))),
    ("relu_method", "ReluBackward0", lambda L, F: _x(L, 3, 4).relu()),
    ("leaky_relu", "LeakyReluBackward0", lambda L, F: F.leaky_relu(_x(L, 3, 4), 0.1)),
    ("elu", "EluBackward0", lambda L, F: F.elu(_x(L, 3, 4))),
    ("selu", "EluBackward0", lambda L, F: F.selu(_x(L, 3, 4))),
    ("celu", "CeluBackward0", lambda L, F: F.celu(_x(L, 3, 4))),
    ("gelu", "GeluBackward0", lambda L, F: F.gelu(_x(L, 3, 4))),
    ("gelu_tanh", "GeluBackward0", lambda L, F: F.gelu(_x(L, 3, 4), approximate="tanh")),
    ("silu", "SiluBackward0", lambda L, F: F.silu(_x(L, 3, 4))),
    ("mish", "MishBackward0", lambda L, F: F.mish(_x(L, 3, 4))),
    ("softplus", "SoftplusBackward0", lambda L, F: F.softplus(_x(L, 3, 4))),
    ("hardtanh", "HardtanhBackward0", lambda L, F: F.hardtanh(_x(L, 3, 4))),
    ("relu6", "HardtanhBackward0", lambda L, F: F.relu6(_x(L, 3, 4))),
    ("hardswish", "HardswishBackward0", lambda L, F: F.hardswish(_x(L, 3, 4))),
    ("logsigmoid", "LogSigmoidBackward0", lambda L, F: F.logsigmoid(_x(L, 3, 4))),
    ("glu", "GluBackward0", lambda L, F: F.glu(_x(L, 3, 4))),
    ("softmax", "SoftmaxBackward0", lambda L, F: F.softmax(_x(L, 3, 4), dim=1)),
    ("softmax_method", "SoftmaxBackward0", lambda L, F: _x(L, 3, 4).softmax(-1)),
    ("softmin", "SoftmaxBackward0", lambda L, F: F.softmin(_x(L, 3, 4), dim=1)),
    ("log_softmax", "LogSoftmaxBackward0", lambda L, F: F.log_softmax(_x(L, 3, 4), dim=1)),
    ("dropout", "MulBackward0", lambda L, F: F.dropout(_x(L, 3, 4), 0.5, True)),
    # reductions
    ("sum", "SumBackward0", lambda L, F: _x(L, 3, 4).sum()),
    ("sum_dim", "SumBackward1", lambda L, F: _x(L, 3, 4).sum(1)),
    ("sum_dims_keepdim", "SumBackward1", lambda L, F: _x(L, 3, 4).sum((0, 1), keepdim=True)),
    ("mean", "MeanBackward0", lambda L, F: _x(L, 3, 4).mean()),
    ("mean_dim", "MeanBackward1", lambda L, F: _x(L, 3, 4).mean(-1, keepdim=True)),
    ("prod", "ProdBackward0", lambda L, F: _x(L, 3, 4).prod()),
    ("prod_dim", "ProdBackward1", lambda L, F: _x(L, 3, 4).prod(1)),
    ("max", "MaxBackward1", lambda L, F: _x(L, 3, 4).max()),
    ("max_dim", "MaxBackward0", lambda L, F: _x(L, 3, 4).max(1)[0]),
    ("min", "MinBackward1", lambda L, F: _x(L, 3, 4).min()),
    ("min_dim", "MinBackward0", lambda L, F: _x(L, 3, 4).min(dim=0).values),
    ("amax", "AmaxBackward0", lambda L, F: _x(L, 3, 4).amax(1)),
    ("var", "VarBackward0", lambda L, F: _x(L, 3, 4).var(1)),
    ("std", "StdBackward0", lambda L, F: _x(L, 3, 4).std()),
    ("norm", "LinalgVectorNormBackward0", lambda L, F: _x(L, 3, 4).norm()),
    ("norm_dim", "LinalgVectorNormBackward0", lambda L, F: _x(L, 3, 4).norm(dim=1)),
    ("logsumexp", "LogsumexpBackward0", lambda L, F: _x(L, 3, 4).logsumexp(1)),
    ("cumsum", "CumsumBackward0", lambda L, F: _x(L, 3, 4).cumsum(1)),
    ("cumprod", "CumprodBackward0", lambda L, F: _x(L, 3, 4).cumprod(1)),
    ("topk", "TopkBackward0", lambda L, F: _x(L, 3, 4).topk(2)[0]),
    ("sort", "SortBackward0", lambda L, F: _x(L, 3, 4).sort(1).values),
    ("median", "MedianBackward0", lambda L, F: _x(L, 3, 4).median()),
    ("median_dim", "MedianBackward1", lambda L, F: _x(L, 3, 4).median(1)[0]),
    # indexing
    ("select", "SelectBackward0", lambda L, F: _x(L, 3, 4)[0]),
    ("select_column", "SelectBackward0", lambda L, F: _x(L, 3, 4)[:, 1]),
    ("slice", "SliceBackward0", lambda L, F: _x(L, 3, 4)[1:3]),
    ("slice_full", "SliceBackward0", lambda L, F: _x(L, 3, 4)[:]),
    ("slice_then_full", "SliceBackward0", lambda L, F: _x(L, 3, 4)[1:, :]),
    ("select_slice", "SliceBackward0", lambda L, F: _x(L, 3, 4)[0, 1:3]),
    ("index_none", "UnsqueezeBackward0", lambda L, F: _x(L, 3, 4)[:, None]),
    ("ellipsis", "AliasBackward0", lambda L, F: _x(L, 3, 4)[...]),
    ("index_tensor", "IndexBackward0", lambda L, F: _x(L, 3, 4)[_i(L, [0, 2])]),
    ("index_list", "IndexBackward0", lambda L, F: _x(L, 3, 4)[[0, 2]]),
    ("index_mask", "IndexBackward0", lambda L, F: _x(L, 3, 4)[_x(L, 3, 4).detach() > 0]),
    ("narrow", "SliceBackward0", lambda L, F: _x(L, 3, 4).narrow(1, 0, 2)),
    ("select_fn", "SelectBackward0", lambda L, F: _x(L, 3, 4).select(1, 2)),
    ("gather", "GatherBackward0", lambda L, F: _x(L, 3, 4).gather(1, _i(L, [[0], [1], [2]]))),
    ("index_select", "IndexSelectBackward0", lambda L, F: _x(L, 3, 4).index_select(0, _i(L, [2]))),
    (
        "masked_fill",
        "MaskedFillBackward0",
        lambda L, F: _x(L, 3, 4).masked_fill(_x(L, 3, 4, seed=1).detach() > 0, 0.0),
    ),
    ("embedding", "EmbeddingBackward0", lambda L, F: F.embedding(_i(L, [0, 2]), _x(L, 3, 4))),
    # shapes
    ("view", "ViewBackward0", lambda L, F: _x(L, 3, 4).view(12)),
    ("view_as", "ViewBackward0", lambda L, F: _x(L, 3, 4).view_as(_x(L, 4, 3))),
    ("reshape", "ViewBackward0", lambda L, F: _x(L, 3, 4).reshape(2, 6)),
    ("reshape_copy", "UnsafeViewBackward0", lambda L, F: _x(L, 3, 4).t().reshape(12)),
    ("flatten", "ViewBackward0", lambda L, F: _x(L, 2, 3, 4).flatten(1)),
    ("unflatten", "ViewBackward0", lambda L, F: _x(L, 3, 4).unflatten(1, (2, 2))),
    ("t", "TBackward0", lambda L, F: _x(L, 3, 4).t()),
    ("T", "PermuteBackward0", lambda L, F: _x(L, 3, 4).T),
    ("mT", "TransposeBackward0", lambda L, F: _x(L, 2, 3, 4).mT),
    ("transpose", "TransposeBackward0", lambda L, F: _x(L, 2, 3, 4).transpose(1, 2)),
    ("permute", "PermuteBackward0", lambda L, F: _x(L, 2, 3, 4).permute(2, 0, 1)),
    ("movedim", "PermuteBackward0", lambda L, F: _x(L, 2, 3, 4).movedim(0, 2)),
    ("unsqueeze", "UnsqueezeBackward0", lambda L, F: _x(L, 3, 4).unsqueeze(0)),
    ("squeeze", "SqueezeBackward0", lambda L, F: _x(L, 3, 1).squeeze()),
    ("squeeze_dim", "SqueezeBackward1", lambda L, F: _x(L, 3, 1).squeeze(1)),
    ("squeeze_dims", "SqueezeBackward2", lambda L, F: _x(L, 1, 3, 1).squeeze((0, 2))),
    ("expand", "ExpandBackward0", lambda L, F: _x(L, 3, 1).expand(3, 4)),
    ("expand_as", "ExpandBackward0", lambda L, F: _x(L, 3, 1).expand_as(_x(L, 3, 4))),
    ("broadcast_to", "ExpandBackward0", lambda L, F: L.broadcast_to(_x(L, 3, 1), (3, 4))),
    ("repeat", "RepeatBackward0", lambda L, F: _x(L, 3, 4).repeat(2, 1)),
    ("cat", "CatBackward0", lambda L, F: L.cat([_x(L, 3, 4), _x(L, 3, 4, seed=1)])),
    ("stack", "StackBackward0", lambda L, F: L.stack([_x(L, 3, 4), _x(L, 3, 4, seed=1)])),
    ("split", "SplitBackward0", lambda L, F: _x(L, 4, 4).split(2)[1]),
    ("split_sizes", "SplitWithSizesBackward0", lambda L, F: _x(L, 4, 4).split([1, 3])[0]),
    ("chunk", "SplitBackward0", lambda L, F: _x(L, 4, 4).chunk(2)[0]),
    ("unbind", "UnbindBackward0", lambda L, F: _x(L, 4, 4).unbind(1)[2]),
    ("flip", "FlipBackward0", lambda L, F: _x(L, 3, 4).flip(0)),
    ("roll", "RollBackward0", lambda L, F: _x(L, 3, 4).roll(1, 1)),
    ("tril", "TrilBackward0", lambda L, F: _x(L, 3, 4).tril()),
    ("triu", "TriuBackward0", lambda L, F: _x(L, 3, 4).triu(1)),
    ("diagonal", "DiagonalBackward0", lambda L, F: _x(L, 3, 4).diagonal()),
    ("pad", "ConstantPadNdBackward0", lambda L, F: F.pad(_x(L, 3, 4), (1, 1))),
    # linear algebra
    ("mm", "MmBackward0", lambda L, F: _x(L, 3, 4).mm(_x(L, 4, 2, seed=1))),
    ("matmul_2d", "MmBackward0", lambda L, F: _x(L, 3, 4) @ _x(L, 4, 2, seed=1)),
    ("matmul_batched", "UnsafeViewBackward0", lambda L, F: _x(L, 2, 3, 4) @ _x(L, 4, 2, seed=1)),
    ("matmul_3d_3d", "UnsafeViewBackward0", lambda L, F: _x(L, 2, 3, 4) @ _x(L, 2, 4, 2, seed=1)),
    ("bmm", "BmmBackward0", lambda L, F: _x(L, 2, 3, 4).bmm(_x(L, 2, 4, 2, seed=1))),
    ("dot", "DotBackward0", lambda L, F: _x(L, 4) @ _x(L, 4, seed=1)),
    ("mv", "MvBackward0", lambda L, F: _x(L, 3, 4) @ _x(L, 4, seed=1)),
    ("vector_matrix", "SqueezeBackward4", lambda L, F: _x(L, 4) @ _x(L, 4, 2, seed=1)),
    ("linear", "AddmmBackward0", lambda L, F: F.linear(_x(L, 5, 4), _x(L, 3, 4), _x(L, 3))),
    ("linear_no_bias", "MmBackward0", lambda L, F: F.linear(_x(L, 5, 4), _x(L, 3, 4))),
    (
        "linear_batched",
        "ViewBackward0",
        lambda L, F: F.linear(_x(L, 2, 5, 4), _x(L, 3, 4), _x(L, 3)),
    ),
    ("addmm", "AddmmBackward0", lambda L, F: L.addmm(_x(L, 3, 2), _x(L, 3, 4), _x(L, 4, 2))),
    # losses, normalisation, convolution
    (
        "cross_entropy",
        "NllLossBackward0",
        lambda L, F: F.cross_entropy(_x(L, 3, 4), _i(L, [0, 1, 3])),
    ),
    (
        "cross_entropy_sum",
        "NllLossBackward0",
        lambda L, F: F.cross_entropy(_x(L, 3, 4), _i(L, [0, 1, 3]), reduction="sum"),
    ),
    (
        "cross_entropy_2d",
        "NllLoss2DBackward0",
        lambda L, F: F.cross_entropy(_x(L, 2, 4, 3, 3), _i(L, np.zeros((2, 3, 3)))),
    ),
    ("nll_loss", "NllLossBackward0", lambda L, F: F.nll_loss(_x(L, 3, 4), _i(L, [0, 1, 3]))),
    ("mse_loss", "MseLossBackward0", lambda L, F: F.mse_loss(_x(L, 3, 4), _x(L, 3, 4, seed=1))),
    (
        "mse_loss_none",
        "MseLossBackward0",
        lambda L, F: F.mse_loss(_x(L, 3, 4), _x(L, 3, 4, seed=1), reduction="none"),
    ),
    ("l1_loss", "MeanBackward0", lambda L, F: F.l1_loss(_x(L, 3, 4), _x(L, 3, 4, seed=1))),
    (
        "smooth_l1_loss",
        "SmoothL1LossBackward0",
        lambda L, F: F.smooth_l1_loss(_x(L, 3, 4), _x(L, 3, 4, seed=1)),
    ),
    (
        "huber_loss",
        "HuberLossBackward0",
        lambda L, F: F.huber_loss(_x(L, 3, 4), _x(L, 3, 4, seed=1)),
    ),
    (
        "binary_cross_entropy",
        "BinaryCrossEntropyBackward0",
        lambda L, F: F.binary_cross_entropy(
            _x(L, 3, 4).sigmoid(), _x(L, 3, 4, seed=1).detach().sigmoid()
        ),
    ),
    (
        "bce_with_logits",
        "BinaryCrossEntropyWithLogitsBackward0",
        lambda L, F: F.binary_cross_entropy_with_logits(_x(L, 3, 4), _x(L, 3, 4, seed=1).detach()),
    ),
    (
        "layer_norm",
        "NativeLayerNormBackward0",
        lambda L, F: F.layer_norm(_x(L, 3, 4), (4,), _x(L, 4, seed=1), _x(L, 4, seed=2)),
    ),
    (
        "batch_norm",
        "NativeBatchNormBackward0",
        lambda L, F: F.batch_norm(_x(L, 3, 4), None, None, training=True),
    ),
    ("group_norm", "NativeGroupNormBackward0", lambda L, F: F.group_norm(_x(L, 2, 4, 3), 2)),
    (
        "conv2d",
        "ConvolutionBackward0",
        lambda L, F: F.conv2d(_x(L, 1, 2, 5, 5), _x(L, 3, 2, 3, 3, seed=1), _x(L, 3, seed=2)),
    ),
    (
        "conv1d",
        "ConvolutionBackward0",
        lambda L, F: F.conv1d(_x(L, 1, 2, 5), _x(L, 3, 2, 3, seed=1)),
    ),
    (
        "max_pool2d",
        "MaxPool2DWithIndicesBackward0",
        lambda L, F: F.max_pool2d(_x(L, 1, 2, 4, 4), 2),
    ),
    ("avg_pool2d", "AvgPool2DBackward0", lambda L, F: F.avg_pool2d(_x(L, 1, 2, 4, 4), 2)),
    (
        "adaptive_avg_pool2d",
        "AdaptiveAvgPool2DBackward0",
        lambda L, F: F.adaptive_avg_pool2d(_x(L, 1, 2, 4, 4), 2),
    ),
    (
        "adaptive_avg_pool2d_1",
        "MeanBackward1",
        lambda L, F: F.adaptive_avg_pool2d(_x(L, 1, 2, 4, 4), 1),
    ),
    (
        "interpolate_nearest",
        "UpsampleNearest2DBackward0",
        lambda L, F: F.interpolate(_x(L, 1, 2, 3, 3), scale_factor=2),
    ),
    (
        "interpolate_bilinear",
        "UpsampleBilinear2DBackward0",
        lambda L, F: F.interpolate(
            _x(L, 1, 2, 3, 3), size=(5, 4), mode="bilinear", align_corners=False
        ),
    ),
    ("instance_norm", "ViewBackward0", lambda L, F: F.instance_norm(_x(L, 2, 3, 4))),
    (
        "adaptive_avg_pool1d",
        "SqueezeBackward1",
        lambda L, F: F.adaptive_avg_pool1d(_x(L, 1, 2, 4), 2),
    ),
    ("unfold", "Im2ColBackward0", lambda L, F: F.unfold(_x(L, 1, 2, 4, 4), 2)),
    (
        "pad_reflect",
        "ReflectionPad1DBackward0",
        lambda L, F: F.pad(_x(L, 1, 3, 4), (1, 1), mode="reflect"),
    ),
    (
        "pad_replicate",
        "ReplicationPad2DBackward0",
        lambda L, F: F.pad(_x(L, 1, 3, 4), (1, 1, 1, 1), mode="replicate"),
    ),
    (
        "pad_value_positional",
        "ConstantPadNdBackward0",
        lambda L, F: F.pad(_x(L, 3, 4), (1, 1), "constant", 2.0),
    ),
    ("normalize", "DivBackward0", lambda L, F: F.normalize(_x(L, 3, 4))),
    # more tensor ops
    ("lerp", "LerpBackward0", lambda L, F: L.lerp(_x(L, 3), _x(L, 3, seed=1), 0.3)),
    (
        "lerp_tensor",
        "LerpBackward1",
        lambda L, F: L.lerp(_x(L, 3), _x(L, 3, seed=1), L.ones(3, dtype=L.float64)),
    ),
    ("addcmul", "AddcmulBackward0", lambda L, F: L.addcmul(_x(L, 3), _x(L, 3, seed=1), _x(L, 3))),
    ("addcdiv", "AddcdivBackward0", lambda L, F: L.addcdiv(_x(L, 3), _x(L, 3), L.ones(3))),
    ("exp2", "Exp2Backward0", lambda L, F: _x(L, 3).exp2()),
    ("tan", "TanBackward0", lambda L, F: _x(L, 3).tan()),
    ("nan_to_num", "NanToNumBackward0", lambda L, F: _x(L, 3).nan_to_num()),
    ("cdist", "CdistBackward0", lambda L, F: L.cdist(_x(L, 3, 4), _x(L, 2, 4, seed=1))),
    ("einsum", "ViewBackward0", lambda L, F: L.einsum("ij,jk->ik", _x(L, 3, 4), _x(L, 4, 2))),
    ("outer", "MulBackward0", lambda L, F: L.outer(_x(L, 3), _x(L, 2, seed=1))),
    (
        "scatter_src",
        "ScatterBackward0",
        lambda L, F: _x(L, 3, 4).scatter(1, _i(L, [[0], [1], [2]]), _x(L, 3, 1)),
    ),
    (
        "scatter_value",
        "ScatterBackward1",
        lambda L, F: _x(L, 3, 4).scatter(1, _i(L, [[0], [1], [2]]), 1.0),
    ),
    (
        "scatter_add",
        "ScatterAddBackward0",
        lambda L, F: _x(L, 3, 4).scatter_add(1, _i(L, [[0], [1], [2]]), _x(L, 3, 1)),
    ),
    (
        "index_add",
        "IndexAddBackward0",
        lambda L, F: _x(L, 3, 4).index_add(0, _i(L, [0]), _x(L, 1, 4)),
    ),
    (
        "masked_select",
        "MaskedSelectBackward0",
        lambda L, F: _x(L, 3).masked_select(_x(L, 3).detach() > 0),
    ),
    ("cummax", "CummaxBackward0", lambda L, F: _x(L, 3, 4).cummax(1)[0]),
    ("logcumsumexp", "LogcumsumexpBackward0", lambda L, F: _x(L, 3, 4).logcumsumexp(1)),
    ("kthvalue", "KthvalueBackward0", lambda L, F: _x(L, 3, 4).kthvalue(2)[0]),
    ("tile", "RepeatBackward0", lambda L, F: _x(L, 3).tile(2)),
    ("hstack", "CatBackward0", lambda L, F: L.hstack([_x(L, 3), _x(L, 3, seed=1)])),
    # where the graphs differ (``DIFFERENT``)
    (
        "sdpa",
        "ScaledDotProductFlashAttentionForCpuBackward0",
        lambda L, F: F.scaled_dot_product_attention(
            _x(L, 1, 2, 3, 4), _x(L, 1, 2, 3, 4, seed=1), _x(L, 1, 2, 3, 4, seed=2)
        ),
    ),
    (
        "cross_entropy_probs",
        "DivBackward1",
        lambda L, F: F.cross_entropy(_x(L, 3, 4), _x(L, 3, 4, seed=1).detach().softmax(1)),
    ),
    ("number_over_tensor", "MulBackward0", lambda L, F: 1 / _x(L, 3)),
    ("repeat_interleave", "ViewBackward0", lambda L, F: _x(L, 3).repeat_interleave(2)),
    ("var_mean", "VarMeanBackward0", lambda L, F: L.var_mean(_x(L, 3, 4))[0]),
    ("diag", "DiagEmbedBackward0", lambda L, F: L.diag(_x(L, 3))),
]

# Cases whose fusegrad name differs from PyTorch's: fusegrad's name and why (the table in
# docs/node_names.md lists the same)
DIFFERENT: dict[str, tuple[str, str]] = {
    "sdpa": (
        "UnsafeViewBackward0",
        "a composite (softmax(q k^T) v) ending in a batched matmul; "
        "PyTorch's node names the fused kernel it picked for the device",
    ),
    "cross_entropy_probs": (
        "DivBackward0",
        "the batch mean is a Python division by a number "
        "(PyTorch's C++ uses div's Scalar overload)",
    ),
    "number_over_tensor": (
        "DivBackward0",
        "number / tensor is one division (PyTorch: a reciprocal times the number)",
    ),
    "repeat_interleave": (
        "IndexSelectBackward0",
        "a gather along the dim (PyTorch: expand and reshape)",
    ),
    "var_mean": ("VarBackward0", "two nodes, one per output (PyTorch: one node for both)"),
    "diag": ("AddBackward0", "a composite of a scatter into zeros (PyTorch: diag_embed)"),
}


def _fusegrad_name(case: str, fn: Callable) -> str:
    import fusegrad.nn.functional as F

    return fn(fusegrad, F).grad_fn.name()


@pytest.mark.parametrize("case,name,fn", CASES, ids=[c[0] for c in CASES])
def test_node_name_is_pytorchs(case: str, name: str, fn: Callable) -> None:
    got = _fusegrad_name(case, fn)
    want = DIFFERENT[case][0] if case in DIFFERENT else name
    assert got == want, f"{case}: {got} (PyTorch: {name})"


@pytest.mark.parametrize("case,name,fn", CASES, ids=[c[0] for c in CASES])
def test_the_table_holds_torchs_names(case: str, name: str, fn: Callable) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    node = fn(torch, F).grad_fn
    assert node.name() == type(node).__name__ == name, case


def test_the_differences_are_documented() -> None:
    text = (REPO_ROOT / "docs" / "node_names.md").read_text()
    names = dict((case, name) for case, name, _ in CASES)
    for case, (ours, _) in DIFFERENT.items():
        assert f"| {names[case]} | {ours} |" in text, case


def test_grad_fn_type_is_the_node_class_and_repr_shows_pytorchs_name() -> None:
    """Every primitive's node is an ``OpNode`` (PyTorch has a class per node name); the name
    is in ``name()``, the repr and the tensor's repr."""
    y = fusegrad.tensor([1.0, -2.0], requires_grad=True).relu()
    assert type(y.grad_fn).__name__ == "OpNode"
    assert y.grad_fn.name() == "ReluBackward0" and repr(y.grad_fn).startswith("<ReluBackward0")
    assert "grad_fn=<ReluBackward0>" in repr(y)


def test_a_composite_names_only_its_own_output_node() -> None:
    x = fusegrad.tensor([1.0, -2.0, 3.0], requires_grad=True)
    y = x * 2
    assert y.grad_fn.name() == "MulBackward0"
    assert fusegrad.broadcast_to(y, (3,)).grad_fn is not y.grad_fn  # a new (alias) node
    assert y.grad_fn.name() == "MulBackward0"  # the input's node keeps its name
    assert y.contiguous() is y and y.grad_fn.name() == "MulBackward0"
    z = x.clamp(min=0)
    # the node before a composite's last one keeps its primitive's name
    (inner,) = [node for node, _ in z.grad_fn.next_functions if node is not None]
    assert z.grad_fn.name() == "ClampBackward1" and inner.name() == "WhereBackward0"
    with fusegrad.no_grad():
        assert x.relu().grad_fn is None


def test_names_survive_a_whole_step_compile_and_compiled_backward() -> None:
    import fusegrad.nn.functional as F

    w = fusegrad.tensor(np.ones((3, 2)), requires_grad=True)

    @fusegrad.compile
    def step(x: Any) -> Any:
        out = F.relu(x @ w).sum(1).mean()
        out.backward()
        return out.detach()

    for _ in range(3):
        w.grad = None
        step(fusegrad.tensor(np.ones((4, 3))))
    y = F.relu(fusegrad.tensor(np.ones((4, 3))) @ w)
    assert y.grad_fn.name() == "ReluBackward0"
    # (relu is where(x > 0, x, 0): its node's edges are where's, the first one the condition's)
    assert [n and n.name() for n, _ in y.grad_fn.next_functions] == [None, "MmBackward0", None]
