"""``fusegrad.nn.modules.batchnorm``: batch normalisation,
at PyTorch's module path (``torch.nn.modules.batchnorm``)."""

from __future__ import annotations

from ..layers import (  # noqa: F401  (re-exported)
    BatchNorm1d,
    BatchNorm2d,
    _BatchNorm,
)
from ..lazy import (  # noqa: F401  (re-exported)
    LazyBatchNorm1d,
    LazyBatchNorm2d,
    LazyBatchNorm3d,
)
from ..more_layers import (  # noqa: F401  (re-exported)
    SyncBatchNorm,
)
from ..volumetric import (  # noqa: F401  (re-exported)
    BatchNorm3d,
)

__all__ = [
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyBatchNorm3d",
    "SyncBatchNorm",
]
