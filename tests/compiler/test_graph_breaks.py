"""Graph breaks split a compiled function (``compiler.breaks``): the statements before the one
that reads a tensor's value are one compiled part, that statement runs as written, and the
statements after it are another compiled part -- with eager's values, parameters and Python
side effects; tensors made from data written in the source are constants, not breaks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import compiler, nn

pytestmark = pytest.mark.usefixtures("fresh_compiler")

TOTAL = 0.0  # what the training steps below accumulate (a global, as scripts do)


def _model(seed: int = 0) -> nn.Module:
    fg.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(4, 8, dtype=fg.float64), nn.Tanh(), nn.Linear(8, 2, dtype=fg.float64)
    )


def _batches(n: int, seed: int = 1) -> list:
    rng = np.random.default_rng(seed)
    return [
        (fg.tensor(rng.standard_normal((6, 4))), fg.tensor(rng.standard_normal((6, 2))))
        for _ in range(n)
    ]


def _params(m: nn.Module) -> list:
    return [p.detach().numpy().copy() for p in m.parameters()]


def _same_params(a: nn.Module, b: nn.Module) -> None:
    for p, q in zip(_params(a), _params(b)):
        np.testing.assert_allclose(p, q, rtol=1e-12, atol=1e-14)


def _accumulating_step(model: nn.Module, opt: Any) -> Any:
    def step(x: fg.Tensor, y: fg.Tensor) -> None:
        global TOTAL
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        TOTAL += loss.item()

    return step


def test_a_value_read_after_the_optimizer_step_costs_no_break_inside_the_step() -> None:
    global TOTAL
    totals = []
    models = []
    for compiled in (False, True):
        TOTAL = 0.0
        model = _model()
        opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        step = _accumulating_step(model, opt)
        fn = fg.compile(step) if compiled else step
        for x, y in _batches(6):
            assert fn(x, y) is None
        totals.append(TOTAL)
        models.append(model)
    np.testing.assert_allclose(totals[1], totals[0], rtol=1e-12)
    _same_params(models[1], models[0])
    (reason,) = compiler.counters.step_breaks
    assert reason.startswith("graph break at line") and "item()" in reason
    assert "run as written" in reason and "test_graph_breaks.py" in reason
    # the step before the read: recorded once (the first call made the optimizer's state,
    # the second broke, the third recorded the part), replayed from then on
    assert compiler.counters.step_captures == 1
    assert compiler.counters.step_runs == 3


def test_parts_on_both_sides_of_a_break_are_compiled_and_hand_values_on() -> None:
    def fn(x: fg.Tensor, w: fg.Tensor) -> Any:
        h = (x @ w).tanh()
        scale = 2.0 if bool((h.sum() > 0).item()) else -1.0  # a Python decision on a value
        out = (h * scale).exp().sum(1)
        return out, scale

    compiled = fg.compile(fn)
    rng = np.random.default_rng(0)
    w = fg.tensor(rng.standard_normal((3, 5)))
    for k in range(6):
        x = fg.tensor(rng.standard_normal((4, 3)) * (1 if k % 2 else -1))
        want, want_scale = fn(x, w)
        got, got_scale = compiled(x, w)
        assert got_scale == want_scale
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    (reason,) = compiler.counters.step_breaks
    assert "split into lines" in reason and "compiled" in reason
    split = compiled.split_at
    assert [c for _, c, _ in split.parts] == [True, False, True]
    # each compiled part replays; the last one once per value of ``scale`` it was handed
    assert compiler.counters.step_runs >= 6


def test_a_helper_making_a_tensor_from_written_data_does_not_break() -> None:
    def normalise(b: fg.Tensor) -> fg.Tensor:
        mean = b.new_tensor([0.5, -0.25, 0.125, 2.0])
        return (b - mean) / fg.tensor([1.5, 2.0, 0.5, 1.0], dtype=fg.float64)

    def make(model: nn.Module, opt: Any) -> Any:
        def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(normalise(x)), y)
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    runs = []
    for compiled in (False, True):
        model = _model()
        opt = fg.optim.Adam(model.parameters(), lr=0.01)
        fn = make(model, opt)
        fn = fg.compile(fn) if compiled else fn
        runs.append(([fn(x, y).item() for x, y in _batches(5)], model))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-12)
    _same_params(runs[1][1], runs[0][1])
    assert compiler.counters.step_breaks == {}
    assert compiler.counters.step_runs == 3


def test_data_computed_in_python_is_not_a_constant() -> None:
    """``new_tensor`` of a computed list changes between calls: never replayed as a constant."""

    def fn(x: fg.Tensor, n: int) -> fg.Tensor:
        offsets = [float(k * n) for k in range(3)]
        return (x + x.new_tensor(offsets)).sum()

    compiled = fg.compile(fn)
    x = fg.ones(2, 3, dtype=fg.float64)
    for n in (1, 2, 3, 1, 2, 3):
        assert compiled(x, n).item() == fn(x, n).item()


def test_a_break_in_a_function_that_cannot_be_cut_says_why() -> None:
    def fn(x: fg.Tensor) -> fg.Tensor:
        y = x.exp()
        if y.sum().item() > 1e9:
            return y  # a return before the end: not cut
        return (y * 2).sum()

    compiled = fg.compile(fn)
    x = fg.ones(3, dtype=fg.float64)
    for _ in range(3):
        np.testing.assert_allclose(compiled(x).numpy(), fn(x).numpy())
    (reason,) = compiler.counters.step_breaks
    assert "not split: a return at line" in reason
    assert compiled.split_at is None


def test_fullgraph_still_raises_at_a_break() -> None:
    model = _model()
    opt = fg.optim.SGD(model.parameters(), lr=0.1)
    compiled = fg.compile(_accumulating_step(model, opt), fullgraph=True)
    x, y = _batches(1)[0]
    with pytest.raises(compiler.CompilationError, match=r"item\(\)"):
        compiled(x, y)


def test_closures_globals_and_a_method_split_correctly() -> None:
    counter = {"n": 0}
    scale = fg.tensor([3.0], dtype=fg.float64)

    class Runner:
        def __init__(self) -> None:
            self.seen: list = []

        @fg.compile
        def run(self, x: fg.Tensor) -> fg.Tensor:
            y = (x * scale).sum()
            self.seen.append(y.item())  # the read: a Python side effect on self
            counter["n"] += 1
            return y * 2

    r = Runner()
    xs = [fg.tensor(np.arange(3.0) + k) for k in range(5)]
    got = [r.run(x).item() for x in xs]
    want = [float((np.arange(3.0) + k).sum() * 3 * 2) for k in range(5)]
    assert got == want
    assert r.seen == [w / 2 for w in want] and counter["n"] == 5


def test_explain_names_the_break_and_the_parts() -> None:
    model = _model()
    opt = fg.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batches(1)[0]
    report = str(compiler.explain(_accumulating_step(model, opt), x, y))
    assert "whole step: graph break at line" in report
    assert "TOTAL += loss.item()" in report and "split into lines" in report


def test_a_python_value_computed_before_the_break_is_never_replayed_stale() -> None:
    """A compiled part that hands on a Python value it computed (a counter, a clock) runs as
    written from its first call on: a replay would hand on the recording's value."""
    import itertools

    ticks = itertools.count(1)

    def fn(x: fg.Tensor) -> fg.Tensor:
        y = x * 2.0
        stamp = next(ticks)  # Python state no guard watches
        if y.sum().item() > 1e9:
            y = y * 0.0
        return y * stamp

    compiled = fg.compile(fn)
    x = fg.ones(3, dtype=fg.float64)
    got = [compiled(x).numpy()[0] for _ in range(5)]
    assert got == [2.0 * k for k in range(1, 6)]
    assert "hand on the Python value 'stamp'" in compiled.split_at.reason


