"""``.grad`` accumulation, root gradients, retain_graph and freeing of saved tensors."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg


def _leaf(*shape: int, seed: int = 0) -> fg.Tensor:
    data = np.random.default_rng(seed).standard_normal(shape)
    return fg.tensor(data, requires_grad=True)


def test_first_grad_does_not_alias_the_root_gradient() -> None:
    x = _leaf(3)
    y = x * 1.0
    g = fg.tensor([1.0, 2.0, 3.0], dtype=fg.float64)
    y.backward(g)
    g.mul_(100.0)
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0, 3.0])


def test_siblings_do_not_share_a_grad_buffer() -> None:
    # add's rule hands the same tensor to both inputs
    a = _leaf(2)
    b = _leaf(2, seed=1)
    (a + b).sum().backward()
    assert a.grad is not b.grad and a.grad.data_ptr() != b.grad.data_ptr()
    (a * 3.0).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [4.0, 4.0])
    np.testing.assert_array_equal(b.grad.numpy(), [1.0, 1.0])


def test_siblings_do_not_share_a_grad_buffer_under_create_graph() -> None:
    a = _leaf(2)
    b = _leaf(2, seed=1)
    (a + b).sum().backward(create_graph=True)
    assert a.grad is not b.grad and a.grad.data_ptr() != b.grad.data_ptr()
    (a * 3.0).sum().backward()
    np.testing.assert_array_equal(b.grad.numpy(), [1.0, 1.0])


def test_create_graph_first_grad_does_not_alias_the_root_gradient() -> None:
    x = _leaf(2)
    g = fg.tensor([1.0, 2.0], dtype=fg.float64)
    x.backward(g, create_graph=True)
    (x * 1.0).backward(g, create_graph=True)
    g.add_(5.0)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


def test_later_gradients_are_added_in_place() -> None:
    x = _leaf(3)
    (x * 2.0).sum().backward()
    first = x.grad
    ptr, version = first.data_ptr(), first._version
    (x * 3.0).sum().backward()
    assert x.grad is first and x.grad.data_ptr() == ptr
    assert first._version > version  # the in-place add is visible to version checks
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 5.0))


def test_user_assigned_grad_is_accumulated_into() -> None:
    x = _leaf(2)
    buf = fg.zeros(2, dtype=fg.float64)
    x.grad = buf
    (x * 2.0).sum().backward()
    assert x.grad is buf
    np.testing.assert_array_equal(buf.numpy(), [2.0, 2.0])


def test_grad_with_history_accumulates_in_place_without_create_graph() -> None:
    # like PyTorch: outside create_graph the existing .grad object is updated in place
    x = _leaf(2)
    (x * x).sum().backward(create_graph=True)
    first = x.grad
    assert first.requires_grad
    (x * 1.0).sum().backward()
    assert x.grad is first
    np.testing.assert_allclose(first.detach().numpy(), 2 * x.detach().numpy() + 1.0)


def test_create_graph_accumulation_is_differentiable() -> None:
    x = _leaf(3)
    xv = x.detach().numpy()
    (x**3).sum().backward(create_graph=True)  # .grad = 3 x^2
    first = x.grad
    (x * x).sum().backward(create_graph=True)  # .grad = .grad + 2x: a new tensor
    assert x.grad is not first
    np.testing.assert_allclose(first.detach().numpy(), 3 * xv**2)
    assert x.grad.requires_grad and x.grad.grad_fn is not None
    (gg,) = fg.autograd.grad(x.grad.sum(), x)
    np.testing.assert_allclose(gg.numpy(), 6 * xv + 2.0)


def test_root_gradients_are_never_mutated() -> None:
    x = _leaf(3)
    g = fg.tensor([1.0, 2.0, 3.0], dtype=fg.float64)
    before = g.numpy().copy()
    version = g._version
    y = x * 2.0
    fg.autograd.backward([y, y * 1.0, x], [g, g, g])
    np.testing.assert_array_equal(g.numpy(), before)
    assert g._version == version
    np.testing.assert_allclose(x.grad.numpy(), 5 * before)
    x.grad = None
    x.backward(g)
    x.backward(g)  # accumulates into x.grad in place, not into g
    np.testing.assert_array_equal(g.numpy(), before)
    np.testing.assert_array_equal(x.grad.numpy(), 2 * before)


def test_root_gradient_requiring_grad_is_not_mutated_under_create_graph() -> None:
    x = _leaf(2)
    v = fg.tensor([1.0, -1.0], dtype=fg.float64, requires_grad=True)
    (x * x).backward(v, create_graph=True)
    (x * 1.0).backward(v)
    np.testing.assert_array_equal(v.detach().numpy(), [1.0, -1.0])


# ---- retain_graph -------------------------------------------------------------------------


def test_second_backward_through_saved_tensors_raises() -> None:
    x = _leaf(3)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_backward() -> None:
    x = _leaf(3)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.detach().numpy())
    with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
        y.backward()


def test_nodes_without_saved_tensors_can_run_again() -> None:
    x = _leaf(3)
    z = (x + 2.0).sum()  # add and sum save nothing
    z.backward()
    z.backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 2.0))
    w = (x.exp() + 1.0).sum()  # exp saves its output: the second run fails at exp only
    add_runs = []
    w.grad_fn.next_functions[0][0].register_prehook(lambda g: add_runs.append(1))
    w.backward()
    with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
        w.backward()
    assert len(add_runs) == 2


def test_retain_graph_defaults_to_create_graph() -> None:
    x = _leaf(2)
    y = (x * x).sum()
    (g,) = fg.autograd.grad(y, x, create_graph=True)
    (g2,) = fg.autograd.grad(y, x)  # graph was retained by create_graph=True
    np.testing.assert_allclose(g2.numpy(), g.detach().numpy())
    with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
        fg.autograd.grad(y, x)


def test_saved_tensors_are_freed_after_backward() -> None:
    x = _leaf(2)
    y = x * x
    assert y.grad_fn._saved is not None
    y.sum().backward()
    assert y.grad_fn._saved is None
    with pytest.raises(RuntimeError, match="after they have already been freed"):
        y.grad_fn._saved_a  # noqa: B018


def test_grad_fn_saved_accessors() -> None:
    x = _leaf(2)
    y = x * x
    assert y.grad_fn._saved_a is x and y.grad_fn._saved_b is x
    c = fg.ones(2, dtype=fg.float64)
    y = x * c  # as PyTorch: x is not saved (only its gradient is computed, from c)
    assert y.grad_fn._saved_a is None and y.grad_fn._saved_self is None
    assert y.grad_fn._saved_b is c and y.grad_fn._saved_other is c
    z = x.exp()
    np.testing.assert_allclose(z.grad_fn._saved_out.detach().numpy(), z.detach().numpy())
