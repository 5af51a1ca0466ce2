"""``fusegrad.compile`` over ``fusegrad.func`` transforms: the per-sample-gradient pattern
``compile(vmap(grad(loss), in_dims=(None, 0, 0)))`` over ``functional_call`` is recorded once
per guard key and replayed as one program (forward and backward of the whole batch), with the
loop's per-sample gradients; what cannot be replayed falls back with its reason and the same
values.  Also custom ``autograd.Function``s under ``vmap`` (eager), whose backward runs at the
``vmap`` level.

Compiles run in the foreground (tests/conftest.py sets ``FUSEGRAD_BACKGROUND_COMPILE=0``), so
the counters say exactly how many recordings and replays there were."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as Fn
from fusegrad import compiler, func
from fusegrad.func._pytree import tree_flatten

RNG = np.random.default_rng(29)


@pytest.fixture(autouse=True)
def fresh_compiler() -> Iterator[None]:
    compiler.reset()
    compiler._debug.check = True  # the IR verified after every pass
    yield
    compiler._debug.check = False
    compiler.reset()


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 7), nn.Tanh(), nn.Linear(7, 3))


def _layer_norm_net() -> nn.Module:
    return nn.Sequential(
        nn.Linear(5, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 8), nn.LayerNorm(8),
        nn.Linear(8, 3),
    )  # fmt: skip


def _loss_of(model: nn.Module) -> Any:
    def loss(params: dict, x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        out = func.functional_call(model, params, (x.unsqueeze(0),))
        return Fn.cross_entropy(out, y.unsqueeze(0))

    return loss


def _data(batch: int, dtype: Any) -> tuple:
    x = fg.tensor(RNG.standard_normal((batch, 5)), dtype=dtype)
    y = fg.tensor(RNG.integers(0, 3, batch))
    return x, y


def _close(got: Any, want: Any, rtol: float) -> None:
    gl, gspec = tree_flatten(got)
    wl, wspec = tree_flatten(want)
    assert gspec == wspec and len(gl) == len(wl)
    for a, b in zip(gl, wl):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert not a.requires_grad
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=rtol, atol=rtol * 1e-2)


def _loop(fn: Any, params: dict, x: fg.Tensor, y: fg.Tensor) -> Any:
    """``fn`` (one sample's gradients, a dict) sample by sample, stacked."""
    per = [fn(params, x[i], y[i]) for i in range(x.shape[0])]
    return {k: fg.stack([p[k] for p in per]) for k in params}


def _replayed(calls: int) -> None:
    """One recording, every later call a replay of it, nothing given up."""
    c = compiler.counters
    assert not c.step_breaks, c.step_breaks
    assert c.step_captures == 1 and c.step_runs == calls - 1, c


@pytest.mark.parametrize(
    ("make", "dtype", "rtol"),
    [(_mlp, fg.float64, 1e-10), (_mlp, fg.float32, 1e-5), (_layer_norm_net, fg.float64, 1e-10)],
    ids=["mlp-float64", "mlp-float32", "layer_norm-float64"],
)
def test_per_sample_gradients_replay_as_one_program(make: Any, dtype: Any, rtol: float) -> None:
    fg.manual_seed(0)
    model = make().to(dtype)
    params = {k: v.detach() for k, v in model.named_parameters()}
    loss = _loss_of(model)
    per_sample = func.vmap(func.grad(loss), in_dims=(None, 0, 0))
    compiled = fg.compile(per_sample)
    calls = 0
    for _ in range(3):  # new data each call: the replay reads it
        x, y = _data(6, dtype)
        got = compiled(params, x, y)
        calls += 1
        _close(got, _loop(func.grad(loss), params, x, y), rtol)
        _close(got, per_sample(params, x, y), rtol)
    # parameters changed in place between calls: the program reads their new values
    with fg.no_grad():
        for p in params.values():
            p.mul_(0.5)
    got = compiled(params, x, y)
    calls += 1
    _close(got, _loop(func.grad(loss), params, x, y), rtol)
    _replayed(calls)
    assert all(p.grad is None for p in model.parameters())


def test_a_new_batch_size_is_a_new_recording() -> None:
    fg.manual_seed(1)
    model = _mlp().double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    loss = _loss_of(model)
    compiled = fg.compile(func.vmap(func.grad(loss), in_dims=(None, 0, 0)))
    for batch in (4, 7, 4):
        x, y = _data(batch, fg.float64)
        _close(compiled(params, x, y), _loop(func.grad(loss), params, x, y), 1e-10)
    assert compiler.counters.step_captures == 2 and compiler.counters.step_runs == 1
    assert not compiler.counters.step_breaks


def test_has_aux_grad_and_value_and_argnums() -> None:
    fg.manual_seed(2)
    model = _layer_norm_net().double()
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_aux(p: dict, x: fg.Tensor, y: fg.Tensor) -> tuple:
        out = func.functional_call(model, p, (x.unsqueeze(0),))
        return Fn.cross_entropy(out, y.unsqueeze(0)), {"logits": out.squeeze(0)}

    def loss_x_first(x: fg.Tensor, p: dict, y: fg.Tensor) -> fg.Tensor:
        return loss_aux(p, x, y)[0]

    transforms = [
        (func.vmap(func.grad(loss_aux, has_aux=True), in_dims=(None, 0, 0)), (None, 0, 0)),
        (func.vmap(func.grad_and_value(loss_aux, has_aux=True), in_dims=(None, 0, 0)), None),
        (func.vmap(func.grad(loss_x_first, argnums=(0, 1)), in_dims=(0, None, 0)), None),
    ]
    x, y = _data(5, fg.float64)
    for k, (per_sample, _) in enumerate(transforms):
        compiler.reset()
        args = (x, params, y) if k == 2 else (params, x, y)
        compiled = fg.compile(per_sample)
        for _ in range(3):
            got = compiled(*args)
        want = per_sample(*args)
        _close(got, want, 1e-10)
        _replayed(3)
    # against one sample at a time: the gradient with respect to x and the aux output
    (gx, gp) = fg.compile(transforms[2][0])(x, params, y)
    for i in range(5):
        one_x, one_p = func.grad(loss_x_first, argnums=(0, 1))(x[i], params, y[i])
        np.testing.assert_allclose(gx[i].numpy(), one_x.numpy(), rtol=1e-10)
        for name in params:
            np.testing.assert_allclose(gp[name][i].numpy(), one_p[name].numpy(), rtol=1e-10)
    _, aux = fg.compile(transforms[0][0])(params, x, y)
    logits = func.functional_call(model, params, (x,))
    np.testing.assert_allclose(aux["logits"].numpy(), logits.detach().numpy(), rtol=1e-10)


def test_nested_vmap_replays_and_matches_the_loops() -> None:
    w = fg.tensor(RNG.standard_normal((5, 3)))
    xs = fg.tensor(RNG.standard_normal((2, 4, 5)))

    def f(w: fg.Tensor, x: fg.Tensor) -> fg.Tensor:
        return ((x @ w).tanh() ** 2).sum()

    nested = func.vmap(func.vmap(func.grad(f), in_dims=(None, 0)), in_dims=(None, 0))
    compiled = fg.compile(nested)
    for _ in range(3):
        got = compiled(w, xs)
    _replayed(3)
    assert got.shape == (2, 4, 5, 3)
    for i in range(2):
        for j in range(4):
            np.testing.assert_allclose(
                got[i, j].numpy(), func.grad(f)(w, xs[i, j]).numpy(), rtol=1e-10
            )


class _ClampStraightThrough(fg.autograd.Function):
    """clamp(x, -1, 1) whose backward passes the gradient straight through, doubled -- not the
    derivative of its forward, so a result that ignored ``backward`` would differ."""

    @staticmethod
    def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
        return x.clamp(-1.0, 1.0)

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
        return 2 * g


class _ScaledSquare(fg.autograd.Function):
    """x * x * w, saving both, with a hand-written backward for x and w."""

    @staticmethod
    def forward(ctx: Any, x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
        ctx.save_for_backward(x, w)
        return x * x * w

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> tuple:
        x, w = ctx.saved_tensors
        return 2 * x * w * g, x * x * g


def _custom_loss(w: fg.Tensor, x: fg.Tensor) -> fg.Tensor:
    return (_ScaledSquare.apply(_ClampStraightThrough.apply(x * 3.0), w) * x).sum()


def test_custom_functions_under_vmap_of_grad_equal_the_loop() -> None:
    w = fg.tensor(RNG.standard_normal(4))
    xs = fg.tensor(RNG.standard_normal((6, 4)))
    got_w, got_x = func.vmap(func.grad(_custom_loss, argnums=(0, 1)), in_dims=(None, 0))(w, xs)
    for i in range(6):
        one_w, one_x = func.grad(_custom_loss, argnums=(0, 1))(w, xs[i])
        np.testing.assert_allclose(got_w[i].numpy(), one_w.numpy(), rtol=1e-12)
        np.testing.assert_allclose(got_x[i].numpy(), one_x.numpy(), rtol=1e-12)


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 5), n=st.integers(1, 4), w_batched=st.booleans())
def test_custom_function_under_vmap_then_backward_outside(
    batch: int, n: int, w_batched: bool
) -> None:
    """The custom Function's node lives on the batch: a backward outside ``vmap`` sums an
    unbatched input's per-sample gradients and keeps a batched one's apart."""
    rng = np.random.default_rng(batch * 10 + n)
    xs = fg.tensor(rng.standard_normal((batch, n)), requires_grad=True)
    w = fg.tensor(rng.standard_normal((batch, n) if w_batched else (n,)), requires_grad=True)
    out = func.vmap(_ScaledSquare.apply, in_dims=(0, 0 if w_batched else None))(xs, w)
    (out * fg.arange(1, n + 1, dtype=fg.float64)).sum().backward()
    xs2 = xs.detach().requires_grad_()
    w2 = w.detach().requires_grad_()
    rows = [_ScaledSquare.apply(xs2[i], w2[i] if w_batched else w2) for i in range(batch)]
    (fg.stack(rows) * fg.arange(1, n + 1, dtype=fg.float64)).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), fg.stack(rows).detach().numpy())
    np.testing.assert_allclose(xs.grad.numpy(), xs2.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), w2.grad.numpy(), rtol=1e-12)


