"""``SmoothL1Loss`` / ``HuberLoss`` modules and the argument errors of their functional forms
(values and gradients are the op table's ``smooth_l1_loss`` / ``huber_loss`` rows)."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import nn


def test_modules_and_formulas() -> None:
    x = fg.tensor([0.0, 0.3, 2.0, -3.0], requires_grad=True)
    y = fg.zeros(4)
    d = np.array([0.0, 0.3, 2.0, 3.0])
    smooth = nn.SmoothL1Loss(reduction="none", beta=0.5)(x, y)
    np.testing.assert_allclose(smooth.detach().numpy(), np.where(d < 0.5, d * d, d - 0.25))
    huber = nn.HuberLoss(reduction="sum", delta=2.0)(x, y)
    np.testing.assert_allclose(huber.item(), 0.0 + 0.045 + 2.0 * 1.0 + 2.0 * 2.0)
    huber.backward()
    assert x.grad.tolist() == pytest.approx([0.0, 0.3, 2.0, -2.0])
    # beta = 0 is the L1 loss, with finite gradients
    x.grad = None
    F.smooth_l1_loss(x, y, beta=0.0).backward()
    assert x.grad.tolist() == [0.0, 0.25, 0.25, -0.25]
    assert F.smooth_l1_loss(x, y, reduce=False).shape == (4,)  # the legacy argument


def test_errors() -> None:
    x = fg.ones(2)
    with pytest.raises(RuntimeError, match="does not support negative values for beta"):
        F.smooth_l1_loss(x, x, beta=-1.0)
    with pytest.raises(RuntimeError, match="does not support non-positive values for delta"):
        F.huber_loss(x, x, delta=0.0)
    with pytest.raises(ValueError, match="is not a valid value for reduction"):
        F.huber_loss(x, x, reduction="avg")
