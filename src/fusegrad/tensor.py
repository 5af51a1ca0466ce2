"""Tensor: an array plus dtype, device and autograd metadata.

Storage (``_data``) is a numpy array on the CPU and a ``fusegrad.cuda.array.CudaArray`` (a device
buffer with numpy geometry) on CUDA; the array's type is the tensor's device.  Views share the
array memory and one ``_VersionCounter``
with their base; every in-place op bumps it so that saved tensors can detect mutation.  Autograd
metadata: ``grad_fn`` (None for leaves), ``_output_nr``, ``requires_grad`` (stored only for
leaves), ``grad``, tensor hooks and the retain_grad flag.  Operators and most methods delegate to
the op surface in ``fusegrad.ops``; they are installed on the class by ``ops._install_methods``,
as ``backward`` is by ``autograd.api``: this module sits below both (it needs only the graph's
base classes, ``autograd.graph_base``), and the layers above bring the methods that use them.

A view (``_base`` is its root base, never itself a view) also carries a ``_ViewInfo``: the view
ops that rebuild it from the base, how it was created, and the version at which its ``grad_fn``
was last set.  As in PyTorch, a view's ``grad_fn`` is *lazy*: once the shared version moved (the
base or another view of it was modified in place, which may have rewritten the base's history),
reading ``grad_fn`` replays the view ops on the base's current history (``ops.views``).
Views are instances of ``_ViewTensor``, a subclass whose ``grad_fn`` is that property; every
other tensor reads ``grad_fn`` from a plain slot, so the eager hot path (which reads it several
times per op) pays nothing for views.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import dtypes as _dt
from ._format import format_tensor
from .autograd import grad_mode as _grad_mode
from .autograd.graph_base import (
    accumulator_for,
    add_hook,
    graph_changed,
    tensor_guards_changed,
)
from .autograd.tracer import notify_host_read as _read
from .autograd.tracer import notify_side_effect as _side_effect
from .autograd.tracer import state as _tracer_state
from .cuda.array import CudaArray, to_device
from .device import CPU, as_device
from .errors import ArgumentError, AutogradError, DTypeError, IndexOutOfRange, ShapeError
from .size import Size
from .storage import to_host

# numpy dtype -> fusegrad dtype: dtypes' own table, which bfloat16 joins once ml_dtypes is
# imported (fusegrad imports it only on first use; see dtypes._LazyNumpyDtype)
_DTYPE_OF = _dt._BY_NP
# The same by the numpy dtype's identity: arrays made by numpy carry these very dtype objects,
# and a numpy dtype's hash is computed anew on every call (``_make`` runs once per op result).
# Two live objects never share an id, and these dtypes live as long as the table (``_make``
# adds a dtype's own numpy dtype, bfloat16's, on its first miss).
_DTYPE_BY_ID = {id(npd): d for npd, d in _DTYPE_OF.items()}
_grad_state = _grad_mode._state  # (``_make`` reads it per tensor; the object is never replaced)
_inference_threads = _grad_mode.inference_threads
# PyTorch's words, for numpy() and np.asarray() on a tensor that requires grad
_NUMPY_REQUIRES_GRAD = (
    "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
)


class _VersionCounter:
    """The version shared by a tensor, its views and detach() aliases: every in-place change
    bumps ``value``, and a saved tensor whose version moved refuses to be used.

    Every tensor gets one, and most are never bumped: ``value`` starts as this class's 0 (no
    ``__init__`` to run, no slot to fill), and a bump stores the instance's own."""

    value = 0

    def bump(self) -> None:
        """An in-place change was made."""
        self.value += 1
        graph_changed()


# How a view was created (PyTorch's CreationMeta).  Anything but DEFAULT forbids rewriting the
# view's history after an in-place change, with the error ``view_rebase_error`` builds.
DEFAULT = "default"
MULTI_OUTPUT = "multi_output"  # an output of split / chunk / unbind
NO_GRAD = "no_grad"  # created with grad mode off
INFERENCE = "inference"  # created under inference_mode


