"""The numba CPU emitter: the source of one Python module per compiled program, one ``@njit``
function per fused kernel, and the loader that writes it to the cache directory and imports it.

Each kernel is an explicit loop nest over the iteration space; sizes are runtime arguments, so
the source depends only on the graph's structure, dtypes and broadcast patterns, never on sizes
(a new batch size reuses the compiled machine code).  Inputs arrive reshaped to the kernel's rank;
a broadcast dimension is indexed with 0.  When every input is either full-size or a single
element, the loop is flattened to one dimension (the common case, and the one LLVM vectorises
best).  Reductions fused as epilogues accumulate in float64: into a local variable for a full
reduction, into a float64 buffer for a partial one.  float32 math uses the vectorisable helpers
of ``fastmath`` (this numba has no SVML; libm calls would stop vectorisation); float64 uses libm.

Floating-point flags (DESIGN.md contract 8): kernels are compiled with ``fastmath={"contract"}``
only, which lets LLVM fuse a multiply and an add into one FMA (one rounding instead of two) and
changes nothing else.  No ``reassoc`` (it folded ``g + (-g)`` to 0 where eager gives NaN at inf),
no ``nsz`` (it turned ``x - x = +0`` into -0), no ``nnan``/``ninf``/``arcp``/``afn``: NaN, inf and
signed zeros come out as eager's (``tests/compiler/test_nan_semantics.py``).  Without
``reassoc`` a running sum along the innermost loop is added in source order, which keeps that
loop scalar.

A kernel without reductions also gets a ``prange`` variant (DESIGN.md contract 8: ``prange`` only
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
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..ir import Value
from ..passes.fuse import Kernel
from . import common, cpu_helpers
from .common import (
    Spelling,
    broadcast_dims,
    cache_dir,
    describe,
    expression,
    is_flat,
    reader,
    reduction_target,
)
from .cpu_helpers import MATH64
from .lowering import MATH

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

CODEGEN_VERSION = 1
FASTMATH = ("contract",)

# purely elementwise kernels over at least this many elements run their ``prange`` variant (when
# numba has more than one thread): below it, waking the thread pool costs more than it saves
PARALLEL_MIN_ELEMENTS = 1 << 16


def _float32_math() -> dict[str, str]:
    """Primitive -> helper name for float32 (fast vectorisable helpers when available)."""
    helpers = dict(getattr(fastmath, "FLOAT32_HELPERS", {})) if fastmath is not None else {}
    out = {}
    for name in MATH:
        out[name] = f"fastmath.{helpers[name]}" if name in helpers else MATH64[name]
    return out


# numpy's scalar ufuncs (through ``cpu_helpers._pow`` for pow: numpy's integer rules)
_FUNCTIONS = {
    "pow": "_pow",
    "sqrt": "np.sqrt",
    "floor": "np.floor",
    "ceil": "np.ceil",
    "trunc": "np.trunc",
}


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


def _spelling() -> Spelling:
    return Spelling(math32=_float32_math(), math64=MATH64, functions=_FUNCTIONS)


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
    lines, plan = _emit(kernel, name, parallel=False)
    if kernel.reductions:
        return "\n".join(lines), plan
    parallel_name = f"{name}_parallel"
    parallel_lines, _ = _emit(kernel, parallel_name, parallel=True)
    plan = dataclasses.replace(plan, parallel_name=parallel_name)
    return "\n".join(lines + ["", ""] + parallel_lines), plan


def _emit(kernel: Kernel, name: str, parallel: bool) -> tuple[list[str], KernelPlan]:
    space = kernel.shape
    members = kernel.members()
    flat = is_flat(kernel)
    rank = 1 if flat else max(len(space), 1)
    loop_space = space if space else (1,)  # (read only by the non-flat indexing)
    idx = [f"i{d}" for d in range(rank)]
    full_out = [v for v in kernel.outputs if v not in kernel.reductions]
    reds = list(kernel.reductions)
    red_shapes = []
    full_red = []
    for r in reds:
        target = reduction_target(r, space)
        full = all(t == 1 for t in target)
        full_red.append(full)
        red_shapes.append((1,) * rank if flat else target)
    args = [f"n{d}" for d in range(rank)]
    args += [f"in{k}" for k in range(len(kernel.inputs))]
    args += [f"out{k}" for k in range(len(full_out))]
    args += [f"red{k}" for k in range(len(reds))]
    spelling = _spelling()
    lines = [_decorator(parallel), f"def {name}({', '.join(args)}):"]
    for k, r in enumerate(reds):
        if full_red[k]:
            lines.append(f"    acc{k} = 0.0  # %{r.id} = {r.op} (full reduction, float64)")
    body_indent = "    " * (rank + 1)
    inner_loop_at = len(lines)
    for d in range(rank):
        if d == rank - 1:
            inner_loop_at = len(lines)  # row accumulators are declared just before this loop
        loop = "numba.prange" if parallel and d == 0 else "range"
        lines.append("    " * (d + 1) + f"for {idx[d]} in {loop}(n{d}):")

    def read_input(k: int, v: Value) -> str:  # inputs arrive reshaped to the loop's rank
        if flat:
            return f"in{k}[{'i0' if v.shape == space else '0'}]"
        b = broadcast_dims(v, loop_space)
        pad = len(loop_space) - len(v.shape)
        sub = ", ".join("0" if (d < pad or b[d]) else idx[d] for d in range(rank))
        return f"in{k}[{sub}]"

    read = reader(members, kernel.inputs, read_input)

    out_index = {v: k for k, v in enumerate(full_out)}
    for v in kernel.values:
        expr = expression(v, read, spelling)
        lines.append(f"{body_indent}v{v.id} = {expr}  {describe(v)}")
        if v in out_index:
            position = "i0" if flat else ", ".join(idx)
            op = "+=" if v in kernel.accumulate else "="
            lines.append(f"{body_indent}out{out_index[v]}[{position}] {op} v{v.id}")
    row_inits: list[str] = []
    row_stores: list[str] = []
    for k, r in enumerate(reds):
        term = read(r.inputs[0])
        if full_red[k]:
            lines.append(f"{body_indent}acc{k} += {term}  # %{r.id} = {r.op}")
            continue
        target = reduction_target(r, space)
        sub = ", ".join("0" if target[d] == 1 and space[d] != 1 else idx[d] for d in range(rank))
        if rank >= 2 and target[-1] == 1 and space[-1] != 1:
            # reduced along the innermost loop: a local accumulator per row keeps that loop
            # vectorisable (a store into red[...] on every iteration made it ~40x slower)
            outer_indent = "    " * rank
            row_inits.append(f"{outer_indent}racc{k} = 0.0  # %{r.id} = {r.op} (row sum)")
            lines.append(f"{body_indent}racc{k} += {term}  # %{r.id} = {r.op}")
            row_stores.append(f"{outer_indent}red{k}[{sub}] += racc{k}")
        else:
            lines.append(f"{body_indent}red{k}[{sub}] += {term}  # %{r.id} = {r.op}")
    lines.extend(row_stores)
    lines[inner_loop_at:inner_loop_at] = row_inits
    for k in range(len(reds)):
        if full_red[k]:
            lines.append(f"    red{k}[{', '.join('0' for _ in range(rank))}] = acc{k}")
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
    )
    return lines, plan


HEADER = '''"""Generated by fusegrad (numba CPU codegen v{version}); do not edit.

