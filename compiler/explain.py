"""``explain``: call a function once and report what compiling it does -- the whole-step
program (or why the call cannot be replayed), the guards, the backward graphs captured, the
fallbacks with their reasons -- as text (``Report.__str__``) or a picture (``Report.render``).

The report is a subscriber of the event stream (``events.debug.report``): while ``explain``
runs on a thread, the events the front ends emit there are noted in it.  See
docs/ARCHITECTURE.md, "Events".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import events
from .events import debug, emit
from .key import grad_state
from .module import OptimizedModule
from .recording import Watch
from .region import compiled_autograd
from .step import AsModule, CompiledFunction
from .viz import report_dot


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
        # why the function runs compiled as a module (``step.AsModule``)
        self.as_module = [rest[0] for kind, *rest in events if kind == "module"]

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
            if reason.startswith("graph break"):
                # (``breaks``: the parts are recorded on the next calls, each a whole step)
                lines.append(
                    f"whole step: {reason}; each compiled part is recorded on its next call"
                )
            else:
                lines.append(
                    f"whole step: not replayable ({reason}); backward() compiled on its own"
                )
        for reason in self.as_module:
            lines.append(
                f"whole step: {reason} (its forward replayed as a program, the backward outside "
                "it a second program: explain(fusegrad.compile(model)) shows such programs)"
            )
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
    if isinstance(fn, OptimizedModule):
        return _explain_module(fn, args, kwargs)
    target = fn if isinstance(fn, CompiledFunction) else None
    if target is None:
        target = CompiledFunction(fn, False, "default", lambda: compiled_autograd())
    seen: list = [("ran", getattr(target.fn, "__qualname__", repr(target.fn)))]
    prev_report, debug.report = debug.report, seen
    try:
        watch = Watch(target.fn, args, kwargs)
        emit(events.RECORDING, target.why_record(watch.key))
        target.record(watch, args, kwargs, explaining=True)
    finally:
        debug.report = prev_report
    entry = target.entries.get(watch.key)
    if type(entry) is AsModule:
        seen.append(("module", entry))
    elif isinstance(entry, str):
        seen.append(("break", entry))
    elif entry is not None:
        grad_key = tuple(grad_state(leaf) for leaf in entry.leaves)
        seen.append(("step", entry, entry.program(grad_key, target.mode)))
    seen.append(("guards", watch.describe_guards()))
    return Report(seen)


def _explain_module(cm: OptimizedModule, args: tuple, kwargs: dict) -> Report:
    """``explain`` of a compiled module: one call, recorded as ``compile(model)`` records it
    (replacing its recording for these guards), reported as its forward program and its
    backward program, or why it cannot be replayed."""
    mod = cm._orig_mod
    seen: list = [("ran", f"compile({type(mod).__name__})")]
    prev_report, debug.report = debug.report, seen
    try:
        watch = Watch(mod.forward, args, kwargs)
        emit(events.RECORDING, cm._aot_why(watch.key))
        cm._recorded_call(watch, args, kwargs, explaining=True)
        entry = cm._aot.get(watch.key)
        if isinstance(entry, str):
            seen.append(("break", entry))
        elif entry is not None:
            grad_key = tuple(grad_state(leaf) for leaf in entry.step.leaves)
            seen.append(("step", entry.step, entry.step.program(grad_key, entry.mode)))
            if entry.root_slots:
                program = entry.build_backward(entry.backward_graph)
                seen.append(("capture", "compile(model): its backward program", program))
    finally:
        debug.report = prev_report
    seen.append(("guards", watch.describe_guards()))
    return Report(seen)
