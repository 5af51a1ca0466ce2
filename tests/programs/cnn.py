"""A CNN with BatchNorm and dropout on 8x8 digit images (scikit-learn's digits when installed,
else a synthetic stand-in), trained with SGD with momentum, written against PyTorch's public
API; ``run(torch, ...)`` works with PyTorch or fusegrad as ``torch``."""

from __future__ import annotations

from typing import Any

import numpy as np


def build(torch: Any, dropout: float) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(16 * 4 * 4, 10),
    )


def images(n: int = 96) -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x, y = digits.images[:n] / 16.0, digits.target[:n]
    except ImportError:
        rng = np.random.default_rng(0)
        y = rng.integers(0, 10, n)
        x = rng.standard_normal((n, 8, 8)) * 0.3 + y[:, None, None] / 10.0
    return x[:, None].astype(np.float64), y.astype(np.int64)


def run(
    torch: Any, state: dict | None, compiled: bool, steps: int = 5, dropout: float = 0.0
) -> dict:
    torch.manual_seed(0)
    model = build(torch, dropout).double()
    if state is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    net = torch.compile(model) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = images()
    loss_fn = torch.nn.CrossEntropyLoss()
    losses = []
    model.train()
    for step in range(steps):
        xb = torch.tensor(x[step * 16 : (step + 1) * 16])
        yb = torch.tensor(y[step * 16 : (step + 1) * 16])
        opt.zero_grad()
        loss = loss_fn(net(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        accuracy = (net(torch.tensor(x)).argmax(1) == torch.tensor(y)).float().mean().item()
    buffers = {n: b.detach().numpy().copy() for n, b in model.named_buffers()}
    return {
        "losses": losses,
        "grads": {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()},
        "params": {n: p.detach().numpy().copy() for n, p in model.named_parameters()},
        "buffers": {n: b for n, b in buffers.items() if b.dtype.kind == "f"},
        "accuracy": accuracy,
    }
