"""Custom autograd Functions inside compiled backward (issue 12, item 1).

A ``backward`` written with fusegrad ops is traced like a derivative rule: its ops become IR
values of the program and fuse with their neighbours.  Everything it depends on besides its
tensors is in the cache key (ctx attributes, the globals and closures its code reads), and what
it must not do (read values, draw random numbers, write in place, touch Python state) is
detected while it runs; such a backward then runs eagerly as an opaque step of the program,
where eager mode runs it (like a user hook), and the rest of the backward stays compiled.
Each test compares with eager mode and checks what was captured, ran opaquely or fell back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegrad as fg
from fusegrad import compiler
from fusegrad.autograd import Function
from fusegrad.autograd.function import once_differentiable

pytestmark = pytest.mark.usefixtures("fresh_compiler")

SCALE = 3.0  # a global the backward of _GlobalScale reads (in the key: changing it recaptures)


class _Cube(Function):
    @staticmethod
    def forward(ctx: Any, x: fg.Tensor, k: float) -> fg.Tensor:
        ctx.save_for_backward(x)
        ctx.k = k
        return k * x**3

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> tuple:
        (x,) = ctx.saved_tensors
        return 3.0 * ctx.k * x * x * g, None


class _GlobalGain(Function):
    """Identity forward; its backward scales by the global ``SCALE``."""

    @staticmethod
    def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
        return g * SCALE


def _leaf(shape: tuple = (3, 4), seed: int = 0) -> fg.Tensor:
    rng = np.random.default_rng(seed)
    return fg.tensor(rng.standard_normal(shape), requires_grad=True)


def _grads(compiled: bool, program: Any, *shapes: tuple, seed: int = 0) -> list:
    leaves = [_leaf(s, seed + i) for i, s in enumerate(shapes)]
    y = program(*leaves)
    if compiled:
        with compiler.compiled_autograd():
            y.backward()
    else:
        y.backward()
    return [None if t.grad is None else t.grad.numpy() for t in leaves]


def _same(program: Any, *shapes: tuple, calls: int = 3, seed: int = 0) -> None:
    eager = _grads(False, program, *shapes, seed=seed)
    for _ in range(calls):
        got = _grads(True, program, *shapes, seed=seed)
        for e, c in zip(eager, got):
            assert (e is None) == (c is None)
            if e is not None:
                np.testing.assert_allclose(c, e, rtol=1e-12, atol=1e-12)


def _compiled_without_fallback(captures: int = 1) -> None:
    assert not compiler.counters.fallbacks, compiler.counters.fallbacks
    assert compiler.counters.captures == captures


def test_a_backward_in_fusegrad_ops_is_traced_and_replayed() -> None:
    _same(lambda x: (_Cube.apply(x.exp(), 2.0) * x).sum(), (3, 4))
    _compiled_without_fallback()
    assert compiler.counters.compiled_runs == 3


def test_its_ops_fuse_with_the_rest_of_the_backward() -> None:
    x = _leaf()
    report = compiler.explain(lambda: (_Cube.apply(x.tanh(), 2.0) * 1.5).sum().backward())
    assert not report.fallbacks
    ((_, program),) = report.captures
    # tanh's rule, the Function's mul chain, the constant's mul: one elementwise loop
    assert len(program.kernels) == 1, str(program)


def test_ctx_attributes_are_in_the_key() -> None:
    _same(lambda x: _Cube.apply(x, 2.0).sum(), (5,))
    _same(lambda x: _Cube.apply(x, 0.5).sum(), (5,))
    _compiled_without_fallback(captures=2)


def test_a_global_the_backward_reads_is_in_the_key() -> None:
    global SCALE
    try:
        _same(lambda x: _GlobalGain.apply(x).sum(), (4,))
        SCALE = 5.0
        got = _grads(True, lambda x: _GlobalGain.apply(x).sum(), (4,))
        np.testing.assert_allclose(got[0], np.full(4, 5.0))
    finally:
        SCALE = 3.0
    _compiled_without_fallback(captures=2)


def test_a_ctx_tensor_attribute_is_read_at_its_current_values() -> None:
    """``ctx.w = w`` (no save_for_backward): eager mode reads ``w`` as it is when backward
    runs, without a version check; so does the program."""

    class _ScaleBy(Function):
        @staticmethod
        def forward(ctx: Any, x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
            ctx.w = w
            return x * w

        @staticmethod
        def backward(ctx: Any, g: fg.Tensor) -> tuple:
            return g * ctx.w, None

    for compiled in (False, True, True):
        x = _leaf((4,))
        w = fg.tensor([1.0, 2.0, 3.0, 4.0], dtype=fg.float64)
        y = _ScaleBy.apply(x, w).sum()
        w.mul_(10.0)
        if compiled:
            with compiler.compiled_autograd():
                y.backward()
        else:
            y.backward()
        np.testing.assert_allclose(x.grad.numpy(), [10.0, 20.0, 30.0, 40.0])
    _compiled_without_fallback()


def test_saved_tensors_keep_their_version_check() -> None:
    x = _leaf((3,))
    h = x * 2.0
    y = _Cube.apply(h, 1.0).sum()
    with fg.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with compiler.compiled_autograd():
            y.backward()


def test_needs_input_grad_branches_are_keyed() -> None:
    class _Mul(Function):
        @staticmethod
        def forward(ctx: Any, a: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx: Any, g: fg.Tensor) -> tuple:
            a, b = ctx.saved_tensors
            ga = g * b if ctx.needs_input_grad[0] else None
            gb = g * a if ctx.needs_input_grad[1] else None
            return ga, gb

    _same(lambda a, b: _Mul.apply(a, b).sum(), (3,), (3,))

    def only_a(a: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
        return _Mul.apply(a, b.detach()).sum()

    _same(only_a, (3,), (3,))
    _compiled_without_fallback(captures=2)


def test_multiple_outputs_materialized_and_not() -> None:
    for materialize in (True, False):

        class _Split(Function):
            @staticmethod
            def forward(ctx: Any, x: fg.Tensor, materialize: bool = materialize) -> tuple:
                ctx.set_materialize_grads(materialize)
                return x * 2.0, x * 3.0

            @staticmethod
            def backward(ctx: Any, g1: Any, g2: Any) -> fg.Tensor:
                if g2 is None:  # (only without materialized gradients)
                    return g1 * 2.0
                return g1 * 2.0 + g2 * 3.0

        _same(lambda x: _Split.apply(x)[0].sum(), (4,))
        _same(lambda x: sum(o.sum() for o in _Split.apply(x)), (4,))
    assert not compiler.counters.fallbacks


def test_once_differentiable_mark_dirty_and_non_differentiable() -> None:
    class _Relu(Function):
        @staticmethod
        def forward(ctx: Any, x: fg.Tensor) -> tuple:
            out = x.clamp(min=0.0)
            mask = x > 0
            ctx.mark_non_differentiable(mask)
            ctx.save_for_backward(mask.to(x.dtype))
            return out, mask

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, g: fg.Tensor, _: Any) -> fg.Tensor:
            (m,) = ctx.saved_tensors
            return g * m

    class _AddOneInPlace(Function):
        @staticmethod
        def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
            x.add_(1.0)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
            return g * 1.0

    _same(lambda x: (_Relu.apply(x)[0] * x).sum(), (3, 4))
    _same(lambda x: _AddOneInPlace.apply(x * 1.0).pow(2).sum(), (5,))
    _compiled_without_fallback(captures=2)


def test_setup_context_style_and_saved_views() -> None:
    class _RowScale(Function):
        @staticmethod
        def forward(x: fg.Tensor, s: fg.Tensor) -> fg.Tensor:
            return x * s[:, None]

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
            x, s = inputs
            ctx.save_for_backward(x.t(), s)  # a view of an input

        @staticmethod
        def backward(ctx: Any, g: fg.Tensor) -> tuple:
            xt, s = ctx.saved_tensors
            return g * s[:, None], (g * xt.t()).sum(1)

    _same(lambda x, s: (_RowScale.apply(x, s) ** 2).sum(), (3, 4), (3,))
    _compiled_without_fallback()


def test_symbolic_sizes_serve_a_new_batch() -> None:
    class _MeanRows(Function):
        @staticmethod
        def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
            ctx.n = x.shape[0]  # (an int: in the key; the next batch size is a new key)
            ctx.save_for_backward(x)
            return x.mean(0)

        @staticmethod
        def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
            (x,) = ctx.saved_tensors
            return g.expand(x.shape[0], -1) / x.shape[0]

    class _Double(Function):
        @staticmethod
        def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
            return x * 2.0

        @staticmethod
        def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
            return g.reshape(g.shape[0], -1).mul(2.0).reshape(g.shape)

    for rows in (4, 7):
        _same(lambda x: _MeanRows.apply(x).sum(), (rows, 3), calls=1)
    assert compiler.counters.captures == 2
    for rows in (4, 7, 9):
        _same(lambda x: _Double.apply(x.exp()).sum(), (rows, 3), calls=1)
    assert compiler.counters.captures == 3  # one symbolic capture for the three batches
    assert not compiler.counters.fallbacks


def test_a_mean_in_the_backward_is_traced_with_its_count_guarded() -> None:
    """``x.mean(0)`` divides by a size: under symbolic sizes that size becomes a number the
    capture guards (a new row count captures again), not an untraceable tensor."""

    class _ByMean(Function):
        @staticmethod
        def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
            ctx.save_for_backward(x)
            return x * 2.0

        @staticmethod
        def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
            (x,) = ctx.saved_tensors
            return g * x.mean(0, keepdim=True)

    for rows in (4, 6):
        _same(lambda x: _ByMean.apply(x.exp()).sum(), (rows, 3), calls=2)
    assert not compiler.counters.opaque_functions and not compiler.counters.fallbacks
    assert compiler.counters.captures == 2


def _refusal(backward: Any, reason: str, program: Any = None, captures: int = 0) -> None:
    """A Function with this backward cannot be traced, for ``reason``: it runs as an opaque step
    of the compiled program (its eager ``backward``, where eager runs it), with eager's gradients
    and no fallback (``captures``: other backwards that compiled meanwhile)."""
    compiler.reset()

    class _F(Function):
        @staticmethod
        def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
            ctx.save_for_backward(x)
            return x * 2.0

    _F.backward = staticmethod(backward)  # type: ignore[method-assign]
    run = program or (lambda x: _F.apply(x).sum())
    _same(lambda x: run(x) if program is None else program(_F, x), (4,), calls=2)
    assert not compiler.counters.fallbacks, compiler.counters.fallbacks
    opaque = compiler.counters.opaque_functions
    assert sum(opaque.values()) == 2 and len(opaque) == 1, opaque
    assert reason in next(iter(opaque)), opaque
    assert compiler.counters.captures == 1 + captures


def test_reading_values_runs_opaquely() -> None:
    _refusal(lambda ctx, g: g * float(ctx.saved_tensors[0].sum()), "needs tensor values")


def test_branching_on_values_runs_opaquely() -> None:
    _refusal(lambda ctx, g: g * 2.0 if bool((g > 0).all()) else g, "needs tensor values")


def test_numpy_runs_opaquely() -> None:
    _refusal(lambda ctx, g: fg.tensor(np.asarray(g.detach()) * 2.0), "reads module 'numpy'")


def test_random_draws_run_opaquely() -> None:
    _refusal(lambda ctx, g: g * 2.0 + 0.0 * fg.randn(4, dtype=fg.float64), "draws random")


def test_a_refused_draw_leaves_the_generator_where_eager_finds_it() -> None:
    """The trace stops *before* the draw (``Tracer.will_draw``), so the opaque step draws the
    numbers eager mode draws, on the first call as on later ones."""

    class _Noisy(Function):
        @staticmethod
        def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
            return x * 2.0

        @staticmethod
        def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
            return g * fg.randn(4, dtype=fg.float64)

    def run(compiled: bool) -> tuple:
        fg.manual_seed(0)
        x = _leaf((4,))
        y = _Noisy.apply(x.exp()).sum()
        if compiled:
            with compiler.compiled_autograd():
                y.backward()
        else:
            y.backward()
        return x.grad.numpy(), fg.randn(3).numpy()

    grad, after = run(False)
    for _ in range(2):
        got, got_after = run(True)
        np.testing.assert_array_equal(got, grad)
        np.testing.assert_array_equal(got_after, after)


def test_in_place_writes_run_opaquely() -> None:
    # (the write into a symbolic value's memory fails before the tracer hears of it)
    _refusal(lambda ctx, g: g.clone().mul_(2.0), "needs tensor values")


LOG: list = []


def test_python_state_runs_opaquely() -> None:
    _refusal(lambda ctx, g: (LOG.append(1), g * 2.0)[1], "reads 'LOG', a list")
    _refusal(lambda ctx, g: (print(end=""), g * 2.0)[1], "builtin 'print'")


def test_an_outside_tensor_runs_opaquely() -> None:
    outside = fg.tensor([2.0, 2.0, 2.0, 2.0], dtype=fg.float64)
    _refusal(lambda ctx, g: g * outside, "reads the tensor 'outside'")


class _Nested(Function):
    """d/dx (2x), computed by a reentrant backward through ``depth`` more of these."""

    @staticmethod
    def forward(ctx: Any, x: fg.Tensor, depth: int) -> fg.Tensor:
        ctx.depth = depth
        ctx.save_for_backward(x)
        return x * 2.0

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> tuple:
        (x,) = ctx.saved_tensors
        if ctx.depth == 0:
            return g * 2.0, None
        with fg.enable_grad():
            inner = x.detach().requires_grad_()
            y = _Nested.apply(inner.sin(), ctx.depth - 1)
            (gi,) = fg.autograd.grad(y.sum(), inner)
        return g * gi, None


@pytest.mark.parametrize("depth", [1, 3])
def test_a_reentrant_backward_inside_is_captured_too(depth: int) -> None:
    """A backward() inside the backward runs the engine over the graph that code recorded, on
    symbolic values: its rules join the same program (captured with concrete sizes)."""
    _same(lambda x: (_Nested.apply(x.exp(), depth) * x).sum(), (3, 4))
    _compiled_without_fallback()


def test_a_reentrant_backward_with_create_graph_runs_opaquely() -> None:
    def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
        (x,) = ctx.saved_tensors
        with fg.enable_grad():
            inner = x.detach().requires_grad_()
            (gi,) = fg.autograd.grad((inner * inner).sum(), inner, create_graph=True)
        return g * gi.detach()

    _refusal(backward, "a backward() inside the backward", captures=1)  # (the inner compiles)


def test_errors_of_the_backward_are_eagers() -> None:
    class _TooFew(Function):
        @staticmethod
        def forward(ctx: Any, x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
            return x * y

        @staticmethod
        def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
            return g

    x, y = _leaf((2,)), _leaf((2,), 1)
    with pytest.raises(RuntimeError, match="returned an incorrect number of gradients"):
        with compiler.compiled_autograd():
            _TooFew.apply(x, y).sum().backward()
    assert x.grad is None and y.grad is None


@settings(max_examples=15, deadline=None)
@given(
    rows=st.integers(1, 5),
    cols=st.integers(1, 5),
    k=st.sampled_from([0.5, 2.0]),
    before=st.sampled_from(["exp", "tanh", "neg"]),
)
def test_random_shapes_and_neighbours_match_eager(
    rows: int, cols: int, k: float, before: str
) -> None:
    def program(x: fg.Tensor) -> fg.Tensor:
        h = getattr(x, before)()
        return (_Cube.apply(h, k) * h.sigmoid()).sum() + _Cube.apply(x, k).mean()

    compiler.reset()
    _same(program, (rows, cols), calls=2)
    assert not compiler.counters.fallbacks


class _Swish(Function):
    @staticmethod
    def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
        s = x.sigmoid()
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
        x, s = ctx.saved_tensors
        return g * (s + x * s * (1.0 - s))


@pytest.mark.parametrize("fn", [_Swish, _GlobalGain])
def test_a_whole_step_records_a_traced_function(fn: Any) -> None:
    """Inside a compiled training step the Function's backward is part of the one program; one
    whose backward reads global values the step's guard does not watch stops the recording."""

    def train(compiled: bool) -> tuple:
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(4, 8), fg.nn.Linear(8, 2)).double()
        opt = fg.optim.SGD(model.parameters(), lr=0.1)

        def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = (model[1](fn.apply(model[0](x))) - y).pow(2).mean()
            loss.backward()
            opt.step()
            return loss

        run = fg.compile(step) if compiled else step
        rng = np.random.default_rng(0)
        losses = []
        for _ in range(4):
            x = fg.tensor(rng.standard_normal((16, 4)))
            y = fg.tensor(rng.standard_normal((16, 2)))
            losses.append(float(run(x, y)))
        return losses, model[0].weight.detach().numpy()

    eager, compiled = train(False), train(True)
    np.testing.assert_allclose(compiled[0], eager[0], rtol=1e-12)
    np.testing.assert_allclose(compiled[1], eager[1], rtol=1e-12, atol=1e-14)
    if fn is _Swish:
        assert compiler.counters.step_captures == 1 and compiler.counters.step_runs == 3
        assert not compiler.counters.step_breaks
    else:
        assert compiler.counters.step_runs == 0
        assert any("reads Python values" in r for r in compiler.counters.step_breaks)


