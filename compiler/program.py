"""A compiled backward: the IR graph after the passes, and how to run it on one call's data.

This first executor evaluates the graph value by value with the primitives' own eager kernels
(no op-surface dispatch, no promotion, no node bookkeeping): the reference against which fused
numba kernels are checked, and what ``mode="debug"`` runs.  Running a program:

1. unpack every saved tensor first, through ``SavedTensor.unpack`` — the same version checks
   and errors as eager mode — before anything is computed or written (a failing check leaves
   every ``.grad`` untouched);
2. evaluate the values in order, dropping each array after its last use;
3. perform the effects with the engine's own ``.grad`` semantics (first write copies, later
   writes add in place into the existing ``.grad``, keeping its identity);
4. free the nodes' saved tensors unless ``retain_graph``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from fusegrad.autograd import engine as _engine
from fusegrad.autograd.node import OpNode
from fusegrad.ops.registry import REGISTRY
from fusegrad.tensor import Tensor

from .capture import Walk
from .ir import Graph, format_graph


@dataclass
class Program:
    graph: Graph
    last_use: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        effects = {v for _, _, v in self.graph.effects}
        for v in self.graph.values:
            for i in v.inputs:
                self.last_use[i] = v
        for v in effects:
            self.last_use.pop(v, None)  # effect values live to the end

    def __str__(self) -> str:
        return format_graph(self.graph)

    def run(self, w: Walk, grad_roots: Sequence[Tensor], retain_graph: bool,
            inputs: Sequence[Tensor] | None) -> list | None:
        saved_arrays = [s.unpack(node)._data for node, s in w.saved]  # version checks first
        env: dict = {}
        dying: dict = {}
        for v, last in self.last_use.items():
            dying.setdefault(last, []).append(v)
        for v in self.graph.values:
            op = v.op
            if op == "input":
                kind, index = v.attr("kind"), v.attr("index")
                env[v] = grad_roots[index]._data if kind == "root" else saved_arrays[index]
            elif op == "scalar":
                env[v] = np.array(v.attr("value"), dtype=v.dtype.np)
            elif op == "constant":
                env[v] = self.graph.constants[v.attr("index")]
            else:
                result = REGISTRY[op].kernel(*[env[i] for i in v.inputs], **dict(v.attrs))
                env[v] = result if type(result) is np.ndarray else np.asarray(result)
            for dead in dying.get(v, ()):
                env.pop(dead, None)
        captured: list | None = None
        if inputs is not None:
            captured = [None] * len(inputs)
        for kind, slot, v in self.graph.effects:
            g = Tensor._make(env[v])
            if kind == "grad":
                _engine._store_grad(w.leaves[slot], g, False)
            elif kind == "input_grad":
                _engine._store_grad(inputs[slot], g, False)  # type: ignore[index]
            else:
                captured[slot] = g  # type: ignore[index]
        if not retain_graph:
            for n in w.nodes:
                if type(n) is OpNode:
                    n.release()
        return captured