{summary}
"""
import math

import numba
import numpy as np

try:
    from fusegrad.compiler.codegen import fastmath
except ImportError:  # float32 math then uses libm
    fastmath = None
from fusegrad.compiler.codegen.cpu_helpers import (
    _cast_bool, _cast_float32, _cast_float64, _cast_int32, _cast_int64, _maximum, _minimum,
    _pow, _sigmoid64, _sign,
)
'''


def emit_module(kernels: list[Kernel], summary: str) -> tuple[str, list[KernelPlan]]:
    parts = [HEADER.format(version=CODEGEN_VERSION, summary=summary)]
    plans = []
    for k, kernel in enumerate(kernels):
        src, plan = emit_kernel(kernel, f"kernel_{k}")
        parts.append("\n" + src + "\n")
        plans.append(plan)
    return "\n".join(parts), plans


_loaded: dict[str, ModuleType] = {}


def _flags() -> str:
    # the helpers are inlined: numba's cache cannot see them change, so their digests are flags
    # (without cpu_helpers' own, a fixed helper would not reach kernels cached before the fix)
    helpers = getattr(fastmath, "SOURCE_DIGEST", "none") if fastmath is not None else "none"
    return (
        f"v{CODEGEN_VERSION}|{FASTMATH}|numba{_numba_version()}|"
        f"helpers{helpers}|{cpu_helpers.SOURCE_DIGEST}"
    )


def module_name(source: str) -> str:
    return common.module_name(source, _flags())


def _numba_version() -> str:
    import numba

    return numba.__version__


def load_module(source: str) -> tuple[ModuleType, str, bool]:
    """Import the module for ``source`` (writing it once); returns (module, path, was_on_disk).
    A corrupt or unreadable cache file is rewritten, never fatal."""
    return common.load_module(source, _flags(), _loaded)


# ---- choosing the parallel variant at run time ------------------------------------------------

# numba's ``workqueue`` threading layer aborts the process when two threads enter parallel code
# at once; whoever holds this lock runs parallel, a concurrent caller runs the serial loop
_parallel_lock = threading.Lock()


def use_parallel(n: int) -> bool:
    """Whether a kernel over ``n`` elements should run its ``prange`` variant."""
    if n < PARALLEL_MIN_ELEMENTS:
        return False
    import numba

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
