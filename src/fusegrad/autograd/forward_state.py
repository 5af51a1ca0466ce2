"""The process-wide forward-AD state, below the op surface: which dual level exists, if any.

``ops.registry.apply`` reads ``state.level`` on every primitive call, and the engine, saved
tensors and in-place ops read it where tangents must follow values.  The level object itself
(``autograd.forward_ad._Level``, above the op surface) does the work when there is one, through
its methods ``apply``, ``saved_output_tangent``, ``carry_tangent`` and ``inplace_update``; so
this module needs nothing above it, and forward AD costs one attribute read per op when it is
not in use.  The level is process-wide, as PyTorch's forward-AD levels are.
"""

from __future__ import annotations

from typing import Any


class _State:
    __slots__ = ("level",)

    def __init__(self) -> None:
        self.level: Any = None  # the active ``forward_ad._Level`` (None: no dual level)


state = _State()
