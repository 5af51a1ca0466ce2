"""nn.Hardtanh, LogSigmoid, Softmin, Hardsigmoid, Softsign, Tanhshrink, Hardshrink, Softshrink
and Threshold: modules over their F functions with PyTorch's options, reprs, outputs, gradients
and node names (against torch in float64); F's in-place forms (relu_, threshold_, ...)."""

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
    ("Hardsigmoid", (), "Hardsigmoid()"),
    ("Softsign", (), "Softsign()"),
    ("Tanhshrink", (), "Tanhshrink()"),
    ("Hardshrink", (), "Hardshrink(0.5)"),
    ("Softshrink", (0.3,), "Softshrink(0.3)"),
    ("Threshold", (0.1, 20.0), "Threshold(threshold=0.1, value=20.0)"),
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
    # (torch's hardsigmoid backward rounds 1/6 to float32)
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-7, atol=1e-14)
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


@pytest.mark.parametrize(
    "name,args",
    [
        ("relu_", ()),
        ("elu_", (0.5,)),
        ("leaky_relu_", (0.2,)),
        ("hardtanh_", (-0.5, 0.5)),
        ("selu_", ()),
        ("celu_", (0.7,)),
        ("threshold_", (0.2, -3.0)),
    ],
)
def test_functional_inplace_forms_match_torch(name: str, args: tuple) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as TF

    import fusegrad.nn.functional as F

    x = fusegrad.tensor(X, requires_grad=True)
    t = torch.tensor(X, requires_grad=True)
    a, b = x * 1, t * 1
    out, tout = getattr(F, name)(a, *args), getattr(TF, name)(b, *args)
    assert out is a and tout is b
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-12, atol=1e-14)
    a.sum().backward()
    b.sum().backward()
    # (torch's in-place celu backward works from the result: 1e-8 apart from its celu's)
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-7, atol=1e-14)
    assert out.grad_fn.name() == tout.grad_fn.name()


def test_softshrink_refuses_a_negative_lambda_and_modules_accept_inplace() -> None:
    import fusegrad.nn.functional as F

    with pytest.raises(RuntimeError, match="lambda must be in range"):
        F.softshrink(fusegrad.tensor(X), -1.0)
    x = fusegrad.tensor([-5.0, 0.0, 5.0])
    assert nn.Hardsigmoid(inplace=True)(x) is x and x.tolist() == [0.0, 0.5, 1.0]
    y = fusegrad.tensor([0.0, 1.0])
    assert (
        repr(nn.Threshold(0.5, -1.0, True)) == "Threshold(threshold=0.5, value=-1.0, inplace=True)"
    )
    assert nn.Threshold(0.5, -1.0, True)(y) is y and y.tolist() == [-1.0, 1.0]
