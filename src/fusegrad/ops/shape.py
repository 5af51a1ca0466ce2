"""Shape and view op surface: reshape/view, permute/transpose, expand, squeeze/unsqueeze,
flatten, narrow/select/split/chunk/unbind, cat/stack, flip/roll, repeat/tile, pad, diagonal,
tril/triu.

Only reshape, permute, broadcast_to, getitem (for slicing), cat, flip, pad and diagonal are
primitives; the rest are composites of those.  Results that numpy can express as views share
storage and the version counter with their base and record how to rebuild them from it
(``views.py``: ``_view_op``, which the indexing surface uses too).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import storage as _storage
from ..autograd.node_names import name_node as _name_node
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..autograd.tracer import notify_check as _check
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import notify_created_as as _created_as
from ..autograd.tracer import notify_host_read as _read
from ..cuda.array import CudaArray
from ..errors import DTypeError, ShapeError, describe
from ..size import broadcast_shapes
from ..tensor import DEFAULT, MULTI_OUTPUT, Tensor
from ._util import (
    P,
    apply,
    broadcast_shape,
    cast,
    scalar_tensor,
    shape_arg,
    to_tensor,
    wrap_dim,
    wrap_dims,
)
from .creation import arange, zeros
from .elementwise import add, where
from .indexing import index_add_at, index_select
from .views import _view_op, replay_view, view_positions  # noqa: F401  (the last two: re-exported)


def _mark_multi_output(outs: tuple, name: str) -> tuple:
    """Outputs of a function returning several views (split, chunk, unbind) may not be
    modified in place, nor used after their base was (PyTorch's MULTI_OUTPUT_NODE)."""
    for i, o in enumerate(outs):
        info = getattr(o, "_view_info", None) if o._base is not None else None
        if info is not None and info.creation == DEFAULT:
            info.creation = MULTI_OUTPUT
            info.origin = (name, i)
    return outs


def _infer_shape(op: str, x: Tensor, shape: tuple) -> tuple:
    n = x._data.size
    if shape.count(-1) > 1:
        raise ShapeError(f"{op}: only one dimension can be inferred, got shape {shape}")
    known = 1
    for s in shape:
        if s != -1:
            if s < 0:
                raise ShapeError(f"{op}: invalid shape dimension {s} in {shape}")
            known *= s
    if -1 in shape:
        if known == 0 or n % known:
            raise ShapeError(
                f"{op}: shape {list(shape)} is invalid for input of size {n} "
                f"(input shape {tuple(x.shape)})"
            )
        shape = tuple(n // known if s == -1 else s for s in shape)
    elif known != n:
        raise ShapeError(
            f"{op}: shape {list(shape)} is invalid for input of size {n} "
            f"(input shape {tuple(x.shape)})"
        )
    return shape


def reshape(input: Any, *shape: Any) -> Tensor:
    x = to_tensor(input)
    target = _infer_shape("reshape", x, shape_arg(shape))
    if target == x._data.shape:
        return _alias(x)
    out = _view_op(x, "reshape", {"shape": target})
    # not a view (the strides do not allow one): PyTorch copies, then _unsafe_view
    return out if out._base is not None else _name_node(out, "UnsafeViewBackward0")


def _alias(x: Tensor) -> Tensor:
    # reshape to the same shape: still a new tensor object (a view), as in PyTorch
    return _view_op(x, "reshape", {"shape": x._data.shape})


def view(input: Tensor, *shape: Any) -> Tensor:
    x = to_tensor(input)
    if len(shape) == 1 and not isinstance(shape[0], (int, tuple, list, np.integer)):
        return _view_dtype(x, _dt.as_dtype(shape[0]))
    target = _infer_shape("view", x, shape_arg(shape))
    probe = x._data.probe().view() if x.is_cuda else x._data.view()
    try:
        probe.shape = target
    except AttributeError:
        raise ShapeError(
            f"view: view size is not compatible with input tensor's size and stride (input "
            f"shape {tuple(x.shape)}, strides {x.stride()}, requested {list(target)}); at least "
            "one dimension spans across two contiguous subspaces. Use .reshape(...) instead."
        ) from None
    return _view_op(x, "reshape", {"shape": target})


def _view_dtype(x: Tensor, dtype: _dt.dtype) -> Tensor:
    """``x.view(dtype)``: the same bytes read as ``dtype`` (no conversion).  With a different
    element size the last dim (which must be contiguous) grows or shrinks by the ratio.  Not
    differentiable (as in PyTorch); the result shares storage and version counter with ``x``,
    so saved tensors still notice changes made through it."""
    if dtype is x.dtype:
        return _view_op(x, "reshape", {"shape": tuple(x.shape)})
    old, new = x.dtype.itemsize, dtype.itemsize
    data = x._data
    if old != new:
        last = x.shape[-1] if x.ndim else 0
        itemstrides = [st // old for st in data.strides]
        problem = None
        if x.ndim == 0:
            problem = "self.dim() cannot be 0"
        elif itemstrides[-1] != 1 and last != 1:
            problem = "self.stride(-1) must be 1"
        elif (last * old) % new:
            problem = f"self.size(-1) ({last}) * {old} must be divisible by {new}"
        elif builtins.any((st * old) % new for st in itemstrides[:-1]):
            problem = f"every other stride ({itemstrides[:-1]}) * {old} must be divisible by {new}"
        if problem is not None:
            raise ShapeError(
                f"view: to view a {describe(x)} tensor as {dtype.name}, whose element size "
                f"differs ({old} vs {new} bytes), {problem}"
            )
    if isinstance(data, np.ndarray):
        if old != new and data.strides[-1] != old:  # a unit last dim with another stride
            data = data.reshape(data.shape[:-1] + (1,))
            data = np.lib.stride_tricks.as_strided(data, data.shape, data.strides[:-1] + (old,))
        out = data.view(dtype.np)
    else:
        shape, strides = list(data.shape), list(data.strides)
        if old != new:
            shape[-1] = shape[-1] * old // new
            strides[-1] = new
        out = CudaArray(
            data.buffer, tuple(shape), tuple(strides), data.offset, dtype.np, data.writeable
        )
    _read(x, "view(dtype)")  # (a compiled region cannot follow a reinterpretation of bytes)
    t = Tensor._make(out)
    t._version_counter = x._version_counter
    t._inference = x._inference
    return _created(t)


def view_as(input: Tensor, other: Tensor) -> Tensor:
    return view(input, tuple(other.shape))


def reshape_as(input: Tensor, other: Tensor) -> Tensor:
    return reshape(input, tuple(other.shape))


def flatten(input: Any, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    x = to_tensor(input)
    if x.ndim == 0:
        return reshape(x, (1,))
    s = wrap_dim("flatten", start_dim, x.ndim)
    e = wrap_dim("flatten", end_dim, x.ndim)
    if s > e:
        raise ShapeError(f"flatten: start_dim {start_dim} cannot come after end_dim {end_dim}")
    shp = x._data.shape
    return reshape(x, shp[:s] + (int(np.prod(shp[s : e + 1])),) + shp[e + 1 :])


def unflatten(input: Any, dim: int, sizes: Sequence[int]) -> Tensor:
    x = to_tensor(input)
    d = wrap_dim("unflatten", dim, x.ndim)
    shp = x._data.shape
    sizes = tuple(sizes)
    if -1 in sizes:
        known = int(np.prod([s for s in sizes if s != -1]))
        sizes = tuple(shp[d] // known if s == -1 else s for s in sizes)
    if int(np.prod(sizes)) != shp[d]:
        raise ShapeError(
            f"unflatten: provided sizes {list(sizes)} don't multiply up to the size of dim {dim} "
            f"({shp[d]}) in the input tensor of shape {tuple(shp)}"
        )
    return reshape(x, shp[:d] + sizes + shp[d + 1 :])


def squeeze(input: Any, dim: Any = None) -> Tensor:
    x = to_tensor(input)
    shp = x._data.shape
    if dim is None:
        dims = tuple(i for i, s in enumerate(shp) if s == 1)
    else:
        dims = wrap_dims("squeeze", dim, x.ndim) or ()
        dims = tuple(d for d in dims if x.ndim and shp[d] == 1)
    out = reshape(x, tuple(s for i, s in enumerate(shp) if i not in dims))
    # PyTorch's overloads: squeeze() 0, squeeze(int) 1, squeeze(tuple of ints) 2
    overload = 0 if dim is None else 1 if isinstance(dim, (int, np.integer)) else 2
    return _name_node(out, f"SqueezeBackward{overload}")


@_torch_node_name("UnsqueezeBackward0")
def unsqueeze(input: Any, dim: int) -> Tensor:
    x = to_tensor(input)
    d = wrap_dim("unsqueeze", dim, x.ndim + 1)
    shp = x._data.shape
    return reshape(x, shp[:d] + (1,) + shp[d:])


def permute(input: Any, *dims: Any) -> Tensor:
    x = to_tensor(input)
    dims = shape_arg(dims)
    if len(dims) != x.ndim:
        raise ShapeError(
            f"permute: number of dims don't match: tensor of shape {tuple(x.shape)} has "
            f"{x.ndim} dims but {len(dims)} were given ({dims})"
        )
    wrapped = tuple(wrap_dim("permute", d, x.ndim) for d in dims)
    if len(set(wrapped)) != len(wrapped):
        raise ShapeError(f"permute: repeated dim in {dims}")
    if wrapped == tuple(range(x.ndim)):
        return _alias(x)
    return _view_op(x, "permute", {"dims": wrapped})


@_torch_node_name("TransposeBackward0")
def transpose(input: Any, dim0: int, dim1: int) -> Tensor:
    x = to_tensor(input)
    if x.ndim == 0:
        return _alias(x)
    a = wrap_dim("transpose", dim0, x.ndim)
    b = wrap_dim("transpose", dim1, x.ndim)
    dims = list(range(x.ndim))
    dims[a], dims[b] = dims[b], dims[a]
    return permute(x, dims)


swapaxes = swapdims = transpose


@_torch_node_name("TBackward0")
def t(input: Any) -> Tensor:
    x = to_tensor(input)
    if x.ndim > 2:
        raise ShapeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.ndim}D")
    return transpose(x, 0, 1) if x.ndim == 2 else _alias(x)


def movedim(input: Any, source: Any, destination: Any) -> Tensor:
    x = to_tensor(input)
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    src = [wrap_dim("movedim", s, x.ndim) for s in src]
    dst = [wrap_dim("movedim", d, x.ndim) for d in dst]
    order = [d for d in range(x.ndim) if d not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return permute(x, order)


@_torch_node_name("ExpandBackward0")
def expand(input: Any, *sizes: Any) -> Tensor:
    x = to_tensor(input)
    sizes = shape_arg(sizes)
    if len(sizes) < x.ndim:
        raise ShapeError(
            f"expand: the number of sizes provided ({len(sizes)}) must be greater or equal to the "
            f"number of dimensions in the tensor ({x.ndim})"
        )
    lead = len(sizes) - x.ndim
    target = []
    for i, s in enumerate(sizes):
        old = x._data.shape[i - lead] if i >= lead else None
        if s == -1:
            if old is None:
                raise ShapeError("expand: -1 is not allowed in a leading, non-existing dimension")
            s = old
        elif old is not None and old != 1 and old != s:
            raise ShapeError(
                f"expand: the expanded size of the tensor ({s}) must match the existing size "
                f"({old}) at non-singleton dimension {i}.  Target sizes: {list(sizes)}.  "
                f"Tensor sizes: {list(x.shape)}"
            )
        target.append(s)
    return broadcast_to(x, tuple(target))


def expand_as(input: Tensor, other: Tensor) -> Tensor:
    return expand(input, tuple(other.shape))


@_torch_node_name("ExpandBackward0")
def broadcast_to(input: Any, shape: Sequence[int]) -> Tensor:
    x = to_tensor(input)
    shape = shape_arg((shape,))
    if shape == x._data.shape:
        return _alias(x)
    try:
        ok = len(shape) >= x.ndim and broadcast_shapes(x._data.shape, shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(
            f"broadcast_to: tensor of shape {tuple(x.shape)} cannot be broadcast to {shape}"
        )
    return _view_op(x, "broadcast_to", {"shape": shape})


def broadcast_tensors(*tensors: Any) -> tuple:
    ts = [to_tensor(t) for t in tensors]
    shape = broadcast_shape("broadcast_tensors", *ts)
    return tuple(broadcast_to(t, shape) for t in ts)


def sum_to(input: Tensor, shape: Sequence[int]) -> Tensor:
    """Sum a broadcast tensor back down to ``shape`` (the inverse of broadcast_to)."""
    shape = tuple(shape)
    if tuple(input.shape) == shape:
        return input
    return apply(P["sum_to"], (input,), {"shape": shape})


def sum_to_size(input: Tensor, *size: Any) -> Tensor:
    return sum_to(input, shape_arg(size))


def contiguous(input: Tensor, memory_format: Any = None) -> Tensor:
    """``input`` (C-contiguous), or a C-contiguous copy; ``memory_format`` is accepted (fusegrad
    keeps one memory order, see ``fusegrad.layouts``)."""
    return input if input._data.flags.c_contiguous else clone(input)


def clone(input: Any, *, memory_format: Any = None) -> Tensor:
    return apply(P["clone"], (to_tensor(input),), {})


def narrow(input: Any, dim: int, start: int, length: int) -> Tensor:
    x = to_tensor(input)
    d = wrap_dim("narrow", dim, x.ndim)
    size = x._data.shape[d]
    if start < 0:
        start += size
    if not (0 <= start <= size and 0 <= length and start + length <= size):
        raise ShapeError(
            f"narrow: start ({start}) + length ({length}) exceeds dimension size ({size}) of "
            f"dim {dim} in tensor of shape {tuple(x.shape)}"
        )
    key = (slice(None),) * d + (slice(start, start + length),)
    return x[key]


def select(input: Any, dim: int, index: int) -> Tensor:
    x = to_tensor(input)
    d = wrap_dim("select", dim, x.ndim)
    return x[(slice(None),) * d + (int(index),)]


def split(tensor: Any, split_size_or_sections: Any, dim: int = 0) -> tuple:
    x = to_tensor(tensor)
    d = wrap_dim("split", dim, x.ndim)
    size = x._data.shape[d]
    if isinstance(split_size_or_sections, (int, np.integer)):
        step = int(split_size_or_sections)
        if step <= 0 and size:
            raise ValueError(f"split: split_size must be positive, got {step}")
        sizes = [min(step, size - i) for i in range(0, size, step)] if size else [0]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != size:
            raise ShapeError(
                f"split: split_with_sizes expects split_sizes to sum exactly to {size} "
                f"(input tensor's size at dimension {dim}), but got split_sizes={sizes}"
            )
    outs, start = [], 0
    # PyTorch: split(int) is SplitBackward0, split(list of sizes) SplitWithSizesBackward0
    name = (
        "SplitBackward0"
        if isinstance(split_size_or_sections, (int, np.integer))
        else ("SplitWithSizesBackward0")
    )
    for s in sizes:
        outs.append(_name_node(narrow(x, d, start, s), name))
        start += s
    return _mark_multi_output(tuple(outs), name)


def chunk(input: Any, chunks: int, dim: int = 0) -> tuple:
    x = to_tensor(input)
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    d = wrap_dim("chunk", dim, x.ndim)
    size = x._data.shape[d]
    if size == 0:  # PyTorch: `chunks` empties
        return _mark_multi_output(
            tuple(_name_node(narrow(x, d, 0, 0), "SplitBackward0") for _ in range(chunks)),
            "SplitBackward0",
        )
    return split(x, math.ceil(size / chunks), d)


def unbind(input: Any, dim: int = 0) -> tuple:
    x = to_tensor(input)
    d = wrap_dim("unbind", dim, x.ndim)
    outs = tuple(_name_node(select(x, d, i), "UnbindBackward0") for i in range(x._data.shape[d]))
    return _mark_multi_output(outs, "UnbindBackward0")


def cat(tensors: Sequence[Any], dim: int = 0) -> Tensor:
    ts = [to_tensor(t) for t in tensors]
    if not ts:
        raise ValueError("cat: expected a non-empty list of Tensors")
    # PyTorch skips 1-D empty tensors (legacy behaviour)
    nonempty = [t for t in ts if not (t.ndim == 1 and t._data.shape[0] == 0)] or ts[:1]
    ref = nonempty[0]
    d = wrap_dim("cat", dim, ref.ndim)
    dt = _dt.result_type(*nonempty)
    for i, t in enumerate(nonempty):
        if t.ndim != ref.ndim or any(
            a != b for j, (a, b) in enumerate(zip(t.shape, ref.shape)) if j != d
        ):
            raise ShapeError(
                f"cat: sizes of tensors must match except in dimension {d}: expected "
                f"{tuple(ref.shape)}, got {tuple(t.shape)} for tensor number {i} in the list"
            )
    cast_ts = [cast(t, dt) for t in nonempty]
    if len(cast_ts) == 1:
        # cat always returns new memory (never a view of its input)
        return cast_ts[0] if cast_ts[0] is not nonempty[0] else clone(cast_ts[0])
    nonempty = cast_ts
    return apply(P["cat"], tuple(nonempty), {"dim": d})


concat = concatenate = cat


@_torch_node_name("StackBackward0")
def stack(tensors: Sequence[Any], dim: int = 0) -> Tensor:
    ts = [to_tensor(t) for t in tensors]
    if not ts:
        raise ValueError("stack: expected a non-empty list of Tensors")
    for i, t in enumerate(ts):
        if t.shape != ts[0].shape:
            raise ShapeError(
                f"stack: expects each tensor to be equal size, but got {tuple(ts[0].shape)} at "
                f"entry 0 and {tuple(t.shape)} at entry {i}"
            )
    d = wrap_dim("stack", dim, ts[0].ndim + 1)
    return cat([unsqueeze(t, d) for t in ts], d)


def hstack(tensors: Sequence[Any]) -> Tensor:
    ts = [to_tensor(t) for t in tensors]
    return cat(ts, 0 if ts[0].ndim == 1 else 1)


def vstack(tensors: Sequence[Any]) -> Tensor:
    return cat([to_tensor(t) if to_tensor(t).ndim > 1 else unsqueeze(t, 0) for t in tensors], 0)


def flip(input: Any, dims: Any) -> Tensor:
    x = to_tensor(input)
    d = wrap_dims("flip", dims, x.ndim)
    if not d or x.ndim == 0:
        return clone(x)
    return apply(P["flip"], (x,), {"dims": d})


@_torch_node_name("RollBackward0")
def roll(input: Any, shifts: Any, dims: Any = None) -> Tensor:
    x = to_tensor(input)
    if dims is None:
        return reshape(roll(flatten(x), shifts, 0), tuple(x.shape))
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(dims):
        raise ShapeError(f"roll: shifts {shifts} and dims {dims} must have the same length")
    out = x
    for s, d in zip(shifts, dims):
        d = wrap_dim("roll", d, x.ndim)
        n = x._data.shape[d]
        if n == 0:
            continue
        s %= n
        if s:
            out = cat([narrow(out, d, n - s, s), narrow(out, d, 0, n - s)], d)
    return out if out is not x else clone(x)


@_torch_node_name("RepeatBackward0")
def repeat(input: Any, *sizes: Any) -> Tensor:
    x = to_tensor(input)
    reps = shape_arg(sizes)
    if len(reps) < x.ndim:
        raise ShapeError(
            f"repeat: number of repeat dims ({len(reps)}) can not be smaller than number of "
            f"dimensions of tensor ({x.ndim})"
        )
    shp = (1,) * (len(reps) - x.ndim) + tuple(x.shape)
    # interleave a new axis of size r before each dim, broadcast, and merge the pairs
    y = reshape(x, tuple(v for s in shp for v in (1, s)))
    y = broadcast_to(y, tuple(v for r, s in zip(reps, shp) for v in (r, s)))
    out = reshape(y, tuple(r * s for r, s in zip(reps, shp)))
    # repeat always returns new memory; with only unit repeats the reshapes above are views
    return clone(out) if _storage.may_share_memory(out._data, x._data) else out


def tile(input: Any, *dims: Any) -> Tensor:
    x = to_tensor(input)
    dims = shape_arg(dims)  # tile(x, (2, 1)), x.tile(2, 1) and x.tile(2), as PyTorch takes them
    if len(dims) < x.ndim:
        dims = (1,) * (x.ndim - len(dims)) + dims
    return repeat(x, dims)


def _pad_name(input: Any, pad: Sequence[int], mode: str = "constant", *rest: Any, **kw: Any) -> Any:
    # PyTorch's padding kernels, by mode and by the number of padded dims
    dims = len(pad) // 2
    return {
        "constant": "ConstantPadNdBackward0",
        "reflect": f"ReflectionPad{dims}DBackward0",
        "replicate": f"ReplicationPad{dims}DBackward0",
    }.get(mode)


@_torch_node_name(_pad_name)
def pad(
    input: Any, pad: Sequence[int], mode: str = "constant", value: float | None = None
) -> Tensor:
    """``F.pad``: ``pad`` lists (left, right) pairs starting from the last dimension."""
    x = to_tensor(input)
    pad = [int(p) for p in pad]
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise ShapeError(
            f"pad: padding length {len(pad)} must be even and at most 2 * ndim ({x.ndim}) "
            f"for input {describe(x)}"
        )
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    for d, ((before, after), n) in enumerate(zip(widths, x.shape)):
        # a crop may empty a dim only in constant mode (reflect and replicate read the
        # uncropped input, circular wraps around what the crop leaves)
        least = 0 if mode == "constant" else 1
        cropped = n + min(before, 0) + min(after, 0)
        if n + before + after < least or (mode in ("constant", "circular") and cropped < least):
            raise ShapeError(
                f"pad: padding ({before}, {after}) at dimension {d} of input {list(x.shape)} "
                f"crops more than the dimension holds (output size {n + before + after}, "
                f"mode {mode!r})"
            )
    if mode == "constant":
        if any(b < 0 or a < 0 for b, a in widths):
            # negative padding crops
            key = tuple(slice(max(-b, 0), s - max(-a, 0)) for (b, a), s in zip(widths, x.shape))
            x = x[key]
            widths = [(max(b, 0), max(a, 0)) for b, a in widths]
        if all(w == (0, 0) for w in widths):
            return clone(x)
        return apply(P["pad"], (x,), {"widths": tuple(widths), "value": value or 0.0})
    if mode in ("reflect", "replicate", "circular"):
        out = x
        for d, (before, after) in enumerate(widths):
            if before or after:
                out = _index_pad(out, d, before, after, mode)
        return out
    raise NotImplementedError(f"Unrecognised padding mode {mode}")


def _index_pad(x: Tensor, d: int, before: int, after: int, mode: str) -> Tensor:
    """Pad (or crop, where a width is negative) dim ``d`` by gathering from the input: output
    position ``i`` reads input position ``i - before`` mapped back into ``[0, n)`` by
    reflection or clamping (circular padding wraps around the cropped middle instead).  Widths
    are checked against the input's own size, as in PyTorch (a crop on one side does not shrink
    what the other side may reflect)."""
    n = x._data.shape[d]
    if mode == "reflect" and (before >= n or after >= n):
        raise ShapeError(
            f"Argument #4: Padding size should be less than the corresponding input dimension, "
            f"but got: padding ({before}, {after}) at dimension {d} of input {list(x.shape)}"
        )
    kept = n - max(-before, 0) - max(-after, 0)  # what a crop leaves
    if mode == "circular" and (before > kept or after > kept):
        raise ShapeError(
            f"Padding value causes wrapping around more than once (padding ({before}, {after}) "
            f"at dimension {d} of input {list(x.shape)})"
        )
    idx = np.arange(-before, n + after)
    if mode == "reflect":
        idx = np.abs(idx)
        idx = np.where(idx >= n, 2 * (n - 1) - idx, idx)
    elif mode == "replicate":
        idx = np.clip(idx, 0, n - 1)
    else:
        # circular: a negative width crops first, and the wrapped parts copy the cropped
        # middle (PyTorch's order)
        start, stop = max(-before, 0), n - max(-after, 0)
        idx = start + (np.arange(-max(before, 0), stop - start + max(after, 0)) % (stop - start))
    return index_select(x, d, _created(Tensor._make(idx.astype(np.int64))))


def diagonal(input: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    x = to_tensor(input)
    a = wrap_dim("diagonal", dim1, x.ndim)
    b = wrap_dim("diagonal", dim2, x.ndim)
    if a == b:
        raise ShapeError(f"diagonal: dimensions cannot be identical {dim1}, {dim2}")
    return _view_op(x, "diagonal", {"offset": int(offset), "dim1": a, "dim2": b})


def diagonal_backward(g: Tensor, shape: tuple, offset: int, dim1: int, dim2: int) -> Tensor:
    """The gradient of ``diagonal``: ``g`` placed on the diagonal of zeros of ``shape``."""
    ndim = len(shape)
    others = [d for d in range(ndim) if d not in (dim1, dim2)]
    length = g.shape[-1]
    r = np.arange(length, dtype=np.int64)
    i1 = _created(Tensor._make(r + max(-offset, 0)))
    i2 = _created(Tensor._make(r + max(offset, 0)))
    # in the permuted layout (others..., dim1, dim2) the diagonal is [..., i1, i2]
    pshape = tuple(shape[d] for d in others) + (shape[dim1], shape[dim2])
    key = (("e",), ("t", 0), ("t", 1))
    placed = index_add_at(g, (i1, i2), key, pshape)
    order = others + [dim1, dim2]
    inverse = [order.index(d) for d in range(ndim)]
    return permute(placed, inverse)


def diag(input: Any, diagonal_: int = 0) -> Tensor:
    x = to_tensor(input)
    if x.ndim == 2:
        return diagonal(x, diagonal_)
    if x.ndim != 1:
        raise ShapeError(f"diag: expected a 1-D or 2-D tensor, got {describe(x)}")
    n = x._data.shape[0] + builtins_abs(diagonal_)
    z = zeros(n, n, dtype=x.dtype)
    return add_diag(z, x, diagonal_)


def builtins_abs(v: int) -> int:
    return v if v >= 0 else -v


def add_diag(z: Tensor, x: Tensor, offset: int) -> Tensor:
    return add(z, diagonal_backward(x, tuple(z.shape), offset, 0, 1))


def _tri_mask(x: Tensor, diagonal_: int, lower: bool) -> Tensor:
    if x.ndim < 2:
        raise ShapeError(
            f"{'tril' if lower else 'triu'}: input tensor must have at least 2 "
            f"dimensions, got {describe(x)}"
        )
    r, c = x._data.shape[-2:]
    m = np.tri(r, c, diagonal_, dtype=bool)
    mask = Tensor._make(m if lower else ~np.tri(r, c, diagonal_ - 1, dtype=bool))
    # (i, j) is kept where j - i <= diagonal (tril) or j - i >= diagonal (triu): a recording
    # may make the mask again at other sizes (``Tracer.created_as``)
    mask = _created_as(mask, ("band", int(r), int(c), int(diagonal_), "le" if lower else "ge"))
    return mask.to(x.device)


def _tri(x: Tensor, diagonal_: int, lower: bool) -> Tensor:
    # the zero is of x's own dtype, so bool and int tensors keep their dtype
    return where(_tri_mask(x, diagonal_, lower), x, scalar_tensor(0, x.dtype))


@_torch_node_name("TrilBackward0")
def tril(input: Any, diagonal: int = 0) -> Tensor:
    return _tri(to_tensor(input), diagonal, True)


@_torch_node_name("TriuBackward0")
def triu(input: Any, diagonal: int = 0) -> Tensor:
    return _tri(to_tensor(input), diagonal, False)


def diff(input: Any, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Tensor:
    """The ``n``-th forward difference along ``dim``, after concatenating ``prepend`` and
    ``append`` there; bool tensors differ by ``!=`` (PyTorch's logical xor)."""
    x = to_tensor(input)
    if x.ndim == 0:
        raise ShapeError("diff: expected at least a 1-D tensor, got a 0-D tensor")
    if n < 0:
        raise ValueError(f"diff: order must be non-negative, got {n}")
    d = wrap_dim("diff", dim, x.ndim)
    parts = [to_tensor(t) for t in (prepend, x, append) if t is not None]
    if len(parts) > 1:
        x = cat(parts, d)
    for _ in range(n):
        length = x.shape[d]
        if length == 0:
            break
        hi, lo = x.narrow(d, 1, length - 1), x.narrow(d, 0, length - 1)
        x = hi != lo if x.dtype == _dt.bool_ else hi - lo
    return x


def repeat_interleave(
    input: Any, repeats: Any = None, dim: int | None = None, *, output_size: int | None = None
) -> Tensor:
    """Repeat each slice along ``dim`` (the flattened tensor when ``dim`` is None) ``repeats``
    times: an int, or a 0-D / 1-D integer tensor with one count per slice (its values are read
    on the host, as PyTorch syncs; ``output_size`` is checked against their total).  Given only
    a 1-D integer tensor, ``repeat_interleave(repeats)`` repeats ``arange(len(repeats))``."""
    if repeats is None:
        counts = to_tensor(input)
        positions = arange(counts.shape[0] if counts.ndim else 1, dtype=_dt.int64)
        return repeat_interleave(positions, counts, 0, output_size=output_size)
    x = to_tensor(input)
    if dim is None:
        x, d = x.reshape(-1), 0
    else:
        d = wrap_dim("repeat_interleave", dim, max(x.ndim, 1))
        if x.ndim == 0:
            x = x.reshape(1)
    size = x.shape[d]
    if isinstance(repeats, Tensor):
        if repeats._dtype.category != 1:
            raise DTypeError(
                f"repeat_interleave: repeats must be an integer tensor, got {describe(repeats)}"
            )
        if repeats.ndim > 1:
            raise ShapeError(
                f"repeat_interleave: repeats must be 0-D or 1-D, got {describe(repeats)}"
            )
        if repeats.numel() not in (1, size):
            raise ShapeError(
                f"repeat_interleave: repeats must have the same size as input along dim "
                f"({repeats.numel()} vs {size})"
            )
        if output_size is not None:
            return x.index_select(d, _device_index(repeats.reshape(-1), size, output_size))
        # the output's shape is the repeats' total: Python reads the values (PyTorch syncs)
        counts = _read(repeats, "repeat_interleave() with tensor repeats", repeats._data)
        counts = np.asarray(_storage.to_host(counts)).reshape(-1)
        if counts.size == 1:
            counts = np.broadcast_to(counts, (size,))
    else:
        counts = np.full(size, int(repeats), dtype=np.int64)
    if counts.shape != (size,):
        raise ShapeError(
            f"repeat_interleave: repeats must have the same size as input along dim "
            f"({counts.shape[0]} vs {size})"
        )
    if (counts < 0).any():
        raise ShapeError("repeat_interleave: repeats can not be negative")
    total = int(counts.sum())
    if output_size is not None and output_size != total:
        raise ShapeError(
            f"repeat_interleave: output_size {output_size} does not match the total of "
            f"repeats {total}"
        )
    index = _created(Tensor._make(np.repeat(np.arange(size, dtype=np.int64), counts)))
    if x.device.type != "cpu":  # (the gather index lives where the input does)
        index = index.to(x.device)
    return index_select(x, d, index)


def _device_index(repeats: Tensor, size: int, output_size: int) -> Tensor:
    """The gather index of ``repeat_interleave`` computed from the repeats tensor, so that a
    compiled step replays it without reading values: output position ``k`` takes slice
    ``#{j : cumsum(repeats)[j] <= k}``.  ``O(output_size * size)`` work, the price of having
    no host read; the values are still checked (non-negative, total ``output_size``)."""

    def check(array: Any) -> None:
        counts = np.broadcast_to(np.asarray(_storage.to_host(array)).reshape(-1), (size,))
        if (counts < 0).any():
            raise ShapeError("repeat_interleave: repeats can not be negative")
        if int(counts.sum()) != output_size:
            raise ShapeError(
                f"repeat_interleave: output_size {output_size} does not match the total of "
                f"repeats {int(counts.sum())}"
            )

    _check(repeats, check)
    ends = repeats.expand(size).cumsum(0)
    positions = arange(output_size, dtype=_dt.int64).to(repeats.device)
    return (positions.unsqueeze(1) >= ends.unsqueeze(0)).sum(1)
