"""Native segments for captured backwards (``Program.per_size``): a compiled-autograd
backward's program, over symbolic sizes, runs native segments at each size vector it was
prepared for, through a program of its graph at those sizes (``Graph.at_sizes``).

Differential tests against eager over several size vectors (the tape path and the walk path),
at sizes no native program was made for, ``explain``'s description, the background compile's
trial against the program of steps, and ``Graph.at_sizes`` itself."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn
from fusegrad.compiler import ir
from fusegrad.compiler.program import Program
from fusegrad.compiler.service import service
from fusegrad.compiler.symbolic import has_sym


@pytest.fixture(autouse=True)
def native(fresh_compiler: None) -> Iterator[None]:
    before = (compiler.config.native_programs, compiler.config.background_compile)
    compiler.config.native_programs = True
    compiler.config.background_compile = False
    yield
    compiler.config.native_programs, compiler.config.background_compile = before


class _Block(nn.Module):
    """Attention after a layer norm (batched products, a causal mask, a softmax, permutes):
    a backward of a few dozen steps."""

    def __init__(self, width: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        mask = fg.tril(fg.ones(t, t)).bool()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        return x + (att @ v).transpose(1, 2).reshape(b, t, c)


class _Small(nn.Module):
    """A linear layer, a layer norm over the last dim and a softmax over the middle one:
    quick to compile at two size vectors."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        return self.norm(self.lin(x).tanh()).softmax(1) * x


def _grads(model: nn.Module, x: fg.Tensor, compiled: bool) -> list[np.ndarray]:
    for p in model.parameters():
        p.grad = None
    x = x.detach().requires_grad_(True)
    if compiled:
        with compiler.compiled_autograd():
            (model(x) ** 2).mean().backward()
    else:
        (model(x) ** 2).mean().backward()
    return [p.grad.numpy().copy() for p in model.parameters()] + [x.grad.numpy().copy()]


def _inputs(shapes: list[tuple[int, int, int]]) -> list[fg.Tensor]:
    rng = np.random.default_rng(5)
    return [fg.tensor(rng.standard_normal(s)) for s in shapes]


def _native_backwards() -> list[Program]:
    return [p for p in service.cached_programs() if p.per_size]


def test_a_captured_backward_runs_native_at_each_size_vector() -> None:
    """``native_programs`` True: the backward's program is built over symbolic sizes, and
    each size vector it runs at gets a native program of the graph at those sizes; every call
    matches eager's gradients (the inputs' too), the second call at a size vector on the tape
    path."""
    fg.manual_seed(0)
    model = _Small().to(fg.float64)
    shapes = [(3, 5, 8), (3, 5, 8), (5, 6, 8), (3, 5, 8), (5, 6, 8)]
    for x in _inputs(shapes):
        want = _grads(model, x, False)
        runs = compiler.counters.native_runs
        got = _grads(model, x, True)
        assert compiler.counters.native_runs > runs  # (native segments ran this backward)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    assert compiler.counters.tape_hits >= 2
    (program,) = _native_backwards()
    assert any(has_sym(v.shape) for v in program.graph.values)
    assert program.graph.hints in program.specialised
    assert len(program.specialised) == 2  # (two size vectors, two native programs)
    text = program.describe_schedule()
    assert text.count("at sizes [") == 2 and "native: " in text and "native segment" in text


