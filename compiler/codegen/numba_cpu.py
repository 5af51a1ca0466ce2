"""The numba CPU emitter: the source of one Python module per compiled program, one ``@njit``
function per fused kernel, and the loader that writes it to the cache directory and imports it.

Each kernel is an explicit loop nest over the iteration space; sizes are runtime arguments, so
the source depends only on the graph's structure, dtypes and broadcast patterns, never on sizes
(a new batch size reuses the compiled machine code).  Inputs arrive reshaped to the kernel's rank;
a broadcast dimension is indexed with 0.  When every input is either full-size or a single
element, the loop is flattened to one dimension (the common case, and the one LLVM vectorises
best).  float32 math uses the vectorisable helpers of ``fastmath`` (this numba has no SVML; libm
calls would stop vectorisation); float64 uses libm.

Floating-point flags (docs/ARCHITECTURE.md, contract 8): kernels are compiled with
``fastmath={"contract"}``
only, which lets LLVM fuse a multiply and an add into one FMA (one rounding instead of two) and
changes nothing else.  No ``reassoc`` (it folded ``g + (-g)`` to 0 where eager gives NaN at inf),
no ``nsz`` (it turned ``x - x = +0`` into -0), no ``nnan``/``ninf``/``arcp``/``afn``: NaN, inf and
signed zeros come out as eager's (``tests/compiler/test_nan_semantics.py``).

Reductions fused as epilogues accumulate in float64.  One whose innermost dim is kept adds into
its float64 buffer element (``red[0, i1] += term``): the innermost loop carries no sum and
vectorises as it stands.  One summed along the innermost loop (a full reduction, or row sums)
has, without ``reassoc``, a sum LLVM must add in source order, one element after the other,
which stops the whole loop from vectorising (measured: the backward of benchmark workload A
1.7-2.1x slower, of B 1.6x).  So the source states another order, explicitly: the innermost
loop runs in blocks of ``REDUCTION_LANES`` elements with a constant trip count, element ``lane``
of every block adding into partial sum ``lane`` (float64 scratch from
``cpu_helpers._partial_sums``), which is elementwise across lanes and vectorises; the elements
past the last whole block go into one more partial sum, ``tail`` (a scalar loop); at the end
(of the row, for row sums) the partial sums are added pairwise in a fixed order, then the tail.
(A row kernel's phase whose partial sums are all row sums, over rows of 64 to 127 elements,
stores the terms in a row buffer in one loop and adds them in lanes in a second, by a call of
``cpu_helpers._buffer_sum``: ``_RowKernel.split_row_sums``.)  The order depends
on the sizes only, never on the machine, its vector width or the thread count, so results are
deterministic; it differs from numpy's pairwise summation in rounding
only (docs/numerics.md).  The cost is compile time: the loop body appears twice (blocks and
tail).

A kernel without reductions also gets a ``prange`` variant (docs/ARCHITECTURE.md, contract 8:
``prange`` only
over disjoint outputs): ``kernel_function`` returns a dispatcher that runs it for sizes of at least
``PARALLEL_MIN_ELEMENTS`` when numba has more than one thread.  Both variants compute each element
with the same expression, so results do not depend on the choice; kernels with reductions stay
serial (a parallel sum would make the result depend on the thread count).

Shared with the CUDA emitter (``common``): geometry helpers, the expression of each IR value from
``lowering.EXPRESSIONS``, and the module cache.

Every line of a kernel computing an IR value carries a comment naming the value and the eager
node it came from.  ``load_module`` writes the source once under a name hashed from the source
and every codegen flag, registers it in ``sys.modules`` and imports it; numba's ``cache=True``
then stores the machine code beside it, so another process skips compilation.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numba

from fusegrad.ops.registry import ScalarFunction

from ..ir import Value
from ..passes.fuse import Kernel
from . import common, cpu_helpers
from .common import (
    broadcast_dims,
    cache_dir,
    describe,
    expression,
    is_flat,
    literal,
    reader,
    reduction_target,
)
from .cpu_helpers import RECORD_HELPERS, TARGET_HELPERS, spell64
from .lowering import helpers_digest

try:
    from . import fastmath
except ImportError:  # pragma: no cover - part of the package; float32 would use libm
    fastmath = None  # type: ignore[assignment]

__all__ = [
    "KernelPlan",
    "cache_dir",
    "emit_kernel",
    "emit_module",
    "is_flat",
    "kernel_function",
    "load_module",
    "module_name",
    "use_parallel",
]

CODEGEN_VERSION = 4
FASTMATH = ("contract",)
# partial sums of a reduction along the innermost loop (module docstring, "Reductions"): enough
# to amortise LLVM's per-block alias checks, few enough to add up cheaply per row
REDUCTION_LANES = 128
# a row kernel's lanes when its rows are known to be shorter than REDUCTION_LANES
SHORT_ROW_LANES = 16
# a row kernel whose rows are known to be at least this long (and shorter than
# REDUCTION_LANES) adds its row sums from a row buffer, in a loop of their own
# (``_RowKernel.split_row_sums``).  Measured on a compiled layer norm's forward and backward,
# one thread (us per step, split / one loop): rows of 64 55 / 63, 96 62 / 75, 127 56 / 61; but
# rows of 24 94 / 84, 32 71 / 65, 48 85 / 77, and with 128 lanes 128 53 / 53, 256 51 / 49
SPLIT_ROWS_FROM = 64

# purely elementwise kernels over at least this many elements run their ``prange`` variant (when
# numba has more than one thread): below it, waking the thread pool costs more than it saves
PARALLEL_MIN_ELEMENTS = 1 << 16

# the size of numba's thread pool, as it was when this module was imported: numba reads
# ``NUMBA_NUM_THREADS`` again into ``numba.config`` whenever it reloads its configuration, so a
# script that set the variable after importing fusegrad would see the value change under it,
# while the pool keeps the size it was launched with.  Programs are planned with this value,
# and workers get it (``workers._worker_env``), so that a worker builds the same program.
POOL_THREADS = int(numba.config.NUMBA_NUM_THREADS)


def _float32_helper(fn: ScalarFunction) -> str | None:
    """The vectorisable float32 helper of ``fn`` (``fastmath``), when there is one."""
    helpers = getattr(fastmath, "FLOAT32_HELPERS", {}) if fastmath is not None else {}
    return f"fastmath.{helpers[fn.name]}" if fn.name in helpers else None


# every scalar function: libm, numpy's scalar ufunc or the compiled helper (``cpu_helpers``);
# float32 through ``fastmath`` where it has a helper (libm calls would stop vectorisation)
SPELLING = common.spelling(spell64, _float32_helper)


@dataclass(frozen=True)
class KernelPlan:
    """How the runner calls one generated kernel."""

    name: str
    rank: int  # loop rank (1 when flattened)
    flat: bool
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]  # full-size outputs
    accumulate: tuple[bool, ...]  # per output: ``+=`` into the given buffer (a .grad)
    reductions: tuple[Value, ...]
    reduced_shapes: tuple[tuple[int, ...], ...]  # accumulator shapes at loop rank (keepdim)
    full_reductions: tuple[bool, ...]
    # the same loops with ``numba.prange`` over the outermost one, for kernels whose every
    # iteration writes its own output elements only (no reduction); None otherwise
    parallel_name: str | None = None
    # per output: computed once per row (a row kernel's per-row value, last dim 1)
    row_outputs: tuple[bool, ...] = ()
    # the loops over groups of the kernel's dims (``collapse_groups``): its sizes, inputs,
    # outputs and reduction buffers are reshaped to ``common.collapsed`` shapes; None: one loop
    # per dim
    groups: tuple[tuple[int, ...], ...] | None = None


def _decorator(parallel: bool) -> str:
    # a sorted literal: a set's repr varies between processes (string hashing), and the source
    # must be byte-identical for the disk cache to hit
    flags = "{" + ", ".join(repr(f) for f in sorted(FASTMATH)) + "}"
    extra = "parallel=True, " if parallel else ""
    return f'@numba.njit(cache=True, {extra}error_model="numpy", nogil=True, fastmath={flags})'


def emit_kernel(kernel: Kernel, name: str) -> tuple[str, KernelPlan]:
    """The source of one kernel and its calling plan.  A kernel without reductions also gets a
    ``{name}_parallel`` variant (``numba.prange`` over the outermost loop): its iterations write
    disjoint output elements (``+=`` into a ``.grad`` included), so it computes exactly what the
    serial loop computes; ``kernel_function`` picks it at run time for large sizes."""
    if kernel.phases:
        lines, plan = _emit_rows(kernel, name)
        return "\n".join(lines), plan
    lines, plan = _emit(kernel, name, parallel=False)
    if kernel.reductions:
        return "\n".join(lines), plan
    parallel_name = f"{name}_parallel"
    parallel_lines, _ = _emit(kernel, parallel_name, parallel=True)
    plan = dataclasses.replace(plan, parallel_name=parallel_name)
    return "\n".join(lines + ["", ""] + parallel_lines), plan


def _masks(kernel: Kernel) -> tuple[dict, dict]:
    """Per kernel input: which loop dims it is broadcast along (or padded over); per reduction:
    which loop dims it sums over.  At the kernel's full rank."""
    space = kernel.shape
    loop_space = space if space else (1,)
    broadcast = {}
    for v in kernel.inputs:
        b = broadcast_dims(v, loop_space)
        pad = len(loop_space) - len(v.shape)
        broadcast[v] = tuple(d < pad or b[d] for d in range(len(loop_space)))
    reduced = {}
    for r in kernel.reductions:
        target = reduction_target(r, space)
        reduced[r] = tuple(target[d] == 1 and space[d] != 1 for d in range(len(space)))
    return broadcast, reduced


