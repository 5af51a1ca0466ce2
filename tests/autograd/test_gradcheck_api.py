"""gradcheck / gradgradcheck: pass on correct rules, fail loudly on wrong ones."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import gradcheck, gradgradcheck
from fusegrad.autograd.gradcheck import GradcheckError
from fusegrad.autograd.node import OpNode
from fusegrad.ops.registry import REGISTRY, Rule
from fusegrad.tensor import Tensor


def _x(*shape: int, seed: int = 0) -> fg.Tensor:
    data = np.random.default_rng(seed).standard_normal(shape)
    return fg.tensor(data, dtype=fg.float64, requires_grad=True)


def _with_grad_hook(y: fg.Tensor, hook) -> fg.Tensor:
    y.register_hook(hook)
    return y


def _exp_with_constant_rule(x: Tensor) -> Tensor:
    """exp whose rule multiplies by a constant array: right first derivative, but the rule is
    not differentiable in x, so second derivatives are wrong."""
    out = Tensor._make(np.exp(x._data))
    rule = Rule("exp", lambda node, g: (g * Tensor._make(np.exp(x._data)),), (), ())
    out.grad_fn = OpNode(REGISTRY["exp"], rule, {}, (x,), (out,))
    return out


CORRECT = [
    (lambda a, b: (a * b).tanh(), lambda: (_x(3, 4), _x(4, seed=1))),
    (lambda a: (a @ a.T).exp().sum(dim=0), lambda: (_x(2, 3),)),
    (lambda a, b: (a.sin() / (b * b + 1.0), a - b), lambda: (_x(3), _x(3, seed=2))),
    (lambda a: a**3, lambda: (_x(),)),
]


@pytest.mark.parametrize("fast_mode", [False, True])
@pytest.mark.parametrize("case", range(len(CORRECT)))
def test_gradcheck_passes_on_correct_rules(case: int, fast_mode: bool) -> None:
    fn, make = CORRECT[case]
    assert gradcheck(fn, make(), fast_mode=fast_mode)


@pytest.mark.parametrize("fast_mode", [False, True])
@pytest.mark.parametrize("case", range(len(CORRECT)))
def test_gradgradcheck_passes_on_correct_rules(case: int, fast_mode: bool) -> None:
    fn, make = CORRECT[case]
    assert gradgradcheck(fn, make(), fast_mode=fast_mode)


@pytest.mark.parametrize("fast_mode", [False, True])
def test_doubled_gradient_is_a_jacobian_mismatch(fast_mode: bool) -> None:
    def fn(a: fg.Tensor) -> fg.Tensor:
        return _with_grad_hook(a.exp(), lambda g: g * 2.0)

    with pytest.raises(GradcheckError, match="Jacobian mismatch") as info:
        gradcheck(fn, (_x(3),), fast_mode=fast_mode)
    assert isinstance(info.value, RuntimeError)
    assert gradcheck(fn, (_x(3),), fast_mode=fast_mode, raise_exception=False) is False


@pytest.mark.parametrize("fast_mode", [False, True])
def test_wrong_second_derivative_fails_gradgradcheck(fast_mode: bool) -> None:
    x = _x(3)
    assert gradcheck(_exp_with_constant_rule, (x,), fast_mode=fast_mode)
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        gradgradcheck(_exp_with_constant_rule, (x,), fast_mode=fast_mode)


@pytest.mark.parametrize("fast_mode", [False, True])
def test_nondeterministic_backward_is_detected(fast_mode: bool) -> None:
    rng = np.random.default_rng(0)

    def fn(a: fg.Tensor) -> fg.Tensor:
        # multiplicative noise: tiny (the Jacobian still matches) and zero for a zero gradient
        noise = lambda g: g * fg.tensor(1.0 + rng.standard_normal(g.shape) * 1e-9)
        return _with_grad_hook(a * 2.0, noise)

    with pytest.raises(GradcheckError, match="not reentrant"):
        gradcheck(fn, (_x(3),), fast_mode=fast_mode)
    assert gradcheck(fn, (_x(3),), fast_mode=fast_mode, nondet_tol=1e-6)


@pytest.mark.parametrize("fast_mode", [False, True])
def test_nonzero_gradient_from_a_zero_output_gradient_is_detected(fast_mode: bool) -> None:
    def fn(a: fg.Tensor) -> fg.Tensor:
        return _with_grad_hook(a * 2.0, lambda g: g + 1e-9)

    with pytest.raises(GradcheckError, match="zero gradient"):
        gradcheck(fn, (_x(3),), fast_mode=fast_mode)
    assert gradcheck(fn, (_x(3),), fast_mode=fast_mode, check_undefined_grad=False)


def test_gradcheck_restores_inputs_and_leaves_grad_alone() -> None:
    x = _x(2, 3)
    before = x.detach().numpy().copy()
    gradcheck(lambda a: a.sin(), (x,))
    np.testing.assert_array_equal(x.detach().numpy(), before)
    assert x.grad is None


def test_gradcheck_restores_inputs_when_the_function_raises() -> None:
    x = _x(3)
    before = x.detach().numpy().copy()
    calls = {"n": 0}

    def fn(a: fg.Tensor) -> fg.Tensor:
        calls["n"] += 1
        if calls["n"] > 1:  # fails during finite differences
            raise ValueError("boom")
        return a * 2.0

    with pytest.raises(ValueError, match="boom"):
        gradcheck(fn, (x,))
    np.testing.assert_array_equal(x.detach().numpy(), before)


def test_gradcheck_non_contiguous_and_non_tensor_inputs() -> None:
    base = np.random.default_rng(3).standard_normal((4, 3))
    xt = fg.tensor(base, dtype=fg.float64).T.detach().requires_grad_()
    assert not xt.is_contiguous()
    assert gradcheck(lambda a, k: (a * k).sin(), (xt, 2.5))


def test_gradcheck_jacobian_mismatch_names_output_and_input() -> None:
    def fn(a: fg.Tensor, b: fg.Tensor) -> tuple:
        return a * 1.0, _with_grad_hook(b * 1.0, lambda g: g * 3.0)

    with pytest.raises(GradcheckError, match="output 1 with respect to input 1"):
        gradcheck(fn, (_x(2), _x(2, seed=1)))


def test_gradcheck_needs_a_differentiable_input() -> None:
    with pytest.raises(ValueError, match="at least one input"):
        gradcheck(lambda a: a * 2.0, (fg.ones(2, dtype=fg.float64),))


def test_gradcheck_warns_on_float32() -> None:
    x = fg.tensor([1.0, 2.0], dtype=fg.float32, requires_grad=True)
    with pytest.warns(UserWarning, match="float64"):
        gradcheck(lambda a: a * 2.0, (x,), eps=1e-3, atol=1e-2, rtol=1e-2)
