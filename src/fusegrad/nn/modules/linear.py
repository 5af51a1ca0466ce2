"""``fusegrad.nn.modules.linear``: linear layers,
at PyTorch's module path (``torch.nn.modules.linear``)."""

from __future__ import annotations

from ..layers import (  # noqa: F401  (re-exported)
    Bilinear,
    Identity,
    Linear,
)
from ..lazy import (  # noqa: F401  (re-exported)
    LazyLinear,
)

__all__ = ["Bilinear", "Identity", "LazyLinear", "Linear"]
