"""Creation functions and random numbers (tensor, zeros, arange, randn, Generator, ...).

Creation results are leaves; ``requires_grad=True`` is accepted for floating dtypes.  Random
numbers come from a ``Generator`` (numpy PCG64 underneath, ``fusegrad.random``, re-exported
here); ``manual_seed`` seeds the default one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import storage as _storage
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import notify_created_as as _created_as
from ..autograd.tracer import notify_from_data as _from_data
from ..autograd.tracer import notify_host_read as _read
from ..autograd.tracer import state as _tracer_state
from ..cuda.array import CudaArray, to_device
from ..device import CPU, as_device
from ..errors import ArgumentError, DTypeError
from ..layouts import check_factory_options
from ..random import (  # noqa: F401  (re-exported: the op surface's random functions)
    Generator,
    _gen,
    default_generator,
    get_rng_state,
    manual_seed,
    seed,
    set_rng_state,
)
from ..tensor import Tensor, _to_array  # (re-exported: Tensor(data) needs it too)
from ._util import shape_arg


def _filled(shape: Any, value: Any, dtype: np.dtype, device: Any) -> Any:
    """An array of ``shape`` filled with ``value``, made where ``device`` says (no copy)."""
    return _storage.full(shape, value, dtype, device is not CPU)


def _full(shape: Any, value: Any, dtype: np.dtype, device: Any, requires_grad: bool) -> Tensor:
    """A new leaf of ``shape`` filled with ``value`` -- or, when this thread's tracer makes
    constants itself (``Tracer.full``), the tracer's (only for leaves that need no grad)."""
    tracer = _tracer_state.tracer
    if tracer is not None and not requires_grad:
        out = tracer.full(tuple(shape), value, _dt.from_numpy_dtype(np.dtype(dtype)), device)
        if out is not NotImplemented:
            return out  # type: ignore[no-any-return]
    return _leaf(_filled(shape, value, dtype, device), requires_grad)


def _leaf(arr: Any, requires_grad: bool, device: Any = CPU) -> Tensor:
    """A new leaf holding ``arr``, copied to ``device`` when that is a GPU."""
    if device is not CPU and type(arr) is not CudaArray:
        arr = to_device(arr)
    t = Tensor._make(arr)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _dtype_or_default(dtype: Any) -> _dt.dtype:
    return _dt.get_default_dtype() if dtype is None else _dt.as_dtype(dtype)


def tensor(
    data: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False
) -> Tensor:
    dev = as_device(device)
    t = _leaf(_to_array(data, dtype), requires_grad, dev)
    if _tracer_state.tracer is not None and not isinstance(data, (Tensor, np.ndarray)):
        _from_data(t, data)
    return t


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    if isinstance(data, Tensor):
        out = data if dtype is None else data.to(_dt.as_dtype(dtype))
        return out if device is None else out.to(device)
    dev = as_device(device)
    if isinstance(data, np.ndarray) and _dt.is_stored(data.dtype) and dev is CPU:
        if dtype is None or _dt.as_dtype(dtype).np == data.dtype:
            return Tensor._make(data)
    return tensor(data, dtype=dtype, device=dev)


def asarray(
    obj: Any,
    *,
    dtype: Any = None,
    device: Any = None,
    copy: bool | None = None,
    requires_grad: bool = False,
) -> Tensor:
    """``obj`` as a tensor, sharing its memory where it can (a tensor, a numpy array or
    anything with ``__array__``/``__dlpack__`` of a dtype fusegrad stores, on the CPU) unless
    ``copy``; ``copy=False`` refuses where a copy would be needed."""
    if isinstance(obj, Tensor):
        out = obj
        if dtype is not None and _dt.as_dtype(dtype) is not obj.dtype:
            if copy is False:
                raise ValueError("asarray: a dtype change needs a copy, but copy=False")
            out = out.to(_dt.as_dtype(dtype))
        if device is not None and as_device(device) != out.device:
            if copy is False:
                raise ValueError("asarray: a device change needs a copy, but copy=False")
            out = out.to(device)
        if copy and out is obj:
            out = obj.clone()
        if requires_grad:
            out = out.detach().requires_grad_(True) if out is obj else out.requires_grad_(True)
        return out
    arr = None
    if hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray):
        arr = np.from_dlpack(obj)
    elif isinstance(obj, np.ndarray) or hasattr(obj, "__array__"):
        arr = np.asarray(obj)
    if arr is not None and _dt.is_stored(arr.dtype) and dtype is None:
        dev = as_device(device)
        if copy:
            arr = arr.copy()
        elif dev is not CPU and copy is False:
            raise ValueError("asarray: moving to a device needs a copy, but copy=False")
        return _leaf(arr, requires_grad, dev)
    if copy is False:
        raise ValueError(f"asarray: {type(obj).__name__} cannot be used without a copy")
    return tensor(obj, dtype=dtype, device=device, requires_grad=requires_grad)