class _ViewInfo:
    """What a view keeps besides ``_base`` (see the module docstring).

    ``steps`` are ``(primitive name, attribute dict)`` pairs that rebuild the view from its
    root base; ``origin`` names a multi-output op and the output's position for error
    messages; ``node`` is the view's ``grad_fn`` (kept here, not in the tensor's slot, so that
    the lazy property reads one object) and ``attr_version`` the version counter value when it
    was last set."""

    __slots__ = ("attr_version", "creation", "node", "origin", "steps")

    def __init__(self, steps: tuple, creation: str, node: Any, version: int) -> None:
        self.steps = steps
        self.creation = creation
        self.origin: tuple | None = None
        self.node = node
        self.attr_version = version


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
        "_view_info",  # set on views only (read only when ``_base`` is not None)
        "_wrapped_number",
        "grad_fn",  # a lazy property on views (``_ViewTensor``)
    )

    __array_priority__ = 1000  # numpy defers binary operators to Tensor

    def __init__(
        self, *args: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
    ) -> None:
        """PyTorch's legacy constructor (``torch.Tensor(...)``), in the default float dtype
        (or ``dtype``): ``Tensor(*sizes)`` or ``Tensor(Size)`` gives uninitialised values of
        that shape, ``Tensor(data)`` a copy of a sequence or array, ``Tensor()`` an empty
        tensor.  ``fusegrad.tensor(data)`` is the constructor that infers the dtype."""
        target = _dt.get_default_dtype() if dtype is None else _dt.as_dtype(dtype)
        arr = legacy_array(args, target, "Tensor")
        if device is not None and as_device(device) is not CPU:
            arr = to_device(arr)
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
    def _make(cls, arr: np.ndarray, counter: _VersionCounter | None = None) -> Tensor:
        """Wrap an array without copying or checking (internal); ``counter``: the version
        counter to share (a fresh one otherwise)."""
        # _init inlined: this runs once per op result, the hottest allocation in eager mode
        t = object.__new__(cls)
        t._data = arr
        npd = arr.dtype
        dt = _DTYPE_BY_ID.get(id(npd))
        if dt is None:
            dt = _DTYPE_OF.get(npd) or _dt.from_numpy_dtype(npd)
            if dt.np is npd:  # (bfloat16 after ml_dtypes' import; not '>f4' and the like)
                _DTYPE_BY_ID[id(npd)] = dt
        t._dtype = dt
        t._requires_grad = False
        t.grad_fn = None
        t._output_nr = 0
        t._grad = None
        t._version_counter = _VersionCounter() if counter is None else counter
        t._base = None
        t._accumulator = None
        t._hooks = None
        t._post_acc_hooks = None
        t._retains_grad = False
        t._wrapped_number = False
        t._inference = _grad_state.inference if _inference_threads else False  # (grad_mode)
        return t

    # -- metadata ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
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
        data = self._data
        return data.device if type(data) is CudaArray else CPU

    @property
    def is_cuda(self) -> bool:
        return type(self._data) is CudaArray

    def cuda(self, device: Any = None, non_blocking: bool = False) -> Tensor:
        """A copy on the GPU (``self`` when already there); differentiable."""
        return self.to("cuda" if device is None else device)  # type: ignore[attr-defined]

    def cpu(self) -> Tensor:
        """A copy in host memory (``self`` when already there); differentiable."""
        return self.to("cpu")  # type: ignore[attr-defined]

    def is_floating_point(self) -> bool:
        return self._dtype.category == 2

    def is_complex(self) -> bool:
        return self._dtype.category == 3

    def element_size(self) -> int:
        return self._dtype.itemsize

    def get_device(self) -> int:
        return 0 if type(self._data) is CudaArray else -1

    def stride(self, dim: int | None = None) -> Any:
        st = tuple(s // self._data.itemsize for s in self._data.strides)
        return st if dim is None else st[self._wrap_dim(dim)]

    def is_contiguous(self) -> bool:
        return bool(self._data.flags.c_contiguous)

    def data_ptr(self) -> int:
        data = self._data
        if type(data) is CudaArray:
            return int(data.kernel_array().device_ctypes_pointer.value or 0)
        return int(data.__array_interface__["data"][0])

    def _wrap_dim(self, dim: int, ndim: int | None = None) -> int:
        n = self._data.ndim if ndim is None else ndim
        bound = max(n, 1)
        if not isinstance(dim, (int, np.integer)) or not -bound <= dim < bound:
            raise IndexOutOfRange(
                f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], "
                f"but got {dim}) for tensor of shape {tuple(self._data.shape)}"
            )
        return int(dim) % bound

    @property
    def _version(self) -> int:
        return self._version_counter.value

    def _bump(self) -> None:
        self._version_counter.bump()

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
        if requires_grad and self._dtype.category < 2:
            raise DTypeError(
                "only Tensors of floating point and complex dtype can require gradients "
                f"(got {self._dtype.name} tensor of shape {tuple(self._data.shape)})"
            )
        if requires_grad and self._inference and not _grad_mode._state.inference:
            raise AutogradError(
                "Setting requires_grad=True on inference tensor outside InferenceMode is not "
                "allowed."
            )
        if _tracer_state.tracer is not None and self._requires_grad != bool(requires_grad):
            _side_effect(self, "requires_grad_()")
        if self._requires_grad != bool(requires_grad):
            self._requires_grad = bool(requires_grad)
            tensor_guards_changed(self)
        return self

    def is_inference(self) -> bool:
        """True for tensors created under ``inference_mode`` (they cannot be saved for
        backward)."""
        return self._inference

    def _is_view(self) -> bool:
        """True when this tensor is a view of another (``_base``), as ``torch.Tensor._is_view``."""
        return self._base is not None

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
        if _tracer_state.tracer is not None:
            _side_effect(self, ".grad assignment")
        self._grad = value

    @grad.deleter
    def grad(self) -> None:
        if _tracer_state.tracer is not None:
            _side_effect(self, "del .grad")
        self._grad = None

    @property
    def output_nr(self) -> int:
        return self._output_nr

    def _edge(self) -> tuple:
        """The backward edge that gradients for this tensor flow into."""
        node = self.grad_fn
        if node is not None:
            return (node, self._output_nr)
        if self._requires_grad:
            return (accumulator_for(self), 0)
        return (None, 0)

    def retain_grad(self) -> None:
        if not self.requires_grad:
            raise AutogradError("can't retain_grad on Tensor that has requires_grad=False")
        if self.grad_fn is None:
            return  # leaves keep their grad anyway
        if self._retains_grad:
            return
        if _tracer_state.tracer is not None:
            _side_effect(self, "retain_grad()")
        self._retains_grad = True
        self._register_retain_grad()

    def _register_retain_grad(self) -> None:
        node = self.grad_fn
        if node._retain_grad_hooks is None:
            node._retain_grad_hooks = {}
        node._retain_grad_hooks[self._output_nr] = weakref.ref(self)
        graph_changed()

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
        if _tracer_state.tracer is not None:
            _side_effect(self, "register_hook()")
        if self.grad_fn is not None:
            return self.grad_fn._add_tensor_pre_hook(self._output_nr, hook)
        if self._hooks is None:
            self._hooks = {}
        return add_hook(self._hooks, hook)

    def register_post_accumulate_grad_hook(self, hook: Callable) -> Any:
        if not self.requires_grad:
            raise AutogradError("cannot register a hook on a tensor that doesn't require gradient")
        if _tracer_state.tracer is not None:
            _side_effect(self, "register_post_accumulate_grad_hook()")
        if self.grad_fn is not None:
            raise AutogradError(
                "post accumulate grad hooks cannot be registered on non-leaf tensors"
            )
        if self._post_acc_hooks is None:
            self._post_acc_hooks = {}
        return add_hook(self._post_acc_hooks, hook)

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
        if self._requires_grad:
            self._requires_grad = False
            tensor_guards_changed(self)
        return self

    @property
    def data(self) -> Tensor:
        """A leaf sharing this tensor's storage but not its version counter (PyTorch's
        ``.data``): changes made through it are invisible to autograd, which is what makes it
        dangerous, and what optimizers written against ``.data`` rely on."""
        t = Tensor._make(self._data)
        t._inference = self._inference
        return t

    @data.setter
    def data(self, value: Tensor) -> None:
        """Swap the storage (shape and dtype may change), keeping this object, its autograd
        metadata and its own version counter (nothing is bumped), as in PyTorch."""
        if not isinstance(value, Tensor):
            raise TypeError(f"data must be a Tensor, got {type(value).__name__}")
        self._data = value._data
        self._dtype = value._dtype
        tensor_guards_changed(self)
        if self._base is not None:
            # the storage is no longer the base's: stop being a view (PyTorch keeps the view
            # link, and a later in-place op would then rewrite the base's history for a change
            # the base never saw)
            grad_fn = self.grad_fn
            if type(self) is _ViewTensor:
                self.__class__ = Tensor
            self._base = None
            self.grad_fn = grad_fn
            self._version_counter = _VersionCounter()

    # -- numpy interop ----------------------------------------------------------------------
    def numpy(self, force: bool = False) -> np.ndarray:
        if self.requires_grad and not force:
            raise AutogradError(_NUMPY_REQUIRES_GRAD)
        if type(self._data) is CudaArray:
            self._data.__array__()  # raises PyTorch's "can't convert cuda:0 ..." TypeError
        if _tracer_state.tracer is not None:
            _read(self, "numpy()")
        return self._data

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # np.asarray(t) / np.array(t): as PyTorch, refused like numpy() for a tensor that
        # requires grad (the array would silently leave the graph)
        if self.requires_grad:
            raise AutogradError(_NUMPY_REQUIRES_GRAD)
        arr = self._data
        if type(arr) is CudaArray:
            arr.__array__()  # a CUDA tensor: raises, as in PyTorch
        if dtype is not None:
            arr = arr.astype(dtype, copy=False)
        if _tracer_state.tracer is not None:
            _read(self, "numpy.asarray()")
        return arr

    def item(self) -> Any:
        if self._data.size != 1:
            raise ShapeError(
                f"a Tensor with {self._data.size} elements cannot be converted to Scalar"
            )
        out = self._data.reshape(()).item()
        return out if _tracer_state.tracer is None else _read(self, "item()", out)

    def tolist(self) -> Any:
        out = self._data.tolist()
        return out if _tracer_state.tracer is None else _read(self, "tolist()", out)

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
        out = self._data.reshape(()).item()
        return out if _tracer_state.tracer is None else _read(self, kind, out)

    def __bool__(self) -> bool:
        if self._data.size != 1:
            raise RuntimeError(
                f"Boolean value of Tensor with more than one value is ambiguous "
                f"(shape {tuple(self._data.shape)})"
            )
        out = bool(self._data.reshape(()).item())
        return out if _tracer_state.tracer is None else _read(self, "bool()", out)

    def __float__(self) -> float:
        return float(self._scalar_value("Python float"))

    def __int__(self) -> int:
        return int(self._scalar_value("Python int"))

    def __complex__(self) -> complex:
        return complex(self._scalar_value("Python complex"))

    def __index__(self) -> int:
        if self._dtype.category != 1 or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        out = int(self._data.reshape(()).item())
        return out if _tracer_state.tracer is None else _read(self, "an index", out)

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        if _tracer_state.tracer is not None:
            _read(self, "print/repr")
        return format_tensor(self)

    def __format__(self, spec: str) -> str:
        if _tracer_state.tracer is not None:
            _read(self, "format")
        if self._data.ndim == 0 and spec:
            return format(self._data.item(), spec)
        return repr(self)

    def __reduce_ex__(self, protocol: int) -> Any:
        data = self._data
        if type(data) is CudaArray:  # a host copy; unpickling puts it back on the device
            return (_rebuild, (data.to_host(), self._requires_grad, "cuda"))
        return (_rebuild, (data.copy(), self._requires_grad))

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


