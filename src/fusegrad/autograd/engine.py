"""The backward engine: ``run_backward`` executes the node graph for ``backward()`` and ``grad()``.

One iterative loop (no recursion over graph depth):

1. discover the nodes reachable from the roots and count, per node, the edges pointing at it;
   with ``inputs`` given, keep only nodes on a path to one of them;
2. seed the roots' gradients, then repeatedly run the ready node (all its incoming gradients
   summed) created latest in the forward pass; AccumulateGrad nodes run as soon as ready;
3. per node: tensor hooks, retain_grad, capture for ``grad()``, node pre-hooks, the rule (under
   no_grad unless ``create_graph``), post-accumulate hooks, node post-hooks;
4. per outgoing edge: undo broadcasting with ``sum_to`` (the engine owns this, DESIGN.md
   contract 2), cast to the input's dtype, and sum fan-in into the next node's buffer.

Saved tensors are released after each node unless ``retain_graph``.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Sequence

import numpy as np

from ..errors import AutogradError
from ..tensor import Tensor
from . import anomaly, grad_mode
from .node import AccumulateGrad, Node


def _sum_to_compatible(gshape: tuple, shape: tuple) -> bool:
    if len(gshape) < len(shape):
        return False
    lead = len(gshape) - len(shape)
    return all(s == gs or s == 1 for s, gs in zip(shape, gshape[lead:]))


def validate_gradient(node: Node, index: int, g: Tensor, shape: tuple, dtype: Any) -> Tensor:
    """Bring a rule's gradient for input ``index`` to that input's shape and dtype."""
    if g._data.shape != shape:
        if not _sum_to_compatible(g._data.shape, shape):
            raise AutogradError(
                f"Function {node.name()} returned an invalid gradient at index {index} - got "
                f"{list(g._data.shape)} but expected shape compatible with {list(shape)}"
            )
        from ..ops.shape import sum_to

        g = sum_to(g, shape)
    if g._dtype is not dtype:
        g = g.to(dtype)
    return g


def _tensor_hooks(node: Node, nr: int) -> list:
    if isinstance(node, AccumulateGrad):
        hooks = node.variable._hooks
        return list(hooks.values()) if hooks else []
    if node._tensor_pre_hooks and nr in node._tensor_pre_hooks:
        return list(node._tensor_pre_hooks[nr].values())
    return []


def _store_grad(t: Tensor, g: Tensor, create_graph: bool) -> None:
    """``.grad`` accumulation: first store copies (no aliasing), later adds in place; under
    create_graph (or when .grad itself has history) ``.grad = .grad + g``."""
    old = t._grad
    if create_graph:
        t._grad = g if old is None else old + g
        return
    if old is None:
        t._grad = Tensor._make(np.array(g._data, copy=True, order="C"))
    elif old.requires_grad:
        t._grad = old + g.detach()
    else:
        np.add(old._data, g._data, out=old._data)
        old._version_counter.value += 1


def _discover(root_nodes: list[Node]) -> tuple[dict, list]:
    """Dependency counts over every edge among nodes reachable from the roots."""
    deps: dict = {}
    seen = set()
    order: list = []
    stack = [n for n in root_nodes]
    for n in root_nodes:
        seen.add(n)
    while stack:
        node = stack.pop()
        order.append(node)
        for nxt, _ in node._edges:
            if nxt is None:
                continue
            deps[nxt] = deps.get(nxt, 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return deps, order


def _needed(order: list, targets: set) -> set:
    """Nodes from which some target node is reachable (targets included)."""
    needed = set(targets)
    # ``order`` lists parents before children only partially (DFS); iterate to a fixpoint
    # over a reverse topological pass built iteratively.
    children = {n: [e[0] for e in n._edges if e[0] is not None] for n in order}
    post: list = []
    state: dict = {}
    for start in order:
        if start in state:
            continue
        stack = [(start, iter(children.get(start, ())))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            advanced = False
            for c in it:
                if c not in state:
                    state[c] = 1
                    stack.append((c, iter(children.get(c, ()))))
                    advanced = True
                    break
            if not advanced:
                stack.pop()
                post.append(node)
    for node in post:  # children before parents
        if node in needed:
            continue
        if any(c in needed for c in children.get(node, ())):
            needed.add(node)
    return needed


def run_backward(
    roots: Sequence[Tensor],
    grad_roots: Sequence[Tensor],
    retain_graph: bool,
    create_graph: bool,
    inputs: Sequence[Tensor] | None = None,
    accumulate: bool = True,
) -> list | None:
    """Execute the graph.  Returns captured gradients for ``inputs`` when not accumulating."""
    root_edges = [r._edge() for r in roots]
    root_nodes = []
    for node, _ in root_edges:
        if node is not None and node not in root_nodes:
            root_nodes.append(node)
    deps, order = _discover(root_nodes)

    capture: dict = {}  # (node, nr) -> list of input positions
    if inputs is not None:
        for i, t in enumerate(inputs):
            edge = t._edge()
            capture.setdefault(edge, []).append(i)
        needed = _needed(order, {e[0] for e in capture if e[0] is not None})
    else:
        needed = None
    captured: list = [None] * (len(inputs) if inputs is not None else 0)

    buffers: dict = {}
    for (node, nr), g in zip(root_edges, grad_roots):
        if node is None:
            continue
        buf = buffers.setdefault(node, [None] * _num_outputs(node))
        buf[nr] = g if buf[nr] is None else buf[nr] + g

    tie = itertools.count()
    ready: list = []
    for node in root_nodes:
        if deps.get(node, 0) == 0 and (needed is None or node in needed):
            heapq.heappush(ready, (-node._seq, next(tie), node))

    prev_mode = grad_mode._state.enabled
    grad_mode._state.enabled = create_graph
    try:
        while ready:
            _, _, node = heapq.heappop(ready)
            grads = buffers.pop(node, None) or [None] * _num_outputs(node)
            results = _run_node(node, grads, capture, captured, needed, accumulate,
                                retain_graph, create_graph, inputs)
            for i, (nxt, nr) in enumerate(node._edges):
                if nxt is None or (needed is not None and nxt not in needed):
                    continue
                g = results[i] if results is not None and i < len(results) else None
                if g is not None:
                    shape, dtype = node._input_meta[i]
                    g = validate_gradient(node, i, g, shape, dtype)
                    buf = buffers.setdefault(nxt, [None] * _num_outputs(nxt))
                    buf[nr] = g if buf[nr] is None else buf[nr] + g
                deps[nxt] -= 1
                if deps[nxt] == 0:
                    heapq.heappush(ready, (-nxt._seq, next(tie), nxt))
    finally:
        grad_mode._state.enabled = prev_mode
    return captured if not accumulate else None


def _num_outputs(node: Node) -> int:
    return node.num_outputs


def _run_node(node: Node, grads: list, capture: dict, captured: list, needed: set | None,
              accumulate: bool, retain_graph: bool, create_graph: bool,
              inputs: Sequence[Tensor] | None) -> tuple | None:
    # 1. tensor hooks (a returned tensor replaces the gradient)
    for nr in range(len(grads)):
        if grads[nr] is None:
            continue
        for hook in _tensor_hooks(node, nr):
            out = hook(grads[nr])
            if out is not None:
                grads[nr] = out
    # 2. retain_grad
    if node._retain_grad_hooks:
        for nr, ref in list(node._retain_grad_hooks.items()):
            t = ref()
            if t is not None and grads[nr] is not None and t.grad_fn is node:
                _store_grad(t, grads[nr], create_graph)
    # capture for grad() / backward(inputs=...)
    is_target = False
    if capture:
        for nr in range(len(grads)):
            positions = capture.get((node, nr))
            if positions is None:
                continue
            is_target = True
            if accumulate:
                if not isinstance(node, AccumulateGrad) and grads[nr] is not None:
                    # a non-leaf listed in backward(inputs=...) accumulates into its .grad
                    _store_grad(inputs[positions[0]], grads[nr], create_graph)  # type: ignore
            else:
                for p in positions:
                    captured[p] = grads[nr]
    if isinstance(node, AccumulateGrad):
        if accumulate and (not capture or is_target) and grads[0] is not None:
            _accumulate(node, grads[0], create_graph)
        return None
    if needed is not None and capture and is_target and not _has_needed_child(node, needed):
        return None
    # 3. node pre-hooks
    if node._pre_hooks:
        for hook in list(node._pre_hooks.values()):
            out = hook(tuple(grads))
            if out is not None:
                grads = list(out)
    # 4. the node itself
    if all(g is None for g in grads):
        results: tuple = (None,) * len(node._edges)
        if not retain_graph and hasattr(node, "release"):
            node.release()
    else:
        try:
            results = node.apply(tuple(grads), retain_graph)
        except Exception as e:
            if anomaly._state.enabled:
                tb = node.metadata.get("traceback_", "")
                raise type(e)(
                    f"Error detected in {node.name()}. Traceback of forward call that caused "
                    f"the error:\n{tb}\n{e}"
                ) from e
            raise
        if not isinstance(results, tuple):
            results = (results,)
        if len(results) != len(node._edges):
            raise AutogradError(
                f"Function {node.name()} returned an incorrect number of gradients (expected "
                f"{len(node._edges)}, got {len(results)})"
            )
        if anomaly._state.enabled and anomaly._state.check_nan:
            for i, r in enumerate(results):
                if r is not None and np.isnan(r._data).any():
                    raise AutogradError(
                        f"Function '{node.name()}' returned nan values in its {i}th output."
                    )
    # 6. node post-hooks
    if node._post_hooks:
        for hook in list(node._post_hooks.values()):
            out = hook(results, tuple(grads))
            if out is not None:
                results = tuple(out)
    return results


def _has_needed_child(node: Node, needed: set) -> bool:
    return any(e[0] is not None and e[0] in needed for e in node._edges)


def _accumulate(node: AccumulateGrad, g: Tensor, create_graph: bool) -> None:
    var = node.variable
    _store_grad(var, g, create_graph)
    # 5. post-accumulate-grad hooks
    if var._post_acc_hooks:
        for hook in list(var._post_acc_hooks.values()):
            hook(var)
    if node._post_hooks:
        for hook in list(node._post_hooks.values()):
            hook((), (g,))
