"""Program caches and counters.

``programs`` maps a walk key (``capture.walk``: structure, attributes, shapes, dtypes, leaves
and their ``.grad`` state) to its ``Program``.  A miss whose key differs from a cached one only
in sizes is logged as a new-size capture; any other difference is logged with the first entry
that changed (the recompile reason).  ``counters`` are for tests and users.

``tape_programs`` is the walk-free path to the same programs: a tape key (``capture.tape_key``:
the interned structure of the forward recorded in a compiled region) maps to a ``TapeEntry``,
the ``capture.Binding`` that finds the walk's arguments in such a graph and, per state of the
leaves (``capture.leaf_key``), the program.  It holds at most ``MAX_TAPE_ENTRIES`` entries
(cleared when full: tape keys are cheap to rebuild from a walk).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Counters:
    """What the compiler did in this process (``reset()`` zeroes it), one line per counter:

    * captures: backward graphs captured and built into a ``Program`` (program cache misses).
    * compiles: numba specialisations (a function for one set of argument types) JIT-compiled.
    * cache_hits: backward passes that found their ``Program`` in memory (tape hits included).
    * tape_hits: the cache hits found through the tape, without walking the graph.
    * disk_hits: numba specialisations loaded from the disk cache instead of compiled.
    * compiled_runs: backward passes run by a compiled ``Program``.
    * fallbacks: backward passes run eagerly, by reason.

    ``compiles`` and ``disk_hits`` count the functions programs call (generated CPU kernels, their
    ``prange`` variants, the interpreter's ``run_ops``, CUDA kernels on a GPU; the CUDA simulator
    compiles nothing), whenever numba needs one (``codegen.diskcache``), not the helpers inside.
    """

    captures: int = 0
    compiles: int = 0
    cache_hits: int = 0
    tape_hits: int = 0  # cache hits found through the tape (no walk), counted in cache_hits too
    disk_hits: int = 0
    compiled_runs: int = 0
    fallbacks: Counter = field(default_factory=Counter)

    def __repr__(self) -> str:
        fb = dict(self.fallbacks)
        return (
            f"Counters(captures={self.captures}, compiles={self.compiles}, "
            f"cache_hits={self.cache_hits}, tape_hits={self.tape_hits}, "
            f"disk_hits={self.disk_hits}, "
            f"compiled_runs={self.compiled_runs}, fallbacks={fb})"
        )


counters = Counters()
programs: dict[tuple, Any] = {}


@dataclass
class TapeEntry:
    binding: Any  # capture.Binding
    programs: dict = field(default_factory=dict)  # leaf key -> Program


MAX_TAPE_ENTRIES = 4096
tape_programs: dict[tuple, TapeEntry] = {}


def _strip_sizes(entry: Any) -> Any:
    """A key entry with every shape replaced by its rank and broadcast pattern (1-dims)."""
    if isinstance(entry, tuple):
        if entry and all(isinstance(x, int) and not isinstance(x, bool) for x in entry):
            return ("shape", tuple(x == 1 for x in entry))
        return tuple(_strip_sizes(e) for e in entry)
    return entry


def miss_reason(key: tuple) -> str:
    """Why ``key`` missed the cache, relative to the closest cached key."""
    cached = list(programs)  # a snapshot: another thread may add a program meanwhile
    if not cached:
        return "first capture"
    same_structure = [
        k for k in cached if len(k) == len(key) and _strip_sizes(k) == _strip_sizes(key)
    ]
    if same_structure:
        return "new sizes (same structure, dtypes and broadcast patterns)"
    best = None
    for k in cached:
        if len(k) != len(key):
            continue
        for i, (a, b) in enumerate(zip(k, key)):
            if a != b:
                if best is None or i > best[0]:
                    best = (i, a, b)
                break
    if best is None:
        return "a graph of a different size"
    return f"entry {best[0]} changed: {best[1]!r} -> {best[2]!r}"


def reset() -> None:
    """Clear cached programs and counters."""
    global counters
    programs.clear()
    tape_programs.clear()
    counters.captures = counters.compiles = counters.cache_hits = counters.disk_hits = 0
    counters.tape_hits = 0
    counters.compiled_runs = 0
    counters.fallbacks.clear()