def collapse_groups(
    kernel: Kernel, masks: tuple[dict, dict] | None = None
) -> tuple[tuple[int, ...], ...] | None:
    """The loop dims of a (non-flat) kernel merged into fewer loops: adjacent dims that every
    input reads alike (broadcast along both or neither) and every reduction treats alike (sums
    over both or neither) are one loop over their product, as their C-ordered elements are
    (the runner reshapes the arrays: ``common.collapsed``).  A conv's bias gradient over (N,
    C, H, W) sums H and W as one loop of H W elements, not H rows of W; None when nothing
    merges.  ``masks``: ``_masks(kernel)``, when the caller has it already."""
    space = kernel.shape
    if len(space) < 2:
        return None
    broadcast, reduced = _masks(kernel) if masks is None else masks
    keys = [
        (tuple(m[d] for m in broadcast.values()), tuple(m[d] for m in reduced.values()))
        for d in range(len(space))
    ]
    groups: list[list[int]] = [[0]]
    for d in range(1, len(space)):
        if keys[d] == keys[d - 1]:
            groups[-1].append(d)
        else:
            groups.append([d])
    if len(groups) == len(space):
        return None
    return tuple(tuple(g) for g in groups)


def _emit(kernel: Kernel, name: str, parallel: bool) -> tuple[list[str], KernelPlan]:
    space = kernel.shape
    members = kernel.members()
    flat = is_flat(kernel)
    broadcast, reduced_masks = _masks(kernel)
    groups = None if flat else collapse_groups(kernel, (broadcast, reduced_masks))
    if groups is not None:  # (the masks per group: alike for every dim of a group)
        broadcast = {v: tuple(m[g[0]] for g in groups) for v, m in broadcast.items()}
        reduced_masks = {r: tuple(m[g[0]] for g in groups) for r, m in reduced_masks.items()}
    rank = 1 if flat else (len(groups) if groups is not None else max(len(space), 1))
    idx = [f"i{d}" for d in range(rank)]
    inner = idx[-1]
    full_out = [v for v in kernel.outputs if v not in kernel.reductions]
    reds = list(kernel.reductions)
    red_shapes = []
    full_red = []
    for r in reds:
        target = reduction_target(r, space)
        full = all(t == 1 for t in target)
        full_red.append(full)
        # (at full rank: reshaped by ``common.collapsed`` at run time)
        red_shapes.append((1,) * rank if flat else target)
    # reductions whose sum runs along the innermost loop: every full one, and those reduced along
    # the innermost dim (row sums); they accumulate into REDUCTION_LANES partial sums (module
    # docstring), the others (innermost dim kept) add into their buffer element directly
    row_red = [not full_red[k] and rank >= 2 and reduced_masks[r][-1] for k, r in enumerate(reds)]
    lanes = [k for k in range(len(reds)) if full_red[k] or row_red[k]]
    spelling = SPELLING
    lines = _header(name, parallel, rank, kernel, full_out, reds, lanes, full_red, REDUCTION_LANES)

    def read_input(k: int, v: Value) -> str:  # inputs arrive reshaped to the loop's rank
        if flat:
            return f"in{k}[{'i0' if v.shape == space else '0'}]"
        mask = broadcast[v]
        sub = ", ".join("0" if mask[d] else idx[d] for d in range(rank))
        return f"in{k}[{sub}]"

    read = reader(members, kernel.inputs, read_input)

    def reduced_index(r: Value) -> str:
        """The element of ``red{k}`` the current iteration adds into (reduced dims at 0)."""
        mask = reduced_masks[r]
        return ", ".join("0" if mask[d] else idx[d] for d in range(rank))

    def body(summand: str) -> list[str]:
        """The loop body: one line per IR value (and per output write and summand); a
        summand of a reduction along the innermost loop adds into ``summand.format(k=k)``."""
        lines: list[str] = []
        for v in kernel.values:
            lines.append(f"v{v.id} = {expression(v, read, spelling)}  {describe(v)}")
            if v in out_index:
                position = "i0" if flat else ", ".join(idx)
                op = "+=" if v in kernel.accumulate else "="
                lines.append(f"out{out_index[v]}[{position}] {op} v{v.id}")
        for k, r in enumerate(reds):
            term = read(r.inputs[0])
            if k in lanes:
                lines.append(f"{summand.format(k=k)} += {term}  # %{r.id} = {r.op}")
            else:
                lines.append(f"red{k}[{reduced_index(r)}] += {term}  # %{r.id} = {r.op}")
        return lines

    out_index = {v: k for k, v in enumerate(full_out)}
    for d in range(rank - 1):
        loop = "numba.prange" if parallel and d == 0 else "range"
        lines.append("    " * (d + 1) + f"for {idx[d]} in {loop}(n{d}):")
    indent = "    " * rank  # of the innermost loop statement
    n_inner = f"n{rank - 1}"
    if not lanes:
        loop = "numba.prange" if parallel and rank == 1 else "range"
        lines.append(f"{indent}for {inner} in {loop}({n_inner}):")
        lines += [f"{indent}    {line}" for line in body("")]
    else:
        # a row shorter than one block (a conv's 26 columns) never touches its partial sums:
        # resetting and combining them per row would cost more than the row itself, and
        # skipping them changes nothing (they hold zeros; 0 + tail is the tail exactly)
        whole_block = f"{n_inner} >= {REDUCTION_LANES}"
        for k in lanes:
            if row_red[k]:  # a fresh set of partial sums per row
                lines += [
                    f"{indent}if {whole_block}:",
                    f"{indent}    for lane in range({REDUCTION_LANES}):",
                    f"{indent}        lanes{k}[lane] = 0.0",
                ]
            if row_red[k] or rank == 1:
                lines.append(f"{indent}tail{k} = 0.0")
        lines += _blocked_loop(indent, inner, n_inner, body)
        for k in lanes:
            if row_red[k]:
                lines.append(f"{indent}if {whole_block}:")
                lines += _combine_lanes(k, indent + "    ")
                lines += [f"{indent}else:", f"{indent}    total{k} = tail{k}"]
                lines.append(f"{indent}red{k}[{reduced_index(reds[k])}] += total{k}")
    for k in lanes:
        if full_red[k]:
            lines += _combine_lanes(k, "    ")
            lines.append(f"    red{k}[{', '.join('0' for _ in range(rank))}] = total{k}")
    plan = KernelPlan(
        name,
        rank,
        flat,
        tuple(kernel.inputs),
        tuple(full_out),
        tuple(v in kernel.accumulate for v in full_out),
        tuple(reds),
        tuple(red_shapes),
        tuple(full_red),
        groups=groups,
    )
    return lines, plan


