"""Automatic dynamic sizes for whole steps (``compile(fn)``) and compiled modules
(``compile(model)``: the forward step and the backward graph, ``merge_entries``): after the
second distinct size, one recording serves every size.

A whole step is recorded with concrete sizes (``recording``).  When a function is recorded a
second time for a guard key that differs from an earlier one only in the sizes of its tensor
arguments, the two recordings are compared: if they are the same program except for integers
(shapes and size attributes) and for constants filled with one value, they are merged into one
graph whose sizes are expressions over *symbols* -- the argument dims that changed (equal
changes share a symbol, PyTorch's duck sizing) -- each other differing integer written as the
one expression ``c * m + d`` (``m`` a symbol or a product of two, ``c``, ``d`` integers) that
gives both recorded values.  The merged graph is then checked against every op's shape rule at
a third, made-up size (``ir.verify``), so an integer that only looked like a size expression is
caught; any doubt keeps the per-size recordings (the reason goes to the ``recompiles`` log).

A call whose key matches the merged one with its dynamic dims masked (``masked``) replays it:
the symbols' values are read from its arguments (each at least 2, and equal where one symbol
stands for several dims), and the program (``program.Program``, which evaluates sizes per call)
runs for them.  A random draw whose shape changes with the size is drawn at the call's shape
(dropout, ``rand``, ``randn``: their redo takes a shape); any other such draw keeps one
recording per size.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import numpy as np

from .ir import Graph, Value, verify
from .symbolic import add, has_sym, mul, symbol

# how far the made-up size used to check the merged graph lies beyond the recorded ones
_PROBE_OFFSET = 7

# ``mark_dynamic`` / ``mark_static``: per tensor (by id, with a weak reference: a tensor's ``==``
# is elementwise, so it cannot be a weak dictionary's key), its dims marked each way
_marks: dict[int, tuple[weakref.ref, dict[str, set]]] = {}


def mark_dynamic(t: Any, dim: int | list | tuple) -> None:
    """Say that ``t``'s dim ``dim`` (or dims) changes from call to call: when a whole step
    taking ``t`` cannot be merged over that dim's sizes, ``CompilationError`` says why (as
    PyTorch raises when a dim marked dynamic is specialised) instead of the step recording per
    size.  Sizes become symbolic from the second distinct size either way."""
    _mark(t, dim, "dynamic")


def mark_static(t: Any, dim: int | list | tuple) -> None:
    """Keep ``t``'s dim ``dim`` (or dims) concrete: a whole step taking ``t`` is recorded once
    per size of that dim, never merged over it."""
    _mark(t, dim, "static")


def _mark(t: Any, dim: int | list | tuple, how: str) -> None:
    dims = [dim] if isinstance(dim, int) else list(dim)
    ndim = len(t.shape)
    for d in dims:
        if not -ndim <= d < ndim:
            raise IndexError(
                f"mark_{how}: dim {d} is out of range for a tensor of shape {list(t.shape)}"
            )
    key = id(t)
    found = _marks.get(key)
    if found is None or found[0]() is not t:
        found = _marks[key] = (
            weakref.ref(t, lambda _, key=key: _marks.pop(key, None)),
            {"dynamic": set(), "static": set()},
        )
    marks = found[1]
    for d in dims:
        d %= ndim
        marks[how].add(d)
        marks["static" if how == "dynamic" else "dynamic"].discard(d)


def marked(t: Any, how: str) -> set:
    """The dims of ``t`` marked ``how`` ("dynamic" or "static")."""
    found = _marks.get(id(t))
    return set() if found is None or found[0]() is not t else found[1][how]


class Mismatch(Exception):
    """The two recordings are not one program over sizes (``str(e)``: where)."""


def masked(key: tuple, dims: frozenset) -> tuple:
    """``key`` with the sizes of the argument dims in ``dims`` (``(argument, dim)`` pairs)
    left out: the key of every call a merged recording serves."""
    parts = list(key)
    counter = [0]

    def mask(desc: Any) -> Any:
        if isinstance(desc, tuple) and desc and desc[0] == "T" and len(desc) == 5:
            k = counter[0]
            counter[0] += 1
            shape = tuple(None if (k, d) in dims else n for d, n in enumerate(desc[1]))
            return ("T", shape, *desc[2:])
        if isinstance(desc, tuple) and len(desc) == 2 and isinstance(desc[1], tuple):
            return (desc[0], tuple(mask(x) for x in desc[1]))
        return desc

    parts[2] = mask(parts[2])
    parts[3] = mask(parts[3])
    return tuple(parts)


def arg_shapes(key: tuple) -> list[tuple]:
    """The shapes of the tensor arguments described in ``key``, in order."""
    found: list[tuple] = []

    def walk(desc: Any) -> None:
        if isinstance(desc, tuple) and desc and desc[0] == "T" and len(desc) == 5:
            found.append(desc[1])
        elif isinstance(desc, tuple) and len(desc) == 2 and isinstance(desc[1], tuple):
            for x in desc[1]:
                walk(x)

    walk(key[2])
    walk(key[3])
    return found


class Dynamic:
    """A merged recording: the ``step.Step`` over symbols, where each symbol's value is read
    from (``places``: per symbol, its ``(argument, dim)`` pairs), and the masked key."""

    def __init__(self, step: Any, places: list[list[tuple[int, int]]], key: tuple) -> None:
        self.step = step  # a ``step.Step``, or a compiled module's ``module.AOTEntry``
        self.solver: Any = None  # (``merge``: the symbols' expressions, for a second graph)
        self.places = places
        self.dims = frozenset(p for group in places for p in group)
        self.key = masked(key, self.dims)

    def sizes(self, args: list) -> tuple | None:
        """The symbols' values for a call with tensor arguments ``args`` (None: a dim shared by
        one symbol differs, or a size below 2)."""
        sizes = []
        for group in self.places:
            (a, d), *rest = group
            n = args[a]._data.shape[d]
            if n < 2 or any(args[b]._data.shape[e] != n for b, e in rest):
                return None
            sizes.append(n)
        return tuple(sizes)

    def describe(self) -> str:
        return ", ".join(
            f"s{k} = " + " = ".join(f"argument {a} dim {d}" for a, d in group)
            for k, group in enumerate(self.places)
        )


def merge(first: Any, second: Any, key_a: tuple, key_b: tuple, args: list = ()) -> Dynamic:  # type: ignore[assignment]
    """One step over symbols from recordings ``first`` and ``second`` (``step.Step``s whose keys
    differ only in argument sizes; ``args``: the second call's tensor arguments, for their
    ``mark_static`` dims); raises ``Mismatch``."""
    shapes_a, shapes_b = arg_shapes(key_a), arg_shapes(key_b)
    if len(shapes_a) != len(shapes_b) or any(len(x) != len(y) for x, y in zip(shapes_a, shapes_b)):
        raise Mismatch("the arguments' ranks differ")
    # the symbols: argument dims that changed, equal changes sharing one
    pairs: dict[tuple[int, int], int] = {}
    places: list[list[tuple[int, int]]] = []
    for a, (sa, sb) in enumerate(zip(shapes_a, shapes_b)):
        for d, (x, y) in enumerate(zip(sa, sb)):
            if x != y:
                if a < len(args) and d in marked(args[a], "static"):
                    raise Mismatch(f"argument {a} dim {d} is marked static")
                if min(x, y) < 2:
                    raise Mismatch(f"argument {a} dim {d} is {min(x, y)} in one recording")
                k = pairs.setdefault((x, y), len(pairs))
                if k == len(places):
                    places.append([])
                places[k].append((a, d))
    if not places:
        raise Mismatch("no argument size changed")
    hints_a = tuple(x for x, _ in pairs)
    hints_b = tuple(y for _, y in pairs)
    solver = _Solver(hints_a, hints_b)
    for name in ("prefix", "suffix", "leaf_sources", "bumps", "n_outputs", "spec"):
        if not _same(getattr(first, name), getattr(second, name)):
            raise Mismatch(f"the recordings' {name} differ")
    if len(first.sources) != len(second.sources):
        raise Mismatch("the recordings read different inputs")
    for sa, sb in zip(first.sources, second.sources):
        if sa[0] != sb[0] or (sa[0] in ("arg", "ext") and sa[1] is not sb[1] and sa[1] != sb[1]):
            raise Mismatch("the recordings read different inputs")
    graph, mapping, draws = _merge_graphs(first.graph, second.graph, first.sources, solver)
    graph.hints = hints_a
    _check(graph, "merged sizes")
    step = copy.copy(first)
    step.graph = graph
    step.draw_shapes = draws
    step.programs = type(first.programs)()
    # eager's value checks (index ranges) on the merged graph's values (``Step.run_checks``
    # evaluates their size attributes per call)
    step.checks = [(mapping[v], fn) for v, fn in first.checks]
    step.check_plan = sorted((mapping[v] for v in first.check_plan), key=lambda v: v.id)
    dynamic = Dynamic(step, places, key_a)
    dynamic.solver = solver
    return dynamic


def merge_entries(first: Any, second: Any, key_a: tuple, key_b: tuple, args: list) -> Dynamic:
    """One compiled module's recording (``module.AOTEntry``) over symbols from two: the forward
    steps merged as ``merge`` merges whole steps, the backward graphs with the same symbols;
    raises ``Mismatch``."""
    for name in ("saved_plan", "root_slots", "version_checks", "n_outputs", "levels", "n_inputs"):
        if not _same(getattr(first, name), getattr(second, name)):
            raise Mismatch(f"the recordings' {name} differ")
    if len(first.input_sources) != len(second.input_sources) or any(
        ka != kb or (ra is not rb and ra != rb)
        for (ka, ra), (kb, rb) in zip(first.input_sources, second.input_sources)
    ):
        raise Mismatch("the recordings' backward edges differ")
    dynamic = merge(first.step, second.step, key_a, key_b, args)
    solver = dynamic.solver
    ga, gb = first.backward_graph, second.backward_graph
    inputs = len(ga.inputs_of("arg"))
    back, _, _ = _merge_graphs(ga, gb, [("arg", None)] * inputs, solver)
    back.hints = dynamic.step.graph.hints
    _check(back, "merged backward")
    entry = copy.copy(first)
    entry.step = dynamic.step
    entry.backward_graph = back
    entry.backward_programs = type(first.backward_programs)()
    entry.pruned = {}
    dynamic.step = entry
    return dynamic


def _check(graph: Graph, what: str) -> None:
    """``graph``'s invariants at its sizes, then at a made-up third size: an expression that
    fits the two recorded sizes but breaks an op's shape rule elsewhere raises ``Mismatch``."""
    verify(graph)
    hints = tuple(h + _PROBE_OFFSET for h in graph.hints)
    try:
        verify(Graph(graph.values, graph.constants, graph.effects, hints))
    except Exception as e:  # noqa: BLE001 - any broken invariant: not one program over sizes
        raise Mismatch(f"the {what} do not hold at another size: {e}") from None


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - arrays and the like: identity
        return a is b


