"""Views: the bookkeeping that makes a view op's result a view of its base.

A result that numpy can express as a view shares storage and the version counter with its base
and records how to rebuild it from there (``_as_view``, run by ``_view_op`` for every view op of
the shape and indexing surfaces).  After an in-place change, the view's ``grad_fn`` is regenerated
by replaying those view primitives on the base (``replay_view``; ``view_grad_fn`` is the lazy
``_ViewTensor.grad_fn`` that ``ops._install_methods`` installs), and an in-place op on a view
writes its result into the base's history at the view's positions (``view_positions``, used by
``ops.inplace``).  Below ``shape.py`` and ``indexing.py``, which both make views.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .. import storage as _storage
from ..autograd import grad_mode as _grad_mode
from ..autograd.tracer import notify_created as _created
from ..tensor import (
    DEFAULT,
    INFERENCE,
    NO_GRAD,
    Tensor,
    _ViewInfo,
    _ViewTensor,
    view_rebase_error,
)
from ._util import P, apply


def _as_view(out: Tensor, base: Tensor, prim: str, attrs: dict) -> Tensor:
    """Mark ``out``, the result of view primitive ``prim`` with ``attrs`` on ``base``, as a view
    of ``base`` (reshape only when numpy did not have to copy).

    A view shares the version counter, records its root base (views of views point at the
    root) and the steps that rebuild it from there (``replay_view``), and how it was created
    (grad mode / inference mode), which decides whether its history may be rewritten later.
    This runs for every view op, so it keeps to attribute reads (one thread-local read in grad
    mode; attrs are kept as the op's own dict, never mutated)."""
    if type(out) is not Tensor:
        return out  # a compiler's symbolic value
    if prim == "reshape" and not _storage.may_share_memory(out._data, base._data):
        return out  # numpy copied
    state = _grad_mode._state
    creation = DEFAULT if state.enabled else INFERENCE if state.inference else NO_GRAD
    if base._base is None:
        root, steps = base, ((prim, attrs),)
    else:
        root = base._base
        parent = getattr(base, "_view_info", None)
        if parent is None:
            # a view of an alias that cannot be replayed (a custom Function's output): the
            # child cannot be rebuilt either, so it gets no view info (in-place on it raises)
            out._version_counter = base._version_counter
            out._base = root
            out._inference = base._inference
            return out
        steps = (*parent.steps, (prim, attrs))
        # PyTorch's propagate_creation_meta: a restriction of the parent carries over
        if creation is DEFAULT or parent.creation is INFERENCE:
            creation = parent.creation
    counter = base._version_counter
    out._version_counter = counter
    out._base = root
    # a view of a normal tensor is normal, even if made in inference mode; one of an inference
    # tensor is an inference tensor
    out._inference = base._inference
    out._view_info = _ViewInfo(steps, creation, out.grad_fn, counter.value)
    out.grad_fn = None  # from here on the node lives in the view info (the slot is shadowed)
    out.__class__ = _ViewTensor  # its grad_fn becomes lazy (same layout: no new slots)
    return out


def _view_op(x: Tensor, prim: str, attrs: dict) -> Tensor:
    """Run view primitive ``prim`` on ``x`` and mark the result as a view of ``x``."""
    return _as_view(apply(P[prim], (x,), attrs), x, prim, attrs)


def replay_view(base: Tensor, steps: tuple) -> Tensor:
    """Rebuild a view from its root base by running its view primitives again (recording
    nodes when grad mode is on).  The result is a plain tensor, not marked as a view: callers
    use its value and ``grad_fn``."""
    out = base
    for prim, attrs in steps:
        out = apply(P[prim], (out,), attrs)
    return out


def _positions(shape: tuple, steps: tuple) -> tuple:
    """Where a view's elements sit in its base: one read-only int64 array per base dim, each of
    the view's shape (an advanced-indexing key).  Found by replaying the view steps on the
    numbers 0..n-1 laid out in the base's shape.  ``steps`` as in ``view_positions``, with the
    attribute dicts as sorted item tuples (hashable)."""
    ids = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    for prim, attrs in steps:
        ids = P[prim].kernel(ids, **dict(attrs))
    # np.array: unravel_index gives numpy scalars for a 0-d view
    coords = np.unravel_index(ids, shape) if shape else ()  # a 0-d base: the key ()
    arrays = tuple(np.array(a, dtype=np.int64) for a in coords)
    for a in arrays:
        a.flags.writeable = False  # cached: shared by every caller
    return tuple(arrays)


# Positions of views of small bases are cached (a loop writing rows of a buffer asks for the same
# ones again and again); large bases are not, which bounds the cache (32 entries of at most 16k
# int64 per base dimension).
_cached_positions = functools.lru_cache(maxsize=32)(_positions)
_CACHED_BASE_SIZE = 1 << 14


def view_positions(base: Tensor, steps: tuple) -> tuple[tuple, tuple]:
    """``(index tensors, key spec)`` selecting a view's elements in its base: ``index_put`` with
    this key writes a new value for the view into (a copy of) the base."""
    key = tuple((prim, tuple(sorted(attrs.items()))) for prim, attrs in steps)
    shape = tuple(base._data.shape)
    find = _cached_positions if base._data.size <= _CACHED_BASE_SIZE else _positions
    arrays = find(shape, key)
    return tuple(_created(Tensor._make(a)) for a in arrays), tuple(
        ("t", i) for i in range(len(arrays))
    )


def view_grad_fn(view: Tensor) -> Any:
    """``view.grad_fn``, regenerated from the base when the shared version moved since it was
    set (PyTorch's ``VariableHooks::grad_fn``): the base, or another view of it, was modified in
    place, which may have given the base a new history.  The view ops are replayed on the base
    with grad mode on, so the view's node is e.g. ``GetitemBackward0`` feeding the base's current
    node; a ``retain_grad`` moves to it, other tensor hooks stay with the old node."""
    info = view._view_info
    if info.attr_version == view._version_counter.value:
        return info.node
    base = view._base
    if info.node is None and not base.requires_grad:
        return None  # nothing to regenerate (checked again once the base requires grad)
    if info.creation is not DEFAULT:
        raise view_rebase_error(view, info, indirect=True)
    state = _grad_mode._state
    enabled, state.enabled = state.enabled, True  # also when read with grad mode off (engine)
    try:
        fresh = replay_view(base, info.steps)
    finally:
        state.enabled = enabled
    view._set_history(fresh.grad_fn, fresh._output_nr)
    return fresh.grad_fn


def set_view_grad_fn(view: Tensor, node: Any) -> None:
    info = view._view_info
    info.node = node
    info.attr_version = view._version_counter.value
