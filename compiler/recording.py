"""Recording a call: the machinery whole steps (``step``: ``compile(fn)``) and compiled modules
(``module``: ``compile(model)``) share.

**The guard** (``Watch``): what a recording depends on besides the arguments' tensors, and the
key that tells two calls apart (grad mode; the arguments' shapes, dtypes, devices and
``requires_grad``; Python scalars by value; the modules, optimizers, closures and globals the
function reaches: their flags, attributes, parameters and state by identity and shape).

**The recorder** (``Recorder``): the thread's tracer while a call runs eagerly to be recorded.
Each primitive call becomes an IR value of one graph (``ir.Graph``, concrete sizes); arrays are
followed by identity, so a tensor that shares another's array (``detach()``) is the same value.
Tensors the call did not compute are program inputs (the arguments, and the tensors the guard
watches); constants made by creation functions are constants; random draws and optimizer
hyperparameters are inputs made again on every call.  A ``backward()`` inside is admitted
(``admission.admit``), captured by the backward compiler (``capture``, concrete sizes) and
grafted onto the forward's graph (the saved tensors *are* forward values, so the two fuse);
DistributedDataParallel's averaging is grafted with it (``_Buckets``).  In-place writes rebind
the written array to the new value; writes to inputs become ``write`` effects.  Optimizer
``step()``/``zero_grad()`` calls at the start and the end are kept as calls to replay around
the program.  What a replay could not reproduce stops the recording (``StepBreak``, with the
source line); ``Recorder.finish`` turns a complete recording into the graph's effects and the
output structure the front end replays (``step.Step``).  See docs/ARCHITECTURE.md,
"Recordings".
"""

from __future__ import annotations

import ast
import linecache
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import fusegrad
from fusegrad import amp as _amp
from fusegrad import storage as _storage
from fusegrad.autograd import grad_mode
from fusegrad.autograd.graph_base import epoch as _epoch
from fusegrad.autograd.tracer import Tracer, tracing
from fusegrad.cuda.array import CudaArray
from fusegrad.nn.module import ENTRY_DICTS, Entries, Module
from fusegrad.ops import registry as _registry
from fusegrad.optim.optimizer import Optimizer
from fusegrad.tensor import Tensor

from . import admission
from .capture import Captured, Fallback
from .capture import capture as _capture_graph
from .ddp import start_bucket, wait_bucket
from .ir import Graph, Value
from .key import BackwardCall, RedrawnTensor, Walk
from .key import walk as _walk

_SCALARS = (int, float, bool, str, type(None), complex)
# optimizer options a recorded update reads on every call (``optim.hyper``): not in the key;
# for these, whether they are zero is (the update skips a term at 0)
_RUNTIME_OPTIONS = frozenset(
    {
        "params",
        "param_names",
        "lr",
        "betas",
        "eps",
        "dampening",
        "alpha",  # RMSprop
        "rho",  # Adadelta
        "lr_decay",  # Adagrad
        "momentum_decay",  # NAdam
    }
)
_ZERO_OR_NOT = frozenset({"momentum", "weight_decay"})
# lists, tuples and dicts reached from ``fn`` with at most this many items, this many levels
# deep, are watched item by item (larger ones by identity only)
CONTAINER_ITEMS = 64
CONTAINER_DEPTH = 3


_HALF = fusegrad.dtypes.HALF  # numba has no CPU half type: steps holding one run eagerly
_SMALL_INT = fusegrad.dtypes.SMALL_INT  # nor casts to them in generated code: eagerly too


class StepBreak(Exception):
    """The call cannot be replayed; ``str(e)`` is the reason (with its source line)."""


_PACKAGES = tuple(
    os.path.dirname(os.path.abspath(f)) + os.sep for f in (fusegrad.__file__, __file__)
)


def _inside(filename: str) -> bool:
    """Whether code from ``filename`` is not the user's: fusegrad's packages, code fusegrad
    generated (``<fusegrad...>``: the ``out=`` wrappers of ``ops.spellings``), or importlib's
    frozen modules."""
    if filename.startswith(("<frozen", "<fusegrad")):
        return True
    return os.path.abspath(filename).startswith(_PACKAGES)


