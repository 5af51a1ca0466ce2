"""The tape: forwards recorded in a compiled region, so that their backward is keyed and bound
without walking the graph.

A compiled region (``fusegrad.compiler.Region``, the thread's tracer inside
``compiled_autograd()``) lets every primitive run eagerly and hands each node a call made
(``Tracer.made``) to ``record``, which appends it to this thread's current ``Tape``.  Each
recorded node gets a tape position and a *state*: an int that identifies the structure of the
whole prefix up to it -- per node its primitive, attributes, input and output shapes and
dtypes, and its edges, written as tape positions of earlier nodes or numbers of leaves (in order
of first use), so which node or leaf is the same object is part of it.  Equal states mean equal
prefixes: states are interned in a trie of ``(previous state, node entry)`` and never reused.
``tape_key`` turns the roots' states into the key of a backward, and a ``Binding`` (made once,
from the walk of the first such backward) finds the walk's saved arrays, leaves and nodes in any
graph recorded with the same key.

Nothing here is a promise that the graph is unchanged since it was recorded: the eager core keeps
no record of what happened to a graph, and the compiler asks it for none.  The structure a tape
records cannot change (a node's edges are fixed when it is made); everything else the program
relies on is checked by ``Binding.bind`` on every use -- no node has hooks, no saved tensor was
freed, modified in place or given unpack hooks, and leaves read for rematerialisation are at the
versions they had when their op ran -- and any failed check sends the backward to the walk, which
raises the eager engine's own errors.  The per-node part of these checks is skipped when the
eager core's change stamp (``graph_base.changes``: hook registrations, releases, version bumps
anywhere) has not moved since the tape's first node was made (``record`` reads it then).

The tape holds no reference to its nodes and only weak ones to its leaves' AccumulateGrad
nodes, so it never keeps a graph alive (and costs no object per node): a node's position is
found by its ``_seq``, which no other node ever has (an ``id`` may be reused once its object
is gone), a leaf's number by the ``id`` of its AccumulateGrad, confirmed through the weak
reference, and a ``Binding`` reaches the nodes it needs from the roots' nodes, through edges.

A tape stops recording (``open`` false) when a node has an edge to a node that is not on it
(made outside the region, on another thread, a custom Function), when saved-tensor hooks are
active, for CUDA tensors (their graphs take the walk, which keys the device), when an
attribute cannot be hashed, or past ``MAX_TAPE`` nodes; nodes recorded before that keep their
states.

State is per thread (``state``): the tape new nodes go on, and the previous one (each backward
in a region starts a new tape; a second root of the last forward is on the previous one).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from fusegrad.autograd import node as _node
from fusegrad.autograd.graph_base import changes
from fusegrad.autograd.node import AccumulateGrad, OpNode
from fusegrad.tensor import Tensor

# Nodes on one tape at most (a longer one stops recording; backward then walks the graph).
MAX_TAPE = 1 << 14
# Interned tape prefixes kept at most (cleared when full: costs sharing, never correctness).
MAX_TRIE = 1 << 18

# unary primitives whose saved result the program may recompute from the op's input when that
# input is a leaf the program reads anyway (``capture.plan_rematerialisation``): the tape keeps
# the leaf's version when the op ran, which the walk and ``Binding.bind`` compare with its
# version now
REMATERIALISE = frozenset({"neg", "abs"})

_serials = itertools.count(1)
_states = itertools.count(1)
_trie: dict = {}


class Tape:
    """The OpNodes created on one thread inside a compiled region, in creation order."""

    __slots__ = (
        "index_of",
        "leaf_of",
        "leaves",
        "open",
        "serial",
        "stamp",
        "state",
        "states",
        "versions",
    )

    def __init__(self) -> None:
        self.serial = next(_serials)
        self.states: list[int] = []  # prefix state after each position (its length: the nodes)
        self.index_of: dict[int, int] = {}  # node._seq -> tape position
        self.leaves: list = []  # weak references to AccumulateGrad nodes, by leaf number
        self.leaf_of: dict[int, int] = {}  # id(AccumulateGrad) -> leaf number
        self.versions: dict[int, int] = {}  # position -> its leaf input's version (remat only)
        self.state = 0  # the empty prefix
        self.open = True
        # ``changes.value`` when the tape's first node was recorded, right after it was made
        # (nothing between moves it): -1 while none is
        self.stamp = -1

    def position(self, node: Any) -> int:
        """``node``'s position on this tape, or -1."""
        if type(node) is not OpNode:  # (only OpNodes are recorded: their ``_seq`` is unique)
            return -1
        return self.index_of.get(node._seq, -1)


class _State(threading.local):
    """Per thread: how deep it is in compiled regions, the tape new nodes go on (None outside
    regions) and the previous one."""

    def __init__(self) -> None:
        self.active = 0
        self.tape: Tape | None = None
        self.previous: Tape | None = None

    def enter(self) -> None:
        self.active += 1
        if self.tape is None:
            self.tape = Tape()

    def exit(self) -> None:
        self.active -= 1
        if not self.active:  # a later region starts afresh
            self.tape = self.previous = None

    def next_tape(self) -> None:
        """A backward ran: later nodes go on a new tape."""
        if self.active:
            self.previous, self.tape = self.tape, Tape()

    def leaf_version(self, node: Any) -> int | None:
        """The version its leaf input had when ``node`` ran (only for ``REMATERIALISE``
        primitives recorded on this thread's two latest tapes), else None."""
        for tape in (self.tape, self.previous):
            if tape is not None:
                index = tape.position(node)
                if index >= 0:
                    return tape.versions.get(index)
        return None


