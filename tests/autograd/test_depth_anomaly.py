"""Anomaly mode in depth: which errors get the ``Error detected in <Node>`` report (rule, hooks,
gradient validation, custom Functions), the parent traceback for double backward, NaN checks per
output index and after post-hooks, the enable warning, and the state switches."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import Function, detect_anomaly, grad, set_detect_anomaly


def _t(data, requires_grad: bool = False) -> fg.Tensor:
    return fg.tensor(np.asarray(data, dtype=np.float64), requires_grad=requires_grad)


@pytest.fixture(autouse=True)
def _quiet_anomaly_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")
        yield


def test_detect_anomaly_warns_like_pytorch() -> None:
    with pytest.warns(UserWarning, match="Anomaly Detection has been enabled"), detect_anomaly():
        pass


def test_nodes_record_forward_traceback_only_under_anomaly_mode() -> None:
    x = _t([1.0], True)
    assert "traceback_" not in (x * 2.0).grad_fn.metadata
    with detect_anomaly():
        y = x * 2.0  # marker-line-for-traceback
    trace = y.grad_fn.metadata["traceback_"]
    assert "marker-line-for-traceback" in trace and "test_depth_anomaly.py" in trace
    assert "parent_" not in y.grad_fn.metadata


def test_custom_function_nodes_record_the_traceback_and_report_errors() -> None:
    class Broken(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            raise ValueError("broken backward")

    x = _t([1.0], True)
    with detect_anomaly():
        y = Broken.apply(x)  # the-custom-function-call
        with pytest.raises(ValueError, match="broken backward") as info:
            y.sum().backward()
    msg = str(info.value)
    assert msg.startswith("Error detected in BrokenBackward. Traceback of forward call")
    assert "the-custom-function-call" in msg


def test_errors_from_hooks_and_validation_are_reported_with_the_node() -> None:
    x = _t([1.0, 2.0], True)
    with detect_anomaly():
        y = x.exp()

        def bad_hook(g):
            raise KeyError("from a tensor hook")

        y.register_hook(bad_hook)
        with pytest.raises(KeyError, match="Error detected in ExpBackward0"):
            (y * 1.0).sum().backward()

    class WrongShape(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return fg.ones(5, dtype=fg.float64)

    with detect_anomaly():
        z = WrongShape.apply(x)
        with pytest.raises(RuntimeError, match="Error detected in WrongShapeBackward") as info:
            z.sum().backward()
    assert "invalid gradient at index 0" in str(info.value)


def test_error_in_a_node_created_outside_anomaly_mode() -> None:
    x = _t([1.0, 2.0], True)
    y = (x * x).sum()
    with fg.no_grad():
        x.add_(1.0)
    with (
        detect_anomaly(),
        pytest.raises(RuntimeError, match="No forward pass information available") as info,
    ):
        y.backward()
    assert "modified by an inplace operation" in str(info.value)


def test_double_backward_error_shows_the_parent_traceback() -> None:
    x = _t([0.5, 1.0], True)
    with detect_anomaly():
        y = x.exp()  # the-first-order-forward-line
        (g,) = grad(y.sum(), x, create_graph=True)
        # g's node was created by ExpBackward0's rule: it records that node as its parent
        assert g.grad_fn.metadata["parent_"] is y.grad_fn
        with fg.no_grad():
            y.add_(1.0)  # g's node saved exp's output: its second backward must fail
        with pytest.raises(RuntimeError) as info:
            g.sum().backward()
    msg = str(info.value)
    assert msg.startswith(f"Error detected in {g.grad_fn.name()}.")
    assert "Previous calculation was induced by ExpBackward0" in msg
    assert "Traceback of forward call that induced the previous calculation" in msg
    assert "the-first-order-forward-line" in msg
    assert "modified by an inplace operation" in msg


def test_third_order_nodes_chain_their_parents() -> None:
    x = _t([0.5], True)
    with detect_anomaly():
        y = x.sin()
        (g,) = grad(y.sum(), x, create_graph=True)
        (gg,) = grad(g.sum(), x, create_graph=True)
    parent = gg.grad_fn.metadata.get("parent_")
    assert parent is not None
    chain = []
    while parent is not None:
        chain.append(parent.name())
        parent = parent.metadata.get("parent_")
    assert chain[-1] == "SinBackward0"
    assert len(chain) >= 2


def test_nan_reports_the_output_index() -> None:
    class NanSecond(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a + b

        @staticmethod
        def backward(ctx, g):
            return g, g * float("nan")

    a, b = _t([1.0], True), _t([2.0], True)
    with detect_anomaly():
        y = NanSecond.apply(a, b)
        with pytest.raises(
            RuntimeError,
            match=r"Function 'NanSecondBackward' returned nan "
            r"values in its 1th output\.",
        ):
            y.sum().backward()
    with detect_anomaly(check_nan=False):
        NanSecond.apply(a, b).sum().backward()
    assert np.isnan(b.grad.numpy()[0])


def test_nan_check_runs_after_node_post_hooks() -> None:
    x = _t([1.0], True)
    with detect_anomaly():
        y = x * 2.0
        y.grad_fn.register_hook(lambda gi, go: (gi[0] * float("nan"), gi[1]))
        with pytest.raises(RuntimeError, match="'MulBackward0' returned nan values in its 0th"):
            y.sum().backward()


def test_nan_check_matches_torch_message() -> None:
    torch = pytest.importorskip("torch")
    messages = []
    for lib in (fg, torch):
        x = lib.tensor([0.0, 1.0], dtype=lib.float64, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with lib.autograd.detect_anomaly():
                y = (x.sqrt() * 0.0).sum()
                with pytest.raises(RuntimeError) as info:
                    y.backward()
        messages.append(str(info.value))
    expected = "Function 'SqrtBackward0' returned nan values in its 0th output."
    assert all(expected in m for m in messages)


def test_set_detect_anomaly_with_check_nan_off() -> None:
    x = _t([0.0], True)
    with set_detect_anomaly(True, check_nan=False):
        assert fg.autograd.is_anomaly_enabled()
        (x.sqrt() * 0.0).sum().backward()
    assert not fg.autograd.is_anomaly_enabled()
    assert np.isnan(x.grad.numpy()[0])


def test_anomaly_state_is_restored_after_an_error() -> None:
    x = _t([1.0], True)
    with pytest.raises(RuntimeError), detect_anomaly():
        y = (x * x).sum()
        with fg.no_grad():
            x.add_(1.0)
        y.backward()
    assert not fg.autograd.is_anomaly_enabled()
    from fusegrad.autograd import anomaly

    assert anomaly._state.current_node is None
