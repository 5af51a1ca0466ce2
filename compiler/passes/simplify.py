"""Algebraic simplification: rewrite values into cheaper equal ones, in one topological sweep.

Assumes a verified graph; guarantees a verified graph computing bit-identical results (only
rewrites that are exact in IEEE arithmetic, including NaN, inf and signed zeros):

* ``mul(x, 1)`` / ``mul(1, x)`` / ``div(x, 1)`` -> ``x`` (x * 1.0 is exact for every x);
* ``neg(neg(x))`` -> ``x``;
* an elementwise primitive of scalars -> the scalar its eager kernel computes;
* ``pow(x, 0.5)`` (a scalar exponent) -> ``sqrt(x)``, as numpy's power loop computes it (exact:
  it is what the eager kernel does);
* ``reshape``/``broadcast_to``/``sum_to`` to ``x``'s own shape, and ``cast`` to its own
  dtype -> ``x``;
* ``broadcast_to(reshape(x))`` of a one-element ``x`` -> ``broadcast_to(x)``;
* ``reshape(reshape(x))`` -> ``reshape(x)``; ``permute(permute(x))`` -> one ``permute``
  (or ``x`` when the composition is the identity).

One rewrite is equal up to the order of a matrix product's sums (BLAS blocking): a transpose of
a matmul that nothing else uses becomes the matmul of the swapped, transposed operands,
``permute(a @ b) -> b.mT @ a.mT``.  The result then comes out of BLAS in the layout it is used
in (a weight's gradient): no strided copy when it becomes ``.grad``, and the operands' own
transposes usually cancel (``w.mT.mT`` is ``w``).

Not rewritten on purpose: ``x * 0`` (NaN/inf inputs), ``x + 0`` (signed zero).
The sweep is a single pass (each value sees its already simplified inputs): no fixpoint loop.
"""

from __future__ import annotations

import numpy as np

from fusegrad.ops.registry import REGISTRY

from ..ir import Graph, Value


def _is_scalar(v: Value, value: float) -> bool:
    return v.op == "scalar" and v.attr("value") == value and v.shape == ()


def _numel_one(shape: tuple) -> bool:
    return all(type(d) is int and d == 1 for d in shape)


def _swap_last_two(dims: tuple) -> bool:
    n = len(dims)
    return n >= 2 and dims == tuple(range(n - 2)) + (n - 1, n - 2)


def _transpose(graph: Graph, x: Value, origin: str) -> Value:
    n = len(x.shape)
    dims = tuple(range(n - 2)) + (n - 1, n - 2)
    shape = x.shape[:-2] + (x.shape[-1], x.shape[-2])
    if x.op == "permute" and _swap_last_two(x.attr("dims")):
        return x.inputs[0]  # the transposes cancel
    return graph.add("permute", (x,), {"dims": dims}, shape, x.dtype, origin)


def _rewrite(
    graph: Graph, v: Value, inputs: tuple[Value, ...], users: dict | None = None
) -> Value | None:
    """The simplified form of ``v`` (with already-mapped ``inputs``), or None."""
    op = v.op
    if (
        op == "permute"
        and users is not None
        and inputs[0].op == "matmul"
        and _swap_last_two(v.attr("dims"))
        and users.get(v.inputs[0], 0) == 1
        and len(inputs[0].inputs[0].shape) == len(inputs[0].inputs[1].shape) == len(v.shape)
    ):
        a, b = inputs[0].inputs
        bt, at = _transpose(graph, b, v.origin), _transpose(graph, a, v.origin)
        return graph.add("matmul", (bt, at), {}, v.shape, v.dtype, v.origin)
    if op == "mul" and v.dtype.is_floating_point:
        a, b = inputs
        if _is_scalar(b, 1) and a.shape == v.shape and a.dtype is v.dtype:
            return a
        if _is_scalar(a, 1) and b.shape == v.shape and b.dtype is v.dtype:
            return b
    if op == "div" and v.dtype.is_floating_point:
        a, b = inputs
        if _is_scalar(b, 1) and a.shape == v.shape and a.dtype is v.dtype:
            return a
    prim = REGISTRY.get(op)
    if (
        prim is not None
        and prim.kind == "elementwise"
        and inputs
        and v.shape == ()
        and all(i.op == "scalar" and i.shape == () for i in inputs)
    ):
        # scalars only: computed now, by the eager kernel on the same 0-d arrays eager uses
        arrays = [np.array(i.attr("value"), dtype=i.dtype.np) for i in inputs]
        try:
            with np.errstate(all="ignore"):
                out = np.asarray(prim.kernel(*arrays, **dict(v.attrs)))
        except Exception:  # noqa: BLE001  (an error eager raises at run time: not folded)
            out = None
        if out is not None and out.shape == ():
            return graph.scalar(out.astype(v.dtype.np).item(), v.dtype)
    if op == "pow" and v.dtype.is_floating_point:
        a, b = inputs
        if _is_scalar(b, 0.5) and a.shape == v.shape and a.dtype is v.dtype:
            # numpy's power loop (the eager kernel) computes a scalar exponent of 0.5 as sqrt:
            # -0 -> -0 and -inf -> nan, where C's pow gives +0 and +inf
            return graph.add("sqrt", (a,), {}, v.shape, v.dtype, v.origin)
    if op == "neg" and inputs[0].op == "neg":
        return inputs[0].inputs[0]
    if op == "broadcast_to" and inputs[0].op == "reshape" and _numel_one(inputs[0].shape):
        # a one-element value reshaped only to be broadcast: broadcast it directly
        inner = inputs[0].inputs[0]
        if len(inner.shape) <= len(v.shape):
            return graph.add(
                "broadcast_to", (inner,), {"shape": v.attr("shape")}, v.shape, v.dtype, v.origin
            )
    if op in ("reshape", "broadcast_to", "sum_to") and inputs[0].shape == v.shape:
        return inputs[0]
    if op == "cast" and inputs[0].dtype is v.dtype:
        return inputs[0]
    if op == "reshape" and inputs[0].op == "reshape":
        inner = inputs[0].inputs[0]
        return graph.add(
            "reshape", (inner,), {"shape": v.attr("shape")}, v.shape, v.dtype, v.origin
        )
    if op == "permute" and inputs[0].op == "permute":
        inner = inputs[0].inputs[0]
        first, second = inputs[0].attr("dims"), v.attr("dims")
        dims = tuple(first[d] for d in second)
        if dims == tuple(range(len(dims))):
            return inner
        return graph.add("permute", (inner,), {"dims": dims}, v.shape, v.dtype, v.origin)
    return None


def simplify(graph: Graph) -> Graph:
    out = Graph(constants=list(graph.constants), hints=graph.hints)
    mapping: dict[Value, Value] = {}
    users: dict[Value, int] = {}
    for v in graph.values:
        for i in v.inputs:
            users[i] = users.get(i, 0) + 1
    for _, _, v in graph.effects:
        users[v] = users.get(v, 0) + 1
    for v in graph.values:
        inputs = tuple(mapping[i] for i in v.inputs)
        new = _rewrite(out, v, inputs, users)
        if new is None:
            new = out.add(v.op, inputs, v.attrs, v.shape, v.dtype, v.origin)
        mapping[v] = new
    out.effects = [(kind, slot, mapping[v]) for kind, slot, v in graph.effects]
    return out
