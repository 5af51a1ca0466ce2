"""nn.ZeroPad/ConstantPad/ReflectionPad/ReplicationPad/CircularPad 1d, 2d and 3d: modules over
F.pad with PyTorch's padding arguments (an int or a tuple), reprs, outputs and gradients,
against torch in float64."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
from fusegrad import nn

X = np.random.default_rng(0).standard_normal((2, 3, 4, 5, 6))

CASES = [
    ("ZeroPad1d", (2,)),
    ("ZeroPad2d", ((1, 1, 2, 0),)),
    ("ZeroPad3d", (1,)),
    ("ConstantPad1d", ((1, 3), 3.5)),
    ("ConstantPad2d", (1, -2.0)),
    ("ConstantPad3d", ((1, 0, 0, 1, 2, 0), 0.5)),
    ("ReflectionPad1d", (2,)),
    ("ReflectionPad2d", ((1, 1, 2, 0),)),
    ("ReflectionPad3d", (1,)),
    ("ReplicationPad1d", ((0, 3),)),
    ("ReplicationPad2d", (1,)),
    ("ReplicationPad3d", ((1, 0, 2, 1, 0, 1),)),
    ("CircularPad1d", (2,)),
    ("CircularPad2d", ((1, 0, 2, 1),)),
    ("CircularPad3d", (1,)),
]


@pytest.mark.parametrize("name,args", CASES, ids=[c[0] for c in CASES])
def test_padding_modules_match_torch(name: str, args: tuple) -> None:
    torch = pytest.importorskip("torch")
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert repr(ours) == repr(theirs) and ours.padding == theirs.padding
    dims = int(name[-2])
    data = X[(0,) * (3 - dims)]  # a batch of (C, d1, ..., dn) inputs
    x = fusegrad.tensor(data, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    y, z = ours(x), theirs(t)
    np.testing.assert_array_equal(y.detach().numpy(), z.detach().numpy())
    weights = np.random.default_rng(1).standard_normal(tuple(z.shape))
    (y * fusegrad.tensor(weights)).sum().backward()
    (z * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_padding_argument_errors() -> None:
    with pytest.raises(ValueError, match="padding must be an int or a tuple of 4 ints"):
        nn.ZeroPad2d((1, 2))
