"""Nodes of the backward graph: OpNode (one per primitive call) and SavedTensor (a tensor a rule
needs, with its version checked on use); Node, AccumulateGrad (one per leaf) and hook handles
come from ``graph_base.py`` (below ``Tensor``, which needs them) and are re-exported here.

A node's ``next_functions`` are its edges ``(node or None, input_nr)``, one per forward input.
Each node records the shape and dtype of every forward input so that the engine can undo
broadcasting (sum-to-shape) and check what a rule returned without keeping the inputs alive.
The rule of an OpNode comes from the one derivative table (``autograd/derivatives.py``).

Saved-tensor hooks (``fusegrad.autograd.graph.saved_tensors_hooks``) live here because
``SavedTensor`` is where they act: the innermost pair active on this thread when a tensor is saved
packs it at once; every access unpacks it.  The stack is thread-local (the engine carries it to
the threads that run deeply nested backward calls) and ``graph.py`` holds the public API.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import AutogradError
from ..tensor import Tensor
from . import anomaly, grad_mode
from .forward_state import state as _forward_state
from .graph_base import (  # (Node, AccumulateGrad & co. are re-exported: this was their home)
    AccumulateGrad,
    Node,
    _change_ids,
    _sequence,
    accumulator_for,
    add_hook,
    graph_changed,
)
from .graph_base import changes as _changes
from .node_names import primitive_node_name

__all__ = [
    "AccumulateGrad",
    "Node",
    "OpNode",
    "SavedTensor",
    "accumulator_for",
    "add_hook",
    "pop_saved_hooks",
    "push_saved_hooks",
    "saved_hooks_state",
]

_make = Tensor._make  # (bound once: unpack runs per saved tensor per backward)

# Tensor types whose backward edge is ``Tensor._edge`` itself: ``OpNode`` computes it inline for
# them (a method call per input is a noticeable part of a small op).  A type that overrides
# ``_edge`` (vmap's batched tensors) is asked.  Filled as types are met (``_edge_is_plain``).
_PLAIN_EDGE: set = set()
_ndarray = np.ndarray  # (a module global: ``np.ndarray`` is two lookups per use)
# the dtypes whose rules may run by their array forms (``OpNode.run_arrays``)
_ARRAY_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _wrap(r: Any, g: Any, data: Any) -> Any:
    """An array form's result as a gradient: None stays None, the incoming gradient's own array
    stays that tensor (as the tensor form returns it), numpy's 0-d scalars become arrays."""
    if r is None:
        return None
    if r is data:
        return g
    return _make(r if type(r) is _ndarray else np.asarray(r))


_NO_EDGE = (None, 0)
# ``needs_input_grad`` of one and two inputs: shared tuples (indexed by the flags)
_NEEDS_ONE = ((False,), (True,))
_NEEDS = (((False, False), (False, True)), ((True, False), (True, True)))


# ``_input_meta`` of one and two inputs with numpy arrays of one shape and dtype, shared by every
# node that has it (immutable tuples): (shape, dtype) -> ``(meta, (meta,), (meta, meta))``.
# Bounded: emptied when it grows past ``_SHARED_META_SIZE`` entries (shapes that keep changing).
_SHARED_META: dict = {}
_SHARED_META_SIZE = 4096


def _share_meta(shape: tuple, dtype: Any) -> tuple:
    if len(_SHARED_META) >= _SHARED_META_SIZE:
        _SHARED_META.clear()
    meta = (shape, dtype)
    shared = _SHARED_META[meta] = (meta, (meta,), (meta, meta))
    return shared


def _edge_of(t: Tensor) -> tuple:
    """``t._edge()``, remembering in ``_PLAIN_EDGE`` a type that does not override it."""
    cls = type(t)
    if cls._edge is Tensor._edge:
        _PLAIN_EDGE.add(cls)
    return t._edge()


class _SavedHooksState(threading.local):
    """Per thread: the stack of (pack, unpack) pairs and the "disabled" message, if any."""

    def __init__(self) -> None:
        self.stack: list[tuple[Callable, Callable]] = []
        self.disabled_message: str | None = None


saved_hooks_state = _SavedHooksState()

# Number of pairs pushed on any thread and not yet popped: while it is 0 (almost always), saving
# a tensor skips the thread-local lookup, which keeps ``SavedTensor`` cheap on the hot path.
_hooks_in_use = 0


def push_saved_hooks(pack_hook: Callable, unpack_hook: Callable) -> None:
    global _hooks_in_use
    message = saved_hooks_state.disabled_message
    if message is not None:
        raise AutogradError(message)
    saved_hooks_state.stack.append((pack_hook, unpack_hook))
    _hooks_in_use += 1


