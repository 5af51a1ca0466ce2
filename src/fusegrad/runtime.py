"""Top-level queries and process settings PyTorch scripts call: ``finfo``/``iinfo``, dtype
questions (``is_floating_point``, ``promote_types``, ``can_cast``, ...), the math constants, the
thread counts, and the flags of determinism, matmul precision, anomaly mode and warnings.

Where this sits: layer 10 of ``fusegrad/__init__.py`` (it reads ``Tensor``, the dtypes, the
default generator and anomaly mode); ``fusegrad`` re-exports every name of ``__all__``.

What the flags do here: fusegrad's CPU kernels are deterministic (compiled loops run ``prange``
only over disjoint outputs) and its float32 matmul is always full precision, so
``use_deterministic_algorithms`` and ``set_float32_matmul_precision`` are accepted, checked and
stored, as PyTorch's are, and change nothing.  ``set_num_threads`` sets numba's thread count
(the compiled programs' ``prange`` loops), loading numba on first use.
"""

from __future__ import annotations

import builtins
import math
import os
from typing import Any

import numpy as np

from . import dtypes as _dt
from ._format import set_printoptions
from .autograd import anomaly as _anomaly
from .ops.creation import default_generator
from .size import Size
from .size import broadcast_shapes as _broadcast_shapes
from .tensor import Tensor

__all__ = [
    "pi",
    "e",
    "inf",
    "nan",
    "newaxis",
    "finfo",
    "iinfo",
    "is_floating_point",
    "is_complex",
    "is_signed",
    "is_nonzero",
    "is_same_size",
    "is_inference",
    "typename",
    "broadcast_shapes",
    "promote_types",
    "result_type",
    "can_cast",
    "initial_seed",
    "get_num_threads",
    "set_num_threads",
    "get_num_interop_threads",
    "set_num_interop_threads",
    "use_deterministic_algorithms",
    "are_deterministic_algorithms_enabled",
    "is_deterministic_algorithms_warn_only_enabled",
    "set_deterministic_debug_mode",
    "get_deterministic_debug_mode",
    "set_float32_matmul_precision",
    "get_float32_matmul_precision",
    "is_anomaly_enabled",
    "is_anomaly_check_nan_enabled",
    "set_anomaly_enabled",
    "set_warn_always",
    "is_warn_always_enabled",
    "set_printoptions",
]

pi = math.pi
e = math.e
inf = math.inf
nan = math.nan
newaxis = None


# ---- dtype information ------------------------------------------------------------------------
class finfo:  # noqa: N801  (PyTorch's name)
    """Machine limits of a floating dtype (``bits``, ``eps``, ``max``, ``min``, ``tiny`` =
    ``smallest_normal``, ``resolution``), as ``torch.finfo``; the default dtype without one."""

    def __init__(self, type: Any = None) -> None:  # noqa: A002  (PyTorch's argument name)
        d = _dt.get_default_dtype() if type is None else _dt.as_dtype(type)
        if not d.is_floating_point:
            raise TypeError(f"torch.finfo() requires a floating point input type, got {d}")
        info = np.finfo(d.np)
        self.dtype = d.name
        self.bits = int(info.bits)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.min = float(info.min)
        self.tiny = self.smallest_normal = float(info.tiny)
        self.resolution = 10.0 ** -int(info.precision)

    def __repr__(self) -> str:
        return (
            f"finfo(resolution={self.resolution}, min={self.min:g}, max={self.max:g}, "
            f"eps={self.eps:g}, smallest_normal={self.tiny:g}, tiny={self.tiny:g}, "
            f"dtype={self.dtype})"
        )


class iinfo:  # noqa: N801
    """Limits of an integer dtype (``bits``, ``max``, ``min``), as ``torch.iinfo``."""

    def __init__(self, type: Any) -> None:  # noqa: A002
        d = _dt.as_dtype(type)
        if d.category != 1 and d is not _dt.bool_:
            raise TypeError(f"torch.iinfo() requires an integer input type, got {d}")
        info = np.iinfo(np.uint8 if d is _dt.bool_ else d.np)
        self.dtype = d.name
        self.bits = 8 if d is _dt.bool_ else int(info.bits)
        self.max = 1 if d is _dt.bool_ else int(info.max)
        self.min = 0 if d is _dt.bool_ else int(info.min)

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"


def _tensor(fn: str, obj: Any) -> Tensor:
    if not isinstance(obj, Tensor):
        raise TypeError(f"{fn}(): argument 'input' must be Tensor, not {type(obj).__name__}")
    return obj


def is_floating_point(input: Tensor) -> bool:
    return _tensor("is_floating_point", input).dtype.is_floating_point


def is_complex(input: Tensor) -> bool:
    return _tensor("is_complex", input).dtype.is_complex


def is_signed(input: Tensor) -> bool:
    return _tensor("is_signed", input).dtype is not _dt.bool_


def is_nonzero(input: Tensor) -> bool:
    x = _tensor("is_nonzero", input)
    if x.numel() == 0:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
    if x.numel() > 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(x.item() != 0)


def is_same_size(input: Tensor, other: Tensor) -> bool:
    return tuple(_tensor("is_same_size", input).shape) == tuple(
        _tensor("is_same_size", other).shape
    )


def is_inference(input: Tensor) -> bool:
    return _tensor("is_inference", input).is_inference()


