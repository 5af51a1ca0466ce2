"""The op surface: every public op as a function, and the same ops installed on ``Tensor`` as
methods and operators (one definition each).

Import order follows the layers: primitives register their records in the registry, the surface
modules define functions over ``registry.apply`` (``generated`` builds those of plain elementwise
primitives from their records), and this module installs the methods.  ``autograd.derivatives``,
which registers one rule per primitive written in this surface, sits above it (``fusegrad``
imports it next).

``Tensor`` methods that run ops are installed here (``_install_methods``), with the lazy
``grad_fn`` of views (``views.view_grad_fn``).  The in-place machinery lives here too
(``inplace``, and ``_rebase_history`` for a custom Function's ``mark_dirty``).

Names: a primitive's aliases and its ``Tensor`` methods come from its record (``method``,
``inplace``, ``aliases``); ``_METHODS`` and ``_INPLACE`` list only the composites' methods.
"""

from __future__ import annotations

import builtins as _builtins
import inspect
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import storage as _storage
from .. import tensor_types as _tensor_types
from ..autograd import grad_mode as _grad_mode
from ..autograd.forward_state import state as _forward_state
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import state as _tracer_state
from ..autograd.tracer import tracer_threads as _tracer_threads
from ..device import as_device
from ..errors import AutogradError, DTypeError, ShapeError, describe
from ..tensor import DEFAULT as _DEFAULT_VIEW
from ..tensor import Tensor, _ViewTensor
from ..tensor import view_rebase_error as _view_rebase_error
from . import _util, registry
from . import decompositions as _decompositions  # noqa: F401  (fusegrad.linalg's primitives)
from . import norms as _norms  # noqa: F401  (the normalisation layers' fused primitives)
from . import primitives as _primitives  # noqa: F401  (registers kernels)
from . import resample as _resample  # noqa: F401  (interpolate's fused primitives)
from . import special_functions as _special_functions  # noqa: F401  (fusegrad.special's)
from . import spectral as _spectral  # noqa: F401  (the FFT primitives of fusegrad.fft)
from ._util import cast, to_tensor
from ._util import scalar_tensor as _scalar_tensor
from .complex import *  # noqa: F401,F403  (complex numbers: primitives and surface)
from .complex import (
    angle,
    complex,
    conj,
    conj_physical,
    imag,
    is_conj,
    is_neg,
    real,
    resolve_conj,
    resolve_neg,
    sgn,
    view_as_complex,
    view_as_real,
)
from .composites import *  # noqa: F401,F403  (composites PyTorch has at top level)
from .creation import *  # noqa: F401,F403
from .creation import (
    Generator,
    _gen,
    _to_array,
    arange,
    as_tensor,
    bernoulli,
    default_generator,
    empty,
    empty_like,
    eye,
    from_numpy,
    full,
    full_like,
    get_rng_state,
    linspace,
    manual_seed,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randn,
    randn_like,
    randperm,
    seed,
    set_rng_state,
    tensor,
    zeros,
    zeros_like,
)
from .elementwise import *  # noqa: F401,F403
from .elementwise import (
    add,
    allclose,
    bitwise_and,
    bitwise_not,
    bitwise_or,
    bitwise_xor,
    ceil,
    clamp,
    clip,
    div,
    elu,
    equal,
    exp2,
    floor,
    gelu,
    isclose,
    isfinite,
    leaky_relu,
    lerp,
    log2,
    log10,
    nan_to_num,
    neg,
    polygamma,
    relu,
    round,
    rsqrt,
    rsub,
    sign,
    silu,
    softplus,
    square,
    sub,
    tan,
    trunc,
    where,
)
from .extra import *  # noqa: F401,F403  (more of PyTorch's ops)
from .extra import (
    INPLACE_NAMES,
    INPLACE_OTHER,
    METHOD_NAMES,
    OTHER_METHODS,
    PROPERTIES,
    TOP_LEVEL_INPLACE,
    bitwise_left_shift,
    bitwise_right_shift,
)
from .functional import (
    avg_pool2d,
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    conv2d,
    cross_entropy,
    dropout,
    l1_loss,
    layer_norm,
    max_pool2d,
    mse_loss,
    nll_loss,
    unfold,
)
from .generated import *  # noqa: F401,F403  (surface functions generated from the records)
from .generated import (
    abs,
    eq,
    floor_divide,
    ge,
    gt,
    le,
    lt,
    mul,
    ne,
    pow,
    remainder,
)
from .indexing import (
    embedding,
    gather,
    gather_spec,
    getitem,
    getitem_spec,
    index_add,
    index_add_at,
    index_copy,
    index_fill,
    index_put_spec,
    index_select,
    masked_fill,
    masked_select,
    one_hot,
    scatter_add,
    scatter_spec,
    setitem_value,
    take_along_dim,
)
from .linalg import (
    addbmm,
    addmm,
    baddbmm,
    bmm,
    cdist,
    cross,
    dot,
    einsum,
    ger,
    inner,
    linear,
    matmul,
    mm,
    mv,
    outer,
)
from .reduction import (
    all,
    amax,
    amin,
    any,
    argmax,
    argmin,
    count_nonzero,
    cumprod,
    cumsum,
    log_softmax,
    logcumsumexp,
    logsumexp,
    max,
    mean,
    min,
    norm,
    prod,
    softmax,
    std,
    sum,
    var,
    var_mean,
)
from .registry import REGISTRY, RULES, apply
from .registry import run as _run
from .sampling import multinomial, normal, poisson
from .search import (
    argwhere,
    bucketize,
    histc,
    nonzero,
    searchsorted,
    unique,
    unique_consecutive,
)
from .shape import (
    broadcast_tensors,
    broadcast_to,
    cat,
    chunk,
    clone,
    concat,
    concatenate,
    contiguous,
    diag,
    diagonal,
    diagonal_backward,
    diff,
    expand,
    expand_as,
    flatten,
    flip,
    hstack,
    movedim,
    narrow,
    pad,
    permute,
    repeat,
    repeat_interleave,
    reshape,
    reshape_as,
    roll,
    select,
    split,
    squeeze,
    stack,
    sum_to,
    sum_to_size,
    swapaxes,
    swapdims,
    t,
    tile,
    transpose,
    tril,
    triu,
    unbind,
    unflatten,
    unsqueeze,
    view,
    view_as,
    vstack,
)
from .sorting import argsort, cummax, cummin, kthvalue, median, mode, msort, sort, topk
from .special_ops import i0, igamma, igammac  # (special's surface; rules: F.special_ops)
from .spellings import adapt
from .views import replay_view as _replay_view
from .views import set_view_grad_fn as _set_view_grad_fn
from .views import view_grad_fn as _view_grad_fn
from .views import view_positions as _view_positions


