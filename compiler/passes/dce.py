"""Dead-code elimination: keep only values that some effect needs.

Assumes a verified graph; guarantees a verified graph with the same effects, values in the same
relative order, renumbered densely.  Runtime inputs that become unused stay (the program's
argument lists are positional), everything else unused goes.
"""

from __future__ import annotations

from ..ir import EFFECT_OPS, Graph, Value


def rebuild(graph: Graph, keep: set[Value]) -> Graph:
    """A new graph with the kept values (in order) and the effects, ids renumbered."""
    out = Graph(constants=list(graph.constants), hints=graph.hints)
    mapping: dict[Value, Value] = {}
    for v in graph.values:
        if v in keep:
            mapping[v] = out.add(
                v.op, tuple(mapping[i] for i in v.inputs), v.attrs, v.shape, v.dtype, v.origin
            )
    out.effects = [(kind, slot, mapping[v]) for kind, slot, v in graph.effects]
    return out


def dce(graph: Graph) -> Graph:
    live: set[Value] = {v for v in graph.values if v.op == "input"}
    stack = [v for _, _, v in graph.effects]
    stack += [v for v in graph.values if v.op in EFFECT_OPS]  # side effects are always live
    while stack:
        v = stack.pop()
        if v in live and v.op != "input":
            continue
        live.add(v)
        stack.extend(v.inputs)
    return rebuild(graph, live)
