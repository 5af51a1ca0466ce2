"""``fusegrad.compile(module)``: a module that compiles its backward even when ``backward()`` is
called outside it (PyTorch's ``OptimizedModule``).

The wrapper is an ``nn.Module`` that owns nothing: parameters, buffers, submodules,
``state_dict`` (with the original's keys, no ``_orig_mod.`` prefix), ``train``/``eval`` and every
other attribute are the wrapped module's (``_orig_mod``).  Its forward runs the original inside
a compiled region, so a ``backward()`` called inside the forward is compiled as under
``compile(fn)``.

A backward called *outside* (``loss = loss_fn(cmodel(x), y); loss.backward()``, as most training
scripts do) is compiled too: each output that requires grad is handed out as an alias of the
real output whose ``grad_fn`` is one node, ``CompiledModuleBackward``, with an edge to every
parameter that requires grad and every tensor argument that does.  When the eager engine
reaches it, the node runs ``autograd.grad`` of the real outputs with respect to those
parameters and arguments inside a compiled region: one compiled program for the module's whole
backward, whose gradients the engine then delivers along the edges (so ``.grad``
accumulation, leaf hooks and ``autograd.grad`` with respect to parameters from outside behave as
in eager).  Aliases share their output's data and version counter: an in-place change of an
output the backward needs raises eager's error.

Ahead of time (``AOTEntry``): the first call with a new guard key (``step.Watch``: arguments,
the module's training flags, attributes, parameters and buffers, grad mode) runs eagerly while
a ``step.Recorder`` records it, and the backward of its outputs is captured into a second
graph whose inputs are the root gradients and the forward values it reads; every later call
with that key replays the forward as one program (which also outputs those saved values; the
elementwise values computed from the forward's inputs alone are recomputed in the backward
instead) and hands out its outputs with one ``AOTBackward`` node, which runs the backward
program on the saved values, after eager's version checks of the inputs and outputs it reads.
Without grad mode (inference) the replay is the forward program alone.  A call the recorder
cannot replay (Python reading values, hooks, views written in place, ...) keeps the path below
for its key, with one logged reason.

The node is only used when it can be exact: when the forward's graph reaches nothing but the
parameters and arguments (no tensor requiring grad from a closure or a module attribute, no
graph made before the call other than the arguments' own), checked after every forward --
through the forward's tape when it recorded every node, else by a walk of the new part of the
graph.  Otherwise the real outputs are returned (the backward then runs eagerly, as it would
without the wrapper) and the reason is logged once per reason on the ``fallback`` channel
(``fullgraph=True`` raises it).  A forward run inside another compiled region, or without grad
mode, returns the real outputs: the enclosing region compiles its backward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fusegrad import random as _random
from fusegrad import storage as _storage
from fusegrad.autograd import engine as _engine
from fusegrad.autograd import grad_mode
from fusegrad.autograd import graph_base as _graph_base
from fusegrad.autograd.api import grad as _grad
from fusegrad.autograd.function import FunctionCtx
from fusegrad.autograd.graph_base import AccumulateGrad, Node
from fusegrad.autograd.node import _freed_message
from fusegrad.dtypes import get_default_dtype
from fusegrad.errors import AutogradError
from fusegrad.nn.module import Module
from fusegrad.tensor import Tensor
from fusegrad.utils.checkpoint import CheckpointFunction

from . import admission, events, passes, workers
from . import tape as _tape
from . import trace as _trace
from .admission import CompilationError
from .capture import Fallback
from .capture import capture as _capture_graph
from .dynamic import masked, merge_entries, merge_with_earlier, why_concrete
from .events import emit
from .guard import Guards
from .ir import Graph, Value, verify
from .key import walk as _walk
from .passes.buffers import VIEW_OPS
from .program import Program
from .recording import Recorder, StepBreak, Watch, describe_change, why_recorded
from .region import Region, compiled_autograd
from .service import Background, CompileNotice, Programs, Recordings, service
from .settings import config
from .step import Step, record, run_as_written


class _ModuleNode(Node):
    """What the backward nodes of a compiled module's outputs share: one node for ``_count``
    outputs, named as in PyTorch's traces."""

    __slots__ = ("_count",)

    def name(self) -> str:
        return "CompiledModuleBackward"

    @property
    def num_outputs(self) -> int:
        return self._count


class CompiledModuleBackward(_ModuleNode):
    """The backward of one call of a compiled module: ``autograd.grad`` of the call's real
    outputs with respect to its parameters and tensor arguments, inside a compiled region.

    Outputs computed from other outputs (``logits, loss``) get a node of their own whose
    edges go on to the inner outputs' node (``inner``), as eager's graph does (see
    ``_two_levels``)."""

    __slots__ = ("_fullgraph", "_inner", "_inner_outputs", "_inputs", "_mode", "_outputs")

    def __init__(
        self,
        outputs: list,
        inputs: list,
        fullgraph: bool,
        mode: str,
        inner: _ModuleNode | None = None,
        inner_outputs: list = (),  # type: ignore[assignment]
    ) -> None:
        edges = [t._edge() for t in inputs] + [(inner, k) for k in range(len(inner_outputs))]
        meta = [(t._data.shape, t._dtype) for t in [*inputs, *inner_outputs]]
        super().__init__(tuple(edges), tuple(meta))
        self._outputs: list | None = outputs
        self._count = len(outputs)
        self._inputs: list | None = inputs
        self._inner = inner
        self._inner_outputs = list(inner_outputs)
        self._fullgraph = fullgraph
        self._mode = mode

    def apply(self, grads: tuple, retain: bool) -> tuple:
        if self._outputs is None or self._inputs is None:
            raise AutogradError(_freed_message)
        roots = [o for o, g in zip(self._outputs, grads) if g is not None]
        root_grads = [g for g in grads if g is not None]
        create = grad_mode.is_grad_enabled()  # the engine enables it for create_graph
        n_inner = len(self._inner_outputs)
        if n_inner and _observed(self._inner):
            return _cut_backward(
                roots, root_grads, self._inputs, self._inner_outputs, self, create, retain
            )
        # only the inputs the running backward needs (eager runs no other node of the module)
        mask = _needed_edges(self)
        if mask is not None:
            mask = mask[: len(self._inputs)]
        inputs = self._inputs if mask is None else [t for t, m in zip(self._inputs, mask) if m]
        # the inputs' own hooks run once, when the engine delivers these gradients to them:
        # not also inside (``autograd.grad`` would run them on what it captures)
        stashed = _stash_hooks(inputs)
        # (the inner outputs' node may still run a backward through the same graph)
        keep = retain or create or (n_inner > 0 and _runs_later(self._inner, n_inner))
        try:
            with compiled_autograd(self._fullgraph, self._mode):
                result = _grad(
                    roots,
                    inputs,
                    root_grads,
                    retain_graph=keep,
                    create_graph=create,
                    allow_unused=True,
                )
        finally:
            _restore_hooks(stashed)
        if mask is not None:
            it = iter(result)
            result = tuple(next(it) if m else None for m in mask)
        # (the references stay: the module's own graph frees its saved tensors and raises
        # eager's error where a second backward needs them, and only there)
        return (*result, *(None,) * n_inner)


