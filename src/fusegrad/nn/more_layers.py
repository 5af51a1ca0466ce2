"""More of ``torch.nn``'s modules: ``EmbeddingBag``, the losses ``CTCLoss``,
``MultiMarginLoss``, ``MultiLabelMarginLoss``, ``TripletMarginWithDistanceLoss`` and
``LinearCrossEntropyLoss``, ``AdaptiveLogSoftmaxWithLoss``, ``CrossMapLRN2d``, ``Buffer``,
``DataParallel`` (one device: the wrapped module, as PyTorch's on a single device) and
``SyncBatchNorm`` (batch statistics summed over the MPI process group of
``fusegrad.distributed``).

Each module holds its options and calls the functional form (``fusegrad.nn.functional``), with
PyTorch's arguments, defaults and repr.
"""

from __future__ import annotations

import importlib
import math
from collections import namedtuple
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..autograd.function import Function
from ..autograd.grad_mode import no_grad
from ..errors import ShapeError
from ..ops.creation import empty, zeros
from ..ops.nn_more import LinearCrossEntropyOptions
from ..ops.shape import cat, stack
from ..tensor import Tensor
from . import functional as F
from . import init
from .containers import ModuleList, Sequential
from .layers import Linear, _BatchNorm
from .loss import _Loss, _WeightedLoss
from .module import Module
from .parameter import Buffer, Parameter

__all__ = [
    "AdaptiveLogSoftmaxWithLoss",
    "Buffer",
    "CTCLoss",
    "CrossMapLRN2d",
    "DataParallel",
    "EmbeddingBag",
    "LinearCrossEntropyLoss",
    "LinearCrossEntropyOptions",
    "MultiLabelMarginLoss",
    "MultiMarginLoss",
    "SyncBatchNorm",
    "TripletMarginWithDistanceLoss",
]


class EmbeddingBag(Module):
    """Sums, means or maxima of bags of embeddings (``F.embedding_bag``); the weight is
    initialised N(0, 1), its ``padding_idx`` row to zeros."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        _weight: Tensor | None = None,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError("padding_idx must be within num_embeddings")
            padding_idx = padding_idx % num_embeddings
        self.padding_idx = padding_idx
        if _weight is None:
            self.weight = Parameter(
                empty(num_embeddings, embedding_dim, dtype=dtype, device=device)
            )
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ShapeError("Shape of weight does not match num_embeddings and embedding_dim")
            self.weight = Parameter(_weight)
        self.mode = mode
        self.sparse = sparse
        self.include_last_offset = include_last_offset

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx].fill_(0)

    def forward(
        self, input: Tensor, offsets: Tensor | None = None, per_sample_weights: Tensor | None = None
    ) -> Tensor:
        return F.embedding_bag(
            input,
            self.weight,
            offsets,
            self.max_norm,
            self.norm_type,
            self.scale_grad_by_freq,
            self.mode,
            self.sparse,
            per_sample_weights,
            self.include_last_offset,
            self.padding_idx,
        )

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Tensor,
        freeze: bool = True,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
    ) -> EmbeddingBag:
        if embeddings.dim() != 2:
            raise ShapeError("Embeddings parameter is expected to be 2-dimensional")
        rows, cols = embeddings.shape
        bag = cls(
            rows,
            cols,
            max_norm,
            norm_type,
            scale_grad_by_freq,
            mode,
            sparse,
            embeddings,
            include_last_offset,
            padding_idx,
        )
        bag.weight.requires_grad = not freeze
        return bag

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq:
            s += ", scale_grad_by_freq=True"
        s += f", mode='{self.mode}'"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s


# ---- losses ---------------------------------------------------------------------------------


class CTCLoss(_Loss):
    """``F.ctc_loss``: the Connectionist Temporal Classification loss."""

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False):
        super().__init__(reduction=reduction)
        self.blank = blank
        self.zero_infinity = zero_infinity

    def forward(
        self, log_probs: Tensor, targets: Tensor, input_lengths: Any, target_lengths: Any
    ) -> Tensor:
        return F.ctc_loss(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            self.blank,
            self.reduction,
            self.zero_infinity,
        )


class MultiMarginLoss(_WeightedLoss):
    """``F.multi_margin_loss``: the multi-class hinge loss."""

    def __init__(
        self,
        p: int = 1,
        margin: float = 1.0,
        weight: Tensor | None = None,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        if p not in (1, 2):
            raise ValueError("only p == 1 and p == 2 supported")
        if weight is not None and weight.dim() != 1:
            raise ValueError(
                f"MultiMarginLoss: expected weight to be None or 1D tensor, got {weight.dim()}D "
                "instead"
            )
        self.p = p
        self.margin = margin

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.multi_margin_loss(
            input,
            target,
            p=self.p,
            margin=self.margin,
            weight=self.weight,
            reduction=self.reduction,
        )


class MultiLabelMarginLoss(_Loss):
    """``F.multilabel_margin_loss``: the multi-label hinge loss."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.multilabel_margin_loss(input, target, reduction=self.reduction)


