"""Adafactor, SparseAdam and Muon, and the PolynomialLR, CosineAnnealingWarmRestarts, CyclicLR
and ChainedScheduler schedules, step by step against PyTorch (issue 28)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg

HAVE_TORCH = importlib.util.find_spec("torch") is not None
pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch cross-check")


def _steps(make: Callable[[Any, list], Any], shapes: list, steps: int = 5) -> float:
    """The largest difference between fusegrad's and PyTorch's parameters after ``steps``
    updates with the same random gradients."""
    import torch

    rng = np.random.default_rng(3)
    start = [rng.standard_normal(s) for s in shapes]
    ours = [fg.nn.Parameter(fg.tensor(p.copy())) for p in start]
    theirs = [torch.nn.Parameter(torch.tensor(p.copy())) for p in start]
    opt_ours, opt_theirs = make(fg.optim, ours), make(torch.optim, theirs)
    for _ in range(steps):
        for a, b in zip(ours, theirs):
            g = rng.standard_normal(tuple(a.shape))
            a.grad, b.grad = fg.tensor(g), torch.tensor(g)
        opt_ours.step()
        opt_theirs.step()
    return max(np.abs(a.detach().numpy() - b.detach().numpy()).max() for a, b in zip(ours, theirs))


@pytest.mark.parametrize(
    "options",
    [{}, {"lr": 0.05, "weight_decay": 0.1}, {"beta2_decay": -0.5, "d": 2.0, "maximize": True}],
)
def test_adafactor_matches_torch(options: dict) -> None:
    shapes = [(3, 4), (5,), (2, 3, 4)]
    assert _steps(lambda m, p: m.Adafactor(p, **options), shapes) < 1e-12


@pytest.mark.parametrize("options", [{}, {"nesterov": False, "adjust_lr_fn": "match_rms_adamw"}])
def test_muon_matches_torch(options: dict) -> None:
    # (bfloat16 Newton-Schulz: the same roundings as PyTorch's, up to matmul summation order)
    assert _steps(lambda m, p: m.Muon(p, lr=0.02, **options), [(3, 4), (6, 2)]) < 1e-3
    with pytest.raises(ValueError, match="2D parameters"):
        fg.optim.Muon([fg.nn.Parameter(fg.zeros(3))])


def test_sparse_adam_matches_torch_on_embeddings() -> None:
    import torch

    rng = np.random.default_rng(4)
    weight = rng.standard_normal((6, 3))
    ours, theirs = fg.nn.Embedding(6, 3), torch.nn.Embedding(6, 3, sparse=True)
    with fg.no_grad():
        ours.weight.copy_(fg.tensor(weight))
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(weight))
    opt_ours = fg.optim.SparseAdam(ours.parameters(), lr=0.01)
    opt_theirs = torch.optim.SparseAdam(theirs.parameters(), lr=0.01)
    for _ in range(6):
        idx = rng.integers(0, 6, 4)
        opt_ours.zero_grad()
        opt_theirs.zero_grad()
        (ours(fg.tensor(idx)) ** 2).sum().backward()
        (theirs(torch.tensor(idx)) ** 2).sum().backward()
        opt_ours.step()
        opt_theirs.step()
    np.testing.assert_allclose(
        ours.weight.detach().numpy(), theirs.weight.detach().numpy(), rtol=1e-6, atol=1e-7
    )


def _schedule(make: Callable[[Any, Any], Any], optimizer: str = "SGD", epoch: Any = None) -> None:
    import torch

    kwargs = {"lr": 0.1, "momentum": 0.9} if optimizer == "SGD" else {"lr": 0.1}
    ours = getattr(fg.optim, optimizer)([fg.nn.Parameter(fg.zeros(2))], **kwargs)
    theirs = getattr(torch.optim, optimizer)([torch.nn.Parameter(torch.zeros(2))], **kwargs)
    sched_ours, sched_theirs = (
        make(fg.optim.lr_scheduler, ours),
        make(torch.optim.lr_scheduler, theirs),
    )
    for i in range(25):
        ours.step()
        theirs.step()
        args = () if epoch is None else (epoch(i),)
        sched_ours.step(*args)
        sched_theirs.step(*args)
        a, b = ours.param_groups[0], theirs.param_groups[0]
        assert a["lr"] == pytest.approx(b["lr"], abs=1e-15), i
        for key in ("momentum", "betas"):
            if key in b:
                assert a[key] == pytest.approx(b[key], abs=1e-15)
    assert sched_ours.get_last_lr() == pytest.approx(sched_theirs.get_last_lr())


def test_polynomial_lr() -> None:
    _schedule(lambda m, o: m.PolynomialLR(o, total_iters=10, power=2.0))


def test_cosine_annealing_warm_restarts() -> None:
    _schedule(lambda m, o: m.CosineAnnealingWarmRestarts(o, 3, 2, eta_min=0.01))
    _schedule(lambda m, o: m.CosineAnnealingWarmRestarts(o, 4), epoch=lambda i: i * 0.37)


@pytest.mark.parametrize("mode", ["triangular", "triangular2", "exp_range"])
def test_cyclic_lr(mode: str) -> None:
    _schedule(lambda m, o: m.CyclicLR(o, 0.01, 0.1, 4, mode=mode, gamma=0.9))
    _schedule(lambda m, o: m.CyclicLR(o, 0.01, 0.1, 3, 5, mode=mode), optimizer="Adam")


def test_chained_scheduler() -> None:
    _schedule(lambda m, o: m.ChainedScheduler([m.ConstantLR(o, 0.1, 2), m.ExponentialLR(o, 0.9)]))
