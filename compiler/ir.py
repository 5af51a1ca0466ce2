"""The backward IR: a ``Graph`` of ``Value``s, each an op applied to earlier values.

A value is a primitive of the op registry (``exp``, ``mul``, ``sum_to``, ``matmul``, ...) or one
of the IR's own ops:

``input``      a runtime argument of the program: ``attrs["kind"]`` is ``root`` (a root
               gradient), ``saved`` (a tensor saved by a node), ``grad`` (a leaf's existing
               ``.grad``) or ``arg`` (an input of a whole-step program: an argument, parameter,
               buffer or random draw, see ``step``); ``attrs["index"]`` is its position in that
               list;
``constant``   a tensor created inside a derivative rule (``zeros_like(g)``, index ranges):
               ``attrs["index"]`` points into ``Graph.constants``;
``scalar``     a Python number inside a rule (``1.0 - out * out``), ``attrs["value"]``;
``hook``, ``hook_output``, ``store_grad``, ``unpack_saved``: user hooks (tensor, node and
               saved-tensor unpack hooks) as opaque steps and ``.grad`` writes at their eager
               positions (only in graphs whose backward runs user hooks).

The graph's *effects* say what the program does with its results: ``("grad", leaf, value)``
accumulates into leaf ``leaf``'s ``.grad`` (in place when it exists, keeping its identity),
``("input_grad", position, value)`` does the same for a non-leaf listed in
``backward(inputs=...)``, and ``("capture", position, value)`` returns a gradient for
``autograd.grad`` (or a whole step's output), ``("write", index, value)`` copies the value
into the array of ``arg`` input ``index`` (a whole step's in-place write to an argument,
parameter or buffer), and ``("check", (node, output), value)`` (anomaly mode) raises eager's
NaN error for walk node ``node`` when the value holds a NaN, before any other effect.

Values are interned: asking for the same op on the same inputs with the same attributes returns
the existing value, so common subexpressions are shared at construction.  Shapes and size
attributes are ints or ``symbolic.Sym`` expressions over the call's size vector (``sN`` when
printed); ``Graph.hints`` is the size vector of the capture.  Generated code takes sizes as
runtime arguments; ``program`` evaluates the expressions for each call.
``verify`` checks a graph's invariants (run after every pass in tests); ``format_graph`` prints
it one value per line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fusegrad import dtypes as _dt
from fusegrad.ops.registry import REGISTRY, DataDependentShape

from .symbolic import Sym, format_expr, substitute

IR_OPS = ("input", "constant", "scalar")
# side-effecting steps, present only when user hooks run during the backward (they keep eager
# order): ``hook`` calls a user hook (inputs: the tensors it is given; ``attrs["site"]`` says
# which), ``hook_output`` is what it returned for one slot (or the slot's old value when it
# returned None), ``store_grad`` performs one ``.grad`` write at its eager position,
# ``unpack_saved`` calls the unpack hook of saved tensor ``attrs["saved"]`` (packed by
# saved-tensor hooks) and is the tensor it returns; ``function`` runs the eager ``backward`` of
# custom Function node ``attrs["node"]`` (one it cannot trace) on the gradients it is given,
# and ``function_output`` (input: that step) is its gradient for input ``attrs["index"]``
EFFECT_OPS = ("hook", "store_grad", "unpack_saved", "function")
# a whole step's data-parallel gradient averaging (DistributedDataParallel's buckets, ``step``):
# ``allreduce_start`` copies its input (a bucket's gradients, flat) and starts a non-blocking
# allreduce of the copy over ``attrs["group"]``; ``allreduce_wait`` (inputs: that start) waits
# for it and is the sum divided by ``attrs["world"]``.  Kernels run between the two.
COLLECTIVE_OPS = ("allreduce_start", "allreduce_wait")
IR_OWN_OPS = IR_OPS + EFFECT_OPS + COLLECTIVE_OPS + ("hook_output", "function_output")


def freeze(value: Any) -> Any:
    """A hashable, comparable form of an attribute value (lists and dicts become tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, slice):
        return ("slice", value.start, value.stop, value.step)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _scalar_identity(attrs: dict | tuple, dtype: _dt.dtype) -> tuple:
    """What tells two scalars apart beyond their (equal-comparing) values: the dtype (1.0 in
    float32 read by a float32 op is not the float64 1.0, which would make the op compute in
    float64) and, for floats, the bits (-0.0 == 0.0, and True == 1 == 1.0)."""
    value = dict(attrs)["value"] if isinstance(attrs, tuple) else attrs["value"]
    floating = isinstance(value, (float, np.floating))
    bits = float(value).hex() if floating else (type(value).__name__, value)
    return (dtype.name, bits)


def _dim(d: Any) -> Any:
    return d if type(d) is Sym else int(d)


