"""Devices: ``"cpu"`` and, when numba-cuda finds a GPU (or its simulator is on), ``"cuda"``.

The record is shaped like ``torch.device``.  ``as_device`` normalises what users pass
(``"cuda"``, ``"cuda:0"``, ``device("cuda")``) and checks that the device exists; a CUDA
device's index is always explicit in the result (``cuda:0``), as in a CUDA tensor's ``device``.

Whether CUDA exists is asked of numba-cuda once, by ``cuda_probe``.  It lives here, at the bottom
of the package, because every layer asks: ``as_device`` (creation functions, ``Tensor.to``, the
random generators) and the ``fusegrad.cuda`` package, whose public ``is_available`` & co. are
built on it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any


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


@functools.cache
def cuda_probe() -> tuple[Any, str]:
    """(``numba.cuda`` module or None, the reason it is unusable), found on the first call."""
    try:
        # numba-cuda is optional and slow to import, and numba's CUDA simulator must be chosen
        # (NUMBA_ENABLE_CUDASIM) before numba is first imported: loaded on the first question
        from numba import config, cuda
    except ImportError as e:  # numba-cuda not installed
        return None, f"numba-cuda is not importable ({e})"
    try:
        if config.ENABLE_CUDASIM:
            return cuda, ""
        if not cuda.is_available():
            return None, "numba-cuda found no usable CUDA driver or GPU"
    except Exception as e:  # a broken driver install must not crash ``is_available``
        return None, f"the CUDA driver could not be initialised ({e})"
    return cuda, ""


_default: list = []  # the device set_default_device chose (empty: the CPU)


def set_default_device(d: object) -> None:
    """The device factories put tensors on when given none (``None``: back to the CPU)."""
    _default.clear()
    if d is not None:
        dev = as_device(d)
        if dev.type != "cpu":
            _default.append(dev)


def get_default_device() -> device:
    """The device factories put tensors on when given none."""
    return _default[0] if _default else CPU


def as_device(d: object) -> device:
    if d is None:
        return _default[0] if _default else CPU
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
    index = dev.index or 0
    cuda, reason = cuda_probe()
    if cuda is None:
        raise RuntimeError(
            f"device '{dev}' is not available: {reason} "
            "(install fusegrad[cuda] on a machine with an NVIDIA GPU, or set "
            "NUMBA_ENABLE_CUDASIM=1 for numba's CUDA simulator)"
        )
    count = len(cuda.gpus)
    if index >= count:
        raise RuntimeError(
            f"CUDA error: invalid device ordinal: device '{dev}' requested, "
            f"{count} device(s) present"
        )
    return device("cuda", index)
