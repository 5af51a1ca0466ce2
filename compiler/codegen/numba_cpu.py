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
No fastmath flag that changes NaN/inf semantics is used: only ``reassoc``/``contract``/``nsz``,
which let LLVM vectorise sums and fuse multiply-adds.

Every line of a kernel computing an IR value carries a comment naming the value and the eager
node it came from.  ``load_module`` writes the source once under a name hashed from the source
and every codegen flag, registers it in ``sys.modules`` and imports it; numba's ``cache=True``
then stores the machine code beside it, so another process skips compilation.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from ..ir import Value
from ..passes.fuse import Kernel
from .cpu_helpers import MATH64
from .lowering import EXPRESSIONS, MATH

try:
    from . import fastmath
except ImportError:  # pragma: no cover - part of the package; float32 would use libm
    fastmath = None  # type: ignore[assignment]

CODEGEN_VERSION = 1
FASTMATH = ("reassoc", "contract", "nsz")


def _float32_math() -> dict[str, str]:
    """Primitive -> helper name for float32 (fast vectorisable helpers when available)."""
    helpers = dict(getattr(fastmath, "FLOAT32_HELPERS", {})) if fastmath is not None else {}
    out = {}
    for name in MATH:
        out[name] = f"fastmath.{helpers[name]}" if name in helpers else MATH64[name]
    return out


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


def _padded(shape: tuple, rank: int) -> tuple:
    return (1,) * (rank - len(shape)) + tuple(shape)


def _reduction_target(v: Value, space: tuple) -> tuple:
    """The keepdim shape of a fused reduction, at the rank of ``space``."""
    if v.op == "sum_to":
        return _padded(tuple(v.attr("shape")), len(space))
    dim = v.attr("dim")
    if dim is None:
        return (1,) * len(space)
    return tuple(1 if i in dim else s for i, s in enumerate(space))


def _broadcast_dims(v: Value, space: tuple) -> tuple[bool, ...]:
    shape = _padded(v.shape, len(space))
    return tuple(s == 1 and t != 1 for s, t in zip(shape, space))


def _literal(value: Any, dtype: Any) -> str:
    if dtype.name == "bool":
        return "True" if value else "False"
    if dtype.is_floating_point:
        v = float(value)
        text = (
            repr(v)
            if np.isfinite(v)
            else ("np.inf" if v > 0 else ("-np.inf" if v < 0 else "np.nan"))
        )
        return f"np.{dtype.name}({text})"
    return f"np.{dtype.name}({int(value)})"


def is_flat(kernel: Kernel) -> bool:
    """Every input full-size or a single element and every reduction full: one flat loop."""
    space = kernel.shape
    return all(
        i.shape == space or int(np.prod(i.shape)) == 1
        for i in kernel.inputs + [v.inputs[0] for v in kernel.values if v.op == "broadcast_to"]
    ) and all(
        all(_reduction_target(r, space)[d] == 1 for d in range(len(space)))
        for r in kernel.reductions
    )


