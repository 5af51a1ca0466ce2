"""``fusegrad.compiler``: compiled autograd.

Inside ``fusegrad.compile(fn)`` or ``with fusegrad.compiler.compiled_autograd():`` the thread's
tracer (``fusegrad.autograd.tracer``, the eager core's one extension point) is a ``Region``: it
records every primitive call on the thread's tape (``tape.py``) and sends every ``backward()``
and ``autograd.grad()`` through ``run``: a cheap walk of the eager graph
builds a cache key (``capture.walk``); on a miss the engine's own walk runs the derivative rules
on symbolic values to record an IR graph (``capture.capture``), the passes run (``passes``), and
the result is cached as a ``Program``; the program then runs on this call's data.  Whatever the
compiler cannot handle (``create_graph``, anomaly mode, custom Functions, hooks, saved-tensor
hooks, data-dependent shapes, ...) runs on the eager engine instead, counted in
``counters.fallbacks`` and logged with its reason — decided before anything is freed or written.
``fullgraph=True`` raises instead of falling back.

A backward whose graph was built in the same region (on this thread) usually skips the walk: the
forward was recorded on a tape and ``tape.tape_key`` / ``tape.Binding`` key and bind it directly
(``counters.tape_hits``); whenever the binding's checks fail, the walk runs.

Programs run on the device their arrays live on: numba CPU code (``codegen.numba_cpu``, small
kernels on a precompiled interpreter) for numpy arrays, numba-cuda kernels (``codegen.numba_cuda``)
for CUDA tensors; a graph that mixes devices runs eagerly.

src/fusegrad never imports this package at load time; it is loaded by ``fusegrad.compile``.
Nothing in fusegrad is patched: outside a region (or on another thread) eager code runs as if
this package had never been imported.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from fusegrad.autograd import anomaly as _anomaly
from fusegrad.autograd import grad_mode
from fusegrad.autograd.engine import graph_task, run_backward
from fusegrad.autograd.node import OpNode
from fusegrad.autograd.tracer import Tracer, tracing
from fusegrad.nn.module import Module
from fusegrad.ops import registry as _registry
from fusegrad.tensor import Tensor

from . import ddp as _ddp
from . import double, logs, passes
from . import tape as _tape
from . import trace as _trace
from .cache import (
    GraphEntry,
    TapeEntry,
    cached_programs,
    counters,
    describe_program_miss,
    graphs,
    lookup,
    miss_reason,
    remember,
    tape_programs,
)
from .cache import reset as _reset_cache
from .capture import Captured, Fallback, Refused, _grad_state
from .capture import capture as _capture_graph
from .capture import walk as _walk
from .ir import format_graph, verify
from .logs import set_logs
from .program import BackgroundBuild, Program, _saved_arrays, scratch_leaf
from .program import release as release_nodes
from .program import wait_for_compiles as _wait_for_compiles
from .settings import Config, config
from .tape import Binding, Unbindable, leaf_key, tape_key

__all__ = [
    "compile",
    "compiled_autograd",
    "counters",
    "reset",
    "explain",
    "set_logs",
    "wait_for_compiles",
    "CompilationError",
]


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait (at most ``timeout`` seconds) until no whole-step program is being compiled in the
    background (``config.background_compile``); True when none is left, so that the next call
    of every compiled step runs compiled code (benchmarks call it before timing)."""
    return _wait_for_compiles(timeout)


class CompilationError(RuntimeError):
    """Raised under ``fullgraph=True`` when a backward cannot be compiled."""


class _Debug(threading.local):
    """Per-thread settings for tests and ``explain``."""

    def __init__(self) -> None:
        self.check = False  # verify the IR after every pass (tests)
        self.report: list | None = None  # explain(): captures and fallbacks are noted here


_debug = _Debug()


