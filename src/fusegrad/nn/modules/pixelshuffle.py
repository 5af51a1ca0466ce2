"""``fusegrad.nn.modules.pixelshuffle``: pixel shuffling,
at PyTorch's module path (``torch.nn.modules.pixelshuffle``)."""

from __future__ import annotations

from ..layers import (  # noqa: F401  (re-exported)
    PixelShuffle,
    PixelUnshuffle,
)

__all__ = ["PixelShuffle", "PixelUnshuffle"]
