"""``fusegrad.nn.grad``: the gradients of a convolution with respect to its input and to its
weight, given the output's gradient (``conv2d_input``, ``conv2d_weight``, ... in 1, 2 and 3
dims).  Each runs the convolution on the known operand and differentiates it with
``autograd.grad`` (the convolution is linear in each operand, so this is exact)."""

from __future__ import annotations

from typing import Any

from ..autograd.api import grad as _grad
from ..autograd.grad_mode import enable_grad
from ..ops.creation import zeros
from ..tensor import Tensor
from . import functional as F

__all__ = [
    "conv1d_input",
    "conv1d_weight",
    "conv2d_input",
    "conv2d_weight",
    "conv3d_input",
    "conv3d_weight",
]

_CONVS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _input_grad(
    n: int, input_size: Any, weight: Tensor, grad_output: Tensor, *geometry: Any
) -> Tensor:
    with enable_grad():
        x = zeros(*input_size, dtype=weight.dtype, device=weight.device, requires_grad=True)
        out = _CONVS[n](x, weight.detach(), None, *geometry)
        (g,) = _grad(out, x, grad_output)
    return g


def _weight_grad(
    n: int, input: Tensor, weight_size: Any, grad_output: Tensor, *geometry: Any
) -> Tensor:
    with enable_grad():
        w = zeros(*weight_size, dtype=input.dtype, device=input.device, requires_grad=True)
        out = _CONVS[n](input.detach(), w, None, *geometry)
        (g,) = _grad(out, w, grad_output)
    return g


def conv1d_input(
    input_size: Any,
    weight: Tensor,
    grad_output: Tensor,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """The gradient of ``conv1d`` with respect to an input of ``input_size``."""
    return _input_grad(1, input_size, weight, grad_output, stride, padding, dilation, groups)


def conv1d_weight(
    input: Tensor,
    weight_size: Any,
    grad_output: Tensor,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """The gradient of ``conv1d`` with respect to a weight of ``weight_size``."""
    return _weight_grad(1, input, weight_size, grad_output, stride, padding, dilation, groups)


def conv2d_input(
    input_size: Any,
    weight: Tensor,
    grad_output: Tensor,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """The gradient of ``conv2d`` with respect to an input of ``input_size``."""
    return _input_grad(2, input_size, weight, grad_output, stride, padding, dilation, groups)


def conv2d_weight(
    input: Tensor,
    weight_size: Any,
    grad_output: Tensor,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """The gradient of ``conv2d`` with respect to a weight of ``weight_size``."""
    return _weight_grad(2, input, weight_size, grad_output, stride, padding, dilation, groups)


def conv3d_input(
    input_size: Any,
    weight: Tensor,
    grad_output: Tensor,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """The gradient of ``conv3d`` with respect to an input of ``input_size``."""
    return _input_grad(3, input_size, weight, grad_output, stride, padding, dilation, groups)


def conv3d_weight(
    input: Tensor,
    weight_size: Any,
    grad_output: Tensor,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """The gradient of ``conv3d`` with respect to a weight of ``weight_size``."""
    return _weight_grad(3, input, weight_size, grad_output, stride, padding, dilation, groups)