class Region(Tracer):
    """The tracer of a thread inside ``compiled_autograd()`` / a ``compile``d function: records
    the primitive calls it runs on the thread's tape, and compiles ``backward``/``grad``."""

    def __init__(self, fullgraph: bool, mode: str) -> None:
        self.fullgraph = fullgraph
        self.mode = mode

    def apply(self, prim: Any, inputs: tuple, attrs: dict) -> Any:
        tape = _tape.state.tape
        if tape is not None and not tape.nodes:
            tape.stamp = _tape.changes.value  # before the tape's first node is made
        out = _registry.run(prim, inputs, attrs)
        node = out.grad_fn
        if type(node) is OpNode:  # a node made by this call: record its structure
            tape = _tape.state.tape
            if tape is not None and tape.open:
                _tape.record(tape, node, inputs, out)
        return out

    def backward(
        self,
        roots: Sequence[Tensor],
        grads: Sequence[Tensor],
        retain_graph: bool,
        create_graph: bool,
        inputs: Sequence[Tensor] | None,
        accumulate: bool,
    ) -> Any:
        return run(self, roots, grads, retain_graph, create_graph, inputs, accumulate)


def reset() -> None:
    """Clear in-memory program caches and counters."""
    _reset_cache()


def _fallback(
    region: Region,
    reason: str,
    outputs: Sequence[Tensor],
    grads: Sequence[Tensor],
    retain_graph: bool,
    create_graph: bool,
    inputs: Any,
    accumulate: bool,
) -> Any:
    if region.fullgraph:
        raise CompilationError(f"fullgraph=True: this backward cannot be compiled: {reason}")
    counters.fallbacks[reason] += 1
    logs.log_counted("fallback", reason, f"running eagerly: {reason}")
    if _trace.enabled:
        _trace.fallback(reason)
    if _debug.report is not None:
        _debug.report.append(("fallback", reason))
    return run_backward(outputs, grads, retain_graph, create_graph, inputs, accumulate)


def run(
    region: Region,
    outputs: Sequence[Tensor],
    grads: Sequence[Tensor],
    retain_graph: bool,
    create_graph: bool,
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
) -> Any:
    """A ``backward()``/``grad()`` call in ``region``: compiled, or eager with a reason."""
    report = _debug.report
    # the tape path: the forward recorded in this region keys and binds the backward
    fast = None
    if inputs is None and not create_graph and not _anomaly._state.enabled and report is None:
        fast = tape_key(outputs, grads, accumulate)
    # nodes made from here on (by hooks, or the next forward) go on a new tape
    _tape.state.next_tape()
    if fast is not None:
        entry = tape_programs.get(fast[1])
        bound = entry.binding.bind(fast[0]) if entry is not None else None
        if bound is not None:
            arrays, leaves, release = bound
            lk = leaf_key(leaves)
            slot = entry.programs.get((lk, region.mode, config.program_key()))
            if slot is not None and slot[0].pending is None:  # (compiling: the walk path)
                program, sizes = slot
                counters.cache_hits += 1
                counters.tape_hits += 1
                counters.compiled_runs += 1
                logs.log_counted("cache", "hit-tape", "program cache hit (tape)")
                program.run_bound(sizes, arrays, leaves, release, grads, retain_graph)
                return None
    w = _walk(outputs, grads, inputs, accumulate, create_graph)
    if w.fallback is not None:
        return _fallback(
            region, w.fallback, outputs, grads, retain_graph, create_graph, inputs, accumulate
        )
    if w.has_hooks and accumulate and inputs is None and not create_graph:
        # DistributedDataParallel's hooks alone: the program does their averaging itself
        # (``ddp``), when that is exactly what they would do
        plan = _ddp.plan(w) if not _anomaly._state.enabled else None
        if plan is not None:
            w.has_hooks = False
            w.ddp = plan
            w.key = (*w.key, plan.key)
    # create_graph adding into an existing .grad: eager makes ``.grad = .grad + g`` (a new tensor
    # whose history joins both); the program runs as for no .grad and the sum is made after it
    stashed: list = []
    if create_graph and accumulate:
        seen: set = set()
        for t in [*w.leaves, *(inputs or ())]:
            if t._grad is not None and id(t) not in seen:
                seen.add(id(t))
                stashed.append(t)
        if stashed:
            w.grad_key = tuple(None if id(t) in seen else _grad_state(t) for t in w.leaves)
    notice = _CompileNotice()
    traced = _trace.depth() if _trace.enabled else -1  # (the trace sections opened below)
    try:
        try:
            program = _program_for(
                region, w, grads, outputs, inputs, accumulate, notice, create_graph
            )
        except Fallback as e:
            return _fallback(
                region, str(e), outputs, grads, retain_graph, create_graph, inputs, accumulate
            )
        if fast is not None and not w.has_hooks and w.ddp is None:
            _remember_tape(fast, w, region, program)
        if _compiling_in_background(region, program, w, grads):
            # the eager engine runs this backward meanwhile (same results, no fallback)
            counters.uncompiled_runs += 1
            return run_backward(outputs, grads, retain_graph, create_graph, inputs, accumulate)
        counters.compiled_runs += 1
        if w.regions or w.reruns:
            counters.checkpoints_replayed += len(w.regions)
            for why in w.reruns:
                counters.checkpoints_rerun[why] += 1
        if w.has_hooks:  # (user code runs inside: it may queue callbacks, as in eager)
            with graph_task(retain_graph, create_graph, accumulate, inputs):
                return program.run(w, w.sizes, grads, retain_graph, inputs)
        if create_graph:
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
            if not retain_graph:
                release_nodes(w)
            return results
        return program.run(w, w.sizes, grads, retain_graph, inputs)
    finally:
        notice.stop()
        if traced >= 0:
            _trace.unwind(traced)


