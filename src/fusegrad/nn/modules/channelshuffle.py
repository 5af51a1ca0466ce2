"""``fusegrad.nn.modules.channelshuffle``: channel shuffling,
at PyTorch's module path (``torch.nn.modules.channelshuffle``)."""

from __future__ import annotations

from ..layers import (  # noqa: F401  (re-exported)
    ChannelShuffle,
)

__all__ = ["ChannelShuffle"]
