"""The fused recurrent kernels (``rnn_sequence`` and its backward, externs in compiled
programs) under the three front ends: a whole training step of an LSTM language model
(``compile(step)``), a compiled backward (``compiled_autograd()``) and a compiled module
(``compile(model)``) give eager's values and gradients, with the captures and replays counted.
(Compiles run in the foreground: tests/conftest.py sets FUSEGRAD_BACKGROUND_COMPILE=0.)"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn

pytestmark = pytest.mark.usefixtures("fresh_compiler")


class _LanguageModel(nn.Module):
    """The word-language-model example's shape, small: embedding, a 2-layer LSTM (or GRU) with
    dropout between the layers, a linear decoder."""

    def __init__(self, cls: str) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.rnn = getattr(nn, cls)(6, 8, num_layers=2, dropout=0.3)
        self.decoder = nn.Linear(8, 11)

    def forward(self, tokens: fg.Tensor, hidden: object) -> tuple:
        out, hidden = self.rnn(self.embed(tokens), hidden)
        return self.decoder(out), hidden


def _squared_output_grads(model: fg.nn.Module, x: np.ndarray, compiled: bool) -> list:
    """The input's and parameters' gradients of the sum of squares of ``model``'s output, the
    backward under ``compiled_autograd()`` or eager."""
    model.zero_grad()
    xt = fg.tensor(x, requires_grad=True)
    out, _ = model(xt)
    loss = (out * out).sum()
    if compiled:
        with compiler.compiled_autograd():
            loss.backward()
    else:
        loss.backward()
    return [xt.grad.numpy()] + [p.grad.numpy().copy() for p in model.parameters()]


def _tokens(count: int, steps: int = 7) -> list:
    rng = np.random.default_rng(4)
    return [rng.integers(0, 11, (steps + 1, 3)) for _ in range(count)]


@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
def test_language_model_step_compiles_and_matches_eager(cls: str) -> None:
    """Truncated BPTT with the hidden state detached between steps, gradient clipping and SGD,
    as the word-language-model example trains: equal losses, parameters and (clipped)
    gradients; later steps replay one recording."""
    fg.manual_seed(0)
    eager = _LanguageModel(cls).double()
    comp = copy.deepcopy(eager)

    def make_step(model: nn.Module) -> Callable:
        opt = fg.optim.SGD(model.parameters(), lr=0.5)

        def step(tokens: fg.Tensor, hidden: object) -> tuple:
            opt.zero_grad()
            logits, hidden = model(tokens[:-1], hidden)
            loss = nn.functional.cross_entropy(logits.reshape(-1, 11), tokens[1:].reshape(-1))
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()
            return loss.detach(), hidden

        return step

    def detach(hidden: object) -> object:
        if isinstance(hidden, tuple):
            return tuple(h.detach() for h in hidden)
        return hidden.detach()

    batches = _tokens(5)
    losses = []
    for step in (make_step(eager), fg.compile(make_step(comp))):
        fg.manual_seed(1)  # the same dropout draws in both runs
        hidden = None
        run = []
        for tokens in batches:
            loss, hidden = step(fg.tensor(tokens), hidden)
            hidden = detach(hidden)
            run.append(loss.item())
        losses.append(run)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-9, atol=1e-12)
    for (name, p), q in zip(comp.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), rtol=1e-8, atol=1e-10, err_msg=name
        )
        np.testing.assert_allclose(
            p.grad.numpy(), q.grad.numpy(), rtol=1e-8, atol=1e-10, err_msg=name
        )
    counters = compiler.counters
    assert not counters.step_breaks, counters.step_breaks
    assert counters.step_runs >= 2, counters  # replays (the first calls record: no hidden)


@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN"])
def test_compiled_backward_matches_eager(cls: str) -> None:
    """``compiled_autograd()``: a bidirectional 2-layer module's backward (the backward kernel
    as an extern) gives eager's gradients, captured once and then replayed."""
    fg.manual_seed(0)
    model = getattr(nn, cls)(3, 4, num_layers=2, bidirectional=True, batch_first=True)
    x = np.random.default_rng(1).standard_normal((2, 5, 3)).astype(np.float32)

    def grads(compiled: bool) -> list:
        return _squared_output_grads(model, x, compiled)

    want = grads(False)
    for _ in range(3):
        got = grads(True)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert compiler.counters.captures == 1, compiler.counters
    assert compiler.counters.compiled_runs == 3, compiler.counters
    assert not compiler.counters.fallbacks, compiler.counters


