"""Scheduling: a graph's steps in run order, and the decisions made per program variant.

Assumes a verified graph after the pipeline (``passes.run``).  Two functions:

* ``steps(graph, mode)``: the fused schedule (``fuse.fuse``): kernels and externs in an order
  that computes every value once, before its first use.  In ``mode="debug"`` every computation is
  an extern of its own (the reference executor: the primitives' eager kernels, value by value).
* ``finish(steps, graph, leaves_with_grad, small)``: one *variant* of that schedule, for the
  kernels that ``small`` says run on the precompiled interpreter (``codegen.interpreter``; which
  kernels are small depends on a call's sizes, so a program keeps one variant per pattern):
  consecutive interpreted kernels over the same iteration space and float dtype are merged into
  one (the fuser's size cap exists for numba's compile time, which the interpreter does not pay);
  on the CPU (``rows=True``), generated kernels that wait on each other's row sums become one
  row kernel (``rows.merge_rows``); and the ``.grad`` accumulation epilogue is planned: a
  generated kernel output that is the gradient of exactly one leaf whose ``.grad`` exists, and
  read by no later step, is added into that ``.grad`` by the kernel.

Guarantees: the steps of a variant compute the same values as ``steps`` gave, in an order that
respects every dependency; kernels are copies (a variant never changes another's kernels).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..codegen.interpreter import eligible, float_dtype, merge
from ..ir import Graph, Value
from .fuse import Extern, Kernel, fuse
from .rows import merge_rows


@dataclass(frozen=True)
class Schedule:
    """One variant of a program's steps (see the module docstring)."""

    steps: tuple[Kernel | Extern, ...]
    interpreted: frozenset[int] = frozenset()  # indices of steps run on the interpreter
    epilogue: Mapping[Value, int] = field(default_factory=dict)  # output -> leaf (.grad +=)

    @property
    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]

    @property
    def externs(self) -> list[Value]:
        return [s.value for s in self.steps if isinstance(s, Extern)]


def steps(graph: Graph, mode: str) -> list[Kernel | Extern]:
    if mode == "debug":
        return [Extern(v) for v in graph.values if v.op not in ("input", "constant", "scalar")]
    return fuse(graph)


def interpreted_or_eager(fused: list[Kernel | Extern], graph: Graph) -> list[Kernel | Extern]:
    """``fused`` with each kernel the interpreter cannot run split into its values, each by its
    primitive's eager kernel (as ``mode="debug"`` runs every value), in the graph's order: the
    steps of a program that generates no code (``Program.quick``)."""
    position = {v: k for k, v in enumerate(graph.values)}
    out: list[Kernel | Extern] = []
    for step in fused:
        if isinstance(step, Kernel) and not eligible(step):
            out.extend(Extern(v) for v in sorted(step.members(), key=position.__getitem__))
        else:
            out.append(step)
    return out


def interpretable(kernel: Kernel) -> bool:
    """Whether the interpreter can run ``kernel`` at all (its size is the caller's question)."""
    return eligible(kernel)


def step_inputs(step: Kernel | Extern) -> list[Value]:
    if isinstance(step, Extern):
        return list(step.value.inputs)
    return list(step.inputs)


def finish(
    fused: list[Kernel | Extern],
    graph: Graph,
    leaves_with_grad: frozenset,
    small: Callable[[Kernel], bool],
    rows: bool = False,
    small_rows: bool = False,
) -> Schedule:
    """The variant of ``fused`` whose interpreted kernels are those ``small`` accepts (see the
    module docstring); ``rows``: generated kernels that wait on each other's row sums become
    row kernels (``rows.merge_rows``: the CPU emitter's); ``small_rows``: runs of small kernels
    too (programs that run many times: whole steps)."""
    ok = [isinstance(s, Kernel) and small(s) for s in fused]
    copied: list[Kernel | Extern] = [
        dataclasses.replace(s, accumulate=set()) if isinstance(s, Kernel) else s for s in fused
    ]
    users: dict[Value, set[int]] = {}
    for k, step in enumerate(copied):
        for v in step_inputs(step):
            users.setdefault(v, set()).add(k)
    effect_values = {v for _, _, v in graph.effects}
    merged: list[Kernel | Extern] = []
    interpreted: set[int] = set()
    k = 0
    while k < len(copied):
        step = copied[k]
        if not ok[k]:
            merged.append(step)
            k += 1
            continue
        assert isinstance(step, Kernel)
        group = [step]
        reductions = set(step.reductions)
        j = k + 1
        while j < len(copied) and ok[j]:
            nxt = copied[j]
            assert isinstance(nxt, Kernel)
            if (
                nxt.shape != step.shape
                or float_dtype(nxt) is not float_dtype(step)
                or any(i in reductions for i in nxt.inputs)
            ):
                break
            group.append(nxt)
            reductions.update(nxt.reductions)
            j += 1
        if len(group) == 1:
            merged.append(step)
        else:
            members = set(range(k, j))
            merged.append(
                merge(
                    group,
                    lambda v, m=members: v in effect_values or bool(users.get(v, set()) - m),
                )
            )
        interpreted.add(len(merged) - 1)
        k = j
    if rows:
        merged, interpreted = merge_rows(
            merged, interpreted, {v for _, _, v in graph.effects}, step_inputs, small_rows
        )
        users = {}
        for k, step in enumerate(merged):
            for v in step_inputs(step):
                users.setdefault(v, set()).add(k)
    # the .grad accumulation epilogue, in generated kernels only: the kernel adds the value into
    # .grad instead of storing it, so nothing else may read it (no other effect, no later step)
    uses: dict[Value, int] = {}
    for _, _, v in graph.effects:
        uses[v] = uses.get(v, 0) + 1
    epilogue: dict[Value, int] = {}
    for kind, slot, v in graph.effects:
        if kind != "grad" or slot not in leaves_with_grad or uses[v] != 1 or v in users:
            continue
        for index, step in enumerate(merged):
            if (
                isinstance(step, Kernel)
                and index not in interpreted
                and v in step.outputs
                and v not in step.reductions
                and v.dtype.is_floating_point
            ):
                step.accumulate.add(v)
                epilogue[v] = slot
    return Schedule(tuple(merged), frozenset(interpreted), epilogue)
