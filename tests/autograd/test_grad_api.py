"""``autograd.grad``, ``backward(inputs=...)`` and ``retain_grad``."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import grad


def _leaf(*shape: int, seed: int = 0) -> fg.Tensor:
    data = np.random.default_rng(seed).standard_normal(shape)
    return fg.tensor(data, requires_grad=True)


def _mark_runs(runs: list, **tensors: fg.Tensor) -> None:
    for name, t in tensors.items():
        t.grad_fn.register_prehook(lambda g, name=name: runs.append(name))


# ---- grad() --------------------------------------------------------------------------------


def test_grad_returns_gradients_without_touching_dot_grad() -> None:
    a = _leaf(3)
    b = _leaf(3, seed=1)
    y = (a * b).sum()
    ga, gb = grad(y, [a, b])
    np.testing.assert_allclose(ga.numpy(), b.detach().numpy())
    np.testing.assert_allclose(gb.numpy(), a.detach().numpy())
    assert a.grad is None and b.grad is None


def test_grad_accepts_a_single_tensor_and_returns_a_tuple() -> None:
    a = _leaf(2)
    result = grad((a * a).sum(), a)
    assert isinstance(result, tuple) and len(result) == 1


def test_grad_runs_only_nodes_on_a_path_to_the_inputs() -> None:
    a = _leaf(3)
    w = _leaf(3, seed=1)
    pa = a.exp()
    pw = w.sin()  # only on the path to w
    pw2 = pw * 2.0
    y = (pa + pw2).sum()
    runs: list = []
    _mark_runs(runs, pa=pa, pw=pw, pw2=pw2, y=y)
    w_hooks: list = []
    w.register_hook(lambda g: w_hooks.append(g))
    (ga,) = grad(y, a, retain_graph=True)
    assert sorted(runs) == ["pa", "y"] and w_hooks == []
    np.testing.assert_allclose(ga.numpy(), np.exp(a.detach().numpy()))
    # and the branch that did not run still has its saved tensors
    runs.clear()
    (gw,) = grad(y, w)
    assert "pw" in runs and "pw2" in runs
    np.testing.assert_allclose(gw.numpy(), 2 * np.cos(w.detach().numpy()))


def test_grad_with_respect_to_a_non_leaf() -> None:
    a = _leaf(3)
    h = a.exp()
    y = (h * h).sum()
    runs: list = []
    _mark_runs(runs, h=h, y=y)
    (gh,) = grad(y, h)
    np.testing.assert_allclose(gh.numpy(), 2 * h.detach().numpy())
    assert runs == ["y"]  # h's own node is not needed: only its incoming gradient
    assert h.grad is None and a.grad is None


def test_grad_with_respect_to_a_non_leaf_and_a_leaf_behind_it() -> None:
    a = _leaf(3)
    h = a * 3.0
    y = (h * h).sum()
    gh, ga = grad(y, [h, a])
    np.testing.assert_allclose(gh.numpy(), 2 * h.detach().numpy())
    np.testing.assert_allclose(ga.numpy(), 6 * h.detach().numpy())


def test_grad_with_grad_outputs_and_several_outputs() -> None:
    a = _leaf(2)
    y1 = a * 2.0
    y2 = a * a
    v1 = fg.tensor([1.0, 0.0], dtype=fg.float64)
    v2 = fg.tensor([0.5, 1.0], dtype=fg.float64)
    (ga,) = grad([y1, y2], a, [v1, v2])
    expected = 2.0 * v1.numpy() + 2 * a.detach().numpy() * v2.numpy()
    np.testing.assert_allclose(ga.numpy(), expected)


def test_grad_of_an_output_with_respect_to_itself() -> None:
    a = _leaf(2)
    y = a * 2.0
    v = fg.tensor([3.0, 4.0], dtype=fg.float64)
    (gy,) = grad(y, y, v)
    np.testing.assert_array_equal(gy.numpy(), [3.0, 4.0])


def test_unused_input_raises_unless_allowed() -> None:
    a = _leaf(2)
    b = _leaf(2, seed=1)
    y = (a * 2.0).sum()
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        grad(y, [a, b], retain_graph=True)
    ga, gb = grad(y, [a, b], allow_unused=True, retain_graph=True)
    assert gb is None and ga is not None
    ga, gb = grad(y, [a, b], materialize_grads=True)
    np.testing.assert_array_equal(gb.numpy(), [0.0, 0.0])
    assert gb.shape == b.shape and gb.dtype == b.dtype
    with pytest.raises(ValueError, match="allow_unused"):
        grad((a * 2.0).sum(), [a, b], allow_unused=False, materialize_grads=True)


def test_grad_argument_errors() -> None:
    a = _leaf(2)
    y = a * 2.0
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar"):
        grad(y, a)
    with pytest.raises(ValueError, match="Mismatch in shape"):
        grad(y, a, fg.ones(3, dtype=fg.float64))
    with pytest.raises(RuntimeError, match="does not require grad"):
        grad(y.sum(), fg.ones(2))
    with pytest.raises(RuntimeError, match="does not require grad"):
        grad(fg.ones(2).sum(), a)
    with pytest.raises(RuntimeError, match="non-empty inputs"):
        grad(y.sum(), [])
    # nothing was consumed by the failed calls
    (ga,) = grad(y.sum(), a)
    np.testing.assert_array_equal(ga.numpy(), [2.0, 2.0])


def test_grad_create_graph_result_is_differentiable() -> None:
    a = _leaf(3)
    (g,) = grad((a**3).sum(), a, create_graph=True)
    assert g.requires_grad
    (gg,) = grad(g.sum(), a)
    np.testing.assert_allclose(gg.numpy(), 6 * a.detach().numpy())


def test_grad_calls_leaf_tensor_hooks_but_not_post_accumulate_hooks() -> None:
    a = _leaf(2)
    events: list = []
    a.register_hook(lambda g: events.append("hook") or g * 2.0)
    a.register_post_accumulate_grad_hook(lambda t: events.append("post-acc"))
    (ga,) = grad((a * 1.0).sum(), a)
    assert events == ["hook"]
    np.testing.assert_array_equal(ga.numpy(), [2.0, 2.0])  # the hook's result is captured
    assert a.grad is None


# ---- backward(inputs=...) ------------------------------------------------------------------


def test_backward_inputs_accumulates_only_into_listed_leaves() -> None:
    a = _leaf(2)
    b = _leaf(2, seed=1)
    y = (a * b).sum()
    y.backward(inputs=[a])
    assert b.grad is None
    np.testing.assert_allclose(a.grad.numpy(), b.detach().numpy())


def test_backward_inputs_skips_unrelated_branches() -> None:
    a = _leaf(2)
    b = _leaf(2, seed=1)
    pb = b.exp()
    y = (a * 2.0 + pb).sum()
    runs: list = []
    _mark_runs(runs, pb=pb)
    y.backward(inputs=[a])
    assert runs == []
    assert b.grad is None


def test_backward_inputs_with_a_non_leaf() -> None:
    a = _leaf(2)
    h = a * 3.0
    y = (h * h).sum()
    y.backward(inputs=[h], retain_graph=True)
    np.testing.assert_allclose(h.grad.numpy(), 2 * h.detach().numpy())
    assert a.grad is None
    y.backward(inputs=[h, a])  # accumulates into h.grad and a.grad
    np.testing.assert_allclose(h.grad.numpy(), 4 * h.detach().numpy())
    np.testing.assert_allclose(a.grad.numpy(), 6 * h.detach().numpy())


def test_backward_inputs_with_retain_grad_stores_once() -> None:
    a = _leaf(2)
    h = a * 3.0
    h.retain_grad()
    (h * 2.0).sum().backward(inputs=[h])
    np.testing.assert_array_equal(h.grad.numpy(), [2.0, 2.0])


def test_backward_inputs_errors() -> None:
    a = _leaf(2)
    y = (a * 2.0).sum()
    with pytest.raises(RuntimeError, match="cannot be empty"):
        y.backward(inputs=[])
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.backward(inputs=[fg.ones(2)])
    y.backward(inputs=a)  # a single tensor is accepted
    np.testing.assert_array_equal(a.grad.numpy(), [2.0, 2.0])


# ---- retain_grad ---------------------------------------------------------------------------


def test_retain_grad_on_a_non_leaf_accumulates_across_backwards() -> None:
    a = _leaf(3)
    h = a.exp()
    assert not h.retains_grad
    h.retain_grad()
    assert h.retains_grad
    y = (h * 2.0).sum()
    y.backward(retain_graph=True)
    np.testing.assert_array_equal(h.grad.numpy(), np.full(3, 2.0))
    y.backward()
    np.testing.assert_array_equal(h.grad.numpy(), np.full(3, 4.0))


def test_without_retain_grad_non_leaves_keep_no_grad() -> None:
    a = _leaf(3)
    h = a.exp()
    (h * 2.0).sum().backward()
    assert h.grad is None


def test_retain_grad_sees_the_result_of_tensor_hooks() -> None:
    a = _leaf(2)
    h = a * 1.0
    h.register_hook(lambda g: g * 10.0)
    h.retain_grad()
    h.sum().backward()
    np.testing.assert_array_equal(h.grad.numpy(), [10.0, 10.0])
    np.testing.assert_array_equal(a.grad.numpy(), [10.0, 10.0])


def test_retain_grad_on_a_leaf_is_a_no_op_and_needs_requires_grad() -> None:
    a = _leaf(2)
    a.retain_grad()
    (a * 2.0).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [2.0, 2.0])
    with pytest.raises(RuntimeError, match="requires_grad=False"):
        fg.ones(2).retain_grad()


def test_retain_grad_follows_an_in_place_rebase() -> None:
    a = _leaf(2)
    h = a * 1.0
    h.retain_grad()
    h.mul_(3.0)
    (h * 2.0).sum().backward()
    np.testing.assert_array_equal(h.grad.numpy(), [2.0, 2.0])  # gradient of the new value
    np.testing.assert_array_equal(a.grad.numpy(), [6.0, 6.0])
