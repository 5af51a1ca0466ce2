"""``F.interpolate``'s nearest and linear modes as fused primitives: ``resample`` (the
forward) and ``resample_backward`` (the input's gradient), numba kernels
(``resample_kernels``, loaded on first use), for 1 to 3 spatial dims.

Why primitives: as composites (a constant matrix multiplied along each dim, or a gather) the
linear modes ran one matmul per dim forward and backward, and a non-finite input reached every
output of its row through a zero weight; the kernels read each output's neighbours only, as
PyTorch's do.  ``resample_grad`` is the backward in the op surface (the transposed
per-dim matrices), used by the rule where a graph of the gradient is wanted (``create_graph``).

Attributes: ``mode`` (``nearest``, ``nearest-exact`` or ``linear``: linear, bilinear and
trilinear by the input's rank), ``size`` (the output's spatial sizes), ``scales`` (per dim, the
given scale factor or None: PyTorch's kernels use it instead of ``in / out`` when
``recompute_scale_factor`` is not set), ``align_corners``.  ``fused_resample_runs`` says when
``interpolate`` uses them: CPU float32 / float64 tensors, no forward-AD level; inside compiled
programs the nearest modes call them as externs and the linear modes keep their composite.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np

from ..autograd.forward_state import state as _forward_state
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import state as _tracer_state
from ..tensor import Tensor
from ._util import P, apply
from .registry import primitive, set_meta

__all__ = ["fused_resample_kernels", "fused_resample_runs", "resample", "resample_grad"]


def nearest_source(n: int, out: int, scale: float | None, exact: bool) -> np.ndarray:
    """The input index each output copies, computed in float32 as PyTorch's kernels do (so that
    a product landing just below an integer floors the same way)."""
    step = np.float32(1.0 / scale if scale is not None and scale > 0 else n / out)
    j = np.arange(out, dtype=np.float32)
    src = np.floor((j + np.float32(0.5)) * step if exact else j * step).astype(np.int64)
    return np.minimum(src, n - 1)


def linear_source(n: int, out: int, scale: float | None, align_corners: bool) -> tuple:
    """(index (out, 2), weight (out, 2)): each output's two sources and weights (PyTorch's
    area_pixel_compute_source_index; at the last input both indices are the same)."""
    j = np.arange(out, dtype=np.float64)
    if align_corners:
        src = j * ((n - 1) / (out - 1) if out > 1 else 0.0)
    else:
        step = 1.0 / scale if scale is not None and scale > 0 else n / out
        src = np.maximum(step * (j + 0.5) - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    frac = src - lo
    return np.stack([lo, hi], 1), np.stack([1.0 - frac, frac], 1)


def keeps_dim(mode: str, rank: int, n: int, out: int) -> bool:
    """Whether a spatial dim whose size does not change is copied as it is, whatever the scale
    factor says: PyTorch's CPU kernels do so for every mode and rank but nearest over 1 or 3
    spatial dims (which then read input ``floor(j / scale)``, as for any size)."""
    return out == n and not (mode == "nearest" and rank in (1, 3))


def _tables(in_sizes: tuple, mode: str, size: tuple, scales: tuple, align_corners: bool) -> list:
    """Per spatial dim: (index (out, 2), weight (out, 2), two corners, copies the dim)."""
    tables = []
    rank = len(in_sizes)
    for n, out, scale in zip(in_sizes, size, scales):
        if keeps_dim(mode, rank, n, out):
            index = np.stack([np.arange(n), np.arange(n)], 1)
            weight = np.zeros((n, 2))
            weight[:, 0] = 1.0
            tables.append((index, weight, False, True))
        elif mode == "linear":
            index, weight = linear_source(n, out, scale, align_corners)
            tables.append((index, weight, True, False))
        else:
            src = nearest_source(n, out, scale, mode == "nearest-exact")
            index = np.stack([src, src], 1)
            weight = np.zeros((out, 2))
            weight[:, 0] = 1.0
            tables.append((index, weight, False, False))
    return tables


def _kernels():  # type: ignore[no-untyped-def]
    """The fused kernels (forward, backward), imported on first use."""
    from .resample_kernels import backward, forward  # numba: not at import

    return SimpleNamespace(forward=forward, backward=backward)


@primitive("resample", "opaque", "x")
def _resample(x, *, mode, size, scales, align_corners):  # type: ignore[no-untyped-def]
    """``x`` (N, C, *spatial) resampled to ``size`` by ``mode`` (see the module docstring)."""
    tables = _tables(x.shape[2:], mode, size, scales, align_corners)
    return _kernels().forward(x, tables)


@primitive("resample_backward", "opaque", "g", differentiable=False)
def _resample_backward(g, *, mode, input_size, scales, align_corners):  # type: ignore[no-untyped-def]
    """The gradient of ``resample``'s input (spatial sizes ``input_size``) for its gradient
    ``g``.  Not differentiable: the rule computes ``resample_grad`` instead where a graph of
    the gradient is wanted (``create_graph``)."""
    tables = _tables(tuple(input_size), mode, g.shape[2:], scales, align_corners)
    return _kernels().backward(g, tuple(g.shape[:2]) + tuple(input_size), tables)


set_meta(
    "resample",
    lambda shapes, dtypes, mode, size, scales, align_corners: (
        tuple(shapes[0][:2]) + tuple(size),
        dtypes[0],
    ),
    ("size",),
)
set_meta(
    "resample_backward",
    lambda shapes, dtypes, mode, input_size, scales, align_corners: (
        tuple(shapes[0][:2]) + tuple(input_size),
        dtypes[0],
    ),
    ("input_size",),
)


class _Switch(threading.local):
    def __init__(self) -> None:
        self.enabled = True


_switch = _Switch()


@contextlib.contextmanager
def fused_resample_kernels(enabled: bool) -> Iterator[None]:
    """Within the block, ``interpolate`` on this thread runs its fused primitives
    (``enabled=True``, the default) or its composites (``False``: for comparisons and
    benchmarks; the results agree to rounding, non-finite inputs aside)."""
    before = _switch.enabled
    _switch.enabled = bool(enabled)
    try:
        yield
    finally:
        _switch.enabled = before


def fused_resample_runs(x: Tensor, linear: bool) -> bool:
    """Whether ``interpolate`` runs the ``resample`` primitive on ``x``: a CPU float32 /
    float64 array, no forward-AD level, ``fused_resample_kernels`` not switched off on this
    thread, and for the ``linear`` modes no compiler recording
    or capturing the call (``Tracer.prefers_composites``: compiled programs keep the
    composite's matrix products, which measured no slower there)."""
    if not _switch.enabled or _forward_state.level is not None:
        return False
    tracer = _tracer_state.tracer
    if linear and tracer is not None and tracer.prefers_composites:
        return False
    data = x._data
    return type(data) is np.ndarray and data.dtype in (np.float32, np.float64)


def resample(x: Tensor, mode: str, size: tuple, scales: tuple, align_corners: bool) -> Tensor:
    """The ``resample`` primitive."""
    attrs = {
        "mode": mode,
        "size": tuple(int(s) for s in size),
        "scales": tuple(None if s is None else float(s) for s in scales),
        "align_corners": bool(align_corners),
    }
    return apply(P["resample"], (x,), attrs)


def resample_input_grad(g: Tensor, attrs: dict, input_size: tuple) -> Tensor:
    """The ``resample_backward`` primitive."""
    kernel_attrs = {
        "mode": attrs["mode"],
        "input_size": tuple(input_size),
        "scales": attrs["scales"],
        "align_corners": attrs["align_corners"],
    }
    return apply(P["resample_backward"], (g,), kernel_attrs)


def resample_grad(g: Tensor, attrs: dict, input_size: tuple) -> Tensor:
    """``resample``'s input gradient in the op surface, differentiable again: per spatial dim,
    ``g`` times the transposed (out, in) matrix of that dim's sources and weights."""
    tables = _tables(tuple(input_size), attrs["mode"], tuple(g.shape[2:]), attrs["scales"],
                     attrs["align_corners"])  # fmt: skip
    for k, (index, weight, _, _) in enumerate(tables):
        n = input_size[k]
        matrix = np.zeros((index.shape[0], n))
        rows = np.arange(index.shape[0])
        matrix[rows, index[:, 0]] += weight[:, 0]  # (one element per row each time)
        matrix[rows, index[:, 1]] += weight[:, 1]
        g = _along(g, 2 + k, matrix.T)
    return g


def _along(x: Tensor, dim: int, matrix: np.ndarray) -> Tensor:
    """``x`` with ``matrix`` (out, in) applied to dim ``dim``."""
    m = _created(Tensor._make(np.ascontiguousarray(matrix, dtype=x.dtype.np)))
    m = m if x.device == m.device else m.to(x.device)
    if dim == x.ndim - 1:
        return x @ m.mT
    if dim == x.ndim - 2:
        return m @ x
    return (x.movedim(dim, -1) @ m.mT).movedim(-1, dim)