def _emit_rows(kernel: Kernel, name: str) -> tuple[list[str], KernelPlan]:
    """A row kernel (``passes.rows``): the outer loops run over the rows; per row, each phase
    first computes its per-row values (last dim 1: plain locals), then loops over the row's
    elements computing its full-size values and adding into its reductions.  A full-size value
    a later phase reads is kept in a row buffer (``rb{id}``, one row long: it stays in the
    cache); a row sum is complete after its phase's loop and is then a local of the row.  Each
    reduction is summed as the separate kernels sum it (``_emit``): row sums in lanes reset per
    row, totals in lanes kept across rows, column sums straight into their buffer element."""
    emitter = _RowKernel(kernel, name)
    return emitter.emit(), emitter.plan()


class _RowKernel:
    """The geometry and source of one row kernel (``_emit_rows``)."""

    def __init__(self, kernel: Kernel, name: str) -> None:
        self.kernel = kernel
        self.name = name
        space = self.space = kernel.shape
        rank = self.rank = len(space)
        self.idx = [f"i{d}" for d in range(rank)]
        self.inner = self.idx[-1]
        self.n_inner = f"n{rank - 1}"
        self.phases = kernel.phases
        reds = self.reds = list(kernel.reductions)
        self.reduction_set = set(reds)
        targets = self.targets = [reduction_target(r, space) for r in reds]
        # one row (every dim but the last literally 1): a total is that row's sum, complete
        # after its phase, and summed in the same order either way (lanes, then the tail)
        one_row = all(type(d) is int and d == 1 for d in space[:-1])
        self.full_red = [all(t == 1 for t in target) and not one_row for target in targets]
        self.row_red = [
            not self.full_red[k] and target[-1] == 1 and space[-1] != 1
            for k, target in enumerate(targets)
        ]
        self.lanes = [k for k in range(len(reds)) if self.full_red[k] or self.row_red[k]]
        self.row_shape = tuple(space[:-1]) + (1,)
        # rows known to be shorter than the lanes (a whole step's sizes are concrete) would run
        # all in the scalar tail loop: fewer lanes keep them in the vectorised blocks
        last = space[-1]
        self.n_lanes = (
            SHORT_ROW_LANES if type(last) is int and last < REDUCTION_LANES else REDUCTION_LANES
        )
        # rows of this many elements (known, short-row lanes) sum from a row buffer in a second
        # loop (``split_row_sums``): measured faster there, slower for shorter and longer rows
        self.split = type(last) is int and SPLIT_ROWS_FROM <= last < REDUCTION_LANES
        self.full_out = [v for v in kernel.outputs if v not in self.reduction_set]
        self.out_index = {v: k for k, v in enumerate(self.full_out)}
        phases = self.phases
        self.buffered = {
            i
            for m in kernel.values + reds
            for i in m.inputs
            if i in phases
            and i not in self.reduction_set
            and not self.per_row(i)
            and phases[i] < phases[m]
        }
        self.phase_now = 0

    def per_row(self, v: Value) -> bool:
        return v not in self.reduction_set and tuple(v.shape) == self.row_shape

    def read_input(self, k: int, v: Value) -> str:  # inputs arrive reshaped to the loop's rank
        b = broadcast_dims(v, self.space)
        pad = self.rank - len(v.shape)
        sub = ", ".join("0" if (d < pad or b[d]) else self.idx[d] for d in range(self.rank))
        return f"in{k}[{sub}]"

    def read(self, v: Value) -> str:
        if v in self.phases:
            if v in self.buffered and self.phases[v] < self.phase_now:
                return f"rb{v.id}[{self.inner}]"
            return f"v{v.id}"
        if v.op == "scalar":
            return literal(v.attr("value"), v.dtype)
        return self.read_input(self.kernel.inputs.index(v), v)

    def reduced_index(self, r: Value) -> str:
        target = reduction_target(r, self.space)
        space, idx = self.space, self.idx
        return ", ".join(
            "0" if target[d] == 1 and space[d] != 1 else idx[d] for d in range(self.rank)
        )

    def write(self, v: Value, position: str) -> list[str]:
        lines = []
        if v in self.out_index:
            op = "+=" if v in self.kernel.accumulate else "="
            lines.append(f"out{self.out_index[v]}[{position}] {op} v{v.id}")
        if v in self.buffered:
            lines.append(f"rb{v.id}[{self.inner}] = v{v.id}")
        return lines

    def emit(self) -> list[str]:
        kernel, rank = self.kernel, self.rank
        lines = _header(
            self.name,
            False,
            rank,
            kernel,
            self.full_out,
            self.reds,
            self.lanes,
            self.full_red,
            self.n_lanes,
        )
        for v in sorted(self.buffered, key=lambda v: v.id):
            dtype = "np.bool_" if v.dtype.name == "bool" else f"np.{v.dtype.name}"
            lines.append(
                f"    rb{v.id} = np.empty({self.n_inner}, dtype={dtype})  # %{v.id}, one row"
            )
        self.split_set = set(self.split_sums())
        for k in sorted(self.split_set):
            term = self.reds[k].inputs[0]
            lines.append(
                f"    rs{k} = np.empty({self.n_inner}, dtype=np.{term.dtype.name})"
                f"  # the terms of %{self.reds[k].id}, one row"
            )
        for d in range(rank - 1):
            lines.append("    " * (d + 1) + f"for {self.idx[d]} in range(n{d}):")
        for phase in range(max(self.phases.values()) + 1):
            lines += self.phase_lines(phase)
        for k in self.lanes:
            if self.full_red[k]:
                lines += _combine_lanes(k, "    ", self.n_lanes)
                lines.append(f"    red{k}[{', '.join('0' for _ in range(rank))}] = total{k}")
        return lines

    def split_sums(self) -> list[int]:
        """The row sums ``split_row_sums`` adds from a row buffer: those of every phase whose
        lane sums are all row sums."""
        chosen: list[int] = []
        if not self.split:
            return chosen
        for phase in set(self.phases.values()):
            ks = [k for k in self.lanes if self.phases[self.reds[k]] == phase]
            if ks and all(self.row_red[k] for k in ks):
                chosen += ks
        return sorted(chosen)

    def phase_lines(self, phase: int) -> list[str]:
        """One phase of a row: its per-row values, then its loop over the row's elements."""
        self.phase_now = phase
        kernel, phases, reds = self.kernel, self.phases, self.reds
        indent = "    " * self.rank
        row_position = ", ".join(self.idx[:-1] + ["0"])
        lines = [f"{indent}# phase {phase}"]
        for v in kernel.values:
            if phases[v] == phase and self.per_row(v):
                lines.append(
                    f"{indent}v{v.id} = {expression(v, self.read, SPELLING)}  {describe(v)}"
                )
                lines += [f"{indent}{line}" for line in self.write(v, row_position)]
        loop_values = [v for v in kernel.values if phases[v] == phase and not self.per_row(v)]
        loop_reds = [k for k, r in enumerate(reds) if phases[r] == phase]
        if not loop_values and not loop_reds:
            return lines

        def body(summand: str) -> list[str]:
            return self.body(summand, loop_values, loop_reds)

        phase_lanes = [k for k in loop_reds if k in self.lanes]
        inner, n_inner, n_lanes = self.inner, self.n_inner, self.n_lanes
        if not phase_lanes:
            lines.append(f"{indent}for {inner} in range({n_inner}):")
            lines += [f"{indent}    {line}" for line in body("")]
            return lines
        if phase_lanes[0] in self.split_set:  # (``split_sums`` chose the phase's sums)
            return lines + self.split_row_sums(indent, loop_values, loop_reds, phase_lanes)
        for k in phase_lanes:
            if self.row_red[k]:
                lines += [
                    f"{indent}for lane in range({n_lanes}):",
                    f"{indent}    lanes{k}[lane] = 0.0",
                    f"{indent}tail{k} = 0.0",
                ]
        lines += _blocked_loop(indent, inner, n_inner, body, n_lanes)
        for k in phase_lanes:
            if self.row_red[k]:
                r = reds[k]
                lines += _combine_lanes(k, indent, n_lanes)
                lines.append(f"{indent}red{k}[{self.reduced_index(r)}] += total{k}")
                # the row's sum as the separate kernels hand it on: its float64 buffer
                # element (0.0 + total) rounded to the value's dtype
                lines.append(f"{indent}v{r.id} = np.{r.dtype.name}(total{k})  # %{r.id}, this row")
        return lines

    def split_row_sums(
        self, indent: str, loop_values: list, loop_reds: list, row_lanes: list
    ) -> list[str]:
        """A phase whose lane sums are all row sums, as two loops over the row: the first
        computes the phase's values (outputs, row buffers, column sums) and stores each row
        sum's terms in a row buffer (``rs{k}``), a plain elementwise loop that vectorises; the
        second adds each buffer in lanes (``_blocked_loop``), the same order of additions as
        one blocked loop doing both (so the same bits).  In one loop the lanes' loads and
        stores, which LLVM cannot prove apart from the outputs', kept the values from
        vectorising (a layer norm's forward over (8, 32, 64): 37 against 21 us).  Only for
        rows of ``SPLIT_ROWS_FROM`` elements or more with short-row lanes (``self.split``)."""
        inner, n_inner, n_lanes = self.inner, self.n_inner, self.n_lanes
        lines = [f"{indent}for {inner} in range({n_inner}):"]
        lines += [
            f"{indent}    {line}"
            for line in self.body("rs{k}[" + inner + "]", loop_values, loop_reds)
        ]
        for k in row_lanes:
            r = self.reds[k]
            if n_lanes == cpu_helpers.BUFFER_SUM_LANES:  # (the same loops, in one helper)
                lines.append(f"{indent}total{k} = _buffer_sum(rs{k}, {n_inner}, lanes{k})")
            else:
                lines += [
                    f"{indent}for lane in range({n_lanes}):",
                    f"{indent}    lanes{k}[lane] = 0.0",
                    f"{indent}tail{k} = 0.0",
                ]
                lines += _blocked_loop(
                    indent,
                    inner,
                    n_inner,
                    lambda summand, k=k: [f"{summand.format(k=k)} += rs{k}[{inner}]"],
                    n_lanes,
                )
                lines += _combine_lanes(k, indent, n_lanes)
            lines.append(f"{indent}red{k}[{self.reduced_index(r)}] += total{k}")
            lines.append(f"{indent}v{r.id} = np.{r.dtype.name}(total{k})  # %{r.id}, this row")
        return lines

    def body(self, summand: str, loop_values: list, loop_reds: list) -> list[str]:
        """The statements for one element of the row in a phase's loop."""
        body_lines: list[str] = []
        for v in loop_values:
            body_lines.append(f"v{v.id} = {expression(v, self.read, SPELLING)}  {describe(v)}")
            body_lines += self.write(v, ", ".join(self.idx))
        for k in loop_reds:
            r = self.reds[k]
            term = self.read(r.inputs[0])
            if k in self.lanes:
                op = "=" if summand.startswith("rs") else "+="  # (a row sum's term, stored)
                body_lines.append(f"{summand.format(k=k)} {op} {term}  # %{r.id} = {r.op}")
            else:
                body_lines.append(f"red{k}[{self.reduced_index(r)}] += {term}  # %{r.id} = {r.op}")
        return body_lines

    def plan(self) -> KernelPlan:
        kernel = self.kernel
        return KernelPlan(
            self.name,
            self.rank,
            False,
            tuple(kernel.inputs),
            tuple(self.full_out),
            tuple(v in kernel.accumulate for v in self.full_out),
            tuple(self.reds),
            tuple(self.targets),
            tuple(self.full_red),
            row_outputs=tuple(self.per_row(v) for v in self.full_out),
        )


