"""Random elementwise programs for hypothesis tests of compiled backward: a list of
``(op, i, j)`` steps, each applying a unary op to value ``i`` or a binary op to values ``i`` and
``j`` (taken modulo the values made so far), over broadcast-compatible input shapes."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

import fusegrad as fg

UNARY = ["exp", "tanh", "sigmoid", "sin", "neg", "relu", "abs"]
BINARY = ["add", "sub", "mul", "maximum"]

SHAPES = st.sampled_from([((3, 4), (4,)), ((2, 1, 3), (4, 1)), ((5,), ()), ((2, 3), (2, 3))])


def steps(max_size: int) -> Any:
    """A strategy for the steps of a program of 1 to ``max_size`` ops."""
    return st.lists(
        st.tuples(st.sampled_from(UNARY + BINARY), st.integers(0, 50), st.integers(0, 50)),
        min_size=1,
        max_size=max_size,
    )


def run(steps: list, vals: list) -> list:
    """The values ``steps`` make from ``vals`` (appended to it; the new ones returned)."""
    start = len(vals)
    for name, i, j in steps:
        a, b = vals[i % len(vals)], vals[j % len(vals)]
        vals.append(getattr(fg, name)(a) if name in UNARY else getattr(fg, name)(a, b))
    return vals[start:]
