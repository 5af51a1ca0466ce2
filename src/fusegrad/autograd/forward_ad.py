"""``fusegrad.autograd.forward_ad``: forward-mode automatic differentiation with dual tensors,
as ``torch.autograd.forward_ad``.

Inside a dual level (``with dual_level():``), ``make_dual(primal, tangent)`` gives a tensor that
carries a tangent; every primitive applied to tensors with tangents computes its output's
tangent with its Jacobian-vector product rule (``autograd/jvps.py``, one rule per primitive,
found by name like the VJP rules of ``derivatives.py``), and ``unpack_dual(t)`` reads
``(primal, tangent)`` back.  Composites are made of primitives, so they need no rules.  Leaving
the level drops every tangent made in it.

How it hooks in: ``ops.registry.apply`` reads one attribute, ``forward_state.state.level``, per
primitive call; only while a level exists does it hand the call to the level's ``apply``
(below), as saved tensors and in-place ops call its other methods (and the engine adds fan-in
gradients with ops rather than arrays).  So forward AD costs nothing when it is not used, and
the layers below the op surface need not import this module.  JVP rules are written in the op
surface: they are ordinary ops, recorded by the reverse-mode engine when grad mode is on
(reverse over forward) and by a compiler tracer when one is installed.  While a rule (or the
primitive itself) runs, forward AD is suspended on this thread, so that the rule's own ops do
not compute tangents of tangents.  A compiled function that enters a dual level itself records
the JVP ops with the rest and replays them; compiled functions, modules and backward passes
called while a dual level exists run eagerly (a replayed program would not compute tangents).

As in PyTorch:

* there is one dual level at a time (entering a second raises "Nested forward mode AD is not
  supported at the moment"); the level is process-wide, not per thread;
* forward AD is independent of grad mode: it works under ``no_grad`` too;
* a view of a dual tensor has the same view of the tangent as its tangent (they share memory),
  and a view of a tensor whose base gets a tangent later sees the base's tangent;
* an in-place op on a dual tensor updates its tangent in place (so views see the change); an
  in-place op that writes a dual value into a tensor without a tangent gives it one (a view's
  base gets a zero tangent first, the view's part of it then written);
* ``detach()`` drops the tangent; non-differentiable results (comparisons, ``argmax``, integer
  results) have none.

Reverse mode sees tangents too: the backward rules are ops, so differentiating a dual
computation in reverse mode inside the level propagates tangents through the gradient
(forward over reverse, how ``functional.hessian(..., outer_jacobian_strategy="forward-mode")``
works).  Outputs saved for backward keep their tangent for that (``saved_output_tangent``).

Custom ``autograd.Function``s take part through their ``jvp`` staticmethod (tangents of the
inputs, None where there is none, to tangents of the outputs; ``ctx.save_for_forward`` keeps
what it needs); their forward runs without forward AD, and one without ``jvp`` raises as in
PyTorch.  ``dual_level`` is one level at a time, as in PyTorch's ``forward_ad``; higher-order
forward derivatives come from ``fusegrad.func`` (``jvp`` and ``jacfwd`` nest, and compose with
``vmap`` and the reverse-mode transforms).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections import namedtuple
from collections.abc import Iterator
from typing import Any

from .. import ops as F
from ..ops.views import replay_view
from ..tensor import Tensor
from . import grad_mode
from .forward_state import state as _state

__all__ = [
    "UnpackedDualTensor",
    "dual_level",
    "enter_dual_level",
    "exit_dual_level",
    "make_dual",
    "unpack_dual",
]


class _Level:
    """One dual level: which tensors hold a tangent in it, to drop the tangents when it ends
    (an entry leaves with its tensor)."""

    __slots__ = ("holders", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        self.holders: dict[int, weakref.ref] = {}

    # what the layers below the op surface call while this level exists (``forward_state``)
    def apply(self, prim: Any, inputs: tuple, attrs: dict, rules: dict, inner: Any) -> Any:
        return apply_dual(prim, inputs, attrs, rules, inner)

    def saved_output_tangent(self, saved: Any, out: Tensor) -> None:
        saved_output_tangent(saved, out)

    def carry_tangent(self, dst: Tensor, src: Tensor) -> None:
        carry_tangent(dst, src)

    def inplace_update(self, target: Tensor, result: Tensor) -> None:
        inplace_update(target, result)


class _Local(threading.local):
    def __init__(self) -> None:
        # True while a primitive or a JVP rule runs on this thread (their ops get no tangents)
        self.suspended = False


_local = _Local()

_TANGENT = "_fw_grad"  # the tensor attribute (in its __dict__) holding ``(level, tangent)``


# ---- levels ------------------------------------------------------------------------------------


def enter_dual_level() -> int:
    """Start the dual level (there can be only one) and return its index."""
    if _state.level is not None:
        raise RuntimeError("Nested forward mode AD is not supported at the moment")
    _state.level = _Level(0)
    return 0


def exit_dual_level(*, level: int | None = None) -> None:
    """End the dual level: every tangent made in it is dropped."""
    current = _state.level
    if level is None:
        level = current.index if current is not None else -1
    if level < 0:
        raise RuntimeError("Dual level must be a positive number.")
    if current is None or level != current.index:
        raise RuntimeError(
            "Trying to exit a forward AD level that was not the last one that was created. This "
            "is not supported."
        )
    _state.level = None
    refs = list(current.holders.values())
    current.holders.clear()  # (dropping a tangent may free tensors, whose entries then go)
    for ref in refs:
        t = ref()
        if t is not None:
            t.__dict__.pop(_TANGENT, None)


class dual_level:
    """Context manager (and decorator) for a dual level: ``with dual_level(): ...``; the
    ``as`` target is the level's index."""

    def __enter__(self) -> int:
        return enter_dual_level()

    def __exit__(self, *exc: Any) -> None:
        exit_dual_level()

    def __call__(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with dual_level():
                return fn(*args, **kwargs)

        return wrapper


# ---- tangents on tensors -----------------------------------------------------------------------


def _set_tangent(t: Tensor, tangent: Tensor | None, level: _Level, follow: bool = True) -> None:
    """``t``'s tangent at ``level`` becomes ``tangent``.  A tensor that stands for another one
    (a ``vmap`` sample, whose batch holds the values the engine differentiates) is told, so
    that the other gets the matching tangent (``_tangent_follows``; not with ``follow`` off,
    what it calls when the tangent comes from the other)."""
    try:
        t.__dict__[_TANGENT] = (level, tangent)
    except AttributeError:  # a compiler's symbolic value without a __dict__
        return
    if follow:
        follows = getattr(t, "_tangent_follows", None)
        if follows is not None:
            suspended, _local.suspended = _local.suspended, True
            try:
                follows(tangent, level)
            finally:
                _local.suspended = suspended
    key, holders = id(t), level.holders

    def forget(ref: weakref.ref) -> None:  # the tensor died: its entry goes (bounded memory)
        if holders.get(key) is ref:
            del holders[key]

    holders[key] = weakref.ref(t, forget)


def _tangent(t: Any, level: _Level) -> Tensor | None:
    """``t``'s tangent at ``level``, or None.  A view without a tangent of its own whose base
    has one takes the same view of the base's tangent (made once, then kept)."""
    d = getattr(t, "__dict__", None)
    if d is None:
        return None
    record = d.get(_TANGENT)
    if record is not None and record[0] is level:
        return record[1]  # (None: marked as having none, e.g. unpack_dual's primal)
    base = getattr(t, "_base", None)
    if base is None or not level.holders:
        return None
    base_tangent = _tangent(base, level)  # a root base is never a view: one step at most
    info = getattr(t, "_view_info", None)
    if base_tangent is None or info is None:
        return None
    tangent = _replay(base_tangent, info.steps)
    _set_tangent(t, tangent, level)
    return tangent


def _replay(tangent: Tensor, steps: tuple) -> Tensor:
    suspended, _local.suspended = _local.suspended, True
    try:
        return replay_view(tangent, steps)
    finally:
        _local.suspended = suspended


def _conform(tangent: Any, out: Tensor) -> Tensor | None:
    """A rule's result as ``out``'s tangent: None for a non-float output; ``out``'s dtype and
    shape (a tangent that only broadcasts to it is materialised, so it can be written)."""
    if tangent is None or out.dtype.category < 2:  # (floating and complex ones have tangents)
        return None
    if tangent.dtype != out.dtype:
        if tangent.dtype.is_complex and not out.dtype.is_complex:
            tangent = tangent.real  # a real output of complex values: the real part
        tangent = F.cast(tangent, out.dtype)
    if tuple(tangent.shape) != tuple(out.shape):
        tangent = F.clone(tangent.broadcast_to(tuple(out.shape)))
    return tangent


def apply_dual(prim: Any, inputs: tuple, attrs: dict, rules: dict, inner: Any) -> Any:
    """A primitive call while a dual level exists (``ops.registry.apply``): ``inner`` computes
    the primal result; when an input has a tangent, the primitive's JVP rule computes the
    output's."""
    level = _state.level
    if _local.suspended or level is None:
        return inner(prim, inputs, attrs)
    tangents: list | None = None
    for i, t in enumerate(inputs):
        tangent = _tangent(t, level)
        if tangent is not None:
            if tangents is None:
                tangents = [None] * len(inputs)
            tangents[i] = tangent
    if tangents is None or not prim.differentiable:
        return inner(prim, inputs, attrs)
    rule = rules.get(prim.name)
    if rule is None:
        raise NotImplementedError(
            f"Trying to use forward AD with {prim.name} that does not support it because it has "
            "not been implemented yet (no JVP rule is registered for this fusegrad primitive)."
        )
    _local.suspended = True
    try:
        out = inner(prim, inputs, attrs)
        tangent = _conform(rule(inputs, tuple(tangents), out, attrs), out)
    finally:
        _local.suspended = False
    if tangent is not None:
        _set_tangent(out, tangent, level)
        node = getattr(out, "grad_fn", None)
        saved = getattr(node, "_saved", None)
        if saved:
            # the node's saved output is the tensor that records it: under ``vmap`` the
            # batch's, whose tangent is the whole batch's (``_recorded_by``), not one sample's
            recorded_by = getattr(out, "_recorded_by", None)
            own = tangent if recorded_by is None else _tangent(recorded_by(), level)
            for s in saved:
                if s._is_output:  # (it keeps only the output's data)
                    s._fw_tangent = (level, own)
    return out


def saved_output_tangent(saved: Any, out: Tensor) -> None:
    """Give ``out``, an output unpacked from saved tensor ``saved``, the tangent it had (so
    backward rules run inside the level propagate tangents: forward over reverse)."""
    level = _state.level
    entry = getattr(saved, "_fw_tangent", None)
    if entry is not None and entry[0] is level:
        _set_tangent(out, entry[1], level)


def carry_tangent(dst: Tensor, src: Tensor) -> None:
    """``dst`` (a copy of ``src`` an in-place op computes from) gets ``src``'s tangent."""
    level = _state.level
    if level is None:
        return
    tangent = _tangent(src, level)
    if tangent is not None:
        _set_tangent(dst, tangent, level)


def inplace_update(target: Tensor, result: Tensor) -> None:
    """After an in-place op wrote ``result`` into ``target``: the tangent of ``target`` becomes
    ``result``'s (written into ``target``'s existing tangent, so that views share the change;
    zeros where ``result`` has none but ``target`` had one)."""
    level = _state.level
    if level is None:
        return
    new = _tangent(result, level)
    current = _tangent(target, level)
    if new is None and current is None:
        return
    suspended, _local.suspended = _local.suspended, True
    try:
        if current is None and target._base is not None and hasattr(target, "_view_info"):
            base = target._base
            base_tangent = _tangent(base, level)
            if base_tangent is None:
                with grad_mode.no_grad():
                    base_tangent = F.zeros_like(base)
                _set_tangent(base, base_tangent, level)
            current = _tangent(target, level)  # the view of the base's tangent
        if current is None:
            if target.dtype.category < 2:
                return
            _set_tangent(target, _conform(new, target), level)
            return
        if new is None:
            new = F.zeros_like(current)
        if current.requires_grad and not new.requires_grad:
            with grad_mode.no_grad():
                current.copy_(new)
        else:
            current.copy_(new)
    finally:
        _local.suspended = suspended


# ---- custom Functions -------------------------------------------------------------------------


def tangents_of(args: tuple) -> list | None:
    """The tangents of a custom Function's arguments (None for each non-Tensor or tensor
    without one), or None when there is no dual level or no argument has a tangent."""
    level = _state.level
    if level is None or _local.suspended:
        return None
    tangents = [_tangent(a, level) if isinstance(a, Tensor) else None for a in args]
    return tangents if any(t is not None for t in tangents) else None


def active_level() -> _Level | None:
    """The dual level where tangents are being computed on this thread now (None when there is
    none, or while a primitive or a rule runs: then values get no tangents)."""
    return None if _local.suspended else _state.level


@contextlib.contextmanager
def suspended(active: bool = True) -> Iterator[None]:
    """Forward AD off on this thread for the block (where ``active``)."""
    if not active:
        yield
        return
    previous, _local.suspended = _local.suspended, True
    try:
        yield
    finally:
        _local.suspended = previous


def custom_function_jvp(cls: type, ctx: Any, tangents: list, outputs: list) -> None:
    """Give a custom Function's outputs the tangents its ``jvp`` computes from ``tangents`` (as
    PyTorch, a Function without one cannot be used with forward AD)."""
    level = _state.level
    ctx.__dict__["_in_jvp"] = True
    try:
        with suspended():
            result = cls.jvp(ctx, *tangents)
    finally:
        ctx.__dict__["_in_jvp"] = False
    results = result if isinstance(result, tuple) else (result,)
    tensor_outputs = [o for o in outputs if isinstance(o, Tensor)]
    if len(results) != len(outputs) and len(results) != len(tensor_outputs):
        raise RuntimeError(
            f"{cls.__name__}.jvp returned {len(results)} tangents for {len(outputs)} outputs: "
            "it must return one per output of forward"
        )
    pairs = zip(outputs if len(results) == len(outputs) else tensor_outputs, results)
    for out, tangent in pairs:
        if not isinstance(out, Tensor) or tangent is None:
            continue
        if tuple(tangent.shape) != tuple(out.shape):
            raise RuntimeError(
                f"{cls.__name__}.jvp returned a tangent of shape {list(tangent.shape)} for an "
                f"output of shape {list(out.shape)}"
            )
        if _tangent(out, level) is not None:  # an input modified in place (mark_dirty)
            inplace_update(out, _Carrier(tangent))
        else:
            _set_tangent(out, _conform(tangent, out), level)


class _Carrier:
    """Stands for a value whose tangent is ``tangent`` (``inplace_update``'s ``result``)."""

    def __init__(self, tangent: Tensor) -> None:
        self.__dict__[_TANGENT] = (_state.level, tangent)


# ---- dual tensors ------------------------------------------------------------------------------


UnpackedDualTensor = namedtuple("UnpackedDualTensor", ["primal", "tangent"])
UnpackedDualTensor.__doc__ = "What ``unpack_dual`` returns: ``primal`` and ``tangent`` (or None)."


def _current(level: int | None) -> _Level | None:
    current = _state.level
    if current is None or (level is not None and level != current.index):
        return None
    return current


def make_dual(tensor: Tensor, tangent: Tensor, *, level: int | None = None) -> Tensor:
    """A view of ``tensor`` that carries ``tangent`` (same shape; a floating dtype) at the
    dual level.  It stays differentiable in reverse mode with respect to ``tensor``."""
    current = _state.level
    if current is None:
        raise RuntimeError(
            "Trying to create a dual Tensor for forward AD but no level exists, make sure to "
            "enter_dual_level() first."
        )
    if level is not None and level != current.index:
        raise RuntimeError(
            f"make_dual: level {level} is not the current forward AD level {current.index}"
        )
    if not isinstance(tensor, Tensor) or not isinstance(tangent, Tensor):
        raise TypeError(
            "make_dual(): expected tensor and tangent to be Tensors, got "
            f"{type(tensor).__name__} and {type(tangent).__name__}"
        )
    if tensor.dtype.category < 2:
        raise ValueError(
            f"Expected primal to be floating point or complex, but got: {tensor.dtype}"
        )
    if tangent.dtype.category < 2:
        raise ValueError(
            f"Expected tangent to be floating point or complex, but got: {tangent.dtype}"
        )
    if tuple(tangent.shape) != tuple(tensor.shape):
        raise RuntimeError(
            "Trying to set a forward gradient that has a different size than that of the "
            f"original Tensor, this is not supported. Tensor is of size {list(tensor.shape)} "
            f"while the given forward gradient is of size {list(tangent.shape)}."
        )
    if _tangent(tensor, current) is not None:
        raise RuntimeError(
            "Making a dual Tensor based on a Tensor that already has a forward gradient at the "
            f"same level {current.index} is not supported."
        )
    suspended, _local.suspended = _local.suspended, True
    try:
        dual = tensor.view_as(tensor)
        if tangent.dtype != tensor.dtype:
            tangent = tangent.to(tensor.dtype)
    finally:
        _local.suspended = suspended
    _set_tangent(dual, tangent, current)
    return dual


def unpack_dual(tensor: Tensor, *, level: int | None = None) -> UnpackedDualTensor:
    """``(primal, tangent)`` of ``tensor``: the primal a view of it without a tangent, the
    tangent None where it has none (or no dual level exists): then the primal is ``tensor``."""
    current = _current(level)
    tangent = _tangent(tensor, current) if current is not None else None
    if tangent is None:
        return UnpackedDualTensor(tensor, None)
    suspended, _local.suspended = _local.suspended, True
    try:
        primal = tensor.view_as(tensor)
    finally:
        _local.suspended = suspended
    _set_tangent(primal, None, current)  # a view of a dual tensor, explicitly without tangent
    return UnpackedDualTensor(primal, tangent)
