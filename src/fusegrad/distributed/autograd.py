"""``fusegrad.distributed.autograd``: a backward pass across processes, over RPC, as PyTorch's
``torch.distributed.autograd``.

    with dist_autograd.context() as context_id:
        loss = model_split_over_workers(x)          # rpc_sync / remote / to_here calls
        dist_autograd.backward(context_id, [loss])  # runs on every worker involved
        grads = dist_autograd.get_gradients(context_id)   # {tensor: gradient} on this worker
        dist_optimizer.step(context_id)

Inside a context, RPC records the tensors that require grad as they cross (``_dist_context``):
a *send* on the sender, a *recv* (a fresh leaf requiring grad) on the receiver, for arguments
and for results.  ``backward`` computes, on this worker, the gradients of ``roots`` for every
leaf of their graph (``fusegrad.autograd.grad``, so ``.grad`` is never written); the
gradients of received leaves go back to their senders in ``backward`` messages, and a worker
receiving one runs the same local pass from the tensor it sent, passing gradients further on.
Each message is answered when everything it started has finished, so ``backward`` returns when
the whole backward is done on every worker.  Gradients of every other leaf (parameters) are
summed into the context of the worker that owns the leaf: ``get_gradients`` there.

This is PyTorch's FAST mode: each arriving gradient runs the local graph from its send at
once, which gives the same sums since gradients are linear.  So that parts of a graph
reached from several sends can run more than once, graphs are always kept (``retain_graph``
is accepted; the graph is freed with its tensors).  A worker that fails in its part answers
with the error, which ``backward`` raises (with the remote traceback) on the caller; a worker
that never answers makes it fail after the RPC timeout.  Leaving the context releases it on
this worker and on every worker it sent messages to in it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from ..autograd.api import grad as autograd_grad
from ..autograd.graph_base import AccumulateGrad
from ..ops.creation import ones_like
from ..tensor import Tensor
from . import _dist_context
from ._rpc_agent import Agent, register_handler, running

__all__ = ["backward", "context", "get_gradients"]


@contextlib.contextmanager
def context() -> Iterator[int]:
    """A new distributed autograd context, current in this thread; yields its id."""
    agent = running("dist_autograd.context")
    ctx = _dist_context.new_context()
    previous = _dist_context.set_current(ctx)
    try:
        yield ctx.context_id
    finally:
        _dist_context.set_current(previous)
        _release(agent, ctx.context_id)


def _release(agent: Agent, context_id: int) -> None:
    """Drop the context here, then on the workers it sent messages to (they pass it on)."""
    ctx = _dist_context.release(context_id)
    if ctx is None:
        return
    futures = [
        agent.request(
            peer, "release", context_id, agent.timeout_s, f"release of context {context_id}"
        )
        for peer in sorted(ctx.peers)
        if peer != agent.rank
    ]
    for future in futures:
        future.wait()


def _lookup(context_id: int, op: str) -> _dist_context.DistAutogradContext:
    ctx = _dist_context.lookup(context_id)
    if ctx is None:
        raise RuntimeError(f"{op}: Could not find autograd context with id: {context_id}")
    return ctx


def get_gradients(context_id: int) -> dict[Tensor, Tensor]:
    """The gradients a distributed backward in ``context_id`` left for this worker's leaves
    (parameters), keyed by the leaf tensor."""
    ctx = _lookup(context_id, "get_gradients")
    with ctx.lock:
        return dict(ctx.grads)


def backward(context_id: int, roots: Sequence[Tensor], retain_graph: bool = False) -> None:
    """Run the backward of ``roots`` (scalar tensors) across every worker their graph spans;
    gradients go into the context (``get_gradients``), not ``.grad``."""
    running("dist_autograd.backward")
    ctx = _lookup(context_id, "dist_autograd.backward")
    roots = list(roots)
    if not roots:
        raise RuntimeError("dist_autograd.backward: no roots given")
    for i, root in enumerate(roots):
        if not isinstance(root, Tensor):
            raise TypeError(
                f"dist_autograd.backward: roots[{i}] must be a Tensor, got {type(root).__name__}"
            )
        if root.numel() != 1:
            raise RuntimeError(
                f"dist_autograd.backward: roots must be scalar tensors, but roots[{i}] has shape "
                f"{tuple(root.shape)}"
            )
        if not root.requires_grad:
            raise RuntimeError(
                f"dist_autograd.backward: element {i} of tensors does not require grad and does "
                f"not have a grad_fn"
            )
    _local_pass(ctx, roots, [ones_like(r) for r in roots])


def _leaves(roots: Sequence[Tensor]) -> list[Tensor]:
    """The leaves requiring grad that ``roots``' graph reaches (an iterative walk)."""
    found: dict[int, Tensor] = {}
    seen: set[int] = set()
    stack = [r.grad_fn for r in roots if r.grad_fn is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, AccumulateGrad):
            found.setdefault(id(node.variable), node.variable)
            continue
        stack.extend(edge[0] for edge in node.next_functions if edge[0] is not None)
    return list(found.values())


def _local_pass(
    ctx: _dist_context.DistAutogradContext, roots: Sequence[Tensor], grads: Sequence[Tensor]
) -> None:
    """This worker's part: gradients of ``roots`` (given ``grads``) for the graph's leaves;
    parameters' into the context, received leaves' back to their senders (waited for)."""
    agent = running("dist_autograd.backward")
    with ctx.lock:  # one local pass at a time per context (graphs may be shared)
        results: dict[int, tuple[Tensor, Tensor]] = {}

        def add(leaf: Tensor, g: Tensor) -> None:
            before = results.get(id(leaf))
            results[id(leaf)] = (leaf, g if before is None else before[1] + g)

        inner = [(r, g) for r, g in zip(roots, grads) if r.grad_fn is not None]
        for r, g in zip(roots, grads):
            if r.grad_fn is None and r.requires_grad:
                add(r, g)  # a leaf root: its gradient is the one given
        leaves = _leaves([r for r, _ in inner])
        if inner and leaves:
            computed = autograd_grad(
                [r for r, _ in inner],
                leaves,
                [g for _, g in inner],
                retain_graph=True,
                allow_unused=True,
            )
            for leaf, g in zip(leaves, computed):
                if g is not None:
                    add(leaf, g)
        outgoing = []
        for leaf, g in results.values():
            record = ctx.recvs.get(id(leaf))
            if record is not None and record.tensor is leaf:
                outgoing.append((record.peer, record.send_id, g))
            else:
                ctx.accumulate(leaf, g)
    # (the lock is not held while waiting: the peer's part may send gradients back here)
    futures = [
        agent.request(
            peer,
            "backward",
            (send_id, g.detach()),
            agent.timeout_s,
            f"dist_autograd.backward: gradient to {agent.workers[peer]!r}",
        )
        for peer, send_id, g in outgoing
    ]
    for future in futures:
        future.wait()


def _serve_backward(agent: Agent, source: int, payload: Any, extra: Any) -> None:
    send_id, g = payload
    ctx = _dist_context.current()
    if ctx is None:
        raise RuntimeError("dist_autograd.backward: a gradient arrived without its context")
    tensor = ctx.sends.get(send_id)
    if tensor is None:
        raise RuntimeError(
            f"dist_autograd.backward: context {ctx.context_id} has no send {send_id} on "
            f"{agent.info!r}"
        )
    _local_pass(ctx, [tensor], [g])


def _serve_release(agent: Agent, source: int, payload: Any, extra: Any) -> None:
    _dist_context.set_current(None)  # (the handler's context: not recorded into)
    _release(agent, int(payload))


register_handler("backward", _serve_backward)
register_handler("release", _serve_release)
