"""``fusegrad.nn.modules.container``: containers,
at PyTorch's module path (``torch.nn.modules.container``)."""

from __future__ import annotations

from ..containers import (  # noqa: F401  (re-exported)
    ModuleDict,
    ModuleList,
    ParameterDict,
    ParameterList,
    Sequential,
)

__all__ = ["ModuleDict", "ModuleList", "ParameterDict", "ParameterList", "Sequential"]
