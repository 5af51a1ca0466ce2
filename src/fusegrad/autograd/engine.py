"""The backward engine: ``run_backward`` executes the node graph for ``backward()`` and ``grad()``.

One iterative loop (no recursion over graph depth):

1. discover the nodes reachable from the roots and count, per node, the edges pointing at it
   (``x * x`` gives x's accumulator two); with ``inputs`` given, keep only nodes on a path to one
   of them (walking parent links back from the targets);
2. seed the roots' gradients, then repeatedly run the ready node (every incoming gradient has
   arrived and been summed) created latest in the forward pass; AccumulateGrad nodes carry an
   infinite sequence number, so they run as soon as they are ready (as in PyTorch);
3. per node: tensor hooks, retain_grad, capture for ``grad()`` / ``backward(inputs=...)``, node
   pre-hooks, the rule (under no_grad unless ``create_graph``) or, for a leaf, the ``.grad``
   write, post-accumulate-grad hooks, node post-hooks;
4. per outgoing edge: undo broadcasting with ``sum_to`` (the engine owns this, docs/ARCHITECTURE.md,
   contract 2), cast to the input's dtype, and sum fan-in into the next node's buffer.  A node
   of one output (nearly all) buffers its gradient as it is, not in a list; an OpNode that this
   edge makes ready runs next without a trip through the heap, its gradient handed over
   directly, unless a ready node created after it is waiting (the heap's order exactly: an
   OpNode's sequence number is its own, so no ties need breaking).

Reentrant calls (``backward()``/``grad()`` inside a node's backward, e.g. a custom Function or
reentrant checkpointing) nest Python frames; past ``MAX_REENTRANT_DEPTH`` nested calls on one
thread, the nested call runs on a fresh thread (with this thread's grad-mode and anomaly state)
while the caller waits, so nesting thousands deep never hits the recursion limit (PyTorch does
the same with its reentrant thread pool).

Each call is a *graph task*: a thread-local record of the running task gives
``current_graph_task_id()`` (non-reentrant checkpointing keys recomputation on it) and
``is_checkpoint_valid()`` (reentrant checkpointing cannot work under ``grad()`` or
``backward(inputs=...)``, in this task or an enclosing one).

Under anomaly mode the engine marks the node it is running, so that nodes created by its rule
(double backward) record it as their parent, checks every node's outputs for NaN, and for any
error raised while processing a node (hooks, rule, gradient validation, NaN) warns
``Error detected in <Node>`` with the forward tracebacks (``anomaly.py``), then re-raises the
original error, as PyTorch does.

What happens at each node goes through the call's *executor* (``Executor``; the default runs
everything eagerly): running a node's rule, writing ``.grad`` and calling user hooks, with
``begin_capture``/``end_capture`` around the call.  The compiler's capture is an executor that
records these steps as IR instead of performing them; the engine loop, its ordering, its
broadcasting and fan-in are the same for both (docs/ARCHITECTURE.md, contracts 2 and 10).

Saved tensors are released after each node unless ``retain_graph``.  Gradients are never
mutated in place here except an existing ``.grad`` (which the engine or the user owns), so root
gradients and tensors returned by rules or hooks can be shared freely; None stays None.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .. import storage as _storage
from ..errors import AutogradError
from ..ops.primitives import as_caller, quiet_again, quiet_errors, restore_errors
from ..ops.shape import sum_to
from ..tensor import Tensor, _ViewTensor
from . import anomaly, grad_mode, tracer
from .forward_state import state as _forward_state
from .node import AccumulateGrad, Node, OpNode

_make = Tensor._make
# eager tensors, views included (views are ``_ViewTensor``, a Tensor subclass with a lazy
# grad_fn); other subclasses (the compiler's symbolic values) take the op-surface paths
_EAGER = (Tensor, _ViewTensor)
_ONE_OUTPUT = (OpNode, AccumulateGrad)  # node types whose ``num_outputs`` is 1


def _sum_to_compatible(gshape: tuple, shape: tuple) -> bool:
    if len(gshape) < len(shape):
        return False
    lead = len(gshape) - len(shape)
    return all(s == gs or s == 1 for s, gs in zip(shape, gshape[lead:]))


def validate_gradient(node: Node, index: int, g: Any, shape: tuple, dtype: Any) -> Tensor:
    """Bring a rule's gradient for input ``index`` to that input's shape and dtype: a gradient
    that can be summed to the input's shape is (broadcasting undone); anything else is an
    error naming the node and the index."""
    if not isinstance(g, Tensor):
        raise AutogradError(
            f"Function {node.name()} returned an invalid gradient at index {index} - expected a "
            f"Tensor or None, got {type(g).__name__}"
        )
    if g._data.shape != shape:
        if not _sum_to_compatible(g._data.shape, shape):
            raise AutogradError(
                f"Function {node.name()} returned an invalid gradient at index {index} - got "
                f"{list(g._data.shape)} but expected shape compatible with {list(shape)}"
            )
        g = sum_to(g, shape)
    if g._dtype is not dtype:
        if g._dtype.category == 3 and dtype.category != 3:
            g = g.real  # a real input of complex values: the real part (docs/complex.md)
        g = g.to(dtype)
    return g


def tensor_hooks(node: Node, nr: int) -> list:
    """The tensor hooks registered now on output ``nr`` of ``node`` (a leaf's for its
    AccumulateGrad), in registration order."""
    if isinstance(node, AccumulateGrad):
        hooks = node.variable._hooks
        return list(hooks.values()) if hooks else []
    if node._tensor_pre_hooks and nr in node._tensor_pre_hooks:
        return list(node._tensor_pre_hooks[nr].values())
    return []


def _hook_name(hook: Any) -> str:
    return getattr(hook, "__name__", type(hook).__name__)


def check_hook_result(hook: Any, old: Tensor, new: Any) -> Tensor:
    """A tensor hook may replace the gradient, but not change its type, size or dtype."""
    if not isinstance(new, Tensor):
        raise TypeError(
            f"hook '{_hook_name(hook)}' returned {type(new).__name__}; expected a Tensor or None"
        )
    if new._data.shape != old._data.shape:
        raise AutogradError(
            f"hook '{_hook_name(hook)}' has changed the size of value: got "
            f"{list(new._data.shape)}, expected {list(old._data.shape)}"
        )
    if new._dtype is not old._dtype:
        raise AutogradError(
            f"hook '{_hook_name(hook)}' has changed the type of value: got {new._dtype.name}, "
            f"expected {old._dtype.name}"
        )
    return new


# gradients a compiled module's backward program computed into arrays of their own and hands
# out once (``give``): nothing else holds them, so a leaf whose ``.grad`` is unset takes such a
# tensor itself rather than a copy (PyTorch steals a gradient no one else references); id ->
# weak reference, dropped when the tensor dies
_given: dict[int, Any] = {}


def give(g: Tensor) -> None:
    """Let the engine make ``g`` a leaf's first ``.grad`` without copying it (``_run_node``):
    only for a tensor that no one else holds or will read (a program's fresh output)."""
    key = id(g)
    _given[key] = weakref.ref(g, lambda _, key=key: _given.pop(key, None))


def _taken(g: Tensor) -> bool:
    """Whether ``g`` was given (``give``); a given tensor is taken once."""
    ref = _given.pop(id(g), None)
    return ref is not None and ref() is g


def accumulate_grad(t: Tensor, g: Tensor, create_graph: bool) -> None:
    """``.grad`` accumulation (leaves, retain_grad, ``backward(inputs=...)``).

    The first gradient is stored as a fresh copy: ``g`` may be the user's root gradient, the
    same tensor a rule handed to several inputs (``add``) or another tensor's ``.grad``, and
    a later in-place accumulation must not reach any of them.  Under ``create_graph`` the copy
    is a differentiable ``clone`` and accumulation is ``.grad = .grad + g`` (a new tensor with
    history); otherwise later gradients are added in place into the same ``.grad`` object."""
    old = t._grad
    if old is None:
        if create_graph:
            t._grad = g.clone()
        else:
            t._grad = Tensor._make(_storage.copy(g._data, t._dtype.np))
    elif create_graph:
        t._grad = old + g
    elif old._data.flags.writeable:
        if type(old._data) is np.ndarray:
            np.add(old._data, g._data, out=old._data, casting="unsafe")
        else:  # a CUDA .grad: add on the device, write back in place (identity kept)
            _storage.copyto(old._data, (old + g)._data)
        old._version_counter.bump()
    else:  # a read-only (e.g. expanded) .grad the user assigned: replace it
        t._grad = Tensor._make(np.asarray(old._data + g._data))


def _discover(root_nodes: list[Node]) -> dict:
    """Dependency counts over every edge among the nodes reachable from the roots."""
    deps: dict = {node: 0 for node in root_nodes}
    stack = list(root_nodes)
    get, push = deps.get, stack.append
    while stack:
        for nxt, _ in stack.pop()._edges:
            if nxt is not None:
                count = get(nxt)
                if count is None:
                    deps[nxt] = 1
                    push(nxt)
                else:
                    deps[nxt] = count + 1
    return deps


def _reach(root_nodes: list, cut: frozenset) -> set:
    """The nodes reachable from the roots along edges not in ``cut``."""
    seen = set(root_nodes)
    stack = list(root_nodes)
    while stack:
        for edge in stack.pop()._edges:
            nxt = edge[0]
            if nxt is not None and nxt not in seen and edge not in cut:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _needed(reachable: dict, targets: set) -> set:
    """The reachable nodes from which some target can be reached (targets included)."""
    parents: dict = {}
    for node in reachable:
        for nxt, _ in node._edges:
            if nxt is not None:
                parents.setdefault(nxt, []).append(node)
    needed = {t for t in targets if t in reachable}
    stack = list(needed)
    while stack:
        for parent in parents.get(stack.pop(), ()):
            if parent not in needed:
                needed.add(parent)
                stack.append(parent)
    return needed


class Executor:
    """How one backward call's steps are performed; the engine decides their order.

    The default (``EAGER``) performs them: rules on tensors, ``.grad`` writes, user hooks.  An
    executor given to ``run_backward`` may perform them differently -- the compiler's capture
    records each as a step of an IR graph -- and receives every step of the call:

    * ``begin_capture(task)`` / ``end_capture(task)`` around the call (``end_capture`` also when
      it fails);
    * ``apply_node(node, grads, retain_graph)``: a node's rule, returning one gradient (or None)
      per edge; ``check_results`` validates the count;
    * ``input_meta(node)``: the shapes and dtypes of the node's forward inputs, which gradients
      that are not plain tensors are validated against (a capture's sizes may be symbols);
    * ``accumulate_grad(tensor, g, create_graph)``: a ``.grad`` write;
    * ``tensor_pre_hook``, ``pre_hook``, ``post_hook``, ``post_acc_grad_hook``: one user hook,
      with its site (``node``, output number, its position among that site's hooks); the value
      returned replaces gradients as in PyTorch.
    """

    def begin_capture(self, task: _Task) -> None:
        pass

    def end_capture(self, task: _Task) -> None:
        pass

    def apply_node(self, node: Node, grads: list, retain_graph: bool) -> tuple:
        return _apply(node, grads, retain_graph)

    def input_meta(self, node: Node) -> tuple:
        return node._input_meta

    def accumulate_grad(self, t: Tensor, g: Tensor, create_graph: bool) -> None:
        accumulate_grad(t, g, create_graph)

    def tensor_pre_hook(self, hook: Any, node: Node, output_nr: int, position: int, g: Any) -> Any:
        return hook(g)

    def pre_hook(self, hook: Any, node: Node, position: int, grads: tuple) -> Any:
        return hook(grads)

    def post_hook(
        self, hook: Any, node: Node, position: int, grads_in: tuple, grads_out: tuple
    ) -> Any:
        return hook(grads_in, grads_out)

    def post_acc_grad_hook(self, hook: Any, node: Node, position: int, tensor: Tensor) -> None:
        hook(tensor)


EAGER = Executor()


class _Task:
    """What one backward call (graph task) needs while it runs (passed to ``_run_node``)."""

    __slots__ = (
        "accumulate",
        "buffers",
        "callbacks",
        "capture",
        "captured",
        "checkpoint_valid",
        "create_graph",
        "cut",
        "deps",
        "executor",
        "id",
        "inputs",
        "needed",
        "reach",
        "retain_graph",
    )

    def __init__(
        self,
        retain_graph: bool,
        create_graph: bool,
        accumulate: bool,
        inputs: Sequence[Tensor] | None,
        needed: set | None,
        capture: dict,
        executor: Executor,
        deps: dict | None = None,
        cut: frozenset = frozenset(),
    ) -> None:
        self.executor = executor
        # the dependency counts of the nodes this task reaches (``_discover``), counted down
        # as gradients are delivered, and the gradients delivered to nodes not run yet
        self.deps = deps if deps is not None else {}
        self.buffers: dict = {}
        # captured edges whose gradient stops there: it does not flow on into the node
        self.cut = cut
        # with a cut: the nodes reached from the roots without crossing it (``_reach``); no
        # other node runs
        self.reach: set | None = None
        self.retain_graph = retain_graph
        self.create_graph = create_graph
        self.accumulate = accumulate
        self.inputs = inputs
        self.needed = needed
        self.capture = capture  # (node, nr) -> positions in ``inputs``
        self.captured: list = [None] * (len(inputs) if inputs is not None else 0)
        self.id = next(_task_ids)
        self.callbacks: list[Callable[[], None]] = []  # queue_callback, run when the task ends
        # reentrant checkpointing needs a plain backward() here and in every enclosing task
        parent = _current.task
        self.checkpoint_valid = inputs is None and (parent is None or parent.checkpoint_valid)


class _Current(threading.local):
    def __init__(self) -> None:
        self.task: _Task | None = None


_current = _Current()
_task_ids = itertools.count(1)


def current_graph_task_id() -> int:
    """Id of the backward call running on this thread (-1 outside backward)."""
    task = _current.task
    return -1 if task is None else task.id


def queue_callback(callback: Callable[[], None]) -> None:
    """Run ``callback()`` once the backward call running on this thread has finished its graph
    (PyTorch's ``Variable._execution_engine.queue_callback``).

    Meant for hooks that start work during backward and must finish it before ``backward()``
    returns: DistributedDataParallel launches a non-blocking allreduce per bucket from
    post-accumulate-grad hooks and queues the wait here.  Callbacks run in the order queued, on
    this thread, after every node of the call has run and before ``backward()``/``grad()``
    returns; one may queue more (they run too).  They do not run when the backward fails.
    Outside a backward call this raises."""
    task = _current.task
    if task is None:
        raise AutogradError(
            "queue_callback: no backward is running on this thread; call it from a hook or a "
            "custom Function's backward while backward() runs"
        )
    task.callbacks.append(callback)


@contextlib.contextmanager
def graph_task(
    retain_graph: bool, create_graph: bool, accumulate: bool, inputs: Sequence[Tensor] | None
) -> Iterator[None]:
    """A backward call that another executor runs (compiled autograd's programs): the hooks it
    calls see a running backward (``queue_callback``, ``current_graph_task_id``), and the
    callbacks they queue run, in order, when it finishes without an error, as in ``_execute``."""
    task = _Task(retain_graph, create_graph, accumulate, inputs, None, {}, EAGER)
    parent, _current.task = _current.task, task
    try:
        yield
        callbacks = task.callbacks
        while callbacks:  # (one may queue more)
            callbacks.pop(0)()
    finally:
        _current.task = parent


def is_checkpoint_valid() -> bool:
    """False inside a backward started by ``grad()`` or ``backward(inputs=...)`` (or nested in
    one): reentrant checkpointing cannot run there (PyTorch's ``_is_checkpoint_valid``)."""
    task = _current.task
    return True if task is None else task.checkpoint_valid


MAX_REENTRANT_DEPTH = 16
"""Nested engine calls per thread before the next one hops to a fresh thread (each level costs
roughly ten Python frames plus the user's backward code)."""

_depth = threading.local()


def _grad_mode_state() -> tuple:
    return grad_mode._state.enabled, grad_mode._state.inference


def _set_grad_mode_state(state: tuple) -> None:
    grad_mode._state.enabled, grad_mode._state.inference = state


def _set_anomaly_state(state: tuple) -> None:
    anomaly._state.enabled, anomaly._state.check_nan, anomaly._state.current_node = state


def _anomaly_state() -> tuple:
    return anomaly._state.enabled, anomaly._state.check_nan, anomaly._state.current_node


def _task_state() -> _Task | None:
    return _current.task


def _set_task_state(task: _Task | None) -> None:
    _current.task = task


# (capture, restore) pairs: thread-local state a reentrant call carries to its fresh thread
# (and that the thread puts back to its own when the call ends).  Modules with their own
# thread-local autograd state (saved-tensor hooks in graph.py) append to it.
THREAD_STATE: list[tuple[Callable[[], Any], Callable[[Any], None]]] = [
    (_grad_mode_state, _set_grad_mode_state),
    (_anomaly_state, _set_anomaly_state),
    (_task_state, _set_task_state),
    (tracer._thread_state, tracer._set_thread_state),
]


def run_backward(
    roots: Sequence[Tensor],
    grad_roots: Sequence[Tensor],
    retain_graph: bool,
    create_graph: bool,
    inputs: Sequence[Tensor] | None = None,
    accumulate: bool = True,
    executor: Executor = EAGER,
    cut: Sequence[Tensor] = (),
) -> list | None:
    """Execute the graph.  Returns captured gradients for ``inputs`` when not accumulating.
    ``executor`` performs the steps (``Executor``; by default eagerly).  ``cut``: inputs whose
    gradient is captured and flows no further (the graph above them is left alone: what a
    compiled module's output computed from another output sends into it, ``compiler.module``)."""
    cut_edges = frozenset(t._edge() for t in cut)
    args = (roots, grad_roots, retain_graph, create_graph, inputs, accumulate, executor, cut_edges)
    return nested(_execute, *args)


def nested(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` as one level of reentrant backward: past ``MAX_REENTRANT_DEPTH`` levels on
    this thread it runs on a fresh thread (new Python stack) with this thread's autograd state,
    which waits for it and re-raises its error.  (Compiled autograd runs a custom Function's
    backward through it too: that backward may call ``backward()`` again.)"""
    depth = getattr(_depth, "value", 0)
    if depth >= MAX_REENTRANT_DEPTH:
        return _run_on_fresh_thread(fn, args)
    _depth.value = depth + 1
    try:
        return fn(*args)
    finally:
        _depth.value = depth


def _run_on_fresh_thread(fn: Callable[..., Any], args: tuple) -> Any:
    """Run a deeply nested call on a new thread (new Python stack); wait; re-raise."""
    states = [(capture(), restore) for capture, restore in THREAD_STATE]
    outcome: dict = {}

    def work() -> None:
        own = [(capture(), restore) for capture, restore in THREAD_STATE]
        for state, restore in states:
            restore(state)
        try:
            outcome["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001  (re-raised on the calling thread)
            outcome["error"] = e
        finally:
            for state, restore in own:
                restore(state)

    worker = threading.Thread(target=work, name="fusegrad-reentrant-backward")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


# rules with an array form run by it on the engine's common path (``OpNode.run_arrays``); the
# tests switch it off to compare the two forms bit for bit
array_rules = True


def _execute(
    roots: Sequence[Tensor],
    grad_roots: Sequence[Tensor],
    retain_graph: bool,
    create_graph: bool,
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
    executor: Executor,
    cut: frozenset = frozenset(),
) -> list | None:
    """The engine loop proper (see the module docstring)."""
    root_edges = [r._edge() for r in roots]
    root_nodes = list(dict.fromkeys(node for node, _ in root_edges if node is not None))
    deps = _discover(root_nodes)

    capture: dict = {}
    needed = None
    if inputs is not None:
        for i, t in enumerate(inputs):
            capture.setdefault(t._edge(), []).append(i)
        needed = _needed(deps, {node for node, _ in capture if node is not None})
    task = _Task(
        retain_graph, create_graph, accumulate, inputs, needed, capture, executor, deps, cut
    )
    if cut:
        task.reach = _reach(root_nodes, cut)

    # node -> the summed incoming gradients: for a node of one output (``_ONE_OUTPUT``: nearly
    # all) the gradient itself, otherwise a list of one per output (None where none came)
    buffers: dict = task.buffers
    for (node, nr), g in zip(root_edges, grad_roots):
        if node is not None:
            if type(node) in _ONE_OUTPUT:
                prev = buffers.get(node)
                buffers[node] = g if prev is None else prev + g
            else:
                buf = buffers.setdefault(node, [None] * node.num_outputs)
                buf[nr] = g if buf[nr] is None else buf[nr] + g

    tie = itertools.count()  # FIFO among equal sequence numbers (AccumulateGrad)
    ready: list = []
    for node in root_nodes:
        if deps[node] == 0 and (needed is None or node in needed):
            heapq.heappush(ready, (-node._seq, next(tie), node))

    prev_mode = grad_mode._state.enabled
    grad_mode._state.enabled = create_graph
    parent_task, _current.task = _current.task, task
    anomaly_state = anomaly._state
    anomaly_threads = anomaly.anomaly_threads  # (empty: anomaly mode is off on every thread)
    parent_node = anomaly_state.current_node
    node = None
    # the common node -- a primitive's, without hooks, run by the eager executor, outside
    # grad()/backward(inputs=...) -- is run here, as ``_run_node`` would run it (its first
    # branch), without its frames; ``task.capture`` is fixed for the call
    plain_nodes = executor is EAGER and not task.capture
    # their rules by their array forms where they have one (``OpNode.run_arrays``): no tensor
    # a rule makes can be observed -- no graph is built, no tracer sees the ops, no tangents
    by_arrays = (
        array_rules
        and plain_nodes
        and not create_graph
        and _forward_state.level is None
        and tracer.current() is None
    )
    pop, push = heapq.heappop, heapq.heappush
    # An OpNode that a node makes ready runs next without a trip through the heap when no ready
    # node was created after it (the heap's order exactly: an OpNode's sequence number is its
    # own, so there are no ties to break); any other node made ready goes on the heap
    direct = direct_g = None
    # The rules of plain nodes and the fan-in sums run fusegrad's kernels only, which ignore
    # numpy's floating-point errors: switched once here, so that each kernel finds the quiet
    # state set and skips its own switch.  Everything that may run user code (hooks, custom
    # Functions, ``.grad`` writes and their hooks, callbacks) sees the caller's state again.
    quiet = quiet_errors() if plain_nodes else None
    executor.begin_capture(task)
    try:
        while True:
            if direct is not None:
                node = direct
                direct = None
                if not ready or ready[0][0] > -node._seq:
                    g0, direct_g = direct_g, None
                else:
                    # a ready node created later runs first: this one waits on the heap
                    if direct_g is not None:
                        buffers[node] = direct_g
                        direct_g = None
                    push(ready, (-node._seq, next(tie), node))
                    node = pop(ready)[2]
                    g0 = buffers.pop(node, None) if type(node) in _ONE_OUTPUT else None
            elif ready:
                node = pop(ready)[2]
                g0 = buffers.pop(node, None) if type(node) in _ONE_OUTPUT else None
            else:
                break
            if type(node) in _ONE_OUTPUT:
                if type(g0) is np.ndarray:
                    # a fan-in sum is kept as the bare array the loop adds into (below)
                    g0 = _make(g0)
                if (
                    plain_nodes
                    and type(node) is OpNode
                    and g0 is not None
                    and node._tensor_pre_hooks is None
                    and node._retain_grad_hooks is None
                    and node._pre_hooks is None
                    and node._post_hooks is None
                    and not (anomaly_threads and anomaly_state.enabled)
                ):
                    results = (
                        node.run_arrays(g0, retain_graph)
                        if by_arrays and node._rule.arrays is not None
                        else None
                    )
                    if results is None:
                        results = node.run_rule(g0, retain_graph)
                    if type(results) is not tuple or len(results) != len(node._edges):
                        results = check_results(node, results)
                    grads = None
                else:
                    grads = [g0]
            else:
                grads = buffers.pop(node, None)
                if grads is None:
                    grads = [None] * node.num_outputs
                else:
                    grads = [_make(g) if type(g) is np.ndarray else g for g in grads]
            if grads is not None:
                if anomaly_threads and anomaly_state.enabled:
                    # nodes created by this rule (create_graph) record it as their parent
                    anomaly_state.current_node = node
                    results = _run_node_as_caller(node, grads, task, quiet)
                    _check_nan(node, results)
                else:
                    results = _run_node_as_caller(node, grads, task, quiet)
            for i, (nxt, nr) in enumerate(node._edges):
                if nxt is None or (needed is not None and nxt not in needed):
                    continue
                g = results[i] if results is not None else None
                if g is not None:
                    if type(g) not in _EAGER:
                        shape, dtype = executor.input_meta(node)[i]
                        g = validate_gradient(node, i, g, shape, dtype)
                    else:
                        shape, dtype = node._input_meta[i]
                        if g._data.shape != shape or g._dtype is not dtype:
                            g = validate_gradient(node, i, g, shape, dtype)
                left = deps[nxt] - 1
                deps[nxt] = left
                if type(nxt) in _ONE_OUTPUT:
                    if left == 0 and direct is None and type(nxt) is OpNode:
                        # it runs next (above): its gradient goes to it, not through ``buffers``
                        prev = buffers.pop(nxt, None)
                        if prev is not None:
                            g = prev if g is None else _fan_in(prev, g, create_graph)
                        direct_g = g
                        direct = nxt
                        continue
                    if g is not None:
                        prev = buffers.get(nxt)
                        buffers[nxt] = g if prev is None else _fan_in(prev, g, create_graph)
                elif g is not None:
                    buf = buffers.get(nxt)
                    if buf is None:
                        buf = buffers[nxt] = [None] * nxt.num_outputs
                    prev = buf[nr]
                    buf[nr] = g if prev is None else _fan_in(prev, g, create_graph)
                if left == 0:
                    push(ready, (-nxt._seq, next(tie), nxt))
        node = None  # a callback's failure is not the last node's (anomaly mode)
        restore_errors(quiet)
        quiet = None
        callbacks = task.callbacks
        while callbacks:  # queue_callback: in order; a callback may queue more
            callbacks.pop(0)()
    except Exception:
        restore_errors(quiet)
        quiet = None
        if node is not None and anomaly_state.enabled:
            anomaly.warn_error_detected_in(node)  # PyTorch's warning; the error goes on as it is
        raise
    finally:
        restore_errors(quiet)  # (a BaseException: KeyboardInterrupt, ...)
        grad_mode._state.enabled = prev_mode
        _current.task = parent_task
        anomaly_state.current_node = parent_node
        executor.end_capture(task)
    return None if accumulate else task.captured


def _fan_in(prev: Any, g: Tensor, create_graph: bool) -> Any:
    """The sum of a node's buffered gradient ``prev`` and one more, ``g``, for one of its outputs
    (both already of the input's shape and dtype).

    Plain tensors outside create_graph add their arrays directly: the first sum is a new array
    that only the buffer holds, so later gradients add into it in place, and it stays a bare
    array until its node runs (``_execute`` wraps it then).  Symbolic values (the compiler's
    capture) are subclasses and take the op-surface add, as do dual tensors (forward AD: their
    tangents add too) and everything under create_graph (the sum is differentiable)."""
    if (
        not create_graph
        and type(g) in _EAGER
        and type(g._data) is np.ndarray
        and _forward_state.level is None
    ):
        if type(prev) is np.ndarray:
            np.add(prev, g._data, out=prev)
            return prev
        if type(prev) in _EAGER and type(prev._data) is np.ndarray:
            # (np.asarray: numpy returns a scalar, not a 0-d array, for 0-d sums)
            return np.asarray(np.add(prev._data, g._data))
        return prev + g
    if type(prev) is np.ndarray:
        prev = _make(prev)
    return prev + g


def _check_nan(node: Node, results: tuple | None) -> None:
    """Anomaly mode: a node's outputs (after its post-hooks) must not contain NaN."""
    if not anomaly._state.check_nan or results is None:
        return
    for i, r in enumerate(results):
        if isinstance(r, Tensor) and r._dtype.category >= 2 and bool(r.isnan().any()):
            raise AutogradError(
                f"Function '{node.name()}' returned nan values in its {i}th output."
            )


def _run_node_as_caller(node: Node, grads: list, task: _Task, quiet: Any) -> tuple | None:
    """``_run_node`` with numpy's error state put back to the caller's while it runs (``quiet``:
    what ``quiet_errors`` returned, None when the engine did not switch); a state the node's
    user code sets is the caller's from then on."""
    if quiet is None:
        return _run_node(node, grads, task)
    as_caller(quiet)
    try:
        return _run_node(node, grads, task)
    finally:
        quiet_again(quiet)


def _run_node(node: Node, grads: list, task: _Task) -> tuple | None:
    """Hooks and the node itself, in PyTorch's order (docs/ARCHITECTURE.md, "Hooks"); the gradients
    for its edges."""
    executor = task.executor
    if (
        type(node) is OpNode
        and not task.capture
        and node._tensor_pre_hooks is None
        and node._retain_grad_hooks is None
        and node._pre_hooks is None
        and node._post_hooks is None
        and grads[0] is not None
    ):
        # the common case (a primitive's node without hooks): no bookkeeping beyond the rule
        if executor is EAGER:
            return _apply(node, grads, task.retain_graph)
        return executor.apply_node(node, grads, task.retain_graph)
    # 1. tensor hooks, in registration order (a returned tensor replaces the gradient)
    for nr, g in enumerate(grads):
        if g is not None:
            for k, hook in enumerate(tensor_hooks(node, nr)):
                out = executor.tensor_pre_hook(hook, node, nr, k, grads[nr])
                if out is not None:
                    grads[nr] = check_hook_result(hook, grads[nr], out)
    # 2. retain_grad (only while the tensor's history still ends in this node)
    retained: set = set()
    if node._retain_grad_hooks:
        for nr, ref in list(node._retain_grad_hooks.items()):
            t = ref()
            if t is not None and grads[nr] is not None and t.grad_fn is node:
                executor.accumulate_grad(t, grads[nr], task.create_graph)
                retained.add(nr)
    # capture for grad() / backward(inputs=...)
    # a cut leaves the graph below it alone: a node there that gets no gradient is not freed
    keep = task.retain_graph or bool(task.cut) and all(g is None for g in grads)
    if task.capture:
        for nr, g in enumerate(grads):
            positions = task.capture.get((node, nr))
            if positions is None:
                continue
            if not task.accumulate:
                for p in positions:
                    task.captured[p] = g
                if (node, nr) in task.cut:
                    grads[nr] = None  # (stops here)
                    keep = True
            elif g is not None and not isinstance(node, AccumulateGrad) and nr not in retained:
                # a non-leaf listed in backward(inputs=...) accumulates into its .grad
                executor.accumulate_grad(
                    task.inputs[positions[0]],  # type: ignore[index]
                    g,
                    task.create_graph,
                )
    # below a cut only (a cut node itself, once its gradient is captured): nothing flows
    # there, and nothing runs -- not even a node that runs without gradients (a custom
    # Function's, whose zeros would flow on and free the nodes they reach)
    if task.reach is not None and node not in task.reach:
        return None
    # a target whose own inputs lead to no other target: its gradient is all that is needed
    is_leaf_write = isinstance(node, AccumulateGrad) and task.accumulate
    if (
        task.needed is not None
        and not is_leaf_write
        and not any(e[0] is not None and e[0] in task.needed for e in node._edges)
    ):
        return None
    # 3. node pre-hooks
    if node._pre_hooks:
        for k, hook in enumerate(list(node._pre_hooks.values())):
            out = executor.pre_hook(hook, node, k, tuple(grads))
            if out is not None:
                grads = hook_tuple(hook, out, len(grads))
    # 4. the node itself; 5. post-accumulate-grad hooks (leaves)
    if isinstance(node, AccumulateGrad):
        results: tuple = ()
        if grads[0] is not None:
            var = node.variable
            g = grads[0]
            if (
                _given
                and var._grad is None
                and executor is EAGER
                and not task.create_graph
                and not var._hooks
                and not node._pre_hooks
                and _taken(g)
                and type(g) is Tensor
                and g._dtype is var._dtype
                and type(g._data) is np.ndarray
                and g._data.flags.writeable
            ):
                var._grad = g  # (given: a program's fresh array, held by nothing else)
            else:
                executor.accumulate_grad(var, g, task.create_graph)
            if var._post_acc_hooks:
                for k, hook in enumerate(list(var._post_acc_hooks.values())):
                    executor.post_acc_grad_hook(hook, node, k, var)
    elif not node._runs_without_grads and all(g is None for g in grads):
        results = (None,) * len(node._edges)
        if not keep and hasattr(node, "release"):
            node.release()
    else:
        results = executor.apply_node(node, grads, keep)
    # 6. node post-hooks (may replace the gradients for the inputs)
    if node._post_hooks:
        for k, hook in enumerate(list(node._post_hooks.values())):
            out = executor.post_hook(hook, node, k, results, tuple(grads))
            if out is not None:
                results = hook_tuple(hook, out, len(results))
    return results


def hook_tuple(hook: Any, out: Any, expected: int) -> list | tuple:
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if len(out) != expected:
        raise AutogradError(
            f"hook '{_hook_name(hook)}' has returned an incorrect number of values (got "
            f"{len(out)}, but expected {expected})"
        )
    return list(out)


def _apply(node: Node, grads: list, retain_graph: bool) -> tuple:
    """Run a node's rule; check the number of gradients."""
    return check_results(node, node.apply(tuple(grads), retain_graph))


def check_results(node: Node, results: Any) -> tuple:
    """A rule's results as a tuple of one entry per edge (PyTorch's error otherwise)."""
    if not isinstance(results, tuple):
        results = tuple(results) if isinstance(results, list) else (results,)
    if len(results) != len(node._edges):
        raise AutogradError(
            f"Function {node.name()} returned an incorrect number of gradients (expected "
            f"{len(node._edges)}, got {len(results)})"
        )
    return results
