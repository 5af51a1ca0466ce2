"""The normalisation layers' fused primitives and their op surface: batch, instance, group and
layer norm each run as ``norm_stats`` twice (the statistics' means, then their biased
variances), ``norm`` (the normalisation and affine map by given statistics) and, in backward,
``norm_backward`` (the input's, weight's and bias's gradients in one kernel).  The kernels are
numba (``norm_kernels``, loaded on first use).

Why primitives (docs/ARCHITECTURE.md, "Conventions": a primitive where speed needs one): as
composites of means, differences, squares and products the layers ran about a dozen eager ops
forward and twice that backward, each a pass over the input; the kernels read it three times
forward (mean, variance, normalisation) and twice backward.  The statistics are a primitive
of their own (not differentiable) so that batch and instance norm can move their running
statistics towards them; ``norm`` takes them as an input, and its rule, knowing that in
training they are the input's own statistics (``training``), includes their dependence on the
input in the input's gradient.

``norm_grads`` is the same backward written in the op surface: the rule uses it where a graph
of the gradient is wanted (``create_graph``), recomputing the statistics from the input so that
their dependence on it is differentiated again.

Layouts (the ``layout`` attribute; no size is an attribute, so a compiled graph holds for
other batch sizes): ``batch`` (per channel over the batch and spatial dims; also every call
with given statistics: batch norm's and instance norm's running statistics in evaluation),
``instance`` (per sample and channel), ``group`` (per sample and group of ``groups`` channels),
``layer`` (per row, over the trailing ``dims`` dims; the weight and bias have those dims'
shape).  ``fused_norm_runs`` says when the layers use these primitives: tensors of float32
or float64, one dtype and device, no forward-AD level; otherwise they run their composites.
CUDA tensors run the device kernels of ``cuda/norms.py``.

Inside compiled programs (``compile(fn)``, ``compile(model)``, ``compiled_autograd()``) batch,
instance and group norm call these kernels as externs, and layer norm stays a composite,
which the compiler fuses into row kernels with its neighbours (``Tracer.prefers_composites``).
Measured at one thread (docs/codegen.md, "Layers with kernels of their own"): a conv net's
compiled training step with two BatchNorm2d ran 50 ms with the kernels against 90 ms with the
composites; ``benchmarks.compiled`` workload B (GELU then LayerNorm on 256x1024) ran its whole
step in 0.66 ms as a composite against 1.08 ms with the kernels.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np

from .. import storage as _storage
from ..autograd.forward_state import state as _forward_state
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import state as _tracer_state
from ..cuda.array import CudaArray
from ..tensor import Tensor
from ._util import P, apply, as_operand
from .registry import primitive, set_meta

__all__ = [
    "fused_norm_kernels",
    "fused_norm_runs",
    "norm",
    "norm_grads",
    "norm_stats",
]

LAYOUTS = ("batch", "instance", "group", "layer")


_loaded: list[SimpleNamespace] = []  # the kernels once imported (``_kernels``)


def _kernels():  # type: ignore[no-untyped-def]
    """The fused kernels (moment, forward, backward), imported on first use (then kept: the
    import statement and the namespace cost a microsecond or two a call)."""
    if not _loaded:
        from .norm_kernels import backward, forward, moment  # numba: not at import

        _loaded.append(SimpleNamespace(moment=moment, forward=forward, backward=backward))
    return _loaded[0]


@primitive("norm_stats", "opaque", "x mean*", differentiable=False)
def _norm_stats(x, *mean, layout, groups, dims):  # type: ignore[no-untyped-def]
    """Each statistic of ``x`` (see the module docstring for the layouts), in the statistics'
    shape (``_stat_shape``): its mean, or with ``mean`` given its biased variance about that
    mean.  Two calls rather than one result of both, so that no size of 2 enters a compiled
    program's key (which tells sizes equal to each other apart: a batch of 2 would need a
    capture of its own).  Not differentiable: ``norm``'s rule accounts for the statistics'
    dependence on the input."""
    out = _kernels().moment(x, mean[0] if mean else None, layout, groups, dims)
    return out.reshape(_stat_shape(x.shape, layout, groups, dims))


@primitive("norm", "opaque", "x mean var weight bias")
def _norm(x, mean, var, w, b, *, layout, groups, dims, eps, weight, bias, training):  # type: ignore[no-untyped-def]
    """``(x - mean) / sqrt(var + eps) * w + b`` with each statistic's ``mean`` and ``var``
    (in the statistics' shape: ``_stat_shape``); ``weight`` / ``bias`` False: the call has
    none, and ``w`` / ``b`` are empty placeholders (so that the inputs are named, and the rule
    saves each tensor only for the gradients that need it).  ``training``: the statistics are
    ``x``'s own (the gradient includes their dependence on ``x``)."""
    w = w if weight else None
    b = b if bias else None
    stats = np.stack([mean.reshape(-1), var.reshape(-1)])
    return _kernels().forward(x, stats, w, b, layout, groups, dims, eps)


@primitive("norm_backward", "opaque", "g operands*", differentiable=False)
def _norm_backward(g, *operands, layout, groups, dims, eps, training, need, weight):  # type: ignore[no-untyped-def]
    """The gradients of ``norm`` for its gradient ``g``, flat: the input's, the weight's and
    the bias's, each where ``need`` says.  ``operands``: the input, the means and the
    variances where the input's or the weight's gradient is wanted (none for the bias's
    alone), then the weight when ``weight``.  Not differentiable: the rule computes
    ``norm_grads`` instead where a graph of the gradient is wanted (``create_graph``)."""
    if need[0] or need[1]:
        x, stats = operands[0], np.stack([operands[1].reshape(-1), operands[2].reshape(-1)])
    else:
        x, stats = g, None
    w = operands[-1] if weight else None
    return _kernels().backward(g, x, stats, w, layout, groups, dims, eps, training, need)


def _product(values: Any) -> Any:
    total = 1
    for v in values:
        total = total * v
    return total


def _param_size(shape: tuple, layout: str, dims: int) -> Any:
    return _product(shape[len(shape) - dims :]) if layout == "layer" else shape[1]


def _stats_meta(shapes, dtypes, layout, groups, dims):  # type: ignore[no-untyped-def]
    return _stat_shape(tuple(shapes[0]), layout, groups, dims), dtypes[0]


def _backward_meta(shapes, dtypes, layout, groups, dims, eps, training, need, weight):  # type: ignore[no-untyped-def]
    shape = shapes[0]
    params = _param_size(shape, layout, dims)
    total = (_product(shape) if need[0] else 0) + (params if need[1] else 0)
    return (total + (params if need[2] else 0),), dtypes[0]


set_meta("norm_stats", _stats_meta)
set_meta(
    "norm",
    lambda shapes, dtypes, layout, groups, dims, eps, weight, bias, training: (
        tuple(shapes[0]),
        dtypes[0],
    ),
)
set_meta("norm_backward", _backward_meta)


# ---- when the layers run the primitives ------------------------------------------------------


class _Switch(threading.local):
    def __init__(self) -> None:
        self.enabled = True


_switch = _Switch()


@contextlib.contextmanager
def fused_norm_kernels(enabled: bool) -> Iterator[None]:
    """Within the block, batch / instance / group / layer norm on this thread run their fused
    primitives (``enabled=True``, the default) or their composites (``False``: for comparisons
    and benchmarks; the results agree to rounding)."""
    before = _switch.enabled
    _switch.enabled = bool(enabled)
    try:
        yield
    finally:
        _switch.enabled = before


def fused_norm_runs(x: Tensor, *others: Tensor | None, rows: bool = False) -> bool:
    """Whether a normalisation of ``x`` with ``others`` (weight, bias, running statistics;
    None for absent ones) runs the fused primitives: arrays of one dtype and device (the CPU,
    or CUDA: ``cuda/norms.py``), float32 or float64, a non-empty input, no forward-AD level
    (whose tangents the composites' primitives carry), and ``fused_norm_kernels`` not
    switched off on this thread.  ``rows`` (layer norm): not while a compiler records or
    captures the call, which fuses the composite into row kernels with its neighbours
    (``Tracer.prefers_composites``)."""
    if not _switch.enabled or _forward_state.level is not None:
        return False
    if rows:
        tracer = _tracer_state.tracer
        if tracer is not None and tracer.prefers_composites:
            return False
    data = x._data
    kind = type(data)
    if kind is not np.ndarray and kind is not CudaArray:
        return False
    if data.dtype not in (np.float32, np.float64) or not data.size:
        return False
    for t in others:
        if t is not None and (type(t._data) is not kind or t._data.dtype != data.dtype):
            return False
    return True


# ---- the op surface ------------------------------------------------------------------------------


def _stat_shape(shape: tuple, layout: str, groups: int | None, dims: int) -> tuple:
    """The statistics' shape: the leading dims (layer), (C,) (batch), (N, C) (instance),
    (N, groups) (group) -- made of the input's sizes, so that a compiled program's key sees no
    size of its own."""
    if layout == "layer":
        return shape[: len(shape) - dims]
    if layout == "batch":
        return shape[1:2]
    if layout == "instance":
        return shape[:2]
    return (shape[0], groups)


def norm_stats(x: Tensor, layout: str, groups: int | None = None, dims: int = 0) -> tuple:
    """(mean, var): the ``norm_stats`` primitive twice, in the statistics' shape."""
    attrs = {"layout": layout, "groups": groups, "dims": dims}
    mean = apply(P["norm_stats"], (x,), attrs)
    return mean, apply(P["norm_stats"], (x, mean), attrs)


def norm(
    x: Tensor,
    mean: Tensor,
    var: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    layout: str,
    eps: float,
    training: bool,
    groups: int | None = None,
    dims: int = 0,
) -> Tensor:
    """The ``norm`` primitive: ``x`` normalised by ``mean`` and ``var`` (from ``norm_stats``
    when ``training``, else given ones), then ``* weight + bias`` (either may be None)."""
    attrs = {
        "layout": layout,
        "groups": groups,
        "dims": dims,
        "eps": float(eps),
        "weight": weight is not None,
        "bias": bias is not None,
        "training": bool(training),
    }
    w = _placeholder(x) if weight is None else weight
    b = _placeholder(x) if bias is None else bias
    return apply(P["norm"], (x, mean, var, w, b), attrs)


def _placeholder(x: Tensor) -> Tensor:
    """An empty constant of ``x``'s dtype standing for an absent weight or bias of ``norm``
    (whose inputs are named, so that its rule saves each tensor only where needed)."""
    return _created(
        Tensor._make(_storage.full((0,), 0, x._data.dtype, not _storage.is_host(x._data)))
    )


def _reduced_view(x: Tensor, layout: str, groups: int | None, dims: int) -> tuple:
    """``x`` seen so that each statistic is a reduction over ``reduce`` (kept dims)."""
    if layout == "layer":
        return x, tuple(range(x.ndim - dims, x.ndim))
    if layout == "group":
        return x.reshape(x.shape[0], groups, -1), (2,)
    view = x.reshape(x.shape[0], x.shape[1], -1)
    return view, ((0, 2) if layout == "batch" else (2,))


def one_element(xs: Tensor, reduce: tuple) -> bool:
    """Whether each statistic of ``xs`` (over its dims ``reduce``) is over one element: a
    layer norm with ``normalized_shape`` (1,), a group norm with one element per group.  Sizes
    1 are never symbols in a compiled capture (``compiler/symbolic.py``): the answer holds for
    every call of its program."""
    return all(xs.shape[d] == 1 for d in reduce)


def centred(xs: Tensor, mean: Tensor, reduce: tuple) -> Tensor:
    """``x - mean`` in the composites; over one element ``x * 0 + 0``: +0, NaN for an infinite
    or NaN ``x``, as the kernels' ``x - mean`` and PyTorch's (the composite's mean of ``-0.0``
    sums to +0: ``x - mean`` gave -0)."""
    if one_element(xs, reduce):
        return xs * 0.0 + 0.0
    return xs - mean


def one_element_gradient(gs: Tensor, xs: Tensor, rstd: Tensor) -> Tensor:
    """The composites' input gradient of a norm over one element, ``gs`` being ``g w``: the
    output is constant (the shift), so the gradient is exactly +0, NaN where ``g w`` or ``x``
    is not finite or ``rstd`` infinite (``eps`` 0), as the layer norm's kernel gives it
    (PyTorch's: the same, or the rounding error of a product its kernel contracts; the group
    norm's kernel leaves that of ``g w / w``, docs/numerics.md).  Only products by 0: the
    general form (``gs rstd - rstd mean(gs) + ...``) cancels a product against its own
    rounded value, which generated code contracts into an FMA that leaves the product's
    rounding error (1e-14 in float64, 1e-6 in float32), amplified by later ops (native fuzz
    seeds 3000330, 1009234; fuzz seed 1005180 under compiled autograd).  ``+ 0.0``: +0, as
    the kernel's ``-0 + 0``."""
    return (gs * 0.0 + xs * 0.0) * rstd + 0.0


def _where(condition: Tensor, input: Tensor, other: Any) -> Tensor:
    """``where(condition, input, other)``, ``other`` a tensor or a number (the primitive:
    ``ops.elementwise``, whose ``where`` this module may not import, loads after it)."""
    return apply(P["where"], (condition, input, as_operand(other, input.dtype)), {})


def training_input_gradient(
    gs: Tensor,
    xs: Tensor,
    diff: Tensor,
    mean: Tensor,
    rstd: Tensor,
    mean_of: Any,
    rows: bool,
) -> Tensor:
    """The composites' input gradient of a norm in training (``norm_grads`` and
    ``autograd.native``'s): ``gs`` is ``g w`` in the statistics' view ``xs``, ``diff`` its
    ``x - mean``, ``mean`` and ``rstd`` the statistics (dims kept), ``mean_of`` the mean over a
    statistic's elements (dims kept); ``rows``: a layer norm.

    rstd (gs - mean(gs) - xhat mean(gs xhat)) in the fused kernels' form, rstd (gs - mean(gs))
    + (x beta + c) with ``c = -beta mean``, each difference taken before its product: where
    ``gs`` is constant over a statistic (the gradient of a sum) the first term is exactly 0,
    and infinities give the kernels' NaN and inf (fuzz seed 20485).  ``gs rstd + (x beta +
    gamma)``, with gamma = -beta mean - rstd mean(gs), left the rounding error of gs rstd where
    the exact gradient is 0.  And mean(gs diff) less mean(gs) mean(diff), 0 in exact arithmetic
    (a corrected two-pass sum): ``diff = x - mean`` with the mean rounded to x's dtype sums to
    n (mean - fl(mean)), so the projection took |mean| u times mean(gs): for a constant gs an
    error |mean| / std times the backward's terms (rstd |gs| u), where the exact gradient is 0
    for every x (native fuzz seeds 1006197, 1000269, 1008724;
    tests/compiler/test_norm_kernels_compiled.py).  The eager kernels keep the mean in x's
    dtype too and still have that error.

    Where rstd is 0 (the variance overflowed: the output is the shift) and ``mean(gs)`` is
    finite, a projection narrower than float64 is 0, as the kernels': their float64 sums of
    products are finite there and times rstd 0; ``gs diff`` in float32 overflowed (``|gs| |x
    - mean|`` past 3.4e38) and ``inf * 0`` was NaN throughout the statistic (fuzz seed
    304442: a layer norm of a row holding 1e30, weighted 1e30 there;
    tests/compiler/test_norm_kernels_compiled.py, tests/ops/test_norm_kernels.py).  In
    float64 the kernels' products overflow where these do, and their NaN is kept.  Other
    forms cost more: ``mean(gs xhat)`` (``xhat = diff rstd``, terms at most ``|gs|
    sqrt(n)``) waits for rstd, one more pass over each row where the row kernel computes the
    statistics too (compiled autograd's backward of a (4096, 768) float32 layer norm, one
    thread: medians 6.3-6.6 -> 6.8-7.1 ms), and float64 products put a second float dtype
    into the row kernels, which neither the interpreter of small kernels nor row fusion takes
    (tests/compiler/test_row_fusion.py failed).  So where rstd is not 0 (a variance within float32's
    range) a float32 ``gs diff`` past 3.4e38 still overflows where the kernels' products do
    not.

    Where ``mean(gs)`` is not finite (an infinite or NaN weight or gradient; the input finite)
    the correction is left out: ``inf * mean(diff)`` is NaN where the drift is 0 or of the
    sum's sign, where the kernels (which have no correction) give an infinity (fuzz seed
    301666).  A layer norm's statistics there take PyTorch's coefficients instead, as its
    kernel (``norm_kernels._row_backward``) does, so that infinities and NaNs fall where
    PyTorch's ``a g w + b x + c`` puts them: ``b = (mean(gs) mean - mean(gs x)) rstd^3``,
    ``c = -b mean - mean(gs) rstd`` -- every one of them infinite or NaN, so the order of the
    terms does not matter there, only which are infinite -- and no shift by ``mean(gs)``.
    ``mean(gs x)`` is not a sum of its own (one more sum per element: the compiled layer norm
    ran 10-20% slower): the drift's sum takes ``gs x`` in place of ``x - mean`` where ``gs``
    is not finite -- only in rows whose drift is not used, and there its infinities and NaNs
    are exactly those of ``mean(gs x)``, the finite terms adding nothing that matters."""
    m1 = mean_of(gs)
    finite = m1.isfinite()
    if rows:
        # one sum for both: the drift where ``gs`` is finite, and where it is not ``gs x``,
        # whose infinities and NaNs are then those of PyTorch's uncentred ``mean(gs x)``
        # (``|gs| < inf``: finite, in one comparison that generated code vectorises)
        drift = mean_of(_where(gs.abs() < math.inf, diff, gs * xs))
    else:
        drift = mean_of(diff)
    correction = _where(finite, m1 * drift, 0.0)
    projection = (mean_of(gs * diff) - correction) * rstd
    if projection.dtype.itemsize < 8:
        # rstd 0 (the variance overflowed): the kernels' float64 sum times 0 is 0, where
        # ``gs diff`` or the correction may have overflowed here (fuzz seed 304442)
        projection = _where((rstd != 0.0).logical_or(finite.logical_not()), projection, 0.0)
    beta = -(rstd * rstd * projection)
    if not rows:
        return (gs - m1) * rstd + (xs * beta - beta * mean)
    torch_b = (m1 * mean - drift) * (rstd * rstd * rstd)
    torch_c = -(torch_b * mean) - m1 * rstd
    shift = _where(finite, m1, 0.0)
    b = _where(finite, beta, torch_b)
    c = _where(finite, -(beta * mean), torch_c)
    return (gs - shift) * rstd + (xs * b + c)


def norm_grads(
    g: Tensor,
    x: Tensor,
    mean: Tensor | None,
    var: Tensor | None,
    weight: Tensor | None,
    attrs: dict,
    need: tuple[bool, bool, bool],
) -> tuple:
    """``norm``'s gradients (input, weight, bias; None where ``need`` is False) in the op
    surface, differentiable again: in training the statistics are recomputed from ``x``."""
    layout, groups, dims = attrs["layout"], attrs["groups"], attrs["dims"]
    eps, training = attrs["eps"], attrs["training"]
    if not (need[0] or need[1]):
        # the bias's alone: a sum of ``g`` (the input was not saved for it)
        ndim = g.ndim
        param_dims = tuple(range(ndim - dims)) if layout == "layer" else (0, *range(2, ndim))
        return None, None, (g.sum(param_dims) if param_dims else g) if need[2] else None
    channel_shape = (1, -1) + (1,) * (x.ndim - 2)
    xs, reduce = _reduced_view(x, layout, groups, dims)
    if training:
        mu = xs.mean(reduce, keepdim=True)
        diff = centred(xs, mu, reduce)
        rstd = ((diff * diff).mean(reduce, keepdim=True) + eps).rsqrt()
    else:  # given statistics (batch layout): constants of the graph
        diff = xs - mean.reshape(1, -1, 1)
        rstd = (var + eps).rsqrt().reshape(1, -1, 1)
    xhat = diff * rstd
    param_dims = tuple(range(x.ndim - dims)) if layout == "layer" else (0, *range(2, x.ndim))
    gx = gw = gb = None
    if need[2]:
        gb = g.sum(param_dims) if param_dims else g
    if need[1]:
        full = xhat.reshape(x.shape)
        gw = (g * full).sum(param_dims) if param_dims else g * full
        gw = gw.reshape(weight.shape) if weight is not None else gw
    if need[0]:
        gwt = g
        if weight is not None:
            gwt = g * (weight if layout == "layer" else weight.reshape(channel_shape))
        gs, _ = _reduced_view(gwt, layout, groups, dims)
        if training and one_element(xs, reduce):
            gx = one_element_gradient(gs, xs, rstd).reshape(x.shape)
        elif training:
            gx = training_input_gradient(
                gs, xs, diff, mu, rstd, lambda t: t.mean(reduce, keepdim=True), layout == "layer"
            ).reshape(x.shape)
        else:
            gx = (gs * rstd).reshape(x.shape)
    return gx, gw, gb
