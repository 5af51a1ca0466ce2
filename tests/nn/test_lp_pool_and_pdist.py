"""F.lp_pool1d/lp_pool2d with nn.LPPool1d/LPPool2d and F.pdist against torch: outputs,
gradients (pdist: zero distances get a zero gradient), reprs, node names and errors."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
import fusegrad.nn.functional as F
from fusegrad import nn

RNG = np.random.default_rng(8)
X = np.abs(RNG.standard_normal((2, 3, 6, 7))) + 0.1


@pytest.mark.parametrize(
    "name,args,data",
    [
        ("LPPool2d", (2, 3), X),
        ("LPPool2d", (1.5, (2, 3), 2, True), X),
        ("LPPool1d", (3, 2), X[0, :, 0]),
        ("LPPool1d", (2, 3, 1), X[:, :, 0]),
    ],
)
def test_lp_pool_matches_torch(name: str, args: tuple, data: np.ndarray) -> None:
    torch = pytest.importorskip("torch")
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert repr(ours) == repr(theirs)
    x, t = fusegrad.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    y, z = ours(x), theirs(t)
    np.testing.assert_allclose(y.detach().numpy(), z.detach().numpy(), rtol=1e-12)
    y.sum().backward()
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0])
def test_pdist_matches_torch(p: float) -> None:
    torch = pytest.importorskip("torch")
    data = RNG.standard_normal((5, 3))
    data[3] = data[1]  # a zero distance
    x, t = fusegrad.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    y, z = F.pdist(x, p), torch.nn.functional.pdist(t, p)
    np.testing.assert_allclose(y.detach().numpy(), z.detach().numpy(), rtol=1e-12)
    y.sum().backward()
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-14)
    assert y.grad_fn.name() == z.grad_fn.name() == "PdistBackward0"
    with pytest.raises(RuntimeError, match="pdist only supports 2D tensors, got: 3D"):
        F.pdist(fusegrad.ones(2, 3, 4))
