"""``F.binary_cross_entropy`` as PyTorch computes it, saturated probabilities included.

The loss was a composite of logs bounded at -100, whose chain rule gave a NaN input gradient
where a probability saturates (p = 0 with target 0, p = 1 with target 1: 0 times log's 1/0)
and a bounded target gradient (100) where PyTorch's is infinite.  It is now one primitive whose
rule is PyTorch's: the input's gradient ``g (p - t) / max((1 - p) p, 1e-12)`` (a primitive of its
own, whose rule gives PyTorch's second derivatives), the target's ``-g logit(p)``.

References: PyTorch where it is installed (values, gradients, second derivatives and forward
mode, float32 and float64, every reduction, weights that broadcast), and otherwise those
formulas in numpy; ``gradcheck``/``gradgradcheck`` in float64 away from the saturated points;
compiled programs (``compile(step)``, ``compile(model)``, ``compiled_autograd()``, compiled in
the foreground: tests/conftest.py) against eager, the saturated points included.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.autograd import forward_ad, gradcheck, gradgradcheck

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch for a reference")

DTYPES = ["float32", "float64"]
REDUCTIONS = ["none", "mean", "sum"]

# probabilities and targets: both saturated pairs (p = 0 with t = 0, p = 1 with t = 1), the
# opposite ones (the loss bounded at 100), an exact half, tiny and nearly-one probabilities,
# soft targets
P = [0.0, 1.0, 0.0, 1.0, 0.5, 1e-30, 1 - 1e-7, 0.3, 0.9, 0.02, 0.75, 0.6]
T = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.2, 0.5, 1.0, 0.0, 0.6]


def _numpy_reference(p: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PyTorch's unreduced loss and its input and target gradients (for g = 1), in numpy (the
    gradient's bound is float32's 1e-12 in every dtype, as in PyTorch's kernel)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = (t - 1) * np.maximum(np.log1p(-p), -100) - t * np.maximum(np.log(p), -100)
        grad_p = (p - t) / np.maximum((1 - p) * p, p.dtype.type(np.float32(1e-12)))
        grad_t = -np.log(p / (1 - p))
    return loss, grad_p, grad_t


def _leaves(dtype: str, shape: tuple = (3, 4)) -> tuple[np.ndarray, np.ndarray]:
    p = np.array(P, dtype).reshape(shape)
    t = np.array(T, dtype).reshape(shape)
    return p, t


def _grads(
    lib: Any,
    p: np.ndarray,
    t: np.ndarray,
    weight: Any = None,
    reduction: str = "mean",
    g: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The loss and the gradients of input and target, by fusegrad or by PyTorch (``lib``)."""
    pt = lib.tensor(p, requires_grad=True)
    tt = lib.tensor(t, requires_grad=True)
    w = None if weight is None else lib.tensor(weight)
    loss = lib.nn.functional.binary_cross_entropy(pt, tt, weight=w, reduction=reduction)
    grad = lib.ones_like(loss) if g is None else lib.tensor(g)
    gp, gt = lib.autograd.grad(loss, (pt, tt), grad)
    return loss.detach().numpy(), gp.numpy(), gt.numpy()


def _fg_grads(p: np.ndarray, t: np.ndarray, *args: Any, **kwargs: Any) -> tuple:
    return _grads(fg, p, t, *args, **kwargs)


def _torch_grads(p: np.ndarray, t: np.ndarray, *args: Any, **kwargs: Any) -> tuple:
    return _grads(torch, p, t, *args, **kwargs)


def _assert_close(got: np.ndarray, want: np.ndarray, dtype: str, what: str) -> None:
    """Equal within the dtype's rounding (the reduction's order differs from PyTorch's), with
    infinities, NaN and the sign of zeros matching; float32's denormal tail (below 1e-36,
    where one rounding more decides) compared absolutely."""
    rtol = 2e-6 if dtype == "float32" else 1e-13
    atol = 1e-36 if dtype == "float32" else 1e-300
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]), err_msg=what)


