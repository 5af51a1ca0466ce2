"""``fusegrad.nn.attention``: ``SDPBackend`` and ``sdpa_kernel``, which choose the paths
``F.scaled_dot_product_attention`` may take.

fusegrad has two: ``MATH`` (the composite of primitives, any device, dtype, dropout and mask)
and a fused CPU kernel for float32/float64 without dropout, which stands for PyTorch's
``FLASH_ATTENTION`` and ``EFFICIENT_ATTENTION``.  ``CUDNN_ATTENTION`` and ``OVERRIDEABLE``
name no fusegrad path: allowing only those makes every call fail with PyTorch's
"No available kernel" error.  The choice is per thread and restored on exit.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from typing import Any

from ..ops.functional import sdpa_backends as _state

__all__ = ["WARN_FOR_UNFUSED_KERNELS", "SDPBackend", "sdpa_kernel"]

# PyTorch warns when a call cannot use a fused kernel if this is set; fusegrad does not warn
WARN_FOR_UNFUSED_KERNELS = False


class SDPBackend(enum.IntEnum):
    """The backends of scaled dot product attention (PyTorch's names and values)."""

    ERROR = -1
    MATH = 0
    FLASH_ATTENTION = 1
    EFFICIENT_ATTENTION = 2
    CUDNN_ATTENTION = 3
    OVERRIDEABLE = 4


_FUSED = {SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION}


@contextlib.contextmanager
def sdpa_kernel(backends: Any, set_priority: bool = False) -> Iterator[None]:
    """Allow only ``backends`` (one, or a list) inside the block (``set_priority`` orders
    PyTorch's backends; fusegrad's choice does not depend on it)."""
    chosen = [backends] if isinstance(backends, SDPBackend) else list(backends)
    if not all(isinstance(b, SDPBackend) for b in chosen):
        raise ValueError("Backend must be an instance of SDPBackend or a list of SDPBackend")
    saved = (_state.math, _state.fused)
    _state.math = SDPBackend.MATH in chosen
    _state.fused = bool(_FUSED & set(chosen))
    try:
        yield
    finally:
        _state.math, _state.fused = saved