def test_other_sizes_run_the_schedule_over_symbols() -> None:
    """A size vector with no native program (``native_programs`` no longer True: none is made
    at run time) runs the program's own schedule over symbolic sizes, with eager's results."""
    fg.manual_seed(1)
    model = _Small().to(fg.float64)
    first, other = _inputs([(3, 5, 8), (5, 6, 8)])
    _grads(model, first, True)
    (program,) = _native_backwards()
    assert len(program.specialised) == 1
    compiler.config.native_programs = None
    want = _grads(model, other, False)
    runs = compiler.counters.native_runs
    got = _grads(model, other, True)
    assert compiler.counters.native_runs == runs
    assert len(program.specialised) == 1
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_a_background_compile_tries_native_at_the_calls_sizes(caplog: Any) -> None:
    """``native_programs`` None (the default), compiled in the background: the program of
    steps is published first, then a ``Trial`` runs it and the native program at the call's
    sizes in turn and keeps the faster (the ``perf`` log says which); every call, during the
    trial and after, matches eager."""
    compiler.config.native_programs = None
    compiler.config.background_compile = True
    before = compiler.config.compile_workers
    compiler.config.compile_workers = False  # (a thread: quicker here)
    try:
        fg.manual_seed(2)
        model = _Block().to(fg.float64)
        xs = _inputs([(3, 5, 8)] * 3)
        wants = [_grads(model, x, False) for x in xs]
        compiler.set_logs("perf")
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            for k in range(24):
                if k == 2:
                    assert compiler.wait_for_compiles(300)
                for g, w in zip(_grads(model, xs[k % 3], True), wants[k % 3]):
                    np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    finally:
        compiler.set_logs(None)
        compiler.config.compile_workers = before
    kept = "native segments at the call's sizes kept" in caplog.text
    assert kept or "native segments at the call's sizes dropped" in caplog.text
    assert compiler.counters.native_runs > 0  # (the native candidate ran in the trial)
    assert bool(_native_backwards()) == kept


def test_a_backward_of_few_steps_gets_no_native_candidate() -> None:
    """A backward of fewer than ``NATIVE_MIN_STEPS`` steps is not worth a native program (its
    kernels would all be generated code, which the interpreter beats on small ones)."""
    from fusegrad.compiler import service as _service

    w = fg.randn(6, requires_grad=True)
    with compiler.compiled_autograd():
        (w.tanh() * 2).sum().backward()
    (program,) = service.cached_programs()
    assert program.per_size  # (native_programs True asks for it outright)
    compiler.config.native_programs = None
    few = Program(program.graph, **{**program.settings, "native": False})
    assert len(few.default.schedule.steps) < _service.NATIVE_MIN_STEPS
    assert not _service._specialises(few)


def test_a_graph_at_sizes_has_no_symbol_left() -> None:
    """``Graph.at_sizes``: the same values (ids, ops, effects) with literal shapes and size
    attributes, which ``ir.verify`` accepts; the original graph is unchanged."""
    fg.manual_seed(3)
    model = _Block().to(fg.float64)
    (x,) = _inputs([(3, 4, 8)])
    compiler.config.native_programs = None
    _grads(model, x, True)
    (program,) = service.cached_programs()
    graph = program.graph
    assert any(has_sym(v.shape) or has_sym(v.attrs) for v in graph.values)
    before = [(v.shape, v.attrs) for v in graph.values]
    concrete = graph.at_sizes(graph.hints)
    ir.verify(concrete)
    assert not any(has_sym(v.shape) or has_sym(v.attrs) for v in concrete.values)
    assert [(v.id, v.op) for v in concrete.values] == [(v.id, v.op) for v in graph.values]
    assert [(k, s, v.id) for k, s, v in concrete.effects] == [
        (k, s, v.id) for k, s, v in graph.effects
    ]
    for v in concrete.values:
        assert all(i is concrete.values[i.id] for i in v.inputs)
    assert [(v.shape, v.attrs) for v in graph.values] == before
    # the shapes are those the symbols stood for: x's gradient has x's shape
    assert (3, 4, 8) in {v.shape for _, _, v in concrete.effects}


def test_a_native_program_that_cannot_be_built_leaves_the_steps(
    monkeypatch: Any, caplog: Any
) -> None:
    """A native program that fails to build at a size vector (a limit of the emitters) is
    logged once, and the backward runs the program's own steps there, with eager's results."""

    def fails(self: ir.Graph, sizes: tuple) -> ir.Graph:
        raise NotImplementedError("no literal form for this attribute")

    monkeypatch.setattr(ir.Graph, "at_sizes", fails)
    fg.manual_seed(4)
    model = _Small().to(fg.float64)
    (x,) = _inputs([(3, 5, 8)])
    want = _grads(model, x, False)
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            for _ in range(2):
                for g, w in zip(_grads(model, x, True), want):
                    np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    finally:
        compiler.set_logs(None)
    assert caplog.text.count("no native program at sizes [") == 1
    assert "NotImplementedError: no literal form" in caplog.text
    assert compiler.counters.native_runs == 0
    (program,) = _native_backwards()
    assert not program.specialised
