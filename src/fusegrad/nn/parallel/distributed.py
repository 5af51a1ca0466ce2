"""``DistributedDataParallel``: data parallel training over ``fusegrad.distributed``.

Every process holds a replica of the module and trains it on its own part of the batch; after
``backward()`` every replica's ``.grad`` is the average over the processes, so identical
optimizer steps keep the replicas identical.

How gradients travel (PyTorch's reducer, on MPI):

* At construction the parameters and buffers of rank 0 are broadcast to every process, and the
  parameters that require grad are split into buckets in *reverse* registration order (the
  order backward tends to produce them): at most ``bucket_cap_mb`` each, the first capped at
  1 MB so communication starts early, one dtype and device per bucket.
* Each parameter has a post-accumulate-grad hook.  When the last gradient of a bucket has been
  accumulated, the bucket's gradients are copied into its flat buffer and a non-blocking
  allreduce (``MPI_Iallreduce``) starts; the rest of the backward runs meanwhile.  Buckets
  start in index order (a full bucket waits for the ones before it): MPI matches collectives by
  the order each process issues them, so every process must issue them in the same order.
* The first hook of a backward queues an end-of-backward callback
  (``fusegrad.autograd.engine.queue_callback``) that waits for every bucket, divides by the
  world size and writes the averages back into each ``.grad`` (in place, or as views of the
  bucket with ``gradient_as_bucket_view=True``).  ``backward()`` returns with averaged grads.

Unused parameters: with ``find_unused_parameters=False`` a parameter that got no gradient
leaves its bucket unfinished, and the next ``forward`` raises PyTorch's "Expected to have
finished reduction in the prior iteration" error naming it.  With ``find_unused_parameters=True``
(or ``static_graph=True``) the end-of-backward callback reduces the unfinished buckets too,
contributing this process's ``.grad`` (accumulated under ``no_sync``) or zeros for its unused
parameters, and leaves ``.grad`` untouched for parameters no process used (one extra small
allreduce of a used-flag per parameter, every backward).  The bucket of a locally unused
parameter, and every bucket after it, start at the end of backward instead of overlapping it
(PyTorch finds unused parameters by walking the graph at forward time instead; not done here).

``state_dict()``: the keys carry PyTorch's ``module.`` prefix (checkpoints interchange with
torch's DDP ones); ``load_state_dict`` takes keys with or without it; ``ddp.module.state_dict()``
gives the plain keys.

``device_ids``, ``output_device``, ``dim`` and ``check_reduction`` are accepted and ignored (the
module's parameters say where it runs; inputs are not scattered).  Under compiled autograd
(and a ``fusegrad.compile``d step, which falls back to it: the hooks stop its recording) the
compiled backward runs DDP's hooks at their eager positions and its end-of-backward callback
when the program is done, so buckets overlap the rest of the program as in eager; the
allreduces are not yet steps the compiler itself schedules.  Not supported yet:
``register_comm_hook``, ``join``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ... import distributed as dist
from ...autograd import engine
from ...autograd.grad_mode import no_grad
from ...cuda.array import copy_into, to_device
from ...storage import is_host, may_share_memory, to_host
from ...tensor import Tensor
from ..module import Module

_FIRST_BUCKET_BYTES = 1024 * 1024  # PyTorch's _DEFAULT_FIRST_BUCKET_BYTES


def _on_device_of(p: Tensor, host: np.ndarray) -> Any:
    """``host`` as an array on ``p``'s device (itself for a CPU parameter)."""
    if is_host(p._data):
        return host
    return to_device(np.ascontiguousarray(host))


class _Bucket:
    """Parameters reduced together: their gradients live in one flat host buffer."""

    def __init__(self, index: int, params: list[tuple[int, str, Tensor]]) -> None:
        self.index = index
        self.params = params  # (parameter index, name, parameter), in backward order
        self.sizes = [p.numel() for _, _, p in params]
        self.offsets = np.cumsum([0, *self.sizes]).tolist()
        self.buffer = np.zeros(self.offsets[-1], params[0][2]._data.dtype)
        self.pending = len(params)
        self.ready: set[int] = set()
        self.work: dist.Work | None = None

    def view(self, k: int) -> np.ndarray:
        """The slice of the buffer holding parameter ``k``'s gradient, in its shape."""
        p = self.params[k][2]
        return self.buffer[self.offsets[k] : self.offsets[k + 1]].reshape(p._data.shape)