state = _State()


def record(region: Any, node: OpNode, inputs: tuple, out: Tensor) -> None:
    """``Region.made``: append ``node`` (made by a primitive call on ``inputs``, result ``out``)
    to this thread's tape, while it is open.  Runs for every node made inside a compiled region,
    where its cost is that of the bytecodes it runs and of the tables it touches (which the
    forward's kernels evict), so it is kept lean: one frame (it is the region's method itself),
    one loop over the edges, one tuple and one trie lookup, no object kept per node, names bound
    once."""
    tape = state.tape
    if tape is None or not tape.open:
        return
    codes = []
    index_of = tape.index_of
    for child, nr in node._edges:
        if child is None:
            codes.append(-1)
            continue
        kind = type(child)
        if kind is OpNode:
            # (a node's ``_seq`` is never reused, unlike an ``id``: finding it in ``index_of``
            # proves that it is the node recorded there)
            index = index_of.get(child._seq, -1)
            if index < 0 or nr >= 1024:
                tape.open = False
                return
            codes.append(index << 10 | nr)
        elif kind is AccumulateGrad:
            number = tape.leaf_of.get(id(child), -1)
            if number < 0 or tape.leaves[number]() is not child:
                number = tape.leaf_of[id(child)] = len(tape.leaves)
                tape.leaves.append(_weak(child))
            codes.append(-2 - number)
        else:
            tape.open = False
            return
    if _node._hooks_in_use:  # a pack hook may have run: what is saved is the hooks'
        tape.open = False
        return
    data = out._data
    if type(data) is not _ndarray:  # CUDA graphs take the walk (it keys the device)
        tape.open = False
        return
    attrs = node.attrs
    name = node._prim.name
    entry = (
        tape.state,
        name,
        tuple(attrs.items()) if attrs else None,
        tuple(codes),
        node._input_meta,
        data.shape,
        out._dtype,
    )
    try:
        state_id = _trie.get(entry)
    except TypeError:  # an unhashable attribute value
        tape.open = False
        return
    if state_id is None:
        if len(_trie) >= MAX_TRIE:
            _trie.clear()
        state_id = _trie[entry] = next(_states)
    states = tape.states
    index = len(states)
    if index >= MAX_TAPE:
        tape.open = False
        return
    if not index:  # (nothing in the eager core moved the stamp since the node was made)
        tape.stamp = changes.value
    tape.state = state_id
    states.append(state_id)
    index_of[node._seq] = index
    if name in REMATERIALISE and codes[0] <= -2:
        tape.versions[index] = inputs[0]._version_counter.value


_ndarray = np.ndarray
_weak = weakref.ref


def tape_key(
    roots: Sequence[Tensor], grad_roots: Sequence[Tensor], accumulate: bool
) -> tuple[Tape, tuple, list] | None:
    """The tape this backward's graph was recorded on, its key and the roots' nodes, or None
    (walk instead).

    Every root must be the output of a node on one of this thread's two latest tapes.  The key
    is the tape state of the latest root (its prefix holds every node reachable from the roots)
    with the roots' positions and gradients' metadata."""
    tape = None
    best = -1
    entries: list = [accumulate, len(roots)]
    nodes = []
    for r, g in zip(roots, grad_roots):
        n, nr = r._edge()
        if type(n) is not OpNode:
            return None
        nodes.append(n)
        index = -1
        if tape is None:
            for candidate in (state.tape, state.previous):
                if candidate is not None:
                    index = candidate.position(n)
                    if index >= 0:
                        tape = candidate
                        break
        else:
            index = tape.position(n)
        if index < 0:
            return None
        best = max(best, index)
        entries += (index, nr, g._data.shape, g._dtype)
    if tape is None:
        return None
    return tape, (tape.states[best], *entries), nodes


class Unbindable(Exception):
    """A walk that a tape cannot reproduce (the backward then always walks)."""


