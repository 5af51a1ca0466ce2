"""Anomaly mode: ``detect_anomaly`` / ``set_detect_anomaly``.

Nodes created while it is on keep the forward traceback (``node.metadata["traceback_"]``).  A
node created while the engine runs another node's rule (double backward: a create_graph backward
builds new nodes) also records that node as ``node.metadata["parent_"]``, so an error in the
second backward can show both the forward line that built the node and the forward line of the
calculation whose backward built it (PyTorch's "Previous calculation was induced by ...").

When any error is raised while the engine processes a node (hooks, rule, gradient validation,
the NaN check), the engine calls ``warn_error_detected_in``, which emits PyTorch's warnings
(``UserWarning``: ``Error detected in <Node>. Traceback of forward call that caused the
error:`` and the stored trace, then one warning per parent), and the engine re-raises the
*original* error unchanged, as PyTorch does.  With ``check_nan``, the engine also checks every
node's outputs for NaN; that error is ``Function '<Node>' returned nan values in its 0th
output.`` itself.  The state is thread-local; the engine carries it to the threads that run
deeply nested backward calls.
"""

from __future__ import annotations

import functools
import threading
import traceback
import warnings
from typing import Any

# One entry per thread with anomaly mode on (list append and pop are atomic): while it is
# empty, the op machinery and the engine know anomaly mode is off everywhere without reading
# this thread's state (a thread-local read per op and per node).
anomaly_threads: list = []


class _State(threading.local):
    def __init__(self) -> None:
        self._enabled = False
        self.check_nan = True
        self.current_node: Any = None  # the node whose rule the engine is running (anomaly on)

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        if bool(value) != bool(self._enabled):
            if value:
                anomaly_threads.append(None)
            else:
                anomaly_threads.pop()
        self._enabled = value


_state = _State()


def is_anomaly_enabled() -> bool:
    return _state.enabled


def is_anomaly_check_nan_enabled() -> bool:
    return _state.check_nan


def record_forward_trace(node: Any) -> None:
    """Called for every node created under anomaly mode (``registry.apply``, ``Function``)."""
    # [:-2]: leave out this function and the op machinery frame that called it
    node.metadata["traceback_"] = "".join(traceback.format_stack()[:-2])
    parent = _state.current_node
    if parent is not None:
        node.metadata["parent_"] = parent


def warn_error_detected_in(node: Any) -> None:
    """Warn, as PyTorch does when a backward node fails under anomaly mode, with the forward
    traceback of ``node`` (the one the engine was processing) and of each of its parents; the
    engine then re-raises the original error.  One ``UserWarning`` per traceback, in PyTorch's
    words (``torch/csrc/autograd/python_anomaly_mode.cpp``)."""
    _warn_forward_trace(node, is_parent=False)
    parent = node.metadata.get("parent_")
    seen = {id(node)}
    while parent is not None and id(parent) not in seen:  # iterative: chains can be long
        seen.add(id(parent))
        _warn_forward_trace(parent, is_parent=True)
        parent = parent.metadata.get("parent_")


def _warn_forward_trace(node: Any, is_parent: bool) -> None:
    trace = node.metadata.get("traceback_")
    if trace is None:
        message = (
            f"Error detected in {node.name()}. No forward pass information available. Enable "
            "detect anomaly during forward pass for more information."
        )
    elif is_parent:
        message = (
            f"\n\nPrevious calculation was induced by {node.name()}. Traceback of forward call "
            f"that induced the previous calculation:\n{trace}"
        )
    else:
        message = (
            f"Error detected in {node.name()}. Traceback of forward call that caused the "
            f"error:\n{trace}"
        )
    warnings.warn(message, UserWarning, stacklevel=1)


class set_detect_anomaly:
    """Turn anomaly detection on or off (plain call or context manager)."""

    def __init__(self, mode: bool, check_nan: bool = True) -> None:
        self._prev = (_state.enabled, _state.check_nan)
        _state.enabled = bool(mode)
        _state.check_nan = bool(check_nan)

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        _state.enabled, _state.check_nan = self._prev


class detect_anomaly:
    """Context manager (and decorator) enabling anomaly detection.  Like PyTorch, it warns
    that it slows things down: it records a traceback per node and scans every gradient."""

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = check_nan
        self._prev: list[tuple[bool, bool]] = []
        warnings.warn(
            "Anomaly Detection has been enabled. This mode will increase the runtime and should "
            "only be enabled for debugging.",
            stacklevel=2,
        )

    def __enter__(self) -> None:
        self._prev.append((_state.enabled, _state.check_nan))
        _state.enabled, _state.check_nan = True, self.check_nan

    def __exit__(self, *exc: object) -> None:
        _state.enabled, _state.check_nan = self._prev.pop()

    def __call__(self, fn: Any) -> Any:
        check_nan = self.check_nan

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # no new instance per call: it warned once, when the decorator was made
            prev = (_state.enabled, _state.check_nan)
            _state.enabled, _state.check_nan = True, check_nan
            try:
                return fn(*args, **kwargs)
            finally:
                _state.enabled, _state.check_nan = prev

        return wrapper
