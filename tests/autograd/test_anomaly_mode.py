"""Anomaly mode: forward tracebacks on backward errors, NaN detection, the switches."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import detect_anomaly, is_anomaly_enabled, set_detect_anomaly


def test_backward_error_warns_with_the_forward_traceback_and_raises_the_original() -> None:
    with detect_anomaly():
        x = fg.tensor([1.0, 2.0], requires_grad=True)
        w = fg.tensor([3.0, 4.0], requires_grad=True)
        y = (x * w).sum()  # this line should appear in the report
        with fg.no_grad():
            x.add_(1.0)
        with (
            pytest.warns(UserWarning, match="Error detected in MulBackward0") as record,
            pytest.raises(RuntimeError, match="modified by an inplace operation") as info,
        ):
            y.backward()
    report = next(str(w.message) for w in record if "Error detected" in str(w.message))
    assert "Traceback of forward call that caused the error" in report
    assert "test_anomaly_mode.py" in report and "(x * w).sum()" in report
    # the error itself is the original one, as in PyTorch: no traceback in its message
    assert "Error detected" not in str(info.value)
    assert str(info.value).startswith("one of the variables needed for gradient computation")
    assert not is_anomaly_enabled()


def test_without_anomaly_mode_errors_are_plain() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    with fg.no_grad():
        x.add_(1.0)
    with pytest.raises(RuntimeError) as info:
        y.backward()
    assert "Error detected" not in str(info.value)
    assert "Hint: enable anomaly detection to find the operation" in str(info.value)


def test_nan_in_a_backward_output_is_reported() -> None:
    x = fg.tensor([0.0, 1.0], requires_grad=True)
    with detect_anomaly():
        y = (x.sqrt() * 0.0).sum()  # sqrt' at 0 is inf; 0 * inf = nan
        with (
            pytest.warns(UserWarning, match="Error detected in SqrtBackward0"),
            pytest.raises(
                RuntimeError,
                match=r"^Function 'SqrtBackward0' returned nan values in its 0th output",
            ),
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
