"""Recurrent and attention layers (nn.LSTM, nn.GRU, nn.TransformerEncoderLayer, ...) trained
by a whole-step compile (``fusegrad.compile(step)``): the parameters, gradients and losses equal
eager's after a few steps, with one recording replayed; a fall back, if any, is logged and
never wrong."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn

pytestmark = pytest.mark.usefixtures("fresh_compiler")


class _Recurrent(nn.Module):
    """A sequence regressor: a 2-layer bidirectional LSTM (or GRU), then a linear head on the
    last time step."""

    def __init__(self, cls: Any) -> None:
        super().__init__()
        self.rnn = cls(3, 5, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(10, 1)

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        out = self.rnn(x)[0]
        return self.head(out[:, -1])


def _train_both(make: Callable[[], nn.Module], batches: list, optimizer: Callable) -> None:
    """Train an eager model and a deep copy under fusegrad.compile(step) on the same batches;
    assert equal losses, parameters and gradients, and that later steps replay one recording."""
    fg.manual_seed(0)
    eager = make().double()
    comp = copy.deepcopy(eager)

    def make_step(model: nn.Module) -> Callable:
        opt = optimizer(model.parameters())

        def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    eager_step, comp_step = make_step(eager), fg.compile(make_step(comp))
    for x, y in batches:
        want = eager_step(fg.tensor(x), fg.tensor(y))
        got = comp_step(fg.tensor(x), fg.tensor(y))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)
    for (name, p), q in zip(comp.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), rtol=1e-8, atol=1e-10, err_msg=name
        )
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-8, atol=1e-10)
    assert not compiler.counters.step_breaks, compiler.counters.step_breaks
    assert compiler.counters.step_captures == 1, compiler.counters
    assert compiler.counters.step_runs == len(batches) - 2, compiler.counters


def _batches(shape: tuple, out: tuple, count: int = 5) -> list:
    rng = np.random.default_rng(1)
    return [(rng.standard_normal(shape), rng.standard_normal(out)) for _ in range(count)]


@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
def test_recurrent_step_compiles_and_matches_eager(cls: str) -> None:
    _train_both(
        lambda: _Recurrent(getattr(nn, cls)),
        _batches((4, 6, 3), (4, 1)),
        lambda params: fg.optim.Adam(params, lr=1e-2),
    )