class _CompileNotice:
    """One line on stderr when capturing, building and first running (numba's JIT) a backward
    takes longer than ``config.compile_notice_s``: printed by a timer while it still runs, or at
    the end if the timer had no chance to.  Cache hits never start one."""

    __slots__ = ("lock", "said", "start_time", "timer", "what")

    def __init__(self) -> None:
        self.timer: threading.Timer | None = None  # (the rest is made by ``start``)

    def start(self, nodes: int, what: str = "") -> None:
        """The slow path began, for a graph of ``nodes`` nodes (``what`` names it otherwise)."""
        limit = config.compile_notice_s
        if self.timer is not None or limit is None:
            return
        self.what = what or f"the backward of a {nodes}-node graph"
        self.said = False
        self.lock = threading.Lock()
        self.start_time = time.perf_counter()
        self.timer = threading.Timer(limit, self.say)
        self.timer.daemon = True
        self.timer.start()

    def say(self) -> None:
        with self.lock:
            if self.said:
                return
            self.said = True
        print(
            f"fusegrad.compiler: compiling {self.what} (capture, fusion and numba's JIT: once; "
            "later calls reuse it, later processes load it from the disk cache)",
            file=sys.stderr,
            flush=True,
        )

    def stop(self) -> None:
        timer = self.timer
        if timer is None:
            return
        timer.cancel()
        limit = config.compile_notice_s
        if limit is not None and time.perf_counter() - self.start_time >= limit:
            self.say()


