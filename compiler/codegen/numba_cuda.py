"""The numba-cuda emitter and launcher, the CUDA counterpart of ``numba_cpu``
(docs/ARCHITECTURE.md, contract 9).

It reads the same ``passes.fuse.Kernel`` objects and computes every value with the same
``lowering.EXPRESSIONS`` template (through ``common.expression``); only the loop structure and the
spelling of a few functions differ.  One module per program, one ``@cuda.jit`` function per fused
kernel (plus one per extra reduction group, see below), one comment per IR value.

Loop structure (sizes are runtime arguments; capture-time shapes only decide structure):

* **Elementwise kernels** are grid-stride loops over the flattened iteration space.  The *flat*
  form indexes every full-size array with the flat index (arrays passed as 1-D views: they must
  be C-contiguous or already 1-D); the *strided* form recovers the ND coordinates from the flat
  index and indexes each array with its own rank and strides (any layout, broadcast dims read at
  0).  The launcher picks the flat form whenever the arrays allow it.
* **Reductions** (``sum_to`` with kept dims, full ``sum``s, ``sum`` over ``dim``) are
  deterministic block-tree reductions, no atomics: the iteration space splits into the dims a
  reduction keeps and the dims it sums over.  A block takes ``tile`` consecutive kept elements
  (32 when the innermost dim is kept, so that memory accesses coalesce, else 1) and one of
  ``slices`` interleaved parts of the summed elements; its threads accumulate in float64
  (int64 for integer sums) in registers, then combine in shared memory in a fixed tree order.
  With ``slices == 1`` the block writes the result; otherwise it writes a partial and a second
  pass (``finish_reduction``) adds each output's partials in order.  ``slices`` is a function of
  the sizes and the device settings only, so results are bitwise reproducible run to run (they
  can differ in the last bits between devices with different multiprocessor counts).  The
  elementwise prologue is computed in the same loop and full-size outputs (``.grad +=``
  epilogues included) are written there.
* A kernel whose reductions keep different dims (``sum_to`` to ``(C,)`` and to ``(N, 1)`` of the
  same ``(N, C)`` loop) gets one function per group of reductions with the same reduced dims;
  each recomputes only the values its reductions need, and the first also writes the full-size
  outputs.  (Recomputing the elementwise prologue is cheap on a GPU; a float64 scratch copy of
  the summands would cost more memory traffic.)

Functions: every scalar function with a libm name is ``math.<name>``, libdevice on the device
(float32 operands call the float32 versions; numpy's ufuncs are not available in numba-cuda
kernels).  The others (the stable sigmoid, digamma, ...) and the target helpers (``_maximum``,
``_sign``, casts) are the same Python functions the CPU compiles — the records' sources and
``cpu_helpers``' — compiled as inlined device functions: one definition for both targets.  Under
the simulator, ``math`` in generated modules is bound to the records' Python stand-ins
(``simulator_math``: Python's ``math`` raises where the device returns inf or nan).

Launch configuration comes from ``device_settings()``: threads per block (a power of two, part
of the generated source: shared-memory sizes), multiprocessor count (grid sizes); small defaults
under the simulator, which runs every thread in Python.  Machine code is cached on disk by
numba-cuda's ``cache=True`` beside the module, whose name hashes the source and the flags,
target (compute capability) included (``common.load_module``).

Entry points: ``emit_kernel`` / ``emit_module`` (source and plans), ``compile_kernels`` (a
program's kernels in one module) and ``compile_kernel`` (one kernel, cached in memory by source:
for eager one-op kernels), ``run_kernel`` (the launcher), ``launch_signatures`` (argument types
of every generated function, for ahead-of-time PTX compilation).
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numba
import numpy as np
from numba import cuda

from fusegrad import dtypes as _dt
from fusegrad.ops.registry import ScalarFunction
from fusegrad.storage import full

from ..ir import Graph, Value
from ..passes.fuse import Kernel
from ..symbolic import substitute
from . import common, cpu_helpers
from .common import describe, expression, is_flat, reader, reduced_dims
from .lowering import (
    EXPRESSIONS,
    FUNCTIONS,
    FUSED_REDUCTIONS,
    HELPER_FUNCTIONS,
    helper_name,
    helpers_digest,
)

CODEGEN_VERSION = 1
MAX_TILE = 32  # kept outputs per block when the innermost dim is kept (one warp wide)
MIN_PER_THREAD = 4  # a reduction is split into more slices only while each thread keeps this many

# ---- device functions called by generated code -----------------------------------------------


def _device(helper: Any) -> Any:
    """A ``cpu_helpers`` function (numba CPU dispatcher) as an inlined CUDA device function of the
    same Python source.  ``inline="always"`` inlines at numba's IR level, so PTX can be compiled
    without a GPU (a device function call would ask the current device for its capability)."""
    return cuda.jit(device=True, inline="always")(helper.py_func)


_maximum = _device(cpu_helpers._maximum)
_minimum = _device(cpu_helpers._minimum)
_sign = _device(cpu_helpers._sign)
_cast_bool = _device(cpu_helpers._cast_bool)
_cast_float32 = _device(cpu_helpers._cast_float32)
_cast_float64 = _device(cpu_helpers._cast_float64)
_cast_int32 = _device(cpu_helpers._cast_int32)
_cast_int64 = _device(cpu_helpers._cast_int64)
_cast_int16 = _device(cpu_helpers._cast_int16)  # (the small integers: eager CUDA kernels)
_cast_int8 = _device(cpu_helpers._cast_int8)
_cast_uint8 = _device(cpu_helpers._cast_uint8)


@cuda.jit(device=True, inline="always")
def _pow(a, b):  # type: ignore[no-untyped-def]
    # libdevice's pow for floats (C pow, as numpy's power); numba's integer power for integers
    return a**b


# the records' scalar functions without a libm equivalent (sigmoid, digamma, ...): device
# functions of the same Python source the CPU compiles (``cpu_helpers.RECORD_HELPERS``)
_RECORD_HELPERS = {
    helper_name(fn): cuda.jit(device=True, inline="always")(fn.python)
    for fn in HELPER_FUNCTIONS.values()
}
globals().update(_RECORD_HELPERS)  # importable by generated modules, like the helpers above

# every helper generated modules import from here
HELPERS = tuple(
    sorted(
        h
        for h in cpu_helpers.TARGET_HELPERS + tuple(_RECORD_HELPERS)
        if h not in cpu_helpers.CPU_REDUCTION_HELPERS
    )
)  # (``_partial_sums`` and ``_buffer_sum`` are the CPU emitter's, for its reductions)

# Python's ``math`` raises (overflow, domain errors, nan to int) where the device returns inf or
# nan; under the simulator generated modules use, under the same names, the records' Python
# stand-ins for their libm functions (numpy's ufuncs or functions that never raise)
simulator_math = types.SimpleNamespace(
    **{fn.libm: fn.python for fn in FUNCTIONS.values() if fn.libm is not None}
)


def _spell(fn: ScalarFunction) -> str:
    # ``math.exp`` of a float32 is libdevice's expf: no separate float32 spelling
    return f"math.{fn.libm}" if fn.libm is not None else helper_name(fn)


_SPELLING = common.spelling(_spell, lambda fn: None)

# ---- device settings --------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSettings:
    """What generated code and launches are sized by."""

    simulator: bool
    compute_capability: tuple[int, int]
    multiprocessors: int
    threads: int  # threads per block, a power of two; baked into generated source
    max_blocks: int  # grid size of grid-stride loops, at most
    reduction_blocks: int  # blocks a reduction tries to keep busy (sizes ``slices``)

    @property
    def target(self) -> str:
        if self.simulator:
            return "cuda-simulator"
        major, minor = self.compute_capability
        return f"cuda-sm{major}{minor}"


def settings_for(
    compute_capability: tuple[int, int], multiprocessors: int, max_threads_per_block: int
) -> DeviceSettings:
    """The settings for a device with these properties (256 threads per block at most)."""
    threads = 1 << (min(256, max_threads_per_block).bit_length() - 1)
    return DeviceSettings(
        simulator=False,
        compute_capability=tuple(compute_capability),  # type: ignore[arg-type]
        multiprocessors=multiprocessors,
        threads=threads,
        max_blocks=multiprocessors * 32,
        reduction_blocks=multiprocessors * 4,
    )


# the simulator runs every thread as a Python thread: few, small blocks (still several
# threads per tree level and more than one block, so the same code paths run)
SIMULATOR = DeviceSettings(
    simulator=True,
    compute_capability=(5, 2),
    multiprocessors=1,
    threads=32,
    max_blocks=2,
    reduction_blocks=2,
)


@functools.cache
def device_settings() -> DeviceSettings:
    """Settings of the current device (or ``SIMULATOR`` under ``NUMBA_ENABLE_CUDASIM=1``)."""
    if getattr(numba.config, "ENABLE_CUDASIM", False):
        return SIMULATOR
    device = cuda.get_current_device()
    return settings_for(
        device.compute_capability,
        int(device.MULTIPROCESSOR_COUNT),
        int(device.MAX_THREADS_PER_BLOCK),
    )


# ---- plans ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """One generated ``@cuda.jit`` function of a kernel.

    Its arguments, in order: the sizes (``n`` for the flat form, one per loop dim otherwise),
    the kernel's inputs, its full-size outputs (only when ``writes_outputs``), one result array
    per reduction (1-D, the kept elements), one partials array per reduction (1-D, float64 or
    int64, ``kept * slices`` elements; any one-element array when ``slices == 1``), ``slices``.
    """

    name: str
    flat: bool
    writes_outputs: bool
    reductions: tuple[Value, ...]  # the reductions this function computes (none: elementwise)
    kept: tuple[int, ...]  # loop dims the reductions keep (all, elementwise; size-1 dims excluded)
    reduced: tuple[int, ...]  # dims they sum over
    tile: int  # threads along consecutive kept elements (block: tile x rows)
    rows: int  # threads along the summed elements


@dataclass(frozen=True)
class CudaKernelPlan:
    """How ``run_kernel`` calls one kernel's generated functions."""

    name: str
    shape: tuple[int, ...]  # the iteration space at capture
    threads: int  # threads per block the source was generated for
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]  # full-size outputs, in argument order
    accumulate: tuple[Value, ...]  # outputs added (``+=``) into an existing array
    reductions: tuple[Value, ...]
    flat: Launch | None  # the one-loop form (C-contiguous or 1-D arrays), when the kernel has one
    strided: tuple[Launch, ...]  # the general form: one function per reduction group


