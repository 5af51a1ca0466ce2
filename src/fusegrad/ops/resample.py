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
``interpolate`` uses them: float32 / float64 tensors on the CPU or on CUDA (whose kernels are
``cuda/resample.py``), no forward-AD level; inside compiled
programs the nearest modes call them as externs and the linear modes keep their composite.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np

from .._resample_tables import keeps_dim, linear_source, nearest_source
from .._resample_tables import tables as _tables
from ..autograd.forward_state import state as _forward_state
from ..autograd.tracer import notify_created as _created
from ..autograd.tracer import state as _tracer_state
from ..cuda.array import CudaArray
from ..tensor import Tensor
from ._util import P, apply
from .registry import primitive, set_meta

__all__ = [
    "fused_resample_kernels",
    "fused_resample_runs",
    "keeps_dim",
    "linear_source",
    "nearest_source",
    "resample",
    "resample_grad",
]


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
    """Whether ``interpolate`` runs the ``resample`` primitive on ``x``: a float32 / float64
    array on the CPU or on CUDA (``cuda/resample.py``), no forward-AD level,
    ``fused_resample_kernels`` not switched off on this thread, and for the ``linear`` modes no
    compiler recording or capturing the call (``Tracer.prefers_composites``: compiled programs
    keep the composite's matrix products, which measured no slower there)."""
    if not _switch.enabled or _forward_state.level is not None:
        return False
    tracer = _tracer_state.tracer
    if linear and tracer is not None and tracer.prefers_composites:
        return False
    data = x._data
    kind = type(data)
    return (kind is np.ndarray or kind is CudaArray) and data.dtype in (np.float32, np.float64)


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
