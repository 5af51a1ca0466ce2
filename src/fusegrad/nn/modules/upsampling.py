"""``fusegrad.nn.modules.upsampling``: upsampling,
at PyTorch's module path (``torch.nn.modules.upsampling``)."""

from __future__ import annotations

from ..layers import (  # noqa: F401  (re-exported)
    Upsample,
    UpsamplingBilinear2d,
    UpsamplingNearest2d,
)

__all__ = ["Upsample", "UpsamplingBilinear2d", "UpsamplingNearest2d"]
