"""RMSprop, Adagrad, Adadelta, Adamax, NAdam and LBFGS against torch.optim in float64 (same
initial parameters and gradients, 12 steps, several option combinations and param groups), their
state_dict structure against torch's, state_dict round trips (also loading torch's own state into
ours), constructor errors with PyTorch's messages, and LBFGS's iterates and stopping rules."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

import fusegrad
from fusegrad import nn, optim

SHAPES = [(3, 4), (5,)]
STEPS = 12

CASES: dict[str, list[dict[str, Any]]] = {
    "RMSprop": [
        {},
        {"lr": 0.05, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.1},
        {"lr": 0.02, "momentum": 0.9, "centered": True, "maximize": True},
        {"momentum": 0.5, "foreach": True},
        {"centered": True, "weight_decay": 0.05, "foreach": False},
    ],
    "Adagrad": [
        {},
        {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1},
        {"initial_accumulator_value": 0.5, "eps": 1e-6, "maximize": True},
        {"lr_decay": 0.2, "foreach": True, "fused": False},
    ],
    "Adadelta": [
        {},
        {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1},
        {"maximize": True, "foreach": True},
    ],
    "Adamax": [
        {},
        {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1},
        {"maximize": True, "foreach": False},
    ],
    "NAdam": [
        {},
        {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1},
        {"weight_decay": 0.1, "decoupled_weight_decay": True, "momentum_decay": 0.02},
        {"maximize": True, "foreach": True},
    ],
    "RAdam": [
        {},
        {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1},
        {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True},
    ],
    "Rprop": [
        {},
        {"lr": 0.05, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.2)},
        {"maximize": True, "foreach": True},
    ],
    "ASGD": [
        {},
        {"lr": 0.05, "lambd": 1e-3, "alpha": 0.5, "t0": 3, "weight_decay": 0.1},
        {"maximize": True, "t0": 0},
    ],
}
ALL = [(name, kwargs) for name, cases in CASES.items() for kwargs in cases]
IDS = [f"{name}-{i}" for name, cases in CASES.items() for i in range(len(cases))]


def _data(seed: int) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s) for s in SHAPES]
    return init, [[rng.standard_normal(s) for s in SHAPES] for _ in range(STEPS)]


def _pair(torch: Any, name: str, init: list[np.ndarray], groups: Any) -> tuple:
    """The same optimizer in both libraries; ``groups(params)`` gives its params argument."""
    ours = [nn.Parameter(fusegrad.tensor(w)) for w in init]
    theirs = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in init]
    return (
        ours,
        groups(ours, getattr(optim, name)),
        theirs,
        groups(theirs, getattr(torch.optim, name)),
    )


def _steps(params: list, opt: Any, grads: list, tensor: Any) -> None:
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = tensor(g.copy())
        opt.step()


def _close(ours: list, theirs: list, tol: float = 1e-12) -> None:
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(
            a.detach().numpy(), b.detach().numpy(), rtol=tol, atol=tol * 1e-2
        )


@pytest.mark.parametrize("name,kwargs", ALL, ids=IDS)
def test_against_torch_optim_float64(name: str, kwargs: dict) -> None:
    torch = pytest.importorskip("torch")
    init, grads = _data(1)
    ours, opt, theirs, topt = _pair(torch, name, init, lambda ps, cls: cls(ps, **kwargs))
    _steps(ours, opt, grads, fusegrad.tensor)
    _steps(theirs, topt, grads, torch.from_numpy)
    _close(ours, theirs)
    # the state has torch's keys, dtypes and values; the groups have torch's options
    ours_sd, theirs_sd = opt.state_dict(), topt.state_dict()
    assert ours_sd["param_groups"] == theirs_sd["param_groups"]
    assert list(ours_sd["state"]) == list(theirs_sd["state"])
    for index, state in theirs_sd["state"].items():
        assert list(ours_sd["state"][index]) == list(state), name
        for key, value in state.items():
            mine = ours_sd["state"][index][key]
            assert str(mine.dtype).split(".")[-1] == str(value.dtype).split(".")[-1], key
            assert tuple(mine.shape) == tuple(value.shape), key
            np.testing.assert_allclose(mine.numpy(), value.numpy(), rtol=1e-12, err_msg=key)


@pytest.mark.parametrize("name", list(CASES))
def test_param_groups_with_their_own_options_against_torch(name: str) -> None:
    torch = pytest.importorskip("torch")
    init, grads = _data(2)
    own = {
        "RMSprop": {"lr": 0.05, "momentum": 0.5},
        "Adagrad": {"lr_decay": 0.1},
        "Adadelta": {"rho": 0.5, "lr": 0.3},
        "Adamax": {"betas": (0.5, 0.9)},
        "NAdam": {"momentum_decay": 0.05, "weight_decay": 0.01},
        "RAdam": {"betas": (0.5, 0.9), "decoupled_weight_decay": True},
        "Rprop": {"etas": (0.4, 1.3), "step_sizes": (1e-4, 1.0)},
        "ASGD": {"t0": 2, "lambd": 1e-3},
    }[name]

    def groups(ps: list, cls: Any) -> Any:
        shared = {} if cls.__name__ == "Rprop" else {"weight_decay": 0.02}
        return cls([{"params": [ps[0]]}, {"params": [ps[1]], **own}], **shared)

    ours, opt, theirs, topt = _pair(torch, name, init, groups)
    for i in range(0, STEPS, 3):  # a schedule changing the first group's lr
        opt.param_groups[0]["lr"] = topt.param_groups[0]["lr"] = 0.01 * (i + 1)
        _steps(ours, opt, grads[i : i + 3], fusegrad.tensor)
        _steps(theirs, topt, grads[i : i + 3], torch.from_numpy)
    _close(ours, theirs)
    assert opt.state_dict()["param_groups"] == topt.state_dict()["param_groups"]


@pytest.mark.parametrize("name,kwargs", ALL, ids=IDS)
def test_state_dict_round_trip_resumes_identically(name: str, kwargs: dict) -> None:
    init, grads = _data(3)
    cls = getattr(optim, name)
    params = [nn.Parameter(fusegrad.tensor(w)) for w in init]
    opt = cls(params, **kwargs)
    _steps(params, opt, grads[:5], fusegrad.tensor)
    saved_params = [p.detach().clone() for p in params]
    saved = copy.deepcopy(opt.state_dict())
    _steps(params, opt, grads[5:], fusegrad.tensor)

    fresh = [nn.Parameter(p.clone()) for p in saved_params]
    again = cls(fresh, lr=0.123)  # options come from the state dict
    again.load_state_dict(saved)
    assert again.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    state = again.state[fresh[0]]
    assert state["step"] is not saved["state"][0]["step"]  # not aliasing the caller's dict
    _steps(fresh, again, grads[5:], fusegrad.tensor)
    # bit for bit; NAdam's float32 mu_product (ASGD's eta and mu) is cast to the parameter's
    # dtype on loading, as PyTorch casts it, so its later values round differently
    tol = 1e-10 if name in ("NAdam", "ASGD") else 0.0
    _close(fresh, params, tol)


@pytest.mark.parametrize("name,kwargs", ALL, ids=IDS)
def test_loads_torchs_state_dict_and_continues_as_torch(name: str, kwargs: dict) -> None:
    """torch's state_dict, its tensors converted, loads into ours: the structures agree."""
    torch = pytest.importorskip("torch")
    init, grads = _data(4)
    theirs = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in init]
    topt = getattr(torch.optim, name)(theirs, **kwargs)
    _steps(theirs, topt, grads[:6], torch.from_numpy)
    sd = topt.state_dict()
    converted = {
        "state": {
            i: {k: fusegrad.tensor(v.numpy().copy()) for k, v in s.items()}
            for i, s in sd["state"].items()
        },
        "param_groups": copy.deepcopy(sd["param_groups"]),
    }
    ours = [nn.Parameter(fusegrad.tensor(p.detach().numpy().copy())) for p in theirs]
    opt = getattr(optim, name)(ours)
    opt.load_state_dict(converted)
    # torch resumes through its own load_state_dict too (which casts floating state to the
    # parameters' dtype, NAdam's mu_product included)
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    topt = getattr(torch.optim, name)(theirs)
    topt.load_state_dict(sd)
    _steps(ours, opt, grads[6:], fusegrad.tensor)
    _steps(theirs, topt, grads[6:], torch.from_numpy)
    _close(ours, theirs)
    assert opt.state[ours[0]]["step"].dtype == fusegrad.float32  # not cast, as in torch


