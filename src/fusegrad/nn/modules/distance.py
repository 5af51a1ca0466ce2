"""``fusegrad.nn.modules.distance``: distances,
at PyTorch's module path (``torch.nn.modules.distance``)."""

from __future__ import annotations

from ..distance import (  # noqa: F401  (re-exported)
    CosineSimilarity,
    PairwiseDistance,
)

__all__ = ["CosineSimilarity", "PairwiseDistance"]
