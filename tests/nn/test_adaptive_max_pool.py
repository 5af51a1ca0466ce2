"""F.adaptive_max_pool1d/2d with nn.AdaptiveMaxPool1d/2d against torch: even and uneven
windows, None sizes, unbatched inputs, gradients to the selected elements, reprs, node names,
and the indices of return_indices=True."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
import fusegrad.nn.functional as F
from fusegrad import nn

RNG = np.random.default_rng(6)


@pytest.mark.parametrize(
    "name,shape,size",
    [
        ("AdaptiveMaxPool2d", (2, 3, 6, 8), (3, 4)),
        ("AdaptiveMaxPool2d", (2, 3, 5, 7), (2, 3)),
        ("AdaptiveMaxPool2d", (3, 5, 7), 3),
        ("AdaptiveMaxPool2d", (1, 2, 5, 7), (None, 2)),
        ("AdaptiveMaxPool1d", (2, 3, 10), 4),
        ("AdaptiveMaxPool1d", (3, 9), 3),
    ],
)
def test_adaptive_max_pool_matches_torch(name: str, shape: tuple, size: object) -> None:
    torch = pytest.importorskip("torch")
    data = RNG.standard_normal(shape)
    ours, theirs = getattr(nn, name)(size), getattr(torch.nn, name)(size)
    assert repr(ours) == repr(theirs)
    x, t = fusegrad.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    y, z = ours(x), theirs(t)
    np.testing.assert_array_equal(y.detach().numpy(), z.detach().numpy())
    w = RNG.standard_normal(tuple(z.shape))
    (y * fusegrad.tensor(w)).sum().backward()
    (z * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-14)
    assert y.grad_fn.name() == z.grad_fn.name()


@pytest.mark.parametrize("dims, size", [(1, 4), (2, (4, 3)), (3, (2, None, 3))])
def test_return_indices_match_torch(dims: int, size: object) -> None:
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, 3) + (7, 5, 6)[:dims])
    fn = f"adaptive_max_pool{dims}d"
    values, indices = getattr(F, fn)(fusegrad.tensor(x, requires_grad=True), size, True)
    want_v, want_i = getattr(torch.nn.functional, fn)(torch.tensor(x), size, True)
    np.testing.assert_array_equal(values.detach().numpy(), want_v.numpy())
    np.testing.assert_array_equal(indices.numpy(), want_i.numpy())
    assert indices.dtype is fusegrad.int64
