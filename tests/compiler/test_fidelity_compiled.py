"""Compiled autograd agrees with eager mode on two findings of issue 28.

* Bug 3: ``grad(dydx, x, allow_unused=True)`` where ``dydx`` came from a compiled
  ``create_graph=True`` backward and does not depend on ``x`` is None, as in eager mode (the
  compiled program's gradients had an edge to every input the program read that requires
  grad, so a zero tensor came back); ``materialize_grads=True`` gives zeros.
* Bug 4: an in-place change to a tensor that two nodes saved raises the version error naming
  the first node, in execution order, that needs it, as in eager mode (the custom Function
  behind ``layer_norm`` refused to be traced on the error and ran as an opaque step later,
  so the next node's check spoke first).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import compiler

pytestmark = pytest.mark.usefixtures("fresh_compiler")


def _leaves() -> tuple[fg.Tensor, fg.Tensor]:
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal((5, 4)), requires_grad=True)
    w = fg.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    return x, w


def _second_order(materialize: bool) -> tuple:
    x, w = _leaves()
    y = (x @ w).sum()
    (dydx,) = fg.autograd.grad(y, x, create_graph=True)  # = the rows of w: no x in it
    return fg.autograd.grad(
        dydx.pow(2).sum(), [x, w], allow_unused=True, materialize_grads=materialize
    )


def _numpy(grads: tuple) -> list:
    return [None if g is None else g.detach().numpy() for g in grads]


@pytest.mark.parametrize("materialize", [False, True])
def test_an_unused_input_of_a_compiled_double_backward_is_none(materialize: bool) -> None:
    eager = _numpy(_second_order(materialize))
    assert (eager[0] is None) != materialize
    for _ in range(2):  # the capture, then the cached program
        with compiler.compiled_autograd():
            got = _numpy(_second_order(materialize))
        assert (got[0] is None) == (eager[0] is None)
        if materialize:
            np.testing.assert_array_equal(got[0], np.zeros((5, 4)))
        np.testing.assert_allclose(got[1], eager[1], rtol=1e-12)
    assert not compiler.counters.fallbacks, compiler.counters.fallbacks


def test_a_path_only_through_a_comparison_is_no_dependence() -> None:
    def program() -> list:
        x, w = _leaves()
        y = (x @ w).relu().sum()  # relu's rule reads x @ w only through a comparison
        (dydw,) = fg.autograd.grad(y, w, create_graph=True)
        return _numpy(fg.autograd.grad(dydw.sum(), [x, w], allow_unused=True))

    eager = program()
    with compiler.compiled_autograd():
        got = program()
    assert [g is None for g in got] == [g is None for g in eager]
    for e, g in zip(eager, got):
        if e is not None:
            np.testing.assert_allclose(g, e, rtol=1e-12)


def _layer_norm_program(variant: str) -> Callable[[], None]:
    def program() -> None:
        rng = np.random.default_rng(1)
        x = fg.tensor(rng.standard_normal((3, 4)), requires_grad=True)
        p = fg.tensor(rng.standard_normal(4), requires_grad=True)
        if variant == "weight saved by abs too":
            w = p * 1.0
            b = w.abs()  # AbsBackward0 saves w as well
            modified = w
        else:  # "weight saved by exp as its output"
            w = p.exp()
            b = w * 2.0
            modified = w
        y = F.layer_norm(x, (4,), w, b)
        modified.tanh_()
        y.sum().backward()

    return program


def _error(program: Callable[[], None]) -> str:
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
        program()
    return str(info.value)


@pytest.mark.parametrize("variant", ["weight saved by abs too", "weight saved by exp"])
def test_the_version_error_names_the_node_eager_names(variant: str) -> None:
    program = _layer_norm_program(variant)
    eager = _error(program)
    assert "needed by NativeLayerNormBackward0" in eager
    for _ in range(2):
        with compiler.compiled_autograd():
            assert _error(program) == eager
