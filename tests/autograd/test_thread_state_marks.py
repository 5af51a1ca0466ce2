"""The module lists that say whether any thread is in inference mode, has anomaly mode on or
has a tracer installed (``grad_mode.inference_threads``, ``anomaly.anomaly_threads``,
``tracer.tracer_threads``): op dispatch and tensor creation skip the thread-local reads while
they are empty, so they must hold one entry per thread in that state -- through nesting,
re-entering and threads that run concurrently -- and a thread's state must still be its own."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

import numpy as np

import fusegrad as fg
from fusegrad.autograd import anomaly, grad_mode, tracer


def _in_thread_while(hold: Callable[[threading.Event, threading.Event], None]) -> tuple:
    """Run ``hold(ready, release)`` on a thread; returns (thread, ready, release) once it has
    entered its state (the caller sets ``release`` and joins)."""
    ready, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=hold, args=(ready, release))
    worker.start()
    assert ready.wait(10)
    return worker, ready, release


def test_inference_marks_follow_nested_modes_and_threads() -> None:
    assert grad_mode.inference_threads == []
    with fg.inference_mode():
        assert len(grad_mode.inference_threads) == 1
        with fg.inference_mode():
            assert len(grad_mode.inference_threads) == 1
        with fg.inference_mode(False):
            assert grad_mode.inference_threads == []
            assert not fg.ones(2).is_inference()
        assert len(grad_mode.inference_threads) == 1
        assert (fg.ones(2) * 2).is_inference()
    assert grad_mode.inference_threads == []


def test_a_tensor_is_an_inference_tensor_only_on_the_thread_in_inference_mode() -> None:
    made: dict = {}

    def hold(ready: threading.Event, release: threading.Event) -> None:
        with fg.inference_mode():
            made["there"] = fg.ones(3) + 1
            ready.set()
            release.wait(10)

    worker, _, release = _in_thread_while(hold)
    try:
        assert len(grad_mode.inference_threads) == 1
        here = fg.tensor(np.ones(3), requires_grad=True) * 2  # this thread: normal tensors
        assert not here.is_inference() and here.requires_grad
        assert made["there"].is_inference()
    finally:
        release.set()
        worker.join()
    assert grad_mode.inference_threads == []


def test_anomaly_marks_follow_modes_and_threads() -> None:
    assert anomaly.anomaly_threads == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fg.autograd.detect_anomaly():
            assert len(anomaly.anomaly_threads) == 1
            with fg.autograd.set_detect_anomaly(False):
                assert anomaly.anomaly_threads == []
                y = fg.tensor([1.0], requires_grad=True) * 2
                assert "traceback_" not in y.grad_fn.metadata
            z = fg.tensor([1.0], requires_grad=True) * 2
            assert "traceback_" in z.grad_fn.metadata  # recorded on the thread in anomaly mode
    assert anomaly.anomaly_threads == []

    def hold(ready: threading.Event, release: threading.Event) -> None:
        with fg.autograd.set_detect_anomaly(True):
            ready.set()
            release.wait(10)

    worker, _, release = _in_thread_while(hold)
    try:
        assert len(anomaly.anomaly_threads) == 1
        w = fg.tensor([1.0], requires_grad=True) * 2  # this thread: anomaly mode is off
        assert "traceback_" not in w.grad_fn.metadata
    finally:
        release.set()
        worker.join()
    assert anomaly.anomaly_threads == []


class _Counting(tracer.Tracer):
    """A tracer that counts the primitive calls handed to it and lets them run eagerly."""

    def __init__(self) -> None:
        self.calls = 0

    def apply(self, prim: object, inputs: tuple, attrs: dict) -> object:
        self.calls += 1
        return NotImplemented


def test_tracer_marks_follow_installs_and_threads() -> None:
    # (relative to what the run installed around the test: FUSEGRAD_TEST_COMPILED=1 runs it
    # inside compiled_autograd(), whose tape keeps this thread marked)
    base = list(tracer.tracer_threads)
    assert len(base) <= 1
    outer, inner = _Counting(), _Counting()
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    with tracer.tracing(outer):
        assert len(tracer.tracer_threads) == 1
        x * 2  # the operator's fast path still hands the call to the tracer
        with tracer.tracing(inner):
            assert len(tracer.tracer_threads) == 1
            x.exp() - 1.0
        with tracer.tracing(None):
            assert tracer.tracer_threads == []
            x + x
    assert tracer.tracer_threads == base
    assert outer.calls == 1 and inner.calls == 2

    other = _Counting()

    def hold(ready: threading.Event, release: threading.Event) -> None:
        with tracer.tracing(other):
            ready.set()
            release.wait(10)

    worker, _, release = _in_thread_while(hold)
    try:
        assert len(tracer.tracer_threads) == 1 + len(base)
        x * x  # this thread has no tracer: nothing reaches the other thread's
        assert other.calls == 0
    finally:
        release.set()
        worker.join()
    assert tracer.tracer_threads == base
