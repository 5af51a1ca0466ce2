"""The eager core's one extension point: a tracer, installed per thread.

fusegrad computes eagerly and knows nothing about compilation.  A tool that needs to see or take
over what a thread computes subclasses ``Tracer`` and installs an instance on the current thread
with ``tracing(tracer)`` (``fusegrad.compiler`` does: its compiled regions record forwards and
compile backwards, and its capture records derivative rules as IR).  While it is the thread's
innermost tracer:

* ``ops.registry.apply`` hands every primitive call to ``tracer.apply(prim, inputs, attrs)``,
  which returns the op's result, or NotImplemented to let the primitive run eagerly
  (``ops.registry.run``, which a tracer may also call itself) -- unless the tracer declares
  ``sees_calls = False``: its ``apply`` is then never asked, and the op surface's fast paths
  run as they do without a tracer;
* ``ops.registry.run``, having recorded a backward node for a call, tells the tracer
  ``tracer.made(node, inputs, out)`` (compiled autograd's region records the forward's graph
  from this alone, so its calls need not pass through ``apply``; a tracer that delegates calls
  to the one it replaced hands this on too);
* ``autograd.backward`` / ``autograd.grad`` hand their validated arguments to
  ``tracer.backward(...)``, which returns the result, or NotImplemented to let the eager engine
  run the call (``engine.run_backward``, which a tracer may also call itself);
* the constant-making creation functions (``zeros``, ``ones``, ``full`` and their ``_like``
  forms, for tensors that need no gradient) ask ``tracer.full(shape, value, dtype, device)``
  first, which returns the tensor, or NotImplemented to let it be made eagerly.

A tracer that records a computation to run it again later (``fusegrad.compiler``'s whole-step
compile) must also see what the primitive calls do not show; these notifications return nothing
and default to doing nothing:

* ``tracer.created(tensor, redo)``: a creation function made ``tensor`` from Python values
  (``arange``, ``eye``, ``linspace``, internal masks: ``redo`` is None, the values are fixed by
  the arguments), from a random generator (``rand``, ``randn``, dropout's mask: ``redo()`` draws
  a new one from the generator as it is then, as a second call would), or as a copy of the
  tensor ``redo`` (the snapshot an in-place op computes from);
* ``tracer.host_read(tensor, what, result)``: Python read ``tensor``'s values (``what`` is
  ``"item()"``, ``"bool()"``, ``"print"``, ``"numpy()"``, ...; ``result`` is what it got,
  None where that is not a Python value);
* ``tracer.wrote(target, result)``: an in-place op wrote ``result``'s values into ``target``'s
  memory (after the write; the version was bumped);
* ``tracer.check(tensor, fn)``: eager validated ``tensor``'s values with ``fn(array)``, which
  raises the op's error for bad values (index ranges, class targets) and returns nothing -- a
  replay runs ``fn`` on the new values before it changes anything;
* ``tracer.side_effect(tensor, what)``: Python state that is not data changed (``.grad``
  assigned, a hook registered, ``requires_grad_``);
* ``tracer.opaque(owner, fn, args, kwargs)``: a stateful library method about to run
  (``Optimizer.step``, ``zero_grad``): its result, or NotImplemented to let it run.

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
import functools
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..tensor import Tensor


class Tracer:
    """Base class of tracers: every method's default, NotImplemented, lets fusegrad do what it
    does without one."""

    # True for a tracer that needs every primitive of a composite to record its own backward
    # node: conv and the norm layers then do not run as one custom-Function node
    # (``autograd.native``).  ``fusegrad.func.vmap`` sets it: its batching rules are per
    # primitive, and a compiled recording around it then captures their rules like any other.
    primitive_nodes = False

    # True for a tracer that fuses primitives itself (``fusegrad.compiler``'s recordings of
    # whole steps and modules, and its captures of backwards): while it is installed, the
    # layers that eager mode runs as fused kernels of their own but whose composites the
    # compiler fuses faster with their neighbours (layer_norm, interpolate's linear modes:
    # ``ops/norms.py``, ``ops/resample.py``) call their composites of primitives instead.
    # (Not compiled autograd's region, whose forwards run eagerly: a checkpoint's recomputation
    # there must compute what the eager forward did.)
    prefers_composites = False

    # False for a tracer whose ``apply`` would let every call run eagerly (it only observes,
    # through ``made`` and the notifications): op dispatch then does not ask it, and the op
    # surface's fast paths -- which otherwise take the generic path under any tracer -- run as
    # without one.  Compiled autograd's region sets it: it records the nodes calls make.
    sees_calls = True

    def apply(self, prim: Any, inputs: tuple, attrs: dict) -> Any:
        """Primitive ``prim`` called on Tensors ``inputs`` with keyword ``attrs``: its result, or
        NotImplemented to let it run eagerly."""
        return NotImplemented

    def made(self, node: Any, inputs: tuple, out: Tensor) -> None:
        """``ops.registry.run`` recorded backward node ``node`` (an ``OpNode``) for a primitive
        call on Tensors ``inputs`` whose result is ``out`` (after ``out.grad_fn`` is set)."""

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

    # ---- notifications for tracers that record to run again (see the module docstring) -------
    def created(self, tensor: Tensor, redo: Any) -> None:
        """A creation function made ``tensor`` (``redo``: None for values fixed by the call's
        arguments, else a callable drawing a new one from its random generator)."""

    def created_as(self, tensor: Tensor, recipe: tuple) -> None:
        """A creation function made ``tensor`` from numbers alone (its sizes among them), as
        ``recipe`` says: ``("arange", start, end, step)`` (``arange``), or ``("band", rows,
        cols, offset, relation)`` for the matrix whose element ``(i, j)`` is ``j - i <relation>
        offset`` (``relation``: ``"le"``, ``"ge"`` or ``"eq"``: ``tril``'s and ``triu``'s masks,
        ``eye``), in ``tensor``'s dtype.  A tracer may record how to make it again at other
        sizes; by default it is any other constant (``created(tensor, None)``)."""
        self.created(tensor, None)

    def from_data(self, tensor: Tensor, data: Any) -> None:
        """``tensor(data)`` or ``new_tensor(data)`` made ``tensor`` from Python data ``data``
        (a recording may keep it as a constant where the data is written in the source)."""

    def will_draw(self, generator: Any = None) -> None:
        """A random draw is about to advance ``generator`` (a ``random.Generator``:
        ``random._gen``): a tracer that refuses it here leaves the generator as it was."""

    def host_read(self, tensor: Tensor, what: str, result: Any = None) -> None:
        """Python read ``tensor``'s values through ``what``, getting ``result``."""

    def wrote(self, target: Tensor, result: Tensor) -> None:
        """An in-place op wrote ``result``'s values into ``target``'s memory."""

    def check(self, tensor: Tensor, fn: Any) -> None:
        """Eager validated ``tensor``'s values with ``fn(array)`` (raises for bad values)."""

    def side_effect(self, tensor: Tensor, what: str) -> None:
        """Python state of ``tensor`` other than its values changed through ``what``."""

    def opaque(self, owner: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        """``fn(owner, *args, **kwargs)``, a stateful library method (optimizer step,
        zero_grad), is about to run: its result, or NotImplemented to let it run."""
        return NotImplemented


def notify_host_read(tensor: Tensor, what: str, result: Any = None) -> Any:
    """Tell this thread's tracer, if any, that Python read ``tensor``'s values; returns
    ``result``."""
    tracer = state.tracer
    if tracer is not None:
        tracer.host_read(tensor, what, result)
    return result


def notify_check(tensor: Tensor, fn: Any) -> None:
    """Validate ``tensor``'s values with ``fn(array)`` (which raises for bad values) and tell
    this thread's tracer, if any."""
    fn(tensor._data)
    tracer = state.tracer
    if tracer is not None:
        tracer.check(tensor, fn)


def notify_side_effect(tensor: Tensor, what: str) -> None:
    tracer = state.tracer
    if tracer is not None:
        tracer.side_effect(tensor, what)


def notify_will_draw(generator: Any = None) -> None:
    tracer = state.tracer
    if tracer is not None:
        tracer.will_draw(generator)


def notify_created(tensor: Tensor, redo: Any = None) -> Tensor:
    """Tell this thread's tracer, if any, that a creation function made ``tensor``; returns it."""
    tracer = state.tracer
    if tracer is not None:
        tracer.created(tensor, redo)
    return tensor


def notify_created_as(tensor: Tensor, recipe: tuple) -> Tensor:
    """Tell this thread's tracer, if any, that a creation function made ``tensor`` as ``recipe``
    says (``Tracer.created_as``); returns it."""
    tracer = state.tracer
    if tracer is not None:
        tracer.created_as(tensor, recipe)
    return tensor


def notify_from_data(tensor: Tensor, data: Any) -> Tensor:
    """Tell this thread's tracer, if any, that ``tensor`` was made from Python data; returns
    it."""
    tracer = state.tracer
    if tracer is not None:
        tracer.from_data(tensor, data)
    return tensor


def opaque_method(fn: Any) -> Any:
    """``fn`` (a method) as a call a tracer may take over (``Tracer.opaque``)."""

    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        tracer = state.tracer
        if tracer is not None:
            out = tracer.opaque(self, fn, args, kwargs)
            if out is not NotImplemented:
                return out
        return fn(self, *args, **kwargs)

    method.__wrapped_opaque__ = True  # type: ignore[attr-defined]
    return method


# One entry per thread that has a tracer installed (list append and pop are atomic): while it
# is empty -- plain eager execution, almost always -- op dispatch knows that no tracer wants
# the call without reading this thread's state, a thread-local read that costs as much as a
# small op's other checks together (``registry.apply`` and the op surface's fast paths).
tracer_threads: list = []


class _State(threading.local):
    def __init__(self) -> None:
        # the tracer (set through ``tracer``); ``innermost`` is the same, as a plain attribute
        # for the reads on every call (``ops.registry.run``'s ``made``)
        self.innermost: Tracer | None = None
        # the tracer when it takes primitive calls (``Tracer.sees_calls``), else None: what op
        # dispatch and the fast paths read
        self.calls: Tracer | None = None

    @property
    def tracer(self) -> Tracer | None:
        return self.innermost

    @tracer.setter
    def tracer(self, tracer: Tracer | None) -> None:
        if (tracer is None) != (self.innermost is None):
            if tracer is None:
                tracer_threads.pop()
            else:
                tracer_threads.append(None)
        self.innermost = tracer
        self.calls = tracer if tracer is not None and tracer.sees_calls else None


state = _State()
"""This thread's innermost tracer (``state.tracer``; ``state.calls``: the same when it takes
primitive calls), read by op dispatch and ``backward``."""


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