def _accumulator_dtype(r: Value) -> np.dtype:
    return np.dtype(np.float64) if r.dtype.is_floating_point else np.dtype(np.int64)


def _groups(kernel: Kernel) -> list[tuple[tuple[int, ...], list[Value]]]:
    """Reductions grouped by the dims they sum over, in order of first appearance."""
    groups: dict[tuple[int, ...], list[Value]] = {}
    for r in kernel.reductions:
        groups.setdefault(reduced_dims(r, kernel.shape), []).append(r)
    return list(groups.items())


def _check_supported(kernel: Kernel, name: str) -> None:
    """Raise ``NotImplementedError`` (the caller falls back) for what this emitter cannot
    generate, naming the value: anything ``fuse`` does not put in kernels today."""
    for v in kernel.values:
        if v.op != "broadcast_to" and v.op not in EXPRESSIONS:
            raise NotImplementedError(f"{name}: %{v.id} = {v.op} is not an elementwise lowering")
        if v.op == "cast" and f"_cast_{v.attr('dtype').name}" not in HELPERS:
            raise NotImplementedError(f"{name}: %{v.id} casts to {v.attr('dtype').name}")
    for r in kernel.reductions:
        if r.op not in FUSED_REDUCTIONS:
            raise NotImplementedError(f"{name}: %{r.id} = {r.op} is not a fused reduction")


