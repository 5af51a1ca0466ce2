"""``functional_call`` and ``stack_module_state``: modules as functions of their parameters.

Where this sits: ``fusegrad.func``, over ``fusegrad.nn.Module``.  ``functional_call`` runs a
module's ``forward`` with some of its parameters and buffers replaced by the given tensors (the
entries of the modules' ``_parameters`` / ``_buffers`` dicts are swapped for the call and put
back afterwards, even when the call raises), which is what ``grad`` and ``vmap`` need to
differentiate or batch over parameters.  ``stack_module_state`` stacks the parameters of
several copies of a model for ``vmap`` over an ensemble.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import ops as F
from ..tensor import Tensor


def _owner(module: Any, name: str) -> tuple[Any, str]:
    """The submodule holding dotted name ``name``, and the last part."""
    *path, leaf = name.split(".")
    owner = module
    for part in path:
        owner = owner._modules.get(part) if hasattr(owner, "_modules") else None
        if owner is None:
            raise AttributeError(f"{type(module).__name__} has no submodule {part!r} ({name})")
    return owner, leaf


def functional_call(
    module: Any,
    parameter_and_buffer_dicts: Any,
    args: Any = None,
    kwargs: dict | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
) -> Any:
    """``module(*args, **kwargs)`` with the parameters and buffers named in
    ``parameter_and_buffer_dicts`` (a dict, or a sequence of dicts, from dotted names to
    tensors) in place of the module's own (PyTorch's ``torch.func.functional_call``).

    With ``tie_weights``, a tensor given for one of several names that share a parameter is
    used for all of them; with ``strict``, every parameter and buffer must be given."""
    if isinstance(parameter_and_buffer_dicts, dict):
        mapping = dict(parameter_and_buffer_dicts)
    else:
        mapping = {}
        for d in parameter_and_buffer_dicts:
            for k, v in d.items():
                if k in mapping:
                    raise ValueError(
                        f"{k} appeared in multiple dictionaries; behavior of functional call is "
                        "ambiguous"
                    )
                mapping[k] = v
    if tie_weights:
        # names that share one tensor (tied weights) all take the value given for any of them
        groups: dict[int, list[str]] = {}
        for name, t in list(module.named_parameters(remove_duplicate=False)) + list(
            module.named_buffers(remove_duplicate=False)
        ):
            groups.setdefault(id(t), []).append(name)
        for names in groups.values():
            given = [n for n in names if n in mapping]
            if given and len(names) > 1:
                value = mapping[given[0]]
                for n in given[1:]:
                    if mapping[n] is not value:
                        raise ValueError(
                            f"functional_call got multiple values for keys {sorted(given)}, "
                            "which are tied. Consider using tie_weights=False"
                        )
                for n in names:
                    mapping[n] = value
    if strict:
        expected = {n for n, _ in module.named_parameters()} | {
            n for n, _ in module.named_buffers()
        }
        missing = sorted(expected - set(mapping))
        unexpected = sorted(set(mapping) - expected)
        if missing or unexpected:
            raise RuntimeError(
                "Error(s) in reparametrizing for "
                f"{type(module).__name__}: missing key(s): {missing}, unexpected key(s): "
                f"{unexpected}"
            )
    swapped: list[tuple[dict, str, Any, bool]] = []  # (store, key, old value, existed)
    try:
        for name, value in mapping.items():
            owner, leaf = _owner(module, name)
            if leaf in owner._parameters:
                store = owner._parameters
            elif leaf in owner._buffers:
                store = owner._buffers
            else:
                if strict or not isinstance(value, Tensor):
                    raise AttributeError(
                        f"{type(owner).__name__} has no parameter or buffer {leaf!r} ({name})"
                    )
                store = owner._buffers  # a new name: visible as an attribute for the call
            swapped.append((store, leaf, store.get(leaf), leaf in store))
            store[leaf] = value
        if args is None:
            args = ()
        elif not isinstance(args, tuple):
            args = (args,)
        return module(*args, **(kwargs or {}))
    finally:
        for store, key, old, existed in reversed(swapped):
            if existed:
                store[key] = old
            else:
                del store[key]


def stack_module_state(models: Sequence[Any]) -> tuple[dict, dict]:
    """``(params, buffers)``: each parameter and buffer of ``models`` (copies of one
    architecture) stacked along a new dim 0, for ``vmap(functional_call...)`` over the
    ensemble.  The stacked parameters are new leaves that require grad where the models'
    do."""
    models = list(models)
    if not models:
        raise RuntimeError("stack_module_state: Expected at least one model, got 0.")
    if not (all(m.training for m in models) or not any(m.training for m in models)):
        raise RuntimeError(
            "stack_module_state: Expected all models to have the same training/eval mode."
        )
    first_type = type(models[0])
    if not all(type(m) is first_type for m in models):
        raise RuntimeError("stack_module_state: Expected all models to be of the same class.")
    params = {}
    for name, p in models[0].named_parameters():
        stacked = F.stack([dict(m.named_parameters())[name].detach() for m in models])
        params[name] = stacked.requires_grad_(p.requires_grad)
    buffers = {
        name: F.stack([dict(m.named_buffers())[name] for m in models])
        for name, _ in models[0].named_buffers()
    }
    return params, buffers
