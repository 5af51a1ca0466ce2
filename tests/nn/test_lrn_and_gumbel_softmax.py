"""F.local_response_norm with nn.LocalResponseNorm against torch (3-D, 4-D and 5-D inputs,
outputs and gradients, reprs), and F.gumbel_softmax: soft samples are distributions whose
arg max follows softmax(logits) in frequency, hard samples are one-hot with the soft sample's
gradient (straight-through), reproducible under manual_seed."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
import fusegrad.nn.functional as F
from fusegrad import nn

RNG = np.random.default_rng(4)


@pytest.mark.parametrize(
    "shape,args", [((2, 5, 3, 4), (3,)), ((2, 6, 7), (2, 1e-2, 0.5, 2.0)), ((1, 4, 2, 3, 2), (4,))]
)
def test_local_response_norm_matches_torch(shape: tuple, args: tuple) -> None:
    torch = pytest.importorskip("torch")
    data = RNG.standard_normal(shape)
    ours, theirs = nn.LocalResponseNorm(*args), torch.nn.LocalResponseNorm(*args)
    assert repr(ours) == repr(theirs)
    x, t = fusegrad.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    y, z = ours(x), theirs(t)
    np.testing.assert_allclose(y.detach().numpy(), z.detach().numpy(), rtol=1e-12, atol=1e-14)
    w = RNG.standard_normal(shape)
    (y * fusegrad.tensor(w)).sum().backward()
    (z * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-11, atol=1e-13)
    with pytest.raises(ValueError, match="Expected 3D or higher dimensionality input"):
        F.local_response_norm(fusegrad.ones(2, 3), 2)


def test_gumbel_softmax_soft_and_hard_samples() -> None:
    logits = np.log(np.array([0.6, 0.3, 0.1]))
    fusegrad.manual_seed(0)
    x = fusegrad.tensor(np.tile(logits, (4000, 1)), requires_grad=True)
    soft = F.gumbel_softmax(x, tau=0.5)
    values = soft.detach().numpy()
    np.testing.assert_allclose(values.sum(-1), 1.0, rtol=1e-12)
    frequency = np.bincount(values.argmax(-1), minlength=3) / len(values)
    np.testing.assert_allclose(frequency, [0.6, 0.3, 0.1], atol=0.03)
    fusegrad.manual_seed(0)
    hard = F.gumbel_softmax(x, tau=0.5, hard=True)
    one_hot = hard.detach().numpy()
    assert set(np.unique(one_hot)) == {0.0, 1.0} and np.all(one_hot.sum(-1) == 1.0)
    np.testing.assert_array_equal(one_hot.argmax(-1), values.argmax(-1))  # same draws
    weights = fusegrad.tensor(RNG.standard_normal((4000, 3)))
    (hard * weights).sum().backward()
    grad_hard = x.grad.numpy().copy()
    x.grad = None
    fusegrad.manual_seed(0)
    (F.gumbel_softmax(x, tau=0.5) * weights).sum().backward()
    np.testing.assert_allclose(grad_hard, x.grad.numpy(), rtol=1e-12, atol=1e-14)
