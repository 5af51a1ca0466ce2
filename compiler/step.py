"""Whole-step compile, a front end of the compilation service: ``fusegrad.compile(fn)`` records
the whole call -- forward primitives,
the ``backward()``/``autograd.grad()`` inside it, optimizer ``step()``/``zero_grad()`` -- and
later calls replay it as one fused program after a guard check.

**Recording.**  The first call with a new guard key runs ``fn`` eagerly (its results are the
eager ones) with a ``recording.Recorder`` as the thread's tracer (the guard is a
``recording.Watch``).  Each primitive call becomes an IR value
of one graph (``ir.Graph``, concrete sizes); arrays are followed by identity, so a tensor that
shares another's array (``detach()``) is the same value.  Tensors the step did not compute are
program inputs: the call's tensor arguments, and the parameters, buffers and tensors the guard
watches (``Watch``: modules and optimizers among the arguments, in ``fn``'s closure, its
``self`` and the globals its code names; tensors in the closure and those globals).  Constants
made by creation functions are constants; random draws (``rand``, dropout's mask, ...) are
inputs drawn again, in the same order, from the generator on every call, so dropout draws the
numbers eager draws.  A ``backward()`` is captured by the backward compiler (``capture``, concrete
sizes) and its graph is appended to the forward's: the saved tensors *are* forward values, so the
two fuse.  In-place writes rebind the written array to the new value; writes to inputs become
``write`` effects (copied back, versions bumped as eager bumps them).  Optimizer ``step()`` and
``zero_grad()`` calls at the start and at the end of the function are kept as calls and replayed
around the program (``Tracer.opaque``).  A first call that will create an optimizer's state
(``Optimizer.state_pending``: PyTorch's optimizers make it at their first step) runs eagerly
without recording: the second call is recorded once for all later ones.

**Replay.**  A call whose guard key (``Watch.key``) was recorded runs the prefix calls, gathers
the input arrays, runs the ``program.Program`` (one per pattern of the leaves' ``.grad`` state),
performs its effects (``.grad`` with the engine's semantics, in-place writes, returned tensors),
runs the suffix calls and rebuilds the return value.  Per call that is the guard walk (modules,
parameters, arguments) and one pass over the program's steps: nothing per recorded op.

**Never silently wrong.**  What a replay could not reproduce stops the recording (``StepBreak``)
and the function runs in compiled-backward mode from then on for that guard key (each backward
inside it compiled as before), with one logged reason naming the source line; ``fullgraph=True``
raises it.  Breaks: Python reading tensor values (``item()``, ``bool()``, ``print``, ``numpy()``)
except values read last and returned (``return loss.item()``); tensors of unknown origin;
in-place writes to memory another recorded array shares (views); hooks, ``retain_grad`` and
``.grad`` assignments inside the function; data-dependent shapes; tensor ops after the optimizer
step; outputs that still need autograd history (use ``compile(module)`` for a backward
outside); CPU and CUDA tensors in one call.  What is *not* detected -- Python side effects other
than tensor ops, and Python state the guard does not watch -- is documented in docs/compile.md.

**CUDA.**  A call whose tensors are CUDA tensors records as on the CPU, and its program is built
for the device (``Step.device``): generated kernels from the CUDA emitter, externs through the
eager CUDA kernels, constants uploaded once, ``.grad`` and in-place writes as device copies.  It
compiles in the foreground (the background compile works on host copies).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np

from fusegrad import storage as _storage
from fusegrad.autograd.node import Node, _freed_message
from fusegrad.autograd.tracer import tracing
from fusegrad.dtypes import get_default_dtype
from fusegrad.errors import AutogradError
from fusegrad.ops import registry as _registry
from fusegrad.optim.optimizer import Optimizer
from fusegrad.tensor import Tensor

from . import admission, events, passes, workers
from . import tape as _tape
from . import trace as _trace
from .admission import CompilationError
from .breaks import Source, Split
from .dynamic import (
    Dynamic,
    arg_shapes,
    marked,
    masked,
    merge,
    merge_with_earlier,
    why_concrete,
)
from .events import emit
from .guard import Guards
from .ir import Value, format_graph, verify
from .key import grad_state
from .passes.fuse import Kernel
from .program import Program, scratch_leaf
from .recording import HISTORY_NEEDED, Recorder, StepBreak, Watch, describe_change, why_recorded
from .region import Region
from .service import Background, CompileNotice, Programs, Recordings, service
from .settings import config
from .symbolic import substitute


class _FreedNode(Node):
    """The ``grad_fn`` of a replay's output whose eager counterpart's graph was freed by the
    step's backward: it has eager's name, and a backward through it raises eager's error."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        super().__init__((), ())
        self._name = name

    def name(self) -> str:
        return self._name

    def apply(self, grads: tuple, retain: bool) -> tuple:
        raise AutogradError(_freed_message)


