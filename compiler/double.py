"""Compiled double backward: ``create_graph=True`` inside compiled autograd (issue 12, item 3).

The first-order backward is captured (with the call's concrete sizes) and runs as a compiled
program like any other.  Its gradients then get one ``CompiledGradBackward`` node as their
``grad_fn`` (``attach``), where eager mode would have recorded the rules' ops one node each.
The node's inputs are what the program read that requires grad: the root gradients
(``grad_outputs``) and the tensors the forward's nodes saved, each at its place in the forward
graph (a saved input's own ``grad_fn`` or leaf, a saved output's node).  A gradient that depends
on none of them does not require grad, as in eager mode.

The node's backward is the VJP of the captured graph (``vjp_graph``): the same derivative rules,
applied to the graph's primitives in reverse, recording a second IR graph that recomputes the
first-order values it needs; that graph runs as a compiled program of its own, built once per
captured graph and pattern of the node's outputs that received a gradient: the others take no
part, as in eager mode (a zero cotangent is not an absent one where a derivative is infinite).
When the node's backward must itself be recorded (``create_graph`` again: a third order), or
the second graph cannot be built, the node evaluates the captured graph op by op with eager
tensors and differentiates that (same values, eager speed), and says so in the ``perf`` log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fusegrad.autograd import engine as _engine
from fusegrad.autograd import grad_mode
from fusegrad.autograd.api import grad as _grad
from fusegrad.autograd.graph_base import Node
from fusegrad.autograd.node import SavedTensor, _freed_message
from fusegrad.autograd.tracer import tracing
from fusegrad.errors import AutogradError
from fusegrad.ops import registry
from fusegrad.ops._util import scalar_tensor
from fusegrad.ops.creation import zeros
from fusegrad.tensor import Tensor

from . import events, logs, passes
from .capture import Recorder, Refused, SymbolicTensor
from .events import emit
from .ir import Graph, Value
from .key import INLINED, Walk
from .service import service
from .settings import config
from .symbolic import NeedsData


class _IRNode:
    """What a derivative rule sees of an IR value (``capture.NodeView``'s interface)."""

    __slots__ = ("attrs", "input_dtypes", "input_shapes", "needs_input_grad", "op")

    def __init__(self, v: Value, needs: tuple) -> None:
        self.op = v.op
        self.attrs = dict(v.attrs)
        self.input_shapes = tuple(tuple(i.shape) for i in v.inputs)
        self.input_dtypes = tuple(i.dtype for i in v.inputs)
        self.needs_input_grad = needs

    def name(self) -> str:
        return f"{self.op} (compiled double backward)"


def copy_values(
    src: Graph, into: Graph, input_of: Callable[[Value], Value], origin: str | None = None
) -> dict[Value, Value]:
    """Copy ``src``'s values into ``into`` (an input becomes ``input_of(input)``; ``origin``
    replaces the values' origins when given); returns the mapping."""
    mapped: dict[Value, Value] = {}
    for v in src.values:
        if v.op == "input":
            mapped[v] = input_of(v)
        elif v.op == "scalar":
            mapped[v] = into.scalar(v.attr("value"), v.dtype)
        elif v.op == "constant":
            mapped[v] = into.constant(src.constants[v.attr("index")])
        else:
            inputs = tuple(mapped[i] for i in v.inputs)
            where = v.origin if origin is None else origin
            mapped[v] = into.add(v.op, inputs, v.attrs, v.shape, v.dtype, where)
    return mapped


def vjp_graph(graph: Graph, outputs: Sequence[Value], needed: Sequence[Value]) -> Graph:
    """The VJP of ``graph`` (concrete sizes) as a graph: its inputs are ``graph``'s inputs
    (``("saved", k)`` for ``graph``'s k-th input value in graph order) and one cotangent per
    output (``("root", j)``); its effects return the cotangent of each value in ``needed`` (its
    inputs that require grad), ``("capture", position in needed, value)``, zeros where none
    flows.  Raises whatever a rule raises (the caller falls back)."""
    out = Graph(hints=())
    rec = Recorder(out, None)
    order = {v: k for k, v in enumerate(u for u in graph.values if u.op == "input")}
    # the first-order values, recomputed where the VJP reads them
    mapped = copy_values(graph, out, lambda v: out.input("saved", order[v], v.shape, v.dtype))
    # which values depend on an input that requires grad (only those get cotangents)
    live = set(needed)
    for v in graph.values:
        if v not in live and any(i in live for i in v.inputs):
            live.add(v)
    cot: dict[Value, Any] = {}

    def sym(v: Value) -> SymbolicTensor:
        return rec.symbolic(mapped[v])

    def add_cot(v: Value, g: Any) -> None:
        prev = cot.get(v)
        cot[v] = g if prev is None else prev + g

    with tracing(rec):
        for j, v in enumerate(outputs):
            if v in live:
                add_cot(v, rec.symbolic(out.input("root", j, v.shape, v.dtype)))
        for v in reversed(graph.values):
            g = cot.get(v)
            if g is None or v.op in ("input", "scalar", "constant"):
                continue
            prim = registry.REGISTRY[v.op]
            rule = registry.RULES.get(v.op)
            needs = tuple(i in live and i.dtype.is_floating_point for i in v.inputs)
            if not any(needs):
                continue
            if not prim.differentiable or rule is None:
                # a float value computed from inputs that need grad by an op eager mode would
                # not have recorded under create_graph: never silently zero (the caller falls
                # back)
                raise NotImplementedError(f"{v.op} has no derivative rule")
            node = _IRNode(v, needs)
            rec.current = node.name()
            saved: list = []
            variadic_at = len(prim.inputs) - 1 if prim.variadic else -2
            for index in rule.save_index:
                if index < 0:
                    saved.append(sym(v))
                elif index == variadic_at:
                    saved.extend(sym(i) for i in v.inputs[index:])
                else:
                    saved.append(sym(v.inputs[index]))
            results = rule.fn(node, g, *saved)
            if not isinstance(results, tuple):
                results = tuple(results) if isinstance(results, list) else (results,)
            for i, (x, r) in enumerate(zip(v.inputs, results)):
                if r is None or not needs[i]:
                    continue
                add_cot(x, _engine.validate_gradient(node, i, r, tuple(x.shape), x.dtype))  # type: ignore[arg-type]
        for pos, v in enumerate(needed):
            g = cot.get(v)
            value = g._value if g is not None else out.full(tuple(v.shape), 0, v.dtype)
            out.effects.append(("capture", pos, value))
    return out


class CompiledGradBackward(Node):
    """The ``grad_fn`` of the gradients a compiled ``create_graph`` backward returned (see the
    module docstring): output j is the program's j-th gradient, edges are the program inputs
    that require grad."""

    __slots__ = (
        "_cache",
        "_device",
        "_graph",
        "_mode",
        "_needed",
        "_outputs",
        "_released",
        "_saved",
    )

    def __init__(
        self, graph: Graph, outputs: list, sources: list, needed: list, cache: dict, mode: str
    ) -> None:
        edges = tuple(sources[k]._edge() for k in needed)
        meta = tuple((sources[k]._data.shape, sources[k]._dtype) for k in needed)
        super().__init__(edges, meta)
        self._graph = graph
        self._outputs = outputs  # the graph's output values, one per node output
        # the tensors the graph's inputs were, in graph order, saved as eager's rules save
        # theirs (version-checked when this backward reads them)
        self._saved: list | None = [SavedTensor(t) for t in sources]
        self._released = False
        self._needed = needed  # positions in the sources of the edges
        # shared by the nodes of one captured graph: VJP graphs and programs, and the token
        # that stands for the graph in walk keys
        self._cache = cache
        self._mode = mode
        # where its arrays live: the VJP program runs there too (CUDA: the device's kernels)
        self._device = "cpu" if all(type(t._data) is np.ndarray for t in sources) else "cuda"

    def _zeros(self, shape: tuple, dtype: Any) -> Tensor:
        return zeros(shape, dtype=dtype, device=self._device)

    def token(self) -> Any:
        """What stands for this node's graph in a walk key (``capture.walk``)."""
        return self._cache.setdefault("token", object())

    def name(self) -> str:
        return "CompiledGradBackward"

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def release(self) -> None:
        if self._saved is not None:
            for s in self._saved:
                s.release()
            self._saved = None
            self._released = True

    def apply(self, grads: tuple, retain: bool) -> tuple:
        if self._saved is None:
            raise AutogradError(_freed_message)
        sources = [s.unpack(self) for s in self._saved]
        # only the outputs that received a gradient take part, as in eager mode (a zero
        # cotangent for the others would be no zero term where their derivative is infinite:
        # BCE's target gradient -logit(p) at p = 0 makes 0 * -inf = NaN)
        present = tuple(g is not None for g in grads)
        cots = [g for g in grads if g is not None]
        result = None
        if not cots:
            result = [None] * len(self._needed)
        elif not grad_mode.is_grad_enabled():
            program = self._program(present)
            if program is not None:
                emit(events.COMPILED_RUN)
                arrays = [t._data for t in sources]
                inst = program.instance(program.graph.hints)
                result = program._run(inst, None, arrays, [], cots, None, None, len(self._needed))
        if result is None:
            result = self._eager(sources, cots, present)
        if not retain:
            self.release()
        return tuple(result)

    def vjp(self, present: tuple | None = None) -> Graph | None:
        """The VJP graph from the outputs ``present`` marks (default: all) to the inputs that
        need grad (built once per captured graph and pattern), or None when it cannot be built
        (logged)."""
        outputs = (
            self._outputs if present is None else [v for v, p in zip(self._outputs, present) if p]
        )
        key = ("graph", tuple(self._needed), tuple(outputs))
        if key not in self._cache:
            inputs = [v for v in self._graph.values if v.op == "input"]
            try:
                graph = vjp_graph(self._graph, outputs, [inputs[k] for k in self._needed])
            except Exception as e:  # noqa: BLE001 - the eager path computes the same
                logs.log("perf", f"compiled double backward: no VJP graph ({e!r}); eager")
                graph = None
            self._cache[key] = graph
        return self._cache[key]

    def _program(self, present: tuple) -> Any:
        """The compiled VJP program (once per captured graph and pattern of the outputs that
        have a gradient, ``present``), or None."""
        key = (
            "program",
            tuple(self._needed),
            tuple(self._outputs),
            present,
            self._mode,
            self._device,
            config.program_key(),
        )
        if key not in self._cache:
            graph = self.vjp(present)
            self._cache[key] = (
                None
                if graph is None
                else service.build(
                    passes.run(graph),  # (the first-order values it does not read go: dce)
                    mode=self._mode,
                    device=self._device,
                )
            )
        return self._cache[key]

    def _eager(self, sources: list, cots: list, present: tuple) -> list:
        """Evaluate the captured graph op by op on the sources (recording, so that this
        backward is differentiable again) and differentiate that."""
        values: dict[Value, Tensor] = {}
        graph = self._graph
        k = 0
        with grad_mode.enable_grad():
            # each source through an alias node of its own: the gradient with respect to the
            # alias is the partial one this node owes that edge (a source that another source
            # depends on, x and exp(x), must not collect the other's path too), and it stays
            # connected to the forward graph for the next order
            sources = [t.view_as(t) if t.requires_grad else t for t in sources]
            for v in graph.values:
                if v.op == "input":
                    values[v] = sources[k]
                    k += 1
                elif v.op == "scalar":
                    values[v] = scalar_tensor(v.attr("value"), v.dtype)
                elif v.op == "constant":
                    values[v] = Tensor._make(graph.constants[v.attr("index")])
                else:
                    prim = registry.REGISTRY[v.op]
                    args = tuple(values[i] for i in v.inputs)
                    if not prim.differentiable and v.dtype.is_floating_point:
                        if any(a.requires_grad for a in args):
                            # (what eager's create_graph would have differentiated is not
                            # in this graph: an error, never a missing term)
                            raise AutogradError(
                                f"compiled double backward: {v.op} ({v.origin}) has no "
                                "derivative; run this backward outside compiled autograd"
                            )
                    values[v] = registry.apply(prim, args, dict(v.attrs))
        outs = [values[v] for v, p in zip(self._outputs, present) if p]
        pairs = [(o, c) for o, c in zip(outs, cots) if o.requires_grad]
        wanted = [sources[k] for k in self._needed]
        got = _grad(
            [o for o, _ in pairs],
            wanted,
            [c for _, c in pairs],
            create_graph=grad_mode.is_grad_enabled(),
            allow_unused=True,
        )
        return [
            g if g is not None else self._zeros(tuple(t._data.shape), t._dtype)
            for g, t in zip(got, wanted)
        ]


def sources_of(graph: Graph, w: Walk, grads: Sequence[Tensor]) -> list[Tensor]:
    """The tensors ``graph``'s inputs were at this call, in graph order, at their places in
    the forward graph (a saved output comes back with its node as ``grad_fn``)."""
    out = []
    for v in graph.values:
        if v.op != "input":
            continue
        kind, index = v.attr("kind"), v.attr("index")
        if kind == "root":
            out.append(grads[index])
        else:
            node, saved = w.saved[index]
            out.append(saved.unpack(node))
    return out


def attach(
    graph: Graph,
    cache: dict,
    w: Walk,
    grads: Sequence[Tensor],
    results: list | None,
    inputs: Sequence[Tensor] | None,
    mode: str,
) -> None:
    """Give the gradients a compiled ``create_graph`` backward produced their ``grad_fn``."""
    sources = sources_of(graph, w, grads)
    needed = [k for k, t in enumerate(sources) if t.requires_grad and t._dtype.is_floating_point]
    if not needed:
        return
    values = [v for v in graph.values if v.op == "input"]
    live = {values[k] for k in needed}
    for v in graph.values:
        if v not in live and any(i in live for i in v.inputs):
            live.add(v)
    effects = [(k, slot, v) for k, slot, v in graph.effects if k != "check" and v in live]
    if not effects:
        return
    # an edge only to the sources the gradients depend on differentiably, as eager's graph
    # would have: a source no gradient depends on gets None from grad(allow_unused=True),
    # not zeros (a path through a comparison or another op without a derivative is no path)
    reach = {v for _, _, v in effects}
    for v in reversed(graph.values):
        if v in reach and v.op not in ("input", "scalar", "constant"):
            if registry.REGISTRY[v.op].differentiable:
                reach.update(i for i in v.inputs if i.dtype.is_floating_point)
    needed = [k for k in needed if values[k] in reach]
    live = {values[k] for k in needed}
    for v in graph.values:
        if v not in live and v.op not in ("input", "scalar", "constant"):
            if registry.REGISTRY[v.op].differentiable and any(i in live for i in v.inputs):
                live.add(v)
    effects = [e for e in effects if e[2] in live]
    if not effects:
        return
    node = CompiledGradBackward(graph, [v for _, _, v in effects], sources, needed, cache, mode)
    for j, (kind, slot, _) in enumerate(effects):
        if kind == "capture":
            t = results[slot]  # type: ignore[index]
        elif kind == "grad":
            t = w.leaves[slot]._grad
        else:  # input_grad
            t = inputs[slot]._grad  # type: ignore[index]
        t.grad_fn = node
        t._output_nr = j


class _Inline:
    """How a capture takes in a ``CompiledGradBackward`` (``capture.INLINED``): its VJP graph
    is copied into the graph being captured, with its inputs bound to the node's saved tensors
    and to the gradients the node receives, so the whole outer backward is one program."""

    @staticmethod
    def key(node: CompiledGradBackward) -> tuple:
        return ("compiled_grad", node.token(), tuple(node._needed), len(node._outputs))

    @staticmethod
    def inline(capture: Any, node: CompiledGradBackward, grads: list) -> tuple:
        if capture.env is not None:
            raise NeedsData("a compiled double backward's graph has concrete sizes")
        # only the outputs that receive a gradient take part, as in ``apply`` (which outputs
        # do is the graph's structure, in the walk key)
        present = tuple(g is not None for g in grads)
        roots = [g for g in grads if g is not None]
        if not roots:
            return tuple(None for _ in node._edges)
        vjp = node.vjp(present)
        if vjp is None:
            raise Refused(f"{node.name()}: its VJP graph could not be built (see the perf log)")
        graph = capture.graph
        saved = node._saved
        if saved is None:
            raise AutogradError(_freed_message)

        def input_of(v: Value) -> Value:
            index = v.attr("index")
            if v.attr("kind") == "saved":
                return capture.unpack(saved[index], node)._value
            return capture.as_value(roots[index])

        mapped = copy_values(vjp, graph, input_of, node.name())
        results: list = [None] * len(node._edges)
        for _, pos, v in vjp.effects:
            results[pos] = capture.symbolic(mapped[v])
        return tuple(results)


INLINED[CompiledGradBackward] = _Inline
