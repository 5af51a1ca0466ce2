"""conv2d, the normalisation layers, softmax and log_softmax as single backward nodes that save
what PyTorch's native ops save, and only for the gradients that will be computed.

Their forwards are composites of primitives (im2col and a matmul; means and a reciprocal
square root).  Recorded primitive by primitive, every node of such a composite saves its own
operands: conv2d kept its im2col columns (kh * kw times the input), layer_norm eight tensors.
Here the same forward runs inside an internal ``autograd.Function`` (under no_grad, so no
per-primitive nodes), which saves

* conv2d: the input only for the weight's gradient, the weight only for the input's
  (PyTorch's ``ConvolutionBackward0`` keeps both always);
* the normalisations: the input, the per-row mean and reciprocal standard deviation (for the
  input's and the weight's gradients) and the weight (for the input's), as
  ``NativeLayerNormBackward0`` / ``NativeBatchNormBackward0`` / ``NativeGroupNormBackward0`` do;
* softmax and log_softmax: their result, as ``SoftmaxBackward0`` and ``LogSoftmaxBackward0``
  do (the composites' nodes kept ``exp(x - max)`` and the sum, and an in-place write into the
  result went unnoticed).

The backwards are written with fusegrad ops on the saved values: they differentiate again
(``create_graph``; the statistics are then recomputed from the saved input, so that their own
dependence on it is seen), compiled autograd traces them like derivative rules and fuses them,
and whole compiled steps take them in (``compiler/functions.py``).  Callers use the Functions
only when a graph is recorded and no forward-mode AD level is active (whose tangents the
composites' primitive rules give); otherwise they run the composite directly.  The norm
layers, softmax and log_softmax use these Functions only where their fused primitives
(``ops/norms.py``, ``ops/classification.py``) do not run: CUDA tensors, dtypes other than
float32/float64, empty and (softmax) 0-d inputs, and layer_norm, softmax and log_softmax
inside compiled programs.

This module sits above the op surface and ``autograd.function`` (which imports ``ops``), so
``ops.functional`` cannot import it: importing it hands it to ``functional.install_native``
(and ``reduction``'s, ``extra``'s, ``convolution``'s)
(``fusegrad.autograd`` imports it after ``function``), as ``autograd.api`` installs
``Tensor.backward``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from .. import dtypes as _dtypes
from ..ops import convolution as _convolution
from ..ops import extra as _extra
from ..ops import functional as _functional
from ..ops import norms as _norms
from ..ops import reduction as _reduction
from ..ops.classification import log_softmax_grad, softmax_grad
from ..ops.convolution import col2im, conv_columns, windows
from ..ops.creation import full, ones_like, zeros_like
from ..ops.elementwise import where
from ..ops.extra import scatter_reduce_host
from ..ops.functional import _update_running
from ..storage import to_host
from ..tensor import Tensor
from .function import Function, once_differentiable
from .grad_mode import is_grad_enabled

_bool = _dtypes.bool_


def columns(
    x: Tensor, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple, groups: int, op: str
) -> Tensor:
    """im2col of an (N, C, *spatial) input: (N, groups, C / groups * prod(kernel), prod(out))."""
    win = windows(x, kernel, stride, padding, dilation, 0.0, op=op)
    n = len(kernel)
    outs = win.shape[2 + n :]
    return win.reshape(x.shape[0], groups, -1, math.prod(outs))


def _owned(out: Tensor) -> Tensor:
    """``out`` as a tensor of its own rather than a view of a forward intermediate (a reshape
    of the matmul's result, which nothing else can reach): the node's output must accept
    in-place ops as a native op's output does (``conv(x).add_(1)``), and a view created in
    the Function's no_grad forward would refuse them."""
    return Tensor._make(out._data) if out._base is not None else out


class Convolution(Function):
    """An n-d convolution of an (N, C, *spatial) input (already padded for an uneven
    ``padding='same'``) by an (O, C / groups, *kernel) weight, plus an optional (O,) bias.
    Saves the input only for the weight's gradient and the weight only for the input's; the
    bias's needs neither."""

    _node_name = "ConvolutionBackward0"

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        w: Tensor,
        bias: Tensor | None,
        stride: tuple,
        padding: tuple,
        dilation: tuple,
        groups: int,
        op: str,
    ) -> Tensor:
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ctx.save_for_backward(x if need_w else None, w if need_x else None)
        # (sizes on the ctx are keyed by value in a compiled backward: not the batch size)
        ctx.geometry = (tuple(x.shape[1:]), tuple(w.shape), stride, padding, dilation, groups, op)
        return _owned(conv_columns(x, w, bias, stride, padding, dilation, groups, op))

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        x, w = ctx.saved_tensors
        x_shape, w_shape, stride, padding, dilation, groups, op = ctx.geometry
        need = ctx.needs_input_grad
        out_c, kernel = w_shape[0], tuple(w_shape[2:])
        n = g.shape[0]
        g_mat = g.reshape(n, groups, out_c // groups, math.prod(g.shape[2:]))
        gx = gw = gb = None
        if need[0]:
            w_mat = w.reshape(groups, out_c // groups, -1)
            shape = (n, *x_shape)
            gx = col2im(w_mat.mT @ g_mat, shape, kernel, stride, padding, dilation)
        if need[1]:
            cols = columns(x, kernel, stride, padding, dilation, groups, op)
            gw = (g_mat @ cols.mT).sum(0).reshape(w_shape)
        if need[2]:
            gb = g.sum((0, *range(2, g.ndim)))
        return gx, gw, gb, None, None, None, None, None


def _channels_view(x: Tensor, groups: int | None) -> Tensor:
    """``x``, or ``x`` as (N, groups, -1) where the statistics are per (sample, group)."""
    if groups is None:
        return x
    rest = 1
    for size in x.shape[1:]:
        rest *= size
    return x.reshape(x.shape[0], groups, rest // groups)


def normalize(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    groups: int | None,
    dims: tuple,
    param_shape: tuple | None,
    running: tuple | None = None,
) -> tuple:
    """``(x - mean) * rstd * weight + bias`` with the statistics over ``dims`` of ``x`` (seen
    as (N, groups, -1) when ``groups`` is given), the weight and bias reshaped to
    ``param_shape`` (None: as they are).  Returns the result, the mean and the reciprocal
    standard deviation (shaped as the statistics' view with ``dims`` kept as 1), and the number
    of elements per statistic.  ``running = (running_mean, running_var, momentum)`` moves the
    running statistics (one per channel, averaged over the other rows; unbiased variance), in
    place and without history."""

    xs = _channels_view(x, groups)
    mean = xs.mean(dims, keepdim=True)
    centred = _norms.centred(xs, mean, dims)
    var = (centred * centred).mean(dims, keepdim=True)
    rstd = (var + eps).rsqrt()
    out = centred * rstd
    if groups is not None:
        out = out.reshape(x.shape)
    if weight is not None:
        out = out * (weight if param_shape is None else weight.reshape(param_shape))
    if bias is not None:
        out = out + (bias if param_shape is None else bias.reshape(param_shape))
    count = xs.numel() // mean.numel() if mean.numel() else 0
    if running is not None:
        running_mean, running_var, momentum = running
        rows = running_mean if running_mean is not None else running_var
        if rows is not None:
            channels = rows.numel()
            unbiased = var * (count / (count - 1))
            _update_running(running_mean, mean.reshape(-1, channels).mean(0), momentum)
            _update_running(running_var, unbiased.reshape(-1, channels).mean(0), momentum)
    return out, mean, rstd, count


class _Normalization(Function):
    """``normalize`` as one node: saves the input, mean and rstd for the input's and the
    weight's gradients, the weight for the input's, nothing for the bias's.

    Arguments: ``x, weight, bias, eps, groups, dims, param_shape, param_dims, running_mean,
    running_var, momentum``; ``param_dims`` are the dims of ``x`` the weight's and bias's
    gradients sum over.  No size is kept as a Python number (a compiled backward would key on
    it): the backward reads shapes from its tensors, and the mean's divisor from a 0-d tensor
    on the ctx (a program input)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
        groups: int | None,
        dims: tuple,
        param_shape: tuple | None,
        param_dims: tuple,
        running_mean: Tensor | None,
        running_var: Tensor | None,
        momentum: Any,
    ) -> Tensor:
        running = (running_mean, running_var, momentum)
        out, mean, rstd, count = normalize(x, weight, bias, eps, groups, dims, param_shape, running)
        out = _owned(out)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        stats = need_x or need_w
        ctx.save_for_backward(
            x if stats else None,
            weight if need_x else None,
            mean if stats else None,
            rstd if stats else None,
        )
        ctx.layout = (eps, groups, dims, param_shape, param_dims)
        ctx.per_count = full((), 1.0 / max(count, 1), dtype=x.dtype, device=x.device)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        x, weight, mean, rstd = ctx.saved_tensors
        eps, groups, dims, param_shape, param_dims = ctx.layout
        per_count = ctx.per_count
        need = ctx.needs_input_grad
        gx = gw = gb = None
        if need[2]:
            gb = _sum_over(g, param_dims)
        if need[0] or need[1]:
            xs = _channels_view(x, groups)
            if is_grad_enabled():
                # create_graph: the statistics again, from the input, so that the next
                # derivative sees how they depend on it (the saved ones carry no history)
                mean = xs.sum(dims, keepdim=True) * per_count
                centred = _norms.centred(xs, mean, dims)
                var = (centred * centred).sum(dims, keepdim=True) * per_count
                rstd = (var + eps).rsqrt()
            else:
                centred = _norms.centred(xs, mean, dims)
            normed = centred * rstd
            if need[1]:
                full = normed if groups is None else normed.reshape(g.shape)
                gw = _sum_over(g * full, param_dims)
            if need[0]:
                if weight is not None:
                    g = g * (weight if param_shape is None else weight.reshape(param_shape))
                gs = _channels_view(g, groups)
                if _norms.one_element(xs, dims):
                    gx = _norms.one_element_gradient(gs, xs, rstd)
                else:
                    # ``ops.norms.training_input_gradient`` says why this form (fuzz seeds
                    # 20485, 301666; native fuzz seeds 1006197, 1000269, 1008724)
                    gx = _norms.training_input_gradient(
                        gs,
                        xs,
                        centred,
                        mean,
                        rstd,
                        lambda t: t.sum(dims, keepdim=True) * per_count,
                        groups is None and param_shape is None,  # (a layer norm)
                    )
                if groups is not None:
                    gx = gx.reshape(g.shape)
        return gx, gw, gb, None, None, None, None, None, None, None, None


def _sum_over(t: Tensor, dims: tuple) -> Tensor:
    return t.sum(dims) if dims else t


class LayerNorm(_Normalization):
    _node_name = "NativeLayerNormBackward0"


class BatchNorm(_Normalization):
    _node_name = "NativeBatchNormBackward0"


class GroupNorm(_Normalization):
    _node_name = "NativeGroupNormBackward0"


def records_log_softmax(x: Tensor) -> bool:
    """Whether ``log_softmax`` of ``x``, where its fused primitive does not run, records its
    node here (``LogSoftmax``): when a graph is recorded and no forward-AD level is active
    (whose tangents the composite's primitives carry), as the norm layers'."""
    return _functional._records(x)


class _SavesItsResult(Function):
    """A composite (``composite(x, dim)``) as one node that saves its result, as PyTorch's
    node does: an in-place write into the result then fails the backward with eager's error,
    where the composite's own nodes saved ``exp(x - max)`` and the sum and did not see it.  The
    backward is the fused rule's, in the op surface (``gradient(g, out, dim)``): differentiable
    again, and fused by the compilers."""

    # (each subclass names its own, as static methods)
    composite: Callable[[Tensor, Any], Tensor]
    gradient: Callable[[Tensor, Tensor, Any], Tensor]

    @classmethod
    def forward(cls, ctx: Any, x: Tensor, dim: Any) -> Tensor:  # type: ignore[override]
        out = _owned(cls.composite(x, dim))
        ctx.save_for_backward(out)
        ctx.dim = dim
        return out

    @classmethod
    def backward(cls, ctx: Any, g: Tensor) -> tuple:  # type: ignore[override]
        (out,) = ctx.saved_tensors
        return cls.gradient(g, out, ctx.dim), None


class LogSoftmax(_SavesItsResult):
    """``log_softmax``'s composite (``ops.reduction._log_softmax_composite``), saving its result
    as ``LogSoftmaxBackward0`` and the fused primitive's rule do (fuzz seeds 1000552, 1005447,
    1009384, 1009962: whole steps and compiled modules, which record the composite, missed a
    write into the result); its backward ``ops.classification.log_softmax_grad``."""

    _node_name = "LogSoftmaxBackward0"
    composite = staticmethod(_reduction._log_softmax_composite)
    gradient = staticmethod(log_softmax_grad)


def records_softmax(x: Tensor) -> bool:
    """Whether ``softmax`` of ``x``, where its fused primitive does not run, records its node
    here (``Softmax``): as ``records_log_softmax``."""
    return _functional._records(x)


class Softmax(_SavesItsResult):
    """``softmax``'s composite (``ops.reduction._softmax_composite``), saving its result as
    ``SoftmaxBackward0`` and the fused primitive's rule do; ``dim`` is None for a 0-d input;
    its backward ``ops.classification.softmax_grad``."""

    _node_name = "SoftmaxBackward0"
    composite = staticmethod(_reduction._softmax_composite)
    gradient = staticmethod(softmax_grad)


class ScatterReduce(Function):
    """``scatter_reduce``/``index_reduce`` with ``prod``, ``amax`` or ``amin``: the values by
    numpy's ``ufunc.at`` on the host; the gradient, in fusegrad ops, goes to the elements that
    equal the result, split evenly between ties (``amax``/``amin``, as PyTorch's), or is the
    product of the other factors (``prod``, zeros handled; not differentiable twice)."""

    _node_name = "ScatterReduceBackward0"

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, src: Tensor, index: Tensor, dim: int, reduce: str, include: bool
    ) -> Tensor:
        host = [to_host(t._data) for t in (x, src, index)]
        out = scatter_reduce_host(*host, dim, reduce, include)
        result = Tensor._make(out)
        result = result if x.device == result.device else result.to(x.device)
        ctx.save_for_backward(x, src, index, result)
        ctx.layout = (dim, reduce, include)
        return result

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        x, src, index, result = ctx.saved_tensors
        dim, reduce, include = ctx.layout
        touched = _touched(x, index, dim)
        if reduce == "prod":
            return _prod_backward(ctx, g)
        # PyTorch's split: every element equal to the result takes an even share, the input's
        # own value counted even when not included (its share then goes nowhere)
        picked = result.gather(dim, index)
        hit_src = (src == picked).to(g.dtype)
        hit_self = (x == result).to(g.dtype)
        share = g / hit_self.scatter_add(dim, index, hit_src)
        g_src = share.gather(dim, index) * hit_src
        g_x = share * hit_self
        if not include:
            g_x = where(touched, 0.0, g_x)
        return g_x, g_src, None, None, None, None


def _touched(x: Tensor, index: Tensor, dim: int) -> Tensor:
    """Where along ``dim`` something is scattered to (bool, ``x``'s shape)."""
    return zeros_like(x, dtype=_bool).scatter(dim, index, value=True)


@once_differentiable
def _prod_backward(ctx: Any, g: Tensor) -> tuple:
    """``prod``'s gradient: each factor's is the product of the others (the result over the
    factor where no factor is zero; the product of the nonzero ones for the single zero
    factor of a position; zero where two or more factors are).  Not differentiable again."""
    x, src, index, result = ctx.saved_tensors
    dim, _, include = ctx.layout
    touched = _touched(x, index, dim)
    nz_src = where(src != 0, src, 1.0)
    zeros_at = zeros_like(result).scatter_add(dim, index, (src == 0).to(g.dtype))
    nz_x = where((x != 0) | ~touched, x, 1.0) if include else ones_like(x)
    if include:
        zeros_at = zeros_at + ((x == 0) & touched).to(g.dtype)
    host = [to_host(t._data) for t in (nz_x, nz_src, index)]
    nz_prod = Tensor._make(scatter_reduce_host(*host, dim, "prod", True)).to(x.device)

    def others(value: Tensor, pick: Any) -> Tensor:
        """The product of a factor's co-factors, ``pick`` taking each factor's position."""
        count = pick(zeros_at)
        alone = (count == 1) & (value == 0)
        by_division = pick(result) / where(value != 0, value, 1.0)
        return where(count == 0, by_division, where(alone, pick(nz_prod), 0.0))

    g_src = g.gather(dim, index) * others(src, lambda t: t.gather(dim, index))
    if include:
        g_x = where(touched, g * others(x, lambda t: t), g)
    else:
        g_x = where(touched, 0.0, g)
    return g_x, g_src, None, None, None, None


_functional.install_native(sys.modules[__name__])
_reduction.install_native(sys.modules[__name__])
_extra.install_native(sys.modules[__name__])
_convolution.install_native(sys.modules[__name__])
