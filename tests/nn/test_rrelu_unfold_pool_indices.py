"""F.rrelu/rrelu_ with nn.RReLU (eval: the mean slope, as torch; training: one slope per
element from U(lower, upper), reproducible under manual_seed), nn.Unfold, nn.NLLLoss2d and
F.max_pool1d_with_indices/max_pool2d_with_indices against torch."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
import fusegrad.nn.functional as F
from fusegrad import nn

RNG = np.random.default_rng(9)
X = RNG.standard_normal((3, 4, 5))
X[np.abs(X) < 0.05] = 0.5  # clear of the kink


def test_rrelu_eval_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    for ours, theirs in [
        (nn.RReLU(), torch.nn.RReLU()),
        (nn.RReLU(0.1, 0.3), torch.nn.RReLU(0.1, 0.3)),
    ]:
        ours.eval()
        theirs.eval()
        assert repr(ours) == repr(theirs)
        x, t = fusegrad.tensor(X, requires_grad=True), torch.tensor(X, requires_grad=True)
        y, z = ours(x), theirs(t)
        np.testing.assert_allclose(y.detach().numpy(), z.detach().numpy(), rtol=1e-12)
        y.sum().backward()
        z.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12)
        assert y.grad_fn.name() == z.grad_fn.name() == "RreluWithNoiseBackward0"


def test_rrelu_training_draws_one_slope_per_element() -> None:
    fusegrad.manual_seed(3)
    x = fusegrad.tensor(X, requires_grad=True)
    y = F.rrelu(x, 0.1, 0.3, training=True)
    slopes = y.detach().numpy() / X
    neg = X < 0
    assert np.all(slopes[~neg] == 1.0)
    assert np.all((slopes[neg] >= 0.1) & (slopes[neg] <= 0.3))
    assert len(np.unique(np.round(slopes[neg], 12))) > neg.sum() // 2  # per element
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), slopes, rtol=1e-12)
    fusegrad.manual_seed(3)
    again = F.rrelu(fusegrad.tensor(X), 0.1, 0.3, training=True)
    np.testing.assert_array_equal(again.numpy(), y.detach().numpy())
    a = fusegrad.tensor(X) * 1
    assert F.rrelu_(a) is a and np.allclose(a.numpy(), np.where(X >= 0, X, X * (0.125 + 1 / 3) / 2))


def test_unfold_module_nllloss2d_and_pool_indices_match_torch() -> None:
    torch = pytest.importorskip("torch")
    images = RNG.standard_normal((2, 3, 6, 7))
    for ours, theirs in [
        (nn.Unfold(2), torch.nn.Unfold(2)),
        (nn.Unfold((2, 3), padding=1, stride=2), torch.nn.Unfold((2, 3), padding=1, stride=2)),
    ]:
        assert repr(ours) == repr(theirs)
        np.testing.assert_allclose(
            ours(fusegrad.tensor(images)).numpy(), theirs(torch.tensor(images)).numpy()
        )
    with pytest.warns(FutureWarning, match="`NLLLoss2d` has been deprecated"):
        loss = nn.NLLLoss2d()
    logp = RNG.standard_normal((2, 4, 3, 3))
    target = RNG.integers(0, 4, (2, 3, 3))
    with pytest.warns(FutureWarning):
        want = torch.nn.NLLLoss2d()(torch.tensor(logp), torch.tensor(target))
    got = loss(fusegrad.tensor(logp), fusegrad.tensor(target))
    np.testing.assert_allclose(float(got), float(want), rtol=1e-12)
    for name, data, args in [
        ("max_pool2d_with_indices", images, (2,)),
        ("max_pool1d_with_indices", images[0], (3, 2, 1)),
    ]:
        values, idx = getattr(F, name)(fusegrad.tensor(data), *args)
        tv, ti = getattr(torch.nn.functional, name)(torch.tensor(data), *args)
        np.testing.assert_array_equal(values.numpy(), tv.numpy())
        np.testing.assert_array_equal(idx.numpy(), ti.numpy())
