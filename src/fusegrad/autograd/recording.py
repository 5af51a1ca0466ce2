"""A block's primitive calls, recorded as a straight-line program over its inputs.

Non-reentrant checkpointing (``utils.checkpoint``) keeps, instead of each tensor the
checkpointed function saves for backward, a holder; the first unpack in a backward re-runs the
function's Python to recompute them.  While the function's forward runs, a ``RegionRecorder`` (the
thread's tracer, delegating to the one it replaced) also writes down what that recomputation
computes, as a ``Recording``:

* ``ops``: every primitive call (``ops.registry.apply``: the primitive, its attributes, where
  each input comes from), every constant made by ``full`` (``zeros``, ``ones``, ...) and every
  random draw (the function that draws it again, and the default generator's state before
  it: the recomputation restores that state, so it draws the same numbers);
* where a tensor comes from (a *ref*): ``("a", k)`` the block's ``k``-th tensor argument (kept as
  the frame's version-checked ``SavedTensor``), ``("v", i)`` the result of ``ops[i]``, ``("e", k)``
  a tensor from outside the block (a parameter, a constant made by a creation function), read as
  it is when the recording runs, as the re-run Python would read it, and
  ``("n", k)`` a Python number wrapped as a tensor;
* each holder knows the ref of the tensor it stands for.

The reentrant variant (``CheckpointFunction``) records its forward, which runs under no_grad,
the same way, with the refs of the function's results (``Recording.outputs``): its backward
replays the recording with grad on and differentiates it.

A tool that runs primitive calls on values of its own (``fusegrad.compiler``'s capture) then
recomputes the saved tensors from the recording inside its program instead of calling the
Python again.  That is exact only if re-running the recorded calls computes what re-running the
Python would; ``Recording.broken`` says why not, and then only the Python recomputes: the block
read tensor values into Python (a branch could go another way), called ``backward()`` or a
stateful library method (an optimizer), drew random numbers without the generator's state being
restored for the recomputation (``preserve_rng_state=False``, or another generator than the
default one), or wrote in place into a tensor from outside or into memory that another tensor
shares.

Tensors are followed by their arrays' identity (``detach()`` shares its array: the same ref),
through weak references, so recording keeps nothing alive that the forward would free.
"""

from __future__ import annotations

import weakref
from typing import Any

from .. import storage as _storage
from ..device import CPU
from ..ops import registry
from ..random import default_generator
from ..tensor import Tensor
from .tracer import Tracer


