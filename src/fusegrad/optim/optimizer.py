"""``Optimizer``: the base class of fusegrad's optimizers, with PyTorch's param-group model.

An optimizer holds ``param_groups`` (each a dict: ``params`` plus per-group options such as
``lr``, defaulted from the constructor's ``defaults``) and a per-parameter ``state`` dict.
Subclasses implement ``step``; they update parameters *in place* under ``no_grad`` with the
Tensor in-place methods, so the parameter objects (and any model holding them) keep their
identity, and every update bumps the parameter's version counter like PyTorch's does.

``state_dict()`` refers to parameters by their position across groups (0, 1, ...), so a saved
state can be loaded into a fresh optimizer over a fresh model of the same structure.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..autograd.grad_mode import enable_grad
from ..autograd.tracer import notify_created, opaque_method
from ..autograd.tracer import state as _tracer_state
from ..errors import FusegradError
from ..nn.module import _zero_grad
from ..ops._util import scalar_tensor
from ..tensor import Tensor


class OptimizerError(FusegradError, ValueError):
    """A bad optimizer argument, param group or state dict."""


class _RequiredParameter:
    """Marks an option (``lr`` for SGD in old PyTorch) that every param group must set."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


def _type_name(obj: object) -> str:
    if isinstance(obj, Tensor):
        return obj.type()  # type: ignore[attr-defined]
    return type(obj).__name__


def hyper(value: float, replay: Callable[[], float], key: Any = None) -> Any:
    """A scalar of the update that changes between steps (the learning rate, bias corrections):
    ``value`` itself in eager mode.  A tracer that records a step to replay it (whole-step
    compile) gets a 0-d Python-number tensor holding ``value`` that stands for ``replay()``: the
    value the next call of ``step`` would compute, evaluated *before* that call's tensor
    updates run (so a value derived from the step count adds the increment itself).  ``key``,
    when given, names what ``replay`` computes (say a param group's ``betas[1]``): scalars with
    one key are one runtime input of a recording, computed once per call."""
    if _tracer_state.tracer is None:
        return value

    def make(v: float) -> Tensor:
        return scalar_tensor(v, _dt.float64)

    def again() -> Tensor:
        return make(replay())

    again.runtime_scalar = True  # type: ignore[attr-defined]  (not a random draw)
    again.array = lambda: np.array(replay(), dtype=np.float64)  # type: ignore[attr-defined]
    again.key = key  # type: ignore[attr-defined]
    return notify_created(make(value), again)


