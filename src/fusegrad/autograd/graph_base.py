"""The base of the backward graph, as far as ``Tensor`` needs it: ``Node`` (every ``grad_fn``
derives from it), ``AccumulateGrad`` (the node of a leaf) with ``accumulator_for``, and hook
registration (``add_hook`` and the ``_Handle`` it returns).

It sits just below ``tensor.py``: a tensor's backward edge (``Tensor._edge``) and its hooks need
these, and nothing here needs ``Tensor`` itself (a leaf is only stored and read).  The nodes that
do build tensors, ``OpNode`` and ``SavedTensor``, are in ``node.py``, above ``tensor.py``;
``node.py`` and ``graph.py`` re-export these names.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..tensor import Tensor

# Creation order of nodes (``Node._sequence_nr``): the engine runs later nodes first.
_sequence = itertools.count()


class _Handle:
    """Returned by every hook registration; ``remove()`` takes the hook out (idempotent)."""

    __slots__ = ("_key", "_store")

    def __init__(self, store: dict, key: int) -> None:
        self._store = store
        self._key = key

    def remove(self) -> None:
        self._store.pop(self._key, None)

    def __enter__(self) -> _Handle:  # noqa: PYI034  (py3.10: no typing.Self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class _Changes:
    """A stamp that moves on every change made to graphs that already exist: a hook registered
    (node, tensor or retain_grad), saved tensors released, a tensor's version bumped.  Whoever
    keeps a graph's state between calls (the compiler's tape) reads ``value`` before recording
    and again before reusing what it recorded: equal values mean none of these happened in
    between, so the per-node checks can be skipped.

    Each change stores a fresh number *after* it is made, so the value never returns to one a
    reader has seen (two threads storing out of order only make a reader check more)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


changes = _Changes()
_change_ids = itertools.count(1)


def graph_changed() -> None:
    """Note a change to an existing graph (see ``_Changes``); call it after the change."""
    changes.value = next(_change_ids)


class _Epoch:
    """A stamp that moves whenever something a compiled function's guard reads of a tensor or a
    module may have changed: a tensor's array, dtype or ``requires_grad`` flag replaced
    (``.data =``, ``resize_``, ``squeeze_``-like view ops, ``requires_grad_``, ``detach_``,
    lazy materialisation), a module's attribute set or deleted, ``train()``/``eval()``, its
    parameters, buffers or submodules added, replaced or removed.  In-place writes to values
    (version bumps) do not move it: a guard does not read values.

    The compiler's whole-step guard (``fusegrad.compiler``) reads ``value`` before it walks
    the modules and tensors a function reaches, and skips that walk on later calls while the
    value is unchanged.  Like ``changes``, each change stores a fresh number after it is made,
    so the value never returns to one a reader has seen.

    A tensor change moves it only for the tensors a guard read (``watched``: their ids, added
    by the compiler when it keeps a guard), so that making new tensors require grad (a custom
    Function's outputs, ``func.grad``'s inputs) on every call leaves the guards standing.  An
    id stays in ``watched`` after its tensor is gone (a new tensor with that id only moves the
    stamp more often); past ``WATCHED`` ids the set is emptied and the stamp moved, which
    retires every guard made before."""

    __slots__ = ("value", "watched")

    WATCHED = 1 << 16

    def __init__(self) -> None:
        self.value = 0
        self.watched: set[int] = set()

    def watch(self, tensors: Any) -> None:
        """Note ``tensors`` as read by a guard: their changes move the stamp from now on."""
        if len(self.watched) > self.WATCHED:
            self.watched.clear()
            guards_changed()
        self.watched.update(map(id, tensors))


epoch = _Epoch()
_epoch_ids = itertools.count(1)


def guards_changed() -> None:
    """Note a change that may alter what a guard reads (see ``_Epoch``); call it after the
    change."""
    epoch.value = next(_epoch_ids)


def tensor_guards_changed(t: Any) -> None:
    """Note that ``t``'s array, dtype or ``requires_grad`` was replaced (see ``_Epoch``)."""
    if id(t) in epoch.watched:
        epoch.value = next(_epoch_ids)


_hook_ids = itertools.count()


def add_hook(store: dict, fn: Callable) -> _Handle:
    key = next(_hook_ids)
    store[key] = fn
    graph_changed()
    return _Handle(store, key)


