"""Devices.  Only "cpu" exists in this release; the record is shaped like ``torch.device`` so that
a CUDA device can be added without changing user code."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class device:  # noqa: N801 - torch-style name
    type: str
    index: int | None = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return (
            f"device(type='{self.type}')"
            if self.index is None
            else (f"device(type='{self.type}', index={self.index})")
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            other = as_device(other)
        if not isinstance(other, device):
            return NotImplemented
        return self.type == other.type and (self.index or 0) == (other.index or 0)

    def __hash__(self) -> int:
        return hash((self.type, self.index or 0))


CPU = device("cpu")


def as_device(d: object) -> device:
    if d is None:
        return CPU
    if isinstance(d, device):
        dev = d
    elif isinstance(d, str):
        kind, _, idx = d.partition(":")
        dev = device(kind, int(idx) if idx else None)
    else:
        raise TypeError(f"expected a device or a string like 'cpu', got {d!r}")
    if dev.type != "cpu":
        raise RuntimeError(
            f"device '{dev}' is not available: this build of fusegrad supports only 'cpu'"
        )
    return CPU
