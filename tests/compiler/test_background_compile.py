"""Whole steps compiled in the background (``config.background_compile``): when a step's program
needs numba's JIT, the JIT runs on a thread of its own while the calls replay the step
uncompiled (each recorded value by its eager kernel); the compiled program takes over at the
first call after it is ready.  Either way every call has eager's effects: parameters, optimizer
state, dropout's random numbers, returned values."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler import workers
from fusegrad.compiler.passes.fuse import Extern
from fusegrad.compiler.program import Program
from fusegrad.compiler.settings import config

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # ``benchmarks`` is a package at the repository root
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import models  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_compiler")


@pytest.fixture
def background(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Background compile on; yields a gate: while it is closed, background compiles wait for
    it before compiling."""
    monkeypatch.setattr(config, "background_compile", True)
    # (the compile thread's own logic; worker processes: tests/compiler/test_compile_workers.py)
    monkeypatch.setattr(config, "compile_workers", False)
    # (no second stage to native segments: tests/compiler/test_native_programs.py)
    monkeypatch.setattr(config, "native_programs", False)
    # (a quick tier compiles its interpreter: no call waits for it, as none waits for a compile;
    # a call waits for a quick tier that only loads it: the quick tier's test below)
    monkeypatch.setattr(workers, "interpreter_ready", lambda dtype: False)
    gate = threading.Event()
    gate.set()
    prepare = Program.prepare

    def gated(self: Program, *args: Any, **kwargs: Any) -> float:
        # (a whole step's prepare takes arrays and leaves; a backward's also roots and sizes)
        assert gate.wait(60), "the test never opened the gate"
        return prepare(self, *args, **kwargs)

    monkeypatch.setattr(Program, "prepare", gated)
    yield gate
    gate.set()
    assert compiler.wait_for_compiles(60)


def _train(
    kind: str,
    compiled: bool,
    steps: int,
    gate: Any = None,
    open_at: int = 0,
    each: Callable[[int], None] | None = None,
) -> tuple:
    """``steps`` AdamW steps of ``benchmarks.models``' ``kind`` in float64 (dropout on for the
    GPT) with the learning rate changing every step; the gate opens before call ``open_at``
    and the background compile is waited for then (so later calls run compiled code);
    ``each(i)`` is called before call ``i``."""
    sizes = {"vocab": 17, "width": 16, "heads": 4, "block": 8} if kind == "gpt" else {}
    fg.manual_seed(0)
    model = models.make(fg, kind, fg.float64, **sizes)
    opt = fg.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)

    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = models.loss(fg, model, x, y)
        loss.backward()
        opt.step()
        return loss

    fn = fg.compile(step) if compiled else step
    rng = np.random.default_rng(1)
    fg.manual_seed(2)  # dropout draws from here on
    losses, uncompiled = [], []
    for i in range(steps):
        if each is not None:
            each(i)
        if gate is not None and i == open_at:
            gate.set()
            assert compiler.wait_for_compiles(60)
        for group in opt.param_groups:
            group["lr"] = 1e-2 * (1 - i / (2 * steps))
        x, y = models.batch(fg, kind, rng, dtype=fg.float64, **sizes)
        before = compiler.counters.uncompiled_runs
        losses.append(fn(x, y).item())
        uncompiled.append(compiler.counters.uncompiled_runs > before)
    return model, losses, uncompiled


def _same_parameters(got: Any, want: Any, atol: float) -> None:
    """Two models' parameters equal to rtol 1e-9 (and ``atol``), each named when it is not."""
    for (name, p), q in zip(got.named_parameters(), want.parameters()):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=atol, err_msg=name
        )


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_uncompiled_then_compiled_calls_match_eager(kind: str, background: Any) -> None:
    want_model, want, _ = _train(kind, False, 10)
    compiler.reset()
    background.clear()  # the JIT waits: calls 3 to 6 run the step uncompiled
    got_model, got, uncompiled = _train(kind, True, 10, background, open_at=6)
    # call 1 makes AdamW's state (eager), call 2 records, calls 3-6 replay uncompiled while
    # the program compiles, calls 7-10 run the compiled program
    assert uncompiled == [False, False, True, True, True, True, False, False, False, False]
    counters = compiler.counters
    assert (counters.step_captures, counters.background_compiles) == (1, 1), counters
    assert counters.step_runs == 8 and counters.uncompiled_runs == 4, counters
    assert not counters.step_breaks
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    # (eager's layer norm is a fused kernel, the program's the composite: they sum in another
    # order, so small parameters differ by about 1e-11 after ten AdamW steps)
    _same_parameters(got_model, want_model, atol=1e-10)


