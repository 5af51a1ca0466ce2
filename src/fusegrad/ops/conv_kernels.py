"""CPU kernels of the convolution primitives (``convolution``, ``convolution_backward_input``,
``convolution_backward_weight`` in ``ops/primitives.py``): numpy arrays in, numpy arrays out.

The kernels are im2col plus BLAS, over 1, 2 or 3 spatial dims and any groups (except one input
channel per group: direct loops, below).  The columns take one of two layouts, by the number
of outputs per sample L (``_by_sample``):

* per sample, (N, C taps, L), from 256 outputs on: the forward is one (batched over samples,
  grouped) ``matmul`` of the (groups, O / groups, C / groups * taps) weight with them, and
  the weight's gradient one product per sample, summed; a 1x1 kernel with unit stride and no
  padding is the input itself, no copy; the columns are made and used ``_CHUNK_BYTES`` (a
  few samples) at a time, so that they stay in the caches (the MNIST network's second layer:
  its weight's gradient 35 -> 19 ms, its input's 22 -> 16);
* the batch in the columns, (C taps, N L), below: one product over the whole batch, as the
  per-sample products are too thin for BLAS there (DCGAN's 4x4 and 8x8 layers: (64, 512) by
  (512, 16) per sample); ``g`` and the output are copied to and from channel-major, which is
  small at these sizes.  With one group and at least 8 input channels these columns are
  channels-last, (N L, taps C) (``_channels_last``): im2col then copies whole channel vectors,
  not strided output rows, and the input and weight are transposed to match (small copies).

im2col and col2im are numba loops (``pool_kernels.im2col`` / ``col2im``) that read and write
either layout and skip the padding instead of copying a padded input; where an output row is
short (a few outputs along the last dim) their per-row cost is too high, so numpy copies a
strided window view instead and adds back one slice per kernel tap (``_SHORT_ROWS``).  The
input's gradient is the columns' gradient ``W^T g`` (one matmul) put back by col2im.  The
weight's gradient needs the forward's columns again: the forward keeps the latest few
(``_columns_of``, per thread, keyed by the input array object and the geometry), and the
weight's gradient takes them instead of making them a second time (the DCGAN step: three
discriminator backwards a step, 0.25 ms of columns each).

The transposed convolution is the convolution's adjoint, so it runs the same three kernels
with the roles swapped: its forward is ``backward_input``, its input's gradient is the
forward (of ``g``), its weight's gradient is ``backward_weight`` with the input and ``g``
exchanged.  Each kernel takes the output's spatial size explicitly, so a transposed
convolution's ``output_padding`` (which can leave rows that no window reads) needs no case of
its own.

Why im2col and not direct loops, per shape class (measured with ``python -m benchmarks.conv``
and by timing each kernel alone, one thread; figures in ``benchmarks/README.md``):

* channels > 1 per group (every ordinary convolution): the time is in the products, and BLAS
  does them several times faster than a loop nest can (a 64-channel 3x3 layer is a (64, 288)
  by (288, L) product per sample).  With the loop kernels, the copies around the products
  take a fraction of them: on DCGAN's 32 -> 64 layer (16 x 32 x 16 x 16, 4x4, stride 2) the
  columns take 0.28 ms against the product's 0.7 (numpy's strided copy took 0.41), and col2im
  0.24 ms (the earlier loop over a 7-dim array, indexed with negative-index checks, 0.72);
* one input channel per group (depthwise, channel multipliers): im2col leaves a (1, taps) by
  (taps, L) product per sample and group, thousands of BLAS calls with nothing in them (5x
  PyTorch's time for the forward at 64 x 64 x 32 x 32, 3x3); direct numba loops do these
  (``pool_kernels.depthwise_*``): forward + backward 3x PyTorch's vectorised kernel there,
  against 8x through im2col (``benchmarks.conv``'s ``depthwise-3x3``).

The forward of a 3x3, stride-1 convolution with many channels runs as Winograd F(4x4, 3x3)
instead (``winograd``; the shape rule is ``_winograd_fits``): 4x fewer products, 1.5x faster
than im2col on the MNIST network's second layer.  The input's gradient is such a correlation
too (of g padded by 2, with the rotated, transposed filters), but there it measured no faster
(24.8 against 22.4 ms on that layer: the padded gradient's partial tiles and the transform of
its 64 channels eat the saving), so both gradients stay im2col.

col2im's slice-add per kernel tap in numpy took as long as the product before it on the MNIST
network's second layer (14.6 against 18 ms), hence the loop kernel wherever rows are long.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .._pool_windows import window_divisor, window_tables


def _loops() -> Any:
    """The loop kernels (``pool_kernels``), imported on their first use: they bring numba,
    which fusegrad never imports when it loads."""
    import fusegrad.ops.pool_kernels as loops  # numba: on first use only

    return loops


def _winograd() -> Any:
    """The Winograd kernels (numba: imported on their first use)."""
    import fusegrad.ops.winograd as winograd  # numba: on first use only

    return winograd


def _winograd_fits(
    in_c: int,
    out_c: int,
    batch: int,
    kernel: tuple,
    stride: tuple,
    dilation: tuple,
    groups: int,
    outs: tuple,
    dtype: Any,
) -> bool:
    """Whether a correlation runs as Winograd F(4x4, 3x3) (``winograd``): 2-D, 3x3, stride 1,
    undilated, one group, floating point, and enough work that its 4x fewer products pay for
    the transforms: at least 32 channels on both sides, 2,048 channel pairs and 64 output
    tiles.  Measured (``python -m benchmarks.conv``, one thread): 1.7x faster than im2col on
    the MNIST network's second layer (32 -> 64 channels, 24 x 24 outputs, batch 64); slower
    with few channels (the transforms dominate) or few tiles (the products are too thin for
    BLAS)."""
    if len(kernel) != 2 or tuple(kernel) != (3, 3) or groups != 1:
        return False
    if tuple(stride) != (1, 1) or tuple(dilation) != (1, 1):
        return False
    if np.dtype(dtype) not in (np.float32, np.float64):
        return False
    if min(in_c, out_c) < 32 or in_c * out_c < 2048:
        return False
    return batch * (-(-outs[0] // 4)) * (-(-outs[1] // 4)) >= 64


# below this many outputs per sample, the columns hold the whole batch (one product over it)
_FEW_OUTPUTS = 256
# below this many outputs along the last spatial dim, numpy copies the columns (its loops
# reorder and merge dims); from it on, the loop kernel (``pool_kernels.im2col``), whose cost
# per row of outputs is too high for rows of 1 to 4 (13 ns a row: 11x numpy's time on DCGAN's
# last layer, 1x1 outputs; even at 4 and 8, 1.2x and 1.8x faster at 16)
_SHORT_ROWS = 8
# col2im's loop kernel (``pool_kernels.col2im``) is 3-4x faster than numpy's slice-adds from
# rows of 2 on; at 1 (a window over the whole input: DCGAN's first transposed layer) 3x slower
_SHORT_ROWS_ADD = 2


# from this many input channels on (one group), the batch-wide columns are channels-last,
# (N L, taps C), where each copy is C contiguous elements rather than a strided output row:
# measured on DCGAN's middle layers (one thread, forward / input gradient / weight gradient,
# ms): 32 -> 64 channels at 16x16, 1.16 / 0.99 / 1.19 channel-major against 0.85 / 0.88 /
# 0.89; 128 -> 64 at 8x8, 1.43 / 1.27 / 1.47 against 0.84 / 0.83 / 0.89.  Per-sample columns
# stay channel-major: there channels-last measured 1.2-2x slower (its (N L, taps C) matrix
# outgrows the caches)
_LAST_MIN_CHANNELS = 8


# per-sample columns are made and used a few samples at a time, at most this many bytes of
# them (at least one sample), so that they stay in the caches between im2col and the product
# (and between the product and col2im).  Measured on the MNIST network's second layer (64 x 32
# x 26 x 26, 3x3 to 64 channels: 663 KB of columns per sample; one thread, ms), the weight's
# gradient: whole batch 35.3, 1 / 2 / 4 / 8 samples at a time 21.0 / 18.9 / 18.2 / 25.2; the
# input's: 22.4, then 17.2 / 16.4 / 22.9 / 28.9
_CHUNK_BYTES = 3 << 19


class _RecentColumns(threading.local):
    """Per thread: the columns (im2col) of the latest convolutions' inputs, for their weights'
    gradients (``_columns_of``): (input array, key, columns), oldest first."""

    def __init__(self) -> None:
        self.entries: list = []


_recent = _RecentColumns()
# at most this many columns are kept, none over this size: a training step's backward reads its
# layers' columns in the reverse order of its forward (measured on the DCGAN step, one thread:
# the discriminator's three convolutions' columns, 0.25 ms per backward, recomputed three times
# a step)
_RECENT_ENTRIES = 8
_RECENT_BYTES = 8 << 20
_RECENT_TOTAL = 24 << 20  # (all of them: what an inference that needs none holds on to)


def _kept_columns(
    x: np.ndarray,
    layout: str,
    kernel: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    outs: tuple,
    forward: bool,
) -> np.ndarray:
    """``x``'s columns in ``layout`` -- "last" (``_columns_last``), "sample" or "batch"
    (``_columns`` by sample or not) -- through ``_columns_of``."""
    if layout == "last":
        make = lambda: _columns_last(x, kernel, stride, padding, dilation, outs)  # noqa: E731
    else:
        by_sample = layout == "sample"
        make = lambda: _columns(x, kernel, stride, padding, dilation, outs, by_sample)  # noqa: E731
    return _columns_of(x, (layout, kernel, stride, padding, dilation, outs), make, forward)


def _columns_of(x: np.ndarray, key: tuple, make: Any, forward: bool) -> np.ndarray:
    """``make()``, the columns of ``x`` for ``key`` (their layout and geometry), shared between a
    convolution and its weight's gradient: the forward computes them and keeps them (the latest
    ``_RECENT_ENTRIES``, each at most ``_RECENT_BYTES``, ``_RECENT_TOTAL`` in all); the
    weight's gradient takes the ones the latest forward made of the same array object (the one
    autograd or a program saved: what changes its values in between bumps its version, and the
    backward refuses it) and computes them where there are none.  Holding the array keeps its
    identity from being reused."""
    key = (key, x.shape, x.strides, x.dtype)
    entries = _recent.entries
    for i, (held, k, cols) in enumerate(entries):
        if held is x and k == key:
            del entries[i]
            if not forward:
                return cols  # type: ignore[no-any-return]
            break
    cols = make()
    if forward and cols.nbytes <= _RECENT_BYTES:
        entries.append((x, key, cols))
        while len(entries) > _RECENT_ENTRIES or (
            sum(c.nbytes for _, _, c in entries) > _RECENT_TOTAL
        ):
            del entries[0]
    return cols  # type: ignore[no-any-return]


def _sample_chunks(batch: int, per_sample: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges of samples covering ``batch``, ``_CHUNK_BYTES`` of columns each."""
    step = max(1, _CHUNK_BYTES // max(1, per_sample))
    return [(lo, min(lo + step, batch)) for lo in range(0, batch, step)]


def _channels_last(by_sample: bool, channels: int, groups: int) -> bool:
    """Whether the columns are channels-last (``_LAST_MIN_CHANNELS``)."""
    return not by_sample and groups == 1 and channels >= _LAST_MIN_CHANNELS


def _columns_last(
    x: np.ndarray, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple, outs: tuple
) -> np.ndarray:
    """Channels-last im2col of ``x`` (N, C, *spatial): (N L, taps C), a row per output
    position (``pool_kernels.im2col_last``)."""
    batch, channels = x.shape[0], x.shape[1]
    length, width = math.prod(outs), channels * math.prod(kernel)
    cols = np.empty(batch * length * width, x.dtype)
    geometry = _geometry(x.shape, kernel, outs, stride, padding, dilation)
    _loops().im2col_last(_moved(x, 1, -1).reshape(-1), cols, geometry)
    return cols.reshape(batch * length, width)


def _rows_last(a: np.ndarray) -> np.ndarray:
    """(N, O, *outs) -> (N L, O), a copy: a row per output position."""
    batch, out_c = a.shape[0], a.shape[1]
    flat = a.reshape(batch, out_c, -1)
    return np.ascontiguousarray(flat.transpose(0, 2, 1)).reshape(-1, out_c)


def _weight_last(w: np.ndarray) -> np.ndarray:
    """(O, C, *kernel) -> (O, taps C): the weight in the channels-last columns' order."""
    return _moved(w, 1, -1).reshape(w.shape[0], -1)


def _padded(x: np.ndarray, padding: tuple) -> np.ndarray:
    """``x`` (N, C, *spatial) with ``padding[i]`` zeros on both sides of spatial dim i."""
    if not any(padding):
        return x
    # (zeros and one slice assignment: ``np.pad`` took ~10 us a call in its argument handling)
    sizes = tuple(x.shape[2 + i] + 2 * p for i, p in enumerate(padding))
    out = np.zeros(x.shape[:2] + sizes, x.dtype)
    out[
        (slice(None), slice(None))
        + tuple(slice(p, p + x.shape[2 + i]) for i, p in enumerate(padding))
    ] = x
    return out


def _window_view(
    x: np.ndarray, kernel: tuple, stride: tuple, dilation: tuple, outs: tuple
) -> np.ndarray:
    """Every kernel window of ``x`` (N, C, *spatial) as a strided view (N, C, *kernel, *outs)."""
    n = len(kernel)
    spatial = x.strides[2:]
    shape = x.shape[:2] + tuple(kernel) + tuple(outs)
    strides = (
        x.strides[:2]
        + tuple(spatial[i] * dilation[i] for i in range(n))
        + tuple(spatial[i] * stride[i] for i in range(n))
    )
    return as_strided(x, shape, strides, writeable=False)


def _geometry(
    shape: tuple, kernel: tuple, outs: tuple, stride: tuple, padding: tuple, dilation: tuple
) -> np.ndarray:
    """The (4, 6) table the column kernels read (``pool_kernels.im2col``): per canonical
    spatial dim (unit dims first) ``(size, kernel, out, stride, padding, dilation)``, then
    ``(N, C)`` of the input ``shape``.  Read-only, and kept per geometry (``_geometry_table``):
    a training step asks for the same few tables every time, and making one took as long as
    a small layer's im2col."""
    return _geometry_table(
        tuple(shape), tuple(kernel), tuple(outs), tuple(stride), tuple(padding), tuple(dilation)
    )


@functools.lru_cache(maxsize=512)
def _geometry_table(
    shape: tuple, kernel: tuple, outs: tuple, stride: tuple, padding: tuple, dilation: tuple
) -> np.ndarray:
    table = np.zeros((4, 6), np.int64)
    lead = 3 - len(kernel)
    table[:lead] = (1, 1, 1, 1, 0, 1)
    for d in range(len(kernel)):
        table[lead + d] = (shape[2 + d], kernel[d], outs[d], stride[d], padding[d], dilation[d])
    table[3, :2] = shape[:2]
    table.flags.writeable = False
    return table


def _moved(a: np.ndarray, source: int, destination: int) -> np.ndarray:
    """``np.moveaxis(a, source, destination)`` as a C-contiguous array (a copy unless it
    already is one): the permutation built directly, as ``np.moveaxis``'s argument checks
    cost a few microseconds a call (several per small layer)."""
    ndim = a.ndim
    order = [d for d in range(ndim) if d != source % ndim]
    order.insert(destination % ndim, source % ndim)
    return np.ascontiguousarray(a.transpose(order))


def _by_sample(outs: tuple) -> bool:
    """The columns' layout: (N, C taps, L), one product per sample, where a sample has at
    least ``_FEW_OUTPUTS`` outputs; (C taps, N L), one product over the whole batch, where it
    has fewer (DCGAN's 4x4 and 8x8 layers: the per-sample products are too thin for BLAS,
    and the copies of ``g`` and the output to and from channel-major are small)."""
    return math.prod(outs) >= _FEW_OUTPUTS


def _columns(
    x: np.ndarray,
    kernel: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    outs: tuple,
    by_sample: bool,
) -> np.ndarray:
    """im2col of ``x`` (N, C, *spatial): (N, C taps, L) if ``by_sample``, else (C taps, N L);
    the input itself where a 1x1 kernel with unit stride and no padding needs no copy."""
    batch, channels = x.shape[0], x.shape[1]
    length, rows = math.prod(outs), channels * math.prod(kernel)
    unit = all(k == 1 for k in kernel) and all(s == 1 for s in stride) and not any(padding)
    if by_sample and unit and tuple(x.shape[2:]) == tuple(outs):
        return np.ascontiguousarray(x).reshape(batch, rows, length)
    if outs[-1] < _SHORT_ROWS:
        # a strided view of the padded input, copied by numpy in the columns' order
        n = len(kernel)
        view = _window_view(_padded(x, padding), kernel, stride, dilation, outs)
        if not by_sample:  # (N, C, *kernel, *outs) -> (C, *kernel, N, *outs)
            view = view.transpose(1, *range(2, 2 + n), 0, *range(2 + n, 2 + 2 * n))
        cols = np.ascontiguousarray(view)
    else:
        cols = np.empty(batch * rows * length, x.dtype)
        geometry = _geometry(x.shape, kernel, outs, stride, padding, dilation)
        _loops().im2col(np.ascontiguousarray(x).reshape(-1), cols, geometry, by_sample)
    return cols.reshape((batch, rows, length) if by_sample else (rows, batch * length))


def _col2im(
    cols: np.ndarray,
    shape: tuple,
    kernel: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    outs: tuple,
    by_sample: bool,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The transpose of ``_columns``: the columns (either layout) summed into an input of
    ``shape`` (N, C, *sizes), each element added where im2col read it; the elements that read
    padding are dropped.  One loop kernel (``pool_kernels.col2im``): a slice-add per kernel
    offset in numpy took as long as the matrix product before it.  ``out``: a contiguous
    array of ``shape`` holding zeros, written and returned (else a new one)."""
    if outs[-1] >= _SHORT_ROWS_ADD:
        if out is None:
            out = np.zeros(shape, cols.dtype)
        geometry = _geometry(shape, kernel, outs, stride, padding, dilation)
        flat = np.ascontiguousarray(cols).reshape(-1)
        _loops().col2im(flat, out.reshape(-1), geometry, by_sample)
        return out
    # short rows: one strided slice-add per kernel tap into the padded input, then the crop
    n, batch, channels = len(kernel), shape[0], shape[1]
    if by_sample:
        cols = cols.reshape(batch, channels, *kernel, *outs)
    else:  # (C, *kernel, N, *outs) -> (N, C, *kernel, *outs)
        cols = cols.reshape(channels, *kernel, batch, *outs)
        cols = cols.transpose(1 + n, 0, *range(1, 1 + n), *range(2 + n, 2 + 2 * n))
    full = [
        max(
            shape[2 + i] + 2 * padding[i],
            (outs[i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1,
        )
        for i in range(n)
    ]
    dest, full_out = out, np.zeros((batch, channels, *full), cols.dtype)
    for tap in np.ndindex(*kernel):
        window = tuple(
            slice(
                tap[i] * dilation[i],
                tap[i] * dilation[i] + (outs[i] - 1) * stride[i] + 1,
                stride[i],
            )
            for i in range(n)
        )
        full_out[(slice(None), slice(None)) + window] += cols[(slice(None), slice(None)) + tap]
    crop = tuple(slice(padding[i], padding[i] + shape[2 + i]) for i in range(n))
    if dest is None:
        return np.ascontiguousarray(full_out[(slice(None), slice(None)) + crop])
    dest[...] = full_out[(slice(None), slice(None)) + crop]
    return dest


def _channels_first(a: np.ndarray, groups: int) -> np.ndarray:
    """(N, O, *outs) -> (groups, O / groups, N L), a copy."""
    return _moved(a, 1, 0).reshape(groups, a.shape[1] // groups, -1)


def _lift3(values: tuple, fill: int) -> np.ndarray:
    """Per-dim values for the canonical three spatial dims (unit dims first)."""
    return np.array((fill,) * (3 - len(values)) + tuple(values), np.int64)


def _depthwise(w: np.ndarray, groups: int) -> bool:
    """Whether a convolution by ``w`` (O, C / groups, *kernel) has one input channel in each
    of several groups: the direct loops' shape class (see ``pool_kernels``).  One group of
    one channel (a first layer on grey images) is a (O, taps) by (taps, L) product per
    sample, which BLAS does better."""
    return w.shape[1] == 1 and groups > 1


def _as3(a: np.ndarray) -> np.ndarray:
    """(N, C, *spatial) -> (N, C, S0, S1, S2) with unit leading spatial dims."""
    return np.ascontiguousarray(a).reshape(a.shape[:2] + (1,) * (5 - a.ndim) + a.shape[2:])


def _depthwise_forward(
    x: np.ndarray, w: np.ndarray, stride: tuple, padding: tuple, dilation: tuple, outs: tuple
) -> np.ndarray:
    pool_kernels = _loops()
    batch, out_c = x.shape[0], w.shape[0]
    out = np.zeros((batch, out_c) + (1,) * (3 - len(outs)) + tuple(outs), x.dtype)
    pool_kernels.depthwise_forward(
        _as3(_padded(x, padding)),
        _as3(w.reshape(out_c, 1, *w.shape[2:]))[:, 0],
        out,
        _lift3(stride, 1),
        _lift3(dilation, 1),
    )
    return out.reshape((batch, out_c) + tuple(outs))


def conv_forward(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    groups: int,
    outs: tuple,
) -> np.ndarray:
    """Cross-correlation of ``x`` (N, C, *spatial) by ``w`` (O, C / groups, *kernel): (N, O,
    *outs), plus ``bias`` (O,)."""
    batch, out_c = x.shape[0], w.shape[0]
    kernel = tuple(w.shape[2:])
    if _depthwise(w, groups):
        out = _depthwise_forward(x, w, stride, padding, dilation, outs)
        if bias is not None:
            out += bias.reshape((1, out_c) + (1,) * len(outs))
        return out
    if _winograd_fits(x.shape[1], out_c, batch, kernel, stride, dilation, groups, outs, x.dtype):
        out = _winograd().correlate(x, _winograd().filters(w), padding, _CHUNK_BYTES)
        if bias is not None:
            out += bias.reshape((1, out_c) + (1,) * len(outs))
        return out
    by_sample = _by_sample(outs)
    if _channels_last(by_sample, x.shape[1], groups):
        cols = _kept_columns(x, "last", kernel, stride, padding, dilation, outs, True)
        rows = cols @ _weight_last(w).T
        out = np.ascontiguousarray(rows.reshape(batch, -1, out_c).transpose(0, 2, 1))
        out = out.reshape(batch, out_c, *outs)
        if bias is not None:
            out += bias.reshape((1, out_c) + (1,) * len(outs))
        return out
    wmat = w.reshape(groups, out_c // groups, -1)
    if by_sample:  # a few samples at a time (``_CHUNK_BYTES``)
        length = math.prod(outs)
        out = np.empty((batch, groups, out_c // groups, length), np.result_type(x, w))
        chunks = _sample_chunks(batch, wmat.shape[-1] * groups * length * x.itemsize)
        for lo, hi in chunks:
            if len(chunks) == 1:  # (the whole batch: kept for the weight's gradient)
                cols = _kept_columns(x, "sample", kernel, stride, padding, dilation, outs, True)
            else:
                cols = _columns(x[lo:hi], kernel, stride, padding, dilation, outs, True)
            np.matmul(wmat, cols.reshape(hi - lo, groups, -1, length), out=out[lo:hi])
        out = out.reshape(batch, out_c, *outs)
    else:  # (groups, O / groups, N L) -> (N, O, *outs)
        cols = _kept_columns(x, "batch", kernel, stride, padding, dilation, outs, True)
        out = np.matmul(wmat, cols.reshape(groups, -1, cols.shape[-1]))
        out = _moved(out.reshape(out_c, batch, -1), 0, 1)
        out = out.reshape(batch, out_c, *outs)
    if bias is not None:
        out += bias.reshape((1, out_c) + (1,) * len(outs))
    return out


def conv_backward_input(
    g: np.ndarray,
    w: np.ndarray,
    sizes: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    groups: int,
) -> np.ndarray:
    """The input's gradient of ``conv_forward`` for the gradient ``g`` (N, O, *outs) of its
    output: (N, C, *sizes)."""
    batch, out_c = g.shape[0], w.shape[0]
    kernel, outs = tuple(w.shape[2:]), tuple(g.shape[2:])
    channels = w.shape[1] * groups
    if _depthwise(w, groups):
        pool_kernels = _loops()
        n = len(kernel)
        full = [
            max(
                sizes[i] + 2 * padding[i],
                (outs[i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1,
            )
            for i in range(n)
        ]
        gxp = np.zeros((batch, channels) + (1,) * (3 - n) + tuple(full), g.dtype)
        pool_kernels.depthwise_backward_input(
            _as3(g), _as3(w)[:, 0], gxp, _lift3(stride, 1), _lift3(dilation, 1)
        )
        gxp = gxp.reshape((batch, channels) + tuple(full))
        lead = (slice(None), slice(None))
        crop = lead + tuple(slice(padding[i], padding[i] + sizes[i]) for i in range(n))
        return np.ascontiguousarray(gxp[crop])
    by_sample = _by_sample(outs)
    if _channels_last(by_sample, channels, groups):
        cols = _rows_last(g) @ _weight_last(w)  # (N L, taps C)
        last = np.zeros((batch, *sizes, channels), g.dtype)
        geometry = _geometry((batch, channels, *sizes), kernel, outs, stride, padding, dilation)
        _loops().col2im_last(cols.reshape(-1), last.reshape(-1), geometry)
        return _moved(last, -1, 1)
    wmat = w.reshape(groups, out_c // groups, -1).transpose(0, 2, 1)
    shape = (batch, channels, *sizes)
    if by_sample:  # a few samples at a time (``_CHUNK_BYTES``)
        gmat = np.ascontiguousarray(g).reshape(batch, groups, out_c // groups, math.prod(outs))
        out = np.zeros(shape, np.result_type(g, w))
        per_sample = wmat.shape[1] * groups * gmat.shape[-1] * out.itemsize
        for lo, hi in _sample_chunks(batch, per_sample):
            cols = np.matmul(wmat, gmat[lo:hi])  # (n, groups, C / groups * taps, L)
            part = (hi - lo, *shape[1:])
            _col2im(cols, part, kernel, stride, padding, dilation, outs, True, out[lo:hi])
        return out
    else:
        cols = np.matmul(wmat, _channels_first(g, groups))  # (groups, C / groups * taps, N L)
    return _col2im(cols, shape, kernel, stride, padding, dilation, outs, by_sample)


def conv_backward_weight(
    g: np.ndarray,
    x: np.ndarray,
    kernel: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    groups: int,
) -> np.ndarray:
    """The weight's gradient of ``conv_forward`` for the gradient ``g`` (N, O, *outs) of its
    output and its input ``x`` (N, C, *spatial): (O, C / groups, *kernel).  One product per
    sample and group, summed over the samples, where a sample has at least as many outputs as
    columns (as fast as one product over the batch at 64 channels, 4x faster with one input
    channel: 9 columns); one product per group over the batch otherwise."""
    batch, out_c, channels = g.shape[0], g.shape[1], x.shape[1]
    outs = tuple(g.shape[2:])
    n = len(kernel)
    if channels == groups > 1:  # one input channel in each of several groups: direct loops
        pool_kernels = _loops()
        gw = np.empty((out_c, *((1,) * (3 - n)), *kernel), g.dtype)
        pool_kernels.depthwise_backward_weight(
            _as3(g), _as3(_padded(x, padding)), gw, _lift3(stride, 1), _lift3(dilation, 1)
        )
        return gw.reshape(out_c, 1, *kernel)
    by_sample = _by_sample(outs)
    if _channels_last(by_sample, channels, groups):
        cols = _kept_columns(x, "last", kernel, stride, padding, dilation, outs, False)
        total = _rows_last(g).T @ cols  # (O, taps C)
        return _moved(total.reshape(out_c, *kernel, channels), -1, 1)
    if by_sample:  # a few samples at a time (``_CHUNK_BYTES``), summed
        gmat = np.ascontiguousarray(g).reshape(batch, groups, out_c // groups, math.prod(outs))
        length, width = gmat.shape[-1], channels // groups * math.prod(kernel)
        total = np.zeros((groups, out_c // groups, width), np.result_type(g, x))
        chunks = _sample_chunks(batch, groups * width * length * x.itemsize)
        for lo, hi in chunks:
            if len(chunks) == 1:  # (the forward's, where it kept them)
                cols = _kept_columns(x, "sample", kernel, stride, padding, dilation, outs, False)
            else:
                cols = _columns(x[lo:hi], kernel, stride, padding, dilation, outs, True)
            cols = cols.reshape(hi - lo, groups, width, length)
            total += np.matmul(gmat[lo:hi], cols.transpose(0, 1, 3, 2)).sum(0)
    else:
        cols = _kept_columns(x, "batch", kernel, stride, padding, dilation, outs, False)
        cols = cols.reshape(groups, -1, cols.shape[-1])
        total = np.matmul(_channels_first(g, groups), cols.transpose(0, 2, 1))
    return total.reshape(out_c, channels // groups, *kernel)


def out_sizes(sizes: tuple, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple) -> tuple:
    """A convolution's output sizes."""
    return tuple(
        (sizes[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
        for i in range(len(kernel))
    )


def transpose_sizes(
    sizes: tuple,
    kernel: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    output_padding: tuple,
) -> tuple:
    """A transposed convolution's output sizes."""
    return tuple(
        (sizes[i] - 1) * stride[i]
        - 2 * padding[i]
        + dilation[i] * (kernel[i] - 1)
        + output_padding[i]
        + 1
        for i in range(len(kernel))
    )


# ---- the primitives' kernels: one convolution primitive, transposed or not ------------------


def convolution(
    x: np.ndarray,
    w: np.ndarray,
    *bias: np.ndarray,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    groups: int,
    transposed: bool,
    output_padding: tuple,
) -> np.ndarray:
    """The ``convolution`` primitive: (N, C, *spatial) by ``w``, (O, C / groups, *kernel) or,
    ``transposed``, (C, O / groups, *kernel)."""
    kernel = tuple(w.shape[2:])
    sizes = tuple(x.shape[2:])
    b = bias[0] if bias else None
    if not transposed:
        outs = out_sizes(sizes, kernel, stride, padding, dilation)
        if x.shape[0] == 0:  # an empty batch (the kernels' reshapes need a sample)
            return np.zeros((0, w.shape[0], *outs), np.result_type(x, w))
        return conv_forward(x, w, b, stride, padding, dilation, groups, outs)
    outs = transpose_sizes(sizes, kernel, stride, padding, dilation, output_padding)
    if x.shape[0] == 0:
        return np.zeros((0, w.shape[1] * groups, *outs), np.result_type(x, w))
    out = conv_backward_input(x, w, outs, stride, padding, dilation, groups)
    if b is not None:
        out += b.reshape((1, -1) + (1,) * len(kernel))
    return out


def convolution_backward_input(
    g: np.ndarray,
    w: np.ndarray,
    *,
    sizes: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    groups: int,
    transposed: bool,
) -> np.ndarray:
    """The input's gradient of ``convolution`` (input spatial sizes ``sizes``)."""
    if g.shape[0] == 0:
        channels = w.shape[0] if transposed else w.shape[1] * groups
        return np.zeros((0, channels, *sizes), np.result_type(g, w))
    if not transposed:
        return conv_backward_input(g, w, sizes, stride, padding, dilation, groups)
    return conv_forward(g, w, None, stride, padding, dilation, groups, sizes)


def convolution_backward_weight(
    g: np.ndarray,
    x: np.ndarray,
    *,
    kernel: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    groups: int,
    transposed: bool,
) -> np.ndarray:
    """The weight's gradient of ``convolution`` (its kernel's sizes ``kernel``)."""
    if g.shape[0] == 0:  # a sum over no samples
        first, second = (
            (x.shape[1], g.shape[1] // groups) if transposed else (g.shape[1], x.shape[1] // groups)
        )
        return np.zeros((first, second, *kernel), np.result_type(g, x))
    if not transposed:
        return conv_backward_weight(g, x, kernel, stride, padding, dilation, groups)
    # the transposed convolution y = conv^T(x): its weight meets x as a convolution's output
    # gradient meets the convolution's input, here g
    return conv_backward_weight(x, g, kernel, stride, padding, dilation, groups)


# ---- pooling: the primitives' kernels over the window tables of ``_pool_windows`` ----------


def _lift(tables: list, fill: int) -> list:
    """Per-dim tables for the canonical three spatial dims (a unit dim reads position 0)."""
    missing = 3 - len(tables)
    if fill < 0:  # (the hi table of a unit dim)
        return [np.ones(1, np.int64)] * missing + list(tables)
    return [np.zeros(1, np.int64)] * missing + list(tables)


def _planes(x: np.ndarray, n: int) -> np.ndarray:
    """(N, C, *spatial) -> the canonical (N C, S0, S1, S2), contiguous."""
    return np.ascontiguousarray(x).reshape(-1, *((1,) * (3 - n)), *x.shape[2:])


def avg_pool(x: np.ndarray, *, window: tuple) -> np.ndarray:
    """The ``avg_pool`` primitive: the average of each window of (N, C, *spatial) ``x``."""
    pool_kernels = _loops()
    n = x.ndim - 2
    sizes = tuple(x.shape[2:])
    los, his, _ = window_tables(window, sizes)
    outs = tuple(len(lo) for lo in los)
    planes = _planes(x, n)
    lift = (1,) * (3 - n)
    out = np.empty((planes.shape[0], *lift, *outs), x.dtype)
    lo, hi = _lift(los, 0), _lift(his, -1)
    divisor = window_divisor(window, sizes, los, his)
    pool_kernels.avg_pool(planes, lo[0], hi[0], lo[1], hi[1], lo[2], hi[2], divisor, out)
    return out.reshape(x.shape[:2] + outs)


def pool_index(x: np.ndarray, *, window: tuple) -> np.ndarray:
    """The ``pool_index`` primitive: the flat position of each window's maximum in its input
    plane (PyTorch's pooling indices)."""
    pool_kernels = _loops()
    n = x.ndim - 2
    los, his, steps = window_tables(window, tuple(x.shape[2:]))
    outs = tuple(len(lo) for lo in los)
    planes = _planes(x, n)
    where = np.empty((planes.shape[0], *((1,) * (3 - n)), *outs), np.int64)
    lo, hi = _lift(los, 0), _lift(his, -1)
    step = np.array([1] * (3 - n) + steps, np.int64)
    pool_kernels.max_pool_index(planes, lo[0], hi[0], lo[1], hi[1], lo[2], hi[2], step, where)
    return where.reshape(x.shape[:2] + outs)


def pool_take(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The ``pool_take`` primitive: each plane of ``x`` at the flat positions ``index``."""
    pool_kernels = _loops()
    planes = x.shape[0] * x.shape[1]
    out = np.empty(index.shape, x.dtype)
    pool_kernels.take(
        np.ascontiguousarray(x).reshape(planes, -1),
        np.ascontiguousarray(index).reshape(planes, -1),
        out.reshape(planes, -1),
    )
    return out


def pool_scatter(g: np.ndarray, index: np.ndarray, *, sizes: tuple) -> np.ndarray:
    """The ``pool_scatter`` primitive: zeros (N, C, *sizes) with ``g`` added at the flat
    positions ``index`` of each plane."""
    pool_kernels = _loops()
    planes = g.shape[0] * g.shape[1]
    out = np.zeros(g.shape[:2] + tuple(sizes), g.dtype)
    pool_kernels.scatter_add(
        np.ascontiguousarray(g).reshape(planes, -1),
        np.ascontiguousarray(index).reshape(planes, -1),
        out.reshape(planes, -1),
    )
    return out


def avg_pool_backward(g: np.ndarray, *, window: tuple, sizes: tuple) -> np.ndarray:
    """The ``avg_pool_backward`` primitive: average pooling's input gradient (input spatial
    sizes ``sizes``): each output's gradient over its divisor, added to its window."""
    pool_kernels = _loops()
    n = len(sizes)
    los, his, _ = window_tables(window, sizes)
    planes = g.shape[0] * g.shape[1]
    lift = (1,) * (3 - n)
    gx = np.zeros((planes, *lift, *sizes), g.dtype)
    lo, hi = _lift(los, 0), _lift(his, -1)
    divisor = window_divisor(window, sizes, los, his)
    pool_kernels.avg_pool_backward(
        np.ascontiguousarray(g).reshape(planes, *lift, *g.shape[2:]),
        lo[0], hi[0], lo[1], hi[1], lo[2], hi[2], divisor, gx,
    )  # fmt: skip
    return gx.reshape(g.shape[:2] + tuple(sizes))
