"""The compiler's one event stream: everything the front ends and the compilation service do
that anyone reports -- a capture, a program built, a cache hit, a fallback with its reason, an
uncompiled run, a whole step recorded or broken, a numba compilation -- is emitted here once,
with ``emit(kind, reason, **detail)``.  Four sinks subscribe to it:

* the counters (``Counters``, ``fusegrad.compiler.counters``): what happened how often;
* the log channels (``logs``: ``FUSEGRAD_LOGS=recompiles,cache,perf,fallback,...``);
* the HTML trace report (``trace``), while ``FUSEGRAD_TRACE_DIR`` is set;
* ``explain()``'s report (``debug.report``), while ``explain`` runs on this thread.

Which sink does what with which event is the table ``_HANDLERS`` at the bottom of this module:
one row per event kind, so an event's meaning (which counter it moves, which line it logs, what
``explain`` shows) is read in one place.  A sink that is off costs one flag test.

Where it sits: below every front end (``region``, ``step``, ``module``), the service and the
programs; above ``logs`` and ``trace`` only (it imports nothing else of the compiler).  See
docs/ARCHITECTURE.md, "Events".
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import logs
from . import trace as _trace


@dataclass
class Counters:
    """What the compiler did in this process (``reset()`` zeroes it), one line per counter:

    * captures: backward graphs captured (the engine run over symbolic values: Python work).
    * builds: programs built from a captured graph (schedule, code generation, loading).
    * compiles: numba specialisations (a function for one set of argument types) JIT-compiled.
    * cache_hits: backward passes that found their ``Program`` in memory (tape hits included).
    * tape_hits: the cache hits found through the tape, without walking the graph.
    * disk_hits: numba specialisations loaded from the disk cache instead of compiled.
    * compiled_runs: backward passes run by a compiled ``Program``.
    * fallbacks: backward passes run eagerly, by reason.
    * step_captures: calls of compiled functions recorded as a whole step (``step``).
    * step_runs: calls replayed as a whole step.
    * step_warmups: first calls run eagerly because they create optimizer state (``step``).
    * background_compiles: programs (whole steps, compiled modules' backwards) built and
      JIT-compiled on a thread of their own.
    * uncompiled_runs: whole-step replays (counted in step_runs too) and compiled modules'
      backwards run uncompiled, each value by its eager kernel, while their program was built
      in the background.
    * quick_runs: runs of a quick tier's program (``Program.quick``: every kernel interpreted
      or by eager kernels), the first a background compile publishes.
    * step_breaks: recordings that could not be replayed, by reason (the function then runs
      with compiled backward only, for that guard key).
    * opaque_functions: custom Function ``backward`` calls a compiled program ran eagerly, as
      an opaque step, because they cannot be traced, by reason (counted in compiled_runs too).
    * checkpoints_replayed: checkpointed functions a compiled program recomputed from the
      recording of their forward (``autograd.recording``), without their Python.
    * checkpoints_rerun: checkpointed functions whose Python a compiled program ran again (the
      unpack hook as an opaque step), because a replay could not vouch for it, by reason (a
      reentrant one counts in opaque_functions instead).
    * native_runs: calls of native segments (``codegen.native_cpu``) that ran to the end, and
      native_steps: the program steps those calls ran.
    * native_dropped: native segments whose steps ran one by one instead, by reason ("not
      compiled": numba could not compile it; "raised": a call raised, and its steps ran again
      one by one to raise eager's error).
    * batched_vjps: Jacobian blocks (``jacobian(vectorize=True)``, one per output) whose rows
      one batched program computed (``batching``).

    ``compiles`` and ``disk_hits`` count the functions programs call (generated CPU kernels, their
    ``prange`` variants, the interpreter's ``run_ops``, CUDA kernels on a GPU; the CUDA simulator
    compiles nothing), whenever numba needs one (``codegen.diskcache``), not the helpers inside.
    """

    captures: int = 0
    builds: int = 0
    compiles: int = 0
    cache_hits: int = 0
    tape_hits: int = 0
    disk_hits: int = 0
    compiled_runs: int = 0
    fallbacks: Counter = field(default_factory=Counter)
    step_captures: int = 0
    step_runs: int = 0
    step_warmups: int = 0
    background_compiles: int = 0
    uncompiled_runs: int = 0
    quick_runs: int = 0
    step_breaks: Counter = field(default_factory=Counter)
    opaque_functions: Counter = field(default_factory=Counter)
    checkpoints_replayed: int = 0
    checkpoints_rerun: Counter = field(default_factory=Counter)
    batched_vjps: int = 0
    native_runs: int = 0
    native_steps: int = 0
    native_dropped: Counter = field(default_factory=Counter)
    # not a count: ``time.perf_counter()`` when a program last started an allreduce (a DDP
    # bucket): the moment its last gradient was done (``benchmarks.distributed`` reads it)
    last_allreduce_start: float = 0.0

    def reset(self) -> None:
        """Every count back to zero (the Counter fields emptied in place)."""
        for name, value in vars(self).items():
            if isinstance(value, Counter):
                value.clear()
            elif name != "last_allreduce_start":
                setattr(self, name, 0)

    def __repr__(self) -> str:
        parts = []
        for name, value in vars(self).items():
            if name == "last_allreduce_start":
                continue
            parts.append(f"{name}={dict(value) if isinstance(value, Counter) else value}")
        return f"Counters({', '.join(parts)})"


counters = Counters()


class _Debug(threading.local):
    """Per-thread settings for tests and ``explain``."""

    def __init__(self) -> None:
        self.check = False  # verify the IR after every pass (tests)
        # explain(): what it shows is appended here, as (kind, reason, *objects)
        self.report: list | None = None


debug = _Debug()


# ---- the event kinds ---------------------------------------------------------------------------
# Compiled autograd (``region``): one backward() / grad() call
TAPE_HIT = "tape hit"  # its program found through the forward's tape, without a walk
PROGRAM_HIT = "program hit"  # its program found in memory after the walk
FALLBACK = "fallback"  # run eagerly; reason
CAPTURED = "captured"  # a backward graph captured; reason: why, detail: kind, captured, key
OPAQUE_STEP = "opaque step"  # a custom Function's backward will run eagerly inside a program
CHECKPOINT_RERUN = "checkpoint rerun"  # a checkpoint's recomputation runs its Python; reason
CHECKPOINTS_REPLAYED = "checkpoints replayed"  # detail: count (at capture, for explain)
COMPILED_RUN = "compiled run"  # a backward ran compiled; detail: replayed, reruns
UNCOMPILED_RUN = "uncompiled run"  # ran uncompiled while its program compiles elsewhere
QUICK_RUN = "quick run"  # a quick tier's program ran (``Program.quick``)
NEW_PROGRAM = "new program"  # a captured graph needs another program; reason: the change
NO_TAPE = "no tape"  # a program cannot be found through the tape later; reason
# The service: a program's life
BUILT = "built"  # a Program built; detail: program
FIRST_RUN = "first run"  # a variant's first run ended (numba's JIT or loading included)
BACKGROUND_STARTED = "background started"  # reason: what compiles
BACKGROUND_DONE = "background done"  # detail: seconds, owner
BACKGROUND_FAILED = "background failed"  # detail: error, owner
NUMBA_COMPILED = "numba compiled"  # a numba specialisation JIT-compiled; reason: which
NUMBA_LOADED = "numba loaded"  # a numba specialisation loaded from the disk cache; reason: which
OPAQUE_FUNCTION_RUN = "opaque function run"  # reason: why it is opaque
BATCHED_VJP = "batched vjp"  # a Jacobian block computed by one batched program
# Whole steps (``step``) and compiled modules (``module``)
STEP_REPLAYED = "step replayed"  # detail: what ("step" or "module")
RECORDING = "recording"  # a call is recorded; reason: why (first call, the key's change)
STEP_RECORDED = "step recorded"  # detail: owner, watch, started, entry (a Step or AOTEntry)
STEP_BREAK = "step break"  # not replayable; reason; detail: owner, watch, started, what
GIVEN_UP = "given up"  # past config.step_recordings: no more recordings; reason
WARMUP = "warmup"  # a first call runs eagerly (it creates optimizer state); reason
EAGER_BACKWARD = "eager backward"  # compile(module): its backward runs eagerly; reason
EXPLAINED = "explained"  # explain() built a backward's program (kept nowhere); detail: program
GRAPH = "graph"  # an IR graph to show (the ``graph`` log channel); reason: the text


def wanted(kind: str) -> bool:
    """Whether any sink shows ``kind``'s reason now: a front end computes an expensive reason
    (a key's difference in words, a graph's text) only then."""
    channel = _CHANNELS.get(kind)
    return (
        (channel is not None and logs.enabled(channel))
        or _trace.enabled
        or debug.report is not None
    )


# ---- emitting ----------------------------------------------------------------------------------


def emit(event: str, reason: str = "", /, **detail: Any) -> None:
    """Tell every sink that ``event`` happened (``reason`` in words, ``detail`` objects)."""
    for handler in _HANDLERS[event]:
        handler(reason, detail)


# ---- the sinks ---------------------------------------------------------------------------------


def _count(name: str, by_reason: bool = False) -> Callable[[str, dict], None]:
    if by_reason:

        def add_reason(reason: str, detail: dict) -> None:
            getattr(counters, name)[reason] += 1

        return add_reason

    def add(reason: str, detail: dict) -> None:
        setattr(counters, name, getattr(counters, name) + 1)

    return add


def _log(channel: str, text: str, counted: str | None = None) -> Callable[[str, dict], None]:
    """A log line on ``channel``: ``text`` formatted with ``reason`` and the detail; ``counted``
    (a key, also formatted) makes it a repeated event (``logs.log_counted``)."""

    def log(reason: str, detail: dict) -> None:
        if logs.enabled(channel):
            message = text.format(reason=reason, **detail)
            if counted is None:
                logs.log(channel, message)
            else:
                logs.log_counted(channel, counted.format(reason=reason, **detail), message)

    return log


def _explain(*entry: str) -> Callable[[str, dict], None]:
    """An entry of ``explain()``'s report: ``entry`` names the kind, then ``"reason"`` or the
    names of detail objects that follow it."""

    def note(reason: str, detail: dict) -> None:
        report = debug.report
        if report is not None:
            kind, *parts = entry
            report.append((kind, *[reason if p == "reason" else detail[p] for p in parts]))

    return note


def _traced(fn: Callable[[str, dict], None]) -> Callable[[str, dict], None]:
    def when_tracing(reason: str, detail: dict) -> None:
        if _trace.enabled:
            fn(reason, detail)

    return when_tracing


def _compiled_run(reason: str, detail: dict) -> None:
    counters.compiled_runs += 1
    replayed, reruns = detail.get("replayed", 0), detail.get("reruns", ())
    counters.checkpoints_replayed += replayed
    for why in reruns:
        counters.checkpoints_rerun[why] += 1


def _tape_hit(reason: str, detail: dict) -> None:
    counters.cache_hits += 1
    counters.tape_hits += 1
    counters.compiled_runs += 1


def _captured_kind(reason: str, detail: dict) -> None:
    if logs.enabled("recompiles"):
        logs.log("recompiles", f"capture #{counters.captures} ({detail['kind']}): {reason}")


def _checkpoints_noted(reason: str, detail: dict) -> None:
    report = debug.report
    if report is not None and detail["count"]:
        report.append(("checkpoint", f"{detail['count']} replayed from the forward's recording"))


def _step_recorded_trace(reason: str, detail: dict) -> None:
    record = _trace.module_recorded if detail["what"] == "module" else _trace.recorded
    record(detail["owner"], detail["watch"], detail["started"], detail["why"], detail["entry"])


def _step_break_trace(reason: str, detail: dict) -> None:
    record = _trace.module_recorded if detail["what"] == "module" else _trace.recorded
    record(detail["owner"], detail["watch"], detail["started"], detail["why"], None, reason)


def _step_break_log(reason: str, detail: dict) -> None:
    if detail["what"] == "module":
        logs.log(
            "fallback",
            f"compile({detail['name']}): the forward is not replayable ({reason}); "
            "its backward is still compiled",
        )
    else:
        logs.log("fallback", f"whole-step compile: {reason}; compiling backward() only")


_HANDLERS: dict[str, list[Callable[[str, dict], None]]] = {
    TAPE_HIT: [_tape_hit, _log("cache", "program cache hit (tape)", "hit-tape")],
    PROGRAM_HIT: [_count("cache_hits"), _log("cache", "program cache hit", "hit")],
    FALLBACK: [
        _count("fallbacks", by_reason=True),
        _log("fallback", "running eagerly: {reason}", "{reason}"),
        _traced(lambda reason, detail: _trace.fallback(reason)),
        _explain("fallback", "reason"),
    ],
    CAPTURED: [
        _count("captures"),
        _captured_kind,
        _traced(lambda r, d: _trace.captured(d["captured"], d["kind"], d["key"])),
    ],
    OPAQUE_STEP: [
        _log("fallback", "an opaque step, run eagerly: {reason}", "{reason}"),
        _explain("opaque", "reason"),
    ],
    CHECKPOINT_RERUN: [
        _log("fallback", "a checkpoint's recomputation runs its Python: {reason}", "{reason}"),
        lambda reason, detail: (
            debug.report.append(("checkpoint", f"its Python runs again ({reason})"))
            if debug.report is not None
            else None
        ),
    ],
    CHECKPOINTS_REPLAYED: [_checkpoints_noted],
    COMPILED_RUN: [_compiled_run],
    UNCOMPILED_RUN: [_count("uncompiled_runs")],
    QUICK_RUN: [_count("quick_runs")],
    NEW_PROGRAM: [
        _log("recompiles", "new program, same graph: {reason}"),
        _traced(
            lambda reason, detail: _trace.begin(
                "backward", "a new program for a graph captured before", reason
            )
        ),
    ],
    NO_TAPE: [_log("cache", "no tape path for this backward: {reason}", "no-tape {reason}")],
    BUILT: [_count("builds"), _traced(lambda r, d: _trace.program_built(d["program"]))],
    FIRST_RUN: [
        _traced(lambda r, d: _trace.first_run(d["program"], d["seconds"])),
        lambda reason, detail: logs.log(
            "perf", f"first run (JIT or cache load included): {1e3 * detail['seconds']:.1f} ms"
        ),
    ],
    BACKGROUND_STARTED: [
        _count("background_compiles"),
        _log("recompiles", "numba compiles {reason}"),
    ],
    BACKGROUND_DONE: [_log("perf", "{owner}: compiled in the background in {seconds:.2f} s")],
    BACKGROUND_FAILED: [_log("perf", "{owner}: background compile failed ({error!r})")],
    NUMBA_COMPILED: [_count("compiles")],
    NUMBA_LOADED: [_count("disk_hits"), _log("cache", "{reason}: loaded from numba's disk cache")],
    OPAQUE_FUNCTION_RUN: [_count("opaque_functions", by_reason=True)],
    BATCHED_VJP: [_count("batched_vjps")],
    STEP_REPLAYED: [
        _count("step_runs"),
        _log("cache", "{message}", "{what}"),
    ],
    RECORDING: [_log("recompiles", "{reason}"), _explain("recompile", "reason")],
    STEP_RECORDED: [_count("step_captures"), _traced(_step_recorded_trace)],
    STEP_BREAK: [
        _count("step_breaks", by_reason=True),
        _step_break_log,
        _traced(_step_break_trace),
    ],
    GIVEN_UP: [_count("step_breaks", by_reason=True), _log("recompiles", "{reason}")],
    WARMUP: [
        _count("step_warmups"),
        _log("recompiles", "whole step: first call runs eagerly: {reason}"),
    ],
    GRAPH: [_log("graph", "{reason}")],
    EXPLAINED: [_explain("capture", "reason", "program")],
    EAGER_BACKWARD: [
        _log(
            "fallback",
            "compile({name}): a backward outside the module runs eagerly: {reason}",
        )
    ],
}

# the log channel of the events whose reason a front end computes only when it is shown
_CHANNELS = {
    RECORDING: "recompiles",
    CAPTURED: "recompiles",
    NEW_PROGRAM: "recompiles",
    GRAPH: "graph",
}
