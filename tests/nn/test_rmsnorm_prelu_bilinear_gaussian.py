"""nn.RMSNorm/F.rms_norm, nn.PReLU/F.prelu, nn.Bilinear/F.bilinear and
nn.GaussianNLLLoss/F.gaussian_nll_loss against torch in float64: outputs, gradients of inputs
and parameters, torch's state_dicts loading, reprs, options and errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad
import fusegrad.nn.functional as F
from fusegrad import nn

RNG = np.random.default_rng(5)


def _copy_params(ours: Any, theirs: Any) -> None:
    ours.load_state_dict(
        {k: fusegrad.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()}
    )


def _check(torch: Any, ours: Any, theirs: Any, *inputs: np.ndarray) -> None:
    _copy_params(ours, theirs)
    xs = [fusegrad.tensor(a, requires_grad=True) for a in inputs]
    ts = [torch.tensor(a, requires_grad=True) for a in inputs]
    y, z = ours(*xs), theirs(*ts)
    np.testing.assert_allclose(y.detach().numpy(), z.detach().numpy(), rtol=1e-12, atol=1e-13)
    w = RNG.standard_normal(tuple(z.shape))
    (y * fusegrad.tensor(w)).sum().backward()
    (z * torch.tensor(w)).sum().backward()
    for x, t in zip(xs, ts):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-11, atol=1e-12)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        np.testing.assert_allclose(
            p.grad.numpy(), q.grad.numpy(), rtol=1e-11, atol=1e-12, err_msg=name
        )


@pytest.mark.parametrize(
    "args,kwargs,shape",
    [
        ((4,), {}, (2, 3, 4)),
        (((3, 4),), {"eps": 1e-5}, (2, 3, 4)),
        ((4,), {"elementwise_affine": False}, (5, 4)),
    ],
)
def test_rms_norm_matches_torch(args: tuple, kwargs: dict, shape: tuple) -> None:
    torch = pytest.importorskip("torch")
    ours, theirs = nn.RMSNorm(*args, **kwargs).double(), torch.nn.RMSNorm(*args, **kwargs).double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.tensor(RNG.uniform(0.5, 1.5, tuple(p.shape))))
    assert repr(ours) == repr(theirs)
    _check(torch, ours, theirs, RNG.standard_normal(shape))
    with pytest.raises(RuntimeError, match="expected input with shape"):
        F.rms_norm(fusegrad.ones(2, 5), (4,))


@pytest.mark.parametrize("num,shape", [(1, (3, 4)), (3, (2, 3, 5)), (3, (2, 3, 4, 4))])
def test_prelu_matches_torch(num: int, shape: tuple) -> None:
    torch = pytest.importorskip("torch")
    ours, theirs = nn.PReLU(num, init=0.1).double(), torch.nn.PReLU(num, init=0.1).double()
    assert repr(ours) == repr(theirs)
    np.testing.assert_allclose(ours.weight.tolist(), [0.1] * num, rtol=1e-7)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(RNG.uniform(0.05, 0.5, num)))
    data = RNG.standard_normal(shape)
    data[np.abs(data) < 0.05] = 0.3  # clear of the kink
    _check(torch, ours, theirs, data)
    y = nn.PReLU(num)(fusegrad.ones(*shape))
    assert y.grad_fn.name() == "PreluKernelBackward0"
    with pytest.raises(RuntimeError, match="Found parameter numbers = 3 and channel size = 4"):
        F.prelu(fusegrad.ones(2, 4), fusegrad.ones(3))


@pytest.mark.parametrize("bias", [True, False])
def test_bilinear_matches_torch(bias: bool) -> None:
    torch = pytest.importorskip("torch")
    ours, theirs = (
        nn.Bilinear(3, 4, 5, bias=bias).double(),
        torch.nn.Bilinear(3, 4, 5, bias=bias).double(),
    )
    assert repr(ours) == repr(theirs)
    bound = 1 / np.sqrt(3)
    assert np.all(np.abs(ours.weight.detach().numpy()) <= bound)
    _check(torch, ours, theirs, RNG.standard_normal((2, 6, 3)), RNG.standard_normal((2, 6, 4)))


@pytest.mark.parametrize(
    "var_shape,full,reduction",
    [((4, 5), False, "mean"), ((4,), True, "sum"), ((4, 1), False, "none"), (None, False, "mean")],
)
def test_gaussian_nll_loss_matches_torch(var_shape: Any, full: bool, reduction: str) -> None:
    torch = pytest.importorskip("torch")
    x, y = RNG.standard_normal((4, 5)), RNG.standard_normal((4, 5))
    var = 0.7 if var_shape is None else RNG.uniform(0.0, 2.0, var_shape)
    if var_shape is not None:
        var.flat[0] = 1e-9  # below eps: clamped for the value, the gradient passes
    xa, va = (
        fusegrad.tensor(x, requires_grad=True),
        (var if var_shape is None else fusegrad.tensor(var, requires_grad=True)),
    )
    xt, vt = (
        torch.tensor(x, requires_grad=True),
        (var if var_shape is None else torch.tensor(var, requires_grad=True)),
    )
    ours = nn.GaussianNLLLoss(full=full, reduction=reduction)
    theirs = torch.nn.GaussianNLLLoss(full=full, reduction=reduction)
    assert repr(ours) == repr(theirs)
    a, b = ours(xa, fusegrad.tensor(y), va), theirs(xt, torch.tensor(y), vt)
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-12)
    a.sum().backward()
    b.sum().backward()
    np.testing.assert_allclose(xa.grad.numpy(), xt.grad.numpy(), rtol=1e-12)
    if var_shape is not None:
        np.testing.assert_allclose(va.grad.numpy(), vt.grad.numpy(), rtol=1e-9)


def test_gaussian_nll_loss_errors() -> None:
    x = fusegrad.ones(2, 3)
    with pytest.raises(ValueError, match="var has negative entry/entries"):
        F.gaussian_nll_loss(x, x, -fusegrad.ones(2, 3))
    with pytest.raises(ValueError, match="var is of incorrect size"):
        F.gaussian_nll_loss(x, x, fusegrad.ones(2, 2))
