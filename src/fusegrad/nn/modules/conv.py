"""``fusegrad.nn.modules.conv``: convolutions,
at PyTorch's module path (``torch.nn.modules.conv``)."""

from __future__ import annotations

from ..conv_transpose import (  # noqa: F401  (re-exported)
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    _ConvTransposeNd,
)
from ..layers import (  # noqa: F401  (re-exported)
    Conv1d,
    Conv2d,
    _ConvNd,
)
from ..lazy import (  # noqa: F401  (re-exported)
    LazyConv1d,
    LazyConv2d,
    LazyConv3d,
    LazyConvTranspose1d,
    LazyConvTranspose2d,
    LazyConvTranspose3d,
)
from ..volumetric import (  # noqa: F401  (re-exported)
    Conv3d,
)

__all__ = [
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "LazyConv1d",
    "LazyConv2d",
    "LazyConv3d",
    "LazyConvTranspose1d",
    "LazyConvTranspose2d",
    "LazyConvTranspose3d",
]
