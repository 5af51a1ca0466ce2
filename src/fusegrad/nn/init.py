"""``fusegrad.nn.init``: in-place parameter initialisation schemes with PyTorch's names and maths.

Every function writes into the given tensor under ``no_grad`` (so it works on leaves that
require grad), bumps its version and returns it.  Random numbers come from fusegrad's default
generator unless a ``generator=`` is passed, so ``fusegrad.manual_seed`` makes model
construction reproducible.  The numbers differ from PyTorch's (different bit generator), the
distributions do not.
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd.grad_mode import no_grad
from ..errors import ShapeError, describe
from ..ops.creation import Generator, _gen
from ..tensor import Tensor

__all__ = [
    "calculate_gain",
    "constant_",
    "eye_",
    "kaiming_normal_",
    "kaiming_uniform_",
    "normal_",
    "ones_",
    "orthogonal_",
    "trunc_normal_",
    "uniform_",
    "xavier_normal_",
    "xavier_uniform_",
    "zeros_",
]

_LINEAR_FNS = (
    "linear",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
)


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (``relu`` -> sqrt(2), ``tanh`` -> 5/3, ...)."""
    if nonlinearity in _LINEAR_FNS or nonlinearity == "sigmoid":
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            negative_slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4  # PyTorch's value for self-normalising networks
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight laid out as (out, in, *kernel)."""
    if tensor.dim() < 2:
        raise ShapeError(
            "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions "
            f"(got {describe(tensor)})"
        )
    receptive_field = 1
    for s in tensor.shape[2:]:
        receptive_field *= s
    return tensor.shape[1] * receptive_field, tensor.shape[0] * receptive_field


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(
    tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Generator | None = None
) -> Tensor:
    """Fill with U(a, b)."""
    with no_grad():
        return tensor.uniform_(a, b, generator=generator)  # type: ignore[attr-defined]


def normal_(
    tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Generator | None = None
) -> Tensor:
    """Fill with N(mean, std^2)."""
    with no_grad():
        return tensor.normal_(mean, std, generator=generator)  # type: ignore[attr-defined]


def trunc_normal_(
    tensor: Tensor,
    mean: float = 0.0,
    std: float = 1.0,
    a: float = -2.0,
    b: float = 2.0,
    generator: Generator | None = None,
) -> Tensor:
    """Fill with N(mean, std^2) truncated to [a, b] (by resampling the values outside)."""
    rng = _gen(generator)
    values = rng.normal(mean, std, tuple(tensor.shape))
    outside = (values < a) | (values > b)
    # bounded loop: if [a, b] holds almost no mass, clip the stragglers rather than spin
    for _ in range(100):
        if not outside.any():
            break
        values[outside] = rng.normal(mean, std, int(outside.sum()))
        outside = (values < a) | (values > b)
    values = np.clip(values, a, b)
    with no_grad():
        return tensor.copy_(Tensor._make(values.astype(tensor.dtype.np)))  # type: ignore[attr-defined]


def constant_(tensor: Tensor, val: float) -> Tensor:
    with no_grad():
        return tensor.fill_(val)  # type: ignore[attr-defined]


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    with no_grad():
        return tensor.zero_()  # type: ignore[attr-defined]


def eye_(tensor: Tensor) -> Tensor:
    """Fill a 2-D tensor with the identity matrix."""
    if tensor.dim() != 2:
        raise ShapeError(f"Only tensors with 2 dimensions are supported (got {describe(tensor)})")
    with no_grad():
        eye = np.eye(tensor.shape[0], tensor.shape[1], dtype=tensor.dtype.np)
        return tensor.copy_(Tensor._make(eye))  # type: ignore[attr-defined]


def xavier_uniform_(
    tensor: Tensor, gain: float = 1.0, generator: Generator | None = None
) -> Tensor:
    """Glorot uniform: U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std  # the uniform bound with that standard deviation
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Generator | None = None) -> Tensor:
    """Glorot normal: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def kaiming_uniform_(
    tensor: Tensor,
    a: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: Generator | None = None,
) -> Tensor:
    """He uniform: U(-bound, bound), bound = gain * sqrt(3 / fan)."""
    if 0 in tuple(tensor.shape):
        return tensor  # PyTorch warns and does nothing for zero-element tensors
    fan = _calculate_correct_fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    std = gain / math.sqrt(fan)
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(
    tensor: Tensor,
    a: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: Generator | None = None,
) -> Tensor:
    """He normal: N(0, std^2), std = gain / sqrt(fan)."""
    if 0 in tuple(tensor.shape):
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    return normal_(tensor, 0.0, gain / math.sqrt(fan), generator)


def orthogonal_(tensor: Tensor, gain: float = 1.0, generator: Generator | None = None) -> Tensor:
    """A (semi-)orthogonal matrix from the QR decomposition of a Gaussian matrix."""
    if tensor.dim() < 2:
        raise ShapeError(
            f"Only tensors with 2 or more dimensions are supported (got {describe(tensor)})"
        )
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    flat = _gen(generator).standard_normal((rows, cols))
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    # sign fix makes the distribution uniform (Haar), as in PyTorch
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    values = (gain * q).reshape(tuple(tensor.shape)).astype(tensor.dtype.np)
    with no_grad():
        return tensor.copy_(Tensor._make(values))  # type: ignore[attr-defined]
