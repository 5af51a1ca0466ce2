"""``fusegrad.optim.lr_scheduler``: the learning-rate sequences of every scheduler against
``torch.optim.lr_scheduler`` (when importable) in float64, by hand where the formula is short,
state_dict round trips, errors, and a compiled training step whose scheduler steps every call
without a new recording."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn
from fusegrad.optim import lr_scheduler as fls

# (name, optimizer, its options, scheduler, its arguments, steps)
CONFIGS: list[tuple[str, str, dict, str, dict, int]] = [
    ("step", "SGD", {"lr": 0.1}, "StepLR", {"step_size": 3, "gamma": 0.5}, 10),
    ("multistep", "SGD", {"lr": 0.1}, "MultiStepLR", {"milestones": [2, 5, 5, 8]}, 10),
    ("exponential", "Adam", {"lr": 1e-2}, "ExponentialLR", {"gamma": 0.9}, 8),
    ("cosine", "AdamW", {"lr": 1e-3}, "CosineAnnealingLR", {"T_max": 6, "eta_min": 1e-5}, 20),
    ("linear", "SGD", {"lr": 0.3}, "LinearLR", {"start_factor": 0.25, "total_iters": 4}, 8),
    (
        "linear_down",
        "SGD",
        {"lr": 0.3},
        "LinearLR",
        {"start_factor": 1.0, "end_factor": 0.1, "total_iters": 5},
        8,
    ),
    ("constant", "SGD", {"lr": 0.3}, "ConstantLR", {"factor": 0.5, "total_iters": 3}, 6),
    ("lambda", "SGD", {"lr": 0.2}, "LambdaLR", {"lr_lambda": lambda e: 1 / (1 + e)}, 6),
    ("multiplicative", "SGD", {"lr": 0.2}, "MultiplicativeLR", {"lr_lambda": lambda e: 0.95}, 6),
    (
        "onecycle_sgd",
        "SGD",
        {"lr": 0.1, "momentum": 0.9},
        "OneCycleLR",
        {"max_lr": 0.5, "total_steps": 20},
        19,
    ),
    (
        "onecycle_adamw_linear_3phase",
        "AdamW",
        {"lr": 1e-3},
        "OneCycleLR",
        {
            "max_lr": 1e-2,
            "epochs": 3,
            "steps_per_epoch": 5,
            "anneal_strategy": "linear",
            "three_phase": True,
            "pct_start": 0.25,
        },
        15,
    ),
]


def _run(lib: Any, optimizer: str, options: dict, scheduler: str, kwargs: dict, steps: int):
    w = lib.zeros(3, dtype=lib.float64, requires_grad=True)
    b = lib.zeros(2, dtype=lib.float64, requires_grad=True)
    groups = [{"params": [w]}, {"params": [b], "lr": options["lr"] * 2}]
    opt = getattr(lib.optim, optimizer)(groups, **options)
    sched = getattr(lib.optim.lr_scheduler, scheduler)(opt, **kwargs)
    seen = [sched.get_last_lr()]
    extra = []
    for _ in range(steps):
        opt.step()
        sched.step()
        seen.append(sched.get_last_lr())
        assert [g["lr"] for g in opt.param_groups] == seen[-1]
        extra.append([g.get("momentum", g.get("betas", (None,))[0]) for g in opt.param_groups])
    return seen, extra, sched


@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_lr_sequence_matches_torch(config: tuple) -> None:
    torch = pytest.importorskip("torch")
    _, optimizer, options, scheduler, kwargs, steps = config
    got, got_m, _ = _run(fg, optimizer, options, scheduler, kwargs, steps)
    want, want_m, _ = _run(torch, optimizer, options, scheduler, kwargs, steps)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-13, atol=0)
    if scheduler == "OneCycleLR":  # momentum / beta1 cycles too
        np.testing.assert_allclose(np.array(got_m, float), np.array(want_m, float), rtol=1e-13)


def test_sequential_warmup_then_cosine_matches_torch() -> None:
    torch = pytest.importorskip("torch")

    def run(lib: Any) -> list:
        w = lib.zeros(2, dtype=lib.float64, requires_grad=True)
        opt = lib.optim.AdamW([w], lr=1e-3)
        warm = lib.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3)
        cos = lib.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8)
        sched = lib.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])
        out = [sched.get_last_lr()]
        for _ in range(12):
            opt.step()
            sched.step()
            out.append(sched.get_last_lr())
        return out

    np.testing.assert_allclose(np.array(run(fg)), np.array(run(torch)), rtol=1e-13)


def test_closed_forms_by_hand() -> None:
    w = fg.zeros(1, requires_grad=True)
    opt = fg.optim.SGD([w], lr=1.0)
    sched = fls.CosineAnnealingLR(opt, T_max=10, eta_min=0.1)
    for t in range(1, 11):
        sched.step()
        want = 0.1 + 0.9 * (1 + math.cos(math.pi * t / 10)) / 2
        assert sched.get_last_lr()[0] == pytest.approx(want, rel=1e-12)
    assert opt.param_groups[0]["initial_lr"] == 1.0 and sched.base_lrs == [1.0]
    opt = fg.optim.SGD([w], lr=1.0)
    sched = fls.StepLR(opt, step_size=2, gamma=0.5)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    with pytest.warns(UserWarning, match="epoch parameter"):
        sched.step(7)  # the deprecated jump: closed form
    assert sched.get_last_lr() == [0.125] and sched.last_epoch == 7


def test_state_dict_round_trip_continues_the_schedule() -> None:
    def make() -> tuple:
        w = fg.zeros(1, requires_grad=True)
        opt = fg.optim.SGD([w], lr=0.5, momentum=0.9)
        return opt, fls.OneCycleLR(opt, max_lr=1.0, total_steps=12)

    opt, sched = make()
    for _ in range(5):
        opt.step()
        sched.step()
    state = sched.state_dict()
    assert "optimizer" not in state and state["last_epoch"] == 5
    saved_groups = [dict(g, params=None) for g in opt.param_groups]
    opt2, sched2 = make()
    for g, saved in zip(opt2.param_groups, saved_groups):
        g.update({k: v for k, v in saved.items() if k != "params"})
    sched2.load_state_dict(state)
    for _ in range(6):
        sched.step()
        sched2.step()
        assert sched2.get_last_lr() == sched.get_last_lr()
        assert opt2.param_groups[0]["momentum"] == opt.param_groups[0]["momentum"]


def test_lambda_state_dict_keeps_callable_objects_only() -> None:
    class Decay:
        def __init__(self) -> None:
            self.rate = 0.5

        def __call__(self, epoch: int) -> float:
            return self.rate**epoch

    w = fg.zeros(1, requires_grad=True)
    opt = fg.optim.SGD([{"params": [w]}, {"params": [fg.zeros(1, requires_grad=True)]}], lr=1.0)
    sched = fls.LambdaLR(opt, [Decay(), lambda e: 1.0])
    state = sched.state_dict()
    assert state["lr_lambdas"] == [{"rate": 0.5}, None]
    state["lr_lambdas"][0]["rate"] = 0.25
    sched.load_state_dict(state)
    sched.step()
    assert sched.get_last_lr() == [0.25, 1.0]


def test_reduce_on_plateau() -> None:
    w = fg.zeros(1, requires_grad=True)
    opt = fg.optim.SGD([w], lr=1.0)
    sched = fls.ReduceLROnPlateau(opt, factor=0.5, patience=1, cooldown=1, min_lr=0.2)
    lrs = []
    for metric in [5.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 3.0]:
        sched.step(fg.tensor(metric))
        lrs.append(sched.get_last_lr()[0])
    # (torch.optim.lr_scheduler.ReduceLROnPlateau gives the same sequence)
    assert lrs == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.2, 0.2, 0.2]


@pytest.mark.parametrize(
    "make,kind,words",
    [
        (lambda o: fls.LinearLR(o, start_factor=0.0), ValueError, "Starting multiplicative"),
        (lambda o: fls.LinearLR(o, end_factor=2.0), ValueError, "Ending multiplicative"),
        (lambda o: fls.LambdaLR(o, [lambda e: 1.0] * 2), ValueError, "Expected 1 lr_lambdas"),
        (lambda o: fls.OneCycleLR(o, max_lr=1.0), ValueError, "total_steps OR"),
        (lambda o: fls.OneCycleLR(o, 1.0, total_steps=0), ValueError, "positive integer"),
        (lambda o: fls.OneCycleLR(o, 1.0, 5, pct_start=2.0), ValueError, "pct_start"),
        (lambda o: fls.OneCycleLR(o, 1.0, 5, anneal_strategy="x"), ValueError, "anneal_strategy"),
        (lambda o: fls.StepLR(o, 2, last_epoch=3), KeyError, "initial_lr"),
        (lambda o: fls.ReduceLROnPlateau(o, factor=1.0), ValueError, "Factor should be < 1.0"),
        (lambda o: fls.ReduceLROnPlateau(o, mode="up"), ValueError, "mode up is unknown"),
        (lambda o: fls.StepLR(object(), 2), TypeError, "is not an Optimizer"),
    ],
)
def test_errors(make, kind, words) -> None:  # type: ignore[no-untyped-def]
    opt = fg.optim.SGD([fg.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(kind, match=words):
        make(opt)


def test_onecycle_stepping_past_the_end_raises() -> None:
    opt = fg.optim.SGD([fg.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
    sched = fls.OneCycleLR(opt, max_lr=1.0, total_steps=3)
    for _ in range(3):
        sched.step()
    with pytest.raises(ValueError, match="Tried to step 4 times"):
        sched.step()


@pytest.mark.parametrize("inside", [False, True], ids=["scheduler_outside", "scheduler_inside"])
def test_compiled_step_with_a_scheduler_records_once(inside: bool) -> None:
    """The learning rate is a runtime input of the recorded update: a schedule stepping every
    call (outside the compiled function, or inside it, replayed as a call) keeps one
    recording, and the parameters follow eager's."""
    compiler.reset()

    def train(compiled: bool) -> tuple:
        fg.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
        opt = fg.optim.AdamW(model.parameters(), lr=1e-2)
        warm = fls.LinearLR(opt, start_factor=0.1, total_iters=3)
        sched = fls.SequentialLR(opt, [warm, fls.CosineAnnealingLR(opt, T_max=5)], [3])

        def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if inside:
                sched.step()
            return loss.detach()

        fn = fg.compile(step) if compiled else step
        rng = np.random.default_rng(1)
        lrs = []
        for _ in range(8):
            x, y = rng.standard_normal((6, 4)), rng.standard_normal((6, 1))
            fn(fg.tensor(x), fg.tensor(y))
            if not inside:
                sched.step()
            lrs.append(sched.get_last_lr()[0])
        return lrs, [p.detach().numpy() for p in model.parameters()]

    want_lrs, want = train(False)
    got_lrs, got = train(True)
    assert got_lrs == want_lrs
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert compiler.counters.step_captures == 1, compiler.counters
    assert compiler.counters.step_runs >= 6 and not compiler.counters.step_breaks
    compiler.reset()


def test_compiled_step_with_one_cycle_momentum_records_once() -> None:
    """OneCycleLR cycles Adam's beta1 (and SGD's momentum) with the learning rate: runtime
    inputs of the recorded update too, so one recording serves every call."""
    for make in (
        lambda ps: fg.optim.AdamW(ps, lr=1e-2),
        lambda ps: fg.optim.SGD(ps, lr=0.1, momentum=0.9),
    ):
        compiler.reset()

        def train(compiled: bool, make: Any = make) -> list:
            fg.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
            opt = make(model.parameters())
            sched = fls.OneCycleLR(opt, max_lr=0.5, total_steps=10)

            def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
                opt.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                opt.step()
                sched.step()
                return loss.detach()

            fn = fg.compile(step) if compiled else step
            rng = np.random.default_rng(1)
            for _ in range(8):
                fn(fg.tensor(rng.standard_normal((6, 4))), fg.tensor(rng.standard_normal((6, 1))))
            return [p.detach().numpy() for p in model.parameters()]

        want = train(False)
        got = train(True)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        assert compiler.counters.step_captures == 1, compiler.counters
        assert compiler.counters.step_runs == 6 and not compiler.counters.step_breaks
    compiler.reset()
