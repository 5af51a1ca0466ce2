"""Complex numbers: the primitives that cross between real and complex values (``real``,
``imag``, ``complex``, ``conj_physical``, ``view_as_real``, ``view_as_complex``) and the op
surface over them (``conj``, ``angle``, ``sgn``, ``polar``, ``Tensor.real`` / ``.imag``, ...).

Where this sits: beside ``primitives.py`` (it registers primitive records and their shape/dtype
rules the same way); the derivative rules are in ``autograd/derivatives.py`` with every other
rule.  Every other primitive takes complex operands as numpy computes them, except those in
``primitives.REAL_ONLY``, which refuse them as PyTorch does.  docs/complex.md is the design:
storage (numpy's complex64/complex128), promotion (``dtypes``), the gradient convention
(conjugate Wirtinger derivatives) and what the compiler does with complex values.

``real``, ``imag``, ``view_as_real`` and ``view_as_complex`` are views, as in PyTorch: they
share memory and the version counter with their base, so writes through them under ``no_grad``
change the base and saved tensors notice.  ``conj()`` is not a lazy view here: it returns the
conjugated values in new memory (``is_conj()`` is always False).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..errors import DTypeError, ShapeError, describe
from ..size import broadcast_shapes
from ..tensor import Tensor
from ._util import P, apply, broadcast_shape, to_tensor
from .elementwise import where
from .registry import primitive, set_meta
from .views import _view_op


class ComplexDTypeError(DTypeError, RuntimeError):
    """A dtype the complex surface does not take (PyTorch raises RuntimeError for these)."""


# ---- primitives --------------------------------------------------------------------------------


@primitive("conj_physical", "elementwise", "x")
def _conj_physical(x):  # type: ignore[no-untyped-def]
    """The complex conjugate, in new memory."""
    return np.conjugate(x)


@primitive("real", "movement", "x")
def _real(x):  # type: ignore[no-untyped-def]
    """The real parts of a complex array: a view."""
    return x.real


@primitive("imag", "movement", "x")
def _imag(x):  # type: ignore[no-untyped-def]
    """The imaginary parts of a complex array: a view."""
    return x.imag


@primitive("complex", "elementwise", "re im")
def _complex(re, im):  # type: ignore[no-untyped-def]
    """``re + i im`` from two arrays of one floating dtype (broadcast)."""
    out = np.empty(np.broadcast_shapes(re.shape, im.shape), _dt.as_dtype(re.dtype).to_complex().np)
    out.real = re
    out.imag = im
    return out


@primitive("view_as_real", "movement", "x")
def _view_as_real(x):  # type: ignore[no-untyped-def]
    """A complex array's memory seen as its real dtype with a last dim of 2 (real, imaginary)."""
    re = np.asarray(x).real  # (asarray: a numpy scalar's .real would be a copy)
    half = re.itemsize
    return np.lib.stride_tricks.as_strided(
        re, re.shape + (2,), re.strides + (half,), writeable=bool(x.flags.writeable)
    )


class _Interface:
    """Memory of ``owner`` described by an ``__array_interface__`` (``view_as_complex``)."""

    def __init__(self, interface: dict, owner: np.ndarray) -> None:
        self.__array_interface__ = interface
        self.owner = owner  # keeps the memory alive as long as the view


@primitive("view_as_complex", "movement", "x")
def _view_as_complex(x):  # type: ignore[no-untyped-def]
    """An array of a floating dtype with a last dim of 2 (stride one element) seen as complex;
    the surface has checked the geometry."""
    cdt = _dt.as_dtype(x.dtype).to_complex().np
    pointer = x.__array_interface__["data"][0]
    interface = {
        "version": 3,
        "shape": x.shape[:-1],
        "strides": x.strides[:-1] or None,
        "typestr": cdt.str,
        "data": (pointer, not x.flags.writeable),
    }
    return np.asarray(_Interface(interface, x))


def _elementwise_shape(shapes: tuple) -> tuple:
    return tuple(broadcast_shapes(*shapes)) if len(shapes) > 1 else tuple(shapes[0])


