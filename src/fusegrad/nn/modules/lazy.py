"""``fusegrad.nn.modules.lazy``: the lazy-module mixin,
at PyTorch's module path (``torch.nn.modules.lazy``)."""

from __future__ import annotations

from ..lazy import (  # noqa: F401  (re-exported)
    LazyModuleMixin,
)

__all__ = ["LazyModuleMixin"]
