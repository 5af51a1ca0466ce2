"""Saved-tensor hooks inside compiled backward (issue 12, item 2).

A tensor packed by ``saved_tensors_hooks`` (or ``save_on_cpu``) becomes an ``unpack_saved`` step
of the program: the unpack hook runs where eager mode runs it, once per unpack, and what it
returns is what the gradient kernels read.  Each test compares gradients *and* the hooks' call
log with eager mode, and checks that nothing fell back.  (Checkpointing, whose hooks the
program replaces by the recomputation itself: test_compiled_checkpoint.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.autograd.graph import save_on_cpu, saved_tensors_hooks
from fusegrad.utils.checkpoint import checkpoint

pytestmark = pytest.mark.usefixtures("fresh_compiler")


def _leaves(seed: int = 0) -> list[fg.Tensor]:
    rng = np.random.default_rng(seed)
    return [
        fg.tensor(rng.standard_normal(shape), requires_grad=True)
        for shape in [(3, 4), (4, 2), (2,)]
    ]


class _Logged:
    """Pack hooks that number what they pack; unpack hooks that log the number and can scale."""

    def __init__(self, scale: float = 1.0) -> None:
        self.packed = 0
        self.log: list[int] = []
        self.scale = scale

    def pack(self, t: fg.Tensor) -> tuple[int, fg.Tensor]:
        self.packed += 1
        return self.packed, t.detach() * self.scale

    def unpack(self, p: tuple[int, fg.Tensor]) -> fg.Tensor:
        self.log.append(p[0])
        return p[1]


def _model(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
    h = fg.tanh(x @ w + b)
    return (h * h.sigmoid()).sum() + (x * x).mean()


def _run(
    compiled: bool, forward: Callable[..., fg.Tensor], hooks: Any, seed: int = 0
) -> tuple[list[int], list[np.ndarray]]:
    leaves = _leaves(seed)
    with saved_tensors_hooks(hooks.pack, hooks.unpack):
        y = forward(*leaves)
    hooks.log.clear()
    if compiled:
        with compiler.compiled_autograd():
            y.backward()
    else:
        y.backward()
    return list(hooks.log), [t.grad.numpy() for t in leaves]


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_unpack_hooks_run_in_eager_order_and_feed_the_gradients(scale: float) -> None:
    """The unpacked values are what the kernels read: a hook that scales what it keeps changes
    the gradients exactly as in eager mode."""
    eager_log, eager = _run(False, _model, _Logged(scale))
    for _ in range(3):  # a capture, then cache hits
        log, grads = _run(True, _model, _Logged(scale), seed=0)
        assert log == eager_log
        for e, c in zip(eager, grads):
            np.testing.assert_allclose(c, e, rtol=1e-12, atol=1e-12)
    assert compiler.counters.compiled_runs == 3
    assert compiler.counters.captures == 1
    assert not compiler.counters.fallbacks
    if scale != 1.0:
        _, unscaled = _run(False, _model, _Logged(1.0))
        assert not np.allclose(unscaled[1], eager[1])  # (the hook's values mattered)


def test_save_on_cpu_compiles() -> None:
    leaves = _leaves()
    _model(*leaves).backward()
    eager = [t.grad.numpy() for t in leaves]
    leaves = _leaves()
    with save_on_cpu():
        y = _model(*leaves)
    with compiler.compiled_autograd():
        y.backward()
    for e, t in zip(eager, leaves):
        np.testing.assert_allclose(t.grad.numpy(), e, rtol=1e-12)
    assert compiler.counters.compiled_runs == 1 and not compiler.counters.fallbacks


def test_non_reentrant_checkpoint_compiles() -> None:
    """Checkpointing without reentrance packs through saved-tensor hooks: the program
    recomputes what they stand for from the recording of the forward (no unpack step)."""
    fg.manual_seed(0)
    lin1, lin2 = fg.nn.Linear(4, 8).double(), fg.nn.Linear(8, 3).double()

    def block(x: fg.Tensor) -> fg.Tensor:
        return lin2(fg.tanh(lin1(x)))

    x = fg.randn(5, 4, dtype=fg.float64, requires_grad=True)
    block(x).pow(2).sum().backward()
    eager = [p.grad.numpy().copy() for p in (x, lin1.weight, lin2.bias)]
    for _ in range(2):
        for p in (x, lin1.weight, lin1.bias, lin2.weight, lin2.bias):
            p.grad = None
        with compiler.compiled_autograd():
            checkpoint(block, x, use_reentrant=False).pow(2).sum().backward()
        for e, p in zip(eager, (x, lin1.weight, lin2.bias)):
            np.testing.assert_allclose(p.grad.numpy(), e, rtol=1e-12, atol=1e-14)
    assert not compiler.counters.fallbacks
    assert compiler.counters.compiled_runs >= 2


def test_an_unpack_hook_returning_another_shape_is_refused() -> None:
    x, w, b = _leaves()
    with saved_tensors_hooks(lambda t: t.detach(), lambda t: t[:1]):
        y = (x * w.sum()).sum()
    with pytest.raises(RuntimeError, match=r"unpack hook .* returned a float64 tensor of shape"):
        with compiler.compiled_autograd():
            y.backward()


def test_a_second_backward_through_freed_packed_tensors_raises_eagers_error() -> None:
    x, w, b = _leaves()
    hooks = _Logged()
    with saved_tensors_hooks(hooks.pack, hooks.unpack):
        y = (x.exp() * x).sum()
    with compiler.compiled_autograd():
        y.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            y.backward()


def test_retain_graph_lets_the_program_unpack_again() -> None:
    x, w, b = _leaves()
    hooks = _Logged()
    with saved_tensors_hooks(hooks.pack, hooks.unpack):
        y = (x.exp() * x).sum()
    with compiler.compiled_autograd():
        y.backward(retain_graph=True)
        first = x.grad.numpy().copy()
        y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first)
    assert len(hooks.log) == 2 * hooks.packed
    assert compiler.counters.compiled_runs == 2