def _observed(inner: Node) -> bool:
    """Whether the running backward looks at what reaches the inner outputs' node ``inner``:
    hooks or ``retain_grad`` on those outputs, node hooks, or ``autograd.grad`` /
    ``backward(inputs=...)`` with respect to one of them.  Then what the outer outputs send
    into them must reach them (``_cut_backward``); else it may flow on inside."""
    if inner._tensor_pre_hooks or inner._retain_grad_hooks or inner._pre_hooks:
        return True
    if inner._post_hooks:
        return True
    task = _engine._current.task
    return task is not None and any(node is inner for node, _ in task.capture)


def _runs_later(inner: Node, own_edges: int) -> bool:
    """Whether the running backward also sends gradients into ``inner`` from outside the
    module: some were delivered already, or more are to come than the outer node's own
    edges to it."""
    task = _engine._current.task
    return task is None or inner in task.buffers or task.deps.get(inner, 0) > own_edges


def _cut_backward(
    roots: list,
    root_grads: list,
    inputs: list,
    inner: list,
    node: Node,
    create: bool,
    retain: bool = True,
) -> tuple:
    """The outer outputs' backward stopped at the inner outputs: gradients for ``inputs`` by
    the paths that avoid the inner outputs, and what reaches each inner output (delivered
    along the node's edges to the inner node, which adds what uses outside send and runs the
    rest).  Eagerly, through the real graph: the nodes it runs are freed as eager frees them
    (without ``retain``) unless the inner node's backward still runs through one of them."""
    mask = _needed_edges(node)
    n = len(inputs)
    wanted = inputs if mask is None else [t for t, m in zip(inputs, mask[:n]) if m]
    keep = retain or create or _shares_nodes(roots, inner, [*wanted, *inner])
    stashed = _stash_hooks(wanted)
    try:
        result = _engine.run_backward(
            roots,
            root_grads,
            keep,
            create,
            inputs=[*wanted, *inner],
            accumulate=False,
            cut=inner,
        )
    finally:
        _restore_hooks(stashed)
    assert result is not None
    own, to_inner = result[: len(wanted)], result[len(wanted) :]
    if mask is not None:
        it = iter(own)
        own = [next(it) if m else None for m in mask[:n]]
    return (*own, *to_inner)


def _nodes_below(starts: list, stops: frozenset = frozenset()) -> Iterator[Node]:
    """Every node reachable from ``starts`` (each once), not following the edges in ``stops``
    (``(id(node), output_nr)`` pairs)."""
    seen: set[int] = set()
    stack = [n for n in starts if n is not None]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        stack.extend(c for c, nr in n._edges if c is not None and (id(c), nr) not in stops)


def _cut_runs(roots: list, targets: list, inner: list) -> list[Node]:
    """The nodes a backward from ``roots`` with respect to ``targets``, stopped at the
    ``inner`` outputs, runs -- the nodes the engine runs: below ``roots`` without crossing the
    inner outputs' edges, on a path to a target (``engine._needed``); a target itself only
    where it leads on to another."""
    stops = frozenset((id(t.grad_fn), t._output_nr) for t in inner if t.grad_fn is not None)
    below = list(_nodes_below([r.grad_fn for r in roots], stops))
    ends = {node for node, _ in (t._edge() for t in targets) if node is not None}
    reachable = dict.fromkeys([*below, *(t.grad_fn for t in inner if t.grad_fn is not None)])
    needed = _engine._needed(reachable, ends)
    return [
        n for n in below if n in needed and (n not in ends or any(c in needed for c, _ in n._edges))
    ]


def _freed_by_cut(roots: list, ran: list, targets: list, inner: list) -> frozenset:
    """The positions among ``roots`` from which a backward reaches a node that saved something
    and that a backward from ``ran`` (some of the roots), with respect to ``targets`` and
    stopped at the ``inner`` outputs, runs (``_cut_runs``)."""
    freed = {n for n in _cut_runs(ran, targets, inner) if getattr(n, "_saved", None)}
    if not freed:
        return frozenset()
    return frozenset(
        k for k, r in enumerate(roots) if any(n in freed for n in _nodes_below([r.grad_fn]))
    )


def _shares_nodes(roots: list, inner: list, targets: list) -> bool:
    """Whether a backward from ``roots`` with respect to ``targets``, stopped at the ``inner``
    outputs, runs a node that the inner outputs' own backward runs too (a path from the outer
    outputs to an input that passes below the inner outputs without going through them):
    those must stay unfreed (a leaf's accumulator holds nothing to free).  Only the nodes it
    runs count (``_cut_runs``): a node below both that leads to no target is not run, and
    keeping the graph for it left the nodes the backward did run unfreed, where eager frees
    them (fuzz seed 309663: ``autograd.grad`` of the outer output with respect to it and the
    inner one, then a backward through the outer one raised nothing)."""
    below = {id(n) for n in _nodes_below([t.grad_fn for t in inner])}
    return any(
        id(n) in below and type(n) is not AccumulateGrad for n in _cut_runs(roots, targets, inner)
    )


def _needed_edges(node: Node) -> list | None:
    """Which of ``node``'s edges the running backward needs (``autograd.grad`` or
    ``backward(inputs=...)`` with respect to some of the module's inputs), or None: all."""
    task = _engine._current.task
    needed = task.needed if task is not None else None
    if needed is None:
        return None
    mask = [child is not None and child in needed for child, _ in node._edges]
    return None if all(mask) else mask


def _stash_hooks(inputs: list) -> list:
    """Take the tensor hooks (and ``retain_grad``) of ``inputs`` off them; ``_restore_hooks``
    puts them back."""
    stashed = []
    for t in inputs:
        if t.grad_fn is None:
            if t._hooks:
                stashed.append((t, "leaf", t._hooks))
                t._hooks = None
            continue
        node, nr = t.grad_fn, t._output_nr
        for attr in ("_tensor_pre_hooks", "_retain_grad_hooks"):
            hooks = getattr(node, attr)
            if hooks and nr in hooks:
                stashed.append((node, attr, (nr, hooks.pop(nr))))
    return stashed


def _restore_hooks(stashed: list) -> None:
    for owner, kind, value in stashed:
        if kind == "leaf":
            owner._hooks = value
        else:
            nr, hooks = value
            getattr(owner, kind)[nr] = hooks


def _roots(out: Any, first_seq: int) -> list:
    """The outputs made by the call (nodes numbered from ``first_seq`` on), each once."""
    roots: list = []
    for t in _tensors(out):
        if t.grad_fn is not None and t.grad_fn._seq > first_seq and all(t is not r for r in roots):
            roots.append(t)
    return roots


class FunctionModule(Module):
    """A function compiled as a module (``compile(fn)`` of a function whose outputs a backward
    outside it differentiates: ``step.CompiledFunction``): its forward is the function, and the
    backward node's edges go to the leaves its graph reaches (the parameters of the modules it
    reads from its globals and closure, watched like a whole step's) and its tensor
    arguments."""

    def __init__(self, fn: Callable) -> None:
        super().__init__()
        object.__setattr__(self, "fn", fn)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _inputs_of(
    mod: Module, args: tuple, kwargs: dict, roots: list | None = None, first_seq: int = 0
) -> list:
    """What the module's backward node has edges to: its parameters that require grad, then
    the tensor arguments that do.  A ``FunctionModule``'s parameters are the leaves the graph
    of ``roots`` (the call's outputs; nodes numbered from ``first_seq`` on were made by the
    call) reaches, in the order a walk from the outputs meets them."""
    if isinstance(mod, FunctionModule):
        inputs = []
        seen = set()
        for child, _ in _edges_below([r.grad_fn for r in roots or ()], first_seq):
            if type(child) is AccumulateGrad and id(child.variable) not in seen:
                seen.add(id(child.variable))
                inputs.append(child.variable)
    else:
        inputs = [p for p in mod.parameters() if p.requires_grad]
    seen = {id(p) for p in inputs}
    for t in _tensors((args, kwargs)):
        if t.requires_grad and id(t) not in seen:
            seen.add(id(t))
            inputs.append(t)
    return inputs


