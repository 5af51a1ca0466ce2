"""Eager CUDA execution of primitives: ``registry.apply`` hands every call with a CUDA input here.

Where each primitive's CUDA code comes from:

* elementwise primitives, and ``sum`` / ``sum_to`` of floating values: a one-op program built by
  the compiler — a tiny IR graph (inputs, the primitive, an output) fused into one ``Kernel`` and
  emitted by ``fusegrad.compiler.codegen.numba_cuda`` from the same lowering table as compiled
  code, so each formula has one definition.  Kernels are cached per primitive, attributes,
  dtypes and broadcast pattern (sizes are runtime arguments);
* view primitives (``reshape``, ``permute``, ``broadcast_to``, ``diagonal``, basic ``getitem``):
  no kernel, only geometry (``CudaArray`` views computed by numpy on a probe);
* ``to_device``: the transfer itself; ``flip``: a view, then a copy; ``matmul``: a tiled
  shared-memory kernel (``fusegrad.cuda.matmul``); reductions: ``fusegrad.cuda.reduce``;
  copying movement ops and ``cumsum``: ``fusegrad.cuda.movement``; advanced indexing:
  ``fusegrad.cuda.advanced``; the elementwise externs (``round``, ``remainder``,
  ``floor_divide``, bitwise ops): ``fusegrad.cuda.arith``; ``argsort`` (sort, topk, ...):
  ``fusegrad.cuda.sorting``; complex operands or results (the generated kernels compute in real
  arithmetic): ``fusegrad.cuda.complex``; the convolution and pooling primitives:
  ``fusegrad.cuda.convolution`` and ``fusegrad.cuda.pooling``; the normalisation layers'
  primitives: ``fusegrad.cuda.norms``; the embedding's: ``fusegrad.cuda.embedding``;
  interpolate's: ``fusegrad.cuda.resample``; the recurrent layers': ``fusegrad.cuda.recurrent``.

What is not implemented on CUDA yet raises ``NotImplementedError`` naming the primitive, shapes
and dtypes — never a silent trip through host memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .._index_key import numpy_key
from . import (
    advanced,
    arith,
    convolution,
    embedding,
    generated,
    movement,
    norms,
    pooling,
    recurrent,
    reduce,
    resample,
    sorting,
)
from . import complex as complex_kernels
from .array import CudaArray, contiguous, copy_into, probe_view, to_device
from .matmul import matmul

# Python scalars (0-d host arrays) meeting CUDA tensors are uploaded once per (dtype, value)
_SCALARS: dict[tuple, CudaArray] = {}
_MAX_SCALARS = 4096


def device_scalar(a: np.ndarray) -> CudaArray:
    """A 0-d host array on the device, uploaded once per (dtype, value) and shared (read-only)."""
    key = (a.dtype.str, a.tobytes())
    out = _SCALARS.get(key)
    if out is None:
        if len(_SCALARS) >= _MAX_SCALARS:
            _SCALARS.clear()
        out = _SCALARS[key] = to_device(a)
        out.writeable = False  # shared: never written in place
    return out


def _on_device(prim: Any, arrays: list) -> list[CudaArray]:
    out = []
    for a in arrays:
        if type(a) is not CudaArray:
            a = np.asarray(a)
            if a.ndim != 0:
                shapes = ", ".join(
                    f"{'cuda:0' if type(x) is CudaArray else 'cpu'} {tuple(x.shape)} {x.dtype}"
                    for x in arrays
                )
                raise RuntimeError(
                    "Expected all tensors to be on the same device, but found at least two "
                    f"devices, cuda:0 and cpu! ({prim.name} got {shapes})"
                )
            a = device_scalar(a)
        out.append(a)
    return out


def run(prim: Any, arrays: list, attrs: dict) -> Any:
    """The CUDA kernel of ``prim`` on ``arrays`` (CudaArrays, or 0-d host scalars)."""
    name = prim.name
    if name == "to_device":
        return prim.kernel(arrays[0], **attrs)
    data_count = _DATA_OPERANDS.get(name)
    if data_count is not None and (len(arrays) > data_count or name == "index_add_at"):
        # index operands may live on either device (PyTorch accepts host index tensors)
        return _advanced(name, _on_device(prim, arrays[:data_count]), arrays[data_count:], attrs)
    if name in _INDEX_AT_1 and type(arrays[1]) is not CudaArray:
        arrays = [arrays[0], to_device(np.asarray(arrays[1])), *arrays[2:]]
    arrays = _on_device(prim, arrays)
    if name not in _GEOMETRY_ONLY and (
        name in _COMPLEX_VIEWS or complex_kernels.involves_complex(name, arrays, attrs)
    ):
        return _complex(prim, arrays, attrs)
    special = _SPECIAL.get(name)
    if special is not None:
        result = special(prim, arrays, attrs)
        if result is not NotImplemented:
            return result
    if generated.supports(prim, arrays):
        return generated.run(prim, arrays, attrs)
    if arith.supports(name):  # elementwise externs of the lowering table
        _, dtype = prim.meta(
            tuple(a.shape for a in arrays),
            tuple(_dt.from_numpy_dtype(a.dtype) for a in arrays),
            **attrs,
        )
        return arith.run(name, arrays, attrs, dtype.np)
    raise NotImplementedError(_unsupported(prim, arrays, attrs))


def _complex(prim: Any, arrays: list, attrs: dict) -> Any:
    """A primitive with complex operands or a complex result (``fusegrad.cuda.complex``): the
    generated kernels compute in real arithmetic and would lose the imaginary parts, so only
    what has a complex kernel, a view, or moves bytes runs; the rest refuses."""
    name = prim.name
    view = _COMPLEX_VIEWS.get(name)
    if view is not None:
        return view(arrays[0])
    if name in ("sum", "sum_to"):
        return complex_kernels.complex_sum(
            lambda n, pairs, a: generated.run(prim, [pairs], a), arrays[0], attrs, name
        )
    if name in complex_kernels.SUPPORTED:
        _, dtype = prim.meta(
            tuple(a.shape for a in arrays),
            tuple(_dt.from_numpy_dtype(a.dtype) for a in arrays),
            **attrs,
        )
        return complex_kernels.run(prim, arrays, attrs, dtype.np)
    if name in _MOVES_BYTES:
        special = _SPECIAL.get(name)
        result = special(prim, arrays, attrs) if special is not None else NotImplemented
        if result is not NotImplemented:
            return result
    raise NotImplementedError(
        _unsupported(prim, arrays, attrs)
        + " (complex values on CUDA: elementwise arithmetic, abs, conj, exp/log/sqrt and the"
        " trigonometric functions, real/imag, casts, where, sums and movement; docs/complex.md)"
    )


# complex values seen as their parts, and back: views
_COMPLEX_VIEWS: dict[str, Callable[[CudaArray], CudaArray]] = {
    "real": lambda a: complex_kernels.part(a, imaginary=False),
    "imag": lambda a: complex_kernels.part(a, imaginary=True),
    "view_as_real": complex_kernels.as_real,
    "view_as_complex": complex_kernels.as_complex,
}
# primitives whose CUDA kernels only move elements (any dtype, complex included)
_MOVES_BYTES = frozenset({"flip", "cat", "pad", "index_put", "getitem", "gather"})
# primitives that only compute geometry (views): any dtype, complex included
_GEOMETRY_ONLY = frozenset({"reshape", "permute", "broadcast_to", "diagonal", "getitem"})
# primitives with trailing index operands: how many leading operands are data
_DATA_OPERANDS = {"getitem": 1, "index_put": 2, "index_add_at": 1}
# primitives with an index operand at position 1 (uploaded when it is on the host)
_INDEX_AT_1 = frozenset({"gather", "scatter", "scatter_add"})


def host_round_trip(name: str, operands: int, dtype: Any) -> str | None:
    """Why the eager CUDA kernel of primitive ``name`` (with ``operands`` operands and a result
    of fusegrad dtype ``dtype``) reads device data on the host, or None when it does not: what
    a compiled CUDA program's ``explain()`` lists as its host round trips."""
    count = _DATA_OPERANDS.get(name)
    if count is not None and (operands > count or name == "index_add_at"):
        return "advanced indexing reads its index tensors on the host (element positions)"
    if name == "floor_divide" and not dtype.is_floating_point:
        return "integer floor_divide reads one flag on the host (is any divisor zero)"
    return None


