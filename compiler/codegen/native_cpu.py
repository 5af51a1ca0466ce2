"""Native program segments: the steps of a CPU program run as one numba function per segment,
so that Python enters a program once per segment instead of once per step (docs/ARCHITECTURE.md,
"Native programs").

Where it sits: ``program.Variant`` plans the segments of its schedule (``plan_segments``) once
its kernels are emitted, the source of the segment functions (``emit_segments``) goes into the
same generated module as the kernels (one module per program, cached on disk), and
``Program._run`` calls a segment where its first step would run.

A segment is a maximal run of consecutive steps that native code can run:

* generated kernels (called as the module's own ``kernel_k`` functions, with the arguments
  ``Program._run_kernel`` would pass: flattened or rank-padded inputs, fresh output buffers,
  float64 accumulators for fused reductions), except kernels that add into an existing
  ``.grad`` (their buffer is the leaf's, Python's business) and kernels large enough for their
  ``prange`` variant (Python picks that at run time; their call overhead does not matter);
* the movement and reduction externs that have a numba spelling: ``reshape``, ``permute``,
  ``broadcast_to``, basic ``getitem`` (slices, integers, ellipsis), a row lookup ``x[index]``,
  ``sum``/``sum_to``/``amax`` over any dims, ``matmul`` (2-d, one matrix broadcast over a batch,
  or equal batches), ``gather``/``scatter_add``/``index_add_at`` of the row-wise kinds;
* in float32, float64, int64 and bool.

Everything else (kernels the precompiled interpreter runs, user hooks, opaque custom
Functions, collectives, other externs, half dtypes) ends a segment and runs as before, one step
at a time.  A segment of one step is not
made (it would only add a call).  Shapes must be concrete (programs of recorded steps and
modules): every shape, permutation and slice is a literal of the generated source.

A segment function takes the values it reads from outside (program inputs, constants, earlier
steps' results) and returns those it computes that are read after it (later steps, effects).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir import Value
from ..passes.fuse import Extern, Kernel
from ..symbolic import has_sym
from . import native_helpers
from .common import collapsed

# the dtypes native code handles (numba's names)
_DTYPES = {
    "float32": "np.float32",
    "float64": "np.float64",
    "int64": "np.int64",
    "bool": "np.bool_",
}
_FLOAT = ("float32", "float64")


@dataclass
class Segment:
    """Steps ``first`` .. ``last`` (inclusive) of a schedule, run by the function ``name``."""

    name: str
    first: int
    last: int
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    fn: Any = None  # the loaded numba function
    compiled: bool = False  # (``fn`` compiled or loaded for its argument types)


def _dtype_ok(v: Value) -> bool:
    return v.dtype.name in _DTYPES


def _shape(v: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in v.shape)


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


class _Emitter:
    """The lines of one step, or None where native code cannot run it."""

    def __init__(self, plans: Mapping[int, Any], reduced: Mapping[int, list], parallel_min: int):
        self.plans = plans  # id(kernel) -> KernelPlan
        self.reduced = reduced  # id(kernel) -> accumulator shapes
        self.parallel_min = parallel_min
        self.temp = 0

    def name(self, prefix: str) -> str:
        self.temp += 1
        return f"{prefix}{self.temp}"

    # ---- kernels -------------------------------------------------------------------------
    def kernel(self, step: Kernel) -> list[str] | None:
        plan = self.plans.get(id(step))
        if plan is None or step.accumulate or any(plan.accumulate):
            return None
        values = [*plan.inputs, *plan.outputs, *plan.reductions]
        if not all(_dtype_ok(v) and not has_sym(v.shape) for v in values):
            return None
        space = tuple(int(d) for d in step.shape)
        n = _numel(space)
        if plan.parallel_name is not None and n >= self.parallel_min:
            return None
        lines = [f"# kernel {plan.name} over {list(space)}"]
        args = []
        if plan.flat:
            sizes: tuple[int, ...] = (n,)
            for v in plan.inputs:
                if _numel(_shape(v)) == n:
                    args.append(f"reshape(v{v.id}, ({n},))")
                else:
                    args.append(f"reshape(v{v.id}, (1,))")
            full = sizes
        else:
            sizes = space or (1,)
            rank = len(sizes)
            for v in plan.inputs:
                shape = _shape(v)
                if len(shape) < rank:
                    padded = (1,) * (rank - len(shape)) + shape
                    args.append(f"reshape(v{v.id}, {padded!r})")
                else:
                    args.append(f"v{v.id}")
            full = sizes
        row = tuple(full[:-1]) + (1,)
        rows = plan.row_outputs or (False,) * len(plan.outputs)
        outs = []
        for v, per_row in zip(plan.outputs, rows):
            o = self.name("o")
            shape = row if per_row else full
            lines.append(f"{o} = np.empty({tuple(shape)!r}, {_DTYPES[v.dtype.name]})")
            outs.append((v, o))
        reds = []
        for v, shape in zip(plan.reductions, self.reduced[id(step)]):
            r = self.name("r")
            shape = tuple(int(d) for d in shape)
            lines.append(f"{r} = np.zeros({shape!r}, np.float64)")
            reds.append((v, r))
        arrays = [*args, *(o for _, o in outs), *(r for _, r in reds)]
        if plan.groups is not None and not plan.flat:
            # (the kernel loops over groups of dims: every array at the grouped shape)
            shapes = [
                *[(1,) * (len(sizes) - len(_shape(v))) + _shape(v) for v in plan.inputs],
                *[row if per_row else full for per_row in rows],
                *[tuple(int(d) for d in shape) for shape in self.reduced[id(step)]],
            ]
            arrays = [
                f"reshape({a}, {collapsed(shape, plan.groups)!r})"
                for a, shape in zip(arrays, shapes)
            ]
            sizes = collapsed(sizes, plan.groups)
        call_args = [*map(str, sizes), *arrays]
        lines.append(f"{plan.name}({', '.join(call_args)})")
        for v, o in outs:
            lines.append(f"v{v.id} = reshape({o}, {_shape(v)!r})  # %{v.id} {v.op}")
        for v, r in reds:
            lines.append(
                f"v{v.id} = reshape({r}.astype({_DTYPES[v.dtype.name]}), {_shape(v)!r})"
                f"  # %{v.id} {v.op}"
            )
        return lines

    # ---- externs -------------------------------------------------------------------------
    def extern(self, v: Value) -> list[str] | None:
        if not _dtype_ok(v) or has_sym(v.shape) or not all(_dtype_ok(i) for i in v.inputs):
            return None
        if any(has_sym(i.shape) for i in v.inputs):
            return None
        method = getattr(self, "_" + v.op, None)
        if method is None:
            return None
        body = method(v)
        if body is None:
            return None
        return [f"# %{v.id} = {v.op}", *body]

    def _reshape(self, v: Value) -> list[str]:
        x = v.inputs[0]
        return [f"v{v.id} = reshape(v{x.id}, {_shape(v)!r})"]

    def _permute(self, v: Value) -> list[str]:
        dims = tuple(int(d) for d in v.attr("dims"))
        if dims == (1, 0):  # (a matrix's transpose: typed F-contiguous, read by BLAS as is)
            return [f"v{v.id} = transpose2(v{v.inputs[0].id})"]
        return [f"v{v.id} = permute(v{v.inputs[0].id}, {dims!r})"]

    def _broadcast_to(self, v: Value) -> list[str]:
        return [f"v{v.id} = broadcast(v{v.inputs[0].id}, {_shape(v)!r})"]

    def _getitem(self, v: Value) -> list[str] | None:
        key = v.attr("key")
        x = v.inputs[0]
        tensors = [e for e in key if e[0] == "t"]
        if not tensors:
            index = self._basic_index(key)
            if index is None or not _shape(x):  # (numba does not index 0-d arrays)
                return None
            if _shape(v) == ():  # (a single element is a scalar: the IR's 0-d array of it)
                return [f"v{v.id} = np.full((), v{x.id}[{index}], {_DTYPES[v.dtype.name]})"]
            return [f"v{v.id} = v{x.id}[{index}]"]
        # a row lookup: x[index] with the index first and nothing else
        if len(key) != 1 or len(v.inputs) != 2 or v.inputs[1].dtype.name != "int64":
            return None
        index = v.inputs[1]
        xs = _shape(x)
        if len(xs) < 1:
            return None
        rest = _numel(xs[1:])
        return [
            f"v{v.id} = reshape(take_rows(reshape(v{x.id}, ({xs[0]}, {rest})), "
            f"reshape(v{index.id}, ({_numel(_shape(index))},))), {_shape(v)!r})"
        ]

    @staticmethod
    def _basic_index(key: tuple) -> str | None:
        """The numba spelling of a key of slices, integers and an ellipsis (None otherwise)."""
        parts = []
        for entry in key:
            tag = entry[0]
            if tag == "s":
                parts.append(":".join("" if p is None else str(int(p)) for p in entry[1:]))
            elif tag == "i":
                parts.append(str(int(entry[1])))
            elif tag == "e":
                parts.append("...")
            else:
                return None  # (None/newaxis, tensors: not spelled here)
        return ", ".join(parts) if parts else "..."

    def _reduce(self, v: Value, axes: tuple[int, ...], kind: str) -> list[str] | None:
        x = v.inputs[0]
        xs = _shape(x)
        if not axes or _numel(xs) == 0:
            return None
        keep = [d for d in range(len(xs)) if d not in axes]
        perm = tuple(keep + list(axes))
        rows = _numel([xs[d] for d in keep])
        cols = _numel([xs[d] for d in axes])
        src = f"rows_of(v{x.id}, {perm!r}, {rows}, {cols})"
        out = self.name("s")
        dtype = v.dtype.name
        if kind == "max":
            fn, acc = "max_rows", _DTYPES[dtype]
        elif dtype in _FLOAT:
            fn, acc = "sum_rows_f", "np.float64"
        else:
            fn, acc = "sum_rows_i", "np.int64"
        lines = [f"{out} = {fn}({src}, np.empty({rows}, {acc}))"]
        lines.append(f"v{v.id} = reshape({out}.astype({_DTYPES[dtype]}), {_shape(v)!r})")
        return lines

    def _sum(self, v: Value) -> list[str] | None:
        return self._reduce(v, self._dims(v), "sum")

    def _amax(self, v: Value) -> list[str] | None:
        if v.dtype.name == "bool":
            return None
        return self._reduce(v, self._dims(v), "max")

    def _sum_to(self, v: Value) -> list[str] | None:
        x = v.inputs[0]
        xs, shape = _shape(x), _shape(v)
        lead = len(xs) - len(shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, s in enumerate(shape) if s == 1 and xs[lead + i] != 1
        )
        if not axes:
            return [f"v{v.id} = reshape(v{x.id}, {shape!r})"]
        return self._reduce(v, axes, "sum")

    @staticmethod
    def _dims(v: Value) -> tuple[int, ...]:
        rank = len(v.inputs[0].shape)
        dim = v.attr("dim")
        if dim is None:
            return tuple(range(rank))
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        return tuple(sorted({int(d) % rank for d in dims})) if rank else ()

    def _matmul(self, v: Value) -> list[str] | None:
        a, b = v.inputs
        if v.dtype.name not in _FLOAT or a.dtype is not b.dtype:
            return None
        sa, sb, so = _shape(a), _shape(b), _shape(v)
        if len(sa) < 2 or len(sb) < 2 or 0 in so or 0 in sa or 0 in sb:
            return None
        if len(sa) == 2 and len(sb) == 2:
            return [f"v{v.id} = matmul2(v{a.id}, v{b.id})"]
        if len(sb) == 2:  # one matrix for every row of the batch: one product
            return [f"v{v.id} = matmul_rows(v{a.id}, v{b.id}, {_numel(sa[:-1])}, {so!r})"]
        batch = so[:-2]
        if tuple(sa[:-2]) != tuple(batch) or tuple(sb[:-2]) != tuple(batch):
            return None  # (a broadcast batch: numpy's matmul, in Python)
        return [f"v{v.id} = matmul_batch(v{a.id}, v{b.id}, {_numel(batch)}, {so!r})"]

    def _last_two(self, x: Value, index: Value, dim: int) -> tuple[tuple, int, int] | None:
        """The permutation that brings ``dim`` last, and the (rows, cols) of ``x`` then, when
        ``index`` has ``x``'s sizes everywhere but along ``dim``."""
        xs, ids = _shape(x), _shape(index)
        rank = len(xs)
        if rank == 0 or len(ids) != rank:
            return None
        dim %= rank
        if any(xs[d] != ids[d] for d in range(rank) if d != dim):
            return None
        perm = tuple(d for d in range(rank) if d != dim) + (dim,)
        rows = _numel([xs[d] for d in perm[:-1]])
        return perm, rows, xs[dim]

    def _gather(self, v: Value) -> list[str] | None:
        x, index = v.inputs
        got = self._last_two(x, index, int(v.attr("dim")))
        if got is None or index.dtype.name != "int64":
            return None
        perm, rows, cols = got
        width = _shape(index)[perm[-1]]
        inverse = tuple(perm.index(d) for d in range(len(perm)))
        permuted = tuple(_shape(index)[d] for d in perm)
        return [
            f"v{v.id} = permute(reshape(gather_last(rows_of(v{x.id}, {perm!r}, {rows}, {cols}), "
            f"rows_of(v{index.id}, {perm!r}, {rows}, {width})), {permuted!r}), {inverse!r})"
        ]

    def _scatter_add(self, v: Value) -> list[str] | None:
        x, index, src = v.inputs
        if _shape(src) != _shape(index) or index.dtype.name != "int64":
            return None
        got = self._last_two(x, index, int(v.attr("dim")))
        if got is None:
            return None
        perm, rows, cols = got
        width = _shape(index)[perm[-1]]
        inverse = tuple(perm.index(d) for d in range(len(perm)))
        permuted = tuple(_shape(x)[d] for d in perm)
        return [
            f"v{v.id} = permute(reshape(scatter_add_last("
            f"rows_of(v{x.id}, {perm!r}, {rows}, {cols}), "
            f"rows_of(v{index.id}, {perm!r}, {rows}, {width}), "
            f"rows_of(v{src.id}, {perm!r}, {rows}, {width})), {permuted!r}), {inverse!r})"
        ]

    def _index_add_at(self, v: Value) -> list[str] | None:
        key = v.attr("key")
        shape = _shape(v)
        if not any(e[0] == "t" for e in key) and len(v.inputs) == 1:
            # basic indices: zeros with ``g`` written at ``key`` (a slice of a split)
            index = self._basic_index(key)
            if index is None or v.inputs[0].dtype is not v.dtype:
                return None
            g = v.inputs[0]
            return [
                f"v{v.id} = np.zeros({shape!r}, {_DTYPES[v.dtype.name]})",
                f"v{v.id}[{index}] = v{g.id}",
            ]
        if len(key) != 1 or key[0][0] != "t" or len(v.inputs) != 2 or not shape:
            return None
        g, index = v.inputs
        if index.dtype.name != "int64" or g.dtype is not v.dtype:
            return None
        rest = _numel(shape[1:])
        count = _numel(_shape(index))
        if _numel(_shape(g)) != count * rest:
            return None
        return [
            f"v{v.id} = reshape(add_rows_at(np.zeros(({shape[0]}, {rest}), "
            f"{_DTYPES[v.dtype.name]}), reshape(v{index.id}, ({count},)), "
            f"reshape(v{g.id}, ({count}, {rest}))), {shape!r})"
        ]