@dataclass(frozen=True, slots=True, eq=False)
class Value:
    """One IR value.  Identity is the value itself (``eq=False``): interning makes equal
    computations the same object."""

    id: int
    op: str
    inputs: tuple[Value, ...]
    attrs: tuple[tuple[str, Any], ...]
    shape: tuple[Any, ...]  # ints and ``Sym``s
    dtype: _dt.dtype
    origin: str = ""  # the eager node whose rule produced it (for comments and reports)

    def attr(self, name: str, default: Any = None) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    @property
    def kind(self) -> str:
        prim = REGISTRY.get(self.op)
        return prim.kind if prim is not None else self.op

    def __repr__(self) -> str:
        return f"%{self.id}"


@dataclass
class Graph:
    values: list[Value] = field(default_factory=list)
    constants: list[np.ndarray] = field(default_factory=list)
    effects: list[tuple[str, Any, Value]] = field(default_factory=list)  # (slot: int or tuple)
    hints: tuple[int, ...] = ()  # the size vector at capture: symbol k stood for hints[k]
    # constant index -> how a creation function made it from numbers and sizes alone
    # (``Tracer.created_as``: ``arange``, ``tril``/``triu`` masks, ``eye``), so that ``dynamic`` can
    # make it again at other sizes; None where two recipes made the same array
    recipes: dict[int, tuple | None] = field(default_factory=dict, repr=False)
    _interned: dict = field(default_factory=dict, repr=False)

    def add(
        self,
        op: str,
        inputs: tuple,
        attrs: dict | tuple,
        shape: tuple,
        dtype: _dt.dtype,
        origin: str = "",
    ) -> Value:
        frozen = (
            attrs
            if isinstance(attrs, tuple)
            else tuple(sorted((k, freeze(v)) for k, v in attrs.items()))
        )
        # the dtype too (a scalar 1.0 in float32 and in float64 are two values) and, for
        # scalars, the bits (-0.0 == 0.0, and True == 1 == 1.0)
        key: tuple = (op, tuple(v.id for v in inputs), frozen, dtype)
        if op == "scalar":
            key += _scalar_identity(attrs, dtype)
        if op != "input":
            found = self._interned.get(key)
            if found is not None:
                return found
        value = Value(
            len(self.values),
            op,
            tuple(inputs),
            frozen,
            tuple(_dim(s) for s in shape),
            dtype,
            origin,
        )
        self.values.append(value)
        if op != "input":
            self._interned[key] = value
        return value

    def input(self, kind: str, index: int, shape: tuple, dtype: _dt.dtype) -> Value:
        return self.add("input", (), {"kind": kind, "index": index}, shape, dtype)

    def scalar(self, value: float | int | bool, dtype: _dt.dtype) -> Value:
        return self.add("scalar", (), {"value": value}, (), dtype)

    def full(
        self, shape: tuple, value: float | int | bool, dtype: _dt.dtype, origin: str = ""
    ) -> Value:
        """A tensor of ``shape`` filled with ``value``: one scalar, broadcast (so that kernels
        read it as a broadcast, never from memory)."""
        scalar = self.scalar(value, dtype)
        if not shape:
            return scalar
        return self.add("broadcast_to", (scalar,), {"shape": shape}, shape, dtype, origin)

    def constant(self, array: np.ndarray) -> Value:
        # identical constant arrays (e.g. the same zeros) are stored once
        for i, c in enumerate(self.constants):
            if c.shape == array.shape and c.dtype == array.dtype and np.array_equal(c, array):
                return self.add(
                    "constant", (), {"index": i}, array.shape, _dt.from_numpy_dtype(array.dtype)
                )
        self.constants.append(np.array(array, copy=True))
        return self.add(
            "constant",
            (),
            {"index": len(self.constants) - 1},
            array.shape,
            _dt.from_numpy_dtype(array.dtype),
        )

    def at_sizes(self, sizes: tuple) -> Graph:
        """This graph with every shape and size attribute evaluated for the size vector
        ``sizes``: the same values (ids, ops, inputs, effects, constants), no symbol left
        (``Program.per_size``: native code needs literal sizes).  Interning is not carried
        over: the copy is for running, not for building on."""
        out = Graph(constants=self.constants, effects=[], hints=(), recipes=self.recipes)
        made: dict[Value, Value] = {}
        for v in self.values:
            made[v] = Value(
                v.id,
                v.op,
                tuple(made[i] for i in v.inputs),
                substitute(v.attrs, sizes),
                tuple(int(d) for d in substitute(v.shape, sizes)),
                v.dtype,
                v.origin,
            )
            out.values.append(made[v])
        out.effects = [(kind, slot, made[v]) for kind, slot, v in self.effects]
        return out

    def inputs_of(self, kind: str) -> list[Value]:
        return sorted(
            (v for v in self.values if v.op == "input" and v.attr("kind") == kind),
            key=lambda v: v.attr("index"),
        )

    def users(self) -> dict[Value, list[Value]]:
        out: dict[Value, list[Value]] = {v: [] for v in self.values}
        for v in self.values:
            for i in v.inputs:
                out[i].append(v)
        return out