@pytest.mark.parametrize("interpreter_ready", [False, True])
def test_a_whole_step_runs_its_quick_tier_while_its_program_compiles(
    monkeypatch: pytest.MonkeyPatch, interpreter_ready: bool
) -> None:
    """A whole step whose program of steps generates row kernels (the GPT's layer norms and
    softmaxes) first publishes its quick tier (``Program.quick``: everything interpreted or
    by eager kernels, no code generated), which runs compiled while the program of steps
    compiles; that one takes over when ready.  Where the interpreter is on disk (or loaded)
    the quick tier only loads it, and the call that started the job waits for it
    (``service.LOAD_WAIT``) rather than run uncompiled beside the load.  Every call equals
    eager's step."""
    monkeypatch.setattr(config, "background_compile", True)
    monkeypatch.setattr(config, "compile_workers", False)
    monkeypatch.setattr(config, "native_programs", False)
    monkeypatch.setattr(workers, "interpreter_ready", lambda dtype: interpreter_ready)
    gate, waiting = threading.Event(), threading.Event()
    prepare, run_step = Program.prepare, Program.run_step
    ran: list[tuple[str, bool]] = []

    def gated(self: Program, *args: Any, **kwargs: Any) -> float:
        if not self.quick:  # (the quick tier compiles, and is published, before this)
            waiting.set()
            assert gate.wait(60), "the test never opened the gate"
        return prepare(self, *args, **kwargs)

    def noted(self: Program, *args: Any, **kwargs: Any) -> Any:
        ran.append((self.mode, self.quick))
        return run_step(self, *args, **kwargs)

    def each(i: int) -> None:
        if i == 3:  # (the background compile started at call 3)
            assert waiting.wait(60)

    monkeypatch.setattr(Program, "prepare", gated)
    monkeypatch.setattr(Program, "run_step", noted)
    want_model, want, _ = _train("gpt", False, 10)
    compiler.reset()
    ran.clear()
    got_model, got, uncompiled = _train("gpt", True, 10, gate, open_at=6, each=each)
    # call 3 uncompiled (or the quick tier, where it only loads), calls 4-6 the quick tier,
    # calls 7-10 the program of steps
    quick = 3 + interpreter_ready
    assert uncompiled == [False, False, not interpreter_ready] + [False] * 7
    first = [("debug", False)] * (not interpreter_ready)  # (the uncompiled run's program)
    assert ran == first + [("default", True)] * quick + [("default", False)] * 4, ran
    counters = compiler.counters
    assert counters.background_compiles == 1 and not counters.step_breaks
    assert (counters.step_runs, counters.uncompiled_runs, counters.quick_runs) == (
        8,
        1 - interpreter_ready,
        quick,
    )
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    _same_parameters(got_model, want_model, atol=1e-10)


