"""``fusegrad.compiler``: compiled autograd, whole steps and compiled modules -- the public face.

Three front ends, one compilation service (docs/ARCHITECTURE.md):

* ``compiled_autograd()`` (``region``): every ``backward()``/``autograd.grad()`` in the block is
  compiled: its graph walked into a key (``key``), captured as IR on a miss (``capture``),
  fused (``passes``), turned into a program (``program``, ``codegen``) and run on the call's data;
* ``compile(fn)`` (``step``): a whole training step -- forward, backward, optimizer -- recorded
  once (``recording``) and replayed as one program;
* ``compile(module)`` (``module``): a module whose forward is replayed as one program and whose
  backward, called outside it, is a second one.

Each front end makes a key and a graph; ``admission`` says what may be compiled (or why not),
``service`` owns every program's life (caches, building, background compiles, promotion,
eviction, the compile notice), and ``events`` is the one stream that ``counters``, the log
channels (``set_logs``), the trace report and ``explain`` subscribe to.  Whatever cannot be
compiled runs eagerly, with its reason, decided before anything is freed or written;
``fullgraph=True`` raises ``CompilationError`` instead.

src/fusegrad never imports this package at load time; it is loaded by ``fusegrad.compile``.
Nothing in fusegrad is patched: outside a region (or on another thread) eager code runs as if
this package had never been imported.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fusegrad.nn.module import Module

from .admission import CompilationError
from .dynamic import mark_dynamic, mark_static
from .events import counters
from .events import debug as _debug
from .explain import Report, explain
from .key import walk as _walk
from .logs import set_logs
from .module import OptimizedModule
from .region import compiled_autograd
from .service import service as _service
from .service import wait_for_compiles as _wait_for_compiles
from .settings import Config, config
from .step import CompiledFunction

__all__ = [
    "compile",
    "compiled_autograd",
    "counters",
    "reset",
    "explain",
    "set_logs",
    "wait_for_compiles",
    "CompilationError",
    "Config",
    "Report",
    "config",
    "cached_programs",
    "mark_dynamic",
    "mark_static",
]


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait (at most ``timeout`` seconds) until no program is being compiled in the background
    (``config.background_compile``); True when none is left, so that the next call of every
    compiled step runs compiled code (benchmarks call it before timing)."""
    return _wait_for_compiles(timeout)


def reset() -> None:
    """Clear in-memory program caches and counters."""
    _service.reset()


def cached_programs() -> list:
    """Every program in the graph cache (for tests and tools), oldest graph first."""
    return _service.cached_programs()


def compile(
    fn: Callable | None = None,
    *,
    fullgraph: bool = False,
    dynamic: bool = True,
    mode: str = "default",
) -> Any:
    """Decorator (``@fusegrad.compile`` or ``@fusegrad.compile(fullgraph=True)``) or function:
    every backward()/grad() executed inside ``fn`` is compiled, and the whole call is recorded
    and replayed as one program where it can be.  ``dynamic`` is accepted for torch.compile
    compatibility: sizes are always runtime arguments of generated code.

    A module gives a module (``compiler.module.OptimizedModule``): the original's parameters,
    state and attributes, whose outputs' backward is compiled even when ``backward()`` is called
    outside it."""
    if fn is None:
        return functools.partial(compile, fullgraph=fullgraph, dynamic=dynamic, mode=mode)
    if not callable(fn):
        raise TypeError(f"compile() expects a callable, got {type(fn).__name__}")
    if mode not in ("default", "debug"):
        raise ValueError(f"compile: unknown mode {mode!r} (expected default or debug)")
    if isinstance(fn, Module):
        return OptimizedModule(fn, fullgraph, mode)
    compiled = CompiledFunction(
        fn, fullgraph, mode, lambda: compiled_autograd(fullgraph=fullgraph, mode=mode)
    )
    functools.update_wrapper(compiled, fn)
    return compiled
