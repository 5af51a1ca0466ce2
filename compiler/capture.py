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

The tape path skips the walk for graphs built inside a compiled region: each OpNode made there
is recorded on a ``Tape`` (``autograd/node.py``) with an interned state for the structure of
everything recorded before it.  ``tape_key`` turns the roots' states into a key, valid while
``graph_epoch`` has not moved since the tape began (no in-place change, hook, freeing or
``.data`` swap since: every saved tensor is current, the structure is the graph's); a
``Binding``, made from the walk on the first such backward, then finds the walk's saved arrays,
leaves and nodes in the new graph by tape position.  Anything else walks, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fusegrad import dtypes as _dt
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
    def of(cls, value: Value) -> SymbolicTensor:
        t = cls._make(np.broadcast_to(np.zeros((), value.dtype.np), value.shape))
        t._value = value
        return t


@dataclass
class Walk:
    """The result of the cheap walk: cache key plus runtime arguments in key order."""

    key: tuple
    nodes: list = field(default_factory=list)
    saved: list = field(default_factory=list)  # (node, SavedTensor) in key order
    saved_alias: list = field(default_factory=list)  # per saved: index of its first alias
    # saved index -> (primitive, attrs, saved index of its input): saved values recomputed in
    # the program from an array it reads anyway (see ``_plan_rematerialisation``)
    remat: dict = field(default_factory=dict)
    leaves: list = field(default_factory=list)  # leaf tensors in key order
    fallback: str | None = None
    index: dict = field(default_factory=dict)  # node -> position in ``nodes``
    has_hooks: bool = False  # user hooks run as opaque steps (effects then happen in order)


def _grad_meta(grad: Any) -> tuple | None:
    """What the key holds of a leaf's ``.grad``: whether it exists, and what decides if a kernel
    may add into it in place."""
    if grad is None:
        return None
    data = grad._data
    flags = data.flags
    return (data.shape, grad._dtype, grad.requires_grad, flags.writeable, flags.c_contiguous)


def _tensor_meta(t: Any) -> tuple:
    return (tuple(t._data.shape), t._dtype.name)


def walk(
    roots: Sequence[Tensor],
    grad_roots: Sequence[Tensor],
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
    create_graph: bool,
) -> Walk:
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
        # the array type is the device (numpy on the CPU, CudaArray on CUDA)
        key.append(("root", index.get(n, -1), nr, g._data.shape, g._dtype, type(g._data)))
    if inputs is not None:
        for t in inputs:
            n, nr = t._edge()
            key.append(("input", index.get(n, -1), nr))
    # The hot loop of every compiled backward: per node only attribute reads and tuple
    # building (dtype objects, not their names; attrs as items, frozen only if unhashable).
    append = key.append
    saved_out = out.saved
    aliases: dict = {}
    for n in order:
        kind = type(n)
        if kind is OpNode:
            hooks: tuple | None = None
            if n._pre_hooks or n._post_hooks or n._tensor_pre_hooks or n._retain_grad_hooks:
                # hook *counts* per site are structure; the callables are looked up at run time
                out.has_hooks = True
                hooks = (
                    len(n._pre_hooks or ()),
                    len(n._post_hooks or ()),
                    tuple(sorted((nr, len(h)) for nr, h in (n._tensor_pre_hooks or {}).items())),
                    tuple(sorted(n._retain_grad_hooks or ())),
                )
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
                    out.fallback = (
                        f"{n.name()} has freed its saved tensors"
                        if s._counter is None
                        else f"{n.name()} has saved-tensor hooks (user code on unpack)"
                    )
                    return out
                t = s._tensor
                data = s._data if t is None else t._data
                # which saved arrays are the same array is structure too: one program input
                # (and one kernel argument) per distinct array
                alias = aliases.setdefault(id(data), len(saved_out))
                smeta.append((data.shape, data.dtype, type(data), alias))
                saved_out.append((n, s))
                out.saved_alias.append(alias)
            append(
                (
                    n._prim.name,
                    tuple(n.attrs.items()),
                    tuple((index[c] if c is not None else -1, nr) for c, nr in n._edges),
                    n._input_meta,
                    tuple(smeta),
                    hooks,
                )
            )
        elif kind is AccumulateGrad:
            v = n.variable
            hooks = None  # (annotated above)
            if n._pre_hooks or n._post_hooks or v._hooks or v._post_acc_hooks:
                out.has_hooks = True
                hooks = (
                    len(n._pre_hooks or ()),
                    len(n._post_hooks or ()),
                    len(v._hooks or ()),
                    len(v._post_acc_hooks or ()),
                )
            gmeta = _grad_meta(v._grad)
            append(("leaf", v._data.shape, v._dtype, type(v._data), gmeta, hooks))
            out.leaves.append(v)
        else:
            out.fallback = _unsupported(n)
            return out
    out.nodes = order
    out.index = index
    out.remat = _plan_rematerialisation(out, aliases)
    if out.remat:
        key.append(("remat", tuple(sorted(out.remat.items()))))
    try:
        out.key = tuple(key)
        hash(out.key)
    except TypeError:  # an attribute value that is not hashable: freeze everything
        out.key = freeze(tuple(key))
    return out


# unary primitives cheap enough to recompute instead of reading their saved result from memory
# (a fused loop is memory-bound: one arithmetic op costs far less than loading 4 bytes)
REMATERIALISE = frozenset({"neg", "abs"})


def _plan_rematerialisation(w: Walk, aliases: dict) -> dict:
    """Saved inputs that are ``neg``/``abs`` of a leaf whose array the program reads anyway.

    Safe only if the leaf still holds the values the op saw: the op's node recorded its input's
    version (``OpNode._input_versions``, kept inside compiled regions) and the leaf is still at
    that version.  The decision (and so the version equality) is part of the cache key."""
    plan: dict = {}
    candidates = []
    for k, (_, s) in enumerate(w.saved):
        t = s._tensor
        producer = s._producer
        if t is None or type(producer) is not OpNode or s._output_nr != 0:
            continue
        if producer._prim.name not in REMATERIALISE or producer._input_versions is None:
            continue
        child = producer._edges[0][0]
        if type(child) is not AccumulateGrad:
            continue
        leaf = child.variable
        if leaf._version_counter.value != producer._input_versions[0]:
            continue
        candidates.append((k, producer, leaf))
    remat_ids = set()
    for k, producer, leaf in candidates:
        first = aliases.get(id(leaf._data))
        if first is None or first in remat_ids:
            continue  # the leaf's array is not read by the program: recomputing saves nothing
        plan[k] = (producer._prim.name, tuple(producer.attrs.items()), first)
        remat_ids.add(w.saved_alias[k])
    # keep only plans whose input is itself read from memory (not recomputed)
    return {k: p for k, p in plan.items() if p[2] not in remat_ids}


def _unsupported(n: Any) -> str:
    return f"{n.name()} is not a primitive's node (custom Function or other node type)"


def capture(
    w: Walk,
    roots: Sequence[Tensor],
    grad_roots: Sequence[Tensor],
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
) -> Graph:
    """Record the backward of ``roots`` as an IR graph (see the module docstring)."""
    graph = Graph()
    saved_index = {id(s): k for k, (_, s) in enumerate(w.saved)}
    leaf_index = {id(t): k for k, t in enumerate(w.leaves)}
    input_index = {id(t): k for k, t in enumerate(inputs or ())}
    current: list[str] = [""]
    saved_values: dict = {}  # alias class -> its input value

    # The hooks below are module-level globals while this capture runs; a backward running in
    # another thread at the same time must not see them: for it they step aside.
    me = threading.get_ident()

    def intercept(prim: registry.Primitive, args: tuple, attrs: dict) -> Any:
        if threading.get_ident() != me:
            return NotImplemented
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

    def saved_input(first: int) -> Value:
        """The program input for the saved array of alias class ``first``."""
        if first not in saved_values:
            s = w.saved[first][1]
            data = s._data if s._tensor is None else s._tensor._data
            dtype = s._tensor._dtype if s._tensor is not None else _dt.from_numpy_dtype(data.dtype)
            saved_values[first] = graph.input("saved", first, data.shape, dtype)
        return saved_values[first]

    def unpack(saved: Any, node: Any) -> Any:
        if threading.get_ident() != me:
            return NotImplemented
        # the real unpack first: the same version check and error as eager mode
        _node.capture_unpack = None
        try:
            saved.unpack(node)  # for its version check (and error) only
        finally:
            _node.capture_unpack = unpack
        k = saved_index.get(id(saved))
        if k is None:
            raise Fallback(f"{node.name()} unpacked a tensor the walk did not see")
        remat = w.remat.get(k)
        if remat is not None:  # recompute from the leaf the program reads anyway
            prim_name, attrs, leaf_first = remat
            source = saved_input(leaf_first)
            prim = registry.REGISTRY[prim_name]
            shape, dtype = prim.meta((source.shape,), (source.dtype,), **dict(attrs))
            value = graph.add(prim_name, (source,), dict(attrs), shape, dtype, origin=current[0])
            return SymbolicTensor.of(value)
        return SymbolicTensor.of(saved_input(w.saved_alias[k]))

    def as_value(g: Tensor) -> Value:
        # a gradient a rule built from nothing (e.g. zeros_like(g) for floor) is a constant
        return g._value if isinstance(g, SymbolicTensor) else graph.constant(g._data)

    seq = iter(range(1 << 62))  # side-effecting values are never interned together
    last_store: dict = {}  # id(tensor) -> its latest store_grad value (orders hooks after it)

    def store(t: Tensor, g: Tensor) -> Any:
        if threading.get_ident() != me:
            return NotImplemented
        if id(t) in leaf_index:
            target: tuple = ("grad", leaf_index[id(t)])
        elif id(t) in input_index:
            target = ("input_grad", input_index[id(t)])
        elif t.grad_fn is not None and t.grad_fn in w.index:
            target = ("retain_grad", w.index[t.grad_fn], t._output_nr)  # retain_grad()
        else:
            raise Fallback("a .grad write to a tensor the walk did not see")
        if not w.has_hooks:
            # no user code runs during this backward: writes can all happen at the end
            graph.effects.append((target[0], target[1], as_value(g)))
            return
        value = graph.add(
            "store_grad",
            (as_value(g),),
            {"target": target, "seq": next(seq)},
            (),
            _dt.bool_,
            origin=current[0],
        )
        last_store[id(t)] = value

    def call_hook(hook: Any, kind: str, node: Any, slot: int, position: int, *args: Any) -> Any:
        if threading.get_ident() != me:
            return hook(*args)
        # a user hook is an opaque step of the program: record where it sits and what it gets
        site = (w.index[node], kind, slot, position)
        if kind == "post_acc":
            var = args[0]
            graph.add(
                "hook",
                (last_store[id(var)],),
                {"site": site, "layout": (), "seq": next(seq)},
                (),
                _dt.bool_,
                origin=node.name(),
            )
            return None
        groups = [args[0]] if kind == "tensor" else list(args)
        layout = []
        values = []
        for group in groups:
            items = (group,) if kind == "tensor" else tuple(group)
            mask = []
            for item in items:
                mask.append(item is not None)
                if item is not None:
                    values.append(as_value(item))
            layout.append(tuple(mask))
        token = graph.add(
            "hook",
            tuple(values),
            {"site": site, "layout": tuple(layout), "seq": next(seq)},
            (),
            _dt.bool_,
            origin=node.name(),
        )
        # the hook may replace (a) the gradient (tensor hook), (b) the node's incoming
        # gradients (pre-hook) or (c) its results (post-hook): one hook_output per slot
        replaced = [args[0]] if kind == "tensor" else list(args[0])
        outs: list[SymbolicTensor | None] = []
        for i, item in enumerate(replaced):
            if item is None:
                outs.append(None)
                continue
            v = as_value(item)
            # position i of what the hook returns, or v itself when it returns None
            out = graph.add(
                "hook_output", (token, v), {"index": i}, v.shape, v.dtype, origin=node.name()
            )
            outs.append(SymbolicTensor.of(out))
        if kind == "tensor":
            return outs[0]
        return tuple(outs)

    engine_apply = _engine._apply

    def apply_named(node: Any, grads: Any, retain_graph: bool) -> Any:
        # remember which eager node's rule is running: IR values name it in comments/reports
        if threading.get_ident() == me:
            current[0] = node.name()
        return engine_apply(node, grads, retain_graph)

    sym_roots = [
        SymbolicTensor.of(graph.input("root", i, g._data.shape, g._dtype))
        for i, g in enumerate(grad_roots)
    ]
    prev = registry.set_interceptor(intercept)
    prev_unpack, prev_store = _node.capture_unpack, _engine.capture_store
    prev_call_hook = _engine.call_hook
    _node.capture_unpack, _engine.capture_store = unpack, store
    _engine._apply = apply_named
    _engine.call_hook = call_hook
    try:
        captured = _engine.run_backward(roots, sym_roots, True, False, inputs, accumulate)
    finally:
        registry.set_interceptor(prev)
        _node.capture_unpack, _engine.capture_store = prev_unpack, prev_store
        _engine._apply = engine_apply
        _engine.call_hook = prev_call_hook
    if not accumulate:
        for pos, g in enumerate(captured or ()):
            if g is not None:
                graph.effects.append(("capture", pos, as_value(g)))
    return graph


# ---- the tape path: a backward keyed and bound without walking the graph ----------------------


def tape_key(
    roots: Sequence[Tensor], grad_roots: Sequence[Tensor], accumulate: bool
) -> tuple[_node.Tape, tuple] | None:
    """The tape this backward's graph was recorded on and its key, or None (walk instead).

    Every root must be the output of a node on one of this thread's two latest tapes, and
    ``graph_epoch`` must not have moved since that tape's first node: then no saved tensor is
    stale or freed, no node got a hook, and the structure the tape recorded is the graph's
    (``autograd.node.Tape``).  The key is the tape state of the latest root (its prefix holds
    every node reachable from the roots) with the roots' positions and gradients' metadata."""
    state_of = _node.tape_state
    tape = None
    best = -1
    state = 0
    entries: list = [accumulate, len(roots)]
    for r, g in zip(roots, grad_roots):
        n, nr = r._edge()
        if type(n) is not OpNode or n._tape_serial == 0:
            return None
        if tape is None:
            for candidate in (state_of.tape, state_of.previous):
                if candidate is not None and candidate.serial == n._tape_serial:
                    tape = candidate
                    break
            else:
                return None
        elif n._tape_serial != tape.serial:
            return None
        index = n._tape_index
        if index > best:
            best, state = index, n._tape_state
        entries += (index, nr, g._data.shape, g._dtype)
    if tape is None or _node.graph_epoch.value != tape.epoch:
        return None
    return tape, (state, *entries)


class Unbindable(Exception):
    """A walk that a tape cannot reproduce (the backward then always walks)."""


class Binding:
    """Where a walk's runtime arguments are in any graph recorded with the same tape key.

    Built once from the walk of a backward whose tape key missed (``from_walk``); ``bind``
    then finds, in a fresh graph of the same structure, the walk's OpNodes (by tape position,
    in walk order), its saved arrays (walk order is node order, then each node's saved
    tensors), its leaves and the nodes to free — with no walk.  What the key does not fix is
    checked: the saved arrays the walk found to be one array (``saved_alias``) and the leaf
    arrays rematerialisation reads must still be the same arrays.  Arrays the walk found
    distinct but now are one need no check: the program then reads one array twice."""

    def __init__(self, w: Walk, tape: _node.Tape) -> None:
        op_nodes = [n for n in w.nodes if type(n) is OpNode]
        for n in op_nodes:
            if n._tape_serial != tape.serial or tape.nodes[n._tape_index]() is not n:
                raise Unbindable("a node of the walk is not on the tape")
        self.node_index = tuple(n._tape_index for n in op_nodes)
        leaf_number = {}
        for number, ref in enumerate(tape.leaves):
            acc = ref()
            if acc is not None:
                leaf_number[id(acc)] = number
        accumulators = [n for n in w.nodes if type(n) is AccumulateGrad]
        try:
            self.leaf_index = tuple(leaf_number[id(acc)] for acc in accumulators)
        except KeyError:
            raise Unbindable("a leaf of the walk is not on the tape") from None
        slots = [s for n in op_nodes for s in n._saved or ()]
        if len(slots) != len(w.saved) or any(a is not b for a, (_, b) in zip(slots, w.saved)):
            raise Unbindable("saved tensors out of walk order")
        self.aliases = tuple((k, j) for k, j in enumerate(w.saved_alias) if j != k)
        checks = []
        for k, (_prim, _attrs, first) in w.remat.items():
            leaf = w.saved[k][1]._producer._edges[0][0].variable
            position = next(i for i, t in enumerate(w.leaves) if t is leaf)
            checks.append((first, position))
        self.remat_checks = tuple(checks)
        self.release = tuple(p for p, n in enumerate(op_nodes) if n._saved)

    def signature(self) -> tuple:
        return (self.node_index, self.leaf_index, self.aliases, self.remat_checks)

    def bind(self, tape: _node.Tape) -> tuple[list, list, list] | None:
        """(saved arrays in walk order, leaves, nodes to free), or None when a check fails."""
        refs = tape.nodes
        try:
            nodes = [refs[i]() for i in self.node_index]
            arrays = [s._array for n in nodes for s in n._saved]
            accumulators = tape.leaves
            leaves = [accumulators[i]().variable for i in self.leaf_index]
        except (AttributeError, TypeError):  # a node or leaf gone or freed: cannot happen
            return None  # while the epoch holds, but never guess
        for k, j in self.aliases:
            if arrays[k] is not arrays[j]:
                return None
        for first, position in self.remat_checks:
            if arrays[first] is not leaves[position]._data:
                return None
        release = [nodes[p] for p in self.release]
        return arrays, leaves, release


def leaf_key(leaves: list) -> tuple | None:
    """The leaves' part of the walk key (shape, dtype, ``.grad`` state), or None when a leaf or
    its AccumulateGrad has hooks (the tape path runs no hooks)."""
    key = []
    for v in leaves:
        if v._hooks or v._post_acc_hooks:
            return None
        ref = v._accumulator
        acc = ref() if ref is not None else None
        if acc is not None and (acc._pre_hooks or acc._post_hooks):
            return None
        key.append(
            (
                v._data.shape,
                v._dtype,
                _grad_meta(v._grad),
            )
        )
    return tuple(key)
