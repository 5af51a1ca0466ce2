"""The passes that turned ``Program.__post_init__`` into pure functions: ``passes.schedule``
(fused steps, interpreted variants, the ``.grad`` epilogue) and ``passes.buffers`` (fresh,
pooled and dying values).  Graphs are captured from small eager graphs, then the passes run on
them directly."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler import passes
from fusegrad.compiler.capture import capture
from fusegrad.compiler.ir import Graph, verify
from fusegrad.compiler.key import walk
from fusegrad.compiler.passes import schedule as sched
from fusegrad.compiler.passes.buffers import plan_buffers
from fusegrad.compiler.passes.fuse import Extern, Kernel

pytestmark = pytest.mark.usefixtures("fresh_compiler")


def _graph(loss_of: Any, leaves: list) -> tuple[Graph, Any]:
    out = loss_of(*leaves)
    grads = [fg.ones_like(out)]
    w = walk([out], grads, None, True, False)
    graph = passes.run(capture(w, [out], grads, None, True).graph, check=True)
    verify(graph)
    return graph, w


def _chain(x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
    h = x
    for _ in range(30):  # long enough for the fuser to split it (MAX_VALUES)
        h = (h * w).tanh() + h
    return h.sum()


def _leaves(n: int = 8) -> list:
    return [fg.randn(n, requires_grad=True), fg.randn(n, requires_grad=True)]


def test_steps_fuse_in_default_mode_and_not_in_debug_mode() -> None:
    graph, _ = _graph(_chain, _leaves())
    fused = sched.steps(graph, "default")
    debug = sched.steps(graph, "debug")
    computed = [v for v in graph.values if v.op not in ("input", "constant", "scalar")]
    assert all(isinstance(s, Extern) for s in debug) and len(debug) == len(computed)
    kernels = [s for s in fused if isinstance(s, Kernel)]
    assert 1 < len(kernels) < len(computed)  # split at the fuser's cap, never one per value


def test_finish_merges_consecutive_small_kernels_and_copies_them() -> None:
    graph, _ = _graph(_chain, _leaves())
    fused = sched.steps(graph, "default")
    kernels = [s for s in fused if isinstance(s, Kernel)]
    everything = sched.finish(fused, graph, frozenset(), lambda k: sched.interpretable(k))
    nothing = sched.finish(fused, graph, frozenset(), lambda k: False)
    assert len(everything.kernels) == 1
    (at,) = [k for k, s in enumerate(everything.steps) if isinstance(s, Kernel)]
    assert everything.interpreted == {at}
    assert len(nothing.kernels) == len(kernels) and not nothing.interpreted
    # every value is still computed exactly once
    computed = [v for k in everything.kernels for v in k.values]
    assert sorted(v.id for v in computed) == sorted(v.id for k in kernels for v in k.values)
    assert all(a is not b for a, b in zip(nothing.kernels, kernels))  # copies


def test_epilogue_only_for_generated_kernels_of_leaves_with_a_grad() -> None:
    graph, w = _graph(lambda x, w: (x * w).tanh().sum(), _leaves())
    fused = sched.steps(graph, "default")
    slots = frozenset(range(len(w.leaves)))
    generated = sched.finish(fused, graph, slots, lambda k: False)
    interpreted = sched.finish(fused, graph, slots, lambda k: True)
    without_grad = sched.finish(fused, graph, frozenset(), lambda k: False)
    assert sorted(generated.epilogue.values()) == [0, 1]
    assert all(
        v in k.accumulate for k in generated.kernels for v in k.outputs if v in generated.epilogue
    )
    assert not interpreted.epilogue and not without_grad.epilogue
    # the variants do not share kernels: planning one never marks another's outputs
    assert not any(k.accumulate for k in without_grad.kernels)


def test_buffer_plan_fresh_pooled_and_dying() -> None:
    graph, _ = _graph(lambda x, w: ((x * w).tanh() * (x + 1.0)).sum(), _leaves())
    fused = sched.steps(graph, "default")
    schedule = sched.finish(fused, graph, frozenset(), lambda k: False)
    plan = plan_buffers(schedule, graph)
    effects = {v for _, _, v in graph.effects}
    assert effects and effects <= plan.fresh  # each leaf's gradient is used by one effect only
    assert not (plan.pooled & effects)  # what becomes a .grad is never reused
    for k, dead in plan.dying.items():
        assert not set(dead) & effects
        for v in dead:  # dropped after its last use, never before
            later = [s for s in schedule.steps[k + 1 :] if v in sched.step_inputs(s)]
            assert not later


def _deep_mlp(layers: int = 8, width: int = 128) -> tuple[list, fg.Tensor]:
    fg.manual_seed(0)
    weights = [fg.randn(width, width, requires_grad=True) for _ in range(layers)]
    return weights, fg.randn(32, width)


def _mlp_loss(weights: list, x: fg.Tensor) -> fg.Tensor:
    for w in weights:
        x = (x @ w).tanh()
    return x.sum()


def test_gradients_are_written_when_computed_not_kept_to_the_end() -> None:
    """Each weight's gradient (a matmul, read by nothing later) is written to .grad right after
    the step that computes it and its array dropped, as eager's engine does: the compiled
    backward's peak memory is eager's, not eager's plus every gradient at once."""
    weights, x = _deep_mlp()
    graph, _ = _graph(lambda *ws: _mlp_loss(list(ws), x), weights)
    schedule = sched.finish(sched.steps(graph, "default"), graph, frozenset(), lambda k: False)
    plan = plan_buffers(schedule, graph)
    early = {v for pairs in plan.early.values() for _, v in pairs}
    assert len(early) == len(weights)
    for k, pairs in plan.early.items():
        for _, v in pairs:  # made by step k, read by no later step
            assert v in (
                schedule.steps[k].outputs
                if isinstance(schedule.steps[k], Kernel)
                else [schedule.steps[k].value]
            )
            assert not [s for s in schedule.steps[k + 1 :] if v in sched.step_inputs(s)]
    peaks = []
    for compiled in (False, True, True):  # (the first compiled call compiles)
        for w in weights:
            w.grad = fg.zeros_like(w)
        loss = _mlp_loss(weights, x)
        tracemalloc.start()
        try:
            if compiled:
                with compiler.compiled_autograd():
                    loss.backward()
            else:
                loss.backward()
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    one_gradient = weights[0].numel() * 4
    assert peaks[2] <= peaks[0] + one_gradient, peaks  # (all of them: 8x one_gradient more)


