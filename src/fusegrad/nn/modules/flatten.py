"""``fusegrad.nn.modules.flatten``: flattening,
at PyTorch's module path (``torch.nn.modules.flatten``)."""

from __future__ import annotations

from ..layers import (  # noqa: F401  (re-exported)
    Flatten,
    Unflatten,
)

__all__ = ["Flatten", "Unflatten"]
