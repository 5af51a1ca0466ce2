"""The ``foreach``/``fused`` path of the elementwise optimizers: which parameters one
multi-tensor kernel updates, and the bookkeeping around the kernel call.

PyTorch's optimizers take ``foreach=`` and ``fused=``: with either, all parameters of a group
update together instead of one tensor at a time.  fusegrad does the same on the CPU with one
numba kernel per (group, dtype) (``optim/_multi_tensor.py``), bit for bit equal to the
per-parameter update.  The choice, as PyTorch makes it per group:

* ``fused=True``: the multi-tensor kernel (PyTorch's fused kernel; here they are one);
* ``foreach=True``: the multi-tensor kernel;
* both None (the default): the multi-tensor kernel.  PyTorch defaults to foreach only for CUDA
  tensors because its CPU foreach ops are loops of single-tensor ops; fusegrad's CPU kernel is
  the fast path, and its results are the same bits, so nothing but the speed tells;
* ``foreach=False``, or ``fused=False`` with ``foreach`` None: one parameter at a time.

Within a group the kernel takes the parameters it can update directly: dense float32/float64
numpy arrays, C-contiguous and writable, whose gradient and state buffers have the parameter's
dtype and layout.  The others (CUDA tensors, half and complex dtypes, sparse gradients,
strided or read-only memory) go through the per-parameter update, as PyTorch's foreach falls
back to per-tensor work for them; the results are the same either way.  While a tracer is
installed (a whole step being recorded, a compiled region) every parameter takes the
per-parameter path, whose tensor ops the tracer sees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..autograd.tracer import state as _tracer_state
from ..tensor import Tensor

_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def wanted(group: dict[str, Any]) -> bool:
    """Whether ``group``'s options ask for the multi-tensor update (PyTorch's choice between
    ``fused``, ``foreach`` and the for-loop) and no tracer is watching."""
    if _tracer_state.tracer is not None:
        return False
    fused = group.get("fused")
    if fused:
        return True
    foreach = group.get("foreach")
    if foreach is None:
        return fused is None
    return bool(foreach)


def check_fused(group: dict[str, Any], params: Sequence[Tensor]) -> None:
    """PyTorch's check of ``fused=True`` at a step: every parameter a floating point tensor."""
    if not group.get("fused"):
        return
    for p in params:
        if not p.is_floating_point():
            raise RuntimeError(
                "`fused=True` requires all the params to be floating point Tensors of supported "
                f"devices: ['cpu', 'cuda'] but {p.dtype} and {p.device.type}"
            )


def check_options(foreach: bool | None, fused: bool | None) -> None:
    """PyTorch's constructor check: ``fused`` and ``foreach`` exclude each other."""
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")


def updated(
    optimizer: Any,
    group: dict[str, Any],
    multi_tensor: Callable[[dict[str, Any], np.dtype, list[Tensor]], list[Tensor]],
) -> list[Tensor]:
    """Run ``multi_tensor(group, dtype, params)`` for each dtype of ``group``'s parameters the
    kernel takes (when the group wants it) and return the parameters with a gradient left to
    the per-parameter update: all of them on the for-loop path; the others, plus those
    ``multi_tensor`` gave back (state it cannot take), on the multi-tensor path."""
    params = group["params"]
    if not wanted(group):
        return [p for p in params if p.grad is not None]
    check_fused(group, [p for p in params if p.grad is not None])
    by_dtype, rest = split(params)
    for dtype, chosen in by_dtype.items():
        rest.extend(multi_tensor(group, dtype, chosen))
    return rest


def _direct(t: Tensor, dtype: np.dtype) -> bool:
    """Whether the kernel may read and write ``t``'s memory as ``dtype`` elements."""
    data = t._data
    return (
        type(data) is np.ndarray
        and data.dtype == dtype
        and data.flags.c_contiguous
        and data.flags.writeable
        and not getattr(t, "is_sparse", False)
    )


def split(params: Sequence[Tensor]) -> tuple[dict[np.dtype, list[Tensor]], list[Tensor]]:
    """The parameters with a gradient, as ``({dtype: params the kernel takes}, the others)``;
    each list keeps the group's order."""
    by_dtype: dict[np.dtype, list[Tensor]] = {}
    rest: list[Tensor] = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        data = p._data
        dtype = getattr(data, "dtype", None)
        if dtype in _KERNEL_DTYPES and _direct(p, dtype) and _direct(g, dtype):
            if g._data is not data and g._data.shape == data.shape:
                by_dtype.setdefault(dtype, []).append(p)
                continue
        rest.append(p)
    return by_dtype, rest


def address(t: Tensor) -> int:
    """The address of ``t``'s first element."""
    return t._data.__array_interface__["data"][0]


def launch(
    kernel: Callable[..., None],
    rows: list[list[Tensor]],
    scalars: list[Sequence[float]],
    dtype: np.dtype,
    *flags: Any,
) -> None:
    """Run ``kernel`` over ``rows`` (per parameter: the parameter, its gradient, its state
    buffers, all of one size and ``dtype``) with per-parameter ``scalars`` (cast to ``dtype``,
    as eager casts a Python number meeting the tensor), then bump the version of every tensor
    written (each row but the gradient)."""
    addresses = np.array([[address(t) for t in row] for row in rows], dtype=np.int64)
    sizes = np.array([row[0]._data.size for row in rows], dtype=np.int64)
    values = np.array(scalars, dtype=np.float64).astype(dtype)
    kernel(addresses, sizes, values, *flags)
    for row in rows:
        row[0]._version_counter.bump()
        for t in row[2:]:
            t._version_counter.bump()


def fits(p: Tensor, buffers: Sequence[Tensor]) -> bool:
    """Whether ``p``'s state ``buffers`` can be passed to the kernel alongside ``p``."""
    dtype = p._data.dtype
    return all(_direct(b, dtype) and b._data.shape == p._data.shape for b in buffers)


def count_step(step: Tensor) -> float:
    """``step.add_(1)`` (a state's 0-d step counter) and its new value as a Python float."""
    data = step._data
    np.add(data, 1, out=data)
    step._version_counter.bump()
    return float(data)


def kernels() -> Any:
    """The kernel module (numba loads with it, at the first multi-tensor update)."""
    from . import _multi_tensor

    return _multi_tensor
