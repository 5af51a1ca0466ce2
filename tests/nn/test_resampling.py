"""F.adaptive_avg_pool2d / nn.AdaptiveAvgPool2d and F.interpolate / nn.Upsample against torch
(outputs and input gradients, over sizes that do and do not divide the input, every mode and
align_corners), their errors, reprs, and which paths avoid an index gather."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import nn
from fusegrad.autograd import tracer
from fusegrad.ops.resample import fused_resample_kernels


def _compare(fn_name: str, shape: tuple, **kwargs: Any) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(len(shape) * 31 + len(str(kwargs)))
    x = rng.standard_normal(shape)
    xt, xf = torch.tensor(x, requires_grad=True), fg.tensor(x, requires_grad=True)
    yt = getattr(torch.nn.functional, fn_name)(xt, **kwargs)
    yf = getattr(F, fn_name)(xf, **kwargs)
    assert tuple(yf.shape) == tuple(yt.shape)
    g = rng.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(g))
    yf.backward(fg.tensor(g))
    np.testing.assert_allclose(yf.detach().numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("hw", [(5, 7), (6, 6), (7, 3)])
@pytest.mark.parametrize("size", [1, 2, 3, (3, None), (None, 4), (5, 2), (7, 9), (10, 14)])
def test_adaptive_avg_pool2d_matches_torch(hw: tuple, size: Any) -> None:
    _compare("adaptive_avg_pool2d", (2, 3) + hw, output_size=size)


@pytest.mark.parametrize("length", [5, 6, 7])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 8, (3,)])
def test_adaptive_avg_pool1d_matches_torch(length: int, size: Any) -> None:
    _compare("adaptive_avg_pool1d", (2, 3, length), output_size=size)
    _compare("adaptive_avg_pool1d", (3, length), output_size=size)


LINEAR = {3: "linear", 4: "bilinear", 5: "trilinear"}
SIZES = [
    {"size": 3},
    {"size": 8},
    {"scale_factor": 2},
    {"scale_factor": 3},
    {"scale_factor": 1.7},
    {"scale_factor": 0.5},
    {"scale_factor": 1.7, "recompute_scale_factor": True},
]


@pytest.mark.parametrize("shape", [(1, 2, 5), (1, 2, 5, 7), (1, 1, 3, 4, 5)])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "linear", "area"])
@pytest.mark.parametrize("kwargs", SIZES)
def test_interpolate_matches_torch(shape: tuple, mode: str, kwargs: dict) -> None:
    if mode == "linear":
        mode = LINEAR[len(shape)]
        for corners in (True, False):
            _compare("interpolate", shape, mode=mode, align_corners=corners, **kwargs)
    _compare("interpolate", shape, mode=mode, **kwargs)


def test_interpolate_per_dim_sizes_and_factors() -> None:
    _compare("interpolate", (1, 2, 3, 4), size=(5, 2), mode="bilinear")
    _compare("interpolate", (1, 2, 3, 4), scale_factor=(2.5, 0.6), mode="nearest")
    _compare("interpolate", (1, 1, 3, 4, 5), size=(2, 9, 4), mode="trilinear", align_corners=True)


def test_modules_and_reprs() -> None:
    torch = pytest.importorskip("torch")
    for args, kwargs in [((), {"scale_factor": 2, "mode": "bilinear"}), ((4,), {})]:
        assert repr(nn.Upsample(*args, **kwargs)) == repr(torch.nn.Upsample(*args, **kwargs))
    assert repr(nn.AdaptiveAvgPool2d((3, None))) == repr(torch.nn.AdaptiveAvgPool2d((3, None)))
    assert repr(nn.AdaptiveAvgPool1d(3)) == repr(torch.nn.AdaptiveAvgPool1d(3))
    assert nn.AdaptiveAvgPool1d(2)(fg.randn(2, 3, 5)).shape == (2, 3, 2)
    x = fg.randn(1, 2, 4, 6)
    assert nn.AdaptiveAvgPool2d((3, None))(x).shape == (1, 2, 3, 6)
    assert nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)(x).shape == (
        1,
        2,
        8,
        12,
    )


def _recorded(fn: Any) -> list[tuple[str, int]]:
    calls: list[tuple[str, int]] = []

    class Recorder(tracer.Tracer):
        def apply(self, prim: Any, inputs: Any, attrs: Any) -> Any:  # type: ignore[override]
            calls.append((prim.name, len(inputs)))
            return NotImplemented

    x = fg.randn(1, 2, 6, 4, requires_grad=True)
    # the composites (eager CPU calls run the fused ``resample`` kernel instead:
    # tests/ops/test_interpolate_kernels.py)
    with tracer.tracing(Recorder()), fused_resample_kernels(False):
        out = fn(x)
        out.backward(fg.ones_like(out))
    return calls


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.adaptive_avg_pool2d(x, (4, 3)),  # uneven rows: a matrix
        lambda x: F.adaptive_avg_pool2d(x, (3, 2)),  # even: reshape-means
        lambda x: F.interpolate(x, scale_factor=2),  # repeat
        lambda x: F.interpolate(x, scale_factor=0.5),  # strided slice
        lambda x: F.interpolate(x, size=(7, 5), mode="bilinear"),
    ],
)
def test_resampling_gradients_need_no_scatter(fn: Any) -> None:
    indexed = [(n, k) for n, k in _recorded(fn) if n in ("getitem", "index_add_at") and k > 1]
    assert not indexed, indexed


def test_nearest_by_an_uneven_factor_is_a_gather() -> None:
    calls = _recorded(lambda x: F.interpolate(x, size=(7, 5)))
    assert any(n == "getitem" and k > 1 for n, k in calls) or any(n == "gather" for n, _ in calls)


@pytest.mark.parametrize(
    "call,kind,words",
    [
        (lambda: F.adaptive_avg_pool2d(fg.randn(5, 7), 3), RuntimeError, "Expected 3D or 4D"),
        (lambda: F.adaptive_avg_pool2d(fg.randn(1, 2, 5, 7), (3,)), RuntimeError, "must be 2"),
        (lambda: F.adaptive_avg_pool2d(fg.randn(1, 2, 0, 7), 2), RuntimeError, "non-zero size"),
        (lambda: F.adaptive_avg_pool1d(fg.randn(5), 2), RuntimeError, "Expected 2 to 3 dimensions"),
        (lambda: F.adaptive_avg_pool1d(fg.randn(2, 5), (2, 3)), RuntimeError, "one int (got 2)"),
        (lambda: F.interpolate(fg.randn(1, 2, 5), size=3, scale_factor=2), ValueError, "only one"),
        (lambda: F.interpolate(fg.randn(1, 2, 5)), ValueError, "either size or scale_factor"),
        (
            lambda: F.interpolate(fg.randn(1, 2, 5), size=3, align_corners=True),
            ValueError,
            "align_corners option can only be set",
        ),
        (
            lambda: F.interpolate(fg.randn(1, 2, 5), size=3, mode="bilinear"),
            NotImplementedError,
            "Got 3D input, but bilinear mode needs 4D input",
        ),
        (
            lambda: F.interpolate(fg.randn(1, 2, 5), size=(3, 4)),
            ValueError,
            "same number of spatial dimensions",
        ),
        (lambda: F.interpolate(fg.randn(1, 2, 5), size=3, mode="foo"), NotImplementedError, "foo"),
        (
            lambda: F.interpolate(fg.randn(1, 2, 5), scale_factor=0.1),
            RuntimeError,
            "greater than 0",
        ),
    ],
)
def test_errors(call: Any, kind: type, words: str) -> None:
    with pytest.raises(kind, match=re.escape(words)):
        call()
