"""PyTorch's layout and memory-format objects: ``fusegrad.strided`` (and ``sparse_coo``, the
layout of ``fusegrad.sparse`` tensors), ``contiguous_format``, ``channels_last``,
``channels_last_3d`` and ``preserve_format``.

fusegrad stores every dense tensor one way (numpy's strides), so a ``memory_format`` argument
(``x.contiguous(memory_format=fusegrad.channels_last)``, ``empty_like(..., memory_format=...)``)
is accepted and changes nothing: values and results are the same, only PyTorch's memory order
differs.  ``check_factory_options`` is what the factories call on such keyword arguments.  A
basic module: it imports nothing from fusegrad.
"""

from __future__ import annotations

from typing import Any


class layout:  # noqa: N801  (PyTorch's name)
    """A tensor layout (``fusegrad.strided`` for dense tensors)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"fusegrad.{self.name}"

    def __reduce__(self) -> tuple:
        return (_layout_named, (self.name,))


class memory_format:  # noqa: N801  (PyTorch's name)
    """A memory format argument (accepted; fusegrad keeps one order, see the docstring)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"fusegrad.{self.name}"

    def __reduce__(self) -> tuple:
        return (_format_named, (self.name,))


strided = layout("strided")
sparse_coo = layout("sparse_coo")
contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
preserve_format = memory_format("preserve_format")

_LAYOUTS = {x.name: x for x in (strided, sparse_coo)}
_FORMATS = {
    x.name: x for x in (contiguous_format, channels_last, channels_last_3d, preserve_format)
}


def _layout_named(name: str) -> layout:
    return _LAYOUTS[name]


def _format_named(name: str) -> memory_format:
    return _FORMATS[name]


def check_factory_options(op: str, options: dict[str, Any]) -> None:
    """The keyword arguments of a factory beyond dtype/device/requires_grad: ``layout``
    (strided only), ``memory_format`` and ``pin_memory`` are accepted; anything else is
    PyTorch's TypeError for an unexpected keyword."""
    for key, value in options.items():
        if key == "layout":
            if value not in (None, strided):
                raise TypeError(f"{op}: only the strided layout is supported here, got {value}")
        elif key == "memory_format":
            if value is not None and not isinstance(value, memory_format):
                raise TypeError(
                    f"{op}: memory_format must be a fusegrad.memory_format, got {value!r}"
                )
        elif key != "pin_memory":
            raise TypeError(f"{op}() got an unexpected keyword argument '{key}'")
