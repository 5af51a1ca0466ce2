"""The multi-tensor (``foreach``/``fused``) optimizer updates: bit for bit the per-parameter
update (``foreach=False``) in float32 and float64 over several steps, for every option, several
groups, parameters without a gradient, mixed dtypes and shapes (0-d, empty, non-contiguous,
float16: the latter two left to the per-parameter path), learning-rate schedules, state dict
round trips; which path PyTorch's ``foreach=``/``fused=`` arguments choose; PyTorch's errors;
and values against torch.optim's foreach path in float64."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegrad
from fusegrad import nn, optim

# (optimizer, options): every option of the update's formula, alone and together
CASES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.05}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.5, "maximize": True}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}),
    ("Adam", {"lr": 0.01, "betas": (0.8, 0.9), "eps": 1e-3, "maximize": True}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "amsgrad": True, "maximize": True, "weight_decay": 0.3}),
    ("RMSprop", {"lr": 0.01}),
    ("RMSprop", {"lr": 0.01, "centered": True}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.7, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.5, "maximize": True, "alpha": 0.9}),
    ("Adagrad", {"lr": 0.1}),
    (
        "Adagrad",
        {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1, "initial_accumulator_value": 0.3},
    ),
    ("Adagrad", {"lr": 0.1, "eps": 1e-3, "maximize": True}),
    ("Adadelta", {}),
    ("Adamax", {"lr": 0.01}),
    ("Adamax", {"lr": 0.01, "betas": (0.7, 0.8), "weight_decay": 0.1, "maximize": True}),
    ("Adadelta", {"lr": 0.5, "rho": 0.6, "eps": 1e-4, "weight_decay": 0.1, "maximize": True}),
]
IDS = [f"{name}-{i}" for i, (name, _) in enumerate(CASES)]
KERNEL = {
    "SGD": "sgd",
    "Adam": "adam",
    "AdamW": "adam",
    "RMSprop": "rmsprop",
    "Adagrad": "adagrad",
    "Adadelta": "adadelta",
    "Adamax": "adamax",
}
STEPS = 4


def _params(dtype: Any, rng: np.random.Generator) -> list[nn.Parameter]:
    """Parameters of several shapes: 2-d, 0-d, 1-d, 3-d, empty, and one non-contiguous (a
    transposed leaf: the per-parameter path takes it)."""
    shapes = [(3, 4), (), (5,), (2, 3, 4), (0,), (1,)]
    params = [nn.Parameter(fusegrad.tensor(rng.standard_normal(s).astype(dtype))) for s in shapes]
    strided = fusegrad.tensor(rng.standard_normal((4, 3)).astype(dtype)).t()
    params.append(nn.Parameter(strided.detach()))
    return params


def _set_grads(params: list, rng: np.random.Generator, step: int, skip: int | None) -> None:
    for i, p in enumerate(params):
        if i == skip:
            p.grad = None  # a parameter without a gradient this step
        elif p.dim() == 2 and step % 2:  # a strided gradient (the per-parameter path takes it)
            grad = rng.standard_normal(tuple(p.shape)[::-1]).astype(p.dtype.name)
            p.grad = fusegrad.tensor(grad).t()
            assert not p.grad.is_contiguous()
        else:
            p.grad = fusegrad.tensor(rng.standard_normal(tuple(p.shape)).astype(p.dtype.name))


def _snapshot(params: list, opt: Any) -> list[np.ndarray]:
    """The parameters and every state value, as arrays in a fixed order."""
    out = [p.detach().numpy().copy() for p in params]
    for p in params:
        for _, value in sorted(opt.state.get(p, {}).items()):
            out.append(np.asarray(value.numpy() if hasattr(value, "numpy") else value).copy())
    return out


def _assert_same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y, strict=True)  # NaN where NaN, each value exact
        if np.iscomplexobj(x):
            x, y = x.view(x.real.dtype), y.view(y.real.dtype)
        if x.dtype.kind == "f":  # signed zeros too (a NaN's sign is nobody's business)
            number = ~np.isnan(x)
            assert np.array_equal(np.signbit(x[number]), np.signbit(y[number]))


def _run(name: str, options: dict, dtype: Any, foreach: bool | None, steps: int = STEPS) -> tuple:
    rng = np.random.default_rng(7)
    params = _params(dtype, rng)
    opt = getattr(optim, name)(params, foreach=foreach, **options)
    for step in range(steps):
        _set_grads(params, rng, step, skip=step % 3)
        opt.step()
    return params, opt


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_foreach_equals_for_loop_bit_for_bit(name: str, options: dict, dtype: Any) -> None:
    ours, opt = _run(name, options, dtype, foreach=True)
    loop, loop_opt = _run(name, options, dtype, foreach=False)
    _assert_same_bits(_snapshot(ours, opt), _snapshot(loop, loop_opt))
    # the kernel ran (and the for-loop path made none)
    assert {key[2] for key in opt.__dict__.get("_foreach_plans", {})} == {KERNEL[name]}
    assert not loop_opt.__dict__.get("_foreach_plans")


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_groups_mixed_dtypes_and_schedule(name: str, options: dict) -> None:
    """Two groups with their own options, float32, float64 and float16 parameters in one group
    (one kernel call per dtype; float16 per parameter), the learning rate changed between
    steps by a schedule, and gradients kept between steps (``zero_grad(set_to_none=False)``)."""

    def run(foreach: bool) -> list[np.ndarray]:
        rng = np.random.default_rng(3)
        first = [
            nn.Parameter(fusegrad.tensor(rng.standard_normal(s).astype(dt)))
            for s, dt in [
                ((4,), np.float32),
                ((2, 2), np.float64),
                ((3,), np.float16),
                ((), np.float32),
            ]
        ]
        second = [nn.Parameter(fusegrad.tensor(rng.standard_normal((3, 2)).astype(np.float32)))]
        other = dict(options)
        other["lr"] = options.get("lr", 1.0) * 0.5
        if "weight_decay" in options:
            other["weight_decay"] = 0.0
        opt = getattr(optim, name)(
            [{"params": first}, {"params": second, **other}],
            foreach=foreach,
            **{k: v for k, v in options.items()},
        )
        schedule = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
        params = first + second
        for p in params:
            p.grad = fusegrad.zeros_like(p)
        for _ in range(5):
            opt.zero_grad(set_to_none=False)
            for p in params:
                p.grad.add_(
                    fusegrad.tensor(rng.standard_normal(tuple(p.shape)).astype(p.dtype.name))
                )
            opt.step()
            schedule.step()
        return _snapshot(params, opt)

    _assert_same_bits(run(True), run(False))


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_state_dict_round_trip(name: str, options: dict) -> None:
    """A foreach optimizer's state saved and loaded into a fresh one over copies of the
    parameters goes on exactly as the for-loop path does (the kernel finds the new buffers)."""
    ours, opt = _run(name, options, np.float32, foreach=True, steps=3)
    loop, loop_opt = _run(name, options, np.float32, foreach=False, steps=3)
    copies = [nn.Parameter(p.detach().clone()) for p in ours]
    fresh = getattr(optim, name)(copies, foreach=True, **options)
    fresh.load_state_dict(copy.deepcopy(opt.state_dict()))
    rng = np.random.default_rng(11)
    grads = [
        [rng.standard_normal(tuple(p.shape)).astype(np.float32) for p in ours] for _ in range(3)
    ]
    for params, o in [(copies, fresh), (loop, loop_opt), (ours, opt)]:
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = fusegrad.tensor(g)
            o.step()
    expected = _snapshot(loop, loop_opt)
    _assert_same_bits(_snapshot(copies, fresh), expected)
    _assert_same_bits(_snapshot(ours, opt), expected)


def test_nan_inf_and_signed_zeros() -> None:
    """Special values go through the kernel as through the per-parameter ops (amsgrad's
    maximum keeps NaN)."""
    for name, options in [
        ("Adam", {"amsgrad": True}),
        ("RMSprop", {"centered": True}),
        ("SGD", {"lr": 0.1, "momentum": 0.9}),
        ("Adagrad", {}),
        ("Adadelta", {}),
        ("Adamax", {}),
    ]:
        snaps = []
        for foreach in (True, False):
            values = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 3.0], np.float32)
            p = nn.Parameter(fusegrad.tensor(values[::-1].copy()))
            opt = getattr(optim, name)([p], foreach=foreach, **options)
            for g in (values, values[::-1].copy(), -values):
                p.grad = fusegrad.tensor(g)
                opt.step()
            snaps.append(_snapshot([p], opt))
        _assert_same_bits(*snaps)


def test_step_count_past_float32_exactness() -> None:
    """The kernel adds one to a float32 step count as ``step.add_(1)`` does, also where float32
    stops counting (2**24) -- so the bias corrections agree."""
    snaps, counts = [], []
    for foreach in (True, False):
        p = nn.Parameter(fusegrad.tensor(np.linspace(-1, 1, 5, dtype=np.float32)))
        opt = optim.Adam([p], foreach=foreach)
        p.grad = fusegrad.ones_like(p)
        opt.step()
        opt.state[p]["step"].fill_(2.0**24 - 1)
        for _ in range(3):
            opt.step()
        snaps.append(_snapshot([p], opt))
        counts.append(opt.state[p]["step"].item())
    _assert_same_bits(*snaps)
    assert counts == [2.0**24, 2.0**24]


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=3), min_size=1, max_size=6),
    amsgrad=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_adamw_any_shapes(shapes: list, amsgrad: bool, seed: int) -> None:
    snaps = []
    for foreach in (True, False):
        rng = np.random.default_rng(seed)
        params = [
            nn.Parameter(fusegrad.tensor(rng.standard_normal(s).astype(np.float32))) for s in shapes
        ]
        opt = optim.AdamW(params, lr=0.05, amsgrad=amsgrad, foreach=foreach)
        for _ in range(3):
            for p in params:
                p.grad = fusegrad.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32))
            opt.step()
        snaps.append(_snapshot(params, opt))
    _assert_same_bits(*snaps)


# ---- which path -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("foreach", "fused", "kernel"),
    [
        (None, None, True),
        (True, None, True),
        (None, True, True),
        (False, None, False),
        (None, False, False),
        (False, False, False),
        (False, True, True),
    ],
)
def test_foreach_and_fused_choose_the_path(foreach: Any, fused: Any, kernel: bool) -> None:
    """PyTorch's choice: fused=True or foreach=True take the multi-tensor update; both None
    too (fusegrad's default on the CPU); foreach=False, or fused=False with foreach None, the
    for-loop."""
    p = nn.Parameter(fusegrad.ones(3))
    opt = optim.Adam([p], foreach=foreach, fused=fused)
    p.grad = fusegrad.ones(3)
    opt.step()
    assert bool(opt.__dict__.get("_foreach_plans")) == kernel


def test_options_per_group_choose_per_group() -> None:
    a, b = nn.Parameter(fusegrad.ones(2)), nn.Parameter(fusegrad.ones(2))
    opt = optim.SGD([{"params": [a]}, {"params": [b], "foreach": False}], lr=0.1)
    a.grad, b.grad = fusegrad.ones(2), fusegrad.ones(2)
    opt.step()
    assert [key[0] for key in opt._foreach_plans] == [0]  # (by group position)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "Adagrad"])
def test_fused_and_foreach_together_is_an_error(name: str) -> None:
    p = nn.Parameter(fusegrad.ones(2))
    with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together"):
        getattr(optim, name)([p], foreach=True, fused=True)
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together"):
        getattr(torch.optim, name)([torch.nn.Parameter(torch.ones(2))], foreach=True, fused=True)


def test_fused_requires_floating_point_params() -> None:
    p = nn.Parameter(fusegrad.ones(2, dtype=fusegrad.complex64))
    opt = optim.Adam([p], fused=True)
    p.grad = fusegrad.ones(2, dtype=fusegrad.complex64)
    before = p.detach().numpy().copy()
    with pytest.raises(RuntimeError, match="`fused=True` requires all the params to be floating"):
        opt.step()
    np.testing.assert_array_equal(p.detach().numpy(), before)


def test_complex_params_take_the_per_parameter_path() -> None:
    snaps = []
    for foreach in (True, False):
        rng = np.random.default_rng(0)
        z = nn.Parameter(
            fusegrad.tensor(
                (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64)
            )
        )
        x = nn.Parameter(fusegrad.tensor(rng.standard_normal(3).astype(np.float32)))
        opt = optim.Adam([z, x], foreach=foreach)
        for _ in range(2):
            z.grad = fusegrad.tensor(rng.standard_normal(3).astype(np.complex64))
            x.grad = fusegrad.tensor(rng.standard_normal(3).astype(np.float32))
            opt.step()
        snaps.append(_snapshot([z, x], opt))
    _assert_same_bits(*snaps)


def test_versions_bumped_saved_tensors_notice() -> None:
    """The kernel's writes bump the parameter's version like the in-place ops do, so a graph
    that saved the parameter refuses to run backward after the step."""
    w = nn.Parameter(fusegrad.ones(3))
    opt = optim.AdamW([w])
    w.grad = fusegrad.ones(3)
    y = (w * w).sum()
    before = w._version
    opt.step()
    assert w._version > before
    assert opt.state[w]["exp_avg"]._version > 0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_read_only_parameter_raises_as_the_for_loop_does() -> None:
    array = np.ones(3, np.float32)
    array.flags.writeable = False
    p = nn.Parameter(fusegrad.from_numpy(array))
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = fusegrad.ones(3)
    with pytest.raises(RuntimeError, match="read-only"):
        opt.step()
    np.testing.assert_array_equal(array, np.ones(3, np.float32))


# ---- against PyTorch ----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_against_torch_foreach_float64(name: str, options: dict) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    init = [rng.standard_normal(s) for s in [(3, 4), (), (5,), (2, 3)]]
    ours = [nn.Parameter(fusegrad.tensor(w.copy())) for w in init]
    theirs = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in init]
    opt = getattr(optim, name)(ours, foreach=True, **options)
    topt = getattr(torch.optim, name)(theirs, foreach=True, **options)
    for _ in range(STEPS):
        grads = [rng.standard_normal(w.shape) for w in init]
        for p, q, g in zip(ours, theirs, grads):
            p.grad = fusegrad.tensor(g.copy())
            q.grad = torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("name", "options"), CASES[1::3], ids=IDS[1::3])
def test_loading_a_state_into_the_same_optimizer(name: str, options: dict) -> None:
    """A state dict loaded back into the optimizer that already ran the kernel replaces its
    buffers: the next steps update the loaded buffers, not the old ones."""

    def run(foreach: bool) -> list[np.ndarray]:
        rng = np.random.default_rng(9)
        params = [
            nn.Parameter(fusegrad.tensor(rng.standard_normal(s).astype(np.float32)))
            for s in [(3, 2), (4,)]
        ]
        opt = getattr(optim, name)(params, foreach=foreach, **options)

        def steps(n: int) -> None:
            for _ in range(n):
                for p in params:
                    p.grad = fusegrad.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32))
                opt.step()

        steps(2)
        saved = copy.deepcopy(opt.state_dict())
        values = [p.detach().clone() for p in params]
        steps(2)
        opt.load_state_dict(saved)
        with fusegrad.no_grad():
            for p, v in zip(params, values):
                p.copy_(v)
        steps(2)
        return _snapshot(params, opt)

    _assert_same_bits(run(True), run(False))