# ---- replay ------------------------------------------------------------------------------------


class Step:
    """A recorded call, ready to replay (see the module docstring)."""

    def _ddp_hooks(self, leaf: Tensor) -> bool:
        """Whether ``leaf``'s post-accumulate-grad hooks are all those of the
        DistributedDataParallel wrappers whose averaging this program does."""
        for hook in leaf._post_acc_hooks.values():
            ref = getattr(hook, "ddp", None)
            ddp = ref() if ref is not None else None
            if ddp is None or id(ddp) not in self.ddps:
                return False
        return True

    def __init__(self, rec: Recorder, spec: Any, bumps: dict, n_outputs: int) -> None:
        """From a finished recording (``Recorder.finish``: ``spec``, ``bumps``,
        ``n_outputs``)."""
        self.graph = rec.graph
        # where the program runs: "cuda" when the recorded tensors are CUDA tensors (its
        # programs are built for the device and compiled in the foreground)
        self.device = rec.device or "cpu"
        self.sources = rec.sources
        self.leaves = rec.leaves  # the recording call's (``describe``, ``explain``)
        # where each leaf is found on a call: ("arg", k) or ("ext", tensor)
        self.leaf_sources = [rec.watch.tensors[id(leaf._data)] for leaf in rec.leaves]
        self.prefix = rec.prefix
        self.suffix = rec.suffix
        self.spec = spec
        self.bumps = bumps
        self.stats = {
            "forward ops": rec.forward_ops,
            "backward ops": rec.backward_ops,
            "backward() calls": rec.backwards,
            "eager saved bytes": sum(rec.eager_saved.values()),
            "saved values": len(rec.saved_values),
            "saved value bytes": sum(
                int(np.prod(v.shape)) * v.dtype.np.itemsize for v in rec.saved_values
            ),
        }
        self.n_outputs = n_outputs
        self.ddps = frozenset(rec.ddps)
        # per random draw whose shape is an expression over sizes (a step over symbols,
        # ``dynamic``): that shape, evaluated per call
        self.draw_shapes: dict[int, tuple] = {}
        # its programs by the leaves' ``.grad`` state (``service.obtain``)
        self.programs = Programs()
        self.write_slots = tuple(bumps)
        self.fresh_outputs = sorted(set(_fresh_outputs(spec)))
        self._unshared: dict = {}  # variant -> ``unshared_outputs``
        # eager's validations (index ranges, class targets), run on every call before the
        # program changes anything: the values they check, computed with the eager kernels
        self.checks = rec.checks
        needed: set[Value] = set()
        stack = [v for v, _ in rec.checks]
        while stack:
            v = stack.pop()
            if v not in needed:
                needed.add(v)
                stack.extend(v.inputs)
        self.check_plan = sorted(needed, key=lambda v: v.id)

    def program(
        self,
        grad_key: tuple,
        mode: str,
        arrays: list | None = None,
        leaves: list | None = None,
        sizes: tuple | None = None,
    ) -> Program:
        """The program for the leaves' ``.grad`` state ``grad_key``, from the service (built on
        first use).  Given the call's input ``arrays`` and ``leaves``, a program numba has not
        compiled yet may be compiled in the background (``config.background_compile``); until
        it is ready the step replays uncompiled: every recorded value computed by its eager
        kernel (a ``mode="debug"`` program of the same graph: the same inputs, effects and
        results as eager's)."""
        ready = self.programs.ready(grad_key)
        if ready is not None:
            return ready
        background = None
        # (a CUDA program compiles in the foreground: a background compile runs the program on
        # host scratch copies, in a worker process)
        if arrays is not None and leaves is not None and mode != "debug" and self.device == "cpu":
            background = self.background(arrays, leaves, sizes)
        program, _ = service.obtain(
            self.programs, grad_key, lambda: self.build(grad_key, mode), background
        )
        return program  # type: ignore[no-any-return]

    def background(self, arrays: list, leaves: list, sizes: tuple | None = None) -> Background:
        """How this step's program compiles in the background: its thread reads copies of the
        arguments and random draws (the user may write into them) and the parameters
        themselves (only ever read), with stand-ins for the leaves."""
        st = self.stats
        sources = self.sources

        def warmup() -> tuple:
            scratch = [
                a if kind == "ext" else np.array(a, copy=True)
                for a, (kind, *_) in zip(arrays, sources)
            ]
            return scratch, [scratch_leaf(t) for t in leaves], (), sizes

        return Background(
            owner="whole step",
            what=(
                f"a whole step ({st['forward ops']} forward and {st['backward ops']} backward "
                "ops) in the background; calls run it uncompiled until it is ready"
            ),
            warmup=warmup,
            uncompiled=lambda: service.uncompiled(self.graph),
            worker=True,
        )

    def build(self, grad_key: tuple, mode: str) -> Program:
        """The graph after the passes, as a program for the leaves' ``.grad`` state
        ``grad_key`` (its kernels JIT-compiled or loaded by their first run)."""
        with _trace.resume(self):  # (the trace report's section of this recording)
            return service.build(
                passes.run(self.graph, check=False),
                mode=mode,
                device=self.device,
                leaves_with_grad=frozenset(i for i, s in enumerate(grad_key) if s is not None),
                recorded=True,
            )

    def run(
        self,
        args: list[Tensor],
        mode: str,
        finish: Callable | None = None,
        sizes: tuple | None = None,
    ) -> Any:
        """Replay on this call's tensor arguments; ``finish(outputs, arrays)``, when given, sees
        the program's output tensors (which it may replace) and input arrays before the result
        is rebuilt from them (``module``).  ``sizes``: the call's size vector, for a step over
        symbols (``dynamic``)."""
        for owner, fn, a, kw in self.prefix:
            fn(owner, *a, **kw)
        leaves = [args[ref] if kind == "arg" else ref for kind, ref in self.leaf_sources]
        grad_key = tuple([grad_state(leaf) for leaf in leaves])
        for leaf in leaves:
            if leaf._hooks or leaf._post_acc_hooks and not self._ddp_hooks(leaf):
                return NotImplemented
        ready = self.programs.ready(grad_key)
        if ready is not None:
            return self._run(args, leaves, grad_key, mode, finish, sizes, ready)
        notice = CompileNotice()  # built, then JIT-compiled by its first run
        st = self.stats
        notice.start(
            f"a whole step ({st['forward ops']} forward and {st['backward ops']} backward ops)"
        )
        try:
            return self._run(args, leaves, grad_key, mode, finish, sizes)
        finally:
            notice.stop()

    def _run(
        self,
        args: list[Tensor],
        leaves: list,
        grad_key: tuple,
        mode: str,
        finish: Any,
        sizes: tuple | None = None,
        ready: Program | None = None,
    ) -> Any:
        """``run`` after its checks; ``ready``: the program for ``grad_key``, when it was ready
        then (else it is obtained once the input arrays are gathered)."""
        arrays = []
        for index, source in enumerate(self.sources):
            kind = source[0]
            if kind == "arg":
                arrays.append(args[source[1]]._data)
            elif kind == "ext":
                arrays.append(source[1]._data)
            elif kind == "scalar":
                arrays.append(source[1].array())
            elif kind == "cast":  # (as ``ops._util.cast`` casts a Python-number tensor)
                arrays.append(np.array(arrays[source[1]].item(), dtype=source[2]))
            elif kind == "grad":  # a leaf's .grad before the program (added into by it: a copy)
                (where, ref), shape, dtype = source[1:]
                grad = (args[ref] if where == "arg" else ref)._grad
                arrays.append(
                    _storage.full(shape, 0, dtype.np, self.device == "cuda")
                    if grad is None
                    else _storage.copy(grad._data)
                )
            elif sizes is not None and index in self.draw_shapes:
                arrays.append(source[1](substitute(self.draw_shapes[index], sizes))._data)
            else:
                arrays.append(source[1]()._data)
        program = ready or self.program(grad_key, mode, arrays, leaves, sizes)
        if self.checks:
            self.run_checks(arrays, sizes)
        targets = {}
        for index in self.write_slots:
            kind, ref = self.sources[index]
            targets[index] = (args[ref] if kind == "arg" else ref, self.bumps[index])
        outputs = program.run_step(arrays, leaves, targets, self.n_outputs, sizes)
        if self.fresh_outputs:
            for k in self.unshared_outputs(program, sizes):
                a = outputs[k]._data
                if any(_storage.may_share_memory(a, b) for b in arrays) or any(
                    _storage.may_share_memory(a, c) for c in program._fixed.values()
                ):
                    outputs[k] = Tensor._make(_storage.copy(a))
        if finish is not None:
            finish(outputs, arrays)
        for owner, fn, a, kw in self.suffix:
            fn(owner, *a, **kw)
        return _rebuild(self.spec, args, outputs)

    def unshared_outputs(self, program: Program, sizes: tuple | None) -> tuple[int, ...]:
        """The output slots that eager returned in new memory (``fresh_outputs``) whose array
        from ``program`` (its variant for ``sizes``) may share memory with an input or a
        constant: all but those a kernel step allocated and hands out once
        (``BufferPlan.fresh``), which nothing else can hold.  Kept per variant."""
        variant = program.instance(program.graph.hints if sizes is None else sizes).variant
        found = self._unshared.get(variant)
        if found is None:
            made = {
                v for step in variant.schedule.steps if type(step) is Kernel for v in step.outputs
            }
            fresh = variant.buffers.fresh
            owned = {
                slot
                for kind, slot, v in program.graph.effects
                if kind == "capture" and v in made and v in fresh
            }
            found = self._unshared[variant] = tuple(k for k in self.fresh_outputs if k not in owned)
        return found

    def describe(self, program: Program | None = None) -> str:
        """The recording in words (``explain``)."""
        kinds = [s[0] for s in self.sources]
        st = self.stats
        calls = [f"{type(o).__name__}.{f.__name__}()" for o, f, _, _ in self.prefix]
        after = [f"{type(o).__name__}.{f.__name__}()" for o, f, _, _ in self.suffix]
        lines = [
            f"whole step: {st['forward ops']} forward op(s), {st['backward ops']} backward op(s) "
            f"from {st['backward() calls']} backward()/grad() call(s), one program",
            f"  inputs: {kinds.count('arg')} argument(s), {kinds.count('ext')} parameter(s)/"
            f"buffer(s)/closure tensor(s), {kinds.count('draw')} random draw(s) (drawn on "
            f"every call, in eager's order), {kinds.count('scalar')} runtime scalar(s) (learning "
            "rates, bias corrections: computed on every call)",
            f"  effects: {len(self.leaves)} .grad, {len(self.bumps)} in-place write(s), "
            f"{self.n_outputs} output(s), {len(self.checks)} value check(s) (index ranges)"
            + (
                ": their values are read on the host before the program, as eager's CUDA "
                "kernels read them"
                if self.checks and self.device == "cuda"
                else ""
            ),
            f"  replayed as calls: before the program {calls or 'nothing'}, after it "
            f"{after or 'nothing'} (their arguments and hyperparameters are read on every call)",
            f"  saved for backward: eager keeps {st['eager saved bytes']} bytes in its nodes; "
            f"the program's backward reads {st['saved values']} forward value(s), "
            f"{st['saved value bytes']} bytes before fusion (those fused into one loop with "
            "their backward use are never stored)",
        ]
        if program is not None:
            n = sum(1 for v in program.graph.values if v.op not in ("input", "scalar", "constant"))
            lines.append(
                f"  program: {n} ops after the passes, {len(program.kernels)} kernel(s), "
                f"{len(program.externs)} extern call(s)"
            )
            lines.extend("    " + line for line in program.describe_schedule().splitlines())
            if program.source_path:
                lines.append(f"  generated code: {program.source_path}")
        return "\n".join(lines)

    def run_checks(self, arrays: list, sizes: tuple | None = None) -> None:
        """Eager's validations of this call's values (index ranges, class targets), computed
        by the eager kernels before the program changes anything.  On CUDA the values checked
        are read on the host, as eager's CUDA kernels read them."""
        env: dict[Value, Any] = {}
        graph = self.graph
        for v in self.check_plan:
            if v.op == "input":
                env[v] = _storage.to_host(arrays[v.attr("index")])
            elif v.op == "scalar":
                env[v] = np.array(v.attr("value"), dtype=v.dtype.np)
            elif v.op == "constant":
                env[v] = graph.constants[v.attr("index")]
            else:
                kernel = _registry.REGISTRY[v.op].kernel
                attrs = dict(v.attrs) if sizes is None else dict(substitute(v.attrs, sizes))
                env[v] = np.asarray(kernel(*[env[i] for i in v.inputs], **attrs))
        for v, fn in self.checks:
            fn(env[v])


