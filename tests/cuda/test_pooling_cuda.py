"""The pooling primitives' CUDA kernels (``cuda/pooling.py``) in numba's simulator: max pooling
(values, indices, gradient), average pooling (count_include_pad, divisor_override, ceil_mode)
and adaptive pooling over 1, 2 and 3 dims give the CPU kernels' values and gradients; a NaN
window and an all -inf window as on the CPU; the kernels ran, not the composites; double
backward through the transposes."""

from __future__ import annotations

from typing import Any

import modes
import numpy as np
import pytest
from primitive_names import PrimitiveNames as _Recorder

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.autograd import tracer

modes.require_device()

_CASES = [
    (lambda t: F.max_pool1d(t, 3, 2, 1, return_indices=True), (2, 2, 7)),
    (
        lambda t: F.max_pool2d(
            t, (2, 3), 2, 1, dilation=(2, 1), ceil_mode=True, return_indices=True
        ),
        (1, 2, 6, 7),
    ),
    (lambda t: F.max_pool3d(t, 2, return_indices=True), (1, 1, 4, 4, 5)),
    (lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False), (2, 1, 6, 5)),
    (lambda t: F.avg_pool2d(t, 2, divisor_override=3), (1, 2, 4, 4)),
    (lambda t: F.avg_pool3d(t, (1, 2, 2), padding=(0, 1, 1)), (1, 1, 2, 3, 4)),
    (lambda t: F.adaptive_max_pool2d(t, (3, 2), return_indices=True), (1, 2, 5, 7)),
    (lambda t: F.adaptive_avg_pool1d(t, 3), (2, 7)),
    (lambda t: F.adaptive_avg_pool3d(t, (2, 3, 2)), (1, 1, 3, 5, 4)),
]


def _run(fn: Any, x: np.ndarray, device: str) -> tuple:
    leaf = fg.tensor(x, device=device, requires_grad=True)
    rec = _Recorder()
    with tracer.tracing(rec):
        out = fn(leaf)
    values = out[0] if isinstance(out, tuple) else out
    weights = np.random.default_rng(1).standard_normal(values.shape)
    (values * fg.tensor(weights, device=device)).sum().backward()
    indices = out[1].cpu().numpy() if isinstance(out, tuple) else None
    return values.detach().cpu().numpy(), indices, leaf.grad.cpu().numpy(), rec.names


@pytest.mark.parametrize("case", range(len(_CASES)))
def test_matches_the_cpu_kernels(case: int) -> None:
    fn, shape = _CASES[case]
    x = np.random.default_rng(case).standard_normal(shape)
    x.flat[1] = np.nan if case == 1 else x.flat[1]
    want = _run(fn, x, "cpu")
    got = _run(fn, x, "cuda")
    assert got[3] & {"pool_index", "avg_pool"}, got[3]  # the kernels ran on the device
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-14, equal_nan=True)
    if want[1] is not None:
        np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[2], want[2], rtol=1e-12, atol=1e-14)


def test_double_backward_on_the_device() -> None:
    x = np.random.default_rng(9).standard_normal((1, 2, 5, 5))
    results = []
    for device in ("cpu", "cuda"):
        leaf = fg.tensor(x, device=device, requires_grad=True)
        top, mean = F.max_pool2d(leaf, 2), F.avg_pool2d(leaf, 3, 1, 1)
        loss = (top * top).sum() + (mean * mean).sum()
        (g,) = fg.autograd.grad(loss, leaf, create_graph=True)
        (gg,) = fg.autograd.grad((g * g).sum(), leaf)
        results.append(gg.cpu().numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-12, atol=1e-14)