def pop_saved_hooks() -> None:
    global _hooks_in_use
    saved_hooks_state.stack.pop()
    _hooks_in_use -= 1


def _current_saved_hooks() -> tuple[Callable, Callable] | None:
    stack = saved_hooks_state.stack
    return stack[-1] if stack else None


_pack_in_place_message = (
    "A saved tensor pack hook is modifying its input in place. Tensors provided as input to "
    "pack hook cannot be modified by in-place operations as this can lead to unexpected "
    "side-effects. Please open an issue if you need to perform in-place operations on the "
    "input to a pack hook."
)


def _inplace_hint() -> str:
    """PyTorch's hint for a modified saved tensor: under anomaly mode the warning emitted with
    the error already shows the forward line of the failing node."""
    if anomaly.is_anomaly_enabled():
        return (
            "Hint: the backtrace further above shows the operation that failed to compute its "
            "gradient. The variable in question was changed in there or anywhere later. Good luck!"
        )
    return (
        "Hint: enable anomaly detection to find the operation that failed to compute its "
        "gradient, with fusegrad.autograd.set_detect_anomaly(True)."
    )


class SavedTensor:
    """A tensor saved for backward.  Outputs of the node itself are kept as their data only (no
    reference cycle node -> output -> node) and rebuilt with ``grad_fn`` = that node on unpack,
    so double backward flows through the node as in PyTorch.

    With saved-tensor hooks active, ``pack(t)`` runs once here and its result is all that is
    kept, with just enough metadata (producing node and output number, or the leaf's
    AccumulateGrad) to give ``unpack(packed)``'s value the same place in the graph.  Versions are
    not checked then: what the hooks keep is theirs (as in PyTorch)."""

    __slots__ = (
        "_counter",
        "_data",
        "_fw_tangent",  # forward AD: (level, tangent) of a saved output (set only in a level)
        "_is_output",
        "_meta",  # packed by hooks: (shape, dtype, array type) of the tensor packed
        "_output_nr",
        "_packed",
        "_producer",
        "_rg",
        "_tensor",
        "_unpack_hook",
        "_version",
    )

    def __init__(
        self, t: Tensor, is_output: bool = False, output_nr: int = 0, node: Node | None = None
    ) -> None:
        if t._inference:
            raise AutogradError(
                "Inference tensors cannot be saved for backward. Please do not use Tensors "
                "created in inference mode in computation tracked by autograd. To work around "
                "this, you can make a clone to get a normal tensor and use it in autograd, or "
                "use `fusegrad.no_grad()` instead of `fusegrad.inference_mode()`."
            )
        self._counter = t._version_counter
        self._version = t._version_counter.value
        self._is_output = is_output
        self._unpack_hook = None
        # Python numbers wrapped as tensors are never shown to hooks (as in PyTorch)
        if _hooks_in_use and not t._wrapped_number:
            hooks = _current_saved_hooks()
            if hooks is not None:
                if is_output and node is not None and t.grad_fn is None:
                    # the pack hook sees the output with its grad_fn, as in PyTorch (the op
                    # machinery would set the same right after the node is built)
                    t.grad_fn, t._output_nr = node, output_nr
                self._pack(t, output_nr, hooks)
                return
        if is_output:
            self._tensor = None
            self._data = t._data
            self._rg = True  # outputs of a recorded node always require grad
            self._output_nr = output_nr
            self._producer = None  # the saving node itself (passed to unpack)
        else:
            self._tensor = t
            self._data = None
            self._rg = False
            # remembered now: an in-place op later rebases ``t.grad_fn``
            self._output_nr = t._output_nr
            self._producer = t.grad_fn

    @classmethod
    def of_input(cls, t: Tensor) -> SavedTensor:
        """``SavedTensor(t)``, built without the constructor's call in the common case (no
        saved-tensor hooks anywhere, not an inference tensor: the fields ``__init__`` sets
        then).  ``OpNode`` sets the same fields in line where a saving plan applies (keep the
        two in step) and calls this otherwise."""
        if _hooks_in_use or t._inference:
            return cls(t)
        s = _new_saved(cls)
        counter = t._version_counter
        s._counter = counter
        s._version = counter.value
        s._is_output = False
        s._unpack_hook = None
        s._tensor = t
        s._data = None
        s._rg = False
        s._output_nr = t._output_nr
        s._producer = t.grad_fn
        return s

    @classmethod
    def of_output(cls, t: Tensor, output_nr: int, node: Node) -> SavedTensor:
        """``SavedTensor(t, True, output_nr, node)`` (an output of ``node``), built without the
        constructor's call in the common case, as ``of_input``."""
        if _hooks_in_use or t._inference:
            return cls(t, True, output_nr, node)
        s = _new_saved(cls)
        counter = t._version_counter
        s._counter = counter
        s._version = counter.value
        s._is_output = True
        s._unpack_hook = None
        s._tensor = None
        s._data = t._data
        s._rg = True  # outputs of a recorded node always require grad
        s._output_nr = output_nr
        s._producer = None  # the saving node itself (passed to unpack)
        return s

    def _pack(self, t: Tensor, output_nr: int, hooks: tuple[Callable, Callable]) -> None:
        """Keep ``pack_hook(t)`` and the graph position of ``t`` instead of ``t``."""
        pack_hook, unpack_hook = hooks
        if self._is_output:
            self._producer, self._output_nr, self._rg = None, output_nr, True  # the node itself
        elif t.grad_fn is not None:
            self._producer, self._output_nr, self._rg = t.grad_fn, t._output_nr, True
        elif t._requires_grad:
            # a leaf: its AccumulateGrad is its place in the graph (kept alive by this reference)
            self._producer, self._output_nr, self._rg = accumulator_for(t), 0, True
        else:
            self._producer, self._output_nr, self._rg = None, 0, False
        version = t._version_counter.value
        self._meta = (t._data.shape, t._dtype, type(t._data))
        with grad_mode.no_grad():
            packed = pack_hook(t)
        if t._version_counter.value != version:
            raise AutogradError(_pack_in_place_message)
        self._tensor = None
        self._data = None
        self._packed = packed
        self._unpack_hook = unpack_hook

    def register_hooks(self, pack_hook: Callable, unpack_hook: Callable) -> None:
        """Pack this one saved tensor now and unpack it on every use (``grad_fn._raw_saved_x``)."""
        if not callable(pack_hook) or not callable(unpack_hook):
            raise TypeError("register_hooks(): pack_hook and unpack_hook must be callable")
        if self._unpack_hook is not None:
            raise AutogradError(
                "Calling register_hooks on a saved tensor whose hooks have already been set. "
                "Hint: only one pair of hooks is allowed at a time."
            )
        if self._counter is None:
            raise AutogradError(
                "Calling register_hooks on a saved tensor after it has been freed. Saved "
                "intermediate values of the graph are freed when you call .backward() or "
                "autograd.grad(). Specify retain_graph=True if you need to backward through the "
                "graph a second time or if you need to access saved variables after calling "
                "backward."
            )
        if self._is_output:
            t = _make(self._data)
            t._version_counter = self._counter
        else:
            t = self._tensor
        # a non-leaf keeps the producer it had when saved (an in-place op may have rebased it)
        producer, output_nr = self._producer, self._output_nr
        self._pack(t, output_nr, (pack_hook, unpack_hook))
        if not self._is_output and producer is not None:
            self._producer, self._output_nr, self._rg = producer, output_nr, True
        # an existing graph changed: compiled autograd's tape must not trust what it recorded
        # of this saved tensor (it is packed now, unpacked by user code)
        graph_changed()

    @property
    def has_hooks(self) -> bool:
        """True when unpacking runs user code (saved-tensor hooks): compiled autograd calls the
        unpack hook as an opaque step of the program, at its eager position."""
        return self._unpack_hook is not None

    def release(self) -> None:
        """Drop what was saved (after a backward without retain_graph)."""
        self._tensor = self._data = None
        if self._unpack_hook is not None:
            self._packed = None
        self._counter = None  # marks the tensor as freed
        graph_changed()

    def unpack(self, node: Node | None) -> Tensor:
        if self._counter is None:
            raise AutogradError(_freed_message)
        if self._unpack_hook is not None:
            return self._unpack_with_hook(node)
        if self._counter.value != self._version:
            t = self._tensor
            shape = tuple(t.shape) if t is not None else self._data.shape
            dtype = t.dtype.name if t is not None else str(self._data.dtype)
            producer = node if self._is_output else self._producer
            origin = (
                ""
                if producer is None
                else (f", which is output {self._output_nr} of {producer.name()},")
            )
            raise AutogradError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: [{dtype} {list(shape)}]{origin} is at version "
                f"{self._counter.value}; expected version {self._version} instead"
                f"{'' if node is None else f' (needed by {node.name()})'}. {_inplace_hint()}"
            )
        if not self._is_output:
            return self._tensor  # type: ignore[return-value]
        out = _make(self._data, self._counter)
        if self._rg:
            out.grad_fn = node
            out._output_nr = self._output_nr
        level = _forward_state.level
        if level is not None:  # a dual level: the output's tangent comes back
            level.saved_output_tangent(self, out)
        return out

    def _unpack_with_hook(self, node: Node | None) -> Tensor:
        value = self._unpack_hook(self._packed)  # type: ignore[misc]
        if not isinstance(value, Tensor):
            raise TypeError(
                "Output of saved tensor unpack_hook expected to be a Tensor but got result of "
                f"type {type(value).__name__}"
            )
        # A fresh tensor on the hook's data, placed where the saved tensor was in the graph.
        out = _make(value._data)
        out._version_counter = value._version_counter
        producer = node if self._is_output else self._producer
        if isinstance(producer, AccumulateGrad):
            out._requires_grad = True
            out._accumulator = weakref.ref(producer)
        elif producer is not None and self._rg:
            out.grad_fn = producer
            out._output_nr = self._output_nr
        return out


