"""Devices: ``"cpu"`` and, when numba-cuda finds a GPU (or its simulator is on), ``"cuda"``.

The record is shaped like ``torch.device``.  ``as_device`` normalises what users pass
(``"cuda"``, ``"cuda:0"``, ``device("cuda")``) and checks that the device exists; a CUDA
device's index is always explicit in the result (``cuda:0``), as in a CUDA tensor's ``device``."""

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
    if dev.type == "cpu":
        return CPU
    if dev.type != "cuda":
        raise RuntimeError(
            f"Expected one of cpu, cuda device type at start of device string: {dev.type}"
        )
    from . import cuda

    index = dev.index or 0
    if not cuda.is_available():
        raise RuntimeError(
            f"device '{dev}' is not available: {cuda.unavailable_reason()} "
            "(install fusegrad[cuda] on a machine with an NVIDIA GPU, or set "
            "NUMBA_ENABLE_CUDASIM=1 for numba's CUDA simulator)"
        )
    if index >= cuda.device_count():
        raise RuntimeError(
            f"CUDA error: invalid device ordinal: device '{dev}' requested, "
            f"{cuda.device_count()} device(s) present"
        )
    return device("cuda", index)
