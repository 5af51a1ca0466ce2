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
    if not aliases:
        lean = _with_out(fn, params)
        if lean is not None:
            return lean

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


_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _with_out(fn: Any, params: dict) -> Any:
    """``fn`` taking ``out=`` too, as a function with ``fn``'s own parameters and a keyword-only
    ``out`` (written out and compiled here), so that a call without ``out=`` is one plain call
    of ``fn``: no packing of ``*args``/``**kwargs`` (a tenth of a microsecond per call, on every
    ``x.exp()`` and every ``.conj()`` of the derivative rules).  None where ``fn``'s parameters
    cannot be spelled so (``*args``, ``**kwargs``) or ``fn`` wraps another function (its
    signature is the wrapped one's; the generic wrapper passes the call on as it is)."""
    if hasattr(fn, "__wrapped__") or not params:
        return None
    kinds = [p.kind for p in params.values()]
    if any(k not in (*_KINDS, inspect.Parameter.KEYWORD_ONLY) for k in kinds):
        return None
    if any(not name.isidentifier() or name.startswith("_fg_") for name in params):
        return None
    namespace: dict = {"_fg_fn": fn, "_fg_write_out": write_out, "_fg_name": fn.__name__}
    signature, arguments = [], []
    last_positional_only = max(
        (i for i, k in enumerate(kinds) if k is inspect.Parameter.POSITIONAL_ONLY), default=-1
    )
    for i, (name, p) in enumerate(params.items()):
        if p.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in signature:
            signature.append("*")
        if p.default is p.empty:
            signature.append(name)
        else:
            namespace[f"_fg_default{i}"] = p.default
            signature.append(f"{name}=_fg_default{i}")
        arguments.append(name if p.kind in _KINDS else f"{name}={name}")
        if i == last_positional_only:
            signature.append("/")
    if "*" not in signature:
        signature.append("*")
    signature.append("out=None")
    call = f"_fg_fn({', '.join(arguments)})"
    source = (
        f"def _fg_call({', '.join(signature)}):\n"
        f"    if out is None:\n"
        f"        return {call}\n"
        f"    return _fg_write_out(_fg_name, {call}, out)\n"
    )
    exec(compile(source, f"<fusegrad.ops.spellings: {fn.__name__} with out=>", "exec"), namespace)
    return functools.wraps(fn)(namespace["_fg_call"])


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