@pytest.mark.parametrize("fn", [_Swish, _GlobalGain])
def test_a_compiled_module_takes_a_traced_function_into_its_backward(fn: Any) -> None:
    """compile(model): the Function's backward is part of the module's backward program; one
    reading global values runs the module's own graph instead (a replay would not check them)."""

    class _Block(fg.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = fg.nn.Linear(4, 8)
            self.outer = fg.nn.Linear(8, 2)

        def forward(self, x: fg.Tensor) -> fg.Tensor:
            return self.outer(fn.apply(self.inner(x)))

    def grads(compiled: bool) -> list:
        fg.manual_seed(0)
        model = _Block().double()
        run = fg.compile(model) if compiled else model
        rng = np.random.default_rng(0)
        out = []
        for _ in range(3):
            for p in model.parameters():
                p.grad = None
            run(fg.tensor(rng.standard_normal((5, 4)))).pow(2).sum().backward()
            out.append(model.inner.weight.grad.numpy().copy())
        return out

    for e, c in zip(grads(False), grads(True)):
        np.testing.assert_allclose(c, e, rtol=1e-12, atol=1e-14)
    if fn is _Swish:
        assert compiler.counters.step_runs >= 2 and not compiler.counters.step_breaks
    else:
        assert any("reads Python values" in r for r in compiler.counters.step_breaks)


class _Logged(Function):
    """Appends to a list kept on its ctx (Python state: untraceable) and reads numpy."""

    @staticmethod
    def forward(ctx: Any, x: fg.Tensor, log: list) -> fg.Tensor:
        ctx.log = log
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> tuple:
        (x,) = ctx.saved_tensors
        ctx.log.append("function")
        return fg.tensor(2.0 * np.asarray(x.detach()) * np.asarray(g)), None


def _opaque_program(log: list) -> Any:
    def program(x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
        h = (x * w).tanh()
        h.register_hook(lambda g: log.append("hook") and None)  # runs after the Function
        y = _Logged.apply(h.exp(), log)
        return (y.sigmoid() * w).sum()

    return program


def test_an_untraceable_backward_is_an_opaque_step_between_compiled_kernels() -> None:
    eager_log: list = []
    _grads(False, _opaque_program(eager_log), (3, 4), (3, 4))
    log: list = []
    _same(_opaque_program(log), (3, 4), (3, 4), calls=3)  # (eager once, then compiled)
    assert eager_log == ["function", "hook"]
    assert log == eager_log * 4  # once per backward, in eager order
    assert not compiler.counters.fallbacks and compiler.counters.captures == 1
    assert sum(compiler.counters.opaque_functions.values()) == 3
    x, w = _leaf(), _leaf(seed=1)
    report = compiler.explain(lambda: _opaque_program([])(x, w).backward())
    assert not report.fallbacks
    ((_, program),) = report.captures
    ops = [v.op for v in program.graph.values]
    assert "function" in ops and "function_output" in ops
    # the rules before (sigmoid, mul) and after (exp, tanh, mul) it are fused kernels
    assert len(program.kernels) >= 2


def test_an_opaque_step_is_one_level_of_reentrant_backward() -> None:
    """A Function whose backward calls backward() on a fresh graph, a hundred levels deep: each
    level is a compiled program whose opaque step runs the next, hopping to a fresh thread every
    ``engine.MAX_REENTRANT_DEPTH`` levels, as eager does."""

    class _Inside(Function):
        @staticmethod
        def forward(ctx: Any, x: fg.Tensor, level: int, log: list) -> fg.Tensor:
            ctx.level, ctx.log = level, log
            return x * 3.0

        @staticmethod
        def backward(ctx: Any, g: fg.Tensor) -> tuple:
            ctx.log.append(ctx.level)
            if ctx.level > 0:
                with fg.enable_grad():
                    inner = fg.tensor([1.0], dtype=fg.float64, requires_grad=True)
                    _Inside.apply(inner, ctx.level - 1, ctx.log).sum().backward()
            return g * 3.0, None, None

    log: list = []
    x = _leaf((2,))
    with compiler.compiled_autograd():
        _Inside.apply(x.exp(), 100, log).sum().backward()
    assert log == list(range(100, -1, -1))
    np.testing.assert_allclose(x.grad.numpy(), 3.0 * np.exp(_leaf((2,)).detach().numpy()))
    assert compiler.counters.compiled_runs == 101 and not compiler.counters.fallbacks
    assert compiler.counters.captures == 2  # (the outer graph, and the one every level makes)


class _MaybeNone(Function):
    """Reads numpy (opaque); returns None for ``y`` when ``ctx.drop`` says so -- not a literal
    None, so the program is first built to receive a gradient there."""

    @staticmethod
    def forward(ctx: Any, x: fg.Tensor, y: fg.Tensor, drop: bool) -> fg.Tensor:
        ctx.drop = drop
        return x * y

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> tuple:
        gy = None if ctx.drop else fg.tensor(np.asarray(g) * 2.0)
        return fg.tensor(np.asarray(g) * 3.0), gy, None


def _maybe_none(drop: bool) -> tuple:
    x, y = _leaf((3,)), _leaf((3,), 1)
    with compiler.compiled_autograd():
        _MaybeNone.apply(x, y.exp(), drop).sum().backward()
    return x.grad, y.grad


def test_a_none_where_the_program_expected_a_gradient_is_refused_then_learned() -> None:
    compiler.counters.fallbacks.clear()
    gx, gy = _maybe_none(False)
    assert gx is not None and gy is not None
    with pytest.raises(RuntimeError, match=r"MaybeNoneBackward returned None .* input 1"):
        _maybe_none(True)
    gx, gy = _maybe_none(True)  # (built without a gradient there now: eager's .grad None)
    np.testing.assert_allclose(gx.numpy(), 3.0)
    assert gy is None
    with pytest.raises(RuntimeError, match=r"returned a gradient for input 1, where compiled"):
        _maybe_none(False)  # the other way round: never dropped silently
    gx, gy = _maybe_none(False)
    np.testing.assert_allclose(gy.numpy(), 2.0 * np.exp(_leaf((3,), 1).detach().numpy()))
    assert not compiler.counters.fallbacks


def test_what_every_return_passes_is_read_from_the_bytecode() -> None:
    from fusegrad.compiler.functions import return_sources

    def two_returns(ctx: Any, g: fg.Tensor, h: fg.Tensor) -> tuple:
        if ctx.flag:
            return g * 2.0, None, h
        return (None, None, None)

    def built_elsewhere(ctx: Any, g: fg.Tensor) -> tuple:
        out = (g, None)
        return out

    def reassigned(ctx: Any, g: fg.Tensor) -> fg.Tensor:
        g = g * 2.0
        return g

    assert return_sources(two_returns) == {1: None}
    assert return_sources(built_elsewhere) == {}
    assert return_sources(reassigned) == {}
    assert return_sources(lambda ctx, g: (g.sin(), g, None)) == {1: 0, 2: None}
    assert return_sources(lambda ctx, g: g) == {0: 0}


def test_a_whole_step_breaks_at_an_opaque_function() -> None:
    log: list = []
    w = _leaf((3,))
    opt = fg.optim.SGD([w], lr=0.1)

    @compiler.compile
    def step(x: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = _Logged.apply(x * w, log).sum()
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        step(_leaf((3,), 2).detach())
    assert log == ["function"] * 3
    (reason,) = compiler.counters.step_breaks
    assert "_LoggedBackward" in reason and "numpy" in reason
