"""Saved values kept in the node's own slots (``OpNode``'s compact form) behave as the
``SavedTensor`` objects they stand for: the same gradients, the same version and "freed"
errors, the same introspection, memory released after backward, whether or not anything read
``grad_fn._saved`` (which builds the objects) before the backward ran."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import node as node_module

MODIFIED = "one of the variables needed for gradient computation has been modified by an inplace"
FREED = "Trying to backward through the graph a second time"


def _leaves(seed: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    x = fg.tensor(rng.uniform(0.5, 1.5, (3, 4)), dtype=fg.float64, requires_grad=True)
    w = fg.tensor(rng.uniform(0.5, 1.5, (3, 4)), dtype=fg.float64, requires_grad=True)
    return x, w


# graphs over two float64 leaves of one shape: two saved inputs (mul), a saved output (tanh,
# exp, sigmoid), a wrapped number (x * 0.5), one value of two saved (only w requires grad),
# broadcasting, several consumers of one tensor, and rules outside the compact form
GRAPHS: dict[str, Callable[[Any, Any], Any]] = {
    "mul": lambda x, w: x * w,
    "mul_square": lambda x, w: (x * w) * (x * w),
    "tanh_chain": lambda x, w: (x * w + x).tanh() * w,
    "sigmoid_scalar": lambda x, w: (x.sigmoid() * 0.5 - w).exp(),
    "div_sub": lambda x, w: (x / w - w / x).sin(),
    "one_requires_grad": lambda x, w: x.detach() * w,
    "broadcast": lambda x, w: (x * w[0]) + w.sum(0),
    "atan2_pow": lambda x, w: x.atan2(w) ** 2,
    "reductions": lambda x, w: (x * w).sum(1).exp() * w.mean(1),
}


def _nodes(root: Any) -> list:
    seen, stack, found = {id(root)}, [root], []
    while stack:
        n = stack.pop()
        found.append(n)
        for nxt, _ in n.next_functions:
            if nxt is not None and id(nxt) not in seen:
                seen.add(id(nxt))
                stack.append(nxt)
    return found


def _grads(graph: Callable, read_saved: bool, retain: bool = False) -> list:
    x, w = _leaves(0)
    y = graph(x, w)
    if read_saved:  # build every node's SavedTensor objects before the backward
        for n in _nodes(y.grad_fn):
            if isinstance(n, node_module.OpNode):
                assert n._saved is not None
    y.sum().backward(retain_graph=retain)
    if retain:
        y.sum().backward()
    return [t.grad.numpy().copy() for t in (x, w) if t.grad is not None]


@pytest.mark.parametrize("name", list(GRAPHS))
def test_gradients_are_the_same_whether_the_saved_objects_were_built_or_not(name: str) -> None:
    graph = GRAPHS[name]
    plain = _grads(graph, read_saved=False)
    built = _grads(graph, read_saved=True)
    assert len(plain) == len(built) > 0
    for a, b in zip(plain, built):
        np.testing.assert_array_equal(a, b)
    twice = _grads(graph, read_saved=False, retain=True)
    for a, b in zip(plain, twice):
        np.testing.assert_allclose(b, 2 * a, rtol=1e-12)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_gradients_match_torch(name: str) -> None:
    torch = pytest.importorskip("torch")
    graph = GRAPHS[name]
    ours = _grads(graph, read_saved=False)
    x, w = _leaves(0)
    tx = torch.tensor(x.detach().numpy(), requires_grad=True)
    tw = torch.tensor(w.detach().numpy(), requires_grad=True)
    graph(tx, tw).sum().backward()
    theirs = [t.grad.numpy() for t in (tx, tw) if t.grad is not None]
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_common_nodes_keep_their_values_in_their_slots_until_read() -> None:
    x, w = _leaves(1)
    y = (x * w).tanh()
    mul = y.grad_fn.next_functions[0][0]
    assert y.grad_fn._saved_list is node_module._COMPACT
    assert mul._saved_list is node_module._COMPACT
    saved = mul._saved
    assert [type(s) for s in saved] == [node_module.SavedTensor] * 2
    assert mul._saved is saved and mul._saved_list is saved  # built once, then the node's
    assert mul._saved_self is x and mul._saved_other is w
    assert mul._raw_saved_self is saved[0]
    out = y.grad_fn._saved_result
    np.testing.assert_array_equal(out.detach().numpy(), y.detach().numpy())
    assert out.grad_fn is y.grad_fn


@pytest.mark.parametrize("read_saved", [False, True], ids=["in slots", "built"])
@pytest.mark.parametrize("where", ["input", "output"])
def test_the_version_error_is_the_same(read_saved: bool, where: str) -> None:
    x, w = _leaves(2)
    h = x.exp()
    y = h * w if where == "input" else h.tanh()
    target = h if where == "input" else y
    if read_saved:
        assert y.grad_fn._saved is not None
    with fg.no_grad():
        target.add_(1.0)
    with pytest.raises(RuntimeError, match=MODIFIED) as info:
        y.sum().backward()
    message = str(info.value)
    if where == "input":
        assert "[float64 [3, 4]], which is output 0 of ExpBackward0," in message
        assert "(needed by MulBackward0)" in message
    else:
        assert "output 0 of TanhBackward0" in message
    assert "is at version 1; expected version 0 instead" in message
    assert x.grad is None and w.grad is None


@pytest.mark.parametrize("read_saved", [False, True], ids=["in slots", "built"])
def test_a_second_backward_and_a_saved_read_after_it_say_freed(read_saved: bool) -> None:
    x, w = _leaves(3)
    y = (x * w).tanh()
    mul = y.grad_fn.next_functions[0][0]
    if read_saved:
        assert mul._saved is not None
    y.sum().backward()
    assert mul._saved is None and y.grad_fn._saved is None
    with pytest.raises(RuntimeError, match=FREED):
        y.sum().backward()
    with pytest.raises(RuntimeError, match=FREED):
        _ = mul._saved_self


def test_backward_lets_go_of_the_saved_tensors_and_producers() -> None:
    x, w = _leaves(4)
    h = x.exp()
    y = h * w  # saves h (an input) and w
    z = y.tanh()  # saves its output
    kept_node = y.grad_fn
    h_ref = weakref.ref(h)
    del h
    gc.collect()
    assert h_ref() is not None  # the mul node holds it until the backward
    assert z.grad_fn._s0 is not None
    z.sum().backward()
    gc.collect()
    assert h_ref() is None
    assert kept_node._saved is None and z.grad_fn._saved is None
    assert z.grad_fn._s0 is None  # the output's array is let go too


def test_an_inference_tensor_is_refused_when_saved() -> None:
    w = fg.ones(3, requires_grad=True)
    with fg.inference_mode():
        a = fg.ones(3)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        a * w


def test_saved_tensor_hooks_see_every_value_of_a_common_node() -> None:
    packed: list = []

    def pack(t: Any) -> Any:
        packed.append(t)
        return t

    x, w = _leaves(5)
    with fg.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = (x * w).tanh()
    assert len(packed) == 3  # x and w for mul, the output for tanh
    assert isinstance(y.grad_fn._saved_list, list)
    y.sum().backward()
    np.testing.assert_allclose(
        x.grad.numpy(), (1 - np.tanh((x * w).detach().numpy()) ** 2) * w.detach().numpy()
    )