def emit_kernel(kernel: Kernel, name: str) -> tuple[str, KernelPlan]:
    """The source of one kernel and its calling plan."""
    space = kernel.shape
    members = kernel.members()
    flat = is_flat(kernel)
    rank = 1 if flat else max(len(space), 1)
    loop_space = (int(np.prod(space)),) if flat else (space if space else (1,))
    idx = [f"i{d}" for d in range(rank)]
    full_out = [v for v in kernel.outputs if v not in kernel.reductions]
    reds = list(kernel.reductions)
    red_shapes = []
    full_red = []
    for r in reds:
        target = _reduction_target(r, space)
        full = all(t == 1 for t in target)
        full_red.append(full)
        red_shapes.append((1,) * rank if flat else target)
    args = [f"n{d}" for d in range(rank)]
    args += [f"in{k}" for k in range(len(kernel.inputs))]
    args += [f"out{k}" for k in range(len(full_out))]
    args += [f"red{k}" for k in range(len(reds))]
    math32 = _float32_math()
    lines = [
        # a sorted literal: a set's repr varies between processes (string hashing), and the
        # source must be byte-identical for the disk cache to hit
        '@numba.njit(cache=True, error_model="numpy", nogil=True, fastmath={'
        + ", ".join(repr(f) for f in sorted(FASTMATH))
        + "})",
        f"def {name}({', '.join(args)}):",
    ]
    for k, r in enumerate(reds):
        if full_red[k]:
            lines.append(f"    acc{k} = 0.0  # %{r.id} = {r.op} (full reduction, float64)")
    body_indent = "    " * (rank + 1)
    inner_loop_at = len(lines)
    for d in range(rank):
        if d == rank - 1:
            inner_loop_at = len(lines)  # row accumulators are declared just before this loop
        lines.append("    " * (d + 1) + f"for {idx[d]} in range(n{d}):")

    def read(v: Value) -> str:
        if v in members:
            return f"v{v.id}"
        if v.op == "scalar":
            return _literal(v.attr("value"), v.dtype)
        k = kernel.inputs.index(v)
        if flat:
            return f"in{k}[{'i0' if v.shape == space else '0'}]"
        b = _broadcast_dims(v, loop_space)
        pad = len(loop_space) - len(v.shape)
        sub = ", ".join("0" if (d < pad or b[d]) else idx[d] for d in range(rank))
        return f"in{k}[{sub}]"

    out_index = {v: k for k, v in enumerate(full_out)}
    for v in kernel.values:
        if v.op == "broadcast_to":
            expr = read(v.inputs[0])  # a broadcasting read: ``read`` indexes by the pattern
        else:
            fmt: dict[str, str] = {
                "dtype": v.attr("dtype").name if v.op == "cast" else v.dtype.name,
                "one": _literal(1, v.dtype) if v.dtype.is_floating_point else "1",
            }
            for m in MATH:
                operand_dtype = v.inputs[0].dtype if v.inputs else v.dtype
                fmt[m] = math32[m] if operand_dtype.name == "float32" else MATH64[m]
            expr = EXPRESSIONS[v.op].format(*[read(a) for a in v.inputs], **fmt)
        if v.dtype.is_floating_point:
            expr = f"np.{v.dtype.name}({expr})"
        origin = f"  # {v.origin}" if v.origin else ""
        lines.append(f"{body_indent}v{v.id} = {expr}  # %{v.id} = {v.op}{origin}")
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
        target = _reduction_target(r, space)
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
    return "\n".join(lines), plan


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


def cache_dir() -> str:
    """``FUSEGRAD_CACHE_DIR``, else the user cache directory (XDG), else a temp directory."""
    path = os.environ.get("FUSEGRAD_CACHE_DIR")
    if not path:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "fusegrad")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".write_test")
        with open(probe, "w") as fh:
            fh.write("ok")
        os.remove(probe)
    except OSError:
        path = os.path.join(tempfile.gettempdir(), "fusegrad-cache")
        os.makedirs(path, exist_ok=True)
    return path


_loaded: dict[str, ModuleType] = {}


def module_name(source: str) -> str:
    # the helpers are inlined: numba's cache cannot see them change, so their digest is a flag
    helpers = getattr(fastmath, "SOURCE_DIGEST", "none") if fastmath is not None else "none"
    flags = f"v{CODEGEN_VERSION}|{FASTMATH}|numba{_numba_version()}|helpers{helpers}"
    digest = hashlib.sha256((flags + "\n" + source).encode()).hexdigest()[:20]
    return f"fusegrad_generated_{digest}"


def _numba_version() -> str:
    import numba

    return numba.__version__


def load_module(source: str) -> tuple[ModuleType, str, bool]:
    """Import the module for ``source`` (writing it once); returns (module, path, was_on_disk).
    A corrupt or unreadable cache file is rewritten, never fatal."""
    name = module_name(source)
    path = os.path.join(cache_dir(), name + ".py")
    if name in _loaded:
        return _loaded[name], path, True
    on_disk = False
    try:
        with open(path) as fh:
            on_disk = fh.read() == source
    except OSError:
        on_disk = False
    if not on_disk:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(source)
        os.replace(tmp, path)  # atomic: concurrent writers never leave a torn file
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before execution: numba's cache locates functions by module
    try:
        spec.loader.exec_module(module)
    except Exception:
        sys.modules.pop(name, None)
        raise
    _loaded[name] = module
    return module, path, on_disk
