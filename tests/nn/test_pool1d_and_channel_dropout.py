"""F.max_pool1d/avg_pool1d with nn.MaxPool1d/AvgPool1d against torch (outputs, indices,
gradients, reprs, options), and F.dropout1d/2d/3d with nn.Dropout1d/2d/3d: whole channels kept
(scaled by 1/(1-p)) or zeroed, one draw per sample and channel, eval and p=0/1 identities,
PyTorch's input-rank errors and warnings."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad
import fusegrad.nn.functional as F
from fusegrad import nn

X = np.random.default_rng(0).standard_normal((2, 3, 11))

POOLS = [
    ("max_pool1d", (3,), {}),
    ("max_pool1d", (3, 2, 1), {"dilation": 2, "ceil_mode": True}),
    ("max_pool1d", (2,), {"ceil_mode": True}),
    ("avg_pool1d", (3,), {}),
    ("avg_pool1d", (4, 2, 2), {"ceil_mode": True, "count_include_pad": False}),
    ("avg_pool1d", (2, 1, 1), {}),
]


@pytest.mark.parametrize("name,args,kwargs", POOLS)
@pytest.mark.parametrize("batched", [True, False])
def test_pool1d_matches_torch(name: str, args: tuple, kwargs: dict, batched: bool) -> None:
    torch = pytest.importorskip("torch")
    data = X if batched else X[0]
    x = fusegrad.tensor(data, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    y = getattr(F, name)(x, *args, **kwargs)
    z = getattr(torch.nn.functional, name)(t, *args, **kwargs)
    np.testing.assert_allclose(y.detach().numpy(), z.detach().numpy(), rtol=1e-12, atol=1e-14)
    w = np.random.default_rng(1).standard_normal(tuple(z.shape))
    (y * fusegrad.tensor(w)).sum().backward()
    (z * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_max_pool1d_indices_and_modules_match_torch() -> None:
    torch = pytest.importorskip("torch")
    values, idx = F.max_pool1d(fusegrad.tensor(X), 3, 2, 1, return_indices=True)
    tv, ti = torch.nn.functional.max_pool1d(torch.tensor(X), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(idx.numpy(), ti.numpy())
    np.testing.assert_array_equal(values.numpy(), tv.numpy())
    for ours, theirs in [
        (nn.MaxPool1d(3, 2, 1), torch.nn.MaxPool1d(3, 2, 1)),
        (nn.AvgPool1d(4, 2, 1, True, False), torch.nn.AvgPool1d(4, 2, 1, True, False)),
    ]:
        assert repr(ours) == repr(theirs)
        np.testing.assert_allclose(
            ours(fusegrad.tensor(X)).numpy(), theirs(torch.tensor(X)).numpy(), rtol=1e-12
        )
    with pytest.raises(ValueError, match="max_pool1d: Expected 2D or 3D input"):
        F.max_pool1d(fusegrad.tensor(X[None]), 2)


@pytest.mark.parametrize(
    "fn,shape,channel_dims",
    [
        (F.dropout1d, (4, 6, 50), 2),
        (F.dropout1d, (6, 50), 1),
        (F.dropout2d, (4, 6, 7, 8), 2),
        (F.dropout3d, (2, 6, 3, 4, 5), 2),
        (F.dropout3d, (6, 3, 4, 5), 1),
    ],
)
def test_channel_dropout_keeps_or_zeroes_whole_channels(
    fn: Any, shape: tuple, channel_dims: int
) -> None:
    fusegrad.manual_seed(0)
    data = np.random.default_rng(2).uniform(1.0, 2.0, shape)
    x = fusegrad.tensor(data, requires_grad=True)
    y = fn(x, 0.4)
    ratio = (y.detach().numpy() / data).reshape(shape[:channel_dims] + (-1,))
    # every channel is all 0 or all 1/(1-p)
    assert np.all(np.isclose(ratio, 0.0) | np.isclose(ratio, 1 / 0.6))
    per_channel = ratio[..., 0]
    assert np.all(np.isclose(ratio, per_channel[..., None]))
    assert 0 < np.isclose(per_channel, 0.0).sum() < per_channel.size
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), (y.detach().numpy() / data))
    assert fn(x, 0.4, training=False) is x and fn(x, 0.0) is x
    assert float(fn(x, 1.0).abs().sum()) == 0.0


def test_channel_dropout_errors_warnings_and_modules() -> None:
    x3 = fusegrad.ones(2, 3, 4)
    with pytest.raises(RuntimeError, match="dropout1d: Expected 2D or 3D input"):
        F.dropout1d(fusegrad.ones(2, 3, 4, 5))
    with pytest.warns(UserWarning, match="Received a 3D input to dropout2d"):
        y = F.dropout2d(x3, 0.5)
    ratio = y.numpy()
    assert np.all(np.isclose(ratio, ratio[..., :1]))  # (N, C, L): whole rows of L
    with pytest.warns(UserWarning, match="Received a 2-D input to dropout3d"):
        F.dropout3d(fusegrad.ones(2, 3), 0.5)
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        F.dropout2d(fusegrad.ones(2, 3, 4, 4), 1.5)
    m = nn.Dropout2d(0.3)
    assert repr(m) == "Dropout2d(p=0.3, inplace=False)"
    m.eval()
    x = fusegrad.ones(2, 3, 4, 4)
    assert m(x) is x
    assert repr(nn.Dropout1d()) == "Dropout1d(p=0.5, inplace=False)"
    assert repr(nn.Dropout3d(0.2, True)) == "Dropout3d(p=0.2, inplace=True)"