def line_in(code: types.CodeType | None) -> int | None:
    """The line the innermost running frame of ``code`` is at (None: no such frame): where a
    compiled function's own statement is, however deep the call that broke its recording."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and code is not None:
        if frame.f_code is code:
            return frame.f_lineno
        frame = frame.f_back
    return None


def _literal_at_call(data: Any) -> bool:
    """Whether the call running in the innermost frame outside fusegrad passes ``data`` as its
    first argument written out as a literal (numbers, and lists or tuples of them), read from
    the source positions of the running instruction."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and _inside(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None or frame.f_lasti < 0:
        return False
    positions = list(frame.f_code.co_positions())
    if frame.f_lasti // 2 >= len(positions):
        return False
    first, last, start, stop = positions[frame.f_lasti // 2]
    if first is None or last is None or start is None or stop is None:
        return False
    lines = [
        linecache.getline(frame.f_code.co_filename, n).encode() for n in range(first, last + 1)
    ]
    if not all(lines):
        return False
    lines[-1] = lines[-1][:stop]
    lines[0] = lines[0][start:]
    try:
        call = ast.parse(b"".join(lines).decode(), mode="eval").body
        if not isinstance(call, ast.Call) or not call.args:
            return False
        written = ast.literal_eval(call.args[0])
        return bool(np.array_equal(np.asarray(written), np.asarray(data)))
    except (SyntaxError, ValueError, TypeError, UnicodeDecodeError, MemoryError, RecursionError):
        return False


def _user_line() -> str:
    """``file:line`` of the innermost frame outside fusegrad (where the user's code is)."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if not _inside(frame.f_code.co_filename):
            name = os.path.abspath(frame.f_code.co_filename)
            line = linecache.getline(name, frame.f_lineno).strip()
            return f"{frame.f_code.co_filename}:{frame.f_lineno}" + (f" ({line})" if line else "")
        frame = frame.f_back
    return "<unknown>"


# ---- the guard ---------------------------------------------------------------------------------


class _Missing:
    """What a guard notes for a global name that is not there, or an empty closure cell."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def autocast_state() -> tuple:
    """The thread's autocast state (``fusegrad.amp``): per device type, enabled and dtype."""
    state = _amp._state
    if not state.enabled and not state.dtype:
        return ()
    return (tuple(sorted(state.enabled.items())), tuple(sorted(state.dtype.items())))


def group_options(group: dict) -> tuple:
    """An optimizer parameter group's part of the key: its options by value except the
    numeric hyperparameters (runtime inputs of a recorded update, ``optim.hyper``; schedulers
    change them every step), of which only "is it zero" shapes the update."""
    return tuple(
        (k, v != 0 if k in _ZERO_OR_NOT else v)
        for k, v in group.items()
        if k not in _RUNTIME_OPTIONS and isinstance(v, (*_SCALARS, tuple))
    )


# why a function that returns a tensor a backward outside it differentiates is no whole step
# (``step.CompiledFunction`` compiles it as a module instead: ``module.FunctionModule``)
HISTORY_NEEDED = (
    "the function returns a tensor that needs its autograd history (a backward outside the "
    "function differentiates it)"
)


class Watch:
    """What a recording depends on besides the arguments' tensors, and the key that tells two
    calls apart: grad mode; per argument, a tensor's shape, dtype, device and ``requires_grad``,
    a Python scalar's value, any other object's identity; for every module reachable from the
    arguments, ``fn``'s ``self``, closure and named globals: its ``training`` flag, its Python
    scalar attributes, and its parameters' and buffers' identities, shapes, dtypes and
    ``requires_grad``; an optimizer's parameters' identities; tensors and scalars in the closure
    and named globals (tensors by identity, scalars by value).

    ``tensors`` maps ``id(array)`` to where the array comes from on a replay: ``("arg", k)``,
    the k-th tensor argument, or ``("ext", tensor)``, a watched tensor.

    The walk also notes what it read from objects that may change without the guard epoch
    moving (``graph_base.epoch``: modules move it, and the tensors in ``read_tensors`` once a
    guard watches them), so that ``guard.FastGuard`` can check a later call in one pass:
    ``epoch`` (the stamp before the walk), ``cells``
    (closure cells and their contents), ``names`` (globals dicts, the names a code reads and
    what they held, ``MISSING`` for absent), ``codes`` (functions and their code objects),
    ``containers`` (small lists, tuples and dicts whose items were keyed, and larger ones
    whose size kept them out) and ``optimizers``."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict) -> None:
        self.epoch = _epoch.value  # (before anything is read)
        self.key_parts: list = [grad_mode._state.enabled, grad_mode._state.inference]
        self.args: list[Tensor] = []
        self.tensors: dict[int, tuple] = {}
        self.optimizers: list[Optimizer] = []
        self.seen: set[int] = set()
        self.depth = 0
        self.cells: list = []  # (cell, its contents)
        self.names: list = []  # (globals dict, name, what it held)
        self.codes: list = []  # (function, its __code__)
        self.containers: list = []  # (container, its items or None: more than CONTAINER_ITEMS)
        self.read_tensors: list[Tensor] = []  # every tensor read outside the arguments
        self.unstamped = False  # a module's parameters, buffers or submodules move no epoch
        self.key_parts.append(self.describe(args))
        self.key_parts.append(self.describe(tuple(sorted(kwargs.items()))))
        func = self.callee = getattr(fn, "__func__", fn)
        owner = getattr(fn, "__self__", None)
        if owner is not None:
            self.key_parts.append(("self", self.root(owner)))
        self.seen.add(id(func))
        self.key_parts.extend(self.function(func))
        # autocast casts nothing (``fusegrad.amp``), but Python may read its state
        self.key_parts.append(("autocast", autocast_state()))
        self.key = tuple(self.key_parts)

    def function(self, func: Any) -> list:
        """Key parts of a function's closure cells and of the globals its code names."""
        parts: list = []
        for cell in getattr(func, "__closure__", None) or ():
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                content = None
                self.cells.append((cell, MISSING))
            else:
                self.cells.append((cell, content))
            parts.append(("cell", self.root(content)))
        code = getattr(func, "__code__", None)
        glob = getattr(func, "__globals__", None)
        self.codes.append((func, code))
        if code is not None:
            parts.append(("code", code))  # (``f.__code__ = ...`` changes what a call does)
        if code is not None and glob is not None:
            for name in code.co_names:
                value = glob.get(name, MISSING) if type(glob) is dict else MISSING
                self.names.append((glob, name, value))
                if name in glob:
                    part = self.root(glob[name])
                    if part is not None:
                        parts.append((name, part))
        return parts

    def describe_guards(self) -> str:
        """What the key holds, in words (``explain``)."""
        parts = self.key_parts
        names = [p[0] for p in parts[4:-1] if p[0] != "code"] + ["autocast state"]
        return (
            f"grad mode {parts[0]}, inference mode {parts[1]}; {len(self.args)} tensor "
            "argument(s) by shape, dtype, device and requires_grad, other arguments by value "
            f"or identity; watched: {', '.join(map(str, names)) or 'nothing else'} (modules: "
            "training flags, Python scalar attributes, parameters and buffers by identity, "
            "shape, dtype and requires_grad; optimizers: their parameters; tensors by identity; "
            "Python scalars by value); the leaves' .grad state selects the program"
        )

    def describe(self, obj: Any) -> Any:
        """An argument's part of the key (tensors become argument inputs)."""
        if isinstance(obj, Tensor):
            arr = obj._data
            self.tensors.setdefault(id(arr), ("arg", len(self.args)))
            self.args.append(obj)
            return ("T", arr.shape, obj._dtype, type(arr), obj.requires_grad)
        if isinstance(obj, _SCALARS):
            return (type(obj), obj)
        if isinstance(obj, (tuple, list)):
            return (type(obj), tuple(self.describe(o) for o in obj))
        if isinstance(obj, dict):
            return (dict, tuple((k, self.describe(v)) for k, v in obj.items()))
        return ("id", id(obj), self.root(obj))

    def root(self, obj: Any) -> Any:
        """The key part of an object reached from ``fn`` (None: nothing to watch)."""
        if isinstance(obj, Tensor):
            arr = obj._data
            self.tensors.setdefault(id(arr), ("ext", obj))
            self.read_tensors.append(obj)
            return ("T", id(obj), arr.shape, obj._dtype, type(arr), obj._requires_grad)
        if isinstance(obj, _SCALARS):
            return (type(obj), obj)
        if id(obj) in self.seen:
            return ("seen", id(obj))
        if isinstance(obj, Module):
            self.seen.add(id(obj))
            return ("M", id(obj), tuple(self.module(m) for m in obj.modules()))
        if isinstance(obj, Optimizer):
            # parameters and state tensors by identity, options by value except the numeric
            # hyperparameters: runtime inputs of a recorded update (``optim.hyper``; schedulers
            # change them every step), of which only "is it zero" shapes the update
            self.seen.add(id(obj))
            self.optimizers.append(obj)
            parts: list = []
            for group in obj.param_groups:
                parts.append(id(group))  # (a recorded update reads this dict on every call)
                parts.append(group_options(group))
                for p in group["params"]:
                    parts.append(self.root(p))
                    state = obj.state.get(p)
                    if state:
                        parts.append(tuple((k, self.root(v)) for k, v in state.items()))
            return ("O", id(obj), tuple(parts))
        if isinstance(obj, types.FunctionType):
            # a function ``fn`` calls: its closure and the globals it names, watched as
            # ``fn``'s own are, a few levels deep
            self.seen.add(id(obj))
            self.depth += 1
            try:
                if self.depth <= CONTAINER_DEPTH:
                    return ("F", id(obj), tuple(self.function(obj)))
            finally:
                self.depth -= 1
            return None
        if isinstance(obj, (types.ModuleType, type, types.BuiltinFunctionType)):
            return None
        if isinstance(obj, (list, tuple, dict)) and len(obj) <= CONTAINER_ITEMS:
            # small containers in the closure or globals: their items watched like the rest
            # (tensors by identity, scalars by value), a few levels deep
            self.seen.add(id(obj))
            self.depth += 1
            try:
                if self.depth <= CONTAINER_DEPTH:
                    self.containers.append(
                        (
                            obj,
                            (tuple(obj), tuple(obj.values())) if type(obj) is dict else tuple(obj),
                        )
                    )
                    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
                    return (type(obj), id(obj), tuple((k, self.root(v)) for k, v in items))
            finally:
                self.depth -= 1
        elif isinstance(obj, (list, tuple, dict)):
            self.containers.append((obj, None))  # (its size keeps its items out of the key)
        return ("id", id(obj))

    def module(self, m: Module) -> tuple:
        self.seen.add(id(m))
        d = m.__dict__
        if not all(type(d.get(name)) is Entries for name in ENTRY_DICTS):
            self.unstamped = True  # (a subclass's own ``__setstate__`` left plain dicts)
        for v in m.__dict__.values():
            if isinstance(v, list):
                # (written in place, a list's items change no stamp: the fast guard checks
                # them; a longer one is out of the key while it stays long)
                self.containers.append((v, tuple(v) if len(v) <= CONTAINER_ITEMS else None))
        attrs = tuple(
            (k, v if isinstance(v, _SCALARS) else tuple(v))
            for k, v in m.__dict__.items()
            if isinstance(v, _SCALARS)
            or (
                isinstance(v, (list, tuple))
                and len(v) <= CONTAINER_ITEMS
                and all(isinstance(x, _SCALARS) for x in v)
            )
        )
        tensors = []
        for name, t in list(m._parameters.items()) + list(m._buffers.items()):
            tensors.append((name, None if t is None else self.root(t)))
        return (id(m), m.training, attrs, tuple(tensors))


# ---- recording ---------------------------------------------------------------------------------


class Recorder(Tracer):
    """The tracer of a recording call (see the module docstring).  ``broken`` is the reason the
    call cannot be replayed (None while it still can); once broken, it only stays out of the
    way: ``delegate`` (a compiled-backward region) handles every call."""

    prefers_composites = True  # (the compiler fuses them: fusegrad.autograd.tracer)

    records_calls = True  # (``admission.call_policy``: a compiled call inside is part of this)

    def __init__(self, watch: Watch, delegate: Any) -> None:
        self.watch = watch
        self.delegate = delegate
        self.graph = Graph()
        # id(array) -> (value, version counter, its value when bound)
        self.values: dict[int, tuple[Value, Any, int]] = {}
        self.keep: list = []  # arrays kept alive while their ids are keys
        self.sharing: dict[int, set[int]] = {}  # id(root array) -> bound arrays on its memory
        self.stale: dict[int, str] = {}  # id(array) -> where a write through another array was
        # per program input: ("arg", k) | ("ext", t) | ("draw", redo) | ("scalar", redo) |
        # ("cast", k, dtype): input k, a runtime scalar, cast
        self.sources: list = []
        self.runtime_keys: dict = {}  # ``optim.hyper`` key -> its runtime input
        self.input_arrays: list = []  # their arrays in this call
        self.source_of: dict[int, int] = {}  # id(array) -> program input index
        self.input_values: list[Value] = []
        self.leaves: list[Tensor] = []
        self.leaf_of: dict[int, int] = {}
        self.grad_effects: dict[int, Value] = {}  # leaf slot -> its gradient's value
        self.grad_preset: dict[int, bool] = {}  # leaf slot -> .grad existed when first reached
        # leaf slot -> the value its ``.grad`` tensor was bound to by the last backward (a later
        # in-place write, e.g. ``clip_grad_norm_``, rebinds the tensor: ``final_grads``)
        self.grad_bound: dict[int, Value] = {}
        self.writes: dict[int, list] = {}  # program input index -> [final value, bumps]
        self.prefix: list = []
        self.suffix: list = []
        # the memory (root arrays' ids) the suffix calls write: an optimizer's parameters and
        # state; None once a call whose writes are unknown is in it.  Tensor ops after the
        # suffix that read none of it are recorded (the program computes them before the
        # calls run: the same values), anything else after it stops the recording
        self.suffix_writes: set[int] | None = set()
        # optimizers whose ``step()`` is recorded into the program although it runs as a call
        # by default (their multi-tensor update: ``optim/_foreach.py``), because tensor ops
        # after it read what it updates; and the one whose update such an op read (``step``
        # records again with it inline)
        self.inline_steps: set[int] = set()
        self.read_update_of: Any = None
        self.started = False  # a tensor op was recorded
        self.pending: list = []  # host reads not yet known to be harmless: (result, what, line)
        # the recorded function's code, and per host read the line of its own statement that
        # made it (``line_in``): where a graph break splits the function (``breaks``)
        self.code: types.CodeType | None = None
        self.read_sites: list[int | None] = []
        self.break_site: int | None = None  # the site of the read that broke the recording
        self.backwards = 0
        # the DistributedDataParallel wrappers whose hooks the program does the work of
        self.ddps: set[int] = set()
        self.checks: list = []  # (value, fn): eager's validations of values (index ranges)
        self.forward_ops = 0  # primitives recorded from the function's own code
        self.backward_ops = 0  # values the captured backward graphs added
        self.eager_saved: dict[int, int] = {}  # id(array) -> bytes eager's nodes saved
        self.saved_values: set[Value] = set()  # forward values the backward reads
        self.broken: str | None = None
        self.explaining = False  # set by ``explain``
        self.history = False  # see ``finish``
        self.user_outputs = 0
        self.output_tensors: list[Tensor] = []  # the call's output tensors, by output slot
        self.fresh_slots: list[bool] = []  # per output slot: eager made it in new memory
        # where the recorded arrays live: "cpu" or "cuda" (set by the first array that is not
        # a 0-d host scalar; a program runs on one device: ``note_device``)
        self.device: str | None = None

    # ---- bookkeeping --------------------------------------------------------------------------
    def stop(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason

    def event(self, reading: bool = False) -> None:
        """A tensor op is about to be recorded: fine unless Python read values before it or the
        optimizer already stepped (``reading``: an op that only reads tensors, which may follow
        an optimizer's step when it reads nothing the step writes: ``after_suffix``)."""
        if self.pending:
            _, what, line, _ = self.pending[0]
            self.break_site = self.read_sites[0]
            raise StepBreak(
                f"Python read a tensor's value ({what}) at {line}, and tensor ops follow"
            )
        if self.suffix and (self.suffix_writes is None or not reading):
            owner, fn = self.suffix[0][0], self.suffix[0][1]
            raise StepBreak(
                f"a tensor op at {_user_line()} after {type(owner).__name__}.{fn.__name__}() "
                "(only optimizer and zero_grad calls at the start and the end are replayed)"
            )
        self.started = True

    @staticmethod
    def _root(arr: Any) -> Any:
        """What ``arr`` is a view of: its base array, or a CUDA array's device buffer."""
        if type(arr) is CudaArray:
            return arr.buffer
        while isinstance(arr.base, np.ndarray):
            arr = arr.base
        return arr

    def note_device(self, arr: Any) -> None:
        """``arr`` is an input, a constant or a new tensor of the program: its device must be
        the recording's (a 0-d host array is a scalar, which a CUDA program reads too)."""
        if type(arr) is CudaArray:
            device = "cuda"
        elif arr.ndim == 0:
            return
        else:
            device = "cpu"
        if self.device is None:
            self.device = device
        elif device != self.device:
            raise StepBreak(
                f"{'a CUDA' if device == 'cuda' else 'a CPU'} tensor at {_user_line()} in a call "
                f"whose other tensors are on {'a CUDA device' if device == 'cpu' else 'the CPU'} "
                "(a compiled program runs on one device)"
            )

    def bind(self, t: Tensor, value: Value) -> None:
        arr = t._data
        if id(arr) not in self.values:
            self.keep.append(arr)
            self.sharing.setdefault(id(self._root(arr)), set()).add(id(arr))
            self.stale.pop(id(arr), None)
        counter = t._version_counter
        self.values[id(arr)] = (value, counter, counter.value)

    def value_of(self, t: Tensor) -> Value:
        arr = t._data
        found = self.values.get(id(arr))
        if found is not None:
            value, counter, version = found
            if t._version_counter is not counter:
                # a view made after its primitive ran shares its base's counter from then on
                self.values[id(arr)] = (value, t._version_counter, t._version_counter.value)
            elif counter.value != version:
                raise StepBreak(
                    f"{_describe(t)} was modified outside the recorded ops (at {_user_line()})"
                )
            return value
        where = self.stale.get(id(arr))
        if where is not None:
            raise StepBreak(
                f"{_describe(t)} is read at {_user_line()} after an in-place write at {where} "
                "into memory it shares (a view and its base)"
            )
        if t._wrapped_number:  # a Python number (kept: a node may save it)
            value = self.graph.scalar(arr.item(), t._dtype)
            self.bind(t, value)
            return value
        source = self.watch.tensors.get(id(arr))
        if source is None:
            if self.broken is None:
                self.break_site = line_in(self.code)
            raise StepBreak(
                f"{_describe(t)} used at {_user_line()} was not computed by the function and is "
                "not an argument, a parameter or buffer of a watched module, or a tensor in its "
                "closure or globals (made by an untraced path, e.g. torch.tensor(data) inside)"
            )
        return self.new_input(t, source)

    def new_input(self, t: Tensor, source: tuple) -> Value:
        arr = t._data
        self.note_device(arr)
        index = len(self.sources)
        self.sources.append(source)
        self.input_arrays.append(arr)
        value = self.graph.input("arg", index, arr.shape, t._dtype)
        self.input_values.append(value)
        self.source_of[id(arr)] = index
        self.bind(t, value)
        return value

    # ---- Tracer ----------------------------------------------------------------------------------
    def apply(self, prim: Any, inputs: tuple, attrs: dict) -> Any:
        if self.broken is None:
            try:
                self.event(reading=True)
                if self.suffix:
                    self.after_suffix(inputs)
            except StepBreak as e:
                self.stop(str(e))
        # (the call runs eagerly: the region ``delegate`` takes no calls, it sees the node
        # made through ``made``)
        out = _registry.run(prim, inputs, attrs)
        if self.broken is None:
            try:
                self.record(prim, inputs, attrs, out)
            except StepBreak as e:
                self.stop(str(e))
        return out

    def made(self, node: Any, inputs: tuple, out: Tensor) -> None:
        self.delegate.made(node, inputs, out)  # (the region records it on the tape)

    def record(self, prim: Any, inputs: tuple, attrs: dict, out: Tensor) -> None:
        values = tuple(self.value_of(t) for t in inputs)
        arr = out._data
        if prim.name == "to_device" and attrs.get("device") != attrs.get("source"):
            raise StepBreak(
                f"a copy between the CPU and a CUDA device (.cpu(), .to(), .cuda()) at "
                f"{_user_line()} (a compiled program runs on one device)"
            )
        self.note_device(arr)
        try:
            shape, dtype = prim.meta(
                tuple(v.shape for v in values), tuple(v.dtype for v in values), **attrs
            )
        except _registry.DataDependentShape as e:
            raise StepBreak(f"{prim.name} at {_user_line()}: {e}") from None
        if tuple(shape) != arr.shape or dtype is not out._dtype:
            raise StepBreak(f"{prim.name}: its shape rule disagrees with its kernel")
        if dtype in _HALF or any(v.dtype in _HALF for v in values):
            raise StepBreak(
                f"{prim.name} at {_user_line()}: a float16/bfloat16 value (compiled programs "
                "take no half dtypes)"
            )
        if dtype.is_complex or any(v.dtype.is_complex for v in values):
            raise StepBreak(
                f"{prim.name} at {_user_line()}: a complex value (compiled programs take no "
                "complex dtypes)"
            )
        if dtype in _SMALL_INT or any(v.dtype in _SMALL_INT for v in values):
            raise StepBreak(
                f"{prim.name} at {_user_line()}: an int16/int8/uint8 value (compiled programs "
                "take no small integers)"
            )
        try:
            value = self.graph.add(prim.name, values, attrs, arr.shape, out._dtype)
        except TypeError:
            raise StepBreak(f"{prim.name} at {_user_line()}: an attribute is unhashable") from None
        self.bind(out, value)
        self.forward_ops += 1

    def full(self, shape: tuple, value: Any, dtype: Any, device: Any) -> Any:
        on_cuda = device is not None and str(device).startswith("cuda")
        if self.broken is not None or (device is not None and not on_cuda and str(device) != "cpu"):
            return NotImplemented
        arr = _storage.full(shape, value, dtype.np, on_cuda)
        try:
            self.event(reading=True)  # (a new tensor: reads nothing an optimizer writes)
            self.note_device(arr)
        except StepBreak as e:
            self.stop(str(e))
            return NotImplemented
        t = Tensor._make(arr)
        self.bind(t, self.graph.full(tuple(shape), value, dtype))
        return t

    def created(self, t: Tensor, redo: Any) -> None:
        if self.broken is not None:
            return
        try:
            self.event(reading=True)  # (a new tensor: reads nothing an optimizer writes)
            self.note_device(t._data)
            if t._requires_grad:
                raise StepBreak(f"a tensor requiring grad created at {_user_line()}")
        except StepBreak as e:
            self.stop(str(e))
            return
        if isinstance(redo, Tensor):  # a copy of ``redo``'s values (perhaps cast)
            try:
                value = self.value_of(redo)
                if value.dtype is not t._dtype:
                    value = self.cast(t, value)
                self.bind(t, value)
            except StepBreak as e:
                self.stop(str(e))
        elif redo is None and t._data.ndim == 0 and t._data.dtype.kind in "fiub":
            self.bind(t, self.graph.scalar(t._data.item(), t._dtype))  # (foldable, fusable)
        elif redo is None:  # (a CUDA constant: copied to the host once, the program uploads it)
            data = t._data
            self.bind(t, self.graph.constant(data.to_host() if type(data) is CudaArray else data))
        else:
            # a random draw, or a runtime scalar of an optimizer (``optim.hyper``): both made
            # again on every call, in the recording's order
            if getattr(redo, "runtime_scalar", False):
                key = getattr(redo, "key", None)
                known = self.runtime_keys.get(key) if key is not None else None
                if known is not None:  # the same option again: one input
                    self.bind(t, known)
                else:
                    value = self.new_input(t, ("scalar", redo))
                    if key is not None:
                        self.runtime_keys[key] = value
            else:
                self.new_input(t, ("draw", redo))

    def created_as(self, t: Tensor, recipe: tuple) -> None:
        """A constant with its recipe (``Tracer.created_as``), kept beside the graph's constants for
        ``dynamic`` to make it again at other sizes; the recording itself holds the array."""
        self.created(t, None)
        found = self.values.get(id(t._data)) if self.broken is None else None
        if found is not None and found[0].op == "constant":
            index = found[0].attr("index")
            recipes = self.graph.recipes
            recipes[index] = recipe if recipes.get(index, recipe) == recipe else None

    def cast(self, t: Tensor, value: Value) -> Value:
        """``value`` cast to ``t``'s dtype: a runtime scalar (``optim.hyper``) becomes a runtime
        input of that dtype, cast as the op surface casts it (one kernel fewer, and a kernel
        of one float dtype, which the interpreter runs); anything else a ``cast`` value."""
        source = self.sources[value.attr("index")] if value.op == "input" else None
        if source is None or source[0] != "scalar":
            return self.graph.add("cast", (value,), {"dtype": t._dtype}, value.shape, t._dtype)
        index = value.attr("index")
        key = ("cast", index, t._dtype)
        known = self.runtime_keys.get(key)
        if known is None:  # ("cast", k, dtype): input k's value (computed before it) cast
            known = self.runtime_keys[key] = self.new_input(t, ("cast", index, t._dtype.np))
        return known

    def from_data(self, t: Tensor, data: Any) -> None:
        """A tensor made from Python data: a constant when the data is written out in the
        source of the call that made it (``x.new_tensor([0.5, 0.1])``: the same on every call),
        else left unknown (a break where it is used: the data may be computed)."""
        if self.broken is None and _literal_at_call(data):
            self.created(t, None)

    def after_suffix(self, inputs: Sequence[Tensor]) -> None:
        """An op after the suffix's calls: it must not read what they write (the program runs
        before them)."""
        writes = self.suffix_writes or set()
        for t in inputs:
            if id(self._root(t._data)) in writes:
                owner, fn = self.suffix[0][0], self.suffix[0][1]
                self.read_update_of = owner
                raise StepBreak(
                    f"a tensor op at {_user_line()} after {type(owner).__name__}."
                    f"{fn.__name__}() reads {_describe(t)}, which that call updates"
                )

    def host_read(self, t: Tensor, what: str, result: Any = None) -> None:
        if self.broken is None and self.suffix:
            try:
                self.after_suffix((t,))
            except StepBreak as e:
                self.stop(str(e))
        if self.broken is None:
            found = self.values.get(id(t._data))
            value = found[0] if found is not None and found[2] == t._version_counter.value else None
            self.pending.append((result, what, _user_line(), value))
            self.read_sites.append(line_in(self.code))

    def wrote(self, target: Tensor, result: Tensor) -> None:
        if self.broken is not None:
            return
        try:
            self.event()
            arr = target._data
            if id(arr) not in self.values:
                self.value_of(target)  # an input written before it was read
            value = self.value_of(result)
            if value.dtype is not target._dtype or value.shape != arr.shape:
                raise StepBreak(f"an in-place write at {_user_line()} that casts or broadcasts")
            self.values[id(arr)] = (value, target._version_counter, target._version_counter.value)
            # other arrays on the same memory (views, a view's base) now hold values the graph
            # does not know: reading one stops the recording
            for other in self.sharing.get(id(self._root(arr)), ()):
                if other != id(arr) and other in self.values:
                    del self.values[other]
                    self.stale[other] = _user_line()
            index = self.source_of.get(id(arr))
            if index is not None:
                entry = self.writes.setdefault(index, [value, 0])
                entry[0] = value
                entry[1] += 1
        except StepBreak as e:
            self.stop(str(e))

    def check(self, t: Tensor, fn: Any) -> None:
        if self.broken is None:
            try:
                self.checks.append((self.value_of(t), fn))
            except StepBreak as e:
                self.stop(str(e))

    def side_effect(self, t: Tensor, what: str) -> None:
        if what == "requires_grad_()" and self.made_inside(t):
            # ``x.detach().requires_grad_()`` (the inputs of ``fusegrad.func.grad``): the flag
            # of a tensor the call made is seen by nothing outside the call, and what the call
            # does with it (a backward, the outputs) is recorded as usual
            return
        self.stop(f"{what} at {_user_line()} inside the compiled function")

    def made_inside(self, t: Tensor) -> bool:
        """True when ``t`` is a tensor the recorded ops made, or a new alias of one or of an
        input (``detach()``): not an argument, parameter, buffer or closure tensor the guard
        watches, whose flags are seen after the call."""
        arr = t._data
        watched = self.watch.tensors.get(id(arr))
        if watched is None:
            return id(arr) in self.values
        return not any(t is a for a in self.watch.args) and not any(
            ref is t for kind, ref in self.watch.tensors.values() if kind == "ext"
        )

    def opaque(self, owner: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        if self.broken is not None:
            return NotImplemented
        if any(callable(a) for a in args) or any(callable(v) for v in kwargs.values()):
            self.stop(f"{type(owner).__name__}.{fn.__name__}() with a closure at {_user_line()}")
            return NotImplemented
        if (
            fn.__name__ == "step"
            and (getattr(owner, "traceable", False) or id(owner) in self.inline_steps)
            and not args
            and not kwargs
            and not self.suffix
        ):
            return NotImplemented  # its tensor ops are recorded into the program
        call = (owner, fn, args, dict(kwargs))
        # zero_grad touches only ``.grad``, which recorded ops never read (reading it stops the
        # recording): before any backward it is replayed before the program
        early = not self.started or (
            fn.__name__ == "zero_grad" and (not self.backwards or self.grads_untouched(owner))
        )
        if early and not self.suffix:
            self.prefix.append(call)
        else:
            self.suffix.append(call)
            self.note_writes(owner)
        with tracing(None):  # its own ops are not recorded: it is replayed as a call
            return fn(owner, *args, **kwargs)

    def grads_untouched(self, owner: Any) -> bool:
        """Whether no recorded backward has reached the parameters of ``owner`` (an optimizer
        or a module) so far: its ``zero_grad()`` then replays before the program, where it
        clears the same ``.grad``s (a GAN's second optimizer, cleared between the two
        updates)."""
        if isinstance(owner, Optimizer):
            params = [p for group in owner.param_groups for p in group["params"]]
        elif isinstance(owner, Module):
            params = list(owner.parameters())
        else:
            return False
        for p in params:
            slot = self.leaf_of.get(id(p))
            if slot is not None and slot in self.grad_effects:
                return False
        return True

    def note_writes(self, owner: Any) -> None:
        """What a call put in the suffix writes (``suffix_writes``)."""
        if self.suffix_writes is None:
            return
        if not isinstance(owner, Optimizer):
            self.suffix_writes = None
            return
        tensors = [p for group in owner.param_groups for p in group["params"]]
        tensors += [
            v for state in owner.state.values() for v in state.values() if isinstance(v, Tensor)
        ]
        for t in tensors:
            self.suffix_writes.add(id(self._root(t._data)))

    def backward(
        self,
        roots: Any,
        grads: Any,
        retain_graph: bool,
        create_graph: bool,
        inputs: Any,
        accumulate: bool,
    ) -> Any:
        if self.broken is None:
            try:
                self.event()
                results = self.record_backward(
                    BackwardCall(roots, grads, retain_graph, create_graph, inputs, accumulate)
                )
            except StepBreak as e:
                self.stop(str(e))
            else:
                return results
        return self.delegate.backward(roots, grads, retain_graph, create_graph, inputs, accumulate)

    def record_backward(self, call: BackwardCall) -> Any:
        """A ``backward()``/``grad()`` of the call: admitted, captured, grafted onto the
        forward's graph with its ``.grad`` effects, then run eagerly (the call's results are
        eager's) and its results bound to their values."""
        roots, grads, inputs, accumulate = call.outputs, call.grads, call.inputs, call.accumulate
        w, captured, ddps = self.captured_backward(
            roots, grads, inputs, accumulate, call.create_graph
        )
        bgraph = captured.graph
        buckets = _Buckets(self, w, bgraph, ddps) if ddps else None
        mapping = self.graft(
            w,
            bgraph,
            self.graph,
            lambda k: self.value_of(grads[k]),
            on_value=None if buckets is None else buckets.mapped,
        )
        self.backward_ops += sum(1 for v in bgraph.values if v.op not in ("input", "constant"))
        grad_values = self.grad_values(w, bgraph, mapping, buckets)
        bind_grads, preset_grads = self.add_grad_effects(grad_values)
        self.backwards += 1
        with tracing(None):  # the derivative rules run eagerly, unrecorded
            if self.explaining:  # explain() also shows the backward compiled on its own
                results = self.delegate.backward(
                    roots, grads, call.retain_graph, call.create_graph, inputs, accumulate
                )
            else:
                results = call.eagerly()
        if not accumulate:
            for kind, pos, v in bgraph.effects:
                if kind == "capture" and results[pos] is not None:
                    self.bind(results[pos], mapping[v])
        self.bind_grads(bind_grads, preset_grads)
        return results

    def captured_backward(
        self, roots: Any, grads: Any, inputs: Any, accumulate: bool, create_graph: bool
    ) -> tuple[Walk, Captured, list]:
        """The backward's walk, admitted for a whole step, and its captured graph (concrete
        sizes); the DistributedDataParallel wrappers whose averaging the program does."""
        where = _user_line()
        w = _walk(roots, grads, inputs, accumulate, create_graph)
        plan = admission.admit(
            w,
            admission.STEP,
            create_graph=create_graph,
            inputs=inputs,
            accumulate=accumulate,
            where=where,
        )
        if isinstance(plan, str):
            raise StepBreak(plan)
        ddps = plan.ddp or []
        if ddps:
            # the capture leaves the wrappers' hooks out: the program averages the buckets
            w.has_hooks = False
            self.ddps.update(id(d) for d in ddps)
        try:
            captured = _capture_graph(
                w, roots, grads, inputs, accumulate, symbolic=False, allow_opaque=False
            )
        except Fallback as e:
            raise StepBreak(f"backward() at {where}: {e}") from None
        return w, captured, ddps

    def grad_values(self, w: Walk, bgraph: Graph, mapping: dict, buckets: Any) -> dict:
        """Leaf slot (of the recording) -> the value of its gradient in this backward (the
        bucket's average under DistributedDataParallel)."""
        grad_values = {}
        for kind, slot, v in bgraph.effects:
            if kind == "grad":
                leaf = w.leaves[slot]
                source = self.watch.tensors.get(id(leaf._data))
                if source is None:
                    raise StepBreak(
                        f"backward() at {_user_line()} reaches {_describe(leaf)}, which the guard "
                        "does not watch (not an argument, parameter or closure tensor)"
                    )
                grad_values[self.leaf_slot(leaf)] = (
                    mapping[v] if buckets is None else buckets.averaged.get(slot, mapping[v])
                )
            elif kind != "capture":
                raise StepBreak(f"backward() at {_user_line()}: {kind} effects are not replayed")
        return grad_values

    def add_grad_effects(self, grad_values: dict) -> tuple[list, list]:
        """Add this backward's gradients to the ``.grad`` effects (a second backward adds into
        the first's); which ``.grad`` tensors to bind to their values afterwards: those made
        by the backward, and those it added into."""
        graph = self.graph
        for slot, value in grad_values.items():
            leaf = self.leaves[slot]
            previous = self.grad_effects.get(slot)
            if previous is None:
                self.grad_preset[slot] = leaf._grad is not None
                self.grad_effects[slot] = value
            elif self.grad_preset[slot]:
                raise StepBreak("two backward() calls reach a leaf whose .grad existed")
            else:
                self.grad_effects[slot] = graph.add(
                    "add", (previous, value), {}, value.shape, value.dtype
                )
        bind_grads = [
            (self.leaves[slot], value)
            for slot, value in self.grad_effects.items()
            if slot in grad_values and not self.grad_preset[slot]
        ]
        # a ``.grad`` that existed (``zero_grad(set_to_none=False)``, accumulation over calls)
        # is added into: what the optimizer then reads of it is its value before the program
        # (an input, read on every call: zeros when it is None then) plus the gradient
        preset_grads = [
            (self.leaves[slot], grad_values[slot])
            for slot in grad_values
            if self.grad_preset[slot] and self.leaves[slot]._grad is not None
        ]
        return bind_grads, preset_grads

    def bind_grads(self, bind_grads: list, preset_grads: list) -> None:
        """After the eager backward: each ``.grad`` it made is its value (the optimizer reads
        it), each it added into the sum of its value before the program and the gradient."""
        for leaf, value in bind_grads:
            grad = leaf._grad
            if grad is not None and grad._data.shape == value.shape:
                self.bind(grad, value)
                self.grad_bound[self.leaf_slot(leaf)] = value
        for leaf, value in preset_grads:
            grad = leaf._grad
            if grad is None or grad.requires_grad or grad._data.shape != value.shape:
                continue  # (not read as the sum: a read of it stops the recording)
            source = ("grad", self.watch.tensors[id(leaf._data)], grad._data.shape, grad._dtype)
            before = self.new_input(grad, source)
            total = self.graph.add("add", (before, value), {}, value.shape, value.dtype)
            self.bind(grad, total)
            self.grad_bound[self.leaf_slot(leaf)] = total

    def final_grads(self) -> dict[int, Value]:
        """The ``.grad`` effects: per leaf slot, what its ``.grad`` holds at the end of the call
        -- the backward's gradient, or what an in-place write after it made of it (gradient
        clipping: ``p.grad.mul_(coef)``).  A ``.grad`` the call changed otherwise after its
        backward (set to None, replaced, or one that existed before the call and was written
        into) stops the recording: the program's effect could not say it."""
        final = {}
        for slot, value in self.grad_effects.items():
            leaf = self.leaves[slot]
            grad = leaf._grad
            found = None if grad is None else self.values.get(id(grad._data))
            bound = self.grad_bound.get(slot)
            if found is not None and found[0] is bound:
                final[slot] = value  # (unchanged since the backward)
                continue
            current = None
            if found is not None and grad._version_counter.value == found[2]:
                current = found[0]
            if self.grad_preset[slot] or current is None or bound is None:
                raise StepBreak(
                    f"the .grad of {_describe(leaf)} is changed after backward() in a way a "
                    "replay cannot repeat (set to None, replaced, or written outside the "
                    "recorded ops, or one that existed before the call written into)"
                )
            if current.shape != value.shape or current.dtype is not value.dtype:
                raise StepBreak(f"the .grad of {_describe(leaf)} changes shape or dtype")
            final[slot] = current
        return final

    def graft(
        self,
        w: Any,
        bgraph: Graph,
        into: Graph,
        root: Callable[[int], Value],
        saved: Callable[[Value], Value] | None = None,
        on_value: Callable[[Value | None, dict], None] | None = None,
    ) -> dict[Value, Value]:
        """Copy the captured backward graph ``bgraph`` (of walk ``w``) into ``into``: root
        gradient k becomes ``root(k)``, a saved tensor the recorded forward value it is
        (through ``saved``, when given), constants and ops themselves.  Returns the mapping;
        raises ``StepBreak`` for what the recording cannot name."""
        mapping: dict[Value, Value] = {}
        for v in bgraph.values:
            if v.op == "input":
                kind, index = v.attr("kind"), v.attr("index")
                if kind == "root":
                    mapping[v] = root(index)
                elif kind == "saved":
                    node, sv = w.saved[index]
                    if type(sv) is RedrawnTensor:  # (not the forward's value: drawn again)
                        raise StepBreak(
                            f"backward() at {_user_line()} recomputes a random draw of a "
                            "checkpointed function"
                        )
                    t = sv._tensor
                    arr = sv._data if t is None else t._data
                    found = self.values.get(id(arr))
                    if found is None:
                        value = self.value_of(Tensor._make(arr))
                    elif sv._counter is not found[1] or found[2] != sv._version:
                        raise StepBreak(f"{node.name()} saved a tensor that was modified later")
                    else:
                        value = found[0]
                    self.saved_values.add(value)
                    self.eager_saved[id(arr)] = arr.nbytes
                    mapping[v] = value if saved is None else saved(value)
                else:
                    raise StepBreak(f"the backward at {_user_line()} reads an existing .grad")
            elif v.op == "constant":
                mapping[v] = into.constant(bgraph.constants[v.attr("index")])
            else:
                mapping[v] = into.add(
                    v.op, tuple(mapping[i] for i in v.inputs), v.attrs, v.shape, v.dtype, v.origin
                )
            if on_value is not None:
                on_value(v, mapping)
        if on_value is not None:
            on_value(None, mapping)  # (the end of the backward)
        return mapping

    def leaf_slot(self, leaf: Tensor) -> int:
        slot = self.leaf_of.get(id(leaf))
        if slot is None:
            slot = self.leaf_of[id(leaf)] = len(self.leaves)
            self.leaves.append(leaf)
        return slot

    # ---- the end of the call -----------------------------------------------------------------
    def finish(
        self, result: Any, saved: Sequence[Value] = (), history: bool = False
    ) -> tuple[Any, dict, int]:
        """The end of a replayable recording (raises ``StepBreak``): the graph's effects made,
        and what ``step.Step`` replays -- the output structure, the version bumps of the
        written inputs, the number of program outputs.  ``saved``:
        values the program also outputs, after the function's own outputs (what a module's
        backward reads, ``module``); ``history``: outputs may require grad (a module's, whose
        backward node ``module`` makes)."""
        if self.broken is not None:
            raise StepBreak(self.broken)
        self.history = history
        reads = {id(r): i for i, (r, *_) in enumerate(self.pending)}
        returned_reads: set[int] = set()
        outputs: list[Value] = []
        spec = self.output_spec(result, reads, returned_reads, outputs)
        for i, (_, what, line, _) in enumerate(self.pending):
            if i not in returned_reads:
                self.break_site = self.read_sites[i]
                raise StepBreak(f"Python read a tensor's value ({what}) at {line}")
        graph = self.graph
        final_grads = self.final_grads()
        for slot in sorted(final_grads):
            graph.effects.append(("grad", slot, final_grads[slot]))
        bumps = {}
        for index, (value, count) in sorted(self.writes.items()):
            graph.effects.append(("write", index, value))
            bumps[index] = count
        self.user_outputs = len(outputs)
        outputs = outputs + list(saved)
        for k, value in enumerate(outputs):
            graph.effects.append(("capture", k, value))
        return spec, bumps, len(outputs)

    def output_spec(self, obj: Any, reads: dict, returned: set, outputs: list) -> Any:
        if isinstance(obj, Tensor):
            arr = obj._data
            known = self.watch.tensors.get(id(arr))
            if known is not None and (id(arr) not in self.values or id(arr) in self.source_of):
                # an argument or watched tensor (perhaps written in place): itself, or a new
                # tensor on its memory (``x.detach()``), as eager returns
                kind, ref = known
                same = obj is (self.watch.args[ref] if kind == "arg" else ref)
                if obj.requires_grad and not same:
                    raise StepBreak(f"the function returns a view of {_describe(obj)}")
                return ("arg", kind, ref, same)
            if id(arr) not in self.values:
                raise StepBreak(f"the function returns {_describe(obj)}, of unknown origin")
            if obj.requires_grad and not self.backwards and not self.history:
                raise StepBreak(HISTORY_NEEDED)
            freed = None
            if obj.requires_grad and not self.history:
                # after backward(): eager's tensor keeps a graph whose saved values are freed
                # (a later backward through it raises); the replay's gets a node that raises
                # the same.  A graph still usable (retain_graph, nothing saved) is not replayed.
                freed = _freed_history(obj)
                if freed is None:
                    raise StepBreak(
                        f"the function returns {_describe(obj)} whose autograd graph a later "
                        "backward could still use (retain_graph, or nothing saved): compile "
                        "the module, fusegrad.compile(model), for a backward outside"
                    )
            for k, t in enumerate(self.output_tensors):
                if t is obj:  # returned again: the same tensor again, as in eager
                    return ("out", k, self.fresh_slots[k], freed)
            value = self.value_of(obj)
            outputs.append(value)
            self.output_tensors.append(obj)
            # a result eager made in new memory must not come back as (part of) an input or a
            # constant of the program, as a simplified ``x * 1`` would
            fresh = not any(_storage.may_share_memory(arr, a) for a in self.input_arrays)
            self.fresh_slots.append(fresh)
            return ("out", len(outputs) - 1, fresh, freed)
        if id(obj) in reads and isinstance(obj, (float, list)):
            i = reads[id(obj)]
            returned.add(i)
            _, what, line, value = self.pending[i]
            if what not in ("item()", "Python float", "tolist()") or value is None:
                raise StepBreak(f"the function returns a value read by {what} at {line}")
            outputs.append(value)
            return ("read", len(outputs) - 1, what == "tolist()")
        if isinstance(obj, tuple) and type(obj) is not tuple:  # a namedtuple
            return (
                "namedtuple",
                type(obj),
                [self.output_spec(o, reads, returned, outputs) for o in obj],
            )
        if isinstance(obj, (tuple, list)):
            return (type(obj), [self.output_spec(o, reads, returned, outputs) for o in obj])
        if isinstance(obj, dict):
            return (
                "dict",
                [(k, self.output_spec(v, reads, returned, outputs)) for k, v in obj.items()],
            )
        return ("object", obj)


def _describe(t: Tensor) -> str:
    return f"a {t._dtype.name} tensor of shape {list(t._data.shape)}"


def _freed_history(t: Tensor) -> str | None:
    """The name of ``t``'s ``grad_fn`` when a backward through it would reach a node whose
    saved values a backward freed (eager raises there), else None."""
    root = t.grad_fn
    stack = [root]
    seen = set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        rule = getattr(node, "_rule", None)
        if rule is not None and rule.save_index and getattr(node, "_saved", ()) is None:
            return root.name()
        stack.extend(edge[0] for edge in node.next_functions)
    return None


_KEY_PARTS = ("grad mode", "inference mode", "the positional arguments", "the keyword arguments")


def why_recorded(name: str, keys: Any, key: tuple) -> str:
    """Why a call of ``name`` with guard key ``key`` was recorded (the trace report): its first
    call, or the difference from the last other key recorded (``keys``, in recording order)."""
    earlier = [k for k in keys if k != key]
    if not earlier:
        return f"first call of {name}"
    return f"recording #{len(earlier) + 1} of {name}: {describe_change(earlier[-1], key)}"


def describe_change(old: tuple, new: tuple) -> str:
    """In words: the first difference between two guard keys (``Watch.key``)."""
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            if i < len(_KEY_PARTS):
                where = _KEY_PARTS[i]
            elif a[0] == "autocast" and i == len(old) - 1:
                where = "the autocast state"
            elif a[0] == "code":
                where = "the compiled function's code"
            else:
                where = f"{a[0]!r} (closure/global/self)"
            return f"{where} changed: {_first_difference(a, b)}"
    return "the watched objects changed (modules, optimizers, globals)"


def _first_difference(a: Any, b: Any) -> str:
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        if a and a[0] == "T" and b and b[0] == "T":  # a tensor: say what
            return f"tensor {_short(a[1:])} -> {_short(b[1:])}"
        for x, y in zip(a, b):
            if x != y:
                return _first_difference(x, y)
    return f"{_short(a)} -> {_short(b)}"


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 120 else text[:117] + "..."


class _Buckets:
    """A whole step's DistributedDataParallel averaging: for each bucket (in the wrapper's
    order, the order every process issues them in), an ``allreduce_start`` of its gradients
    placed as soon as the backward has computed the last of them, and an ``allreduce_wait``
    after the backward; the averages are what ``.grad`` and the optimizer get
    (``averaged``: leaf slot of the walk -> value)."""

    def __init__(self, recorder: Any, w: Any, bgraph: Graph, ddps: list) -> None:
        self.recorder = recorder
        slot_of = {id(leaf): k for k, leaf in enumerate(w.leaves)}
        effect = {slot: v for kind, slot, v in bgraph.effects if kind == "grad"}
        self.buckets: list = []  # (ddp, bucket, [(walk slot, gradient value of bgraph)])
        for ddp in ddps:
            if not ddp.require_backward_grad_sync:
                continue  # (no_sync: gradients accumulate locally)
            for bucket in ddp._buckets:
                members = []
                for _, name, p in bucket.params:
                    slot = slot_of.get(id(p))
                    if slot is None or slot not in effect:
                        raise StepBreak(
                            f"backward() at {_user_line()}: DistributedDataParallel parameter "
                            f"{name} gets no gradient (unused parameters are not replayed)"
                        )
                    members.append((slot, effect[slot]))
                self.buckets.append((ddp, bucket, members))
        self.waiting: list = [{v for _, v in m} for _, _, m in self.buckets]
        self.started: list = []
        self.averaged: dict[int, Value] = {}

    def mapped(self, v: Value | None, mapping: dict) -> None:
        """The graft mapped ``v`` (None: it is done): start every bucket, in order, whose
        gradients are all there; at the end, wait for them."""
        for waiting in self.waiting[len(self.started) :]:
            waiting.discard(v)
        while len(self.started) < len(self.buckets) and not self.waiting[len(self.started)]:
            ddp, bucket, members = self.buckets[len(self.started)]
            self.started.append(self._start(ddp, bucket, members, mapping))
        if v is None:
            for (ddp, _, members), (start, sizes) in zip(self.buckets, self.started):
                self._wait(ddp, members, start, sizes, mapping)

    def _start(self, ddp: Any, bucket: Any, members: list, mapping: dict) -> tuple:
        return start_bucket(self.recorder.graph, ddp, bucket, [mapping[g] for _, g in members])

    def _wait(self, ddp: Any, members: list, start: Value, sizes: list, mapping: dict) -> None:
        averaged = wait_bucket(self.recorder.graph, ddp, start, sizes)
        for (slot, _), value in zip(members, averaged):
            self.averaged[slot] = value