@pytest.mark.parametrize("dtype", DTYPES)
def test_saturated_probabilities_give_pytorchs_finite_input_gradient(dtype: str) -> None:
    """p = 0 with target 0 and p = 1 with target 1: gradient 0, not NaN; the opposite pairs
    +-1e12 (the bound 1e-12 of the denominator); the target's gradient +-inf there."""
    p, t = _leaves(dtype)
    loss, grad_p, grad_t = _fg_grads(p, t, reduction="none")
    want_loss, want_p, want_t = _numpy_reference(p, t)
    assert np.isfinite(grad_p).all(), grad_p
    _assert_close(loss, want_loss, dtype, "loss")
    _assert_close(grad_p, want_p, dtype, "input gradient")
    _assert_close(grad_t, want_t, dtype, "target gradient")
    assert np.isposinf(grad_t.flat[0]) and np.isneginf(grad_t.flat[1])


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weight_shape", [None, (4,), (3, 1), (), (1, 1)])
def test_values_and_gradients_match_torch(
    dtype: str, reduction: str, weight_shape: tuple | None
) -> None:
    p, t = _leaves(dtype)
    rng = np.random.default_rng(0)
    weight = None if weight_shape is None else rng.uniform(0.5, 2.0, weight_shape).astype(dtype)
    g = None if reduction != "none" else rng.uniform(-1.0, 1.0, p.shape).astype(dtype)
    got = _fg_grads(p, t, weight, reduction, g)
    want = _torch_grads(p, t, weight, reduction, g)
    for name, a, b in zip(["loss", "input gradient", "target gradient"], got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        _assert_close(a, b, dtype, name)


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_dim_and_empty_inputs_match_torch(dtype: str) -> None:
    for p, t in [(np.array(0.3, dtype), np.array(1.0, dtype)), (np.array(0.0, dtype),) * 2]:
        for a, b in zip(_fg_grads(p, t, reduction="sum"), _torch_grads(p, t, reduction="sum")):
            _assert_close(a, b, dtype, "0-d")
    empty = np.zeros((0, 3), dtype)
    for reduction in REDUCTIONS:
        got = F.binary_cross_entropy(fg.tensor(empty), fg.tensor(empty), reduction=reduction)
        want = torch.nn.functional.binary_cross_entropy(
            torch.tensor(empty), torch.tensor(empty), reduction=reduction
        )
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def _second_derivatives(lib: Any, p: np.ndarray, t: np.ndarray, v: np.ndarray) -> list:
    """d(gp . v)/dp, d(gp . v)/dt and d(gt . v)/dp of the summed loss (None: no dependence)."""
    pt = lib.tensor(p, requires_grad=True)
    tt = lib.tensor(t, requires_grad=True)
    vt = lib.tensor(v)
    loss = lib.nn.functional.binary_cross_entropy(pt, tt, reduction="sum")
    gp, gt = lib.autograd.grad(loss, (pt, tt), create_graph=True)
    out = list(lib.autograd.grad((gp * vt).sum(), (pt, tt), retain_graph=True))
    (second,) = lib.autograd.grad((gt * vt).sum(), (pt,))
    return [None if x is None else x.detach().numpy() for x in [*out, second]]


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
def test_second_derivatives_match_torch_saturated_points_included(dtype: str) -> None:
    p, t = _leaves(dtype)
    v = np.random.default_rng(1).uniform(0.5, 2.0, p.shape).astype(dtype)
    got = _second_derivatives(fg, p, t, v)
    want = _second_derivatives(torch, p, t, v)
    for k, (a, b) in enumerate(zip(got, want)):
        rtol = 1e-5 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(a, b, rtol=rtol, atol=0, err_msg=f"second derivative {k}")


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_mode_matches_torch(dtype: str) -> None:
    p, t = _leaves(dtype)
    rng = np.random.default_rng(2)
    tp, tt = (rng.uniform(-1.0, 1.0, p.shape).astype(dtype) for _ in range(2))
    with forward_ad.dual_level():
        out = F.binary_cross_entropy(
            forward_ad.make_dual(fg.tensor(p), fg.tensor(tp)),
            forward_ad.make_dual(fg.tensor(t), fg.tensor(tt)),
            reduction="none",
        )
        got = forward_ad.unpack_dual(out).tangent.numpy()
    import torch.autograd.forward_ad as tfw

    with tfw.dual_level():
        out = torch.nn.functional.binary_cross_entropy(
            tfw.make_dual(torch.tensor(p), torch.tensor(tp)),
            tfw.make_dual(torch.tensor(t), torch.tensor(tt)),
            reduction="none",
        )
        want = tfw.unpack_dual(out).tangent.numpy()
    _assert_close(got, want, dtype, "tangent")


def _interior(seed: int) -> tuple[fg.Tensor, fg.Tensor, fg.Tensor]:
    rng = np.random.default_rng(seed)
    p = fg.tensor(rng.uniform(0.05, 0.95, (3, 4)), requires_grad=True)
    t = fg.tensor(rng.uniform(0.0, 1.0, (3, 4)), requires_grad=True)
    w = fg.tensor(rng.uniform(0.5, 2.0, (4,)))
    return p, t, w


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_and_gradgradcheck_away_from_saturation(reduction: str) -> None:
    p, t, w = _interior(3)

    def loss(p: fg.Tensor, t: fg.Tensor) -> fg.Tensor:
        return F.binary_cross_entropy(p, t, weight=w, reduction=reduction)

    assert gradcheck(loss, (p, t))
    assert gradgradcheck(loss, (p, t))


def test_the_gradient_of_the_gradient_is_differentiable_again() -> None:
    """Third order: the second derivative's rule is written in ops that have rules."""
    p, t, _ = _interior(4)

    def input_gradient(p: fg.Tensor, t: fg.Tensor) -> fg.Tensor:
        loss = F.binary_cross_entropy(p, t, reduction="sum")
        (gp,) = fg.autograd.grad(loss, p, create_graph=True)
        return gp

    assert gradgradcheck(input_gradient, (p, t))


def test_one_primitive_forward_and_backward() -> None:
    """The loss is the ``binary_cross_entropy`` primitive and its input gradient the
    ``binary_cross_entropy_backward`` primitive (PyTorch's node names)."""
    p, t, _ = _interior(5)
    loss = F.binary_cross_entropy(p, t, reduction="none")
    assert loss.grad_fn.name() == "BinaryCrossEntropyBackward0"
    (gp,) = fg.autograd.grad(loss.sum(), p, create_graph=True)
    assert gp.grad_fn.name() == "BinaryCrossEntropyBackwardBackward0"


def test_a_weight_that_requires_grad_is_refused_as_in_pytorch() -> None:
    p, t, _ = _interior(6)
    w = fg.ones(4, dtype=fg.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'weight'"):
        F.binary_cross_entropy(p, t, weight=w)
    with fg.no_grad():  # (no graph: nothing to refuse)
        F.binary_cross_entropy(p, t, weight=w)
    assert p.grad is None and w.grad is None


def test_a_weight_that_would_broadcast_the_loss_is_refused() -> None:
    p, t, _ = _interior(7)
    with pytest.raises(RuntimeError, match=r"output with shape \[3, 4\] doesn't match"):
        F.binary_cross_entropy(p, t, weight=fg.ones(2, 3, 4, dtype=fg.float64))
