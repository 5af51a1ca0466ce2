"""Compiled ``F.binary_cross_entropy`` (the ``binary_cross_entropy`` primitive and its gradient's,
tests/ops/test_bce_primitive.py) gives eager's answers, saturated probabilities included:
``compile(step)``, ``compile(model)`` and ``compiled_autograd()`` (first and second order),
compiled in the foreground (tests/conftest.py), with the number of recordings counted."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad import compiler

pytestmark = pytest.mark.usefixtures("fresh_compiler")

DTYPES = ["float32", "float64"]
REDUCTIONS = ["none", "mean", "sum"]

# both saturated pairs (p = 0 with t = 0, p = 1 with t = 1), the opposite ones, ordinary values
P = [0.0, 1.0, 0.0, 1.0, 0.5, 1e-30, 1 - 1e-7, 0.3, 0.9, 0.02, 0.75, 0.6]
T = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.2, 0.5, 1.0, 0.0, 0.6]


def _compiled_leaves(dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p = np.array(P, dtype).reshape(3, 4)
    t = np.array(T, dtype).reshape(3, 4)
    w = np.random.default_rng(8).uniform(0.5, 2.0, (4,)).astype(dtype)
    return p, t, w


def _close_compiled(got: np.ndarray, want: np.ndarray, dtype: str, what: str) -> None:
    # float32: compiled code's log/log1p are fastmath's (<= 2 ulp of numpy's)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0, err_msg=what)
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]), err_msg=what)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_compiled_step_gives_eagers_answers(dtype: str, reduction: str) -> None:
    p0, t0, w0 = _compiled_leaves(dtype)
    w = fg.tensor(w0)

    def step(p: fg.Tensor, t: fg.Tensor) -> fg.Tensor:
        loss = F.binary_cross_entropy(p, t, weight=w, reduction=reduction)
        loss.sum().backward()
        return loss.detach()

    compiled = fg.compile(step)
    for call in range(3):  # recorded, then replayed as a compiled program
        scale = 1.0 if call < 2 else 0.5  # (the last call: other probabilities, same program)
        results = []
        for fn in (step, compiled):
            p = fg.tensor(np.where((p0 == 0) | (p0 == 1), p0, p0 * scale), requires_grad=True)
            t = fg.tensor(t0, requires_grad=True)
            loss = fn(p, t)
            results.append([loss.numpy(), p.grad.numpy(), t.grad.numpy()])
        for name, got, want in zip(["loss", "p.grad", "t.grad"], results[1], results[0]):
            _close_compiled(got, want, dtype, f"call {call}: {name}")
        assert np.isfinite(results[1][1]).all()
    assert compiler.counters.step_captures == 1
    assert compiler.counters.step_runs >= 2
    assert not compiler.counters.fallbacks, compiler.counters.fallbacks


class _Probabilities(nn.Module):
    """Probabilities from logits, some of them saturated in float32 and float64 (sigmoid of
    +-800 is exactly 1 and 0)."""

    def __init__(self, logits: np.ndarray) -> None:
        super().__init__()
        self.logits = nn.Parameter(fg.tensor(logits))

    def forward(self, t: fg.Tensor) -> fg.Tensor:
        return F.binary_cross_entropy(self.logits.sigmoid(), t, reduction="sum")


@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_module_gives_eagers_answers(dtype: str) -> None:
    rng = np.random.default_rng(9)
    logits = rng.uniform(-3.0, 3.0, (3, 4)).astype(dtype)
    logits.flat[:4] = [-800.0, 800.0, -800.0, 800.0]  # p = 0, 1, 0, 1
    t = fg.tensor(np.array(T, dtype).reshape(3, 4))  # targets 0, 1, 1, 0 there
    eager, module = _Probabilities(logits), _Probabilities(logits)
    compiled = fg.compile(module)
    for _ in range(3):
        for net in (eager, compiled):
            net.zero_grad()
            net(t).backward()
        _close_compiled(module.logits.grad.numpy(), eager.logits.grad.numpy(), dtype, "grad")
    assert np.isfinite(module.logits.grad.numpy()).all()
    assert compiler.counters.step_captures == 1
    assert not compiler.counters.fallbacks, compiler.counters.fallbacks


def _first_and_second_order(
    dtype: str, create_graph: bool, target_requires_grad: bool
) -> list[np.ndarray]:
    """``.grad`` of the mean weighted loss, or (``create_graph``) its gradients and the gradient
    of ``sum(gp v)`` with respect to the probabilities (and the targets, when they require
    grad)."""
    p0, t0, w0 = _compiled_leaves(dtype)
    v = fg.tensor(np.random.default_rng(10).uniform(0.5, 2.0, (3, 4)).astype(dtype))
    p = fg.tensor(p0, requires_grad=True)
    t = fg.tensor(t0, requires_grad=target_requires_grad)
    leaves = (p, t) if target_requires_grad else (p,)
    loss = F.binary_cross_entropy(p, t, weight=fg.tensor(w0), reduction="mean")
    if not create_graph:
        loss.backward()
        return [leaf.grad.numpy() for leaf in leaves]
    first = fg.autograd.grad(loss, leaves, create_graph=True)
    second = fg.autograd.grad((first[0] * v).sum(), leaves)
    return [g.detach().numpy() for g in (*first, *second)]


def _assert_compiled_autograd_is_eager(dtype: str, create_graph: bool, target: bool) -> None:
    want = _first_and_second_order(dtype, create_graph, target)
    for _ in range(2):  # the capture, then the cached program
        with compiler.compiled_autograd():
            got = _first_and_second_order(dtype, create_graph, target)
        for k, (a, b) in enumerate(zip(got, want)):
            _close_compiled(a, b, dtype, f"result {k}")
    assert compiler.counters.compiled_runs >= 2
    assert not compiler.counters.fallbacks, compiler.counters.fallbacks


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("create_graph", [False, True])
def test_compiled_autograd_gives_eagers_answers(dtype: str, create_graph: bool) -> None:
    """The backward (and, with ``create_graph``, a second backward through the input's
    gradient) captured and compiled, against eager's; the targets require grad where only the
    first order is taken."""
    _assert_compiled_autograd_is_eager(dtype, create_graph, target=not create_graph)


@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_second_order_with_a_target_that_requires_grad(dtype: str) -> None:
    """The second backward reaches only the input's gradient; the target's gradient, whose
    derivative is infinite at saturation, gets no cotangent (``CompiledGradBackward`` runs the
    VJP from the outputs that have one: a zero for it would make 0 * -inf = NaN)."""
    _assert_compiled_autograd_is_eager(dtype, create_graph=True, target=True)