def test_after_the_quick_tier_come_the_generated_larger_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A whole step (a layer norm and elementwise work over 64 x 128) whose program of steps
    generates row kernels and interprets kernels over
    ``GENERATED_ABOVE`` elements: after its quick tier, the next program the calls run is the
    one with those kernels generated (the native candidate's rival), not the program of steps
    with them interpreted, which is never built (its native candidate fails here, so it stays).
    Every call equals eager's step."""
    from fusegrad.compiler import service as _service

    monkeypatch.setattr(config, "background_compile", True)
    monkeypatch.setattr(config, "compile_workers", False)
    monkeypatch.setattr(config, "native_programs", None)
    monkeypatch.setattr(config, "remember_trials", False)
    monkeypatch.setattr(workers, "interpreter_ready", lambda dtype: False)  # (see ``background``)
    gate, waiting = threading.Event(), threading.Event()
    prepare, run_step = Program.prepare, Program.run_step
    ran: list[tuple[bool, int]] = []
    prepared: list[tuple[bool, int]] = []

    def gated(self: Program, *args: Any, **kwargs: Any) -> float:
        if self.native:
            raise RuntimeError("no native candidate in this test")
        prepared.append((self.quick, self.interpreter_max_elements))
        if not self.quick:
            waiting.set()
            assert gate.wait(60), "the test never opened the gate"
        return prepare(self, *args, **kwargs)

    def noted(self: Program, *args: Any, **kwargs: Any) -> Any:
        if self.mode == "default":
            ran.append((self.quick, self.interpreter_max_elements))
        return run_step(self, *args, **kwargs)

    monkeypatch.setattr(Program, "prepare", gated)
    monkeypatch.setattr(Program, "run_step", noted)

    def run(compiled: bool) -> tuple:
        rng = np.random.default_rng(5)
        w = fg.tensor(rng.standard_normal((32, 128)) / 6, requires_grad=True)
        g = fg.tensor(1 + rng.standard_normal(128) / 6, requires_grad=True)
        opt = fg.optim.SGD([w, g], lr=0.05)

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            h = x @ w
            n = fg.nn.functional.layer_norm(h, (128,), weight=g)
            loss = (n.tanh() * n).sum() + (h.tanh() * h.sigmoid()).square().sum()
            loss.backward()
            opt.step()
            return loss

        fn = fg.compile(step) if compiled else step
        losses = []
        for i in range(9):
            if compiled and i == 3:
                assert waiting.wait(60)
            if compiled and i == 6:
                gate.set()
                assert compiler.wait_for_compiles(120)
            losses.append(fn(fg.tensor(rng.standard_normal((64, 32)))).item())
        return losses, w.detach().numpy(), g.detach().numpy()

    want = run(False)
    compiler.reset()
    ran.clear()
    got = run(True)
    limit, default = _service.GENERATED_ABOVE, config.interpreter_max_elements
    # (SGD makes no state: the second call starts the background compile, and the third runs
    # the quick tier or, when it is not published yet, uncompiled)
    assert ran[-3:] == [(False, limit)] * 3 and set(ran[:-3]) == {(True, default)}, ran
    assert len(ran) in (6, 7), ran
    # compiled: the quick tier, then the larger kernels generated (the program of steps with
    # them interpreted is built, to be named, but never compiled)
    assert prepared == [(True, default), (False, limit)], prepared
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_the_quick_tier_generates_no_code_and_matches_eager(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole steps built as their quick tier (``config.quick_programs`` True, in the
    foreground): no kernel is generated code -- those the interpreter cannot run (the GPT's
    cross-entropy over int64 targets) run value by value through eager kernels -- no later
    candidate follows, and ten steps equal eager's."""
    from fusegrad.compiler import service as _service

    monkeypatch.setattr(config, "background_compile", False)
    monkeypatch.setattr(config, "quick_programs", True)
    build = _service.Service.build
    built: list[Program] = []

    def noted(self: Any, graph: Any, **kwargs: Any) -> Program:
        program = build(self, graph, **kwargs)
        built.append(program)
        return program

    monkeypatch.setattr(_service.Service, "build", noted)
    want_model, want, _ = _train(kind, False, 10)
    compiler.reset()
    got_model, got, uncompiled = _train(kind, True, 10)
    assert built and not any(uncompiled)
    assert compiler.counters.step_runs == 8 and not compiler.counters.step_breaks
    split = set()
    for program in built:
        assert program.quick and not _service._upgrades(program)
        assert not _service._generates_more(program, None)
        assert _service._generated_kernels(program) == 0
        assert program.default.schedule.interpreted
        split |= {s.value.op for s in program.fused if isinstance(s, Extern)}
    if kind == "gpt":  # (the int64 kernel of cross-entropy's ignored targets, value by value)
        assert {"eq", "where"} <= split, split
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    _same_parameters(got_model, want_model, atol=1e-10)


def test_compiled_program_takes_over_without_waiting(background: Any) -> None:
    """Nobody waits: the calls go on uncompiled until the thread is done, and from the first
    call after that on, compiled (eager's results throughout)."""
    want_model, want, _ = _train("mlp", False, 30)
    compiler.reset()
    got_model, got, uncompiled = _train("mlp", True, 30)
    assert uncompiled[:3] == [False, False, True]
    first_compiled = uncompiled.index(False, 2) if False in uncompiled[2:] else len(uncompiled)
    assert not any(uncompiled[first_compiled:])  # never back to uncompiled
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    for p, q in zip(got_model.parameters(), want_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-12)


def _gated_linear_step() -> tuple:
    """A compiled SGD step of a linear layer, called until its background compile starts (and
    waits at the closed gate); the step and its argument."""
    model = fg.nn.Linear(5, 3).double()
    opt = fg.optim.SGD(model.parameters(), lr=0.1)

    @fg.compile
    def step(x: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    x = fg.randn(4, 5, dtype=fg.float64)
    for _ in range(3):
        step(x)
    return step, x


def test_wait_for_compiles_times_out_while_the_jit_runs(background: Any) -> None:
    background.clear()
    step, x = _gated_linear_step()
    assert compiler.counters.background_compiles == 1
    assert not compiler.wait_for_compiles(0.05)  # the thread waits at the gate
    background.set()
    assert compiler.wait_for_compiles(60)
    before = compiler.counters.uncompiled_runs
    step(x)
    assert compiler.counters.uncompiled_runs == before  # compiled code from now on


def test_a_failed_background_run_is_redone_by_the_next_call(
    background: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread's run raising (here: a stand-in failure) loses nothing: the next call runs
    the program itself, as a synchronous first run does, with eager's results."""
    prepare = Program.prepare

    def failing(self: Program, arrays: list, leaves: list) -> float:
        raise RuntimeError("stand-in for a failed JIT")

    monkeypatch.setattr(Program, "prepare", failing)
    want_model, want, _ = _train("mlp", False, 6)
    compiler.reset()
    got_model, got, uncompiled = _train("mlp", True, 6)
    assert compiler.wait_for_compiles(60)
    monkeypatch.setattr(Program, "prepare", prepare)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    for p, q in zip(got_model.parameters(), want_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-12)
    assert compiler.counters.background_compiles == 1


def test_the_background_run_leaves_the_real_tensors_alone(background: Any) -> None:
    """The thread's run reads the parameters but writes only its own buffers and scratch
    leaves: while it ran (gate open, waited for), no parameter, ``.grad`` or version moved."""
    background.clear()
    model = fg.nn.Sequential(fg.nn.Linear(6, 8), fg.nn.Tanh(), fg.nn.Linear(8, 2)).double()
    opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @fg.compile
    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = fg.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    x = fg.randn(5, 6, dtype=fg.float64)
    y = fg.tensor([0, 1, 1, 0, 1])
    for _ in range(3):
        step(x, y)
    assert compiler.counters.background_compiles == 1
    params = [p.detach().numpy().copy() for p in model.parameters()]
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    versions = [p._version for p in model.parameters()]
    state = [opt.state[p]["momentum_buffer"].numpy().copy() for p in model.parameters()]
    background.set()
    assert compiler.wait_for_compiles(60)
    assert [p._version for p in model.parameters()] == versions
    for p, a, g, m in zip(model.parameters(), params, grads, state):
        np.testing.assert_array_equal(p.detach().numpy(), a)
        np.testing.assert_array_equal(p.grad.numpy(), g)
        np.testing.assert_array_equal(opt.state[p]["momentum_buffer"].numpy(), m)


def test_off_the_call_that_builds_the_program_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``config.background_compile = False``: no thread, no uncompiled calls; the third call
    builds, compiles and runs the program."""
    monkeypatch.setattr(config, "background_compile", False)
    _, _, uncompiled = _train("mlp", True, 5)
    assert not any(uncompiled)
    assert compiler.counters.background_compiles == 0
    assert compiler.counters.step_runs == 3


def test_compiled_module_forward_and_outside_backward(background: Any) -> None:
    """``fusegrad.compile(model)``: the forward's program and the backward's (run by the
    outputs' node when ``loss.backward()`` is called outside) are built on threads; until they
    are ready both run uncompiled, with eager's gradients and updates throughout."""

    def train(compiled: bool, gate: Any = None) -> tuple:
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(6, 16), fg.nn.GELU(), fg.nn.Linear(16, 3)).double()
        net = fg.compile(model) if compiled else model
        opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        rng = np.random.default_rng(4)
        losses, uncompiled = [], []
        for i in range(8):
            if gate is not None and i == 5:
                gate.set()
                assert compiler.wait_for_compiles(60)
            x = fg.tensor(rng.standard_normal((5, 6)))
            y = fg.tensor(rng.integers(0, 3, 5))
            before = compiler.counters.uncompiled_runs
            opt.zero_grad()
            loss = fg.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            uncompiled.append(compiler.counters.uncompiled_runs - before)
        return model, losses, uncompiled

    want_model, want, _ = train(False)
    compiler.reset()
    background.clear()
    got_model, got, uncompiled = train(True, background)
    # call 1 records the forward (its backward: compiled autograd's, whose program compiles
    # on a thread while the engine runs it); calls 2-5 start the module's two builds and run
    # the forward and the backward uncompiled; 6-8 compiled
    assert uncompiled == [1, 2, 2, 2, 2, 0, 0, 0], uncompiled
    assert compiler.counters.background_compiles == 3
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    for p, q in zip(got_model.parameters(), want_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_compiled_autograd_runs_eagerly_while_its_program_compiles(background: Any) -> None:
    """A backward in ``compiled_autograd()`` whose program has not run yet: the program is
    compiled on a thread and the eager engine runs this backward (and the next ones, until
    the thread is done); then the program runs them, with eager's gradients throughout."""
    background.clear()
    rng = np.random.default_rng(7)
    w = fg.tensor(rng.standard_normal((6, 4)), requires_grad=True)
    grads, kinds = [], []
    with compiler.compiled_autograd():
        for i in range(5):
            if i == 3:
                background.set()
                assert compiler.wait_for_compiles(60)
            x = fg.tensor(rng.standard_normal((3, 6)))
            before = (compiler.counters.uncompiled_runs, compiler.counters.compiled_runs)
            w.grad = None
            (x @ w).tanh().square().sum().backward()
            after = (compiler.counters.uncompiled_runs, compiler.counters.compiled_runs)
            kinds.append("eager" if after[0] > before[0] else "compiled")
            want = (
                (1 - np.tanh(x.numpy() @ w.detach().numpy()) ** 2)
                * 2
                * np.tanh(x.numpy() @ w.detach().numpy())
            )
            grads.append((w.grad.numpy().copy(), x.numpy().T @ want))
    assert kinds == ["eager", "eager", "eager", "compiled", "compiled"]
    assert compiler.counters.background_compiles == 1 and not compiler.counters.fallbacks
    for got, want in grads:
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_compiled_autograd_with_hooks_compiles_at_once(background: Any) -> None:
    """A backward that calls user hooks is not run a second time on the thread (the hooks
    would run there): its program compiles on the calling thread, as without the setting."""
    w = fg.tensor([1.0, 2.0, 3.0], dtype=fg.float64, requires_grad=True)
    seen: list = []
    w.register_hook(lambda g: seen.append(g.numpy().copy()))
    with compiler.compiled_autograd():
        (w * w).sum().backward()
    assert compiler.counters.background_compiles == 0 and compiler.counters.compiled_runs == 1
    np.testing.assert_allclose(seen[0], [2.0, 4.0, 6.0])


def test_kernels_run_their_serial_loops_while_a_background_compile_runs(background: Any) -> None:
    """A compile takes a core: parallel loops (one thread per core) would wait for the thread
    left without one.  While a background compile runs, ``use_parallel`` says no; after it,
    large kernels go parallel again (with more than one thread)."""
    from fusegrad.compiler.codegen import numba_cpu

    big = numba_cpu.PARALLEL_MIN_ELEMENTS
    background.clear()
    step, x = _gated_linear_step()
    assert numba_cpu.background_compiles == 1
    assert not numba_cpu.use_parallel(big)
    background.set()
    assert compiler.wait_for_compiles(60)
    assert numba_cpu.background_compiles == 0
    assert numba_cpu.use_parallel(big) == (numba_cpu.numba.get_num_threads() > 1)


def _larger_kernels_backward(rng: Any, w: fg.Tensor, b: fg.Tensor) -> tuple:
    """A backward whose elementwise kernels run over 64 x 128 = 8,192 elements (interpreted by
    default, above ``service.GENERATED_ABOVE``): its gradients, and eager's from numpy."""
    x = fg.tensor(rng.standard_normal((64, 32)))
    w.grad = b.grad = None
    h = x @ w + b
    (h.tanh() * h.sigmoid()).square().sum().backward()
    hn = x.numpy() @ w.detach().numpy() + b.detach().numpy()
    t, s = np.tanh(hn), 1 / (1 + np.exp(-hn))
    dh = 2 * t * s * ((1 - t**2) * s + t * s * (1 - s))
    return (w.grad.numpy().copy(), b.grad.numpy().copy()), (x.numpy().T @ dh, dh.sum(0))


def test_compiled_autograd_tries_generated_code_for_its_larger_kernels(
    background: Any, caplog: Any
) -> None:
    """A captured backward interpreting kernels over ``GENERATED_ABOVE`` elements: after its
    program compiled in the background, the same graph with those kernels as generated code
    compiles too; the next calls run the two in turn (``service.Trial``, on the tape path) and
    the faster stays.  Every call has eager's gradients."""
    import logging

    from fusegrad.compiler import service as _service

    rng = np.random.default_rng(11)
    w = fg.tensor(rng.standard_normal((32, 128)) / 6, requires_grad=True)
    b = fg.tensor(rng.standard_normal(128) / 6, requires_grad=True)
    results = []
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            with compiler.compiled_autograd():
                for i in range(2 * (_service.Trial.RUNS + 1) + 3):
                    if i == 1:
                        assert compiler.wait_for_compiles(120)
                    results.append(_larger_kernels_backward(rng, w, b))
    finally:
        compiler.set_logs(None)
    kept = "generated code for the larger kernels kept:" in caplog.text
    assert kept or "generated code for the larger kernels dropped:" in caplog.text
    (program,) = compiler.cached_programs()  # (the one the trial kept)
    want_limit = _service.GENERATED_ABOVE if kept else compiler.config.interpreter_max_elements
    assert program.interpreter_max_elements == want_limit
    assert compiler.counters.background_compiles == 1 and not compiler.counters.fallbacks
    assert compiler.counters.tape_hits >= 2 * _service.Trial.RUNS
    for got, want in results:
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_a_whole_step_tries_generated_code_for_its_larger_kernels(
    background: Any, caplog: Any, larger_kernels_step: Any
) -> None:
    """A whole step's program (``hot``) interpreting kernels over ``GENERATED_ABOVE`` elements
    gets the same second candidate as a captured backward when native segments are off: after
    the trial the kept program is the faster one, and every call equals eager's step."""
    import logging

    run = larger_kernels_step

    want = run(False)
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            got = run(True)
    finally:
        compiler.set_logs(None)
    kept = "generated code for the larger kernels kept:" in caplog.text
    assert kept or "generated code for the larger kernels dropped:" in caplog.text
    assert "ms for interpreting them (outside the extern steps)" in caplog.text
    assert compiler.counters.background_compiles == 1 and not compiler.counters.step_breaks
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_small_kernels_get_no_second_candidate(background: Any, caplog: Any) -> None:
    """A backward whose kernels are all small stays with the interpreter: no trial."""
    import logging

    rng = np.random.default_rng(12)
    w = fg.tensor(rng.standard_normal((6, 4)), requires_grad=True)
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            with compiler.compiled_autograd():
                for i in range(4):
                    if i == 1:
                        assert compiler.wait_for_compiles(60)
                    x = fg.tensor(rng.standard_normal((3, 6)))
                    (x @ w).tanh().square().sum().backward()
    finally:
        compiler.set_logs(None)
    assert "larger kernels" not in caplog.text
    programs = compiler.cached_programs()
    assert programs and all(
        p.interpreter_max_elements == compiler.config.interpreter_max_elements for p in programs
    )


def test_a_trial_of_generated_kernels_compares_the_time_outside_externs() -> None:
    """``service.Trial(kernels_only=True)``: the candidates time their extern steps
    (``Program.time_externs``) and the trial compares the rest of their wall time, so a
    candidate whose externs happened to run slower still wins on faster kernels; the timing
    is switched off when the trial ends."""
    from types import SimpleNamespace

    from fusegrad.compiler.cache import Slot
    from fusegrad.compiler.service import Trial

    # (wall seconds, extern seconds) per run: the generated candidate's kernels take 0.2 s
    # against the interpreted one's 0.5 s, its externs 1.0 s against 0.5 s
    cases = {"interpreted": (1.0, 0.5), "generated": (1.2, 1.0)}
    for kernels_only, kept in ((True, "generated"), (False, "interpreted")):
        first = SimpleNamespace(name="interpreted", last_seconds=None, extern_seconds=0.0)
        second = SimpleNamespace(name="generated", last_seconds=None, extern_seconds=0.0)
        slot = Slot()
        slot.trial = Trial(slot, first, second, kernels_only=kernels_only)  # type: ignore[arg-type]
        assert first.time_externs is second.time_externs is kernels_only
        while slot.trial is not None:
            program = slot.trial.next()
            program.last_seconds, program.extern_seconds = cases[program.name]
        assert slot.program.name == kept
        assert first.time_externs is second.time_externs is False


def test_a_program_times_its_extern_steps_when_asked() -> None:
    """``Program.time_externs``: a run records the seconds its extern steps took
    (``extern_seconds``: a matrix product's here), part of its wall time; off, nothing is
    timed and the run's values are the same."""
    rng = np.random.default_rng(21)
    w = fg.tensor(rng.standard_normal((48, 40)), requires_grad=True)
    xs = [fg.tensor(rng.standard_normal((30, 48))) for _ in range(4)]
    grads = []
    with compiler.compiled_autograd():
        for k, x in enumerate(xs):
            if k == 2:
                (program,) = compiler.cached_programs()
                assert not program.time_externs and program.extern_seconds == 0.0
                program.time_externs = True
            w.grad = None
            (x @ w).tanh().square().sum().backward()
            grads.append(w.grad.numpy().copy())
    assert program.time_externs
    assert 0.0 < program.extern_seconds < program.last_seconds
    for x, g in zip(xs, grads):
        xa = x.numpy()
        h = xa @ w.detach().numpy()
        want = xa.T @ (2 * np.tanh(h) * (1 - np.tanh(h) ** 2))
        np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)


def test_a_trials_choice_is_remembered_by_the_next_compile(
    background: Any, caplog: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``config.remember_trials``: a finished trial writes which candidate it kept into the
    disk cache; the next background compile of the same program (here after
    ``compiler.reset()``, as a new process would) builds that one alone, runs no trial, and says
    so on the ``perf`` log.  Every call has eager's gradients; without a remembered choice the
    trial runs again."""
    import logging

    from fusegrad.compiler import service as _service

    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(config, "remember_trials", True)
    rng = np.random.default_rng(11)
    w = fg.tensor(rng.standard_normal((32, 128)) / 6, requires_grad=True)
    b = fg.tensor(rng.standard_normal(128) / 6, requires_grad=True)

    def calls(n: int) -> str:
        compiler.set_logs("perf")
        caplog.clear()
        try:
            with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
                with compiler.compiled_autograd():
                    for i in range(n):
                        if i == 1:
                            assert compiler.wait_for_compiles(120)
                        for got, want in zip(*_larger_kernels_backward(rng, w, b)):
                            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        finally:
            compiler.set_logs(None)
        return caplog.text

    text = calls(2 * (_service.Trial.RUNS + 1) + 3)
    kept = "generated code for the larger kernels kept:" in text
    assert kept or "generated code for the larger kernels dropped:" in text
    (program,) = compiler.cached_programs()
    limit = program.interpreter_max_elements
    assert list(tmp_path.glob("fusegrad_trial_*"))

    compiler.reset()
    text = calls(4)
    remembered = "kept" if kept else "dropped"
    assert f"generated code for the larger kernels {remembered} as an earlier trial chose" in text
    assert "ms for interpreting them" not in text  # (no trial)
    (program,) = compiler.cached_programs()
    assert program.interpreter_max_elements == limit
    assert compiler.counters.background_compiles == 1

    # not remembered: the next compile runs the trial again
    monkeypatch.setattr(config, "remember_trials", False)
    compiler.reset()
    text = calls(2 * (_service.Trial.RUNS + 1) + 3)
    assert "as an earlier trial chose" not in text
    assert "ms for interpreting them" in text


def test_a_remembered_choice_belongs_to_the_code_generators_that_measured_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A trial's remembered choice is named by the first program and by the code generators'
    sources (``service._codegen_stamp``): another fusegrad's generated code is measured again
    rather than inheriting a choice made between other programs."""
    from types import SimpleNamespace

    from fusegrad.compiler import service as _service

    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(config, "remember_trials", True)
    first = SimpleNamespace(source_path=str(tmp_path / "fusegrad_generated_0123abcd.py"))
    assert _service.remembered_choice(first, "native segments") is None  # type: ignore[arg-type]
    _service.remember_choice(first, "native segments", 1)  # type: ignore[arg-type]
    assert _service.remembered_choice(first, "native segments") == 1  # type: ignore[arg-type]
    assert _service.remembered_choice(first, "generated code") is None  # type: ignore[arg-type]
    assert len(_service._codegen_stamp()) == 16
    monkeypatch.setattr(_service, "_stamp", ["another generator"])
    assert _service.remembered_choice(first, "native segments") is None  # type: ignore[arg-type]


_EXIT_CHILD = """
import sys, time
import numpy as np
import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler import workers
from fusegrad.compiler.program import Program
from fusegrad.compiler.settings import config

config.background_compile = True
config.compile_workers = False
config.native_programs = False
prepare = Program.prepare

def slow(self, *args, **kwargs):
    time.sleep(1.0)  # (the compile still runs when the script ends)
    result = prepare(self, *args, **kwargs)
    with open(sys.argv[1], "a") as f:
        f.write("prepared\\n")
    return result

Program.prepare = slow
model = fg.nn.Linear(5, 3).double()
opt = fg.optim.SGD(model.parameters(), lr=0.1)

@fg.compile
def step(x):
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    return loss

x = fg.randn(4, 5, dtype=fg.float64)
for _ in range(3):
    step(x)
assert compiler.counters.background_compiles == 1
print("exiting")
"""


def test_a_script_that_ends_waits_for_its_background_compiles(tmp_path: Path) -> None:
    """The compile threads are daemons; a script that ends while one runs waits for it
    (``service._finish_compiles_at_exit``) rather than have Python stop it mid-compile (which
    can abort the process from inside LLVM), and exits cleanly with the compile done."""
    import os
    import subprocess

    script, marker = tmp_path / "child.py", tmp_path / "prepared.txt"
    script.write_text(_EXIT_CHILD)
    env = dict(os.environ, FUSEGRAD_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, str(script), str(marker)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exiting" in done.stdout
    assert marker.exists() and marker.read_text().count("prepared") >= 1