def _plan(kernel: Kernel, name: str, threads: int) -> CudaKernelPlan:
    _check_supported(kernel, name)
    space = kernel.shape
    rank = max(len(space), 1)
    loop = space if space else (1,)
    big = tuple(d for d in range(rank) if loop[d] != 1)  # size-1 dims are indexed with 0
    full_out = tuple(v for v in kernel.outputs if v not in kernel.reductions)

    def launch(launch_name: str, flat: bool, first: bool, group: Any) -> Launch:
        if group is None:  # elementwise: every (non-1) dim is a loop dim
            return Launch(launch_name, flat, True, (), big, (), 1, threads)
        reduced, reductions = group
        kept = () if flat else tuple(d for d in big if d not in reduced)
        tile = min(MAX_TILE, threads // 4) if kept and kept[-1] == rank - 1 else 1
        return Launch(
            launch_name, flat, first, tuple(reductions), kept, reduced, tile, threads // tile
        )

    groups = _groups(kernel)
    flat = None
    if is_flat(kernel):  # then every reduction is full: at most one group
        flat = launch(f"{name}_flat", True, True, groups[0] if groups else None)
    strided: tuple[Launch, ...] = ()
    if flat is None or len(space) > 1:  # a 1-D flat form already takes any 1-D layout
        if not groups:
            strided = (launch(name, False, True, None),)
        else:
            strided = tuple(
                launch(name if g == 0 else f"{name}_group{g}", False, g == 0, group)
                for g, group in enumerate(groups)
            )
    return CudaKernelPlan(
        name,
        tuple(space),
        threads,
        tuple(kernel.inputs),
        full_out,
        tuple(v for v in full_out if v in kernel.accumulate),
        tuple(kernel.reductions),
        flat,
        strided,
    )


# ---- emission ---------------------------------------------------------------------------------


def _needed(kernel: Kernel, roots: Sequence[Value]) -> list[Value]:
    """The kernel's values that ``roots`` depend on, in kernel order."""
    needed = set(roots)
    members = set(kernel.values)
    for v in reversed(kernel.values):
        if v in needed:
            needed.update(i for i in v.inputs if i in members)
    return [v for v in kernel.values if v in needed]


def _product(names: Sequence[str]) -> str:
    return " * ".join(names) if names else "1"


def _unravel(index: str, dims: Sequence[int], indent: str) -> list[str]:
    """Lines setting ``i{d}`` for ``dims`` (row-major) from the flat ``index`` over them."""
    if not dims:
        return []
    if len(dims) == 1:
        return [f"{indent}i{dims[0]} = {index}"]
    lines = [f"{indent}rest = {index}"]
    for d in reversed(dims[1:]):
        lines.append(f"{indent}i{d} = rest % n{d}")
        lines.append(f"{indent}rest //= n{d}")
    lines.append(f"{indent}i{dims[0]} = rest")
    return lines


def _emit_launch(kernel: Kernel, plan: CudaKernelPlan, launch: Launch) -> list[str]:
    space = kernel.shape
    rank = max(len(space), 1)
    loop = space if space else (1,)
    members = set(kernel.values)
    outputs = plan.outputs if launch.writes_outputs else ()
    coords = ["0" if loop[d] == 1 else f"i{d}" for d in range(rank)]

    def read_input(k: int, v: Value) -> str:  # each input indexed with its own rank
        if launch.flat and v.shape == space:
            return f"in{k}[i]"  # passed flattened
        if not v.shape:
            return f"in{k}[0]"  # 0-d inputs are passed as one-element 1-d arrays
        pad = rank - len(v.shape)
        sub = ", ".join("0" if s == 1 else coords[pad + d] for d, s in enumerate(v.shape))
        return f"in{k}[{sub}]"

    read = reader(members, plan.inputs, read_input)

    sizes = ["n"] if launch.flat else [f"n{d}" for d in range(rank)]
    args = sizes + [f"in{k}" for k in range(len(plan.inputs))]
    args += [f"out{k}" for k in range(len(outputs))]
    reds = launch.reductions
    if reds:
        args += [f"res{k}" for k in range(len(reds))] + [f"part{k}" for k in range(len(reds))]
        args.append("slices")
    lines = ["@cuda.jit(cache=True)", f"def {launch.name}({', '.join(args)}):"]
    if reds:
        summed = ", ".join(str(d) for d in launch.reduced) or "none"
        lines.append(
            f'    """{", ".join(f"%{r.id} = {r.op}" for r in reds)}: sums over dims ({summed}); '
            f'a block takes {launch.tile} kept element(s) x one of `slices` parts of the rest"""'
        )

    roots = list(outputs) + [r.inputs[0] for r in reds]
    values = _needed(kernel, roots)
    position = "i" if launch.flat else ", ".join(coords)
    if not reds:
        total = "n" if launch.flat else _product([f"n{d}" for d in launch.kept])
        lines.append(f"    for i in range(cuda.grid(1), {total}, cuda.gridsize(1)):")
        body = "        "
        if not launch.flat:
            lines += _unravel("i", launch.kept, body)
    else:
        tile, rows = launch.tile, launch.rows
        kept_total = "1" if launch.flat else _product([f"n{d}" for d in launch.kept])
        summed_total = "n" if launch.flat else _product([f"n{d}" for d in launch.reduced])
        # a block is tile x rows threads (tx, ty); with one kept element per block, just rows
        lines += ["    tx = cuda.threadIdx.x"] if tile > 1 else []
        lines += [
            "    ty = cuda.threadIdx.y",
            f"    kept = {kept_total}",
            f"    summed = {summed_total}",
            f"    tiles = (kept + {tile - 1}) // {tile}" if tile > 1 else "    tiles = kept",
        ]
        for k, r in enumerate(reds):
            acc = _accumulator_dtype(r).name
            lines.append(
                f"    shared{k} = cuda.shared.array({plan.threads}, numba.{acc})  {describe(r)}"
            )
        lines += [
            "    for work in range(cuda.blockIdx.x, tiles * slices, cuda.gridDim.x):",
            "        tile = work // slices",
            "        part = work - tile * slices",
            f"        o = tile * {tile} + tx" if tile > 1 else "        o = tile",
        ]
        for k, r in enumerate(reds):
            acc = _accumulator_dtype(r).name
            lines.append(f"        acc{k} = np.{acc}(0)")
        lines.append("        if o < kept:")
        lines += _unravel("o", launch.kept, "            ")
        j = "i" if launch.flat else "j"
        lines.append(f"            for {j} in range(part * {rows} + ty, summed, slices * {rows}):")
        body = "                "
        if not launch.flat:
            lines += _unravel("j", launch.reduced, body)
    out_index = {v: k for k, v in enumerate(outputs)}
    if not values and not reds:
        lines.append(f"{body}pass  # (no output: nothing this kernel computes is read)")
    for v in values:
        lines.append(f"{body}v{v.id} = {expression(v, read, _SPELLING)}  {describe(v)}")
        if v in out_index:
            op = "+=" if v in plan.accumulate else "="
            lines.append(f"{body}out{out_index[v]}[{position}] {op} v{v.id}")
    if not reds:
        return lines
    for k, r in enumerate(reds):
        lines.append(f"{body}acc{k} += {read(r.inputs[0])}  {describe(r)}")
    # this thread's slot in shared memory, the slot ``step`` rows below, and its row's first
    slot, below, first = ("ty", "ty + step", "0")
    if launch.tile > 1:
        slot, below, first = (f"ty * {launch.tile} + tx", f"(ty + step) * {launch.tile} + tx", "tx")
    for k in range(len(reds)):
        lines.append(f"        shared{k}[{slot}] = acc{k}")
    lines += [
        "        cuda.syncthreads()",
        f"        step = {launch.rows // 2}",
        "        while step > 0:  # a tree over the rows of the block, in a fixed order",
        "            if ty < step:",
    ]
    deep = " " * 16
    for k in range(len(reds)):
        lines.append(f"{deep}shared{k}[{slot}] += shared{k}[{below}]")
    lines += [
        "            cuda.syncthreads()",
        "            step //= 2",
        "        if ty == 0 and o < kept:",
        "            if slices == 1:",
    ]
    lines += [f"{deep}res{k}[o] = shared{k}[{first}]" for k in range(len(reds))]
    lines.append("            else:")
    lines += [f"{deep}part{k}[o * slices + part] = shared{k}[{first}]" for k in range(len(reds))]
    lines.append("        cuda.syncthreads()  # shared memory is reused by the next work item")
    return lines


def emit_kernel(
    kernel: Kernel, name: str, settings: DeviceSettings | None = None
) -> tuple[str, CudaKernelPlan]:
    """The source of one kernel's ``@cuda.jit`` functions and its calling plan."""
    if kernel.phases:  # (programs on CUDA never make them: ``Program.row_fusion``)
        raise ValueError("a row kernel (passes.rows) is the CPU emitter's; CUDA has no lowering")
    settings = settings or device_settings()
    plan = _plan(kernel, name, settings.threads)
    launches = ([plan.flat] if plan.flat else []) + list(plan.strided)
    chunks = ["\n".join(_emit_launch(kernel, plan, launch)) for launch in launches]
    return "\n\n\n".join(chunks), plan


HEADER = '''"""Generated by fusegrad (numba CUDA codegen v{version}, {target},
{threads} threads per block); do not edit.

{summary}
"""
{math_import}

import numba
import numpy as np
from numba import cuda

from fusegrad.compiler.codegen.numba_cuda import (
    {helpers},
)


@cuda.jit(cache=True)
def finish_reduction(part, res, kept, slices):
    """res[o] = the sum of part[o * slices : (o + 1) * slices], added in order."""
    for o in range(cuda.grid(1), kept, cuda.gridsize(1)):
        acc = part[o * slices]
        for s in range(1, slices):
            acc += part[o * slices + s]
        res[o] = acc
'''


def emit_module(
    kernels: Sequence[Kernel], summary: str, settings: DeviceSettings | None = None
) -> tuple[str, list[CudaKernelPlan]]:
    """One module for ``kernels`` (``kernel_0``, ``kernel_1``, ...) and their plans."""
    settings = settings or device_settings()
    math_import = (
        "from fusegrad.compiler.codegen.numba_cuda import simulator_math as math"
        if settings.simulator
        else "import math"
    )
    parts = [
        HEADER.format(
            version=CODEGEN_VERSION,
            target=settings.target,
            threads=settings.threads,
            summary=summary,
            math_import=math_import,
            helpers=", ".join(HELPERS),
        )
    ]
    plans = []
    for k, kernel in enumerate(kernels):
        source, plan = emit_kernel(kernel, f"kernel_{k}", settings)
        parts.append("\n" + source + "\n")
        plans.append(plan)
    return "\n".join(parts), plans


# ---- loading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompiledKernel:
    """A kernel's plan with its module's functions, ready for ``run_kernel``."""

    plan: CudaKernelPlan
    functions: Mapping[str, Any]  # launch name (and "finish_reduction") -> cuda kernel
    settings: DeviceSettings


_loaded: dict[str, types.ModuleType] = {}
_by_source: dict[str, tuple[types.ModuleType, str]] = {}


@functools.cache
def _helpers_digest() -> str:
    sources = [Path(cpu_helpers.__file__).read_bytes(), Path(__file__).read_bytes()]
    return hashlib.sha256(b"".join(sources)).hexdigest()[:16]


def _flags(settings: DeviceSettings) -> str:
    # the helpers are inlined: numba-cuda's cache cannot see them change, so their digest is a flag
    from importlib.metadata import PackageNotFoundError, version

    try:
        numba_cuda_version = version("numba-cuda")
    except PackageNotFoundError:
        numba_cuda_version = "unknown"
    return (
        f"cuda v{CODEGEN_VERSION}|{settings.target}|threads{settings.threads}|"
        f"numba-cuda{numba_cuda_version}|helpers{_helpers_digest()}|scalar{helpers_digest()}"
    )


def load_module(source: str, settings: DeviceSettings) -> tuple[types.ModuleType, str, bool]:
    """Import the module for ``source`` (see ``common.load_module``); in-memory by source first."""
    hit = _by_source.get(source)
    if hit is not None:
        return hit[0], hit[1], True
    module, path, on_disk = common.load_module(source, _flags(settings), _loaded)
    _by_source[source] = (module, path)
    return module, path, on_disk


def compile_kernels(
    kernels: Sequence[Kernel], summary: str = "", settings: DeviceSettings | None = None
) -> tuple[list[CompiledKernel], str]:
    """A program's kernels in one module: the compiled kernels (in order) and the module path.
    numba-cuda compiles each function on its first launch (or loads it from the disk cache)."""
    settings = settings or device_settings()
    source, plans = emit_module(kernels, summary, settings)
    module, path, _ = load_module(source, settings)
    compiled = []
    for plan in plans:
        names = [launch.name for launch in ([plan.flat] if plan.flat else []) + list(plan.strided)]
        functions = {name: getattr(module, name) for name in names + ["finish_reduction"]}
        compiled.append(CompiledKernel(plan, functions, settings))
    return compiled, path


def compile_kernel(kernel: Kernel, settings: DeviceSettings | None = None) -> CompiledKernel:
    """One kernel in a module of its own (eager one-op kernels: a ``Kernel`` with one elementwise
    value, or one reduction of an input).  Kernels with the same source share the module and
    its compiled machine code; the cost of a repeated call is emitting the source (tens of
    microseconds) and a dictionary lookup."""
    ops = ", ".join(v.op for v in kernel.values + kernel.reductions)
    (compiled,), _ = compile_kernels([kernel], f"one kernel: {ops}", settings)  # no sizes
    return compiled


# ---- eager one-op kernels (``fusegrad.cuda.generated``) -------------------------------------

_ONE_OP: dict[tuple, tuple] = {}  # (primitive, attributes, operand shapes and dtypes) -> kernel
_ONE_OP_LIMIT = 4096
_ONE_OP_REDUCTIONS = ("sum", "sum_to")
_one_op_lock = threading.Lock()


def _freeze_attrs(attrs: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))


