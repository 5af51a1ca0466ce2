"""``Size``: the tuple subclass returned by ``Tensor.shape``; prints like
``fusegrad.Size([2, 3])``."""

from __future__ import annotations

from .errors import ShapeError


class Size(tuple):
    __slots__ = ()

    def __repr__(self) -> str:
        return f"fusegrad.Size({list(self)})"

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n


def broadcast_shapes(*shapes: tuple) -> tuple:
    """numpy's broadcasting of ``shapes`` (right-aligned; a dim of 1 stretches), in plain
    Python: sizes may be any integers, including the compiler's symbolic ones, for which the
    comparisons below are decided symbolically.  Raises ShapeError (a RuntimeError and a
    ValueError) when two sizes differ and neither is 1."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim, 0, -1):
        size: object = 1
        for s in shapes:
            if i > len(s):
                continue
            d = s[-i]
            if size == 1:
                size = d
            elif d != 1 and d != size:
                raise ShapeError(f"shapes {[tuple(s) for s in shapes]} cannot broadcast")
        out.append(size)
    return tuple(out)