def test_a_wrapper_and_zero_argument_super_are_not_cut() -> None:
    import functools

    def logged(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            calls.append(1)
            return fn(*args)

        return wrapper

    calls: list = []

    @logged
    def inner(x: fg.Tensor) -> fg.Tensor:
        y = x * 2.0
        if y.sum().item() > 0:
            y = y + 1.0
        return y

    compiled = fg.compile(inner)  # (``inner`` is the wrapper: its source is not the code)
    x = fg.ones(2, dtype=fg.float64)
    for _ in range(3):
        np.testing.assert_allclose(compiled(x).numpy(), [3.0, 3.0])
    assert len(calls) == 3 and compiled.split_at is None
    (reason,) = compiler.counters.step_breaks
    assert "not split: its source is not the code that runs" in reason

    class Base:
        def scale(self) -> float:
            return 3.0

    class Child(Base):
        @fg.compile
        def run(self, x: fg.Tensor) -> fg.Tensor:
            y = x * super().scale()
            if y.sum().item() > 0:
                y = y * 2.0
            return y

    c = Child()
    for _ in range(3):
        np.testing.assert_allclose(c.run(x).numpy(), [6.0, 6.0])
    assert Child.run.split_at is None


def _checked_step(model: nn.Module, opt: Any, flagged: list) -> Any:
    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        if loss.item() > 1e6:  # the break: a Python decision on the loss's value
            flagged.append(loss.item())
        loss.backward()
        opt.step()
        return loss

    return step


def test_a_break_between_the_forward_and_its_backward_compiles_the_forward_as_a_module() -> None:
    """``if loss.item() > ...`` between the loss and ``loss.backward()``: the part before the
    break hands on a loss that the part after differentiates, so it runs compiled as a module
    (its forward replayed as a program, its backward a second program that the backward after
    the break runs), as PyTorch's AOTAutograd compiles the graph before such a break.  Losses
    and parameters are eager's."""
    losses, models = [], []
    for compiled in (False, True):
        model = _model()
        opt = fg.optim.Adam(model.parameters(), lr=0.01)
        flagged: list = []
        step = _checked_step(model, opt, flagged)
        fn = fg.compile(step) if compiled else step
        losses.append([float(fn(x, y)) for x, y in _batches(6)])
        models.append(model)
        assert not flagged
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-12)
    _same_params(models[1], models[0])
    compiled_split = fn.split_at
    assert compiled_split is not None and compiled_split.parts[0][1] is True
    first = compiled_split.parts[0][2]
    assert first._module_form is not None  # the forward part: compiled as a module
    (entry,) = [e for e in first._module_form._aot.values() if type(e).__name__ == "AOTEntry"]
    assert entry.backward_graph is not None
    # call 1 makes Adam's state, call 2 breaks, call 3 records the forward part (it hands on
    # the loss) and breaks the rest at the backward, call 4 records the forward part as a
    # module and the optimizer's part; calls 5 and 6 replay both
    assert compiler.counters.step_runs == 4