class _Solver:
    """Integer pairs (one per recording) as expressions over the symbols."""

    def __init__(self, hints_a: tuple, hints_b: tuple) -> None:
        n = len(hints_a)
        monomials: list[tuple[Any, int, int]] = [
            (symbol(k), hints_a[k], hints_b[k]) for k in range(n)
        ]
        for i in range(n):
            for j in range(i, n):
                monomials.append(
                    (mul(symbol(i), symbol(j)), hints_a[i] * hints_a[j], hints_b[i] * hints_b[j])
                )
        self.monomials = monomials
        self.known: dict[tuple[int, int], Any] = {}

    def __call__(self, x: int, y: int) -> Any:
        if x == y:
            return x
        found = self.known.get((x, y))
        if found is not None:
            return found
        fits = []
        for m, ma, mb in self.monomials:
            if ma == mb or (y - x) % (mb - ma):
                continue
            c = (y - x) // (mb - ma)
            d = x - c * ma
            if c != 0:
                fits.append((d != 0, abs(c) != 1, add(mul(c, m), d) if d else mul(c, m)))
        if not fits:
            raise Mismatch(f"the size pair ({x}, {y}) is no expression of the arguments' sizes")
        fits.sort(key=lambda f: (f[0], f[1]))
        best = fits[0]
        if len(fits) > 1 and fits[1][:2] == best[:2] and fits[1][2] != best[2]:
            raise Mismatch(f"the size pair ({x}, {y}) fits several expressions")
        self.known[(x, y)] = best[2]
        return best[2]

    def ints(self, a: Any, b: Any) -> Any:
        """``a`` and ``b`` (nested tuples, lists, ints, other values) as one value with
        expressions where their integers differ."""
        if isinstance(a, bool) or isinstance(b, bool):
            if a != b:
                raise Mismatch(f"{a!r} and {b!r} differ")
            return a
        if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
            return self(int(a), int(b))
        if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
            merged = [self.ints(x, y) for x, y in zip(a, b)]
            return tuple(merged) if isinstance(a, tuple) else merged
        if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
            return a
        if not _same(a, b):
            raise Mismatch(f"{a!r} and {b!r} differ")
        return a


