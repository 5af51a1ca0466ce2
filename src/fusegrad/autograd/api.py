"""``backward()`` and ``grad()``: the entry points of a backward pass (re-exported by
``fusegrad.autograd``), and ``Tensor.backward``, which this module installs on the class.

Both validate their arguments (PyTorch's error texts), build the root gradients and hand over to
the engine, or to this thread's tracer when one is installed (``tracer.py``: a compiled region of
``fusegrad.compiler`` compiles the call, falling back to the same engine for whatever it cannot
compile).  This sits above the engine and the op surface, which is why ``Tensor.backward`` is
installed from here rather than defined in ``tensor.py`` (as the op surface installs the methods
that run ops).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import storage as _storage
from ..errors import AutogradError, ShapeError
from ..ops.creation import zeros_like
from ..tensor import Tensor
from .engine import run_backward
from .tracer import notify_created as _created
from .tracer import state as _tracer_state

__all__ = ["backward", "grad"]


def _as_tuple(x: Any) -> tuple:
    if x is None:
        return ()
    if isinstance(x, (list, tuple)):
        return tuple(x)
    return (x,)


def _make_grads(outputs: tuple, grad_outputs: tuple, create_graph: bool) -> list:
    if grad_outputs and len(grad_outputs) != len(outputs):
        raise AutogradError(
            f"grad requires one gradient per output: got {len(grad_outputs)} gradients for "
            f"{len(outputs)} outputs"
        )
    grads = []
    for i, out in enumerate(outputs):
        g = grad_outputs[i] if grad_outputs else None
        if g is None:
            if out._dtype.category == 3:
                raise AutogradError(
                    "grad can be implicitly created only for real scalar outputs (output "
                    f"{i} is {out._dtype.name}); pass a gradient, or take .real or .abs() first"
                )
            if out.numel() != 1:
                raise AutogradError(
                    "grad can be implicitly created only for scalar outputs (output "
                    f"{i} has shape {tuple(out.shape)}); pass a gradient of that shape"
                )
            g = _created(Tensor._make(_storage.full_like(out._data, 1)))
        else:
            if not isinstance(g, Tensor):
                g = Tensor._make(np.asarray(g, dtype=out.dtype.np))
            if g.shape != out.shape:
                raise ShapeError(
                    f"Mismatch in shape: grad_output[{i}] has a shape of {g.shape} and "
                    f"output[{i}] has a shape of {out.shape}."
                )
            if g.dtype.category < 2:
                raise AutogradError(
                    f"grad_output[{i}] must be a floating point or complex tensor, got "
                    f"{g.dtype.name}"
                )
            if g._dtype.category == 3 and out._dtype.category != 3:
                raise AutogradError(
                    f"grad_output[{i}] is {g.dtype.name} but output[{i}] is {out.dtype.name}: "
                    "a real output takes a real gradient"
                )
            if not create_graph:
                g = g.detach()
            if g._dtype is not out._dtype:
                # the engine's buffers and ``.grad`` keep the dtype of what they belong to
                g = g.to(out._dtype)
        grads.append(g)
    return grads


def _check_roots(outputs: tuple) -> None:
    for i, out in enumerate(outputs):
        if not out.requires_grad:
            raise AutogradError(
                f"element {i} of tensors does not require grad and does not have a grad_fn"
            )


def _run(
    outputs: tuple,
    grads: list,
    retain_graph: bool,
    create_graph: bool,
    inputs: tuple | None,
    accumulate: bool,
) -> list | None:
    tracer = _tracer_state.tracer
    if tracer is not None:
        result = tracer.backward(outputs, grads, retain_graph, create_graph, inputs, accumulate)
        if result is not NotImplemented:
            return result  # type: ignore[no-any-return]
    return run_backward(outputs, grads, retain_graph, create_graph, inputs, accumulate)


def backward(
    tensors: Any,
    grad_tensors: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    inputs: Any = None,
) -> None:
    """Accumulate gradients of ``tensors`` into the ``.grad`` of leaves (or of ``inputs``)."""
    outputs = _as_tuple(tensors)
    grad_outputs = _as_tuple(grad_tensors)
    if retain_graph is None:
        retain_graph = create_graph
    _check_roots(outputs)
    grads = _make_grads(outputs, grad_outputs, create_graph)
    ins = _as_tuple(inputs) if inputs is not None else None
    if ins is not None:
        if not ins:
            raise AutogradError("backward: 'inputs' argument to backward() cannot be empty.")
        for t in ins:
            if not t.requires_grad:
                raise AutogradError(
                    "backward: One of the differentiated Tensors does not require grad"
                )
    _run(outputs, grads, retain_graph, create_graph, ins, True)


def grad(
    outputs: Any,
    inputs: Any,
    grad_outputs: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    allow_unused: bool | None = None,
    is_grads_batched: bool = False,
    materialize_grads: bool = False,
) -> tuple:
    """Gradients of ``outputs`` with respect to ``inputs``, without touching ``.grad``."""
    outs = _as_tuple(outputs)
    ins = _as_tuple(inputs)
    if is_grads_batched:
        raise NotImplementedError("grad: is_grads_batched is not supported")
    if allow_unused is None:
        allow_unused = materialize_grads
    if materialize_grads and allow_unused is False:
        raise ValueError(
            "grad: Expected allow_unused to be True or not passed when materialize_grads=True"
        )
    if retain_graph is None:
        retain_graph = create_graph
    if not ins:
        raise AutogradError("grad requires non-empty inputs.")
    _check_roots(outs)
    for t in ins:
        if not isinstance(t, Tensor):
            raise TypeError(f"grad: inputs must be Tensors, got {type(t).__name__}")
        if not t.requires_grad:
            raise AutogradError("One of the differentiated Tensors does not require grad")
    grads = _make_grads(outs, _as_tuple(grad_outputs), create_graph)
    result = _run(outs, grads, retain_graph, create_graph, ins, False) or [None] * len(ins)
    final = []
    for t, g in zip(ins, result):
        if g is None:
            if materialize_grads:
                g = zeros_like(t)
            elif not allow_unused:
                raise AutogradError(
                    "One of the differentiated Tensors appears to not have been used in the "
                    "graph. Set allow_unused=True if this is the desired behavior."
                )
        final.append(g)
    return tuple(final)


def _tensor_backward(
    self: Tensor,
    gradient: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    inputs: Any = None,
) -> None:
    """Accumulate the gradient of this tensor into the ``.grad`` of leaves (or of ``inputs``)."""
    backward(self, gradient, retain_graph, create_graph, inputs=inputs)


_tensor_backward.__name__, _tensor_backward.__qualname__ = "backward", "Tensor.backward"
Tensor.backward = _tensor_backward  # type: ignore[method-assign]
