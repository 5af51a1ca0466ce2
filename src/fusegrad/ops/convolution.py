"""Convolution, pooling, fold/unfold and unpooling over 1, 2 or 3 spatial dims.

Convolutions (transposed too), max, average and adaptive pooling of float32 / float64 tensors
run as primitives with kernels of their own (``convolution``, ``avg_pool``, ``pool_index`` +
``pool_take``, ...: ``ops/conv_kernels.py`` on the CPU, ``cuda/convolution.py`` and
``cuda/pooling.py`` on CUDA; ``kernel_ok`` says when).  Everything else, and those ops for
other dtypes, under a forward-AD level or inside ``window_kernels(False)``, runs the
composites below; the convolution's rule also uses them for a differentiable gradient
(``convolution_grads``).

The composites read its input through ``_windows``: every kernel window of an (N, C, *spatial)
input as (N, C, *kernel, *out), made of one strided basic slice per kernel offset and dim,
stacked.  The gradient of a basic slice writes ``g`` into zeros by slice assignment, so the
backward of im2col (col2im) is a few slice-adds, never a scatter with duplicate indices.  On
top of it:

* convolution: im2col and one (batched, grouped) matmul; while a graph is recorded it runs as
  one node (``autograd.native.Convolution``) that saves only the input and weight;
* transposed convolution: the input spread out by the stride (zeros between pixels), padded,
  and convolved with the flipped, channel-swapped weight;
* pooling: max (values by argmax and gather, so the gradient reaches one element per window,
  as PyTorch's), average (with PyTorch's divisors at the borders and for ``ceil_mode``),
  power-average, fractional max (random window starts) and adaptive pooling in 3-D;
  unpooling scatters values back to the positions pooling's indices name;
* ``unfold`` (im2col) and ``fold`` (col2im, the sum of overlapping windows).

Arguments are checked as PyTorch checks them (an int or a tuple of one length per spatial dim;
padding at most half the effective kernel for pooling), with PyTorch's words.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import storage as _storage
from ..autograd import grad_mode as _grad_mode
from ..autograd.forward_state import state as _forward_state
from ..autograd.node_names import name_node as _name_node
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import notify_host_read as _read
from ..errors import ShapeError, describe
from ..tensor import Tensor
from ._util import P, apply, to_tensor
from .creation import rand, zeros
from .elementwise import relu, sign
from .generated import abs, mul
from .indexing import index_add_at
from .reduction import sum
from .shape import pad, stack

# ``autograd.native`` (above the op surface) hands itself over on import (see its docstring)
_native: Any = None

_WORDS = {1: "one", 2: "two", 3: "three"}


def install_native(module: Any) -> None:
    """Called by ``fusegrad.autograd.native`` with itself."""
    global _native
    _native = module


def _records(*tensors: Tensor | None) -> bool:
    """Whether a call on ``tensors`` records a backward node: grad mode on, one of them
    requiring grad, and no forward-AD level (whose tangents come from the composites'
    primitives).  The convolution then runs as one node of ``native``."""
    if not _grad_mode.is_grad_enabled() or _forward_state.level is not None:
        return False
    return builtins.any(t is not None and t.requires_grad for t in tensors)


class _Kernels(threading.local):
    enabled = True


_kernels = _Kernels()


@contextlib.contextmanager
def window_kernels(enabled: bool) -> Iterator[None]:
    """Within the block, convolution and pooling on this thread run their kernels
    (``enabled=True``, the default) or the composites (``False``: the path before the kernels,
    for comparisons and benchmarks; the results agree to rounding)."""
    before = _kernels.enabled
    _kernels.enabled = bool(enabled)
    try:
        yield
    finally:
        _kernels.enabled = before


def kernel_ok(*tensors: Tensor | None) -> bool:
    """Whether a call on ``tensors`` runs the convolution and pooling primitives (kernels of
    their own, ``ops/conv_kernels.py``) rather than the composites: tensors of one dtype and
    device (the CPU, or CUDA: ``cuda/convolution.py``, ``cuda/pooling.py``), float32 or
    float64, and no forward-AD level (whose tangents come from the composites' primitives).
    Other dtypes run the composites, as everything does inside ``window_kernels(False)``."""
    if _forward_state.level is not None or not _kernels.enabled:
        return False
    first = tensors[0]
    if first is None or first.dtype not in (_dt.float32, _dt.float64):
        return False
    for t in tensors:
        if t is not None and (t.dtype is not first.dtype or t.device != first.device):
            return False
        if t is not None and t.device.type not in ("cpu", "cuda"):
            return False
    return True


def _check_windows(
    op: str,
    x: Tensor,
    kernel: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    ceil_mode: bool = False,
) -> tuple:
    """The window counts of ``x`` (N, C, *spatial), or the error ``windows`` raises when there
    is none."""
    n = len(kernel)
    sizes = tuple(x.shape[2:])
    outs = tuple(
        out_size(sizes[i], kernel[i], stride[i], padding[i], dilation[i], ceil_mode)
        for i in range(n)
    )
    if builtins.any(o <= 0 for o in outs):
        raise ShapeError(
            f"{op}: input {describe(x)} is too small for kernel {tuple(kernel)} with padding "
            f"{tuple(padding)}, stride {tuple(stride)}, dilation {tuple(dilation)} (output "
            f"would be {'x'.join(map(str, outs))})"
        )
    return outs


# ---- arguments -----------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def conv_tuple(op: str, name: str, value: Any, n: int) -> tuple[int, ...]:
    """A convolution's size argument: an int, or a sequence of one or ``n`` ints."""
    if _is_int(value):
        return (int(value),) * n
    values = [int(v) for v in value]
    if len(values) == 1:
        return (values[0],) * n
    if len(values) != n:
        raise ShapeError(
            f"{op}: expected {name} to be a single integer value or a list of {n} values to "
            f"match the convolution dimensions, but got {name}={values}"
        )
    return tuple(values)


def pool_tuple(op: str, name: str, value: Any, n: int, default: Any = None) -> tuple[int, ...]:
    """A pooling size argument: an int, or a sequence of one or ``n`` ints (``stride`` may be
    omitted: None or empty gives ``default``)."""
    if name == "stride" and (value is None or (not _is_int(value) and len(value) == 0)):
        return tuple(default)
    if _is_int(value):
        return (int(value),) * n
    values = [int(v) for v in value]
    if len(values) == 1:
        return (values[0],) * n
    if len(values) != n:
        lead = (
            "must either be omitted, a single int"
            if name == "stride"
            else (
                "must be either a single int"
                if name == "dilation"
                else "must either be a single int"
            )
        )
        raise ShapeError(
            f"{op}: {name} {lead}, or a tuple of {_WORDS[n]} ints (got {name}={values})"
        )
    return tuple(values)


def out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool = False) -> int:
    """Windows of kernel ``k``, stride ``s``, padding ``p`` and dilation ``d`` along a dim."""
    span = size + 2 * p - d * (k - 1) - 1
    n = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (n - 1) * s >= size + p:
        n -= 1  # the last window must start inside the input or left padding
    return n


