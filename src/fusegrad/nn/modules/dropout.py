"""``fusegrad.nn.modules.dropout``: dropout,
at PyTorch's module path (``torch.nn.modules.dropout``)."""

from __future__ import annotations

from ..layers import (  # noqa: F401  (re-exported)
    AlphaDropout,
    Dropout,
    Dropout1d,
    Dropout2d,
    Dropout3d,
    FeatureAlphaDropout,
)

__all__ = ["AlphaDropout", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "FeatureAlphaDropout"]
