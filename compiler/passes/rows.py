"""Row fusion: consecutive generated kernels that wait on each other's row sums become one *row
kernel*, which runs them row by row, in phases over the row's elements.

The fuser (``fuse``) ends a kernel where a value needs a reduction of it: a sum is complete only
after its loop.  A layer norm is therefore a chain over the same iteration space ``(..., D)``:
a loop ending in row sums (``sum_to`` to ``(..., 1)``), a small kernel over ``(..., 1)`` (mean,
variance, reciprocal square root), a loop reading those per row through ``broadcast_to``, more
row sums, and so on -- softmax, cross-entropy and their backwards alike.  Each loop of the chain
streams the whole tensor through memory.  When the chain's rows are independent, the loops can
run one row at a time instead: the row's phase 0 loop, then its row sums and the per-row
values that need them, then its phase 1 loop, ...; the row stays in the cache between phases,
so the chain reads and writes memory about once.

``merge_rows(steps, interpreted, effect_values, inputs_of)`` finds maximal runs of consecutive
kernels (on the CPU: the caller decides) that start with a generated kernel over a space of
rank >= 2 whose last dim is not 1 and continue with generated kernels over the same space or
with kernels over its *row space* (the space with its last dim 1, small enough to be
interpreted on their own; they have no reductions and become generated code).  Members may read
the run's reductions only where those are row sums (float32/float64); at least one member reads
one, and the run's last kernel reads something the run computed.  Each run becomes one
``Kernel`` whose ``phases`` map every member to its phase: a value's phase is the largest of its
kernel inputs' phases, plus one past a row sum.  Every member's dtype is float32, float64 or
bool.

Guarantees: the row kernel computes every value the run computed, each from the same
expression, and its outputs are the run's outputs needed outside it (or by an effect) and its
reductions; nothing runs between the kernels of a run, so the schedule stays valid.  The CPU
emitter (``numba_cpu``) sums rows, columns and totals in the order of the separate kernels, so
the results are theirs (except where rows are known to be shorter than the emitter's lanes: a
row kernel then uses fewer lanes, which vectorise, and rounds its sums in that order).
"""

from __future__ import annotations

from collections.abc import Callable, Set

from ..codegen.common import reduction_target
from ..ir import Value
from .fuse import Extern, Kernel, merge_kernels

_DTYPES = frozenset({"float32", "float64", "bool"})


def row_space(shape: tuple) -> tuple | None:
    """The row space of an iteration space (its last dim made 1), or None when it has none."""
    if len(shape) < 2 or (type(shape[-1]) is int and shape[-1] == 1):
        return None
    return tuple(shape[:-1]) + (1,)


def is_row_sum(r: Value, space: tuple, row: tuple) -> bool:
    """A reduction of a kernel over ``space`` that sums each row to one element of ``row``."""
    target = reduction_target(r, space)
    return tuple(r.shape) == row and target == row and r.dtype.name in ("float32", "float64")


def _dtypes_ok(kernel: Kernel) -> bool:
    return all(v.dtype.name in _DTYPES for v in kernel.values + kernel.reductions + kernel.inputs)


def _run_end(steps: list, k: int, interpreted: Set[int]) -> int:
    """The end (exclusive) of the row-fusable run starting at ``steps[k]`` (``k + 1``: none);
    ``interpreted``: the steps that stay on the interpreter (a run starts at none of them and
    takes only those over the row space)."""
    first = steps[k]
    if not isinstance(first, Kernel) or k in interpreted or first.phases:
        return k + 1
    space = tuple(first.shape)
    row = row_space(space)
    if row is None or not _dtypes_ok(first):
        return k + 1
    reductions = set(first.reductions)
    row_sums = {r for r in first.reductions if is_row_sum(r, space, row)}
    produced = first.members()
    used = False
    end = k + 1
    j = k + 1
    while j < len(steps):
        step = steps[j]
        if not isinstance(step, Kernel) or step.phases:
            break
        shape = tuple(step.shape)
        if shape == row:  # (small: perhaps interpreted on its own; here it is generated)
            if step.reductions:
                break
        elif shape != space or j in interpreted:
            break
        if not _dtypes_ok(step):
            break
        read = {i for m in step.values + step.reductions for i in m.inputs if i in reductions}
        if read - row_sums:
            break  # a column sum or a total: complete only after every row
        reductions.update(step.reductions)
        if shape == space:
            row_sums.update(r for r in step.reductions if is_row_sum(r, space, row))
        j += 1
        used = used or bool(read)
        if any(i in produced for i in step.inputs):
            end = j  # (kernels after the last one that reads the run are left alone)
        produced |= step.members()
    return end if used else k + 1


def _row_kernel(group: list[Kernel], needed_outside: Callable[[Value], bool]) -> Kernel:
    """The run's kernels as one, each member with its phase."""
    reduction_set = {r for kern in group for r in kern.reductions}
    phases: dict[Value, int] = {}
    for kern in group:
        for v in kern.values:
            phase = 0
            for i in v.inputs:
                if i in phases:
                    phase = max(phase, phases[i] + (1 if i in reduction_set else 0))
            phases[v] = phase
        for r in kern.reductions:
            phases[r] = phases[r.inputs[0]]
    return merge_kernels(group, needed_outside, phases)


def merge_rows(
    steps: list[Kernel | Extern],
    interpreted: Set[int],
    effect_values: Set[Value],
    inputs_of: Callable[[Kernel | Extern], list[Value]],
    small: bool = False,
) -> tuple[list[Kernel | Extern], set[int]]:
    """``steps`` with each row-fusable run replaced by its row kernel, and the indices of the
    interpreted steps in the new list (see the module docstring).  ``small``: runs of kernels
    the interpreter would run fuse too (generated code: a compile, then one call instead of an
    interpreter call per kernel -- for programs that run many times, like training steps)."""
    users: dict[Value, set[int]] = {}
    for k, step in enumerate(steps):
        for v in inputs_of(step):
            users.setdefault(v, set()).add(k)
    out: list[Kernel | Extern] = []
    still_interpreted: set[int] = set()
    k = 0
    while k < len(steps):
        end = _run_end(steps, k, frozenset() if small else interpreted)
        if end - k >= 2:
            members = set(range(k, end))
            group = [s for s in steps[k:end] if isinstance(s, Kernel)]

            def needed_outside(v: Value, members: set[int] = members) -> bool:
                return v in effect_values or bool(users.get(v, set()) - members)

            out.append(_row_kernel(group, needed_outside))
        else:
            if k in interpreted:
                still_interpreted.add(len(out))
            out.append(steps[k])
        k = end
    return out, still_interpreted
