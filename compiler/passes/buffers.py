"""Buffer planning: which arrays a program may hand out, reuse or drop early.

Assumes a ``schedule.Schedule`` of a verified graph.  ``plan_buffers`` gives a ``BufferPlan``:

* ``fresh``: values computed by a kernel or by an extern that allocates (not a view), used by
  exactly one effect: such an array may become a leaf's ``.grad`` without the defensive copy
  the engine makes (nothing else holds it);
* ``pooled``: kernel outputs that cannot escape the program -- not an effect or captured
  gradient, not reachable from one through views, and no user hook in the graph (a hook may
  keep what it is given) -- so their buffers may be reused from call to call (saving the page
  faults of fresh allocations: about 2x on 40 MB buffers);
* ``dying``: per step index, the values whose last use is that step, dropped from the run's
  environment right after it (effects' values, inputs, constants and scalars are never dropped:
  they stay alive elsewhere, so dropping them frees nothing);
* ``early``: per step index, the ``.grad`` effects ``(slot, value)`` whose value that step
  computes and no later step reads: the program performs them right after it and drops the
  array, as eager's engine writes a leaf's ``.grad`` when it gets there, instead of keeping
  every parameter's gradient alive to the end.  Only in a backward graph (inputs: root
  gradients and saved tensors; a whole step may read a ``.grad`` later) without user hooks
  or NaN checks (their order with the writes is eager's), and not for values a kernel adds into
  ``.grad`` itself (``Schedule.epilogue``).

Guarantees: a value is in ``fresh`` or ``pooled`` only if no reference to its array can remain
after the run except the one the program itself hands out (fresh) or keeps (pooled).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..ir import EFFECT_OPS, IR_OWN_OPS, Graph, Value
from .fuse import Kernel
from .schedule import Schedule, step_inputs

# externs whose result may share memory with an input
VIEW_OPS = frozenset(
    {"reshape", "permute", "broadcast_to", "getitem", "diagonal", "hook_output", "function_output"}
)


@dataclass(frozen=True)
class BufferPlan:
    fresh: frozenset[Value]
    pooled: frozenset[Value]
    dying: Mapping[int, tuple[Value, ...]]
    early: Mapping[int, tuple[tuple[int, Value], ...]]


def plan_buffers(schedule: Schedule, graph: Graph) -> BufferPlan:
    uses: dict[Value, int] = {}
    for _, _, v in graph.effects:
        uses[v] = uses.get(v, 0) + 1
    fresh = set()
    for step in schedule.steps:
        produced = step.outputs if isinstance(step, Kernel) else [step.value]
        for v in produced:
            if uses.get(v) == 1 and v.op not in VIEW_OPS and v.op not in IR_OWN_OPS:
                fresh.add(v)
    escaping: set[Value] = set()
    stack = [v for _, _, v in graph.effects]
    while stack:
        v = stack.pop()
        if v in escaping:
            continue
        escaping.add(v)
        if v.op in VIEW_OPS:
            stack.extend(v.inputs)
    has_hooks = any(v.op in EFFECT_OPS for v in graph.values)
    pooled: set[Value] = set()
    if not has_hooks:
        for k, step in enumerate(schedule.steps):
            if isinstance(step, Kernel) and k not in schedule.interpreted:
                pooled.update(
                    v
                    for v in step.outputs
                    if v not in escaping and v not in step.reductions and v not in step.accumulate
                )
    effect_values = {v for _, _, v in graph.effects}
    last: dict[Value, int] = {}
    for k, step in enumerate(schedule.steps):
        for v in step_inputs(step):
            last[v] = k
    dying: dict[int, list[Value]] = {}
    for v, k in last.items():
        if v not in effect_values and v.op not in ("input", "constant", "scalar"):
            dying.setdefault(k, []).append(v)
    early: dict[int, list[tuple[int, Value]]] = {}
    backward_only = all(
        v.attr("kind") in ("root", "saved") for v in graph.values if v.op == "input"
    )
    if backward_only and not has_hooks and all(kind != "check" for kind, _, _ in graph.effects):
        made: dict[Value, int] = {}
        for k, step in enumerate(schedule.steps):
            for v in step.outputs if isinstance(step, Kernel) else [step.value]:
                made[v] = k
        for kind, slot, v in graph.effects:
            k = made.get(v)
            if (
                kind == "grad"
                and k is not None
                and uses[v] == 1
                and v not in schedule.epilogue
                and last.get(v, k) <= k
            ):
                early.setdefault(k, []).append((slot, v))
    return BufferPlan(
        frozenset(fresh),
        frozenset(pooled),
        {k: tuple(vs) for k, vs in dying.items()},
        {k: tuple(e) for k, e in early.items()},
    )
