"""nn.ConvTranspose1d/2d and F.conv_transpose1d/2d against torch (outputs, gradients of input,
weight and bias in float64; reprs; ``output_size``), their errors, and a backward made of slice-adds
and a matmul, never a scatter (values and compiled runs are in the op table)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import nn
from fusegrad.autograd import tracer

CASES = [
    {},
    {"stride": 2, "padding": 1, "output_padding": 1},
    {"stride": (2, 3), "padding": (1, 0), "dilation": (2, 1), "groups": 2, "bias": False},
    {"stride": 3, "dilation": 2, "output_padding": 2, "groups": 2},
    {"padding": 2},
]


def _copy_from_torch(module: Any, torch_module: Any) -> None:
    module.load_state_dict(
        {k: fg.tensor(v.detach().numpy()) for k, v in torch_module.state_dict().items()}
    )


CASES_1D = [
    {},
    {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2},
    {"stride": 3, "dilation": 2, "output_padding": 1, "bias": False},
]


@pytest.mark.parametrize("dims,case", [(2, c) for c in CASES] + [(1, c) for c in CASES_1D])
@pytest.mark.parametrize("batched", [True, False])
def test_module_matches_torch(dims: int, case: dict, batched: bool) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    name = f"ConvTranspose{dims}d"
    want = getattr(torch.nn, name)(4, 6, 3, **case).double()
    module = getattr(nn, name)(4, 6, 3, **case).double()
    assert module.weight.shape == tuple(want.weight.shape)
    _copy_from_torch(module, want)
    assert repr(module) == repr(want)
    rng = np.random.default_rng(0)
    spatial = (5, 4)[:dims]
    x = rng.standard_normal((2, 4, *spatial) if batched else (4, *spatial))
    xt, xf = torch.tensor(x, requires_grad=True), fg.tensor(x, requires_grad=True)
    yt, yf = want(xt), module(xf)
    assert tuple(yf.shape) == tuple(yt.shape)
    g = rng.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(g))
    yf.backward(fg.tensor(g))
    np.testing.assert_allclose(yf.detach().numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    for (name, p), q in zip(module.named_parameters(), want.parameters()):
        np.testing.assert_allclose(
            p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name
        )


def test_output_size_picks_the_output_padding() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    want = torch.nn.ConvTranspose2d(2, 3, 3, stride=2).double()
    module = nn.ConvTranspose2d(2, 3, 3, stride=2).double()
    _copy_from_torch(module, want)
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 5))
    for size in ([11, 12], [1, 3, 12, 11]):
        got = module(fg.tensor(x), output_size=size)
        expected = want(torch.tensor(x), output_size=size)
        np.testing.assert_allclose(got.detach().numpy(), expected.detach().numpy(), atol=1e-12)
    with pytest.raises(ValueError, match="valid sizes range from"):
        module(fg.tensor(x), output_size=[14, 12])


def test_init_bounds() -> None:
    conv = nn.ConvTranspose2d(4, 6, 3, groups=2)
    assert conv.weight.shape == (4, 3, 3, 3) and conv.bias.shape == (6,)
    bound = 1 / np.sqrt(3 * 3 * 3)  # fan_in from dim 1 (out_channels / groups) * kernel
    assert np.abs(conv.weight.numpy(force=True)).max() <= bound
    assert np.abs(conv.bias.numpy(force=True)).max() <= bound


@pytest.mark.parametrize(
    "call,words",
    [
        (lambda m: m.F.conv_transpose2d(_t(m, 2, 4, 5, 5), _t(m, 3, 3, 3, 3)), "channels"),
        (
            lambda m: m.F.conv_transpose1d(_t(m, 2, 4, 5), _t(m, 4, 3, 3), stride=(1, 1)),
            "single integer value",
        ),
        (
            lambda m: m.F.conv_transpose1d(_t(m, 2, 4, 5, 5), _t(m, 4, 3, 3)),
            "Expected 2D (unbatched) or 3D (batched) input",
        ),
        (
            lambda m: m.F.conv_transpose2d(_t(m, 2, 4, 5, 5), _t(m, 4, 3, 3, 3), groups=3),
            "divisible",
        ),
        (
            lambda m: m.F.conv_transpose2d(_t(m, 2, 4, 5, 5), _t(m, 4, 3, 3, 3), output_padding=1),
            "output padding must be smaller than either stride or dilation",
        ),
        (
            lambda m: m.F.conv_transpose2d(_t(m, 2, 4, 5, 5), _t(m, 4, 3, 3, 3), _t(m, 4)),
            "expected bias to be 1-dimensional with 3 elements",
        ),
    ],
)
def test_errors_as_torch(call: Any, words: str) -> None:
    with pytest.raises(RuntimeError, match=re.escape(words)):
        call(_Lib(fg))
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match=re.escape(words)):
        call(_Lib(torch))


def test_conv_transpose1d_output_size() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    want = torch.nn.ConvTranspose1d(2, 3, 3, stride=3).double()
    module = nn.ConvTranspose1d(2, 3, 3, stride=3).double()
    _copy_from_torch(module, want)
    x = np.random.default_rng(2).standard_normal((1, 2, 4))
    got = module(fg.tensor(x), output_size=[14])
    expected = want(torch.tensor(x), output_size=[14])
    np.testing.assert_allclose(got.detach().numpy(), expected.detach().numpy(), atol=1e-12)


def test_module_errors_as_torch() -> None:
    with pytest.raises(ValueError, match='Only "zeros" padding mode'):
        nn.ConvTranspose2d(4, 3, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.ConvTranspose2d(5, 4, 3, groups=2)


class _Lib:
    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.F = lib.nn.functional

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lib, name)


def _t(m: Any, *shape: int) -> Any:
    return m.zeros(*shape, dtype=m.float64)


class _Recorder(tracer.Tracer):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def apply(self, prim: Any, inputs: Any, attrs: Any) -> Any:  # type: ignore[override]
        self.calls.append((prim.name, len(inputs)))
        return NotImplemented  # run as usual


def test_gradient_is_slice_adds_not_scatters() -> None:
    """The spread-out input is a pad and a reshape, the windows strided slices: the backward
    writes slices into zeros (``index_add_at`` with no index operands), never an indexed
    scatter (``np.add.at``) or an advanced-index gather.  (The composite: float16 runs it;
    float32 and float64 run the convolution kernels.)"""
    rng = np.random.default_rng(1)
    x = fg.tensor(rng.standard_normal((2, 4, 5, 4)), dtype=fg.float16, requires_grad=True)
    w = fg.tensor(rng.standard_normal((4, 3, 3, 3)), dtype=fg.float16, requires_grad=True)
    rec = _Recorder()
    with tracer.tracing(rec):
        out = F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1)
        out.backward(fg.ones_like(out))
    names = {name for name, _ in rec.calls}
    assert "index_add_at" in names
    indexed = [(n, k) for n, k in rec.calls if n in ("getitem", "index_add_at") and k > 1]
    assert not indexed, indexed
    assert np.isfinite(x.grad.numpy()).all() and np.isfinite(w.grad.numpy()).all()
