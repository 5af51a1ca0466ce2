"""The convolution primitive's CUDA kernels (``cuda/convolution.py``: im2col, col2im, batched
products) in numba's simulator: conv1d/2d/3d and conv_transpose1d/2d/3d with stride, padding,
dilation, groups and output_padding give the CPU kernels' values and gradients (input, weight,
bias); the kernels ran on the device, not the composites; double backward (the rule's composite)
on the device too."""

from __future__ import annotations

import modes
import numpy as np
import pytest
from primitive_names import PrimitiveNames as _Recorder

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.autograd import tracer

modes.require_device()

# (function, input shape, weight shape, keyword arguments)
_CASES = [
    (F.conv1d, (2, 4, 7), (6, 2, 3), {"stride": 2, "padding": 1, "groups": 2}),
    (F.conv2d, (1, 3, 5, 6), (4, 3, 3, 2), {"dilation": (2, 1), "padding": "same"}),
    (F.conv2d, (2, 4, 5, 5), (4, 1, 3, 3), {"groups": 4, "stride": 2}),  # depthwise
    (F.conv3d, (1, 2, 4, 3, 4), (2, 2, 2, 2, 2), {"padding": 1}),
    (F.conv_transpose1d, (2, 4, 5), (4, 3, 3), {"stride": 2, "output_padding": 1}),
    (F.conv_transpose2d, (1, 4, 3, 4), (4, 2, 2, 3), {"stride": 2, "padding": 1, "groups": 2}),
    (F.conv_transpose2d, (1, 2, 3, 3), (2, 3, 2, 2), {"dilation": 3, "output_padding": 2}),
    (F.conv_transpose3d, (1, 2, 2, 3, 2), (2, 2, 2, 2, 2), {"stride": 2}),
]


def _run(case: tuple, device: str) -> tuple:
    fn, xs, ws, kwargs = case
    rng = np.random.default_rng(len(xs))
    transposed = "transpose" in fn.__name__
    groups = kwargs.get("groups", 1)
    out_c = ws[1] * groups if transposed else ws[0]
    arrays = [rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(out_c)]
    leaves = [fg.tensor(a, device=device, requires_grad=True) for a in arrays]
    rec = _Recorder()
    with tracer.tracing(rec):
        out = fn(*leaves, **kwargs)
        weights = np.random.default_rng(1).standard_normal(out.shape)
        (out * fg.tensor(weights, device=device)).sum().backward()
    return [out.detach().cpu().numpy()] + [t.grad.cpu().numpy() for t in leaves], rec.names


@pytest.mark.parametrize("case", _CASES, ids=lambda c: f"{c[0].__name__}{c[1]}")
def test_matches_the_cpu_kernels(case: tuple) -> None:
    want, _ = _run(case, "cpu")
    got, names = _run(case, "cuda")
    assert {"convolution", "convolution_backward_input", "convolution_backward_weight"} <= names
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


def test_double_backward_on_the_device() -> None:
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((1, 2, 4, 4)), rng.standard_normal((3, 2, 2, 2))
    results = []
    for device in ("cpu", "cuda"):
        xt = fg.tensor(x, device=device, requires_grad=True)
        wt = fg.tensor(w, device=device, requires_grad=True)
        out = F.conv2d(xt, wt, padding=1)
        gx, gw = fg.autograd.grad((out * out).sum(), (xt, wt), create_graph=True)
        (gg,) = fg.autograd.grad((gx * gx).sum() + (gw * gw).sum(), xt)
        results.append(gg.cpu().numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-11, atol=1e-12)


def test_compiled_backward_on_the_device() -> None:
    """compiled_autograd() on CUDA: the convolution and pooling kernels as externs of the
    compiled backward give the eager CPU gradients, compiled once, without a fallback."""
    from fusegrad import compiler

    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 2, 6, 6)), rng.standard_normal((3, 2, 3, 3))
    results = []
    compiler.reset()
    for device, compiled in (("cpu", False), ("cuda", True)):
        xt = fg.tensor(x, device=device, requires_grad=True)
        wt = fg.tensor(w, device=device, requires_grad=True)
        out = F.avg_pool2d(F.max_pool2d(F.relu(F.conv2d(xt, wt, padding=1)), 2), 2, 1)
        loss = (out * out).sum()
        if compiled:
            with compiler.compiled_autograd():
                loss.backward()
        else:
            loss.backward()
        results.append((xt.grad.cpu().numpy(), wt.grad.cpu().numpy()))
    for a, b in zip(results[1], results[0]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert compiler.counters.compiled_runs == 1 and not compiler.counters.fallbacks
    compiler.reset()