def detach(input: Tensor) -> Tensor:
    return input.detach()


# ---- conversions -------------------------------------------------------------------------------
def to(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """``to(dtype)``, ``to(device)``, ``to(device, dtype)``, ``to(other)``; ``copy=`` too."""
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    copy = kwargs.pop("copy", False)
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)  # (one memory order in fusegrad: see ``layouts``)
    for a in args:
        if isinstance(a, Tensor):
            dtype = a.dtype
        elif isinstance(a, (_dt.dtype, type)) or (
            isinstance(a, str) and a in ("float32", "float64", "float16", "bfloat16")
        ):
            dtype = a
        else:
            device = a
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    target = None if device is None else as_device(device)
    out = self if dtype is None else cast(self, _dt.as_dtype(dtype))
    if target is not None and target != out.device:
        out = to_device(out, target)
    if copy and out is self:
        out = clone(self)
    return out


def to_device(input: Tensor, device: Any) -> Tensor:
    """A differentiable copy of ``input`` on ``device`` (``Tensor.to(device)``)."""
    target = as_device(device)
    return registry.apply(
        registry.REGISTRY["to_device"],
        (input,),
        {"device": str(target), "source": str(input.device)},
    )


def _type(self: Tensor, dtype: Any = None) -> Any:
    if dtype is None:
        return {
            "float32": "fusegrad.FloatTensor",
            "float64": "fusegrad.DoubleTensor",
            "int64": "fusegrad.LongTensor",
            "int32": "fusegrad.IntTensor",
            "bool": "fusegrad.BoolTensor",
            "float16": "fusegrad.HalfTensor",
            "bfloat16": "fusegrad.BFloat16Tensor",
            "complex64": "fusegrad.ComplexFloatTensor",
            "complex128": "fusegrad.ComplexDoubleTensor",
            "int16": "fusegrad.ShortTensor",
            "int8": "fusegrad.CharTensor",
            "uint8": "fusegrad.ByteTensor",
        }[self.dtype.name]
    legacy = getattr(dtype, "_legacy_dtype", None)  # FloatTensor and the other tensor types
    if legacy is not None:
        out = to(self, legacy)
        return out.cuda() if getattr(dtype, "_legacy_cuda", False) else out
    if isinstance(dtype, str):  # "torch.FloatTensor", "fusegrad.cuda.LongTensor", ...
        kind = _tensor_types.by_name(dtype)
        if kind is not None:
            return _type(self, kind)
    return to(self, dtype)


def _no_bfloat16(self: Tensor) -> Tensor:
    raise TypeError("bfloat16 needs the optional ml_dtypes package (pip install ml_dtypes)")


def _converter(d: _dt.dtype) -> Any:
    def convert(self: Tensor) -> Tensor:
        return cast(self, d)

    convert.__name__ = d.name
    return convert


# ---- in-place ops ------------------------------------------------------------------------------
#
# Every in-place op goes through ``inplace``: the op runs out of place and its result is written
# into the target's storage, bumping the version counter the target shares with its base and
# views (also under no_grad), so saved tensors notice.  When a graph is recorded the target's
# history is rebased onto the op's node; when the target is a view, the *base's* history is
# rewritten instead (PyTorch's CopySlices, see ``_inplace_on_view``) and the view's ``grad_fn``
# is regenerated from the base on its next read (``views.view_grad_fn``).

_INFERENCE_INPLACE = (
    "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a "
    "clone to get a normal tensor before doing inplace update.See "
    "https://github.com/pytorch/rfcs/pull/17 for more details."
)


def _check_inplace(self: Tensor, op: str, needs_graph: bool) -> None:
    """The errors PyTorch raises before an in-place op runs (its ``check_inplace``)."""
    if self._inference and not _grad_mode._state.inference:
        raise AutogradError(f"{op}: {_INFERENCE_INPLACE}")
    if not needs_graph:
        return  # no_grad (optimizers, init) may write anything
    base = self._base
    if base is not None:
        info = getattr(self, "_view_info", None)
        if info is None or info.creation != _DEFAULT_VIEW:
            raise _view_rebase_error(self, info, indirect=False)
        if base.grad_fn is None and base._requires_grad:
            raise AutogradError(
                f"{op}: a view of a leaf Variable that requires grad is being used in an "
                "in-place operation."
            )
    if self._requires_grad and self.grad_fn is None:
        raise AutogradError(
            f"{op}: a leaf Variable that requires grad is being used in an in-place operation."
        )


class _ArrayInterface:
    """Exposes another array's memory through ``__array_interface__`` (see ``_writable``)."""

    def __init__(self, interface: dict, owner: np.ndarray) -> None:
        self.__array_interface__ = interface
        self.owner = owner  # keeps the memory alive as long as the alias


