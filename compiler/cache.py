"""Program caches, their bounds, and counters.

Three levels, each bounded (``config``) and safe to use from several threads at once:

* ``graphs``: walk key (``capture.walk``: structure, attributes, dtypes, ranks, which sizes are 0
  or 1 and which are equal, no sizes) -> ``GraphEntry``: the graphs captured for that key.  A
  symbolic capture serves every size vector that satisfies its guards; a concrete one only its
  own sizes.  Each captured graph keeps its programs per *program key* (the leaves' ``.grad``
  state, the mode and the configuration that changes generated code): changing only those
  builds a program from the same graph, without a capture.
* ``tape_programs``: the walk-free path (``tape``): a tape key (the structure and shapes of the
  forward recorded in a compiled region) -> ``TapeEntry``, the ``tape.Binding`` that finds the
  walk's arguments in such a graph and, per state of the leaves, the program and size vector.
* each ``program.Program`` keeps its own per-size-vector instances (``config.sizes_per_program``).

A miss costs O(1) in the number of cached programs: the reason in words (logged on the
``recompiles`` channel) compares the new key with the last key of the same coarse shape (the
sequence of node kinds), never with every cached key.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .settings import config


@dataclass
class Counters:
    """What the compiler did in this process (``reset()`` zeroes it), one line per counter:

    * captures: backward graphs captured (the engine run over symbolic values: Python work).
    * builds: programs built from a captured graph (schedule, code generation, loading).
    * compiles: numba specialisations (a function for one set of argument types) JIT-compiled.
    * cache_hits: backward passes that found their ``Program`` in memory (tape hits included).
    * tape_hits: the cache hits found through the tape, without walking the graph.
    * disk_hits: numba specialisations loaded from the disk cache instead of compiled.
    * compiled_runs: backward passes run by a compiled ``Program``.
    * fallbacks: backward passes run eagerly, by reason.
    * step_captures: calls of compiled functions recorded as a whole step (``step``).
    * step_runs: calls replayed as a whole step.
    * step_warmups: first calls run eagerly because they create optimizer state (``step``).
    * background_compiles: programs (whole steps, compiled modules' backwards) built and
      JIT-compiled on a thread of their own.
    * uncompiled_runs: whole-step replays (counted in step_runs too) and compiled modules'
      backwards run uncompiled, each value by its eager kernel, while their program was built
      in the background.
    * step_breaks: recordings that could not be replayed, by reason (the function then runs
      with compiled backward only, for that guard key).
    * opaque_functions: custom Function ``backward`` calls a compiled program ran eagerly, as
      an opaque step, because they cannot be traced, by reason (counted in compiled_runs too).
    * checkpoints_replayed: checkpointed functions a compiled program recomputed from the
      recording of their forward (``autograd.recording``), without their Python.
    * checkpoints_rerun: checkpointed functions whose Python a compiled program ran again (the
      unpack hook as an opaque step), because a replay could not vouch for it, by reason (a
      reentrant one counts in opaque_functions instead).
    * batched_vjps: Jacobian blocks (``jacobian(vectorize=True)``, one per output) whose rows
      one batched program computed (``batching``).

    ``compiles`` and ``disk_hits`` count the functions programs call (generated CPU kernels, their
    ``prange`` variants, the interpreter's ``run_ops``, CUDA kernels on a GPU; the CUDA simulator
    compiles nothing), whenever numba needs one (``codegen.diskcache``), not the helpers inside.
    """

    captures: int = 0
    builds: int = 0
    compiles: int = 0
    cache_hits: int = 0
    tape_hits: int = 0
    disk_hits: int = 0
    compiled_runs: int = 0
    fallbacks: Counter = field(default_factory=Counter)
    step_captures: int = 0
    step_runs: int = 0
    step_warmups: int = 0
    background_compiles: int = 0
    uncompiled_runs: int = 0
    step_breaks: Counter = field(default_factory=Counter)
    opaque_functions: Counter = field(default_factory=Counter)
    checkpoints_replayed: int = 0
    checkpoints_rerun: Counter = field(default_factory=Counter)
    batched_vjps: int = 0
    # not a count: ``time.perf_counter()`` when a program last started an allreduce (a DDP
    # bucket): the moment its last gradient was done (``benchmarks.distributed`` reads it)
    last_allreduce_start: float = 0.0

    def __repr__(self) -> str:
        fb = dict(self.fallbacks)
        return (
            f"Counters(captures={self.captures}, builds={self.builds}, "
            f"compiles={self.compiles}, cache_hits={self.cache_hits}, "
            f"tape_hits={self.tape_hits}, disk_hits={self.disk_hits}, "
            f"compiled_runs={self.compiled_runs}, fallbacks={fb}, "
            f"step_captures={self.step_captures}, step_runs={self.step_runs}, "
            f"step_warmups={self.step_warmups}, "
            f"background_compiles={self.background_compiles}, "
            f"uncompiled_runs={self.uncompiled_runs}, "
            f"step_breaks={dict(self.step_breaks)}, "
            f"opaque_functions={dict(self.opaque_functions)}, "
            f"checkpoints_replayed={self.checkpoints_replayed}, "
            f"checkpoints_rerun={dict(self.checkpoints_rerun)}, "
            f"batched_vjps={self.batched_vjps})"
        )


counters = Counters()


class LRU:
    """A bounded mapping, least recently used first out, with one lock around every change.
    ``limit`` is called on each insertion (a ``config`` setting can change at run time)."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self._data: OrderedDict = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            limit = max(int(self._limit()), 1)
            while len(self._data) > limit:
                self._data.popitem(last=False)

    def pop(self, key: Any) -> Any:
        with self._lock:
            return self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def values(self) -> list:
        with self._lock:
            return list(self._data.values())

    def keys(self) -> list:
        with self._lock:
            return list(self._data.keys())

    def items(self) -> list:
        with self._lock:
            return list(self._data.items())

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator:
        return iter(self.keys())

    def __contains__(self, key: object) -> bool:
        return key in self._data


def _limit(name: str) -> Callable[[], int]:
    def limit() -> int:
        return int(getattr(config, name))

    return limit


class GraphEntry:
    """The graphs captured for one walk key: symbolic ones (each with its guards) and concrete
    ones (by size vector), both bounded by ``config.captures_per_key``."""

    def __init__(self) -> None:
        self.symbolic: list = []  # capture.Captured, most recent last
        self.concrete = LRU(_limit("captures_per_key"))
        self.symbolic_failed: str | None = None  # why symbolic capture failed for this key
        # why this key's backward runs eagerly every time (``capture.Refused``), else None
        self.refused: str | None = None
        self._lock = threading.Lock()

    def find(self, sizes: tuple) -> Any:
        for captured in reversed(self.symbolic):
            if all(g.holds(sizes) for g in captured.guards):
                return captured
        return self.concrete.get(sizes)

    def add(self, captured: Any, sizes: tuple) -> None:
        if captured.symbolic:
            with self._lock:
                self.symbolic.append(captured)
                del self.symbolic[: max(0, len(self.symbolic) - config.captures_per_key)]
        else:
            self.concrete.put(sizes, captured)
            if self.symbolic_failed is None:
                self.symbolic_failed = captured.reason

    def failed_guard(self, sizes: tuple) -> str | None:
        """Words for why no symbolic capture serves ``sizes`` (the first failed guard)."""
        for captured in reversed(self.symbolic):
            for g in captured.guards:
                if not g.holds(sizes):
                    return "a size guard failed: " + g.describe(sizes)
        return None


graphs = LRU(_limit("cache_size"))


@dataclass
class TapeEntry:
    binding: Any  # tape.Binding
    programs: dict = field(default_factory=dict)  # (leaf key, mode) -> (Program, size vector)


tape_programs = LRU(_limit("tape_cache_size"))


# ---- miss reasons, in words, in O(1) --------------------------------------------------------

_recent = LRU(lambda: 4096)  # coarse shape of a key -> the last full key of that shape


def _coarse(key: tuple) -> tuple:
    return tuple(entry[0] if isinstance(entry, tuple) and entry else None for entry in key)


def remember(key: tuple) -> None:
    _recent.put(_coarse(key), key)


def miss_reason(key: tuple) -> str:
    """Why ``key`` missed, in words: the first difference from the last key of the same coarse
    shape (the same sequence of node kinds), or that the graph is new."""
    if not len(graphs):
        return "first capture"
    previous = _recent.get(_coarse(key))
    if previous is None:
        nodes = sum(1 for e in key if isinstance(e, tuple) and e and e[0] not in _KINDS)
        return f"a graph not seen before ({nodes} nodes)"
    for i, (a, b) in enumerate(zip(previous, key)):
        if a != b:
            return describe_difference(i, a, b)
    return "a graph whose earlier program was evicted from the cache (config.cache_size)"


_KINDS = ("call", "root", "input", "leaf", "remat")


def _describe_shape(old: tuple, new: tuple) -> str | None:
    if len(old) != len(new):
        return f"rank {len(old)} -> {len(new)}"
    for d, (a, b) in enumerate(zip(old, new)):
        if a != b:
            if a < 2 or b < 2:
                was = "a size of 2 or more" if a >= 2 else str(a)
                now = "a size of 2 or more" if b >= 2 else str(b)
                return f"dim {d}: {was} -> {now}"
            return "sizes that were equal to each other differ now (or the other way round)"
    return None


def describe_difference(i: int, old: Any, new: Any) -> str:
    """The difference between entry ``i`` of two keys, in words."""
    if not (isinstance(old, tuple) and isinstance(new, tuple)) or old[:1] != new[:1]:
        return f"the graph's structure changed at entry {i}"
    kind = old[0]
    if kind == "call":
        return "backward() instead of grad() (or the other way round), or another number of roots"
    if kind in ("root", "leaf"):
        what = "root gradient" if kind == "root" else "leaf"
        shape_at, dtype_at, type_at = (3, 4, 5) if kind == "root" else (1, 2, 3)
        if old[dtype_at] != new[dtype_at]:
            return f"{what} dtype {old[dtype_at].name} -> {new[dtype_at].name}"
        if old[type_at] != new[type_at]:
            return f"{what} moved to another device"
        shape = _describe_shape(old[shape_at], new[shape_at])
        if shape:
            return f"{what} shape: {shape}"
        if kind == "leaf" and old[4] != new[4]:
            return "hooks registered on a leaf changed"
        return f"the {what}'s place in the graph changed"
    if kind in ("input", "remat"):
        return "the inputs of grad() changed" if kind == "input" else "rematerialisation changed"
    name = f"{kind} node"
    if old[1] != new[1]:
        return f"{name}: attributes {dict(old[1])} -> {dict(new[1])}"
    if old[2] != new[2]:
        return f"{name}: its inputs come from other nodes"
    if old[3] != new[3]:
        for (so, do), (sn, dn) in zip(old[3], new[3]):
            if do != dn:
                return f"{name}: input dtype {do.name} -> {dn.name}"
            shape = _describe_shape(so, sn)
            if shape:
                return f"{name}: input shape: {shape}"
    if old[4] != new[4]:
        return f"{name}: what it saved changed (dtype, aliasing or device of a saved tensor)"
    if old[5] != new[5]:
        return f"{name}: hooks registered on it changed"
    return f"{name} changed"


def describe_program_miss(old_key: tuple | None, new_key: tuple) -> str:
    """Why a captured graph needs another program: its program key (leaves' ``.grad`` state,
    mode, configuration) differs from the one it was built for."""
    if old_key is None:
        return "first program of this graph"
    grads_old, mode_old, config_old = old_key
    grads_new, mode_new, config_new = new_key
    if mode_old != mode_new:
        return f"mode {mode_old!r} -> {mode_new!r}"
    if config_old != config_new:
        changed = [
            f"config.{name} {a!r} -> {b!r}"
            for name, a, b in zip(config.PROGRAM_KEY, config_old, config_new)
            if a != b
        ]
        return ", ".join(changed) or f"configuration {config_old} -> {config_new}"
    for k, (a, b) in enumerate(zip(grads_old, grads_new)):
        if (a is None) != (b is None):
            return f"leaf {k}'s .grad went from {'None' if a is None else 'a tensor'} to " + (
                "None" if b is None else "a tensor"
            )
        if a != b:
            return f"leaf {k}'s .grad changed (dtype, layout or requires_grad)"
    return "another program key"


def lookup(w: Any, mode: str = "default") -> Any:
    """The cached program that runs walk ``w`` in ``mode`` now, or None (for tools)."""
    entry = graphs.get(w.key)
    captured = entry.find(w.sizes) if entry is not None else None
    if captured is None:
        return None
    return captured.programs.get((w.grad_key, mode, config.program_key()))


def cached_programs() -> list:
    """Every program in the graph cache (for tests and tools), oldest graph first."""
    out = []
    for entry in graphs.values():
        captures = list(entry.symbolic) + entry.concrete.values()
        for captured in captures:
            out.extend(captured.programs.values())
    return out


def reset() -> None:
    """Clear in-memory program caches and counters."""
    graphs.clear()
    tape_programs.clear()
    _recent.clear()
    counters.captures = counters.compiles = counters.cache_hits = counters.disk_hits = 0
    counters.tape_hits = counters.builds = 0
    counters.compiled_runs = counters.step_captures = counters.step_runs = 0
    counters.step_warmups = counters.background_compiles = counters.uncompiled_runs = 0
    counters.fallbacks.clear()
    counters.step_breaks.clear()
    counters.opaque_functions.clear()
    counters.checkpoints_replayed = 0
    counters.checkpoints_rerun.clear()
    counters.batched_vjps = 0
