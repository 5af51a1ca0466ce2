"""Nodes of the backward graph: Node, OpNode (one per primitive call), AccumulateGrad (one per
leaf), and SavedTensor (a tensor a rule needs, with its version checked on use).

A node's ``next_functions`` are its edges ``(node or None, input_nr)``, one per forward input.
Each node records the shape and dtype of every forward input so that the engine can undo
broadcasting (sum-to-shape) and check what a rule returned without keeping the inputs alive.
The rule of an OpNode comes from the one derivative table (``autograd/derivatives.py``).
"""

from __future__ import annotations

import itertools
import re
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import AutogradError

if TYPE_CHECKING:
    from ..tensor import Tensor

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


_hook_ids = itertools.count()


def add_hook(store: dict, fn: Callable) -> _Handle:
    key = next(_hook_ids)
    store[key] = fn
    return _Handle(store, key)


class Node:
    """Base of all backward nodes."""

    __slots__ = (
        "__weakref__",
        "_edges",
        "_input_meta",
        "_post_hooks",
        "_pre_hooks",
        "_retain_grad_hooks",
        "_seq",
        "_tensor_pre_hooks",
        "metadata",
    )

    def __init__(self, edges: tuple, input_meta: tuple) -> None:
        self._edges = edges  # tuple of (Node | None, int)
        self._seq = next(_sequence)
        self._input_meta = input_meta  # tuple of (shape, dtype) per input
        self._pre_hooks: dict | None = None
        self._post_hooks: dict | None = None
        self._tensor_pre_hooks: dict | None = None  # output_nr -> {id: fn}
        self._retain_grad_hooks: dict | None = None  # output_nr -> weakref to Tensor
        self.metadata: dict = {}

    # -- public, torch-like -------------------------------------------------------------
    def name(self) -> str:
        raise NotImplementedError

    @property
    def next_functions(self) -> tuple:
        return self._edges

    def register_prehook(self, fn: Callable) -> _Handle:
        if self._pre_hooks is None:
            self._pre_hooks = {}
        return add_hook(self._pre_hooks, fn)

    def register_hook(self, fn: Callable) -> _Handle:
        if self._post_hooks is None:
            self._post_hooks = {}
        return add_hook(self._post_hooks, fn)

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


class SavedTensor:
    """A tensor saved for backward.  Outputs of the node itself are kept as their data only (no
    reference cycle node -> output -> node) and rebuilt with ``grad_fn`` = that node on unpack,
    so double backward flows through the node as in PyTorch."""

    __slots__ = (
        "_counter",
        "_data",
        "_is_output",
        "_output_nr",
        "_producer",
        "_rg",
        "_tensor",
        "_version",
    )

    def __init__(self, t: Tensor, is_output: bool = False, output_nr: int = 0) -> None:
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

    def unpack(self, node: Node) -> Tensor:
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
                f"{self._counter.value}; expected version {self._version} instead (needed by "
                f"{node.name()}). Hint: enable anomaly detection to find the operation "
                "that failed to compute its gradient, with "
                "fusegrad.autograd.set_detect_anomaly(True)."
            )
        if not self._is_output:
            return self._tensor  # type: ignore[return-value]
        from ..tensor import Tensor

        out = Tensor._make(self._data)
        out._version_counter = self._counter
        if self._rg:
            out.grad_fn = node
            out._output_nr = self._output_nr
        return out


_freed_message = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward."
)


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"_+", name) if part)


class OpNode(Node):
    """The node of one primitive call: applies the primitive's rule from the derivative table."""

    __slots__ = ("_freed", "_prim", "_rule", "_saved", "attrs", "needs_input_grad")

    def __init__(self, prim: Any, rule: Any, attrs: dict, inputs: tuple, outputs: tuple) -> None:
        edges = tuple(t._edge() for t in inputs)
        super().__init__(edges, tuple((t._data.shape, t._dtype) for t in inputs))
        self._prim = prim
        self._rule = rule
        self.attrs = attrs
        self.needs_input_grad = tuple(e[0] is not None for e in edges)
        saved = []
        variadic_at = len(prim.inputs) - 1 if prim.variadic else -2
        for index in rule.save_index:
            if index < 0:  # an output of the node
                saved.append(SavedTensor(outputs[-1 - index], True, -1 - index))
            elif index == variadic_at:  # "name*": every input from here on
                saved.extend(SavedTensor(t) for t in inputs[index:])
            else:
                saved.append(SavedTensor(inputs[index]))
        self._saved: list | None = saved
        self._freed = False

    def name(self) -> str:
        return f"{_camel(self._prim.name)}Backward0"

    @property
    def input_shapes(self) -> tuple:
        return tuple(m[0] for m in self._input_meta)

    @property
    def input_dtypes(self) -> tuple:
        return tuple(m[1] for m in self._input_meta)

    def saved_values(self) -> tuple:
        if self._saved is None:
            raise AutogradError(_freed_message)
        return tuple(s.unpack(self) for s in self._saved)

    def release(self) -> None:
        """Free saved tensors (after a backward without retain_graph)."""
        if self._saved:
            self._saved = None

    def apply(self, grads: tuple, retain: bool) -> tuple:
        saved = self.saved_values() if self._rule.save_index else ()
        result = self._rule.fn(self, grads[0], *saved)
        if not retain:
            self.release()
        return result

    def __getattr__(self, item: str) -> Any:
        # _saved_<name> accessors, as in PyTorch (``grad_fn._saved_self``)
        if item.startswith("_saved_"):
            name = item[len("_saved_") :]
            names = self._rule.save
            if name in names:
                return self.saved_values()[names.index(name)]
        raise AttributeError(item)


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