class _ViewTensor(Tensor):
    """A tensor that is a view of another (``_base``, ``_view_info``; see the module docstring).
    Only ``grad_fn`` differs: it is regenerated from the base after in-place changes, by
    replaying view ops, so the property (``ops.views.view_grad_fn``) is installed by the op
    surface (``ops._install_methods``) like the other methods that run ops."""

    __slots__ = ()


def view_rebase_error(view: Tensor, info: _ViewInfo | None, indirect: bool) -> AutogradError:
    """The error for rewriting the history of a view that does not allow it (PyTorch's
    ``handle_view_on_rebase`` wording): ``indirect`` when its base or another view of it was
    modified, else the view itself is being modified in place."""
    modified = "its base or another view of its base has been" if indirect else "is being"
    node = info.node if info is not None else view.grad_fn
    creation = info.creation if info is not None else None
    if creation in (NO_GRAD, INFERENCE) or node is None:
        prefix = (
            "A view was created in"
            if node is None
            else f"Output {view._output_nr} of {node.name()} is a view of a view which was "
            "created in"
        )
        if creation == INFERENCE:
            msg = f"{prefix} inference mode and {modified} modified inplace in normal mode."
        else:
            msg = f"{prefix} no_grad mode and {modified} modified inplace with grad mode enabled."
    else:
        origin = info.origin if info is not None else None
        name, nr = origin if origin else (node.name(), view._output_nr)
        msg = f"Output {nr} of {name} is a view and {modified} modified inplace."
    if creation == MULTI_OUTPUT:
        msg += (
            " This view is the output of a function that returns multiple views. Such functions "
            "do not allow the output views to be modified inplace. You should replace the "
            "inplace operation by an out-of-place one."
        )
    elif creation == NO_GRAD:
        msg += (
            " Given that this use case is ambiguous and error-prone, it is forbidden. You can "
            "clarify your code by moving both the view and the inplace either both inside the "
            "no_grad block (if you don't want the inplace to be tracked) or both outside (if you "
            "want the inplace to be tracked)."
        )
    elif creation == INFERENCE:
        msg += (
            " Given that this use case is ambiguous and error-prone, it is forbidden. You can "
            "clarify your code by moving both the view and the inplace either both inside the "
            "inference_mode block (if you don't want the inplace to be tracked) or both outside "
            "(if you want the inplace to be tracked)."
        )
    else:  # an alias returned by a custom Function (no view info)
        msg += (
            " This view was created inside a custom Function (or because an input was returned "
            "as-is) and the autograd logic to handle view+inplace would override the custom "
            "backward associated with the custom Function, leading to incorrect gradients. This "
            "behavior is forbidden. You can fix this by cloning the output of the custom "
            "Function."
        )
    return AutogradError(msg)