class Optimizer:
    """Base class: ``Optimizer(params, defaults)``; subclasses define ``step``.

    A subclass whose ``step`` is written in tensor ops only (no ``.item()``; per-call scalars
    through ``hyper``) sets ``traceable = True``: a whole-step compile then records its update
    into the step's program; other optimizers' steps are replayed as calls."""

    traceable = False

    def state_pending(self) -> Tensor | None:
        """A parameter whose state the next ``step()`` will create (PyTorch's optimizers make
        it lazily, at the first step that sees the parameter's gradient), or None.  A
        whole-step compile runs such a call eagerly and records the next one.  This default
        answers for optimizers that keep state for every parameter; one that keeps none under
        some options says so by overriding it."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and not self.state.get(p):
                    return p
        return None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # ``step`` and ``zero_grad`` are calls a tracer may take over (a whole-step compile
        # replays them as calls: ``Tracer.opaque``)
        super().__init_subclass__(**kwargs)
        for name in ("step", "zero_grad"):
            fn = cls.__dict__.get(name)
            if fn is not None and not getattr(fn, "__wrapped_opaque__", False):
                setattr(cls, name, opaque_method(fn))

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or "
                f"dicts, but got {_type_name(params)}"
            )
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        param_groups = list(params)
        if len(param_groups) == 0:
            raise OptimizerError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    # -- groups --------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own options (missing options take defaults)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the "
                "ordering of tensors in sets will change between runs. Please use a list instead."
            )
        else:
            params = list(params)
        # named parameters (name, tensor) are accepted, as torch >= 2.6 does
        names = None
        if params and isinstance(params[0], tuple):
            names = [n for n, _ in params]
            params = [p for _, p in params]
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(
                    "optimizer can only optimize Tensors, but one of the params is " + _type_name(p)
                )
            if not p.is_leaf:
                raise OptimizerError("can't optimize a non-leaf Tensor")
        if len({id(p) for p in params}) != len(params):
            raise OptimizerError(
                "optimizer contains a parameter group with duplicate parameters; in future, "
                "this will cause an error"
            )
        group = dict(param_group)
        group["params"] = params
        if names is not None:
            group["param_names"] = names
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise OptimizerError(
                    "parameter group didn't specify a value of required optimization parameter "
                    + name
                )
            group.setdefault(name, default)
        existing = {id(p) for g in self.param_groups for p in g["params"]}
        if existing & {id(p) for p in params}:
            raise OptimizerError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    # -- gradients -----------------------------------------------------------------------------
    @opaque_method
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of all optimized parameters (to None by default)."""
        for group in self.param_groups:
            for p in group["params"]:
                _zero_grad(p, set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        raise NotImplementedError

    @staticmethod
    def _evaluate_closure(closure: Callable[[], Any] | None) -> Any:
        # the closure recomputes the loss and calls backward, so it needs grad mode even though
        # step() itself runs under no_grad
        if closure is None:
            return None
        with enable_grad():
            return closure()

    def gradients(self) -> Iterator[tuple[dict[str, Any], Tensor, Tensor, dict[str, Any]]]:
        """``(group, p, g, state)`` for every parameter with a gradient, group by group: ``g``
        is ``p.grad``, negated when the group maximizes; ``state`` is ``self.state[p]`` (empty
        before the first update).  The loop of the elementwise optimizers' ``step``."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                yield group, p, (-p.grad if group["maximize"] else p.grad), self.state[p]

    # -- serialisation -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {...}}, "param_groups": [{options..., "params": [index...]}]}``.

        State tensors are returned by reference, as in PyTorch; deep-copy to snapshot."""
        index_of: dict[int, int] = {}
        groups = []
        next_index = 0
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            indices = []
            for p in group["params"]:
                if id(p) not in index_of:
                    index_of[id(p)] = next_index
                    next_index += 1
                indices.append(index_of[id(p)])
            packed["params"] = indices
            groups.append(packed)
        state = {
            index_of[id(p)]: value
            for p, value in self.state.items()
            if isinstance(p, Tensor) and id(p) in index_of
        }
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load options and per-parameter state saved by ``state_dict()``."""
        state_dict = copy.deepcopy(state_dict)  # never alias the caller's tensors
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise OptimizerError("loaded state dict has a different number of parameter groups")
        for ours, saved in zip(self.param_groups, saved_groups):
            if len(ours["params"]) != len(saved["params"]):
                raise OptimizerError(
                    "loaded state dict contains a parameter group that doesn't match the size "
                    "of optimizer's group"
                )
        id_map = {
            old: p
            for ours, saved in zip(self.param_groups, saved_groups)
            for old, p in zip(saved["params"], ours["params"])
        }
        state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for key, value in state_dict["state"].items():
            if key in id_map:
                param = id_map[key]
                state[param] = {k: _cast_state(param, k, v) for k, v in value.items()}
            else:
                state[key] = value  # type: ignore[index]
        new_groups = []
        for ours, saved in zip(self.param_groups, saved_groups):
            group = dict(saved)
            group["params"] = ours["params"]
            if "param_names" in ours and "param_names" not in saved:
                group["param_names"] = ours["param_names"]
            new_groups.append(group)
        self.state = state
        self.param_groups = new_groups

    def __getstate__(self) -> dict[str, Any]:
        return {
            "defaults": self.defaults,
            "state": self.state,
            "param_groups": self.param_groups,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        lines = [type(self).__name__ + " ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for key in sorted(group):
                if key not in ("params", "param_names"):
                    lines.append(f"    {key}: {group[key]}")
        lines.append(")")
        return "\n".join(lines)


def check_options(**options: Any) -> None:
    """PyTorch's constructor checks of the options given, in their order: each must be ≥ 0 (a
    NaN fails too) and each of ``betas`` in [0, 1), with PyTorch's messages ("Invalid learning
    rate: -1", "Invalid epsilon value: ...", "Invalid beta parameter at index 1: ...",
    "Invalid <name> value: ...")."""
    for name, value in options.items():
        if name == "betas":
            for index, beta in enumerate(value):
                if not 0.0 <= beta < 1.0:
                    raise OptimizerError(f"Invalid beta parameter at index {index}: {beta}")
        elif not 0.0 <= value:
            what = {"lr": "learning rate", "eps": "epsilon value"}.get(name, f"{name} value")
            raise OptimizerError(f"Invalid {what}: {value}")


def check_differentiable(optimizer: Optimizer, differentiable: bool) -> None:
    """``differentiable=True`` (an update autograd records, to differentiate through the step)
    is accepted only as False: fusegrad's updates are in place under ``no_grad``."""
    if differentiable:
        raise NotImplementedError(
            f"{type(optimizer).__name__}: differentiable=True is not supported"
        )


def missing_state(
    optimizer: Optimizer, keys: Callable[[dict[str, Any]], tuple[str, ...]]
) -> Tensor | None:
    """``Optimizer.state_pending`` for an optimizer whose state per parameter is ``keys(group)``:
    the first parameter that requires grad and lacks one of them (its next step makes it)."""
    for group in optimizer.param_groups:
        needed = keys(group)
        for p in group["params"]:
            if p.requires_grad:
                state = optimizer.state.get(p) or {}
                if any(k not in state for k in needed):
                    return p
    return None


def _cast_state(param: Tensor, key: str, value: Any) -> Any:
    """Floating state follows the parameter's dtype (``step`` stays as saved), as in PyTorch."""
    if isinstance(value, Tensor) and key != "step" and value.is_floating_point():
        return value.to(param.dtype)  # type: ignore[attr-defined]
    return value


__all__ = ["Optimizer", "OptimizerError", "required"]
