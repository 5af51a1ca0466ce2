"""What the numba CPU and CUDA emitters share: kernel geometry, scalar expressions, and the module
cache.

Both emitters (``numba_cpu``, ``numba_cuda``) read the same ``passes.fuse.Kernel`` objects and
compute every elementwise value from the same ``lowering.EXPRESSIONS`` template (the interpreter
too); they differ only in loop structure and in how scalar functions are spelled on their target
(``Spelling``).  This module holds the pieces that must agree between them:

* geometry: a reduction's keepdim target at the loop's rank (``reduction_target``), an input's
  broadcast pattern (``broadcast_dims``), whether a kernel runs as one flat loop (``is_flat``);
* ``literal`` (a scalar constant in generated source), ``format_expression`` (a template filled
  in) and ``expression`` (the scalar expression of one IR value, from the lowering table);
* the on-disk module cache: ``cache_dir``, ``module_name`` (a hash of the source and every codegen
  flag, the target included) and ``load_module``, which writes the source once, registers the
  module in ``sys.modules`` and imports it, so that numba's ``cache=True`` finds its machine code
  in the next process (``diskcache`` holds the mechanics: location, atomic writes, guarded numba
  caches, in-memory fallback).

Sizes never appear in generated source: shapes only decide *structure* (which dims are 1, i.e.
broadcast or reduced, and which are the same expression), which the cache key fixes
(docs/ARCHITECTURE.md,
contract 5).  Shapes are tuples of ints and ``symbolic.Sym``s; every helper here compares them
structurally.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from fusegrad.ops.registry import ScalarFunction

from ..ir import Value
from ..passes.fuse import Kernel
from . import diskcache
from .lowering import EXPRESSIONS, FUNCTIONS

# ---- geometry ---------------------------------------------------------------------------------


def padded(shape: tuple, rank: int) -> tuple:
    """``shape`` with leading 1s up to ``rank`` (numpy's broadcasting alignment)."""
    return (1,) * (rank - len(shape)) + tuple(shape)


def reduction_target(v: Value, space: tuple) -> tuple:
    """The keepdim shape of a fused reduction (``sum_to`` or ``sum``), at the rank of ``space``."""
    if v.op == "sum_to":
        return padded(tuple(v.attr("shape")), len(space))
    dim = v.attr("dim")
    if dim is None:
        return (1,) * len(space)
    return tuple(1 if i in dim else s for i, s in enumerate(space))


def reduced_dims(v: Value, space: tuple) -> tuple[int, ...]:
    """The dims of ``space`` a reduction sums over (size-1 dims of ``space`` are never reduced:
    summing over them is the identity)."""
    target = reduction_target(v, space)
    return tuple(d for d in range(len(space)) if target[d] == 1 and space[d] != 1)


def broadcast_dims(v: Value, space: tuple) -> tuple[bool, ...]:
    """Per dim of ``space``: is ``v`` (aligned to the right) broadcast along it?"""
    shape = padded(v.shape, len(space))
    return tuple(s == 1 and t != 1 for s, t in zip(shape, space))


def collapsed(shape: Sequence[int], groups: tuple | None) -> tuple[int, ...]:
    """``shape`` (at a kernel's full rank) with each group of dims (a generated CPU kernel's
    ``KernelPlan.groups``) multiplied into one."""
    if groups is None:
        return tuple(shape)
    return tuple(math.prod(shape[d] for d in g) for g in groups)


def is_single(shape: tuple) -> bool:
    """A shape of exactly one element for every size vector: every dim is the literal 1 (a
    symbolic dim is a size of at least 2, or an expression that need not be 1)."""
    return all(type(d) is int and d == 1 for d in shape)


def is_flat(kernel: Kernel) -> bool:
    """Every input full-size or a single element and every reduction full: one flat loop.
    Structural: decided from the shapes' expressions, so it holds for every size vector."""
    space = kernel.shape
    return all(
        i.shape == space or is_single(i.shape)
        for i in kernel.inputs + [v.inputs[0] for v in kernel.values if v.op == "broadcast_to"]
    ) and all(
        all(reduction_target(r, space)[d] == 1 for d in range(len(space)))
        for r in kernel.reductions
    )


# ---- scalar expressions -----------------------------------------------------------------------


def literal(value: Any, dtype: Any) -> str:
    """A typed scalar constant in generated source (``np.float32(0.5)``, ``np.inf``, ...)."""
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


@dataclass(frozen=True)
class Spelling:
    """How one target spells the scalar functions of lowering expressions (``lowering.FUNCTIONS``):
    ``float32`` and ``other`` map each function name to the callee used when the operands are
    float32 and when they are not.  Emitters build theirs with ``spelling``."""

    float32: Mapping[str, str]
    other: Mapping[str, str]


def spelling(
    target: Callable[[ScalarFunction], str], float32: Callable[[ScalarFunction], str | None]
) -> Spelling:
    """A target's ``Spelling``: ``target(fn)`` spells every function, ``float32(fn)`` overrides it
    for float32 operands where it returns a name."""
    other = {name: target(fn) for name, fn in FUNCTIONS.items()}
    fast = {name: float32(fn) or other[name] for name, fn in FUNCTIONS.items()}
    return Spelling(float32=fast, other=other)


def format_expression(
    op: str, operands: Sequence[str], spelling: Spelling, float32: bool, one: str, dtype: str
) -> str:
    """The ``lowering.EXPRESSIONS`` template of ``op`` with ``operands`` (scalar expressions)
    filled in, functions spelled for float32 operands or not, ``{one}`` and ``{dtype}``."""
    functions = spelling.float32 if float32 else spelling.other
    return EXPRESSIONS[op].format(*operands, one=one, dtype=dtype, **functions)


def expression(v: Value, read: Callable[[Value], str], spelling: Spelling) -> str:
    """The scalar expression computing kernel value ``v`` from its ``lowering.EXPRESSIONS``
    template (``broadcast_to`` is a read: ``read`` indexes its operand by the broadcast pattern);
    ``read`` gives each operand's expression.  Floating results are wrapped in their numpy type,
    so every value keeps its IR dtype."""
    if v.op == "broadcast_to":
        expr = read(v.inputs[0])
        return f"np.{v.dtype.name}({expr})" if v.dtype.is_floating_point else expr
    operand_dtype = v.inputs[0].dtype if v.inputs else v.dtype
    expr = format_expression(
        v.op,
        [read(a) for a in v.inputs],
        spelling,
        float32=operand_dtype.name == "float32",
        one=literal(1, v.dtype) if v.dtype.is_floating_point else "1",
        dtype=v.attr("dtype").name if v.op == "cast" else v.dtype.name,
    )
    return f"np.{v.dtype.name}({expr})" if v.dtype.is_floating_point else expr


def reader(
    members: set[Value] | frozenset[Value],
    inputs: Sequence[Value],
    read_input: Callable[[int, Value], str],
) -> Callable[[Value], str]:
    """The ``read`` of an emitter, for ``expression``: a kernel value is its local ``v{id}``, a
    scalar its literal, the ``k``-th kernel input whatever ``read_input(k, value)`` says (the
    indexing is the emitter's)."""

    def read(v: Value) -> str:
        if v in members:
            return f"v{v.id}"
        if v.op == "scalar":
            return literal(v.attr("value"), v.dtype)
        return read_input(inputs.index(v), v)

    return read


def describe(v: Value) -> str:
    """The comment naming an IR value (and the eager node it came from) in generated code."""
    return f"# %{v.id} = {v.op}" + (f"  # {v.origin}" if v.origin else "")


# ---- the on-disk module cache (``diskcache`` does the work) ------------------------------------


def cache_dir() -> str | None:
    """The directory generated modules are cached in: ``FUSEGRAD_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/fusegrad``, else ``~/.cache/fusegrad``; None when it cannot be used (code
    is then compiled in memory, after one warning).  Never a directory shared by all users."""
    return diskcache.cache_dir()


def module_name(source: str, flags: str) -> str:
    """The module's name: a hash of ``flags`` (every codegen setting the source does not show:
    emitter version, target, compiler version, digests of inlined helpers) and the source."""
    digest = hashlib.sha256((flags + "\n" + source).encode()).hexdigest()[:20]
    return f"fusegrad_generated_{digest}"


def load_module(
    source: str,
    flags: str,
    loaded: dict[str, ModuleType],
    entry_points: Collection[str] | None = None,
) -> tuple[ModuleType, str, bool]:
    """Import the module for ``source`` (writing it once); returns (module, path, was_on_disk).
    ``loaded`` is the caller's in-memory table of modules already imported in this process.
    An unreadable, corrupt or mismatched cache entry is rewritten, never fatal; without a usable
    cache directory the module is compiled in memory (``diskcache.load_module``)."""
    return diskcache.load_module(module_name(source, flags), source, loaded, entry_points)