def _one_op_kernel(
    prim: Any, shapes: Sequence[tuple], dtypes: Sequence[np.dtype], attrs: Any
) -> tuple:
    """The smallest program there is: one input value per operand and one value (for ``sum`` /
    ``sum_to``: the reduction of its input, a deterministic block tree) as one ``Kernel``."""
    graph = Graph()
    inputs = [
        graph.input("saved", i, tuple(shape), _dt.from_numpy_dtype(np.dtype(dtype)))
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes))
    ]
    shape, dtype = prim.meta(
        tuple(v.shape for v in inputs), tuple(v.dtype for v in inputs), **attrs
    )
    value = graph.add(prim.name, tuple(inputs), dict(attrs), tuple(shape), dtype)
    if prim.name in _ONE_OP_REDUCTIONS:  # a reduction of its input: the loop runs over it
        kernel = Kernel(shape=inputs[0].shape, reductions=[value], inputs=inputs, outputs=[value])
    else:
        space = tuple(np.broadcast_shapes(*(v.shape for v in inputs)))
        kernel = Kernel(shape=space, values=[value], inputs=inputs, outputs=[value])
    return inputs, value, compile_kernel(kernel)


def run_one_op(
    prim: Any, arrays: Sequence[Any], shapes: Sequence[tuple], attrs: Mapping[str, Any]
) -> tuple[Any, tuple]:
    """Primitive ``prim`` on device arrays ``arrays`` (numba-cuda arrays of ``shapes``) as one
    generated kernel: returns (result device array, result shape).  Kernels are kept per
    primitive, attributes, shapes and dtypes (sizes are runtime arguments of the code, so a new
    size costs emitting the source, not a compilation); the table is bounded."""
    key = (
        prim.name,
        _freeze_attrs(attrs),
        tuple((tuple(shape), np.dtype(a.dtype).str) for shape, a in zip(shapes, arrays)),
    )
    entry = _ONE_OP.get(key)
    if entry is None:
        with _one_op_lock:
            if len(_ONE_OP) >= _ONE_OP_LIMIT:
                _ONE_OP.clear()
            entry = _ONE_OP[key] = _one_op_kernel(
                prim, shapes, [a.dtype for a in arrays], dict(attrs)
            )
    inputs, value, compiled = entry
    results = run_kernel(compiled, dict(zip(inputs, arrays)))
    return results[value], value.shape


