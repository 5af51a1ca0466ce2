"""``fusegrad.accelerator``: PyTorch's device-generic accelerator queries.  fusegrad's one
accelerator is CUDA (numba-cuda); without a GPU ``is_available()`` is False and
``current_accelerator()`` None, as PyTorch's on a CPU-only machine."""

from __future__ import annotations

from . import cuda as _cuda
from .device import device


def is_available() -> bool:
    return _cuda.is_available()


def current_accelerator(check_available: bool = False) -> device | None:
    """``device("cuda")`` where CUDA is usable, else None."""
    return device("cuda") if _cuda.is_available() else None


def device_count() -> int:
    return _cuda.device_count() if _cuda.is_available() else 0


def current_device_index() -> int:
    return _cuda.current_device() if _cuda.is_available() else -1


def synchronize(device: object = None) -> None:
    if _cuda.is_available():
        _cuda.synchronize(device)
