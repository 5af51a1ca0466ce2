"""Polynomial regression in the manner of PyTorch's classic example: features x, x^2, x^3,
x^4 of random points, a target polynomial with noise, one nn.Linear fitted with
F.smooth_l1_loss and a hand-written gradient step on ``param.data``; written against PyTorch's
public API.  ``run(torch, ...)`` works with PyTorch or fusegrad as ``torch``."""

from __future__ import annotations

from typing import Any

import numpy as np

DEGREE = 4
W_TARGET = np.array([[0.5], [-1.2], [0.3], [0.8]])
B_TARGET = np.array([0.7])


def build(torch: Any) -> Any:
    return torch.nn.Linear(DEGREE, 1)


def make_features(torch: Any, x: Any) -> Any:
    """Columns x, x^2, ..., x^DEGREE of a column vector x."""
    x = x.unsqueeze(1)
    return torch.cat([x**i for i in range(1, DEGREE + 1)], 1)


def batches(steps: int, size: int = 32) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(size) for _ in range(steps)]


def run(torch: Any, state: dict | None, compiled: bool, steps: int = 5) -> dict:
    torch.manual_seed(0)
    F = torch.nn.functional
    fc = build(torch).double()
    if state is not None:
        fc.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    net = torch.compile(fc) if compiled else fc
    w_target, b_target = torch.tensor(W_TARGET), torch.tensor(B_TARGET)
    noise = np.random.default_rng(1)
    losses = []
    for points in batches(steps):
        x = make_features(torch, torch.tensor(points))
        y = x.mm(w_target) + b_target.item() + torch.tensor(0.01 * noise.standard_normal((32, 1)))
        fc.zero_grad()
        loss = F.smooth_l1_loss(net(x), y)
        loss.backward()
        for param in fc.parameters():
            param.data.add_(-0.1 * param.grad)
        losses.append(loss.item())
    return {
        "losses": losses,
        "grads": {n: p.grad.detach().numpy().copy() for n, p in fc.named_parameters()},
        "params": {n: p.detach().numpy().copy() for n, p in fc.named_parameters()},
    }
