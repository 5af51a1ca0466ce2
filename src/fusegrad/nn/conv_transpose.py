"""``nn.ConvTranspose1d``, ``nn.ConvTranspose2d`` and ``nn.ConvTranspose3d``: transposed
convolution modules over ``F.conv_transpose1d``/``2d``/``3d``, with PyTorch's arguments,
weight layout (in_channels, out_channels / groups, *kernel), initialisation, repr and
``output_size`` argument of ``forward``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import ShapeError
from ..tensor import Tensor
from . import functional as F
from . import init
from .layers import _new_weight, _ntuple
from .module import Module

__all__ = ["ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]


class _ConvTransposeNd(Module):
    """Transposed convolution over ``_n`` spatial dims: each output size is (in - 1) * stride -
    2 * padding + dilation * (kernel - 1) + output_padding + 1."""

    _n = 2

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: Any = 1,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {type(self).__name__}')
        if isinstance(padding, str):
            raise ValueError(f"padding={padding!r} is not supported by ConvTranspose2d: give ints")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _ntuple(kernel_size, self._n)
        self.stride = _ntuple(stride, self._n)
        self.padding = _ntuple(padding, self._n)
        self.output_padding = _ntuple(output_padding, self._n)
        self.dilation = _ntuple(dilation, self._n)
        self.groups = groups
        self.padding_mode = padding_mode
        self.transposed = True
        self.weight = _new_weight(
            in_channels, out_channels // groups, *self.kernel_size, dtype=dtype, device=device
        )
        if bias:
            self.bias = _new_weight(out_channels, dtype=dtype, device=device)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # as PyTorch: fan_in is read from the weight's dim 1 (out_channels / groups) * kernel
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def _output_padding(self, input: Tensor, output_size: Sequence[int] | None) -> tuple:
        """The output_padding that gives ``output_size`` (its last ``_n`` entries), or the
        module's own when no size is asked for."""
        if output_size is None:
            return self.output_padding
        n = self._n
        size = [int(s) for s in output_size][-n:]
        if len(size) != n:
            raise ShapeError(
                f"{type(self).__name__}: output_size must have {n} or more elements "
                f"(got {output_size})"
            )
        spatial = list(input.shape[-n:])
        smallest, largest = [], []
        for d in range(n):
            low = (
                (spatial[d] - 1) * self.stride[d]
                - 2 * self.padding[d]
                + self.dilation[d] * (self.kernel_size[d] - 1)
                + 1
            )
            smallest.append(low)
            largest.append(low + self.stride[d] - 1)
        for d in range(n):
            if not smallest[d] <= size[d] <= largest[d]:
                raise ShapeError(
                    f"requested an output size of {size}, but valid sizes range from "
                    f"{smallest} to {largest} (for an input of {spatial})"
                )
        return tuple(size[d] - smallest[d] for d in range(n))

    def _conv(self, *args: Any) -> Tensor:
        raise NotImplementedError

    def forward(self, input: Tensor, output_size: Sequence[int] | None = None) -> Tensor:
        return self._conv(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self._output_padding(input, output_size),
            self.groups,
            self.dilation,
        )

    def extra_repr(self) -> str:
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}"
        )
        n = self._n
        if self.padding != (0,) * n:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * n:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * n:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class ConvTranspose1d(_ConvTransposeNd):
    """1-D transposed convolution of (N, C_in, L) or (C_in, L) inputs."""

    _n = 1

    def _conv(self, *args: Any) -> Tensor:
        return F.conv_transpose1d(*args)


class ConvTranspose2d(_ConvTransposeNd):
    """2-D transposed convolution of (N, C_in, H, W) or (C_in, H, W) inputs."""

    _n = 2

    def _conv(self, *args: Any) -> Tensor:
        return F.conv_transpose2d(*args)


class ConvTranspose3d(_ConvTransposeNd):
    """3-D transposed convolution of (N, C_in, D, H, W) or (C_in, D, H, W) inputs."""

    _n = 3

    def _conv(self, *args: Any) -> Tensor:
        return F.conv_transpose3d(*args)