class TripletMarginWithDistanceLoss(_Loss):
    """``F.triplet_margin_with_distance_loss``: the triplet loss for any distance."""

    def __init__(
        self,
        *,
        distance_function: Any = None,
        margin: float = 1.0,
        swap: bool = False,
        reduction: str = "mean",
    ) -> None:
        super().__init__(reduction=reduction)
        if margin <= 0:
            raise ValueError(
                f"TripletMarginWithDistanceLoss: expected margin to be greater than 0, got "
                f"{margin} instead"
            )
        self.distance_function = distance_function
        self.margin = margin
        self.swap = swap

    def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        return F.triplet_margin_with_distance_loss(
            anchor,
            positive,
            negative,
            distance_function=self.distance_function,
            margin=self.margin,
            swap=self.swap,
            reduction=self.reduction,
        )


class LinearCrossEntropyLoss(Module):
    """A linear layer (without bias by default) and ``cross_entropy`` in one:
    ``F.linear_cross_entropy`` over ``self.linear``'s weight, reshaped to (num_classes,
    *out_features, in_features)."""

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        *,
        out_features: tuple[int, ...] = (),
        bias: bool = False,
        device: Any = None,
        dtype: Any = None,
        reduction: str = "mean",
        weight: Tensor | None = None,
        ignore_index: int | None = None,
        label_smoothing: float = 0.0,
        options: Any = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.num_classes = num_classes
        self.out_features = tuple(out_features)
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.options = options
        self.register_buffer("weight", weight)
        total = math.prod(self.out_features, start=num_classes)
        self.linear = Linear(in_features, total, bias=bias, device=device, dtype=dtype)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        shape = (self.num_classes, *self.out_features, self.in_features)
        bias = self.linear.bias
        return F.linear_cross_entropy(
            input,
            self.linear.weight.reshape(shape),
            target,
            linear_bias=None if bias is None else bias.reshape(shape[:-1]),
            weight=self.weight,
            reduction=self.reduction,
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
            options=self.options,
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, num_classes={self.num_classes}, "
            f"out_features={self.out_features}, bias={self.linear.bias is not None}, "
            f"reduction={self.reduction}, ignore_index={self.ignore_index}, "
            f"label_smoothing={self.label_smoothing}, options={self.options}"
        )


_ASMoutput = namedtuple("_ASMoutput", ["output", "loss"])


