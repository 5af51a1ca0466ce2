"""``fusegrad.nn.modules.sparse``: embeddings,
at PyTorch's module path (``torch.nn.modules.sparse``)."""

from __future__ import annotations

from ..layers import (  # noqa: F401  (re-exported)
    Embedding,
)
from ..more_layers import (  # noqa: F401  (re-exported)
    EmbeddingBag,
)

__all__ = ["Embedding", "EmbeddingBag"]