def _spatial_input(op: str, x: Tensor, n: int) -> tuple[Tensor, bool]:
    """``x`` batched ((N, C, *spatial)) and whether it was unbatched ((C, *spatial))."""
    if x.ndim == n + 1:
        return x.unsqueeze(0), True
    if x.ndim != n + 2:
        raise ShapeError(
            f"{op}: Expected {n + 1}D (unbatched) or {n + 2}D (batched) input, but got input "
            f"of size: {list(x.shape)}"
        )
    return x, False


# ---- windows (im2col) and their transpose (col2im) --------------------------------------------


def windows(
    x: Tensor,
    kernel: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    pad_value: float,
    ceil_mode: bool = False,
    op: str = "unfold",
) -> Tensor:
    """(N, C, *spatial) -> (N, C, *kernel, *out): every kernel window, by strided slices."""
    n = len(kernel)
    if x.ndim != n + 2:
        raise ShapeError(f"{op}: expected a {n + 2}-D input (N, C, *spatial), got {describe(x)}")
    sizes = tuple(x.shape[2:])
    outs = [
        out_size(sizes[i], kernel[i], stride[i], padding[i], dilation[i], ceil_mode)
        for i in range(n)
    ]
    if builtins.any(o <= 0 for o in outs):
        raise ShapeError(
            f"{op}: input {describe(x)} is too small for kernel {tuple(kernel)} with padding "
            f"{tuple(padding)}, stride {tuple(stride)}, dilation {tuple(dilation)} (output "
            f"would be {'x'.join(map(str, outs))})"
        )
    extras = [
        builtins.max(
            (outs[i] - 1) * stride[i]
            + dilation[i] * (kernel[i] - 1)
            + 1
            - (sizes[i] + 2 * padding[i]),
            0,
        )
        for i in range(n)
    ]
    if builtins.any(padding) or builtins.any(extras):
        widths: list[int] = []
        for i in reversed(range(n)):  # F.pad lists the last dim first
            widths += [padding[i], padding[i] + extras[i]]
        x = pad(x, tuple(widths), value=pad_value)
    # the last spatial dim first: each slide puts its kernel offsets at dim 2, so the spatial
    # dim to slide next is always at dim n + 1, and the kernel dims end up in order
    for i in reversed(range(n)):
        x = _slide(x, n + 1, kernel[i], stride[i], dilation[i], outs[i])
    return x


def _slide(x: Tensor, dim: int, size: int, stride: int, dilation: int, count: int) -> Tensor:
    """The ``size`` windows' offsets along ``dim`` as a new dim 2: ``out[:, :, a, ..., i, ...]
    = x[..., a * dilation + i * stride, ...]`` (``dim`` of ``x`` becomes ``count`` long)."""
    span = (count - 1) * stride + 1
    lead = (slice(None),) * dim
    parts = [x[lead + (slice(a * dilation, a * dilation + span, stride),)] for a in range(size)]
    # one offset (a unit kernel): a view, no copy
    return parts[0].unsqueeze(2) if size == 1 else stack(parts, 2)


