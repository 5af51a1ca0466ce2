"""The recorded graph: requires_grad propagation, leaves, grad_fn, next_functions, node names."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd.node import AccumulateGrad


def _leaf(*shape: int, requires_grad: bool = True) -> fg.Tensor:
    return fg.tensor(np.random.default_rng(0).standard_normal(shape), requires_grad=requires_grad)


def test_output_requires_grad_iff_an_input_does() -> None:
    a = _leaf(3)
    b = _leaf(3, requires_grad=False)
    c = _leaf(3, requires_grad=False)
    assert (a * b).requires_grad
    assert (b * a).requires_grad
    assert not (b * c).requires_grad
    assert (b * c).grad_fn is None
    assert (a + 1.0).requires_grad


def test_no_grad_output_does_not_require_grad() -> None:
    a = _leaf(3)
    with fg.no_grad():
        y = a * 2.0
    assert not y.requires_grad and y.grad_fn is None and y.is_leaf


@pytest.mark.parametrize("dtype", [fg.int64, fg.int32, fg.bool])
def test_only_floating_point_can_require_grad(dtype: fg.dtype) -> None:
    t = fg.zeros(3, dtype=dtype)
    with pytest.raises(TypeError, match="floating point"):
        t.requires_grad_()
    with pytest.raises(TypeError, match="floating point"):
        t.requires_grad = True
    assert not t.requires_grad
    with pytest.raises(TypeError, match="floating point"):
        fg.tensor([1, 2], requires_grad=True)
    # requires_grad_(False) on an integer tensor is harmless
    t.requires_grad_(False)


def test_integer_output_of_a_float_graph_does_not_require_grad() -> None:
    a = _leaf(4)
    assert not (a > 0).requires_grad
    assert not a.argmax().requires_grad


def test_leaves_and_grad_fn() -> None:
    a = _leaf(2, 3)
    assert a.is_leaf and a.grad_fn is None and a.grad is None
    y = a * 2.0
    assert not y.is_leaf and y.grad_fn is not None
    plain = _leaf(2, requires_grad=False)
    assert plain.is_leaf and not plain.requires_grad


def test_requires_grad_flag_only_changes_on_leaves() -> None:
    a = _leaf(2)
    y = a * 2.0
    with pytest.raises(RuntimeError, match="only change requires_grad flags of leaf"):
        y.requires_grad_(False)
    assert y.requires_grad
    a.requires_grad_(False)
    assert not a.requires_grad and not (a * 2.0).requires_grad


def test_next_functions_structure_and_names() -> None:
    a = _leaf(3)
    b = _leaf(3)
    c = _leaf(3, requires_grad=False)
    y = (a * b + c).sum()
    assert y.grad_fn.name() == "SumBackward0"
    assert type(y.grad_fn).__name__ != "" and "SumBackward0" in repr(y.grad_fn)
    (add_edge,) = y.grad_fn.next_functions
    add, nr = add_edge
    assert nr == 0 and add.name() == "AddBackward0"
    (mul, mul_nr), (none, none_nr) = add.next_functions
    assert mul.name() == "MulBackward0" and mul_nr == 0
    assert none is None and none_nr == 0  # c does not require grad
    (acc_a, nr_a), (acc_b, nr_b) = mul.next_functions
    assert isinstance(acc_a, AccumulateGrad) and acc_a.name() == "AccumulateGrad"
    assert acc_a.variable is a and acc_b.variable is b and nr_a == nr_b == 0
    assert isinstance(y.grad_fn.next_functions, tuple)
    assert all(isinstance(e, tuple) and len(e) == 2 for e in mul.next_functions)


def test_accumulate_grad_is_shared_per_leaf() -> None:
    a = _leaf(3)
    y = a * a
    (acc1, _), (acc2, _) = y.grad_fn.next_functions
    assert acc1 is acc2
    z = a.exp()
    assert z.grad_fn.next_functions[0][0] is acc1


def test_more_node_names() -> None:
    a = _leaf(2, 2)
    assert a.exp().grad_fn.name() == "ExpBackward0"
    assert (a @ a).grad_fn.name() == "MmBackward0"  # PyTorch's name for a 2-D matmul
    assert (a - a).grad_fn.name() == "SubBackward0"
    assert a.tanh().grad_fn.name() == "TanhBackward0"


@pytest.mark.parametrize("lead", [(5,), (3, 4)])
def test_a_batch_times_a_matrix_folds_into_one_product(lead: tuple) -> None:
    """(..., m, k) @ (k, n) runs as one (... m, k) @ (k, n) product and a view, as PyTorch folds
    it (``UnsafeViewBackward0`` over ``MmBackward0``): the matrix's gradient is one product over
    every row, equal to the sum of the per-batch products."""
    rng = np.random.default_rng(1)
    x = fg.tensor(rng.standard_normal((*lead, 6, 4)), requires_grad=True)
    w = fg.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    y = x @ w
    assert y.shape == (*lead, 6, 3)
    assert y.grad_fn.name() == "UnsafeViewBackward0"
    assert y.grad_fn.next_functions[0][0].name() == "MmBackward0"
    g = rng.standard_normal(y.shape)
    y.backward(fg.tensor(g))
    xs, gs = x.detach().numpy(), g
    np.testing.assert_allclose(y.detach().numpy(), xs @ w.detach().numpy(), rtol=1e-12)
    want_w = sum(a.T @ b for a, b in zip(xs.reshape(-1, 6, 4), gs.reshape(-1, 6, 3)))
    np.testing.assert_allclose(w.grad.numpy(), want_w, rtol=1e-10)
    np.testing.assert_allclose(x.grad.numpy(), gs @ w.detach().numpy().T, rtol=1e-10)
    # a batch that does not fold without a copy, and needs no gradient, keeps the batched product
    t = fg.tensor(rng.standard_normal((6, 5, 4))).transpose(0, 1)
    np.testing.assert_allclose((t @ w.detach()).numpy(), t.numpy() @ w.detach().numpy())


def test_detach_shares_storage_and_version_counter() -> None:
    a = _leaf(3)
    d = a.detach()
    assert d.is_leaf and not d.requires_grad and d.grad_fn is None
    assert d.data_ptr() == a.data_ptr()
    v = a._version
    d.add_(1.0)  # allowed: a detached alias is not a view of the leaf for autograd
    assert a._version == v + 1 == d._version
    np.testing.assert_array_equal(a.detach().numpy(), d.numpy())
    y = a * 2.0
    yd = y.detach()
    assert yd.grad_fn is None and yd.data_ptr() == y.data_ptr()
    with fg.no_grad():
        y.mul_(2.0)
    assert yd._version == y._version
