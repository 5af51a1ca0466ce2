"""``CudaArray``: the storage of a CUDA tensor.

A CUDA tensor's ``_data`` is a ``CudaArray``: one flat device allocation (``buffer``, a 1-D
numba-cuda device array, or the simulator's stand-in) plus numpy-style geometry — ``shape``,
``strides`` in bytes and a byte ``offset`` into the buffer.  Views (reshape, permute,
broadcast_to, basic indexing, diagonal, ...) share the buffer and differ only in geometry, exactly
as numpy views of one ndarray do, so the tensor machinery above (version counters shared with the
base, in-place writes through views, ``_base``) is the same on both devices.

The geometry of a view is computed by numpy itself: the numpy view function runs on a *probe*,
an array with this geometry over a one-element host buffer (``np.lib.stride_tricks.as_strided``
reads nothing), and the probe result's strides and data-pointer offset are the view's.  Only
functions that never read or copy data may run on a probe (``probe_view``'s callers guarantee it).

Kernels receive ``kernel_array()``: a numba device array with exactly this geometry over the
buffer.  Data leaves the device only through ``to_host()`` (``Tensor.cpu()``, ``.item()``,
``repr``): numpy conversion of a CUDA tensor raises, as in PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..device import device as _device
from . import kernels, numba_cuda

CUDA0 = _device("cuda", 0)

_PROBE_BASE: dict[np.dtype, np.ndarray] = {}


def _simulator() -> bool:
    from numba import config  # numba-cuda: only asked once a CUDA array exists

    return bool(config.ENABLE_CUDASIM)


class _Flags:
    __slots__ = ("c_contiguous", "writeable")

    def __init__(self, c_contiguous: bool, writeable: bool) -> None:
        self.c_contiguous = c_contiguous
        self.writeable = writeable


def contiguous_strides(shape: tuple, itemsize: int) -> tuple:
    strides = []
    step = itemsize
    for s in reversed(shape):
        strides.append(step)
        step *= max(int(s), 1)
    return tuple(reversed(strides))


class CudaArray:
    """Device storage with numpy geometry (see the module docstring)."""

    __slots__ = ("_kernel_array", "buffer", "dtype", "offset", "shape", "strides", "writeable")

    def __init__(
        self,
        buffer: Any,
        shape: tuple,
        strides: tuple,
        offset: int,
        dtype: np.dtype,
        writeable: bool = True,
    ) -> None:
        self.buffer = buffer
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)
        self.dtype = np.dtype(dtype)
        self.writeable = writeable
        self._kernel_array: Any = None

    # -- numpy-like metadata ----------------------------------------------------------------
    @property
    def device(self) -> _device:
        return CUDA0

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def c_contiguous(self) -> bool:
        if self.size <= 1:
            return True
        return all(
            st == cs or sh == 1
            for sh, st, cs in zip(
                self.shape, self.strides, contiguous_strides(self.shape, self.itemsize)
            )
        )

    @property
    def flags(self) -> _Flags:
        return _Flags(self.c_contiguous, self.writeable)

    def __repr__(self) -> str:
        return f"CudaArray(shape={self.shape}, dtype={self.dtype}, device='cuda:0')"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(
            "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
            "tensor to host memory first."
        )

    # -- device arrays for kernels ----------------------------------------------------------
    def kernel_array(self) -> Any:
        """A numba device array with this geometry, sharing the buffer (cached)."""
        if self._kernel_array is None:
            self._kernel_array = _device_view(self)
        return self._kernel_array

    def to_host(self) -> np.ndarray:
        """A C-contiguous host copy."""
        if self.size == 0:
            return np.empty(self.shape, self.dtype)
        # (a view whose dtype is not its buffer's, the parts of complex numbers: copied first)
        same = np.dtype(self.buffer.dtype) == self.dtype
        src = self if self.c_contiguous and same else contiguous(self, force=True)
        flat = src.buffer
        start = src.offset // self.itemsize
        if _simulator():
            host = np.array(flat._ary[start : start + self.size], copy=True)
        else:
            host = flat[start : start + self.size].copy_to_host()
        return host.reshape(self.shape)

    def tolist(self) -> Any:
        return self.to_host().tolist()

    def item(self) -> Any:
        return self.to_host().reshape(()).item()

    def reshape(self, *shape: Any) -> CudaArray:
        """numpy's ``reshape``: a view when the geometry allows it, else a contiguous copy."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        probe = self.probe()
        try:
            view = probe.view()
            view.shape = shape
        except AttributeError:
            return contiguous(self).reshape(shape)
        return from_probe(self, probe, view)

    def copy(self) -> CudaArray:
        return self.astype(self.dtype)

    def astype(self, dtype: Any, copy: bool = True) -> CudaArray:
        """A C-contiguous device copy cast to ``dtype`` (numpy's unsafe cast)."""
        out = empty(self.shape, dtype)
        copy_into(out, self)
        return out

    # -- geometry through numpy ---------------------------------------------------------------
    def probe(self) -> np.ndarray:
        """A host array with this geometry over one element: numpy computes views on it."""
        base = _PROBE_BASE.get(self.dtype)
        if base is None:
            base = _PROBE_BASE[self.dtype] = np.zeros(1, self.dtype)
        return np.lib.stride_tricks.as_strided(base, self.shape, self.strides)