class VerifyError(AssertionError):
    """A graph broke an IR invariant."""


def verify(graph: Graph) -> None:
    """Check the invariants every pass must keep: values in topological order with ids equal to
    positions, inputs defined earlier, primitives known with shapes and dtypes equal to their
    shape/dtype rule (evaluated at the capture's sizes, ``Graph.hints``), IR ops well formed,
    effects pointing at values of the graph."""
    hints = graph.hints
    index: dict[Value, int] = {}
    for pos, v in enumerate(graph.values):
        if v.id != pos:
            raise VerifyError(f"value at position {pos} has id {v.id}")
        for i in v.inputs:
            if index.get(i) is None or index[i] >= pos:
                raise VerifyError(f"%{v.id} = {v.op} uses %{i.id}, which is not defined before it")
        index[v] = pos
        if v.op in COLLECTIVE_OPS:
            if len(v.inputs) != 1 or (v.op == "allreduce_wait") != (
                v.inputs[0].op == "allreduce_start"
            ):
                raise VerifyError(f"%{v.id}: {v.op} takes one input (a start takes the values)")
            continue
        if v.op == "function_output" and (len(v.inputs) != 1 or v.inputs[0].op != "function"):
            raise VerifyError(f"%{v.id}: function_output takes (function,)")
        if v.op == "function_output":
            continue
        if v.op in EFFECT_OPS or v.op == "hook_output":
            if v.op == "hook_output" and (len(v.inputs) != 2 or v.inputs[0].op != "hook"):
                raise VerifyError(f"%{v.id}: hook_output takes (hook, original value)")
            if v.op == "hook_output" and (v.shape, v.dtype) != (
                v.inputs[1].shape,
                v.inputs[1].dtype,
            ):
                raise VerifyError(f"%{v.id}: hook_output must keep its slot's shape and dtype")
            continue
        if v.op in IR_OPS:
            if v.inputs:
                raise VerifyError(f"%{v.id}: {v.op} takes no inputs")
            if v.op == "input" and v.attr("kind") not in ("root", "saved", "grad", "arg"):
                raise VerifyError(f"%{v.id}: unknown input kind {v.attr('kind')!r}")
            if v.op == "constant" and not 0 <= v.attr("index", -1) < len(graph.constants):
                raise VerifyError(f"%{v.id}: constant index out of range")
            continue
        prim = REGISTRY.get(v.op)
        if prim is None:
            raise VerifyError(f"%{v.id}: unknown op {v.op!r}")
        try:
            shape, dtype = prim.meta(
                tuple(substitute(i.shape, hints) for i in v.inputs),
                tuple(i.dtype for i in v.inputs),
                **{k: substitute(x, hints) for k, x in v.attrs},
            )
        except DataDependentShape as e:
            raise VerifyError(f"%{v.id}: {e}") from None
        recorded = substitute(v.shape, hints)
        if tuple(shape) != recorded or dtype is not v.dtype:
            raise VerifyError(
                f"%{v.id} = {v.op}: recorded {v.dtype.name}{list(recorded)}, rule gives "
                f"{dtype.name}{list(shape)}"
            )
    for kind, slot, value in graph.effects:
        if kind not in ("grad", "input_grad", "capture", "write", "check"):
            raise VerifyError(f"unknown effect {kind!r}")
        if index.get(value) is None:
            raise VerifyError(f"effect ({kind}, {slot}) refers to a value outside the graph")


def _format_attrs(v: Value) -> str:
    if v.op == "input":
        return f"{v.attr('kind')}[{v.attr('index')}]"
    if v.op == "scalar":
        return repr(v.attr("value"))
    parts = [f"{k}={val!r}" for k, val in v.attrs]
    return ", ".join(parts)


def format_value(v: Value) -> str:
    args = ", ".join(repr(i) for i in v.inputs)
    attrs = _format_attrs(v)
    inner = ", ".join(p for p in (args, attrs) if p)
    dims = ", ".join(format_expr(d) for d in v.shape)
    text = f"%{v.id}: {v.dtype.name}[{dims}] = {v.op}({inner})"
    return f"{text}  # {v.origin}" if v.origin else text


def format_graph(graph: Graph) -> str:
    """The graph as text (the capture's sizes, when symbolic), one value per line, then its
    effects."""
    lines = []
    if any(type(d) is Sym for v in graph.values for d in v.shape):
        lines.append(
            "sizes at capture: " + ", ".join(f"s{k}={h}" for k, h in enumerate(graph.hints))
        )
    lines += [format_value(v) for v in graph.values]
    for kind, slot, value in graph.effects:
        lines.append(f"{kind}[{slot}] <- {value!r}")
    return "\n".join(lines)
