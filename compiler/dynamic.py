"""Automatic dynamic sizes for whole steps (``compile(fn)``) and compiled modules
(``compile(model)``: the forward step and the backward graph, ``merge_entries``): after the
second distinct size, one recording serves every size.

A whole step is recorded with concrete sizes (``recording``).  When a function is recorded a
second time for a guard key that differs from an earlier one only in the sizes of its tensor
arguments, the two recordings are compared (``merge_with_earlier``): if they are the same
program except for integers (shapes and size attributes) and for constants that follow the
size, they are merged into one graph whose sizes are expressions over *symbols* -- the argument
dims that changed (equal changes share a symbol, PyTorch's duck sizing) -- each other differing
integer written as the one expression ``c * m + d`` (``m`` a symbol or a product of two, ``c``,
``d`` integers) that gives both recorded values, or else as a *derived* symbol, an integer
division of one argument size (``_Solver``).  Constants filled with one value are made at the
call's shape; constants a creation function made from sizes (``arange``, the masks of ``tril``
and ``triu``, ``eye``: its *recipe*, ``Tracer.created_as``, kept in ``Graph.recipes``) are computed
from their recipe at the call's sizes (``_remake``).  The merged graph is then checked against
every op's shape rule at a third, made-up size (``ir.verify``), and against every other
recording of the function at that recording's sizes (``Dynamic.predicts``), so an integer that
only looked like a size expression is caught where the evidence allows; any doubt keeps the
per-size recordings (the reason goes to the ``recompiles`` log).  Sizes of 0 and 1 are never a
symbol's (they broadcast): a recording at such a size stays on its own.

A call whose key matches the merged one with its dynamic dims masked (``masked``) replays it:
the symbols' values are read from its arguments (each at least 2, and equal where one symbol
stands for several dims; the derived symbols computed from them and their remainder guards
kept; no slice over a symbol running past the end of its input), and the program
(``program.Program``, which evaluates sizes per call) runs for them.  A random draw whose shape
changes with the size is drawn at the call's shape (dropout, ``rand``, ``randn``: their redo
takes a shape); any other such draw keeps one recording per size.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import numpy as np

from fusegrad import dtypes as _dt
from fusegrad.ops.registry import REGISTRY

from .ir import Graph, Value, verify
from .symbolic import Sym, add, has_sym, mul, substitute, symbol

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


class _Shaped:
    """A stand-in for a tensor argument of a given shape (``Dynamic.sizes_for``)."""

    __slots__ = ("_data",)

    def __init__(self, shape: tuple) -> None:
        self._data = _ShapeOnly(shape)


class _ShapeOnly:
    __slots__ = ("shape",)

    def __init__(self, shape: tuple) -> None:
        self.shape = shape


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
            if desc[0] is dict:  # (key, value) pairs, in the order ``Watch.args`` has them
                for _, value in desc[1]:
                    walk(value)
            else:
                for x in desc[1]:
                    walk(x)

    walk(key[2])
    walk(key[3])
    return found


class Dynamic:
    """A merged recording: the ``step.Step`` over symbols, where each symbol's value is read
    from (``places``: per symbol, its ``(argument, dim)`` pairs; then the *derived* symbols,
    ``s // q`` or ``ceil(s / q)`` of one of those, see ``_Solver``), and the masked key."""

    def __init__(self, step: Any, places: list[list[tuple[int, int]]], key: tuple) -> None:
        self.step = step  # a ``step.Step``, or a compiled module's ``module.AOTEntry``
        self.solver: Any = None  # (``merge``: the symbols' expressions, for a second graph)
        self.places = places
        self.dims = frozenset(p for group in places for p in group)
        self.key = masked(key, self.dims)
        # the guard keys of the two recordings merged (``merge``): it serves them too
        self.merged_keys: frozenset = frozenset()
        # slices over symbols (``x[:n]``, a causal mask's ``mask[:T, :T]``): numpy clamps a
        # slice that runs past the end, so their shapes hold only while they do not (checked
        # per call: a call past the end is recorded on its own)
        self.slices: list[Value] = []
        self.merged: Merged | None = None  # (``merge``: for ``predicts``)
        self.recorded: Graph | None = None  # the first recording's graph

    def sizes_for(self, shapes: list[tuple]) -> tuple | None:
        """The symbols' values for tensor arguments of ``shapes`` (None: not served)."""
        return self.sizes([_Shaped(shape) for shape in shapes])

    def predicts(self, key: tuple, graph: Graph) -> str | None:
        """None when the merged graph, at the sizes of a recording with guard key ``key`` and
        graph ``graph`` (another recording of the function), is that recording: the same
        shapes, size attributes and constants value for value; else the first difference, in
        words.  Two recordings fit many expressions (``n // 2`` is 2 at sizes 4 and 5); a third
        recording that the merged graph does not predict shows the fit to be a coincidence."""
        merged, recorded = self.merged, self.recorded
        sizes = self.sizes_for(arg_shapes(key))
        if merged is None or recorded is None or sizes is None:
            return None  # (not a size it serves: nothing to compare)
        return _predicts(merged, recorded, graph, sizes)

    def sizes(self, args: list) -> tuple | None:
        """The symbols' values for a call with tensor arguments ``args`` (None: see
        ``why_not``)."""
        sizes = []
        for group in self.places:
            (a, d), *rest = group
            n = args[a]._data.shape[d]
            if n < 2 or any(args[b]._data.shape[e] != n for b, e in rest):
                return None
            sizes.append(n)
        solver = self.solver
        if solver is not None and solver.derived:
            for j, q, r in solver.guards:
                if sizes[j] % q != r:
                    return None
            for j, q, e in solver.derived:
                n = (sizes[j] + e) // q
                if n < 2:
                    return None
                sizes.append(n)
        if self.slices and self._clamped(sizes) is not None:
            return None
        return tuple(sizes)

    def _clamped(self, sizes: list) -> str | None:
        """The first slice whose shape at ``sizes`` is not its expression's, in words."""
        meta = REGISTRY["getitem"].meta
        for v in self.slices:
            try:
                shape, _ = meta(
                    tuple(substitute(i.shape, sizes) for i in v.inputs),
                    tuple(i.dtype for i in v.inputs),
                    **{k: substitute(x, sizes) for k, x in v.attrs},
                )
            except Exception as e:  # noqa: BLE001 - an index out of range: not this program
                return f"%{v.id} = getitem: {e}"
            want = substitute(v.shape, sizes)
            if tuple(shape) != tuple(want):
                return (
                    f"%{v.id} = getitem slices past the end of its input "
                    f"{list(substitute(v.inputs[0].shape, sizes))}: {list(shape)}, not "
                    f"{list(want)}"
                )
        return None

    def why_not(self, args: list) -> str:
        """In words, why the call with tensor arguments ``args`` is not one this recording
        serves (its key matching the masked key): the recompile log's reason."""
        values = []
        for k, group in enumerate(self.places):
            (a, d), *rest = group
            n = args[a]._data.shape[d]
            if n < 2:
                return (
                    f"argument {a} dim {d} is {n}: sizes 0 and 1 are specialised (recorded on "
                    f"their own, as PyTorch does), not the symbolic s{k}"
                )
            for b, e in rest:
                if args[b]._data.shape[e] != n:
                    return (
                        f"argument {a} dim {d} ({n}) and argument {b} dim {e} "
                        f"({args[b]._data.shape[e]}) were equal in the recordings (one symbol, "
                        f"s{k}) but differ now"
                    )
            values.append(n)
        solver = self.solver
        if solver is not None:
            for j, q, r in solver.guards:
                if values[j] % q != r:
                    return (
                        f"s{j} = {values[j]} is not {r} modulo {q}, as it was in both "
                        f"recordings: divisions of s{j} by {q} rounded differently agreed "
                        "there, so which one the step computes is known only at such sizes"
                    )
            for k, (j, q, e) in enumerate(solver.derived, len(self.places)):
                n = (values[j] + e) // q
                if n < 2:
                    return (
                        f"s{k} = {solver.describe(k)} would be {n} (symbols stand for sizes >= 2)"
                    )
            sizes = list(values) + [(values[j] + e) // q for j, q, e in solver.derived]
        else:
            sizes = values
        clamped = self._clamped(sizes)
        if clamped is not None:
            return clamped
        return "the call is served by this recording"

    def describe(self) -> str:
        text = ", ".join(
            f"s{k} = " + " = ".join(f"argument {a} dim {d}" for a, d in group)
            for k, group in enumerate(self.places)
        )
        solver = self.solver
        if solver is not None:
            for k in range(len(self.places), len(self.places) + len(solver.derived)):
                text += f", s{k} = {solver.describe(k)}"
            for j, q, r in solver.guards:
                text += f" (for s{j} = {r} modulo {q})"
        return text


def merge_with_earlier(
    earlier: list[tuple[tuple, Any]], key: tuple, entry: Any, args: list, merge_fn: Any
) -> tuple[Dynamic | None, list[tuple[tuple, Mismatch]]]:
    """After a recording with guard key ``key``: ``entry`` merged (``merge_fn``: ``merge`` or
    ``merge_entries``) with the first of the ``earlier`` recordings (``(key, entry)`` pairs,
    oldest first) whose key differs from ``key`` only in the arguments' sizes and with which it
    is one program over sizes; also, per earlier recording tried, why it did not merge.  A
    recording at a size of 0 or 1 (specialised, as PyTorch specialises them) does not merge, but
    neither does it stop a later size from merging with another recording."""
    every = frozenset((a, d) for a, shape in enumerate(arg_shapes(key)) for d in range(len(shape)))
    failed: list[tuple[tuple, Mismatch]] = []
    for other_key, other in earlier:
        if other_key == key or type(other) is not type(entry):
            continue
        if masked(other_key, every) != masked(key, every):
            continue
        try:
            dyn = merge_fn(other, entry, other_key, key, args)
        except Mismatch as e:
            failed.append((other_key, e))
            continue
        # every other recording at sizes the merged one serves must be what it computes there
        why = None
        for third_key, third in earlier:
            if third_key in (key, other_key) or type(third) is not type(entry):
                continue
            if masked(third_key, every) == masked(key, every):
                why = dyn.predicts(third_key, getattr(third, "step", third).graph)
                if why is not None:
                    shapes = [list(x) for x in arg_shapes(third_key)]
                    why = f"at the sizes of the recording of arguments {shapes}, {why}"
                    break
        if why is None:
            return dyn, failed
        failed.append((other_key, Mismatch(f"the merged program is not every recording: {why}")))
    return None, failed


def why_concrete(failed: list[tuple[tuple, Mismatch]]) -> str:
    """The recompile log's words for recordings that did not merge (``merge_with_earlier``)."""
    if not failed:
        return "no earlier recording differs only in the arguments' sizes"
    reasons = [str(e) for _, e in failed]
    if len(set(reasons)) == 1:
        return reasons[0]
    return "; ".join(
        f"with the recording of arguments {[list(x) for x in arg_shapes(key)]}: {e}"
        for key, e in failed
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
                    raise Mismatch(
                        f"argument {a} dim {d} is {min(x, y)} in one recording (sizes 0 and 1 "
                        "are specialised: that recording serves that size alone)"
                    )
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
    merged = _merge_graphs(first.graph, second.graph, first.sources, solver)
    graph, mapping, draws = merged.graph, merged.mapping, merged.draws
    graph.hints = solver.hints()
    _check(graph, "merged sizes", solver)
    step = copy.copy(first)
    step.graph = graph
    step.draw_shapes = draws
    step.programs = type(first.programs)()
    # eager's value checks (index ranges) on the merged graph's values (``Step.run_checks``
    # evaluates their size attributes per call)
    step.checks = [(mapping[v], fn) for v, fn in first.checks]
    needed: set[Value] = set()  # (a constant made again has inputs of its own)
    stack = [v for v, _ in step.checks]
    while stack:
        v = stack.pop()
        if v not in needed:
            needed.add(v)
            stack.extend(v.inputs)
    step.check_plan = sorted(needed, key=lambda v: v.id)
    dynamic = Dynamic(step, places, key_a)
    dynamic.merged_keys = frozenset((key_a, key_b))
    dynamic.solver = solver
    dynamic.merged = merged
    dynamic.recorded = first.graph
    dynamic.slices = [v for v in graph.values if v.op == "getitem" and has_sym(v.attrs)]
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
    back = _merge_graphs(ga, gb, [("arg", None)] * inputs, solver).graph
    # (the backward may have derived a symbol the forward did not: both take every hint)
    back.hints = dynamic.step.graph.hints = solver.hints()
    _check(back, "merged backward", solver)
    entry = copy.copy(first)
    entry.step = dynamic.step
    entry.backward_graph = back
    entry.backward_programs = type(first.backward_programs)()
    entry.pruned = {}
    dynamic.step = entry
    return dynamic


def _check(graph: Graph, what: str, solver: _Solver) -> None:
    """``graph``'s invariants at its sizes, then at a made-up third size (``_Solver.probe``):
    an expression that fits the two recorded sizes but breaks an op's shape rule elsewhere
    raises ``Mismatch``."""
    verify(graph)
    hints = solver.probe()
    try:
        verify(Graph(graph.values, graph.constants, graph.effects, hints))
    except Exception as e:  # noqa: BLE001 - any broken invariant: not one program over sizes
        raise Mismatch(f"the {what} do not hold at another size {hints}: {e}") from None


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - arrays and the like: identity
        return a is b


class _Solver:
    """Integer pairs (one per recording) as expressions over the symbols.

    A pair is first fitted as ``c * m + d`` (``m`` a symbol or a product of two; the simplest
    fit, and two equally simple ones are a ``Mismatch``).  A pair no such expression fits may be
    an integer division of one argument size ``s`` (``x[: n // 2]``, ``ceil(n / 2)``): when the
    divisions ``(s + e) // q`` (``0 <= e < q``: ``e = 0`` is the floor, ``e = q - 1`` the
    ceiling) that give both values all divide by one ``q``, the pair becomes a *derived* symbol
    (``derived``: ``(base symbol, q, e)``), computed from its base on every call, and later pairs
    may use it as they use the others.  Several offsets ``e`` fit when both recorded sizes leave
    the same remainder modulo ``q`` (``n // 2`` and ``ceil(n / 2)`` at two even sizes): they agree
    on every size with that remainder and nothing says which the step computes elsewhere, so the
    recording then serves only such sizes (``guards``: ``(symbol, q, remainder)``); with
    different remainders several offsets are a ``Mismatch``.
    """

    def __init__(self, hints_a: tuple, hints_b: tuple) -> None:
        n = len(hints_a)
        self.base = n
        self.hints_a, self.hints_b = tuple(hints_a), tuple(hints_b)
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
        self.derived: list[tuple[int, int, int]] = []
        self.guards: list[tuple[int, int, int]] = []

    def hints(self) -> tuple:
        """The first recording's size vector: the argument sizes, then the derived symbols."""
        return self.hints_a + tuple(self._divide(self.hints_a[j], q, c) for j, q, c in self.derived)

    def probe(self) -> tuple:
        """A third size vector, unlike both recorded ones, for ``_check``: per symbol a size
        between the two recorded ones where there is one (a size beyond both may exceed what
        the step slices from a fixed buffer, a GPT's causal mask), else below them, else above,
        keeping the guards and derived symbols of at least 2."""
        probe = []
        for j in range(self.base):
            lo, hi = sorted((self.hints_a[j], self.hints_b[j]))
            middle = (lo + hi) / 2
            order = sorted(range(lo + 1, hi), key=lambda v: abs(v - middle))
            order += list(range(lo - 1, 1, -1)) + list(range(hi + 1, hi + 64))
            for v in order:
                if all(v % q == r for k, q, r in self.guards if k == j) and all(
                    self._divide(v, q, c) >= 2 for k, q, c in self.derived if k == j
                ):
                    probe.append(v)
                    break
            else:
                raise Mismatch(f"no third size of s{j} to check the merged graph at")
        return tuple(probe) + tuple(self._divide(probe[j], q, c) for j, q, c in self.derived)

    def describe(self, k: int) -> str:
        j, q, e = self.derived[k - self.base]
        if e == 0:
            return f"s{j} // {q}"
        return f"ceil(s{j} / {q})" if e == q - 1 else f"(s{j} + {e}) // {q}"

    @staticmethod
    def _divide(n: int, q: int, e: int) -> int:
        return (n + e) // q

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
            best = self._derive(x, y)
        else:
            fits.sort(key=lambda f: (f[0], f[1]))
            best = fits[0][2]
            if len(fits) > 1 and fits[1][:2] == fits[0][:2] and fits[1][2] != best:
                raise Mismatch(f"the size pair ({x}, {y}) fits several expressions")
        self.known[(x, y)] = best
        return best

    def _derive(self, x: int, y: int) -> Any:
        """``(x, y)`` as a new derived symbol (see the class docstring), or ``Mismatch``."""
        why = f"the size pair ({x}, {y}) is no expression of the arguments' sizes"
        if min(x, y) < 2:
            raise Mismatch(why)
        found: dict[tuple[int, int], list[int]] = {}
        for j in range(self.base):
            a, b = self.hints_a[j], self.hints_b[j]
            for q in range(2, max(a, b) // 2 + 1):
                for e in range(q):
                    if ((a + e) // q, (b + e) // q) == (x, y):
                        found.setdefault((j, q), []).append(e)
        if not found:
            raise Mismatch(why + " (nor an integer division of one)")
        if len(found) > 1:
            named = ", ".join(f"s{j} // {q}" for j, q in found)
            raise Mismatch(
                f"the size pair ({x}, {y}) fits divisions of the arguments' sizes by several "
                f"integers ({named}...): two recordings cannot tell which the step computes"
            )
        ((j, q), offsets), *_ = found.items()
        if len(offsets) > 1:
            a, b = self.hints_a[j], self.hints_b[j]
            if a % q != b % q:
                raise Mismatch(
                    f"the size pair ({x}, {y}) fits (s{j} + e) // {q} for e in {offsets}, which "
                    f"differ at sizes the recordings ({a}, {b}) do not tell apart"
                )
            # they agree on every size with the recorded remainder: serve only those
            self.guards.append((j, q, a % q))
        self.derived.append((j, q, offsets[0]))
        k = self.base + len(self.derived) - 1
        self.monomials.append((symbol(k), x, y))
        return symbol(k)

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


class Merged:
    """What ``_merge_graphs`` made: the graph over symbols, the first recording's values
    mapped to it, the random draws' shapes, and the constants made again from recipes."""

    def __init__(self, graph: Graph, mapping: dict, draws: dict, recipes: dict) -> None:
        self.graph = graph
        self.mapping = mapping
        self.draws = draws
        self.recipes = recipes


def _merge_graphs(ga: Graph, gb: Graph, sources: list, solver: _Solver) -> Merged:
    if len(ga.values) != len(gb.values) or len(ga.effects) != len(gb.effects):
        raise Mismatch("the recordings have different ops")
    out = Graph()
    mapping: dict[Value, Value] = {}
    draws: dict[int, tuple] = {}
    recipes: dict[Value, tuple] = {}  # constants of ``ga`` made again from their recipes
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
            recipe_a = ga.recipes.get(va.attr("index"))
            recipe_b = gb.recipes.get(vb.attr("index"))
            if ca.shape == cb.shape and np.array_equal(ca, cb):
                mapping[va] = out.constant(ca)
            elif recipe_a is not None and recipe_b is not None:
                # made by a creation function from sizes (before the uniform case: a
                # ``tril`` mask all True at both sizes is not at a third)
                recipe = solver.ints(recipe_a, recipe_b)
                mapping[va] = _remake(out, recipe, shape, va.dtype, va.origin, solver)
                recipes[va] = recipe
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
    out.recipes = {}  # (``_predicts`` reads the merged recipes from ``Merged``)
    return Merged(out, mapping, draws, recipes)


def _remake(
    out: Graph, recipe: tuple, shape: tuple, dtype: Any, origin: str, solver: _Solver
) -> Value:
    """The constant ``recipe`` describes (``Tracer.created_as``; its integers merged into
    expressions) as values of ``out`` computed at the call's sizes: ``arange`` as a running
    count (``cumsum`` of ones) scaled as eager scales it, a band (``tril``/``triu`` masks,
    ``eye``) by comparing column minus row indices with the offset.  Raises ``Mismatch`` where a
    number other than the length changes with the size, or where the length's expression is not
    the recipe's at the probe size."""
    kind = recipe[0]
    if kind == "arange":
        _, start, end, step = recipe
        if has_sym(start) or has_sym(step):
            raise Mismatch(f"an arange's start or step changes with the size ({recipe})")
        (n,) = shape
        for sizes in (solver.hints(), solver.probe()):
            # (eager's length: ``ops.creation.arange``)
            want = int(np.ceil((float(substitute(end, sizes)) - float(start)) / float(step)))
            if max(want, 0) != substitute(n, sizes):
                raise Mismatch(f"an arange's length {n} is not its recipe's {recipe}")
        index = _iota(out, n, origin)  # 0, 1, ..., n - 1 (int64)
        if dtype.is_floating_point or isinstance(start, float) or isinstance(step, float):
            # eager: (np.arange(n, float64) * step + start).astype(dtype)
            f64 = _dt.float64
            x = _op(out, "cast", (index,), {"dtype": f64}, (n,), origin)
            if step != 1:
                x = _op(out, "mul", (x, out.scalar(float(step), f64)), {}, (n,), origin)
            if start != 0:
                x = _op(out, "add", (x, out.scalar(float(start), f64)), {}, (n,), origin)
        else:
            i64, x = _dt.int64, index
            if step != 1:
                x = _op(out, "mul", (x, out.scalar(int(step), i64)), {}, (n,), origin)
            if start != 0:
                x = _op(out, "add", (x, out.scalar(int(start), i64)), {}, (n,), origin)
        if x.dtype is not dtype:
            x = _op(out, "cast", (x,), {"dtype": dtype}, (n,), origin)
        return x
    if kind == "band":
        _, rows, cols, offset, relation = recipe
        if tuple(shape) != (rows, cols) or has_sym(offset):
            raise Mismatch(f"a band matrix's offset changes with the size ({recipe})")
        i64 = _dt.int64
        r = _op(
            out, "reshape", (_iota(out, rows, origin),), {"shape": (rows, 1)}, (rows, 1), origin
        )
        c = _op(
            out, "reshape", (_iota(out, cols, origin),), {"shape": (1, cols)}, (1, cols), origin
        )
        shape = (rows, cols)
        r = _op(out, "broadcast_to", (r,), {"shape": shape}, shape, origin)
        c = _op(out, "broadcast_to", (c,), {"shape": shape}, shape, origin)
        d = _op(out, "sub", (c, r), {}, shape, origin)
        k = out.full(shape, int(offset), i64, origin)
        x = _op(out, relation, (d, k), {}, shape, origin)
        if x.dtype is not dtype:
            x = _op(out, "cast", (x,), {"dtype": dtype}, shape, origin)
        return x
    raise Mismatch(f"a constant made by {kind} differs beyond its size")


def _iota(out: Graph, n: Any, origin: str) -> Value:
    """0, 1, ..., n - 1 in int64: a running count of ones, less one."""
    i64 = _dt.int64
    ones = out.full((n,), 1, i64, origin)
    count = _op(out, "cumsum", (ones,), {"dim": 0}, (n,), origin)
    return _op(out, "sub", (count, out.full((n,), 1, i64, origin)), {}, (n,), origin)


def _op(out: Graph, name: str, inputs: tuple, attrs: dict, shape: tuple, origin: str) -> Value:
    """``name`` applied to ``inputs`` in ``out``, its dtype by the primitive's rule (at sizes
    2, 3, ...: a dtype does not depend on them; ``verify`` checks the shape at every size
    ``_check`` tries)."""
    hints = tuple(range(2, 2 + _symbols(inputs, attrs)))
    _, dtype = REGISTRY[name].meta(
        tuple(substitute(i.shape, hints) for i in inputs),
        tuple(i.dtype for i in inputs),
        **{k: substitute(v, hints) for k, v in attrs.items()},
    )
    return out.add(name, inputs, attrs, shape, dtype, origin)


def _symbols(inputs: tuple, attrs: dict) -> int:
    """How many symbols the shapes of ``inputs`` and ``attrs`` can name (one past the
    largest symbol number)."""
    top = -1
    for part in [i.shape for i in inputs] + list(attrs.values()):
        stack = [part]
        while stack:
            x = stack.pop()
            if type(x) is Sym:
                top = max([top] + [k for monomial, _ in x.terms for k in monomial])
            elif isinstance(x, (tuple, list)):
                stack.extend(x)
    return top + 1


def _predicts(merged: Merged, recorded: Graph, other: Graph, sizes: tuple) -> str | None:
    """``Dynamic.predicts``: ``merged`` (made from ``recorded`` and a second recording) at
    ``sizes`` against the recording ``other``."""
    if len(other.values) != len(recorded.values):
        return "it has other ops"
    for va, vo in zip(recorded.values, other.values):
        if va.op != vo.op:
            return f"value %{va.id} is {vo.op} there, not {va.op}"
        mv = merged.mapping[va]
        if va.op == "constant":
            co = other.constants[vo.attr("index")]
            recipe = merged.recipes.get(va)
            if recipe is not None:
                if not _equal(substitute(recipe, sizes), other.recipes.get(vo.attr("index"))):
                    return f"constant %{va.id} ({recipe[0]}) is made otherwise there"
            elif mv.op == "constant":
                cm = merged.graph.constants[mv.attr("index")]
                if cm.shape != co.shape or not np.array_equal(cm, co):
                    return f"constant %{va.id} differs there"
            else:  # filled with one value (``Graph.full``)
                fill = (mv.inputs[0] if mv.inputs else mv).attr("value")
                if co.shape != tuple(substitute(mv.shape, sizes)) or not (
                    co.size and _uniform(co) and _same(co.flat[0], fill)
                ):
                    return f"constant %{va.id} is not filled with {fill!r} there"
            continue
        shape = tuple(substitute(mv.shape, sizes))
        if shape != tuple(vo.shape):
            return f"value %{va.id} ({va.op}) has shape {list(vo.shape)} there, not {list(shape)}"
        if va.op != "input" and not _equal(substitute(mv.attrs, sizes), vo.attrs):
            return f"value %{va.id} ({va.op}) has attributes {vo.attrs} there"
    return None


def _equal(a: Any, b: Any) -> bool:
    """``a == b`` for nested attribute values, NaN equal to NaN."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return _same(a, b)


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
    "merge_with_earlier",
    "why_concrete",
]
