"""Native programs (``config.native_programs``, ``codegen.native_cpu``): a recorded step's
schedule runs as native segments, one numba call per run of steps native code can run.

Differential tests against eager (whole steps with optimizers, a compiled module), the
segments and the reasons for the steps Python runs in ``explain``'s description, a segment
that raises (its steps run again one by one), and an index out of range fed to a replayed
step: eager's error, with parameters, ``.grad`` and optimizer state as eager leaves them.
(The GPT step's segments compile cold in a minute or more, too long for the suite:
``FUSEGRAD_NATIVE=1 python -m benchmarks.steps`` checks its parameters against eager's.)"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import compiler, nn
from fusegrad.compiler.codegen import numba_cpu
from fusegrad.compiler.program import Program


@pytest.fixture(autouse=True)
def native(fresh_compiler: None) -> Iterator[None]:
    before = compiler.config.native_programs
    compiler.config.native_programs = True
    yield
    compiler.config.native_programs = before


class _Tiny(nn.Module):
    """An embedding, a layer norm, one attention head (batched matmuls, a causal mask, a
    softmax) and a linear head: the externs a segment spells (row lookups, permutes,
    reshapes, 2-d and batched products, reductions, index_add_at, gather)."""

    def __init__(self, vocab: int = 11, width: int = 8, block: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", fg.tril(fg.ones(block, block)).bool())

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        b, t = x.shape
        h = self.norm(self.embed(x))
        q, k, v = self.qkv(h).split(h.shape[-1], dim=-1)
        att = (q @ k.transpose(-2, -1)) / h.shape[-1] ** 0.5
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
        return self.head(h + att @ v)


def _data(steps: int, dtype: Any = fg.float64) -> list[tuple[fg.Tensor, fg.Tensor]]:
    rng = np.random.default_rng(3)
    return [
        (fg.tensor(rng.integers(0, 11, (4, 6))), fg.tensor(rng.integers(0, 11, (4, 6))))
        for _ in range(steps)
    ]


def _train(opt_name: str, compiled: bool, data: list) -> tuple[nn.Module, Any, Any, list[float]]:
    fg.manual_seed(0)
    model = _Tiny().to(fg.float64)
    if opt_name == "sgd":
        opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    else:
        opt = fg.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, amsgrad=True)

    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, 11), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    fn = fg.compile(step) if compiled else step
    return model, opt, fn, [fn(x, y).item() for x, y in data]


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_whole_step_matches_eager_in_native_segments(opt_name: str) -> None:
    data = _data(6)
    compiler.config.native_programs = False
    want_model, _, _, want = _train(opt_name, False, data)
    compiler.config.native_programs = True
    got_model, _, fn, got = _train(opt_name, True, data)
    assert compiler.counters.step_runs == len(data) - 2, compiler.counters
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    for (name, p), q in zip(got_model.named_parameters(), want_model.parameters()):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-12, err_msg=name
        )
    # the program's description lists its segments and the steps Python runs, with why
    text = str(compiler.explain(fn, *data[0]))
    assert "native: " in text and "native segment segment_0" in text, text


def test_python_code_splits_segments_and_says_why() -> None:
    def train(compiled: bool) -> list[float]:
        fg.manual_seed(0)
        lin1, lin2 = nn.Linear(5, 7).double(), nn.Linear(7, 3).double()
        opt = fg.optim.SGD([*lin1.parameters(), *lin2.parameters()], lr=0.1)

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            h = F.relu(lin1(x)).exp().cumsum(-1)  # (an extern with no native spelling)
            loss = (lin2(h).tanh() ** 2).sum()
            loss.backward()
            opt.step()
            return loss

        fn = fg.compile(step) if compiled else step
        rng = np.random.default_rng(0)
        out = [fn(fg.tensor(rng.standard_normal((4, 5)))).item() for _ in range(4)]
        if compiled:
            text = str(compiler.explain(fn, fg.tensor(rng.standard_normal((4, 5)))))
            assert "python step" in text and "cumsum: no native spelling" in text, text
            assert "native segment" in text, text
        return out

    want = train(False)
    got = train(True)
    assert compiler.counters.step_runs >= 2, compiler.counters
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("program", ["native", "quick"])
def test_an_index_out_of_range_raises_eagers_error_and_changes_what_eager_does(
    program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Native segments, and the quick tier a background compile publishes first (every
    kernel interpreted or by eager kernels): the replay raises eager's error, and nothing
    changed."""
    data = _data(4)
    compiler.config.native_programs = False
    want_model, want_opt, eager_step, _ = _train("adamw", False, data)
    compiler.config.native_programs = program == "native"
    monkeypatch.setattr(compiler.config, "quick_programs", True if program == "quick" else None)
    model, opt, fn, _ = _train("adamw", True, data)
    assert compiler.counters.step_runs == 2, compiler.counters
    assert compiler.counters.quick_runs == (2 if program == "quick" else 0)
    bad = fg.tensor(np.full((4, 6), 11))  # one past the vocabulary
    with pytest.raises(IndexError) as replayed:
        fn(bad, data[0][1])
    # raised by the replay's checks, before the program changes anything
    assert any(entry.path.name == "step.py" for entry in replayed.traceback)
    with pytest.raises(IndexError) as eager:
        eager_step(bad, data[0][1])
    assert type(replayed.value) is type(eager.value)
    assert str(replayed.value) == str(eager.value)
    # parameters and optimizer state untouched; .grad as eager's zero_grad() left it
    for (n, p), q in zip(model.named_parameters(), want_model.parameters()):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-12, err_msg=n
        )
        assert (p.grad is None) == (q.grad is None), n
        if p.grad is not None:
            np.testing.assert_allclose(
                p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=n
            )
    for (_p, s), (_q, t) in zip(opt.state.items(), want_opt.state.items()):
        assert s.keys() == t.keys()
        for k in s:
            np.testing.assert_allclose(s[k].numpy(), t[k].numpy(), rtol=1e-9, atol=1e-12, err_msg=k)


