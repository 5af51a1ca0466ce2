"""``fusegrad.nn.modules.instancenorm``: instance normalisation,
at PyTorch's module path (``torch.nn.modules.instancenorm``)."""

from __future__ import annotations

from ..layers import (  # noqa: F401  (re-exported)
    InstanceNorm1d,
    InstanceNorm2d,
    _InstanceNorm,
)
from ..lazy import (  # noqa: F401  (re-exported)
    LazyInstanceNorm1d,
    LazyInstanceNorm2d,
    LazyInstanceNorm3d,
)
from ..volumetric import (  # noqa: F401  (re-exported)
    InstanceNorm3d,
)

__all__ = [
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "LazyInstanceNorm1d",
    "LazyInstanceNorm2d",
    "LazyInstanceNorm3d",
]
