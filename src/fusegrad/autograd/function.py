"""Custom autograd functions: ``class F(fusegrad.autograd.Function)`` with static ``forward`` and
``backward``, called through ``F.apply``.

``apply`` runs ``forward`` under no_grad with a context object that is also the backward node
(as in PyTorch, ``ctx`` *is* ``grad_fn``).  The node has one edge per forward argument (None for
non-tensors and tensors not requiring grad) and one output slot per returned value (non-tensor
outputs keep their slot so that ``output_nr`` is the position).  ``forward`` may also be written
without ``ctx`` when the class defines ``setup_context(ctx, inputs, output)`` (PyTorch 2 style).

What ``ctx`` offers inside ``forward`` / ``setup_context``:

* ``save_for_backward(*tensors)``: saved tensors are version-checked on access (an in-place
  change in between is an error), go through saved-tensor hooks, and are freed after backward
  unless ``retain_graph`` (later access: "Trying to backward through the graph a second time");
* ``mark_dirty(*inputs)``: the inputs were modified in place and are returned; their history
  is rebased onto this node (a leaf that requires grad may not be modified in place);
* ``mark_non_differentiable(*outputs)``: those outputs do not require grad;
* ``set_materialize_grads(False)``: backward receives None (not zeros) for outputs that got no
  gradient.

``backward`` returns one gradient per forward argument (extra trailing Nones are allowed; a
wrong count is ``returned an incorrect number of gradients``); None means "no gradient" and stays
None.  Gradients the engine cannot sum to the input's shape are its ``invalid gradient at index``
error.  Under ``create_graph`` backward runs with grad mode on, so a backward written with
fusegrad ops is itself differentiable; ``once_differentiable`` marks one that is not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import AutogradError
from ..ops import _rebase_history
from ..tensor import Tensor
from . import anomaly, grad_mode
from . import forward_ad as _forward_ad
from .forward_state import state as _forward_state
from .node import Node, SavedTensor, _freed_message


def _edge_meta(t: Tensor) -> tuple:
    """(shape, dtype) of the gradients that flow into ``t``'s edge: its own, or for a tensor
    whose history lives on another tensor (``fusegrad.func.vmap``'s batched tensors keep it on
    the whole batch, ``_phys``) that tensor's."""
    phys = t.__dict__.get("_phys")
    return ((t if phys is None else phys)._data.shape, t._dtype)


def _batching(t: Any) -> Any:
    """For ``fusegrad.func.vmap``'s nodes of a Function called on batched tensors: ``t``'s
    levels, innermost first, each with the shape of what it wraps (None for a tensor that is
    not batched, or not a tensor)."""
    if not isinstance(t, Tensor) or "_phys" not in t.__dict__:
        return None
    chain = []
    while "_phys" in t.__dict__:
        level = t.__dict__["_level"]
        t = t.__dict__["_phys"]
        chain.append((level, t._data.shape))
    return tuple(chain)


