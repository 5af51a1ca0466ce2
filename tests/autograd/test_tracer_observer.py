"""A tracer that only observes (``Tracer.sees_calls = False``, compiled autograd's region):
op dispatch never asks its ``apply``, the op surface's fast paths run as without a tracer, and
``ops.registry.run`` tells it of every backward node it makes (``Tracer.made``) -- and a tracer
that takes calls is still asked for every one."""

from __future__ import annotations

from typing import Any

import numpy as np

import fusegrad as fg
from fusegrad.autograd import tracer
from fusegrad.autograd.node import OpNode


class _Observer(tracer.Tracer):
    sees_calls = False

    def __init__(self) -> None:
        self.made_nodes: list = []

    def apply(self, prim: Any, inputs: tuple, attrs: dict) -> Any:
        raise AssertionError(f"an observing tracer was asked for {prim.name}")

    def made(self, node: Any, inputs: tuple, out: fg.Tensor) -> None:
        assert out.grad_fn is node and type(node) is OpNode
        assert len(inputs) == len(node._edges)
        self.made_nodes.append(node)


class _Taker(tracer.Tracer):
    def __init__(self) -> None:
        self.calls: list = []
        self.made_nodes: list = []

    def apply(self, prim: Any, inputs: tuple, attrs: dict) -> Any:
        self.calls.append(prim.name)
        return NotImplemented

    def made(self, node: Any, inputs: tuple, out: fg.Tensor) -> None:
        self.made_nodes.append(node)


def _ops(x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
    # fast-path forms (tensor-tensor, tensor-number, number-tensor, rsub, generated unary and
    # binary functions, neg) and a few generic ones (reshape, matmul, sum over a dim)
    a = (x * w + 1.0) / (2.0 - x * x)
    b = 1.0 - fg.exp(-a) * 0.5
    c = fg.maximum(b, w).reshape(2, 3) @ fg.ones(3, 2, dtype=fg.float64)
    return c.sum(dim=0).tanh().sum()


def _graph(root: fg.Tensor) -> list:
    seen: dict[int, Any] = {}
    stack = [root.grad_fn]
    while stack:
        n = stack.pop()
        if n is not None and id(n) not in seen:
            seen[id(n)] = n
            stack.extend(child for child, _ in n._edges)
    return [n for n in seen.values() if type(n) is OpNode]


def _leaves() -> tuple[fg.Tensor, fg.Tensor]:
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal(6), requires_grad=True)
    w = fg.tensor(rng.standard_normal(6), requires_grad=True)
    return x, w


def test_an_observer_is_told_of_every_node_and_asked_for_no_call() -> None:
    x, w = _leaves()
    want = _ops(x, w)
    observer = _Observer()
    before = tracer.state.tracer  # (None; the suite's compiled run has a region here)
    with tracer.tracing(observer):
        assert tracer.state.tracer is observer and tracer.state.calls is None
        got = _ops(x, w)
        with fg.no_grad():
            assert _ops(x, w).grad_fn is None  # (no node, nothing told)
    assert tracer.state.tracer is before
    nodes = _graph(got)
    assert len(nodes) == len(observer.made_nodes) == len(_graph(want)) == 15
    assert {id(n) for n in nodes} == {id(n) for n in observer.made_nodes}
    np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())


def test_a_tracer_that_takes_calls_is_asked_for_each_and_told_of_each_node() -> None:
    x, w = _leaves()
    taker = _Taker()
    with tracer.tracing(taker):
        assert tracer.state.calls is taker
        out = _ops(x, w)
    assert len(taker.calls) == 15  # (every op made a node here, each asked for first)
    assert {id(n) for n in _graph(out)} == {id(n) for n in taker.made_nodes}


def test_the_innermost_tracer_decides() -> None:
    taker, observer = _Taker(), _Observer()
    x, w = _leaves()
    with tracer.tracing(taker):
        with tracer.tracing(observer):
            assert tracer.state.calls is None
            (x * w).sum()
        assert tracer.state.calls is taker
        (x * w).sum()
    assert taker.calls == ["mul", "sum"] and len(observer.made_nodes) == 2
