"""Tensor: an ndarray plus dtype, device and autograd metadata.

Storage is a numpy array (``_data``).  Views share the array memory and one ``_VersionCounter``
with their base; every in-place op bumps it so that saved tensors can detect mutation.  Autograd
metadata: ``grad_fn`` (None for leaves), ``_output_nr``, ``requires_grad`` (stored only for
leaves), ``grad``, tensor hooks and the retain_grad flag.  Operators and most methods delegate to
the op surface in ``fusegrad.ops``; they are installed on the class by ``ops._install_methods``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import dtypes as _dt
from .autograd import grad_mode as _grad_mode
from .device import CPU
from .errors import AutogradError, DTypeError, ShapeError


_DTYPE_OF = {d.np: d for d in _dt.ALL}


class _VersionCounter:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class Tensor:
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_accumulator",
        "_base",
        "_data",
        "_dtype",
        "_grad",
        "_hooks",
        "_inference",
        "_output_nr",
        "_post_acc_hooks",
        "_requires_grad",
        "_retains_grad",
        "_version_counter",
        "_wrapped_number",
        "grad_fn",
    )

    __array_priority__ = 1000  # numpy defers binary operators to Tensor

    def __init__(self, data: Any, dtype: Any = None, requires_grad: bool = False) -> None:
        from .ops.creation import _to_array

        arr = _to_array(data, dtype)
        self._init(arr)
        if requires_grad:
            self.requires_grad_(True)

    def _init(self, arr: np.ndarray) -> None:
        self._data = arr
        self._dtype = _dt.from_numpy_dtype(arr.dtype)
        self._requires_grad = False
        self.grad_fn = None
        self._output_nr = 0
        self._grad = None
        self._version_counter = _VersionCounter()
        self._base = None
        self._accumulator = None
        self._hooks = None
        self._post_acc_hooks = None
        self._retains_grad = False
        self._wrapped_number = False
        self._inference = _grad_mode._state.inference

    @classmethod
    def _make(cls, arr: np.ndarray) -> Tensor:
        """Wrap an array without copying or checking (internal)."""
        # _init inlined: this runs once per op result, the hottest allocation in eager mode
        t = object.__new__(cls)
        t._data = arr
        t._dtype = _DTYPE_OF[arr.dtype] if arr.dtype in _DTYPE_OF else _dt.from_numpy_dtype(
            arr.dtype
        )
        t._requires_grad = False
        t.grad_fn = None
        t._output_nr = 0
        t._grad = None
        t._version_counter = _VersionCounter()
        t._base = None
        t._accumulator = None
        t._hooks = None
        t._post_acc_hooks = None
        t._retains_grad = False
        t._wrapped_number = False
        t._inference = _grad_mode._state.inference
        return t

    # -- metadata ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        from .size import Size

        return Size(self._data.shape)

    def size(self, dim: int | None = None) -> Any:
        if dim is None:
            return self.shape
        return self._data.shape[self._wrap_dim(dim)]

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def dim(self) -> int:
        return self._data.ndim

    def numel(self) -> int:
        return int(self._data.size)

    def nelement(self) -> int:
        return int(self._data.size)

    @property
    def dtype(self) -> _dt.dtype:
        return self._dtype

    @property
    def device(self) -> Any:
        return CPU

    @property
    def is_cuda(self) -> bool:
        return False

    def is_floating_point(self) -> bool:
        return self._dtype.category == 2

    def element_size(self) -> int:
        return self._dtype.itemsize

    def stride(self, dim: int | None = None) -> Any:
        st = tuple(s // self._data.itemsize for s in self._data.strides)
        return st if dim is None else st[self._wrap_dim(dim)]

    def is_contiguous(self) -> bool:
        return bool(self._data.flags.c_contiguous)

    def data_ptr(self) -> int:
        return int(self._data.__array_interface__["data"][0])

    def _wrap_dim(self, dim: int, ndim: int | None = None) -> int:
        n = self._data.ndim if ndim is None else ndim
        bound = max(n, 1)
        if not isinstance(dim, (int, np.integer)) or not -bound <= dim < bound:
            from .errors import IndexOutOfRange

            raise IndexOutOfRange(
                f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], "
                f"but got {dim}) for tensor of shape {tuple(self._data.shape)}"
            )
        return int(dim) % bound

    @property
    def _version(self) -> int:
        return self._version_counter.value

    def _bump(self) -> None:
        self._version_counter.value += 1

    # -- autograd metadata ------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad or self.grad_fn is not None

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if self.grad_fn is not None:
            if not requires_grad:
                raise AutogradError(
                    "you can only change requires_grad flags of leaf variables. If you want to "
                    "use a computed variable in a subgraph that doesn't require differentiation "
                    "use var_no_grad = var.detach()."
                )
            return self
        if requires_grad and self._dtype.category != 2:
            raise DTypeError(
                "only Tensors of floating point dtype can require gradients "
                f"(got {self._dtype.name} tensor of shape {tuple(self._data.shape)})"
            )
        if requires_grad and self._inference and not _grad_mode._state.inference:
            raise AutogradError(
                "Setting requires_grad=True on inference tensor outside InferenceMode is not "
                "allowed."
            )
        self._requires_grad = bool(requires_grad)
        return self

    def is_inference(self) -> bool:
        """True for tensors created under ``inference_mode`` (they cannot be saved for
        backward)."""
        return self._inference

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def grad(self) -> Tensor | None:
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None, got {value!r}")
            if value.shape != self.shape:
                raise ShapeError(
                    f"assigned grad has data of a different size: expected "
                    f"{tuple(self.shape)}, got {tuple(value.shape)}"
                )
            if value.dtype != self.dtype:
                raise DTypeError(
                    f"assigned grad has data of a different type: expected {self.dtype.name}, "
                    f"got {value.dtype.name}"
                )
        self._grad = value

    @grad.deleter
    def grad(self) -> None:
        self._grad = None

    @property
    def output_nr(self) -> int:
        return self._output_nr

    def _edge(self) -> tuple:
        """The backward edge that gradients for this tensor flow into."""
        if self.grad_fn is not None:
            return (self.grad_fn, self._output_nr)
        if self._requires_grad:
            return (_accumulator_for(self), 0)
        return (None, 0)

    def retain_grad(self) -> None:
        if not self.requires_grad:
            raise AutogradError("can't retain_grad on Tensor that has requires_grad=False")
        if self.grad_fn is None:
            return  # leaves keep their grad anyway
        if self._retains_grad:
            return
        self._retains_grad = True
        self._register_retain_grad()

    def _register_retain_grad(self) -> None:
        import weakref

        node = self.grad_fn
        if node._retain_grad_hooks is None:
            node._retain_grad_hooks = {}
        node._retain_grad_hooks[self._output_nr] = weakref.ref(self)

    def _set_history(self, grad_fn: Any, output_nr: int) -> None:
        """Rebase this tensor onto ``grad_fn`` (after an in-place op).  As in PyTorch, a
        retain_grad moves to the new node: ``.grad`` is the gradient of the current value.
        Tensor hooks stay with the node that was current when they were registered."""
        self.grad_fn, self._output_nr = grad_fn, output_nr
        if self._retains_grad:
            if grad_fn is None:
                self._retains_grad = False
            else:
                self._register_retain_grad()

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def register_hook(self, hook: Callable) -> Any:
        """Hook ``fn(grad) -> Tensor | None`` called with this tensor's gradient."""
        if not self.requires_grad:
            raise AutogradError("cannot register a hook on a tensor that doesn't require gradient")
        from .autograd.node import add_hook

        if self.grad_fn is not None:
            return self.grad_fn._add_tensor_pre_hook(self._output_nr, hook)
        if self._hooks is None:
            self._hooks = {}
        return add_hook(self._hooks, hook)

    def register_post_accumulate_grad_hook(self, hook: Callable) -> Any:
        if not self.requires_grad:
            raise AutogradError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is not None:
            raise AutogradError(
                "post accumulate grad hooks cannot be registered on non-leaf tensors"
            )
        from .autograd.node import add_hook

        if self._post_acc_hooks is None:
            self._post_acc_hooks = {}
        return add_hook(self._post_acc_hooks, hook)

    def backward(
        self,
        gradient: Any = None,
        retain_graph: bool | None = None,
        create_graph: bool = False,
        inputs: Any = None,
    ) -> None:
        from .autograd import backward

        backward(self, gradient, retain_graph, create_graph, inputs=inputs)

    def detach(self) -> Tensor:
        """A new leaf sharing storage and version counter, not requiring grad.

        It is not a view in the autograd sense (no ``_base``): in-place ops on it are allowed
        even when this tensor is a leaf that requires grad (``p.detach().add_(1)``), and bump
        the shared version counter so saved tensors still notice."""
        t = Tensor._make(self._data)
        t._version_counter = self._version_counter
        t._inference = self._inference
        return t

    def detach_(self) -> Tensor:
        if self._base is not None and self._base.requires_grad:
            raise AutogradError("Can't detach views in-place. Use detach() instead.")
        self.grad_fn = None
        self._requires_grad = False
        return self

    @property
    def data(self) -> Tensor:
        return self.detach()

    @data.setter
    def data(self, value: Tensor) -> None:
        if not isinstance(value, Tensor):
            raise TypeError(f"data must be a Tensor, got {type(value).__name__}")
        self._data = value._data
        self._dtype = value._dtype

    # -- numpy interop ----------------------------------------------------------------------
    def numpy(self, force: bool = False) -> np.ndarray:
        if self.requires_grad and not force:
            raise AutogradError(
                "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() "
                "instead."
            )
        return self._data

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self._data
        if dtype is not None:
            arr = arr.astype(dtype, copy=False)
        return arr

    def item(self) -> Any:
        if self._data.size != 1:
            raise ShapeError(
                f"a Tensor with {self._data.size} elements cannot be converted to Scalar"
            )
        return self._data.reshape(()).item()

    def tolist(self) -> Any:
        return self._data.tolist()

    def __len__(self) -> int:
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self) -> Iterator[Tensor]:
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))  # type: ignore[attr-defined]

    def _scalar_value(self, kind: str) -> Any:
        if self._data.size != 1:
            raise ShapeError(
                f"a Tensor with {self._data.size} elements cannot be converted to {kind}"
            )
        return self._data.reshape(()).item()

    def __bool__(self) -> bool:
        if self._data.size != 1:
            raise RuntimeError(
                f"Boolean value of Tensor with more than one value is ambiguous "
                f"(shape {tuple(self._data.shape)})"
            )
        return bool(self._data.reshape(()).item())

    def __float__(self) -> float:
        return float(self._scalar_value("Python float"))

    def __int__(self) -> int:
        return int(self._scalar_value("Python int"))

    def __index__(self) -> int:
        if self._dtype.category != 1 or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self._data.reshape(()).item())

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        from ._format import format_tensor

        return format_tensor(self)

    def __format__(self, spec: str) -> str:
        if self._data.ndim == 0 and spec:
            return format(self._data.item(), spec)
        return repr(self)

    def __reduce_ex__(self, protocol: int) -> Any:
        return (_rebuild, (self._data.copy(), self._requires_grad))

    def __deepcopy__(self, memo: dict) -> Tensor:
        if self.grad_fn is not None:
            raise AutogradError(
                "Only Tensors created explicitly by the user (graph leaves) support the "
                "deepcopy protocol at the moment"
            )
        t = Tensor._make(self._data.copy())
        t._requires_grad = self._requires_grad
        if self._grad is not None:
            t._grad = Tensor._make(self._grad._data.copy())
        memo[id(self)] = t
        return t


def _rebuild(arr: np.ndarray, requires_grad: bool) -> Tensor:
    t = Tensor._make(arr)
    t._requires_grad = requires_grad
    return t


from .autograd.node import accumulator_for as _accumulator_for  # noqa: E402