def _header(
    name: str,
    parallel: bool,
    rank: int,
    kernel: Kernel,
    full_out: list,
    reds: list,
    lanes: list,
    full_red: list,
    n_lanes: int,
) -> list[str]:
    """A kernel function's first lines: its signature (sizes, inputs, full-size outputs,
    reductions' float64 buffers) and the partial sums of the reductions summed along the
    innermost loop (``tail{k}`` too for a total over a loop nest)."""
    args = [f"n{d}" for d in range(rank)]
    args += [f"in{k}" for k in range(len(kernel.inputs))]
    args += [f"out{k}" for k in range(len(full_out))]
    args += [f"red{k}" for k in range(len(reds))]
    lines = [_decorator(parallel), f"def {name}({', '.join(args)}):"]
    for k in lanes:
        r = reds[k]
        kind = "full reduction" if full_red[k] else "row sums"
        lines.append(
            f"    lanes{k} = _partial_sums({n_lanes})  # %{r.id} = {r.op} ({kind}, float64)"
        )
        if full_red[k] and rank > 1:
            lines.append(f"    tail{k} = 0.0")
    return lines


def _blocked_loop(
    indent: str,
    inner: str,
    n_inner: str,
    body: Callable[[str], list[str]],
    lanes: int = REDUCTION_LANES,
) -> list[str]:
    """The innermost loop of a kernel whose sums run along it (module docstring,
    "Reductions"): whole blocks of ``REDUCTION_LANES`` elements, a constant trip count LLVM
    vectorises (lane j of every block adds into partial sum j: ``body("lanes{k}[lane]")``),
    then the tail into one more partial sum (``body("tail{k}")``), a loop LLVM leaves scalar
    (an ordered float sum), so it costs little compile time."""
    lines = [
        f"{indent}blocks_end = {n_inner} - {n_inner} % {lanes}",
        f"{indent}for block in range(0, blocks_end, {lanes}):",
        f"{indent}    for lane in range({lanes}):",
        f"{indent}        {inner} = block + lane",
    ]
    lines += [f"{indent}        {line}" for line in body("lanes{k}[lane]")]
    lines.append(f"{indent}for {inner} in range(blocks_end, {n_inner}):  # the tail")
    lines += [f"{indent}    {line}" for line in body("tail{k}")]
    return lines