def _check_writable(self: Tensor, op: str) -> None:
    """Refuse to write a tensor in which several elements share one memory location (an
    expanded view, PyTorch's internal-overlap check) or whose memory is read-only."""
    arr = self._data
    if arr.flags.writeable:
        return
    if _builtins.any(st == 0 and n > 1 for st, n in zip(arr.strides, arr.shape)):
        raise AutogradError(
            "unsupported operation: more than one element of the written-to tensor refers to a "
            "single memory location. Please clone() the tensor before performing the operation. "
            f"({op} on {describe(self)}, an expanded view)"
        )
    root = self._base._data if self._base is not None else arr
    if not root.flags.writeable:
        raise AutogradError(
            f"{op}: the memory of {describe(self)} is read-only (it wraps a non-writable numpy "
            "array); clone() the tensor before performing the operation"
        )


def _writable(arr: np.ndarray) -> np.ndarray:
    """``arr``, or a writable alias of it when numpy marked it read-only although its memory is
    writable: a view of an expanded view without repeated elements (``x.expand(2, 3)[0]``),
    which PyTorch lets one write.  ``_check_writable`` has ruled out the other cases."""
    if arr.flags.writeable:
        return arr
    interface = dict(arr.__array_interface__)
    interface["data"] = (interface["data"][0], False)  # (pointer, read-only flag)
    return np.asarray(_ArrayInterface(interface, arr))


def _cast_result(self: Tensor, result: Tensor) -> Tensor:
    """The op's result in ``self``'s dtype where it may be written there (a float result into an
    int tensor is refused by ``_check_result``)."""
    if result._dtype is not self._dtype and result._dtype.category <= self._dtype.category:
        return cast(result, self._dtype)
    return result


def _check_result(self: Tensor, result: Tensor, op: str) -> None:
    if tuple(result.shape) != tuple(self.shape):
        raise ShapeError(
            f"{op}: output with shape {list(self.shape)} doesn't match the broadcast shape "
            f"{list(result.shape)}"
        )
    if result._dtype is not self._dtype and result._dtype.category > self._dtype.category:
        raise DTypeError(
            f"{op}: result type {result._dtype.name} can't be cast to the desired output "
            f"type {self._dtype.name}"
        )


def _write(self: Tensor, result: Tensor, op: str) -> None:
    """Copy ``result`` into ``self``'s storage (shape and dtype checked), bumping the version."""
    _check_result(self, result, op)
    _check_writable(self, op)
    data = self._data
    _storage.copyto(_writable(data) if type(data) is np.ndarray else data, result._data)
    self._version_counter.bump()
    tracer = _tracer_state.tracer
    if tracer is not None:
        tracer.wrote(self, result)


def inplace(self: Tensor, op: str, fn: Any, *args: Any, **kwargs: Any) -> Tensor:
    """Run ``fn(self, *args)`` out of place and write the result into ``self``.

    With autograd involved, ``self``'s history is rebased onto the op's node: the op runs on a
    snapshot that carries self's old history and data, so nodes that saved ``self`` before keep
    seeing a version mismatch (and error), while the new node computes with the old value.
    A view hands the rebase to its base (``_inplace_on_view``); a tensor that holds its values
    elsewhere (``fusegrad.func.vmap``'s batched tensors) does the op its own way."""
    if type(self) is not Tensor and type(self) is not _ViewTensor:
        hook = getattr(self, "_inplace_hook", None)
        if hook is not None:
            return hook(op, fn, args, kwargs)
    needs_graph = _grad_mode._state.enabled and (
        self.requires_grad
        # a view made under no_grad has no grad_fn, yet its base's history is at stake (the
        # error for it is raised by ``_check_inplace``)
        or (self._base is not None and self._base.requires_grad)
        or _builtins.any(isinstance(a, Tensor) and a.requires_grad for a in args)
        or _builtins.any(isinstance(a, Tensor) and a.requires_grad for a in kwargs.values())
    )
    _check_inplace(self, op, needs_graph)
    _check_writable(self, op)  # before computing anything (PyTorch checks overlap first too)
    if not needs_graph:
        if len(args) == 1 and not kwargs and _inplace_ufunc(self, fn, args[0]):
            return self
        with _grad_mode.no_grad():
            result = fn(self, *args, **kwargs)
        _write(self, result, op)
        if _forward_state.level is not None:  # a dual level: the tangent follows the value
            _forward_state.level.inplace_update(self, result)
        return self
    if self._base is not None:
        return _inplace_on_view(self, op, fn, args, kwargs)
    snapshot = _created(Tensor._make(self._data.copy()), self)  # (self's values, as a copy)
    snapshot.grad_fn, snapshot._output_nr = self.grad_fn, self._output_nr
    if _forward_state.level is not None:
        _forward_state.level.carry_tangent(snapshot, self)
    result = _cast_result(self, fn(snapshot, *args, **kwargs))
    if result.grad_fn is None and snapshot.grad_fn is not None:
        # a non-differentiable result (eq_, sign-like ops, normal_): as in PyTorch the tensor
        # keeps requiring grad, with a zero gradient for its old value (the same as a view of
        # it would get through its base, see ``_inplace_on_view``)
        result = _zero_grad_through(result, snapshot)
    _write(self, result, op)
    self._set_history(result.grad_fn, result._output_nr)  # moves a retain_grad along
    if _forward_state.level is not None:
        _forward_state.level.inplace_update(self, result)
    return self


# in-place arithmetic whose out-of-place result would be the ufunc's on the same operands:
# the op surface's function -> the ufunc (``_inplace_ufunc``); filled once the surface exists
_INPLACE_UFUNCS: dict = {}
_INPLACE_DTYPES = (_dt.float32, _dt.float64)


