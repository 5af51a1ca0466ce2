"""Loss modules: values against numpy references, values and input gradients against PyTorch
(class weights, ignore_index, label smoothing, probability targets, every reduction)."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
from fusegrad import nn

RNG = np.random.default_rng(99)


def _np(t: fusegrad.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _log_softmax(x: np.ndarray, axis: int = 1) -> np.ndarray:
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def _check_against_torch(
    name: str, kwargs: dict, x: np.ndarray, target: np.ndarray, buffers: dict | None = None
) -> None:
    """Same loss module in both libraries: loss value and d loss / d input must agree."""
    torch = pytest.importorskip("torch")
    buffers = buffers or {}
    ours = getattr(nn, name)(**kwargs, **{k: fusegrad.tensor(v) for k, v in buffers.items()})
    theirs = getattr(torch.nn, name)(
        **kwargs, **{k: torch.from_numpy(v) for k, v in buffers.items()}
    )
    xf = fusegrad.tensor(x, requires_grad=True)
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    lf = ours(xf, fusegrad.tensor(target))
    lt = theirs(xt, torch.from_numpy(target.copy()))
    np.testing.assert_allclose(_np(lf), lt.detach().numpy(), rtol=1e-7, atol=1e-10)
    upstream = RNG.standard_normal(tuple(lt.shape))
    (lf * fusegrad.tensor(upstream)).sum().backward()
    (lt * torch.from_numpy(upstream)).sum().backward()
    np.testing.assert_allclose(_np(xf.grad), xt.grad.numpy(), rtol=1e-7, atol=1e-10)


# ---- numpy references ------------------------------------------------------------------------


def test_cross_entropy_matches_numpy():
    x = RNG.standard_normal((6, 4))
    y = RNG.integers(0, 4, 6)
    expected = -_log_softmax(x)[np.arange(6), y].mean()
    loss = nn.CrossEntropyLoss()(fusegrad.tensor(x), fusegrad.tensor(y))
    np.testing.assert_allclose(float(loss), expected, rtol=1e-12)
    # gradient of the mean loss: (softmax - onehot) / N
    xf = fusegrad.tensor(x, requires_grad=True)
    nn.CrossEntropyLoss()(xf, fusegrad.tensor(y)).backward()
    onehot = np.eye(4)[y]
    np.testing.assert_allclose(_np(xf.grad), (np.exp(_log_softmax(x)) - onehot) / 6, rtol=1e-10)


def test_weighted_cross_entropy_with_ignore_index_matches_numpy():
    x = RNG.standard_normal((5, 3))
    y = np.array([0, 2, -100, 1, 2])
    w = np.array([0.2, 1.0, 3.0])
    keep = y != -100
    logp = _log_softmax(x)[np.arange(5)[keep], y[keep]]
    expected = -(w[y[keep]] * logp).sum() / w[y[keep]].sum()
    loss = nn.CrossEntropyLoss(weight=fusegrad.tensor(w))(fusegrad.tensor(x), fusegrad.tensor(y))
    np.testing.assert_allclose(float(loss), expected, rtol=1e-12)


def test_regression_and_binary_losses_match_numpy():
    a, b = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    fa, fb = fusegrad.tensor(a), fusegrad.tensor(b)
    np.testing.assert_allclose(float(nn.MSELoss()(fa, fb)), ((a - b) ** 2).mean(), rtol=1e-12)
    np.testing.assert_allclose(
        float(nn.L1Loss(reduction="sum")(fa, fb)), np.abs(a - b).sum(), rtol=1e-12
    )
    np.testing.assert_allclose(_np(nn.MSELoss(reduction="none")(fa, fb)), (a - b) ** 2)
    p = 1 / (1 + np.exp(-a))
    t = (b > 0).astype(np.float64)
    bce = -(t * np.log(p) + (1 - t) * np.log(1 - p)).mean()
    np.testing.assert_allclose(
        float(nn.BCELoss()(fusegrad.tensor(p), fusegrad.tensor(t))), bce, rtol=1e-10
    )
    np.testing.assert_allclose(
        float(nn.BCEWithLogitsLoss()(fa, fusegrad.tensor(t))), bce, rtol=1e-10
    )


def test_bce_clamps_log_like_pytorch():
    p = fusegrad.tensor([0.0, 1.0])
    t = fusegrad.tensor([1.0, 0.0])
    assert float(nn.BCELoss(reduction="sum")(p, t)) == pytest.approx(200.0)


def test_bce_with_logits_is_stable_for_large_logits():
    x = fusegrad.tensor([1000.0, -1000.0])
    t = fusegrad.tensor([0.0, 1.0])
    np.testing.assert_allclose(_np(nn.BCEWithLogitsLoss(reduction="none")(x, t)), [1000, 1000])


def test_nll_loss_matches_numpy():
    logp = _log_softmax(RNG.standard_normal((4, 5)))
    y = np.array([4, 0, 0, 2])
    expected = -logp[np.arange(4), y].sum()
    loss = nn.NLLLoss(reduction="sum")(fusegrad.tensor(logp), fusegrad.tensor(y))
    np.testing.assert_allclose(float(loss), expected, rtol=1e-12)


def test_loss_argument_errors():
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        nn.MSELoss(reduction="avg")
    with pytest.raises(IndexError, match="out of bounds"):
        nn.CrossEntropyLoss()(fusegrad.randn(2, 3), fusegrad.tensor([0, 3]))
    with pytest.raises(TypeError):
        nn.NLLLoss()(fusegrad.randn(2, 3), fusegrad.tensor([0.0, 1.0]))
    # legacy size_average / reduce map onto reduction, as in PyTorch
    assert nn.MSELoss(size_average=False).reduction == "sum"
    assert nn.MSELoss(reduce=False).reduction == "none"


def test_weight_is_a_buffer():
    loss = nn.CrossEntropyLoss(weight=fusegrad.ones(3))
    assert list(loss.state_dict()) == ["weight"]
    loss.double()
    assert loss.weight.dtype == fusegrad.float64
    assert list(nn.CrossEntropyLoss().state_dict()) == []


# ---- against PyTorch -------------------------------------------------------------------------

REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_class_targets_against_torch(
    reduction: str, weighted: bool, smoothing: float
):
    x = RNG.standard_normal((6, 4))
    y = np.array([0, 3, -100, 1, 2, 3])
    buffers = {"weight": RNG.uniform(0.5, 2.0, 4)} if weighted else {}
    _check_against_torch(
        "CrossEntropyLoss",
        {"reduction": reduction, "ignore_index": -100, "label_smoothing": smoothing},
        x,
        y,
        buffers,
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_custom_ignore_index_spatial_against_torch(reduction: str):
    x = RNG.standard_normal((2, 3, 4, 5))  # (N, C, d1, d2)
    y = RNG.integers(0, 3, (2, 4, 5))
    y[0, 0, :2] = 1  # class 1 is the ignored one below
    _check_against_torch(
        "CrossEntropyLoss",
        {"reduction": reduction, "ignore_index": 1, "label_smoothing": 0.1},
        x,
        y,
        {"weight": np.array([1.0, 2.0, 0.5])},
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_cross_entropy_probability_targets_against_torch(
    reduction: str, weighted: bool, smoothing: float
):
    x = RNG.standard_normal((5, 4))
    probs = RNG.uniform(size=(5, 4))
    probs /= probs.sum(1, keepdims=True)
    buffers = {"weight": RNG.uniform(0.5, 2.0, 4)} if weighted else {}
    _check_against_torch(
        "CrossEntropyLoss",
        {"reduction": reduction, "label_smoothing": smoothing},
        x,
        probs,
        buffers,
    )


def test_cross_entropy_unbatched_against_torch():
    _check_against_torch(
        "CrossEntropyLoss", {"label_smoothing": 0.1}, RNG.standard_normal(5), np.array(3)
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_against_torch(reduction: str, weighted: bool):
    x = _log_softmax(RNG.standard_normal((6, 5)))
    y = np.array([4, 0, 0, 2, -100, 1])
    buffers = {"weight": RNG.uniform(0.5, 2.0, 5)} if weighted else {}
    _check_against_torch("NLLLoss", {"reduction": reduction}, x, y, buffers)


@pytest.mark.parametrize("name", ["MSELoss", "L1Loss"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_regression_losses_against_torch(name: str, reduction: str):
    _check_against_torch(
        name, {"reduction": reduction}, RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_bce_against_torch(reduction: str, weighted: bool):
    p = RNG.uniform(0.05, 0.95, (4, 3))
    t = RNG.uniform(size=(4, 3))  # soft targets are allowed
    buffers = {"weight": RNG.uniform(0.5, 2.0, (4, 3))} if weighted else {}
    _check_against_torch("BCELoss", {"reduction": reduction}, p, t, buffers)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("extra", ["none", "weight", "pos_weight"])
def test_bce_with_logits_against_torch(reduction: str, extra: str):
    x = RNG.standard_normal((4, 3)) * 5
    t = (RNG.uniform(size=(4, 3)) > 0.5).astype(np.float64)
    buffers = {}
    if extra == "weight":
        buffers["weight"] = RNG.uniform(0.5, 2.0, (1, 3))
    elif extra == "pos_weight":
        buffers["pos_weight"] = RNG.uniform(0.5, 3.0, 3)
    _check_against_torch("BCEWithLogitsLoss", {"reduction": reduction}, x, t, buffers)