def _advanced(name: str, data: list, index: list, attrs: dict) -> CudaArray:
    key = numpy_key(attrs["key"], tuple(advanced.host_index(i) for i in index))
    if name == "getitem":
        return advanced.getitem(data[0], key)
    if name == "index_put":
        return advanced.index_put(data[0], data[1], key)
    return advanced.index_add_at(data[0], key, tuple(attrs["shape"]))


def _unsupported(prim: Any, arrays: list, attrs: dict) -> str:
    shapes = ", ".join(f"{tuple(a.shape)} {a.dtype}" for a in arrays)
    return (
        f"{prim.name} is not implemented for CUDA tensors yet (inputs: {shapes}); "
        "move the tensors to the CPU with .cpu() for this op"
    )


# ---- views: geometry only ---------------------------------------------------------------------
# (each special gets the primitive's record, the arrays and the attributes)
def _reshape(prim: Any, arrays: list, attrs: dict) -> CudaArray:
    return arrays[0].reshape(tuple(attrs["shape"]))


def _view(prim: Any, arrays: list, attrs: dict) -> CudaArray:
    """A view primitive: its numpy kernel, run on the geometry alone."""
    kernel = prim.kernel
    return probe_view(arrays[0], lambda p: kernel(p, **attrs))


def _getitem(prim: Any, arrays: list, attrs: dict) -> Any:
    if len(arrays) > 1:  # index tensors: advanced indexing (a gather)
        return NotImplemented
    return _view(prim, arrays, attrs)