def _state_pending(optimizers: list[Optimizer]) -> str:
    """Why the next call will create optimizer state ("" when it will not, as far as the
    optimizers can tell before the call: ``Optimizer.state_pending``)."""
    for opt in optimizers:
        p = opt.state_pending()
        if p is not None:
            return (
                f"{type(opt).__name__} has no state yet for a parameter of shape "
                f"{list(p.shape)} (made at its first step()); recording starts at the next call"
            )
    return ""


def _fresh_outputs(spec: Any) -> list[int]:
    """The output slots of ``spec`` that eager returned in new memory."""
    kind = spec[0]
    if kind == "out":
        return [spec[1]] if spec[2] else []
    if kind in ("arg", "object", "read"):
        return []
    items = spec[2] if kind == "namedtuple" else spec[1]
    if kind == "dict":
        items = [s for _, s in items]
    return [k for s in items for k in _fresh_outputs(s)]


def _rebuild(spec: Any, args: list, outputs: list) -> Any:
    kind = spec[0]
    if kind == "out":
        t = outputs[spec[1]]
        if spec[3] is not None and t.grad_fn is None:
            t.grad_fn = _FreedNode(spec[3])
        return t
    if kind == "arg":
        _, source, ref, same = spec
        t = args[ref] if source == "arg" else ref
        return t if same else Tensor._make(t._data)
    if kind == "read":
        t = outputs[spec[1]]
        return t._data.tolist() if spec[2] else t._data.reshape(()).item()
    if kind == "object":
        return spec[1]
    if kind == "namedtuple":
        return spec[1](*[_rebuild(s, args, outputs) for s in spec[2]])
    if kind == "dict":
        return {k: _rebuild(s, args, outputs) for k, s in spec[1]}
    return kind(_rebuild(s, args, outputs) for s in spec[1])


