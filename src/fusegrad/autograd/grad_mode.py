"""Grad modes: no_grad, enable_grad, set_grad_enabled, inference_mode (thread-local).

``registry.run`` reads ``_state.enabled`` (``grad_off_threads`` first: while no thread has grad
mode off, it need not read this thread's) to decide whether an op records a backward node; the
engine switches it to ``create_graph`` while it runs.  Every mode works as a context manager and
as a decorator (``@no_grad()`` and bare ``@no_grad``); ``set_grad_enabled(False)`` also works as
a plain call, as in PyTorch.  The state is a ``threading.local``: a thread starts with grad mode
on and never sees another thread's modes.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


# One entry per thread whose inference mode is on (list append and pop are atomic): while it is
# empty, which is almost always, no thread is in inference mode, and ``Tensor._make`` marks a
# new tensor as a normal one without reading this thread's state (a thread-local read costs
# as much as the rest of a small tensor's creation).  A thread that ends inside inference mode
# leaves its entry: the reads then happen, which is only slower.
inference_threads: list = []

# The same for grad mode: one entry per thread whose grad mode is off.  While it is empty (every
# forward pass of a training step), ``registry.run`` knows that grad mode is on here without
# reading the thread-local state, which costs as much as a tenth of a small op.  Hot readers
# read ``grad_off_threads`` first and ``_state._enabled`` (the plain value, not the property)
# only when some thread has grad mode off.
grad_off_threads: list = []


class _State(threading.local):
    def __init__(self) -> None:
        self._enabled = True
        self._inference = False

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        value = bool(value)
        if value != self._enabled:
            if value:
                grad_off_threads.pop()
            else:
                grad_off_threads.append(None)
        self._enabled = value

    @property
    def inference(self) -> bool:
        return self._inference

    @inference.setter
    def inference(self, value: bool) -> None:
        value = bool(value)
        if value != self._inference:
            if value:
                inference_threads.append(None)
            else:
                inference_threads.pop()
        self._inference = value


_state = _State()


def is_grad_enabled() -> bool:
    return _state.enabled


def is_inference_mode_enabled() -> bool:
    return _state.inference


class _Mode:
    """Base: ``_enter_state`` switches the mode; ``__exit__`` restores what was there before.

    The saved states form a stack, so one instance may be entered re-entrantly; decorated
    functions make a fresh instance per call (thread-safe and recursion-safe)."""

    def __init__(self) -> None:
        self._prev: list[tuple[bool, bool]] = []

    def _enter_state(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> None:
        self._prev.append((_state.enabled, _state.inference))
        self._enter_state()

    def __exit__(self, *exc: object) -> None:
        _state.enabled, _state.inference = self._prev.pop()

    def _clone(self) -> _Mode:
        return self.__class__()

    def __call__(self, fn: F) -> F:
        if inspect.isgeneratorfunction(fn):
            # the mode must hold while the generator runs, not just while it is created
            @functools.wraps(fn)
            def generator(*args: Any, **kwargs: Any) -> Any:
                gen = fn(*args, **kwargs)
                try:
                    with self._clone():
                        request = gen.send(None)
                    while True:
                        try:
                            response = yield request
                        except GeneratorExit:
                            with self._clone():
                                gen.close()
                            raise
                        except BaseException as e:  # noqa: BLE001  (forwarded into gen)
                            with self._clone():
                                request = gen.throw(e)
                        else:
                            with self._clone():
                                request = gen.send(response)
                except StopIteration as stop:
                    return stop.value

            return generator  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._clone():
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class _NoParamMode(_Mode):
    """A mode without arguments that can also decorate bare: ``@no_grad`` as ``@no_grad()``."""

    def __new__(cls, orig_func: Callable | None = None) -> Any:
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)

    def __init__(self, orig_func: Callable | None = None) -> None:
        super().__init__()


class no_grad(_NoParamMode):
    """Ops record no backward graph inside (outputs do not require grad)."""

    def _enter_state(self) -> None:
        _state.enabled = False

    def __call__(self, fn: F) -> F:
        if inspect.isgeneratorfunction(fn):
            return super().__call__(fn)

        # what ``_Mode``'s decorator does, without an instance per call: the optimizers'
        # ``step()`` runs under it, once per replayed whole step
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            prev = (_state.enabled, _state.inference)
            _state.enabled = False
            try:
                return fn(*args, **kwargs)
            finally:
                _state.enabled, _state.inference = prev

        return wrapper  # type: ignore[return-value]


class enable_grad(_NoParamMode):
    """Turns grad mode back on inside ``no_grad`` (not inside ``inference_mode``' tensors)."""

    def _enter_state(self) -> None:
        _state.enabled = True


class set_grad_enabled(_Mode):
    """``set_grad_enabled(mode)``: takes effect at once (plain call) and restores the previous
    mode on ``__exit__`` (context manager); as a decorator it changes nothing until called."""

    def __init__(self, mode: bool) -> None:
        super().__init__()
        self._target = bool(mode)
        # The plain-call form changes the mode immediately, like PyTorch.
        self._prev.append((_state.enabled, _state.inference))
        _state.enabled = self._target

    def __enter__(self) -> None:
        # the state was switched (and the previous one saved) by __init__
        _state.enabled = self._target

    def _clone(self) -> _Mode:
        return set_grad_enabled(self._target)

    def __call__(self, fn: F) -> F:
        # used as a decorator: undo the immediate switch made by __init__
        if self._prev:
            _state.enabled, _state.inference = self._prev.pop()
        return super().__call__(fn)

    def _enter_state(self) -> None:
        _state.enabled = self._target


class inference_mode(_Mode):
    """``inference_mode(True)``: grad mode off and tensors created inside are inference tensors
    (``Tensor.is_inference()``), which cannot be saved for backward.  ``inference_mode(False)``
    turns it off again (grad mode on), as in PyTorch."""

    def __new__(cls, mode: Any = True) -> Any:
        if isinstance(mode, bool):
            return super().__new__(cls)
        return cls()(mode)  # bare decorator: @inference_mode

    def __init__(self, mode: Any = True) -> None:
        super().__init__()
        self._mode = mode if isinstance(mode, bool) else True

    def _enter_state(self) -> None:
        _state.enabled = not self._mode
        _state.inference = self._mode

    def _clone(self) -> _Mode:
        return inference_mode(self._mode)