def plan_segments(
    steps: Sequence[Kernel | Extern],
    interpreted: frozenset[int],
    plans: Mapping[int, Any],
    reduced: Mapping[int, list],
    effect_values: set[Value],
    special_ops: frozenset[str],
    parallel_min: int,
) -> tuple[list[Segment], dict[int, str]]:
    """The segments of a schedule (see the module docstring), and for each step left to
    Python why (``explain``): ``plans`` and ``reduced`` map ``id(kernel)`` to its
    ``KernelPlan`` and accumulator shapes, ``special_ops`` are the externs that are Python's
    (hooks, opaque steps, collectives)."""
    emitter = _Emitter(plans, reduced, parallel_min)
    bodies: list[list[str] | None] = []
    why: dict[int, str] = {}
    for k, step in enumerate(steps):
        if isinstance(step, Kernel):
            bodies.append(None if k in interpreted else emitter.kernel(step))
            if bodies[-1] is None:
                why[k] = _kernel_reason(step, plans.get(id(step)), parallel_min)
        elif step.value.op in special_ops:
            bodies.append(None)
            why[k] = f"{step.value.op}: user code or a collective, run by Python"
        else:
            bodies.append(emitter.extern(step.value))
            if bodies[-1] is None:
                v = step.value
                has = hasattr(emitter, "_" + v.op)
                why[k] = (
                    f"{v.op}: no native spelling for these operands "
                    f"({', '.join(f'{i.dtype.name} {list(i.shape)}' for i in v.inputs)})"
                    if has
                    else f"{v.op}: no native spelling"
                )
    # the last step that reads each value (a segment returns what is read after it)
    last_read: dict[Value, int] = {}
    for k, step in enumerate(steps):
        for v in step.inputs if isinstance(step, Kernel) else step.value.inputs:
            last_read[v] = k
    segments: list[Segment] = []
    k = 0
    while k < len(steps):
        if bodies[k] is None:
            k += 1
            continue
        j = k
        while j + 1 < len(steps) and bodies[j + 1] is not None:
            j += 1
        if j > k:
            segments.append(_segment(len(segments), k, j, steps, bodies, last_read, effect_values))
        else:
            why[k] = "alone between Python steps (a segment of one step would only add a call)"
        k = j + 1
    return segments, why


