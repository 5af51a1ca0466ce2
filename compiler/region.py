"""Compiled autograd, a front end of the compilation service: inside
``fusegrad.compiler.compiled_autograd()`` (and inside a ``fusegrad.compile``d function whose
call is not replayed as a whole step) the thread's tracer is a ``Region``.

A region lets every primitive call run eagerly (it takes no calls: ``Tracer.sees_calls``, so
the op surface's fast paths run as in eager mode), records every node the calls make
(``Tracer.made``) on the thread's tape (``tape``), and sends every ``backward()`` and
``autograd.grad()`` through ``run``:

1. **the tape path**: a backward whose forward was recorded on this thread's tape is keyed and
   bound from the tape, without walking the graph (``tape.tape_key``, ``tape.Binding``); a
   ready program then runs at once (``events.TAPE_HIT``);
2. **the walk**: otherwise the graph is walked (``key.walk``) and admitted
   (``admission.admit``: a plan, or a reason to run eagerly -- decided before anything is freed
   or written);
3. **the graph**: the service's graph cache gives the captured graph for the walk key and size
   vector, or the engine's own walk runs the derivative rules on symbolic values to capture one
   (``capture.capture``), and the passes run (``passes``);
4. **the program**: the service builds (or finds) the program for the program key (``.grad``
   state, mode, configuration) and compiles it, in the background while the eager engine runs
   the call (``service.obtain``), or by its first run;
5. **the run**: the program runs on this call's data -- with user hooks at their eager
   positions, or as a differentiable backward (``double``) under ``create_graph``.

Whatever the compiler cannot handle runs on the eager engine with one reason
(``events.FALLBACK``); ``fullgraph=True`` raises ``CompilationError`` instead.  Programs run on
the device their arrays live on; a graph that mixes devices runs eagerly.  See
docs/ARCHITECTURE.md, "Compiled autograd".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from fusegrad.autograd import anomaly as _anomaly
from fusegrad.autograd import grad_mode
from fusegrad.autograd.engine import graph_task
from fusegrad.autograd.tracer import Tracer, tracing
from fusegrad.tensor import Tensor

from . import admission, double, events, passes
from . import tape as _tape
from . import trace as _trace
from .admission import CompilationError
from .cache import GraphEntry, TapeEntry, describe_program_miss
from .capture import Captured, Fallback, Refused
from .capture import capture as _capture_graph
from .events import emit
from .ir import format_graph, verify
from .key import BackwardCall, Walk, grad_state
from .key import walk as _walk
from .program import Program, _saved_arrays, scratch_leaf
from .program import release as release_nodes
from .service import Background, CompileNotice, service
from .settings import config
from .tape import Binding, Unbindable, leaf_key, tape_key


class Region(Tracer):
    """The tracer of a thread inside ``compiled_autograd()`` / a ``compile``d function: records
    the nodes that primitive calls make on the thread's tape, and compiles
    ``backward``/``grad``."""

    # an optimizer's update under no_grad makes no nodes, so nothing of it is on the tape: its
    # multi-tensor kernel may run instead of the tensor ops (``fusegrad.optim._foreach``)
    sees_updates = False

    # every op runs eagerly: dispatch need not ask ``apply``, and the op surface's fast paths
    # run as in eager mode; the nodes the calls make come to ``made``
    sees_calls = False

    def __init__(self, fullgraph: bool, mode: str) -> None:
        self.fullgraph = fullgraph
        self.mode = mode

    # each node a call makes goes on this thread's tape (the function itself, one frame less
    # per node than a method calling it)
    made = _tape.record

    def backward(
        self,
        roots: Sequence[Tensor],
        grads: Sequence[Tensor],
        retain_graph: bool,
        create_graph: bool,
        inputs: Sequence[Tensor] | None,
        accumulate: bool,
    ) -> Any:
        return run(self, BackwardCall(roots, grads, retain_graph, create_graph, inputs, accumulate))


@contextlib.contextmanager
def compiled_autograd(fullgraph: bool = False, mode: str = "default") -> Iterator[None]:
    """Compile every backward()/grad() executed in the block (nests; the innermost wins)."""
    if mode not in ("default", "debug"):
        raise ValueError(f"compiled_autograd: unknown mode {mode!r} (expected default or debug)")
    _tape.state.enter()  # nodes made in the region, on this thread, are recorded on a tape
    try:
        with tracing(Region(fullgraph, mode)):
            yield
    finally:
        _tape.state.exit()


def run(region: Region, call: BackwardCall) -> Any:
    """A ``backward()``/``grad()`` call in ``region``: compiled, or eager with a reason."""
    outputs, grads, inputs = call.outputs, call.grads, call.inputs
    create_graph, accumulate = call.create_graph, call.accumulate
    # the tape path: the forward recorded in this region keys and binds the backward
    fast = None
    if inputs is None and not create_graph and not _anomaly._state.enabled:
        if events.debug.report is None:
            fast = tape_key(outputs, grads, accumulate)
    # nodes made from here on (by hooks, or the next forward) go on a new tape
    _tape.state.next_tape()
    if fast is not None and _run_from_tape(region, fast, grads, call.retain_graph):
        return None
    w = _walk(outputs, grads, inputs, accumulate, create_graph)
    plan = admission.admit(
        w,
        admission.BACKWARD,
        fullgraph=region.fullgraph,
        create_graph=create_graph,
        inputs=inputs,
        accumulate=accumulate,
    )
    if isinstance(plan, str):
        return _fallback(region, plan, call)
    w.has_hooks = plan.hooks
    if plan.ddp is not None:
        w.ddp = plan.ddp
        w.key = (*w.key, *plan.key)
    stashed = _stash_grads(w, call) if create_graph and accumulate else []
    notice = CompileNotice()
    traced = _trace.depth() if _trace.enabled else -1  # (the trace sections opened below)
    try:
        try:
            program, compiled, filed = _program_for(region, w, call, notice)
        except Fallback as e:
            return _fallback(region, str(e), call)
        if fast is not None and filed is not None and not w.has_hooks and w.ddp is None:
            _remember_tape(fast, w, region, filed)
        if not compiled:  # the eager engine runs this backward meanwhile (no fallback)
            return call.eagerly()
        assert program is not None
        return _run_program(region, program, w, call, stashed)
    finally:
        notice.stop()
        if traced >= 0:
            _trace.unwind(traced)


def _run_from_tape(region: Region, fast: tuple, grads: Sequence[Tensor], retain: bool) -> bool:
    """Run the program filed under the tape key ``fast`` when the tape binds and it is ready;
    whether it ran."""
    entry = service.tapes.get(fast[1])
    bound = entry.binding.bind(fast[0], fast[2]) if entry is not None else None
    if bound is None:
        return False
    arrays, leaves, release = bound
    filed = entry.programs.get((leaf_key(leaves), region.mode, config.program_key()))
    if filed is None:
        return False
    table, pkey, sizes = filed
    program = table.ready(pkey)
    if program is None:
        slot = table.slots.get(pkey)
        if slot is None or slot.job is not None or slot.trial is None:
            return False  # (compiling, or evicted: the walk path)
        program = slot.trial.next()  # (two compiled programs measured in turn)
    emit(events.TAPE_HIT)
    program.run_bound(sizes, arrays, leaves, release, grads, retain)
    return True


def _fallback(region: Region, reason: str, call: BackwardCall) -> Any:
    if region.fullgraph:
        raise CompilationError(f"fullgraph=True: this backward cannot be compiled: {reason}")
    emit(events.FALLBACK, reason)
    return call.eagerly()


def _stash_grads(w: Walk, call: BackwardCall) -> list:
    """create_graph adding into an existing .grad: eager makes ``.grad = .grad + g`` (a new
    tensor whose history joins both); the program runs as for no .grad and the sum is made
    after it.  The leaves (and inputs) that have a ``.grad``."""
    stashed: list = []
    seen: set = set()
    for t in [*w.leaves, *(call.inputs or ())]:
        if t._grad is not None and id(t) not in seen:
            seen.add(id(t))
            stashed.append(t)
    if stashed:
        w.grad_key = tuple(None if id(t) in seen else grad_state(t) for t in w.leaves)
    return stashed


def _run_program(
    region: Region, program: Program, w: Walk, call: BackwardCall, stashed: list
) -> Any:
    """Run ``program`` on this call's data (user hooks at their positions; create_graph: a
    differentiable node over the results)."""
    emit(events.COMPILED_RUN, replayed=len(w.regions), reruns=w.reruns)
    grads, inputs, retain = call.grads, call.inputs, call.retain_graph
    if w.has_hooks:  # (user code runs inside: it may queue callbacks, as in eager)
        with graph_task(retain, call.create_graph, call.accumulate, inputs):
            return program.run(w, w.sizes, grads, retain, inputs)
    if not call.create_graph:
        return program.run(w, w.sizes, grads, retain, inputs)
    raw, vjp = program.double
    olds = [t._grad for t in stashed]
    for t in stashed:
        t._grad = None
    try:
        results = program.run(w, w.sizes, grads, True, inputs)
        double.attach(raw, vjp, w, grads, results, inputs, region.mode)
    except BaseException:
        for t, old in zip(stashed, olds):
            t._grad = old
        raise
    with grad_mode.enable_grad():
        for t, old in zip(stashed, olds):
            t._grad = old if t._grad is None else old + t._grad
    if not retain:
        release_nodes(w)
    return results


# ---- the graph and the program -----------------------------------------------------------------


def _program_for(
    region: Region, w: Walk, call: BackwardCall, notice: CompileNotice
) -> tuple[Program | None, bool, tuple | None]:
    """The program for walk ``w`` in ``region``, whether it is compiled (False: compiling in
    the background, the caller runs eagerly meanwhile), and where it is filed (the captured
    graph's table and the program key): from a cached or newly captured graph (raises
    ``Fallback`` when it cannot be had).  Under ``explain`` nothing is looked up or kept.
    ``notice`` is started on the slow paths (capture, a new program)."""
    captured = _graph_for(region, w, call, notice)
    if captured.opaque:
        # custom Functions the capture found untraceable run as opaque steps (user code):
        # this call then runs as one with hooks does (``capture.capture``)
        w.has_hooks = True
    report = events.debug.report
    if report is not None:  # explain(): a program of its own, kept nowhere
        notice.start(f"the backward of a {len(w.nodes)}-node graph")
        program = _build(region, w, captured, _device(w, call))
        emit(events.EXPLAINED, "explain() captures every graph", program=program)
        return program, True, None
    pkey = (w.grad_key, region.mode, config.program_key())
    table = captured.programs
    slot = table.slots.get(pkey)
    if slot is not None and slot.program is not None:
        emit(events.PROGRAM_HIT)
        device = slot.program.device
        if slot.job is None and slot.trial is None and not _cold(slot.program, w):
            return slot.program, True, (table, pkey)
    else:
        device = _device(w, call)
        if len(table) and events.wanted(events.NEW_PROGRAM):
            emit(events.NEW_PROGRAM, _program_change(table, pkey))
        notice.start(f"the backward of a {len(w.nodes)}-node graph")
    background = _background(region, w, call) if device == "cpu" else None
    program, compiled = service.obtain(
        table, pkey, lambda: _build(region, w, captured, device), background, notice
    )
    return program, compiled, (table, pkey)


def _device(w: Walk, call: BackwardCall) -> str:
    device = _device_of(w, call.grads)
    if device is None:
        raise Fallback("the backward graph spans devices (cpu and cuda)")
    return device


def _build(region: Region, w: Walk, captured: Captured, device: str) -> Program:
    program = service.build(
        captured.graph,
        mode=region.mode,
        device=device,
        leaves_with_grad=frozenset(i for i, s in enumerate(w.grad_key) if s is not None),
        unpacked=captured.unpacked,
    )
    program.double = (captured.raw, captured.vjp)  # (``double.attach``: create_graph)
    return program


def _cold(program: Program, w: Walk) -> bool:
    """Whether ``program`` has not run (so numba has not compiled it) for ``w``'s sizes."""
    return config.background_compile and program.cold(w.sizes)


