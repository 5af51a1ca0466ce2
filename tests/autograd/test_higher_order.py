"""create_graph: Hessian-vector products, gradient penalties, third derivatives."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import grad, gradcheck


def _t(data, requires_grad: bool = False) -> fg.Tensor:
    return fg.tensor(np.asarray(data, dtype=np.float64), requires_grad=requires_grad)


def test_hessian_vector_product_matches_analytic() -> None:
    rng = np.random.default_rng(0)
    A = rng.standard_normal((4, 4))
    xv = rng.standard_normal(4)
    vv = rng.standard_normal(4)
    x = _t(xv, True)
    a = _t(A)
    f = 0.5 * (x * (a @ x)).sum() + (x**3).sum()
    (g,) = grad(f, x, create_graph=True)
    assert g.requires_grad
    np.testing.assert_allclose(g.detach().numpy(), 0.5 * (A + A.T) @ xv + 3 * xv**2)
    (hv,) = grad(g, x, _t(vv), retain_graph=True)
    hessian = 0.5 * (A + A.T) + np.diag(6 * xv)
    np.testing.assert_allclose(hv.numpy(), hessian @ vv, rtol=1e-12)
    # the same through a scalar (g * v).sum()
    (hv2,) = grad((g * _t(vv)).sum(), x)
    np.testing.assert_allclose(hv2.numpy(), hessian @ vv, rtol=1e-12)
    assert x.grad is None


@pytest.mark.parametrize(
    "fn, third",
    [
        (lambda x: x**4, lambda x: 24 * x),
        (lambda x: x.sin(), lambda x: -np.cos(x)),
        (lambda x: x.exp() * x, lambda x: np.exp(x) * (x + 3)),
    ],
)
def test_third_derivative(fn, third) -> None:
    xv = np.array([0.3, -1.2, 2.0])
    x = _t(xv, True)
    y = fn(x).sum()
    (d1,) = grad(y, x, create_graph=True)
    (d2,) = grad(d1.sum(), x, create_graph=True)
    (d3,) = grad(d2.sum(), x)
    np.testing.assert_allclose(d3.numpy(), third(xv), rtol=1e-10)


def test_third_derivative_through_backward_and_dot_grad() -> None:
    x = _t([1.5], True)
    y = x**4
    (d1,) = grad(y.sum(), x, create_graph=True)
    (d2,) = grad(d1.sum(), x, create_graph=True)
    d2.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [24 * 1.5])


def _gradient_penalty(w: fg.Tensor, xs: fg.Tensor) -> fg.Tensor:
    """WGAN-GP style: (||d D(x) / dx||^2 - 1)^2 summed over samples."""
    xs = xs.detach().requires_grad_()
    d = (xs @ w).tanh().sum()
    (gx,) = grad(d, xs, create_graph=True)
    return (((gx * gx).sum(dim=1) - 1.0) ** 2).sum()


def test_gradient_penalty_gradient_is_correct() -> None:
    rng = np.random.default_rng(1)
    w = _t(rng.standard_normal((3, 2)), True)
    xs = _t(rng.standard_normal((5, 3)))
    gp = _gradient_penalty(w, xs)
    gp.backward()
    assert w.grad is not None and w.grad.shape == (3, 2)
    # the penalty's gradient w.r.t. w needs second derivatives of tanh and matmul
    assert gradcheck(lambda w_: _gradient_penalty(w_, xs), (w,))


def test_gradient_penalty_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    wv, xv = rng.standard_normal((3, 2)), rng.standard_normal((5, 3))
    w = _t(wv, True)
    _gradient_penalty(w, _t(xv)).backward()

    tw = torch.tensor(wv, requires_grad=True)
    txs = torch.tensor(xv, requires_grad=True)
    d = (txs @ tw).tanh().sum()
    (gx,) = torch.autograd.grad(d, txs, create_graph=True)
    (((gx * gx).sum(dim=1) - 1.0) ** 2).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-10)


def test_without_create_graph_gradients_have_no_history() -> None:
    x = _t([1.0, 2.0], True)
    (g,) = grad((x**3).sum(), x)
    assert not g.requires_grad and g.grad_fn is None
    (x**3).sum().backward()
    assert not x.grad.requires_grad


def test_create_graph_grad_through_a_leaf_root_gradient() -> None:
    # the root gradient itself requires grad: d/dv of <v, dy/dx>
    x = _t([1.0, 2.0], True)
    v = _t([3.0, -1.0], True)
    y = x**2
    (g,) = grad(y, x, v, create_graph=True)  # 2 x v
    (gv,) = grad(g.sum(), v)
    np.testing.assert_allclose(gv.numpy(), [2.0, 4.0])