class Binding:
    """Where a walk's runtime arguments are in any graph recorded with the same tape key.

    Built once from the walk of a backward whose tape key missed; ``bind`` then finds, in a
    fresh graph of the same structure, the walk's OpNodes in walk order -- from the roots' nodes,
    each node as edge ``e`` of one found before it: the key fixes every edge, so the path that
    led to a position in the first graph leads to the node at that position in any other -- its
    saved arrays (walk order is node order, then each node's saved tensors), its leaves and the
    nodes to free, checking what the key does not fix (see the module docstring): the saved
    arrays the walk found to be one array (``saved_alias``) must still be one array, and
    rematerialisation reads a leaf that must be the saved array's source, unchanged since its
    op ran.  Arrays the walk found distinct but now are one need no check: the program then reads
    one array twice."""

    def __init__(self, w: Any, tape: Tape, roots: list) -> None:
        op_nodes = [n for n in w.nodes if type(n) is OpNode]
        positions = [tape.position(n) for n in op_nodes]
        if any(p < 0 for p in positions):
            raise Unbindable("a node of the walk is not on the tape")
        self.node_index = tuple(positions)
        # the OpNodes reachable from the roots' nodes, breadth first: after the roots' own, each
        # found as edge ``e`` of the ``k``-th found (``paths``); ``order``: which found node each
        # node of the walk is
        found = list(roots)
        where: dict[int, int] = {}
        for k, n in enumerate(found):
            where.setdefault(id(n), k)
        paths = []
        k = 0
        while k < len(found):
            for e, (child, _) in enumerate(found[k]._edges):
                if type(child) is OpNode and id(child) not in where:
                    where[id(child)] = len(found)
                    found.append(child)
                    paths.append((k, e))
            k += 1
        order = [where.get(id(n), -1) for n in op_nodes]
        if -1 in order:
            raise Unbindable("a node of the walk is not reachable from the roots")
        self.paths = tuple(paths)
        self.order = tuple(order)
        accumulators = [n for n in w.nodes if type(n) is AccumulateGrad]
        numbers = []
        for acc in accumulators:
            number = tape.leaf_of.get(id(acc), -1)
            if number < 0 or tape.leaves[number]() is not acc:
                raise Unbindable("a leaf of the walk is not on the tape")
            numbers.append(number)
        self.leaf_index = tuple(numbers)
        slots = [s for n in op_nodes for s in n._saved or ()]
        if len(slots) != len(w.saved) or any(a is not b for a, (_, b) in zip(slots, w.saved)):
            raise Unbindable("saved tensors out of walk order")
        self.aliases = tuple((k, j) for k, j in enumerate(w.saved_alias) if j != k)
        position_of = {id(n): p for n, p in zip(op_nodes, positions)}
        checks = []
        for k, (_prim, _attrs, first) in w.remat.items():
            producer = w.saved[k][1]._producer
            leaf = producer._edges[0][0].variable
            leaf_position = next(i for i, t in enumerate(w.leaves) if t is leaf)
            checks.append((first, leaf_position, position_of[id(producer)]))
        self.remat_checks = tuple(checks)
        self.release = tuple(p for p, n in enumerate(op_nodes) if n._saved)

    def signature(self) -> tuple:
        return (
            self.node_index,
            self.paths,
            self.order,
            self.leaf_index,
            self.aliases,
            self.remat_checks,
        )

    def bind(self, tape: Tape, roots: list) -> tuple[list, list, list] | None:
        """(saved arrays in walk order, leaves, nodes to free) in the graph of the roots' nodes
        ``roots`` (recorded on ``tape`` with this binding's key), or None when a check fails."""
        found = list(roots)
        append = found.append
        for k, e in self.paths:
            append(found[k]._edges[e][0])
        nodes = [found[k] for k in self.order]
        if tape.stamp == changes.value:
            # no hook registered, nothing released, no version bumped anywhere since the tape's
            # first node was made: its nodes are as they were recorded
            arrays = []
            for n in nodes:
                arrays += n.saved_arrays()
        else:
            checked = self._checked_arrays(nodes)
            if checked is None:
                return None
            arrays = checked
        accumulators = tape.leaves
        leaves = []
        for i in self.leaf_index:
            acc = accumulators[i]()
            if acc is None:
                return None
            leaves.append(acc.variable)
        for k, j in self.aliases:
            if arrays[k] is not arrays[j]:
                return None
        versions = tape.versions
        for first, leaf_position, node_position in self.remat_checks:
            leaf = leaves[leaf_position]
            if (
                arrays[first] is not leaf._data
                or versions.get(node_position) != leaf._version_counter.value
            ):
                return None
        release = [nodes[p] for p in self.release]
        return arrays, leaves, release

    @staticmethod
    def _checked_arrays(nodes: list) -> list | None:
        """The saved arrays of ``nodes`` in walk order, or None when a node has hooks or was
        freed, or a saved tensor was modified in place or has unpack hooks."""
        arrays: list = []
        append = arrays.append
        for n in nodes:
            if (
                n._saved is None  # freed: the walk raises the eager error
                or n._pre_hooks is not None
                or n._post_hooks is not None
                or n._tensor_pre_hooks is not None
                or n._retain_grad_hooks is not None
            ):
                return None
            for s in n._saved:
                counter = s._counter
                if counter is None or counter.value != s._version or s._unpack_hook is not None:
                    return None
                t = s._tensor
                append(s._data if t is None else t._data)
        return arrays


def grad_meta(grad: Any) -> tuple | None:
    """What a key holds of a leaf's ``.grad``: whether it exists, and what decides if a kernel
    may add into it in place."""
    if grad is None:
        return None
    data = grad._data
    flags = data.flags
    return (data.shape, grad._dtype, grad.requires_grad, flags.writeable, flags.c_contiguous)


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
        key.append((v._data.shape, v._dtype, grad_meta(v._grad)))
    return tuple(key)