def _inplace_ufunc(self: Tensor, fn: Any, other: Any) -> bool:
    """``self op= other`` as one ufunc call writing into ``self``'s memory, where the general
    path (the op out of place, then a copy into ``self``) would compute the same values: a plain
    CPU float32/float64 ``self`` recording nothing (grad mode or no history: the caller decided),
    no tracer, no forward AD, and ``other`` a Python number or a tensor of ``self``'s dtype and
    shape (or 0-d).  numpy computes overlapping operands as if from copies.  One pass over the
    memory instead of three and no temporary: ``clip_grad_norm_``'s scaling of the LSTM-LM's
    gradients (1.5 M values) 0.6 -> 0.1 ms.  False, with nothing done, otherwise."""
    ufunc = _INPLACE_UFUNCS.get(fn)
    if (
        ufunc is None
        or self._dtype not in _INPLACE_DTYPES
        or _forward_state.level is not None
        or (_tracer_threads and _tracer_state.tracer is not None)
        or registry.ERROR_STATE is None
    ):
        return False
    data = self._data
    if type(data) is not np.ndarray:
        return False
    kind = type(other)
    if kind is float or kind is int:
        operand = _scalar_tensor(other, self._dtype)._data
    elif (
        (kind is Tensor or kind is _ViewTensor)
        and other._dtype is self._dtype
        and type(other._data) is np.ndarray
        and (other._data.shape == data.shape or other._data.ndim == 0)
    ):
        operand = other._data
    else:
        return False
    out = _writable(data)
    token = registry.ERROR_STATE.set(registry.QUIET)
    try:
        ufunc(out, operand, out=out)
    finally:
        registry.ERROR_STATE.reset(token)
    self._version_counter.bump()
    return True


def _zero_grad_through(result: Tensor, old: Tensor) -> Tensor:
    """``result``'s value, recorded as depending on ``old`` with a zero gradient (a ``where``
    that always picks ``result``: unlike ``old * 0`` it cannot turn an inf or nan into nan)."""
    everywhere = _created(Tensor._make(_storage.full_like(result._data, True, bool)))
    return where(everywhere, result, old)


def _inplace_on_view(view: Tensor, op: str, fn: Any, args: tuple, kwargs: dict) -> Tensor:
    """In-place op on a view while recording: rewrite the base's history (PyTorch's CopySlices)
    with existing primitives.

    The op runs out of place on the view's old value, taken as the view ops replayed on the
    base's old history (so, as in PyTorch, hooks on the view's previous ``grad_fn`` are not on
    the path).  The base's new value is ``index_put(old base, result, view positions)``: its
    rule sends the gradient of the written region to the op's node (and on to the view's old
    value and the op's other operands) and the rest to the base's old history.  The view's
    ``grad_fn`` is regenerated from the base on its next read, since the version moved."""
    base = view._base
    # The base's current value with its current history.  Its data is shared, not copied:
    # the view primitives replayed on it save no data tensors.
    old_base = Tensor._make(base._data)
    old_base.grad_fn, old_base._output_nr = base.grad_fn, base._output_nr
    region = _replay_view(old_base, view._view_info.steps)
    # a copy: the op's node may save its input, and the view's storage is overwritten below
    snapshot = _created(Tensor._make(_storage.copy(region._data)), region)
    snapshot.grad_fn, snapshot._output_nr = region.grad_fn, region._output_nr
    if _forward_state.level is not None:
        _forward_state.level.carry_tangent(snapshot, view)
    result = _cast_result(view, fn(snapshot, *args, **kwargs))
    _check_result(view, result, op)  # before the base's history changes
    _write(view, result, op)
    _rewrite_base(view, result)
    if _forward_state.level is not None:
        _forward_state.level.inplace_update(view, result)
    return view


def _rewrite_base(view: Tensor, result: Tensor) -> None:
    """Give ``view``'s base the history of its new value: its old value and history with the
    view's elements replaced by ``result`` (whose node is the in-place op's), i.e.
    ``index_put(old base, result, positions of the view in the base)``."""
    base = view._base
    # The base's value with its history before this change.  Its data is shared, not copied:
    # index_put saves only its index tensors, and only the node is kept.
    old_base = Tensor._make(base._data)
    old_base.grad_fn, old_base._output_nr = base.grad_fn, base._output_nr
    steps = view._view_info.steps
    value = result
    # Views that change the dtype (z.real, view_as_real(z), ...) have no element positions in
    # their base: from the last of them outwards, the new value of what that view was taken
    # from is built from the written value and the parts it leaves alone (the base's memory
    # already holds the new values, so replaying the views reads those parts unchanged).
    while _builtins.any(prim in _DTYPE_VIEWS for prim, _ in steps):
        j = _builtins.max(i for i, (prim, _) in enumerate(steps) if prim in _DTYPE_VIEWS)
        if j + 1 < len(steps):
            value = _put(_replay_view(old_base, steps[: j + 1]), value, steps[j + 1 :])
        value = _DTYPE_VIEWS[steps[j][0]](_replay_view(old_base, steps[:j]), value)
        steps = steps[:j]
    new_base = _put(old_base, value, steps) if steps else value
    base._set_history(new_base.grad_fn, new_base._output_nr)


def _put(base: Tensor, value: Tensor, steps: tuple) -> Tensor:
    """``base`` with the elements of its view ``steps`` (no dtype-changing step) replaced by
    ``value``: an ``index_put`` at the view's positions."""
    index, key = _view_positions(base, steps)
    value = value if index or value.ndim == 0 else value.reshape(())  # 0-d base: key ()
    return index_put_spec(base, value, index, key)


# dtype-changing views: name -> (what the view was taken from, the view's new value) -> the
# new value of what it was taken from
_DTYPE_VIEWS = {
    "real": lambda outer, value: complex(value, imag(outer)),
    "imag": lambda outer, value: complex(real(outer), value),
    "view_as_real": lambda outer, value: view_as_complex(value.contiguous()),
    "view_as_complex": lambda outer, value: view_as_real(value),
}


