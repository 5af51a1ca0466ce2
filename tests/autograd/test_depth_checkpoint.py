"""Activation checkpointing (``fusegrad.utils.checkpoint``): both variants give the gradients of
the plain program, free the activations, recompute with the RNG state replayed (dropout gives
bit-identical gradients), work with grad()/inputs= (non-reentrant) or refuse them (reentrant),
detect non-deterministic recomputation, and compose with hooks, nesting, double backward,
checkpoint_sequential and gradcheck."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import nn
from fusegrad.autograd import Function, grad, gradcheck, gradgradcheck
from fusegrad.utils.checkpoint import (
    CheckpointError,
    checkpoint,
    checkpoint_sequential,
    set_checkpoint_early_stop,
)

VARIANTS = [pytest.param(True, id="reentrant"), pytest.param(False, id="non_reentrant")]
# compiled backward recomputes a checkpoint from the recording of its forward: the function's
# Python does not run again (so it cannot differ from the forward either)
REPLAYED = pytest.mark.compiled_differs(
    "compiled backward recomputes from the recording of the forward, without running the "
    "checkpointed function's Python again (docs/compile.md)"
)


def _t(data, requires_grad: bool = False) -> fg.Tensor:
    return fg.tensor(np.asarray(data, dtype=np.float64), requires_grad=requires_grad)


def _block(x, w1, w2):
    return ((x @ w1).tanh() @ w2).sigmoid() * x


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (
        _t(rng.standard_normal((4, 3)), True),
        _t(rng.standard_normal((3, 5)), True),
        _t(rng.standard_normal((5, 3)), True),
    )


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_gradients_equal_the_unckeckpointed_ones(use_reentrant: bool) -> None:
    x, w1, w2 = _inputs()
    (_block(x, w1, w2) ** 2).sum().backward()
    expected = [t.grad.numpy().copy() for t in (x, w1, w2)]
    x2, v1, v2 = _inputs()
    out = checkpoint(_block, x2, v1, v2, use_reentrant=use_reentrant)
    np.testing.assert_allclose(out.detach().numpy(), _block(x, w1, w2).detach().numpy())
    (out**2).sum().backward()
    for got, want in zip((x2.grad, v1.grad, v2.grad), expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_parameters_used_inside_get_their_gradients(use_reentrant: bool) -> None:
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    x = fg.randn(5, 3, requires_grad=True)
    model(x).sum().backward()
    expected = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    checkpoint(model, x, use_reentrant=use_reentrant).sum().backward()
    for p, want in zip(model.parameters(), expected):
        np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-6)


def test_reentrant_needs_an_input_that_requires_grad() -> None:
    fg.manual_seed(0)
    layer = nn.Linear(3, 2)
    x = fg.randn(4, 3)  # does not require grad
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        out = checkpoint(layer, x, use_reentrant=True)
    assert not out.requires_grad  # as in PyTorch: the parameters get no gradient this way
    out = checkpoint(layer, x, use_reentrant=False)
    out.sum().backward()
    assert layer.weight.grad is not None


def test_use_reentrant_none_warns_and_is_reentrant() -> None:
    x = _t([1.0, 2.0], True)
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"):
        y = checkpoint(lambda a: a.sin(), x)
    assert y.grad_fn.name() == "CheckpointFunctionBackward"
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"):
        checkpoint_sequential([lambda a: a.sin()], 1, x)


@pytest.mark.parametrize(
    "use_reentrant",
    [
        pytest.param(True, id="reentrant", marks=REPLAYED),
        pytest.param(False, id="non_reentrant", marks=REPLAYED),
    ],
)
def test_activations_are_freed_and_recomputed_once_per_backward(use_reentrant: bool) -> None:
    calls: list = []
    refs: list = []

    def fn(x):
        calls.append(fg.is_grad_enabled())
        h = x.exp()  # h is saved by sin below: the plain program keeps it alive
        refs.append(weakref.ref(h))
        return h.sin()

    x = _t([0.1, 0.2], True)
    plain = fn(x)
    gc.collect()
    assert refs[0]() is not None
    del plain
    out = checkpoint(fn, x, use_reentrant=use_reentrant)
    gc.collect()
    assert refs[1]() is None  # nothing inside fn was kept
    assert len(calls) == 2
    out.sum().backward(retain_graph=not use_reentrant)
    assert len(calls) == 3  # one recomputation
    assert calls[2] is True  # with grad mode on
    if not use_reentrant:  # the graph survives: a second backward recomputes again
        out.sum().backward()
        assert len(calls) == 4
    xv = np.array([0.1, 0.2])
    times = 1 if use_reentrant else 2
    np.testing.assert_allclose(x.grad.numpy(), times * np.cos(np.exp(xv)) * np.exp(xv))


def test_non_reentrant_works_with_grad_and_inputs() -> None:
    x, w1, w2 = _inputs()
    out = checkpoint(_block, x, w1, w2, use_reentrant=False)
    gx, gw1 = grad(out.sum(), (x, w1), retain_graph=True)
    x2, v1, v2 = _inputs()
    rx, rw1 = grad(_block(x2, v1, v2).sum(), (x2, v1))
    np.testing.assert_allclose(gx.numpy(), rx.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gw1.numpy(), rw1.numpy(), rtol=1e-12)
    out.sum().backward(inputs=[w2])
    assert x.grad is None and w1.grad is None and w2.grad is not None


def test_reentrant_refuses_grad_and_inputs() -> None:
    x, w1, w2 = _inputs()
    out = checkpoint(_block, x, w1, w2, use_reentrant=True)
    with pytest.raises(RuntimeError, match="incompatible with .grad"):
        grad(out.sum(), x, retain_graph=True)
    out = checkpoint(_block, x, w1, w2, use_reentrant=True)
    with pytest.raises(RuntimeError, match="use_reentrant=False"):
        out.sum().backward(inputs=[x])


def test_keyword_arguments() -> None:
    def fn(x, *, scale):
        return (x * scale).sin()

    x = _t([0.3], True)
    checkpoint(fn, x, scale=2.0, use_reentrant=False).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0 * np.cos(0.6)])
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        checkpoint(fn, x, scale=2.0, use_reentrant=True)
    with pytest.raises(ValueError, match="only supported when use_reentrant=False"):
        checkpoint(fn, x, use_reentrant=True, debug=True)


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_non_tensor_arguments_and_several_outputs(use_reentrant: bool) -> None:
    def fn(x, power, y):
        return x**power, (x * y).exp()

    x, y = _t([0.5, 1.5], True), _t([2.0, -1.0], True)
    a, b = checkpoint(fn, x, 3, y, use_reentrant=use_reentrant)
    (a.sum() + b.sum()).backward()
    xv, yv = np.array([0.5, 1.5]), np.array([2.0, -1.0])
    np.testing.assert_allclose(x.grad.numpy(), 3 * xv**2 + yv * np.exp(xv * yv))
    np.testing.assert_allclose(y.grad.numpy(), xv * np.exp(xv * yv))


def _dropout_mlp(x, w1, w2):
    h = F.dropout((x @ w1).relu(), p=0.5, training=True)
    return F.dropout(h @ w2, p=0.3, training=True)


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_dropout_gradients_are_bit_identical(use_reentrant: bool) -> None:
    x, w1, w2 = _inputs(3)
    fg.manual_seed(123)
    _dropout_mlp(x, w1, w2).sum().backward()
    after_plain = fg.rand(3).numpy()
    expected = [t.grad.numpy().copy() for t in (x, w1, w2)]
    x2, v1, v2 = _inputs(3)
    fg.manual_seed(123)
    out = checkpoint(_dropout_mlp, x2, v1, v2, use_reentrant=use_reentrant)
    out.sum().backward()
    for got, want in zip((x2.grad, v1.grad, v2.grad), expected):
        np.testing.assert_array_equal(got.numpy(), want)
    # the recomputation replays the forward's draws without shifting the global stream
    np.testing.assert_array_equal(fg.rand(3).numpy(), after_plain)


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_without_preserve_rng_state_the_masks_differ(use_reentrant: bool) -> None:
    x, w1, w2 = _inputs(3)
    fg.manual_seed(123)
    _dropout_mlp(x, w1, w2).sum().backward()
    x2, v1, v2 = _inputs(3)
    fg.manual_seed(123)
    out = checkpoint(
        _dropout_mlp, x2, v1, v2, use_reentrant=use_reentrant, preserve_rng_state=False
    )
    out.sum().backward()
    assert not np.array_equal(v1.grad.numpy(), w1.grad.numpy())


@REPLAYED
def test_determinism_check_different_number_of_saved_tensors() -> None:
    runs: list = []

    def fn(x):
        runs.append(1)
        y = x.sin()
        if len(runs) == 1:
            y = y.exp()  # only in the original forward: one more saved tensor
        return y

    out = checkpoint(fn, _t([1.0], True), use_reentrant=False)
    with pytest.raises(
        CheckpointError,
        match="A different number of tensors was saved during "
        "the original forward and recomputation",
    ):
        out.sum().backward()
    assert issubclass(CheckpointError, RuntimeError)


@REPLAYED
def test_determinism_check_different_metadata() -> None:
    runs: list = []

    def fn(x):
        runs.append(1)
        if len(runs) > 1:
            x = x.to(fg.float32)  # recomputation saves a tensor of another dtype
        return x.sin()

    out = checkpoint(fn, _t([1.0, 2.0], True), use_reentrant=False)
    with pytest.raises(
        CheckpointError, match="Recomputed values for the following tensors have different metadata"
    ) as info:
        out.sum().backward()
    assert "tensor at position 0" in str(info.value)
    runs.clear()
    out = checkpoint(fn, _t([1.0, 2.0], True), use_reentrant=False, determinism_check="none")
    out.sum().backward()  # not checked
    with pytest.raises(ValueError, match="determinism_check should be one of"):
        checkpoint(fn, _t([1.0], True), use_reentrant=False, determinism_check="strict")


@REPLAYED
def test_more_tensors_saved_in_recomputation_is_an_error() -> None:
    runs: list = []

    def fn(x):
        runs.append(1)
        y = x.sin()
        if len(runs) > 1:
            y = y.exp()
        return y

    with set_checkpoint_early_stop(False):
        out = checkpoint(fn, _t([1.0], True), use_reentrant=False)
    with pytest.raises(CheckpointError, match="trying to save more tensors during recomputation"):
        out.sum().backward()


@REPLAYED
def test_debug_lists_saved_tensors() -> None:
    runs: list = []

    def fn(x):
        runs.append(1)
        y = x.sin()
        if len(runs) == 1:
            y = y.exp()
        return y

    out = checkpoint(fn, _t([1.0], True), use_reentrant=False, debug=True)
    with pytest.raises(CheckpointError, match="Tensors saved during the original forward") as info:
        out.sum().backward()
    assert "ExpBackward0" in str(info.value)


@REPLAYED
def test_early_stop() -> None:
    log: list = []

    def fn(x):
        h = x.sin()  # saves x
        y = h * h  # saves h (twice): the last saved tensors
        log.append("end")
        return y

    x = _t([0.5], True)
    checkpoint(fn, x, use_reentrant=False).sum().backward()
    assert log == ["end"]  # the recomputation stopped once everything was back
    log.clear()
    with set_checkpoint_early_stop(False):
        out = checkpoint(fn, x, use_reentrant=False)
    out.sum().backward()
    assert log == ["end", "end"]


def test_input_modified_in_place_after_the_forward_is_detected() -> None:
    for use_reentrant in (True, False):
        x = _t([1.0], True)
        h = x * 1.0
        out = checkpoint(lambda a: a.sin(), h, use_reentrant=use_reentrant)
        with fg.no_grad():
            h.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_saved_tensors_accessed_twice_in_one_backward() -> None:
    class TwiceAccess(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            _ = ctx.saved_tensors
            _ = ctx.saved_tensors  # the second access within one backward
            return g * 2.0

    out = checkpoint(lambda a: TwiceAccess.apply(a.sin()), _t([1.0], True), use_reentrant=False)
    with pytest.raises(CheckpointError, match="already unpacked once"):
        out.sum().backward()


def test_reentrant_output_that_does_not_depend_on_the_inputs() -> None:
    const = _t([1.0, 2.0])
    out = checkpoint(lambda a: const * 2.0, _t([1.0, 1.0], True), use_reentrant=True)
    with pytest.raises(RuntimeError, match="none of output has requires_grad=True"):
        out.sum().backward()


def test_nested_non_reentrant_checkpoints() -> None:
    def inner(a):
        return a.exp().sin()

    def outer(a):
        return checkpoint(inner, a * 2.0, use_reentrant=False).tanh() * a

    x = _t([0.1, 0.4], True)
    checkpoint(outer, x, use_reentrant=False).sum().backward()
    y = _t([0.1, 0.4], True)
    ((y * 2.0).exp().sin().tanh() * y).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-12)


def test_double_backward_through_non_reentrant_checkpoint() -> None:
    def fn(a):
        return (a * a).sin()

    x = _t([0.3, 0.9], True)
    out = checkpoint(fn, x, use_reentrant=False)
    (g,) = grad(out.sum(), x, create_graph=True)
    (gg,) = grad(g.sum(), x)
    xv = np.array([0.3, 0.9])
    np.testing.assert_allclose(g.detach().numpy(), np.cos(xv**2) * 2 * xv)
    np.testing.assert_allclose(gg.numpy(), -np.sin(xv**2) * (2 * xv) ** 2 + 2 * np.cos(xv**2))


def test_context_fn_runs_around_forward_and_recomputation() -> None:
    import contextlib

    log: list = []

    @contextlib.contextmanager
    def tag(name):
        log.append(f"enter {name}")
        try:  # early stop ends the recomputation with an exception
            yield
        finally:
            log.append(f"exit {name}")

    x = _t([1.0], True)
    out = checkpoint(
        lambda a: a.exp(),
        x,
        use_reentrant=False,
        context_fn=lambda: (tag("forward"), tag("recompute")),
    )
    assert log == ["enter forward", "exit forward"]
    out.sum().backward()
    assert log[2:] == ["enter recompute", "exit recompute"]


def test_checkpoint_under_no_grad_just_runs() -> None:
    x = _t([1.0], True)
    for use_reentrant in (True, False):
        with fg.no_grad():
            out = checkpoint(lambda a: a.exp(), x, use_reentrant=use_reentrant)
        assert not out.requires_grad
        np.testing.assert_allclose(out.numpy(), np.exp([1.0]))


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_checkpoint_sequential(use_reentrant: bool) -> None:
    fg.manual_seed(1)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(4, 4), nn.Tanh()]
    model = nn.Sequential(*layers)
    x = fg.randn(3, 4, requires_grad=True)
    model(x).pow(2).sum().backward()
    expected = [p.grad.numpy().copy() for p in model.parameters()] + [x.grad.numpy().copy()]
    for segments in (1, 3, 5, 12):
        model.zero_grad()
        x.grad = None
        out = checkpoint_sequential(model, segments, x, use_reentrant=use_reentrant)
        out.pow(2).sum().backward()
        got = [p.grad.numpy() for p in model.parameters()] + [x.grad.numpy()]
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)


def test_checkpoint_sequential_with_a_list_of_functions() -> None:
    functions = [lambda a: a.sin(), lambda a: a * 3.0, lambda a: a.exp(), lambda a: a.sum()]
    x = _t([0.2, 0.4], True)
    out = checkpoint_sequential(functions, 2, x, use_reentrant=False)
    out.backward()
    xv = np.array([0.2, 0.4])
    np.testing.assert_allclose(x.grad.numpy(), np.exp(3 * np.sin(xv)) * 3 * np.cos(xv))
    with pytest.raises(ValueError, match="Unexpected keyword arguments"):
        checkpoint_sequential(functions, 2, x, use_reentrant=False, foo=1)


def test_gradcheck_over_checkpoint_mixed_with_hooks_and_custom_functions() -> None:
    class Cube(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3.0 * x * x

    def inner(a, b):
        h = Cube.apply(a) * b.sin()
        h.register_hook(lambda g: g * 2.0)  # a hook inside the checkpointed region
        return h.tanh()

    def program(a, b):
        mid = checkpoint(inner, a, b, use_reentrant=False)
        mid.register_hook(lambda g: g + 0.0)
        return checkpoint(lambda m: (m * a).exp(), mid, use_reentrant=False)

    rng = np.random.default_rng(7)
    a = _t(rng.uniform(-1, 1, 3), True)
    b = _t(rng.uniform(-1, 1, 3), True)

    # the hook doubles the gradient flowing into h: compare against that program explicitly
    def reference(a, b):
        h = Cube.apply(a) * b.sin()
        h.register_hook(lambda g: g * 2.0)
        return (h.tanh() * a).exp()

    (ga, gb) = grad(program(a, b).sum(), (a, b))
    (ra, rb) = grad(reference(a, b).sum(), (a, b))
    np.testing.assert_allclose(ga.numpy(), ra.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gb.numpy(), rb.numpy(), rtol=1e-12)

    def region(p, q):
        h = Cube.apply(p) * q.sin()
        h.mul_(1.5)  # an in-place op inside the checkpointed region (replayed on recompute)
        return h.tanh()

    def smooth(a, b):  # without the gradient-scaling hook, so finite differences apply
        h = checkpoint(region, a, b, use_reentrant=False)
        h.register_hook(lambda g: g * 1.0)
        return checkpoint(lambda m: (m * a).exp(), h, use_reentrant=False)

    assert gradcheck(smooth, (a, b))
    assert gradgradcheck(smooth, (a, b))


def test_grad_inside_the_checkpointed_function() -> None:
    """grad() inside fn's own forward triggers a recomputation of what it needs (PyTorch's
    "backward inside checkpoint"), and the outer backward still matches the plain program."""

    def fn(x):
        y = x.sin()
        (gx,) = grad(y.sum(), x, create_graph=True)
        return gx * x

    x = _t([0.3, 0.6], True)
    checkpoint(fn, x, use_reentrant=False).sum().backward()
    y = _t([0.3, 0.6], True)
    fn(y).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-12)


def test_checkpoint_inside_other_saved_tensor_hooks() -> None:
    """The inner checkpoint's hooks win inside fn; its inputs are saved through the outer
    hooks (save_on_cpu here) and unpacked through them for the recomputation."""
    from fusegrad.autograd.graph import save_on_cpu

    x = _t([0.3, 0.6], True)
    with save_on_cpu():
        out = checkpoint(lambda a: a.exp().sin(), x * 2.0, use_reentrant=False).cos()
    out.sum().backward()
    y = _t([0.3, 0.6], True)
    (y * 2.0).exp().sin().cos().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-12)


def test_reachable_as_fusegrad_utils_checkpoint() -> None:
    assert fg.utils.checkpoint.checkpoint is checkpoint
    assert fg.utils.checkpoint.checkpoint_sequential is checkpoint_sequential