def _combine_lanes(k: int, indent: str, lanes: int = REDUCTION_LANES) -> list[str]:
    """``total{k}``: the partial sums ``lanes{k}`` added pairwise in a fixed order (lane j and
    lane j + half, halving until one is left: each step is a vectorisable loop), then the
    tail's sum ``tail{k}``."""
    return [
        f"{indent}half = {lanes // 2}",
        f"{indent}while half > 0:",
        f"{indent}    for lane in range(half):",
        f"{indent}        lanes{k}[lane] += lanes{k}[lane + half]",
        f"{indent}    half //= 2",
        f"{indent}total{k} = lanes{k}[0] + tail{k}",
    ]


HEADER = '''"""Generated by fusegrad (numba CPU codegen v{version}); do not edit.

{summary}
"""
{imports}'''


def module_imports() -> str:
    """The imports of a generated CPU module (and of the interpreter's): ``math``, numba, numpy,
    ``fastmath`` and every helper of ``cpu_helpers`` an expression may call."""
    names = sorted(TARGET_HELPERS + tuple(RECORD_HELPERS))
    lines = [
        "import math",
        "",
        "import numba",
        "import numpy as np",
        "",
        "try:",
        "    from fusegrad.compiler.codegen import fastmath",
        "except ImportError:  # float32 math then uses libm",
        "    fastmath = None",
        "from fusegrad.compiler.codegen.cpu_helpers import (",
    ]
    lines += [f"    {name}," for name in names]
    return "\n".join(lines + [")", ""])


