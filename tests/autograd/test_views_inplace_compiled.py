"""Compiled backward through in-place ops on views equals the eager backward: the rewritten base
history (``index_put`` at the view's positions) and the regenerated view nodes are ordinary
primitives that the compiler captures; a boolean-mask assignment (data-dependent shape) falls
back to the eager engine with its reason counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg

compiler = pytest.importorskip("fusegrad.compiler")


def _row_mul_and_column_set(a: Any, w: Any) -> Any:
    b = a.clone()
    b[0].mul_(w)
    b[:, 1] = w[:3].exp()
    return (b * a).sum(0)


def _chain_of_views(a: Any, w: Any) -> Any:
    b = a * 2.0
    v = b.t()[1:]
    v.add_(w[1:])
    v.diagonal().mul_(w[0])
    return b.tanh()


def _mask_assignment(a: Any, w: Any) -> Any:
    b = a * w
    b[b > 0.0] = 0.0
    return b


def _grads(prog: Callable, compiled: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    a = fg.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w = fg.tensor(rng.uniform(0.5, 1.5, 4), requires_grad=True)
    out = prog(a, w)
    g = fg.tensor(rng.standard_normal(tuple(out.shape)))
    if compiled:
        with compiler.compiled_autograd():
            out.backward(g)
    else:
        out.backward(g)
    return [a.grad.numpy(), w.grad.numpy()]


@pytest.mark.compares_compiled
@pytest.mark.parametrize("prog", [_row_mul_and_column_set, _chain_of_views, _mask_assignment])
def test_compiled_backward_equals_eager(prog: Callable) -> None:
    compiler.reset()
    eager = _grads(prog, compiled=False)
    compiled = _grads(prog, compiled=True)
    for mine, ref in zip(compiled, eager):
        np.testing.assert_allclose(mine, ref, rtol=1e-12, atol=1e-12)
    counters = compiler.counters
    if prog is _mask_assignment:
        assert counters.compiled_runs == 0
        assert any("data-dependent" in reason for reason in counters.fallbacks)
    else:
        assert counters.compiled_runs == 1 and not counters.fallbacks
