"""An LSTM sequence model (two LSTMCells stepping through a sine wave, predicting the next
value) trained with LBFGS, as PyTorch's classic time-series example does, written against
PyTorch's public API; ``run(torch, ...)`` works with PyTorch or fusegrad as ``torch``."""

from __future__ import annotations

from typing import Any

import numpy as np

HIDDEN = 12


def build(torch: Any) -> Any:
    nn = torch.nn

    class Sequence(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm1 = nn.LSTMCell(1, HIDDEN)
            self.lstm2 = nn.LSTMCell(HIDDEN, HIDDEN)
            self.linear = nn.Linear(HIDDEN, 1)

        def forward(self, x: Any) -> Any:
            outputs = []
            h1 = c1 = torch.zeros(x.size(0), HIDDEN, dtype=x.dtype)
            h2 = c2 = torch.zeros(x.size(0), HIDDEN, dtype=x.dtype)
            for t in x.split(1, dim=1):
                h1, c1 = self.lstm1(t, (h1, c1))
                h2, c2 = self.lstm2(h1, (h2, c2))
                outputs.append(self.linear(h2))
            return torch.cat(outputs, dim=1)

    return Sequence()


def waves(n: int = 6, length: int = 20) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(length + 1) + rng.integers(-4, 4, (n, 1))
    return np.sin(t / 3.0)


def run(torch: Any, state: dict | None, compiled: bool, steps: int = 5) -> dict:
    torch.manual_seed(0)
    model = build(torch).double()
    if state is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    net = torch.compile(model) if compiled else model
    data = waves()
    x, y = torch.tensor(data[:, :-1]), torch.tensor(data[:, 1:])
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    loss_fn = torch.nn.MSELoss()
    losses = []

    def closure() -> Any:
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        return loss

    for _ in range(steps):
        losses.append(opt.step(closure).item())
    closure()  # the gradients at the final parameters
    return {
        "losses": losses,
        "grads": {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()},
        "params": {n: p.detach().numpy().copy() for n, p in model.named_parameters()},
    }
