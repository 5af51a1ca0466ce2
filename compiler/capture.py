"""Capture: turn one ``backward()`` / ``autograd.grad()`` call into a backward IR graph.

Two steps, both over the live eager graph:

1. ``walk`` -- a cheap, deterministic walk of the nodes reachable from the roots (iterative DFS,
   preorder) that builds the cache *key* (node types, primitive attributes, edge structure,
   dtypes, ranks, which sizes are 0 or 1 and which are equal to each other, which leaves get
   gradients, the call's flags, the structure of checkpoint recordings) and collects the
   runtime arguments in a fixed order: the size vector (every size of 2 or more, numbered in
   order of first appearance: ``symbolic``), the nodes' saved tensors (and what checkpoint
   recordings read) and the leaves.  The leaves' ``.grad`` state is kept apart
   (``Walk.grad_key``): it changes the program built from a graph, not the graph.  Anything the
   compiler cannot run (a forward-AD level, freed saved tensors, a hand-built node, ...) is
   reported as a fallback reason instead; a custom Function whose ``backward`` the key cannot
   vouch for becomes an opaque step (``Walk.opaque``).
2. ``Capture`` -- on a cache miss, the *same* engine (``engine.run_backward``) runs the *same*
   derivative rules, with a ``Capture`` as its executor (DESIGN.md contracts 1, 3 and 10): the
   roots' gradients and saved tensors are ``SymbolicTensor``s, tensors with a shape and dtype but
   no data, and the capture is this thread's tracer for the duration, so every primitive call of
   a rule comes to ``Capture.apply`` and is recorded as an IR value.  Saved tensors become
   ``input`` values (their versions are checked exactly as in eager mode), ``.grad`` writes
   become effects, user hooks opaque steps at their eager positions, and tensors that rules
   create from nothing (index ranges) become constants.  A tensor packed by saved-tensor hooks
   becomes an ``unpack_saved`` step, which calls the unpack hook where eager mode would --
   unless a checkpoint packed it and recorded its function's forward (``autograd.recording``):
   then the recording's ops are recorded instead, at the first unpack (``Capture.recompute``),
   and a reentrant checkpoint's backward is the recording's, replayed with grad on and
   differentiated in a reentrant backward of the capture (``_checkpoint_backward``).  A
   custom Function's ``backward`` is traced like a rule, under watch (``functions``); one that
   turns out untraceable becomes a ``function`` step, its eager ``backward`` run where eager mode
   runs it, and the capture starts again (``OpaqueRestart``).  Nothing
   is patched: another thread's backward, eager or compiled, never sees this capture.

A capture is *symbolic* first: sizes are ``symbolic.SymInt``s (in the symbolic tensors' shapes,
and in what rules see of their node: ``NodeView``), so the graph's shapes and size attributes are
expressions over the size vector, valid for every call with the same key that satisfies the
capture's guards.  When something needs a concrete size or data on the way (``NeedsData``, or
any other failure), the capture is repeated with the call's concrete sizes, guarded to be exactly
those: correct, and only as general as captures were before symbolic sizes.

Backwards whose forward was recorded in a compiled region usually skip the walk (``tape``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fusegrad import dtypes as _dt
from fusegrad.autograd import anomaly, grad_mode
from fusegrad.autograd import engine as _engine
from fusegrad.autograd.forward_state import state as _forward_state
from fusegrad.autograd.function import FunctionCtx
from fusegrad.autograd.node import AccumulateGrad, OpNode
from fusegrad.autograd.recording import Recording
from fusegrad.autograd.tracer import Tracer, tracing
from fusegrad.errors import AutogradError
from fusegrad.ops import registry
from fusegrad.ops.registry import RULES as _RULES
from fusegrad.random import default_generator
from fusegrad.tensor import Tensor
from fusegrad.utils.checkpoint import CheckpointFunction

from . import symbolic
from .ddp import Buckets
from .functions import (
    CTX_INTERNAL,
    CtxTensor,
    TracedCtx,
    Untraceable,
    ctx_attribute_key,
    function_globals_key,
    reads_plain_values,
    return_sources,
)
from .ir import Graph, Value, freeze
from .symbolic import FakeArray, Guard, NeedsData, ShapeEnv
from .tape import REMATERIALISE
from .tape import state as tape_state

# float16/bfloat16 values: numba has no CPU half type, so graphs holding them run eagerly
_HALF_REASON = "a float16/bfloat16 value (compiled programs take no half dtypes: eager)"


# node types the capture inlines (``double.CompiledGradBackward``): type -> an object with
# ``key(node)`` (its part of the walk key) and ``inline(capture, node, grads)`` (its results)
INLINED: dict[type, Any] = {}


class Fallback(Exception):
    """This backward cannot be compiled; ``str(e)`` is the one logged reason."""


class OpaqueRestart(Fallback):
    """A custom Function's ``backward`` could not be traced (``reason``): capture again with
    node ``site`` (its walk position) as an opaque step (``Capture._opaque_function``)."""

    def __init__(self, site: int, reason: str) -> None:
        super().__init__(reason)
        self.site = site
        self.reason = reason


# custom Function class -> (input positions its ``backward`` returned None for although the
# program expected a gradient, positions it returned a gradient for although the program
# expected None), found when opaque steps ran (``program._function_output``): the walk keys them
NONE_GRADIENTS: dict[type, tuple[frozenset, frozenset]] = {}


def learn_gradient(cls: type, index: int, returned: bool) -> None:
    """Record that ``cls.backward`` returned a gradient (or None) at ``index`` against what the
    program was built for."""
    none, some = NONE_GRADIENTS.get(cls, (frozenset(), frozenset()))
    if returned:
        NONE_GRADIENTS[cls] = (none - {index}, some | {index})
    else:
        NONE_GRADIENTS[cls] = (none | {index}, some - {index})


def none_gradients(node: FunctionCtx, layout: tuple) -> frozenset:
    """The input positions an opaque step of ``node``'s ``backward`` is built to take no
    gradient from, given which gradients it gets (``layout``): those where every ``return`` has
    a literal None or passes on a gradient it gets as None (``functions.return_sources``), or,
    once one has run, those found at run time (``NONE_GRADIENTS``)."""
    none = set()
    for j, source in return_sources(node._cls.backward).items():
        if source is None or (
            not node.materialize_grads and source < len(layout) and not layout[source]
        ):
            none.add(j)
    learned, some = NONE_GRADIENTS.get(node._cls, (frozenset(), frozenset()))
    return frozenset((none | learned) - some)


class Refused(Fallback):
    """A fallback that holds for every call with the same walk key (a custom Function's
    backward that cannot be traced): remembered, so later calls skip the capture."""


class SymbolicTensor(Tensor):
    """A tensor that stands for an IR value: shape and dtype, no data.

    In a symbolic capture ``_data`` is a ``FakeArray`` whose shape holds ``SymInt``s; in a
    concrete one, a zero-stride numpy array of the right shape and dtype (it costs no memory).
    Either way every op-surface check that reads shapes or dtypes works unchanged, and no kernel
    runs: ``registry.apply`` hands the call to the capture, this thread's tracer."""

    __slots__ = ("_value",)

    @classmethod
    def of(cls, value: Value, env: ShapeEnv | None) -> SymbolicTensor:
        if env is None:
            data: Any = np.broadcast_to(np.zeros((), value.dtype.np), value.shape)
        else:
            data = FakeArray(symbolic.to_symints(value.shape, env), value.dtype.np)
        t = cls._make(data)
        t._value = value
        return t


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