def test_constructor_defaults_match_torch() -> None:
    torch = pytest.importorskip("torch")
    for name in [*CASES, "LBFGS"]:
        ours = getattr(optim, name)([nn.Parameter(fusegrad.zeros(2))])
        theirs = getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(2))])
        assert ours.defaults == theirs.defaults, name
        assert ours.state_dict() == theirs.state_dict() or name == "Adagrad", name


BAD_ARGUMENTS = [
    ("RMSprop", {"lr": -1.0}),
    ("RMSprop", {"eps": -1.0}),
    ("RMSprop", {"momentum": -0.1}),
    ("RMSprop", {"weight_decay": -1.0}),
    ("RMSprop", {"alpha": -0.5}),
    ("Adagrad", {"lr": -0.1}),
    ("Adagrad", {"lr_decay": -1.0}),
    ("Adagrad", {"weight_decay": -1.0}),
    ("Adagrad", {"initial_accumulator_value": -1.0}),
    ("Adagrad", {"eps": -1.0}),
    ("Adadelta", {"lr": -1.0}),
    ("Adadelta", {"rho": 1.5}),
    ("Adadelta", {"eps": -1.0}),
    ("Adadelta", {"weight_decay": -1.0}),
    ("Adamax", {"lr": -1.0}),
    ("Adamax", {"eps": -1.0}),
    ("Adamax", {"betas": (1.0, 0.9)}),
    ("Adamax", {"betas": (0.9, -0.1)}),
    ("Adamax", {"weight_decay": -1.0}),
    ("NAdam", {"lr": -1.0}),
    ("NAdam", {"eps": -1.0}),
    ("NAdam", {"betas": (1.0, 0.9)}),
    ("NAdam", {"betas": (0.9, 1.0)}),
    ("NAdam", {"weight_decay": -1.0}),
    ("NAdam", {"momentum_decay": -1.0}),
    ("LBFGS", {"lr": -1.0}),
]