def test_compiled_module_matches_eager() -> None:
    """``compile(model)`` of an LSTM: the forward program and the backward program (the
    kernels as externs) give eager's outputs and gradients."""
    fg.manual_seed(0)
    eager = nn.LSTM(3, 4, num_layers=2, bidirectional=True).double()
    comp = fg.compile(copy.deepcopy(eager))
    rng = np.random.default_rng(2)
    for _ in range(3):
        x = rng.standard_normal((5, 2, 3))
        results = []
        for model in (eager, comp):
            model.zero_grad()
            out, (h, c) = model(fg.tensor(x))
            ((out**2).sum() + (h * c).sum()).backward()
            results.append([out.detach().numpy()] + [p.grad.numpy() for p in model.parameters()])
        for a, b in zip(*results):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert not compiler.counters.fallbacks, compiler.counters


def test_compiled_backward_of_a_packed_sequence_matches_eager() -> None:
    """Packed input (the kernels on the packed rows, ``batch_sizes`` an attribute): the
    compiled backward equals eager's, for two sets of lengths."""
    from fusegrad.nn.utils import rnn as R

    fg.manual_seed(0)
    model = nn.LSTM(3, 4, num_layers=2, bidirectional=True).double()
    rng = np.random.default_rng(3)
    for lengths in ([5, 2, 4], [3, 3, 1]):
        data = rng.standard_normal((5, 3, 3))
        results = []
        for compiled in (False, True):
            model.zero_grad()
            x = fg.tensor(data, requires_grad=True)
            out, (h, c) = model(R.pack_padded_sequence(x, lengths, enforce_sorted=False))
            loss = (out.data**2).sum() + (h * c).sum()
            if compiled:
                with compiler.compiled_autograd():
                    loss.backward()
            else:
                loss.backward()
            results.append([x.grad.numpy()] + [p.grad.numpy().copy() for p in model.parameters()])
        for a, b in zip(*results):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert compiler.counters.compiled_runs == 2, compiler.counters


def test_layer_output_is_read_in_place(caplog: pytest.LogCaptureFixture) -> None:
    """The layer's output h is a contiguous block of the primitive's flat result (eager), so a
    compiled module whose dropout and next layer read it makes no copy of it (the ``perf``
    log's copies of the forward and backward programs, their kernels generated code)."""
    import logging

    fg.manual_seed(0)
    model = _LanguageModel("LSTM")
    out, _ = model.rnn(model.embed(fg.tensor(_tokens(1)[0])))
    assert out.is_contiguous() and out._base is not None  # (a view of the result, no copy)
    comp = fg.compile(model)
    compiler.set_logs("perf")
    previous = compiler.config.interpreter_max_elements
    compiler.config.interpreter_max_elements = 0  # every kernel generated code (flat loops)
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            for tokens in _tokens(3):
                logits, _ = comp(fg.tensor(tokens), None)
                logits.square().sum().backward()
    finally:
        compiler.set_logs(None)
        compiler.config.interpreter_max_elements = previous
    copies = [r.getMessage() for r in caplog.records if "copies" in r.getMessage()]
    assert copies, [r.getMessage() for r in caplog.records]
    assert not [c for c in copies if "reads a copy" in c], copies
    assert not compiler.counters.fallbacks, compiler.counters


@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN"])
def test_compiled_backward_is_symbolic_in_sequence_length_and_batch(cls: str) -> None:
    """One capture serves other sequence lengths and batch sizes: the backward primitive takes
    the parts of the flat result and of its gradient as (rows, ...) views, so no size is
    specialised (the gradients equal eager's at each size)."""
    fg.manual_seed(0)
    model = getattr(nn, cls)(3, 4, num_layers=2).double()
    rng = np.random.default_rng(5)
    for steps, batch in ((5, 2), (7, 6), (9, 8)):
        x = rng.standard_normal((steps, batch, 3))
        results = []
        for compiled in (False, True):
            results.append(_squared_output_grads(model, x, compiled))
        for a, b in zip(*results):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert compiler.counters.captures == 1, compiler.counters
    assert compiler.counters.compiled_runs == 3, compiler.counters
