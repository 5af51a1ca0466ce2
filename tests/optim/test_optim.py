"""Optimizers: update formulas against hand-written numpy references and against torch.optim on
identical parameters and gradients; param groups, state_dict, closures, errors, identity."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import fusegrad
from fusegrad import nn, optim

RNG = np.random.default_rng(2024)
SHAPES = [(3, 4), (5,)]
STEPS = 6


def _grads() -> list[list[np.ndarray]]:
    return [[RNG.standard_normal(s) for s in SHAPES] for _ in range(STEPS)]


def _run_ours(cls, kwargs: dict, init: list[np.ndarray], grads) -> list[np.ndarray]:
    params = [nn.Parameter(fusegrad.tensor(w)) for w in init]
    opt = cls(params, **kwargs)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = fusegrad.tensor(g)
        opt.step()
    return [p.detach().numpy() for p in params]


# ---- numpy references (PyTorch's documented algorithms) ----------------------------------------


def _sgd_ref(
    init, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False
):
    out = []
    for i, w in enumerate(init):
        w = w.copy()
        buf = None
        for step_grads in grads:
            g = -step_grads[i] if maximize else step_grads[i].copy()
            g = g + weight_decay * w
            if momentum:
                buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
                g = g + momentum * buf if nesterov else buf
            w = w - lr * g
        out.append(w)
    return out


def _adam_ref(
    init,
    grads,
    lr,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    amsgrad=False,
    maximize=False,
    decoupled=False,
):
    b1, b2 = betas
    out = []
    for i, w in enumerate(init):
        w = w.copy()
        m = np.zeros_like(w)
        v = np.zeros_like(w)
        vmax = np.zeros_like(w)
        for t, step_grads in enumerate(grads, start=1):
            g = -step_grads[i] if maximize else step_grads[i]
            if decoupled:
                w = w * (1 - lr * weight_decay)
            else:
                g = g + weight_decay * w
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            vmax = np.maximum(vmax, v)
            v_hat = (vmax if amsgrad else v) / (1 - b2**t)
            w = w - lr * (m / (1 - b1**t)) / (np.sqrt(v_hat) + eps)
        out.append(w)
    return out


SGD_CASES = [
    {"lr": 0.1},
    {"lr": 0.05, "momentum": 0.9},
    {"lr": 0.05, "momentum": 0.9, "dampening": 0.3},
    {"lr": 0.05, "momentum": 0.8, "nesterov": True},
    {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.1, "nesterov": True},
    {"lr": 0.1, "weight_decay": 0.05, "maximize": True},
]
ADAM_CASES = [
    {"lr": 0.01},
    {"lr": 0.02, "betas": (0.8, 0.99), "eps": 1e-6},
    {"lr": 0.01, "weight_decay": 0.1},
    {"lr": 0.01, "amsgrad": True},
    {"lr": 0.01, "amsgrad": True, "weight_decay": 0.05, "maximize": True},
]
ADAMW_CASES = [{"lr": 0.01}, {"lr": 0.01, "weight_decay": 0.3, "amsgrad": True}]


@pytest.mark.parametrize("kwargs", SGD_CASES)
def test_sgd_matches_numpy_reference(kwargs: dict):
    init = [RNG.standard_normal(s) for s in SHAPES]
    grads = _grads()
    ours = _run_ours(optim.SGD, kwargs, init, grads)
    for a, b in zip(ours, _sgd_ref(init, grads, **kwargs)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kwargs", ADAM_CASES)
def test_adam_matches_numpy_reference(kwargs: dict):
    init = [RNG.standard_normal(s) for s in SHAPES]
    grads = _grads()
    ours = _run_ours(optim.Adam, kwargs, init, grads)
    for a, b in zip(ours, _adam_ref(init, grads, **kwargs)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs", ADAMW_CASES)
def test_adamw_matches_numpy_reference(kwargs: dict):
    init = [RNG.standard_normal(s) for s in SHAPES]
    grads = _grads()
    ours = _run_ours(optim.AdamW, kwargs, init, grads)
    ref_kwargs = dict(kwargs)
    ref_kwargs.setdefault("weight_decay", 1e-2)  # AdamW's default
    for a, b in zip(ours, _adam_ref(init, grads, decoupled=True, **ref_kwargs)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "name,kwargs",
    [("SGD", k) for k in SGD_CASES]
    + [("Adam", k) for k in ADAM_CASES]
    + [("AdamW", k) for k in ADAMW_CASES],
)
def test_against_torch_optim(name: str, kwargs: dict):
    torch = pytest.importorskip("torch")
    init = [RNG.standard_normal(s) for s in SHAPES]
    grads = _grads()
    ours = _run_ours(getattr(optim, name), kwargs, init, grads)
    params = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in init]
    opt = getattr(torch.optim, name)(params, **kwargs)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = torch.from_numpy(g.copy())
        opt.step()
    for a, p in zip(ours, params):
        np.testing.assert_allclose(a, p.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_float32_adam_against_torch_on_a_model():
    torch = pytest.importorskip("torch")
    fusegrad.manual_seed(0)
    ours = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    theirs = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for (_, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
            q.copy_(torch.from_numpy(p.detach().numpy().copy()))
    opt_f = optim.Adam(ours.parameters(), lr=0.01, weight_decay=0.01)
    opt_t = torch.optim.Adam(theirs.parameters(), lr=0.01, weight_decay=0.01)
    x = RNG.standard_normal((16, 4)).astype(np.float32)
    y = RNG.integers(0, 3, 16)
    for _ in range(10):
        opt_f.zero_grad()
        opt_t.zero_grad()
        nn.CrossEntropyLoss()(ours(fusegrad.tensor(x)), fusegrad.tensor(y)).backward()
        torch.nn.CrossEntropyLoss()(theirs(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt_f.step()
        opt_t.step()
    for p, q in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-5)


# ---- mechanics -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (optim.SGD, {"lr": 0.1, "momentum": 0.9}),
        (optim.Adam, {"lr": 0.1}),
        (optim.AdamW, {"lr": 0.1}),
    ],
)
def test_updates_are_in_place_and_keep_identity(cls, kwargs: dict):
    model = nn.Linear(3, 2)
    weight = model.weight
    storage = weight.detach().numpy()
    before = storage.copy()
    opt = cls(model.parameters(), **kwargs)
    for _ in range(3):
        opt.zero_grad()
        model(fusegrad.randn(4, 3)).pow(2).sum().backward()
        version = weight._version
        opt.step()
        assert weight._version > version  # in-place updates bump the version counter
    assert model.weight is weight and isinstance(weight, nn.Parameter)
    assert weight.is_leaf and weight.requires_grad and weight.grad_fn is None
    assert weight.detach().numpy() is storage or np.shares_memory(weight.detach().numpy(), storage)
    assert not np.allclose(storage, before)
    assert opt.param_groups[0]["params"][0] is weight


def test_step_skips_params_without_grad_and_step_under_no_grad():
    a, b = nn.Parameter(fusegrad.ones(2)), nn.Parameter(fusegrad.ones(2))
    opt = optim.Adam([a, b], lr=0.1)
    a.grad = fusegrad.ones(2)
    opt.step()
    assert b.tolist() == [1.0, 1.0] and b not in opt.state
    assert a.tolist() != [1.0, 1.0] and set(opt.state[a]) == {"step", "exp_avg", "exp_avg_sq"}
    assert float(opt.state[a]["step"]) == 1.0


def test_param_groups_with_their_own_options():
    w, b = nn.Parameter(fusegrad.zeros(2)), nn.Parameter(fusegrad.zeros(2))
    opt = optim.SGD([{"params": [w]}, {"params": [b], "lr": 1.0}], lr=0.1, momentum=0.0)
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[1]["lr"] == 1.0
    assert opt.param_groups[1]["momentum"] == 0.0  # filled in from defaults
    w.grad = fusegrad.ones(2)
    b.grad = fusegrad.ones(2)
    opt.step()
    np.testing.assert_allclose(w.tolist(), [-0.1, -0.1])
    np.testing.assert_allclose(b.tolist(), [-1.0, -1.0])
    extra = nn.Parameter(fusegrad.zeros(1))
    opt.add_param_group({"params": extra, "lr": 0.5})
    assert opt.param_groups[2]["params"] == [extra] and opt.param_groups[2]["nesterov"] is False
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [w]})
    # lr can be changed between steps (what schedulers do)
    opt.param_groups[0]["lr"] = 0.0
    opt.step()
    np.testing.assert_allclose(w.tolist(), [-0.1, -0.1])


def test_zero_grad():
    p = nn.Parameter(fusegrad.ones(3))
    opt = optim.SGD([p], lr=0.1)
    p.grad = fusegrad.ones(3)
    g = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is g and p.grad.tolist() == [0.0, 0.0, 0.0]
    opt.zero_grad()
    assert p.grad is None


def test_closure_is_evaluated_with_grad_enabled():
    p = nn.Parameter(fusegrad.tensor([3.0]))
    opt = optim.SGD([p], lr=0.25)

    def closure() -> fusegrad.Tensor:
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    with fusegrad.no_grad():  # step must still let the closure build a graph
        loss = opt.step(closure)
    assert float(loss) == 9.0
    assert p.tolist() == [1.5]  # 3 - 0.25 * 2 * 3


def test_constructor_errors_like_pytorch():
    p = [nn.Parameter(fusegrad.zeros(1))]
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        optim.SGD(p, lr=-1)
    with pytest.raises(ValueError, match="Invalid momentum value: -0.5"):
        optim.SGD(p, lr=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match="Invalid weight_decay value: -1"):
        optim.Adam(p, weight_decay=-1)
    with pytest.raises(
        ValueError, match="Nesterov momentum requires a momentum and zero dampening"
    ):
        optim.SGD(p, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.0"):
        optim.Adam(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Invalid epsilon value: -1"):
        optim.Adam(p, eps=-1)
    with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
        optim.Adam([])
    with pytest.raises(TypeError, match="should be an iterable of Tensors or dicts"):
        optim.SGD(p[0], lr=0.1)
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor"):
        optim.SGD([p[0] * 2], lr=0.1)
    with pytest.raises(TypeError, match="optimizer can only optimize Tensors"):
        optim.SGD([1.0], lr=0.1)
    assert isinstance(optim.OptimizerError("x"), fusegrad.FusegradError)


def test_state_dict_round_trip_resumes_identically():
    def make():
        fusegrad.manual_seed(1)
        model = nn.Linear(3, 2)
        return model, optim.Adam(model.parameters(), lr=0.05, amsgrad=True)

    x = fusegrad.randn(5, 3)

    def train(model, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

    model_a, opt_a = make()
    train(model_a, opt_a, 3)
    saved_model = copy.deepcopy(model_a.state_dict())
    saved_opt = copy.deepcopy(opt_a.state_dict())
    assert list(saved_opt["state"]) == [0, 1]
    assert saved_opt["param_groups"][0]["params"] == [0, 1]
    assert saved_opt["param_groups"][0]["lr"] == 0.05
    train(model_a, opt_a, 2)

    model_b, opt_b = make()
    model_b.load_state_dict(saved_model)
    opt_b.load_state_dict(saved_opt)
    assert opt_b.state[model_b.weight]["exp_avg"] is not saved_opt["state"][0]["exp_avg"]
    train(model_b, opt_b, 2)
    np.testing.assert_allclose(
        model_a.weight.detach().numpy(), model_b.weight.detach().numpy(), rtol=1e-6
    )
    bad = copy.deepcopy(saved_opt)
    bad["param_groups"][0]["params"] = [0]
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        opt_b.load_state_dict(bad)
    bad = copy.deepcopy(saved_opt)
    bad["param_groups"].append(dict(bad["param_groups"][0]))
    with pytest.raises(ValueError, match="different number of parameter groups"):
        opt_b.load_state_dict(bad)


def test_sgd_momentum_buffer_is_independent_of_grad():
    p = nn.Parameter(fusegrad.zeros(2))
    opt = optim.SGD([p], lr=1.0, momentum=0.5)
    p.grad = fusegrad.ones(2)
    opt.step()
    buf = opt.state[p]["momentum_buffer"]
    opt.zero_grad(set_to_none=False)  # zeroing the grad must not zero the buffer
    assert buf.tolist() == [1.0, 1.0]
    p.grad = fusegrad.ones(2)
    opt.step()
    assert buf.tolist() == [1.5, 1.5] and p.tolist() == [-2.5, -2.5]


def test_repr_lists_group_options():
    opt = optim.SGD([nn.Parameter(fusegrad.zeros(1))], lr=0.1, momentum=0.9)
    text = repr(opt)
    assert text.startswith("SGD (\nParameter Group 0\n") and "    lr: 0.1\n" in text
    assert "momentum: 0.9" in text and text.endswith(")")


def test_training_reduces_loss_on_a_regression_problem():
    fusegrad.manual_seed(0)
    true_w = np.array([[2.0, -3.0, 0.5]], dtype=np.float32)
    x = RNG.standard_normal((64, 3)).astype(np.float32)
    y = x @ true_w.T + 0.1
    model = nn.Linear(3, 1)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(300):
        opt.zero_grad()
        loss = nn.MSELoss()(model(fusegrad.tensor(x)), fusegrad.tensor(y))
        loss.backward()
        opt.step()
    assert float(loss) < 1e-4
    np.testing.assert_allclose(model.weight.detach().numpy(), true_w, atol=1e-2)
    assert math.isclose(float(model.bias), 0.1, abs_tol=1e-2)
