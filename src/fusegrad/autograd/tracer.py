"""The eager core's one extension point: a tracer, installed per thread.

fusegrad computes eagerly and knows nothing about compilation.  A tool that needs to see or take
over what a thread computes subclasses ``Tracer`` and installs an instance on the current thread
with ``tracing(tracer)`` (``fusegrad.compiler`` does: its compiled regions record forwards and
compile backwards, and its capture records derivative rules as IR).  While it is the thread's
innermost tracer:

* ``ops.registry.apply`` hands every primitive call to ``tracer.apply(prim, inputs, attrs)``,
  which returns the op's result, or NotImplemented to let the primitive run eagerly
  (``ops.registry.run``, which a tracer may also call itself);
* ``autograd.backward`` / ``autograd.grad`` hand their validated arguments to
  ``tracer.backward(...)``, which returns the result, or NotImplemented to let the eager engine
  run the call (``engine.run_backward``, which a tracer may also call itself);
* the constant-making creation functions (``zeros``, ``ones``, ``full`` and their ``_like``
  forms, for tensors that need no gradient) ask ``tracer.full(shape, value, dtype, device)``
  first, which returns the tensor, or NotImplemented to let it be made eagerly.

How the backward engine runs the nodes of one call is not thread state either: ``run_backward``
takes an executor (``engine.Executor``), the object that runs each node's rule, writes ``.grad``
and calls user hooks.

Nothing here is global.  Tracers are per thread (carried to the fresh threads that run deeply
nested backward calls, see ``engine.THREAD_STATE``), and nothing in fusegrad is reassigned at run
time, so two threads tracing at once cannot see each other.  Only the innermost tracer is asked;
a tracer that wants to delegate keeps a reference to the one it replaced (``tracing`` returns it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..tensor import Tensor


class Tracer:
    """Base class of tracers: every method's default, NotImplemented, lets fusegrad do what it
    does without one."""

    def apply(self, prim: Any, inputs: tuple, attrs: dict) -> Any:
        """Primitive ``prim`` called on Tensors ``inputs`` with keyword ``attrs``: its result, or
        NotImplemented to let it run eagerly."""
        return NotImplemented

    def full(self, shape: tuple, value: Any, dtype: Any, device: Any) -> Any:
        """A constant of ``shape`` (fusegrad ``dtype``) filled with ``value``, or
        NotImplemented to let it be made eagerly."""
        return NotImplemented

    def backward(
        self,
        roots: Sequence[Tensor],
        grads: Sequence[Tensor],
        retain_graph: bool,
        create_graph: bool,
        inputs: Sequence[Tensor] | None,
        accumulate: bool,
    ) -> Any:
        """A validated ``backward()`` (``accumulate``) or ``grad()`` call: its result (see
        ``engine.run_backward``), or NotImplemented to let the eager engine run it."""
        return NotImplemented


class _State(threading.local):
    def __init__(self) -> None:
        self.tracer: Tracer | None = None


state = _State()
"""This thread's innermost tracer (``state.tracer``), read by op dispatch and ``backward``."""


def current() -> Tracer | None:
    """The tracer installed on this thread (None: plain eager execution)."""
    return state.tracer


@contextlib.contextmanager
def tracing(tracer: Tracer | None) -> Iterator[Tracer | None]:
    """Install ``tracer`` on this thread for the block (None: none); yields the one it replaces,
    which is back in place when the block ends."""
    previous = state.tracer
    state.tracer = tracer
    try:
        yield previous
    finally:
        state.tracer = previous


def _thread_state() -> Tracer | None:
    return state.tracer


def _set_thread_state(tracer: Tracer | None) -> None:
    state.tracer = tracer