@pytest.mark.parametrize("name,kwargs", BAD_ARGUMENTS)
def test_constructor_errors_say_what_torch_says(name: str, kwargs: dict) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError) as theirs:
        getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(2))], **kwargs)
    with pytest.raises(ValueError) as ours:
        getattr(optim, name)([nn.Parameter(fusegrad.zeros(2))], **kwargs)
    assert str(ours.value) == str(theirs.value)
    assert isinstance(ours.value, fusegrad.FusegradError)


@pytest.mark.parametrize("name", list(CASES))
def test_differentiable_is_refused_and_the_other_flags_accepted(name: str) -> None:
    p = [nn.Parameter(fusegrad.zeros(2))]
    with pytest.raises(NotImplementedError, match=f"{name}: differentiable=True"):
        getattr(optim, name)(p, differentiable=True)
    opt = getattr(optim, name)(p, differentiable=False, foreach=True)
    assert opt.defaults["foreach"] is True and opt.defaults["differentiable"] is False
    if name != "Adagrad":  # capturable (CUDA graphs) is accepted and changes nothing on the CPU
        opt = getattr(optim, name)(p, capturable=True, lr=0.5)
        p[0].grad = fusegrad.ones(2)
        opt.step()
        assert opt.defaults["capturable"] is True and p[0].tolist() != [0.0, 0.0]
    with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together"):
        optim.Adagrad(p, fused=True, foreach=True)


def test_lazy_state_and_parameters_without_grad() -> None:
    a, b = nn.Parameter(fusegrad.ones(2)), nn.Parameter(fusegrad.ones(2))
    opt = optim.RMSprop([a, b], momentum=0.9, centered=True)
    assert opt.state_pending() is a
    a.grad = fusegrad.ones(2)
    opt.step()
    assert b.tolist() == [1.0, 1.0] and b not in opt.state
    assert list(opt.state[a]) == ["step", "square_avg", "momentum_buffer", "grad_avg"]
    assert opt.state_pending() is b
    # Adagrad makes its state at construction, as PyTorch's does; a group added later at its
    # first step
    ada = optim.Adagrad([a], initial_accumulator_value=0.25)
    assert ada.state[a]["sum"].tolist() == [0.25, 0.25] and ada.state_pending() is None
    ada.add_param_group({"params": [b], "initial_accumulator_value": 1.0})
    assert ada.state_pending() is b
    b.grad = fusegrad.ones(2)
    ada.step()
    assert ada.state[b]["sum"].tolist() == [2.0, 2.0] and float(ada.state[b]["step"]) == 1.0


