"""The exception hierarchy and message builders.

Every fusegrad error derives from ``FusegradError`` and also from the builtin a PyTorch user
would catch: shape errors are ``RuntimeError`` (what PyTorch raises for them) and also
``ValueError`` (what fusegrad raised first, so older ``except ValueError`` keeps working), dtype
errors ``TypeError``, autograd errors ``RuntimeError``, bad indices ``IndexError``.  Messages
name the op, the shapes and dtypes of its inputs, what was expected and what was found.
"""

from __future__ import annotations


class FusegradError(Exception):
    """Root of fusegrad's errors."""


class ShapeError(FusegradError, RuntimeError, ValueError):
    """Shapes that do not fit the op (broadcasting, reshape, view, matmul, a root gradient's
    ``Mismatch in shape``, ...).  PyTorch raises ``RuntimeError`` for all of these."""


class DTypeError(FusegradError, TypeError):
    """A dtype the op does not accept."""


class AutogradError(FusegradError, RuntimeError):
    """Misuse of the autograd engine (double backward without retain_graph, ...)."""


class IndexOutOfRange(FusegradError, IndexError):
    """An index or ``dim`` outside the valid range."""


class ComplexNotSupported(FusegradError, NotImplementedError):
    """An op that PyTorch does not define for complex tensors (ordering, rounding, ``erf``,
    ...) met one: a ``NotImplementedError``, as PyTorch raises for most of them."""


class ArgumentError(FusegradError, RuntimeError):
    """An argument value the op does not accept (a rounding mode, an indexing mode, clamp
    without bounds, an integer to a negative power, a bool dtype for ``linspace``): PyTorch's
    ``RuntimeError``."""


def describe(*tensors: object) -> str:
    """``(3, 4) float32, (5,) int64`` for the given tensors (scalars as their Python type)."""
    parts = []
    for t in tensors:
        shape = getattr(t, "shape", None)
        d = getattr(t, "dtype", None)
        if shape is not None and d is not None:
            parts.append(f"{tuple(shape)} {getattr(d, 'name', d)}")
        else:
            parts.append(type(t).__name__)
    return ", ".join(parts)