def emit_module(kernels: list[Kernel], summary: str) -> tuple[str, list[KernelPlan]]:
    """The module of ``kernels`` and their plans.  A kernel whose code is another's up to the
    numbering of its values (each layer of a model repeats its kernels) calls that one's
    function: numba compiles each distinct function once (about a third of a Transformer
    step's kernels were repeats, each costing about half a second of cold compile)."""
    parts = [HEADER.format(version=CODEGEN_VERSION, summary=summary, imports=module_imports())]
    plans = []
    first: dict[str, KernelPlan] = {}  # canonical code -> the plan of the kernel emitting it
    for k, kernel in enumerate(kernels):
        name = f"kernel_{k}"
        src, plan = emit_kernel(kernel, name)
        key = _canonical(src, name)
        same = first.get(key)
        if same is not None:
            plans.append(
                dataclasses.replace(plan, name=same.name, parallel_name=same.parallel_name)
            )
            continue
        first[key] = plan
        parts.append("\n" + src + "\n")
        plans.append(plan)
    return "\n".join(parts), plans


_VALUE_NAME = re.compile(r"\bv(\d+)\b")
_COMMENT = re.compile(r"  # .*$", re.MULTILINE)


def _canonical(src: str, name: str) -> str:
    """``src`` (the functions of kernel ``name``) without its name, its comments and its value
    numbers: value names renumbered in order of first appearance.  Two kernels with the same
    canonical code compute the same function of their arguments."""
    text = _COMMENT.sub("", src).replace(name, "KERNEL")
    numbers: dict[str, int] = {}
    return _VALUE_NAME.sub(lambda m: f"v{numbers.setdefault(m.group(1), len(numbers))}", text)