def _program_for(
    region: Region,
    w: Any,
    grads: Sequence[Tensor],
    outputs: Sequence[Tensor],
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
    notice: _CompileNotice,
    create_graph: bool = False,
) -> Program:
    """The program for walk ``w`` in ``region``: cached, built from a cached graph, or captured
    (raises ``Fallback`` when it cannot be).  Under ``explain`` nothing is looked up or kept.
    ``notice`` is started on the slow paths (capture, a new program)."""
    report = _debug.report
    if w.opaque and region.fullgraph:
        raise Fallback(next(iter(w.opaque.values())))  # (an opaque step is a graph break)
    entry = graphs.get(w.key) if report is None else None
    if entry is not None and entry.refused is not None:
        raise Fallback(entry.refused)
    captured = entry.find(w.sizes) if entry is not None else None
    if captured is None:
        notice.start(len(w.nodes))
        if report is not None:
            why = "explain() captures every graph"
        elif entry is not None:
            why = entry.failed_guard(w.sizes) or (
                "new sizes, and this graph is captured with concrete sizes: "
                f"{entry.symbolic_failed}"
            )
        else:
            why = miss_reason(w.key) if logs.enabled("recompiles") or _trace.enabled else ""
        symbolic = (
            config.symbolic_sizes
            and not create_graph  # (``double`` differentiates a graph of concrete sizes)
            and not (w.ddp is not None and w.ddp.buckets)  # (a bucket's size is a number)
            and (entry is None or entry.symbolic_failed is None)
        )
        if _trace.enabled:
            _trace.begin("backward", f"backward of a {len(w.nodes)}-node graph", why)
        try:
            captured = _capture(
                w, outputs, grads, inputs, accumulate, symbolic, create_graph, not region.fullgraph
            )
        except Refused as e:
            if report is None and entry is None:  # (a key that holds graphs keeps them)
                entry = GraphEntry()
                entry.refused = str(e)
                graphs.put(w.key, entry)
            raise
        counters.captures += 1
        if captured.symbolic:
            kind = "symbolic sizes"
            if captured.guards:
                kind += f", {len(captured.guards)} guard(s)"
        else:
            kind = f"concrete sizes: {captured.reason}"
        logs.log("recompiles", f"capture #{counters.captures} ({kind}): {why}")
        for reason in [*w.opaque.values(), *captured.opaque.values()]:
            logs.log_counted("fallback", reason, f"an opaque step, run eagerly: {reason}")
            if report is not None:
                report.append(("opaque", reason))
        for reason in w.reruns:
            logs.log_counted(
                "fallback", reason, f"a checkpoint's recomputation runs its Python: {reason}"
            )
            if report is not None:
                report.append(("checkpoint", f"its Python runs again ({reason})"))
        if w.regions and report is not None:
            report.append(("checkpoint", f"{len(w.regions)} replayed from the forward's recording"))
        if _trace.enabled:
            _trace.captured(captured, kind, w.key)
        logs.log("graph", "backward graph:\n" + format_graph(captured.graph))
        if report is None:
            if entry is None:
                entry = GraphEntry()
                graphs.put(w.key, entry)
                remember(w.key)
            entry.add(captured, w.sizes)
    if captured.opaque:
        # custom Functions the capture found untraceable run as opaque steps (user code):
        # this call then runs as one with hooks does (``capture.capture``)
        w.has_hooks = True
    pkey = (w.grad_key, region.mode, config.program_key())
    program = captured.programs.get(pkey)
    if program is not None:
        counters.cache_hits += 1
        logs.log_counted("cache", "hit", "program cache hit")
        return program
    device = _device_of(w, grads)
    if device is None:
        raise Fallback("the backward graph spans devices (cpu and cuda)")
    if captured.programs and (logs.enabled("recompiles") or _trace.enabled):
        # the closest of the (at most Captured.MAX_PROGRAMS) keys: one part differs, at best
        closest = min(
            captured.programs,
            key=lambda k: 4 * (k[1] != pkey[1]) + 2 * (k[2] != pkey[2]) + (k[0] != pkey[0]),
        )
        change = describe_program_miss(closest, pkey)
        logs.log("recompiles", f"new program, same graph: {change}")
        if _trace.enabled:
            _trace.begin("backward", "a new program for a graph captured before", change)
    notice.start(len(w.nodes))
    program = Program(
        captured.graph,
        mode=region.mode,
        leaves_with_grad=frozenset(i for i, s in enumerate(w.grad_key) if s is not None),
        interpreter_max_elements=config.interpreter_max_elements,
        device=device,
        sizes_per_program=config.sizes_per_program,
        unpacked=captured.unpacked,
    )
    program.double = (captured.raw, captured.vjp)  # (``double.attach``: create_graph)
    if report is not None:
        report.append(("capture", "explain() captures every graph", program))
    else:
        captured.keep(pkey, program)
    return program


def _compiling_in_background(region: Region, program: Program, w: Any, grads: Any) -> bool:
    """Whether ``program``'s first run for these sizes is (still) being compiled on another
    thread (``config.background_compile``): started here for a program not run yet, when it
    calls no user hook (the thread's run must not) and runs on the CPU."""
    job = program.pending
    if job is not None:
        if not job.done.is_set():
            return True
        program.pending = None
        if job.error is not None:  # (this call's run compiles what the thread did not)
            logs.log("perf", f"compiled backward: background compile failed ({job.error!r})")
        else:
            logs.log(
                "perf", f"compiled backward: compiled in the background in {job.seconds:.2f} s"
            )
        return False
    if (
        not config.background_compile
        or region.mode == "debug"
        or w.has_hooks
        or program.device != "cpu"
        or _trace.enabled
        or _debug.report is not None
        or not program.instance(w.sizes).variant.first_run
    ):
        return False
    try:
        saved = _saved_arrays(w, program.unpacked)
    except Exception:  # noqa: BLE001 - (the eager run raises it, as eager does)
        return False
    roots = [Tensor._make(np.array(g._data, copy=True)) for g in grads]
    leaves = [scratch_leaf(t) for t in w.leaves]
    sizes = w.sizes

    def work() -> Program:
        program.prepare(saved, leaves, roots, sizes)
        return program

    what = f"the backward of a {len(w.nodes)}-node graph in the background (run eagerly meanwhile)"
    program.pending = BackgroundBuild(work, None, what)
    counters.background_compiles += 1
    return True


