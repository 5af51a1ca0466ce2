"""Saving only what is needed (``@vjp(..., save={...})`` in ``derivatives.py``, ``OpNode``): a
node saves a value only if the gradient of an input that requires grad uses it.  For ``x * y``
with only ``x`` requiring grad, ``y`` alone is saved: one pack-hook call, as in PyTorch.  Counts
of pack-hook calls and packed bytes for the binary ops, matmul and linear are checked against a
table and against torch; gradients (eager, compiled, second order) stay right."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import gradgradcheck

# name -> (the op written for a module ``m``, shapes of its two operands, tensors saved when
# both / the first / the second operand require grad)
OPS: dict[str, tuple[Callable[..., Any], tuple[tuple[int, ...], ...], tuple[int, int, int]]] = {
    # each operand only for the other's gradient
    "mul": (lambda m, a, b: a * b, ((3, 4), (3, 4)), (2, 1, 1)),
    "mul broadcast": (lambda m, a, b: a * b, ((3, 4), (4,)), (2, 1, 1)),
    "matmul": (lambda m, a, b: a @ b, ((3, 4), (4, 5)), (2, 1, 1)),
    "matmul batched": (lambda m, a, b: a @ b, ((2, 3, 4), (2, 4, 5)), (2, 1, 1)),
    "linear": (lambda m, a, b: m.nn.functional.linear(a, b), ((3, 4), (5, 4)), (2, 1, 1)),
    "linear with bias": (
        lambda m, a, b: m.nn.functional.linear(a, b, m.ones(5, dtype=m.float64)),
        ((3, 4), (5, 4)),
        (2, 1, 1),
    ),
    # the divisor's gradient needs both
    "div": (lambda m, a, b: a / b, ((3, 4), (3, 4)), (2, 1, 2)),
    # the output only for the exponent's gradient (PyTorch keeps it for the base's too)
    "pow": (lambda m, a, b: a**b, ((3, 4), (3, 4)), (3, 2, 3)),
    "pow by a number": (lambda m, a, b: a**2.5, ((3, 4), (3, 4)), (1, 1, 0)),
    # each operand for its own gradient, the output for both
    "hypot": (lambda m, a, b: m.hypot(a, b), ((3, 4), (3, 4)), (3, 2, 2)),
    # both operands only for the divisor's gradient
    "remainder": (lambda m, a, b: m.remainder(a, b), ((3, 4), (3, 4)), (2, 0, 2)),
    # both for each gradient: always saved
    "atan2": (lambda m, a, b: m.atan2(a, b), ((3, 4), (3, 4)), (2, 2, 2)),
    "maximum": (lambda m, a, b: m.maximum(a, b), ((3, 4), (3, 4)), (2, 2, 2)),
}
NEEDS = {"both": (True, True), "first": (True, False), "second": (False, True)}
# fusegrad saves less than PyTorch here (PowBackward1 keeps its result for the base's gradient)
FEWER_THAN_TORCH = {("pow", "first")}


def _operands(m: Any, shapes: tuple, needs: tuple) -> list:
    rng = np.random.default_rng(0)
    return [
        m.tensor(rng.uniform(0.5, 2.0, shape), dtype=m.float64, requires_grad=rg)
        for shape, rg in zip(shapes, needs)
    ]


def _packs(m: Any, name: str, needs: str) -> tuple[int, int, Any, list]:
    """Pack-hook calls and packed bytes while building ``name``; its output and operands."""
    fn, shapes, _ = OPS[name]
    operands = _operands(m, shapes, NEEDS[needs])
    packed: list = []

    def pack(t: Any) -> Any:
        packed.append(t.numel() * t.element_size())
        return t

    with m.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(m, *operands)
    return len(packed), sum(packed), out, operands


@pytest.mark.parametrize("needs", list(NEEDS))
@pytest.mark.parametrize("name", list(OPS))
def test_saves_only_what_the_gradients_need(name: str, needs: str) -> None:
    count, nbytes, out, operands = _packs(fg, name, needs)
    assert count == OPS[name][2][list(NEEDS).index(needs)]
    if not out.requires_grad:
        return  # (pow by a number of a base that does not require grad: no node at all)
    # and the gradients are those of the node that saved everything
    out.sum().backward()
    fn, shapes, _ = OPS[name]
    full = _operands(fg, shapes, (True, True))
    fn(fg, *full).sum().backward()
    for t, ref in zip(operands, full):
        if t.requires_grad and ref.grad is not None:
            np.testing.assert_allclose(t.grad.numpy(), ref.grad.numpy(), rtol=1e-12)


def test_the_other_operand_is_saved_whole() -> None:
    # x (3, 4) * y (4,): x's gradient needs y (32 bytes), y's needs x (96 bytes)
    assert _packs(fg, "mul broadcast", "first")[:2] == (1, 4 * 8)
    assert _packs(fg, "mul broadcast", "second")[:2] == (1, 12 * 8)
    assert _packs(fg, "matmul", "first")[:2] == (1, 20 * 8)


@pytest.mark.parametrize("needs", list(NEEDS))
@pytest.mark.parametrize("name", list(OPS))
def test_pack_hook_calls_and_bytes_match_torch(name: str, needs: str) -> None:
    torch = pytest.importorskip("torch")
    ours = _packs(fg, name, needs)[:2]
    theirs = _packs(torch, name, needs)[:2]
    if (name, needs) in FEWER_THAN_TORCH:
        assert ours[0] < theirs[0] and ours[1] < theirs[1]
    else:
        assert ours == theirs


def test_unsaved_values_read_as_none_as_in_pytorch() -> None:
    x = fg.ones(2, dtype=fg.float64, requires_grad=True)
    c = fg.ones(2, dtype=fg.float64)
    node = (x * c).grad_fn
    assert node._saved_self is None and node._saved_a is None
    assert node._saved_other is c
    assert [name for name in dir(node) if name.startswith("_raw_saved_")] == [
        "_raw_saved_b",
        "_raw_saved_other",
    ]


@pytest.mark.parametrize("needs", ["first", "second"])
@pytest.mark.parametrize("name", ["mul", "div", "matmul", "linear with bias", "pow", "hypot"])
def test_compiled_backward_with_partly_saved_nodes(name: str, needs: str) -> None:
    from fusegrad import compiler

    compiler.reset()
    fn, shapes, _ = OPS[name]
    eager = _operands(fg, shapes, NEEDS[needs])
    (fn(fg, *eager).tanh() * 2.0).sum().backward()
    compiled = _operands(fg, shapes, NEEDS[needs])
    with compiler.compiled_autograd():
        for _ in range(2):  # a capture, then a run of the cached program
            for t in compiled:
                t.grad = None
            (fn(fg, *compiled).tanh() * 2.0).sum().backward()
    assert compiler.counters.captures == 1 and not compiler.counters.fallbacks
    for t, ref in zip(compiled, eager):
        if t.requires_grad:
            np.testing.assert_allclose(t.grad.numpy(), ref.grad.numpy(), rtol=1e-12)
    compiler.reset()


@pytest.mark.parametrize("name", ["mul", "div", "matmul", "pow", "hypot", "remainder"])
def test_second_order_through_partly_saved_nodes(name: str) -> None:
    fn, shapes, _ = OPS[name]
    for needs in ("first", "second"):
        a, b = _operands(fg, shapes, NEEDS[needs])
        free = b if needs == "first" else a

        def f(t: fg.Tensor, needs: str = needs, free: fg.Tensor = free) -> fg.Tensor:
            return fn(fg, t, free) if needs == "first" else fn(fg, free, t)

        assert gradgradcheck(f, (a if needs == "first" else b,))