_loaded: dict[str, ModuleType] = {}


@functools.cache
def _flags() -> str:
    # the helpers are inlined: numba's cache cannot see them change, so their digests are flags
    # (fastmath's, cpu_helpers' and those of the records' scalar functions; without
    # cpu_helpers' own, a fixed helper would not reach kernels cached before the fix)
    helpers = getattr(fastmath, "SOURCE_DIGEST", "none") if fastmath is not None else "none"
    return (
        f"v{CODEGEN_VERSION}|{FASTMATH}|lanes{REDUCTION_LANES}|numba{_numba_version()}|"
        f"helpers{helpers}|cpu_helpers{cpu_helpers.SOURCE_DIGEST}|scalar{helpers_digest()}"
    )


def module_name(source: str) -> str:
    return common.module_name(source, _flags())


def _numba_version() -> str:

    return numba.__version__


def load_module(source: str) -> tuple[ModuleType, str, bool]:
    """Import the module for ``source`` (writing it once); returns (module, path, was_on_disk).
    A corrupt or unreadable cache file is rewritten, never fatal."""
    return common.load_module(source, _flags(), _loaded)


# ---- choosing the parallel variant at run time ------------------------------------------------

# numba's ``workqueue`` threading layer aborts the process when two threads enter parallel code
# at once; whoever holds this lock runs parallel, a concurrent caller runs the serial loop
_parallel_lock = threading.Lock()


