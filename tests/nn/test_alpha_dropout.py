"""F.alpha_dropout/feature_alpha_dropout with nn.AlphaDropout/FeatureAlphaDropout: dropped
values take SELU's saturation value, kept ones PyTorch's affine rescaling, so a standard normal
input keeps mean 0 and variance 1 (as torch's do); channels drop whole; eval is the identity."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
import fusegrad.nn.functional as F
from fusegrad import nn

ALPHA = 1.7580993408473766


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_alpha_dropout_values_and_moments(p: float) -> None:
    torch = pytest.importorskip("torch")
    data = np.random.default_rng(0).standard_normal((400, 500))
    fusegrad.manual_seed(0)
    x = fusegrad.tensor(data, requires_grad=True)
    y = F.alpha_dropout(x, p, training=True)
    out = y.detach().numpy()
    a = 1 / np.sqrt((ALPHA**2 * p + 1) * (1 - p))
    dropped_value = -ALPHA * a + ALPHA * a * p
    dropped = np.isclose(out, dropped_value)
    np.testing.assert_allclose(out[~dropped], a * data[~dropped] + ALPHA * a * p, rtol=1e-12)
    assert abs(dropped.mean() - p) < 0.01
    theirs = torch.nn.functional.alpha_dropout(torch.tensor(data), p, training=True).numpy()
    assert abs(out.mean() - theirs.mean()) < 0.01 and abs(out.std() - theirs.std()) < 0.01
    assert abs(out.mean()) < 0.01 and abs(out.std() - 1) < 0.01
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.where(dropped, 0.0, a), rtol=1e-12)


def test_feature_alpha_dropout_drops_channels_and_eval_is_identity() -> None:
    fusegrad.manual_seed(1)
    data = np.random.default_rng(1).standard_normal((8, 6, 5))
    out = F.feature_alpha_dropout(fusegrad.tensor(data), 0.5, training=True).numpy()
    a = 1 / np.sqrt((ALPHA**2 * 0.5 + 1) * 0.5)
    dropped = np.isclose(out, -ALPHA * a + ALPHA * a * 0.5)
    assert np.all(dropped.all(-1) | ~dropped.any(-1))  # whole channels
    assert 0 < dropped.all(-1).sum() < 48
    m = nn.AlphaDropout(0.3)
    m.eval()
    x = fusegrad.tensor(data)
    assert m(x) is x and nn.FeatureAlphaDropout(0.3).eval()(x) is x
    assert float(F.alpha_dropout(x, 1.0, training=True).abs().sum()) == 0.0