def test_updates_are_in_place_and_work_with_a_scheduler() -> None:
    torch = pytest.importorskip("torch")
    for name in CASES:
        fusegrad.manual_seed(0)
        model = nn.Linear(3, 2).double()
        theirs = torch.nn.Linear(3, 2).double()
        with torch.no_grad():
            theirs.weight.copy_(torch.from_numpy(model.weight.detach().numpy().copy()))
            theirs.bias.copy_(torch.from_numpy(model.bias.detach().numpy().copy()))
        weight = model.weight
        opt = getattr(optim, name)(model.parameters(), lr=0.1)
        topt = getattr(torch.optim, name)(theirs.parameters(), lr=0.1)
        sched = optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=2, gamma=0.5)
        x = np.arange(12.0).reshape(4, 3) / 10
        for _ in range(6):
            opt.zero_grad()
            topt.zero_grad()
            model(fusegrad.tensor(x)).tanh().sum().backward()
            theirs(torch.from_numpy(x)).tanh().sum().backward()
            version = weight._version
            opt.step()
            topt.step()
            sched.step()
            tsched.step()
            assert weight._version > version
        assert model.weight is weight
        _close(list(model.parameters()), list(theirs.parameters()), 1e-11)


# ---- LBFGS ------------------------------------------------------------------------------------


def _rosenbrock(lib: Any, x: Any) -> Any:
    # products only (no pow), so both libraries round each evaluation alike
    a, b = 1 - x[0], x[1] - x[0] * x[0]
    return a * a + 100 * (b * b) + ((x[2:] - 0.5) * (x[2:] - 0.5)).sum()


def _lbfgs_run(lib: Any, kwargs: dict, steps: int, problem: str) -> tuple:
    if lib is fusegrad:
        make = lambda a: nn.Parameter(fusegrad.tensor(a))  # noqa: E731
        opt_cls, tensor = optim.LBFGS, fusegrad.tensor
    else:
        make = lambda a: lib.nn.Parameter(lib.from_numpy(a))  # noqa: E731
        opt_cls, tensor = lib.optim.LBFGS, lib.from_numpy
    rng = np.random.default_rng(5)
    if problem == "rosenbrock":
        params = [make(np.array([-1.2, 1.0])), make(np.array([0.3, -0.2]))]
    else:
        params = [make(rng.standard_normal((3, 4)) * 0.5), make(rng.standard_normal(3) * 0.1)]
        data = tensor(rng.standard_normal((16, 4)))
        target = tensor(rng.standard_normal((16, 3)))
    opt = opt_cls(params, **kwargs)
    evals = []

    def closure() -> Any:
        opt.zero_grad()
        if problem == "rosenbrock":
            loss = _rosenbrock(lib, lib.cat([params[0], params[1]]))
        else:
            out = (data @ params[0].T + params[1]).tanh()
            loss = ((out - target) ** 2).mean() + 1e-3 * (params[0] ** 4).sum()
        loss.backward()
        evals.append(float(loss.detach()))
        return loss

    losses = [float(opt.step(closure).detach()) for _ in range(steps)]
    return losses, evals, [p.detach().numpy().copy() for p in params], opt


LBFGS_CASES = [
    ({}, "rosenbrock"),
    ({"line_search_fn": "strong_wolfe"}, "rosenbrock"),
    ({"line_search_fn": "strong_wolfe", "history_size": 3, "max_iter": 30}, "rosenbrock"),
    ({"lr": 0.1, "history_size": 2, "max_iter": 7}, "rosenbrock"),
    ({"line_search_fn": "strong_wolfe", "max_eval": 9, "tolerance_change": 1e-5}, "model"),
    ({"tolerance_grad": 1e-3, "max_iter": 50}, "model"),
    ({"lr": 0.8, "line_search_fn": "strong_wolfe", "tolerance_grad": 1e-12}, "model"),
    # line-search corners: extrapolation from a short first step, a step too long (zoom
    # shrinking from above), the evaluation budget running out, a bracket below tolerance
    ({"lr": 0.01, "line_search_fn": "strong_wolfe"}, "rosenbrock"),
    ({"lr": 30.0, "line_search_fn": "strong_wolfe"}, "rosenbrock"),
    ({"lr": 1e-3, "line_search_fn": "strong_wolfe", "max_eval": 4}, "rosenbrock"),
    ({"lr": 5.0, "line_search_fn": "strong_wolfe", "tolerance_change": 1e-2}, "model"),
]


