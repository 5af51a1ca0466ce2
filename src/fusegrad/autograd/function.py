"""Custom autograd functions: ``class F(fusegrad.autograd.Function)`` with static ``forward`` and
``backward``, called through ``F.apply``.

``apply`` runs ``forward`` under no_grad with a context object that is also the backward node
(as in PyTorch, ``ctx`` *is* ``grad_fn``).  The node has one edge per forward argument (None for
non-tensors and tensors not requiring grad) and one output slot per returned tensor.  Saved
tensors are version-checked on access and freed after backward unless ``retain_graph``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from ..errors import AutogradError
from . import grad_mode
from .node import Node, SavedTensor, _freed_message


class FunctionCtx(Node):
    """The ``ctx`` of a custom Function and, once forward returns, its backward node."""

    __slots__ = (
        "_cls",
        "_to_save",
        "_saved",
        "_released",
        "_dirty",
        "_non_differentiable",
        "materialize_grads",
        "needs_input_grad",
        "_output_meta",
        "__dict__",
    )

    def __init__(self, cls: type, args: tuple) -> None:
        from ..tensor import Tensor

        edges = tuple(
            a._edge() if isinstance(a, Tensor) else (None, 0) for a in args
        )
        meta = tuple(
            (a._data.shape, a._dtype) if isinstance(a, Tensor) else ((), None) for a in args
        )
        super().__init__(edges, meta)
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
        self._to_save = tensors

    def mark_dirty(self, *tensors: Any) -> None:
        self._dirty = tensors

    def mark_non_differentiable(self, *tensors: Any) -> None:
        self._non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = bool(value)

    # -- used inside backward -----------------------------------------------------------------
    @property
    def saved_tensors(self) -> tuple:
        if self._released or self._saved is None and self._to_save:
            raise AutogradError(_freed_message)
        if self._saved is None:
            return ()
        return tuple(s.unpack(self) if s is not None else None for s in self._saved)

    # -- node interface -----------------------------------------------------------------------
    def name(self) -> str:
        return f"{self._cls.__name__}Backward"

    @property
    def num_outputs(self) -> int:
        return len(self._output_meta)

    def release(self) -> None:
        if self._saved is not None:
            self._saved = None
            self._released = True

    def apply(self, grads: tuple, retain: bool) -> tuple:
        from ..tensor import Tensor

        grads = list(grads)
        if self.materialize_grads:
            for i, g in enumerate(grads):
                shape, dtype = self._output_meta[i]
                if g is None and dtype is not None:
                    grads[i] = Tensor._make(np.zeros(shape, dtype.np))
        result = self._cls.backward(self, *grads)
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
        if not retain:
            self.release()
        return tuple(r if self.needs_input_grad[i] else None for i, r in enumerate(result))


class Function:
    """Base class for custom differentiable functions (see module docstring)."""

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("You must implement the forward function for custom Function.")

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise NotImplementedError("You must implement the backward function for custom Function.")

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        from ..tensor import Tensor

        ctx = FunctionCtx(cls, args)
        with grad_mode.no_grad():
            outputs = cls.forward(ctx, *args, **kwargs)
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        tensor_args = [a for a in args if isinstance(a, Tensor)]
        record = grad_mode.is_grad_enabled() and any(a.requires_grad for a in tensor_args)
        dirty_ids = {id(t) for t in ctx._dirty}
        nondiff_ids = {id(t) for t in ctx._non_differentiable}
        input_ids = {id(a) for a in tensor_args}
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
                if id(o) in dirty_ids and o.grad_fn is None and o._requires_grad:
                    raise AutogradError(
                        "a leaf Variable that requires grad is being used in an in-place "
                        "operation."
                    )
                o.grad_fn = ctx
                o._output_nr = i
            final.append(o)
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
        if single:
            return final[0]
        return tuple(final)


def once_differentiable(fn: Callable) -> Callable:
    """Decorate a ``backward`` that is not itself differentiable: it runs under no_grad, and
    differentiating its result raises."""

    @functools.wraps(fn)
    def wrapper(ctx: Any, *grads: Any) -> Any:
        with grad_mode.no_grad():
            result = fn(ctx, *grads)
        if not grad_mode.is_grad_enabled():
            return result
        if not any(getattr(g, "requires_grad", False) for g in grads):
            return result
        return _mark_twice_error(result, ctx)

    return wrapper


class _DelayedError(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, msg: str, *tensors: Any) -> Any:
        ctx.msg = msg
        out = tuple(t.detach() for t in tensors)
        return out if len(out) > 1 else out[0]

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise AutogradError(ctx.msg)


def _mark_twice_error(result: Any, ctx: Any) -> Any:
    from ..tensor import Tensor

    single = not isinstance(result, tuple)
    items = (result,) if single else result
    msg = (
        f"trying to differentiate twice a function that was marked with @once_differentiable "
        f"({ctx.name()})"
    )
    tensors = [r for r in items if isinstance(r, Tensor)]
    if not tensors:
        return result
    # give each output a grad_fn that raises when differentiated
    anchor = Tensor._make(np.zeros(()))
    anchor.requires_grad_(True)
    wrapped = []
    for r in items:
        if isinstance(r, Tensor):
            wrapped.append(_DelayedError.apply(msg, r + anchor.to(r.dtype) * 0))
        else:
            wrapped.append(r)
    return wrapped[0] if single else tuple(wrapped)
