"""``Module``: the base class of layers and models, with PyTorch's registration rules.

Assigning a ``Parameter`` to a module attribute registers it in ``_parameters``, a ``Module`` in
``_modules``; ``register_buffer`` adds non-learnable state (running statistics, masks) to
``_buffers``.  Everything that walks a model (``parameters()``, ``state_dict()``, ``train()``,
``to()``, ``zero_grad()``, ``repr``) is built on these three ordered dicts, exactly as in
``torch.nn.Module``, so code written against PyTorch's module API carries over.

Nothing here computes on tensor values: parameters are updated in place by ``fusegrad.optim``
under ``no_grad``, and the forward pass is whatever ``forward`` a subclass defines.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..autograd.graph_base import guards_changed
from ..autograd.tracer import opaque_method
from ..device import as_device
from ..errors import FusegradError
from ..ops.creation import as_tensor
from ..tensor import Tensor
from .parameter import Buffer, Parameter

if TYPE_CHECKING:
    from typing_extensions import Self


class LoadStateDictError(FusegradError, RuntimeError):
    """``load_state_dict`` found missing/unexpected keys or mismatched shapes."""


class _IncompatibleKeys(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return (
            f"_IncompatibleKeys(missing_keys={self.missing_keys}, "
            f"unexpected_keys={self.unexpected_keys})"
        )

    def __str__(self) -> str:
        return self.__repr__()


class RemovableHandle:
    """Returned by ``register_forward_hook`` and friends; ``remove()`` unregisters the hook."""

    _next_id = itertools.count()

    def __init__(self, hooks: dict) -> None:
        self._hooks = hooks
        self.id = next(RemovableHandle._next_id)

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _type_name(value: object) -> str:
    if isinstance(value, Tensor):
        return value.type()  # type: ignore[attr-defined]
    return type(value).__name__


def _addindent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    return lines[0] + "\n" + "\n".join(" " * spaces + line for line in lines[1:])


class Entries(OrderedDict):
    """A module's ``_parameters``, ``_buffers`` and ``_modules``: an ``OrderedDict`` whose
    every change moves the guard epoch (``autograd.graph_base.epoch``), whoever makes it
    (registration, ``Sequential``'s item assignment, ``load_state_dict(assign=True)``, user
    code writing the dict): a compiled function's guard trusts a module's contents while the
    epoch stands still.  Reads are the ``OrderedDict``'s own."""

    __slots__ = ()

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        guards_changed()

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        guards_changed()

    def pop(self, *args: Any) -> Any:
        try:
            return super().pop(*args)
        finally:
            guards_changed()

    def popitem(self, last: bool = True) -> Any:
        try:
            return super().popitem(last)
        finally:
            guards_changed()

    def clear(self) -> None:
        super().clear()
        guards_changed()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        try:
            return super().setdefault(key, default)
        finally:
            guards_changed()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        guards_changed()

    def move_to_end(self, key: Any, last: bool = True) -> None:
        super().move_to_end(key, last)
        guards_changed()

    def __ior__(self, other: Any) -> Entries:
        super().__ior__(other)
        guards_changed()
        return self

    def __reduce__(self) -> Any:
        # pickled as the plain ``OrderedDict`` it stands for (files stay loadable with
        # ``weights_only=True``); ``Module.__setstate__`` makes it an ``Entries`` again
        return (OrderedDict, (), None, None, iter(self.items()))


ENTRY_DICTS = ("_parameters", "_buffers", "_modules")