# ---- data -> array (``Tensor(data)``, ``fusegrad.tensor(data)``) ---------------------------------
def legacy_array(args: tuple, dtype: _dt.dtype, name: str) -> Any:
    """The array of a legacy constructor call ``name(*args)`` (``Tensor``, ``FloatTensor``,
    ...): sizes give uninitialised values, one sequence, array or tensor is copied (converted
    to ``dtype``), nothing gives an empty 1-D array."""
    if not args:
        return np.empty((0,), dtype.np)
    if all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in args):
        if any(a < 0 for a in args):
            raise ShapeError(f"{name}: negative dimension in size {list(args)}")
        return np.empty(tuple(int(a) for a in args), dtype.np)
    if len(args) == 1:
        data = args[0]
        if isinstance(data, Size):
            return np.empty(tuple(data), dtype.np)
        if isinstance(data, Tensor):
            return to_host(data._data).astype(dtype.np, copy=True)
        if isinstance(data, (list, tuple, np.ndarray)):
            return _to_array(data, dtype)
    kinds = ", ".join(type(a).__name__ for a in args)
    raise TypeError(
        f"{name}() takes sizes (ints or a Size), or one sequence, array or tensor of data; got "
        f"({kinds})"
    )


def _to_array(data: Any, dtype: Any = None) -> np.ndarray:
    """Copy ``data`` into a fresh array with PyTorch's dtype inference and conversions: a number
    beyond a float dtype's range is +-inf, silently; a Python number that an integer dtype
    cannot hold raises PyTorch's overflow error (``_python_numbers_as``); arrays and tensors
    are cast as numpy casts them (wrapping), silently, as PyTorch's."""
    if isinstance(data, Tensor):
        arr = np.array(to_host(data._data), copy=True)
    else:
        arr = _infer(data, dtype is not None)
    if dtype is not None:
        target = _dt.as_dtype(dtype).np
        if arr.dtype != target:
            if (target.kind in "iu" or arr.dtype.kind == "O") and not isinstance(
                data, (Tensor, np.ndarray)
            ):  # Python numbers for an integer dtype, or ints beyond int64
                arr = _python_numbers_as(arr, target)
            if arr.dtype.kind in "biu" and target.kind in "biu":
                arr = arr.astype(target, copy=False)  # (integer casts never warn)
            else:
                arr = _quiet_cast(arr, target)
    elif not _dt.is_stored(arr.dtype):
        arr = _quiet_cast(arr, _dt.as_dtype(arr.dtype).np)
    return arr


