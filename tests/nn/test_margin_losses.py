"""nn.MarginRankingLoss, HingeEmbeddingLoss, SoftMarginLoss, MultiLabelSoftMarginLoss,
CosineEmbeddingLoss and PoissonNLLLoss (and their F functions): values and gradients against
torch in float64 for each reduction, options, the legacy size_average/reduce arguments, reprs.
(The op table checks the functions against numpy references, gradcheck and gradgradcheck.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad
from fusegrad import nn

RNG = np.random.default_rng(3)
A, B = RNG.standard_normal((4, 5)), RNG.standard_normal((4, 5))
SIGNS = np.where(RNG.random((4, 5)) > 0.5, 1.0, -1.0)
ROW_SIGNS = np.where(RNG.random(4) > 0.5, 1.0, -1.0)
LABELS = (RNG.random((4, 5)) > 0.5) * 1.0
COUNTS = RNG.poisson(2.0, (4, 5)).astype(np.float64)

CASES = [
    ("MarginRankingLoss", {"margin": 0.3}, (A, B, SIGNS), 2),
    ("HingeEmbeddingLoss", {"margin": 0.5}, (A, SIGNS), 1),
    ("SoftMarginLoss", {}, (A, SIGNS), 1),
    ("MultiLabelSoftMarginLoss", {"weight": np.linspace(0.5, 2, 5)}, (A, LABELS), 1),
    ("CosineEmbeddingLoss", {"margin": 0.1}, (A, B, ROW_SIGNS), 2),
    ("PoissonNLLLoss", {}, (A, COUNTS), 1),
    ("PoissonNLLLoss", {"log_input": False, "full": True}, (np.abs(A) + 0.1, COUNTS), 1),
]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name,options,args,differentiable", CASES)
def test_losses_match_torch(
    name: str, options: dict, args: tuple, differentiable: int, reduction: str
) -> None:
    torch = pytest.importorskip("torch")

    def make(lib: Any) -> Any:
        kw = {k: lib.tensor(v) if isinstance(v, np.ndarray) else v for k, v in options.items()}
        return getattr(lib.nn, name)(reduction=reduction, **kw)

    ours, theirs = make(fusegrad), make(torch)
    assert repr(ours) == repr(theirs)
    xs = [fusegrad.tensor(a, requires_grad=i < differentiable) for i, a in enumerate(args)]
    ts = [torch.tensor(a, requires_grad=i < differentiable) for i, a in enumerate(args)]
    y, z = ours(*xs), theirs(*ts)
    np.testing.assert_allclose(y.detach().numpy(), z.detach().numpy(), rtol=1e-12, atol=1e-14)
    y.sum().backward()
    z.sum().backward()
    for x, t in zip(xs[:differentiable], ts[:differentiable]):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_legacy_reduction_arguments() -> None:
    x, y = fusegrad.tensor(A), fusegrad.tensor(SIGNS)
    total = nn.SoftMarginLoss(size_average=False)(x, y)
    per = nn.SoftMarginLoss(reduce=False)(x, y)
    assert per.shape == (4, 5)
    np.testing.assert_allclose(float(total), per.numpy().sum(), rtol=1e-12)
    with pytest.raises(ValueError, match="is not a valid value for reduction"):
        nn.HingeEmbeddingLoss(reduction="mean_all")