def _tensors(tree: Any) -> Iterator[Tensor]:
    """The tensors in nested tuples, lists and dict values (the arguments' structure)."""
    if isinstance(tree, Tensor):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for x in tree:
            yield from _tensors(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from _tensors(x)


def _map_tensors(tree: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``tree`` with every tensor replaced by ``fn(tensor)`` (tuples, lists, dicts rebuilt;
    named tuples keep their type)."""
    if isinstance(tree, Tensor):
        return fn(tree)
    if isinstance(tree, tuple):
        items = [_map_tensors(x, fn) for x in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    if isinstance(tree, list):
        return [_map_tensors(x, fn) for x in tree]
    if isinstance(tree, dict):
        return {k: _map_tensors(v, fn) for k, v in tree.items()}
    return tree


def _outside_reason(
    roots: list, inputs: list, first_seq: int, tape: _tape.Tape | None
) -> str | None:
    """Why the graph of ``roots`` reaches beyond ``inputs`` (the parameters and tensor
    arguments), or None when it does not.  Nodes numbered from ``first_seq`` on were made by the
    call."""
    leaf_ids = {id(t) for t in inputs if t.grad_fn is None}
    edges = {(id(t.grad_fn), t._output_nr) for t in inputs if t.grad_fn is not None}
    if (
        tape is not None
        and tape.open
        and not edges
        and all(tape.position(r.grad_fn) >= 0 for r in roots)
    ):
        # every node the call made is on the tape (an edge to any other node closes it), with
        # its edges to leaves numbered there: nothing else to look at
        for ref in tape.leaves:
            acc = ref()
            if acc is not None and id(acc.variable) not in leaf_ids:
                return _leaf_reason(acc.variable)
        return None
    for child, nr in _edges_below([r.grad_fn for r in roots], first_seq, edges):
        if (id(child), nr) in edges:
            continue
        if type(child) is AccumulateGrad:
            if id(child.variable) not in leaf_ids:
                return _leaf_reason(child.variable)
        elif child._seq < first_seq:
            return (
                f"the forward reaches {child.name()}, made before the call and not an "
                "argument's: its gradient would not flow on"
            )
    return None


def _edges_below(starts: list, first_seq: int, stop: Any = ()) -> Iterator[tuple]:
    """Every edge ``(child, nr)`` of the nodes the call made that are reachable from
    ``starts`` (each node once), not looking beyond leaves, nodes made before the call (numbered
    below ``first_seq``) and the edges in ``stop`` (``(id(node), nr)`` pairs)."""
    seen: set[int] = set()
    stack = list(starts)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for child, nr in node._edges:
            if child is None:
                continue
            yield child, nr
            if (
                type(child) is not AccumulateGrad
                and child._seq >= first_seq
                and (id(child), nr) not in stop
            ):
                stack.append(child)


def _two_levels(roots: list, first_seq: int) -> tuple[list, list] | str:
    """``(outer, inner)``: the positions of the outputs computed from other outputs, and of the
    rest (``outer`` empty: the outputs are independent); or why the outputs' dependencies are
    deeper than two levels (an output computed from one that is computed from a third).

    The outer outputs' node has edges to the inner outputs' node, as in eager's graph, so that
    hooks, ``retain_grad`` and ``autograd.grad`` on an inner output see what the outer ones
    send into it.  When nothing looks there, the outer node's backward runs on through the inner
    outputs (one program for ``logits, loss = model(x, y); loss.backward()``)."""
    if len(roots) < 2:
        return [], list(range(len(roots)))
    where = {(id(r.grad_fn), r._output_nr): k for k, r in enumerate(roots)}
    reaches: list[set] = [set() for _ in roots]
    for k, r in enumerate(roots):
        for child, nr in _edges_below([r.grad_fn], first_seq):
            other = where.get((id(child), nr))
            if other is not None and other != k:
                reaches[k].add(other)
    outer = [k for k, found in enumerate(reaches) if found]
    reached = set().union(*reaches)
    for k in outer:
        if k in reached:
            return (
                f"output {k} of the module is computed from another output and used to "
                "compute a third (more than two levels)"
            )
    return outer, [k for k in range(len(roots)) if k not in outer]


def _hooked_output_reason(roots: list) -> str | None:
    """Why the module's backward node would be wrong: an output has hooks or retains its
    gradient (registered inside the forward, on the real output), or None."""
    for k, r in enumerate(roots):
        node, nr = r.grad_fn, r._output_nr
        if r._retains_grad or (node._tensor_pre_hooks and nr in node._tensor_pre_hooks):
            return f"output {k} of the module has hooks or retains its gradient"
    return None


def _reentrant_reason(roots: list, first_seq: int) -> str | None:
    """Why the module's backward cannot be an ``autograd.grad`` with respect to its inputs: a
    reentrant checkpoint inside needs a plain ``backward()`` (eager raises otherwise), or
    None."""
    starts = [r.grad_fn for r in roots]
    for node in [*starts, *(child for child, _ in _edges_below(starts, first_seq))]:
        if type(node) is FunctionCtx and node._cls is CheckpointFunction:
            return "the forward has a reentrant checkpoint (its backward needs a plain backward())"
    return None


def _leaf_reason(t: Tensor) -> str:
    return (
        f"the forward uses a tensor of shape {list(t.shape)} that requires grad and is neither "
        "a parameter nor an argument (a closure or a plain attribute): its gradient would be lost"
    )


# ---- ahead-of-time: the forward replayed, the backward a second program ----------------------

# elementwise primitives a backward recomputes from the forward's inputs instead of having the
# forward save their results (``AOTEntry``): cheap, and their inputs are kept anyway
_RECOMPUTE_KINDS = ("elementwise",)


class AOTEntry:
    """One recorded call of a compiled module, replayable ahead of time: the forward program
    (a whole-step ``Step`` whose outputs are the module's outputs, then the values its backward
    reads) and the backward graph over the root gradients and those saved values, built into a
    program on the first backward.

    What the backward reads of the forward is decided here: forward values computed by
    elementwise primitives from the forward's inputs alone (parameters, arguments, random
    draws, constants) are recomputed in the backward; every other value it reads is saved.
    ``stats`` compares the bytes saved with eager's saved tensors."""

    def __init__(
        self,
        rec: Recorder,
        out: Any,
        roots: list,
        inputs: list,
        watch: Watch,
        mode: str,
        levels: tuple = ([], []),
    ) -> None:
        self.mode = mode
        # (outer, inner): positions of the roots computed from other roots, and of the rest
        # (``_two_levels``; no outer ones: one node for all)
        self.levels = levels
        self.root_meta = [(r._data.shape, r._dtype) for r in roots]
        bg = Graph()  # no output needs a gradient (inference): the forward program alone
        w = None
        if roots:
            dummy = [Tensor._make(_storage.full_like(r._data, 0)) for r in roots]
            w = _walk(roots, dummy, inputs, False, False)
            plan = admission.admit(w, admission.MODULE, inputs=inputs, accumulate=False)
            if isinstance(plan, str):
                raise StepBreak(plan)
            try:
                captured = _capture_graph(
                    w, roots, dummy, inputs, False, symbolic=False, allow_opaque=False
                )
            except Fallback as e:
                raise StepBreak(str(e)) from None
            except Exception as e:  # noqa: BLE001  (eager raises it only if a backward runs there)
                raise StepBreak(f"its whole backward would raise: {e}") from None
            bg = captured.graph
        # the backward graph: root gradients first, then the saved values (numbered as they
        # are met), recomputed values inlined
        back = Graph()
        roots_in = [back.input("arg", i, r._data.shape, r._dtype) for i, r in enumerate(roots)]
        saved: list[Value] = []  # forward values the forward program outputs for the backward
        saved_in: dict[Value, Value] = {}

        def bring(f: Value) -> Value:
            """Forward value ``f`` in the backward graph: recomputed or a saved input."""
            found = saved_in.get(f)
            if found is not None:
                return found
            if f.op == "scalar":
                value = back.scalar(f.attr("value"), f.dtype)
            elif f.op == "constant":
                index = f.attr("index")
                value = back.constant(rec.graph.constants[index])
                if index in rec.graph.recipes:  # (``dynamic`` makes it again at other sizes)
                    back.recipes[value.attr("index")] = rec.graph.recipes[index]
            elif f.kind in _RECOMPUTE_KINDS and _from_inputs(f):
                value = back.add(f.op, tuple(bring(i) for i in f.inputs), f.attrs, f.shape, f.dtype)
            else:
                value = back.input("arg", len(roots) + len(saved), f.shape, f.dtype)
                saved.append(f)
            saved_in[f] = value
            return value

        mapping = rec.graft(w, bg, back, lambda k: roots_in[k], bring)
        for kind, pos, v in bg.effects:
            if kind != "capture":
                raise StepBreak(f"the module's backward has {kind} effects")
            back.effects.append(("capture", pos, mapping[v]))
        verify(back)
        self.backward_graph = back
        # per pattern of outputs that got a gradient: the backward program, and the graph it
        # is built from (None: that pattern cannot be pruned exactly)
        self.backward_programs = Programs()
        self.pruned: dict[tuple, Graph | None] = {}
        self.n_inputs = len(inputs)
        # the forward program outputs the module's outputs, then the saved values that are not
        # inputs of the forward (those are the call's own arrays)
        forward_inputs = set(rec.input_values)  # (after the graft: it may add inputs)
        input_index = {v: v.attr("index") for v in rec.input_values}
        internal = [f for f in saved if f not in forward_inputs]
        slot = {f: k for k, f in enumerate(internal)}
        # per saved value: ("input", program input index) or ("output", extra output slot)
        self.saved_plan = [
            ("input", input_index[f]) if f in forward_inputs else ("output", slot[f]) for f in saved
        ]
        self.step = Step(rec, *rec.finish(out, internal, history=True))
        self.device = self.step.device  # (the backward program runs where the forward's does)
        verify(rec.graph)
        self.n_outputs = rec.user_outputs
        # what eager would check before this backward: the saved inputs and saved outputs
        user_values = [
            v for kind, k, v in rec.graph.effects if kind == "capture" and k < rec.user_outputs
        ]
        output_of = {v: k for k, v in enumerate(user_values)}
        self.version_checks = []
        for f in saved:
            if f in output_of:
                self.version_checks.append(("output", output_of[f]))
            base = f
            while base.op in VIEW_OPS and base not in forward_inputs:
                base = base.inputs[0]  # a view of an input shares its memory (and version)
            if base in forward_inputs:
                self.version_checks.append(("input", input_index[base]))
        root_ids = {id(r) for r in roots}
        self.root_slots = [k for k, t in enumerate(rec.output_tensors) if id(t) in root_ids]
        if len(self.root_slots) != len(roots):
            raise StepBreak("an output that needs a gradient is not one of the recorded outputs")
        # the backward's edges on a call: parameters (watched) and tensor arguments, by position
        arg_index = {id(t): k for k, t in enumerate(watch.args)}
        self.input_sources = [
            ("arg", arg_index[id(t)]) if id(t) in arg_index else ("ext", t) for t in inputs
        ]
        self.has_draws = any(src[0] == "draw" for src in rec.sources)
        self.stats = {
            "eager saved bytes": sum(rec.eager_saved.values()),
            "saved bytes": sum(_nbytes(f) for f in internal),
            "saved values": len(internal),
            "saved inputs": len(saved) - len(internal),
        }

    def reads_saved(self, present: tuple) -> bool:
        """Whether the backward for this pattern of output gradients reads a saved value (or
        cannot say: not prunable)."""
        graph = self.backward_graph if all(present) else _prune(self.backward_graph, present)
        if graph is None:
            return _reads_saved_loosely(self.backward_graph, present)
        stack, live = [v for _, _, v in graph.effects], set()
        while stack:  # (what the effects need: the values a program would compute)
            v = stack.pop()
            if v not in live:
                live.add(v)
                stack.extend(v.inputs)
        return any(v.op == "input" and v.attr("index") >= len(present) for v in live)

    def build_backward(self, graph: Graph) -> Program:
        """The backward program of ``graph`` (the module's backward, or a pruned one)."""
        with _trace.resume(self):  # (the trace report's section of this recording)
            return service.build(
                passes.run(graph, check=False), mode=self.mode, device=self.device, recorded=True
            )

    def graph_for(self, present: tuple) -> Graph | None:
        """The backward graph for this pattern of output gradients (None: not prunable)."""
        if all(present):
            return self.backward_graph
        if present not in self.pruned:
            self.pruned[present] = _prune(self.backward_graph, present)
        return self.pruned[present]

    def backward(self, saved: list, grads: tuple, sizes: tuple | None = None) -> list | None:
        """The inputs' gradients (None for an input no output with a gradient reaches), or
        None when this pattern of absent output gradients cannot be pruned exactly.  ``sizes``:
        the call's size vector (an entry over symbols, ``dynamic``)."""
        present = tuple(g is not None for g in grads)
        # (an absent gradient's input is never read: any array of its shape will do)
        arrays = [g._data if g is not None else np.empty(0) for g in grads] + saved
        program = self.backward_programs.ready(present)
        notice = None
        if program is None:
            graph = self.graph_for(present)
            if graph is None:
                return None
            background = None
            if self.mode != "debug" and self.device == "cpu":  # (CUDA: in the foreground)
                background = Background(
                    owner="compiled module",
                    what="a compiled module's backward in the background (run uncompiled "
                    "meanwhile)",
                    warmup=lambda: ([np.array(a, copy=True) for a in arrays], [], (), sizes),
                    uncompiled=lambda: service.uncompiled(graph),
                    worker=True,
                )
            notice = CompileNotice()
            program, _ = service.obtain(
                self.backward_programs,
                present,
                lambda: self.build_backward(graph),
                background,
                notice,
            )
        emit(events.COMPILED_RUN)
        prev = grad_mode._state.enabled
        grad_mode._state.enabled = False
        try:
            grads_out = program.run_step(arrays, [], {}, self.n_inputs, sizes)
        finally:
            grad_mode._state.enabled = prev
            if notice is not None:
                notice.stop()
        for slot in program.fresh_outputs(sizes):
            # (its own array, handed out once: a leaf's first .grad takes it as it is)
            if grads_out[slot] is not None:
                _engine.give(grads_out[slot])
        return grads_out  # type: ignore[no-any-return]


_ABSENT = object()


def _prune(graph: Graph, present: tuple) -> Graph | None:
    """``graph`` for a backward in which only the ``present`` root gradients exist: what flows
    from the absent ones alone is left out (not zeros: a zero gradient through an inf would be
    NaN where eager computes nothing).  Gradients meet in ``add``/``sub``; any other op joining
    an absent flow with a present one gives None (not prunable: the caller re-runs eagerly), and
    so does a gradient that depends on no root gradient at all (a ``ceil``'s zeros) where it
    meets an absent flow or becomes an effect: which outputs' paths it lies on, the values
    cannot tell (eager computes it only when its path runs)."""
    roots = graph.inputs_of("arg")[: len(present)]
    absent = {v for v, p in zip(roots, present) if not p}
    flowing = {v for v, p in zip(roots, present) if p}  # values a present gradient reaches
    # values no root gradient reaches (saved values, and what a rule makes without its
    # incoming gradient: ceil's zeros): on which path they lie, the values cannot say
    neutral = {v for v in graph.values if v.op != "input" or v not in roots}
    out = Graph(constants=list(graph.constants), hints=graph.hints)
    mapping: dict = {}
    for v in graph.values:
        if v in absent:
            mapping[v] = _ABSENT
            continue
        if any(i in flowing for i in v.inputs):
            flowing.add(v)
        if v.inputs and not all(i in neutral for i in v.inputs):
            neutral.discard(v)
        inputs = [mapping[i] for i in v.inputs]
        gone = [i is _ABSENT for i in inputs]
        if any(gone):
            if v.op in ("add", "sub") and any(i in neutral for i in v.inputs):
                return None  # an absent flow meets a gradient of no known path
            if v not in flowing:  # only the absent flow (times saved values): nothing
                mapping[v] = _ABSENT
            elif v.op == "add" and len(inputs) == 2:
                mapping[v] = inputs[1] if gone[0] else inputs[0]
            elif v.op == "sub" and len(inputs) == 2 and gone[1]:
                mapping[v] = inputs[0]
            elif v.op == "sub" and len(inputs) == 2:
                b = inputs[1]
                mapping[v] = out.add("neg", (b,), {}, b.shape, b.dtype, v.origin)
            else:
                return None
            kept = mapping[v]
            if kept is not _ABSENT and (kept.shape, kept.dtype) != (v.shape, v.dtype):
                return None  # (a broadcasting add: its other side is not the whole result)
            continue
        if v.op == "input":
            mapping[v] = out.input("arg", v.attr("index"), v.shape, v.dtype)
        else:
            mapping[v] = out.add(v.op, tuple(inputs), v.attrs, v.shape, v.dtype, v.origin)
    for kind, slot, v in graph.effects:
        if v in neutral:
            return None  # a gradient no root reaches: eager writes it only if its path runs
        if mapping[v] is not _ABSENT:
            out.effects.append((kind, slot, mapping[v]))
    return out


def _reads_saved_loosely(graph: Graph, present: tuple) -> bool:
    """Whether a backward in which only the ``present`` root gradients exist may read a saved
    value, for a pattern ``_prune`` cannot make exact: what flows only from absent roots is
    left out, and every value that depends on no root (a ``ceil``'s zeros: ``_prune`` cannot
    place those on a path) is kept.  False means no part the backward runs needs what was
    saved, as eager's nodes there save nothing (a ``ceil`` output's second backward)."""
    n = len(present)
    roots = graph.inputs_of("arg")[:n]
    absent = {v for v, p in zip(roots, present) if not p}
    flowing = {v for v, p in zip(roots, present) if p}
    only_absent = set(absent)
    for v in graph.values:
        if v in absent:
            continue
        if any(i in flowing for i in v.inputs):
            flowing.add(v)
        elif any(i in only_absent for i in v.inputs):
            only_absent.add(v)
    stack = [v for _, _, v in graph.effects if v not in only_absent]
    live: set = set()
    while stack:
        v = stack.pop()
        if v in live or v in only_absent:
            continue
        live.add(v)
        stack.extend(v.inputs)
    return any(v.op == "input" and v.attr("index") >= n for v in live)


def _from_inputs(f: Value) -> bool:
    """Whether ``f`` is computed by elementwise primitives from forward inputs, scalars and
    constants alone."""
    stack, seen = [f], set()
    while stack:
        v = stack.pop()
        if v in seen or v.op in ("input", "scalar", "constant"):
            continue
        seen.add(v)
        if v.kind not in _RECOMPUTE_KINDS or len(seen) > 16:
            return False
        stack.extend(v.inputs)
    return True


def _nbytes(v: Value) -> int:
    n = v.dtype.np.itemsize
    for d in v.shape:
        n *= int(d)
    return n


class AOTBackward(_ModuleNode):
    """The backward of one replayed call of a compiled module: ``AOTEntry.backward`` on what
    that call's forward program saved, with eager's checks (saved outputs and inputs not
    modified in place since) and its errors.  A backward that must itself be differentiable
    (``create_graph=True``) re-runs the module's forward eagerly from the same inputs.

    ``slots``: the outputs (positions among the entry's roots) this node is the ``grad_fn``
    of -- all of them, or, for outputs computed from other outputs, the outer ones (with
    edges on to ``inner``, the node of the inner ones: ``_two_levels``) or the inner ones.
    The nodes of one call share what it saved (``state``: freed by a backward that does not
    retain the graph)."""

    __slots__ = (
        "_checks",
        "_deferred",
        "_entry",
        "_inner",
        "_inputs",
        "_redo",
        "_sizes",
        "_slots",
        "_state",
        "_freed_roots",
    )
    # (an inner node runs even when nothing from outside reaches it: it may hold the outer
    # outputs' gradients, deferred to it, ``_defer``)
    _runs_without_grads = True

    def __init__(
        self,
        entry: AOTEntry,
        inputs: list,
        state: list,
        checks: list,
        redo: Callable,
        slots: list,
        inner: AOTBackward | None = None,
        inner_meta: list = (),  # type: ignore[assignment]
        sizes: tuple | None = None,
    ) -> None:
        n_inner = len(inner._slots) if inner is not None else 0
        edges = [t._edge() for t in inputs] + [(inner, k) for k in range(n_inner)]
        # (the inner outputs' shapes and dtypes: what the edges to them carry)
        meta = [(t._data.shape, t._dtype) for t in inputs] + list(inner_meta)
        super().__init__(tuple(edges), tuple(meta))
        self._entry = entry
        self._inputs = inputs
        self._state = state  # [saved values, or None once freed]
        self._checks = checks
        self._count = len(slots)
        self._slots = slots
        self._inner = inner
        self._redo = redo
        self._sizes = sizes  # the call's size vector (``dynamic``), or None
        # a backward stopped at the inner outputs ran this node without retaining the graph:
        # eager's nodes it ran are freed then.  Per such backward (its task id), the outputs
        # (positions among the entry's roots) from which a later backward reaches one of
        # those that saved something, and raises eager's error (``_ran_cut``)
        self._freed_roots: list[tuple[int, frozenset]] = []
        # the outer outputs' gradients, deferred to this inner node by the outer one in the
        # running backward (``_defer``): (that backward's task, every output's gradient)
        self._deferred: tuple | None = None

    def apply(self, grads: tuple, retain: bool) -> tuple:
        entry = self._entry
        full: list = [None] * len(entry.root_slots)  # the gradients of every output
        for k, g in zip(self._slots, grads):
            full[k] = g
        deferred, self._deferred = self._deferred, None
        if deferred is not None and deferred[0] is _engine._current.task:
            for k, g in enumerate(deferred[1]):
                if g is not None:
                    full[k] = g
        if all(g is None for g in full):
            return (None,) * len(self._edges)
        inner = self._inner
        n_inner = len(inner._slots) if inner is not None else 0
        saved = self._state[0]
        if self._freed_roots and self._reaches_freed(full):
            raise AutogradError(_freed_message)
        if saved is None:
            # freed by a backward through the whole module: a later one may still run the
            # parts that read nothing saved (a view's backward), as eager's nodes can
            present = tuple(g is not None for g in full)
            if grad_mode.is_grad_enabled() or entry.reads_saved(present):
                raise AutogradError(_freed_message)
            saved = [None] * len(entry.saved_plan)
        for t, version, what in self._checks:
            if t._version_counter.value != version:
                raise AutogradError(
                    "one of the variables needed for gradient computation has been modified "
                    f"by an inplace operation: [{t._dtype.name} {list(t._data.shape)}], {what}, "
                    f"is at version {t._version_counter.value}; expected version {version} "
                    "instead (needed by CompiledModuleBackward)."
                )
        if inner is not None and _observed(inner):
            # what reaches the inner outputs is looked at: the outer ones' backward stops
            # there (the forward again, eagerly), and the inner node runs the rest
            mask = _needed_edges(self)
            result = tuple(
                self._redo(tuple(full), mask and mask[: len(self._inputs)], inner._slots)
            )
            if not retain and not grad_mode.is_grad_enabled() and entry.saved_plan:
                self._ran_cut(getattr(self._redo, "cut_freed", None))
            return result
        mask = _needed_edges(self)
        if mask is not None:
            mask = mask[: len(self._inputs)]
            if all(mask):
                mask = None
        if inner is not None and mask is None and self._defer(full, n_inner):
            return (None,) * len(self._edges)
        result = None
        if not grad_mode.is_grad_enabled() and mask is None:
            # (outputs without a gradient: the program for that pattern leaves out what flows
            # from them alone, as eager runs nothing there)
            result = entry.backward(saved, tuple(full), self._sizes)
        if result is None:
            # create_graph (a differentiable backward), a backward that needs only some of the
            # module's inputs (eager runs only part of its graph), or absent gradients that
            # cannot be pruned exactly: the forward again, eagerly
            result = self._redo(tuple(full), mask)
        partial = mask is not None or any(g is None for g in full)
        later = inner is not None and _runs_later(inner, n_inner)
        if not retain and not later and entry.saved_plan and (not partial or inner is not None):
            # (a backward that reached only some outputs leaves the rest usable, as eager's
            # frees only the nodes it ran; one from the outer outputs ran through all of them)
            self._state[0] = None
        return (*result, *(None,) * n_inner)

    def _ran_cut(self, freed: frozenset | None) -> None:
        """A backward stopped at the inner outputs ran without retaining the graph: eager
        frees the nodes it ran, so a later backward raises eager's error where it reaches one
        of those that saved something, and only there (fuzz seed 40280: flip, cumsum, neg save
        nothing; seed 3005251: a later backward from another outer output, through nodes the
        first did not run).  ``freed``: the outputs such a backward starts from (the redo's
        ``cut_freed``; None: all of them).  Both nodes of the call keep it: a later backward
        from the inner outputs reaches what the cut ran below them too (not the running one:
        the inner node runs the rest of it)."""
        if freed is None:
            freed = frozenset(range(len(self._entry.root_slots)))
        if freed:
            task = _engine.current_graph_task_id()
            for node in (self, self._inner):
                if node is not None:
                    node._freed_roots.append((task, freed))

    def _reaches_freed(self, full: list) -> bool:
        """Whether a backward with the outputs' gradients ``full`` starts from an output from
        which an earlier backward's freed nodes are reached (``_ran_cut``)."""
        task = _engine.current_graph_task_id()
        return any(
            full[k] is not None
            for ran_in, freed in self._freed_roots
            if ran_in != task
            for k in freed
        )

    def _defer(self, full: list, n_inner: int) -> bool:
        """Hand the outer outputs' gradients ``full`` on to the inner outputs' node, when the
        running backward reaches that node from outside the module too (a VAE's KL term on
        ``mu`` and ``logvar`` beside the reconstruction computed from them): it then runs one
        backward program for every output.  Run here, the outer outputs' program would go on
        through the inner outputs to the inputs, and the inner node's would run that part
        again for its own gradients.  Not for a differentiable backward (``create_graph``,
        which re-runs the forward eagerly)."""
        task = _engine._current.task
        inner = self._inner
        if task is None or grad_mode.is_grad_enabled() or inner is None:
            return False
        if not (inner in task.buffers or task.deps.get(inner, 0) > n_inner):
            return False
        inner._deferred = (task, full)
        return True


class OptimizedModule(Module):
    """What ``fusegrad.compile(module)`` returns (see the module docstring)."""

    def __init__(self, mod: Module, fullgraph: bool, mode: str) -> None:
        super().__init__()
        object.__setattr__(self, "_orig_mod", mod)
        object.__setattr__(self, "_fullgraph", fullgraph)
        object.__setattr__(self, "_compile_mode", mode)
        object.__setattr__(self, "_reasons_logged", set())
        # guard key -> AOTEntry | reason (str), and the recording policy
        object.__setattr__(self, "_aot", Recordings(lambda: f"compile({type(mod).__name__})"))
        # recordings merged over sizes (``dynamic``), every size after the second replays one
        object.__setattr__(self, "_dynamics", [])
        # fast guards of the latest replayed keys (``guard.FastGuard``)
        object.__setattr__(self, "_guards", Guards())
        if mode != "debug":  # (as ``step.CompiledFunction``: the interpreter's worker starts now)
            workers.warm_interpreter(get_default_dtype().name)

    # -- the original's state, not a copy -------------------------------------------------------
    @property
    def training(self) -> bool:  # type: ignore[override]
        return self._orig_mod.training

    @training.setter
    def training(self, value: bool) -> None:
        if "_orig_mod" in self.__dict__:
            self._orig_mod.training = value

    def __getattr__(self, name: str) -> Any:
        if name == "_orig_mod":
            raise AttributeError(name)
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "training":
            object.__setattr__(self, name, value)
        elif "_orig_mod" in self.__dict__ and not name.startswith("_"):
            setattr(self._orig_mod, name, value)
        else:
            super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self._orig_mod)))

    def named_modules(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.named_modules(*args, **kwargs)

    def named_children(self) -> Any:
        return self._orig_mod.named_children()

    def _named_members(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod._named_members(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, **kwargs: Any) -> Any:
        """The original's keys; a checkpoint saved from PyTorch's OptimizedModule (every key
        prefixed ``_orig_mod.``) loads too."""
        prefix = "_orig_mod."
        if state_dict and all(k.startswith(prefix) for k in state_dict):
            state_dict = type(state_dict)((k[len(prefix) :], v) for k, v in state_dict.items())
        return self._orig_mod.load_state_dict(state_dict, strict=strict, **kwargs)

    def train(self, mode: bool = True) -> OptimizedModule:
        self._orig_mod.train(mode)
        return self

    def _apply(self, fn: Callable[[Tensor], Tensor]) -> OptimizedModule:
        self._orig_mod._apply(fn)
        return self

    def apply(self, fn: Callable[[Module], None]) -> OptimizedModule:
        self._orig_mod.apply(fn)
        return self

    def requires_grad_(self, requires_grad: bool = True) -> OptimizedModule:
        self._orig_mod.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._orig_mod.zero_grad(set_to_none)

    def __repr__(self) -> str:
        inner = repr(self._orig_mod).replace("\n", "\n  ")
        return f"OptimizedModule(\n  (_orig_mod): {inner}\n)"

    # -- the compiled call ---------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mod = self._orig_mod
        policy = admission.call_policy()
        if policy != admission.COMPILE:
            return run_as_written(policy, mod, args, kwargs, self._region)
        entries = self.__dict__["_aot"]
        dynamics = self.__dict__["_dynamics"]
        guards = self.__dict__["_guards"]
        # (a function compiled as a module: the function's guard, as ``compile(fn)`` keys it)
        forward = mod.fn if isinstance(mod, FunctionModule) else mod.forward
        # the fast guards first (``guard``: one pass over stamps and identities), then the
        # full walk, which makes a fast guard for the entry it finds
        found = guards.find(forward, args, kwargs, entries, dynamics)
        if found is not None:
            fast, tensors = found
            out = self._replay(fast.entry, tensors, args, kwargs, fast.sizes)
            if out is not NotImplemented:
                emit(
                    events.STEP_REPLAYED,
                    what="module",
                    message="compiled module's forward replayed",
                )
                return out
        watch = Watch(forward, args, kwargs)
        entry = entries.get(watch.key)
        sizes = None
        dynamics = self.__dict__["_dynamics"]
        if type(entry) is AOTEntry and any(watch.key in d.merged_keys for d in dynamics):
            # a recording merged into one over sizes replays that one: one program to build
            for dyn in dynamics:
                if watch.key in dyn.merged_keys:
                    sizes = dyn.sizes(watch.args)
                    if sizes is not None:
                        entry = dyn.step
                        break
        if entry is None:
            unserved = ""  # why a recording over sizes whose key matches does not serve it
            for dyn in dynamics:
                sizes = dyn.sizes(watch.args) if masked(watch.key, dyn.dims) == dyn.key else None
                if sizes is not None:
                    entry = dyn.step
                    break
                if masked(watch.key, dyn.dims) == dyn.key and not unserved:
                    unserved = dyn.why_not(watch.args)
            if entry is None and unserved and events.wanted(events.RECORDING):
                emit(
                    events.RECORDING,
                    f"{self._name()}: the recording over symbolic sizes does not serve this "
                    f"call: {unserved}",
                )
        if type(entry) is AOTEntry and found is None:
            guards.keep(watch, args, kwargs, entry, entries, dynamics, sizes)
        if type(entry) is AOTEntry:
            out = self._replay(entry, watch.args, args, kwargs, sizes)
            if out is not NotImplemented:
                emit(
                    events.STEP_REPLAYED,
                    what="module",
                    message="compiled module's forward replayed",
                )
                return out
        if entry is None and entries.refusal() is None:
            entries.count()
            return self._recorded_call(watch, args, kwargs)
        first_seq = next(_graph_base._sequence)
        with self._region():
            tape = _tape.state.tape
            out = mod(*args, **kwargs)
        return self._hand_out(None, watch, out, first_seq, tape, args, kwargs)

    def _recorded_call(
        self, watch: Watch, args: tuple, kwargs: dict, explaining: bool = False
    ) -> Any:
        """A call run eagerly while it is recorded; the recording (or why it cannot be
        replayed) is filed under ``watch.key``."""
        first_seq = next(_graph_base._sequence)
        region = Region(self._fullgraph, self._compile_mode)
        rec, out, tape = record(self._orig_mod, watch, region, args, kwargs, explaining)
        return self._hand_out(rec, watch, out, first_seq, tape, args, kwargs)

    def _hand_out(
        self,
        rec: Recorder | None,
        watch: Watch,
        out: Any,
        first_seq: int,
        tape: Any,
        args: tuple,
        kwargs: dict,
    ) -> Any:
        """The call's outputs, with the compiled backward node(s) where they can be exact (the
        recording ``rec`` filed, if any)."""
        mod = self._orig_mod
        entries = self.__dict__["_aot"]
        roots = _roots(out, first_seq)
        if not roots:  # (no grad mode, or nothing requires grad): the forward alone
            if rec is not None:
                self._remember(entries, watch, rec, out, [], [])
            return out
        inputs = _inputs_of(mod, args, kwargs, roots, first_seq)
        levels = _two_levels(roots, first_seq)
        reason = (
            _outside_reason(roots, inputs, first_seq, tape)
            or _hooked_output_reason(roots)
            or (levels if isinstance(levels, str) else None)
            or _reentrant_reason(roots, first_seq)
        )
        if reason is not None:
            if rec is not None:
                entries.remember(watch.key, reason)
            self._note_eager_backward(reason)
            return out
        assert not isinstance(levels, str)
        if rec is not None:
            self._remember(entries, watch, rec, out, roots, inputs, levels)
        outer, inner = levels
        places: dict = {}
        full, mode = self._fullgraph, self._compile_mode
        inner_node = None
        if outer:  # (outputs computed from other outputs: two nodes, as eager's graph)
            inner_roots = [roots[k] for k in inner]
            inner_node = CompiledModuleBackward(inner_roots, inputs, full, mode)
            places.update((k, (inner_node, nr)) for nr, k in enumerate(inner))
        mine = outer or inner
        node = CompiledModuleBackward(
            [roots[k] for k in mine],
            inputs,
            full,
            mode,
            inner_node,
            [roots[k] for k in inner] if outer else [],
        )
        places.update((k, (node, nr)) for nr, k in enumerate(mine))
        return _alias_outputs(out, roots, places)

    def _region(self) -> Any:
        return compiled_autograd(self._fullgraph, self._compile_mode)

    def _merge_sizes(self, entries: Recordings, watch: Watch, entry: AOTEntry) -> None:
        """After a recording: merged with an earlier one whose key differs only in the
        arguments' sizes, when both programs are one over sizes (``dynamic``); the outcome
        goes to the ``recompiles`` log."""
        dynamics = self.__dict__["_dynamics"]
        if not config.dynamic_sizes or len(dynamics) >= 4:
            return
        dyn, failed = merge_with_earlier(
            entries.items(), watch.key, entry, watch.args, merge_entries
        )
        if dyn is None:
            if failed:
                emit(
                    events.RECORDING,
                    f"{self._name()}: sizes stay concrete ({why_concrete(failed)})",
                )
            return
        dynamics.append(dyn)
        emit(events.RECORDING, f"{self._name()}: sizes became symbolic ({dyn.describe()})")

    def _aot_why(self, key: tuple) -> str:
        """In words, why a call with guard key ``key`` is recorded (``explain``)."""
        entries = self.__dict__["_aot"]
        if key in entries:
            return "these guards were recorded before; recorded again (explain replaces it)"
        last = entries.last_key()
        return "first call of this module" if last is None else describe_change(last, key)

    def _name(self) -> str:
        return f"compile({type(self._orig_mod).__name__})"

    def _remember(
        self,
        entries: Recordings,
        watch: Watch,
        rec: Recorder,
        out: Any,
        roots: list,
        inputs: list,
        levels: tuple = ([], []),
    ) -> None:
        """File the recording of this call (or why it cannot be replayed)."""
        started = _trace.clock() if _trace.enabled else 0.0
        detail = {"what": "module", "owner": self, "watch": watch, "started": started, "why": ""}
        try:
            if rec.backwards:
                raise StepBreak("the forward calls backward()")
            entry = AOTEntry(rec, out, roots, inputs, watch, self._compile_mode, levels)
        except StepBreak as e:
            entries.remember(watch.key, str(e))
            if _trace.enabled:
                detail["why"] = why_recorded(self._name(), entries, watch.key)
            emit(events.STEP_BREAK, str(e), name=type(self._orig_mod).__name__, **detail)
            return
        entries.remember(watch.key, entry)
        self._merge_sizes(entries, watch, entry)
        if _trace.enabled:
            detail["why"] = why_recorded(self._name(), entries, watch.key)
        emit(events.STEP_RECORDED, entry=entry, **detail)

    def _replay(
        self,
        entry: AOTEntry,
        tensors: list,
        args: tuple,
        kwargs: dict,
        sizes: tuple | None = None,
    ) -> Any:
        """A call replayed on its tensor arguments ``tensors``: the forward program, then one
        ``AOTBackward`` node for its outputs that require grad (``sizes``: the call's size
        vector, for an entry over symbols)."""
        inputs = [tensors[ref] if kind == "arg" else ref for kind, ref in entry.input_sources]
        # a differentiable backward re-runs the forward eagerly: with the random state the
        # replay drew its numbers from (the default generator's), so it draws them again
        rng = _random.get_rng_state() if entry.has_draws else None

        def finish(outputs: list, arrays: list) -> None:
            if not entry.root_slots:
                return
            saved = [
                arrays[k] if kind == "input" else outputs[entry.n_outputs + k]._data
                for kind, k in entry.saved_plan
            ]
            checks = []
            for kind, k in entry.version_checks:
                if kind == "input":
                    source, ref = entry.step.sources[k]
                    if source in ("draw", "scalar", "cast", "grad"):
                        continue
                    t = tensors[ref] if source == "arg" else ref
                    checks.append((t, t._version_counter.value, "an input of the module"))
                else:
                    t = outputs[k]
                    checks.append((t, t._version_counter.value, f"output {k} of the module"))
            redo = self._redo(args, kwargs, rng)
            state = [saved]
            outer, inner = entry.levels
            nodes = {}
            inner_node = None
            if outer:  # (outputs computed from other outputs: two nodes, as eager's graph)
                inner_node = AOTBackward(entry, inputs, state, checks, redo, inner, sizes=sizes)
                nodes.update((k, (inner_node, nr)) for nr, k in enumerate(inner))
            inner_meta = [
                (outputs[entry.root_slots[k]]._data.shape, outputs[entry.root_slots[k]]._dtype)
                for k in (inner if outer else [])
            ]
            node = AOTBackward(
                entry, inputs, state, checks, redo, outer or inner, inner_node, inner_meta, sizes
            )
            nodes.update((k, (node, nr)) for nr, k in enumerate(outer or inner))
            for pos, slot in enumerate(entry.root_slots):
                t = outputs[slot]
                t.grad_fn, t._output_nr = nodes[pos]

        return entry.step.run(tensors, self._compile_mode, finish, sizes)

    def _redo(self, args: tuple, kwargs: dict, rng: dict | None) -> Callable:
        """A differentiable backward for ``create_graph=True``: the forward again, eagerly, on
        the same inputs and, when it draws random numbers, from the random state the replay
        started from (``rng``), then ``autograd.grad`` through it."""
        mod = self._orig_mod

        def redo(grads: tuple, mask: list | None, cut: list | None = None) -> list:
            if rng is not None:
                now = _random.get_rng_state()
                _random.set_rng_state(rng)
            try:
                first_seq = next(_graph_base._sequence)
                with grad_mode.enable_grad():
                    out = mod(*args, **kwargs)
            finally:
                if rng is not None:
                    _random.set_rng_state(now)
            roots = _roots(out, first_seq)
            inputs = _inputs_of(mod, args, kwargs, roots, first_seq)
            if mask is not None:
                inputs = [t for t, m in zip(inputs, mask) if m]
            pairs = [(r, g) for r, g in zip(roots, grads) if g is not None]
            if cut is not None:  # (``AOTBackward``: the outer outputs' backward, stopped)
                inner = [roots[k] for k in cut]
                # which outputs a later backward would start from to reach a node this one
                # runs that saved something: a backward without retain_graph frees those
                # (``AOTBackward._ran_cut``)
                redo.cut_freed = _freed_by_cut(  # type: ignore[attr-defined]
                    roots, [r for r, _ in pairs], [*inputs, *inner], inner
                )
                found = _engine.run_backward(
                    [r for r, _ in pairs],
                    [g for _, g in pairs],
                    True,
                    grad_mode.is_grad_enabled(),
                    inputs=[*inputs, *inner],
                    accumulate=False,
                    cut=inner,
                )
                assert found is not None
                own = found[: len(inputs)]
                if mask is not None:
                    it = iter(own)
                    own = [next(it) if m else None for m in mask]
                return [*own, *found[len(inputs) :]]
            result = _grad(
                [r for r, _ in pairs],
                inputs,
                [g for _, g in pairs],
                retain_graph=True,
                create_graph=grad_mode.is_grad_enabled(),
                allow_unused=True,
            )
            if mask is None:
                return list(result)
            it = iter(result)
            return [next(it) if m else None for m in mask]

        return redo

    def _note_eager_backward(self, reason: str) -> None:
        if self._fullgraph:
            raise CompilationError(f"{self._name()}: {reason}")
        if reason not in self._reasons_logged:  # (once per reason)
            self._reasons_logged.add(reason)
            emit(events.EAGER_BACKWARD, reason, name=type(self._orig_mod).__name__)


def _alias_outputs(out: Any, roots: list, places: dict) -> Any:
    """``out`` with each output in ``roots`` replaced by an alias whose ``grad_fn`` and output
    number are ``places[k]`` for the k-th root (one alias per output, however often it is
    returned): same data, same version counter."""
    index = {id(r): k for k, r in enumerate(roots)}
    made: dict[int, Tensor] = {}

    def alias(t: Tensor) -> Tensor:
        k = index.get(id(t))
        if k is None:
            return t
        a = made.get(k)
        if a is None:
            a = made[k] = Tensor._make(t._data)
            a._version_counter = t._version_counter
            a.grad_fn, a._output_nr = places[k]
        return a

    return _map_tensors(out, alias)
