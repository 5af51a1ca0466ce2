"""A tracer for tests: ``PrimitiveNames`` records the names of the primitives that a block run
under ``fusegrad.autograd.tracer.tracing(...)`` reaches, and lets each run as usual (which
kernel ran: a fused primitive or its composite)."""

from __future__ import annotations

from typing import Any

from fusegrad.autograd import tracer


class PrimitiveNames(tracer.Tracer):
    """Names the primitives a call reaches (``names``), and lets them run."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def apply(self, prim: Any, inputs: Any, attrs: Any) -> Any:  # type: ignore[override]
        self.names.add(prim.name)
        return NotImplemented