def _capture(
    w: Any,
    outputs: Sequence[Tensor],
    grads: Sequence[Tensor],
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
    symbolic: bool,
    create_graph: bool = False,
    allow_opaque: bool = True,
) -> Captured:
    with _trace.phase("capture"):
        captured = _capture_graph(
            w,
            outputs,
            grads,
            inputs,
            accumulate,
            symbolic=symbolic,
            create_graph=create_graph,
            allow_opaque=allow_opaque,
        )
    if create_graph:
        captured.raw = captured.graph
    if _debug.check:
        verify(captured.graph)
    if _trace.enabled:
        _trace.graph("the captured graph, before the passes", captured.graph)
    captured.graph = passes.run(captured.graph, check=_debug.check)
    return captured


def _device_of(w: Any, grads: Sequence[Tensor]) -> str | None:
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


def _remember_tape(fast: tuple, w: Any, region: Region, program: Program) -> None:
    """File ``program`` under the tape key so the next such backward skips the walk."""
    tape, key = fast
    lk = leaf_key(w.leaves)
    if lk is None:
        return
    try:
        binding = Binding(w, tape)
    except Unbindable as e:
        logs.log_counted("cache", f"no-tape {e}", f"no tape path for this backward: {e}")
        return
    entry = tape_programs.get(key)
    if entry is None or entry.binding.signature() != binding.signature():
        entry = TapeEntry(binding)
        tape_programs.put(key, entry)
    entry.programs[(lk, region.mode, config.program_key())] = (program, w.sizes)


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


def compile(
    fn: Callable | None = None,
    *,
    fullgraph: bool = False,
    dynamic: bool = True,
    mode: str = "default",
) -> Any:
    """Decorator (``@fusegrad.compile`` or ``@fusegrad.compile(fullgraph=True)``) or function:
    every backward()/grad() executed inside ``fn`` is compiled.  ``dynamic`` is accepted for
    torch.compile compatibility: sizes are always runtime arguments of generated code.

    A module gives a module (``compiler.module.OptimizedModule``): the original's parameters,
    state and attributes, whose outputs' backward is compiled even when ``backward()`` is called
    outside it."""
    if fn is None:
        return functools.partial(compile, fullgraph=fullgraph, dynamic=dynamic, mode=mode)
    if not callable(fn):
        raise TypeError(f"compile() expects a callable, got {type(fn).__name__}")
    if mode not in ("default", "debug"):
        raise ValueError(f"compile: unknown mode {mode!r} (expected default or debug)")
    if isinstance(fn, Module):
        # (``compiler.module`` builds on this package: imported once it is complete)
        from .module import OptimizedModule

        return OptimizedModule(fn, fullgraph, mode)

    from .step import CompiledFunction

    compiled = CompiledFunction(
        fn, fullgraph, mode, lambda: compiled_autograd(fullgraph=fullgraph, mode=mode)
    )
    functools.update_wrapper(compiled, fn)
    return compiled