def frombuffer(
    buffer: Any,
    *,
    dtype: Any,
    count: int = -1,
    offset: int = 0,
    requires_grad: bool = False,
) -> Tensor:
    """A 1-D tensor over the bytes of a Python buffer (shared, not copied): ``count`` items of
    ``dtype`` from byte ``offset`` (all of them by default)."""
    dt = _dt.as_dtype(dtype)
    arr = np.frombuffer(buffer, dtype=dt.np, count=count, offset=offset)
    return _leaf(arr, requires_grad, CPU)


def from_dlpack(ext_tensor: Any) -> Tensor:
    """A tensor sharing the memory of a DLPack-capable CPU array (numpy, PyTorch, JAX, ...)."""
    arr = np.from_dlpack(ext_tensor)
    if not _dt.is_stored(arr.dtype):
        raise DTypeError(f"from_dlpack: fusegrad has no dtype for {arr.dtype}")
    return Tensor._make(arr)


def to_dlpack(tensor: Tensor) -> Any:
    """A DLPack capsule of a CPU tensor's memory (shared), for ``from_dlpack`` elsewhere."""
    data = tensor._data
    if not isinstance(data, np.ndarray):
        raise RuntimeError("to_dlpack: only CPU tensors are exported (copy with .cpu() first)")
    return data.__dlpack__()


def from_numpy(array: np.ndarray) -> Tensor:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected np.ndarray, got {type(array).__name__}")
    if not _dt.is_stored(array.dtype):
        raise DTypeError(
            f"from_numpy: can't convert np.ndarray of type {array.dtype}. The only supported "
            f"types are: {', '.join(d.name for d in _dt.ALL if d is not _dt.bool_)}, and bool."
        )
    return Tensor._make(array)


