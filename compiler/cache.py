"""The data structures of the compiler's caches: bounded maps, the graphs captured per walk
key, a front end's programs per key, the tape path's entries, and the miss reasons in words.
The caches themselves (the instances) belong to the compilation service (``service``); this
module only says what they hold:

* ``Service.graphs``: walk key (``key.walk``: structure, attributes, dtypes, ranks, which sizes
  are 0 or 1 and which are equal, no sizes) -> ``GraphEntry``: the graphs captured for that key.
  A symbolic capture serves every size vector that satisfies its guards; a concrete one only its
  own sizes.  Each captured graph keeps its programs per *program key* (the leaves' ``.grad``
  state, the mode and the configuration that changes generated code) in a ``Programs`` table:
  changing only those builds a program from the same graph, without a capture.
* ``Service.tapes``: the walk-free path (``tape``): a tape key (the structure and shapes of the
  forward recorded in a compiled region) -> ``TapeEntry``, the ``tape.Binding`` that finds the
  walk's arguments in such a graph and, per state of the leaves, where its program is.
* each ``program.Program`` keeps its own per-size-vector instances (``config.sizes_per_program``).

A miss costs O(1) in the number of cached programs: the reason in words (``KeyHistory``, logged
on the ``recompiles`` channel) compares the new key with the last key of the same coarse shape
(the sequence of node kinds), never with every cached key.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .settings import config

if TYPE_CHECKING:
    from .program import Program
    from .service import BackgroundBuild


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


class Slot:
    """One program's life under one key: ``program`` once built (and, in the background case,
    compiled), ``job`` while a ``BackgroundBuild`` runs."""

    __slots__ = ("job", "program", "trial")

    def __init__(self) -> None:
        self.program: Program | None = None
        self.job: BackgroundBuild | None = None
        self.trial: Any = None  # a ``service.Trial`` choosing between two programs


class Programs:
    """A front end's programs by key (a whole step's by ``.grad`` state, a module's backward by
    which outputs got a gradient, a captured graph's by program key), at most ``limit`` kept:
    the oldest key goes first.  Readers on other threads see whole dicts (copy on write)."""

    __slots__ = ("limit", "slots")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.slots: dict[Any, Slot] = {}

    def ready(self, key: Any) -> Program | None:
        """The program under ``key`` when it is built and not being compiled, else None."""
        slot = self.slots.get(key)
        if slot is None or slot.job is not None or slot.trial is not None:
            return None
        return slot.program

    def slot(self, key: Any) -> Slot:
        found = self.slots.get(key)
        if found is None:
            slots = dict(self.slots)
            found = slots[key] = Slot()
            while self.limit is not None and len(slots) > self.limit:
                slots.pop(next(iter(slots)))
            self.slots = slots
        return found

    def programs(self) -> list[Program]:
        return [s.program for s in self.slots.values() if s.program is not None]

    def keys(self) -> list:
        return list(self.slots)

    def __iter__(self) -> Iterator:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.slots)

    def __contains__(self, key: Any) -> bool:
        return self.ready(key) is not None


@dataclass
class TapeEntry:
    binding: Any  # tape.Binding
    # (leaf key, mode, configuration) -> (the captured graph's ``Programs``, program key, size
    # vector): its program, when ready
    programs: dict = field(default_factory=dict)


# ---- miss reasons, in words, in O(1) --------------------------------------------------------


class KeyHistory:
    """The last full walk key of each coarse shape (the sequence of node kinds), to say why a
    key missed in O(1): its first difference from the last key of the same shape."""

    def __init__(self) -> None:
        self._recent = LRU(lambda: 4096)

    def remember(self, key: tuple) -> None:
        self._recent.put(_coarse(key), key)

    def clear(self) -> None:
        self._recent.clear()

    def miss_reason(self, key: tuple, first: bool) -> str:
        """Why ``key`` missed, in words (``first``: nothing is cached at all)."""
        if first:
            return "first capture"
        previous = self._recent.get(_coarse(key))
        if previous is None:
            nodes = sum(1 for e in key if isinstance(e, tuple) and e and e[0] not in _KINDS)
            return f"a graph not seen before ({nodes} nodes)"
        for i, (a, b) in enumerate(zip(previous, key)):
            if a != b:
                return describe_difference(i, a, b)
        return "a graph whose earlier program was evicted from the cache (config.cache_size)"


def _coarse(key: tuple) -> tuple:
    return tuple(entry[0] if isinstance(entry, tuple) and entry else None for entry in key)


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


def _attributes(attrs: Any) -> Any:
    """A node entry's attributes for a message: a dict where they are (name, value) pairs."""
    try:
        return dict(attrs)
    except (TypeError, ValueError):
        return attrs


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
    if kind == "unrun":  # (past the inputs of a grad()-like walk: ``key.KeyBuilder``)
        return f"a node that does not run changed ({old[1]} -> {new[1]})"
    if len(old) < 6 or len(new) < 6:  # (entries of other shapes: checkpoints, functions)
        return f"{name} changed"
    if old[1] != new[1]:
        return f"{name}: attributes {_attributes(old[1])} -> {_attributes(new[1])}"
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
