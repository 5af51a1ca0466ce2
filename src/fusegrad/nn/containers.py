"""Container modules: ``Sequential``, ``ModuleList``, ``ModuleDict``, ``ParameterList``,
``ParameterDict``.

They hold submodules (parameters) under string keys ("0", "1", ... for the sequence types) in
``_modules`` (``_parameters``), so parameters, ``state_dict`` keys (``0.weight``) and ``repr``
follow PyTorch's layout.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..tensor import Tensor
from .module import Module, _addindent
from .parameter import Parameter

if TYPE_CHECKING:
    from typing_extensions import Self


def _index(n: int, idx: Any, kind: str) -> int:
    i = operator.index(idx)
    if not -n <= i < n:
        raise IndexError(f"index {i} is out of range for {kind} of length {n}")
    return i % n


class Sequential(Module):
    """Modules applied in order: ``Sequential(m0, m1, ...)`` or ``Sequential(OrderedDict)``."""

    def __init__(self, *args: Any) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for i, module in enumerate(args):
                self.add_module(str(i), module)

    def forward(self, input: Any) -> Any:
        for module in self._modules.values():
            input = module(input)
        return input

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            return type(self)(OrderedDict(list(self._modules.items())[idx]))
        keys = list(self._modules)
        return self._modules[keys[_index(len(keys), idx, "Sequential")]]

    def __setitem__(self, idx: int, module: Module) -> None:
        keys = list(self._modules)
        setattr(self, keys[_index(len(keys), idx, "Sequential")], module)

    def __delitem__(self, idx: Any) -> None:
        keys = list(self._modules)
        if isinstance(idx, slice):
            doomed = keys[idx]
        else:
            doomed = [keys[_index(len(keys), idx, "Sequential")]]
        for key in doomed:
            del self._modules[key]
        # keep the string indices contiguous, as PyTorch does
        items = list(self._modules.values())
        self._modules.clear()
        for i, module in enumerate(items):
            self._modules[str(i)] = module

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> Sequential:
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> Sequential:
        if not isinstance(module, Module):
            raise TypeError(f"module should be of type: Module, got {type(module).__name__}")
        n = len(self._modules)
        if not -n <= index <= n:
            raise IndexError(f"Index out of range: {index}")
        index = index % (n + 1) if index < 0 else index
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m
        return self

    def __add__(self, other: Sequential) -> Sequential:
        if not isinstance(other, Sequential):
            raise ValueError(  # noqa: TRY004  (PyTorch raises ValueError here)
                "add operator supports only objects of Sequential class, but "
                f"{type(other).__name__} is given."
            )
        return Sequential(*self, *other)


class ModuleList(Module):
    """A list of submodules, registered so that ``parameters()`` and ``state_dict`` see them."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __repr__(self) -> str:
        """Runs of consecutive entries that print the same are one line, ``(0-5): 6 x Block(...)``,
        as PyTorch prints them (a Transformer's identical layers)."""
        reprs = [repr(m) for m in self]
        if not reprs:
            return self._get_name() + "()"
        runs: list[list[Any]] = []  # [first index, last index, text]
        for i, text in enumerate(reprs):
            if runs and runs[-1][2] == text:
                runs[-1][1] = i
            else:
                runs.append([i, i, text])
        lines = []
        for first, last, text in runs:
            head = f"({first})" if first == last else f"({first}-{last}): {last - first + 1} x"
            line = f"{head}: {text}" if first == last else f"{head} {text}"
            lines.append(_addindent(line, 2))
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            return type(self)(list(self._modules.values())[idx])
        return self._modules[str(_index(len(self), idx, "ModuleList"))]

    def __setitem__(self, idx: int, module: Module) -> None:
        setattr(self, str(_index(len(self), idx, "ModuleList")), module)

    def __delitem__(self, idx: Any) -> None:
        items = list(self._modules.values())
        del items[idx if isinstance(idx, slice) else _index(len(items), idx, "ModuleList")]
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m

    def __iadd__(self, modules: Iterable[Module]) -> Self:
        self.extend(modules)
        return self

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList([*self, *other])

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        if isinstance(modules, Module) and not isinstance(modules, (ModuleList, Sequential)):
            raise TypeError(
                "ModuleList.extend should be called with an iterable, but got "
                + type(modules).__name__
            )
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(items):
            self.add_module(str(i), m)


class ModuleDict(Module):
    """An ordered dict of submodules keyed by name."""

    def __init__(
        self,
        modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None,
    ) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def clear(self) -> None:
        self._modules.clear()

    def pop(self, key: str) -> Module:
        value = self[key]
        del self[key]
        return value

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def items(self) -> Iterable[tuple[str, Module]]:
        return self._modules.items()

    def values(self) -> Iterable[Module]:
        return self._modules.values()

    def update(self, modules: Any) -> None:
        pairs = modules.items() if isinstance(modules, Mapping) else modules
        for entry in pairs:
            key, module = entry
            self[key] = module


