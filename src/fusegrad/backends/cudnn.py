"""``fusegrad.backends.cudnn``: cuDNN's switches, stored and otherwise ignored (fusegrad does not
use cuDNN; see ``fusegrad.backends``).  Defaults are PyTorch's."""

from __future__ import annotations

enabled = True
benchmark = False
benchmark_limit = 10
deterministic = False
allow_tf32 = True


def is_available() -> bool:
    """False: fusegrad has no cuDNN."""
    return False


def version() -> None:
    """None, as PyTorch without cuDNN."""
    return None