set_meta("conj_physical", lambda shapes, dtypes: (tuple(shapes[0]), dtypes[0]))
set_meta("real", lambda shapes, dtypes: (tuple(shapes[0]), dtypes[0].to_real()))
set_meta("imag", lambda shapes, dtypes: (tuple(shapes[0]), dtypes[0].to_real()))
set_meta(
    "complex",
    lambda shapes, dtypes: (_elementwise_shape(tuple(shapes)), dtypes[0].to_complex()),
)
set_meta(
    "view_as_real",
    lambda shapes, dtypes: (tuple(shapes[0]) + (2,), dtypes[0].to_real()),
)
set_meta(
    "view_as_complex",
    lambda shapes, dtypes: (tuple(shapes[0])[:-1], dtypes[0].to_complex()),
)


# ---- op surface --------------------------------------------------------------------------------


def real(input: Any) -> Tensor:
    """The real parts of a complex tensor (a view); a real tensor itself."""
    x = to_tensor(input)
    if x._dtype.category != 3:
        return x
    return _view_op(x, "real", {})


def imag(input: Any) -> Tensor:
    """The imaginary parts of a complex tensor (a view)."""
    x = to_tensor(input)
    if x._dtype.category != 3:
        raise ComplexDTypeError(
            f"imag is not implemented for tensors with non-complex dtypes. (got {describe(x)})"
        )
    return _view_op(x, "imag", {})


def conj_physical(input: Any) -> Tensor:
    """The complex conjugate in new memory; a real tensor itself."""
    x = to_tensor(input)
    if x._dtype.category != 3:
        return x
    return apply(P["conj_physical"], (x,), {})


@_torch_node_name("ConjBackward0")
def _conj_complex(input: Any) -> Tensor:
    return conj_physical(input)


def conj(input: Any) -> Tensor:
    """The complex conjugate; a real tensor itself.  PyTorch returns a lazy view with its
    conjugate bit set; fusegrad computes the values (``conj_physical``), so ``is_conj()`` is
    False and writing into the result does not change ``input``."""
    if isinstance(input, Tensor) and input._dtype.category != 3:
        # a real tensor (every derivative rule conjugates its operands): itself, without the
        # naming wrapper, which renames only nodes this call makes (none here)
        return input
    return _conj_complex(input)


def resolve_conj(input: Any) -> Tensor:
    """``input`` itself: fusegrad never holds a lazily conjugated tensor."""
    return to_tensor(input)


def resolve_neg(input: Any) -> Tensor:
    """``input`` itself: fusegrad never holds a lazily negated tensor."""
    return to_tensor(input)


def is_conj(input: Any) -> bool:
    """False: fusegrad's ``conj`` computes the values (no conjugate bit)."""
    to_tensor(input)
    return False


def is_neg(input: Any) -> bool:
    """False: fusegrad has no negative bit."""
    to_tensor(input)
    return False


def _float_pair(op: str, a: Tensor, b: Tensor) -> None:
    if a._dtype is not b._dtype:
        raise ComplexDTypeError(
            f"{op}: Expected object of scalar type {a._dtype.name} but got scalar type "
            f"{b._dtype.name} for second argument ({describe(a, b)})"
        )
    if a._dtype.category != 2 or a._dtype in _dt.HALF:
        raise ComplexDTypeError(
            f"{op}: Expected both inputs to be Float or Double tensors but got {describe(a, b)}"
        )


def complex(real: Any, imag: Any) -> Tensor:  # noqa: A001  (torch.complex)
    """``real + i imag`` (broadcast) from two tensors of one floating dtype."""
    re, im = to_tensor(real), to_tensor(imag)
    _float_pair("complex", re, im)
    broadcast_shape("complex", re, im)
    return apply(P["complex"], (re, im), {})


@_torch_node_name("PolarBackward0")
def polar(abs: Any, angle: Any) -> Tensor:  # noqa: A002
    """``abs * (cos(angle) + i sin(angle))`` (broadcast), two tensors of one floating dtype."""
    r, theta = to_tensor(abs), to_tensor(angle)
    _float_pair("polar", r, theta)
    return complex(r * theta.cos(), r * theta.sin())


