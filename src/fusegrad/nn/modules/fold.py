"""``fusegrad.nn.modules.fold``: fold and unfold,
at PyTorch's module path (``torch.nn.modules.fold``)."""

from __future__ import annotations

from ..layers import (  # noqa: F401  (re-exported)
    Unfold,
)
from ..volumetric import (  # noqa: F401  (re-exported)
    Fold,
)

__all__ = ["Fold", "Unfold"]
