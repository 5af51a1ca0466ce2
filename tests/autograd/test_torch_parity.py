"""Gradients of a few composite graphs against PyTorch (skipped when torch is missing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg

torch = pytest.importorskip("torch")


def _mlp(lib: Any, x: Any, w1: Any, b1: Any, w2: Any) -> Any:
    h = (x @ w1 + b1).tanh()
    return ((h @ w2).sigmoid() - 0.5).pow(2).mean()


def _broadcast_mix(lib: Any, a: Any, b: Any, c: Any) -> Any:
    y = a * b + c.exp() / (1.0 + a * a)
    return (y.sum(dim=0) * y.mean(dim=1, keepdim=True).sum()).sum()


def _shared_subexpressions(lib: Any, a: Any, b: Any) -> Any:
    h = (a * b).sin()
    g = h * h + h.cos() * a
    return (g.max() + g.amin(dim=0).sum() + lib.maximum(h, g).sum()) * g.sum()


GRAPHS: list[tuple[Callable, list[tuple]]] = [
    (_mlp, [(5, 3), (3, 4), (4,), (4, 2)]),
    (_broadcast_mix, [(4, 1), (3,), (4, 3)]),
    (_shared_subexpressions, [(3, 4), (4,)]),
]


@pytest.mark.parametrize("index", range(len(GRAPHS)))
def test_first_order_gradients_match_torch(index: int) -> None:
    fn, shapes = GRAPHS[index]
    rng = np.random.default_rng(index)
    arrays = [rng.standard_normal(s) for s in shapes]
    ours = [fg.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    fn(fg, *ours).backward()
    fn(torch, *theirs).backward()
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("index", range(len(GRAPHS)))
def test_second_order_gradients_match_torch(index: int) -> None:
    fn, shapes = GRAPHS[index]
    rng = np.random.default_rng(10 + index)
    arrays = [rng.standard_normal(s) for s in shapes]
    ours = [fg.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    g_ours = fg.autograd.grad(fn(fg, *ours), ours, create_graph=True)
    g_theirs = torch.autograd.grad(fn(torch, *theirs), theirs, create_graph=True)
    sum(((g * g).sum() for g in g_ours), fg.tensor(0.0, dtype=fg.float64)).backward()
    sum((g * g).sum() for g in g_theirs).backward()
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_retain_grad_and_inputs_match_torch() -> None:
    arrays = [np.array([0.5, -1.0, 2.0]), np.array([1.5, 0.25, -0.5])]

    def run(lib: Any) -> list:
        a, b = (lib.tensor(x, requires_grad=True) for x in arrays)
        h = a * b
        h.retain_grad()
        y = (h.exp() * a).sum()
        y.backward(retain_graph=True)
        first = [a.grad.clone(), b.grad.clone(), h.grad.clone()]
        y.backward(inputs=[b])
        return first + [a.grad, b.grad, h.grad]

    for o, t in zip(run(fg), run(torch)):
        np.testing.assert_allclose(o.detach().numpy(), t.detach().numpy(), rtol=1e-12)
