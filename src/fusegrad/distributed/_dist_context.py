"""Distributed autograd contexts: what the RPC layer records while tensors cross processes.

A context (``fusegrad.distributed.autograd.context()``) has an id unique over the job: the
creating worker's rank in the top 16 bits, a per-worker counter below, as PyTorch's.  A worker
that receives an RPC made inside a context joins it: it gets a context of the same id.

While a context is current (a thread-local; the RPC agent makes the caller's context current
while it runs a request), the agent records every tensor that requires grad as it crosses:

* the sender keeps the tensor under a *send id* (its "send" node: during the distributed
  backward the gradient for it arrives from the peer, and the local backward starts from it);
* the receiver makes the received value a fresh leaf that requires grad and keeps it under the
  sender's rank and send id (its "recv" node: the gradient the local backward computes for that
  leaf goes back to the sender).

Leaves of the local graph that are not received values are the worker's own parameters: their
gradients are summed into the context (``grads``), never into ``.grad``, as PyTorch does.
This module depends on nothing but the tensor; the agent (``_rpc_agent``) and the backward
(``autograd``) build on it.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

from ..tensor import Tensor


@dataclass(frozen=True, slots=True)
class RecvRecord:
    """A received leaf: its gradient goes back to ``peer``'s send ``send_id``."""

    tensor: Tensor
    peer: int
    send_id: int


class DistAutogradContext:
    """One context on one worker: its sends, receives and accumulated gradients."""

    def __init__(self, context_id: int) -> None:
        self.context_id = context_id
        self.sends: dict[int, Tensor] = {}
        self.recvs: dict[int, RecvRecord] = {}  # id(tensor) -> record
        self.grads: dict[Tensor, Tensor] = {}
        self.peers: set[int] = set()  # workers this one sent messages to in the context
        self.lock = threading.Lock()  # one local backward pass at a time; sends, grads
        self._send_ids = itertools.count()

    def record_send(self, tensor: Tensor) -> int:
        with self.lock:
            send_id = next(self._send_ids)
            self.sends[send_id] = tensor
        return send_id

    def record_recv(self, tensor: Tensor, peer: int, send_id: int) -> None:
        with self.lock:
            self.recvs[id(tensor)] = RecvRecord(tensor, peer, send_id)

    def accumulate(self, leaf: Tensor, grad: Tensor) -> None:
        """Sum ``grad`` into the context's gradient of ``leaf`` (the caller holds ``lock``)."""
        previous = self.grads.get(leaf)
        self.grads[leaf] = grad if previous is None else previous + grad

    def __repr__(self) -> str:
        return f"DistAutogradContext(context_id={self.context_id})"


class _Current(threading.local):
    def __init__(self) -> None:
        self.context: DistAutogradContext | None = None


_current = _Current()
_contexts: dict[int, DistAutogradContext] = {}
_contexts_lock = threading.Lock()
_counter = itertools.count()
_worker_id = [0]  # set by init_rpc: the top 16 bits of this worker's context ids


def set_worker_id(worker_id: int) -> None:
    _worker_id[0] = worker_id


def new_context() -> DistAutogradContext:
    context_id = (_worker_id[0] << 48) + next(_counter)
    ctx = DistAutogradContext(context_id)
    with _contexts_lock:
        _contexts[context_id] = ctx
    return ctx


def join(context_id: int) -> DistAutogradContext:
    """The context of ``context_id`` on this worker, made when a message first brings it."""
    with _contexts_lock:
        ctx = _contexts.get(context_id)
        if ctx is None:
            ctx = _contexts[context_id] = DistAutogradContext(context_id)
        return ctx


def lookup(context_id: int) -> DistAutogradContext | None:
    with _contexts_lock:
        return _contexts.get(context_id)


def release(context_id: int) -> DistAutogradContext | None:
    with _contexts_lock:
        return _contexts.pop(context_id, None)


def current() -> DistAutogradContext | None:
    return _current.context


def set_current(ctx: DistAutogradContext | None) -> DistAutogradContext | None:
    """Make ``ctx`` current in this thread; returns the one it replaces."""
    previous = _current.context
    _current.context = ctx
    return previous


def clear_all() -> None:
    """Forget every context (``rpc.shutdown``)."""
    with _contexts_lock:
        _contexts.clear()