def run_as_written(policy: str, fn: Callable, args: tuple, kwargs: dict, region: Callable) -> Any:
    """A call of a compiled function or module that ``admission.call_policy`` does not compile:
    its Python runs, inside a compiled-backward region (``region()``) where the policy says so."""
    if policy == admission.REGION:
        with region():
            return fn(*args, **kwargs)
    return fn(*args, **kwargs)


def record(
    fn: Callable,
    watch: Watch,
    region: Region,
    args: tuple,
    kwargs: dict,
    explaining: bool = False,
    inline: set | None = None,
) -> tuple[Recorder, Any, Any]:
    """Run ``fn`` once, eagerly, while a ``Recorder`` records it (its results are eager's);
    the recorder, the call's result and the tape its forward was recorded on.  ``inline``:
    ids of optimizers whose ``step()`` is recorded into the program."""
    rec = Recorder(watch, region)
    rec.explaining = explaining
    rec.inline_steps = inline or set()
    rec.code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    _tape.state.enter()
    try:
        tape = _tape.state.tape
        with tracing(rec):
            result = fn(*args, **kwargs)
    finally:
        _tape.state.exit()
    return rec, result, tape


class AsModule(str):
    """A guard key's entry (its reason, in words) whose calls run the function compiled as a
    module (``CompiledFunction.module_form``): it returns tensors that a backward outside it
    differentiates."""


