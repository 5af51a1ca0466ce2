"""Op-surface functions generated from primitive records: an elementwise primitive whose record
sets ``surface`` needs no hand-written function.

Where this sits: ``primitives.py`` registers the records; this module turns every record with a
``surface`` flag into a public function named after the primitive, with PyTorch's signature
(``name(input)`` or ``name(input, other)``); ``ops/__init__.py`` exports them and installs them as
``Tensor`` methods (``method``/``inplace``/``aliases`` flags), and ``autograd/derivatives.py``
calls them in rules like any hand-written op.

The flag says how operands are promoted (PyTorch's rules, ``dtypes.result_type``):

* ``"float"``: to their promoted dtype, integer and bool results going to the default float
  dtype (``exp``, ``sqrt``, ``atan2``, ``lgamma``, ...);
* ``"same"``: to their promoted dtype, whatever it is (``mul``, ``maximum``, ``eq``, ...).

Then shapes are checked to broadcast and the primitive runs through ``registry.apply``.  The
promotion helpers live here, not in ``elementwise.py``, because the hand-written surface
functions there (add with ``alpha``, div with ``rounding_mode``, ...) use them too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..autograd.forward_state import state as _forward_state
from ..autograd.tracer import state as _tracer_state
from ..autograd.tracer import tracer_threads as _tracer_threads
from ..tensor import Tensor
from ._util import P, apply, as_operand, broadcast_shape, cast, operand, scalar_tensor, to_tensor
from .registry import REGISTRY, Primitive, run

_ndarray = np.ndarray


def _fast_binary(name: str, a: Any, b: Any) -> Tensor | None:
    """The common cases without general promotion: two tensors of one dtype, or a float tensor
    and a Python int/float.  Returns None when the general path is needed.  (These are most of
    the calls that derivative rules make, so this is the eager backward's hot path.)"""
    if isinstance(a, Tensor):
        dt = a._dtype
        tb = type(b)
        if isinstance(b, Tensor):
            if b._dtype is not dt:
                return None
            x, y = a._data, b._data
            if (
                type(x) is _ndarray
                and type(y) is _ndarray
                and _forward_state.level is None
                and (not _tracer_threads or _tracer_state.calls is None)
            ):
                return _run_broadcast(P[name], a, b)
            if x.shape != y.shape:
                broadcast_shape(name, a, b)
            return apply(P[name], (a, b), {})
        if (tb is float or tb is int) and dt.category == 2:
            return apply(P[name], (a, scalar_tensor(b, dt)), {})
    elif isinstance(b, Tensor):
        ta = type(a)
        if (ta is float or ta is int) and b._dtype.category == 2:
            return apply(P[name], (scalar_tensor(a, b._dtype), b), {})
    return None


def _run_broadcast(prim: Primitive, a: Tensor, b: Tensor) -> Tensor:
    """``run(prim, (a, b), {})`` for numpy arrays whose shapes were not checked: numpy's ufunc
    says whether they broadcast (its rules are PyTorch's), and where they do not, the error is
    ``broadcast_shape``'s.  Reading two shapes to check them first costs a fifth of a small op
    (both are new tuples)."""
    try:
        return run(prim, (a, b), {})
    except ValueError:
        broadcast_shape(prim.name, a, b)  # (raises if that was the cause)
        raise


def _binary(name: str, a: Any, b: Any, dtype: _dt.dtype | None = None) -> Tensor:
    if dtype is None:
        out = _fast_binary(name, a, b)
        if out is not None:
            return out
    a, b = operand(a), operand(b)
    dt = dtype if dtype is not None else _dt.result_type(a, b)
    a, b = as_operand(a, dt), as_operand(b, dt)
    broadcast_shape(name, a, b)
    return apply(P[name], (a, b), {})


def _float_binary(name: str, a: Any, b: Any) -> Tensor:
    a, b = operand(a), operand(b)
    dt = _dt.result_type(a, b)
    if dt.category < 2:
        dt = _dt.get_default_dtype()
    return _binary(name, a, b, dt)


def _float_unary(name: str, x: Any) -> Tensor:
    x = to_tensor(x)
    if x._dtype.category < 2:
        x = cast(x, _dt.get_default_dtype())
    return apply(P[name], (x,), {})


def _same_unary(name: str, x: Any) -> Tensor:
    return apply(P[name], (to_tensor(x),), {})


_PROMOTE: dict[tuple[str, int], Callable[..., Tensor]] = {
    ("float", 1): _float_unary,
    ("same", 1): _same_unary,
    ("float", 2): _float_binary,
    ("same", 2): _binary,
}


def surface_function(prim: Primitive) -> Callable[..., Tensor]:
    """The op-surface function of ``prim`` (a record with ``surface`` set).

    Each function first tries the commonest call in line -- a float tensor for a "float"
    unary, any tensor for a "same" unary, two tensors of one dtype for a binary ("float": a
    floating one) -- which the promotion helper would pass through unchanged, and runs the
    primitive without the helper's frames (``registry.run`` directly when no forward-AD level
    and no tracer wants the call, as ``registry.apply`` would decide).  Everything else goes
    through the helper."""
    name = prim.name
    promote = _PROMOTE.get((prim.surface or "", len(prim.inputs)))
    if promote is None:
        raise ValueError(
            f"{name}: no generated surface for surface={prim.surface!r} with "
            f"{len(prim.inputs)} inputs (write it by hand and leave the flag unset)"
        )
    how = "integers and bools promoted to the default float dtype"
    if prim.surface == "same":
        how = "in the operands' promoted dtype"
    min_category = 2 if prim.surface == "float" else 0
    if len(prim.inputs) == 1:

        def op(input: Any) -> Tensor:
            if isinstance(input, Tensor) and input._dtype.category >= min_category:
                if _forward_state.level is None and (
                    not _tracer_threads or _tracer_state.calls is None
                ):
                    return run(prim, (input,), {})
                return apply(prim, (input,), {})
            return promote(name, input)

        op.__doc__ = f"``{name}`` of ``input``, elementwise ({how})."
    else:

        def op(input: Any, other: Any) -> Tensor:  # type: ignore[misc]
            if (
                isinstance(input, Tensor)
                and isinstance(other, Tensor)
                and input._dtype is other._dtype
                and input._dtype.category >= min_category
            ):
                a, b = input._data, other._data
                if _forward_state.level is None and (
                    not _tracer_threads or _tracer_state.calls is None
                ):
                    if type(a) is _ndarray and type(b) is _ndarray:
                        try:  # (``_run_broadcast`` in line: the derivative rules' products)
                            return run(prim, (input, other), {})
                        except ValueError:
                            broadcast_shape(name, input, other)
                            raise
                    if a.shape != b.shape and a.ndim and b.ndim:  # (0-d always broadcasts)
                        broadcast_shape(name, input, other)
                    return run(prim, (input, other), {})
                if a.shape != b.shape and a.ndim and b.ndim:
                    broadcast_shape(name, input, other)
                return apply(prim, (input, other), {})
            return promote(name, input, other)

        op.__doc__ = f"``{name}`` of ``input`` and ``other``, broadcast, elementwise ({how})."
    op.__name__ = op.__qualname__ = name
    return op


__all__: list[str] = []
for _prim in list(REGISTRY.values()):
    if _prim.surface is not None:
        globals()[_prim.name] = surface_function(_prim)
        __all__.append(_prim.name)
