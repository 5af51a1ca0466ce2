"""The windows of the pooling primitives (``avg_pool``, ``pool_index`` in ``ops/primitives.py``):
output sizes, per-dim window tables and average pooling's divisors, numpy only.  Kept below both
devices: the CPU kernels (``ops/conv_kernels.py``) and the CUDA ones (``cuda/pooling.py``) read
the same tables.

A pooling primitive's ``window`` attribute says which windows it reads:

* ``("fixed", kernel, stride, padding, dilation, ceil_mode, count_include_pad,
  divisor_override)`` (the last two matter to average pooling only);
* ``("adaptive", output_size)``.
"""

from __future__ import annotations

import numpy as np


def pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """How many windows of kernel ``k``, stride ``s``, padding ``p`` and dilation ``d`` a dim
    of ``size`` holds (PyTorch's rule: with ``ceil_mode`` the last window must start inside the
    input or its left padding)."""
    span = size + 2 * p - d * (k - 1) - 1
    count = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (count - 1) * s >= size + p:
        count -= 1
    return count


def pool_out_sizes(window: tuple, sizes: tuple) -> tuple:
    """The output's spatial sizes of a pooling primitive over input sizes ``sizes``."""
    if window[0] == "adaptive":
        return tuple(window[1])
    _, kernel, stride, padding, dilation, ceil_mode = window[:6]
    return tuple(
        pool_out_size(sizes[i], kernel[i], stride[i], padding[i], dilation[i], ceil_mode)
        for i in range(len(kernel))
    )


def window_tables(window: tuple, sizes: tuple) -> tuple[list, list, list]:
    """Per spatial dim: the first and past-the-last input positions each output reads (int64
    arrays, clipped to the input) and the step between them."""
    los, his, steps = [], [], []
    outs = pool_out_sizes(window, sizes)
    for i, size in enumerate(sizes):
        o = np.arange(outs[i], dtype=np.int64)
        if window[0] == "adaptive":
            lo = (o * size) // outs[i]
            hi = -((-(o + 1) * size) // outs[i])
            step = 1
        else:
            k, s, p, d = window[1][i], window[2][i], window[3][i], window[4][i]
            start = o * s - p
            # the first offset a with start + a d >= 0
            lo = start + (-(np.minimum(start, 0)) + d - 1) // d * d
            hi = np.minimum(start + (k - 1) * d + 1, size)
            step = d
        los.append(lo)
        his.append(np.maximum(hi, lo))
        steps.append(step)
    return los, his, steps


def window_divisor(window: tuple, sizes: tuple, los: list, his: list) -> np.ndarray:
    """Average pooling's divisor per output (O0, O1, O2): PyTorch's rule (the window inside
    the padded input, or inside the input without ``count_include_pad``; a ``ceil_mode``
    window hanging over the end counts only what it covers)."""
    per_dim = []
    if window[0] == "adaptive":
        per_dim = [(his[i] - los[i]).astype(np.float64) for i in range(len(sizes))]
    else:
        _, kernel, stride, padding, _, _, include_pad, override = window
        if override:
            shape = tuple(len(lo) for lo in los)
            return np.full((1,) * (3 - len(shape)) + shape, float(override))
        for i, size in enumerate(sizes):
            start = np.arange(len(los[i]), dtype=np.int64) * stride[i] - padding[i]
            end = np.minimum(start + kernel[i], size + padding[i])
            if include_pad:
                per_dim.append((end - start).astype(np.float64))
            else:
                per_dim.append((np.minimum(end, size) - np.maximum(start, 0)).astype(np.float64))
    divisor = per_dim[0]
    for v in per_dim[1:]:
        divisor = np.multiply.outer(divisor, v)
    return divisor.reshape((1,) * (3 - len(sizes)) + divisor.shape)
