"""Grad modes: no_grad, enable_grad, set_grad_enabled, inference_mode (thread-local).

Each works as a context manager and as a decorator; ``set_grad_enabled(False)`` also works as a
plain call, as in PyTorch.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class _State(threading.local):
    def __init__(self) -> None:
        self.enabled = True
        self.inference = False


_state = _State()


def is_grad_enabled() -> bool:
    return _state.enabled


def is_inference_mode_enabled() -> bool:
    return _state.inference


class _Mode:
    """Base: subclasses set ``_target``; entering saves the previous state, exit restores it."""

    _target: bool = True

    def __init__(self) -> None:
        self._prev: list[tuple[bool, bool]] = []

    def _enter_state(self) -> None:
        _state.enabled = self._target

    def __enter__(self) -> None:
        self._prev.append((_state.enabled, _state.inference))
        self._enter_state()

    def __exit__(self, *exc: object) -> None:
        _state.enabled, _state.inference = self._prev.pop()

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.__class__(*self._init_args()):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def _init_args(self) -> tuple[Any, ...]:
        return ()


class no_grad(_Mode):  # noqa: N801
    _target = False


class enable_grad(_Mode):  # noqa: N801
    _target = True


class set_grad_enabled(_Mode):  # noqa: N801
    """``set_grad_enabled(mode)``: takes effect at once (plain call) and restores on ``__exit__``."""

    def __init__(self, mode: bool) -> None:
        super().__init__()
        self._target = bool(mode)
        # The plain-call form changes the mode immediately, like PyTorch.
        self._prev.append((_state.enabled, _state.inference))
        _state.enabled = self._target

    def __enter__(self) -> None:
        # state already switched in __init__; keep the saved previous state for __exit__
        _state.enabled = self._target

    def _init_args(self) -> tuple[Any, ...]:
        return (self._target,)

    def __call__(self, fn: F) -> F:
        # used as a decorator: undo the immediate switch made by __init__
        if self._prev:
            _state.enabled, _state.inference = self._prev.pop()
        target = self._target

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with set_grad_enabled(target):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class inference_mode(_Mode):  # noqa: N801
    """Like no_grad; tensors made inside are marked as inference tensors."""

    def __init__(self, mode: bool = True) -> None:
        super().__init__()
        self._mode = bool(mode)

    def _enter_state(self) -> None:
        if self._mode:
            _state.enabled = False
            _state.inference = True

    def _init_args(self) -> tuple[Any, ...]:
        return (self._mode,)
