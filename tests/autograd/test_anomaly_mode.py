"""Anomaly mode: forward tracebacks on backward errors, NaN detection, the switches."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import detect_anomaly, is_anomaly_enabled, set_detect_anomaly


def test_backward_error_names_the_node_and_the_forward_traceback() -> None:
    with detect_anomaly():
        x = fg.tensor([1.0, 2.0], requires_grad=True)
        w = fg.tensor([3.0, 4.0], requires_grad=True)
        y = (x * w).sum()  # this line should appear in the report
        with fg.no_grad():
            x.add_(1.0)
        with pytest.raises(RuntimeError, match="Error detected in MulBackward0") as info:
            y.backward()
    msg = str(info.value)
    assert "test_anomaly_mode.py" in msg and "(x * w).sum()" in msg
    assert "modified by an inplace operation" in msg
    assert not is_anomaly_enabled()


def test_without_anomaly_mode_errors_are_plain() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    with fg.no_grad():
        x.add_(1.0)
    with pytest.raises(RuntimeError) as info:
        y.backward()
    assert "Error detected" not in str(info.value)


def test_nan_in_a_backward_output_is_reported() -> None:
    x = fg.tensor([0.0, 1.0], requires_grad=True)
    with detect_anomaly():
        y = (x.sqrt() * 0.0).sum()  # sqrt' at 0 is inf; 0 * inf = nan
        with pytest.raises(
            RuntimeError,
            match=r"Function 'SqrtBackward0' returned nan values "
            r"in its 0th output",
        ):
            y.backward()
    x.grad = None
    with detect_anomaly(check_nan=False):
        (x.sqrt() * 0.0).sum().backward()
    assert np.isnan(x.grad.numpy()[0])


def test_set_detect_anomaly_call_and_context() -> None:
    assert not is_anomaly_enabled()
    set_detect_anomaly(True)
    try:
        assert is_anomaly_enabled()
    finally:
        set_detect_anomaly(False)
    assert not is_anomaly_enabled()
    with set_detect_anomaly(True):
        assert is_anomaly_enabled()
    assert not is_anomaly_enabled()

    @detect_anomaly()
    def f() -> bool:
        return is_anomaly_enabled()

    assert f() and not is_anomaly_enabled()
