"""The key of a backward: a cheap, deterministic walk of the live eager graph (``walk``), the
first thing every compiled backward does (compiled autograd, and the backward inside a recorded
whole step or module).

The walk visits the nodes reachable from the roots (iterative DFS, preorder) and builds:

* the cache **key** (``Walk.key``): node types, primitive attributes, edge structure, dtypes,
  ranks, which sizes are 0 or 1 and which are equal to each other, which leaves get gradients,
  hook counts per site, the call's flags, the structure of checkpoint recordings -- never the
  sizes themselves (``_Sizes``: every size of 2 or more becomes a numbered symbol);
* the **runtime arguments** in key order: the size vector (``Walk.sizes``), the saved tensors
  (and what checkpoint recordings read: ``Walk.saved``), the leaves, the leaves' ``.grad`` state
  (``Walk.grad_key``: it changes the program built from a graph, not the graph);
* what the capture needs to know: custom Functions that will run as opaque steps
  (``Walk.opaque``), checkpoint recordings to replay (``Walk.regions``), nodes eager would not
  run (``Walk.unrun``), saved values recomputed instead of read (``Walk.remat``).

Anything that cannot be keyed (a forward-AD level, freed saved tensors, a hand-built node, ...)
ends the walk with ``Walk.fallback``; what a front end then does with a complete walk is
``admission.admit``'s decision.

The walk is one object, ``KeyBuilder``, whose state (the key list, the saved list, the alias
map, the checkpoint regions, the leaves) is explicit in its attributes, and whose steps are
named methods: ``order_nodes`` -> ``call_entries`` -> ``node_entries``
(``function_entry``, ``saved_entries``, ``packed_entry``, ``region_entry``,
``reentrant_entry``, ``leaf_entry``) -> ``finish``.  A saved tensor's index is always taken
*after* whatever keying it may add entries to the saved list (a nested checkpoint's enclosing
recording is keyed first).  Caches of what was keyed live in ``cache`` and ``service``.  See
docs/ARCHITECTURE.md, "Keys".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fusegrad.autograd import anomaly
from fusegrad.autograd import engine as _engine
from fusegrad.autograd.forward_state import state as _forward_state
from fusegrad.autograd.function import FunctionCtx
from fusegrad.autograd.node import AccumulateGrad, OpNode
from fusegrad.autograd.recording import Recording
from fusegrad.autograd.tracer import tracing
from fusegrad.ops.registry import RULES as _RULES
from fusegrad.random import default_generator
from fusegrad.tensor import Tensor
from fusegrad.utils.checkpoint import CheckpointFunction

from . import symbolic
from .functions import (
    CTX_INTERNAL,
    NONE_GRADIENTS,
    CtxTensor,
    Untraceable,
    ctx_attribute_key,
    function_globals_key,
    reads_plain_values,
)
from .ir import freeze
from .tape import REMATERIALISE
from .tape import state as tape_state

# node types the capture inlines (``double.CompiledGradBackward``): type -> an object with
# ``key(node)`` (its part of the walk key) and ``inline(capture, node, grads)`` (its results)
INLINED: dict[type, Any] = {}


@dataclass
class Walk:
    """The result of the cheap walk: cache key plus runtime arguments in key order."""

    key: tuple
    sizes: tuple = ()  # the size vector: symbol k's value is sizes[k]
    grad_key: tuple = ()  # the leaves' .grad state (what a program, not a graph, depends on)
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
    # with ``inputs`` (grad(), backward(inputs=...)): the OpNodes the eager engine does not run
    # -- those only reached through an input, and an input's own node when nothing needed lies
    # beyond it -- whose saved tensors are neither read, checked nor freed (as in eager)
    unrun: frozenset = frozenset()
    # Function node -> {attribute name: CtxTensor} (its tensor attributes, in ``saved``)
    ctx_tensors: dict = field(default_factory=dict)
    # Function node -> why its ``backward`` cannot be traced: it runs as an opaque step of the
    # program (the eager ``backward``, like a user hook), found by the walk; ``Captured.opaque``
    # holds those the capture found
    opaque: dict = field(default_factory=dict)
    # compiled autograd doing DistributedDataParallel's averaging (``ddp.plan``): the program
    # starts each bucket's allreduce where the hooks would; the hooks themselves do not run
    ddp: Any = None
    # checkpointed functions whose recomputation the program runs from their recordings
    # (``autograd.recording``): (recording, saved indices of its arguments, of its tensors from
    # outside, {op index: saved index} of its random draws); and per saved tensor a holder
    # stands for: (region number, ref)
    regions: list = field(default_factory=list)
    region_of: dict = field(default_factory=dict)
    # reentrant checkpoint node -> its region: its backward is the recording's (``Capture``)
    reentrant: dict = field(default_factory=dict)
    # why the recordings of non-reentrant checkpoints whose unpack hooks run are not replayed
    reruns: list = field(default_factory=list)


def sized_attrs(prim: Any, attrs: dict, size: Any) -> dict:
    """``attrs`` of a call of ``prim`` with ``size`` applied to every size in its size
    attributes (``symbolic.map_size_attr``)."""
    return {
        k: symbolic.map_size_attr(k, v, size) if k in prim.size_attrs else v
        for k, v in attrs.items()
    }


class _Unversioned:
    """The version counter of a value no one writes."""

    __slots__ = ()
    value = 0


class RedrawnTensor:
    """A random draw inside a checkpointed function (``autograd.recording``): a program input
    drawn again, whenever the program reads it, by ``redo`` from the default generator set to
    ``state`` (its state before the forward's draw, put back afterwards), as eager's
    recomputation with ``preserve_rng_state`` draws it: the forward's numbers, not kept."""

    __slots__ = ("_redo", "_state")
    _counter = _Unversioned()
    _version = 0
    _data = None
    _unpack_hook = None
    _producer = None
    _output_nr = 0
    _is_output = False

    def __init__(self, redo: Any, state: Any) -> None:
        self._redo = redo
        self._state = state

    @property
    def _tensor(self) -> Tensor:
        now = default_generator.get_state()
        default_generator.set_state(self._state)
        try:
            with tracing(None):  # (no tracer of this thread sees the draw)
                return self._redo()  # type: ignore[no-any-return]
        finally:
            default_generator.set_state(now)

    def unpack(self, node: Any) -> Tensor:
        return self._tensor


class _Sizes:
    """Duck sizing for one walk: each size of 2 or more becomes its symbol (``2 + k`` in the key,
    where no literal size of 2 or more remains), 0 and 1 stay literal."""

    __slots__ = ("of", "shapes", "values")

    def __init__(self) -> None:
        self.of: dict[int, int] = {}
        self.values: list[int] = []
        self.shapes: dict[tuple, tuple] = {}

    def size(self, d: int) -> int:
        if d < 2:
            return d
        k = self.of.get(d)
        if k is None:
            k = self.of[d] = len(self.values)
            self.values.append(d)
        return k + 2

    def shape(self, shape: tuple) -> tuple:
        out = self.shapes.get(shape)
        if out is None:
            out = self.shapes[shape] = tuple([self.size(d) for d in shape])
        return out


def grad_state(leaf: Any) -> tuple | None:
    """What a program depends on of a leaf's ``.grad``: whether it exists, and what decides if a
    kernel may add into it in place."""
    grad = leaf._grad
    if grad is None:
        return None
    data = grad._data
    flags = data.flags
    return (
        grad._dtype,
        grad.requires_grad,
        bool(flags.writeable),
        bool(flags.c_contiguous),
        data.shape == leaf._data.shape,
    )


class _Stop(Exception):
    """The walk ends here: ``Walk.fallback`` says why."""


class KeyBuilder:
    """One walk (see the module docstring).  State, all explicit:

    * ``out``: the ``Walk`` being filled (its ``saved``, ``saved_alias``, ``leaves``,
      ``regions``, ... lists grow in key order);
    * ``key``: the key's entries so far; ``grad_key``: the leaves' ``.grad`` states;
    * ``sizes``: the size symbols; ``aliases``: ``id(array)`` -> the saved index of its first
      appearance (which saved arrays are the same array is structure too);
    * ``regions``: ``id(recording)`` -> its region number (-1: its Python runs again);
    * ``index``, ``order``: the nodes in walk order; ``unrun``: nodes eager does not run."""

    def __init__(
        self,
        roots: Sequence[Tensor],
        grad_roots: Sequence[Tensor],
        inputs: Sequence[Tensor] | None,
        accumulate: bool,
        create_graph: bool,
    ) -> None:
        self.roots = roots
        self.grad_roots = grad_roots
        self.inputs = inputs
        self.accumulate = accumulate
        self.create_graph = create_graph
        self.out = Walk(key=())
        self.key: list = []
        self.grad_key: list = []
        self.sizes = _Sizes()
        self.aliases: dict[int, int] = {}
        self.regions: dict[int, int] = {}
        self.index: dict = {}
        self.order: list = []
        self.unrun: frozenset = frozenset()

    def walk(self) -> Walk:
        """Run every step; the finished ``Walk`` (with ``fallback`` set where it stopped)."""
        out = self.out
        if _forward_state.level is not None:
            # the rules' ops must run on the dual values to propagate tangents (forward over
            # reverse); a compiled program would drop them
            out.fallback = "a forward-AD dual level is active (tangents flow through the backward)"
            return out
        try:
            self.order_nodes()
            self.call_entries()
            self.node_entries()
        except _Stop:
            return out
        self.finish()
        return out

    def stop(self, reason: str) -> None:
        self.out.fallback = reason
        raise _Stop

    # ---- the nodes and the call -----------------------------------------------------------------
    def order_nodes(self) -> None:
        """The nodes reachable from the roots in preorder; with ``inputs``, those eager's engine
        does not run (``Walk.unrun``)."""
        index, order = self.index, self.order
        self.root_edges = [r._edge() for r in self.roots]
        stack = [n for n, _ in reversed(self.root_edges) if n is not None]
        while stack:
            n = stack.pop()
            if n in index:
                continue
            index[n] = len(order)
            order.append(n)
            for child, _ in reversed(n._edges):
                if child is not None and child not in index:
                    stack.append(child)
        if self.inputs is not None:
            targets = {n for n, _ in (t._edge() for t in self.inputs) if n is not None}
            needed = _engine._needed(index, targets)
            self.unrun = self.out.unrun = frozenset(
                n
                for n in order
                if type(n) is not AccumulateGrad
                and (
                    n not in needed
                    or (n in targets and not any(c in needed for c, _ in n._edges if c is not None))
                )
            )

    def call_entries(self) -> None:
        """The call's flags, its roots and the inputs of ``grad()``."""
        shape = self.sizes.shape
        index = self.index
        # anomaly mode: the program checks each node's gradients for NaN (``Capture.check_nan``);
        # create_graph: its gradients get a differentiable node (``double``)
        check_nan = anomaly._state.enabled and anomaly._state.check_nan
        key = self.key
        key.append(("call", self.accumulate, len(self.roots), check_nan, self.create_graph))
        for (n, nr), g in zip(self.root_edges, self.grad_roots):
            # the array type is the device (numpy on the CPU, CudaArray on CUDA)
            key.append(
                ("root", index.get(n, -1), nr, shape(g._data.shape), g._dtype, type(g._data))
            )
        if self.inputs is not None:
            for t in self.inputs:
                n, nr = t._edge()
                key.append(("input", index.get(n, -1), nr))

    def node_entries(self) -> None:
        """One entry per node, in walk order.  The hot loop of every walked backward: per node
        only attribute reads and tuple building (dtype objects, not their names; attrs as
        items, frozen only if unhashable), and a method call for its saved tensors."""
        append = self.key.append
        unrun = self.unrun
        index = self.index
        shape = self.sizes.shape
        saved_entries = self.saved_entries
        for n in self.order:
            kind = type(n)
            if kind is OpNode or kind is FunctionCtx or kind in INLINED:
                hooks = None
                if n._pre_hooks or n._post_hooks or n._tensor_pre_hooks or n._retain_grad_hooks:
                    hooks = self.hook_counts(n)
                skipped = n in unrun
                smeta = saved_entries(n, kind, skipped)
                common = (
                    tuple((index[c] if c is not None else -1, nr) for c, nr in n._edges),
                    tuple([(shape(s), d) for s, d in n._input_meta]),
                    tuple(smeta),
                    hooks,
                    "unrun" if skipped else None,
                )
                if kind is OpNode:
                    prim = n._prim
                    if n._rule is not _RULES.get(prim.name):
                        # a node built by hand with a rule of its own: programs are keyed by
                        # primitive
                        self.stop(
                            f"{n.name()} has a derivative rule of its own (not its primitive's)"
                        )
                    attrs = n.attrs
                    if prim.size_attrs:
                        attrs = sized_attrs(prim, attrs, self.sizes.size)
                    append((prim.name, tuple(attrs.items()), *common))
                elif kind is FunctionCtx:
                    append((self.function_entry(n), *common))
                else:
                    append((INLINED[kind].key(n), *common))
            elif kind is AccumulateGrad:
                append(self.leaf_entry(n))
            elif n in unrun:
                # past the inputs of a grad()-like walk (a compiled module called on another
                # compiled module's output): never run, only its place in the order is keyed
                append(("unrun", n.name(), len(n._edges)))
            else:
                self.stop(
                    f"{n.name()} is not a primitive's node (custom Function or other node type)"
                )

    def hook_counts(self, n: Any) -> tuple:
        """The hook *counts* per site of a node with hooks: structure (the callables are
        looked up at run time)."""
        self.out.has_hooks = True
        return (
            len(n._pre_hooks or ()),
            len(n._post_hooks or ()),
            tuple(sorted((nr, len(h)) for nr, h in (n._tensor_pre_hooks or {}).items())),
            tuple(sorted(n._retain_grad_hooks or ())),
        )

    def leaf_entry(self, n: AccumulateGrad) -> tuple:
        """A leaf: its shape, dtype, device and hook counts; its ``.grad`` state apart."""
        v = n.variable
        hooks = None
        if n._pre_hooks or n._post_hooks or v._hooks or v._post_acc_hooks:
            self.out.has_hooks = True
            hooks = (
                len(n._pre_hooks or ()),
                len(n._post_hooks or ()),
                len(v._hooks or ()),
                len(v._post_acc_hooks or ()),
            )
        self.grad_key.append(grad_state(v))
        self.out.leaves.append(v)
        return ("leaf", self.sizes.shape(v._data.shape), v._dtype, type(v._data), hooks)

    # ---- saved tensors --------------------------------------------------------------------------
    def saved_entries(self, n: Any, kind: type, unrun: bool) -> list:
        """The key entries of node ``n``'s saved tensors; each goes on the saved list."""
        saved = n._saved
        if unrun:
            return []  # (the key still holds its place: ``"unrun"``)
        if saved is None:
            if kind is OpNode and n._rule.save_index or kind is not OpNode and n._released:
                # freed: the eager engine raises its "Specify retain_graph=True" error
                self.stop(f"{n.name()} has freed its saved tensors")
            return []
        smeta: list = []
        out, aliases, shape = self.out, self.aliases, self.sizes.shape
        saved_out = out.saved
        for s in saved:
            if s is None:  # (a Function saved None)
                smeta.append(None)
                continue
            if s._counter is None:
                self.stop(f"{n.name()} has freed its saved tensors")
            if s._unpack_hook is not None:
                smeta.append(self.packed_entry(n, s))
                continue
            t = s._tensor
            data = s._data if t is None else t._data
            # one program input (and one kernel argument) per distinct array
            alias = aliases.setdefault(id(data), len(saved_out))
            smeta.append((shape(data.shape), data.dtype, type(data), alias))
            saved_out.append((n, s))
            out.saved_alias.append(alias)
        return smeta

    def save(self, n: Any, s: Any, alias: int | None = None) -> int:
        """Put saved tensor ``s`` of ``n`` on the saved list; its index (its own alias unless
        ``alias`` is given)."""
        out = self.out
        k = len(out.saved)
        out.saved.append((n, s))
        out.saved_alias.append(k if alias is None else alias)
        return k

    def packed_entry(self, n: Any, s: Any) -> tuple:
        """Saved tensor ``s`` of ``n``, packed by saved-tensor hooks: a checkpoint's, recomputed
        from its recording; else its unpack hook runs as an opaque step of the program (user
        code, so effects keep their eager order), built for the packed tensor's shape and
        dtype."""
        holder = s._packed
        rec = getattr(holder, "recording", None)
        out = self.out
        if type(rec) is Recording and rec.broken is None and not self.create_graph:
            number = self.regions.get(id(rec))
            if number is None:
                number = self.regions[id(rec)] = self.region_entry(n, rec)
            # (the index after keying the region, which may add entries before this one)
            k = len(out.saved)
            out.region_of[k] = (number, holder.ref)
            self.save(n, s)
            return ("region", number, holder.ref)
        if type(rec) is Recording and id(rec) not in self.regions:
            self.regions[id(rec)] = -1
            out.reruns.append(rec.broken or "create_graph=True")
        out.has_hooks = True
        mshape, mdtype, mtype = s._meta
        self.save(n, s)
        return (self.sizes.shape(mshape), mdtype, mtype, "unpack")

    # ---- checkpoint recordings ------------------------------------------------------------------
    def region_entry(self, n: Any, rec: Recording) -> int:
        """Key recording ``rec`` (the ops, with their size attributes as the walk's sizes) and
        add its arguments and its tensors from outside to the saved list; its number."""
        shape, aliases = self.sizes.shape, self.aliases
        args = []
        for a in rec.args:  # (version-checked when the program unpacks them, as eager does)
            if a._unpack_hook is not None:  # packed by an enclosing checkpoint's hooks
                # (keying the enclosing recording first may add entries: ``a`` is the last)
                meta = self.packed_entry(n, a)
                args.append((len(self.out.saved) - 1, meta))
                continue
            k = len(self.out.saved)
            t = a._tensor
            data = a._data if t is None else t._data
            alias = aliases.setdefault(id(data), k)
            self.save(n, a, alias)
            args.append((k, (shape(data.shape), data.dtype, type(data), alias)))
        outside = []
        for t in rec.outside:  # (read as they are now, as the Python re-run would read them)
            k = len(self.out.saved)
            data = t._data
            alias = aliases.setdefault(id(data), k)
            self.save(n, CtxTensor(t), alias)
            outside.append((k, (shape(data.shape), t._dtype, type(data), alias)))
        ops, draws = self.recorded_ops(n, rec)
        self.key.append(
            (
                "region",
                tuple(m for _, m in args),
                tuple(m for _, m in outside),
                tuple(ops),
                tuple((t._data.item(), t._dtype) for t in rec.numbers),
            )
        )
        self.out.regions.append((rec, [k for k, _ in args], [k for k, _ in outside], draws))
        return len(self.out.regions) - 1

    def recorded_ops(self, n: Any, rec: Recording) -> tuple[list, dict]:
        """A recording's ops as key entries, and its random draws (drawn again on every run:
        each an input of its own, on the saved list)."""
        shape = self.sizes.shape
        ops: list = []
        draws: dict = {}
        for i, op in enumerate(rec.ops):
            if op[0] == "full":
                ops.append(("full", shape(op[1]), op[2], op[3]))
                continue
            if op[0] == "draw":
                draws[i] = self.save(n, RedrawnTensor(op[1], op[2]))
                ops.append(("draw", op[3], shape(op[4]), op[5]))
                continue
            prim, attrs, refs = op[1], op[2], op[3]
            if prim.size_attrs:
                attrs = sized_attrs(prim, attrs, self.sizes.size)
            ops.append((prim.name, tuple(attrs.items()), refs))
        return ops, draws

    def replayable(self, rec: Recording) -> bool:
        """Whether the backward of a reentrant checkpoint can be its recording's backward: a
        plain ``backward()`` (eager's raises otherwise), and what the recording reads from
        outside that needs a gradient are leaves without hooks (the inner backward's writes
        are then ``.grad`` writes, in any order)."""
        if rec.broken is not None or self.create_graph or self.inputs is not None:
            return False
        if not self.accumulate or not _engine.is_checkpoint_valid() or not rec.outputs:
            return False
        for t in rec.outside:
            if t._requires_grad or t.grad_fn is not None:
                if t.grad_fn is not None or t._hooks or t._post_acc_hooks:
                    return False
                acc = t._accumulator() if t._accumulator is not None else None
                if acc is not None and (acc._pre_hooks or acc._post_hooks):
                    return False
        return True

    def reentrant_entry(self, n: FunctionCtx, rec: Recording) -> tuple:
        """The key entry of reentrant checkpoint ``n`` replayed from ``rec``: the recording,
        and the leaves from outside it that the inner backward writes ``.grad`` of."""
        number = self.regions[id(rec)] = self.region_entry(n, rec)
        self.out.reentrant[n] = number
        shape = self.sizes.shape
        for t in rec.outside:
            if t._requires_grad:
                self.key.append(("leaf", shape(t._data.shape), t._dtype, type(t._data), None))
                self.grad_key.append(grad_state(t))
                self.out.leaves.append(t)
        return (
            "checkpoint",
            number,
            n.materialize_grads,
            n.needs_input_grad,
            tuple(n.tensor_indices),
            tuple((shape(s), d) for s, d in n._output_meta),
        )

    # ---- custom Functions -----------------------------------------------------------------------
    def function_entry(self, n: FunctionCtx) -> tuple:
        """A custom Function's node: a reentrant checkpoint replayed from its recording, a
        traced ``backward``, or an opaque step when its ``backward`` cannot be traced."""
        rec = n.__dict__.get("recording") if n._cls is CheckpointFunction else None
        try:
            if rec is not None and self.replayable(rec):
                return self.reentrant_entry(n, rec)
            return self.traced_function_entry(n, n in self.unrun)
        except Untraceable as e:
            self.out.opaque[n] = f"{n.name()}: {e}"
            self.out.has_hooks = True  # (user code runs inside: effects in eager order)
            return self.opaque_function_entry(n)

    def traced_function_entry(self, n: FunctionCtx, unrun: bool) -> tuple:
        """Custom Function node ``n`` apart from its edges, inputs and saved tensors: its class
        and ``backward``, what ``backward`` reads from globals and closures, the ctx's
        attributes (its tensors become program inputs, ``Walk.ctx_tensors``), its flags and
        outputs (``functions``; raises ``Untraceable``)."""
        cls = n._cls
        backward = cls.backward
        if unrun:
            return ("function", cls, backward)
        globals_key = function_globals_key(backward)
        attrs: list = []
        tensors: dict = {}
        w, shape, aliases = self.out, self.sizes.shape, self.aliases
        start = len(w.saved)
        try:
            for name, value in n.__dict__.items():
                if name in CTX_INTERNAL:
                    continue
                if isinstance(value, Tensor):
                    obj = CtxTensor(value)
                    data = value._data
                    alias = aliases.setdefault(id(data), len(w.saved))
                    self.save(n, obj, alias)
                    tensors[name] = obj
                    attrs.append((name, shape(data.shape), value._dtype, type(data), alias))
                else:
                    attrs.append((name, ctx_attribute_key(name, value)))
        except Untraceable:
            # (the node runs opaquely: its tensor attributes are no program inputs after all,
            # and the walk's saved list must not depend on which attribute failed)
            for k in range(start, len(w.saved)):
                data = w.saved[k][1]._tensor._data
                if aliases.get(id(data)) == k:
                    del aliases[id(data)]
            del w.saved[start:], w.saved_alias[start:]
            raise
        if tensors:
            w.ctx_tensors[n] = tensors
        return (
            "function",
            cls,
            backward,
            globals_key,
            tuple(attrs),
            n.materialize_grads,
            n.needs_input_grad,
            tuple((shape(s), d) for s, d in n._output_meta),
        )

    def opaque_function_entry(self, n: FunctionCtx) -> tuple:
        """Custom Function node ``n`` run as an opaque step: the eager ``backward`` is called on
        the node itself, so only what the program's structure depends on counts -- which inputs
        get a gradient from it (``Capture._opaque_function``)."""
        shape = self.sizes.shape
        return (
            "function",
            n._cls,
            n._cls.backward,
            "opaque",
            n.materialize_grads,
            n.needs_input_grad,
            NONE_GRADIENTS.get(n._cls),
            tuple((shape(s), d) for s, d in n._output_meta),
        )

    # ---- the end ------------------------------------------------------------------------------
    def finish(self) -> None:
        """The walk's results: nodes, sizes, ``.grad`` states, rematerialisation, the key."""
        out = self.out
        out.nodes = self.order
        out.index = self.index
        out.remat = _plan_rematerialisation(out, self.aliases)
        key = self.key
        if out.remat:
            key.append(("remat", tuple(sorted(out.remat.items()))))
        out.sizes = tuple(self.sizes.values)
        out.grad_key = tuple(self.grad_key)
        try:
            out.key = tuple(key)
            hash(out.key)
        except TypeError:  # an attribute value that is not hashable: freeze everything
            out.key = freeze(tuple(key))


class BackwardCall:
    """One ``backward()``/``grad()`` call's arguments, as the engine hands them to a tracer
    (``Tracer.backward``); ``eagerly()`` runs it on the eager engine."""

    __slots__ = ("accumulate", "create_graph", "grads", "inputs", "outputs", "retain_graph")

    def __init__(
        self,
        outputs: Sequence[Tensor],
        grads: Sequence[Tensor],
        retain_graph: bool,
        create_graph: bool,
        inputs: Sequence[Tensor] | None,
        accumulate: bool,
    ) -> None:
        self.outputs = outputs
        self.grads = grads
        self.retain_graph = retain_graph
        self.create_graph = create_graph
        self.inputs = inputs
        self.accumulate = accumulate

    def eagerly(self) -> Any:
        return _engine.run_backward(
            self.outputs,
            self.grads,
            self.retain_graph,
            self.create_graph,
            self.inputs,
            self.accumulate,
        )


def walk(
    roots: Sequence[Tensor],
    grad_roots: Sequence[Tensor],
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
    create_graph: bool,
) -> Walk:
    """The key and runtime arguments of a backward (see the module docstring)."""
    return KeyBuilder(roots, grad_roots, inputs, accumulate, create_graph).walk()


def replay_reason(w: Walk) -> str | None:
    """Why a backward of walk ``w`` must not be replayed without walking it again (a whole
    step, compile(module)): a traced custom Function's backward that reads Python values from
    globals or closures, which only the walk's key checks."""
    for n in w.nodes:
        if type(n) is FunctionCtx and reads_plain_values(function_globals_key(n._cls.backward)):
            return (
                f"the backward of {n.name()} reads Python values from globals or closures, "
                "which a replay does not check"
            )
    return None


def _plan_rematerialisation(w: Walk, aliases: dict) -> dict:
    """Saved inputs that are ``neg``/``abs`` of a leaf whose array the program reads anyway
    (cheap enough to recompute instead of reading their saved result from memory: a fused loop
    is memory-bound, and one arithmetic op costs far less than loading 4 bytes).

    Safe only if the leaf still holds the values the op saw: the op was recorded on this
    thread's tape, which kept the leaf's version then (``tape.REMATERIALISE``), and the leaf is
    still at that version.  The decision (and so the version equality) is part of the key."""
    plan: dict = {}
    candidates = []
    for k, (_, s) in enumerate(w.saved):
        producer = s._producer
        if type(producer) is not OpNode or s._output_nr != 0 or s._tensor is None:
            continue
        if producer._prim.name not in REMATERIALISE:
            continue
        child = producer._edges[0][0]
        if type(child) is not AccumulateGrad:
            continue
        leaf = child.variable
        if leaf._version_counter.value != tape_state.leaf_version(producer):
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
