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
back to per-tensor work for them; the results are the same either way.

Tracers: a whole-step recording never sees a multi-tensor ``step()`` run inside it -- such an
optimizer is not ``traceable`` (``records_per_parameter``), so the recording replays its
``step()`` as a call after the program, and the kernel runs there; a tracer that must see the
update's tensor ops gets the per-parameter path (``wanted``); a compiled-backward region, which
records only ops that make graph nodes, lets the kernel run.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..autograd.graph_base import graph_changed
from ..autograd.tracer import state as _tracer_state
from ..autograd.tracer import tracer_threads as _tracer_threads
from ..tensor import Tensor

_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def chosen(group: dict[str, Any]) -> bool:
    """Whether ``group``'s options ask for the multi-tensor update (PyTorch's choice between
    ``fused``, ``foreach`` and the for-loop)."""
    fused = group.get("fused")
    if fused:
        return True
    foreach = group.get("foreach")
    if foreach is None:
        return fused is None
    return bool(foreach)


def wanted(group: dict[str, Any]) -> bool:
    """Whether ``group`` takes the multi-tensor update now: chosen by its options, and no
    tracer needs to see the update's tensor ops (a tracer that declares
    ``sees_updates = False`` -- a compiled-backward region, which records only ops that make
    graph nodes -- lets the kernel run)."""
    tracer = _tracer_state.tracer if _tracer_threads else None  # (see ``tracer_threads``)
    if tracer is not None and getattr(tracer, "sees_updates", True):
        return False
    return chosen(group)


def records_per_parameter(optimizer: Any) -> bool:
    """``Optimizer.traceable`` of the optimizers with a multi-tensor update: a whole-step
    compile records the update's tensor ops into the step's program only when no group takes
    the multi-tensor path; otherwise ``step()`` is replayed as a call after the program, which
    runs the kernel (one call per group and dtype, bit for bit eager's update)."""
    return not any(chosen(group) for group in optimizer.param_groups)


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
    if group.get("fused"):
        check_fused(group, [p for p in params if p.grad is not None])
    by_dtype, rest = split(params)
    for dtype, chosen in by_dtype.items():
        rest.extend(multi_tensor(group, dtype, chosen))
    return rest


def split(params: Sequence[Tensor]) -> tuple[dict[np.dtype, list[Tensor]], list[Tensor]]:
    """The parameters with a gradient, as ``({dtype: params the kernel may take}, the others)``
    (``launch`` checks the rest of what the kernel needs); each list keeps the group's order."""
    by_dtype: dict[np.dtype, list[Tensor]] = {}
    rest: list[Tensor] = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        data = p._data
        if type(data) is np.ndarray and data.dtype in _KERNEL_DTYPES and not g.is_sparse:
            by_dtype.setdefault(data.dtype, []).append(p)
        else:
            rest.append(p)
    return by_dtype, rest


def address(array: np.ndarray) -> int:
    """The address of the first element of ``array``, a C-contiguous float32 or float64 array
    (``_usable``; its flat view has it: one compiled signature per dtype)."""
    return _native["address"](array.ravel())  # type: ignore[no-any-return]


def _usable(array: Any, dtype: np.dtype, shape: tuple) -> bool:
    """Whether the kernel may read and write ``array`` as ``shape`` elements of ``dtype``."""
    return (
        type(array) is np.ndarray
        and array.dtype == dtype
        and array.shape == shape
        and array.flags.c_contiguous
        and array.flags.writeable
    )


class _Plan:
    """The addresses of one kernel call's arrays, kept between steps: the arrays (as weak
    references, so that a gradient set to None is freed) and their addresses.  Finding a
    parameter, its state and (when not set to None between steps) its gradient to be the same
    arrays as last time costs an identity check instead of the checks and the address look-up
    of a new array.  The per-row element counts are kept too (noted with each new parameter
    array)."""

    __slots__ = ("addresses", "refs", "sizes")

    def __init__(self, rows: int, columns: int) -> None:
        self.addresses = np.zeros((rows, columns), dtype=np.int64)
        self.refs: list[list[Any]] = [[None] * columns for _ in range(rows)]
        self.sizes = np.zeros(rows, dtype=np.int64)