def test_what_cannot_be_replayed_falls_back_with_its_reason() -> None:
    """A custom Function's backward under ``vmap`` is not a primitive's rule: the whole call
    is not recorded (the reason is counted), and every call gives the loop's gradients."""
    w = fg.tensor(RNG.standard_normal(4))
    xs = fg.tensor(RNG.standard_normal((6, 4)))
    per_sample = func.vmap(func.grad(_custom_loss, argnums=(0, 1)), in_dims=(None, 0))
    compiled = fg.compile(per_sample)
    for _ in range(3):
        got = compiled(w, xs)
        _close(got, per_sample(w, xs), 1e-12)
    c = compiler.counters
    assert c.step_runs == 0
    (reason,) = c.step_breaks
    assert "_ScaledSquareBackward" in reason or "_ClampStraightThroughBackward" in reason
    assert "not a primitive's node" in reason


def test_randomness_different_is_replayed_with_new_draws() -> None:
    """Dropout under ``vmap(randomness="different")`` in a replayed program draws anew on every
    call from the generator, as the eager call would."""
    fg.manual_seed(3)
    w = fg.tensor(RNG.standard_normal((5, 3)))

    def f(w: fg.Tensor, x: fg.Tensor) -> fg.Tensor:
        return Fn.dropout(x @ w, 0.5, training=True).sum()

    per_sample = func.vmap(func.grad(f), in_dims=(None, 0), randomness="different")
    compiled = fg.compile(per_sample)
    x = fg.tensor(RNG.standard_normal((4, 5)))
    outs = []
    for seed in (10, 11, 10):
        fg.manual_seed(seed)
        got = compiled(w, x)
        fg.manual_seed(seed)
        _close(got, per_sample(w, x), 1e-12)
        outs.append(got.numpy())
    np.testing.assert_array_equal(outs[0], outs[2])
    assert not np.array_equal(outs[0], outs[1])
    assert not compiler.counters.step_breaks


