"""Capture: turn one ``backward()`` / ``autograd.grad()`` call into a backward IR graph.

Two steps, both over the live eager graph:

1. ``walk`` — a cheap, deterministic walk of the nodes reachable from the roots (iterative DFS,
   preorder) that builds the cache *key* (node types, primitive attributes, edge structure,
   shapes, dtypes, which leaves get gradients and whether their ``.grad`` exists, the call's
   flags) and collects the runtime arguments in a fixed order: the nodes' saved tensors and the
   leaves.  Anything the compiler cannot run (custom Functions, hooks, anomaly mode,
   ``create_graph``, ...) is reported as a fallback reason instead.
2. ``capture`` — on a cache miss, the *same* engine walk (``engine.run_backward``) runs the
   *same* derivative rules on ``SymbolicTensor``s: tensors with a shape and dtype but no data
   whose every primitive call is intercepted at ``registry.apply`` and recorded as an IR value
   (DESIGN.md contracts 1 and 3).  Saved tensors become ``input`` values (their versions are
   checked exactly as in eager mode), ``.grad`` writes become effects, and tensors that rules
   create from nothing (``zeros_like(g)``, index ranges) become constants.

Sizes are concrete in the key and the graph; generated code takes them as runtime arguments, so
a new batch size costs a capture (Python only), not a compilation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from fusegrad.autograd import anomaly
from fusegrad.autograd import engine as _engine
from fusegrad.autograd import node as _node
from fusegrad.autograd.node import AccumulateGrad, OpNode
from fusegrad.ops import registry
from fusegrad.tensor import Tensor

from .ir import Graph, Value, freeze


class Fallback(Exception):
    """This backward cannot be compiled; ``str(e)`` is the one logged reason."""


class SymbolicTensor(Tensor):
    """A tensor that stands for an IR value: shape and dtype, no data.

    ``_data`` is a zero-stride numpy array of the right shape and dtype (it costs no memory), so
    every op-surface check that reads shapes or dtypes works unchanged; the kernel never runs
    because ``registry.apply`` hands the call to the capture's interceptor first."""

    __slots__ = ("_value",)

    @classmethod
    def of(cls, value: Value) -> "SymbolicTensor":
        t = cls._make(np.broadcast_to(np.zeros((), value.dtype.np), value.shape))
        t._value = value
        return t


@dataclass
class Walk:
    """The result of the cheap walk: cache key plus runtime arguments in key order."""

    key: tuple
    nodes: list = field(default_factory=list)
    saved: list = field(default_factory=list)  # (node, SavedTensor) in key order
    leaves: list = field(default_factory=list)  # leaf tensors in key order
    fallback: str | None = None


def _tensor_meta(t: Any) -> tuple:
    return (tuple(t._data.shape), t._dtype.name)


def walk(roots: Sequence[Tensor], grad_roots: Sequence[Tensor], inputs: Sequence[Tensor] | None,
         accumulate: bool, create_graph: bool) -> Walk:
    """Build the key and collect the runtime arguments (see the module docstring)."""
    out = Walk(key=())
    if create_graph:
        out.fallback = "create_graph=True (the backward itself must be recorded)"
        return out
    if anomaly._state.enabled:
        out.fallback = "anomaly mode is on (per-node checks and tracebacks)"
        return out
    index: dict = {}
    order: list = []
    root_edges = [r._edge() for r in roots]
    stack = [n for n, _ in reversed(root_edges) if n is not None]
    while stack:
        n = stack.pop()
        if n in index:
            continue
        index[n] = len(order)
        order.append(n)
        for child, _ in reversed(n._edges):
            if child is not None and child not in index:
                stack.append(child)
    key: list = [("call", accumulate, len(roots))]
    for (n, nr), g in zip(root_edges, grad_roots):
        key.append(("root", index.get(n, -1), nr, g._data.shape, g._dtype))
    if inputs is not None:
        for t in inputs:
            n, nr = t._edge()
            key.append(("input", index.get(n, -1), nr))
    # The hot loop of every compiled backward: per node only attribute reads and tuple
    # building (dtype objects, not their names; attrs as items, frozen only if unhashable).
    append = key.append
    saved_out = out.saved
    for n in order:
        kind = type(n)
        if kind is OpNode:
            if n._pre_hooks or n._post_hooks or n._tensor_pre_hooks or n._retain_grad_hooks:
                out.fallback = _unsupported(n)
                return out
            saved = n._saved
            if saved is None:
                if n._rule.save_index:
                    # freed: the eager engine raises its "Specify retain_graph=True" error
                    out.fallback = f"{n.name()} has freed its saved tensors"
                    return out
                saved = ()
            smeta = []
            for s in saved:
                if s._counter is None or s._unpack_hook is not None:
                    out.fallback = (f"{n.name()} has freed its saved tensors"
                                    if s._counter is None else
                                    f"{n.name()} has saved-tensor hooks (user code on unpack)")
                    return out
                t = s._tensor
                data = s._data if t is None else t._data
                smeta.append((data.shape, data.dtype))
                saved_out.append((n, s))
            append((n._prim.name, tuple(n.attrs.items()),
                    tuple((index[c] if c is not None else -1, nr) for c, nr in n._edges),
                    n._input_meta, tuple(smeta)))
        elif kind is AccumulateGrad:
            reason = _unsupported(n)
            if reason is not None:
                out.fallback = reason
                return out
            v = n.variable
            grad = v._grad
            gmeta = None if grad is None else (grad._data.shape, grad._dtype,
                                               grad.requires_grad, grad._data.flags.writeable,
                                               grad._data.flags.c_contiguous)
            append(("leaf", v._data.shape, v._dtype, gmeta))
            out.leaves.append(v)
        else:
            out.fallback = _unsupported(n)
            return out
    out.nodes = order
    try:
        out.key = tuple(key)
        hash(out.key)
    except TypeError:  # an attribute value that is not hashable: freeze everything
        out.key = freeze(tuple(key))
    return out


