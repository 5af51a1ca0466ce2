"""Row fusion (``passes.rows``, ``numba_cpu._emit_rows``): generated kernels that wait on each
other's row sums -- layer norm, softmax, cross-entropy and their backwards -- run as one row
kernel, phase after phase per row.  Checked: the fusion happens (the schedule's kernels), the
values equal the separately generated kernels' and eager's, across ranks, last dims that are
and are not multiples of the reduction lanes, float32 and float64, symbolic sizes (one program,
new batch sizes), the whole step and the ``.grad`` accumulation epilogue."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import compiler

pytestmark = pytest.mark.usefixtures("fresh_compiler")


@pytest.fixture(autouse=True)
def _generated(monkeypatch: pytest.MonkeyPatch) -> None:
    # small sizes, generated code: the interpreter would run these kernels otherwise
    monkeypatch.setattr(compiler.config, "interpreter_max_elements", 0)


def _layer_norm_gelu(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor, r: fg.Tensor) -> fg.Tensor:
    d = x.shape[-1]
    return (F.layer_norm(F.gelu(x, approximate="tanh"), (d,), w, b) * r).sum()


def _softmax_ce(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor, r: fg.Tensor) -> fg.Tensor:
    logits = (x * w + b).reshape(-1, x.shape[-1])
    target = fg.tensor(np.arange(logits.shape[0]) % x.shape[-1])
    return F.cross_entropy(logits, target) + (F.softmax(x, -1) * r).sum()


def _data(shape: tuple, dtype: Any, seed: int = 0) -> list[fg.Tensor]:
    rng = np.random.default_rng(seed)
    d = shape[-1]
    x = fg.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)
    w = fg.tensor((1 + 0.1 * rng.standard_normal(d)).astype(dtype), requires_grad=True)
    b = fg.tensor((0.1 * rng.standard_normal(d)).astype(dtype), requires_grad=True)
    r = fg.tensor(rng.standard_normal(shape).astype(dtype))
    return [x, w, b, r]


def _grads(fn: Callable, data: list[fg.Tensor], mode: str) -> list[np.ndarray]:
    """Gradients of ``fn``'s loss: eager, or with the backward compiled (``rows`` on or off)."""
    for t in data:
        t.grad = None
    if mode == "eager":
        fn(*data).backward()
    else:
        compiler.config.row_fusion = mode == "rows"
        try:
            with compiler.compiled_autograd():
                fn(*data).backward()
        finally:
            compiler.config.row_fusion = True
    return [t.grad.numpy().copy() for t in data[:3]]


def _row_kernels(program: Any) -> list:
    return [k for k in program.kernels if k.phases]


@pytest.mark.parametrize(
    "fn, shape, dtype",
    [
        (_layer_norm_gelu, (2, 3, 300), np.float32),  # rank 3, a tail past the lanes
        (_layer_norm_gelu, (4, 128), np.float64),  # whole lanes, no tail
        (_softmax_ce, (3, 5), np.float64),  # the tail only
        (_softmax_ce, (1, 1000), np.float32),  # one row: its total is its row sum
    ],
    ids=["layer_norm-2x3x300-f32", "layer_norm-4x128-f64", "softmax-3x5-f64", "softmax-1x1000-f32"],
)
def test_row_kernel_equals_separate_kernels_and_eager(
    fn: Callable, shape: tuple, dtype: Any
) -> None:
    data = _data(shape, dtype)
    want = _grads(fn, data, "eager")
    separate = _grads(fn, data, "separate")
    rows = _grads(fn, data, "rows")
    for a, b, c in zip(want, separate, rows):
        # the row kernel sums as the separate kernels do: the same values, to rounding of
        # fused multiply-adds across what used to be kernel boundaries
        tol = 2e-6 if dtype == np.float32 else 1e-13
        np.testing.assert_allclose(c, b, rtol=tol, atol=tol * np.abs(b).max())
        tol = 1e-4 if dtype == np.float32 else 1e-10
        np.testing.assert_allclose(c, a, rtol=tol, atol=tol * np.abs(a).max())
    report = compiler.explain(lambda: fn(*data).backward())
    ((_, program),) = report.captures
    assert len(_row_kernels(program)) >= 1, str(report)  # (the disk cache has its code)


def test_layer_norm_backward_is_one_row_kernel() -> None:
    data = _data((8, 64), np.float32)
    report = compiler.explain(lambda: _layer_norm_gelu(*data).backward())
    ((_, program),) = report.captures
    (kernel,) = program.kernels
    # (layer_norm's backward reads its saved mean and rstd: the row sums of g and g * normed
    # in one phase, the input's gradient from them in the next)
    assert kernel.phases and max(kernel.phases.values()) >= 1, str(report)
    assert not program.externs
    # the per-row values (last dim 1) live inside it, as locals of a row
    assert any(v.shape[-1] == 1 and v not in kernel.reductions for v in kernel.values)