def test_convolution_under_vmap_of_grad_eager_and_compiled() -> None:
    """conv2d (one ``convolution`` primitive with its backward kernels) under ``vmap`` gives
    the loop's per-sample gradients, and compiled it replays as one program."""
    fg.manual_seed(4)
    model = nn.Sequential(
        nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 3)
    ).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = fg.tensor(RNG.standard_normal((4, 2, 6, 6)))
    y = fg.tensor(RNG.integers(0, 3, 4))
    loss = _loss_of(model)
    per_sample = func.vmap(func.grad(loss), in_dims=(None, 0, 0))
    want = _loop(func.grad(loss), params, x, y)
    _close(per_sample(params, x, y), want, 1e-10)
    compiled = fg.compile(per_sample)
    for _ in range(2):
        _close(compiled(params, x, y), want, 1e-10)
    assert not compiler.counters.step_breaks
    assert compiler.counters.step_runs >= 1


def test_requires_grad_inside_a_recording() -> None:
    """``requires_grad_()`` on a tensor the call made (``x.detach()``, ``grad``'s inputs) is
    recorded through; on an argument it still stops the recording (the caller sees the flag)."""
    fg.manual_seed(5)
    model = _mlp().double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    loss = _loss_of(model)
    x, y = _data(1, fg.float64)
    one_sample = fg.compile(func.grad(loss))  # no vmap: grad's inputs are detached arguments
    for _ in range(3):
        got = one_sample(params, x[0], y[0])
        _close(got, func.grad(loss)(params, x[0], y[0]), 1e-12)
    _replayed(3)
    assert not any(p.requires_grad for p in params.values())

    compiler.reset()

    def grad_of_square(w: fg.Tensor) -> fg.Tensor:
        leaf = w.detach().requires_grad_()
        return fg.autograd.grad((leaf * leaf).sum(), leaf)[0]

    w = fg.tensor(RNG.standard_normal(3))
    compiled = fg.compile(grad_of_square)
    for _ in range(3):
        np.testing.assert_allclose(compiled(w).numpy(), 2 * w.numpy())
    _replayed(3)
    assert not w.requires_grad

    compiler.reset()

    def marks_its_argument(w: fg.Tensor) -> fg.Tensor:
        w.requires_grad_()
        return fg.autograd.grad((w * w).sum(), w)[0]

    w = fg.tensor(RNG.standard_normal(3))
    marked = fg.compile(marks_its_argument)(w)
    np.testing.assert_allclose(marked.numpy(), 2 * w.detach().numpy())
    assert w.requires_grad
    (reason,) = compiler.counters.step_breaks
    assert reason.startswith("requires_grad_() at ")


