"""Admission: what each front end may do with a call and with a backward graph, decided in one
place.

Two questions, asked by all three front ends (compiled autograd ``region``, whole steps
``step``, compiled modules ``module``):

* **How a call runs** (``call_policy``): a compiled function or module called while another
  compiled call records (``INLINE``: its ops are part of that recording), inside a
  compiled-backward region or under anomaly mode (``REGION``: run as written, its ``backward()``
  calls compiled one by one -- anomaly mode's checks need the backward's nodes to run, which a
  replay never does, and they then run with eager's checks), under a forward-AD level (``PLAIN``:
  the ops must run to carry tangents, which no program computes), else ``COMPILE`` (replay a
  recording, or record one).  The same answer for ``compile(fn)`` and ``compile(model)``.
* **What a backward graph becomes** (``admit``): given the walk of a backward (``key.walk``),
  either a ``Plan`` (compile it; how DistributedDataParallel's hooks are taken over; whether
  user code runs inside as opaque steps) or the reason it cannot be compiled for this front end.
  Compiled autograd runs user code (hooks, untraceable custom Functions) as opaque steps of its
  program; a whole step or a module's ahead-of-time backward replays no Python, so the same
  graph is a reason there.

``CompilationError`` is what ``fullgraph=True`` raises instead of any fallback.  See
docs/ARCHITECTURE.md, "Admission".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fusegrad.autograd import anomaly as _anomaly
from fusegrad.autograd.forward_state import state as _forward_state
from fusegrad.autograd.tracer import state as _tracer_state
from fusegrad.autograd.tracer import tracer_threads as _tracer_threads

from . import ddp as _ddp
from .key import replay_reason


class CompilationError(RuntimeError):
    """Raised under ``fullgraph=True`` when something cannot be compiled."""


# ---- how a call runs ---------------------------------------------------------------------------

INLINE = "inline"  # part of an enclosing recording: run the Python, the recording sees its ops
REGION = "region"  # run the Python inside a compiled-backward region
PLAIN = "plain"  # run the Python as eager code
COMPILE = "compile"  # replay a recording of this call, or record one


def call_policy() -> str:
    """How a call of a compiled function or module runs now (see the module docstring)."""
    current = _tracer_state.tracer if _tracer_threads else None  # (see ``tracer_threads``)
    if current is not None:
        # (``recording.Recorder``, the tracer of a call being recorded, says so)
        return INLINE if getattr(current, "records_calls", False) else REGION
    if _forward_state.level is not None:
        return PLAIN
    if _anomaly._state.enabled:
        return REGION
    return COMPILE


# ---- what a backward graph becomes -------------------------------------------------------------

BACKWARD = "backward"  # compiled autograd: a backward()/grad() call
STEP = "step"  # a backward() inside a whole step being recorded
MODULE = "module"  # a compiled module's ahead-of-time backward
BATCHED = "batched"  # jacobian(vectorize=True): one program for every row of a Jacobian


@dataclass
class Plan:
    """A backward that compiles: ``hooks`` -- user code runs inside the program as opaque steps
    (effects then keep eager's order); ``ddp`` -- the DistributedDataParallel work the program
    does instead of the wrappers' hooks (compiled autograd: a ``ddp.Plan``; a whole step: the
    wrappers, whose buckets it averages itself); ``key`` -- what that adds to the walk's key."""

    hooks: bool
    ddp: Any = None
    key: tuple = ()


def admit(
    w: Any,
    front: str,
    *,
    fullgraph: bool = False,
    create_graph: bool = False,
    inputs: Any = None,
    accumulate: bool = True,
    where: str = "",
) -> Plan | str:
    """A ``Plan`` for walk ``w`` in front end ``front`` (``BACKWARD``, ``STEP``, ``MODULE``), or
    the reason it cannot be compiled there.  ``where`` (a whole step's source line) goes into
    the reason."""
    at = f"backward() at {where}: " if where else ""
    if front == STEP and create_graph:
        # (the recorded program would need the double backward's intermediate values, which
        # the eager run that records it does not bind)
        return f"backward(create_graph=True) at {where}"
    if w.fallback is not None:
        return at + w.fallback
    reason = _mode_reason(w, create_graph)
    if reason is not None:
        return at + reason
    opaque = next(iter(w.opaque.values()), None)
    if front == BATCHED:
        return "the backward runs user hooks" if w.has_hooks else Plan(hooks=False)
    if front == BACKWARD:
        if opaque is not None and fullgraph:
            return opaque  # (an opaque step is a graph break)
        if w.has_hooks and accumulate and inputs is None and not create_graph:
            # DistributedDataParallel's hooks alone: the program does their averaging itself,
            # when that is exactly what they would do
            plan = _ddp.plan(w) if not _anomaly._state.enabled else None
            if plan is not None:
                return Plan(hooks=False, ddp=plan, key=(plan.key,))
        return Plan(hooks=w.has_hooks)
    if opaque is not None:
        return at + opaque
    ddps = None
    if w.has_hooks:
        # DistributedDataParallel's hooks are the one kind a whole step takes in: it averages
        # the buckets itself; a module's backward takes none
        ddps = _ddp.ddp_hooks_only(w) if front == STEP else []
        if not ddps:
            return (
                f"backward() at {where} runs user hooks"
                if where
                else ("the backward runs user hooks")
            )
    reason = replay_reason(w)
    if reason is not None:
        return at + reason
    if front == STEP and inputs is not None and accumulate:
        if any(t.grad_fn is not None for t in inputs):
            # (a non-leaf's .grad lives on a tensor of the recording call only)
            return f"backward(inputs=...) with a non-leaf input at {where}"
    return Plan(hooks=False, ddp=ddps or None)


def _mode_reason(w: Any, create_graph: bool) -> str | None:
    """Why anomaly mode or ``create_graph`` keeps this backward eager, whatever the front end."""
    anomaly = _anomaly._state.enabled
    if w.opaque and (anomaly or create_graph):
        # (its gradients would have to be differentiable, or NaN-checked before it returns)
        return str(next(iter(w.opaque.values())))
    if w.has_hooks and anomaly:
        # (a NaN check must stop the backward before later hooks run, as eager's does)
        return "anomaly mode is on and the backward runs user hooks"
    if create_graph and anomaly:
        return "create_graph=True under anomaly mode (each recorded node keeps its parent)"
    if create_graph and w.has_hooks:
        return "create_graph=True with user hooks (their results would be recorded)"
    return None