def test_row_fusion_off_keeps_separate_kernels() -> None:
    data = _data((8, 64), np.float32)
    compiler.config.row_fusion = False
    try:
        report = compiler.explain(lambda: _layer_norm_gelu(*data).backward())
    finally:
        compiler.config.row_fusion = True
    ((_, program),) = report.captures
    assert len(program.kernels) > 1 and not _row_kernels(program)


def test_symbolic_sizes_one_program_for_new_batch_sizes() -> None:
    for batch in (5, 9, 2):
        data = _data((batch, 200), np.float32, seed=batch)
        want = _grads(_layer_norm_gelu, data, "eager")
        got = _grads(_layer_norm_gelu, data, "rows")
        for a, b in zip(want, got):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * np.abs(a).max())
    assert compiler.counters.captures == 1, compiler.counters


def test_accumulation_epilogue_in_a_row_kernel() -> None:
    """``.grad`` that exists is added into by the row kernel (or after it), as eager adds."""
    data = _data((6, 130), np.float64)
    first = _grads(_layer_norm_gelu, data, "eager")
    for mode in ("eager", "rows"):
        for t in data:
            t.grad = None
        _layer_norm_gelu(*data).backward()
        if mode == "eager":
            _layer_norm_gelu(*data).backward()
        else:
            with compiler.compiled_autograd():
                _layer_norm_gelu(*data).backward()
        for a, t in zip(first, data):
            np.testing.assert_allclose(t.grad.numpy(), 2 * a, rtol=1e-12, atol=1e-12)


def _whole_step_matches_eager(data: list[fg.Tensor]) -> Any:
    """Train-step-like calls of a layer norm + GELU whole step: eager's loss and gradients;
    returns the replayed program."""

    def step(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor, r: fg.Tensor) -> fg.Tensor:
        loss = _layer_norm_gelu(x, w, b, r)
        loss.backward()
        return loss.detach()

    want = step(*data)
    want_grads = [t.grad.numpy().copy() for t in data[:3]]
    g = fg.compile(step)
    for _ in range(3):
        for t in data:
            t.grad = None
        got = g(*data)
    assert compiler.counters.step_runs == 2
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    for t, a in zip(data, want_grads):
        np.testing.assert_allclose(t.grad.numpy(), a, rtol=1e-4, atol=1e-4 * np.abs(a).max())
    ((entry, program),) = compiler.explain(g, *data).steps
    return program


def test_whole_step_layer_norm_is_one_row_kernel() -> None:
    program = _whole_step_matches_eager(_data((16, 96), np.float32))
    assert len(program.kernels) == 1 and program.kernels[0].phases


def test_row_sums_from_a_row_buffer_are_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of 64 to 127 elements add their row sums from a row buffer in a loop of their own
    (``numba_cpu.SPLIT_ROWS_FROM``): the same additions in the same order as one loop."""
    from fusegrad.compiler.codegen import numba_cpu

    grads = []
    for split_from in (numba_cpu.SPLIT_ROWS_FROM, 10**9):
        monkeypatch.setattr(numba_cpu, "SPLIT_ROWS_FROM", split_from)
        compiler.reset()
        data = _data((3, 5, 100), np.float32, seed=7)
        program = _whole_step_matches_eager(data)
        with open(program.source_path) as fh:
            source = fh.read()
        assert ("rs0 = np.empty" in source) == (split_from <= 100)
        grads.append([t.grad.numpy().copy() for t in data[:3]])
    for split, one_loop in zip(*grads):
        np.testing.assert_array_equal(split, one_loop)


@settings(max_examples=6, deadline=None)
@given(
    rows=st.integers(1, 5),
    lead=st.integers(1, 3),
    last=st.integers(1, 300),
    softmax=st.booleans(),
)
def test_random_shapes(rows: int, lead: int, last: int, softmax: bool) -> None:
    shape = (lead, rows, last) if lead > 1 else (rows, last)
    fn = _softmax_ce if softmax else _layer_norm_gelu
    data = _data(shape, np.float64, seed=rows * 1000 + last)
    want = _grads(fn, data, "eager")
    got = _grads(fn, data, "rows")
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-10 * (np.abs(a).max() + 1))


def test_small_runs_fuse_in_whole_steps_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels small enough for the interpreter stay interpreted in a compiled backward (no
    compile for a program that may run once), but a whole step -- a training step, run many
    times -- turns their run into one generated row kernel (one call instead of several)."""
    monkeypatch.setattr(compiler.config, "interpreter_max_elements", 1 << 16)
    data = _data((4, 8, 32), np.float32)
    report = compiler.explain(lambda: _layer_norm_gelu(*data).backward())
    ((_, program),) = report.captures
    assert not _row_kernels(program) and program.default.schedule.interpreted, str(report)
    for t in data:
        t.grad = None  # (explain ran that backward)
    program = _whole_step_matches_eager(data)
    assert _row_kernels(program) and not program.default.schedule.interpreted