def col2im(
    cols: Tensor, shape: tuple, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple
) -> Tensor:
    """The transpose of ``windows``: ``cols`` holding (N, C, *kernel, *out) elements -> the
    (N, C, *spatial) sum of every window put back where it was read (padding cropped)."""
    n = len(kernel)
    batch, channels, sizes = shape[0], shape[1], tuple(shape[2:])
    outs = [out_size(sizes[i], kernel[i], stride[i], padding[i], dilation[i]) for i in range(n)]
    fulls = [
        builtins.max(
            sizes[i] + 2 * padding[i], (outs[i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1
        )
        for i in range(n)
    ]
    g = cols.reshape(batch, channels, *kernel, *outs)
    for i in range(n):
        g = _unslide(g, n + 1, kernel[i], stride[i], dilation[i], outs[i], fulls[i])
    if tuple(fulls) != sizes:
        g = g[
            (slice(None), slice(None))
            + tuple(slice(padding[i], padding[i] + sizes[i]) for i in range(n))
        ]
    return g


def _unslide(
    g: Tensor, dim: int, size: int, stride: int, dilation: int, count: int, length: int
) -> Tensor:
    """The transpose of ``_slide``: ``g`` with the window offsets at dim 2 -> each offset's
    part added into the strided slice of a ``length``-long ``dim`` (counted without dim 2)
    that the forward read it from."""
    span = (count - 1) * stride + 1
    shape = list(g.shape)
    del shape[2]
    shape[dim] = length
    full = ("s", None, None, 1)
    total = None
    for a in range(size):
        key = (full,) * dim + (("s", a * dilation, a * dilation + span, stride),)
        part = index_add_at(g.select(2, a), (), key, tuple(shape))
        total = part if total is None else total + part
    return total


# ---- unfold / fold -----------------------------------------------------------------------------


@_torch_node_name("Im2ColBackward0")
def unfold(
    input: Tensor, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1
) -> Tensor:
    """im2col: (N, C, H, W) or (C, H, W) -> (N, C * kh * kw, L), one column per window."""
    x = to_tensor(input)
    if x.ndim not in (3, 4):
        raise ShapeError(f"Input Error: Only 3D or 4D input Tensors are supported (got {x.ndim}D)")
    batched, unbatched = _spatial_input("unfold", x, 2)
    k = conv_tuple("unfold", "kernel_size", kernel_size, 2)
    win = windows(
        batched,
        k,
        conv_tuple("unfold", "stride", stride, 2),
        conv_tuple("unfold", "padding", padding, 2),
        conv_tuple("unfold", "dilation", dilation, 2),
        0.0,
    )
    n, c, kh, kw, oh, ow = win.shape
    out = win.reshape(n, c * kh * kw, oh * ow)
    return out.squeeze(0) if unbatched else out


@_torch_node_name("Col2ImBackward0")
def fold(
    input: Tensor,
    output_size: Any,
    kernel_size: Any,
    dilation: Any = 1,
    padding: Any = 0,
    stride: Any = 1,
) -> Tensor:
    """col2im: (N, C * kh * kw, L) or (C * kh * kw, L) -> (N, C, H, W), overlapping windows
    summed (the transpose of ``unfold``)."""
    x = to_tensor(input)
    if x.ndim not in (2, 3):
        raise ShapeError(
            f"Input Error: Only unbatched (2D) or batched (3D) input Tensors are supported "
            f"(got {x.ndim}D)"
        )
    unbatched = x.ndim == 2
    if unbatched:
        x = x.unsqueeze(0)
    size = conv_tuple("fold", "output_size", output_size, 2)
    k = conv_tuple("fold", "kernel_size", kernel_size, 2)
    d = conv_tuple("fold", "dilation", dilation, 2)
    p = conv_tuple("fold", "padding", padding, 2)
    s = conv_tuple("fold", "stride", stride, 2)
    n, rows, length = x.shape
    if rows % (k[0] * k[1]):
        raise ShapeError(
            "Expected size of input's dimension 1 to be divisible by the product of "
            f"kernel_size, but got input.size(1)={rows} and kernel_size={k}"
        )
    blocks = [out_size(size[i], k[i], s[i], p[i], d[i]) for i in range(2)]
    if blocks[0] * blocks[1] != length:
        raise ShapeError(
            f"Given output_size={size}, kernel_size={k}, dilation={d}, padding={p}, "
            f"stride={s}, expected size of input's dimension 2 to match the calculated number "
            f"of sliding blocks {blocks[0]} * {blocks[1]} = {blocks[0] * blocks[1]}, but got "
            f"input.size(2)={length}."
        )
    out = col2im(x, (n, rows // (k[0] * k[1]), *size), k, s, p, d)
    return out.squeeze(0) if unbatched else out


# ---- convolution -------------------------------------------------------------------------------


def convolution(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
    n: int,
    op: str,
) -> Tensor:
    """An ``n``-d convolution (cross-correlation) of (N, C, *spatial) or (C, *spatial) inputs
    by an (O, C / groups, *kernel) weight, plus an optional (O,) bias."""
    x, w = to_tensor(input), to_tensor(weight)
    if w.ndim != n + 2:
        raise ShapeError(
            f"{op}: weight must be {n + 2}-D (out, in/groups, *kernel), got {describe(w)}"
        )
    if x.ndim not in (n + 1, n + 2):
        raise ShapeError(
            f"Expected {n + 1}D (unbatched) or {n + 2}D (batched) input to {op}, but got input "
            f"of size: {list(x.shape)}"
        )
    if x.ndim == n + 1:
        return convolution(
            x.unsqueeze(0), w, bias, stride, padding, dilation, groups, n, op
        ).squeeze(0)
    if groups <= 0:
        raise ShapeError(f"{op}: non-positive groups is not supported (groups={groups})")
    if x.shape[1] != w.shape[1] * groups or w.shape[0] % groups:
        raise ShapeError(
            f"{op}: input {describe(x)} does not fit weight {describe(w)} with groups={groups} "
            f"(expected {w.shape[1] * groups} input channels)"
        )
    s = conv_tuple(op, "stride", stride, n)
    d = conv_tuple(op, "dilation", dilation, n)
    if builtins.min(s) <= 0 or builtins.min(d) <= 0:
        raise ShapeError(f"{op}: stride and dilation must be positive (stride={s}, dilation={d})")
    if isinstance(padding, str):
        if padding == "valid":
            p = (0,) * n
        elif padding == "same":
            if s != (1,) * n:
                raise ShapeError(f"{op}: padding='same' is not supported for strided convolutions")
            totals = [d[i] * (w.shape[2 + i] - 1) for i in range(n)]
            if builtins.any(t % 2 for t in totals):
                # as PyTorch: an odd total padding puts the extra row/column at the end
                widths: list[int] = []
                for t in reversed(totals):
                    widths += [t // 2, t - t // 2]
                x = pad(x, tuple(widths))
                p = (0,) * n
            else:
                p = tuple(t // 2 for t in totals)
        else:
            raise ShapeError(
                f"{op}: invalid padding string {padding!r}, should be one of 'valid', 'same'"
            )
    else:
        p = conv_tuple(op, "padding", padding, n)
        if builtins.min(p) < 0:
            raise ShapeError(f"{op}: negative padding is not supported (padding={p})")
    b = None if bias is None else to_tensor(bias)
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise ShapeError(
            f"{op}: expected bias to be 1-dimensional with {w.shape[0]} elements, but got bias "
            f"of size {list(b.shape)} instead"
        )
    geometry = (s, p, d, groups, op)
    if kernel_ok(x, w, b):
        _check_windows(op, x, tuple(w.shape[2:]), s, p, d)
        attrs = {
            "stride": s,
            "padding": p,
            "dilation": d,
            "groups": groups,
            "transposed": False,
            "output_padding": (0,) * n,
        }
        return apply(P["convolution"], (x, w) if b is None else (x, w, b), attrs)
    if _records(x, w, b):
        return _native.Convolution.apply(x, w, b, *geometry)
    return conv_columns(x, w, b, *geometry)


def conv_columns(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    groups: int,
    op: str,
) -> Tensor:
    """Convolution as im2col and one (batched, grouped) matmul, plus the bias."""
    out_c, cin_g = w.shape[0], w.shape[1]
    kernel = tuple(w.shape[2:])
    win = windows(x, kernel, stride, padding, dilation, 0.0, op=op)
    n = len(kernel)
    outs = tuple(win.shape[2 + n :])
    taps = math.prod(kernel)
    cols = win.reshape(x.shape[0], groups, cin_g * taps, math.prod(outs))
    wmat = w.reshape(groups, out_c // groups, cin_g * taps)
    out = (wmat @ cols).reshape(x.shape[0], out_c, *outs)
    if bias is not None:
        out = out + bias.reshape(1, out_c, *((1,) * n))
    return out


def convolution_grads(
    g: Tensor,
    x: Tensor | None,
    w: Tensor | None,
    need_x: bool,
    need_w: bool,
    x_shape: tuple,
    w_shape: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    groups: int,
    transposed: bool,
) -> tuple[Tensor | None, Tensor | None]:
    """The input's and the weight's gradients of the ``convolution`` primitive for the gradient
    ``g`` of its output, in the op surface (im2col by strided slices, col2im by slice-adds,
    matmuls): what its derivative rule computes where a graph of the gradient is wanted, so
    that the gradients differentiate again.  ``x`` is needed for the weight's gradient only,
    ``w`` for the input's."""
    n = len(stride)
    kernel = tuple(w_shape[2:])
    batch = g.shape[0]
    gx = gw = None
    if not transposed:
        out_c = w_shape[0]
        g_mat = g.reshape(batch, groups, out_c // groups, math.prod(g.shape[2:]))
        if need_x:
            w_mat = w.reshape(groups, out_c // groups, -1)
            gx = col2im(w_mat.mT @ g_mat, (batch, *x_shape[1:]), kernel, stride, padding, dilation)
        if need_w:
            win = windows(x, kernel, stride, padding, dilation, 0.0)
            cols = win.reshape(batch, groups, -1, math.prod(g.shape[2:]))
            gw = (g_mat @ cols.mT).sum(0).reshape(w_shape)
        return gx, gw
    # y = conv^T(x): x's gradient is the convolution of g (its first x-sized windows: an
    # output_padding row at the end is read by no window), w's is x times g's columns
    sizes = tuple(x_shape[2:])
    crop = (slice(None), slice(None)) + tuple(slice(0, v) for v in sizes)
    if need_x:
        gx = conv_columns(g, w, None, stride, padding, dilation, groups, "conv_transpose")
        if tuple(gx.shape[2:]) != sizes:
            gx = gx[crop]
    if need_w:
        win = windows(g, kernel, stride, padding, dilation, 0.0)
        if tuple(win.shape[2 + n :]) != sizes:
            win = win[(slice(None),) * (2 + n) + crop[2:]]
        cols = win.reshape(batch, groups, -1, math.prod(sizes))
        x_mat = x.reshape(batch, groups, x_shape[1] // groups, math.prod(sizes))
        gw = (x_mat @ cols.mT).sum(0).reshape(w_shape)
    return gx, gw


def conv_transpose(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Any,
    padding: Any,
    output_padding: Any,
    groups: int,
    dilation: Any,
    n: int,
    op: str,
) -> Tensor:
    """The transposed ``n``-d convolution (the convolution's gradient with respect to its
    input) of (N, C_in, *spatial) or (C_in, *spatial) input with weight (C_in, C_out / groups,
    *kernel): out size (in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding +
    1.  Written as a stride-1 convolution of the input spread out by ``stride`` (zeros between
    pixels) and padded by ``dilation * (k - 1) - padding`` (cropped where negative), with the
    weight's in/out channels swapped per group and flipped: the same im2col, so the backward
    is slice-adds and a matmul, never a scatter."""
    x, w = to_tensor(input), to_tensor(weight)
    if w.ndim != n + 2:
        raise ShapeError(
            f"{op}: weight must be {n + 2}-D (in, out/groups, *kernel), got {describe(w)}"
        )
    if x.ndim not in (n + 1, n + 2):
        raise ShapeError(
            f"Expected {n + 1}D (unbatched) or {n + 2}D (batched) input to {op}, but got input "
            f"of size: {list(x.shape)}"
        )
    if x.ndim == n + 1:
        return conv_transpose(
            x.unsqueeze(0), w, bias, stride, padding, output_padding, groups, dilation, n, op
        ).squeeze(0)
    if groups <= 0:
        raise ShapeError(f"{op}: non-positive groups is not supported (groups={groups})")
    if w.shape[0] % groups:
        raise ShapeError(
            f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
            f"but got weight of size {list(w.shape)} instead"
        )
    if x.shape[1] != w.shape[0]:
        raise ShapeError(
            f"Given transposed=1, weight of size {list(w.shape)}, expected input "
            f"{describe(x)} to have {w.shape[0]} channels"
        )
    s = conv_tuple(op, "stride", stride, n)
    p = conv_tuple(op, "padding", padding, n)
    op_ = conv_tuple(op, "output_padding", output_padding, n)
    d = conv_tuple(op, "dilation", dilation, n)
    if builtins.min(s + d) <= 0 or builtins.min(p + op_) < 0:
        raise ShapeError(
            f"{op}: stride and dilation must be positive, padding and output_padding "
            f"non-negative (stride={s}, padding={p}, output_padding={op_}, dilation={d})"
        )
    if not builtins.all(op_[i] < s[i] or op_[i] < d[i] for i in range(n)):
        raise ShapeError(
            f"output padding must be smaller than either stride or dilation, but got "
            f"output_padding={op_}, stride={s}, dilation={d}"
        )
    cin, cout_g = w.shape[0], w.shape[1]
    kernel = tuple(w.shape[2:])
    out_c = cout_g * groups
    if bias is not None and tuple(to_tensor(bias).shape) != (out_c,):
        raise ShapeError(
            f"Given transposed=1, weight of size {list(w.shape)}, expected bias to be "
            f"1-dimensional with {out_c} elements, but got bias of size "
            f"{list(to_tensor(bias).shape)} instead"
        )
    sizes = [
        (x.shape[2 + i] - 1) * s[i] - 2 * p[i] + d[i] * (kernel[i] - 1) + op_[i] + 1
        for i in range(n)
    ]
    if builtins.min(sizes) <= 0:
        raise ShapeError(
            f"{op}: input {describe(x)} with kernel {kernel}, stride {s}, padding {p} and "
            f"dilation {d} gives an empty output ({'x'.join(map(str, sizes))})"
        )
    b = None if bias is None else to_tensor(bias)
    if kernel_ok(x, w, b):
        attrs = {
            "stride": s,
            "padding": p,
            "dilation": d,
            "groups": groups,
            "transposed": True,
            "output_padding": op_,
        }
        return apply(P["convolution"], (x, w) if b is None else (x, w, b), attrs)
    spread = x
    for i in range(n):
        spread = _dilate(spread, 2 + i, s[i])
    widths: list[int] = []
    for i in reversed(range(n)):
        edge = d[i] * (kernel[i] - 1) - p[i]
        widths += [edge, edge + op_[i]]
    spread = pad(spread, tuple(widths))
    # (in, out/g, *k) -> (out, in/g, *k), flipped: the convolution that is its transpose
    flipped = (
        w.reshape(groups, cin // groups, cout_g, *kernel)
        .transpose(1, 2)
        .reshape(out_c, cin // groups, *kernel)
        .flip(tuple(range(2, n + 2)))
    )
    return convolution(spread, flipped, bias, 1, 0, d, groups, n, op)


def _dilate(x: Tensor, dim: int, stride: int) -> Tensor:
    """``stride - 1`` zeros between neighbours along ``dim``: n -> (n - 1) * stride + 1.  A pad
    of a new unit dim and a reshape, so the gradient is a strided slice (no scatter)."""
    if stride == 1 or x.shape[dim] == 0:
        return x
    n = x.shape[dim]
    widths = [0, 0] * (x.ndim - dim - 1) + [0, stride - 1]  # F.pad lists the last dim first
    spread = pad(x.unsqueeze(dim + 1), tuple(widths))
    merged = spread.reshape(*x.shape[:dim], n * stride, *x.shape[dim + 1 :])
    return merged.narrow(dim, 0, (n - 1) * stride + 1)


# ---- pooling -------------------------------------------------------------------------------


def _lowest(dtype: _dt.dtype) -> float:
    """What max pooling pads with: -inf, or the smallest integer of an integer dtype."""
    if dtype.category == 2:
        return -math.inf
    if dtype.category == 1:
        return int(np.iinfo(dtype.np).min)
    return False


def max_pool(
    input: Tensor,
    n: int,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    ceil_mode: bool,
    return_indices: bool,
    op: str,
) -> Any:
    """``n``-d max pooling of (N, C, *spatial) or (C, *spatial) inputs; with
    ``return_indices`` also the flat index of each maximum within its input plane/volume."""
    x, unbatched = _spatial_input(op, to_tensor(input), n)
    k = pool_tuple(op, "kernel_size", kernel_size, n)
    s = pool_tuple(op, "stride", stride, n, default=k)
    p = pool_tuple(op, "padding", padding, n)
    d = pool_tuple(op, "dilation", dilation, n)
    if builtins.min(k) <= 0 or builtins.min(s) <= 0 or builtins.min(d) <= 0:
        raise ShapeError(
            f"{op}: kernel_size, stride and dilation must be greater than zero, but got "
            f"kernel_size={k}, stride={s}, dilation={d}"
        )
    for i in range(n):
        if p[i] < 0 or p[i] > ((k[i] - 1) * d[i] + 1) // 2:
            raise ShapeError(
                f"{op}: pad should be at most half of effective kernel size, but got "
                f"pad={p[i]}, kernel_size={k[i]} and dilation={d[i]}"
            )
    if kernel_ok(x):
        _check_windows(op, x, k, s, p, d, ceil_mode)
        window = ("fixed", k, s, p, d, bool(ceil_mode), False, None)
        values, indices = pool_max(x, window)
        _name_node(values, f"MaxPool{n}DWithIndicesBackward0")
        if unbatched:
            values, indices = values.squeeze(0), indices.squeeze(0)
        return (values, indices) if return_indices else values
    win = windows(x, k, s, p, d, _lowest(x.dtype), ceil_mode, op=op)
    outs = tuple(win.shape[2 + n :])
    flat = win.reshape(x.shape[0], x.shape[1], math.prod(k), *outs)
    # values via argmax + gather: the gradient goes to one element per window, as in PyTorch
    values, idx = flat.max(dim=2)
    if unbatched:
        values = values.squeeze(0)
    _name_node(values, f"MaxPool{n}DWithIndicesBackward0")
    if not return_indices:
        return values
    flat_idx = window_indices(idx, tuple(x.shape[2:]), k, s, p, d, op)
    return values, (flat_idx.squeeze(0) if unbatched else flat_idx)


def window_indices(
    local: Tensor, sizes: tuple, k: tuple, s: tuple, p: tuple, d: tuple, op: str
) -> Tensor:
    """Window-local argmax positions (N, C, *out) -> flat indices into the input's spatial
    dims (PyTorch's pooling indices).  Computed on the host: indices carry no gradient."""
    _read(local, f"{op}(return_indices=True)")
    arr = _storage.to_host(local._data)
    n = len(k)
    offsets = np.unravel_index(arr, k)
    flat = np.zeros(arr.shape, np.int64)
    for i in range(n):
        shape = [1] * arr.ndim
        shape[2 + i] = arr.shape[2 + i]
        start = (np.arange(arr.shape[2 + i]) * s[i] - p[i]).reshape(shape)
        flat = flat * sizes[i] + start + offsets[i] * d[i]
    return Tensor._make(flat).to(local.device)


def avg_pool(
    input: Tensor,
    n: int,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
    op: str,
) -> Tensor:
    """``n``-d average pooling of (N, C, *spatial) or (C, *spatial) inputs, with PyTorch's
    divisor per window: the part of the window inside the padded input (``count_include_pad``)
    or inside the input itself; a ``ceil_mode`` window hanging over the end counts only what
    it covers."""
    x, unbatched = _spatial_input(op, to_tensor(input), n)
    k = pool_tuple(op, "kernel_size", kernel_size, n)
    s = pool_tuple(op, "stride", stride, n, default=k)
    p = pool_tuple(op, "padding", padding, n)
    if builtins.min(k) <= 0 or builtins.min(s) <= 0:
        raise ShapeError(
            f"{op}: kernel_size and stride must be greater than zero, but got kernel_size={k}, "
            f"stride={s}"
        )
    for i in range(n):
        if p[i] < 0 or p[i] > k[i] // 2:
            raise ShapeError(
                f"{op}: pad should be at most half of kernel size, but got pad={p[i]} and "
                f"kernel_size={k[i]}"
            )
    if divisor_override is not None and divisor_override == 0:
        raise ShapeError(f"{op}: divisor must be not zero")
    if kernel_ok(x):
        _check_windows(op, x, k, s, p, (1,) * n, ceil_mode)
        window = (
            "fixed",
            k,
            s,
            p,
            (1,) * n,
            bool(ceil_mode),
            bool(count_include_pad),
            None if divisor_override is None else int(divisor_override),
        )
        out = apply(P["avg_pool"], (x,), {"window": window})
        return out.squeeze(0) if unbatched else out
    win = windows(x, k, s, p, (1,) * n, 0.0, ceil_mode, op=op)
    outs = tuple(win.shape[2 + n :])
    total = sum(win.reshape(x.shape[0], x.shape[1], math.prod(k), *outs), 2)
    if divisor_override:
        out = total / divisor_override
    else:
        per_dim = [
            _pool_divisors(x.shape[2 + i], k[i], s[i], p[i], outs[i], count_include_pad)
            for i in range(n)
        ]
        if count_include_pad and builtins.all(int(v.min()) == k[i] for i, v in enumerate(per_dim)):
            out = total / math.prod(k)
        else:
            divisor = per_dim[0]
            for v in per_dim[1:]:
                divisor = np.multiply.outer(divisor, v)
            out = total / _constant(total, divisor)
    return out.squeeze(0) if unbatched else out


def _pool_divisors(size: int, k: int, s: int, p: int, count: int, include_pad: bool) -> np.ndarray:
    """How many positions each of ``count`` average-pooling windows along one dim averages."""
    start = np.arange(count) * s - p
    end = np.minimum(start + k, size + p)
    if include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def _constant(like: Tensor, array: np.ndarray) -> Tensor:
    """A constant (not requiring grad) of ``like``'s dtype, on ``like``'s device."""
    t = _created(Tensor._make(np.ascontiguousarray(array, dtype=like.dtype.np)))
    return t if like.device == t.device else t.to(like.device)


def _index(values: Any, device: Any) -> Tensor:
    t = _created(Tensor._make(np.asarray(values, dtype=np.int64)))
    return t if device == t.device else t.to(device)


def lp_pool(
    input: Tensor,
    n: int,
    norm_type: float,
    kernel_size: Any,
    stride: Any,
    ceil_mode: bool,
    op: str,
) -> Tensor:
    """Power-average pooling: ``(sum of x^p over a window)^(1/p)``, PyTorch's
    ``(sign(avg) * relu(|avg|) * window) ** (1 / p)`` of the average of ``x ** p``."""
    x = to_tensor(input)
    k = pool_tuple(op, "kernel_size", kernel_size, n)
    pooled = avg_pool(x**norm_type, n, k, stride, 0, ceil_mode, True, None, op)
    signed = mul(sign(pooled), relu(abs(pooled)))
    return mul(signed, float(math.prod(k))) ** (1.0 / norm_type)


def max_unpool(
    input: Tensor,
    indices: Tensor,
    n: int,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    output_size: Any,
    op: str,
) -> Tensor:
    """The inverse of max pooling: zeros of the unpooled size with each value put at the flat
    position its index names (the gradient gathers from those positions)."""
    x, ind = to_tensor(input), to_tensor(indices)
    if x.shape != ind.shape:
        raise ShapeError(
            f"{op}: Expected shape of indices to be same as that of the input tensor "
            f"({list(x.shape)}) but got indices tensor with shape: {list(ind.shape)}"
        )
    if ind.dtype.category != 1:
        raise ShapeError(f"{op}: expected indices to have an integer dtype, got {describe(ind)}")
    k = pool_tuple(op, "kernel_size", kernel_size, n)
    s = pool_tuple(op, "stride", stride, n, default=k)
    p = pool_tuple(op, "padding", padding, n)
    xb, unbatched = _spatial_input(op, x, n)
    ib = ind.unsqueeze(0) if unbatched else ind
    default = [(xb.shape[2 + i] - 1) * s[i] - 2 * p[i] + k[i] for i in range(n)]
    if output_size is None:
        sizes = default
    else:
        sizes = [int(v) for v in output_size]
        if len(sizes) == n + 2:
            sizes = sizes[2:]
        elif len(sizes) == n + 1:
            sizes = sizes[1:]
        if len(sizes) != n:
            raise ShapeError(
                f"{op}: output_size should be a sequence containing {n} or {n + 2} elements, "
                f"but it has a length of '{len(sizes)}'"
            )
        for i in range(n):
            low, high = default[i] - s[i], default[i] + s[i]
            if not low < sizes[i] < high:
                raise ShapeError(
                    f'{op}: invalid output_size "{sizes}" (dim {i} must be between {low} and '
                    f"{high})"
                )
    volume = math.prod(sizes)
    batch, channels = xb.shape[0], xb.shape[1]
    flat_idx = ib.reshape(batch, channels, -1)
    if flat_idx.numel():
        _read(flat_idx, f"{op} index check")
        arr = _storage.to_host(flat_idx._data)
        if arr.min() < 0 or arr.max() >= volume:
            bad = int(arr.max() if arr.max() >= volume else arr.min())
            raise ShapeError(
                f"{op}: Found an invalid max index: {bad} (output volumes are of size "
                f"{'x'.join(map(str, sizes))})"
            )
    out = zeros(batch, channels, volume, dtype=x.dtype, device=x.device)
    out = out.scatter(2, flat_idx.long(), xb.reshape(batch, channels, -1))
    out = out.reshape(batch, channels, *sizes)
    return out.squeeze(0) if unbatched else out


def _gather_windows(x: Tensor, n: int, positions: list[np.ndarray]) -> tuple[Tensor, np.ndarray]:
    """Gather windows from (N, C, *spatial) ``x``: ``positions[i]`` (N, C, out_i, width_i)
    are input positions along spatial dim i.  Returns (N, C, *outs, prod widths) values and
    the flat spatial index of each gathered element (a host array of the same shape)."""
    batch, channels = x.shape[0], x.shape[1]
    sizes = tuple(x.shape[2:])
    outs = [q.shape[2] for q in positions]
    widths = [q.shape[3] for q in positions]
    flat = np.zeros((batch, channels) + tuple(outs) + tuple(widths), np.int64)
    for i, q in enumerate(positions):
        # q (N, C, out_i, width_i) broadcast to (N, C, *outs, *widths)
        shape = [batch, channels] + [1] * (2 * n)
        shape[2 + i] = outs[i]
        shape[2 + n + i] = widths[i]
        flat = flat * sizes[i] + q.reshape(shape)
    flat = flat.reshape(batch, channels, *outs, math.prod(widths))
    index = _index(flat.reshape(batch, channels, -1), x.device)
    values = x.reshape(batch, channels, -1).gather(2, index)
    return values.reshape(batch, channels, *outs, math.prod(widths)), flat


def _pick(values: Tensor, flat: np.ndarray, want_indices: bool) -> Any:
    """The maximum of each window (last dim of ``values``), and its flat input index."""
    best, local = values.max(dim=-1)
    if not want_indices:
        return best, None
    _read(local, "pooling indices")
    chosen = np.take_along_axis(flat, _storage.to_host(local._data)[..., None], -1)[..., 0]
    return best, Tensor._make(chosen).to(values.device)


def adaptive_max_pool(
    input: Tensor, n: int, output_size: Any, return_indices: bool, op: str
) -> Any:
    """Max over PyTorch's adaptive windows (output i of a dim covers input [floor(i * in /
    out), ceil((i + 1) * in / out))) of the last ``n`` dims; with the flat input index of each
    maximum.  Short windows repeat their last element (which never changes a maximum)."""
    x, unbatched = _spatial_input(op, to_tensor(input), n)
    sizes = (output_size,) * n if _is_int(output_size) else tuple(output_size)
    if len(sizes) != n:
        raise ShapeError(f"{op}: output_size must be {n}, got {output_size}")
    sizes = tuple(int(x.shape[2 + i] if v is None else v) for i, v in enumerate(sizes))
    for i in range(n):
        if x.shape[2 + i] == 0:
            raise ShapeError(
                f"{op}(): Expected input to have non-zero size for non-batch dimensions, but "
                f"input has sizes {list(to_tensor(input).shape)} with an empty dimension"
            )
    if kernel_ok(x):
        return adaptive_pool(to_tensor(input), n, sizes, "max", return_indices)
    positions = []
    for i in range(n):
        length, out = x.shape[2 + i], sizes[i]
        bounds = [((j * length) // out, -((-(j + 1) * length) // out)) for j in range(out)]
        width = builtins.max((stop - start for start, stop in bounds), default=1)
        table = np.array(
            [[builtins.min(a + t, b - 1) for t in range(width)] for a, b in bounds], np.int64
        ).reshape(out, width)
        positions.append(np.broadcast_to(table, (x.shape[0], x.shape[1], out, width)))
    values, flat = _gather_windows(x, n, positions)
    best, indices = _pick(values, flat, return_indices)
    if unbatched:
        best = best.squeeze(0)
        indices = None if indices is None else indices.squeeze(0)
    _name_node(best, f"AdaptiveMaxPool{n}DBackward0")
    return (best, indices) if return_indices else best


def pool_max(x: Tensor, window: tuple) -> tuple[Tensor, Tensor]:
    """Max pooling of (N, C, *spatial) ``x`` by the kernels: the positions of the maxima
    (``pool_index``, no gradient) and the values there (``pool_take``, whose gradient adds
    into those positions)."""
    index = apply(P["pool_index"], (x,), {"window": window})
    return apply(P["pool_take"], (x, index), {}), index


def adaptive_pool(x: Tensor, n: int, sizes: tuple, mode: str, return_indices: bool) -> Any:
    """Adaptive max or average pooling of ``x`` (N, C, *spatial) or (C, *spatial) to
    ``sizes`` by the kernels (callers check ``kernel_ok`` and the arguments), with max
    pooling's indices where asked."""
    unbatched = x.ndim == n + 1
    if unbatched:
        x = x.unsqueeze(0)
    window = ("adaptive", tuple(int(v) for v in sizes))
    indices = None
    if mode == "max":
        values, indices = pool_max(x, window)
        _name_node(values, f"AdaptiveMaxPool{n}DBackward0")
    else:
        values = apply(P["avg_pool"], (x,), {"window": window})
    if unbatched:
        values = values.squeeze(0)
        indices = None if indices is None else indices.squeeze(0)
    return (values, indices) if return_indices else values


def _fractional_starts(sample: np.ndarray, length: int, out: int, k: int) -> np.ndarray:
    """PyTorch's pseudo-random window starts of fractional max pooling along one dim, for each
    of the (N, C) planes' ``sample`` in [0, 1): ``int((i + u) * alpha) - int(u * alpha)`` with
    ``alpha = (length - k) / (out - 1)``, the last window ending at the input's end."""
    starts = np.zeros(sample.shape + (out,), np.int64)
    if out > 1:
        alpha = sample.dtype.type(length - k) / sample.dtype.type(out - 1)
        i = np.arange(out - 1, dtype=sample.dtype)
        u = sample[..., None]
        starts[..., : out - 1] = ((i + u) * alpha).astype(np.int64) - (u * alpha).astype(np.int64)
    starts[..., out - 1] = length - k
    return starts


def fractional_max_pool(
    input: Tensor,
    n: int,
    kernel_size: Any,
    output_size: Any,
    output_ratio: Any,
    return_indices: bool,
    random_samples: Tensor | None,
    op: str,
) -> Any:
    """Fractional max pooling (Graham, 2014): windows of ``kernel_size`` at pseudo-random
    starts that give ``output_size`` (or ``output_ratio`` of the input) outputs per dim; the
    starts follow PyTorch's sequence for the same ``_random_samples`` (N, C, n) in [0, 1)."""
    x, unbatched = _spatial_input(op, to_tensor(input), n)
    k = pool_tuple(op, "kernel_size", kernel_size, n)
    if output_size is None and output_ratio is None:
        raise ShapeError(f"{op} requires specifying either an output_size or an output_ratio")
    if output_size is None:
        ratio = (
            (output_ratio,) * n
            if not isinstance(output_ratio, (tuple, list))
            else tuple(output_ratio)
        )
        if len(ratio) == 1:
            ratio = ratio * n
        if not builtins.all(0 < r < 1 for r in ratio):
            raise ShapeError(f"{op}: output_ratio must be between 0 and 1 (got {output_ratio})")
        sizes = tuple(int(x.shape[2 + i] * float(ratio[i])) for i in range(n))
    else:
        sizes = pool_tuple(op, "output_size", output_size, n)
    for i in range(n):
        if sizes[i] + k[i] - 1 > x.shape[2 + i]:
            raise ShapeError(
                f"{op}(): pool size {k[i]} too large relative to input size {x.shape[2 + i]} "
                f"for output size {sizes[i]} (dim {i})"
            )
    batch, channels = x.shape[0], x.shape[1]
    if random_samples is None:
        dtype = x.dtype if x.dtype.category == 2 else _dt.get_default_dtype()
        random_samples = rand(batch, channels, n, dtype=dtype)
    samples = to_tensor(random_samples)
    if tuple(samples.shape) != (batch, channels, n):
        raise ShapeError(
            f"{op}: expected _random_samples of shape {[batch, channels, n]}, got "
            f"{list(samples.shape)}"
        )
    _read(samples, f"{op} random samples")
    drawn = _storage.to_host(samples._data)
    if drawn.dtype.kind != "f":
        drawn = drawn.astype(np.float32)
    # PyTorch's sample order: W first then H in 2-D; T, H, W in 3-D
    order = [1, 0] if n == 2 else list(range(n))
    positions = []
    for i in range(n):
        starts = _fractional_starts(drawn[:, :, order[i]], x.shape[2 + i], sizes[i], k[i])
        positions.append(starts[..., None] + np.arange(k[i]))
    values, flat = _gather_windows(x, n, positions)
    best, indices = _pick(values, flat, return_indices)
    if unbatched:
        best = best.squeeze(0)
        indices = None if indices is None else indices.squeeze(0)
    _name_node(best, f"FractionalMaxPool{n}DBackward0")
    return (best, indices) if return_indices else best