def _program_change(table: Any, pkey: tuple) -> str:
    """Why a captured graph needs another program: the closest of its program keys (one part
    differs, at best) and what changed."""
    closest = min(
        table.keys(),
        key=lambda k: 4 * (k[1] != pkey[1]) + 2 * (k[2] != pkey[2]) + (k[0] != pkey[0]),
    )
    return describe_program_miss(closest, pkey)


def _background(region: Region, w: Walk, call: BackwardCall) -> Background | None:
    """How this backward's program may compile in the background while the eager engine runs
    it (``config.background_compile``): not when it calls user hooks (the compile thread's run
    must not) or runs on CUDA, nor in debug mode or under ``create_graph``; its thread runs the
    program on copies of the root gradients and stand-ins for the leaves."""
    if w.has_hooks or region.mode == "debug" or call.create_graph:
        return None
    if not config.background_compile:
        return None
    grads, sizes = call.grads, w.sizes

    def warmup() -> tuple:
        saved = _saved_arrays(w, None)  # (checks the versions: may raise, as eager does)
        roots = [Tensor._make(np.array(g._data, copy=True)) for g in grads]
        return saved, [scratch_leaf(t) for t in w.leaves], roots, sizes

    return Background(
        owner="compiled backward",
        what=f"the backward of a {len(w.nodes)}-node graph in the background (run eagerly "
        "meanwhile)",
        warmup=warmup,
        cold=lambda program: _cold(program, w),
        build_first=True,
    )