def _unsupported(n: Any) -> str | None:
    kind = type(n)
    if kind is not OpNode and kind is not AccumulateGrad:
        return f"{n.name()} is not a primitive's node (custom Function or other node type)"
    if n._pre_hooks or n._post_hooks or n._tensor_pre_hooks or n._retain_grad_hooks:
        return f"{n.name()} has hooks (hooks are not compiled yet)"
    if kind is AccumulateGrad and (n.variable._hooks or n.variable._post_acc_hooks):
        return "a leaf has tensor or post-accumulate-grad hooks (hooks are not compiled yet)"
    return None


def capture(w: Walk, roots: Sequence[Tensor], grad_roots: Sequence[Tensor],
            inputs: Sequence[Tensor] | None, accumulate: bool) -> Graph:
    """Record the backward of ``roots`` as an IR graph (see the module docstring)."""
    graph = Graph()
    saved_index = {id(s): k for k, (_, s) in enumerate(w.saved)}
    leaf_index = {id(t): k for k, t in enumerate(w.leaves)}
    input_index = {id(t): k for k, t in enumerate(inputs or ())}
    current: list[str] = [""]

    def intercept(prim: registry.Primitive, args: tuple, attrs: dict) -> Any:
        values = []
        for a in args:
            if isinstance(a, SymbolicTensor):
                values.append(a._value)
            elif a._wrapped_number or (a._data.ndim == 0):
                values.append(graph.scalar(a._data.item(), a._dtype))
            else:
                values.append(graph.constant(a._data))
        try:
            shape, dtype = prim.meta(
                tuple(v.shape for v in values), tuple(v.dtype for v in values), **attrs
            )
        except registry.DataDependentShape as e:
            raise Fallback(f"{prim.name} in {current[0]}: {e}") from None
        value = graph.add(prim.name, tuple(values), attrs, shape, dtype, origin=current[0])
        return SymbolicTensor.of(value)

    def unpack(saved: Any, node: Any) -> Tensor:
        # the real unpack first: the same version check and error as eager mode
        _node.capture_unpack = None
        try:
            real = saved.unpack(node)
        finally:
            _node.capture_unpack = unpack
        k = saved_index.get(id(saved))
        if k is None:
            raise Fallback(f"{node.name()} unpacked a tensor the walk did not see")
        return SymbolicTensor.of(graph.input("saved", k, real._data.shape, real._dtype))

    def as_value(g: Tensor) -> Value:
        # a gradient a rule built from nothing (e.g. zeros_like(g) for floor) is a constant
        return g._value if isinstance(g, SymbolicTensor) else graph.constant(g._data)

    def store(t: Tensor, g: Tensor) -> None:
        if id(t) in leaf_index:
            graph.effects.append(("grad", leaf_index[id(t)], as_value(g)))
        elif id(t) in input_index:
            graph.effects.append(("input_grad", input_index[id(t)], as_value(g)))
        else:
            raise Fallback("a .grad write to a tensor the walk did not see")

    engine_apply = _engine._apply

    def apply_named(node: Any, grads: Any, retain_graph: bool) -> Any:
        # remember which eager node's rule is running: IR values name it in comments/reports
        current[0] = node.name()
        return engine_apply(node, grads, retain_graph)

    sym_roots = [
        SymbolicTensor.of(graph.input("root", i, g._data.shape, g._dtype))
        for i, g in enumerate(grad_roots)
    ]
    prev = registry.set_interceptor(intercept)
    prev_unpack, prev_store = _node.capture_unpack, _engine.capture_store
    _node.capture_unpack, _engine.capture_store = unpack, store
    _engine._apply = apply_named
    try:
        captured = _engine.run_backward(roots, sym_roots, True, False, inputs, accumulate)
    finally:
        registry.set_interceptor(prev)
        _node.capture_unpack, _engine.capture_store = prev_unpack, prev_store
        _engine._apply = engine_apply
    if not accumulate:
        for pos, g in enumerate(captured or ()):
            if g is not None:
                graph.effects.append(("capture", pos, as_value(g)))
    return graph