def _kernel_reason(step: Kernel, plan: Any, parallel_min: int) -> str:
    if plan is None:
        return "an interpreted kernel (the precompiled interpreter runs it)"
    if step.accumulate:
        return "a kernel adding into an existing .grad (the leaf's buffer)"
    if plan.parallel_name is not None and _numel(step.shape) >= parallel_min:
        return (
            f"a kernel over {_numel(step.shape)} elements (its prange variant is chosen at run "
            "time)"
        )
    return "a kernel of a dtype native code does not take"


def _segment(
    number: int,
    first: int,
    last: int,
    steps: Sequence[Kernel | Extern],
    bodies: list[list[str] | None],
    last_read: Mapping[Value, int],
    effect_values: set[Value],
) -> Segment:
    seg = Segment(f"segment_{number}", first, last)
    inside: set[Value] = set()
    for k in range(first, last + 1):
        step = steps[k]
        reads = step.inputs if isinstance(step, Kernel) else step.value.inputs
        for v in reads:
            if v not in inside and v not in seg.inputs:
                seg.inputs.append(v)
        for v in step.outputs if isinstance(step, Kernel) else [step.value]:
            inside.add(v)
            if v in effect_values or last_read.get(v, -1) > last:
                seg.outputs.append(v)
    params = ", ".join(f"v{v.id}" for v in seg.inputs)
    body: list[str] = []
    for k in range(first, last + 1):
        body.extend(bodies[k] or ())
    returned = "".join(f"v{v.id}, " for v in seg.outputs)
    seg.lines = [
        _DECORATOR,
        f"def {seg.name}({params}):",
        f'    """Steps {first} to {last} of the program."""',
        *(f"    {line}" for line in body),
        f"    return ({returned})",
    ]
    return seg


_DECORATOR = '@numba.njit(cache=True, nogil=True, error_model="numpy")'

# (the products' library is part of the source: a module compiled against numpy's BLAS is
# never loaded from the cache where that library is missing, ``native_helpers.GEMM``)
PRELUDE = f"""
# products: {"numpy's BLAS (gemm)" if native_helpers.GEMM else "numba's np.dot"}
from fusegrad.compiler.codegen.native_helpers import (
    add_rows_at,
    broadcast,
    gather_last,
    matmul2,
    matmul_batch,
    matmul_rows,
    max_rows,
    permute,
    reshape,
    rows_of,
    scatter_add_last,
    sum_rows_f,
    sum_rows_i,
    take_rows,
    transpose2,
)
"""


def emit_segments(segments: Sequence[Segment]) -> str:
    """The source of the segment functions (appended to the program's kernel module)."""
    if not segments:
        return ""
    parts = [PRELUDE]
    for seg in segments:
        parts.append("\n\n" + "\n".join(seg.lines) + "\n")
    return "".join(parts)