class DistributedDataParallel(Module):
    """Wraps ``module`` so that ``backward()`` leaves every process with the gradients averaged
    over the process group (see the module docstring).  Call it like ``module``; reach the
    wrapped module as ``.module``."""

    def __init__(
        self,
        module: Module,
        device_ids: Any = None,
        output_device: Any = None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        process_group: Any = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
    ) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise dist.DistNotInitializedError(
                "DistributedDataParallel: Default process group has not been initialized, "
                "please make sure to call init_process_group."
            )
        self.module = module
        self.process_group = process_group
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.bucket_cap_mb = 25.0 if bucket_cap_mb is None else float(bucket_cap_mb)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise RuntimeError(
                "DistributedDataParallel is not needed when a module doesn't have any parameter "
                "that requires a gradient."
            )
        self._world = dist.get_world_size(process_group)
        self._sync_params_and_buffers()
        self._buckets = self._make_buckets(named)
        self._where: dict[int, tuple[_Bucket, int]] = {}
        for bucket in self._buckets:
            for k, (_, _, p) in enumerate(bucket.params):
                self._where[id(p)] = (bucket, k)
        self._sync_this_backward = True
        self._next_bucket = 0  # the first bucket whose allreduce has not started
        self._callback_task = -1  # graph task id whose end-of-backward callback is queued
        self._unfinished: list[str] | None = None  # parameters of an unfinished reduction
        # through a weak reference: a discarded wrapper's hooks stay on the parameters but
        # do nothing (a module may be wrapped again)
        ready = weakref.WeakMethod(self._grad_ready)

        def hook(p: Tensor) -> None:
            method = ready()
            if method is not None:
                method(p)

        # a compiled whole step recognises the hook and averages the buckets itself
        hook.ddp = weakref.ref(self)  # type: ignore[attr-defined]
        for _, p in named:
            p.register_post_accumulate_grad_hook(hook)

    # -- construction ----------------------------------------------------------------------------
    def _sync_params_and_buffers(self) -> None:
        """Rank 0's parameters and buffers everywhere (in place, as PyTorch's broadcast)."""
        src = dist.get_global_rank(self._group(), 0)
        with no_grad():
            for p in self.module.parameters():
                dist.broadcast(p, src=src, group=self.process_group)
            for b in self.module.buffers():
                dist.broadcast(b, src=src, group=self.process_group)

    def _group(self) -> dist.ProcessGroup:
        pg = self.process_group
        return dist.group.WORLD if pg is None else pg  # type: ignore[return-value]

    def _make_buckets(self, named: list[tuple[str, Tensor]]) -> list[_Bucket]:
        cap = int(self.bucket_cap_mb * 1024 * 1024)
        buckets: list[_Bucket] = []
        current: list[tuple[int, str, Tensor]] = []
        size = 0
        limit = min(_FIRST_BUCKET_BYTES, cap)
        for index in reversed(range(len(named))):
            name, p = named[index]
            nbytes = p.numel() * p.element_size()
            key = (p.dtype, p.is_cuda)
            if current and (
                size + nbytes > limit or key != (current[0][2].dtype, current[0][2].is_cuda)
            ):
                buckets.append(_Bucket(len(buckets), current))
                current, size, limit = [], 0, cap
            current.append((index, name, p))
            size += nbytes
        buckets.append(_Bucket(len(buckets), current))
        return buckets

    @property
    def bucket_names(self) -> list[list[str]]:
        """The parameter names of each bucket, in the order their allreduce is expected."""
        return [[name for _, name, _ in b.params] for b in self._buckets]

    # -- forward ---------------------------------------------------------------------------------
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self._unfinished is not None:
            names = self._unfinished
            self._unfinished = None
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting a "
                "new one. This error indicates that your module has parameters that were not "
                "used in producing loss. You can enable unused parameter detection by passing "
                "the keyword argument `find_unused_parameters=True` to "
                "`fusegrad.nn.parallel.DistributedDataParallel`, and by making sure all "
                "`forward` function outputs participate in calculating loss. Parameters which "
                f"did not receive grad for rank {dist.get_rank(self.process_group)}: "
                f"{', '.join(names)}"
            )
        if self._callback_task != -1:
            self._drop_failed_backward()
        self._sync_this_backward = self.require_backward_grad_sync
        if self.broadcast_buffers and self.require_forward_param_sync and self._world > 1:
            src = dist.get_global_rank(self._group(), 0)
            with no_grad():
                for b in self.module.buffers():
                    dist.broadcast(b, src=src, group=self.process_group)
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes of forwards run inside accumulate ``.grad`` locally, without
        communication; the first backward after it reduces the accumulated gradients."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    # -- backward: the hooks and the end-of-backward callback ------------------------------------
    def _grad_ready(self, p: Tensor) -> None:
        """Post-accumulate-grad hook: mark ``p`` ready; launch its bucket when it is full."""
        if not self._sync_this_backward:
            return
        task = engine.current_graph_task_id()
        if task == -1:
            # (every backward, eager or compiled, runs as an engine task; a hook called by
            # hand is not in one: nothing would wait for its bucket)
            raise RuntimeError(
                "DistributedDataParallel: a gradient arrived outside a backward() call: no "
                "end of backward to wait for its bucket's allreduce at"
            )
        if task != self._callback_task:
            self._callback_task = task
            engine.queue_callback(self._finish_backward)
        bucket, k = self._where[id(p)]
        if k in bucket.ready:
            raise RuntimeError(
                f"Expected to mark a variable ready only once. This error is caused by one of "
                f"the following reasons: 1) Use of a module parameter outside the `forward` "
                f"function. 2) Reused parameters in multiple reentrant backward passes. "
                f"Parameter {bucket.params[k][1]} (index {bucket.params[k][0]}) has been marked "
                f"as ready twice."
            )
        bucket.ready.add(k)
        bucket.pending -= 1
        # buckets start in index order, on every process the same: MPI matches collectives by
        # the order they are issued in, so a bucket that fills early waits for its elders
        buckets = self._buckets
        while self._next_bucket < len(buckets) and buckets[self._next_bucket].pending == 0:
            self._launch(buckets[self._next_bucket])
            self._next_bucket += 1

    def _launch(self, bucket: _Bucket) -> None:
        for k, (_, _, p) in enumerate(bucket.params):
            target = bucket.view(k)
            grad = p.grad
            if grad is None:  # an unused parameter (find_unused_parameters)
                target[...] = 0
            elif not (is_host(grad._data) and may_share_memory(grad._data, target)):
                np.copyto(target, to_host(grad._data), casting="unsafe")
        flat = Tensor._make(bucket.buffer)
        bucket.work = dist.all_reduce(flat, group=self.process_group, async_op=True)

    def _finish_backward(self) -> None:
        """End of backward: reduce what is left, wait for every bucket, write the averages."""
        self._callback_task = -1
        unfinished = [b for b in self._buckets if b.pending > 0]
        globally_used = None
        if self.find_unused_parameters or self.static_graph:
            # the rest of the buckets, in order, then which parameters any process used (every
            # process issues the same collectives in the same order, whatever it used)
            for b in self._buckets[self._next_bucket :]:
                self._launch(b)
            self._next_bucket = len(self._buckets)
            used = np.zeros(len(self._where), np.int32)
            for b in self._buckets:
                for k in b.ready:
                    used[b.params[k][0]] = 1
            dist.all_reduce(Tensor._make(used), op=dist.ReduceOp.MAX, group=self.process_group)
            globally_used = used
        elif unfinished:
            self._unfinished = [
                name
                for b in unfinished
                for k, (_, name, _) in enumerate(b.params)
                if k not in b.ready
            ]
        for b in self._buckets:
            if b.work is None:
                continue
            b.work.wait()
            np.divide(b.buffer, self._world, out=b.buffer)
            for k, (index, _, p) in enumerate(b.params):
                if globally_used is not None and not globally_used[index] and p.grad is None:
                    continue  # no process used it: .grad stays None, as PyTorch leaves it
                self._write_grad(p, b.view(k))
        for b in self._buckets:
            b.pending, b.ready, b.work = len(b.params), set(), None
        self._next_bucket = 0

    def _drop_failed_backward(self) -> None:
        """A backward that raised after some gradients arrived never ran its callback: finish
        the allreduces it started (the other processes issued them too) and start afresh; the
        gradients of that backward are not averaged."""
        for b in self._buckets:
            if b.work is not None:
                b.work.wait()
            b.pending, b.ready, b.work = len(b.params), set(), None
        self._next_bucket = 0
        self._callback_task = -1

    def _write_grad(self, p: Tensor, average: np.ndarray) -> None:
        grad = p.grad
        if grad is not None and is_host(grad._data) and may_share_memory(grad._data, average):
            grad._bump()  # already the bucket view: reduced in place
            return
        if self.gradient_as_bucket_view and is_host(p._data):
            p.grad = Tensor._make(average)  # a view of the bucket from now on
            return
        if grad is None:  # a parameter only other processes used
            p.grad = Tensor._make(_on_device_of(p, average.copy()))
            return
        data = grad._data
        if is_host(data) and data.flags.writeable:
            np.copyto(data, average, casting="unsafe")
            grad._bump()
        elif is_host(data):  # a read-only .grad the user assigned: replace it
            p.grad = Tensor._make(average.copy())
        else:  # CUDA: back to the device, in place
            copy_into(data, _on_device_of(p, average))
            grad._bump()

    # -- state dict --------------------------------------------------------------------------------
    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """Keys with PyTorch's ``module.`` prefix (what ``state_dict()`` gives) or without it
        (``ddp.module.state_dict()``, a single-process checkpoint)."""
        if isinstance(state_dict, Mapping) and not any(k.startswith("module.") for k in state_dict):
            state_dict = OrderedDict((f"module.{k}", v) for k, v in state_dict.items())
        return super().load_state_dict(state_dict, strict=strict, assign=assign)
