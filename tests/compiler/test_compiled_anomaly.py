"""Anomaly mode inside compiled backward (issue 12, item 4).

The program checks each node's gradients for NaN, in eager's order, before it writes anything:
the first node whose output holds one gets eager's warning (its forward traceback) and eager's
error.  Each test runs the same program eagerly and compiled and compares what comes out:
the error, the warnings, the gradients, and that nothing fell back.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.autograd import Function

pytestmark = pytest.mark.usefixtures("fresh_compiler")


def _run(compiled: bool, program: Any, values: list, check_nan: bool = True) -> tuple:
    """(error message or None, the 'Error detected' warnings' first lines, the gradient)."""
    x = fg.tensor(values, dtype=fg.float64, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fg.autograd.detect_anomaly(check_nan=check_nan):
            y = program(x)
            error = None
            try:
                if compiled:
                    with compiler.compiled_autograd():
                        y.backward()
                else:
                    y.backward()
            except RuntimeError as e:
                error = str(e)
    detected = [str(w.message).splitlines()[0] for w in caught if "detected" in str(w.message)]
    return error, detected, None if x.grad is None else x.grad.numpy()


def _same(program: Any, values: list, check_nan: bool = True, calls: int = 2) -> tuple:
    eager = _run(False, program, values, check_nan)
    for _ in range(calls):
        got = _run(True, program, values, check_nan)
        assert got[0] == eager[0]
        assert got[1] == eager[1]
        assert (got[2] is None) == (eager[2] is None)
        if eager[2] is not None:
            np.testing.assert_allclose(got[2], eager[2], rtol=1e-12, equal_nan=True)
    assert not compiler.counters.fallbacks, compiler.counters.fallbacks
    assert compiler.counters.compiled_runs == calls
    return eager


def test_a_nan_gradient_names_its_node_with_eagers_warning() -> None:
    error, detected, grad = _same(lambda x: (x.sqrt() * 2.0).sum(), [1.0, -1.0, 4.0])
    assert error == "Function 'SqrtBackward0' returned nan values in its 0th output."
    assert detected == [
        "Error detected in SqrtBackward0. Traceback of forward call that caused the error:"
    ]
    assert grad is None  # (nothing written: eager's AccumulateGrad had not run yet either)


def test_the_first_node_in_eagers_order_is_named() -> None:
    def program(x: fg.Tensor) -> fg.Tensor:
        return (x.log() * 3.0).sum() + x.sqrt().sum()  # both give NaN at -1

    error, _, _ = _same(program, [-1.0, 2.0])
    assert error is not None and "returned nan values in its 0th output" in error


def test_no_nan_gives_eagers_gradients_and_one_capture() -> None:
    _, detected, grad = _same(lambda x: (x.sqrt() * x.exp()).sum(), [1.0, 2.0, 4.0], calls=3)
    assert detected == [] and grad is not None
    assert compiler.counters.captures == 1


def test_without_check_nan_the_nans_are_written() -> None:
    error, _, grad = _same(lambda x: x.sqrt().sum(), [1.0, -1.0], check_nan=False)
    assert error is None and np.isnan(grad[1])


def test_a_custom_function_is_named_too() -> None:
    class _Root(Function):
        @staticmethod
        def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
            ctx.save_for_backward(x)
            return x * 1.0

        @staticmethod
        def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
            (x,) = ctx.saved_tensors
            return g * x.sqrt()

    error, detected, _ = _same(lambda x: _Root.apply(x).sum(), [4.0, -1.0])
    assert error == "Function '_RootBackward' returned nan values in its 0th output."
    assert detected and "_RootBackward" in detected[0]


def test_anomaly_mode_with_user_hooks_falls_back() -> None:
    x = fg.tensor([1.0, 2.0], dtype=fg.float64, requires_grad=True)
    with pytest.warns(UserWarning, match="Anomaly Detection"), fg.autograd.detect_anomaly():
        y = x.exp()
        y.register_hook(lambda g: g * 2.0)
        with compiler.compiled_autograd():
            y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2.0 * np.exp([1.0, 2.0]))
    assert any("anomaly mode" in r for r in compiler.counters.fallbacks)