class AdaptiveLogSoftmaxWithLoss(Module):
    """The adaptive softmax of Grave et al. (2016): the frequent classes (below the first
    cutoff) and one entry per tail cluster in a head softmax; each cluster's classes in a
    smaller softmax through a projection of size ``in_features / div_value ** (i + 1)``.
    ``forward(input, target)`` gives each sample's target log-probability and the mean
    negative log-likelihood; ``log_prob`` all classes' log-probabilities; ``predict`` the most
    likely class."""

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        cutoffs: Sequence[int],
        div_value: float = 4.0,
        head_bias: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        cutoffs = list(cutoffs)
        if len(cutoffs) == 0:
            raise ValueError("cutoffs should be a sequence of length larger than 0")
        if (
            cutoffs != sorted(cutoffs)
            or min(cutoffs) <= 0
            or max(cutoffs) > (n_classes - 1)
            or len(set(cutoffs)) != len(cutoffs)
            or any(int(c) != c for c in cutoffs)
        ):
            raise ValueError(
                "cutoffs should be a sequence of unique, positive integers sorted in an "
                "increasing order, where each value is between 1 and n_classes-1"
            )
        self.in_features = in_features
        self.n_classes = n_classes
        self.cutoffs = cutoffs + [n_classes]
        self.div_value = div_value
        self.head_bias = head_bias
        self.shortlist_size = self.cutoffs[0]
        self.n_clusters = len(self.cutoffs) - 1
        self.head_size = self.shortlist_size + self.n_clusters
        kw = {"device": device, "dtype": dtype}
        self.head = Linear(in_features, self.head_size, bias=head_bias, **kw)
        tails = []
        for i in range(self.n_clusters):
            hidden = int(in_features // (div_value ** (i + 1)))
            size = self.cutoffs[i + 1] - self.cutoffs[i]
            tails.append(
                Sequential(
                    Linear(in_features, hidden, bias=False, **kw),
                    Linear(hidden, size, bias=False, **kw),
                )
            )
        self.tail = ModuleList(tails)

    def reset_parameters(self) -> None:
        self.head.reset_parameters()
        for projection in self.tail:
            for layer in projection:
                layer.reset_parameters()

    def forward(self, input: Tensor, target: Tensor) -> Any:
        unbatched = input.dim() == 1
        x = input.unsqueeze(0) if unbatched else input
        t = target.unsqueeze(0) if unbatched else target
        if x.dim() != 2 or t.dim() != 1 or x.shape[0] != t.shape[0]:
            raise ShapeError(
                "Input and target should have the same size in the batch dimension "
                f"(input {list(input.shape)}, target {list(target.shape)})"
            )
        t_host = t.detach().tolist()
        if any(v < 0 or v >= self.n_classes for v in t_host):
            raise ShapeError(f"Target values should be in [0, {self.n_classes - 1}]")
        head_logp = F.log_softmax(self.head(x), dim=1)
        output = head_logp.gather(1, t.clamp(max=self.shortlist_size - 1).unsqueeze(1)).squeeze(1)
        for i in range(self.n_clusters):
            low, high = self.cutoffs[i], self.cutoffs[i + 1]
            rows = [j for j, v in enumerate(t_host) if low <= v < high]
            if not rows:
                continue
            index = Tensor._make(np.array(rows, dtype=np.int64)).to(x.device)
            cluster_logp = F.log_softmax(self.tail[i](x.index_select(0, index)), dim=1)
            local = (t.index_select(0, index) - low).unsqueeze(1)
            value = head_logp.index_select(0, index)[
                :, self.shortlist_size + i
            ] + cluster_logp.gather(1, local).squeeze(1)
            output = output.index_copy(0, index, value)
        loss = (-output).mean()
        if unbatched:
            output = output.squeeze(0)
        return _ASMoutput(output, loss)

    def _full_log_prob(self, x: Tensor, head_output: Tensor) -> Tensor:
        head_logp = F.log_softmax(head_output, dim=1)
        parts = [head_logp[:, : self.shortlist_size]]
        for i in range(self.n_clusters):
            cluster_logp = F.log_softmax(self.tail[i](x), dim=1)
            parts.append(cluster_logp + head_logp[:, self.shortlist_size + i].unsqueeze(1))
        return cat(parts, 1)

    def log_prob(self, input: Tensor) -> Tensor:
        """(N, n_classes) log-probabilities of every class."""
        unbatched = input.dim() == 1
        x = input.unsqueeze(0) if unbatched else input
        out = self._full_log_prob(x, self.head(x))
        return out.squeeze(0) if unbatched else out

    def predict(self, input: Tensor) -> Tensor:
        """The most likely class of each sample."""
        return self.log_prob(input).argmax(dim=-1)


class CrossMapLRN2d(Module):
    """PyTorch's legacy local response normalisation across the channels of (N, C, H, W)
    inputs: ``x * (k + alpha / size * s) ** -beta`` with ``s`` the sum of squares over a
    window of channels.  The windows are PyTorch's, as its running-sum recurrence builds them
    (channel 0 stays in every window from ``(size - 1) // 2 + 1`` on): the same values as
    ``torch.nn.CrossMapLRN2d``, which differ from ``LocalResponseNorm``'s.  The gradient is
    that of these values (PyTorch's hand-written backward assumes symmetric windows)."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1) -> None:
        super().__init__()
        self.size = size
        self.alpha = alpha
        self.beta = beta
        self.k = k

    @staticmethod
    def _windows(size: int, channels: int) -> np.ndarray:
        """(C, C): which channels' squares each channel's sum adds (the recurrence, run on
        indicator vectors)."""
        pre = int((size - 1) / 2 + 1)
        rows = np.zeros((channels, channels))
        rows[0, : min(pre, channels)] = 1
        for c in range(1, channels):
            rows[c] = rows[c - 1]
            if c < channels - pre + 1:
                rows[c, c + pre - 1] += 1
            if c > pre:
                rows[c, c - pre] -= 1
        return rows

    def forward(self, input: Tensor) -> Tensor:
        if input.dim() != 4:
            raise ShapeError(f"CrossMapLRN2d: Expected input to be 4D, got {input.dim()}D instead.")
        windows = Tensor._make(self._windows(self.size, input.shape[1]).astype(input.dtype.np))
        sums = (windows.to(input.device) @ (input * input).movedim(1, -2)).movedim(-2, 1)
        return input * (sums * (self.alpha / self.size) + self.k) ** -self.beta

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


# ---- devices and processes ------------------------------------------------------------------


class DataParallel(Module):
    """``torch.nn.DataParallel`` on one device: fusegrad runs one device per process (use
    ``DistributedDataParallel`` across processes), so the wrapped ``module`` runs the whole
    batch, as PyTorch's does with a single device.  Its state dict keys start with
    ``module.``, as PyTorch's."""

    def __init__(
        self, module: Module, device_ids: Any = None, output_device: Any = None, dim: int = 0
    ) -> None:
        super().__init__()
        self.module = module
        self.device_ids = [] if device_ids is None else list(device_ids)
        self.output_device = output_device
        self.dim = dim

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)