def _segments(fn: Any) -> list:
    """The native segments of compiled step ``fn``'s programs."""
    return [
        seg
        for entry in fn.entries.values()
        for program in entry.programs.programs()
        for variant in program._variants.values()
        for seg in variant.segments.values()
    ]


def test_a_segment_that_raises_runs_its_steps_one_by_one(monkeypatch: Any, caplog: Any) -> None:
    """A native segment only computes new arrays: when it raises, the program runs its steps
    again one by one (where eager's kernel would raise eager's error), with the same values."""
    data = _data(7)
    compiler.config.native_programs = False
    want_model, _, _, want = _train("sgd", False, data)
    compiler.config.native_programs = True
    fg.manual_seed(0)
    calls = {"n": 0}

    def broken(*args: Any) -> Any:
        calls["n"] += 1
        raise RuntimeError("a failing native call")

    got_model, _, fn, got = _train("sgd", True, data[:4])
    segments = _segments(fn)
    assert segments
    for seg in segments:
        monkeypatch.setattr(seg, "fn", broken)
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            got += [fn(x, y).item() for x, y in data[4:]]
    finally:
        compiler.set_logs(None)
    assert calls["n"] == 3 * len(segments)
    assert "raised RuntimeError('a failing native call')" in caplog.text, caplog.text
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    for p, q in zip(got_model.parameters(), want_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_compiled_module_matches_eager_in_native_segments() -> None:
    """``compile(model)``: the recorded forward program (and the backward called outside it)
    run as native segments, with eager's outputs and gradients."""
    data = _data(4)

    def run(compiled: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
        fg.manual_seed(0)
        model = _Tiny().to(fg.float64)
        fn = fg.compile(model) if compiled else model
        outs, grads = [], []
        for x, _ in data:
            model.zero_grad()
            out = fn(x)
            (out.tanh() * out).sum().backward()
            outs.append(out.detach().numpy())
            grads.extend(p.grad.numpy().copy() for p in model.parameters())
        return outs, grads

    want = run(False)
    got = run(True)
    assert compiler.counters.step_runs >= 2, compiler.counters  # forward programs replayed
    for g, w in zip(got[0] + got[1], want[0] + want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)


def test_a_background_compile_goes_on_to_native_segments(monkeypatch: Any, caplog: Any) -> None:
    """``native_programs`` None (the default): a background compile makes the program of
    steps, which the calls run compiled while the same compile goes on to the native segments;
    those take over when ready.  A foreground build stays a program of steps."""
    monkeypatch.setattr(compiler.config, "native_programs", None)
    monkeypatch.setattr(compiler.config, "background_compile", True)
    monkeypatch.setattr(compiler.config, "compile_workers", False)  # (a thread: quicker here)
    data = _data(19)
    first_ready = threading.Event()
    release = threading.Event()
    prepare = Program.prepare

    def gated(self: Program, *args: Any, **kwargs: Any) -> float:
        if self.native:  # the second stage waits until the test has seen the first run
            first_ready.set()
            assert release.wait(120)
        return prepare(self, *args, **kwargs)

    monkeypatch.setattr(Program, "prepare", gated)
    compiler.config.native_programs = False
    want_model, _, _, want = _train("sgd", False, data)
    compiler.config.native_programs = None
    fg.manual_seed(0)
    model = _Tiny().to(fg.float64)
    opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)

    @fg.compile
    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, 11), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    got = [step(*data[k]).item() for k in range(3)]  # warm-up, recording, uncompiled run
    assert first_ready.wait(300)  # the program of steps is compiled; the segments wait
    assert not _segments(step)
    uncompiled = compiler.counters.uncompiled_runs
    got += [step(*data[k]).item() for k in range(3, 5)]
    assert compiler.counters.uncompiled_runs == uncompiled  # (ran compiled meanwhile)
    release.set()
    assert compiler.wait_for_compiles(300)
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            # the two programs run in turn, then the faster one stays
            got += [step(*data[k]).item() for k in range(5, 19)]
    finally:
        compiler.set_logs(None)
    assert "native segments kept" in caplog.text or "native segments dropped" in caplog.text
    assert bool(_segments(step)) == ("native segments kept" in caplog.text)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    for p, q in zip(model.parameters(), want_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_a_trial_keeps_the_faster_program() -> None:
    """``service.Trial``: the two programs run in turn, the first run of each unmeasured, and
    the one with the smaller median time stays in the slot."""
    from types import SimpleNamespace

    from fusegrad.compiler.cache import Slot
    from fusegrad.compiler.service import Trial

    for native_time, kept in ((0.5, 1), (2.0, 0)):
        steps, native = SimpleNamespace(last_seconds=None), SimpleNamespace(last_seconds=None)
        slot = Slot()
        slot.trial = Trial(slot, steps, native)  # type: ignore[arg-type]
        order = []
        while slot.trial is not None:
            program = slot.trial.next()
            order.append(program)
            program.last_seconds = native_time if program is native else 1.0
        assert slot.program is (steps, native)[kept]
        assert order[:4] == [native, steps, native, steps]
        assert len(order) == 2 * (Trial.RUNS + 1) + 1


def test_a_kernel_over_grouped_dims_runs_in_a_native_segment(monkeypatch: Any) -> None:
    """A channel scale and shift over (N, C, H, W): the backward's channel sums loop over (N,
    C, H W) (``numba_cpu.collapse_groups``); inside a native segment the arrays are reshaped
    to the grouped shapes as the program of steps does, with eager's values."""
    rng = np.random.default_rng(5)
    batches = [fg.tensor(rng.standard_normal((3, 4, 7, 9))) for _ in range(4)]

    def train(compiled: bool) -> tuple:
        fg.manual_seed(0)
        scale = fg.tensor(rng_params[0].copy(), requires_grad=True)
        shift = fg.tensor(rng_params[1].copy(), requires_grad=True)
        opt = fg.optim.SGD([scale, shift], lr=0.1)

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = ((x * scale + shift).tanh() ** 2).mean()
            loss.backward()
            opt.step()
            return loss.detach()

        fn = fg.compile(step) if compiled else step
        losses = [float(fn(x)) for x in batches]
        return losses, scale.detach().numpy(), shift.detach().numpy(), fn

    rng_params = [rng.standard_normal((1, 4, 1, 1)), rng.standard_normal((1, 4, 1, 1))]
    ran: set = set()
    run_step = Program.run_step

    def noted(self: Program, *args: Any, **kwargs: Any) -> Any:
        ran.add(self)
        return run_step(self, *args, **kwargs)

    monkeypatch.setattr(Program, "run_step", noted)
    want = train(False)
    got = train(True)
    assert compiler.counters.step_runs == len(batches) - 1, compiler.counters  # (1st: recorded)
    for a, b in zip(got[:3], want[:3]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    text = str(compiler.explain(got[3], batches[0]))
    assert "native segment segment_0" in text, text
    assert any(
        numba_cpu.emit_kernel(k, "k")[1].groups == ((0,), (1,), (2, 3))
        for p in ran
        for k in p.kernels
    )


def _recorded_trials(monkeypatch: Any) -> list:
    """Every ``service.Trial`` made from now on, as (its program of steps, the other
    candidate)."""
    from fusegrad.compiler import service as _service

    trials: list = []
    init = _service.Trial.__init__

    def recorded(self: Any, slot: Any, steps: Any, other: Any, *args: Any, **kw: Any) -> None:
        trials.append((steps, other))
        init(self, slot, steps, other, *args, **kw)

    monkeypatch.setattr(_service.Trial, "__init__", recorded)
    return trials


def test_native_segments_are_tried_against_generated_larger_kernels(
    monkeypatch: Any, caplog: Any, tmp_path: Any, larger_kernels_step: Any
) -> None:
    """``native_programs`` None, a whole step whose first program interprets kernels over
    ``service.GENERATED_ABOVE`` elements: the background compile publishes the first program,
    then the same step with those kernels as generated code, then compiles its native segments;
    the trial is between the native program and the generated-larger one (a native program
    generates every kernel), and its choice is remembered under the first program, so that the
    next compile of the step (``compiler.reset()``, as a new process would) builds the kept one
    without a trial.  Every call equals eager's step."""
    from fusegrad.compiler import service as _service

    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler.config, "native_programs", None)
    monkeypatch.setattr(compiler.config, "background_compile", True)
    monkeypatch.setattr(compiler.config, "compile_workers", False)  # (a thread: quicker here)
    monkeypatch.setattr(compiler.config, "remember_trials", True)
    trials = _recorded_trials(monkeypatch)
    run = larger_kernels_step

    def logged(compiled: bool) -> tuple[tuple, str]:
        compiler.set_logs("perf")
        caplog.clear()
        try:
            with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
                got = run(compiled)
        finally:
            compiler.set_logs(None)
        return got, caplog.text

    want = run(False)
    got, text = logged(True)
    kept = "native segments kept:" in text
    assert kept or "native segments dropped:" in text
    assert "ms for the program of steps" in text
    ((steps, native),) = trials
    assert native.native and not steps.native
    assert steps.interpreter_max_elements == _service.GENERATED_ABOVE
    assert compiler.config.interpreter_max_elements > _service.GENERATED_ABOVE
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)

    compiler.reset()
    trials.clear()
    got, text = logged(True)
    assert f"native segments {'kept' if kept else 'dropped'} as an earlier trial chose" in text
    assert not trials and "ms for the program of steps" not in text
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_a_native_trial_leaves_out_the_externs_both_programs_run_from_python(
    caplog: Any,
) -> None:
    """Between a program of steps and its native segments, the trial compares the time outside
    the extern steps the native program runs from Python too (a convolution here: the same
    work in both, whose noise would otherwise decide): those are the same IR values in both
    programs, each program times them while the trial runs, and the calls still equal eager's
    step."""
    from fusegrad.compiler import service as _service
    from fusegrad.compiler.passes.fuse import Extern

    def run(compiled: bool, trial: bool = False) -> tuple:
        fg.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Tanh(), nn.Flatten(), nn.Linear(48, 5))
        model = model.double()
        opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        fn = fg.compile(step) if compiled else step
        rng = np.random.default_rng(5)
        batches = [
            (fg.tensor(rng.standard_normal((4, 2, 6, 6))), fg.tensor(rng.integers(0, 5, 4)))
            for _ in range(2 * (_service.Trial.RUNS + 1) + 6)
        ]
        losses = []
        for i, (x, y) in enumerate(batches):
            if trial and i == 3:  # the step runs compiled: a trial against its program of steps
                ((slot,),) = [list(e.programs.slots.values()) for e in fn.entries.values()]
                native = slot.program
                steps = Program(native.graph, **{**native.settings, "native": False})
                common = _service._python_externs(native)
                assert any(native.graph.values[i].op.startswith("conv") for i in common)
                assert common <= {
                    s.value.id for s in steps.default.schedule.steps if isinstance(s, Extern)
                }
                slot.trial = _service.Trial(slot, steps, native)
                assert steps.time_externs == native.time_externs == common
            if trial and i == 8:  # (both have run in the trial: each timed the convolutions)
                assert steps.extern_seconds > 0 and native.extern_seconds > 0
            losses.append(fn(x, y).item())
        if trial:
            assert slot.trial is None and steps.time_externs is False
        return losses, [p.detach().numpy() for p in model.parameters()]

    want = run(False)
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            got = run(True, trial=True)
    finally:
        compiler.set_logs(None)
    assert "(outside the extern steps both run from Python)" in caplog.text
    np.testing.assert_allclose(got[0], want[0], rtol=1e-10, atol=1e-12)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_transposed_matrix_reaches_blas_without_a_copy(dtype: Any) -> None:
    """``native_helpers.transpose2``: a C-contiguous matrix's transpose is typed F-contiguous,
    so ``matmul2`` hands it to BLAS as its transposed operand (numba's ``np.dot`` on an F
    array) instead of copying it; a view of any other layout is copied first.  The products
    equal numpy's."""
    from fusegrad.compiler.codegen import native_helpers as nh

    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 5)).astype(dtype)
    w = rng.standard_normal((9, 5)).astype(dtype)
    wt = nh.transpose2(w)
    assert wt.flags.f_contiguous and np.shares_memory(wt, w)
    np.testing.assert_allclose(nh.matmul2(a, wt), a @ w.T, rtol=1e-5, atol=1e-6)
    typed = [sig[1] for sig in nh.matmul2.signatures]
    assert any(t.layout == "F" for t in typed)  # (compiled for the F operand: not copied)
    strided = rng.standard_normal((10, 18)).astype(dtype)[:5, ::2]  # (neither C nor F)
    np.testing.assert_allclose(nh.matmul2(a, strided), a @ strided, rtol=1e-5, atol=1e-6)
    rows = rng.standard_normal((2, 3, 5)).astype(dtype)
    got = nh.matmul_rows(rows, wt, 6, (2, 3, 9))
    np.testing.assert_allclose(got, rows @ w.T, rtol=1e-5, atol=1e-6)


