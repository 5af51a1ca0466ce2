"""Fusion: partition a graph's computations into ``Kernel``s (fused loops) and externs.

Assumes a verified graph after DCE.  Guarantees a schedule (a list of steps, executed in order)
in which every value is computed exactly once, before its first use, and every kernel is convex
(no path leaves the kernel and comes back).

* Elementwise values (``lowering.EXPRESSIONS``) and ``broadcast_to`` views over the same
  iteration space (output shape) fuse: vertically (a producer and its consumer) and horizontally
  (independent values of the same shape, e.g. the gradients of ``x`` and of ``w``).
* An elementwise value's reduction ``sum_to`` / ``sum`` fuses as the kernel's epilogue (the
  gradient of a broadcast operand is computed in the same loop as the broadcast op's gradient).
* Everything else (matmul, indexing, reshape, ...) is an extern step, a fusion barrier; so is a
  lone ``broadcast_to`` that nothing fused with (a numpy view instead of a loop).

Convexity by construction: a value may join kernel K only if each of its inputs is in K or is
computed by a step scheduled before K.  Kernels are capped at ``MAX_VALUES`` values (a 200-op
chain becomes several loops, keeping numba's compile time bounded).  ``fuse=False`` (debug mode)
puts every computation in a step of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..codegen.lowering import EXPRESSIONS, FUSED_REDUCTIONS
from ..ir import EFFECT_OPS, Graph, Value

MAX_VALUES = 48


@dataclass(eq=False)
class Kernel:
    """One fused loop nest over ``shape``: ``values`` in order, ``reductions`` as epilogues."""

    shape: tuple[int, ...]
    values: list[Value] = field(default_factory=list)
    reductions: list[Value] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)  # computed outside, read inside
    outputs: list[Value] = field(default_factory=list)  # computed inside, needed outside
    # outputs written with ``+=`` straight into an existing ``.grad`` (the accumulation
    # epilogue): set by the program, which knows which leaves already have a ``.grad``
    accumulate: set = field(default_factory=set)
    # a row kernel (``schedule.merge_rows``): member -> phase; empty for a plain kernel
    phases: dict = field(default_factory=dict)

    def members(self) -> set[Value]:
        return set(self.values) | set(self.reductions)


@dataclass
class Extern:
    """A value computed by its primitive's eager kernel (an opaque op or a fusion barrier)."""

    value: Value


def _fusible(v: Value) -> bool:
    return v.op in EXPRESSIONS or v.op == "broadcast_to"


def _reduction_of(v: Value) -> bool:
    return v.op in FUSED_REDUCTIONS and v.dtype.is_floating_point


def fuse(graph: Graph, enabled: bool = True) -> list[Kernel | Extern]:
    steps: list[Kernel | Extern] = []
    step_of: dict[Value, int] = {}  # value -> index of the step computing it
    open_kernels: list[int] = []  # step indices of kernels that may still grow

    def available_before(v: Value, k: int) -> bool:
        return v.op in ("input", "constant", "scalar") or step_of.get(v, k) < k

    for v in graph.values:
        if v.op in ("input", "constant", "scalar"):
            continue
        placed = False
        if enabled and (_fusible(v) or (_reduction_of(v) and v.inputs[0] in step_of)):
            if _fusible(v):
                space = v.shape
            else:
                space = v.inputs[0].shape  # a reduction joins the kernel of its input
            for k in reversed(open_kernels):
                kern = steps[k]
                assert isinstance(kern, Kernel)
                if kern.shape != space or len(kern.values) + len(kern.reductions) >= MAX_VALUES:
                    continue
                members = kern.members()
                if _reduction_of(v) and not _fusible(v) and v.inputs[0] not in kern.values:
                    continue
                if all(i in members or available_before(i, k) for i in v.inputs):
                    if any(i in kern.reductions for i in v.inputs):
                        continue  # a reduction's result is only complete after the loop
                    (kern.reductions if not _fusible(v) else kern.values).append(v)
                    step_of[v] = k
                    placed = True
                    break
            if not placed and _fusible(v):
                steps.append(Kernel(shape=v.shape, values=[v]))
                step_of[v] = len(steps) - 1
                open_kernels.append(len(steps) - 1)
                placed = True
        if not placed:
            steps.append(Extern(v))
            step_of[v] = len(steps) - 1
            if v.op in EFFECT_OPS or v.op == "allreduce_start":
                # a user hook or an ordered .grad write: nothing computed after it in eager
                # order may move before it, so no earlier kernel grows past this point
                open_kernels.clear()
    # a kernel of broadcasts only (a constant a rule made, read by externs): a numpy view costs
    # nothing, a loop would write every element
    steps = [
        Extern(step.values[0])
        if isinstance(step, Kernel)
        and len(step.values) == 1
        and not step.reductions
        and step.values[0].op == "broadcast_to"
        else step
        for step in steps
    ]
    _connect(graph, steps)
    return steps


def _connect(graph: Graph, steps: list[Kernel | Extern]) -> None:
    """Fill each kernel's inputs and outputs."""
    needed_outside: dict[Value, set[int]] = {}
    for idx, step in enumerate(steps):
        uses = (
            step.value.inputs
            if isinstance(step, Extern)
            else [i for m in step.values + step.reductions for i in m.inputs]
        )
        for i in uses:
            needed_outside.setdefault(i, set()).add(idx)
    effect_values = {v for _, _, v in graph.effects}
    for idx, step in enumerate(steps):
        if not isinstance(step, Kernel):
            continue
        members = step.members()
        seen: set[Value] = set()
        for m in step.values + step.reductions:
            for i in m.inputs:
                if i not in members and i not in seen and i.op != "scalar":
                    seen.add(i)
                    step.inputs.append(i)
        for m in step.values + step.reductions:
            users = needed_outside.get(m, set()) - {idx}
            if users or m in effect_values or m in step.reductions:
                step.outputs.append(m)


def merge_kernels(
    group: list[Kernel], needed_outside: Callable[[Value], bool], phases: dict | None = None
) -> Kernel:
    """One kernel with the members of the consecutive kernels ``group`` (nothing runs between
    them, so the schedule stays valid).  Its inputs are what the group reads and does not
    compute; its outputs are the members' reductions and the values for which
    ``needed_outside(value)`` holds (read by a step outside the group, or an effect).  Whether
    the members may share one loop is the caller's question (``interpreter.merge``: the same
    iteration space, no reduction read; ``rows``: phases)."""
    values = [v for k in group for v in k.values]
    reductions = [r for k in group for r in k.reductions]
    produced = set(values) | set(reductions)
    inputs: list[Value] = []
    seen: set[Value] = set()
    for kern in group:
        for i in kern.inputs:
            if i not in produced and i not in seen:
                seen.add(i)
                inputs.append(i)
    outputs = [
        o for kern in group for o in kern.outputs if o in kern.reductions or needed_outside(o)
    ]
    return Kernel(group[0].shape, values, reductions, inputs, outputs, phases=phases or {})