@_torch_node_name("SgnBackward0")
def sgn(input: Any) -> Tensor:
    """``z / |z|`` for complex ``z`` (0 at 0); ``sign`` for real tensors."""
    x = to_tensor(input)
    if x._dtype.category != 3:
        return x.sign()
    a = x.abs()
    zero = a == 0
    # the division never meets 0 / 0, so that no nan reaches the gradient at 0
    return where(zero, 0.0, x / where(zero, 1.0, a))


@_torch_node_name("AngleBackward0")
def angle(input: Any) -> Tensor:
    """The argument of each element, in (-pi, pi]: ``atan2(imag, real)`` for complex tensors;
    for real ones pi for negative numbers, 0 otherwise, nan for nan (with a zero gradient),
    integers giving the default float dtype."""
    x = to_tensor(input)
    if x._dtype.category == 3:
        return imag(x).atan2(real(x))
    if x._dtype.category < 2:
        x = x.to(_dt.get_default_dtype())
    s = x.sign()
    # 2 for negative numbers, +0 for zero and positive ones, nan for nan; sign's zero gradient
    # keeps the result in the graph with PyTorch's zero gradient
    return (s.abs() - s) * (math.pi / 2)


def view_as_real(input: Any) -> Tensor:
    """A complex tensor's memory as a real tensor with a last dim of 2 (a view)."""
    x = to_tensor(input)
    if x._dtype.category != 3:
        raise ComplexDTypeError(
            f"view_as_real is only supported for complex tensors (got {describe(x)})"
        )
    return _view_op(x, "view_as_real", {})


def view_as_complex(input: Any) -> Tensor:
    """A float tensor with a last dim of 2 and stride 1 there, seen as complex (a view)."""
    x = to_tensor(input)
    if x._dtype not in (_dt.float32, _dt.float64):
        raise ComplexDTypeError(
            "view_as_complex is only supported for float and double tensors, but got a tensor "
            f"of scalar type: {x._dtype.name}"
        )
    if x.ndim == 0 or x.shape[-1] != 2:
        raise ShapeError(f"Tensor must have a last dimension of size 2 (got {describe(x)})")
    data = x._data
    item = data.itemsize
    if data.size == 0:
        pass  # no memory to reinterpret: any strides do
    elif data.strides[-1] != item:
        raise ShapeError(
            f"Tensor must have a last dimension with stride 1 (got strides {x.stride()})"
        )
    elif any(s % (2 * item) for s in data.strides[:-1]):
        raise ShapeError(
            f"Tensor must have a stride divisible by 2 for all but last dimension (got strides "
            f"{x.stride()})"
        )
    elif _offset(x) % (2 * item):
        raise ShapeError(
            f"Tensor must have a storage_offset divisible by 2 (got {_offset(x) // item})"
        )
    return _view_op(x, "view_as_complex", {})


def _offset(x: Tensor) -> int:
    """Bytes from the start of ``x``'s root base (its storage) to its first element."""
    root = x._base if x._base is not None else x
    if x.is_cuda:  # (a CudaArray's offset is its bytes into the storage's buffer)
        return x._data.offset - root._data.offset
    pointer = x._data.__array_interface__["data"][0]
    return pointer - root._data.__array_interface__["data"][0]


def view_as_real_copy(input: Any) -> Tensor:
    """``view_as_real`` in new memory."""
    return view_as_real(input).clone()


def view_as_complex_copy(input: Any) -> Tensor:
    """``view_as_complex`` in new memory."""
    return view_as_complex(input).clone()


def conj_physical_(input: Tensor) -> Tensor:
    """Conjugates ``input`` in place (nothing to do for a real tensor)."""
    return input.conj_physical_()


__all__ = [
    "conj_physical_",
    "view_as_complex_copy",
    "view_as_real_copy",
    "angle",
    "complex",
    "conj",
    "conj_physical",
    "imag",
    "is_conj",
    "is_neg",
    "polar",
    "real",
    "resolve_conj",
    "resolve_neg",
    "sgn",
    "view_as_complex",
    "view_as_real",
]
