"""``Parameter``: a Tensor that a ``Module`` registers as one of its learnable weights.

A Parameter is an ordinary leaf Tensor (a subclass, so ``isinstance(p, Tensor)`` holds) whose
``requires_grad`` defaults to True.  Assigning one to a Module attribute registers it (see
``module.py``).  Wrapping an existing tensor shares its storage and version counter, as
``torch.nn.Parameter(t)`` does, so ``Parameter(t)`` and ``t`` see each other's in-place updates.
Op results computed from a Parameter are plain Tensors (the registry builds ``Tensor`` outputs).
"""

from __future__ import annotations

from typing import Any, SupportsIndex

import numpy as np

from .. import dtypes as _dt
from ..tensor import Tensor, _rebuild, _to_array


class Parameter(Tensor):
    """A learnable tensor: ``Parameter(data=None, requires_grad=True)``."""

    def __init__(self, data: Any = None, requires_grad: bool = True) -> None:
        if data is None:
            arr = np.empty((0,), _dt.get_default_dtype().np)
            self._init(arr)
        elif isinstance(data, Tensor):
            # share storage and version counter: Parameter(t) is t.detach() re-typed
            self._init(data._data)
            self._version_counter = data._version_counter
        else:
            self._init(_to_array(data))
        self.requires_grad_(requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo: dict) -> Parameter:
        if id(self) in memo:
            return memo[id(self)]
        p = Parameter(Tensor._make(self._data.copy()), self.requires_grad)
        if self._grad is not None:
            p._grad = Tensor._make(self._grad._data.copy())
        memo[id(self)] = p
        return p

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        t = Tensor.__reduce_ex__(self, protocol)[1]  # (array, requires_grad[, device])
        return (_rebuild_parameter, t)


def _rebuild_parameter(arr: np.ndarray, requires_grad: bool, device: str = "cpu") -> Parameter:
    return Parameter(_rebuild(arr, False, device), requires_grad)


class Buffer(Tensor):
    """``nn.Buffer(data, persistent=True)``: marks a tensor to be registered as a buffer when
    assigned to a Module attribute (``self.stats = nn.Buffer(t)`` is
    ``self.register_buffer("stats", t, persistent)``).  The module holds the tensor itself,
    not this marker."""

    def __new__(cls, data: Any = None, *, persistent: bool = True) -> Buffer:  # type: ignore[misc]
        t = object.__new__(cls)
        if data is None:
            t._init(np.empty((0,), _dt.get_default_dtype().np))
        elif isinstance(data, Tensor):
            t._init(data._data)
            t._version_counter = data._version_counter
            t._requires_grad = data._requires_grad and data.grad_fn is None
            t.__dict__["_source"] = data
        else:
            t._init(_to_array(data))
        t.__dict__["persistent"] = persistent
        return t

    def __init__(self, data: Any = None, *, persistent: bool = True) -> None:
        pass  # (made by __new__)


def is_parameter(obj: object) -> bool:
    return isinstance(obj, Parameter)