def zeros(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    dev = as_device(device)
    return _full(shape_arg(size), 0, _dtype_or_default(dtype).np, dev, requires_grad)


def ones(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    dev = as_device(device)
    return _full(shape_arg(size), 1, _dtype_or_default(dtype).np, dev, requires_grad)


def empty(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    dev = as_device(device)
    return _leaf(np.empty(shape_arg(size), _dtype_or_default(dtype).np), requires_grad, dev)


def full(
    size: Sequence[int],
    fill_value: Any,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    dev = as_device(device)
    dt = _dt.as_dtype(dtype) if dtype is not None else _dt.result_type(fill_value)
    return _full(shape_arg((size,)), fill_value, dt.np, dev, requires_grad)


def _like_dtype(t: Tensor, dtype: Any) -> _dt.dtype:
    return t.dtype if dtype is None else _dt.as_dtype(dtype)


def _like_device(t: Tensor, device: Any) -> Any:
    return t.device if device is None else as_device(device)


def zeros_like(
    input: Tensor,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    **layout: Any,  # layout=, memory_format=: fusegrad has one of each
) -> Tensor:
    check_factory_options("zeros_like", layout)
    dt, dev = _like_dtype(input, dtype), _like_device(input, device)
    return _full(input.shape, 0, dt.np, dev, requires_grad)


def ones_like(
    input: Tensor,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    **layout: Any,
) -> Tensor:
    check_factory_options("ones_like", layout)
    dt, dev = _like_dtype(input, dtype), _like_device(input, device)
    return _full(input.shape, 1, dt.np, dev, requires_grad)


def empty_like(
    input: Tensor,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    **layout: Any,
) -> Tensor:
    check_factory_options("empty_like", layout)
    arr = np.empty(input.shape, _like_dtype(input, dtype).np)
    return _leaf(arr, requires_grad, _like_device(input, device))


def full_like(
    input: Tensor,
    fill_value: Any,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    **layout: Any,
) -> Tensor:
    check_factory_options("full_like", layout)
    dt, dev = _like_dtype(input, dtype), _like_device(input, device)
    return _full(input.shape, fill_value, dt.np, dev, requires_grad)


def arange(
    start: Any,
    end: Any = None,
    step: Any = 1,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    dev = as_device(device)
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    if dtype is None:
        dt = _dt.result_type(start, end, step)
    else:
        dt = _dt.as_dtype(dtype)
    n = int(np.ceil((float(end) - float(start)) / float(step)))
    arr = (np.arange(max(n, 0), dtype=np.float64) * step + start).astype(dt.np)
    t = _leaf(arr, requires_grad, dev)
    if not requires_grad and all(_plain_number(v) for v in (start, end, step)):
        # a recording may make it again at other sizes (``Tracer.created_as``)
        return _created_as(t, ("arange", _number(start), _number(end), _number(step)))
    return _created(t)


def _plain_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _number(v: Any) -> int | float:
    return v.item() if isinstance(v, np.generic) else v


def linspace(
    start: float,
    end: float,
    steps: int,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    dev = as_device(device)
    dt = _dtype_or_default(dtype)
    if dt is _dt.bool_:
        # PyTorch's NotImplementedError (a RuntimeError) for a dtype its kernel lacks
        raise NotImplementedError("\"linspace\" not implemented for 'Bool'")
    if int(steps) < 0:
        raise ArgumentError(f"linspace: number of steps must be non-negative, got {steps}")
    arr = np.linspace(start, end, int(steps)).astype(dt.np)
    return _created(_leaf(arr, requires_grad, dev))


def eye(
    n: int,
    m: int | None = None,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    dev = as_device(device)
    t = _leaf(np.eye(n, m, dtype=_dtype_or_default(dtype).np), requires_grad, dev)
    if not requires_grad and _plain_number(n) and (m is None or _plain_number(m)):
        # ones where j - i == 0 (``Tracer.created_as``: a recording may make it at other sizes)
        return _created_as(t, ("band", int(n), int(n if m is None else m), 0, "eq"))
    return _created(t)


# ---- random (generators: ``fusegrad.random``) ---------------------------------------------------
def rand(
    *size: Any,
    generator: Generator | None = None,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    dev = as_device(device)
    dt = _dtype_or_default(dtype)
    shape = shape_arg(size)

    def draw(shape: tuple = shape) -> Tensor:  # (another shape: a step over sizes redraws)
        arr = _gen(generator).random(shape, dtype=np.float64).astype(dt.np)
        return _leaf(arr, requires_grad, dev)

    draw.resizable = True  # type: ignore[attr-defined]
    return _created(draw(), draw)


def randn(
    *size: Any,
    generator: Generator | None = None,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> Tensor:
    dev = as_device(device)
    dt = _dtype_or_default(dtype)
    shape = shape_arg(size)

    def draw(shape: tuple = shape) -> Tensor:  # (another shape: a step over sizes redraws)
        return _leaf(_gen(generator).standard_normal(shape).astype(dt.np), requires_grad, dev)

    draw.resizable = True  # type: ignore[attr-defined]
    return _created(draw(), draw)


def randint(
    low: int,
    high: int | None = None,
    size: Sequence[int] = (),
    *,
    generator: Generator | None = None,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    **layout: Any,
) -> Tensor:
    check_factory_options("randint", layout)
    dev = as_device(device)
    if high is None:
        low, high = 0, low
    dt = _dt.int64 if dtype is None else _dt.as_dtype(dtype)
    shape = tuple(size)

    def draw() -> Tensor:
        arr = _gen(generator).integers(low, high, size=shape).astype(dt.np)
        return _leaf(arr, requires_grad, dev)

    return _created(draw(), draw)


def randperm(
    n: int,
    *,
    generator: Generator | None = None,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    **layout: Any,
) -> Tensor:
    check_factory_options("randperm", layout)
    dt = _dt.int64 if dtype is None else _dt.as_dtype(dtype)
    dev = as_device(device)

    def draw() -> Tensor:
        return _leaf(_gen(generator).permutation(n).astype(dt.np), requires_grad, dev)

    return _created(draw(), draw)


def rand_like(
    input: Tensor,
    *,
    dtype: Any = None,
    generator: Generator | None = None,
    device: Any = None,
    requires_grad: bool = False,
    **layout: Any,
) -> Tensor:
    check_factory_options("rand_like", layout)
    return rand(
        *input.shape,
        dtype=_like_dtype(input, dtype),
        generator=generator,
        device=_like_device(input, device),
        requires_grad=requires_grad,
    )


def randn_like(
    input: Tensor,
    *,
    dtype: Any = None,
    generator: Generator | None = None,
    device: Any = None,
    requires_grad: bool = False,
    **layout: Any,
) -> Tensor:
    check_factory_options("randn_like", layout)
    return randn(
        *input.shape,
        dtype=_like_dtype(input, dtype),
        generator=generator,
        device=_like_device(input, device),
        requires_grad=requires_grad,
    )


def bernoulli(p: Tensor, *, generator: Generator | None = None) -> Tensor:
    if _tracer_state.tracer is not None:
        _read(p, "bernoulli()")  # (probabilities read on the host)
    u = _gen(generator).random(p.shape)
    return _leaf((u < _storage.to_host(p._data)).astype(p.dtype.np), False, p.device)
