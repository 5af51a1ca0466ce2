"""Graph passes, each ``Graph -> Graph`` in its own module, run in a fixed order by ``run``.

``simplify`` rewrites values into cheaper equal ones (exact rewrites only), then ``dce`` drops
values no effect needs.  CSE happens at construction (``Graph.add`` interns values) and again
in every rebuilt graph.  Fusion (``fuse``) turns the final graph into a schedule of kernels and
externs; it runs when a program is built.
"""

from __future__ import annotations

import time

from .. import trace as _trace
from ..ir import Graph, verify
from .dce import dce
from .simplify import simplify

PIPELINE = (simplify, dce)


def run(graph: Graph, check: bool = False) -> Graph:
    """Apply the pipeline; with ``check`` (tests), ``verify`` after every pass.  While the trace
    report is on, each pass's name, time and graph size before and after go into it."""
    traced = _trace.enabled
    for p in PIPELINE:
        before, start = len(graph.values), time.perf_counter() if traced else 0.0
        graph = p(graph)
        if traced:
            _trace.pass_done(p.__name__, before, len(graph.values), time.perf_counter() - start)
        if check:
            verify(graph)
    return graph
