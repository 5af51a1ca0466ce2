"""``fusegrad.utils``: helpers outside the core tensor/autograd API, named as in ``torch.utils``.

``fusegrad.utils.checkpoint`` holds activation checkpointing (``checkpoint``,
``checkpoint_sequential``); ``fusegrad.utils.data`` datasets, samplers and the ``DataLoader``.
"""

from __future__ import annotations

from . import checkpoint, data

__all__ = ["checkpoint", "data"]