# background compiles running in this process (``service.BackgroundBuild``: a compile thread,
# perhaps waiting on a worker process); while one runs, kernels run their serial loops
background_compiles = 0


def use_parallel(n: int) -> bool:
    """Whether a kernel over ``n`` elements should run its ``prange`` variant: large enough, more
    than one thread, and no background compile running.  A compile (numba in a worker process,
    or on a thread) takes a core for seconds to minutes; a parallel loop with one thread per
    core then waits at its end for the thread the scheduler left without a core, every call
    (time slices of milliseconds, against loops of microseconds)."""
    if n < PARALLEL_MIN_ELEMENTS or background_compiles:
        return False
    return bool(numba.get_num_threads() > 1)


class _Dispatch:
    """A kernel with a parallel variant: called like the serial function (sizes first), it runs
    the ``prange`` variant when ``use_parallel`` says so and no other thread is in one.  Both
    variants compute every element with the same expression, so the choice never changes a
    result."""

    __slots__ = ("serial", "parallel", "rank")

    def __init__(self, serial: Any, parallel: Any, rank: int) -> None:
        self.serial = serial
        self.parallel = parallel  # compiled on its first call only
        self.rank = rank

    @property
    def stats(self) -> Any:  # numba's dispatcher statistics (disk-cache hits), of the serial one
        return self.serial.stats

    def __call__(self, *args: Any) -> Any:
        n = 1
        for size in args[: self.rank]:
            n *= size
        if use_parallel(n) and _parallel_lock.acquire(blocking=False):
            try:
                return self.parallel(*args)
            finally:
                _parallel_lock.release()
        return self.serial(*args)


def kernel_function(module: ModuleType, plan: KernelPlan) -> Any:
    """The callable running ``plan``'s kernel from ``module``: the serial function, or for a
    kernel with a parallel variant a dispatcher choosing per call (same arguments either way)."""
    serial = getattr(module, plan.name)
    if plan.parallel_name is None:
        return serial
    return _Dispatch(serial, getattr(module, plan.parallel_name), plan.rank)
