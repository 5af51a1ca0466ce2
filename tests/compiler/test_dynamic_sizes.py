"""Automatic dynamic sizes for whole steps (``compiler.dynamic``): after the second distinct
size, one recording over symbolic sizes serves every size -- with eager's losses, parameters,
dropout masks and value checks; ``mark_static`` and ``mark_dynamic``; what stays per size."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import models  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_compiler")


def _mlp_step(seed: int = 0) -> tuple[nn.Module, Any]:
    fg.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return model, step


def _same_params(a: nn.Module, b: nn.Module, rtol: float = 1e-10) -> None:
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=rtol, atol=1e-12)


def test_twenty_steps_over_eight_batch_sizes_take_two_recordings(caplog: Any) -> None:
    eager_model, eager = _mlp_step()
    model, step = _mlp_step()
    compiled = fg.compile(step)
    rng = np.random.default_rng(0)
    sizes = [8, 8, 12, 5, 9, 3, 16, 7, 12, 5, 9, 3, 16, 7, 8, 12, 2, 9, 5, 7]
    assert len(set(sizes)) == 8
    compiler.set_logs("recompiles")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            for n in sizes:
                x, y = rng.standard_normal((n, 6)), rng.integers(0, 3, n)
                want = eager(fg.tensor(x), fg.tensor(y)).item()
                got = compiled(fg.tensor(x), fg.tensor(y)).item()
                assert got == pytest.approx(want, rel=1e-12)
    finally:
        compiler.set_logs(None)
    _same_params(model, eager_model)
    assert compiled.recordings == 2 and compiler.counters.step_captures == 2
    assert compiler.counters.step_runs == len(sizes) - 3  # (state, then the two recordings)
    assert "sizes became symbolic (s0 = argument 0 dim 0 = argument 1 dim 0)" in caplog.text
    # the value checks still run at every size: a class index out of range raises eager's error
    with pytest.raises(IndexError, match="out of bounds|out of range"):
        compiled(fg.tensor(rng.standard_normal((11, 6))), fg.tensor(np.full(11, 7)))


def test_dropout_draws_eagers_masks_at_every_batch_size() -> None:
    def make() -> tuple[nn.Module, Any]:
        fg.manual_seed(0)
        model = models.make(fg, "gpt", vocab=17, width=16, heads=2, block=8).double()
        opt = fg.optim.AdamW(model.parameters(), lr=1e-3)

        def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = models.loss(fg, model, x, y)
            loss.backward()
            opt.step()
            return loss.detach()

        return model, step

    eager_model, eager = make()
    model, step = make()
    compiled = fg.compile(step)
    rng = np.random.default_rng(1)
    for n in (4, 4, 6, 3, 5, 2, 7, 4):
        x, y = rng.integers(0, 17, (n, 8)), rng.integers(0, 17, (n, 8))
        fg.manual_seed(10 + n)
        want = eager(fg.tensor(x), fg.tensor(y)).item()
        fg.manual_seed(10 + n)
        got = compiled(fg.tensor(x), fg.tensor(y)).item()
        assert got == pytest.approx(want, rel=1e-9)
    _same_params(model, eager_model, rtol=1e-7)
    assert compiled.recordings == 2 and len(compiled.dynamics) == 1


def test_shared_symbols_size_one_and_unmergeable_sizes_record_again() -> None:
    _, step = _mlp_step()
    _, eager = _mlp_step()
    compiled = fg.compile(step)
    rng = np.random.default_rng(2)

    def call(n_x: int, n_y: int) -> None:
        x, y = rng.standard_normal((n_x, 6)), rng.integers(0, 3, n_y)
        try:
            want = eager(fg.tensor(x), fg.tensor(y)).item()
        except Exception as e:  # noqa: BLE001 - eager's error, which compiled must raise too
            with pytest.raises(type(e)):
                compiled(fg.tensor(x), fg.tensor(y))
            return
        assert compiled(fg.tensor(x), fg.tensor(y)).item() == pytest.approx(want, rel=1e-12)

    for n in (4, 4, 6, 9):
        call(n, n)
    assert compiled.recordings == 2
    call(1, 1)  # a size of 1 is not a symbol's (broadcasting): recorded on its own
    assert compiled.recordings == 3
    call(9, 5)  # the batch dims share a symbol: differing now, eager's error
    assert compiled.recordings <= 4


def test_a_size_that_is_no_expression_of_the_arguments_stays_concrete(caplog: Any) -> None:
    w = fg.randn(6, 3, dtype=fg.float64, requires_grad=True)

    def fn(x: fg.Tensor) -> fg.Tensor:
        half = x[: x.shape[0] // 2]  # n // 2: not c * n + d with integers c and d
        loss = (half @ w).square().sum()
        loss.backward()
        return loss.detach()

    compiled = fg.compile(fn)
    compiler.set_logs("recompiles")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            for n in (4, 8, 6):
                x = fg.tensor(np.arange(n * 6.0).reshape(n, 6))
                w.grad = None
                got = compiled(x).item()
                grad = w.grad.numpy().copy()
                w.grad = None
                want = fn(x).item()
                assert got == pytest.approx(want, rel=1e-12)
                np.testing.assert_allclose(grad, w.grad.numpy(), rtol=1e-12)
    finally:
        compiler.set_logs(None)
    assert "sizes stay concrete" in caplog.text
    assert compiled.recordings == 3 and not compiled.dynamics


def test_mark_static_keeps_a_dim_concrete_and_mark_dynamic_raises_when_it_cannot_merge() -> None:
    _, step = _mlp_step()
    compiled = fg.compile(step)
    rng = np.random.default_rng(3)
    for n in (4, 4, 6, 9):
        x = fg.tensor(rng.standard_normal((n, 6)))
        compiler.mark_static(x, 0)
        compiled(x, fg.tensor(rng.integers(0, 3, n)))
    assert compiled.recordings == 3 and not compiled.dynamics
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        compiler.mark_dynamic(x, 2)

    w = fg.randn(6, 3, dtype=fg.float64, requires_grad=True)

    def halves(x: fg.Tensor) -> fg.Tensor:
        loss = (x[: x.shape[0] // 2] @ w).sum()
        loss.backward()
        return loss.detach()

    strict = fg.compile(halves)
    for n in (4, 4):
        strict(fg.tensor(np.ones((n, 6))))
    x = fg.tensor(np.ones((8, 6)))
    compiler.mark_dynamic(x, 0)
    with pytest.raises(compiler.CompilationError, match="marked dynamic"):
        strict(x)


def test_config_dynamic_sizes_off_records_per_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler.config, "dynamic_sizes", False)
    _, step = _mlp_step()
    compiled = fg.compile(step)
    rng = np.random.default_rng(4)
    for n in (4, 4, 6, 9):
        compiled(fg.tensor(rng.standard_normal((n, 6))), fg.tensor(rng.integers(0, 3, n)))
    assert compiled.recordings == 3 and not compiled.dynamics


class _Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8, dtype=fg.float64)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(8, 11, dtype=fg.float64)

    def forward(self, idx: fg.Tensor, targets: fg.Tensor) -> tuple:
        logits = self.head(self.drop(self.emb(idx).tanh()))
        return logits, nn.functional.cross_entropy(logits.view(-1, 11), targets.view(-1))


def test_a_compiled_module_takes_two_recordings_over_batch_sizes(caplog: Any) -> None:
    fg.manual_seed(0)
    eager = _Classifier()
    m = _Classifier()
    m.load_state_dict(eager.state_dict())
    cm = fg.compile(m)
    rng = np.random.default_rng(5)
    compiler.set_logs("recompiles")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            for n in (4, 4, 6, 3, 5, 2, 7, 4, 9):
                idx, targets = (
                    fg.tensor(rng.integers(0, 11, (n, 5))),
                    fg.tensor(rng.integers(0, 11, (n, 5))),
                )
                grads = []
                for net in (eager, cm):
                    net.zero_grad()
                    fg.manual_seed(n)
                    logits, loss = net(idx, targets)
                    (loss + logits.square().mean()).backward()
                    grads.append([p.grad.numpy().copy() for p in net.parameters()])
                for g, w in zip(*grads):
                    np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    finally:
        compiler.set_logs(None)
    assert "compile(_Classifier): sizes became symbolic" in caplog.text
    assert cm._aot.recordings == 2 and len(cm._dynamics) == 1
    assert compiler.counters.step_runs == 7
