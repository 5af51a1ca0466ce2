"""Reentrant backward: grad()/backward() inside a node's backward, nested deeply."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import engine

Function = fg.autograd.Function


class Nested(Function):
    """d/dx (2x), computed by a nested backward through ``depth - 1`` more of these."""

    @staticmethod
    def forward(ctx, x, depth, fail_at=-1):
        ctx.depth, ctx.fail_at = depth, fail_at
        ctx.save_for_backward(x)
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if ctx.depth == ctx.fail_at:
            raise ValueError(f"failed at depth {ctx.depth}")
        if ctx.depth == 0:
            return g * 2.0, None, None
        with fg.enable_grad():
            inner = x.detach().requires_grad_()
            y = Nested.apply(inner, ctx.depth - 1, ctx.fail_at)
            (gi,) = fg.autograd.grad(y.sum(), inner)
        return g * gi, None, None


@pytest.mark.parametrize("depth", [3, 2000])
def test_nested_backward_thousands_deep(depth: int) -> None:
    x = fg.tensor([1.0, 3.0], requires_grad=True)
    Nested.apply(x, depth).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])


def test_error_in_a_deeply_nested_backward_reaches_the_outer_call() -> None:
    x = fg.tensor([1.0], requires_grad=True)
    y = Nested.apply(x, 3 * engine.MAX_REENTRANT_DEPTH, 5).sum()
    with pytest.raises(ValueError, match="failed at depth 5"):
        y.backward()
    assert x.grad is None
    assert fg.is_grad_enabled()


class ModeProbe(Function):
    """Records the grad mode and anomaly state seen by a nested backward."""

    seen: ClassVar[list] = []

    @staticmethod
    def forward(ctx, x, depth):
        ctx.depth = depth
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        ModeProbe.seen.append((fg.is_grad_enabled(), fg.autograd.is_anomaly_enabled()))
        if ctx.depth > 0:
            with fg.enable_grad():
                inner = fg.tensor([1.0], requires_grad=True)
                fg.autograd.grad(ModeProbe.apply(inner, ctx.depth - 1).sum(), inner)
        return g, None


def test_thread_hop_carries_anomaly_mode() -> None:
    ModeProbe.seen = []
    x = fg.tensor([1.0], requires_grad=True)
    depth = engine.MAX_REENTRANT_DEPTH + 3
    with fg.autograd.detect_anomaly():
        ModeProbe.apply(x, depth).sum().backward()
    assert len(ModeProbe.seen) == depth + 1
    assert all(anomaly for _, anomaly in ModeProbe.seen)
    assert not any(grad_on for grad_on, _ in ModeProbe.seen)  # no create_graph anywhere
