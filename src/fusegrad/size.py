"""``Size``: the tuple subclass returned by ``Tensor.shape``; prints like
``fusegrad.Size([2, 3])``."""

from __future__ import annotations


class Size(tuple):
    __slots__ = ()

    def __repr__(self) -> str:
        return f"fusegrad.Size({list(self)})"

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n