class Module:
    """Base class for all neural network modules; subclasses define ``forward``.

    Subclasses must call ``super().__init__()`` before assigning parameters or submodules.
    """

    training: bool
    _version: int = 1  # state_dict format version, as PyTorch stores in metadata

    def __init__(self) -> None:
        # object.__setattr__ bypasses our __setattr__, which needs these dicts to exist
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", Entries())
        object.__setattr__(self, "_buffers", Entries())
        object.__setattr__(self, "_non_persistent_buffers_set", set())
        object.__setattr__(self, "_modules", Entries())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())

    def __setstate__(self, state: dict) -> None:
        """Unpickling and ``copy``: the state as it was, with the parameters, buffers and
        submodules in ``Entries`` again (pickled as plain ``OrderedDict``s)."""
        self.__dict__.update(state)
        for name in ENTRY_DICTS:
            entries = state.get(name)
            if entries is not None and type(entries) is not Entries:
                object.__setattr__(self, name, Entries(entries))
        guards_changed()

    # -- forward -------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f'Module [{type(self).__name__}] is missing the required "forward" function'
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for hook in list(self._forward_pre_hooks.values()):
            new_args = hook(self, args)
            if new_args is not None:
                args = new_args if isinstance(new_args, tuple) else (new_args,)
        result = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks.values()):
            new_result = hook(self, args, result)
            if new_result is not None:
                result = new_result
        return result

    def register_forward_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, args) -> None | new args``, called before ``forward``."""
        handle = RemovableHandle(self._forward_pre_hooks)
        self._forward_pre_hooks[handle.id] = hook
        return handle

    def register_forward_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, args, output) -> None | new output``, called after ``forward``."""
        handle = RemovableHandle(self._forward_hooks)
        self._forward_hooks[handle.id] = hook
        return handle

    # -- registration --------------------------------------------------------------------------
    def _check_init(self, what: str) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {what} before Module.__init__() call")

    @staticmethod
    def _check_name(name: Any, kind: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain "."')

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        self._check_init("parameters")
        self._check_name(name, "parameter")
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"cannot assign '{_type_name(param)}' object to parameter '{name}' "
                "(fusegrad.nn.Parameter or None required)"
            )
        if param is not None and param.grad_fn is not None:
            raise ValueError(
                f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
                "created explicitly. To express '{name}' as a function of another Tensor, compute "
                "the value in the forward() method."
            )
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        self._check_name(name, "buffer")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign '{_type_name(tensor)}' object to buffer '{name}' "
                "(fusegrad Tensor or None required)"
            )
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        self._check_init("child module")
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{_type_name(module)} is not a Module subclass")
        self._check_name(name, "module")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        self._modules[name] = module

    register_module = add_module

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            self._assign_attribute(name, value)
        finally:
            guards_changed()  # (what a compiled function's guard reads may have changed)

    def _assign_attribute(self, name: str, value: Any) -> None:
        def remove_from(*dicts: dict) -> None:
            for d in dicts:
                d.pop(name, None)
            self.__dict__.pop(name, None)

        params = self.__dict__.get("_parameters")
        if isinstance(value, Buffer):  # nn.Buffer: registered as a buffer (the tensor it marks)
            source = value.__dict__.get("_source")
            plain = source if source is not None else Tensor._make(value._data)
            if params is not None:
                remove_from(self._parameters, self._modules)
            self.register_buffer(name, plain, value.__dict__.get("persistent", True))
            return
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            remove_from(self._buffers, self._modules)
            self._non_persistent_buffers_set.discard(name)
            self.register_parameter(name, value)
            return
        if params is not None and name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{_type_name(value)}' as parameter '{name}' "
                    "(fusegrad.nn.Parameter or None expected)"
                )
            self.register_parameter(name, value)
            return
        modules = self.__dict__.get("_modules")
        if isinstance(value, Module):
            if modules is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            remove_from(self._parameters, self._buffers)
            self._non_persistent_buffers_set.discard(name)
            modules[name] = value
            return
        if modules is not None and name in modules:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{_type_name(value)}' as child module '{name}' "
                    "(fusegrad.nn.Module or None expected)"
                )
            modules[name] = value
            return
        buffers = self.__dict__.get("_buffers")
        if buffers is not None and name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(
                    f"cannot assign '{_type_name(value)}' as buffer '{name}' "
                    "(fusegrad.Tensor or None expected)"
                )
            buffers[name] = value
            return
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails, i.e. for registered params/buffers/modules
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            entries = d.get(store)
            if entries is not None and name in entries:
                return entries[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)
        guards_changed()

    def __dir__(self) -> list[str]:
        keys = list(super().__dir__())
        keys += list(self._parameters) + list(self._buffers) + list(self._modules)
        return sorted({k for k in keys if not k[0].isdigit()})

    def get_submodule(self, target: str) -> Module:
        if target == "":
            return self
        mod: Module = self
        for item in target.split("."):
            if item not in mod._modules:
                raise AttributeError(f"{type(mod).__name__} has no attribute `{item}`")
            mod = mod._modules[item]
        return mod

    def get_parameter(self, target: str) -> Parameter:
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if name not in mod._parameters:
            raise AttributeError(f"{type(mod).__name__} has no parameter `{name}`")
        return mod._parameters[name]

    # -- traversal -----------------------------------------------------------------------------
    def named_modules(
        self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Module]]:
        # explicit stack, pre-order like PyTorch's recursive generator (deep nets do not recurse)
        if memo is None:
            memo = set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            name, mod = stack.pop()
            if remove_duplicate:
                if mod in memo:
                    continue
                memo.add(mod)
            yield name, mod
            children = [
                (name + ("." if name else "") + child_name, child)
                for child_name, child in mod._modules.items()
                if child is not None
            ]
            stack.extend(reversed(children))

    def modules(self) -> Iterator[Module]:
        for _, mod in self.named_modules():
            yield mod

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen = set()
        for name, mod in self._modules.items():
            if mod is not None and mod not in seen:
                seen.add(mod)
                yield name, mod

    def children(self) -> Iterator[Module]:
        for _, mod in self.named_children():
            yield mod

    def _named_members(
        self, store: str, prefix: str, recurse: bool, remove_duplicate: bool
    ) -> Iterator[tuple[str, Tensor]]:
        mods = (
            self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
            if recurse
            else [(prefix, self)]
        )
        seen: set[int] = set()
        for mod_prefix, mod in mods:
            for name, value in getattr(mod, store).items():
                if value is None:
                    continue
                if remove_duplicate:
                    if id(value) in seen:
                        continue
                    seen.add(id(value))
                yield mod_prefix + ("." if mod_prefix else "") + name, value

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Parameter]]:
        yield from self._named_members(  # type: ignore[misc]
            "_parameters", prefix, recurse, remove_duplicate
        )

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Tensor]]:
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn: Callable[[Module], None]) -> Module:
        """Call ``fn`` on every submodule (children first) and then on ``self``."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # -- modes and gradients -------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")  # noqa: TRY004 (as PyTorch)
        for mod in self.modules():
            object.__setattr__(mod, "training", mode)
        guards_changed()
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    @opaque_method
    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            _zero_grad(p, set_to_none)

    # -- conversion ----------------------------------------------------------------------------
    def _apply(self, fn: Callable[[Tensor], Tensor]) -> Module:
        """Apply ``fn`` to every parameter, gradient and buffer, keeping Parameter identity."""
        for mod in self.modules():
            for p in mod._parameters.values():
                if p is None:
                    continue
                with no_grad():
                    new = fn(p)
                # like PyTorch's default: swap the storage, keep the Parameter object (so an
                # optimizer built before .double() still updates the same objects)
                p.data = new
                if p._grad is not None:
                    with no_grad():
                        p._grad.data = fn(p._grad)
            for key, b in mod._buffers.items():
                if b is not None:
                    with no_grad():
                        mod._buffers[key] = fn(b)
        return self

    def to(self, *args: Any, **kwargs: Any) -> Module:
        """``to(dtype)``, ``to(device)``, ``to(device, dtype)``, ``to(tensor)``.

        Only floating point parameters and buffers change dtype, as in PyTorch."""
        dtype = kwargs.pop("dtype", None)
        device = kwargs.pop("device", None)
        kwargs.pop("non_blocking", None)
        if kwargs:
            raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, Tensor):
                dtype = a.dtype
            elif isinstance(a, (_dt.dtype, type)):
                dtype = a
            else:
                device = a
        place = None
        if device is not None:
            place = as_device(device)
        target = None
        if dtype is not None:
            target = _dt.as_dtype(dtype)
            if target.category != 2:
                raise TypeError(
                    f"nn.Module.to only accepts floating point dtypes, but got desired dtype="
                    f"{target.name}"
                )
        if place is None and target is None:
            return self

        def convert(t: Tensor) -> Tensor:
            if target is not None and t.is_floating_point():
                t = t.to(target)  # type: ignore[attr-defined]
            if place is not None:
                t = t.to(place)  # type: ignore[attr-defined]
            return t

        return self._apply(convert)

    def double(self) -> Module:
        return self.to(_dt.float64)

    def float(self) -> Module:
        return self.to(_dt.float32)

    def half(self) -> Module:
        return self.to(_dt.float16)

    def bfloat16(self) -> Module:
        if _dt.bfloat16 is None:
            raise TypeError("bfloat16 needs the optional ml_dtypes package (pip install ml_dtypes)")
        return self.to(_dt.bfloat16)

    def cpu(self) -> Module:
        return self.to("cpu")

    def cuda(self, device: Any = None) -> Module:
        return self.to("cuda" if device is None else device)

    def type(self, dst_type: Any) -> Module:
        return self.to(dst_type)

    # -- state dict ----------------------------------------------------------------------------
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()

    def state_dict(
        self, *, destination: dict | None = None, prefix: str = "", keep_vars: bool = False
    ) -> OrderedDict[str, Tensor]:
        """Parameters and persistent buffers by dotted name; values share storage with them."""
        if destination is None:
            destination = OrderedDict()
        # no de-duplication: a shared submodule is saved under every name, as in PyTorch
        named = self.named_modules(prefix=prefix.rstrip("."), remove_duplicate=False)
        for mod_prefix, mod in named:
            mod._save_to_state_dict(
                destination, mod_prefix + ("." if mod_prefix else ""), keep_vars
            )
        return destination  # type: ignore[return-value]

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> _IncompatibleKeys:
        """Copy ``state_dict`` into this module's parameters and buffers (in place).

        ``strict`` requires the keys to match exactly; shape mismatches are always errors.
        ``assign=True`` replaces the tensors instead of copying into them."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"Expected state_dict to be dict-like, got {type(state_dict).__name__}."
            )
        errors: list[str] = []
        missing: list[str] = []
        expected: set[str] = set()
        for mod_prefix, mod in self.named_modules(remove_duplicate=False):
            dot = mod_prefix + ("." if mod_prefix else "")
            local = [(n, p, True) for n, p in mod._parameters.items() if p is not None]
            local += [
                (n, b, False)
                for n, b in mod._buffers.items()
                if b is not None and n not in mod._non_persistent_buffers_set
            ]
            for name, current, is_param in local:
                key = dot + name
                expected.add(key)
                if key not in state_dict:
                    missing.append(key)
                    continue
                value = state_dict[key]
                if not isinstance(value, Tensor):
                    try:
                        value = as_tensor(value)
                    except (TypeError, ValueError):
                        errors.append(
                            f'While copying the parameter named "{key}", expected '
                            f"fusegrad.Tensor or Tensor-like object from checkpoint but "
                            f"received {type(value).__name__}"
                        )
                        continue
                if tuple(value.shape) != tuple(current.shape):
                    errors.append(
                        f"size mismatch for {key}: copying a param with shape "
                        f"{_size(value.shape)} from checkpoint, the shape in current model is "
                        f"{_size(current.shape)}."
                    )
                    continue
                if assign:
                    if is_param:
                        new = Parameter(value.detach(), current.requires_grad)
                        mod._parameters[name] = new
                    else:
                        mod._buffers[name] = value.detach()
                else:
                    with no_grad():
                        current.copy_(value)  # type: ignore[attr-defined]
        unexpected = [k for k in state_dict if k not in expected]
        if strict:
            if unexpected:
                errors.insert(
                    0,
                    "Unexpected key(s) in state_dict: "
                    + ", ".join(f'"{k}"' for k in unexpected)
                    + ". ",
                )
            if missing:
                errors.insert(
                    0,
                    "Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". ",
                )
        if errors:
            raise LoadStateDictError(
                f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                + "\n\t".join(errors)
            )
        return _IncompatibleKeys(missing, unexpected)

    # -- printing ------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """One-line summary of this module's own settings; subclasses override it."""
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = []
        for name, mod in self._modules.items():
            child_lines.append(f"({name}): " + _addindent(repr(mod), 2))
        lines = extra_lines + child_lines
        main = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main += extra_lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"


def _size(shape: Any) -> str:
    return f"fusegrad.Size({list(shape)})"


def _zero_grad(p: Tensor, set_to_none: bool) -> None:
    """Reset one parameter's gradient, as ``Module.zero_grad`` and ``Optimizer.zero_grad`` do."""
    if p.grad is None:
        return
    if set_to_none:
        p.grad = None
        return
    g = p.grad
    if g.grad_fn is not None:
        g.detach_()
    else:
        g.requires_grad_(False)
    with no_grad():
        g.zero_()  # type: ignore[attr-defined]
