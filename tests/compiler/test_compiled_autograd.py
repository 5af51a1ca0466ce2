"""Compiled autograd vs eager: values *and* how many captures / fallbacks happened.

Every differentiable op of the op table runs its backward compiled (with the IR verified after
capture and after every pass) and must give the eager gradients; then the cache, fallback and
state rules of the compiled path (docs/ARCHITECTURE.md, contracts 4 and 5).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest
import random_programs
from hypothesis import given, settings
from hypothesis import strategies as st
from op_table import FG, OPS, build, flat_outputs, is_float

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler.capture import capture as capture_graph
from fusegrad.compiler.key import walk as walk_graph

GRAD_CASES = [(e, s) for e in OPS for s in e.get_samples() if e.differentiable and s.grad]
# numba compiles each new kernel (~0.3 s): the generated-code run covers the first sample of
# every op; the reference executor (mode="debug") covers every sample
FIRST_CASES = list({e.name: (e, s) for e, s in reversed(GRAD_CASES)}.values())


pytestmark = pytest.mark.usefixtures("fresh_compiler")


def _grads(entry: Any, sample: Any, compiled: bool, mode: str = "default") -> tuple[list, list]:
    leaves, fn = build(entry, FG, sample, "float64")
    outs = [o for o in flat_outputs(fn(*leaves)) if is_float(o) and o.requires_grad]
    if not leaves or not outs:
        return [], []
    rng = np.random.default_rng(7)
    cots = [fg.tensor(rng.standard_normal(tuple(o.shape))) for o in outs]
    if compiled:
        with compiler.compiled_autograd(mode=mode):
            fg.autograd.backward(outs, cots)
    else:
        fg.autograd.backward(outs, cots)
    return leaves, [None if t.grad is None else t.grad.numpy() for t in leaves]


def _check_op(entry: Any, sample: Any, mode: str, tol: float) -> None:
    leaves, eager = _grads(entry, sample, compiled=False)
    if not leaves:
        pytest.skip("no differentiable input")
    _, compiled = _grads(entry, sample, compiled=True, mode=mode)
    for e, c in zip(eager, compiled):
        assert (e is None) == (c is None)
        if e is not None:
            np.testing.assert_allclose(c, e, rtol=tol, atol=tol)
    counts = compiler.counters
    assert counts.compiled_runs + sum(counts.fallbacks.values()) == 1
    assert counts.captures == counts.compiled_runs
    for reason in counts.fallbacks:  # only data-dependent shapes and complex values fall back
        assert "data-dependent" in reason or "a complex value" in reason, reason


@pytest.mark.parametrize(
    "entry,sample", GRAD_CASES, ids=[f"{e.name}-{s.name}" for e, s in GRAD_CASES]
)
def test_op_table_reference_executor_matches_eager(entry: Any, sample: Any) -> None:
    _check_op(entry, sample, "debug", 1e-12)


@pytest.mark.parametrize(
    "entry,sample", FIRST_CASES, ids=[f"{e.name}-{s.name}" for e, s in FIRST_CASES]
)
def test_op_table_generated_code_matches_eager(entry: Any, sample: Any) -> None:
    # float64 throughout; fused loops may contract a*b+c into an FMA and reassociate sums
    previous = compiler.config.interpreter_max_elements
    compiler.config.interpreter_max_elements = 0  # every kernel as generated code
    try:
        _check_op(entry, sample, "default", 1e-10)
    finally:
        compiler.config.interpreter_max_elements = previous


@pytest.mark.parametrize(
    "entry,sample", FIRST_CASES, ids=[f"{e.name}-{s.name}" for e, s in FIRST_CASES]
)
def test_op_table_interpreter_matches_eager(entry: Any, sample: Any) -> None:
    previous = compiler.config.interpreter_max_elements
    compiler.config.interpreter_max_elements = 1 << 30  # every eligible kernel interpreted
    try:
        _check_op(entry, sample, "default", 1e-10)
    finally:
        compiler.config.interpreter_max_elements = previous


def _model(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
    return ((x * w + b).tanh() * x.sigmoid() + (-x * x).exp() * 0.5).sum()


def _leaves(n: int, seed: int = 0, bshape: tuple = (1,)) -> list:
    rng = np.random.default_rng(seed)
    return [
        fg.tensor(rng.standard_normal(n).astype(np.float32), requires_grad=True),
        fg.tensor(rng.standard_normal(n).astype(np.float32), requires_grad=True),
        fg.tensor(rng.standard_normal(bshape).astype(np.float32), requires_grad=True),
    ]


def test_ten_steps_capture_once_and_match_eager() -> None:
    ref = _leaves(64)
    _model(*ref).backward()
    leaves = _leaves(64)

    def step() -> None:
        with compiler.compiled_autograd():  # the backward compiled on its own
            _model(*leaves).backward()

    for _ in range(10):
        for t in leaves:
            t.grad = None
        step()
    assert compiler.counters.captures == 1
    assert compiler.counters.cache_hits == 9
    for a, b in zip(leaves, ref):  # float32: fused loops may contract and reassociate
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_new_batch_size_reuses_the_graph_and_a_broadcast_change_is_logged(caplog: Any) -> None:
    compiler.set_logs("recompiles")
    try:
        with caplog.at_level("INFO", logger="fusegrad.compiler"):
            with compiler.compiled_autograd():
                for n in (64, 128, 37, 1000):  # same structure, new sizes: no capture
                    leaves = _leaves(n)
                    _model(*leaves).backward()
                    want = _leaves(n)
                    _model(*want).backward()
                    for a, b in zip(leaves, want):
                        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5)
                assert compiler.counters.captures == 1
                _model(*_leaves(128, bshape=(128,))).backward()  # broadcast pattern changed
    finally:
        compiler.set_logs(None)
    assert compiler.counters.captures == 2
    text = caplog.text
    assert "first capture" in text
    assert "dim 0: 1 -> a size of 2 or more" in text


def test_grad_identity_is_kept_and_accumulates_in_place() -> None:
    leaves = _leaves(16)
    _model(*leaves).backward()
    grads = [t.grad for t in leaves]
    before = [g.numpy().copy() for g in grads]
    with compiler.compiled_autograd():
        _model(*leaves).backward()
    for t, g, b in zip(leaves, grads, before):
        assert t.grad is g
        np.testing.assert_allclose(g.numpy(), 2 * b, rtol=1e-6)


def test_retain_graph_interleaving_eager_and_compiled() -> None:
    leaves = _leaves(16)
    loss = _model(*leaves)
    loss.backward(retain_graph=True)
    once = [t.grad.numpy().copy() for t in leaves]
    with compiler.compiled_autograd():
        loss.backward(retain_graph=True)
    loss.backward(retain_graph=True)
    with compiler.compiled_autograd():
        loss.backward()  # frees the graph
    for t, g in zip(leaves, once):
        np.testing.assert_allclose(t.grad.numpy(), 4 * g, rtol=1e-5)
    with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
        with compiler.compiled_autograd():
            loss.backward()


def test_autograd_grad_compiled_does_not_touch_grad() -> None:
    x, w, b = _leaves(8)
    y = _model(x, w, b)
    eager = fg.autograd.grad(y, [x, b], retain_graph=True)
    with compiler.compiled_autograd():
        got = fg.autograd.grad(y, [x, b])
    assert x.grad is None and b.grad is None
    for e, g in zip(eager, got):
        np.testing.assert_allclose(e.numpy(), g.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call", ["grad", "backward_inputs"])
def test_a_non_leaf_input_leaves_its_history_to_later_backwards(call: str) -> None:
    # eager runs only the nodes between the roots and the inputs: the history of a non-leaf
    # input is neither run, nor checked, nor freed (the compiled program freed it once)
    def run(compiled: bool) -> list:
        a = fg.tensor(np.linspace(-1.0, 1.0, 6), requires_grad=True)
        x = (a * a).tanh()  # its history saves a and the tanh's output
        y = (x * x).sum()
        with compiler.compiled_autograd() if compiled else _no_region():
            if call == "grad":
                (g,) = fg.autograd.grad(y, x)
            else:
                y.backward(inputs=[x])
                g = x.grad
        (x * 3.0).sum().backward()  # runs x's history, which must still hold its tensors
        return [g.numpy().copy(), a.grad.numpy().copy()]

    want = run(False)
    for _ in range(2):  # capture, then the cached program
        got = run(True)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_a_stale_saved_tensor_beyond_the_inputs_is_not_an_error() -> None:
    # as in eager: a saved tensor modified in place after it was saved only matters if its
    # node runs, and grad() with respect to x does not run x's history
    for compiled in (False, True, True):
        a = fg.tensor(np.linspace(-1.0, 1.0, 6), requires_grad=True)
        c = a * 1.0
        x = c.sin()  # saves c
        y = (x * x).sum()
        c.add_(1.0)  # sin's saved c is stale now
        with compiler.compiled_autograd() if compiled else _no_region():
            (g,) = fg.autograd.grad(y, x)
        np.testing.assert_allclose(g.numpy(), 2 * x.detach().numpy(), rtol=1e-12)


def _no_region() -> Any:
    return contextlib.nullcontext()


def test_a_slow_compile_says_what_is_compiling_once(capsys: Any, monkeypatch: Any) -> None:
    # config.compile_notice_s = 0: every capture or new program counts as slow
    monkeypatch.setattr(compiler.config, "compile_notice_s", 0.0)
    x = fg.tensor(np.linspace(-1.0, 1.0, 8), requires_grad=True)

    def step() -> None:
        x.grad = None  # (a .grad that exists is another program)
        with compiler.compiled_autograd():
            (x.tanh() * x).sum().backward()

    step()
    err = capsys.readouterr().err
    assert err.count("fusegrad.compiler: compiling the backward of a 4-node graph") == 1, err
    assert err.count("\n") == 1
    step()  # a cache hit: silent
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(compiler.config, "compile_notice_s", None)
    compiler.reset()
    step()  # a capture again, but notices are off
    assert capsys.readouterr().err == ""
    assert compiler.counters.captures == 1


def test_version_check_raises_before_any_grad_is_written() -> None:
    x, w, b = _leaves(8)
    y = _model(x, w, b)
    with fg.no_grad():
        w.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with compiler.compiled_autograd():
            y.backward()
    assert x.grad is None and w.grad is None and b.grad is None


class _Square(fg.autograd.Function):
    """A custom Function whose backward reads values on the host (``.item()``): it cannot be
    traced, so its backward runs eagerly, as an opaque step of the program."""

    @staticmethod
    def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * g * float(x.sum().item() != 0.0)


def test_an_untraceable_function_is_an_opaque_step_with_its_reason() -> None:
    def program(x: fg.Tensor) -> fg.Tensor:
        return (_Square.apply(x.exp()) * x).sum()

    x_ref = fg.tensor([0.5, -1.0, 2.0], dtype=fg.float64, requires_grad=True)
    program(x_ref).backward()
    x = fg.tensor([0.5, -1.0, 2.0], dtype=fg.float64, requires_grad=True)
    with compiler.compiled_autograd():
        program(x).backward()
    np.testing.assert_allclose(x.grad.numpy(), x_ref.grad.numpy(), rtol=1e-12)
    assert compiler.counters.captures == 1 and not compiler.counters.fallbacks
    ((reason, count),) = compiler.counters.opaque_functions.items()
    assert "SquareBackward needs tensor values" in reason and count == 1


def test_fullgraph_raises_instead_of_falling_back() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = _Square.apply(x).sum()
    with pytest.raises(compiler.CompilationError, match=r"SquareBackward needs tensor values"):
        fg.compile(lambda: y.backward(), fullgraph=True)()
    assert x.grad is None


def test_explain_reports_graphs_and_fallbacks() -> None:
    leaves = _leaves(8)
    report = compiler.explain(lambda: _model(*leaves).backward())
    text = str(report)
    assert "1 graph(s) captured, 0 fallback(s)" in text
    assert "tanh" not in text or "TanhBackward0" in text
    assert "grad[0]" in text and "grad[2]" in text
    x = fg.tensor([1.0], requires_grad=True)
    report = compiler.explain(lambda: _Square.apply(x).sum().backward())
    assert not report.fallbacks and "needs tensor values" in report.opaque[0]
    assert "opaque step (a custom Function's backward, run eagerly)" in str(report)


def test_symbolic_values_never_run_kernels() -> None:
    x, w, b = _leaves(4)
    y = _model(x, w, b)
    w_ = walk_graph([y], [fg.ones_like(y)], None, True, False)
    graph = capture_graph(w_, [y], [fg.ones_like(y)], None, True).graph
    assert x.grad is None  # capture recorded the .grad writes as effects, performed none
    assert sorted(slot for kind, slot, _ in graph.effects if kind == "grad") == [0, 1, 2]


# ---- random graphs ----------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    ops=random_programs.steps(12),
    shapes=random_programs.SHAPES,
    reduce_dim=st.sampled_from([None, 0, -1]),
)
def test_random_graphs_compiled_match_eager(ops: list, shapes: tuple, reduce_dim: Any) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in shapes]

    def run(compiled: bool) -> list:
        leaves = [fg.tensor(a, requires_grad=True) for a in arrays]
        out = sum(
            v.sum() if reduce_dim is None or v.ndim == 0 else v.sum(reduce_dim).sum()
            for v in random_programs.run(ops, list(leaves))
        )
        if compiled:
            with compiler.compiled_autograd():
                out.backward()
        else:
            out.backward()
        return [None if t.grad is None else t.grad.numpy() for t in leaves]

    eager, comp = run(False), run(True)
    for e, c in zip(eager, comp):
        assert (e is None) == (c is None)
        if e is not None:
            np.testing.assert_allclose(c, e, rtol=1e-12, atol=1e-12)


def test_compiled_regions_are_per_thread() -> None:
    import threading

    x = fg.tensor([1.0, 2.0], requires_grad=True)
    inside = threading.Event()
    release = threading.Event()

    def other_thread() -> None:
        with compiler.compiled_autograd():
            inside.set()
            release.wait(5)

    t = threading.Thread(target=other_thread)
    t.start()
    inside.wait(5)
    try:
        (x * x).sum().backward()  # this thread is not in a compiled region: eager
    finally:
        release.set()
        t.join()
    assert compiler.counters.compiled_runs == 0
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


def test_log_channels_report_graph_fusion_and_timing(caplog: Any) -> None:
    compiler.set_logs("graph,fusion,perf,cache")
    try:
        with caplog.at_level("INFO", logger="fusegrad.compiler"):
            x = fg.randn(6, requires_grad=True)
            with compiler.compiled_autograd():
                for _ in range(2):
                    x.grad = None  # same .grad state: the second call hits the cache
                    x.tanh().sum().backward()
    finally:
        compiler.set_logs(None)
    text = caplog.text
    assert "backward graph:" in text and "tanh" not in text.split("backward graph:")[0]
    assert "kernel over [s0] = [6]" in text  # symbolic sizes, and their values at capture
    assert "first run" in text
    assert "program cache hit" in text
    with pytest.raises(ValueError, match="unknown log channels"):
        compiler.set_logs("graph,nonsense")


def test_an_eager_backward_in_another_thread_during_a_capture_is_unaffected() -> None:
    import threading

    x = fg.tensor(np.linspace(-1, 1, 50), requires_grad=True)
    other = fg.tensor(np.linspace(0.5, 2, 50), requires_grad=True)
    expected = 1 / other.detach().numpy()  # d/dx sum(log x) = 1/x
    results: dict = {}
    started, finish = threading.Event(), threading.Event()

    def eager_worker() -> None:
        started.wait(5)  # runs while the main thread is inside its capture
        loss = other.log().sum()
        loss.backward()
        results["grad"] = other.grad.numpy().copy()
        finish.set()

    from fusegrad.compiler.capture import SymbolicTensor

    real_of = SymbolicTensor.of.__func__  # type: ignore[attr-defined]

    calls = [0]

    def of(cls: Any, value: Any, env: Any) -> Any:
        # from the second call on (the first makes the root gradient, before the capture is
        # this thread's tracer and the engine's executor) the capture is live: let the other
        # thread run a whole eager backward now
        calls[0] += 1
        if calls[0] == 2:
            started.set()
            finish.wait(5)
        return real_of(cls, value, env)

    t = threading.Thread(target=eager_worker)
    t.start()
    SymbolicTensor.of = classmethod(of)  # type: ignore[method-assign,assignment]
    try:
        with compiler.compiled_autograd():
            (x.exp() * x).sum().backward()
    finally:
        SymbolicTensor.of = classmethod(real_of)  # type: ignore[method-assign,assignment]
        started.set()
        t.join(10)
    np.testing.assert_allclose(results["grad"], expected, rtol=1e-12)
    xs = x.detach().numpy()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(xs) * (1 + xs), rtol=1e-10)