def _grad_state(leaf: Any) -> tuple | None:
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


def walk(
    roots: Sequence[Tensor],
    grad_roots: Sequence[Tensor],
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
    create_graph: bool,
) -> Walk:
    """Build the key and collect the runtime arguments (see the module docstring)."""
    out = Walk(key=())
    if _forward_state.level is not None:
        # the rules' ops must run on the dual values to propagate tangents (forward over
        # reverse); a compiled program would drop them
        out.fallback = "a forward-AD dual level is active (tangents flow through the backward)"
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
    unrun: frozenset = frozenset()
    if inputs is not None:
        targets = {n for n, _ in (t._edge() for t in inputs) if n is not None}
        needed = _engine._needed(index, targets)
        unrun = frozenset(
            n
            for n in order
            if (type(n) in (OpNode, FunctionCtx) or type(n) in INLINED)
            and (
                n not in needed
                or (n in targets and not any(c in needed for c, _ in n._edges if c is not None))
            )
        )
        out.unrun = unrun
    sizes = _Sizes()
    shape = sizes.shape
    # anomaly mode: the program checks each node's gradients for NaN (``Capture.check_nan``);
    # create_graph: its gradients get a differentiable node (``double``)
    check_nan = anomaly._state.enabled and anomaly._state.check_nan
    key: list = [("call", accumulate, len(roots), check_nan, create_graph)]
    for (n, nr), g in zip(root_edges, grad_roots):
        # the array type is the device (numpy on the CPU, CudaArray on CUDA)
        key.append(("root", index.get(n, -1), nr, shape(g._data.shape), g._dtype, type(g._data)))
    if inputs is not None:
        for t in inputs:
            n, nr = t._edge()
            key.append(("input", index.get(n, -1), nr))
    # The hot loop of every walked backward: per node only attribute reads and tuple building
    # (dtype objects, not their names; attrs as items, frozen only if unhashable).
    append = key.append
    saved_out = out.saved
    grad_key = []
    aliases: dict = {}
    regions: dict = {}  # id(recording) -> its region number

    def packed(n: Any, s: Any) -> tuple:
        """The key entry of saved tensor ``s`` (of node ``n``), packed by saved-tensor hooks."""
        holder = s._packed
        rec = getattr(holder, "recording", None)
        if type(rec) is Recording and rec.broken is None and not create_graph:
            # a checkpointed function's tensor: the program recomputes it from the recording
            number = regions.get(id(rec))
            if number is None:
                number = regions[id(rec)] = region(n, rec)
            out.region_of[len(saved_out)] = (number, holder.ref)
            out.saved_alias.append(len(saved_out))
            saved_out.append((n, s))
            return ("region", number, holder.ref)
        if type(rec) is Recording and id(rec) not in regions:
            regions[id(rec)] = -1
            out.reruns.append(rec.broken or "create_graph=True")
        # otherwise the unpack hook is an opaque step of the program (user code, so effects
        # keep their eager order), built for the shape and dtype the packed tensor had
        out.has_hooks = True
        mshape, mdtype, mtype = s._meta
        out.saved_alias.append(len(saved_out))
        saved_out.append((n, s))
        return (shape(mshape), mdtype, mtype, "unpack")

    def replayable(n: FunctionCtx, rec: Recording) -> bool:
        """Whether the backward of reentrant checkpoint ``n`` can be its recording's backward:
        a plain ``backward()`` (eager's raises otherwise), and what the recording reads from
        outside that needs a gradient are leaves without hooks (the inner backward's writes
        are then ``.grad`` writes, in any order)."""
        if rec.broken is not None or create_graph or inputs is not None or not accumulate:
            return False
        if not _engine.is_checkpoint_valid() or not rec.outputs:
            return False
        for t in rec.outside:
            if t._requires_grad or t.grad_fn is not None:
                if t.grad_fn is not None or t._hooks or t._post_acc_hooks:
                    return False
                acc = t._accumulator() if t._accumulator is not None else None
                if acc is not None and (acc._pre_hooks or acc._post_hooks):
                    return False
        return True

    def reentrant(n: FunctionCtx, rec: Recording) -> tuple:
        """The key entry of reentrant checkpoint ``n`` replayed from ``rec``: the recording,
        and the leaves from outside it that the inner backward writes ``.grad`` of."""
        number = regions[id(rec)] = region(n, rec)
        out.reentrant[n] = number
        for t in rec.outside:
            if t._requires_grad:
                append(("leaf", shape(t._data.shape), t._dtype, type(t._data), None))
                grad_key.append(_grad_state(t))
                out.leaves.append(t)
        return (
            "checkpoint",
            number,
            n.materialize_grads,
            n.needs_input_grad,
            tuple(n.tensor_indices),
            tuple((shape(s), d) for s, d in n._output_meta),
        )

    def region(n: Any, rec: Recording) -> int:
        """Key recording ``rec`` (the ops, with their size attributes as the walk's sizes) and
        add its arguments and its tensors from outside to the saved list; its number."""
        args = []
        for a in rec.args:  # (version-checked when the program unpacks them, as eager does)
            if a._unpack_hook is not None:  # packed by an enclosing checkpoint's hooks
                # (keying the enclosing recording first may add entries: ``a`` is the last)
                meta = packed(n, a)
                args.append((len(saved_out) - 1, meta))
                continue
            k = len(saved_out)
            t = a._tensor
            data = a._data if t is None else t._data
            alias = aliases.setdefault(id(data), k)
            saved_out.append((n, a))
            out.saved_alias.append(alias)
            args.append((k, (shape(data.shape), data.dtype, type(data), alias)))
        outside = []
        for t in rec.outside:  # (read as they are now, as the Python re-run would read them)
            k = len(saved_out)
            data = t._data
            alias = aliases.setdefault(id(data), k)
            saved_out.append((n, CtxTensor(t)))
            out.saved_alias.append(alias)
            outside.append((k, (shape(data.shape), t._dtype, type(data), alias)))
        ops = []
        draws = {}
        for i, op in enumerate(rec.ops):
            if op[0] == "full":
                ops.append(("full", shape(op[1]), op[2], op[3]))
                continue
            if op[0] == "draw":  # (drawn again on every run: an input of its own)
                draws[i] = len(saved_out)
                saved_out.append((n, RedrawnTensor(op[1], op[2])))
                out.saved_alias.append(draws[i])
                ops.append(("draw", op[3], shape(op[4]), op[5]))
                continue
            prim, attrs, refs = op[1], op[2], op[3]
            if prim.size_attrs:
                attrs = sized_attrs(prim, attrs, sizes.size)
            ops.append((prim.name, tuple(attrs.items()), refs))
        append(
            (
                "region",
                tuple(m for _, m in args),
                tuple(m for _, m in outside),
                tuple(ops),
                tuple((t._data.item(), t._dtype) for t in rec.numbers),
            )
        )
        out.regions.append((rec, [k for k, _ in args], [k for k, _ in outside], draws))
        return len(out.regions) - 1

    for n in order:
        kind = type(n)
        if kind is OpNode or kind is FunctionCtx or kind in INLINED:
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
            if n in unrun:
                saved = ()  # (the key still holds its place: ``"unrun"`` below)
            elif saved is None:
                if kind is OpNode and n._rule.save_index or kind is not OpNode and n._released:
                    # freed: the eager engine raises its "Specify retain_graph=True" error
                    out.fallback = f"{n.name()} has freed its saved tensors"
                    return out
                saved = ()
            smeta: list = []
            for s in saved:
                if s is None:  # (a Function saved None)
                    smeta.append(None)
                    continue
                if s._counter is None:
                    out.fallback = f"{n.name()} has freed its saved tensors"
                    return out
                if s._unpack_hook is not None:
                    smeta.append(packed(n, s))
                    continue
                t = s._tensor
                data = s._data if t is None else t._data
                # which saved arrays are the same array is structure too: one program input
                # (and one kernel argument) per distinct array
                alias = aliases.setdefault(id(data), len(saved_out))
                smeta.append((shape(data.shape), data.dtype, type(data), alias))
                saved_out.append((n, s))
                out.saved_alias.append(alias)
            if kind is not OpNode:
                if kind is FunctionCtx:
                    rec = n.__dict__.get("recording") if n._cls is CheckpointFunction else None
                    try:
                        if rec is not None and replayable(n, rec):
                            entry = reentrant(n, rec)
                        else:
                            entry = _function_entry(n, out, shape, aliases, n in unrun)
                    except Untraceable as e:
                        out.opaque[n] = f"{n.name()}: {e}"
                        out.has_hooks = True  # (user code runs inside: effects in eager order)
                        entry = _opaque_function_entry(n, shape)
                else:
                    entry = INLINED[kind].key(n)
                append(
                    (
                        entry,
                        tuple((index[c] if c is not None else -1, nr) for c, nr in n._edges),
                        tuple([(shape(s), d) for s, d in n._input_meta]),
                        tuple(smeta),
                        hooks,
                        "unrun" if n in unrun else None,
                    )
                )
                continue
            prim = n._prim
            if n._rule is not _RULES.get(prim.name):
                # a node built by hand with a rule of its own: programs are keyed by primitive
                out.fallback = f"{n.name()} has a derivative rule of its own (not its primitive's)"
                return out
            attrs = n.attrs
            items = tuple(
                (sized_attrs(prim, attrs, sizes.size) if prim.size_attrs else attrs).items()
            )
            append(
                (
                    prim.name,
                    items,
                    tuple((index[c] if c is not None else -1, nr) for c, nr in n._edges),
                    tuple([(shape(s), d) for s, d in n._input_meta]),
                    tuple(smeta),
                    hooks,
                    "unrun" if n in unrun else None,
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
            append(("leaf", shape(v._data.shape), v._dtype, type(v._data), hooks))
            grad_key.append(_grad_state(v))
            out.leaves.append(v)
        else:
            out.fallback = _unsupported(n)
            return out
    if out.opaque and (anomaly._state.enabled or create_graph):
        # (its gradients would have to be differentiable, or NaN-checked before it returns)
        out.fallback = next(iter(out.opaque.values()))
        return out
    if out.has_hooks and anomaly._state.enabled:
        # (a NaN check must stop the backward before later hooks run, as eager's does)
        out.fallback = "anomaly mode is on and the backward runs user hooks"
        return out
    if create_graph and anomaly._state.enabled:
        out.fallback = "create_graph=True under anomaly mode (each recorded node keeps its parent)"
        return out
    if create_graph and out.has_hooks:
        out.fallback = "create_graph=True with user hooks (their results would be recorded)"
        return out
    out.nodes = order
    out.index = index
    out.remat = _plan_rematerialisation(out, aliases)
    if out.remat:
        key.append(("remat", tuple(sorted(out.remat.items()))))
    out.sizes = tuple(sizes.values)
    out.grad_key = tuple(grad_key)
    try:
        out.key = tuple(key)
        hash(out.key)
    except TypeError:  # an attribute value that is not hashable: freeze everything
        out.key = freeze(tuple(key))
    return out


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


def _function_entry(n: FunctionCtx, w: Walk, shape: Any, aliases: dict, unrun: bool) -> tuple:
    """The key of custom Function node ``n`` apart from its edges, inputs and saved tensors:
    its class and ``backward``, what ``backward`` reads from globals and closures, the ctx's
    attributes (its tensors become program inputs, ``w.ctx_tensors``), its flags and outputs
    (``functions``; raises ``Untraceable``)."""
    cls = n._cls
    backward = cls.backward
    if unrun:
        return ("function", cls, backward)
    globals_key = function_globals_key(backward)
    attrs: list = []
    tensors: dict = {}
    start = len(w.saved)
    try:
        for name, value in n.__dict__.items():
            if name in CTX_INTERNAL:
                continue
            if isinstance(value, Tensor):
                obj = CtxTensor(value)
                data = value._data
                alias = aliases.setdefault(id(data), len(w.saved))
                w.saved.append((n, obj))
                w.saved_alias.append(alias)
                tensors[name] = obj
                attrs.append((name, shape(data.shape), value._dtype, type(data), alias))
            else:
                attrs.append((name, ctx_attribute_key(name, value)))
    except Untraceable:
        # (the node runs opaquely: its tensor attributes are no program inputs after all, and
        # the walk's saved list must not depend on which attribute failed)
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


def _opaque_function_entry(n: FunctionCtx, shape: Any) -> tuple:
    """The key of custom Function node ``n`` that runs as an opaque step: the eager ``backward``
    is called on the node itself, so only what the program's structure depends on counts --
    which inputs get a gradient from it (``Capture._opaque_function``)."""
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


def _unsupported(n: Any) -> str:
    return f"{n.name()} is not a primitive's node (custom Function or other node type)"


class NodeView:
    """What a derivative rule sees of its node in a symbolic capture: the node's attributes and
    input shapes with sizes as ``SymInt``s.  Rules are written against this interface
    (``attrs``, ``input_shapes``, ``input_dtypes``, ``needs_input_grad``, ``name()``); anything
    else of the node would carry concrete sizes, so asking for it makes the capture concrete."""

    __slots__ = ("_node", "attrs", "input_dtypes", "input_shapes", "needs_input_grad")

    def __init__(self, node: OpNode, env: ShapeEnv) -> None:
        self._node = node
        self.attrs = sized_attrs(node._prim, node.attrs, env.size)
        self.input_shapes = tuple(env.shape(m[0]) for m in node._input_meta)
        self.input_dtypes = node.input_dtypes
        self.needs_input_grad = node.needs_input_grad

    def name(self) -> str:
        return self._node.name()

    def __getattr__(self, name: str) -> Any:
        raise NeedsData(f"a derivative rule read {name!r} of its node")


class Recorder(Tracer):
    """Records primitive calls on symbolic values as IR values of ``graph`` (this thread's
    tracer while it runs derivative rules): the capture's, and ``double``'s differentiation of a
    captured graph.  ``env`` holds the symbolic sizes (None: concrete ones); ``current`` names
    the node whose rule runs (IR values keep it as their origin); ``user`` is set while a custom
    Function's backward runs (``Capture._trace_function``), whose tensors ``made`` holds."""

    def __init__(self, graph: Graph, env: ShapeEnv | None) -> None:
        self.graph = graph
        self.env = env
        self.current = ""
        self.user = 0  # how deep in custom Functions' backwards (nested: reentrant ones)
        self.made: dict[int, Tensor] = {}
        # the no-data arrays of the values user code got, by id: a tensor sharing one
        # (``detach()``, a saved output rebuilt on unpack) stands for that value
        self.fake: dict[int, tuple[FakeArray, Value]] = {}

    def value_of(self, t: Any) -> Value | None:
        """The IR value tensor ``t`` stands for, if it stands for one."""
        if isinstance(t, SymbolicTensor):
            return t._value
        entry = self.fake.get(id(t._data))
        return entry[1] if entry is not None and entry[0] is t._data else None

    def symbolic(self, value: Value) -> SymbolicTensor:
        if self.user and self.env is None:
            # (inside a custom Function's backward: its values have no data even in a
            # concrete capture, and what it does is watched)
            # user code must never compute on the zeros a concrete capture's values hold:
            # reading data raises (``NeedsData``), and that backward falls back
            t = SymbolicTensor._make(FakeArray(tuple(value.shape), value.dtype.np))
            t._value = value
            self.fake[id(t._data)] = (t._data, value)
            return t
        t = SymbolicTensor.of(value, self.env)
        if self.user:
            self.fake[id(t._data)] = (t._data, value)
        return t

    def apply(self, prim: registry.Primitive, inputs: tuple, attrs: dict) -> Any:
        graph = self.graph
        values = []
        for a in inputs:
            known = self.value_of(a)
            if known is not None:
                values.append(known)
                continue
            if self.user and not a._wrapped_number and id(a) not in self.made:
                raise Refused(
                    f"the backward of {self.current} uses a tensor that is neither an input of "
                    "its backward (gradients, saved tensors, ctx attributes) nor made inside it"
                )
            if a._wrapped_number or (a._data.ndim == 0):
                values.append(graph.scalar(a._data.item(), a._dtype))
            else:
                values.append(graph.constant(a._data))
        env = self.env
        if env is not None:
            env.where = f"{prim.name} in the rule of {self.current}"
            shapes = tuple(symbolic.to_symints(v.shape, env) for v in values)
        else:
            shapes = tuple(v.shape for v in values)
        try:
            shape, dtype = prim.meta(shapes, tuple(v.dtype for v in values), **attrs)
        except registry.DataDependentShape as e:
            raise Fallback(f"{prim.name} in {self.current}: {e}") from None
        if dtype in _dt.HALF or any(v.dtype in _dt.HALF for v in values):
            raise Fallback(f"{prim.name} in {self.current}: {_HALF_REASON}")
        value = graph.add(
            prim.name,
            tuple(values),
            symbolic.to_exprs(attrs) if env is not None else attrs,
            symbolic.to_exprs(tuple(shape)),
            dtype,
            origin=self.current,
        )
        out = self.symbolic(value)
        if self.user and prim.differentiable and grad_mode._state.enabled:
            # user code recording a graph (to call backward() on it: a reentrant backward)
            for a in inputs:
                if a._requires_grad or a.grad_fn is not None:
                    if env is not None:
                        raise NeedsData("a custom Function's backward records a graph")
                    out.grad_fn = OpNode(prim, _RULES[prim.name], attrs, inputs, (out,))
                    break
        return out

    def full(self, shape: tuple, value: Any, dtype: Any, device: Any) -> Any:
        """A constant a rule makes (``zeros_like(g)``, ``zeros(shape)``): one scalar broadcast
        to ``shape`` (which may be symbolic), fused into kernels like any broadcast read."""
        dims = symbolic.to_exprs(tuple(shape))
        return self.symbolic(self.graph.full(dims, value, dtype, self.current))


class Capture(_engine.Executor, Recorder):
    """One capture: the engine's executor and this thread's tracer while the engine runs the
    backward of ``w``'s graph on symbolic values (see the module docstring).  ``run`` returns
    the graph; ``Fallback`` says why there is none.  ``symbolic`` selects sizes as symbols (the
    guards the graph needs end up in ``guards``) or the call's concrete sizes."""

    def __init__(
        self,
        w: Walk,
        roots: Sequence[Tensor],
        grad_roots: Sequence[Tensor],
        inputs: Sequence[Tensor] | None,
        accumulate: bool,
        symbolic: bool = True,
        create_graph: bool = False,
        opaque: dict | None = None,
        allow_opaque: bool = True,
    ) -> None:
        self.w = w
        # walk positions of Function nodes this capture runs as opaque steps (beyond the walk's
        # own ``w.opaque``), and whether a backward that cannot be traced may become one
        self.opaque_sites = opaque or {}  # site -> why
        self.allow_opaque = allow_opaque
        self.roots = roots
        self.grad_roots = grad_roots
        self.inputs = inputs
        self.accumulate = accumulate
        self.create_graph = create_graph
        Recorder.__init__(self, Graph(hints=w.sizes), ShapeEnv(w.sizes) if symbolic else None)
        self.saved_index = {id(s): k for k, (_, s) in enumerate(w.saved)}
        self.leaf_index = {id(t): k for k, t in enumerate(w.leaves)}
        self.input_index = {id(t): k for k, t in enumerate(inputs or ())}
        self.saved_values: dict[int, Value] = {}  # alias class -> its input value
        self.seq = iter(range(1 << 62))  # side-effecting values are never interned together
        self.last_store: dict[int, Value] = {}  # id(tensor) -> its latest store_grad value
        # saved tensors the engine unpacked (their nodes ran): only these are version-checked
        # when the program runs, as eager mode checks only those of the nodes it runs
        self.unpacked: set[int] = set()
        # anomaly mode: each node's gradients become ``("check", (node, output), value)``
        # effects, which the program tests for NaN, in eager's order, before any other effect
        self.check_nan = anomaly._state.enabled and anomaly._state.check_nan
        self.buckets = None if w.ddp is None else Buckets(w.ddp, self.graph)
        self.regions: dict[int, dict] = {}  # region number -> its recomputed values, by ref
        self.holders: set[int] = set()  # ids of the checkpoint holders unpacked
        self.standins: dict[int, Tensor] = {}  # id(replayed outside tensor) -> the tensor

    @property
    def guards(self) -> list[Guard]:
        """What the graph assumes about the size vector (``symbolic.Guard``): in a concrete
        capture, that every size is the one it had."""
        if self.env is not None:
            return list(self.env.guards)
        return [
            Guard(symbolic.sub(symbolic.symbol(k), v), "==", "the capture used concrete sizes")
            for k, v in enumerate(self.w.sizes)
        ]

    def run(self) -> Graph:
        graph = self.graph
        sym_roots = [
            self.symbolic(graph.input("root", i, self.exprs(g._data.shape), g._dtype))
            for i, g in enumerate(self.grad_roots)
        ]
        # anomaly mode's per-node work is the program's (``check_nan``), not the capture's: the
        # engine's own NaN check and warnings would read symbolic values
        enabled, anomaly._state.enabled = anomaly._state.enabled, False
        try:
            with tracing(self):
                captured = _engine.run_backward(
                    self.roots,
                    sym_roots,
                    True,
                    self.create_graph,
                    self.inputs,
                    self.accumulate,
                    executor=self,
                )
        finally:
            anomaly._state.enabled = enabled
        if not self.accumulate:
            for pos, g in enumerate(captured or ()):
                if g is not None:
                    graph.effects.append(("capture", pos, self.as_value(g)))
        if self.buckets is not None:
            averaged = self.buckets.finish()
            if averaged is None:
                raise Fallback(
                    "a DistributedDataParallel parameter got no gradient (its hooks leave the "
                    "reduction unfinished, which eager mode reports at the next forward)"
                )
            graph.effects = [
                (kind, slot, averaged.get(slot, v) if kind == "grad" else v)
                for kind, slot, v in graph.effects
            ]
        return graph

    def exprs(self, shape: tuple) -> tuple:
        """A concrete shape of the walked graph as IR dims (symbols in a symbolic capture)."""
        if self.env is None:
            return tuple(shape)
        return tuple(symbolic.expr_of(self.env.size(d)) for d in shape)

    # ---- Tracer: every primitive call of a rule ------------------------------------------------
    def backward(
        self,
        roots: Sequence[Tensor],
        grads: Sequence[Tensor],
        retain_graph: bool,
        create_graph: bool,
        inputs: Sequence[Tensor] | None,
        accumulate: bool,
    ) -> Any:
        """A reentrant backward inside a custom Function's backward: the engine runs it with
        this capture as its executor, over the graph that code recorded (rules never call
        backward)."""
        if not self.user or create_graph:
            raise Refused(f"a backward() inside the backward of {self.current}")
        if self.env is not None:
            raise NeedsData("a reentrant backward (captured with concrete sizes)")
        roots_grads = []
        for g in grads:
            v = self.value_of(g)
            roots_grads.append(self.symbolic(v if v is not None else self.as_value(g)))
        return _engine.run_backward(
            roots, roots_grads, retain_graph, False, inputs, accumulate, executor=self
        )

    # What a custom Function's backward must not do to be replayed (``functions``): each is
    # detected while it runs, and sends that backward to eager mode (remembered per key).
    def created(self, tensor: Tensor, redo: Any) -> None:
        if self.user:
            if redo is not None and not isinstance(redo, Tensor):
                raise Refused(f"the backward of {self.current} draws random numbers")
            self.made[id(tensor)] = tensor

    def will_draw(self, generator: Any = None) -> None:
        if self.user:  # (before the generator moves: the eager run draws what eager would)
            raise Refused(f"the backward of {self.current} draws random numbers")

    def host_read(self, tensor: Tensor, what: str, result: Any = None) -> None:
        if self.user:
            raise Refused(f"the backward of {self.current} reads tensor values ({what})")

    def wrote(self, target: Tensor, result: Tensor) -> None:
        if self.user:
            raise Refused(f"the backward of {self.current} writes into a tensor in place")

    def side_effect(self, tensor: Tensor, what: str) -> None:
        if self.user and self.value_of(tensor) is None:  # (its own values: ``requires_grad_``)
            raise Refused(f"the backward of {self.current} changes tensor state ({what})")

    def opaque(self, owner: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        if self.user:
            raise Refused(f"the backward of {self.current} calls {fn.__qualname__}")
        return NotImplemented

    def _trace_function(self, node: FunctionCtx, grads: list) -> tuple:
        """A custom Function node of the walk: traced (``_traced_function``), or an opaque step
        when its backward cannot be (found by the walk, or now: the capture restarts)."""
        site = self.w.index.get(node)
        if site is not None and (node in self.w.opaque or site in self.opaque_sites):
            return self._opaque_function(node, site, grads)
        try:
            return self._traced_function(node, grads)
        except Refused as e:
            if site is None or not self.allow_opaque or self.create_graph or self.check_nan:
                raise
            raise OpaqueRestart(site, str(e)) from None

    def _opaque_function(self, node: FunctionCtx, site: int, grads: list) -> tuple:
        """The node's eager ``backward`` as a step of the program, at its eager position (like a
        user hook): a ``function`` value takes the gradients it is given, and one
        ``function_output`` per input it is expected to return a gradient for -- every input
        that needs one (``needs_input_grad``) and leads somewhere.  Should it return None there
        after all, the program refuses (``program._function_output``)."""
        graph = self.graph
        layout = tuple(g is not None for g in grads)
        values = tuple(self.as_value(g) for g in grads if g is not None)
        why = self.w.opaque.get(node) or self.opaque_sites.get(site, "")
        none = none_gradients(node, layout)
        wanted = [
            child is not None and meta[1] is not None and node.needs_input_grad[i]
            for i, ((child, _), meta) in enumerate(zip(node._edges, node._input_meta))
        ]
        dropped = tuple(i for i, want in enumerate(wanted) if want and i in none)
        attrs = {"node": site, "layout": layout, "why": why, "dropped": dropped}
        token = graph.add(
            "function", values, {**attrs, "seq": next(self.seq)}, (), _dt.bool_, origin=self.current
        )
        out: list = []
        for i, (shape, dtype) in enumerate(node._input_meta):
            if not wanted[i] or i in none:
                out.append(None)
                continue
            value = graph.add(
                "function_output",
                (token,),
                {"index": i},
                self.exprs(shape),
                dtype,
                origin=self.current,
            )
            out.append(self.symbolic(value))
        return tuple(out)

    def _traced_function(self, node: FunctionCtx, grads: list) -> tuple:
        """Run custom Function ``node``'s ``backward`` on symbolic values: its ops are recorded
        like a rule's.  What ``FunctionCtx.apply`` does around it is done here on the symbolic
        values (zeros for missing gradients when materialized, the checks, dropping gradients of
        inputs that need none); anything the key cannot vouch for is ``Refused``."""
        name = self.current
        if node not in self.w.index:
            # made by an outer Function's backward (reentrant): what its code reads must be
            # fixed by the key, which holds only the outer one's
            try:
                reads = reads_plain_values(function_globals_key(node._cls.backward))
            except Untraceable as e:
                raise Refused(f"{name}: {e}") from None
            if reads:
                raise Refused(f"{name} (made inside a backward) reads Python values of globals")
        self.user += 1
        try:
            args = []
            for i, g in enumerate(grads):
                if g is None:
                    shape, dtype = node._output_meta[i]
                    if node.materialize_grads and dtype is not None:
                        g = self.full(self.exprs(shape), 0, dtype, None)
                else:
                    g = self.symbolic(self.as_value(g))
                args.append(g)
            ctx = TracedCtx(self, node, self.w.ctx_tensors.get(node, {}))
            number = self.w.reentrant.get(node)
            try:
                if number is not None:  # (a reentrant checkpoint replayed from its recording)
                    result = self._checkpoint_backward(node, number, args)
                else:
                    result = node._cls.backward(ctx, *args)
            except (Fallback, NeedsData):
                raise
            except Untraceable as e:
                raise Refused(f"{name}: {e}") from None
            except Exception as e:  # noqa: BLE001 - eager mode raises it, if it is real
                raise Refused(
                    f"the backward of {name} failed on symbolic values ({type(e).__name__}: {e})"
                ) from None
        except NeedsData as e:
            if self.env is not None:
                raise  # (a concrete capture may do without symbolic sizes)
            raise Refused(f"the backward of {name} needs tensor values ({e})") from None
        finally:
            self.user -= 1
        try:
            result = node.backward_results(result)
        except AutogradError as e:  # (eager mode raises it)
            raise Refused(f"{name}: {e}") from None
        out: list = []
        for r in result:
            if r is not None and not isinstance(r, SymbolicTensor) and id(r) not in self.made:
                raise Refused(f"{name} returned a tensor made outside its backward")
            # back to the capture's own kind of value (zero-stride data in a concrete one)
            out.append(None if r is None else self.symbolic(self.as_value(r)))
        return tuple(out)

    # ---- Executor: the engine's steps -----------------------------------------------------------
    def input_meta(self, node: Any) -> tuple:
        if self.env is None or type(node) not in (OpNode, FunctionCtx):
            return node._input_meta
        return tuple((self.env.shape(s), d) for s, d in node._input_meta)

    def apply_node(self, node: Any, grads: list, retain_graph: bool) -> tuple:
        results = self._apply_node(node, grads)
        if self.check_nan and node in self.w.index:
            site = self.w.index[node]
            for i, r in enumerate(results):
                if isinstance(r, SymbolicTensor) and r._dtype.is_floating_point:
                    self.graph.effects.append(("check", (site, i), r._value))
        return results

    def _apply_node(self, node: Any, grads: list) -> tuple:
        self.current = node.name()
        if self.env is not None:
            self.env.where = f"the rule of {self.current}"
        if type(node) is FunctionCtx:
            return self._trace_function(node, grads)
        inlined = INLINED.get(type(node))
        if inlined is not None:
            return inlined.inline(self, node, grads)
        if type(node) is not OpNode:
            raise Fallback(_unsupported(node))
        rule = node._rule
        view: Any = node if self.env is None else NodeView(node, self.env)
        if not rule.save_index:
            return _engine.check_results(node, rule.fn(view, grads[0]))
        saved = node._saved
        if saved is None:
            node.apply(tuple(grads), True)  # raises the eager engine's error
        values = node.rule_arguments([self.unpack(s, node) for s in saved])
        return _engine.check_results(node, rule.fn(view, grads[0], *values))

    def unpack(self, saved: Any, node: Any) -> SymbolicTensor:
        w = self.w
        k = self.saved_index.get(id(saved))
        if k is None:
            if self.user:  # saved by a node user code recorded (reentrant backward)
                t = saved.unpack(node)
                value = self.value_of(t)
                if value is None and t._wrapped_number:  # (a Python number in a replayed op)
                    value = self.graph.scalar(t._data.item(), t._dtype)
                if value is not None:
                    return self.symbolic(value)
            raise Fallback(f"{node.name()} unpacked a tensor the walk did not see")
        if saved._unpack_hook is not None:
            region = w.region_of.get(k)
            if region is not None:
                return self.recomputed(region, saved, node)
            # the user's unpack hook runs when the program gets here, not now
            mshape, mdtype, _ = saved._meta
            value = self.graph.add(
                "unpack_saved",
                (),
                {"saved": k, "seq": next(self.seq)},
                self.exprs(mshape),
                mdtype,
                origin=self.current,
            )
            return self.symbolic(value)
        saved.unpack(node)  # the real unpack, for its version check (and error) only
        self.unpacked.add(k)
        remat = w.remat.get(k)
        if remat is not None:  # recompute from the leaf the program reads anyway
            prim_name, attrs, leaf_first = remat
            source = self.saved_input(leaf_first)
            value = self.graph.add(
                prim_name, (source,), dict(attrs), source.shape, source.dtype, origin=self.current
            )
            return self.symbolic(value)
        return self.symbolic(self.saved_input(w.saved_alias[k]))

    def recomputed(self, region: tuple, saved: Any, node: Any) -> SymbolicTensor:
        """A checkpointed function's saved tensor: its recording's ops become values of this
        graph (once per capture, on the first unpack, where eager mode recomputes), and this is
        the one ``saved``'s holder stands for."""
        number, ref = region
        holder = saved._packed
        if id(holder) in self.holders:
            raise Fallback(
                f"{node.name()} unpacked a checkpointed tensor twice (eager mode raises "
                "CheckpointError)"
            )
        self.holders.add(id(holder))
        values = self.regions.get(number)
        if values is None:
            values = self.regions[number] = self.recompute(number, node)
        return values[ref]

    def recompute(self, number: int, node: Any) -> dict:
        """The values of recording ``number`` of the walk, by ref: its arguments unpacked (and
        version-checked) as eager's recomputation unpacks them, its tensors from outside read
        as program inputs, its ops recorded as a rule's are."""
        rec, arg_ks, outside_ks, _ = self.w.regions[number]
        saved = self.w.saved
        values: dict = {}
        for j, k in enumerate(arg_ks):
            values[("a", j)] = self.unpack(saved[k][1], node)
        for j, k in enumerate(outside_ks):
            values[("e", j)] = self.symbolic(self.saved_input(self.w.saved_alias[k]))
        current = self.current
        self.current = f"the recomputation of a checkpoint (for {current})"
        try:
            self.replay(number, values)
        finally:
            self.current = current
        return values

    def replay(self, number: int, values: dict) -> None:
        """Record the ops of the walk's recording ``number`` on ``values`` (its arguments and
        tensors from outside, by ref), adding their results to it."""
        rec, _, _, draws = self.w.regions[number]
        env = self.env
        for i, op in enumerate(rec.ops):
            if op[0] == "full":
                values[("v", i)] = self.full(self.exprs(op[1]), op[2], op[3], None)
                continue
            if op[0] == "draw":
                values[("v", i)] = self.symbolic(self.saved_input(draws[i]))
                continue
            prim, attrs, refs = op[1], op[2], op[3]
            inputs = tuple(rec.numbers[r[1]] if r[0] == "n" else values[r] for r in refs)
            if env is not None and prim.size_attrs:
                attrs = sized_attrs(prim, attrs, env.size)
            values[("v", i)] = self.apply(prim, inputs, attrs)

    def _checkpoint_backward(self, node: FunctionCtx, number: int, grads: list) -> tuple:
        """``CheckpointFunction.backward`` with the recording's ops for ``run_function``: the
        arguments detached, the forward replayed with grad on, a reentrant backward through it
        (whose ``.grad`` writes to the parameters read from outside are the program's)."""
        if self.env is not None:
            raise NeedsData("a reentrant checkpoint's backward (a reentrant backward)")
        rec, _, outside_ks, _ = self.w.regions[number]
        values: dict = {}
        detached = []
        for j, s in enumerate(node._saved):
            d = self.symbolic(self.unpack(s, node)._value)
            if node.needs_input_grad[2 + node.tensor_indices[j]]:
                d.requires_grad_(True)
            self.made[id(d)] = d
            detached.append(d)
            values[("a", j)] = d
        for j, k in enumerate(outside_ks):
            t = rec.outside[j]
            d = self.symbolic(self.saved_input(self.w.saved_alias[k]))
            if t._requires_grad:
                d.requires_grad_(True)
                self.standins[id(d)] = t
            self.made[id(d)] = d
            values[("e", j)] = d
        with grad_mode.enable_grad():
            self.replay(number, values)
        roots, root_grads = [], []
        for ref, g in zip(rec.outputs, grads):
            if ref is not None and values[ref].requires_grad:
                roots.append(values[ref])
                root_grads.append(g)
        if not roots:
            raise Refused("none of the checkpoint's outputs requires grad (eager raises)")
        self.backward(roots, root_grads, False, False, None, True)
        result: list = [None] * len(node._input_meta)
        for j, i in enumerate(node.tensor_indices):
            result[2 + i] = detached[j]._grad
        return tuple(result)

    def saved_input(self, first: int) -> Value:
        """The program input for the saved array of alias class ``first``."""
        value = self.saved_values.get(first)
        if value is None:
            s = self.w.saved[first][1]
            data = s._data if s._tensor is None else s._tensor._data
            dtype = s._tensor._dtype if s._tensor is not None else _dt.from_numpy_dtype(data.dtype)
            value = self.graph.input("saved", first, self.exprs(data.shape), dtype)
            self.saved_values[first] = value
        return value

    def as_value(self, g: Tensor) -> Value:
        # a gradient a rule built from nothing (e.g. zeros for floor) is a constant
        return g._value if isinstance(g, SymbolicTensor) else self.graph.constant(g._data)

    def accumulate_grad(self, t: Tensor, g: Tensor, create_graph: bool) -> None:
        w = self.w
        t = self.standins.get(id(t), t)  # (a parameter a reentrant checkpoint reads)
        if id(t) in self.leaf_index:
            target: tuple = ("grad", self.leaf_index[id(t)])
        elif id(t) in self.input_index:
            target = ("input_grad", self.input_index[id(t)])
        elif t.grad_fn is not None and t.grad_fn in w.index:
            target = ("retain_grad", w.index[t.grad_fn], t._output_nr)  # retain_grad()
        elif self.user and self.value_of(t) is not None:
            # a leaf user code made (reentrant backward): its .grad lives in this capture
            t._grad = g if t._grad is None else t._grad + g
            return
        else:
            raise Fallback("a .grad write to a tensor the walk did not see")
        if not w.has_hooks:
            # no user code runs during this backward: writes can all happen at the end
            self.graph.effects.append((target[0], target[1], self.as_value(g)))
            if self.buckets is not None and target[0] == "grad":
                self.buckets.values[target[1]] = self.as_value(g)
            return
        self.last_store[id(t)] = self.graph.add(
            "store_grad",
            (self.as_value(g),),
            {"target": target, "seq": next(self.seq)},
            (),
            _dt.bool_,
            origin=self.current,
        )

    # A user hook is an opaque step of the program: record where it sits and what it gets.  The
    # hook may replace (a) the gradient (tensor hook), (b) the node's incoming gradients
    # (pre-hook) or (c) its results (post-hook): one hook_output value per slot.
    def tensor_pre_hook(self, hook: Any, node: Any, output_nr: int, position: int, g: Any) -> Any:
        return self._hook(node, "tensor", output_nr, position, [(g,)], [g])[0]

    def pre_hook(self, hook: Any, node: Any, position: int, grads: tuple) -> Any:
        return tuple(self._hook(node, "pre", 0, position, [grads], list(grads)))

    def post_hook(
        self, hook: Any, node: Any, position: int, grads_in: tuple, grads_out: tuple
    ) -> Any:
        return tuple(self._hook(node, "post", 0, position, [grads_in, grads_out], list(grads_in)))

    def post_acc_grad_hook(self, hook: Any, node: Any, position: int, tensor: Tensor) -> None:
        if self.buckets is not None:  # (DDP's hooks: the program averages, ``ddp.Buckets``)
            self.buckets.ready()
            return
        if not self.w.has_hooks:
            return  # (a whole step does DistributedDataParallel's work itself: ``step``)
        site = (self.w.index[node], "post_acc", 0, position)
        self.graph.add(
            "hook",
            (self.last_store[id(tensor)],),
            {"site": site, "layout": (), "seq": next(self.seq)},
            (),
            _dt.bool_,
            origin=node.name(),
        )

    def _hook(
        self, node: Any, kind: str, slot: int, position: int, groups: list, replaced: list
    ) -> list:
        graph = self.graph
        layout = []
        values = []
        for group in groups:
            mask = []
            for item in group:
                mask.append(item is not None)
                if item is not None:
                    values.append(self.as_value(item))
            layout.append(tuple(mask))
        site = (self.w.index[node], kind, slot, position)
        token = graph.add(
            "hook",
            tuple(values),
            {"site": site, "layout": tuple(layout), "seq": next(self.seq)},
            (),
            _dt.bool_,
            origin=node.name(),
        )
        outs: list[SymbolicTensor | None] = []
        for i, item in enumerate(replaced):
            if item is None:
                outs.append(None)
                continue
            v = self.as_value(item)
            # position i of what the hook returns, or v itself when it returns None
            out = graph.add(
                "hook_output", (token, v), {"index": i}, v.shape, v.dtype, origin=node.name()
            )
            outs.append(self.symbolic(out))
        return outs


@dataclass
class Captured:
    """A captured graph, the guards it holds under, how it was captured, and the programs built
    from it (per program key: ``compiler._program_for``)."""

    graph: Graph
    guards: tuple[Guard, ...]
    symbolic: bool
    reason: str = ""  # why the capture was concrete (empty for a symbolic one)
    unpacked: frozenset[int] = frozenset()  # saved tensors (walk order) the backward unpacks
    programs: dict = field(default_factory=dict)
    # a ``create_graph`` backward's graph before the passes (what ``double`` differentiates:
    # the rules' own ops) and the VJP programs built from it
    raw: Graph | None = None
    vjp: dict = field(default_factory=dict)
    # walk positions of the custom Function nodes the capture found it could not trace (they
    # run as opaque steps, like those of ``Walk.opaque``) -> why
    opaque: dict = field(default_factory=dict)

    MAX_PROGRAMS = 8  # program keys kept per graph (mode x .grad states x configurations)

    def keep(self, key: tuple, program: Any) -> None:
        programs = dict(self.programs)  # copy-on-write: readers on other threads see a whole dict
        programs[key] = program
        while len(programs) > self.MAX_PROGRAMS:
            programs.pop(next(iter(programs)))
        self.programs = programs


def capture(
    w: Walk,
    roots: Sequence[Tensor],
    grad_roots: Sequence[Tensor],
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
    symbolic: bool = True,
    create_graph: bool = False,
    allow_opaque: bool = True,
) -> Captured:
    """Record the backward of ``roots`` as an IR graph (see the module docstring): symbolic
    sizes when possible, else the call's concrete sizes.  With ``create_graph`` the rules run
    in grad mode, as eager's do then (a rule may pick a differentiable formula: ``double``).
    A custom Function whose ``backward`` turns out untraceable becomes an opaque step and the
    capture starts again (``allow_opaque``; else it is ``Refused``, as for whole steps, which
    replay no Python): the backward then runs user code, so ``w.has_hooks`` is set."""
    opaque: dict = {}
    while True:
        try:
            captured = _capture(
                w, roots, grad_roots, inputs, accumulate, symbolic, create_graph, opaque,
                allow_opaque,
            )  # fmt: skip
        except OpaqueRestart as e:
            if e.site in opaque:  # (cannot happen: an opaque node is not traced again)
                raise Refused(e.reason) from None
            opaque[e.site] = e.reason
            w.has_hooks = True
            continue
        captured.opaque = opaque
        return captured


def _capture(
    w: Walk,
    roots: Sequence[Tensor],
    grad_roots: Sequence[Tensor],
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
    symbolic: bool,
    create_graph: bool,
    opaque: dict,
    allow_opaque: bool,
) -> Captured:
    reason = "symbolic sizes were turned off for this graph"
    args = (w, roots, grad_roots, inputs, accumulate)
    if symbolic:
        c = Capture(*args, True, create_graph, opaque, allow_opaque)
        try:
            graph = c.run()
            return Captured(graph, tuple(c.guards), True, unpacked=frozenset(c.unpacked))
        except Fallback:
            raise
        except NeedsData as e:
            reason = f"{c.current or 'the capture'} needed concrete sizes ({e})"
        except Exception as e:  # noqa: BLE001  (the concrete capture re-raises real errors)
            reason = f"{c.current or 'the capture'} failed with symbolic sizes ({e!r})"
    c = Capture(*args, False, create_graph, opaque, allow_opaque)
    try:
        graph = c.run()
    except Fallback:
        raise
    except Exception as e:
        if anomaly._state.enabled:  # eager mode raises it with anomaly mode's warnings
            raise Fallback(f"{c.current} raised {type(e).__name__} under anomaly mode") from None
        raise
    return Captured(graph, tuple(c.guards), False, reason, frozenset(c.unpacked))