class Recording:
    """What a recorded block computes (see the module docstring); filled by ``RegionRecorder``."""

    __slots__ = (
        "__weakref__",
        "_pending",
        "_refs",
        "args",
        "broken",
        "numbers",
        "ops",
        "outputs",
        "outside",
        "running",
        "views",
    )

    def __init__(self, args: list) -> None:
        self.args = args  # the block's tensor arguments, as version-checked SavedTensors
        # ("prim", prim, attrs, refs) | ("full", shape, value, dtype)
        # | ("draw", redo, generator state, dtype, shape, array type)
        self.ops: list[tuple] = []
        self.outside: list[Tensor] = []  # tensors from outside the block, by ("e", k)
        self.numbers: list[Tensor] = []  # Python numbers wrapped as tensors, by ("n", k)
        self.broken: str | None = None
        self.outputs: list = []  # refs of the block's results (None: not a tensor), if noted
        # id(array) -> (ref, weak reference to the array or the array itself); only while recording
        self._refs: dict[int, tuple] = {}
        self.views: set[int] = set()  # ids of arrays that recorded views share memory with
        self.running = False  # inside a primitive call (its outputs are not bound yet)
        self._pending: list = []  # (holder, tensor) packed during that call

    def hold(self, holder: Any, t: Tensor) -> None:
        """Set ``holder.ref`` to where ``t`` comes from: now, or -- for a tensor packed while a
        primitive call runs (a node saving its own output) -- once the call has returned."""
        if self.broken is not None:
            return
        if self.running:
            self._pending.append((holder, t))
        else:
            holder.ref = self.ref_of(t)

    def bind(self, t: Tensor, ref: tuple) -> None:
        arr = t._data
        try:
            holder: Any = weakref.ref(arr)
        except TypeError:  # (device arrays take no weak reference: kept until recording ends)
            holder = arr
        self._refs[id(arr)] = (ref, holder)
        base = getattr(arr, "base", None)
        if base is not None:
            self.views.add(id(arr))
            while getattr(base, "base", None) is not None:
                base = base.base
            self.views.add(id(base))

    def known(self, t: Tensor) -> tuple | None:
        arr = t._data
        entry = self._refs.get(id(arr))
        if entry is None:
            return None
        holder = entry[1]
        alive = holder() if isinstance(holder, weakref.ref) else holder
        return entry[0] if alive is arr else None

    def ref_of(self, t: Tensor) -> tuple:
        """Where ``t`` comes from; a tensor not seen before is from outside the block."""
        ref = self.known(t)
        if ref is not None:
            return ref
        if t._wrapped_number:
            self.numbers.append(t)
            return ("n", len(self.numbers) - 1)
        self.outside.append(t)
        ref = ("e", len(self.outside) - 1)
        self.bind(t, ref)
        return ref

    def finish(self, outputs: tuple = ()) -> None:
        """The block's forward ended with ``outputs`` (noted when given): forget the arrays
        (holders keep their refs)."""
        if self.broken is None:
            self.outputs = [self.ref_of(t) if isinstance(t, Tensor) else None for t in outputs]
        self._refs = {}
        self.views = set()

    def stop(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
            self.ops = []
            self.outside = []
            self.numbers = []
            self._refs = {}
            self._pending = []


class RegionRecorder(Tracer):
    """The thread's tracer while a recorded block's forward runs: computes as the tracer it
    replaced (``previous``; None: eagerly) would and writes the calls into ``recording``.
    ``tensors``: the block's tensor arguments.  ``random_ok``: the recomputation restores the
    default generator's state, so it draws what the forward drew (``preserve_rng_state``)."""

    def __init__(
        self, recording: Recording, tensors: list, previous: Tracer | None, random_ok: bool
    ) -> None:
        self.recording = recording
        self.previous = previous
        self.random_ok = random_ok
        self.drawing: Any = None  # the default generator's state before the draw under way
        for k, t in enumerate(tensors):  # (the arguments ``recording.args`` saved)
            recording.bind(t, ("a", k))

    def apply(self, prim: Any, inputs: tuple, attrs: dict) -> Any:
        previous = self.previous
        rec = self.recording
        rec.running = True
        try:
            out = NotImplemented if previous is None else previous.apply(prim, inputs, attrs)
            if out is NotImplemented:
                out = registry.run(prim, inputs, attrs)
        except BaseException:
            rec.stop(f"{prim.name} raised (and the error was caught inside it)")
            raise
        finally:
            rec.running = False
        if rec.broken is None:
            refs = tuple(rec.ref_of(t) for t in inputs)
            rec.ops.append(("prim", prim, attrs, refs))
            rec.bind(out, ("v", len(rec.ops) - 1))
        pending = rec._pending
        if pending:
            rec._pending = []
            for holder, t in pending:
                rec.hold(holder, t)
        return out

    def made(self, node: Any, inputs: tuple, out: Tensor) -> None:
        if self.previous is not None:  # (a compiled region records the node)
            self.previous.made(node, inputs, out)

    def full(self, shape: tuple, value: Any, dtype: Any, device: Any) -> Any:
        previous = self.previous
        out = NotImplemented if previous is None else previous.full(shape, value, dtype, device)
        if out is NotImplemented:  # (as ``ops.creation`` makes it eagerly)
            out = Tensor._make(_storage.full(shape, value, dtype.np, device is not CPU))
        rec = self.recording
        if rec.broken is None:
            rec.ops.append(("full", tuple(shape), value, dtype))
            rec.bind(out, ("v", len(rec.ops) - 1))
        return out

    def backward(self, *args: Any) -> Any:
        self.recording.stop("it calls backward() or autograd.grad()")
        previous = self.previous
        return NotImplemented if previous is None else previous.backward(*args)

    def created(self, tensor: Tensor, redo: Any) -> None:
        rec = self.recording
        if isinstance(redo, Tensor):  # a copy of ``redo``'s values: the same ref
            ref = rec.known(redo)
            if ref is not None and rec.broken is None and redo._dtype is tensor._dtype:
                rec.bind(tensor, ref)
        elif redo is not None and self.drawing is not None and rec.broken is None:
            # a random draw: ``redo`` draws it again from the generator set to ``drawing``
            arr = tensor._data
            rec.ops.append(("draw", redo, self.drawing, tensor._dtype, arr.shape, type(arr)))
            rec.bind(tensor, ("v", len(rec.ops) - 1))
        self.drawing = None
        if self.previous is not None:
            self.previous.created(tensor, redo)

    def will_draw(self, generator: Any = None) -> None:
        rec = self.recording
        if not self.random_ok:
            rec.stop("it draws random numbers and preserve_rng_state=False")
        elif generator is not default_generator:
            # (the recomputation restores the default generator only: it draws anew from this)
            rec.stop("it draws random numbers from a generator other than the default one")
        elif rec.broken is None:
            self.drawing = generator.get_state()
        if self.previous is not None:
            self.previous.will_draw(generator)

    def host_read(self, tensor: Tensor, what: str, result: Any = None) -> None:
        self.recording.stop(f"it reads tensor values into Python ({what})")
        if self.previous is not None:
            self.previous.host_read(tensor, what, result)

    def wrote(self, target: Tensor, result: Tensor) -> None:
        rec = self.recording
        if rec.broken is None:
            ref = rec.known(target)
            arr = target._data
            if ref is None or ref[0] != "v":
                rec.stop("it writes in place into a tensor from outside it")
            elif id(arr) in rec.views or getattr(arr, "base", None) is not None:
                rec.stop("it writes in place into memory a view shares")
            else:
                rec.bind(target, rec.ref_of(result))
        if self.previous is not None:
            self.previous.wrote(target, result)

    def check(self, tensor: Tensor, fn: Any) -> None:
        if self.previous is not None:
            self.previous.check(tensor, fn)

    def side_effect(self, tensor: Tensor, what: str) -> None:
        if self.previous is not None:
            self.previous.side_effect(tensor, what)

    def opaque(self, owner: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        self.recording.stop(f"it calls {getattr(fn, '__qualname__', fn)}")
        previous = self.previous
        return NotImplemented if previous is None else previous.opaque(owner, fn, args, kwargs)