class FunctionCtx(Node):
    """The ``ctx`` of a custom Function and, once forward returns, its backward node."""

    __slots__ = (
        "__dict__",
        "_cls",
        "_dirty",
        "_non_differentiable",
        "_output_meta",
        "_released",
        "_saved",
        "_to_save",
        "materialize_grads",
        "needs_input_grad",
    )

    # PyTorch calls a custom backward even when no output received a gradient
    _runs_without_grads = True

    def __init__(self, cls: type, args: tuple) -> None:
        edges = tuple(a._edge() if isinstance(a, Tensor) else (None, 0) for a in args)
        meta = tuple(_edge_meta(a) if isinstance(a, Tensor) else ((), None) for a in args)
        super().__init__(edges, meta)
        if any(isinstance(a, Tensor) and "_phys" in a.__dict__ for a in args):
            # called under vmap: how each input is batched (``vmap._LevelFunction``)
            self.__dict__["_input_batching"] = tuple(_batching(a) for a in args)
        self._cls = cls
        self._to_save: tuple = ()
        self._saved: list | None = None
        self._released = False
        self._dirty: tuple = ()
        self._non_differentiable: tuple = ()
        self.materialize_grads = True
        self.needs_input_grad = tuple(e[0] is not None for e in edges)
        self._output_meta: list = []

    # -- used inside forward ------------------------------------------------------------------
    def save_for_backward(self, *tensors: Any) -> None:
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(
                    "save_for_backward can only save variables, but argument "
                    f"{i} is of type {type(t).__name__}"
                )
        self._to_save = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        """Keep ``tensors`` for ``jvp`` (forward-mode AD), which reads them as
        ``ctx.saved_tensors``."""
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(
                    "save_for_forward expects all arguments to be tensors; you should save "
                    f"non-tensors as attributes on ctx. (argument {i} is of type "
                    f"{type(t).__name__})"
                )
        self.__dict__["_forward_saved"] = tensors

    def mark_dirty(self, *tensors: Any) -> None:
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise TypeError(
                    f"mark_dirty can only accept variables, but argument {i} is of type "
                    f"{type(t).__name__}"
                )
        self._dirty = tensors

    def mark_non_differentiable(self, *tensors: Any) -> None:
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise TypeError(
                    "mark_non_differentiable can only accept variables, but argument "
                    f"{i} is of type {type(t).__name__}"
                )
        self._non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = bool(value)

    # -- used inside backward -----------------------------------------------------------------
    @property
    def saved_tensors(self) -> tuple:
        if self.__dict__.get("_in_jvp"):  # inside jvp: what save_for_forward kept
            return tuple(self.__dict__.get("_forward_saved", ()))
        if self._released:
            raise AutogradError(_freed_message)
        if self._saved is None:
            return ()
        return tuple(s.unpack(self) if s is not None else None for s in self._saved)

    # -- node interface -----------------------------------------------------------------------
    def name(self) -> str:
        # (fusegrad's internal Functions carry PyTorch's name for the native node they stand for)
        return self._cls.__dict__.get("_node_name") or f"{self._cls.__name__}Backward"

    @property
    def num_outputs(self) -> int:
        return len(self._output_meta)

    def release(self) -> None:
        if self._saved is not None:
            for s in self._saved:
                if s is not None:
                    s.release()
            self._saved = None
            self._released = True

    def apply(self, grads: tuple, retain: bool) -> tuple:
        grads = list(grads)
        if self.materialize_grads:
            for i, g in enumerate(grads):
                shape, dtype = self._output_meta[i]
                if g is None and dtype is not None:
                    grads[i] = Tensor._make(np.zeros(shape, dtype.np))
        result = self.backward_results(self._cls.backward(self, *grads))
        if not retain:
            self.release()
        return result

    def backward_results(self, result: Any) -> tuple:
        """What ``backward`` returned, checked as PyTorch checks it (count, types, no gradient
        for a non-tensor input), as one entry per edge, None for inputs that need no gradient
        (also what compiled autograd's trace of ``backward`` goes through)."""
        if not isinstance(result, tuple):
            result = (result,)
        n = len(self._edges)
        if len(result) > n and all(r is None for r in result[n:]):
            result = result[:n]
        if len(result) != n:
            raise AutogradError(
                f"function {self.name()} returned an incorrect number of gradients (expected "
                f"{n}, got {len(result)})"
            )
        for i, r in enumerate(result):
            if r is not None and not isinstance(r, Tensor):
                raise AutogradError(
                    f"function {self.name()} returned a gradient of type {type(r).__name__} at "
                    f"index {i}; expected a Tensor or None"
                )
            if r is not None and self._input_meta[i][1] is None:
                raise AutogradError(
                    f"function {self.name()} returned a gradient different than None at position "
                    f"{i + 1}, but the corresponding forward input was not a Tensor"
                )
        # a gradient for an input that does not require grad is dropped, as in PyTorch
        return tuple(r if self.needs_input_grad[i] else None for i, r in enumerate(result))