def _graph_for(region: Region, w: Walk, call: BackwardCall, notice: CompileNotice) -> Captured:
    """The captured graph for walk ``w`` and its sizes: cached, or captured now (raises
    ``Fallback``/``Refused``; a refusal is remembered for the key)."""
    report = events.debug.report
    entry = service.graphs.get(w.key) if report is None else None
    if entry is not None and entry.refused is not None:
        raise Fallback(entry.refused)
    captured = entry.find(w.sizes) if entry is not None else None
    if captured is not None:
        return captured
    notice.start(f"the backward of a {len(w.nodes)}-node graph")
    why = _miss_reason(w, entry, report)
    symbolic = (
        config.symbolic_sizes
        and not call.create_graph  # (``double`` differentiates a graph of concrete sizes)
        and not (w.ddp is not None and w.ddp.buckets)  # (a bucket's size is a number)
        and (entry is None or entry.symbolic_failed is None)
    )
    if _trace.enabled:
        _trace.begin("backward", f"backward of a {len(w.nodes)}-node graph", why)
    try:
        captured = _capture(w, call, symbolic, not region.fullgraph)
    except Refused as e:
        if report is None and entry is None:  # (a key that holds graphs keeps them)
            entry = GraphEntry()
            entry.refused = str(e)
            service.graphs.put(w.key, entry)
        raise
    _note_capture(w, captured, why)
    if report is None:
        if entry is None:
            entry = GraphEntry()
            service.graphs.put(w.key, entry)
            service.history.remember(w.key)
        entry.add(captured, w.sizes)
    return captured


