"""``fusegrad.nn.modules.adaptive``: the adaptive softmax,
at PyTorch's module path (``torch.nn.modules.adaptive``)."""

from __future__ import annotations

from ..more_layers import (  # noqa: F401  (re-exported)
    AdaptiveLogSoftmaxWithLoss,
)

__all__ = ["AdaptiveLogSoftmaxWithLoss"]
