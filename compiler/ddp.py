"""DistributedDataParallel's gradient averaging as steps of a compiled program.

``DistributedDataParallel`` (``fusegrad.nn.parallel``) averages gradients from post-accumulate-
grad hooks: each bucket's non-blocking allreduce starts when its last gradient has been
accumulated, and a callback waits for them at the end of the backward.  A compiled program can
do that work itself, with the same collectives in the same order: per bucket an
``allreduce_start`` of its gradients (flat, in the wrapper's order, placed right after the
kernels that produce the last of them) and an ``allreduce_wait`` before anything reads the
average (``ir.COLLECTIVE_OPS``).  Two places do: a whole step (``step``, which grafts the
backward into its own graph) and compiled autograd (``capture.Capture`` with a ``Plan``).

Compiled autograd takes the wrappers' work over only where it is exactly what the hooks would
do (``plan``); otherwise the hooks stay opaque steps of the program, which is always right.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fusegrad.autograd.node import AccumulateGrad

from .ir import Graph, Value


def ddp_hooks_only(w: Any) -> list:
    """The DistributedDataParallel wrappers whose post-accumulate-grad hooks are all the user
    code walk ``w``'s backward runs (empty: other hooks, or a wrapper a program cannot take
    over: unused-parameter detection, static graphs, buffers to broadcast, CUDA)."""
    ddps: dict[int, Any] = {}
    for n in w.nodes:
        if isinstance(n, AccumulateGrad):
            var = n.variable
            if n._pre_hooks or n._post_hooks or var._hooks:
                return []
            for hook in (var._post_acc_hooks or {}).values():
                ref = getattr(hook, "ddp", None)
                ddp = ref() if ref is not None else None
                if ddp is None:
                    return []
                ddps[id(ddp)] = ddp
        elif n._pre_hooks or n._post_hooks or n._tensor_pre_hooks or n._retain_grad_hooks:
            return []
    if w.opaque or any(s._unpack_hook is not None for _, s in w.saved):
        return []
    for ddp in ddps.values():
        if ddp.find_unused_parameters or ddp.static_graph or ddp._world < 1:
            return []
        if ddp.broadcast_buffers and ddp._world > 1 and any(True for _ in ddp.module.buffers()):
            return []  # (its forward broadcasts the buffers: a collective a replay would skip)
        if any(not isinstance(p._data, np.ndarray) for p in ddp.module.parameters()):
            return []
    return list(ddps.values())


def start_bucket(graph: Graph, ddp: Any, bucket: Any, values: list) -> tuple[Value, list]:
    """``allreduce_start`` of ``values`` (the bucket's gradients, in its order) made flat:
    the start and the (count, shape) of each part."""
    parts, sizes = [], []
    for value in values:
        n = int(np.prod(value.shape, dtype=np.int64))
        parts.append(graph.add("reshape", (value,), {"shape": (n,)}, (n,), value.dtype))
        sizes.append((n, value.shape))
    dtype = parts[0].dtype
    total = sum(n for n, _ in sizes)
    flat = (
        parts[0] if len(parts) == 1 else graph.add("cat", tuple(parts), {"dim": 0}, (total,), dtype)
    )
    attrs = {"group": ddp.process_group, "bucket": bucket.index, "ddp": id(ddp)}
    return graph.add("allreduce_start", (flat,), attrs, (), dtype, "DDP bucket"), sizes


def wait_bucket(graph: Graph, ddp: Any, start: Value, sizes: list) -> list[Value]:
    """``allreduce_wait`` for ``start`` and the averaged gradients, one per part."""
    total = sum(n for n, _ in sizes)
    attrs = {"world": ddp._world, "bucket": start.attr("bucket"), "ddp": start.attr("ddp")}
    flat = graph.add("allreduce_wait", (start,), attrs, (total,), start.dtype, "DDP bucket")
    out, offset = [], 0
    for n, shape in sizes:
        key = (("s", offset, offset + n, 1),)
        part = graph.add("getitem", (flat,), {"key": key}, (n,), start.dtype)
        out.append(graph.add("reshape", (part,), {"shape": shape}, shape, start.dtype))
        offset += n
    return out


class Plan:
    """Compiled autograd doing the DDP wrappers' averaging (``plan``): per wrapper that
    synchronises this backward, its buckets as lists of walk leaf slots.  ``key`` goes into
    the walk's key (the graph depends on it)."""

    def __init__(self, buckets: list) -> None:
        self.buckets = buckets  # [(ddp, bucket, [leaf slot, ...])], each wrapper in its order
        self.key = (
            "ddp",
            tuple((id(ddp), bucket.index, tuple(slots)) for ddp, bucket, slots in buckets),
        )


def plan(w: Any) -> Plan | None:
    """A ``Plan`` when walk ``w``'s hooks are DDP's alone and the program can do exactly what
    they would: every wrapper either does not synchronise this backward (``no_sync``: its
    hooks do nothing) or has nothing in flight, no ``gradient_as_bucket_view``, one dtype per
    bucket, and every parameter reached by this backward with no ``.grad`` yet (the common
    ``zero_grad()`` loop; with a ``.grad`` to add to, the hooks stay opaque steps).  None
    otherwise."""
    ddps = ddp_hooks_only(w)
    if not ddps:
        return None
    slot_of = {id(leaf): k for k, leaf in enumerate(w.leaves)}
    buckets: list = []
    for ddp in ddps:
        if not ddp._sync_this_backward:
            continue  # (its hooks return at once)
        if ddp.gradient_as_bucket_view or ddp._callback_task != -1 or ddp._next_bucket:
            return None
        for bucket in ddp._buckets:
            slots = []
            for _, _, p in bucket.params:
                slot = slot_of.get(id(p))
                if slot is None or p._grad is not None or p._dtype.np != bucket.buffer.dtype:
                    return None
                slots.append(slot)
            if bucket.pending != len(bucket.params):
                return None
            buckets.append((ddp, bucket, slots))
    return Plan(buckets)


class Buckets:
    """One capture's progress through a ``Plan``: ``ready``, called where DDP's hook would
    run once a leaf's gradient (in ``values``) is accumulated, starts the buckets whose
    gradients are all there, in each wrapper's order; ``finish`` waits for them and gives the
    averages (walk leaf slot -> value), which ``.grad`` gets instead of the local gradients."""

    def __init__(self, plan: Plan, graph: Graph) -> None:
        self.graph = graph
        self.plan = plan
        self.values: dict[int, Value] = {}
        self.started: dict[int, tuple] = {}  # position in plan.buckets -> (start, sizes)
        self.next: dict[int, int] = {}  # id(ddp) -> its first position not started

    def ready(self) -> None:
        """A leaf's gradient was accumulated (its value is in ``values``): start every bucket
        now complete, each wrapper's in its order (MPI matches collectives by order)."""
        buckets = self.plan.buckets
        progress = True
        while progress:
            progress = False
            for k, (ddp, bucket, slots) in enumerate(buckets):
                if k in self.started or any(s not in self.values for s in slots):
                    continue
                if any(buckets[j][0] is ddp and j not in self.started for j in range(k)):
                    continue  # (an elder bucket of the wrapper has not started)
                values = [self.values[s] for s in slots]
                self.started[k] = start_bucket(self.graph, ddp, bucket, values)
                progress = True

    def finish(self) -> dict[int, Value] | None:
        """The averages, or None when a bucket never filled (a parameter got no gradient:
        eager's hooks leave that reduction unfinished, an error at the next forward)."""
        if len(self.started) != len(self.plan.buckets):
            return None
        averaged: dict[int, Value] = {}
        for k, (ddp, _, slots) in enumerate(self.plan.buckets):
            start, sizes = self.started[k]
            for slot, value in zip(slots, wait_bucket(self.graph, ddp, start, sizes)):
                averaged[slot] = value
        return averaged
