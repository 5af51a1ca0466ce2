"""``nn.ConvTranspose2d``: the transposed 2-D convolution module over ``F.conv_transpose2d``,
with PyTorch's arguments, weight layout (in_channels, out_channels / groups, kh, kw),
initialisation, repr and ``output_size`` argument of ``forward``."""

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

__all__ = ["ConvTranspose2d"]


class ConvTranspose2d(Module):
    """2-D transposed convolution of (N, C_in, H, W) or (C_in, H, W) inputs: H_out = (H - 1) *
    stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1."""

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
            raise ValueError('Only "zeros" padding mode is supported for ConvTranspose2d')
        if isinstance(padding, str):
            raise ValueError(f"padding={padding!r} is not supported by ConvTranspose2d: give ints")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _ntuple(kernel_size, 2)
        self.stride = _ntuple(stride, 2)
        self.padding = _ntuple(padding, 2)
        self.output_padding = _ntuple(output_padding, 2)
        self.dilation = _ntuple(dilation, 2)
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
        """The output_padding that gives ``output_size`` (its last two entries), or the
        module's own when no size is asked for."""
        if output_size is None:
            return self.output_padding
        size = [int(s) for s in output_size][-2:]
        if len(size) != 2:
            raise ShapeError(
                f"ConvTranspose2d: output_size must have 2 or more elements (got {output_size})"
            )
        spatial = list(input.shape[-2:])
        smallest, largest = [], []
        for d in range(2):
            low = (
                (spatial[d] - 1) * self.stride[d]
                - 2 * self.padding[d]
                + self.dilation[d] * (self.kernel_size[d] - 1)
                + 1
            )
            smallest.append(low)
            largest.append(low + self.stride[d] - 1)
        for d in range(2):
            if not smallest[d] <= size[d] <= largest[d]:
                raise ShapeError(
                    f"requested an output size of {size}, but valid sizes range from "
                    f"{smallest} to {largest} (for an input of {spatial})"
                )
        return tuple(size[d] - smallest[d] for d in range(2))

    def forward(self, input: Tensor, output_size: Sequence[int] | None = None) -> Tensor:
        return F.conv_transpose2d(
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
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.output_padding != (0, 0):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s