def _miss_reason(w: Walk, entry: GraphEntry | None, report: list | None) -> str:
    if report is not None:
        return "explain() captures every graph"
    if entry is not None:
        return entry.failed_guard(w.sizes) or (
            f"new sizes, and this graph is captured with concrete sizes: {entry.symbolic_failed}"
        )
    return service.miss_reason(w.key) if events.wanted(events.CAPTURED) else ""


def _note_capture(w: Walk, captured: Captured, why: str) -> None:
    """Tell the event stream what the capture found."""
    if captured.symbolic:
        kind = "symbolic sizes"
        if captured.guards:
            kind += f", {len(captured.guards)} guard(s)"
    else:
        kind = f"concrete sizes: {captured.reason}"
    emit(events.CAPTURED, why, kind=kind, captured=captured, key=w.key)
    for reason in [*w.opaque.values(), *captured.opaque.values()]:
        emit(events.OPAQUE_STEP, reason)
    for reason in w.reruns:
        emit(events.CHECKPOINT_RERUN, reason)
    emit(events.CHECKPOINTS_REPLAYED, count=len(w.regions))
    if events.wanted(events.GRAPH):
        emit(events.GRAPH, "backward graph:\n" + format_graph(captured.graph))


def _capture(w: Walk, call: BackwardCall, symbolic: bool, allow_opaque: bool) -> Captured:
    with _trace.phase("capture"):
        captured = _capture_graph(
            w,
            call.outputs,
            call.grads,
            call.inputs,
            call.accumulate,
            symbolic=symbolic,
            create_graph=call.create_graph,
            allow_opaque=allow_opaque,
        )
    if call.create_graph:
        captured.raw = captured.graph
    if events.debug.check:
        verify(captured.graph)
    if _trace.enabled:
        _trace.graph("the captured graph, before the passes", captured.graph)
    captured.graph = passes.run(captured.graph, check=events.debug.check)
    return captured


def _device_of(w: Walk, grads: Sequence[Tensor]) -> str | None:
    """ "cpu" or "cuda" for the arrays a backward reads, None when it mixes them.  Decided at
    program build: the key holds every array's type, so every later call agrees."""
    arrays = [g._data for g in grads] + [leaf._data for leaf in w.leaves]
    # 0-d host arrays (saved Python scalars) go with any device, as in eager mode; a tensor
    # packed by saved-tensor hooks counts with the shape and array type it had
    kinds = set()
    for _, s in w.saved:
        if s._unpack_hook is None:
            arrays.append(s._data if s._tensor is None else s._tensor._data)
        elif s._meta[0]:
            kinds.add("cpu" if s._meta[2] is np.ndarray else "cuda")
    kinds.update("cpu" if type(a) is np.ndarray else "cuda" for a in arrays if a.ndim)
    if len(kinds) > 1:
        return None
    return kinds.pop() if kinds else "cpu"


def _remember_tape(fast: tuple, w: Walk, region: Region, filed: tuple) -> None:
    """File where the program is (``filed``: its table and program key) under the tape key, so
    the next such backward skips the walk."""
    tape, key, roots = fast
    lk = leaf_key(w.leaves)
    if lk is None:
        return
    try:
        binding = Binding(w, tape, roots)
    except Unbindable as e:
        emit(events.NO_TAPE, str(e))
        return
    entry = service.tapes.get(key)
    if entry is None or entry.binding.signature() != binding.signature():
        entry = TapeEntry(binding)
        service.tapes.put(key, entry)
    table, pkey = filed
    entry.programs[(lk, region.mode, config.program_key())] = (table, pkey, w.sizes)
