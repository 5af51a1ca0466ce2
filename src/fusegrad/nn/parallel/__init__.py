"""``fusegrad.nn.parallel``: ``DistributedDataParallel`` (over ``fusegrad.distributed``)."""

from __future__ import annotations

from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
