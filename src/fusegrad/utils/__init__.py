"""``fusegrad.utils``: helpers outside the core tensor/autograd API, named as in ``torch.utils``.

``fusegrad.utils.checkpoint`` holds activation checkpointing (``checkpoint``,
``checkpoint_sequential``).
"""

from __future__ import annotations

from . import checkpoint

__all__ = ["checkpoint"]
