"""nn.Conv1d and F.conv1d against torch (outputs, gradients, reprs, padding modes, groups,
dilation, 'same'), their errors, and the im2col backward of convolution and pooling: slice-adds,
never a scatter with index operands (the ``np.add.at`` path)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import nn
from fusegrad.autograd import tracer

CONV1D_CASES = [
    {},
    {"stride": 2, "padding": 1, "groups": 2},
    {"padding": 2, "dilation": 2, "bias": False, "padding_mode": "reflect"},
    {"padding": "same", "dilation": 3},
    {"padding": "same", "padding_mode": "replicate"},
    {"padding": 1, "padding_mode": "circular"},
    {"padding": "valid", "groups": 2, "dilation": 2},
]


def _copy_from_torch(module: Any, torch_module: Any) -> None:
    module.load_state_dict(
        {k: fg.tensor(v.detach().numpy()) for k, v in torch_module.state_dict().items()}
    )


@pytest.mark.parametrize("case", CONV1D_CASES)
@pytest.mark.parametrize("batched", [True, False])
def test_conv1d_module_matches_torch(case: dict, batched: bool) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    want_module = torch.nn.Conv1d(4, 6, 3, **case).double()
    module = nn.Conv1d(4, 6, 3, **case).double()
    _copy_from_torch(module, want_module)
    assert repr(module) == repr(want_module)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 9) if batched else (4, 9))
    xt, xf = torch.tensor(x, requires_grad=True), fg.tensor(x, requires_grad=True)
    yt, yf = want_module(xt), module(xf)
    assert tuple(yf.shape) == tuple(yt.shape)
    g = rng.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(g))
    yf.backward(fg.tensor(g))
    np.testing.assert_allclose(yf.detach().numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    for (name, p), q in zip(module.named_parameters(), want_module.parameters()):
        np.testing.assert_allclose(
            p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name
        )


def test_conv1d_init_shapes() -> None:
    conv = nn.Conv1d(6, 4, 3, groups=2)
    assert conv.weight.shape == (4, 3, 3) and conv.bias.shape == (4,)
    bound = 1 / np.sqrt(3 * 3)
    assert np.abs(conv.weight.detach().numpy()).max() <= bound
    assert conv.kernel_size == (3,) and conv.stride == (1,) and conv.padding == (0,)


@pytest.mark.parametrize(
    "call,words",
    [
        (
            lambda: F.conv1d(fg.randn(2, 3, 5, 5), fg.randn(4, 3, 2)),
            "Expected 2D (unbatched) or 3D",
        ),
        (lambda: F.conv1d(fg.randn(2, 3, 5), fg.randn(4, 3, 2, 2)), "weight must be 3-D"),
        (lambda: F.conv1d(fg.randn(2, 3, 5), fg.randn(4, 2, 2)), "conv1d: input"),
        (lambda: F.conv1d(fg.randn(2, 3, 5), fg.randn(4, 3, 2), stride=(1, 1)), "stride"),
        (
            lambda: F.conv1d(fg.randn(2, 3, 5), fg.randn(4, 3, 2), padding="same", stride=2),
            "not supported for strided convolutions",
        ),
        (lambda: F.conv1d(fg.randn(2, 3, 2), fg.randn(4, 3, 3)), "too small"),
    ],
)
def test_conv1d_errors(call: Any, words: str) -> None:
    with pytest.raises(RuntimeError, match=re.escape(words)):
        call()
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.Conv1d(5, 4, 3, groups=2)


class _Recorder(tracer.Tracer):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def apply(self, prim: Any, inputs: Any, attrs: Any) -> Any:  # type: ignore[override]
        self.calls.append((prim.name, len(inputs)))
        return NotImplemented  # run as usual


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w: F.conv2d(x, w, padding=1, stride=2, dilation=(1, 2)),
        lambda x, w: F.conv1d(x[:, :, 0], w[:, :, 0], padding=1, groups=1),
        lambda x, w: F.max_pool2d(x, 3, 2, 1) * w.sum(),
        lambda x, w: F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False) * w.sum(),
        lambda x, w: F.unfold(x, 2, padding=1) * w.sum(),
    ],
)
def test_windows_gradients_are_slice_adds_not_scatters(fn: Any) -> None:
    """The windows of the composites of convolution and pooling (what float16, CUDA and
    forward AD run; float32 and float64 run the kernels) are strided basic slices; their
    gradient writes each slice into zeros (``index_add_at`` with no index operands): no
    scatter that numpy can only run with ``np.add.at`` (one element at a time), and no
    advanced-index gather."""
    rng = np.random.default_rng(1)
    x = fg.tensor(rng.standard_normal((2, 3, 6, 5)), dtype=fg.float16, requires_grad=True)
    w = fg.tensor(rng.standard_normal((4, 3, 3, 3)), dtype=fg.float16, requires_grad=True)
    rec = _Recorder()
    with tracer.tracing(rec):
        out = fn(x, w)
        out.backward(fg.ones_like(out))
    names = {name for name, _ in rec.calls}
    assert "index_add_at" in names  # the slices' backward ran
    indexed = [(n, k) for n, k in rec.calls if n in ("getitem", "index_add_at") and k > 1]
    assert not indexed, indexed
    assert x.grad is not None and np.isfinite(x.grad.numpy()).all()
