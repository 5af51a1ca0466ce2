"""Collectives and point-to-point on tensors, as ``torch.distributed``'s, on MPI.

Buffers: a contiguous CPU tensor is handed to MPI as its own numpy array -- no copy; results
land in place in the tensor's array, and the output tensor's version counter is bumped when the
call is issued, as an in-place op would.  A non-contiguous tensor is staged through a contiguous
copy (written back when the work completes).  CUDA tensors always go through host buffers:
copied to the host before the call and back to the device when it completes, even where the MPI
library is CUDA-aware (``cuda_aware_mpi()`` says whether it is).

Ranks: ``src``/``dst`` arguments are global ranks, as in PyTorch; ``group=None`` is the default
group; a process outside ``group`` does nothing and gets None.  Every call is MPI's
non-blocking one; ``async_op=True`` returns its ``Work``, otherwise the call waits for it (with
the group's timeout) and returns None (``recv``: the sender's rank).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..cuda.array import copy_into, to_device
from ..storage import is_host, may_share_memory, to_host
from ..tensor import Tensor
from .process_group import (
    DistError,
    ProcessGroup,
    ReduceOp,
    Work,
    _mpi,
    _resolve,
)


# -- buffers ---------------------------------------------------------------------------------------
def _check_tensor(t: Any, op: str, what: str = "tensor") -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: expected a fusegrad.Tensor for {what}, got {type(t).__name__}")
    return t


def _describe(t: Tensor) -> str:
    return f"{tuple(t.shape)} {t.dtype.name}"


def _source(t: Tensor) -> np.ndarray:
    """An array MPI may read for ``t``: the tensor's own array when it is a contiguous CPU
    array, else a contiguous host copy.  Callers keep it referenced from the ``Work``'s finish
    step (``lambda: source``) so a staged copy outlives the non-blocking call."""
    data = t._data
    if type(data) is np.ndarray and data.flags.c_contiguous:
        return data
    return np.ascontiguousarray(to_host(data))


def _write_back(t: Tensor, host: np.ndarray) -> None:
    """Store ``host`` (of ``t``'s shape or size) into ``t``'s storage, on its device."""
    data = t._data
    if is_host(data):
        np.copyto(data, host.reshape(data.shape), casting="unsafe")
    else:
        copy_into(data, to_device(np.ascontiguousarray(host.reshape(data.shape))))


def _target(t: Tensor, op: str, read: bool = True) -> tuple[np.ndarray, Callable[[], None] | None]:
    """An array MPI may write ``t``'s result into, and what copies it back into ``t`` when it
    is staged (None when MPI writes the tensor's own array).  Bumps ``t``'s version: the call
    changes it in place.  ``read=False``: the current contents are not needed (output only)."""
    data = t._data
    if is_host(data) and not data.flags.writeable:
        raise DistError(
            f"{op}: the output tensor {_describe(t)} is read-only (an expanded view?); pass a "
            f"tensor that owns its memory"
        )
    t._bump()
    if type(data) is np.ndarray and data.flags.c_contiguous:
        return data, None
    if read:
        host = np.ascontiguousarray(to_host(data))
        if host is data or (is_host(data) and np.may_share_memory(host, data)):
            host = host.copy()
    else:
        host = np.empty(data.shape, data.dtype)
    return host, lambda: _write_back(t, host)


def _chain(*steps: Callable[[], Any] | None) -> Callable[[], Any] | None:
    todo = [s for s in steps if s is not None]
    if not todo:
        return None

    def run() -> Any:
        out = None
        for step in todo:
            out = step()
        return out

    return run


def _mpi_op(op: Any, dtype: np.dtype, name: str) -> Any:
    MPI = _mpi()
    if not isinstance(op, ReduceOp):
        raise TypeError(f"{name}: op must be a ReduceOp, got {op!r}")
    if dtype == np.bool_:  # PyTorch's bool reductions: SUM/MAX are "or", MIN/PRODUCT "and"
        if op is ReduceOp.AVG:
            raise TypeError(f"{name}: ReduceOp.AVG needs a floating point tensor, got bool")
        return MPI.LOR if op in (ReduceOp.SUM, ReduceOp.MAX) else MPI.LAND
    if op is ReduceOp.AVG and dtype.kind != "f":
        raise TypeError(
            f"{name}: ReduceOp.AVG needs a floating point tensor, got {dtype.name} (use SUM and "
            f"divide)"
        )
    return {
        ReduceOp.SUM: MPI.SUM,
        ReduceOp.AVG: MPI.SUM,
        ReduceOp.PRODUCT: MPI.PROD,
        ReduceOp.MIN: MPI.MIN,
        ReduceOp.MAX: MPI.MAX,
    }[op]


def _average(host: np.ndarray, pg: ProcessGroup) -> Callable[[], None]:
    def divide() -> None:
        np.divide(host, pg.size(), out=host)

    return divide


def _finish(work: Work, async_op: bool) -> Work | None:
    if async_op:
        return work
    work.wait()
    return None


def _same(a: Tensor, b: Tensor) -> bool:
    return a.dtype == b.dtype and a.is_cuda == b.is_cuda


# -- collectives ---------------------------------------------------------------------------------
def all_reduce(
    tensor: Tensor, op: ReduceOp = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> Work | None:
    """Reduce ``tensor`` over the group; every process gets the result, in place."""
    name = "all_reduce"
    _check_tensor(tensor, name)
    pg = _resolve(group, name)
    if pg is None:
        return None
    mpi_op = _mpi_op(op, tensor._data.dtype, name)
    host, back = _target(tensor, name)
    request = pg.comm.Iallreduce(_mpi().IN_PLACE, host, op=mpi_op)
    avg = _average(host, pg) if op is ReduceOp.AVG else None
    return _finish(Work([request], name, pg.timeout, _chain(avg, back)), async_op)


def reduce(
    tensor: Tensor,
    dst: int = 0,
    op: ReduceOp = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``tensor`` over the group into ``dst``'s ``tensor`` (others' are unchanged)."""
    name = "reduce"
    _check_tensor(tensor, name)
    pg = _resolve(group, name)
    if pg is None:
        return None
    root = pg.group_rank(dst, name)
    mpi_op = _mpi_op(op, tensor._data.dtype, name)
    if pg.rank() == root:
        host, back = _target(tensor, name)
        request = pg.comm.Ireduce(_mpi().IN_PLACE, host, op=mpi_op, root=root)
        avg = _average(host, pg) if op is ReduceOp.AVG else None
        return _finish(Work([request], name, pg.timeout, _chain(avg, back)), async_op)
    source = _source(tensor)
    request = pg.comm.Ireduce(source, None, op=mpi_op, root=root)
    return _finish(Work([request], name, pg.timeout, lambda: source), async_op)


def broadcast(
    tensor: Tensor,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Work | None:
    """``src``'s ``tensor`` copied into every other process's ``tensor`` (same shape and
    dtype everywhere)."""
    name = "broadcast"
    _check_tensor(tensor, name)
    pg = _resolve(group, name)
    if pg is None:
        return None
    root = _root(pg, src, group_src, name)
    if pg.rank() == root:
        source = _source(tensor)
        request = pg.comm.Ibcast(source, root=root)
        return _finish(Work([request], name, pg.timeout, lambda: source), async_op)
    host, back = _target(tensor, name, read=False)
    request = pg.comm.Ibcast(host, root=root)
    return _finish(Work([request], name, pg.timeout, back), async_op)


def _root(pg: ProcessGroup, src: int | None, group_src: int | None, name: str) -> int:
    if (src is None) == (group_src is None):
        raise ValueError(f"{name}: give exactly one of src (a global rank) and group_src")
    if group_src is not None:
        if not 0 <= group_src < pg.size():
            raise ValueError(f"{name}: group_src={group_src} outside a group of {pg.size()}")
        return group_src
    return pg.group_rank(src, name)  # type: ignore[arg-type]


def all_gather(
    tensor_list: list[Tensor], tensor: Tensor, group: Any = None, async_op: bool = False
) -> Work | None:
    """Every process's ``tensor`` into ``tensor_list`` (one tensor per group rank, each of
    ``tensor``'s shape and dtype), on every process."""
    name = "all_gather"
    _check_tensor(tensor, name)
    pg = _resolve(group, name)
    if pg is None:
        return None
    outputs = _check_list(tensor_list, tensor, pg, name, "tensor_list")
    source = _source(tensor)
    gathered = np.empty((pg.size(), *source.shape), source.dtype)
    for out in outputs:
        out._bump()
    request = pg.comm.Iallgather(source, gathered)

    def scatter_into_list() -> None:
        for out, part in zip(outputs, gathered):
            _write_back(out, part)

    return _finish(Work([request], name, pg.timeout, scatter_into_list), async_op)


def _check_list(tensors: Any, like: Tensor, pg: ProcessGroup, name: str, what: str) -> list[Tensor]:
    if not isinstance(tensors, (list, tuple)) or len(tensors) != pg.size():
        got = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
        raise ValueError(
            f"{name}: {what} must be a list of {pg.size()} tensors (the group size), got {got}"
        )
    for i, t in enumerate(tensors):
        _check_tensor(t, name, f"{what}[{i}]")
        if tuple(t.shape) != tuple(like.shape) or not _same(t, like):
            raise ValueError(
                f"{name}: {what}[{i}] is {_describe(t)} but the tensor is {_describe(like)}; "
                f"every tensor in {what} must have its shape, dtype and device"
            )
        if is_host(t._data) and not t._data.flags.writeable and what != "scatter_list":
            raise DistError(f"{name}: {what}[{i}] {_describe(t)} is read-only")
    return list(tensors)


def all_gather_into_tensor(
    output_tensor: Tensor, input_tensor: Tensor, group: Any = None, async_op: bool = False
) -> Work | None:
    """Every process's ``input_tensor`` into ``output_tensor``, in group-rank order: the
    inputs concatenated along dim 0 (``(world_size * n, ...)``) or stacked
    (``(world_size, n, ...)``) -- any output of ``world_size`` times the input's size."""
    name = "all_gather_into_tensor"
    _check_tensor(output_tensor, name, "output_tensor")
    _check_tensor(input_tensor, name, "input_tensor")
    pg = _resolve(group, name)
    if pg is None:
        return None
    if output_tensor.numel() != pg.size() * input_tensor.numel():
        raise ValueError(
            f"{name}: output tensor size must be equal to world_size times input tensor size: "
            f"output {_describe(output_tensor)}, input {_describe(input_tensor)}, world_size "
            f"{pg.size()}"
        )
    if not _same(output_tensor, input_tensor):
        raise TypeError(
            f"{name}: output tensor must have the same type as input tensor: output "
            f"{_describe(output_tensor)} on {output_tensor.device}, input "
            f"{_describe(input_tensor)} on {input_tensor.device}"
        )
    source = _source(input_tensor)
    host, back = _target(output_tensor, name, read=False)
    if may_share_memory(source, host):  # MPI forbids overlapping send and receive buffers
        source = source.copy()
    request = pg.comm.Iallgather(source, host)
    return _finish(Work([request], name, pg.timeout, _chain(lambda: source, back)), async_op)


def reduce_scatter_tensor(
    output: Tensor,
    input: Tensor,
    op: ReduceOp = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``input`` over the group and give group rank ``i`` the ``i``-th of
    ``world_size`` equal parts (``input`` is ``world_size`` times ``output``'s size; parts are
    consecutive elements, i.e. chunks of dim 0)."""
    name = "reduce_scatter_tensor"
    _check_tensor(output, name, "output")
    _check_tensor(input, name, "input")
    pg = _resolve(group, name)
    if pg is None:
        return None
    if input.numel() != pg.size() * output.numel():
        raise ValueError(
            f"{name}: input tensor must be the same size as output size times world size: "
            f"input {_describe(input)}, output {_describe(output)}, world_size {pg.size()}"
        )
    if not _same(output, input):
        raise TypeError(
            f"{name}: input tensor must be the same type as the output tensor: input "
            f"{_describe(input)}, output {_describe(output)}"
        )
    mpi_op = _mpi_op(op, input._data.dtype, name)
    source = _source(input)
    host, back = _target(output, name, read=False)
    if may_share_memory(source, host):
        source = source.copy()
    request = pg.comm.Ireduce_scatter_block(source, host, op=mpi_op)
    avg = _average(host, pg) if op is ReduceOp.AVG else None
    return _finish(Work([request], name, pg.timeout, _chain(lambda: source, avg, back)), async_op)


def gather(
    tensor: Tensor,
    gather_list: list[Tensor] | None = None,
    dst: int = 0,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Every process's ``tensor`` into ``dst``'s ``gather_list`` (one per group rank); other
    processes pass no ``gather_list``."""
    name = "gather"
    _check_tensor(tensor, name)
    pg = _resolve(group, name)
    if pg is None:
        return None
    root = pg.group_rank(dst, name)
    source = _source(tensor)
    if pg.rank() != root:
        if gather_list:
            raise ValueError(
                f"{name}: Argument ``gather_list`` must NOT be specified on non-destination ranks."
            )
        request = pg.comm.Igather(source, None, root=root)
        return _finish(Work([request], name, pg.timeout, lambda: source), async_op)
    if gather_list is None:
        raise ValueError(f"{name}: Argument ``gather_list`` must be specified on destination rank.")
    outputs = _check_list(gather_list, tensor, pg, name, "gather_list")
    gathered = np.empty((pg.size(), *source.shape), source.dtype)
    for out in outputs:
        out._bump()
    request = pg.comm.Igather(source, gathered, root=root)

    def into_list() -> None:
        for out, part in zip(outputs, gathered):
            _write_back(out, part)

    return _finish(Work([request], name, pg.timeout, into_list), async_op)


def scatter(
    tensor: Tensor,
    scatter_list: list[Tensor] | None = None,
    src: int = 0,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """``src``'s ``scatter_list[i]`` into group rank ``i``'s ``tensor``; other processes pass
    no ``scatter_list``."""
    name = "scatter"
    _check_tensor(tensor, name)
    pg = _resolve(group, name)
    if pg is None:
        return None
    root = pg.group_rank(src, name)
    packed = None
    if pg.rank() == root:
        if scatter_list is None:
            raise ValueError(f"{name}: Argument ``scatter_list`` must be specified on source rank.")
        parts = _check_list(scatter_list, tensor, pg, name, "scatter_list")
        packed = np.stack([to_host(p._data) for p in parts]) if parts else None
    elif scatter_list:
        raise ValueError(
            f"{name}: Argument ``scatter_list`` must NOT be specified on non-source ranks."
        )
    host, back = _target(tensor, name, read=False)
    request = pg.comm.Iscatter(packed, host, root=root)
    return _finish(Work([request], name, pg.timeout, _chain(lambda: packed, back)), async_op)


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None) -> Work | None:
    """Wait until every process of the group has called ``barrier``."""
    name = "barrier"
    pg = _resolve(group, name)
    if pg is None:
        return None
    return _finish(Work([pg.comm.Ibarrier()], name, pg.timeout), async_op)


# -- point to point ------------------------------------------------------------------------------
def isend(tensor: Tensor, dst: int, group: Any = None, tag: int = 0) -> Work | None:
    """Send ``tensor`` to global rank ``dst`` without waiting; keep it unchanged until the
    returned work completes."""
    name = "isend"
    _check_tensor(tensor, name)
    pg = _resolve(group, name)
    if pg is None:
        return None
    peer = pg.group_rank(dst, name)
    if peer == pg.rank():
        raise ValueError(
            f"{name}: Invalid destination rank: should not be the same as the rank of the "
            f"current process ({dst})."
        )
    source = _source(tensor)
    request = pg.comm.Isend(source, dest=peer, tag=tag)
    return Work([request], name, pg.timeout, lambda: source)


def irecv(tensor: Tensor, src: int | None = None, group: Any = None, tag: int = 0) -> Work | None:
    """Receive into ``tensor`` from global rank ``src`` (any process when None) without
    waiting; after ``wait()``, ``work.source_rank()`` is the sender's global rank."""
    name = "irecv"
    _check_tensor(tensor, name)
    pg = _resolve(group, name)
    if pg is None:
        return None
    MPI = _mpi()
    peer = MPI.ANY_SOURCE if src is None else pg.group_rank(src, name)
    host, back = _target(tensor, name, read=False)
    status = MPI.Status()
    request = pg.comm.Irecv(host, source=peer, tag=tag)

    def received() -> int:
        if back is not None:
            back()
        return pg.ranks[status.Get_source()]

    return _RecvWork([request], name, pg.timeout, received, [status])


class _RecvWork(Work):
    def source_rank(self) -> int:
        if not self._done:
            raise DistError("irecv: source_rank() is known once the work has completed (wait())")
        return int(self.result_value)

    _source_rank = source_rank  # PyTorch's private spelling


def send(tensor: Tensor, dst: int, group: Any = None, tag: int = 0) -> None:
    """Send ``tensor`` to global rank ``dst`` and wait until it has left this process."""
    work = isend(tensor, dst, group, tag)
    if work is not None:
        work.wait()


def recv(tensor: Tensor, src: int | None = None, group: Any = None, tag: int = 0) -> int:
    """Receive into ``tensor`` from ``src`` (any process when None); returns the sender's
    global rank (-1 for a process outside ``group``)."""
    work = irecv(tensor, src, group, tag)
    if work is None:
        return -1
    work.wait()
    return int(work.result_value)


# -- Python objects ------------------------------------------------------------------------------
def broadcast_object_list(object_list: list, src: int = 0, group: Any = None) -> None:
    """``src``'s picklable objects into every process's ``object_list`` (same length)."""
    pg = _resolve(group, "broadcast_object_list")
    if pg is None:
        return
    objects = pg.comm.bcast(list(object_list), root=pg.group_rank(src, "broadcast_object_list"))
    object_list[:] = objects


def all_gather_object(object_list: list, obj: Any, group: Any = None) -> None:
    """Every process's picklable ``obj`` into ``object_list`` (one slot per group rank)."""
    pg = _resolve(group, "all_gather_object")
    if pg is None:
        return
    if len(object_list) != pg.size():
        raise ValueError(
            f"all_gather_object: object_list must have {pg.size()} slots (the group size), got "
            f"{len(object_list)}"
        )
    object_list[:] = pg.comm.allgather(obj)
