"""The argument spellings PyTorch accepts beyond an op's own signature: numpy's names
(``axis=`` for ``dim=``, ``keepdims=`` for ``keepdim=``, as PyTorch's argument parser maps
them for every op) and ``out=`` on the top-level functions (the result written into the given
tensor, resized if its shape differs, as PyTorch does for an empty one).

``ops/__init__.py`` wraps the op surface with ``adapt`` once its methods are installed: a
function or method gets only the spellings its signature lacks, and a call that uses none of
them costs one dict check.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from ..autograd import grad_mode as _grad_mode
from ..errors import ArgumentError, AutogradError
from ..tensor import Tensor

_ALIASES = (("axis", "dim"), ("keepdims", "keepdim"))


def _parameters(fn: Any) -> dict | None:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def adapt(fn: Any, out: bool) -> Any:
    """``fn`` accepting numpy's names where it takes ``dim``/``keepdim`` and, with ``out``,
    an ``out=`` tensor (or tuple of tensors) where its signature has none."""
    params = _parameters(fn)
    if params is None:
        return fn
    aliases = tuple((alias, name) for alias, name in _ALIASES if name in params)
    add_out = out and "out" not in params
    if not aliases and not add_out:
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not kwargs:
            return fn(*args)
        for alias, name in aliases:
            if alias in kwargs:
                if name in kwargs:
                    raise TypeError(f"{fn.__name__}() got both '{name}' and its alias '{alias}'")
                kwargs[name] = kwargs.pop(alias)
        target = kwargs.pop("out", None) if add_out else None
        result = fn(*args, **kwargs)
        if target is None:
            return result
        return write_out(fn.__name__, result, target)

    return call


def write_out(op: str, result: Any, target: Any) -> Any:
    """``result`` copied into ``target`` (a tensor, or a tuple of them for a tuple result), as
    PyTorch's ``out=``: shapes that differ resize ``target``; no autograd history."""
    if isinstance(result, tuple):
        if not isinstance(target, (tuple, list)) or len(target) != len(result):
            raise ArgumentError(f"{op}: out= needs {len(result)} tensors for its results")
        for r, t in zip(result, target):
            write_out(op, r, t)
        return result._make(target) if hasattr(result, "_fields") else tuple(target)
    if not isinstance(target, Tensor):
        raise TypeError(f"{op}(): argument 'out' must be Tensor, not {type(target).__name__}")
    if isinstance(result, Tensor) and result.requires_grad and _grad_mode.is_grad_enabled():
        raise AutogradError(
            f"{op}(): functions with out=... arguments don't support automatic differentiation, "
            "but one of the arguments requires grad."
        )
    value = result if isinstance(result, Tensor) else Tensor(result)
    if tuple(target.shape) != tuple(value.shape):
        target.resize_(*value.shape)
    with _grad_mode.no_grad():
        target.copy_(value)
    return target