def _check_callable(fn: Any) -> None:
    if not callable(fn):
        raise TypeError(f"hook must be callable, got {type(fn).__name__}")


class Node:
    """Base of all backward nodes (``fusegrad.autograd.graph.Node``)."""

    # The engine skips a node whose incoming gradients are all None (its inputs get None);
    # custom Functions still run, as PyTorch calls their backward with None / zeros.
    _runs_without_grads = False

    __slots__ = (
        "__weakref__",
        "_edges",
        "_input_meta",
        "_metadata",
        "_post_hooks",
        "_pre_hooks",
        "_retain_grad_hooks",
        "_seq",
        "_tensor_pre_hooks",
    )

    def __init__(self, edges: tuple, input_meta: tuple) -> None:
        self._edges = edges  # tuple of (Node | None, int)
        self._seq = next(_sequence)
        self._input_meta = input_meta  # tuple of (shape, dtype) per input
        self._pre_hooks: dict | None = None
        self._post_hooks: dict | None = None
        self._tensor_pre_hooks: dict | None = None  # output_nr -> {id: fn}
        self._retain_grad_hooks: dict | None = None  # output_nr -> weakref to Tensor
        self._metadata: dict | None = None  # made on first use (few nodes ever need one)

    # -- public, torch-like -------------------------------------------------------------
    def name(self) -> str:
        raise NotImplementedError

    @property
    def next_functions(self) -> tuple:
        return self._edges

    @property
    def metadata(self) -> dict:
        """A dict for whatever the user (or anomaly mode) keeps with this node."""
        metadata = self._metadata
        if metadata is None:
            metadata = self._metadata = {}
        return metadata

    @metadata.setter
    def metadata(self, value: dict) -> None:
        self._metadata = value

    def register_prehook(self, fn: Callable) -> _Handle:
        """``fn(grad_outputs) -> tuple | None`` runs before the node (a tuple replaces the
        incoming gradients)."""
        _check_callable(fn)
        if self._pre_hooks is None:
            self._pre_hooks = {}
        return add_hook(self._pre_hooks, fn)

    def register_hook(self, fn: Callable) -> _Handle:
        """``fn(grad_inputs, grad_outputs) -> tuple | None`` runs after the node (a tuple
        replaces the gradients it computed for its inputs)."""
        _check_callable(fn)
        if self._post_hooks is None:
            self._post_hooks = {}
        return add_hook(self._post_hooks, fn)

    def _sequence_nr(self) -> float:
        """Creation order in the forward pass (the engine runs later nodes first)."""
        return self._seq

    def __repr__(self) -> str:
        return f"<{self.name()} object at {id(self):#x}>"

    def __call__(self, *grads: Any) -> tuple:
        return self.apply(grads, retain=True)

    # -- engine interface ---------------------------------------------------------------
    @property
    def num_outputs(self) -> int:
        return 1

    def apply(self, grads: tuple, retain: bool) -> tuple:
        """Gradients for each forward input (None where there is none)."""
        raise NotImplementedError

    def _add_tensor_pre_hook(self, output_nr: int, fn: Callable) -> _Handle:
        if self._tensor_pre_hooks is None:
            self._tensor_pre_hooks = {}
        store = self._tensor_pre_hooks.setdefault(output_nr, {})
        return add_hook(store, fn)


class AccumulateGrad(Node):
    """Writes the incoming gradient into a leaf's ``.grad`` (first store copies, later adds in
    place; under create_graph ``.grad = .grad + g``)."""

    __slots__ = ("variable",)

    def __init__(self, variable: Tensor) -> None:
        super().__init__((), ((variable._data.shape, variable._dtype),))
        self._seq = float("inf")  # run as soon as ready, like PyTorch
        self.variable = variable

    def name(self) -> str:
        return "AccumulateGrad"

    def apply(self, grads: tuple, retain: bool) -> tuple:
        raise AssertionError("AccumulateGrad is executed by the engine")


def accumulator_for(t: Tensor) -> AccumulateGrad:
    """The (cached, weakly referenced) AccumulateGrad of a leaf."""
    ref = t._accumulator
    acc = ref() if ref is not None else None
    if acc is None:
        acc = AccumulateGrad(t)
        t._accumulator = weakref.ref(acc)
    return acc
