"""The 3-D layers and the pooling variants beside them: ``Conv3d``, ``BatchNorm3d``,
``InstanceNorm3d``, ``MaxPool3d``, ``AvgPool3d``, ``LPPool3d``, the adaptive 3-D pools,
``MaxUnpool1d/2d/3d``, ``FractionalMaxPool2d/3d`` and ``Fold``.

Each is PyTorch's module over the functional form in ``fusegrad.nn.functional`` (written once
for 1, 2 and 3 spatial dims in ``ops/convolution.py``), with PyTorch's arguments, defaults and
``extra_repr``.
"""

from __future__ import annotations

from typing import Any

from ..tensor import Tensor
from . import functional as F
from .layers import _BatchNorm, _ConvNd, _InstanceNorm, _ntuple
from .module import Module

__all__ = [
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool3d",
    "AvgPool3d",
    "BatchNorm3d",
    "Conv3d",
    "Fold",
    "FractionalMaxPool2d",
    "FractionalMaxPool3d",
    "InstanceNorm3d",
    "LPPool3d",
    "MaxPool3d",
    "MaxUnpool1d",
    "MaxUnpool2d",
    "MaxUnpool3d",
]


class Conv3d(_ConvNd):
    """3-D convolution (cross-correlation) over (N, C, D, H, W) inputs, via ``F.conv3d``."""

    _n = 3

    def _conv(self, input: Tensor, padding: Any) -> Tensor:
        return F.conv3d(
            input, self.weight, self.bias, self.stride, padding, self.dilation, self.groups
        )


class BatchNorm3d(_BatchNorm):
    """Batch normalisation of (N, C, D, H, W) inputs over N, D, H and W per channel."""

    _dims = (5,)


class InstanceNorm3d(_InstanceNorm):
    """Instance normalisation of (N, C, D, H, W) or unbatched (C, D, H, W) inputs."""

    _dims = (4, 5)


class MaxPool3d(Module):
    """``F.max_pool3d`` with PyTorch's options and repr."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def forward(self, input: Tensor) -> Any:
        return F.max_pool3d(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            ceil_mode=self.ceil_mode,
            return_indices=self.return_indices,
        )

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


class AvgPool3d(Module):
    """``F.avg_pool3d`` with PyTorch's options and repr."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input: Tensor) -> Tensor:
        return F.avg_pool3d(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class LPPool3d(Module):
    """``F.lp_pool3d``: power-average pooling over three dims."""

    def __init__(
        self, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False
    ) -> None:
        super().__init__()
        self.norm_type = norm_type
        self.kernel_size = kernel_size
        self.stride = stride
        self.ceil_mode = ceil_mode

    def forward(self, input: Tensor) -> Tensor:
        return F.lp_pool3d(input, self.norm_type, self.kernel_size, self.stride, self.ceil_mode)

    def extra_repr(self) -> str:
        return (
            f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"ceil_mode={self.ceil_mode}"
        )


class AdaptiveAvgPool3d(Module):
    """Average pooling of (N, C, D, H, W) or (C, D, H, W) inputs to a fixed output size."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:
        return F.adaptive_avg_pool3d(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveMaxPool3d(Module):
    """``F.adaptive_max_pool3d`` (with the maxima's indices when ``return_indices``)."""

    def __init__(self, output_size: Any, return_indices: bool = False) -> None:
        super().__init__()
        self.output_size = output_size
        self.return_indices = return_indices

    def forward(self, input: Tensor) -> Any:
        return F.adaptive_max_pool3d(input, self.output_size, self.return_indices)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class _MaxUnpoolNd(Module):
    """The inverse of max pooling: values put back where pooling's indices say."""

    _n = 2

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0) -> None:
        super().__init__()
        self.kernel_size = _ntuple(kernel_size, self._n)
        self.stride = _ntuple(stride if stride is not None else kernel_size, self._n)
        self.padding = _ntuple(padding, self._n)

    def forward(self, input: Tensor, indices: Tensor, output_size: Any = None) -> Tensor:
        fn = (F.max_unpool1d, F.max_unpool2d, F.max_unpool3d)[self._n - 1]
        return fn(input, indices, self.kernel_size, self.stride, self.padding, output_size)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool1d(_MaxUnpoolNd):
    """The inverse of ``MaxPool1d``."""

    _n = 1


class MaxUnpool2d(_MaxUnpoolNd):
    """The inverse of ``MaxPool2d``."""

    _n = 2


class MaxUnpool3d(_MaxUnpoolNd):
    """The inverse of ``MaxPool3d``."""

    _n = 3


class _FractionalMaxPoolNd(Module):
    """Fractional max pooling: windows at pseudo-random starts, drawn per call (or from
    ``_random_samples``), giving ``output_size`` or ``output_ratio`` outputs."""

    _n = 2

    def __init__(
        self,
        kernel_size: Any,
        output_size: Any = None,
        output_ratio: Any = None,
        return_indices: bool = False,
        _random_samples: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size = _ntuple(kernel_size, self._n)
        self.return_indices = return_indices
        self.register_buffer("_random_samples", _random_samples)
        self.output_size = None if output_size is None else _ntuple(output_size, self._n)
        if output_ratio is not None:
            ratio = (
                (output_ratio,) * self._n
                if not isinstance(output_ratio, (tuple, list))
                else (tuple(output_ratio))
            )
            if not all(0 < r < 1 for r in ratio):
                raise ValueError(f"output_ratio must be between 0 and 1 (got {output_ratio})")
            output_ratio = ratio
        self.output_ratio = output_ratio
        if output_size is None and output_ratio is None:
            raise ValueError(
                f"{type(self).__name__} requires specifying either an output size, or a "
                "pooling ratio"
            )
        if output_size is not None and output_ratio is not None:
            raise ValueError("only one of output_size and output_ratio may be specified")

    def forward(self, input: Tensor) -> Any:
        fn = F.fractional_max_pool2d if self._n == 2 else F.fractional_max_pool3d
        return fn(
            input,
            self.kernel_size,
            self.output_size,
            self.output_ratio,
            self.return_indices,
            _random_samples=self._random_samples,
        )


class FractionalMaxPool2d(_FractionalMaxPoolNd):
    """``F.fractional_max_pool2d`` as a module."""

    _n = 2


class FractionalMaxPool3d(_FractionalMaxPoolNd):
    """``F.fractional_max_pool3d`` as a module."""

    _n = 3


class Fold(Module):
    """``F.fold`` (col2im: overlapping windows summed) as a module."""

    def __init__(
        self,
        output_size: Any,
        kernel_size: Any,
        dilation: Any = 1,
        padding: Any = 0,
        stride: Any = 1,
    ) -> None:
        super().__init__()
        self.output_size = output_size
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.padding = padding
        self.stride = stride

    def forward(self, input: Tensor) -> Tensor:
        return F.fold(
            input, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride
        )

    def extra_repr(self) -> str:
        return (
            f"output_size={self.output_size}, kernel_size={self.kernel_size}, "
            f"dilation={self.dilation}, padding={self.padding}, stride={self.stride}"
        )
