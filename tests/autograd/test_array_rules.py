"""The array forms of derivative rules (``registry.vjp_arrays``, ``OpNode.run_arrays``): the
eager engine's common path runs them instead of the tensor forms, and they must give the same
bits, take the same gradients' identities, and step aside wherever a tensor of the rule could
be observed (double backward, hooks, forward AD) or the values are not one float dtype."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegrad as fg
from fusegrad.autograd import engine
from fusegrad.ops.registry import RULES

_UNARY = ("neg", "exp", "log", "tanh", "sigmoid", "sqrt", "sum")
_BINARY = ("mul", "div", "sub")


def _grads(build: Any, leaves: list, arrays: bool, monkeypatch: pytest.MonkeyPatch) -> list:
    """The leaves' gradients of ``build(*leaves)`` after one backward, with the array forms
    on or off."""
    monkeypatch.setattr(engine, "array_rules", arrays)
    for t in leaves:
        t.grad = None
    build(*leaves).backward()
    return [None if t.grad is None else t.grad.numpy().copy() for t in leaves]


def _same_bits(a: list, b: list) -> None:
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape
            bits = [v.reshape(-1).view(np.uint8) for v in (x, y)]
            np.testing.assert_array_equal(*bits)


def test_every_array_form_belongs_to_a_rule_of_the_table() -> None:
    with_arrays = {name for name, rule in RULES.items() if rule.arrays is not None}
    assert set(_UNARY + _BINARY) <= with_arrays
    assert all(RULES[name].fn is not None for name in with_arrays)


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    shape_a=st.sampled_from([(), (1,), (5,), (3, 4), (2, 1, 4)]),
    shape_b=st.sampled_from([(), (4,), (3, 1), (1, 4), (3, 4)]),
    needs=st.sampled_from([(True, True), (True, False), (False, True)]),
    ops=st.lists(st.sampled_from(_UNARY[:-1] + _BINARY), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_random_graphs_have_the_tensor_forms_bits(
    dtype: Any, shape_a: tuple, shape_b: tuple, needs: tuple, ops: list, seed: int
) -> None:
    """Chains of the ops with array forms, over broadcasting operands, one or both of which
    require grad (the ``mul``/``div`` rules then see one saved value), in float32 and float64:
    the gradients equal the tensor forms' bit for bit."""
    rng = np.random.default_rng(seed)
    try:
        np.broadcast_shapes(shape_a, shape_b)
    except ValueError:
        return
    a0 = rng.uniform(0.5, 1.5, shape_a).astype(dtype)
    b0 = rng.uniform(0.5, 1.5, shape_b).astype(dtype)

    def build(a: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
        h = a * b
        for op in ops:
            if op in _BINARY:
                h = getattr(h, op)(b if op != "sub" else a)
            elif op in ("log", "sqrt"):
                h = getattr(h.abs() + 0.5, op)()  # (in their domain)
            else:
                h = getattr(h, op)()
            h = h * 0.5 + h.sigmoid()  # (bounded; a Python number wrapped, as in the rules)
        return h.sum()

    with pytest.MonkeyPatch.context() as mp:
        leaves = [
            fg.tensor(a0, requires_grad=needs[0]),
            fg.tensor(b0, requires_grad=needs[1]),
        ]
        want = _grads(build, leaves, False, mp)
        got = _grads(build, leaves, True, mp)
    _same_bits(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sums_over_dims_and_a_scalar_gradient(dtype: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sum`` over some dims, with and without keepdim, and a 0-d chain (numpy's 0-d results
    are scalars, wrapped back as arrays)."""
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((3, 4, 5)).astype(dtype)

    def build(x: fg.Tensor) -> fg.Tensor:
        s = x.tanh().sum(dim=1) * x.sum(dim=(1,), keepdim=True).sum(dim=1) + x.sum()
        return (s.sum().exp() * 1e-3).sigmoid().log().neg()

    leaves = [fg.tensor(x0, requires_grad=True)]
    _same_bits(_grads(build, leaves, True, monkeypatch), _grads(build, leaves, False, monkeypatch))


@pytest.mark.compiled_differs(
    "the array forms are the eager engine's: a compiled backward runs its program instead"
)
def test_the_array_forms_run_on_the_common_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain backward runs the array forms (each once per node); a backward with
    ``create_graph`` (the gradient has history), one under forward AD's dual level, and nodes
    whose gradients are not one float dtype run the tensor forms."""
    calls: list = []
    original = RULES["tanh"].arrays

    def counting(node: Any, g: Any, out: Any) -> tuple:
        calls.append(g.dtype)
        return original(node, g, out)  # type: ignore[misc]

    monkeypatch.setitem(RULES, "tanh", dataclasses.replace(RULES["tanh"], arrays=counting))
    x = fg.tensor(np.linspace(-1.5, 1.5, 4), requires_grad=True)
    x.tanh().tanh().sum().backward()
    assert len(calls) == 2

    calls.clear()
    x.grad = None
    (g,) = fg.autograd.grad(x.tanh().sum(), x, create_graph=True)
    assert not calls and g.requires_grad
    g.sum().backward()  # (through the graph the tensor form built)
    t = np.tanh(x.detach().numpy())
    np.testing.assert_allclose(x.grad.numpy(), -2 * t * (1 - t * t), rtol=1e-12)

    calls.clear()
    xh = fg.randn(4, dtype=fg.float16, requires_grad=True)
    xh.tanh().sum().backward()
    assert not calls and xh.grad is not None

    calls.clear()
    with fg.autograd.forward_ad.dual_level():
        xd = fg.autograd.forward_ad.make_dual(x.detach(), fg.ones(4, dtype=x.dtype))
        xd.requires_grad_(True)
        xd.tanh().sum().backward()
    assert not calls
