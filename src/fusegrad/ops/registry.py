"""THE op registry: one record per primitive, and ``apply``, the single place where a primitive
runs and, when autograd needs it, a backward node is recorded.

A primitive record holds its eager kernel (numpy arrays in, array out; calls with a CUDA input
go to ``fusegrad.cuda.ops`` instead, which runs the primitive's CUDA kernel), its kind
(elementwise | reduce | movement | opaque) and the names of its tensor inputs.  Its derivative
rule lives in ``autograd/derivatives.py`` (``RULES``) and is looked up by name; the compiler adds
a lowering per primitive.  Composites (sigmoid-free ops such as softmax, layer_norm, ...) never
appear here: they are written in the op surface over these primitives.

``apply`` sends every call to this thread's tracer first, when one is installed
(``autograd.tracer``, the eager core's one extension point): the compiler's capture records
derivative rules written in the op surface as IR instead of computing them (DESIGN.md contract
3), and its compiled regions record forwards.  ``run`` is the eager execution proper.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..autograd import grad_mode
from ..autograd.tracer import state as _tracer_state
from ..cuda.array import CudaArray
from ..errors import AutogradError


@dataclass(frozen=True, slots=True)
class Primitive:
    name: str
    kind: str  # "elementwise" | "reduce" | "movement" | "opaque"
    inputs: tuple[str, ...]  # names of the tensor inputs ("*" suffix: variadic)
    kernel: Callable[..., Any]
    differentiable: bool = True
    variadic: bool = False
    doc: str = field(default="", compare=False)
    # shape/dtype rule: ``meta(shapes, dtypes, **attrs) -> (shape, dtype)`` over the inputs'
    # shapes and fusegrad dtypes, without data.  Used by the compiler's capture (symbolic values
    # have shapes but no data) and by the IR verifier; set with ``set_meta``.
    meta: Callable[..., tuple] | None = field(default=None, compare=False)
    # the attributes that hold sizes (a shape, an index key's slice bounds and ints, pad widths),
    # as opposed to dims, flags and dtypes: a capture may treat them as symbols, so that a graph
    # holds for other sizes (``fusegrad.compiler.symbolic``); set with ``set_meta``
    size_attrs: tuple[str, ...] = field(default=(), compare=False)


REGISTRY: dict[str, Primitive] = {}


@dataclass(frozen=True, slots=True)
class Rule:
    """A derivative rule: ``fn(node, g, *saved) -> tuple of input gradients``.

    ``save`` names what the rule needs: forward input names, or ``"out"`` for the output.
    ``save_index`` maps those names to input positions (>= 0) or outputs (-1 is output 0)."""

    prim: str
    fn: Callable[..., tuple]
    save: tuple[str, ...]
    save_index: tuple[int, ...]


RULES: dict[str, Rule] = {}


def primitive(
    name: str, kind: str, inputs: str, *, differentiable: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``kernel`` as the eager implementation of primitive ``name``."""
    names = tuple(inputs.split())
    variadic = bool(names) and names[-1].endswith("*")

    def register(kernel: Callable[..., Any]) -> Callable[..., Any]:
        if name in REGISTRY:
            raise ValueError(f"primitive {name!r} registered twice")
        REGISTRY[name] = Primitive(
            name, kind, names, kernel, differentiable, variadic, kernel.__doc__ or ""
        )
        return kernel

    return register


class DataDependentShape(Exception):
    """A primitive's output shape depends on input *values* (boolean-mask indexing)."""


def set_meta(name: str, fn: Callable[..., tuple], size_attrs: tuple[str, ...] = ()) -> None:
    """Attach the shape/dtype rule of primitive ``name`` and name its size attributes (see
    ``Primitive.meta`` and ``Primitive.size_attrs``)."""
    import dataclasses

    REGISTRY[name] = dataclasses.replace(REGISTRY[name], meta=fn, size_attrs=size_attrs)


def vjp(name: str, save: str = "") -> Callable[[Callable[..., tuple]], Callable[..., tuple]]:
    """Register the derivative rule of primitive ``name`` (see ``Rule``)."""
    prim = REGISTRY[name]
    names = tuple(save.split())
    index = []
    for n in names:
        if n == "out":
            index.append(-1)
        elif n in prim.inputs:
            index.append(prim.inputs.index(n))
        else:
            raise ValueError(f"rule for {name!r} saves unknown value {n!r}")

    def register(fn: Callable[..., tuple]) -> Callable[..., tuple]:
        if name in RULES:
            raise ValueError(f"rule for {name!r} registered twice")
        RULES[name] = Rule(name, fn, names, tuple(index))
        return fn

    return register


def apply(prim: Primitive, inputs: tuple, attrs: dict) -> Any:
    """Run ``prim`` on Tensors ``inputs`` with keyword ``attrs`` (recording a node if needed),
    or hand the call to this thread's tracer when one is installed."""
    tracer = _tracer_state.tracer
    if tracer is not None:
        result = tracer.apply(prim, inputs, attrs)
        if result is not NotImplemented:
            return result
    return run(prim, inputs, attrs)


def run(prim: Primitive, inputs: tuple, attrs: dict) -> Any:
    """Eager execution of ``prim``: its kernel on the arrays, and a backward node when grad mode
    is on and an input requires grad.

    This is the hot path of eager execution: keep it free of per-call imports and checks that
    the op surface has already done."""
    arrays = [t._data for t in inputs]
    for a in arrays:
        if type(a) is CudaArray:  # a CUDA tensor: the device runs it
            data = _device_run(prim, arrays, attrs)
            break
    else:
        data = prim.kernel(*arrays, **attrs)
        if type(data) is not np.ndarray and type(data) is not CudaArray:  # (to_device makes one)
            data = np.asarray(data)
    out = _make(data)
    if prim.differentiable and grad_mode._state.enabled:
        for t in inputs:
            if t._requires_grad or t.grad_fn is not None:
                break
        else:
            return out
        rule = RULES.get(prim.name)
        if rule is None:
            raise AutogradError(f"{prim.name}: no derivative rule is registered")
        node = _OpNode(prim, rule, attrs, inputs, (out,))
        out.grad_fn = node
        if _anomaly_state.enabled:
            _record_forward_trace(node)
    return out


def _device_run(prim: Primitive, arrays: list, attrs: dict) -> Any:
    from ..cuda.ops import run

    return run(prim, arrays, attrs)


def _bind_late() -> None:
    """Resolve names from modules that import this one (called once by ``fusegrad.ops``)."""
    global _make, _OpNode, _anomaly_state, _record_forward_trace
    from ..autograd import anomaly
    from ..autograd.node import OpNode
    from ..tensor import Tensor

    _make = Tensor._make
    _OpNode = OpNode
    _anomaly_state = anomaly._state
    _record_forward_trace = anomaly.record_forward_trace
