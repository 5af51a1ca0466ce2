"""``fusegrad.nn.modules.normalization``: normalisation layers,
at PyTorch's module path (``torch.nn.modules.normalization``)."""

from __future__ import annotations

from ..layers import (  # noqa: F401  (re-exported)
    GroupNorm,
    LayerNorm,
    LocalResponseNorm,
    RMSNorm,
)
from ..more_layers import (  # noqa: F401  (re-exported)
    CrossMapLRN2d,
)

__all__ = ["CrossMapLRN2d", "GroupNorm", "LayerNorm", "LocalResponseNorm", "RMSNorm"]