def from_probe(a: CudaArray, probe: np.ndarray, view: np.ndarray) -> CudaArray:
    """The CudaArray that ``view`` (computed from ``a.probe()``) describes."""
    delta = view.__array_interface__["data"][0] - probe.__array_interface__["data"][0]
    writeable = a.writeable and all(st != 0 or sh <= 1 for sh, st in zip(view.shape, view.strides))
    return CudaArray(a.buffer, view.shape, view.strides, a.offset + delta, a.dtype, writeable)


def probe_view(a: CudaArray, fn: Callable[[np.ndarray], np.ndarray]) -> CudaArray:
    """Apply a numpy view function (one that never reads or copies data) to ``a``'s geometry."""
    probe = a.probe()
    view = fn(probe)
    if not isinstance(view, np.ndarray) or (view.size and not np.may_share_memory(view, probe)):
        raise AssertionError("probe_view: the function did not return a view")
    return from_probe(a, probe, view)


def _device_view(a: CudaArray) -> Any:
    if _simulator():
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray  # (numba-cuda)

        host = a.buffer._ary
        if host.dtype != a.dtype:  # memory seen as another dtype (complex parts as reals)
            view = np.ndarray(a.shape, a.dtype, host, a.offset if a.size else 0, a.strides)
            return FakeCUDAArray(view)
        view = np.lib.stride_tricks.as_strided(
            host[a.offset // a.itemsize :] if a.size else host, a.shape, a.strides
        )
        return FakeCUDAArray(view)
    from numba.cuda.cudadrv.devicearray import DeviceNDArray  # (numba-cuda)

    gpu_data = a.buffer.gpu_data
    if a.offset:
        gpu_data = gpu_data.view(a.offset)
    return DeviceNDArray(a.shape, a.strides, a.dtype, gpu_data=gpu_data)


# -- allocation and transfers ------------------------------------------------------------------
def empty(shape: tuple, dtype: Any) -> CudaArray:
    dtype = np.dtype(dtype)
    n = 1
    for s in shape:
        n *= int(s)
    buffer = numba_cuda().device_array(max(n, 1), dtype)
    return CudaArray(buffer, shape, contiguous_strides(tuple(shape), dtype.itemsize), 0, dtype)


def to_device(host: Any) -> CudaArray:
    """Copy a host array (anything numpy accepts) to a new contiguous CudaArray."""
    arr = np.asarray(host)
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would also make a 0-d array 1-d)
        arr = np.ascontiguousarray(arr)
    flat = arr.reshape(-1) if arr.size else np.zeros(1, arr.dtype)
    buffer = numba_cuda().to_device(flat)
    return CudaArray(buffer, arr.shape, contiguous_strides(arr.shape, arr.itemsize), 0, arr.dtype)


def contiguous(a: CudaArray, force: bool = False) -> CudaArray:
    """``a`` itself if C-contiguous (unless ``force``), else a contiguous device copy."""
    return a if a.c_contiguous and not force else a.astype(a.dtype)


def copy_into(dst: CudaArray, src: CudaArray) -> None:
    """``dst[...] = src`` on the device, with numpy's broadcasting and an unsafe cast."""
    if src.shape != dst.shape:
        src = probe_view(src, lambda p: np.broadcast_to(p, dst.shape))
    kernels.copy(dst, src)