class CompiledFunction:
    """``fusegrad.compile(fn)``: see the module docstring."""

    def __init__(self, fn: Callable, fullgraph: bool, mode: str, region: Callable) -> None:
        self.fn = fn
        self.fullgraph = fullgraph
        self.mode = mode
        self.region = region  # () -> a context manager: a compiled-backward region
        # guard key -> Step | reason (str), and the recording policy (``service.Recordings``)
        self.entries = Recordings(self.name)
        self.warmed_up = False  # see ``_state_pending``
        # the function cut at its first graph break (``breaks``): every later call runs the
        # parts (each compiled part has its own recordings and guards; the Python of the part
        # that reads the value runs as written, so nothing the cut keeps depends on the key)
        self.split_at: Split | None = None
        # recordings merged over sizes (``dynamic``): every size after the second replays one
        self.dynamics: list[Dynamic] = []
        # the function compiled as a module (``module.FunctionModule``), for the keys whose
        # outputs a backward outside it differentiates (``AsModule`` entries)
        self._module_form: Any = None
        # ids of optimizers whose ``step()`` is recorded into the program (``Recorder``'s
        # ``inline_steps``): ops after it read what it updates (a GAN's second model)
        self.inline_steps: set[int] = set()
        # fast guards of the latest replayed keys (``guard.FastGuard``)
        self.guards = Guards()
        self.__wrapped__ = fn
        if mode != "debug":
            # the interpreter's own compile (once per machine, several seconds) starts now, in
            # a worker, not at the first call: a script builds its model and data between
            # (``workers.warm_interpreter``; the first call tries again for another dtype)
            workers.warm_interpreter(get_default_dtype().name)

    def name(self) -> str:
        return str(getattr(self.fn, "__qualname__", self.fn))

    @property
    def recordings(self) -> int:
        return self.entries.recordings

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        policy = admission.call_policy()
        if policy != admission.COMPILE:
            return run_as_written(policy, self.fn, args, kwargs, self.region)
        if self.split_at is not None:
            return self.split_at(args, kwargs)
        # the fast guards first (``guard``: one pass over stamps and identities), then the
        # full walk, which makes a fast guard for the entry it finds
        entry: Any = None
        sizes = None
        unserved = ""  # why a recording over sizes whose key matches does not serve the call
        found = self.guards.find(self.fn, args, kwargs, self.entries, self.dynamics)
        if found is not None:
            fast, tensors = found
            entry, sizes = fast.entry, fast.sizes
        else:
            watch = Watch(self.fn, args, kwargs)
            entry = self.entries.get(watch.key)
            tensors = watch.args
            if self.dynamics and (
                entry is None
                or (type(entry) is Step and any(watch.key in d.merged_keys for d in self.dynamics))
            ):
                # (a recording merged into one over sizes replays that one: one program to
                # build)
                for dyn in self.dynamics:
                    if masked(watch.key, dyn.dims) != dyn.key:
                        continue
                    dyn_sizes = dyn.sizes(watch.args)
                    if dyn_sizes is None:
                        unserved = unserved or dyn.why_not(watch.args)
                        continue
                    self.guards.keep(
                        watch, args, kwargs, dyn.step, self.entries, self.dynamics, dyn_sizes
                    )
                    out = dyn.step.run(watch.args, self.mode, sizes=dyn_sizes)
                    if out is not NotImplemented:
                        emit(events.STEP_REPLAYED, what="step", message="whole step replayed")
                        return out
            if type(entry) is Step or type(entry) is AsModule:
                self.guards.keep(watch, args, kwargs, entry, self.entries, self.dynamics)
        if type(entry) is Step:
            out = entry.run(tensors, self.mode, sizes=sizes)
            if out is not NotImplemented:
                emit(events.STEP_REPLAYED, what="step", message="whole step replayed")
                return out
            entry = "a leaf has hooks"
        if type(entry) is AsModule:
            return self.module_form()(*args, **kwargs)
        if entry is None:
            entry = self.entries.refusal()
        if entry is not None:  # fell back for this key: compiled backward only
            with self.region():
                return self.fn(*args, **kwargs)
        if not self.warmed_up and not self.entries.recordings:
            self.warmed_up = True
            if self.mode != "debug":  # (a background compile may follow: its interpreter)
                workers.warm_interpreter(get_default_dtype().name)
            pending = _state_pending(watch.optimizers)
            if pending:
                # this call creates the optimizer's state (PyTorch's optimizers make it lazily
                # at their first step): a recording now would hold the first step's creation
                # ops, and the next call, with the state in the key, would need another.  It
                # runs eagerly instead; the next call is recorded once, for every later call.
                emit(events.WARMUP, pending)
                return self.fn(*args, **kwargs)
        number = self.entries.count()
        if len(self.entries) and events.wanted(events.RECORDING):
            why = self.why_record(watch.key)
            if unserved:
                why += f"; the recording over symbolic sizes does not serve it: {unserved}"
            emit(events.RECORDING, f"whole step: recording #{number}: {why}")
        return self.record(watch, args, kwargs)

    def module_form(self) -> Any:
        """The function compiled as a module: its forward recorded and replayed as a program,
        its outputs' backward a second program, as ``compile(model)`` (PyTorch's AOTAutograd
        for a graph whose outputs are differentiated outside it)."""
        if self._module_form is None:
            from .module import FunctionModule, OptimizedModule  # (module imports this one)

            self._module_form = OptimizedModule(FunctionModule(self.fn), self.fullgraph, self.mode)
        return self._module_form

    def split(self, rec: Recorder, reason: str) -> Split | str | None:
        """The function cut at the statement whose Python read of a value broke the recording
        (``breaks``); None for another break; why not, for a body that cannot be cut."""
        if rec.break_site is None or not (
            reason.startswith("Python read a tensor's value") or "not computed by the" in reason
        ):
            return None
        source = Source.of(self.fn)
        if isinstance(source, str):
            return source
        why = source.why_not()
        if why is not None:
            return why
        at = source.statement_at(rec.break_site)
        if at is None:
            return None
        region = self.region
        return Split(
            self.fn,
            source,
            at,
            reason,
            lambda part: CompiledFunction(part, False, self.mode, region),
            region,
        )

    def merge_sizes(self, key: tuple, step: Step, args: list) -> None:
        """After a recording: merged with an earlier one whose key differs only in the
        arguments' sizes, when they are one program over sizes (``dynamic``); the outcome goes
        to the ``recompiles`` log (``CompilationError`` when a dim that changed is marked
        dynamic, ``mark_dynamic``)."""
        if not config.dynamic_sizes or len(self.dynamics) >= 4:
            return
        dyn, failed = merge_with_earlier(self.entries.items(), key, step, args, merge)
        if dyn is None:
            for other_key, e in failed:
                shapes = zip(arg_shapes(other_key), arg_shapes(key), args)
                for a, (sa, sb, t) in enumerate(shapes):
                    changed = {d for d, (x, y) in enumerate(zip(sa, sb)) if x != y}
                    if changed & marked(t, "dynamic"):
                        raise CompilationError(
                            f"{self.name()}: argument {a} dims {sorted(changed)} are marked "
                            f"dynamic, but the step cannot be one program over them: {e}"
                        ) from None
            if failed:
                emit(events.RECORDING, f"whole step: sizes stay concrete ({why_concrete(failed)})")
            return
        self.dynamics.append(dyn)
        emit(events.RECORDING, f"whole step: sizes became symbolic ({dyn.describe()})")

    def why_record(self, key: tuple) -> str:
        """In words, why a call with guard key ``key`` is recorded (``explain``, the log)."""
        if key in self.entries:
            return "these guards were recorded before; recorded again (explain replaces it)"
        last = self.entries.last_key()
        if last is None:
            return "first call of this function"
        return describe_change(last, key)

    def record(self, watch: Watch, args: tuple, kwargs: dict, explaining: bool = False) -> Any:
        started = _trace.clock() if _trace.enabled else 0.0
        region = Region(self.fullgraph, self.mode)
        rec, result, _ = record(
            self.fn, watch, region, args, kwargs, explaining, inline=self.inline_steps
        )
        detail = {"what": "step", "owner": self, "watch": watch, "started": started, "why": ""}
        try:
            step = Step(rec, *rec.finish(result))
        except StepBreak as e:
            owner = rec.read_update_of
            if owner is not None and id(owner) not in self.inline_steps and not explaining:
                # an op after an optimizer's step() (run as a call after the program) read
                # what it updates: the next call records it again with that update in the
                # program (its per-parameter ops: bit for bit the multi-tensor kernel's)
                self.inline_steps.add(id(owner))
                emit(
                    events.RECORDING,
                    f"whole step: {type(owner).__name__}.step() goes into the program from the "
                    f"next recording ({e})",
                )
                return result
            if str(e) == HISTORY_NEEDED:
                # its outputs are differentiated outside it: from the next call on, the
                # function compiled as a module (forward and backward programs)
                self.entries.remember(
                    watch.key, AsModule(f"{e}: compiled as a module from the next call on")
                )
                emit(events.RECORDING, f"whole step: {e}; compiled as a module from the next call")
                return result
            if self.fullgraph:
                self.entries.remember(watch.key, str(e))
                emit(events.STEP_BREAK, str(e), **detail)
                raise CompilationError(f"fullgraph=True: {e}") from None
            split = self.split(rec, str(e))
            if type(split) is Split:
                self.split_at = split
                self.entries.remember(watch.key, message := split.describe())
            else:
                message = str(e) if split is None else f"{e} (not split: {split})"
                self.entries.remember(watch.key, message)
            if _trace.enabled:
                detail["why"] = why_recorded(self.name(), self.entries, watch.key)
            emit(events.STEP_BREAK, message, **detail)
            return result
        if events.wanted(events.GRAPH):
            emit(events.GRAPH, "whole-step graph:\n" + format_graph(rec.graph))
        verify(rec.graph)
        self.entries.remember(watch.key, step)
        self.merge_sizes(watch.key, step, watch.args)
        if _trace.enabled:
            detail["why"] = why_recorded(self.name(), self.entries, watch.key)
        emit(events.STEP_RECORDED, entry=step, **detail)
        return result