def _rebase_history(self: Tensor, grad_fn: Any, output_nr: int) -> None:
    """After ``self`` was modified in place by an op whose backward is output ``output_nr`` of
    ``grad_fn`` (a custom Function's ``mark_dirty``): a tensor takes that node as its history; a
    view hands it to its base, whose history is rewritten as for the built-in in-place ops
    (PyTorch's CopySlices), and the view's ``grad_fn`` is regenerated."""
    if self._base is None:
        self._set_history(grad_fn, output_nr)
        return
    _check_inplace(self, "mark_dirty", True)
    value = Tensor._make(self._data)
    value.grad_fn, value._output_nr = grad_fn, output_nr
    _rewrite_base(self, value)
    self._view_info.attr_version = -1  # stale even if forward wrote without bumping


def _inplace_method(name: str, fn: Any) -> Any:
    def method(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return inplace(self, name, fn, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"In-place version of :func:`{fn.__name__}`."
    return method


def _fill(self: Tensor, value: Any) -> Tensor:
    grad_value = isinstance(value, Tensor) and value.requires_grad
    # (a dual level: a tensor value's tangent fills the tangent, through the where below)
    dual_value = isinstance(value, Tensor) and _forward_state.level is not None
    if not (_grad_mode._state.enabled and (self.requires_grad or grad_value)) and not dual_value:
        return full_like(self, value.item() if isinstance(value, Tensor) else value)
    # keep the result in the graph (PyTorch's FillBackward): self gets a zero gradient, a
    # tensor value the sum of the gradient
    if isinstance(value, Tensor) and value.ndim != 0:
        raise ShapeError(
            f"fill_ only supports 0-dimension value tensor but got tensor with {value.ndim} "
            "dimensions."
        )
    everywhere = _created(Tensor._make(_storage.full_like(self._data, True, bool)))
    v = value if isinstance(value, Tensor) else _util.as_operand(value, self.dtype)
    return where(everywhere, cast(v, self.dtype), self)


def _zero(self: Tensor) -> Tensor:
    return _fill(self, 0)


def _copy(self: Tensor, src: Any) -> Tensor:
    s = src if isinstance(src, Tensor) else to_tensor(src, self.dtype)
    s = cast(s, self.dtype)
    if tuple(s.shape) != tuple(self.shape):
        s = s.broadcast_to(tuple(self.shape))
    if _grad_mode._state.enabled and (self.requires_grad or s.requires_grad):
        # PyTorch's CopyBackwards: src gets the gradient, self's old history a zero one (a
        # where, not ``self * 0``, which would turn an inf or nan in self into nan)
        everywhere = _created(Tensor._make(_storage.full_like(self._data, True, bool)))
        return where(everywhere, s, self)
    if _forward_state.level is not None:
        return clone(s)  # (a dual level: the copy keeps ``src``'s tangent)
    return clone(s).detach()


def _normal(self: Tensor, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> Tensor:
    shape, dtype = tuple(self.shape), self.dtype.np

    def draw() -> Tensor:
        return Tensor._make((_gen(generator).standard_normal(shape) * std + mean).astype(dtype))

    return _created(draw(), draw)


def _uniform(self: Tensor, a: float = 0.0, b: float = 1.0, *, generator: Any = None) -> Tensor:
    shape, dtype = tuple(self.shape), self.dtype.np

    def draw() -> Tensor:
        return Tensor._make(_gen(generator).uniform(a, b, shape).astype(dtype))

    return _created(draw(), draw)


def _addcmul(self: Tensor, t1: Any, t2: Any, *, value: Any = 1) -> Tensor:
    return add(self, mul(mul(t1, t2), value))


def _addcdiv(self: Tensor, t1: Any, t2: Any, *, value: Any = 1) -> Tensor:
    return add(self, mul(div(t1, t2), value))


@_torch_node_name("AddcmulBackward0")
def addcmul(input: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
    return _addcmul(to_tensor(input), tensor1, tensor2, value=value)


@_torch_node_name("AddcdivBackward0")
def addcdiv(input: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
    return _addcdiv(to_tensor(input), tensor1, tensor2, value=value)


def _clamp_min(input: Tensor, min: Any) -> Tensor:  # noqa: A002  (PyTorch's argument name)
    return clamp(input, min=min)


def _clamp_max(input: Tensor, max: Any) -> Tensor:  # noqa: A002
    return clamp(input, max=max)


def _polygamma(self: Tensor, n: int) -> Tensor:
    """``Tensor.polygamma(n)``: the tensor is the second argument of ``polygamma(n, input)``."""
    return polygamma(n, self)


def _setitem(self: Tensor, key: Any, value: Any) -> None:
    inplace(self, "__setitem__", setitem_value, key, value)


# ---- installation on Tensor ------------------------------------------------------------------
# methods of composites (a primitive's methods are flags of its record)
_METHODS = [
    # elementwise
    "square",
    "lerp",
    "exp2",
    "log2",
    "log10",
    "rsqrt",
    "tan",
    "i0",
    "igamma",
    "igammac",
    "relu",
    "clamp",
    "clip",
    "nan_to_num",
    "bitwise_not",
    "isfinite",
    "isclose",
    "allclose",
    "equal",
    # reductions
    "mean",
    "max",
    "min",
    "var",
    "std",
    "norm",
    "logsumexp",
    "logcumsumexp",
    "softmax",
    "log_softmax",
    "count_nonzero",
    # sorting
    "sort",
    "argsort",
    "msort",
    "topk",
    "kthvalue",
    "median",
    "cummax",
    "cummin",
    "mode",
    "multinomial",
    # searching and counting
    "histc",
    "nonzero",
    "argwhere",
    "unique",
    "unique_consecutive",
    # shape
    "view",
    "view_as",
    "reshape_as",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "transpose",
    "swapaxes",
    "swapdims",
    "t",
    "movedim",
    "expand",
    "expand_as",
    "sum_to_size",
    "contiguous",
    "narrow",
    "select",
    "split",
    "chunk",
    "unbind",
    "roll",
    "repeat",
    "tile",
    "diag",
    "tril",
    "triu",
    # indexing
    "index_select",
    "masked_fill",
    "masked_select",
    "take_along_dim",
    "index_add",
    "index_copy",
    "index_fill",
    # linalg
    "mm",
    "bmm",
    "mv",
    "dot",
    "inner",
    "outer",
    "ger",
    "addmm",
    "baddbmm",
    "addbmm",
    "cross",
    "diff",
    "cumprod",
    "sinc",
    "repeat_interleave",
    "addcmul",
    "addcdiv",
    # complex
    "conj",
    "conj_physical",
    "resolve_conj",
    "resolve_neg",
    "is_conj",
    "is_neg",
    "angle",
    "sgn",
    "adjoint",
    "isreal",
]

# in-place methods of composites and of what is not an op (fill_, copy_, normal_, ...)
_INPLACE = {
    "relu_": relu,
    "clamp_": clamp,
    "clip_": clamp,
    "square_": square,
    "i0_": i0,
    "igamma_": igamma,
    "igammac_": igammac,
    "lerp_": lerp,
    "masked_fill_": masked_fill,
    "addcmul_": _addcmul,
    "addcdiv_": _addcdiv,
    "fill_": _fill,
    "zero_": _zero,
    "copy_": _copy,
    "normal_": _normal,
    "uniform_": _uniform,
    "nan_to_num_": nan_to_num,
    "exp2_": exp2,
    "log2_": log2,
    "log10_": log10,
    "rsqrt_": rsqrt,
    "tan_": tan,
    "clamp_min_": _clamp_min,
    "clamp_max_": _clamp_max,
    "bitwise_not_": bitwise_not,
    "index_add_": index_add,
    "index_copy_": index_copy,
    "index_fill_": index_fill,
    "polygamma_": _polygamma,
    "conj_physical_": conj_physical,
    "sgn_": sgn,
}


def _record_names() -> dict[str, Any]:
    """The functions and methods the primitives' records declare: name -> the op-surface
    function (aliases included), with in-place methods under ``name_``.  Each record's surface
    function is the one of the same name in this namespace (generated or hand-written)."""
    g = globals()
    out: dict[str, Any] = {}
    for prim in REGISTRY.values():
        if not (prim.method or prim.inplace or prim.aliases):
            continue
        fn = g.get(prim.name)
        if fn is None:
            raise AssertionError(
                f"{prim.name}: its record declares methods or aliases, but the op surface has "
                "no function of that name (set the record's surface flag, or write one)"
            )
        for name in (prim.name, *prim.aliases):
            if prim.method:
                out[name] = fn
            if prim.inplace:
                out[name + "_"] = _inplace_method(name + "_", fn)
            if name != prim.name:
                g[name] = fn  # the alias as a function: fusegrad.true_divide, ...
    return out


def _install_methods() -> None:
    g = globals()
    # the records' own ufuncs; ``div``'s kernel is ``true_divide`` cast back to the float
    # operands' dtype, which it already is for same-dtype floats
    _INPLACE_UFUNCS.update({g[n]: REGISTRY[n].ufunc for n in ("add", "sub", "mul")})
    _INPLACE_UFUNCS[g["div"]] = np.true_divide
    records = _record_names()
    twice = set(records) & (set(_METHODS) | set(_INPLACE))
    if twice:
        raise AssertionError(f"methods declared by a record and listed again: {sorted(twice)}")
    for name, method in records.items():
        setattr(Tensor, name, method)
    for name in _METHODS:
        setattr(Tensor, name, g[name])
    for name, fn in _INPLACE.items():
        setattr(Tensor, name, _inplace_method(name, fn))
    # more of PyTorch's methods (``extra``'s tables)
    for name in METHOD_NAMES:
        setattr(Tensor, name, g[name])
    for name in INPLACE_NAMES:
        setattr(Tensor, name + "_", _inplace_method(name + "_", g[name]))
    for name, fn in INPLACE_OTHER.items():
        setattr(Tensor, name, _inplace_method(name, fn))
    for name, fn in OTHER_METHODS.items():
        setattr(Tensor, name, fn)
    for name, fn in PROPERTIES.items():
        setattr(Tensor, name, property(fn))
    Tensor.__lshift__ = bitwise_left_shift
    Tensor.__rshift__ = bitwise_right_shift
    Tensor.__rlshift__ = lambda self, other: bitwise_left_shift(other, self)
    Tensor.__rrshift__ = lambda self, other: bitwise_right_shift(other, self)
    Tensor.__ilshift__ = _inplace_method("__ilshift__", bitwise_left_shift)
    Tensor.__irshift__ = _inplace_method("__irshift__", bitwise_right_shift)
    # a view's grad_fn: regenerated from its base (by replaying view ops) after in-place changes
    _ViewTensor.grad_fn = property(  # type: ignore[assignment]
        _view_grad_fn,
        _set_view_grad_fn,
        doc="The node that produced this view (regenerated "
        "from the base when the base or another view of it was modified in place).",
    )
    Tensor.to = to
    Tensor.type = _type
    Tensor.polygamma = _polygamma
    for attr, d in [
        ("float", _dt.float32),
        ("double", _dt.float64),
        ("long", _dt.int64),
        ("int", _dt.int32),
        ("bool", _dt.bool_),
        ("half", _dt.float16),
        ("cfloat", _dt.complex64),
        ("cdouble", _dt.complex128),
        ("short", _dt.int16),
        ("char", _dt.int8),
        ("byte", _dt.uint8),
    ]:
        setattr(Tensor, attr, _converter(d))
    Tensor.bfloat16 = _converter(_dt.bfloat16) if _dt.bfloat16 else _no_bfloat16  # type: ignore
    Tensor.T = property(lambda self: permute(self, tuple(range(self.ndim))[::-1]))
    Tensor.mT = property(lambda self: transpose(self, -2, -1))
    # the conjugate transposes (the transposes themselves for real tensors)
    Tensor.H = property(lambda self: conj(permute(self, tuple(range(self.ndim))[::-1])))
    Tensor.mH = property(lambda self: conj(transpose(self, -2, -1)))
    Tensor.real = property(real, _set_real, doc="The real parts (a view; ``self`` if real).")
    Tensor.imag = property(imag, _set_imag, doc="The imaginary parts of a complex tensor.")
    Tensor.__getitem__ = getitem
    Tensor.__setitem__ = _setitem
    binary = {
        "add": add,
        "sub": sub,
        "mul": mul,
        "truediv": div,
        "floordiv": floor_divide,
        "mod": remainder,
        "pow": pow,
        "matmul": matmul,
        "and": bitwise_and,
        "or": bitwise_or,
        "xor": bitwise_xor,
    }
    for name, fn in binary.items():
        setattr(Tensor, f"__{name}__", _forward(fn))
        setattr(Tensor, f"__r{name}__", _reverse(fn))
        setattr(Tensor, f"__i{name}__", _inplace_method(f"__i{name}__", fn))
    # the arithmetic operators of every model and derivative rule: their common calls in line
    for name, prim in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div")):
        setattr(Tensor, f"__{name}__", _fast_forward(binary[name], REGISTRY[prim]))
        if name != "sub":
            setattr(Tensor, f"__r{name}__", _fast_reverse(binary[name], REGISTRY[prim]))
    Tensor.__rsub__ = _fast_rsub(_forward(rsub))  # (number - tensor: PyTorch's RsubBackward1)
    for name, fn in {"eq": eq, "ne": ne, "lt": lt, "le": le, "gt": gt, "ge": ge}.items():
        setattr(Tensor, f"__{name}__", _forward(fn))
    Tensor.__neg__ = neg
    Tensor.__pos__ = lambda self: self
    Tensor.__abs__ = abs
    Tensor.__invert__ = bitwise_not
    for name in ("new_zeros", "new_ones", "new_empty"):
        setattr(
            Tensor,
            name,
            _new_factory({"new_zeros": zeros, "new_ones": ones, "new_empty": empty}[name]),
        )
    Tensor.new_full = _new_full
    Tensor.new_tensor = _new_tensor


def _set_real(self: Tensor, value: Any) -> None:
    """``z.real = x``: writes the real parts (``self`` itself when it is real)."""
    real(self).copy_(value)


def _set_imag(self: Tensor, value: Any) -> None:
    imag(self).copy_(value)


def _forward(fn: Any) -> Any:
    def op(self: Tensor, other: Any) -> Any:
        if not isinstance(
            other, (Tensor, int, float, _builtins.complex, bool, np.ndarray, np.number, list)
        ):
            return NotImplemented
        return fn(self, other)

    return op


def _reverse(fn: Any) -> Any:
    def op(self: Tensor, other: Any) -> Any:
        if not isinstance(
            other, (Tensor, int, float, _builtins.complex, bool, np.ndarray, np.number, list)
        ):
            return NotImplemented
        return fn(other, self)

    return op


# ``_fast_forward``, ``_fast_reverse`` and ``_fast_rsub``: ``+ - * /`` with a tensor on the left
# (or, reversed, a number on the left), in the cases that the op's promotion passes through
# unchanged: two tensors of one dtype (floating for ``/``, not bool for ``-``), or a floating
# tensor and a Python int or float (a wrapped number of the tensor's dtype).  They run the
# primitive as ``registry.apply`` would -- ``registry.run`` when no forward-AD level and no
# tracer wants the call -- without the frames of the operator, the op-surface function and its
# promotion helpers (each op of a small model pays for them).  Anything else takes the full path,
# which decides exactly as before.


_grad_state = _grad_mode._state  # (the thread-local object itself is never replaced)
_grad_off_threads = _grad_mode.grad_off_threads  # (empty: grad mode is on in every thread)
_ndarray = np.ndarray

# The wrapped numbers of the fast paths below while grad mode is off (every derivative rule's
# ``1.0 - out``, an optimizer's ``p * 0.9``): no node is recorded, so nothing keeps them, and one
# read-only tensor per (value, dtype) serves every such call.  NaN (never equal to itself) and
# zeros (0.0 and -0.0 are equal keys) are made anew each time; the table is emptied past 256.
_NO_GRAD_SCALARS: dict = {}


def _no_grad_scalar(value: Any, dtype: _dt.dtype) -> Tensor:
    if value != value or value == 0:
        return _scalar_tensor(value, dtype)
    key = (value, dtype)
    t = _NO_GRAD_SCALARS.get(key)
    if t is None:
        if len(_NO_GRAD_SCALARS) >= 256:
            _NO_GRAD_SCALARS.clear()
        t = _scalar_tensor(value, dtype)
        t._data.flags.writeable = False
        _NO_GRAD_SCALARS[key] = t
    return t


def _fast_forward(fn: Any, prim: Any) -> Any:
    full = _forward(fn)
    name = prim.name
    min_category = 2 if name == "div" else 0  # int / int is a float division
    no_bool = name == "sub"  # bool - bool raises (in ``sub``)

    def op(self: Tensor, other: Any) -> Any:
        if isinstance(other, Tensor):
            dt = self._dtype
            if (
                other._dtype is not dt
                or dt.category < min_category
                or (no_bool and dt is _dt.bool_)
            ):
                return full(self, other)
            a, b = self._data, other._data
            operands = (self, other)
            if (
                type(a) is _ndarray
                and type(b) is _ndarray
                and _forward_state.level is None
                and (not _tracer_threads or _tracer_state.calls is None)
            ):
                # numpy's ufunc says whether the shapes broadcast (``generated._run_broadcast``,
                # in line here)
                try:
                    return _run(prim, operands, {})
                except ValueError:
                    _util.broadcast_shape(name, self, other)  # (raises if that was the cause)
                    raise
            if a.shape != b.shape and a.ndim and b.ndim:  # (a 0-d operand always broadcasts)
                _util.broadcast_shape(name, self, other)
        else:
            kind = type(other)
            if not ((kind is float or kind is int) and self._dtype.category == 2):
                return full(self, other)
            if _forward_state.level is None and (
                not _tracer_threads or _tracer_state.calls is None
            ):
                if not _grad_off_threads or _grad_state._enabled:
                    return _run(prim, (self, _scalar_tensor(other, self._dtype)), {})
                return _run(prim, (self, _no_grad_scalar(other, self._dtype)), {})
            operands = (self, _scalar_tensor(other, self._dtype))
        if _forward_state.level is None and (not _tracer_threads or _tracer_state.calls is None):
            return _run(prim, operands, {})
        return apply(prim, operands, {})

    op.__name__ = op.__qualname__ = full.__name__
    return op


def _fast_reverse(fn: Any, prim: Any) -> Any:
    full = _reverse(fn)

    def op(self: Tensor, other: Any) -> Any:
        kind = type(other)
        if not ((kind is float or kind is int) and self._dtype.category == 2):
            return full(self, other)
        if _forward_state.level is None and (not _tracer_threads or _tracer_state.calls is None):
            if not _grad_off_threads or _grad_state._enabled:
                return _run(prim, (_scalar_tensor(other, self._dtype), self), {})
            return _run(prim, (_no_grad_scalar(other, self._dtype), self), {})
        return apply(prim, (_scalar_tensor(other, self._dtype), self), {})

    op.__name__ = op.__qualname__ = full.__name__
    return op


def _fast_rsub(full: Any) -> Any:
    prim = REGISTRY["sub"]

    def op(self: Tensor, other: Any) -> Any:
        kind = type(other)
        if (
            (kind is float or kind is int)
            and self._dtype.category == 2
            and _forward_state.level is None
            and (not _tracer_threads or _tracer_state.calls is None)
        ):
            if not _grad_off_threads or _grad_state._enabled:
                out = _run(prim, (_scalar_tensor(other, self._dtype), self), {})
            else:
                out = _run(prim, (_no_grad_scalar(other, self._dtype), self), {})
            node = out.grad_fn
            if node is not None:  # (made by this call: what ``rsub``'s naming checks)
                node._name = "RsubBackward1"
            return out
        return full(self, other)

    op.__name__ = op.__qualname__ = full.__name__
    return op


def _new_factory(factory: Any) -> Any:
    def make(
        self: Tensor,
        *size: Any,
        dtype: Any = None,
        device: Any = None,
        requires_grad: bool = False,
        **ignored: Any,  # layout=, pin_memory=: fusegrad has one of each
    ) -> Tensor:
        return factory(
            *size,
            dtype=dtype or self.dtype,
            device=self.device if device is None else device,
            requires_grad=requires_grad,
        )

    return make


def _new_full(
    self: Tensor,
    size: Any,
    fill_value: Any,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    **ignored: Any,
) -> Tensor:
    return full(
        size,
        fill_value,
        dtype=dtype or self.dtype,
        device=self.device if device is None else device,
        requires_grad=requires_grad,
    )


def _new_tensor(
    self: Tensor,
    data: Any,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    **ignored: Any,
) -> Tensor:
    return tensor(
        data,
        dtype=dtype or self.dtype,
        device=self.device if device is None else device,
        requires_grad=requires_grad,
    )


def _method_function(name: str) -> Any:
    """``fusegrad.<name>(input, ...)``: the Tensor method of that name (``torch.abs_(x)`` is
    ``x.abs_()``)."""

    def call(input: Tensor, *args: Any, **kwargs: Any) -> Any:
        return getattr(input, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``input.{name}(...)``."
    return call


_install_methods()
# the in-place forms PyTorch also has at top level (torch.abs_(x), torch.zero_(x), ...)
for _name in TOP_LEVEL_INPLACE:
    if hasattr(Tensor, _name):
        globals()[_name] = _method_function(_name)


def _adapt_spellings() -> None:
    """numpy's ``axis=``/``keepdims=`` on every function and method taking ``dim``/``keepdim``,
    and ``out=`` on the top-level functions (``spellings``).  A method that is also a
    top-level function gets the same wrapper (``Tensor.exp is fusegrad.exp`` stays true)."""
    g = globals()
    wrapped: dict[int, Any] = {}

    def once(fn: Any, out: bool) -> Any:
        if id(fn) not in wrapped:
            wrapped[id(fn)] = adapt(fn, out=out)
        return wrapped[id(fn)]

    for name, value in list(g.items()):
        if name.startswith("_") or not inspect.isfunction(value):
            continue
        if not getattr(value, "__module__", "").startswith("fusegrad.ops"):
            continue
        g[name] = once(value, out=True)
        if g[name] is not value:
            # pickled by reference (RPC sends functions so): found here under its own name
            g[name].__module__, g[name].__qualname__ = __name__, name
    for cls in (Tensor, _ViewTensor):
        for name, value in list(vars(cls).items()):
            if not name.startswith("_") and inspect.isfunction(value):
                setattr(cls, name, once(value, out=False))


_adapt_spellings()