def _as_parameter(value: Any) -> Any:
    """A plain Tensor put in a parameter container becomes a Parameter, as in PyTorch; other
    objects are kept as they are (plain attributes)."""
    if isinstance(value, Tensor) and not isinstance(value, Parameter):
        return Parameter(value)
    return value


def _describe_entry(key: Any, value: Any) -> str:
    if isinstance(value, Tensor):
        size = "x".join(str(n) for n in value.shape)
        device = f" ({value.device})" if value.device.type == "cuda" else ""
        kind = "Parameter" if isinstance(value, Parameter) else "Tensor"
        return f"  ({key}): {kind} containing: [{value.dtype} of size {size}{device}]"
    return f"  ({key}): Object of type: {type(value).__name__}"


class ParameterList(Module):
    """A list of Parameters, registered under "0", "1", ... so that ``parameters()`` and
    ``state_dict`` see them; Tensors appended become Parameters."""

    def __init__(self, values: Iterable[Any] | None = None) -> None:
        super().__init__()
        self._size = 0
        if values is not None:
            self += values

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Any]:
        return iter(self[i] for i in range(len(self)))

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            return type(self)([self[i] for i in range(len(self))[idx]])
        return getattr(self, str(_index(len(self), idx, "ParameterList")))

    def __setitem__(self, idx: int, param: Any) -> None:
        setattr(self, str(_index(len(self), idx, "ParameterList")), _as_parameter(param))

    def __iadd__(self, parameters: Iterable[Any]) -> Self:
        return self.extend(parameters)

    def __dir__(self) -> list[str]:
        return [k for k in super().__dir__() if not k.isdigit()]

    def append(self, value: Any) -> Self:
        self._size += 1
        self[self._size - 1] = value
        return self

    def extend(self, values: Iterable[Any]) -> Self:
        if not isinstance(values, Iterable) or isinstance(values, Tensor):
            raise TypeError(
                "ParameterList.extend should be called with an iterable, but got "
                + type(values).__name__
            )
        for value in values:
            self.append(value)
        return self

    def extra_repr(self) -> str:
        return "\n".join(_describe_entry(k, p) for k, p in enumerate(self))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("ParameterList should not be called.")


class ParameterDict(Module):
    """An ordered dict of Parameters keyed by name; Tensors stored become Parameters."""

    def __init__(self, parameters: Any = None) -> None:
        super().__init__()
        self._keys: dict[str, None] = {}
        if parameters is not None:
            self.update(parameters)

    def _key(self, key: Any) -> str:
        if not isinstance(key, str):
            raise TypeError(f"ParameterDict keys must be strings, got {type(key).__name__}")
        return key

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        self._keys[self._key(key)] = None
        setattr(self, key, _as_parameter(value))

    def __delitem__(self, key: str) -> None:
        del self._keys[key]
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __reversed__(self) -> Iterator[str]:
        return reversed(list(self._keys))

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __or__(self, other: ParameterDict) -> ParameterDict:
        out = self.copy()
        out.update(other)
        return out

    def __ior__(self, other: ParameterDict) -> Self:
        self.update(other)
        return self

    def copy(self) -> ParameterDict:
        return ParameterDict(OrderedDict((k, self[k]) for k in self._keys))

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, key: str) -> Any:
        value = self[key]
        del self[key]
        return value

    def popitem(self) -> tuple[str, Any]:
        key = list(self._keys)[-1]
        return key, self.pop(key)

    def clear(self) -> None:
        for key in list(self._keys):
            del self[key]

    def fromkeys(self, keys: Iterable[str], default: Any = None) -> ParameterDict:
        return ParameterDict((k, default) for k in keys)

    def keys(self) -> Iterable[str]:
        return self._keys.keys()

    def items(self) -> Iterable[tuple[str, Any]]:
        return [(k, self[k]) for k in self._keys]

    def values(self) -> Iterable[Any]:
        return [self[k] for k in self._keys]

    def update(self, parameters: Any) -> None:
        if isinstance(parameters, (OrderedDict, ParameterDict)):
            pairs: Iterable = parameters.items()
        elif isinstance(parameters, Mapping):
            pairs = sorted(parameters.items())  # PyTorch sorts a plain dict's keys
        elif isinstance(parameters, Iterable):
            pairs = parameters
        else:
            raise TypeError(
                "ParametersDict.update should be called with an iterable of key/value pairs, "
                f"but got {type(parameters).__name__}"
            )
        for i, entry in enumerate(pairs):
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise ValueError(
                    f"ParameterDict update sequence element #{i} should be a key/value pair"
                )
            self[entry[0]] = entry[1]

    def extra_repr(self) -> str:
        return "\n".join(_describe_entry(k, p) for k, p in self.items())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("ParameterDict should not be called.")