class Function:
    """Base class for custom differentiable functions (see module docstring)."""

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("You must implement the forward function for custom Function.")

    @staticmethod
    def setup_context(ctx: FunctionCtx, inputs: tuple, output: Any) -> None:
        raise NotImplementedError("setup_context is not implemented.")

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise NotImplementedError("You must implement the backward function for custom Function.")

    @staticmethod
    def jvp(ctx: FunctionCtx, *tangents: Any) -> Any:
        """Forward-mode AD: the outputs' tangents from the inputs' (None for an input without
        one, or that is not a Tensor)."""
        raise NotImplementedError(
            "You must implement the jvp function for custom autograd.Function to use it with "
            "forward mode AD."
        )

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        ctx = FunctionCtx(cls, args)
        separate_setup = cls.setup_context is not Function.setup_context
        # forward AD: the forward's own ops compute no tangents; ``jvp`` gives the outputs'
        tangents = _forward_ad.tangents_of(args) if _forward_state.level is not None else None
        with grad_mode.no_grad(), _forward_ad.suspended(tangents is not None):
            if separate_setup:
                outputs = cls.forward(*args, **kwargs)
                cls.setup_context(ctx, args, outputs)
            else:
                outputs = cls.forward(ctx, *args, **kwargs)
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        tensor_args = [a for a in args if isinstance(a, Tensor)]
        record = grad_mode.is_grad_enabled() and any(a.requires_grad for a in tensor_args)
        dirty_ids = {id(t) for t in ctx._dirty}
        nondiff_ids = {id(t) for t in ctx._non_differentiable}
        input_ids = {id(a) for a in tensor_args}
        output_ids = {id(o) for o in outs if isinstance(o, Tensor)}
        if not dirty_ids <= output_ids:
            raise AutogradError(
                "Some elements marked as dirty during the forward method were not returned as "
                "output. The inputs that are modified inplace must all be outputs of the "
                "Function."
            )
        final = []
        for i, o in enumerate(outs):
            if not isinstance(o, Tensor):
                ctx._output_meta.append(((), None))  # keeps output_nr == position
                final.append(o)
                continue
            if id(o) in input_ids and id(o) not in dirty_ids:
                # an input returned as is: hand out a new alias so its history is not rewritten
                alias = Tensor._make(o._data)
                alias._version_counter = o._version_counter
                alias._base = o._base if o._base is not None else o
                o = alias
            ctx._output_meta.append((o._data.shape, o._dtype))
            if record and id(o) not in nondiff_ids and o._dtype.is_floating_point:
                if id(o) in dirty_ids:
                    if o.grad_fn is None and o._requires_grad:
                        raise AutogradError(
                            "a leaf Variable that requires grad is being used in an in-place "
                            "operation."
                        )
                    # the in-place result's history is this node (a view's base's, too)
                    _rebase_history(o, ctx, i)
                else:
                    o.grad_fn = ctx
                    o._output_nr = i
            final.append(o)
        if record and anomaly._state.enabled:
            anomaly.record_forward_trace(ctx)
        if record:
            saved = []
            outputs_by_id = {id(o): k for k, o in enumerate(final) if isinstance(o, Tensor)}
            for t in ctx._to_save:
                if t is None:
                    saved.append(None)
                elif id(t) in outputs_by_id and t.grad_fn is ctx:
                    saved.append(SavedTensor(t, True, outputs_by_id[id(t)]))
                else:
                    saved.append(SavedTensor(t))
            ctx._saved = saved
        else:
            ctx._saved = [SavedTensor(t) if t is not None else None for t in ctx._to_save]
        if tangents is not None:
            _forward_ad.custom_function_jvp(cls, ctx, tangents, final)
        if single:
            return final[0]
        return tuple(final)


def once_differentiable(fn: Callable) -> Callable:
    """Decorate a ``backward`` that is not itself differentiable: it runs under no_grad, and
    when the caller asked for a graph (``create_graph``) its results carry a node that raises if
    differentiated (PyTorch's DelayedError)."""

    @functools.wraps(fn)
    def wrapper(ctx: Any, *grads: Any) -> Any:
        with grad_mode.no_grad():
            result = fn(ctx, *grads)
        if not grad_mode.is_grad_enabled():
            return result
        if not any(isinstance(g, Tensor) and g.requires_grad for g in grads):
            return result
        single = not isinstance(result, tuple)
        items = (result,) if single else result
        message = (
            "trying to differentiate twice a function that was marked with "
            f"@once_differentiable ({ctx.name()})"
        )
        wrapped = _DelayedError.apply(message, *[_fake_requires_grad(r) for r in items])
        if not isinstance(wrapped, tuple):
            wrapped = (wrapped,)
        return wrapped[0] if single else wrapped

    return wrapper


def _fake_requires_grad(value: Any) -> Any:
    """A leaf alias that requires grad, so that ``_DelayedError`` records its node."""
    if not isinstance(value, Tensor) or not value.is_floating_point():
        return value
    alias = value.detach()
    alias.requires_grad_(True)
    return alias


class _DelayedError(Function):
    """Passes its tensors through; differentiating them raises ``message``."""

    @staticmethod
    def forward(ctx: FunctionCtx, message: str, *values: Any) -> Any:
        ctx.message = message
        return values if len(values) != 1 else values[0]

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise AutogradError(ctx.message)

    @staticmethod
    def jvp(ctx: FunctionCtx, message: Any, *tangents: Any) -> Any:
        return tangents if len(tangents) != 1 else tangents[0]