# ---- launching --------------------------------------------------------------------------------


def _to_device(a: Any) -> Any:
    """A device array for ``a`` (host arrays and scalars are copied to the device)."""
    if isinstance(a, (np.ndarray, np.generic, int, float, bool)):
        return cuda.to_device(np.array(a, order="C"))  # (ascontiguousarray would make 0-d 1-d)
    return a


def _flattenable(a: Any) -> bool:
    return a.ndim <= 1 or bool(a.is_c_contiguous())


def _zeros(shape: tuple, dtype: np.dtype) -> Any:
    """A device array of zeros, filled on the device by the eager backend's fill kernel (a host
    array of zeros copied over would be a transfer per call)."""
    return full(shape, 0, dtype, True).kernel_array()


def _slices(tiles: int, summed: int, rows: int, settings: DeviceSettings) -> int:
    """How many parts each kept element's sum is split into: enough blocks to fill the device,
    while every thread still adds at least ``MIN_PER_THREAD`` terms.  A function of sizes and
    settings only, so the order of additions is the same on every run."""
    wanted = -(-settings.reduction_blocks // max(tiles, 1))
    most = max(1, summed // (rows * MIN_PER_THREAD))
    return max(1, min(wanted, most))


@dataclass(frozen=True)
class _Row:
    """One launch of a prepared kernel: the function, its grid and block, and for a reduction
    group the number of kept elements, the partial sums per kept element (``slices``) and the
    grid of the ``finish_reduction`` launch that adds them."""

    fn: Any
    blocks: int
    block: Any  # threads per block: an int, or (tile, rows) for a reduction group
    writes_outputs: bool
    reductions: tuple[tuple[Value, np.dtype, np.dtype, tuple], ...]  # (value, dtype, acc, shape)
    kept: int
    slices: int
    finish_blocks: int


@dataclass(frozen=True)
class Prepared:
    """A compiled kernel's launch sequence for one size vector (``prepare``): every grid, block,
    shape and scratch size ``launch`` needs, decided once, so that a call only binds its arrays
    and enqueues the launches (``Program`` keeps one per step and size vector)."""

    kernel: CompiledKernel
    n: int  # elements of the iteration space
    space: tuple[int, ...]  # the loop's dims (``(1,)`` for a 0-d space)
    full: tuple[bool, ...]  # per input: spans the whole space (a flat launch reads it as 1-D)
    outputs: tuple[tuple[int, ...], ...]  # the full-size outputs' shapes
    reductions: tuple[tuple[int, ...], ...]  # the reductions' shapes
    flat: tuple[_Row, ...] | None  # the one-loop form, where the plan has one
    strided: tuple[_Row, ...]
    zero_dim: bool  # a 0-d space: outputs are passed as one-element 1-D arrays

    @property
    def launches(self) -> int:
        """Launches of the general form (the flat form has as many or fewer)."""
        rows = self.strided or self.flat or ()
        return sum(1 + (len(row.reductions) if row.slices > 1 else 0) for row in rows)


def _rows(
    kernel: CompiledKernel, launches: Sequence[Launch], loop: tuple, n: int, sizes: Sequence[int]
) -> tuple[_Row, ...]:
    settings = kernel.settings
    threads = settings.threads
    rows = []
    for launch in launches:
        fn = kernel.functions[launch.name]
        if not launch.reductions:
            blocks = min(-(-n // threads), settings.max_blocks)
            rows.append(_Row(fn, blocks, threads, launch.writes_outputs, (), 0, 1, 0))
            continue
        kept = 1 if launch.flat else math.prod(loop[d] for d in launch.kept)
        tiles = -(-kept // launch.tile)
        slices = _slices(tiles, n // kept, launch.rows, settings)
        reductions = tuple(
            (r, r.dtype.np, _accumulator_dtype(r), substitute(r.shape, sizes))
            for r in launch.reductions
        )
        rows.append(
            _Row(
                fn,
                min(tiles * slices, settings.max_blocks),
                (launch.tile, launch.rows),
                launch.writes_outputs,
                reductions,
                kept,
                slices,
                min(-(-kept // threads), settings.max_blocks),
            )
        )
    return tuple(rows)


def prepare(kernel: CompiledKernel, sizes: Sequence[int] = ()) -> Prepared:
    """``kernel``'s launches for the size vector ``sizes`` (see ``Prepared``)."""
    plan, settings = kernel.plan, kernel.settings
    if settings.threads != plan.threads:
        raise ValueError(
            f"{plan.name}: generated for {plan.threads} threads per block, "
            f"launched with settings for {settings.threads}"
        )
    space = substitute(plan.shape, sizes)
    n = math.prod(space)
    loop = space if space else (1,)
    return Prepared(
        kernel,
        n,
        loop,
        tuple(v.shape == plan.shape for v in plan.inputs),
        tuple(substitute(v.shape, sizes) for v in plan.outputs),
        tuple(substitute(r.shape, sizes) for r in plan.reductions),
        None if plan.flat is None else _rows(kernel, (plan.flat,), (n,), n, sizes),
        _rows(kernel, plan.strided, loop, n, sizes),
        not space,
    )


def launch(
    prepared: Prepared, inputs: Sequence[Any], grads: Mapping[Value, Any] | None = None
) -> dict[Value, Any]:
    """Enqueue ``prepared``'s launches on ``inputs`` (device arrays of the values' shapes, in
    ``plan.inputs`` order; host arrays and scalars are copied to the device).  ``grads`` maps
    each accumulated output to the existing device array its result is added into, in place (a
    missing one gets zeros, filled on the device).  Returns every output and reduction as a
    device array of the value's shape.  Launches are queued on the default stream: nothing is
    copied to or from the host, and nothing waits for the device."""
    kernel = prepared.kernel
    plan, settings = kernel.plan, kernel.settings
    # 0-d inputs as 1-d arrays of one element (the simulator has no 0-d device arrays)
    args = [_to_device(a) for a in inputs]
    args = [a.reshape(1) if a.ndim == 0 else a for a in args]
    outputs = []
    for v, shape in zip(plan.outputs, prepared.outputs):
        if v in plan.accumulate:
            buf = grads.get(v) if grads is not None else None
            outputs.append(_zeros(shape, v.dtype.np) if buf is None else buf)
        else:
            outputs.append(cuda.device_array(shape, v.dtype.np))
    results: dict[Value, Any] = dict(zip(plan.outputs, outputs))
    n = prepared.n
    if n == 0:  # nothing to launch: sums over nothing are zero
        for r, shape in zip(plan.reductions, prepared.reductions):
            results[r] = _zeros(shape, r.dtype.np)
        return results
    full = prepared.full
    rows = prepared.flat
    if rows is not None and (
        all(_flattenable(a) for a, f in zip(args, full) if f)
        and all(_flattenable(o) for o in outputs)
    ):
        loop: tuple[int, ...] = (n,)
        args = [a.reshape(n) if f else a for a, f in zip(args, full)]
        written = [o.reshape(n) for o in outputs]
    else:
        rows = prepared.strided
        loop = prepared.space
        written = [o.reshape(1) for o in outputs] if prepared.zero_dim else outputs
    finish = kernel.functions["finish_reduction"]
    threads = settings.threads
    for row in rows:
        out = written if row.writes_outputs else []
        if not row.reductions:
            row.fn[row.blocks, row.block](*loop, *args, *out)
            continue
        kept, slices = row.kept, row.slices
        reds = [cuda.device_array(kept, dtype) for _, dtype, _, _ in row.reductions]
        parts = [
            cuda.device_array(kept * slices if slices > 1 else 1, acc)
            for _, _, acc, _ in row.reductions
        ]
        row.fn[row.blocks, row.block](*loop, *args, *out, *reds, *parts, slices)
        for (r, _, _, shape), res, part in zip(row.reductions, reds, parts):
            if slices > 1:
                finish[row.finish_blocks, threads](part, res, kept, slices)
            results[r] = res.reshape(shape)
    return results


def run_kernel(
    kernel: CompiledKernel,
    env: Mapping[Value, Any],
    grads: Mapping[Value, Any] | None = None,
    sizes: Sequence[int] = (),
) -> dict[Value, Any]:
    """Launch one compiled kernel: the analogue of ``program._run_kernel`` for CUDA.

    ``env`` maps every input of the kernel (``kernel.plan.inputs``) to a device array of the
    value's shape (numba-cuda device arrays of any layout, or the simulator's; numpy arrays and
    scalars are copied to the device).  ``grads`` maps each accumulated output
    (``plan.accumulate``) to the existing device array its result is added into, in place (a
    missing one gets a zero array).  Returns every output and reduction of the kernel as a
    device array of the value's shape (for accumulated outputs, the array from ``grads``).
    Shapes with symbolic sizes are evaluated for the size vector ``sizes``.  A program prepares
    each kernel once per size vector instead (``prepare``, ``launch``)."""
    prepared = prepare(kernel, sizes)
    return launch(prepared, [env[v] for v in kernel.plan.inputs], grads)


# ---- ahead-of-time compilation ----------------------------------------------------------------


def launch_signatures(plan: CudaKernelPlan) -> list[tuple[str, tuple]]:
    """(function name, numba argument types) of every function ``run_kernel`` may launch for
    ``plan``, with the array layouts it passes (C-contiguous for the flat form and for arrays the
    launcher allocates, any layout for the strided form's inputs and accumulated outputs): for
    ``cuda.compile_ptx`` without a GPU."""
    from numba import types as nt  # (numba's type objects, for the PTX tests only)

    def array(dtype: Any, ndim: int, layout: str) -> Any:
        return nt.Array(numba.from_dtype(np.dtype(dtype)), ndim, layout)  # type: ignore[call-overload]

    space = plan.shape
    rank = max(len(space), 1)
    out = []
    for launch in ([plan.flat] if plan.flat else []) + list(plan.strided):
        sig: list[Any] = [nt.int64] * (1 if launch.flat else rank)
        for v in plan.inputs:
            ndim = max(len(v.shape), 1)  # 0-d inputs arrive as one-element 1-d arrays
            if launch.flat:
                sig.append(array(v.dtype.np, 1 if v.shape == space else ndim, "C"))
            else:
                sig.append(array(v.dtype.np, ndim, "A"))
        if launch.writes_outputs:
            for v in plan.outputs:
                layout = "A" if v in plan.accumulate and not launch.flat else "C"
                sig.append(array(v.dtype.np, 1 if launch.flat else rank, layout))
        if launch.reductions:
            sig += [array(r.dtype.np, 1, "C") for r in launch.reductions]
            sig += [array(_accumulator_dtype(r), 1, "C") for r in launch.reductions]
            sig.append(nt.int64)
        out.append((launch.name, tuple(sig)))
    for r in plan.reductions:
        sig = [array(_accumulator_dtype(r), 1, "C"), array(r.dtype.np, 1, "C"), nt.int64, nt.int64]
        out.append(("finish_reduction", tuple(sig)))
    return out