_new_saved = object.__new__
_saved_input = SavedTensor.of_input
_saved_output = SavedTensor.of_output

_freed_message = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward."
)


# ``OpNode._saved_list`` while the node keeps its saved values in its own slots (see ``OpNode``)
_COMPACT = object()


class OpNode(Node):
    """The node of one primitive call: applies the primitive's rule from the derivative table.

    Saved values (``_saved``: a list of ``SavedTensor``, None once freed) are usually kept in
    the node's own slots instead: where a saving plan applies (one or two inputs, at most two
    values) and no saved-tensor hooks are active, the node stores for value ``i`` what a
    ``SavedTensor`` would -- ``_s{i}`` the tensor (an input) or its array (an output),
    ``_c{i}`` / ``_v{i}`` the version counter and the version when saved, ``_p{i}`` / ``_o{i}``
    an input's producer and output number then -- and ``_steps`` the plan (``Rule.save_plans``)
    that says which value is which.  Two objects fewer per saved value (the ``SavedTensor`` and
    the list) is a quarter of a small op's forward: their allocation, and the garbage
    collections that every 700 surviving objects cost.  ``_saved_list`` is ``_COMPACT`` then;
    ``run_rule`` unpacks such values itself, and reading ``_saved`` (introspection, the
    compiler, forward AD, a version error) builds the ``SavedTensor`` objects once, from then
    on the node's saved values (``_materialize``)."""

    __slots__ = (
        "_c0",
        "_c1",
        "_name",
        "_o0",
        "_o1",
        "_p0",
        "_p1",
        "_prim",
        "_raw_shared",
        "_rule",
        "_s0",
        "_s1",
        "_saved_list",
        "_steps",
        "_unsaved",
        "_v0",
        "_v1",
        "attrs",
        "needs_input_grad",
    )

    def __init__(self, prim: Any, rule: Any, attrs: dict, inputs: tuple, outputs: tuple) -> None:
        # Hot path (one per recorded op): Node.__init__ and ``Tensor._edge`` inlined (for
        # tensor types that do not override ``_edge``), one and two inputs without building
        # lists, no generator expressions (each costs more than the rest of a small node).
        if len(inputs) == 2:
            t0, t1 = inputs
            if type(t0) is Tensor or type(t0) in _PLAIN_EDGE:
                node = t0.grad_fn
                if node is not None:
                    edge0 = (node, t0._output_nr)
                else:
                    edge0 = (accumulator_for(t0), 0) if t0._requires_grad else _NO_EDGE
            else:
                edge0 = _edge_of(t0)
            if type(t1) is Tensor or type(t1) in _PLAIN_EDGE:
                node = t1.grad_fn
                if node is not None:
                    edge1 = (node, t1._output_nr)
                else:
                    edge1 = (accumulator_for(t1), 0) if t1._requires_grad else _NO_EDGE
            else:
                edge1 = _edge_of(t1)
            self._edges = (edge0, edge1)
            a0, a1 = t0._data, t1._data
            # (one shared entry when two numpy arrays agree, as they mostly do, and one object
            # for all nodes that see that shape and dtype: fewer objects that the graph keeps
            # alive and the garbage collector walks.  Only numpy shapes are compared and
            # cached: a capture's symbolic sizes must not be asked)
            if type(a0) is _ndarray:
                shared = _SHARED_META.get((a0.shape, t0._dtype))
                if shared is None:
                    shared = _share_meta(a0.shape, t0._dtype)
                meta0 = shared[0]
                if t1._dtype is meta0[1] and type(a1) is _ndarray and a1.shape == meta0[0]:
                    self._input_meta = shared[2]
                else:
                    self._input_meta = (meta0, (a1.shape, t1._dtype))
            else:
                self._input_meta = ((a0.shape, t0._dtype), (a1.shape, t1._dtype))
            wants0 = edge0[0] is not None
            wants1 = edge1[0] is not None
            needs: tuple = _NEEDS[wants0][wants1]
            plan, plans = 2 * wants0 + wants1, 4  # (index and length of ``rule.save_plans``)
        elif len(inputs) == 1:
            t0 = inputs[0]
            if type(t0) is Tensor or type(t0) in _PLAIN_EDGE:
                node = t0.grad_fn
                if node is not None:
                    edge0 = (node, t0._output_nr)
                else:
                    edge0 = (accumulator_for(t0), 0) if t0._requires_grad else _NO_EDGE
            else:
                edge0 = _edge_of(t0)
            self._edges = (edge0,)
            a0 = t0._data
            if type(a0) is _ndarray:
                shared = _SHARED_META.get((a0.shape, t0._dtype))
                if shared is None:
                    shared = _share_meta(a0.shape, t0._dtype)
                self._input_meta = shared[1]
            else:
                self._input_meta = ((a0.shape, t0._dtype),)
            wants0 = edge0[0] is not None
            needs = _NEEDS_ONE[wants0]
            plan, plans = wants0, 2  # (a bool indexes as 0 or 1)
        else:
            edges = tuple([_edge_of(t) for t in inputs])
            self._edges = edges
            self._input_meta = tuple([(t._data.shape, t._dtype) for t in inputs])
            needs = tuple([e[0] is not None for e in edges])
            plan, plans = -1, -1
        self._seq = next(_sequence)
        self._pre_hooks = None
        self._post_hooks = None
        self._tensor_pre_hooks = None
        self._retain_grad_hooks = None
        self._metadata = None
        self._prim = prim
        self._name = None  # PyTorch's name, set by a composite ending in this node
        self._rule = rule
        self.attrs = attrs
        self.needs_input_grad = needs
        if not rule.save_steps:
            self._saved_list = ()  # (nothing to save: no list kept alive)
            self._unsaved = None
        elif len(rule.save_plans) == plans:  # (a call with as many inputs as declared)
            # the saves decided per rule and inputs requiring grad (``Rule.save_plans``)
            steps, self._unsaved = rule.save_plans[plan]
            if 0 < len(steps) <= 2 and not _hooks_in_use:
                # kept in the node's slots (see the class docstring); an inference tensor
                # goes to ``SavedTensor``, which refuses it
                where, position = steps[0]
                if where == "input":
                    t = inputs[position]
                    if t._inference:
                        SavedTensor(t)
                    counter = t._version_counter
                    self._s0 = t
                    self._c0 = counter
                    self._v0 = counter.value
                    self._p0 = t.grad_fn  # (remembered now: an in-place op later rebases it)
                    self._o0 = t._output_nr
                else:
                    t = outputs[position]
                    if t._inference:
                        SavedTensor(t, True, position, self)
                    counter = t._version_counter
                    self._s0 = t._data  # (an output keeps its array only: no cycle)
                    self._c0 = counter
                    self._v0 = counter.value
                if len(steps) == 2:
                    where, position = steps[1]
                    if where == "input":
                        t = inputs[position]
                        if t._inference:
                            SavedTensor(t)
                        counter = t._version_counter
                        self._s1 = t
                        self._c1 = counter
                        self._v1 = counter.value
                        self._p1 = t.grad_fn
                        self._o1 = t._output_nr
                    else:
                        t = outputs[position]
                        if t._inference:
                            SavedTensor(t, True, position, self)
                        counter = t._version_counter
                        self._s1 = t._data
                        self._c1 = counter
                        self._v1 = counter.value
                self._steps = steps
                self._saved_list = _COMPACT
                self._raw_shared = False
                return
            # with hooks (or more values): ``SavedTensor`` objects, the common ones built in
            # line as ``SavedTensor.of_input`` / ``of_output`` would build them
            saved: list = []
            for where, position in steps:
                if where == "input":
                    t = inputs[position]
                    if _hooks_in_use or t._inference:
                        saved.append(SavedTensor(t))
                        continue
                    s = _new_saved(SavedTensor)
                    counter = t._version_counter
                    s._counter = counter
                    s._version = counter.value
                    s._is_output = False
                    s._unpack_hook = None
                    s._tensor = t
                    s._data = None
                    s._rg = False
                    s._output_nr = t._output_nr
                    s._producer = t.grad_fn
                    saved.append(s)
                elif where == "out":
                    t = outputs[position]
                    if _hooks_in_use or t._inference:
                        saved.append(SavedTensor(t, True, position, self))
                        continue
                    s = _new_saved(SavedTensor)
                    counter = t._version_counter
                    s._counter = counter
                    s._version = counter.value
                    s._is_output = True
                    s._unpack_hook = None
                    s._tensor = None
                    s._data = t._data
                    s._rg = True  # outputs of a recorded node always require grad
                    s._output_nr = position
                    s._producer = None  # the saving node itself (passed to unpack)
                    saved.append(s)
                else:  # (variadic primitives have no plans)
                    raise AssertionError(f"{prim.name}: a plan saves {where!r}")
            self._saved_list = saved
        else:
            saved = []
            unsaved = None  # positions in rule.save of values no input that requires grad needs
            for k, where, position, wanted_by in rule.save_steps:
                if wanted_by is not None:
                    for i in wanted_by:
                        if needs[i]:
                            break
                    else:  # no input that requires grad needs it
                        unsaved = (*unsaved, k) if unsaved else (k,)
                        continue
                if where == "out":
                    saved.append(_saved_output(outputs[position], position, self))
                elif where == "input":
                    saved.append(_saved_input(inputs[position]))
                else:  # "name*": every input from here on
                    saved.extend([_saved_input(t) for t in inputs[position:]])
            self._saved_list = saved
            self._unsaved = unsaved
        self._raw_shared = False  # a SavedTensor was handed out (``_raw_saved_<name>``)

    def name(self) -> str:
        name = self._name
        return primitive_node_name(self) if name is None else name

    @property
    def input_shapes(self) -> tuple:
        return tuple(m[0] for m in self._input_meta)

    @property
    def input_dtypes(self) -> tuple:
        return tuple(m[1] for m in self._input_meta)

    @property
    def _saved(self) -> list | tuple | None:
        """The saved values as ``SavedTensor`` objects (None once freed); built from the node's
        slots on first use where it keeps them there (see the class docstring)."""
        saved = self._saved_list
        if saved is _COMPACT:
            saved = self._materialize()
        return saved

    @_saved.setter
    def _saved(self, value: list | tuple | None) -> None:
        if self._saved_list is _COMPACT:
            self._clear_compact()
        self._saved_list = value

    def _materialize(self) -> list:
        """Turn the values kept in the node's slots into ``SavedTensor`` objects, which from now
        on are the node's saved values (as ``OpNode.__init__`` would have built them)."""
        saved = []
        for i, (where, position) in enumerate(self._steps):
            s = _new_saved(SavedTensor)
            s._counter, s._version = (self._c0, self._v0) if i == 0 else (self._c1, self._v1)
            s._unpack_hook = None
            value = self._s0 if i == 0 else self._s1
            if where == "input":
                s._is_output = False
                s._tensor = value
                s._data = None
                s._rg = False
                s._output_nr, s._producer = (self._o0, self._p0) if i == 0 else (self._o1, self._p1)
            else:
                s._is_output = True
                s._tensor = None
                s._data = value
                s._rg = True  # outputs of a recorded node always require grad
                s._output_nr = position
                s._producer = None  # the saving node itself (passed to unpack)
            saved.append(s)
        self._clear_compact()
        self._saved_list = saved
        return saved

    def _clear_compact(self) -> None:
        """Drop the tensors, arrays and producers the node's slots keep (freed, or moved into
        ``SavedTensor`` objects)."""
        self._s0 = self._p0 = None
        if len(self._steps) == 2:
            self._s1 = self._p1 = None

    def saved_arrays(self) -> list | None:
        """The arrays of the saved values, in order (None once freed), without building
        ``SavedTensor`` objects for values kept in the node's slots: what the compiler's tape
        binds a replayed backward to (``compiler.tape.Binding.bind``).  No version check and no
        unpack hook: the caller has checked that nothing changed since the values were saved."""
        saved = self._saved_list
        if saved is _COMPACT:
            steps = self._steps
            a0 = self._s0._data if steps[0][0] == "input" else self._s0
            if len(steps) == 1:
                return [a0]
            return [a0, self._s1._data if steps[1][0] == "input" else self._s1]
        if saved is None:
            return None
        return [s._data if s._tensor is None else s._tensor._data for s in saved]

    def saved_values(self) -> tuple:
        if self._saved is None:
            raise AutogradError(_freed_message)
        return tuple(s.unpack(self) for s in self._saved)

    def rule_arguments(self, values: list) -> list:
        """The rule's saved arguments from the unpacked values of ``_saved`` (one per saved
        tensor): None goes where a value was not saved because no input needing it requires
        grad (those names are never variadic, so positions before them are one-to-one)."""
        unsaved = self._unsaved
        if unsaved is not None:
            for k in unsaved:
                values.insert(k, None)
        return values

    def release(self) -> None:
        """Free saved tensors (after a backward without retain_graph)."""
        saved = self._saved_list
        if saved is _COMPACT:
            self._clear_compact()
            self._saved_list = None
            graph_changed()
        elif saved:
            if self._raw_shared:
                # each one too: a ``_raw_saved_<name>`` the user holds must not keep the memory
                # (and must say it was freed); otherwise nothing but this list holds them
                for s in saved:
                    s.release()
            self._saved_list = None
            graph_changed()

    def apply(self, grads: tuple, retain: bool) -> tuple:
        return self.run_rule(grads[0], retain)

    def run_arrays(self, g: Any, retain: bool) -> tuple | None:
        """``run_rule`` by the rule's array form (``Rule.arrays``, the same kernel calls on the
        arrays), for the engine's common path when no tensor of the rule could be observed
        (grad mode off, no tracer, no forward AD: the engine checks those); None, with nothing
        done, unless the gradient and the saved values are numpy arrays of one float dtype
        held in the node's slots, unchanged."""
        data = g._data
        if type(data) is not _ndarray or data.dtype not in _ARRAY_DTYPES:
            return None
        rule = self._rule
        saved = self._saved_list
        if saved is _COMPACT:
            steps = self._steps
            unsaved = self._unsaved
            if self._c0.value != self._v0 or (unsaved is not None and len(rule.save_index) != 2):
                return None
            s0 = self._s0
            if steps[0][0] == "input":
                s0 = s0._data
            if type(s0) is not _ndarray or s0.dtype is not data.dtype:
                return None
            if len(steps) == 2:
                s1 = self._s1
                if steps[1][0] == "input":
                    s1 = s1._data
                if (
                    self._c1.value != self._v1
                    or type(s1) is not _ndarray
                    or s1.dtype is not data.dtype
                ):
                    return None
                result = rule.arrays(self, data, s0, s1)  # type: ignore[misc]
            elif unsaved is None:
                result = rule.arrays(self, data, s0)  # type: ignore[misc]
            elif unsaved[0] == 0:
                result = rule.arrays(self, data, None, s0)  # type: ignore[misc]
            else:
                result = rule.arrays(self, data, s0, None)  # type: ignore[misc]
            if not retain:
                self.release()
        elif not rule.save_index:
            result = rule.arrays(self, data)  # type: ignore[misc]
        else:
            return None
        if len(result) == 1:
            return (_wrap(result[0], g, data),)
        return tuple(_wrap(r, g, data) for r in result)

    def run_rule(self, g: Any, retain: bool) -> tuple:
        """``apply`` given the one incoming gradient (the engine's common path calls this)."""
        rule = self._rule
        if rule.save_index:
            saved = self._saved_list
            if saved is _COMPACT:
                # values in the node's slots: an input is its tensor, an output is rebuilt as
                # ``SavedTensor.unpack`` rebuilds it.  A version that moved (the error) and
                # forward AD (tangents of saved outputs) take ``unpack``'s own path
                steps = self._steps
                unsaved = self._unsaved
                if (
                    self._c0.value == self._v0
                    and (len(steps) == 1 or self._c1.value == self._v1)
                    and (unsaved is None or len(rule.save_index) == 2)
                    and _forward_state.level is None
                ):
                    where, position = steps[0]
                    v0 = self._s0
                    if where != "input":
                        v0 = _make(v0, self._c0)
                        v0.grad_fn = self
                        v0._output_nr = position
                    if len(steps) == 2:
                        where, position = steps[1]
                        v1 = self._s1
                        if where != "input":
                            v1 = _make(v1, self._c1)
                            v1.grad_fn = self
                            v1._output_nr = position
                        result = rule.fn(self, g, v0, v1)
                    elif unsaved is None:
                        result = rule.fn(self, g, v0)
                    elif unsaved[0] == 0:  # (two names, one saved: unsaved is (0,) or (1,))
                        result = rule.fn(self, g, None, v0)
                    else:
                        result = rule.fn(self, g, v0, None)
                    if not retain:
                        if self._saved_list is _COMPACT:  # (``release`` in line)
                            self._s0 = self._p0 = None  # (``_clear_compact`` in line)
                            if len(steps) == 2:
                                self._s1 = self._p1 = None
                            self._saved_list = None
                            _changes.value = next(_change_ids)  # (``graph_changed``)
                        else:  # (the rule read ``_saved``: the node has SavedTensors now)
                            self.release()
                    return result
                saved = self._materialize()
            if saved is None:
                raise AutogradError(_freed_message)
            # (one and two saved tensors, the common cases, without building a list; one of
            # two values saved is ``x * y`` where only one of them requires grad.  A saved input
            # whose tensor is still held -- not freed, not packed by hooks -- and whose version
            # has not moved is that tensor: ``unpack``'s first answer, without its call)
            unsaved = self._unsaved
            n_saved = len(saved)
            if 0 < n_saved <= 2 and (unsaved is None or len(rule.save_index) == 2):
                s0 = saved[0]
                v0 = s0._tensor
                if v0 is None or s0._counter.value != s0._version:
                    v0 = s0.unpack(self)
                if n_saved == 2:
                    s1 = saved[1]
                    v1 = s1._tensor
                    if v1 is None or s1._counter.value != s1._version:
                        v1 = s1.unpack(self)
                    result = rule.fn(self, g, v0, v1)
                elif unsaved is None:
                    result = rule.fn(self, g, v0)
                elif unsaved[0] == 0:  # (two names, one saved: unsaved is (0,) or (1,))
                    result = rule.fn(self, g, None, v0)
                else:
                    result = rule.fn(self, g, v0, None)
            else:
                values = [s.unpack(self) for s in saved]
                if unsaved is not None:
                    values = self.rule_arguments(values)
                result = rule.fn(self, g, *values)
            if not retain and saved and not self._raw_shared and self._saved_list is saved:
                # ``release`` in line: nothing but this list holds the saved tensors
                self._saved_list = None
                _changes.value = next(_change_ids)  # (``graph_changed``)
                return result
        else:
            result = rule.fn(self, g)
        if not retain and self._saved_list:
            self.release()
        return result

    # -- introspection: ``_saved_<name>`` / ``_raw_saved_<name>``, as in PyTorch --------------
    def _slots_of_saved(self) -> dict:
        """Saved name -> slice of ``_saved`` (a variadic "name*" covers several tensors)."""
        slots: dict = {}
        variadic_at = len(self._prim.inputs) - 1 if self._prim.variadic else -2
        n_inputs = len(self._edges)
        unsaved = self._unsaved or ()
        at = 0
        for k, (name, index) in enumerate(zip(self._rule.save, self._rule.save_index)):
            if k in unsaved:
                continue
            width = n_inputs - index if index == variadic_at else 1
            slots[name.rstrip("*")] = (slice(at, at + width), index == variadic_at)
            at += width
        # PyTorch's names: self / other are the first / second input, result the output
        inputs = [n.rstrip("*") for n in self._prim.inputs]
        for alias, target in (("self", 0), ("other", 1)):
            if alias not in slots and len(inputs) > target and inputs[target] in slots:
                slots[alias] = slots[inputs[target]]
        if "out" in slots:
            slots.setdefault("result", slots["out"])
        return slots

    def _lookup_saved(self, name: str, raw: bool) -> Any:
        slot = self._slots_of_saved().get(name)
        if slot is None:
            if name in self._unsaved_names():
                return None  # PyTorch: ``_saved_other`` of ``x * y`` is None if only y needs grad
            if not raw and name in self.attrs:
                return self.attrs[name]  # a non-tensor argument (dim, keepdim, ...)
            raise AttributeError(f"'{self.name()}' object has no attribute '_saved_{name}'")
        where, variadic = slot
        if self._saved is None:
            raise AutogradError(_freed_message)
        items = self._saved[where]
        if raw:
            self._raw_shared = True
        values = items if raw else [s.unpack(self) for s in items]
        return tuple(values) if variadic else values[0]

    def _unsaved_names(self) -> set:
        """Names (and PyTorch's aliases) of the values this node did not save."""
        if not self._unsaved:
            return set()
        names = {self._rule.save[k] for k in self._unsaved}
        inputs = self._prim.inputs
        for alias, target in (("self", 0), ("other", 1)):
            if len(inputs) > target and inputs[target] in names:
                names.add(alias)
        return names

    def __getattr__(self, item: str) -> Any:
        if item.startswith("_saved_"):
            return self._lookup_saved(item[len("_saved_") :], raw=False)
        if item.startswith("_raw_saved_"):
            return self._lookup_saved(item[len("_raw_saved_") :], raw=True)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{item}'")

    def __dir__(self) -> list:
        names = [f"_saved_{n}" for n in self._slots_of_saved()]
        names += [f"_raw_saved_{n}" for n in self._slots_of_saved()]
        names += [f"_saved_{n}" for n in self.attrs]
        return sorted(set(super().__dir__()) | set(names))
