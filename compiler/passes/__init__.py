"""Graph passes, each ``Graph -> Graph`` in its own module, run in a fixed order by ``run``.

``dce`` drops values no effect needs.  (CSE happens at construction: ``Graph.add`` interns.)
Fusion and buffer planning come with the code generators.
"""

from __future__ import annotations

from ..ir import Graph, verify
from .dce import dce

PIPELINE = (dce,)


def run(graph: Graph, check: bool = False) -> Graph:
    """Apply the pipeline; with ``check`` (tests), ``verify`` after every pass."""
    for p in PIPELINE:
        graph = p(graph)
        if check:
            verify(graph)
    return graph
