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
    # the sizes recorded replay the merged program too: one program built for every size
    assert compiler.counters.builds == 1
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
        n = x.shape[0]
        rows = x[: n * n // 7]  # no c * n + d, nor a division of n by an integer
        loss = (rows @ w).square().sum()
        loss.backward()
        return loss.detach()

    compiled = fg.compile(fn)
    compiler.set_logs("recompiles")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            # (4, 6) give (2, 5): no expression; (4, 5) give (2, 3), (6, 5) give (5, 3): the
            # expressions n - 2 and 2 * n - 7, each of which the third recording refutes
            for n in (4, 6, 5):
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
    assert "sizes stay concrete" in caplog.text and "nor an integer division" in caplog.text
    assert "the merged program is not every recording" in caplog.text
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
        loss = (x[: x.shape[0] ** 2 // 7] @ w).sum()  # (no expression of the size: above)
        loss.backward()
        return loss.detach()

    strict = fg.compile(halves)
    for n in (4, 4):
        strict(fg.tensor(np.ones((n, 6))))
    x = fg.tensor(np.ones((6, 6)))
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


# ---- sizes that also size constants, divisions of sizes, sizes of 1 ---------------------------


def _gpt_step(block: int = 16) -> tuple[nn.Module, Any]:
    fg.manual_seed(0)
    model = models.make(fg, "gpt", vocab=17, width=16, heads=2, block=block).double()
    opt = fg.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = models.loss(fg, model, x, y)
        loss.backward()
        opt.step()
        return loss.detach()

    return model, step


def _same_grads(a: nn.Module, b: nn.Module) -> None:
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_a_gpt_over_eight_sequence_lengths_and_batch_sizes_takes_two_recordings(
    caplog: Any,
) -> None:
    # the positions ``arange(T)`` and the causal mask's slice ``mask[:, :, :T, :T]`` follow the
    # sequence length: the merged step makes the positions at the call's length
    eager_model, eager = _gpt_step()
    model, step = _gpt_step()
    compiled = fg.compile(step)
    rng = np.random.default_rng(6)
    shapes = [(3, 5), (3, 5), (4, 8), (2, 6), (5, 12), (3, 16), (2, 3), (4, 9), (6, 7), (2, 11)]
    shapes += [(3, 8), (5, 5)]
    assert len({t for _, t in shapes}) == 9 and len({b for b, _ in shapes}) == 5
    compiler.set_logs("recompiles")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            for k, (b, t) in enumerate(shapes):
                x, y = rng.integers(0, 17, (b, t)), rng.integers(0, 17, (b, t))
                fg.manual_seed(k)  # (dropout: eager's masks at every size)
                want = eager(fg.tensor(x), fg.tensor(y)).item()
                fg.manual_seed(k)
                got = compiled(fg.tensor(x), fg.tensor(y)).item()
                assert got == pytest.approx(want, rel=1e-9)
                _same_grads(model, eager_model)
    finally:
        compiler.set_logs(None)
    _same_params(model, eager_model, rtol=1e-8)
    assert compiled.recordings == 2 and len(compiled.dynamics) == 1
    assert compiler.counters.builds == 1  # (the recorded shapes (3, 5), (4, 8) replay it too)
    assert "s1 = argument 0 dim 1 = argument 1 dim 1" in caplog.text
    graph = compiled.dynamics[0].step.graph
    assert "cumsum" in {v.op for v in graph.values}  # the positions, made at the call's length
    # past the mask buffer's 16 rows the slice would be clamped: not served (eager's error)
    x = fg.tensor(rng.integers(0, 17, (2, 20)))
    with pytest.raises(IndexError):
        eager(x, x)
    with pytest.raises(IndexError):
        compiled(x, x)
    assert "slices past the end" in compiled.dynamics[0].why_not([x, x])


def test_a_compiled_gpt_module_over_sequence_lengths_takes_two_recordings() -> None:
    fg.manual_seed(0)
    eager = models.make(fg, "gpt", vocab=17, width=16, heads=2, block=16, dropout=0.0).double()
    net = models.make(fg, "gpt", vocab=17, width=16, heads=2, block=16, dropout=0.0).double()
    net.load_state_dict(eager.state_dict())
    cm = fg.compile(net)
    rng = np.random.default_rng(7)
    built = 0
    for k, (b, t) in enumerate([(2, 4), (3, 7), (2, 9), (4, 5), (3, 12), (2, 16), (5, 6), (2, 10)]):
        if k == 2:  # (each recorded call ran its own backward program)
            built = compiler.counters.builds
        x, y = fg.tensor(rng.integers(0, 17, (b, t))), fg.tensor(rng.integers(0, 17, (b, t)))
        losses = []
        for m in (eager, cm):
            m.zero_grad()
            loss = models.loss(fg, m, x, y)
            loss.backward()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-10)
        _same_grads(net, eager)
    assert cm._aot.recordings == 2 and len(cm._dynamics) == 1
    # the recorded sizes replay the merged programs too: one forward and one backward program
    x = fg.tensor(rng.integers(0, 17, (2, 4)))
    cm.zero_grad()
    models.loss(fg, cm, x, x).backward()
    assert compiler.counters.builds - built == 2


class _CausalAttention(nn.Module):
    """Causal self-attention whose masks and positions are made inside, at each length."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24, dtype=fg.float64)
        self.out = nn.Linear(8, 5, dtype=fg.float64)

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        b, t, c = x.shape
        position = fg.arange(1, t + 1, dtype=fg.float64) * 0.25  # (a float arange)
        x = x + position.view(1, t, 1)
        q, k, v = self.qkv(x).split(c, dim=2)
        att = q @ k.transpose(-2, -1) / c**0.5
        att = att + nn.Transformer.generate_square_subsequent_mask(t, dtype=fg.float64)
        att = att.softmax(-1)
        keep = fg.ones(t, t, dtype=fg.bool).tril(-1)  # a second band: strictly below
        att = att + att.masked_fill(~keep, 0.0) * 0.5
        att = att + fg.eye(t, dtype=fg.float64) * 0.1
        far = fg.ones(t, t, dtype=fg.float64).triu(9)  # all zero at t <= 9, not beyond
        return self.out((att + far) @ v)


def test_a_causal_mask_transformer_makes_its_masks_at_every_length() -> None:
    fg.manual_seed(1)
    eager = _CausalAttention()
    net = _CausalAttention()
    net.load_state_dict(eager.state_dict())

    def make_step(m: nn.Module) -> Any:
        def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
            m.zero_grad()
            loss = nn.functional.cross_entropy(m(x).reshape(-1, 5), y.reshape(-1))
            loss.backward()
            return loss.detach()

        return step

    eager_step, compiled = make_step(eager), fg.compile(make_step(net))
    rng = np.random.default_rng(8)
    for b, t in [(2, 4), (3, 6), (2, 5), (4, 9), (3, 3), (2, 13), (5, 8), (2, 11), (3, 15)]:
        x = rng.standard_normal((b, t, 8))
        y = rng.integers(0, 5, (b, t))
        want = eager_step(fg.tensor(x), fg.tensor(y)).item()
        got = compiled(fg.tensor(x), fg.tensor(y)).item()
        assert got == pytest.approx(want, rel=1e-11)
        _same_grads(net, eager)
    assert compiled.recordings == 2 and len(compiled.dynamics) == 1
    # no constant of the merged step has the length's size: every mask is made per call
    graph = compiled.dynamics[0].step.graph
    assert all(c.ndim < 2 for c in graph.constants)


def test_a_division_of_a_size_is_a_symbol_of_its_own(caplog: Any) -> None:
    w = fg.randn(6, 3, dtype=fg.float64, requires_grad=True)

    def halves(x: fg.Tensor) -> fg.Tensor:
        n = x.shape[0]
        loss = (x[: n // 2] @ w).square().sum() + (x[n // 2 :] @ w).sum()
        loss.backward()
        return loss.detach()

    def first_half(x: fg.Tensor) -> fg.Tensor:
        loss = (x[: x.shape[0] // 2] @ w).square().sum()
        loss.backward()
        return loss.detach()

    def check(fn: Any, compiled: Any, n: int) -> None:
        x = fg.tensor(np.random.default_rng(n).standard_normal((n, 6)))
        w.grad = None
        got = compiled(x).item()
        grad = w.grad.numpy().copy()
        w.grad = None
        assert got == pytest.approx(fn(x).item(), rel=1e-12)
        np.testing.assert_allclose(grad, w.grad.numpy(), rtol=1e-12)

    # n // 2 at sizes 5 and 8: one division fits, and serves every size
    compiled = fg.compile(first_half)
    for n in (5, 8, 4, 7, 6, 9, 12, 11):
        check(first_half, compiled, n)
    assert compiled.recordings == 2 and len(compiled.dynamics) == 1
    assert compiled.dynamics[0].describe() == "s0 = argument 0 dim 0, s1 = s0 // 2"

    # at two even sizes n // 2 and ceil(n / 2) agree (and the halves are equal): the merged
    # step serves even sizes, an odd one is recorded with the reason
    compiled = fg.compile(halves)
    compiler.set_logs("recompiles")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            for n in (4, 8, 6, 10, 12, 7):
                check(halves, compiled, n)
    finally:
        compiler.set_logs(None)
    assert compiled.recordings == 3 and len(compiled.dynamics) == 1
    assert "s1 = s0 // 2 (for s0 = 0 modulo 2)" in caplog.text
    assert "s0 = 7 is not 0 modulo 2" in caplog.text


def test_a_size_of_one_is_recorded_alone_and_does_not_stop_merging(caplog: Any) -> None:
    eager_model, eager = _mlp_step()
    model, step = _mlp_step()
    compiled = fg.compile(step)
    rng = np.random.default_rng(9)
    compiler.set_logs("recompiles")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            for n in (4, 1, 6, 1, 9, 3, 1, 7):
                x, y = rng.standard_normal((n, 6)), rng.integers(0, 3, n)
                want = eager(fg.tensor(x), fg.tensor(y)).item()
                got = compiled(fg.tensor(x), fg.tensor(y)).item()
                assert got == pytest.approx(want, rel=1e-12)
    finally:
        compiler.set_logs(None)
    _same_params(model, eager_model)
    # 4 (after the optimizer's first step, eager), 1 on its own, 6 merged with 4, not with 1
    assert compiled.recordings == 3 and len(compiled.dynamics) == 1
    assert "sizes 0 and 1 are specialised" in caplog.text
    assert "sizes became symbolic (s0 = argument 0 dim 0 = argument 1 dim 0)" in caplog.text
    # a size of 1 after the merge: the log says why the merged recording does not serve it
    compiled2 = fg.compile(_mlp_step()[1])
    with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
        compiler.set_logs("recompiles")
        try:
            for n in (4, 4, 6, 1):
                compiled2(fg.tensor(rng.standard_normal((n, 6))), fg.tensor(rng.integers(0, 3, n)))
        finally:
            compiler.set_logs(None)
    assert "does not serve it: argument 0 dim 0 is 1: sizes 0 and 1 are specialised" in (
        caplog.text
    )


def test_values_that_differ_per_size_keep_recordings_per_size(caplog: Any) -> None:
    w = fg.randn(3, dtype=fg.float64, requires_grad=True)

    def spaced(x: fg.Tensor) -> fg.Tensor:
        # linspace's values change with the length, and it has no recipe: a constant per size
        loss = (x * fg.linspace(0.0, 1.0, x.shape[0], dtype=fg.float64)[:, None] * w).sum()
        loss.backward()
        return loss.detach()

    def shifted(x: fg.Tensor) -> fg.Tensor:
        n = x.shape[0]
        loss = (x * fg.arange(n, 2 * n, dtype=fg.float64)[:, None] * w).sum()  # start: n
        loss.backward()
        return loss.detach()

    compiler.set_logs("recompiles")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            for fn, why in (
                (spaced, "differs beyond its size"),
                (shifted, "an arange's start or step changes with the size"),
            ):
                compiled = fg.compile(fn)
                for n in (4, 6, 9, 4):
                    x = fg.tensor(np.random.default_rng(n).standard_normal((n, 3)))
                    w.grad = None
                    got = compiled(x).item()
                    grad = w.grad.numpy().copy()
                    w.grad = None
                    assert got == pytest.approx(fn(x).item(), rel=1e-12)
                    np.testing.assert_allclose(grad, w.grad.numpy(), rtol=1e-12)
                assert compiled.recordings == 3 and not compiled.dynamics
                assert why in caplog.text
    finally:
        compiler.set_logs(None)


def test_argument_shapes_follow_the_watchs_order_through_dicts_and_lists() -> None:
    """``arg_shapes(key)`` lists the tensor arguments in ``Watch.args``'s order, dict values
    and list items included (the sizes of a step over symbols are read from ``Watch.args`` by
    these positions: a dict of parameters before the batch once made a vmap(grad) step read
    the parameters' sizes)."""
    from fusegrad.compiler.dynamic import arg_shapes
    from fusegrad.compiler.recording import Watch

    params = {"w": fg.zeros(7, 5), "b": fg.zeros(7)}
    args = (params, [fg.zeros(4, 5), 3.0], fg.zeros(4))

    def fn(p: dict, xs: list, y: fg.Tensor) -> None:
        return None

    watch = Watch(fn, args, {})
    assert arg_shapes(watch.key) == [tuple(t.shape) for t in watch.args]
    assert [tuple(t.shape) for t in watch.args] == [(7, 5), (7,), (4, 5), (4,)]
