"""Compiled training steps with the multi-tensor (``foreach``/``fused``) optimizer updates.

An optimizer whose groups take the multi-tensor path is replayed as a call after the step's
program (``Optimizer.traceable`` is False for it), so each call updates every parameter of a
group with one kernel call per dtype, bit for bit eager's update on the program's gradients,
with the options (a learning-rate schedule) read on every call and one recording for all
calls.  With ``foreach=False`` the per-parameter update is recorded into the program as before.
Inside ``compiled_autograd()`` the kernel runs too."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn

pytestmark = pytest.mark.usefixtures("fresh_compiler")

STEPS = 6
CASES = [
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.1}),
    ("Adam", {"lr": 0.01, "amsgrad": True}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1, "maximize": True}),
    ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.5}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01}),
    ("Adadelta", {"lr": 1.0, "weight_decay": 0.1}),
    ("Adamax", {"lr": 0.01, "weight_decay": 0.1}),
]
IDS = [f"{name}-{i}" for i, (name, _) in enumerate(CASES)]


def _model(dtype: Any) -> nn.Module:
    fg.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).to(dtype)


def _snapshot(params: list, opt: Any) -> list[np.ndarray]:
    out = [p.detach().numpy().copy() for p in params]
    for p in params:
        for _, value in sorted(opt.state[p].items()):
            out.append(np.asarray(value.numpy()).copy())
    return out


@pytest.mark.parametrize("dtype", [fg.float32, fg.float64], ids=["float32", "float64"])
@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_replayed_update_is_eager_bit_for_bit(name: str, options: dict, dtype: Any) -> None:
    """After every compiled call the parameters and state equal, bit for bit, what the
    per-parameter update makes from the same parameters, state and (the program's)
    gradients; the learning rate changes every call; one recording serves every call."""
    model = _model(dtype)
    opt = getattr(fg.optim, name)(model.parameters(), **options)
    shadow = _model(dtype)  # the same start, updated by the per-parameter path
    shadow_opt = getattr(fg.optim, name)(shadow.parameters(), foreach=False, **options)
    params, shadow_params = list(model.parameters()), list(shadow.parameters())

    def step(x: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = model(x).square().sum()
        loss.backward()
        opt.step()
        return loss.detach()

    fn = fg.compile(step)
    x = fg.tensor(np.arange(12.0).reshape(4, 3) / 7 - 0.5, dtype=dtype)
    for i in range(STEPS):
        for o in (opt, shadow_opt):
            o.param_groups[0]["lr"] = options["lr"] * (1 - i / (2 * STEPS))  # a schedule
        fn(x)
        for p, q in zip(params, shadow_params):
            q.grad = p.grad.detach().clone()  # the program's gradients
        shadow_opt.step()
        got, want = _snapshot(params, opt), _snapshot(shadow_params, shadow_opt)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b, strict=True)
        for p, q in zip(params, shadow_params):  # next call: the same start again
            q.data.copy_(p.data)
    assert compiler.counters.step_captures == 1 and not compiler.counters.step_breaks
    assert compiler.counters.step_runs >= STEPS - 2, compiler.counters
    assert opt.__dict__.get("_foreach_plans")  # the kernel ran


@pytest.mark.parametrize(("name", "options"), CASES[:4], ids=IDS[:4])
def test_step_is_replayed_after_the_program(name: str, options: dict) -> None:
    """Default options: ``step()`` is a call after the program; ``foreach=False``: the update
    is in the program (no call after it).  Both give eager's values (within the compiled
    forward and backward's tolerance)."""

    def train(compiled: bool, **extra: Any) -> tuple:
        model = _model(fg.float64)
        opt = getattr(fg.optim, name)(model.parameters(), **options, **extra)

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = model(x).square().sum()
            loss.backward()
            opt.step()
            return loss.detach()

        fn = fg.compile(step) if compiled else step
        x = fg.tensor(np.arange(12.0).reshape(4, 3) / 7 - 0.5, dtype=fg.float64)
        for _ in range(STEPS):
            fn(x)
        return [p.detach().numpy().copy() for p in model.parameters()], fn, x

    want, _, _ = train(False)
    for foreach, replayed in [(None, True), (False, False)]:
        compiler.reset()
        got, fn, x = train(True, foreach=foreach)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        ((entry, _),) = compiler.explain(fn, x).steps
        after = [f.__name__ for _, f, _, _ in entry.suffix]
        assert after == (["step"] if replayed else []), after


def test_compiled_autograd_runs_the_kernel() -> None:
    """Inside ``compiled_autograd()`` the optimizer's update is the multi-tensor kernel (the
    region records only ops that make graph nodes), equal to eager's."""

    def train(region: bool) -> tuple:
        model = _model(fg.float64)
        opt = fg.optim.AdamW(model.parameters(), lr=0.01)
        x = fg.tensor(np.arange(12.0).reshape(4, 3) / 7 - 0.5, dtype=fg.float64)
        for _ in range(STEPS):
            if region:
                with compiler.compiled_autograd():
                    opt.zero_grad()
                    model(x).square().sum().backward()
                    opt.step()
            else:
                opt.zero_grad()
                model(x).square().sum().backward()
                opt.step()
        return [p.detach().numpy().copy() for p in model.parameters()], opt

    want, _ = train(False)
    got, opt = train(True)
    assert opt.__dict__.get("_foreach_plans")
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def _step_then_read(model: nn.Module, opt: Any) -> Any:
    def step(x: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
        return model[0].weight.detach().abs().sum()  # reads the updated weight

    return step


def test_ops_after_the_step_that_read_its_update_put_the_update_into_the_program() -> None:
    """A tensor op after a replayed ``step()`` that reads the update's results cannot run
    before it: the first recording stops, and the next records the update into the program
    (its per-parameter ops, bit for bit the kernel's), which then replays; with
    ``foreach=False`` the update is in the program from the first recording."""
    for foreach, recordings in [(None, 2), (False, 1)]:
        compiler.reset()
        model = _model(fg.float64)
        opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=foreach)
        eager_model = _model(fg.float64)
        eager_opt = fg.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9, foreach=foreach)
        fn = fg.compile(_step_then_read(model, opt))
        eager = _step_then_read(eager_model, eager_opt)
        x = fg.tensor(np.arange(12.0).reshape(4, 3) / 7 - 0.5, dtype=fg.float64)
        for _ in range(5):
            np.testing.assert_allclose(float(fn(x)), float(eager(x)), rtol=1e-12)
        for p, q in zip(model.parameters(), eager_model.parameters()):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12)
        assert not compiler.counters.step_breaks
        assert fn.recordings == recordings and compiler.counters.step_runs == 4 - recordings


