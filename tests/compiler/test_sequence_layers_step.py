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
    losses = []
    for step in (eager_step, comp_step):
        fg.manual_seed(1)  # the same dropout draws in both runs
        losses.append([step(fg.tensor(x), fg.tensor(y)).item() for x, y in batches])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-9, atol=1e-12)
    for (name, p), q in zip(comp.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), rtol=1e-8, atol=1e-10, err_msg=name
        )
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-8, atol=1e-10)
    assert not compiler.counters.step_breaks, compiler.counters.step_breaks
    assert compiler.counters.step_captures == 1, compiler.counters
    # an optimizer with state runs its first call eagerly (a warm-up), the next is recorded,
    # every later call replays the recording
    counters = compiler.counters
    assert counters.step_runs == len(batches) - 1 - counters.step_warmups, counters


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


class _Encoder(nn.Module):
    """A sequence classifier: a TransformerEncoderLayer with a causal mask and a padding mask,
    mean-pooled, then a linear head."""

    def __init__(self, norm_first: bool) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first, activation="gelu"
        )
        self.head = nn.Linear(8, 1)
        padding = np.zeros((4, 6), dtype=bool)
        padding[1, 4:] = True
        # buffers, so that the whole-step compile knows where they come from
        self.register_buffer("padding", fg.tensor(padding))
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(6))

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        h = self.layer(x, src_mask=self.mask, src_key_padding_mask=self.padding)
        return self.head(h.mean(1))


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer_step_compiles_and_matches_eager(norm_first: bool) -> None:
    _train_both(
        lambda: _Encoder(norm_first),
        _batches((4, 6, 8), (4, 1)),
        lambda params: fg.optim.AdamW(params, lr=1e-2),
    )


def test_multihead_attention_with_weights_and_dropout_step_matches_eager() -> None:
    """need_weights=True (the plain-softmax path) with attention dropout: the random draws are
    replayed as eager draws them."""

    class Attend(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 4, dropout=0.3, kdim=5, vdim=3)
            self.head = nn.Linear(8, 1)

        def forward(self, x: fg.Tensor) -> fg.Tensor:
            out, weights = self.attn(x[..., :8], x[..., 8:13], x[..., 13:16])
            return self.head(out.mean(0)) + (weights**2).sum((1, 2)).unsqueeze(-1)

    _train_both(Attend, _batches((6, 4, 16), (4, 1)), lambda p: fg.optim.SGD(p, lr=0.01))


def test_packed_sequence_step_equals_eager_with_a_logged_fall_back() -> None:
    """Packing reads the lengths on the host (its permutation is a tensor made from them), so
    a whole step falls back with a logged reason (the backward still compiles); the results
    equal eager's, also when the lengths change."""
    from fusegrad.nn.utils import rnn as R

    class Packed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.GRU(3, 5, 2, bidirectional=True)
            self.head = nn.Linear(10, 1)

        def forward(self, x: fg.Tensor, lengths: list) -> fg.Tensor:
            out, h = self.rnn(R.pack_padded_sequence(x, lengths, enforce_sorted=False))
            padded, _ = R.pad_packed_sequence(out)
            return self.head(padded.sum(0)) + h.sum()

    fg.manual_seed(0)
    eager = Packed().double()
    comp = copy.deepcopy(eager)

    def make_step(model: nn.Module) -> Callable:
        opt = fg.optim.Adam(model.parameters(), lr=1e-2)

        def step(x: fg.Tensor, y: fg.Tensor, lengths: list) -> fg.Tensor:
            opt.zero_grad()
            loss = ((model(x, lengths) - y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    eager_step, comp_step = make_step(eager), fg.compile(make_step(comp))
    rng = np.random.default_rng(0)
    for lengths in ([3, 5, 1, 4], [3, 5, 1, 4], [3, 5, 1, 4], [2, 2, 5, 1]):
        x, y = rng.standard_normal((5, 4, 3)), rng.standard_normal((4, 1))
        want = eager_step(fg.tensor(x), fg.tensor(y), lengths)
        got = comp_step(fg.tensor(x), fg.tensor(y), lengths)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)
    for p, q in zip(comp.parameters(), eager.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-8, atol=1e-10)
    # the lengths' tensor breaks the recording; the function is split at the forward's
    # statement (``compiler.breaks``), and the backward after it, whose loss comes from there,
    # is split off too
    for reason in compiler.counters.step_breaks:
        assert "int64 tensor" in reason or reason.startswith("graph break at line"), reason