def test_trials_running_counts_the_trials_that_have_not_ended() -> None:
    """``service.trials_running``: a trial counts from its start until it keeps a program (or
    its slot is dropped with it), so that benchmarks measure only kept programs."""
    import gc
    from types import SimpleNamespace

    from fusegrad.compiler import service as _service
    from fusegrad.compiler.cache import Slot

    before = _service.trials_running()
    slot = Slot()
    a, b = SimpleNamespace(last_seconds=None), SimpleNamespace(last_seconds=None)
    slot.trial = _service.Trial(slot, a, b)  # type: ignore[arg-type]
    assert _service.trials_running() == before + 1
    while slot.trial is not None:
        program = slot.trial.next()
        program.last_seconds = 1.0 if program is a else 2.0
    assert slot.program is a and _service.trials_running() == before
    dropped = Slot()
    dropped.trial = _service.Trial(dropped, a, b)  # type: ignore[arg-type]
    assert _service.trials_running() == before + 1
    del dropped
    gc.collect()
    assert _service.trials_running() == before


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_products_call_numpys_blas_and_equal_numpys(dtype: Any) -> None:
    """``native_helpers.product``: where numpy ships its OpenBLAS, a segment's products call its
    gemm (the library numpy's ``@`` calls; numba's np.dot calls scipy's, measured slower), with
    each operand C- or F-contiguous (an F one as the transposed operand) and any other layout
    copied first; every form equals numpy's product."""
    from fusegrad.compiler.codegen import native_helpers as nh

    assert nh.GEMM == (nh._numpy_blas() is not None)
    if nh.GEMM:
        assert nh.product is nh._product_gemm
    rng = np.random.default_rng(1)
    a = rng.standard_normal((6, 4)).astype(dtype)
    b = rng.standard_normal((4, 5)).astype(dtype)
    forms = {
        "C": lambda x: x,
        "F": np.asfortranarray,
        "strided": lambda x: np.repeat(x, 2, axis=1)[:, ::2],
    }
    for fa, la in forms.items():
        for fb, lb in forms.items():
            x, y = la(a), lb(b)
            got = nh.matmul2(x, y)
            assert got.flags.c_contiguous, (fa, fb)
            np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-6, err_msg=f"{fa} {fb}")
    batch_a = rng.standard_normal((3, 6, 4)).astype(dtype)
    batch_b = rng.standard_normal((3, 4, 5)).astype(dtype)
    got = nh.matmul_batch(
        batch_a, batch_b.transpose(0, 2, 1).copy().transpose(0, 2, 1), 3, (3, 6, 5)
    )
    np.testing.assert_allclose(got, batch_a @ batch_b, rtol=1e-5, atol=1e-6)
    got = nh.matmul_rows(batch_a, nh.transpose2(b.T.copy()), 18, (3, 6, 5))
    np.testing.assert_allclose(got, batch_a @ b, rtol=1e-5, atol=1e-6)


def test_a_remembered_choice_of_the_program_of_steps_runs_no_trial(
    monkeypatch: Any, tmp_path: Any, larger_kernels_step: Any
) -> None:
    """An earlier trial dropped the native segments (it kept the program of steps with its
    larger kernels generated, the one it measured): the next compile builds that program, which
    replaces the first one as it did then, with no trial between them (a trial between the
    interpreted and the generated larger kernels ran when the dropped choice was timing's, in a
    loaded CI run)."""
    from fusegrad.compiler import service as _service

    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler.config, "native_programs", None)
    monkeypatch.setattr(compiler.config, "background_compile", True)
    monkeypatch.setattr(compiler.config, "compile_workers", False)
    monkeypatch.setattr(_service, "remembered_choice", lambda first, what: 0)
    trials = _recorded_trials(monkeypatch)
    want = larger_kernels_step(False)
    got = larger_kernels_step(True)
    assert not trials
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)