def _sin_sum(x: fg.Tensor) -> fg.Tensor:
    return (x.sin() * x.sum()).sum()


NESTED = {
    "jacrev": lambda: func.jacrev(fg.sin),
    "jacrev_scalar": lambda: func.jacrev(_sin_sum),
    "jacfwd": lambda: func.jacfwd(fg.sin),
    "hessian": lambda: func.hessian(_sin_sum),
    "jacfwd_of_grad": lambda: func.jacfwd(func.grad(_sin_sum)),
    "jacrev_of_grad": lambda: func.jacrev(func.grad(_sin_sum)),
    "jacrev_of_jacrev": lambda: func.jacrev(func.jacrev(fg.sin)),
    "grad_of_grad": lambda: func.grad(lambda x: func.grad(_sin_sum)(x).sum()),
    "jvp_of_grad": lambda: lambda x: func.jvp(func.grad(_sin_sum), (x,), (fg.ones_like(x),))[1],
}


@pytest.mark.parametrize("name", sorted(NESTED))
def test_jacobians_inside_compiled_code_equal_eager(name: str) -> None:
    """Jacobians, Hessians and nested transforms under ``compiled_autograd()`` and
    ``fusegrad.compile``: the values a compiled program cannot carry (batched output gradients,
    forward-AD tangents, graphs a later transform differentiates) run with the eager engine --
    a recording stops with that reason -- and every result is eager's."""
    x = fg.tensor(RNG.standard_normal(3))
    transform = NESTED[name]()
    want = transform(x).numpy()
    with compiler.compiled_autograd():
        np.testing.assert_allclose(transform(x).numpy(), want, rtol=1e-12)
    compiler.reset()
    compiled = fg.compile(transform)
    for _ in range(3):
        np.testing.assert_allclose(compiled(x).numpy(), want, rtol=1e-12)
    c = compiler.counters
    if name == "jacfwd":  # forward mode alone records and replays
        _replayed(3)
    else:
        (reason,) = c.step_breaks
        assert "under fusegrad.func" in reason and c.step_runs == 0