def _index_put(prim: Any, arrays: list, attrs: dict) -> Any:
    if len(arrays) > 2:  # index tensors: advanced indexing (a scatter)
        return NotImplemented
    out = contiguous(arrays[0], force=True)
    key = numpy_key(attrs["key"], ()) + (Ellipsis,)  # a view even for all-integer keys
    copy_into(probe_view(out, lambda p: p[key]), arrays[1])
    return out


def _flip(prim: Any, arrays: list, attrs: dict) -> CudaArray:
    view = probe_view(arrays[0], lambda p: np.flip(p, attrs["dims"]))
    return contiguous(view, force=True)  # PyTorch's flip copies


def _matmul(prim: Any, arrays: list, attrs: dict) -> CudaArray:
    return matmul(arrays[0], arrays[1])


def _reduce(name: str) -> Callable[[Any, list, dict], Any]:
    def run(prim: Any, arrays: list, attrs: dict) -> Any:
        return reduce.run(name, arrays[0], attrs)

    return run


def _movement(name: str) -> Callable[[Any, list, dict], Any]:
    def run(prim: Any, arrays: list, attrs: dict) -> Any:
        if name == "cat":
            return movement.cat(arrays, attrs["dim"])
        if name == "pad":
            return movement.pad(arrays[0], attrs["widths"], attrs["value"])
        if name == "gather":
            return movement.gather(arrays[0], arrays[1], attrs["dim"])
        if name == "cumsum":
            return movement.cumsum(arrays[0], attrs["dim"])
        return movement.scatter(*arrays, attrs["dim"], add=name == "scatter_add")

    return run


_SPECIAL: dict[str, Callable[[Any, list, dict], Any]] = {
    **{n: _movement(n) for n in ("cat", "pad", "gather", "scatter", "scatter_add", "cumsum")},
    "reshape": _reshape,
    "permute": _view,
    "broadcast_to": _view,
    "diagonal": _view,
    "getitem": _getitem,
    "index_put": _index_put,
    "flip": _flip,
    "matmul": _matmul,
    "argsort": lambda prim, arrays, attrs: sorting.argsort(arrays[0], **attrs),
    # the convolution and pooling primitives (``cuda/convolution.py``, ``cuda/pooling.py``)
    "convolution": lambda prim, arrays, attrs: convolution.convolution(*arrays, **attrs),
    "convolution_backward_input": lambda prim, arrays, attrs: (
        convolution.convolution_backward_input(*arrays, **attrs)
    ),
    "convolution_backward_weight": lambda prim, arrays, attrs: (
        convolution.convolution_backward_weight(*arrays, **attrs)
    ),
    "avg_pool": lambda prim, arrays, attrs: pooling.avg_pool(arrays[0], **attrs),
    "avg_pool_backward": lambda prim, arrays, attrs: pooling.avg_pool_backward(arrays[0], **attrs),
    "pool_index": lambda prim, arrays, attrs: pooling.pool_index(arrays[0], **attrs),
    "pool_take": lambda prim, arrays, attrs: pooling.pool_take(*arrays),
    "pool_scatter": lambda prim, arrays, attrs: pooling.pool_scatter(*arrays, **attrs),
    # the normalisation layers' primitives (``cuda/norms.py``)
    "norm_stats": lambda prim, arrays, attrs: norms.norm_stats(*arrays, **attrs),
    "norm": lambda prim, arrays, attrs: norms.norm(*arrays, **attrs),
    "norm_backward": lambda prim, arrays, attrs: norms.norm_backward(*arrays, **attrs),
    # the embedding's lookup and scatter-add backward (``cuda/embedding.py``)
    "embedding": lambda prim, arrays, attrs: embedding.embedding(*arrays),
    "embedding_backward": lambda prim, arrays, attrs: embedding.embedding_backward(
        *arrays, **attrs
    ),
    # interpolate's nearest and linear modes (``cuda/resample.py``)
    "resample": lambda prim, arrays, attrs: resample.resample(arrays[0], **attrs),
    "resample_backward": lambda prim, arrays, attrs: resample.resample_backward(arrays[0], **attrs),
    # the recurrent layers over a whole sequence (``cuda/recurrent.py``)
    "rnn_sequence": lambda prim, arrays, attrs: recurrent.rnn_sequence(*arrays, **attrs),
    "rnn_sequence_backward": lambda prim, arrays, attrs: recurrent.rnn_sequence_backward(
        *arrays, **attrs
    ),
    **{n: _reduce(n) for n in ("amax", "amin", "prod", "argmax", "argmin", "all", "any")},
}
