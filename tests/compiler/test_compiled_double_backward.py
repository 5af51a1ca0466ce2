"""Compiled double backward (issue 12, item 3): ``create_graph=True`` inside compiled autograd.

The first-order backward is a compiled program whose gradients carry one
``CompiledGradBackward`` node; a backward through that node inlines its VJP graph (the same
derivative rules, applied to the captured graph) into its own program.  Every test compares
values with eager mode and checks what compiled and what fell back.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.autograd import gradgradcheck

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from op_table import FG, build  # noqa: E402
from test_op_table import GRADGRAD_CASES, _float_outputs  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_compiler")

# the first twice-differentiable sample of every op-table entry
FIRST_GRADGRAD = list({e.name: (e, s) for e, s in reversed(GRADGRAD_CASES)}.values())


def _leaves(seed: int = 0) -> tuple[fg.Tensor, fg.Tensor]:
    rng = np.random.default_rng(seed)
    x = fg.tensor(rng.standard_normal((5, 4)), requires_grad=True)
    w = fg.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    return x, w


def _both(program: Any, calls: int = 2) -> list:
    """``program`` eagerly, then ``calls`` times in compiled autograd: the same results."""
    eager = program()
    for _ in range(calls):
        with compiler.compiled_autograd():
            got = program()
        for e, c in zip(eager, got):
            np.testing.assert_allclose(c, e, rtol=1e-12, atol=1e-13)
    return eager


def _no_fallback() -> None:
    assert not compiler.counters.fallbacks, compiler.counters.fallbacks


def test_a_gradient_penalty_runs_two_compiled_programs() -> None:
    def program() -> list:
        x, w = _leaves()
        y = (x @ w).tanh().pow(2).sum()
        (gx,) = fg.autograd.grad(y, x, create_graph=True)
        penalty = gx.pow(2).sum()
        penalty.backward()
        return [penalty.detach().numpy(), w.grad.numpy(), x.grad.numpy()]

    _both(program)
    _no_fallback()
    assert compiler.counters.captures == 2  # the create_graph backward, the penalty's
    assert compiler.counters.compiled_runs == 4


def test_hessian_vector_products_and_a_third_order() -> None:
    def hvp() -> list:
        x, _ = _leaves()
        v = fg.ones(5, 4, dtype=fg.float64)
        y = (x.sin() * x.exp()).sum()
        (g,) = fg.autograd.grad(y, x, create_graph=True)
        (h,) = fg.autograd.grad((g * v).sum(), x)
        return [h.numpy()]

    def third() -> list:
        x, _ = _leaves()
        (g1,) = fg.autograd.grad(x.pow(4).sum(), x, create_graph=True)
        (g2,) = fg.autograd.grad(g1.sum(), x, create_graph=True)
        (g3,) = fg.autograd.grad(g2.sum(), x)
        return [g1.detach().numpy(), g2.detach().numpy(), g3.numpy()]

    _both(hvp)
    values = _both(third)
    x, _ = _leaves()
    np.testing.assert_allclose(values[2], 24 * x.detach().numpy(), rtol=1e-12)
    _no_fallback()


@pytest.mark.parametrize("create_graph", [False, True])
def test_the_node_runs_in_the_eager_engine_too(create_graph: bool) -> None:
    """A second backward outside compiled autograd runs the node itself: its VJP program, or
    (``create_graph`` again) the captured graph re-evaluated eagerly and differentiated."""

    def grads(compiled: bool) -> list:
        x, _ = _leaves()
        y = (x.exp() * x.sin()).sum()
        if compiled:
            with compiler.compiled_autograd():
                (g,) = fg.autograd.grad(y, x, create_graph=True)
        else:
            (g,) = fg.autograd.grad(y, x, create_graph=True)
        (h,) = fg.autograd.grad(g.pow(2).sum(), x, create_graph=create_graph)
        out = [g.detach().numpy(), h.detach().numpy()]
        if create_graph:
            (t,) = fg.autograd.grad(h.sum(), x)
            out.append(t.numpy())
        return out

    for e, c in zip(grads(False), grads(True)):
        np.testing.assert_allclose(c, e, rtol=1e-12, atol=1e-13)
    # the create_graph backward, and the node's VJP program (with create_graph, in the third
    # order: the second order's cotangent 2g flows back into g's node)
    assert compiler.counters.compiled_runs == 2
    _no_fallback()


def test_gradients_require_grad_exactly_where_eagers_do() -> None:
    def program() -> list:
        x, w = _leaves()
        gx, gw = fg.autograd.grad((3.0 * x).sum() + (w * w).sum(), [x, w], create_graph=True)
        return [np.array([gx.requires_grad, gw.requires_grad]), gx.detach().numpy()]

    eager = _both(program)
    assert eager[0].tolist() == [False, True]


def test_backward_with_create_graph_writes_differentiable_grads() -> None:
    def program() -> list:
        x, w = _leaves()
        (x @ w).sigmoid().sum().backward(create_graph=True)
        assert w.grad.grad_fn is not None
        (gx,) = fg.autograd.grad(w.grad.pow(2).sum(), x)
        return [w.grad.detach().numpy(), gx.numpy()]

    _both(program)
    _no_fallback()


def test_create_graph_adding_into_an_existing_grad_sums_out_of_place() -> None:
    """As eager: ``.grad = .grad + g``, a new tensor whose history reaches both the old .grad
    (which requires grad here) and the compiled node; the old tensor is left as it was."""

    def program() -> list:
        x, w = _leaves()
        old = fg.tensor(np.full((4, 3), 0.5), requires_grad=True)
        w.grad = old
        (x @ w).tanh().sum().backward(create_graph=True)
        assert w.grad is not old and w.grad.grad_fn is not None
        gx, gold = fg.autograd.grad(w.grad.pow(2).sum(), [x, old])
        return [w.grad.detach().numpy(), gx.numpy(), gold.numpy(), old.detach().numpy()]

    _both(program)
    _no_fallback()


def test_grad_outputs_that_require_grad_are_inputs_of_the_node() -> None:
    def program() -> list:
        x, _ = _leaves()
        v = fg.tensor(np.linspace(-1.0, 1.0, 20).reshape(5, 4), requires_grad=True)
        (g,) = fg.autograd.grad(x.exp(), x, grad_outputs=v, create_graph=True)
        gv, gx = fg.autograd.grad(g.sum(), [v, x])
        return [gv.numpy(), gx.numpy()]

    _both(program)
    _no_fallback()


def test_without_retain_graph_the_forward_graph_is_freed_as_in_eager() -> None:
    """``retain_graph=False``: the first backward frees the forward's saved tensors; the second
    order then needs ``TanhBackward0``'s output again and raises eager's error."""
    for compiled in (False, True):
        x, _ = _leaves()
        region = compiler.compiled_autograd() if compiled else fg.enable_grad()
        with region:
            (g,) = fg.autograd.grad(x.tanh().sum(), x, create_graph=True, retain_graph=False)
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                fg.autograd.grad(g.sum(), x)


def test_an_input_modified_in_place_raises_eagers_error() -> None:
    for compiled in (False, True):
        x, _ = _leaves()
        h = x * 1.0
        (g,) = fg.autograd.grad(h.pow(3).sum(), x, create_graph=True)
        with fg.no_grad():
            h.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            if compiled:
                with compiler.compiled_autograd():
                    g.sum().backward()
            else:
                g.sum().backward()


def test_a_second_backward_through_a_released_node_raises() -> None:
    x, _ = _leaves()
    with compiler.compiled_autograd():
        (g,) = fg.autograd.grad(x.exp().sum(), x, create_graph=True)
        g.sum().backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            g.sum().backward()


@pytest.mark.parametrize("entry,sample", FIRST_GRADGRAD, ids=[e.name for e, _ in FIRST_GRADGRAD])
def test_gradgradcheck_of_every_op_table_entry_in_compiled_autograd(
    entry: Any, sample: Any
) -> None:
    leaves, fn = build(entry, FG, sample, "float64")
    if not leaves:
        pytest.skip("no differentiable input in this case")
    with compiler.compiled_autograd():
        assert gradgradcheck(_float_outputs(fn), tuple(leaves))
    fallbacks = compiler.counters.fallbacks
    for reason in fallbacks:  # only data-dependent shapes (boolean masks), complex values
        assert "data-dependent shape" in reason or "a complex value" in reason, reason
    assert compiler.counters.compiled_runs > 0 or fallbacks