def test_no_early_writes_under_hooks_or_anomaly_checks() -> None:
    weights, x = _deep_mlp(layers=3, width=8)

    def loss(*ws: fg.Tensor) -> fg.Tensor:
        ws[0].register_hook(lambda g: None)
        return _mlp_loss(list(ws), x)

    graph, _ = _graph(loss, weights)
    schedule = sched.finish(sched.steps(graph, "default"), graph, frozenset(), lambda k: False)
    assert not plan_buffers(schedule, graph).early
    compiler.reset()
    weights, x = _deep_mlp(layers=3, width=8)  # (without the hook)
    with fg.autograd.detect_anomaly(), compiler.compiled_autograd():
        _mlp_loss(weights, x).backward()
    (program,) = compiler.cached_programs()
    assert program.checks and not program.default.buffers.early


def test_no_pooling_when_a_user_hook_may_keep_a_buffer() -> None:
    x, w = _leaves()
    kept: list = []

    def loss(x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
        h = (x * w).tanh()
        h.register_hook(lambda g: kept.append(g))
        return (h * x).sum()

    graph, _ = _graph(loss, [x, w])
    schedule = sched.finish(sched.steps(graph, "default"), graph, frozenset(), lambda k: False)
    assert not plan_buffers(schedule, graph).pooled


def test_program_runs_what_the_passes_planned() -> None:
    x, w = _leaves(16)
    with compiler.compiled_autograd():
        _chain(x, w).backward()
    (program,) = compiler.cached_programs()
    variant = program.default
    assert variant.schedule.steps == tuple(program.steps)
    assert set(variant.interpreted) == {
        id(variant.schedule.steps[k]) for k in variant.schedule.interpreted
    }
