"""Device-generic helpers for the few places that touch tensor storage directly (in-place
writes, ``.grad`` accumulation, view bookkeeping): a numpy array on the CPU, a ``CudaArray`` on
CUDA.  Everything else goes through primitives, which ``registry.apply`` runs on either device."""

from __future__ import annotations

from typing import Any

import numpy as np

from .cuda import array as _cuda_array
from .cuda import kernels as _cuda_kernels
from .cuda.array import CudaArray, copy_into
from .cuda.ops import device_scalar


def is_host(a: Any) -> bool:
    return type(a) is not CudaArray


def may_share_memory(a: Any, b: Any) -> bool:
    if is_host(a) and is_host(b):
        return bool(np.may_share_memory(a, b))
    if is_host(a) or is_host(b):
        return False
    return a.buffer is b.buffer


def copyto(dst: Any, src: Any) -> None:
    """``dst[...] = src`` with broadcasting and numpy's unsafe cast (on ``dst``'s device)."""
    if is_host(dst):
        np.copyto(dst, src, casting="unsafe")
        return
    if is_host(src):
        if src.ndim:
            raise RuntimeError(
                f"copy: expected a cuda:0 source for a cuda:0 destination, got a cpu array of "
                f"shape {src.shape}"
            )
        src = device_scalar(src)
    copy_into(dst, src)


def full(shape: Any, value: Any, dtype: Any, on_cuda: bool) -> Any:
    """A new array of ``shape`` filled with ``value``: on the GPU when ``on_cuda`` (no copy)."""
    dt = np.dtype(dtype)
    if not on_cuda:
        return np.full(shape, value, dt)
    out = _cuda_array.empty(tuple(shape), dt)
    _cuda_kernels.fill(out, value)
    return out


def full_like(a: Any, value: Any, dtype: Any = None) -> Any:
    """A new array of ``a``'s shape filled with ``value``, on ``a``'s device."""
    return full(a.shape, value, a.dtype if dtype is None else dtype, not is_host(a))


def copy(a: Any, dtype: Any = None) -> Any:
    """A C-contiguous copy of ``a`` (cast to ``dtype``) on ``a``'s device."""
    if is_host(a):
        return np.array(a, dtype=dtype, copy=True, order="C")
    return a.astype(a.dtype if dtype is None else dtype)


def placed_like(a: np.ndarray, like: Any) -> Any:
    """Host array ``a`` on ``like``'s device (a copy to the GPU; ``a`` itself on the CPU)."""
    return a if is_host(like) else _cuda_array.to_device(a)


def to_host(a: Any) -> np.ndarray:
    return a if is_host(a) else a.to_host()