# numpy's error state (a context variable since numpy 2, as the op registry uses it): casts set
# it to "ignore" around themselves, 0.3 us where ``np.errstate`` takes 1
try:
    from numpy._core._ufunc_config import _extobj_contextvar as _NUMPY_ERRORS
    from numpy._core._ufunc_config import _make_extobj

    _IGNORE_ERRORS: Any = _make_extobj(all="ignore")
    _set_errors, _reset_errors = _NUMPY_ERRORS.set, _NUMPY_ERRORS.reset
except ImportError:  # pragma: no cover - numpy < 2
    _NUMPY_ERRORS = None


def _quiet_cast(arr: np.ndarray, target: Any) -> np.ndarray:
    """``arr`` as ``target`` without numpy's warnings: a float beyond a narrower float's range
    is +-inf, and NaN, inf or an out-of-range float cast to an integer is what numpy's cast
    gives (PyTorch's casts are silent)."""
    if _NUMPY_ERRORS is None:  # pragma: no cover
        with np.errstate(all="ignore"):
            return arr.astype(target, copy=False)
    token = _set_errors(_IGNORE_ERRORS)
    try:
        return arr.astype(target, copy=False)
    finally:
        _reset_errors(token)


def _python_numbers_as(arr: np.ndarray, target: np.dtype) -> np.ndarray:
    """Check Python numbers (``arr``, as ``_infer`` read them) against an integer ``target`` as
    PyTorch does, and convert ints beyond int64 (an object or uint64 array) for a float one.

    PyTorch refuses a float that is NaN or outside ``[min, max]`` of the integer dtype, and an
    int outside it -- except that an unsigned dtype takes ints down to ``-max`` (wrapping:
    ``tensor(-1, dtype=uint8)`` is 255) -- with ``value cannot be converted to type ... without
    overflow``; an int beyond int64 is refused by every integer dtype (``Overflow when
    unpacking long long``).  Bool dtypes take anything (nonzero is True)."""
    if target.kind in "fc":
        if arr.dtype.kind == "O":  # ints beyond int64: float() each (OverflowError past 1e308)
            return np.array(arr.tolist(), dtype=np.float64)
        return arr
    if target.kind not in "iu" or arr.dtype.kind == "b":
        return arr
    if arr.dtype.kind == "O" or arr.dtype == np.uint64:  # (ints beyond int64: ``_infer``)
        raise ValueError(
            f"tensor: Overflow when unpacking long long: an int beyond int64 "
            f"({_first_beyond_int64(arr)}) for dtype {_dt.as_dtype(target).name}"
        )
    if arr.dtype.kind not in "fiu":  # (complex: numpy's cast refuses it)
        return arr
    lo, hi = _INTEGER_RANGES[target.char]
    if arr.dtype.kind == "f":  # (compared as doubles, as PyTorch: 2.0**63 passes for int64)
        lo, hi = float(lo), float(hi)
    elif target.kind == "u":
        lo = -hi  # (PyTorch wraps negative ints into unsigned dtypes)
    if arr.size == 0:
        return arr
    if arr.size <= 64:  # (Python's comparisons: a fraction of numpy's calls' time)
        items = arr.reshape(-1).tolist()
        if arr.dtype.kind == "f":
            inside = all(lo <= x <= hi for x in items)  # (NaN: False)
        else:
            inside = lo <= min(items) and max(items) <= hi
    else:
        inside = bool(((arr >= lo) & (arr <= hi)).all())
    if not inside:
        flat = arr.reshape(-1)
        value = flat[~((flat >= lo) & (flat <= hi))][0].item()
        name = _dt.as_dtype(target).name
        raise ArgumentError(
            f"tensor: value cannot be converted to type {name} without overflow: {value!r} is "
            f"outside [{int(lo)}, {int(hi)}]"
        )
    return arr


