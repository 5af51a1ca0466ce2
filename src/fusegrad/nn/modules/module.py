"""``fusegrad.nn.modules.module``: the Module base class,
at PyTorch's module path (``torch.nn.modules.module``)."""

from __future__ import annotations

from ..module import (  # noqa: F401  (re-exported)
    Module,
)

__all__ = ["Module"]