def test_ops_after_the_step_that_read_nothing_it_updates_stay_in_the_recording() -> None:
    """Metrics computed after ``step()`` from values made before it (the loss, predictions)
    are recorded: the program computes them before the update runs, with the same values."""
    compiler.reset()
    model = _model(fg.float64)
    opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    eager_model = _model(fg.float64)
    eager_model.load_state_dict(model.state_dict())
    eager_opt = fg.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9)

    def make(m: Any, o: Any) -> Any:
        def step(x: fg.Tensor) -> tuple:
            o.zero_grad()
            out = m(x)
            loss = out.square().mean()
            loss.backward()
            o.step()
            return loss.detach() * 2.0, (out > 0).double().mean()  # after the update

        return step

    fn, eager = fg.compile(make(model, opt)), make(eager_model, eager_opt)
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = fg.tensor(rng.standard_normal((4, 3)))
        got, want = fn(x), eager(x)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12)
    assert not compiler.counters.step_breaks and compiler.counters.step_runs == 3


@pytest.mark.parametrize("foreach", [None, False])
def test_a_gan_step_with_two_optimizers_replays_with_eagers_updates(foreach: Any) -> None:
    """A discriminator update, then the generator's: the second optimizer's ``zero_grad()``
    sits mid-function (no recorded backward reached its parameters: it replays before the
    program), and the first optimizer's update is read by the generator's loss (it goes into
    the program)."""

    def make() -> tuple:
        fg.manual_seed(0)
        gen = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 3)).double()
        disc = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1), nn.Sigmoid()).double()
        opt_d = fg.optim.Adam(disc.parameters(), lr=0.01, betas=(0.5, 0.999), foreach=foreach)
        opt_g = fg.optim.Adam(gen.parameters(), lr=0.01, betas=(0.5, 0.999), foreach=foreach)
        bce = nn.BCELoss()

        def step(real: fg.Tensor, noise: fg.Tensor, ones: fg.Tensor, zeros: fg.Tensor) -> Any:
            opt_d.zero_grad()
            err_real = bce(disc(real).view(-1), ones)
            err_real.backward()
            fake = gen(noise)
            err_fake = bce(disc(fake.detach()).view(-1), zeros)
            err_fake.backward()
            opt_d.step()
            opt_g.zero_grad()
            err_g = bce(disc(fake).view(-1), ones)
            err_g.backward()
            opt_g.step()
            return (err_real + err_fake).detach() + err_g.detach()

        return step, [gen, disc]

    step, nets = make()
    eager, eager_nets = make()
    fn = fg.compile(step)
    rng = np.random.default_rng(0)
    ones, zeros = fg.ones(5, dtype=fg.float64), fg.zeros(5, dtype=fg.float64)
    for _ in range(6):
        real = fg.tensor(rng.standard_normal((5, 3)))
        noise = fg.tensor(rng.standard_normal((5, 2)))
        got, want = fn(real, noise, ones, zeros), eager(real, noise, ones, zeros)
        np.testing.assert_allclose(float(got), float(want), rtol=1e-12)
    for net, eager_net in zip(nets, eager_nets):
        for p, q in zip(net.parameters(), eager_net.parameters()):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-10)
    assert not compiler.counters.step_breaks
    assert compiler.counters.step_runs == (3 if foreach is None else 4)  # (one re-recording)