# each integer dtype's [min, max] (numpy's ``iinfo`` takes a microsecond per call)
_INTEGER_RANGES = {
    np.dtype(t).char: (int(np.iinfo(t).min), int(np.iinfo(t).max))
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
}


def _first_beyond_int64(data: Any) -> Any:
    """The first Python int of ``data`` (nested lists or an object array) beyond int64."""
    items = _flat(data.tolist() if isinstance(data, np.ndarray) else data)
    for x in items:
        if type(x) is int and not -(2**63) <= x < 2**63:
            return x
    return items[0] if items else data


def _infer(data: Any, dtype_given: bool = False) -> np.ndarray:
    """``data`` as a fresh array of PyTorch's inferred dtype; with ``dtype_given`` (the caller
    casts next) Python floats stay float64 here, so that ``tensor([0.1], dtype=float64)`` is
    exactly 0.1 and ``1e200`` does not overflow on its way through float32."""
    if isinstance(data, np.ndarray):
        return np.array(data, copy=True)
    if isinstance(data, (list, tuple)):
        leaves = _flat(data)  # (one walk serves every question below)
        if any(isinstance(d, Tensor) for d in leaves):
            data = _untensor(data)
            leaves = _flat(data)
    else:
        leaves = [data]
    arr = np.array(data)
    if (
        arr.dtype.kind in "fuO"
        and leaves
        and type(leaves[0]) is int  # (one look rules out a list of floats)
        and all(type(x) is int for x in leaves)
    ):
        # Python ints beyond int64, which numpy holds as uint64, float64 or objects: a float
        # dtype converts them (``_python_numbers_as``), as PyTorch does; without a dtype they
        # are int64's, which cannot hold them
        if dtype_given:
            return arr if arr.dtype.kind != "f" else np.array(data, dtype=object)
        raise ValueError(
            f"tensor: Overflow when unpacking long long: {_first_beyond_int64(data)} is beyond "
            "int64 (give a float dtype to convert it)"
        )
    if dtype_given and arr.dtype.kind != "O":
        return arr
    if arr.dtype.kind == "f" and not isinstance(data, np.generic):
        # Python floats are the default float dtype (float32), not numpy's float64; numpy float
        # scalars inside a list keep their own precision (PyTorch: [np.float64(1.5)] is float64)
        typed = [e.dtype for e in leaves if isinstance(e, np.floating)]
        widest = max(typed, key=lambda d: d.itemsize) if typed else None
        if widest is None or widest.itemsize < _dt.get_default_dtype().np.itemsize:
            arr = _quiet_cast(arr, _dt.get_default_dtype().np)  # (1e300: inf, silently)
        else:
            arr = _quiet_cast(arr, _dt.as_dtype(widest).np)
    elif arr.dtype.kind == "c" and not isinstance(data, np.generic):
        # Python complex numbers are the default complex dtype (complex64 beside float32);
        # numpy scalars inside a list keep their own precision, as for floats
        typed = [e.dtype for e in leaves if isinstance(e, (np.floating, np.complexfloating))]
        wide = any(d.itemsize >= (16 if d.kind == "c" else 8) for d in typed)
        default = _dt.get_default_complex_dtype()
        arr = _quiet_cast(arr, (_dt.complex128 if wide else default).np)
    elif arr.dtype.kind in "iu" and not isinstance(data, np.generic):
        arr = arr.astype(np.int64)
    elif arr.dtype.kind == "O":
        raise TypeError(f"tensor: could not infer dtype of {type(data).__name__}")
    return arr


def _flat(data: Any) -> list:
    out, stack = [], [data]
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        else:
            out.append(x)
    return out


def _untensor(data: Any) -> Any:
    if isinstance(data, Tensor):
        return to_host(data._data)
    if isinstance(data, (list, tuple)):
        return [_untensor(d) for d in data]
    return data


def _rebuild(arr: np.ndarray, requires_grad: bool, device: str = "cpu") -> Tensor:
    if device != "cpu":
        as_device(device)  # a clear error where there is no GPU
        arr = to_device(arr)
    t = Tensor._make(arr)
    t._requires_grad = requires_grad
    return t