def _distributed() -> Any:
    """``fusegrad.distributed`` (MPI), loaded on first use as ``fusegrad.__getattr__`` does."""
    return importlib.import_module("fusegrad.distributed")


class _SumOverProcesses(Function):
    """The sum of a tensor over the ranks of a process group; the gradient is summed too
    (each rank's loss depends on every rank's contribution)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        dist = _distributed()
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        dist = _distributed()
        total = g.clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation whose batch statistics are those of the whole batch across the
    processes of ``process_group`` (the default group of ``fusegrad.distributed``, over MPI):
    each process's per-channel sums, sums of squares and counts are summed over the group
    (differentiably), then every process normalises with the global mean and variance.  Without
    a process group of more than one process, or in eval mode, it is ``BatchNorm``."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.process_group = process_group

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ShapeError(f"expected at least 2D input (got {input.dim()}D input)")

    def _world(self) -> int:
        dist = _distributed()
        if not dist.is_available() or not dist.is_initialized():
            return 1
        return dist.get_world_size(self.process_group)

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ShapeError(
                f"SyncBatchNorm: expected {self.num_features} channels, got input of shape "
                f"{list(input.shape)}"
            )
        if not self.training or self._world() == 1:
            return super().forward(input)
        momentum: Any = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            with no_grad():
                self.num_batches_tracked.add_(1)
            if self.momentum is None:
                momentum = 1.0 / self.num_batches_tracked.double()
        dims = (0, *range(2, input.dim()))
        count = input.numel() // input.shape[1]
        counts = zeros(self.num_features, dtype=input.dtype, device=input.device) + count
        local = stack([input.sum(dims), (input * input).sum(dims), counts])
        total = _SumOverProcesses.apply(local, self.process_group)
        n = total[2]
        mean = total[0] / n
        var = total[1] / n - mean * mean
        shape = (1, -1) + (1,) * (input.dim() - 2)
        out = (input - mean.reshape(shape)) / (var.reshape(shape) + self.eps).sqrt()
        if self.weight is not None:
            out = out * self.weight.reshape(shape)
        if self.bias is not None:
            out = out + self.bias.reshape(shape)
        if self.track_running_stats and self.running_mean is not None:
            with no_grad():
                unbiased = var.detach() * (n.detach() / (n.detach() - 1).clamp(min=1))
                self.running_mean.mul_(1 - momentum).add_(mean.detach() * momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased * momentum)
        return out

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, process_group: Any = None) -> Module:
        """``module`` with every BatchNorm layer replaced by a SyncBatchNorm holding the same
        parameters and buffers (the module itself when it is one)."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            converted = cls(
                module.num_features,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
                process_group,
            )
            if module.affine:
                with no_grad():
                    converted.weight = module.weight
                    converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.train(module.training)
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return converted