def _admit(plan: _Plan, i: int, row: list[np.ndarray], dtype: np.dtype, counted: bool) -> bool:
    """Check the arrays of ``row`` the plan has not seen at row ``i`` (the parameter, its
    gradient, its 0-d float32 step counter where ``counted``, its buffers: of the parameter's
    shape and ``dtype``, C-contiguous, writable, the gradient not the parameter's memory) and
    note their addresses; False when one does not pass."""
    known, addresses = plan.refs[i], plan.addresses
    shape = row[0].shape
    for k, array in enumerate(row):
        ref = known[k]
        if ref is not None and ref() is array:
            continue
        if k == 2 and counted:
            ok = _usable(array, _COUNT32, ())  # the step counter
        else:
            ok = _usable(array, dtype, shape)
        if not ok:
            known[k] = None
            return False
        known[k] = weakref.ref(array)
        addresses[i, k] = address(array)
        if k == 0:
            plan.sizes[i] = array.size
    return addresses[i, 1] != addresses[i, 0]


def launch(
    optimizer: Any,
    group: dict[str, Any],
    kernel: Callable[..., None],
    rows: list[list[Tensor]],
    scalars: list[Sequence[float]],
    dtype: np.dtype,
    *flags: Any,
    counted: bool = True,
) -> list[Tensor]:
    """Run ``kernel`` over ``rows`` (per parameter: the parameter, its gradient, then for the
    optimizers that count steps (``counted``) its 0-d float32 ``step``, then its state buffers) with
    per-parameter ``scalars`` (cast to ``dtype``, as eager casts a Python number meeting the
    tensor), then bump the version of every tensor written (all but the gradient; the kernel
    adds one to each step itself).  Returns the parameters of the rows the kernel cannot take
    (left to the per-parameter update, before anything of theirs was written)."""
    if not rows:
        return []
    plans = optimizer.__dict__.setdefault("_foreach_plans", {})
    # by the group's position (a loaded state dict makes new group dicts; the plan then finds
    # new arrays and looks their addresses up again)
    for position, g in enumerate(optimizer.param_groups):  # noqa: B007 - (found below)
        if g is group:
            break
    else:
        raise ValueError(f"{type(optimizer).__name__}: the parameter group is not one of its own")
    key = (position, dtype, kernel.__name__)
    columns = len(rows[0])
    plan = plans.get(key)
    if plan is None or plan.addresses.shape != (len(rows), columns):
        plan = plans[key] = _Plan(len(rows), columns)
    left: list[Tensor] = []
    taken = []
    for i, row in enumerate(rows):
        if _admit(plan, i, [t._data for t in row], dtype, counted):
            taken.append(i)
        else:
            left.append(row[0])
    if not taken:
        return left
    if len(taken) == len(rows):
        addresses, sizes = plan.addresses, plan.sizes
        values = np.array(scalars, dtype=np.float64).astype(dtype)
    else:
        addresses, sizes = plan.addresses[taken], plan.sizes[taken]
        values = np.array([scalars[i] for i in taken], dtype=np.float64).astype(dtype)
        rows = [rows[i] for i in taken]
    kernel(addresses, sizes, values, *flags)
    for row in rows:
        row[0]._version_counter.value += 1
        for t in row[2:]:
            t._version_counter.value += 1
    graph_changed()
    return left


_COUNT32 = np.dtype(np.float32)
_EXACT = 2.0**24  # below it, float32 counts add one exactly


def next_count(step: Any) -> float | None:
    """The value ``step.add_(1)`` will give a state's step counter (the kernel adds it), or
    None where the kernel cannot count it (not a 0-d float32 array in host memory)."""
    if not isinstance(step, Tensor):
        return None
    data = step._data
    if type(data) is not np.ndarray or data.dtype != _COUNT32 or data.shape != ():
        return None
    if not data.flags.writeable:
        return None
    value = float(data) + 1.0
    if value > _EXACT:
        value = float(np.float32(data) + np.float32(1))
    return value


# the kernels and ``address`` (``_multi_tensor``), filled by the first ``kernel`` call
_native: dict[str, Callable[..., Any]] = {}


def kernel(name: str) -> Callable[..., None]:
    """The multi-tensor kernel ``name`` (``sgd``, ``adam``, ...)."""
    if not _native:
        from ._multi_tensor import KERNELS, address  # numba: loaded by the first update

        _native.update(KERNELS)
        _native["address"] = address
    return _native[name]