@pytest.mark.parametrize("kwargs,problem", LBFGS_CASES)
def test_lbfgs_matches_torch_iterate_by_iterate(kwargs: dict, problem: str) -> None:
    torch = pytest.importorskip("torch")
    losses, evals, params, opt = _lbfgs_run(fusegrad, kwargs, 4, problem)
    t_losses, t_evals, t_params, topt = _lbfgs_run(torch, kwargs, 4, problem)
    assert len(evals) == len(t_evals)  # the same closure calls: same decisions
    # (last-bit differences of the two libraries' reductions, amplified over ~80 Rosenbrock
    # iterations, reach 1e-9)
    np.testing.assert_allclose(evals, t_evals, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(losses, t_losses, rtol=1e-7, atol=1e-12)
    for a, b in zip(params, t_params):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)
    state, t_state = opt.state_dict()["state"], topt.state_dict()["state"]
    assert list(state) == list(t_state) == [0]
    assert sorted(state[0]) == sorted(t_state[0])
    for key in ("func_evals", "n_iter"):
        assert state[0][key] == t_state[0][key], key
    assert len(state[0]["old_dirs"]) == len(t_state[0]["old_dirs"])
    assert opt.state_dict()["param_groups"] == topt.state_dict()["param_groups"]


def test_lbfgs_converges_on_rosenbrock_with_strong_wolfe() -> None:
    losses, _, params, _ = _lbfgs_run(
        fusegrad, {"line_search_fn": "strong_wolfe", "max_iter": 100}, 3, "rosenbrock"
    )
    assert losses[-1] < 1e-10
    np.testing.assert_allclose(params[0], [1.0, 1.0], atol=1e-5)


def test_lbfgs_state_dict_round_trip_resumes_identically() -> None:
    kwargs = {"line_search_fn": "strong_wolfe", "history_size": 4, "max_iter": 3}
    _, _, want, _ = _lbfgs_run(fusegrad, kwargs, 4, "model")
    _, _, half, opt = _lbfgs_run(fusegrad, kwargs, 2, "model")
    saved = copy.deepcopy(opt.state_dict())
    # a fresh optimizer over the same parameter values, resumed from the saved state
    rng = np.random.default_rng(5)
    rng.standard_normal((3, 4)), rng.standard_normal(3)
    data = fusegrad.tensor(rng.standard_normal((16, 4)))
    target = fusegrad.tensor(rng.standard_normal((16, 3)))
    params = [nn.Parameter(fusegrad.tensor(a)) for a in half]
    again = optim.LBFGS(params)
    again.load_state_dict(saved)
    assert again.param_groups[0]["history_size"] == 4

    def closure() -> Any:
        again.zero_grad()
        out = (data @ params[0].T + params[1]).tanh()
        loss = ((out - target) ** 2).mean() + 1e-3 * (params[0] ** 4).sum()
        loss.backward()
        return loss

    for _ in range(2):
        again.step(closure)
    for a, b in zip(params, want):
        np.testing.assert_allclose(a.detach().numpy(), b, rtol=1e-12, atol=1e-14)


def test_lbfgs_errors_like_torch() -> None:
    a, b = nn.Parameter(fusegrad.ones(2)), nn.Parameter(fusegrad.ones(2))
    with pytest.raises(ValueError, match=r"LBFGS doesn't support per-parameter options"):
        optim.LBFGS([{"params": [a]}, {"params": [b]}])
    opt = optim.LBFGS([a])
    with pytest.raises(TypeError, match="closure"):
        opt.step()
    opt = optim.LBFGS([a], line_search_fn="backtracking")

    def closure() -> Any:
        opt.zero_grad()
        loss = (a * a).sum()
        loss.backward()
        return loss

    with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
        opt.step(closure)
    assert optim.LBFGS([a]).defaults["max_eval"] == 25  # max_iter * 5 // 4


def test_lbfgs_returns_at_once_at_an_optimum() -> None:
    p = nn.Parameter(fusegrad.zeros(3, dtype=fusegrad.float64))
    opt = optim.LBFGS([p])
    calls = []

    def closure() -> Any:
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        calls.append(1)
        return loss

    loss = opt.step(closure)
    assert float(loss) == 0.0 and len(calls) == 1 and p.tolist() == [0.0, 0.0, 0.0]
    assert opt.state[p] == {"func_evals": 1, "n_iter": 0}
