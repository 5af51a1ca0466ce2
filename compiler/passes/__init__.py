"""Graph passes, each ``Graph -> Graph`` in its own module, run in a fixed order by ``run``.

``simplify`` rewrites values into cheaper equal ones (exact rewrites only), then ``dce`` drops
values no effect needs.  CSE happens at construction (``Graph.add`` interns values) and again
in every rebuilt graph.  Fusion (``fuse``) turns the final graph into a schedule of kernels and
externs; it runs when a program is built.
"""

from __future__ import annotations

from ..ir import Graph, verify
from .dce import dce
from .simplify import simplify

PIPELINE = (simplify, dce)


def run(graph: Graph, check: bool = False) -> Graph:
    """Apply the pipeline; with ``check`` (tests), ``verify`` after every pass."""
    for p in PIPELINE:
        graph = p(graph)
        if check:
            verify(graph)
    return graph
