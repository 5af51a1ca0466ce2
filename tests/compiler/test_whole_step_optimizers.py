"""Whole-step compile with the elementwise optimizers (RMSprop, Adagrad, Adadelta, Adamax,
NAdam): their update is recorded into the step's program once, with every option a runtime
input, so a schedule changing lr (and the other options) every call neither recompiles nor
drifts from eager; LBFGS (a closure that reads values) stops the recording with its reason and
runs eagerly, giving eager's result."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn

pytestmark = pytest.mark.usefixtures("fresh_compiler")

STEPS = 10

# (optimizer, constructor options, the options changed before every call: name -> value(i))
CASES = [
    ("RMSprop", {"lr": 0.01}, {"alpha": lambda i: 0.9 + 0.005 * i}),
    (
        "RMSprop",
        {"lr": 0.01, "momentum": 0.9, "centered": True, "weight_decay": 0.1},
        {"momentum": lambda i: 0.5 + 0.04 * i, "eps": lambda i: 1e-8 * (i + 1)},
    ),
    ("RMSprop", {"lr": 0.01, "maximize": True}, {"weight_decay": lambda i: 0.01 * (i + 1)}),
    (
        "Adagrad",
        {"lr": 0.1, "lr_decay": 0.05, "initial_accumulator_value": 0.1},
        {"lr_decay": lambda i: 0.01 * i, "eps": lambda i: 1e-10 * (i + 1)},
    ),
    ("Adagrad", {"lr": 0.1, "weight_decay": 0.1, "maximize": True}, {}),
    ("Adadelta", {"lr": 1.0}, {"rho": lambda i: 0.8 + 0.01 * i}),
    ("Adadelta", {"lr": 0.5, "weight_decay": 0.1}, {"eps": lambda i: 1e-6 * (i + 1)}),
    ("Adamax", {"lr": 0.01}, {"betas": lambda i: (0.8 + 0.01 * i, 0.99 - 0.001 * i)}),
    ("Adamax", {"lr": 0.01, "weight_decay": 0.1, "maximize": True}, {}),
    (
        "NAdam",
        {"lr": 0.01},
        {"betas": lambda i: (0.8 + 0.01 * i, 0.99), "momentum_decay": lambda i: 4e-3 * (i + 1)},
    ),
    ("NAdam", {"lr": 0.01, "weight_decay": 0.1}, {}),
    ("NAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}, {}),
    ("Rprop", {"lr": 0.01, "etas": (0.4, 1.3)}, {}),
    # not recorded (its branch depends on the step count): replayed as a call, eager's values
    ("RAdam", {"lr": 0.01, "weight_decay": 0.1}, {"betas": lambda i: (0.8 + 0.01 * i, 0.99)}),
    ("ASGD", {"lr": 0.01, "t0": 3}, {}),
]
IDS = [f"{name}-{i}" for i, (name, _, _) in enumerate(CASES)]


def _train(name: str, options: dict, schedule: dict, dtype: Any, compiled: bool) -> tuple:
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(dtype)
    opt = getattr(fg.optim, name)(model.parameters(), **options)

    def step(x: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = model(x).square().sum()
        loss.backward()
        opt.step()
        return loss.detach()

    fn = fg.compile(step) if compiled else step
    x = fg.tensor(np.arange(15.0).reshape(5, 3) / 9 - 0.5, dtype=dtype)
    losses = []
    for i in range(STEPS):
        group = opt.param_groups[0]
        group["lr"] = options["lr"] * (1 - i / (2 * STEPS))  # a schedule: lr changes every call
        for key, value in schedule.items():
            group[key] = value(i)
        losses.append(float(fn(x)))
    return [p.detach().numpy().copy() for p in model.parameters()], losses, opt


@pytest.mark.parametrize("dtype", [fg.float64, fg.float32])
@pytest.mark.parametrize("name,options,schedule", CASES, ids=IDS)
def test_ten_steps_equal_eager_with_one_recording(
    name: str, options: dict, schedule: dict, dtype: Any
) -> None:
    want, want_losses, _ = _train(name, options, schedule, dtype, False)
    compiler.reset()
    got, got_losses, opt = _train(name, options, schedule, dtype, True)
    # the first call makes the optimizer's state eagerly (Adagrad's exists from construction,
    # so its first call is already recorded); one recording serves every later call
    warmups = 0 if name == "Adagrad" else 1
    assert compiler.counters.step_warmups == warmups, compiler.counters
    assert compiler.counters.step_captures == 1, compiler.counters
    assert compiler.counters.step_runs == STEPS - 1 - warmups, compiler.counters
    assert compiler.counters.builds == 1 and not compiler.counters.step_breaks
    tol = 1e-12 if dtype is fg.float64 else 2e-6
    np.testing.assert_allclose(got_losses, want_losses, rtol=tol, atol=tol)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    # the state the replays wrote is eager's (step counts included)
    assert float(opt.state[opt.param_groups[0]["params"][0]]["step"]) == STEPS


def test_a_scheduler_stepping_every_call_never_recompiles() -> None:
    def train(compiled: bool) -> list:
        fg.manual_seed(0)
        lin = nn.Linear(3, 2, dtype=fg.float64)
        opt = fg.optim.NAdam(lin.parameters(), lr=0.05, weight_decay=0.01)
        sched = fg.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = lin(x).tanh().square().sum()
            loss.backward()
            opt.step()
            return loss.detach()

        fn = fg.compile(step) if compiled else step
        x = fg.tensor(np.arange(12.0).reshape(4, 3) / 7, dtype=fg.float64)
        for _ in range(STEPS):
            fn(x)
            sched.step()
        return [p.detach().numpy().copy() for p in lin.parameters()]

    want = train(False)
    compiler.reset()
    got = train(True)
    assert compiler.counters.step_captures == 1 and compiler.counters.step_runs == STEPS - 2
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_switching_rmsprop_momentum_on_makes_its_buffer_eagerly_first() -> None:
    """momentum 0 -> 0.9 changes the update's structure (a new guard key) and needs a state
    buffer: the call that makes it is recorded under the old state's key (never replayed), the
    next one, with the buffer in the key, is recorded for the rest; values stay eager's."""

    def train(compiled: bool) -> list:
        fg.manual_seed(0)
        lin = nn.Linear(3, 2, dtype=fg.float64)
        opt = fg.optim.RMSprop(lin.parameters(), lr=0.01)

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            lin(x).square().sum().backward()
            opt.step()
            return x

        fn = fg.compile(step) if compiled else step
        x = fg.tensor(np.arange(6.0).reshape(2, 3) / 5, dtype=fg.float64)
        for i in range(8):
            if i == 4:
                opt.param_groups[0]["momentum"] = 0.9
            fn(x)
        return [p.detach().numpy().copy() for p in lin.parameters()]

    want = train(False)
    compiler.reset()
    got = train(True)
    # calls: 0 eager (state), 1 recorded, 2-3 replayed, 4 recorded (makes the buffer),
    # 5 recorded (the buffer in the key), 6-7 replayed
    assert compiler.counters.step_warmups == 1 and compiler.counters.step_captures == 3
    assert compiler.counters.step_runs == 4 and not compiler.counters.step_breaks
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def _lbfgs_train(compiled: bool, fullgraph: bool = False) -> tuple:
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    opt = fg.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, line_search_fn="strong_wolfe")
    x = fg.tensor(np.arange(15.0).reshape(5, 3) / 9, dtype=fg.float64)
    y = fg.tensor(np.linspace(-1, 1, 5).reshape(5, 1), dtype=fg.float64)

    def step() -> fg.Tensor:
        def closure() -> fg.Tensor:
            opt.zero_grad()
            loss = (model(x) - y).square().mean()
            loss.backward()
            return loss

        return opt.step(closure).detach()

    fn = fg.compile(step, fullgraph=fullgraph) if compiled else step
    losses = [float(fn()) for _ in range(4)]
    return losses, [p.detach().numpy().copy() for p in model.parameters()]


def test_lbfgs_in_a_compiled_step_runs_eagerly_with_its_reason() -> None:
    want_losses, want = _lbfgs_train(False)
    compiler.reset()
    got_losses, got = _lbfgs_train(True)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-12, atol=1e-14)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert compiler.counters.step_runs == 0 and compiler.counters.step_warmups == 0
    (reason,) = compiler.counters.step_breaks
    assert "LBFGS.step() with a closure" in reason and "test_whole_step_optimizers.py" in reason


def test_lbfgs_under_fullgraph_raises_the_reason() -> None:
    with pytest.raises(compiler.CompilationError, match=r"LBFGS\.step\(\) with a closure"):
        _lbfgs_train(True, fullgraph=True)
