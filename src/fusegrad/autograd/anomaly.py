"""Anomaly mode: ``detect_anomaly`` / ``set_detect_anomaly``.

Nodes created while it is on keep the forward traceback (``node.metadata["traceback_"]``);
the engine then re-raises backward errors with ``Error detected in <Node>`` and that traceback,
and checks every rule's outputs for NaN when ``check_nan`` is on.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any


class _State(threading.local):
    def __init__(self) -> None:
        self.enabled = False
        self.check_nan = True


_state = _State()


def is_anomaly_enabled() -> bool:
    return _state.enabled


def is_anomaly_check_nan_enabled() -> bool:
    return _state.check_nan


def record_forward_trace(node: Any) -> None:
    node.metadata["traceback_"] = "".join(traceback.format_stack()[:-2])


class set_detect_anomaly:  # noqa: N801
    """Turn anomaly detection on or off (plain call or context manager)."""

    def __init__(self, mode: bool, check_nan: bool = True) -> None:
        self._prev = (_state.enabled, _state.check_nan)
        _state.enabled = bool(mode)
        _state.check_nan = bool(check_nan)

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        _state.enabled, _state.check_nan = self._prev


class detect_anomaly:  # noqa: N801
    """Context manager (and decorator) enabling anomaly detection."""

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = check_nan
        self._prev: list[tuple[bool, bool]] = []

    def __enter__(self) -> None:
        self._prev.append((_state.enabled, _state.check_nan))
        _state.enabled, _state.check_nan = True, self.check_nan

    def __exit__(self, *exc: object) -> None:
        _state.enabled, _state.check_nan = self._prev.pop()

    def __call__(self, fn: Any) -> Any:
        import functools

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with detect_anomaly(self.check_nan):
                return fn(*args, **kwargs)

        return wrapper
