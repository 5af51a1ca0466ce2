"""``fusegrad.distributed.optim.DistributedOptimizer``: one optimizer over parameters that live
on several workers, stepped with the gradients of a distributed autograd context.

    opt = DistributedOptimizer(fg.optim.SGD, param_rrefs, lr=0.05)
    with dist_autograd.context() as context_id:
        dist_autograd.backward(context_id, [loss])
        opt.step(context_id)

As PyTorch's: the constructor creates, on each worker owning some of ``params_rref`` (RRefs
to parameters: ``rpc.RRef(p)`` on the owner, or returned by a remote call), a local optimizer
of ``optimizer_class`` over that worker's parameters (``remote``); ``step(context_id)`` asks
every one of them at once to set each parameter's ``.grad`` to its gradient in the context
(``dist_autograd.get_gradients`` there; None for a parameter the backward did not reach) and to
step, and waits for all (the first error is raised, with the remote traceback).  One local
step at a time per optimizer (a lock), so concurrent trainers can share it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from .autograd import get_gradients
from .rpc import RRef, remote, rpc_async


class _LocalOptimizer:
    """The optimizer on one owner (made there by ``remote``)."""

    def __init__(
        self, optimizer_class: Any, params_rref: Sequence[RRef], args: tuple, kwargs: dict
    ) -> None:
        self.params = [r.local_value() for r in params_rref]
        self.optim = optimizer_class(self.params, *args, **kwargs)
        self.lock = threading.Lock()

    def step(self, context_id: int) -> None:
        grads = get_gradients(context_id)
        with self.lock:
            for p in self.params:
                p.grad = grads.get(p)
            self.optim.step()


def _new_local_optimizer(
    optimizer_class: Any, params_rref: list[RRef], args: tuple, kwargs: dict
) -> _LocalOptimizer:
    return _LocalOptimizer(optimizer_class, params_rref, args, kwargs)


def _local_step(optimizer_rref: RRef, context_id: int) -> None:
    optimizer_rref.local_value().step(context_id)


class DistributedOptimizer:
    """``optimizer_class(params, *args, **kwargs)`` on every worker owning some of
    ``params_rref``; ``step(context_id)`` steps them all with that context's gradients."""

    def __init__(
        self, optimizer_class: Any, params_rref: Sequence[RRef], *args: Any, **kwargs: Any
    ) -> None:
        by_owner: dict[int, list[RRef]] = {}
        for i, r in enumerate(params_rref):
            if not isinstance(r, RRef):
                raise TypeError(
                    f"DistributedOptimizer: params_rref[{i}] must be an RRef, got "
                    f"{type(r).__name__}"
                )
            by_owner.setdefault(r.owner().id, []).append(r)
        if not by_owner:
            raise ValueError("DistributedOptimizer: params_rref is empty")
        self.remote_optimizers = [
            remote(owner, _new_local_optimizer, args=(optimizer_class, rrefs, args, kwargs))
            for owner, rrefs in sorted(by_owner.items())
        ]

    def step(self, context_id: int) -> None:
        """Step every worker's optimizer with the gradients of ``context_id``; waits for all."""
        futures = [
            rpc_async(opt.owner(), _local_step, args=(opt, context_id))
            for opt in self.remote_optimizers
        ]
        errors = []
        for future in futures:
            try:
                future.wait()
            except Exception as e:  # noqa: BLE001  (wait for every worker, then raise)
                errors.append(e)
        if errors:
            raise errors[0]
