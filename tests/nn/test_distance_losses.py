"""KLDivLoss, TripletMarginLoss, CosineSimilarity, PairwiseDistance (modules) and what the op
table cannot express for their functionals: PyTorch's gradient of cosine_similarity where the
norm is clamped, kl_div's 'mean' warning and legacy arguments, and the errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F

try:
    import torch
    import torch.nn.functional as TF
except ImportError:  # pragma: no cover - torch is optional
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


def _np(t: fg.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _pair(a: np.ndarray) -> tuple:
    return fg.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


@needs_torch
@pytest.mark.parametrize(
    ("scale_a", "eps"),
    [(1e-9, 1e-8), (1.0, 2.0), (0.0, 1e-8), (1.0, 1e-8)],
)
def test_cosine_similarity_gradient_matches_torch_where_clamped(scale_a: float, eps: float):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 5)) * scale_a, rng.standard_normal((3, 5))
    (fa, ta), (fb, tb) = _pair(a), _pair(b)
    out = F.cosine_similarity(fa, fb, dim=1, eps=eps)
    want = TF.cosine_similarity(ta, tb, dim=1, eps=eps)
    np.testing.assert_allclose(_np(out), want.detach().numpy(), rtol=1e-12, atol=1e-15)
    weights = rng.standard_normal(3)
    (out * fg.tensor(weights)).sum().backward()
    (want * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(_np(fa.grad), ta.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(_np(fb.grad), tb.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_cosine_similarity_stays_within_one_and_refuses_integers() -> None:
    big = fg.tensor(np.array([[1e150, 1e150], [3.0, 4.0]]))
    out = _np(F.cosine_similarity(big, big))
    # each input divided by its own norm first: no overflow of the norms' product
    np.testing.assert_allclose(out, [1.0, 1.0], rtol=4e-16, atol=0)
    with pytest.raises(TypeError, match="expected common dtype to be floating point"):
        F.cosine_similarity(fg.tensor([1, 2]), fg.tensor([1, 3]), dim=0)
    mixed = F.cosine_similarity(fg.tensor([1, 2]), fg.tensor([1.0, 3.0]), dim=0)
    assert mixed.dtype == fg.float32


def test_kl_div_mean_warns_and_legacy_arguments() -> None:
    x = fg.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    t = fg.tensor([[0.3, 0.7], [0.5, 0.5]])
    with pytest.warns(UserWarning, match="'batchmean' divides only by the batch size"):
        mean = F.kl_div(x, t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        total = F.kl_div(x, t, reduction="sum")
        batch = F.kl_div(x, t, reduction="batchmean")
        legacy = F.kl_div(x, t, reduce=False)
    np.testing.assert_allclose(float(mean) * 4, float(total), rtol=1e-6)
    np.testing.assert_allclose(float(batch) * 2, float(total), rtol=1e-6)
    assert tuple(legacy.shape) == (2, 2)
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        F.kl_div(x, t, reduction="avg")


@needs_torch
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "none", "mean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_loss_module_matches_torch(reduction: str, log_target: bool) -> None:
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((4, 5))
    probs = rng.dirichlet(np.ones(5), 4)
    probs[0, 1] = 0.0
    target = np.log(probs + 1e-3) if log_target else probs
    fx, tx = _pair(logits)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = nn.KLDivLoss(reduction=reduction, log_target=log_target)(
            fx.log_softmax(1), fg.tensor(target)
        )
        want = torch.nn.KLDivLoss(reduction=reduction, log_target=log_target)(
            tx.log_softmax(1), torch.tensor(target)
        )
    np.testing.assert_allclose(_np(got), want.detach().numpy(), rtol=1e-12, atol=1e-15)
    got.sum().backward()
    want.sum().backward()
    np.testing.assert_allclose(_np(fx.grad), tx.grad.numpy(), rtol=1e-10, atol=1e-14)


@needs_torch
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"margin": 0.5, "p": 1.0}, {"swap": True}, {"p": 3.0, "eps": 1e-3, "reduction": "none"}],
)
def test_triplet_margin_loss_module_matches_torch(kwargs: dict) -> None:
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((6, 4)) for _ in range(3)]
    fs = [fg.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    got = nn.TripletMarginLoss(**kwargs)(*fs)
    want = torch.nn.TripletMarginLoss(**kwargs)(*ts)
    np.testing.assert_allclose(_np(got), want.detach().numpy(), rtol=1e-12)
    got.sum().backward()
    want.sum().backward()
    for f, t in zip(fs, ts):
        np.testing.assert_allclose(_np(f.grad), t.grad.numpy(), rtol=1e-10, atol=1e-14)


@needs_torch
def test_distance_modules_match_torch() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4))
    got = nn.CosineSimilarity(dim=-1, eps=1e-6)(fg.tensor(a), fg.tensor(b))
    want = torch.nn.CosineSimilarity(dim=-1, eps=1e-6)(torch.tensor(a), torch.tensor(b))
    np.testing.assert_allclose(_np(got), want.numpy(), rtol=1e-12)
    got = nn.PairwiseDistance(p=1.0, keepdim=True)(fg.tensor(a), fg.tensor(b))
    want = torch.nn.PairwiseDistance(p=1.0, keepdim=True)(torch.tensor(a), torch.tensor(b))
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_allclose(_np(got), want.numpy(), rtol=1e-12)
    assert "dim=-1" in repr(nn.CosineSimilarity(dim=-1))


def test_triplet_errors() -> None:
    with pytest.raises(RuntimeError, match="same number of dimensions, but got: anchor 2D"):
        F.triplet_margin_loss(fg.ones(2, 3), fg.ones(2, 3), fg.ones(3))
    with pytest.raises(ValueError, match="margin must be greater than 0"):
        F.triplet_margin_loss(fg.ones(2, 3), fg.ones(2, 3), fg.ones(2, 3), margin=0)
    with pytest.raises(ValueError, match="expected margin to be greater than 0"):
        nn.TripletMarginLoss(margin=-1.0)


def test_losses_train_in_a_compiled_step() -> None:
    """The composites record into a whole compiled step like any op: same losses and grads."""
    fg.manual_seed(0)
    net = nn.Linear(4, 3, dtype=fg.float64)
    twin = nn.Linear(4, 3, dtype=fg.float64)
    twin.load_state_dict(net.state_dict())
    kl, triplet = nn.KLDivLoss(reduction="batchmean"), nn.TripletMarginLoss(margin=2.0)
    cos = nn.CosineSimilarity()

    def step(model: nn.Module, x: fg.Tensor, t: fg.Tensor) -> fg.Tensor:
        out = model(x)
        loss = kl(out.log_softmax(1), t) + triplet(out, out.roll(1, 0), out.flip(0))
        loss = loss + (1 - cos(out, x[:, :3])).mean()
        loss.backward()
        return loss.detach()

    compiled = fg.compile(lambda x, t: step(twin, x, t))
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = fg.tensor(rng.standard_normal((5, 4)))
        t = fg.tensor(rng.dirichlet(np.ones(3), 5))
        net.zero_grad()
        twin.zero_grad()
        want = step(net, x, t)
        got = compiled(x, t)
        np.testing.assert_allclose(_np(got), _np(want), rtol=1e-12)
        for p, q in zip(twin.parameters(), net.parameters()):
            np.testing.assert_allclose(_np(p.grad), _np(q.grad), rtol=1e-10, atol=1e-14)