class Report:
    """What ``explain`` saw: the whole-step recording (its program, or why it could not be
    replayed), captured backward graphs (with their IR) and fallbacks with reasons."""

    def __init__(self, events: list) -> None:
        self.captures = [
            (reason, prog) for kind, reason, *rest in events if kind == "capture" for prog in rest
        ]
        self.fallbacks = [reason for kind, reason, *rest in events if kind == "fallback"]
        # custom Function backwards that run eagerly as opaque steps of a compiled program
        self.opaque = [reason for kind, reason, *rest in events if kind == "opaque"]
        # how checkpoints recompute: replayed from their recordings, or their Python run again
        self.checkpoints = [what for kind, what, *rest in events if kind == "checkpoint"]
        self.steps = [(e[1], e[2]) for e in events if e[0] == "step"]
        self.breaks = [reason for kind, reason, *rest in events if kind == "break"]
        self.guards = [rest[0] for kind, *rest in events if kind == "guards"]
        self.recompiles = [rest[0] for kind, *rest in events if kind == "recompile"]
        self.ran = next((rest[0] for kind, *rest in events if kind == "ran"), None)

    def __str__(self) -> str:
        lines = []
        if self.ran is not None:
            lines.append(
                f"explain ran {self.ran} once, as one call: its effects happened (.grad, "
                "parameters, optimizer state, buffers, random draws)"
            )
        for reason in self.recompiles:
            lines.append(f"recording: {reason}")
        for step, program in self.steps:
            lines.append(step.describe(program))
        for reason in self.breaks:
            lines.append(f"whole step: not replayable ({reason}); backward() compiled on its own")
        for guard in self.guards:
            lines.append(f"guards: {guard}")
        lines.append(f"{len(self.captures)} graph(s) captured, {len(self.fallbacks)} fallback(s)")
        for reason in self.opaque:
            lines.append(f"opaque step (a custom Function's backward, run eagerly): {reason}")
        for what in self.checkpoints:
            lines.append(f"checkpoint recomputation: {what}")
        for i, (reason, prog) in enumerate(self.captures):
            n = sum(1 for v in prog.graph.values if v.op not in ("input", "scalar", "constant"))
            lines.append(
                f"graph {i}: {n} ops, {len(prog.kernels)} kernel(s), "
                f"{len(prog.externs)} extern call(s) ({reason})"
            )
            lines.extend("    " + line for line in str(prog).splitlines())
            lines.extend("  " + line for line in prog.describe_schedule().splitlines())
            if prog.source_path:
                lines.append(f"  generated code: {prog.source_path}")
        for reason in self.fallbacks:
            lines.append(f"fallback: {reason}")
        return "\n".join(lines)

    def to_dot(self) -> Any:
        """The report as a ``fusegrad.viz.DotGraph``: kernels as clusters of the IR values fused
        into them, externs, effects, hooks, fallbacks; a whole step's parts (``compiler.viz``)."""
        from .viz import report_dot  # (pictures: loaded when asked for)

        return report_dot(self)

    def render(self, path: str, format: str | None = None) -> str:
        """Draw ``to_dot()`` to ``path`` (svg, png, ... by its suffix); returns the path written
        (a ``.dot`` file, with a warning, when Graphviz's ``dot`` is missing)."""
        return self.to_dot().render(path, format)


def explain(fn: Callable, *args: Any, **kwargs: Any) -> Report:
    """Call ``fn(*args, **kwargs)`` once and report what compiling it does.

    This *is* a call of ``fn``, run eagerly while it is recorded as a whole step: its effects
    (gradients, optimizer steps, buffers, random draws) happen once, exactly as one call of the
    function would make them -- call ``explain`` *instead of* one step, not in addition to it.
    The report shows the whole-step program (forward, backward and optimizer parts, kernels,
    what the backward reads of the forward) or why the call cannot be replayed (with the source
    line), the guards, and every backward graph captured afresh when the call falls back to
    compiling its backward.  When ``fn`` is a ``fusegrad.compile``d function its recording for
    these arguments is replaced by this one (so the next call replays it); anything else is
    left out of every cache."""
    from .step import CompiledFunction, Watch

    target = fn if isinstance(fn, CompiledFunction) else None
    if target is None:
        target = CompiledFunction(fn, False, "default", lambda: compiled_autograd())
    events: list = [("ran", getattr(target.fn, "__qualname__", repr(target.fn)))]
    prev_report, _debug.report = _debug.report, events
    try:
        watch = Watch(target.fn, args, kwargs)
        events.append(("recompile", target.why_record(watch.key)))
        target.record(watch, args, kwargs, explaining=True)
    finally:
        _debug.report = prev_report
    entry = target.entries.get(watch.key)
    if isinstance(entry, str):
        events.append(("break", entry))
    elif entry is not None:
        grad_key = tuple(_grad_state(leaf) for leaf in entry.leaves)
        events.append(("step", entry, entry.program(grad_key, target.mode)))
    events.append(("guards", watch.describe_guards()))
    return Report(events)