def _merge_graphs(
    ga: Graph, gb: Graph, sources: list, solver: _Solver
) -> tuple[Graph, dict[Value, Value], dict[int, tuple]]:
    if len(ga.values) != len(gb.values) or len(ga.effects) != len(gb.effects):
        raise Mismatch("the recordings have different ops")
    out = Graph()
    mapping: dict[Value, Value] = {}
    draws: dict[int, tuple] = {}
    for va, vb in zip(ga.values, gb.values):
        if va.op != vb.op or va.dtype is not vb.dtype:
            raise Mismatch(f"value %{va.id}: {va.op} vs {vb.op}")
        if [i.id for i in va.inputs] != [i.id for i in vb.inputs]:
            raise Mismatch(f"value %{va.id} ({va.op}) has other inputs")
        shape = solver.ints(va.shape, vb.shape)
        if va.op == "input":
            index = va.attr("index")
            kind = sources[index][0]
            if kind not in ("arg", "ext", "scalar", "cast", "grad") and has_sym(shape):
                if not getattr(sources[index][1], "resizable", False):
                    raise Mismatch("a random draw's shape changes with the size")
                draws[index] = shape  # (drawn at the call's sizes: ``Step._run``)
            mapping[va] = out.input(va.attr("kind"), index, shape, va.dtype)
        elif va.op == "constant":
            ca, cb = ga.constants[va.attr("index")], gb.constants[vb.attr("index")]
            if ca.shape == cb.shape and np.array_equal(ca, cb):
                mapping[va] = out.constant(ca)
            elif (
                ca.size
                and cb.size
                and _uniform(ca)
                and _uniform(cb)
                and _same(ca.flat[0], cb.flat[0])
            ):
                mapping[va] = out.full(shape, ca.flat[0].item(), va.dtype, va.origin)
            else:
                raise Mismatch(f"constant %{va.id} differs beyond its size")
        else:
            attrs = tuple((k, solver.ints(x, y)) for (k, x), (_, y) in zip(va.attrs, vb.attrs))
            if [k for k, _ in va.attrs] != [k for k, _ in vb.attrs]:
                raise Mismatch(f"value %{va.id} ({va.op}) has other attributes")
            mapping[va] = out.add(
                va.op, tuple(mapping[i] for i in va.inputs), attrs, shape, va.dtype, va.origin
            )
    for (kind, slot, va), (kind_b, slot_b, vb) in zip(ga.effects, gb.effects):
        if kind != kind_b or slot != slot_b or va.id != vb.id:
            raise Mismatch("the recordings' effects differ")
        out.effects.append((kind, slot, mapping[va]))
    return out, mapping, draws


def _uniform(a: np.ndarray) -> bool:
    first = a.flat[0]
    return bool(np.all(a == first)) if first == first else bool(np.all(np.isnan(a)))


__all__ = [
    "Dynamic",
    "Mismatch",
    "mark_dynamic",
    "mark_static",
    "masked",
    "merge",
    "merge_entries",
]
