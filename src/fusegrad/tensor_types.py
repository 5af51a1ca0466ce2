"""PyTorch's legacy tensor types: ``FloatTensor``, ``LongTensor``, ... and their CUDA twins.

Each is a class whose instances are the fusegrad tensors of its dtype and device
(``isinstance(t, fusegrad.FloatTensor)`` holds for a float32 CPU tensor), and whose call is the
legacy constructor of that dtype: ``FloatTensor(3, 4)`` gives uninitialised values of that shape,
``LongTensor([1, 2])`` a copy of the data, ``FloatTensor()`` an empty tensor.
``t.type(fusegrad.DoubleTensor)`` converts to the type's dtype (and device).  Nothing creates
instances of these classes themselves: calls return ordinary ``Tensor``s.
"""

from __future__ import annotations

from typing import Any

from . import dtypes as _dt
from .cuda.array import CudaArray, to_device
from .tensor import Tensor, legacy_array


class _TensorType(type):
    """The metaclass of the legacy tensor types: ``isinstance`` by dtype and device, calls as
    the legacy constructor."""

    _legacy_dtype: _dt.dtype
    _legacy_cuda: bool

    def __instancecheck__(cls, obj: Any) -> bool:
        return (
            isinstance(obj, Tensor)
            and obj.dtype is cls._legacy_dtype
            and (type(obj._data) is CudaArray) == cls._legacy_cuda
        )

    def __call__(cls, *args: Any, device: Any = None) -> Tensor:  # type: ignore[override]
        name = cls.__qualname__
        arr = legacy_array(args, cls._legacy_dtype, name)
        if cls._legacy_cuda or (device is not None and str(device).startswith("cuda")):
            arr = to_device(arr)
        return Tensor._make(arr)

    @property
    def dtype(cls) -> _dt.dtype:
        return cls._legacy_dtype

    @property
    def is_cuda(cls) -> bool:
        return cls._legacy_cuda


def _make(name: str, dtype: _dt.dtype, cuda: bool) -> type:
    where = "a CUDA" if cuda else "a CPU"
    doc = f"{where} tensor of dtype {dtype.name} (PyTorch's legacy type ``{name}``)."
    module = "fusegrad.cuda" if cuda else "fusegrad"
    body = {"_legacy_dtype": dtype, "_legacy_cuda": cuda, "__doc__": doc, "__module__": module}
    return _TensorType(name, (), body)


_NAMES = {
    "FloatTensor": _dt.float32,
    "DoubleTensor": _dt.float64,
    "HalfTensor": _dt.float16,
    "LongTensor": _dt.int64,
    "IntTensor": _dt.int32,
    "ShortTensor": _dt.int16,
    "CharTensor": _dt.int8,
    "ByteTensor": _dt.uint8,
    "BoolTensor": _dt.bool_,
}
if _dt.bfloat16 is not None:
    _NAMES["BFloat16Tensor"] = _dt.bfloat16

CPU_TYPES = {name: _make(name, d, False) for name, d in _NAMES.items()}
CUDA_TYPES = {name: _make(name, d, True) for name, d in _NAMES.items()}


def by_name(name: str) -> type | None:
    """The type a string names: ``"torch.FloatTensor"``, ``"fusegrad.cuda.LongTensor"``, ..."""
    parts = name.split(".")
    table = CUDA_TYPES if len(parts) > 2 and parts[-2] == "cuda" else CPU_TYPES
    return table.get(parts[-1])


globals().update(CPU_TYPES)
__all__ = sorted(CPU_TYPES)
