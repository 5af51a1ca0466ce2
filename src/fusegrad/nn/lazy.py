"""Lazy modules: layers whose input size is read from their first input.

``LazyLinear(out_features)``, ``LazyConv1d/2d/3d(out_channels, kernel_size, ...)``,
``LazyConvTranspose1d/2d/3d``, ``LazyBatchNorm1d/2d/3d`` and ``LazyInstanceNorm1d/2d/3d``
hold ``UninitializedParameter``s (and ``UninitializedBuffer``s) until their first call: then
the in-features / channels come from the input, the parameters are materialised in place (the
same objects, so an optimizer made before the first call keeps them), initialised as the
regular layer initialises them, and the module becomes that regular layer (``cls_to_become``),
as in PyTorch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..autograd.graph_base import tensor_guards_changed
from ..cuda.array import to_device
from ..device import as_device
from ..errors import ShapeError
from ..tensor import Tensor
from .conv_transpose import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from .layers import (
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    InstanceNorm1d,
    InstanceNorm2d,
    Linear,
    _ntuple,
)
from .module import Module
from .parameter import Parameter
from .volumetric import BatchNorm3d, Conv3d, InstanceNorm3d

__all__ = [
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyBatchNorm3d",
    "LazyConv1d",
    "LazyConv2d",
    "LazyConv3d",
    "LazyConvTranspose1d",
    "LazyConvTranspose2d",
    "LazyConvTranspose3d",
    "LazyInstanceNorm1d",
    "LazyInstanceNorm2d",
    "LazyInstanceNorm3d",
    "LazyLinear",
    "LazyModuleMixin",
    "UninitializedBuffer",
    "UninitializedParameter",
]


class _Uninitialized:
    """What the uninitialised parameter and buffer share: no shape until ``materialize``."""

    cls_to_become: type = Tensor

    def materialize(self, shape: Any, device: Any = None, dtype: Any = None) -> None:
        """Give the tensor storage of ``shape`` (uninitialised values) and turn it into a
        regular ``cls_to_become`` in place."""
        target = _dt.as_dtype(dtype) if dtype is not None else self.__dict__["_lazy_dtype"]
        arr = np.empty(tuple(int(s) for s in shape), target.np)
        place = as_device(device) if device is not None else self.__dict__["_lazy_device"]
        self._data = to_device(arr) if place.type == "cuda" else arr  # type: ignore[attr-defined]
        self._dtype = target  # type: ignore[attr-defined]
        self.__class__ = self.cls_to_become  # type: ignore[assignment]
        tensor_guards_changed(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


class UninitializedParameter(_Uninitialized, Parameter):
    """A parameter whose shape is not known yet (a lazy module's, before its first call)."""

    cls_to_become = Parameter

    def __init__(self, requires_grad: bool = True, device: Any = None, dtype: Any = None) -> None:
        Parameter.__init__(self, None, requires_grad)
        self.__dict__["_lazy_dtype"] = _dt.as_dtype(dtype) if dtype else _dt.get_default_dtype()
        self.__dict__["_lazy_device"] = as_device(device)


class UninitializedBuffer(_Uninitialized, Tensor):
    """A buffer whose shape is not known yet (a lazy module's, before its first call)."""

    cls_to_become = Tensor

    def __init__(self, requires_grad: bool = False, device: Any = None, dtype: Any = None) -> None:
        self._init(np.empty((0,), np.float32))
        self.__dict__["_lazy_dtype"] = _dt.as_dtype(dtype) if dtype else _dt.get_default_dtype()
        self.__dict__["_lazy_device"] = as_device(device)


class LazyModuleMixin:
    """The first call of a lazy module: ``initialize_parameters(input)`` materialises its
    uninitialised parameters and buffers from the input, ``reset_parameters`` initialises
    them, and the module becomes ``cls_to_become``."""

    cls_to_become: type | None = None

    def has_uninitialized_params(self) -> bool:
        tensors = list(self._parameters.values()) + list(self._buffers.values())  # type: ignore[attr-defined]
        return any(isinstance(t, _Uninitialized) for t in tensors)

    def initialize_parameters(self, input: Tensor) -> None:
        raise NotImplementedError  # every lazy class below defines it

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if type(self).__dict__.get("cls_to_become") is not None or self.has_uninitialized_params():
            if not args or not isinstance(args[0], Tensor):
                raise ShapeError(f"{type(self).__name__}: the first call needs a tensor input")
            self.initialize_parameters(args[0])
            self.reset_parameters()  # type: ignore[attr-defined]
            if self.cls_to_become is not None:
                self.__class__ = self.cls_to_become
        return Module.__call__(self, *args, **kwargs)  # type: ignore[arg-type]

    def _materialize(self, name: str, shape: tuple) -> None:
        value = getattr(self, name, None)
        if isinstance(value, _Uninitialized):
            value.materialize(shape)


class LazyLinear(LazyModuleMixin, Linear):
    """``Linear`` whose ``in_features`` is the first input's last dim."""

    cls_to_become = Linear

    def __init__(
        self, out_features: int, bias: bool = True, device: Any = None, dtype: Any = None
    ) -> None:
        Module.__init__(self)
        self.in_features = 0
        self.out_features = out_features
        self.weight = UninitializedParameter(device=device, dtype=dtype)
        if bias:
            self.bias = UninitializedParameter(device=device, dtype=dtype)
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params() and self.in_features != 0:
            Linear.reset_parameters(self)

    def initialize_parameters(self, input: Tensor) -> None:
        self.in_features = int(input.shape[-1])
        self._materialize("weight", (self.out_features, self.in_features))
        self._materialize("bias", (self.out_features,))


class _LazyConvMixin(LazyModuleMixin):
    _n = 2
    _transposed = False

    def _lazy_init(
        self,
        out_channels: int,
        kernel_size: Any,
        stride: Any,
        padding: Any,
        dilation: Any,
        groups: int,
        bias: bool,
        padding_mode: str,
        device: Any,
        dtype: Any,
        output_padding: Any = 0,
    ) -> None:
        Module.__init__(self)  # type: ignore[arg-type]
        n = self._n
        self.in_channels = 0
        self.out_channels = out_channels
        self.kernel_size = _ntuple(kernel_size, n)
        self.stride = _ntuple(stride, n)
        self.padding = padding if isinstance(padding, str) else _ntuple(padding, n)
        self.dilation = _ntuple(dilation, n)
        self.groups = groups
        self.padding_mode = padding_mode
        if self._transposed:
            self.output_padding = _ntuple(output_padding, n)
            self.transposed = True
        self.weight = UninitializedParameter(device=device, dtype=dtype)
        if bias:
            self.bias = UninitializedParameter(device=device, dtype=dtype)
        else:
            self.register_parameter("bias", None)  # type: ignore[attr-defined]

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params() and self.in_channels != 0:
            self.cls_to_become.reset_parameters(self)  # type: ignore[union-attr]

    def initialize_parameters(self, input: Tensor) -> None:
        batched = input.dim() == self._n + 2
        self.in_channels = int(input.shape[1 if batched else 0])
        if self.in_channels % self.groups:
            raise ValueError("in_channels must be divisible by groups")
        if self._transposed:
            shape = (self.in_channels, self.out_channels // self.groups, *self.kernel_size)
        else:
            shape = (self.out_channels, self.in_channels // self.groups, *self.kernel_size)
        self._materialize("weight", shape)
        self._materialize("bias", (self.out_channels,))


def _lazy_conv(name: str, base: type, n: int, transposed: bool) -> type:
    if transposed:

        def __init__(  # noqa: N807
            self: Any,
            out_channels: int,
            kernel_size: Any,
            stride: Any = 1,
            padding: Any = 0,
            output_padding: Any = 0,
            groups: int = 1,
            bias: bool = True,
            dilation: Any = 1,
            padding_mode: str = "zeros",
            device: Any = None,
            dtype: Any = None,
        ) -> None:
            self._lazy_init(
                out_channels,
                kernel_size,
                stride,
                padding,
                dilation,
                groups,
                bias,
                padding_mode,
                device,
                dtype,
                output_padding,
            )

    else:

        def __init__(  # noqa: N807
            self: Any,
            out_channels: int,
            kernel_size: Any,
            stride: Any = 1,
            padding: Any = 0,
            dilation: Any = 1,
            groups: int = 1,
            bias: bool = True,
            padding_mode: str = "zeros",
            device: Any = None,
            dtype: Any = None,
        ) -> None:
            self._lazy_init(
                out_channels,
                kernel_size,
                stride,
                padding,
                dilation,
                groups,
                bias,
                padding_mode,
                device,
                dtype,
            )

    doc = f"``{base.__name__}`` whose ``in_channels`` is read from the first input."
    body = {
        "__init__": __init__,
        "cls_to_become": base,
        "_n": n,
        "_transposed": transposed,
        "__doc__": doc,
        "__module__": __name__,
    }
    return type(name, (_LazyConvMixin, base), body)


LazyConv1d = _lazy_conv("LazyConv1d", Conv1d, 1, False)
LazyConv2d = _lazy_conv("LazyConv2d", Conv2d, 2, False)
LazyConv3d = _lazy_conv("LazyConv3d", Conv3d, 3, False)
LazyConvTranspose1d = _lazy_conv("LazyConvTranspose1d", ConvTranspose1d, 1, True)
LazyConvTranspose2d = _lazy_conv("LazyConvTranspose2d", ConvTranspose2d, 2, True)
LazyConvTranspose3d = _lazy_conv("LazyConvTranspose3d", ConvTranspose3d, 3, True)


class _LazyNormMixin(LazyModuleMixin):
    _instance = False

    def __init__(
        self,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool | None = None,
        track_running_stats: bool | None = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        Module.__init__(self)  # type: ignore[arg-type]
        affine = (not self._instance) if affine is None else affine
        track = (not self._instance) if track_running_stats is None else track_running_stats
        self.num_features = 0
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track
        kw = {"device": device, "dtype": dtype}
        if affine:
            self.weight = UninitializedParameter(**kw)
            self.bias = UninitializedParameter(**kw)
        else:
            self.register_parameter("weight", None)  # type: ignore[attr-defined]
            self.register_parameter("bias", None)  # type: ignore[attr-defined]
        if track:
            self.register_buffer("running_mean", UninitializedBuffer(**kw))  # type: ignore[attr-defined]
            self.register_buffer("running_var", UninitializedBuffer(**kw))  # type: ignore[attr-defined]
            self.register_buffer(  # type: ignore[attr-defined]
                "num_batches_tracked", Tensor._make(np.array(0, dtype=np.int64))
            )
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)  # type: ignore[attr-defined]

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params() and self.num_features != 0:
            self.cls_to_become.reset_parameters(self)  # type: ignore[union-attr]

    def initialize_parameters(self, input: Tensor) -> None:
        unbatched = self._instance and input.dim() == self.cls_to_become._dims[0]  # type: ignore[union-attr]
        self.num_features = int(input.shape[0 if unbatched else 1])
        for name in ("weight", "bias", "running_mean", "running_var"):
            self._materialize(name, (self.num_features,))


def _lazy_norm(name: str, base: type, instance: bool) -> type:
    doc = f"``{base.__name__}`` whose ``num_features`` is read from the first input."
    body = {"cls_to_become": base, "_instance": instance, "__doc__": doc, "__module__": __name__}
    return type(name, (_LazyNormMixin, base), body)


LazyBatchNorm1d = _lazy_norm("LazyBatchNorm1d", BatchNorm1d, False)
LazyBatchNorm2d = _lazy_norm("LazyBatchNorm2d", BatchNorm2d, False)
LazyBatchNorm3d = _lazy_norm("LazyBatchNorm3d", BatchNorm3d, False)
LazyInstanceNorm1d = _lazy_norm("LazyInstanceNorm1d", InstanceNorm1d, True)
LazyInstanceNorm2d = _lazy_norm("LazyInstanceNorm2d", InstanceNorm2d, True)
LazyInstanceNorm3d = _lazy_norm("LazyInstanceNorm3d", InstanceNorm3d, True)