_TYPE_NAMES = {
    "float32": "torch.FloatTensor",
    "float64": "torch.DoubleTensor",
    "float16": "torch.HalfTensor",
    "bfloat16": "torch.BFloat16Tensor",
    "int32": "torch.IntTensor",
    "int64": "torch.LongTensor",
    "int16": "torch.ShortTensor",
    "int8": "torch.CharTensor",
    "uint8": "torch.ByteTensor",
    "bool": "torch.BoolTensor",
    "complex64": "torch.ComplexFloatTensor",
    "complex128": "torch.ComplexDoubleTensor",
}


def typename(obj: Any) -> str:
    """``torch.FloatTensor`` and the like for tensors (PyTorch's spelling, as scripts compare
    it), the qualified class name for anything else."""
    if isinstance(obj, Tensor):
        return _TYPE_NAMES.get(obj.dtype.name, f"torch.{obj.dtype.name}")
    cls = obj if isinstance(obj, type) else type(obj)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", None) else f"{module}.{cls.__qualname__}"


def broadcast_shapes(*shapes: Any) -> Size:
    """The shape that tensors of ``shapes`` broadcast to (an int is a 1-D shape)."""
    as_tuples = [(s,) if isinstance(s, builtins.int) else tuple(s) for s in shapes]
    return Size(_broadcast_shapes(*as_tuples))


def promote_types(type1: Any, type2: Any) -> _dt.dtype:
    return _dt.result_type(
        Tensor._make(np.zeros(1, _dt.as_dtype(type1).np)),
        Tensor._make(np.zeros(1, _dt.as_dtype(type2).np)),
    )


def result_type(tensor1: Any, tensor2: Any) -> _dt.dtype:
    return _dt.result_type(tensor1, tensor2)


def can_cast(from_: Any, to: Any) -> bool:
    """PyTorch's casting rule: no float to integer, no non-bool to bool (widening or narrowing
    within a category is allowed)."""
    src, dst = _dt.as_dtype(from_), _dt.as_dtype(to)
    return src.category <= dst.category and not (dst is _dt.bool_ and src is not _dt.bool_)


def initial_seed() -> int:
    return default_generator.initial_seed()


# ---- threads ----------------------------------------------------------------------------------
_interop_threads = [os.cpu_count() or 1]


def get_num_threads() -> int:
    import numba  # loaded on first use (the compiled programs' thread pool)

    return int(numba.get_num_threads())


def set_num_threads(int: int) -> None:  # noqa: A002  (PyTorch's argument name)
    """The threads of compiled programs' parallel loops (numba's, for the calling thread);
    at most numba's pool size (``NUMBA_NUM_THREADS``, the number of cores by default)."""
    if not isinstance(int, builtins.int) or int <= 0:
        raise RuntimeError("set_num_threads expects a positive integer")
    import numba  # loaded on first use (the compiled programs' thread pool)

    numba.set_num_threads(min(int, numba.config.NUMBA_NUM_THREADS))


def get_num_interop_threads() -> int:
    return _interop_threads[0]


def set_num_interop_threads(int: int) -> None:  # noqa: A002
    """Stored only: fusegrad runs no inter-op thread pool."""
    if not isinstance(int, builtins.int) or int <= 0:
        raise RuntimeError("Expected positive number of threads")
    _interop_threads[0] = int


# ---- flags (stored; see the module docstring) -------------------------------------------------
_flags: dict[str, Any] = {
    "deterministic": False,
    "warn_only": False,
    "matmul_precision": "highest",
    "warn_always": False,
}


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    if not isinstance(mode, bool):
        raise RuntimeError(f"use_deterministic_algorithms expects a bool, but got {type(mode)}")
    _flags["deterministic"], _flags["warn_only"] = mode, bool(warn_only)


def are_deterministic_algorithms_enabled() -> bool:
    return bool(_flags["deterministic"])


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    return bool(_flags["warn_only"])


_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_deterministic_debug_mode(debug_mode: str | int) -> None:
    if isinstance(debug_mode, str):
        if debug_mode not in _DEBUG_MODES:
            raise RuntimeError(
                "invalid value of debug_mode, expected one of `default`, `warn`, `error`, but "
                f"got {debug_mode}"
            )
        debug_mode = _DEBUG_MODES[debug_mode]
    if debug_mode not in (0, 1, 2):
        raise RuntimeError(
            f"invalid value of debug_mode, expected 0, 1, or 2, but got {debug_mode}"
        )
    use_deterministic_algorithms(debug_mode > 0, warn_only=debug_mode == 1)


def get_deterministic_debug_mode() -> int:
    if not _flags["deterministic"]:
        return 0
    return 1 if _flags["warn_only"] else 2


def set_float32_matmul_precision(precision: str) -> None:
    if precision not in ("highest", "high", "medium"):
        raise RuntimeError(
            f"Invalid precision {precision}: expected one of 'highest', 'high', 'medium'"
        )
    _flags["matmul_precision"] = precision


def get_float32_matmul_precision() -> str:
    return str(_flags["matmul_precision"])


def is_anomaly_enabled() -> bool:
    return _anomaly.is_anomaly_enabled()


def is_anomaly_check_nan_enabled() -> bool:
    return _anomaly.is_anomaly_check_nan_enabled()


def set_anomaly_enabled(enabled: bool, check_nan: bool = True) -> None:
    """Anomaly mode on or off for the calling thread (``autograd.set_detect_anomaly``'s
    effect, without a context)."""
    _anomaly.set_detect_anomaly(enabled, check_nan)


def set_warn_always(b: bool) -> None:
    """Stored only (PyTorch's warn-once warnings)."""
    _flags["warn_always"] = bool(b)


def is_warn_always_enabled() -> bool:
    return bool(_flags["warn_always"])
