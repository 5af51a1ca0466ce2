"""Reentrant backward in depth: backward()/grad() from custom backwards and from hooks, 1,000
levels deep; the nested task finishes before its caller continues; errors and thread-local state
across levels; graph-task ids and the reentrant-checkpoint validity flag."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import Function, engine, grad

DEEP = 1000


def _t(data, requires_grad: bool = False) -> fg.Tensor:
    return fg.tensor(np.asarray(data, dtype=np.float64), requires_grad=requires_grad)


class BackwardInside(Function):
    """Its backward calls ``backward()`` (not grad) on a fresh graph ``level`` more times."""

    @staticmethod
    def forward(ctx, x, level, log):
        ctx.level, ctx.log = level, log
        return x * 3.0

    @staticmethod
    def backward(ctx, g):
        ctx.log.append(ctx.level)
        if ctx.level > 0:
            with fg.enable_grad():
                inner = _t([1.0], True)
                BackwardInside.apply(inner, ctx.level - 1, ctx.log).sum().backward()
                assert inner.grad is not None
        return g * 3.0, None, None


def test_backward_inside_backward_a_thousand_levels_deep() -> None:
    assert DEEP * 10 > sys.getrecursionlimit()  # plain nesting would overflow the stack
    log: list = []
    x = _t([1.0, 2.0], True)
    BackwardInside.apply(x, DEEP, log).sum().backward()
    assert log == list(range(DEEP, -1, -1))
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def _grad_in_hook(level: int, count: list) -> fg.Tensor:
    """grad() of a graph whose tensor hook calls this again, one level down."""
    count.append(level)
    x = _t([1.0], True)
    with fg.enable_grad():  # hooks run with grad mode off (no create_graph), as in torch
        y = x * 1.0
    if level > 0:
        y.register_hook(lambda g: g * _grad_in_hook(level - 1, count))
    with fg.enable_grad():
        out = (y * 2.0).sum()
    (gx,) = grad(out, x)
    return gx


def test_grad_inside_hooks_a_thousand_levels_deep() -> None:
    count: list = []
    value = _grad_in_hook(DEEP, count)
    assert len(count) == DEEP + 1
    np.testing.assert_allclose(value.numpy(), [2.0 ** (DEEP + 1)])


def test_nested_task_runs_to_completion_before_its_caller_continues() -> None:
    """The nested graph task (deeper) runs all its nodes before the outer task runs any other
    node, as PyTorch's reentrant backward does."""
    order: list = []

    class Outer(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            order.append("outer:start")
            with fg.enable_grad():
                inner = _t([1.0], True)
                a = inner * 2.0
                a.register_hook(lambda gg: order.append("inner:a") and None)
                b = a.exp()
                b.register_hook(lambda gg: order.append("inner:b") and None)
                inner.register_hook(lambda gg: order.append("inner:leaf") and None)
                b.sum().backward()
            order.append("outer:end")
            return g

    x = _t([1.0], True)
    left = Outer.apply(x)
    right = x * 5.0
    right.register_hook(lambda g: order.append("outer:other-branch") and None)
    (left.sum() + right.sum()).backward()
    start, end = order.index("outer:start"), order.index("outer:end")
    assert order[start + 1 : end] == ["inner:b", "inner:a", "inner:leaf"]
    # the other branch of the outer graph runs either before or after, never in between
    other = order.index("outer:other-branch")
    assert other < start or other > end


def test_error_in_a_nested_hook_reaches_the_outer_call_and_state_is_restored() -> None:
    depth = 3 * engine.MAX_REENTRANT_DEPTH  # crosses several worker threads

    def nested(level: int) -> fg.Tensor:
        x = _t([1.0], True)
        with fg.enable_grad():
            y = x * 1.0

        def hook(g):
            if level == 0:
                raise ValueError("failed in the innermost hook")
            return g * nested(level - 1)

        y.register_hook(hook)
        with fg.enable_grad():
            out = y.sum()
        (gx,) = grad(out, x)
        return gx

    with pytest.raises(ValueError, match="failed in the innermost hook"):
        nested(depth)
    assert fg.is_grad_enabled()
    assert engine.current_graph_task_id() == -1
    assert engine.is_checkpoint_valid()


def test_graph_task_ids_and_checkpoint_validity() -> None:
    seen: list = []

    class Probe(Function):
        @staticmethod
        def forward(ctx, x, nested_with_grad):
            ctx.nested_with_grad = nested_with_grad
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            seen.append((engine.current_graph_task_id(), engine.is_checkpoint_valid()))
            if ctx.nested_with_grad is not None:
                with fg.enable_grad():
                    inner = _t([1.0], True)
                    out = Probe.apply(inner, None).sum()
                    if ctx.nested_with_grad:
                        grad(out, inner)
                    else:
                        out.backward()
            return g, None

    assert engine.current_graph_task_id() == -1
    x = _t([1.0], True)
    Probe.apply(x, False).sum().backward()  # backward() nesting backward()
    (outer_id, outer_valid), (inner_id, inner_valid) = seen
    assert outer_id != inner_id and outer_id > 0 and inner_id > 0
    assert outer_valid and inner_valid
    seen.clear()
    grad(Probe.apply(x, False).sum(), x)  # grad(): invalid here and in what it nests
    assert [valid for _, valid in seen] == [False, False]
    seen.clear()
    Probe.apply(x, True).sum().backward(inputs=[x])
    assert [valid for _, valid in seen] == [False, False]
    seen.clear()
    Probe.apply(x, True).sum().backward()  # valid outside, grad() inside is not
    assert [valid for _, valid in seen] == [True, False]
    assert engine.current_graph_task_id() == -1
