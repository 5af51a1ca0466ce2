"""nn.Hardtanh, nn.LogSigmoid and nn.Softmin: modules over F.hardtanh, F.logsigmoid and
F.softmin with PyTorch's options, reprs, outputs and gradients (against torch in float64)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad
from fusegrad import nn

X = np.random.default_rng(0).standard_normal((4, 5)) * 2

CASES = [
    ("Hardtanh", (), "Hardtanh(min_val=-1.0, max_val=1.0)"),
    ("Hardtanh", (-0.5, 2.0), "Hardtanh(min_val=-0.5, max_val=2.0)"),
    ("LogSigmoid", (), "LogSigmoid()"),
    ("Softmin", (1,), "Softmin(dim=1)"),
    ("Softmin", (0,), "Softmin(dim=0)"),
]


@pytest.mark.parametrize("name,args,text", CASES)
def test_outputs_gradients_and_repr_match_torch(name: str, args: tuple, text: str) -> None:
    torch = pytest.importorskip("torch")
    ours = getattr(nn, name)(*args)
    theirs = getattr(torch.nn, name)(*args)
    assert repr(ours) == repr(theirs) == text
    x = fusegrad.tensor(X, requires_grad=True)
    t = torch.tensor(X, requires_grad=True)
    y, z = ours(x), theirs(t)
    np.testing.assert_allclose(y.detach().numpy(), z.detach().numpy(), rtol=1e-12, atol=1e-14)
    weights = np.arange(X.size, dtype=np.float64).reshape(X.shape) / 7
    (y * fusegrad.tensor(weights)).sum().backward()
    (z * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-14)
    assert y.grad_fn.name() == z.grad_fn.name()


def test_hardtanh_inplace_and_errors() -> None:
    m = nn.Hardtanh(-1.0, 1.0, inplace=True)
    assert repr(m) == "Hardtanh(min_val=-1.0, max_val=1.0, inplace=True)"
    x = fusegrad.tensor([-3.0, 0.5, 2.0])
    out = m(x)
    assert out is x and x.tolist() == [-1.0, 0.5, 1.0]
    with pytest.raises(ValueError, match=r"max_val \(0\) must be greater than min_val \(1\)"):
        nn.Hardtanh(1, 0)


def test_softmin_without_dim_warns_like_torch() -> None:
    x = fusegrad.tensor(X)
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmin"):
        out: Any = nn.Softmin()(x)
    np.testing.assert_allclose(out.numpy().sum(1), np.ones(4), rtol=1e-12)
