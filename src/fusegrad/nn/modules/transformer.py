"""``fusegrad.nn.modules.transformer``: transformers,
at PyTorch's module path (``torch.nn.modules.transformer``)."""

from __future__ import annotations

from ..transformer import (  # noqa: F401  (re-exported)
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
]
