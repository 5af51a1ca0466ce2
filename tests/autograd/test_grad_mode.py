"""Grad modes: no_grad, enable_grad, set_grad_enabled, inference_mode; thread-locality."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import fusegrad as fg


def _leaf() -> fg.Tensor:
    return fg.tensor([1.0, 2.0], requires_grad=True)


def test_no_grad_context_manager() -> None:
    x = _leaf()
    with fg.no_grad():
        assert not fg.is_grad_enabled()
        y = x * 2.0
    assert fg.is_grad_enabled()
    assert not y.requires_grad


def test_no_grad_decorators_with_and_without_parentheses() -> None:
    x = _leaf()

    @fg.no_grad()
    def f(t: fg.Tensor) -> fg.Tensor:
        return t * 2.0

    @fg.no_grad
    def g(t: fg.Tensor) -> fg.Tensor:
        return t * 2.0

    assert not f(x).requires_grad and not g(x).requires_grad
    assert f.__name__ == "f" and g.__name__ == "g"
    assert fg.is_grad_enabled()


def test_no_grad_decorator_restores_on_exception() -> None:
    @fg.no_grad()
    def boom() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError):
        boom()
    assert fg.is_grad_enabled()


def test_no_grad_decorated_generator_keeps_the_mode_while_running() -> None:
    x = _leaf()

    @fg.no_grad()
    def gen():
        for _ in range(2):
            yield fg.is_grad_enabled(), (x * 2.0).requires_grad

    outside = []
    for inside in gen():
        outside.append(fg.is_grad_enabled())
        assert inside == (False, False)
    assert outside == [True, True]


def test_enable_grad_inside_no_grad() -> None:
    x = _leaf()
    with fg.no_grad():
        with fg.enable_grad():
            assert (x * 2.0).requires_grad
        assert not (x * 2.0).requires_grad

    @fg.enable_grad
    def f() -> bool:
        return fg.is_grad_enabled()

    with fg.no_grad():
        assert f()
        assert not fg.is_grad_enabled()


def test_set_grad_enabled_as_plain_call() -> None:
    x = _leaf()
    try:
        fg.set_grad_enabled(False)
        assert not fg.is_grad_enabled()
        assert not (x * 2.0).requires_grad
    finally:
        fg.set_grad_enabled(True)
    assert fg.is_grad_enabled() and (x * 2.0).requires_grad


def test_set_grad_enabled_as_context_manager_and_decorator() -> None:
    with fg.set_grad_enabled(False):
        assert not fg.is_grad_enabled()
        with fg.set_grad_enabled(True):
            assert fg.is_grad_enabled()
        assert not fg.is_grad_enabled()
    assert fg.is_grad_enabled()

    @fg.set_grad_enabled(False)
    def f() -> bool:
        return fg.is_grad_enabled()

    assert fg.is_grad_enabled()  # decorating changes nothing by itself
    assert f() is False
    assert fg.is_grad_enabled()


def test_nested_reuse_of_one_instance() -> None:
    mode = fg.no_grad()
    with mode:
        with fg.enable_grad():
            with mode:
                assert not fg.is_grad_enabled()
            assert fg.is_grad_enabled()
        assert not fg.is_grad_enabled()
    assert fg.is_grad_enabled()


def test_grad_mode_is_thread_local() -> None:
    x = _leaf()
    entered = threading.Event()
    release = threading.Event()
    seen: dict = {}

    def worker() -> None:
        with fg.no_grad():
            entered.set()
            release.wait(5)
            seen["worker"] = fg.is_grad_enabled()

    def fresh() -> None:
        seen["fresh_thread"] = fg.is_grad_enabled()
        seen["fresh_requires"] = (x * 2.0).requires_grad

    t = threading.Thread(target=worker)
    with fg.no_grad():
        t.start()
        assert entered.wait(5)
        u = threading.Thread(target=fresh)  # a thread started inside no_grad starts with grad on
        u.start()
        u.join()
    # the worker is still inside its no_grad; this thread is not
    assert fg.is_grad_enabled() and (x * 2.0).requires_grad
    release.set()
    t.join()
    assert seen == {"worker": False, "fresh_thread": True, "fresh_requires": True}


def test_backward_works_inside_no_grad() -> None:
    x = _leaf()
    y = (x * x).sum()
    with fg.no_grad():
        y.backward()
        assert not fg.is_grad_enabled()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


def test_create_graph_inside_no_grad_still_records_the_backward() -> None:
    x = _leaf()
    y = (x**3).sum()
    with fg.no_grad():
        (g,) = fg.autograd.grad(y, x, create_graph=True)
    assert g.requires_grad


def test_inference_mode() -> None:
    x = _leaf()
    with fg.inference_mode():
        assert not fg.is_grad_enabled() and fg.is_inference_mode_enabled()
        y = x * 2.0
        with fg.inference_mode(False):
            assert fg.is_grad_enabled() and not fg.is_inference_mode_enabled()
    assert not fg.is_inference_mode_enabled() and fg.is_grad_enabled()
    assert not y.requires_grad and y.is_inference() and not x.is_inference()

    @fg.inference_mode
    def f() -> bool:
        return fg.is_inference_mode_enabled()

    @fg.inference_mode()
    def g() -> bool:
        return fg.is_inference_mode_enabled()

    assert f() and g() and not fg.is_inference_mode_enabled()


def test_inference_tensors_cannot_be_saved_or_require_grad() -> None:
    w = _leaf()
    with fg.inference_mode():
        t = fg.tensor([3.0, 4.0])
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        w * t
    (w + t).sum().backward()  # add saves nothing: allowed, as in PyTorch
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 1.0])
    with pytest.raises(RuntimeError, match="inference tensor outside InferenceMode"):
        t.requires_grad_()
    (w * t.clone()).sum().backward()  # a clone is a normal tensor
    assert not t.clone().is_inference()
