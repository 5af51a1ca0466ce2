"""User hooks in compiled backward: opaque calls at their eager positions (a hook is a kernel
boundary), same order, same replacement semantics, same .grad states seen by the hooks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler

pytestmark = pytest.mark.usefixtures("fresh_compiler")


def _both(program: Callable[[list], tuple]) -> tuple:
    """Run ``program(log)`` eagerly and compiled; return (eager, compiled) (log, grads)."""
    results = []
    for compiled in (False, True):
        log: list = []
        leaves, loss = program(log)
        if compiled:
            with compiler.compiled_autograd(fullgraph=True):
                loss.backward()
        else:
            loss.backward()
        results.append((log, [None if t.grad is None else t.grad.numpy().copy() for t in leaves]))
    return results[0], results[1]


def _check(eager: tuple, compiled: tuple) -> None:
    assert eager[0] == compiled[0]
    for e, c in zip(eager[1], compiled[1]):
        assert (e is None) == (c is None)
        if e is not None:
            np.testing.assert_allclose(c, e, rtol=1e-12, atol=1e-12)


def _x(values: tuple = (0.5, -1.0, 2.0)) -> fg.Tensor:
    return fg.tensor(list(values), dtype=fg.float64, requires_grad=True)


def test_tensor_hooks_replace_gradients_in_registration_order() -> None:
    def program(log: list) -> tuple:
        x, w = _x(), _x((1.5, 0.25, -0.5))
        y = x * w
        y.register_hook(lambda g: log.append(("y1", g.numpy().round(6).tolist())) or g * 3)
        y.register_hook(lambda g: log.append(("y2", g.numpy().round(6).tolist())))
        x.register_hook(lambda g: g + 1)
        return [x, w], y.tanh().sum()

    _check(*_both(program))
    assert compiler.counters.captures == 1 and not compiler.counters.fallbacks


def test_node_pre_and_post_hooks_and_post_accumulate_order() -> None:
    def program(log: list) -> tuple:
        x = _x()
        a = x.exp()
        b = a * x
        b.grad_fn.register_prehook(lambda go: (log.append("pre"), (go[0] * 2,))[1])
        b.grad_fn.register_hook(lambda gi, go: log.append(("post", len(gi))))
        x.register_post_accumulate_grad_hook(
            lambda t: log.append(("acc", float(t.grad.sum().item())))
        )
        return [x], b.sum()

    eager, compiled = _both(program)
    _check(eager, compiled)
    assert [e if isinstance(e, str) else e[0] for e in eager[0]] == ["pre", "post", "acc"]


def test_retain_grad_in_compiled_backward() -> None:
    x = _x()
    y = x.sin()
    y.retain_grad()
    with compiler.compiled_autograd(fullgraph=True):
        (y * y).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), 2 * np.sin(x.detach().numpy()))
    np.testing.assert_allclose(x.grad.numpy(), np.sin(2 * x.detach().numpy()))


def test_fresh_lambdas_each_step_reuse_the_program() -> None:
    x = _x()
    for step in range(4):
        x.grad = None
        y = (x * x).exp()
        y.register_hook(lambda g, k=step: g * (k + 1))
        with compiler.compiled_autograd():
            y.sum().backward()
        expected = (step + 1) * np.exp(x.detach().numpy() ** 2) * 2 * x.detach().numpy()
        np.testing.assert_allclose(x.grad.numpy(), expected)
    assert compiler.counters.captures == 1
    assert compiler.counters.cache_hits == 3


def test_a_hook_count_change_recaptures() -> None:
    x = _x()
    grads = []
    with compiler.compiled_autograd():
        for with_hook in (False, True, False):
            x.grad = None
            h = x.register_hook(lambda g: g * 10) if with_hook else None
            (x * 2).sum().backward()
            grads.append(x.grad.numpy()[0])
            if h is not None:
                h.remove()
    assert grads == [2.0, 20.0, 2.0]
    assert compiler.counters.captures == 2  # without hook, with hook; the third hits the first


def test_hooks_see_grad_states_in_eager_order() -> None:
    # a post-accumulate hook on w reads x.grad: x's accumulation must already have happened if
    # it did in eager mode (the hook is a barrier; writes happen at their eager positions)
    def program(log: list) -> tuple:
        x, w = _x(), _x((1.0, 2.0, 3.0))
        w.register_post_accumulate_grad_hook(
            lambda t: log.append(None if x.grad is None else x.grad.numpy().round(6).tolist())
        )
        return [x, w], (x.exp() * w).sum()

    _check(*_both(program))


def test_hooks_removed_during_backward_as_eager() -> None:
    """A site's hooks are read when its first hook runs (the engine's snapshot): a hook that
    removes a later hook of its own tensor does not stop it this time; a pre-hook removing a
    hook of a site that runs later does."""

    def program(log: list) -> tuple:
        x, w = _x(), _x((1.5, 0.25, -0.5))
        y = x * w
        handles: dict = {}

        def remove_b(g: fg.Tensor) -> None:
            log.append("a")
            handles["b"].remove()

        y.register_hook(remove_b)
        handles["b"] = y.register_hook(lambda g: log.append("b"))

        def remove_self(g: fg.Tensor) -> None:
            log.append("self")
            handles["self"].remove()

        handles["self"] = y.register_hook(remove_self)

        def remove_acc(grad_outputs: tuple) -> None:
            log.append("pre")
            handles["acc"].remove()

        y.grad_fn.register_prehook(remove_acc)
        handles["acc"] = x.register_post_accumulate_grad_hook(lambda t: log.append("acc"))
        return [x, w], y.sum()

    eager, compiled = _both(program)
    assert eager[0] == ["a", "b", "self", "pre"]
    _check(eager, compiled)


def test_post_hook_results_are_checked_as_eager() -> None:
    """A post hook's gradient of another shape: summed to the input's shape when it can be
    (as the engine does), eager's error otherwise; one dropped (None): refused with a clear
    error, never computed on."""

    def summable(log: list) -> tuple:
        a, b = _x(), _x((1.5, 0.25, -0.5))
        y = a * b
        y.grad_fn.register_hook(lambda gi, go: (gi[0], fg.ones(2, 3, dtype=fg.float64)))
        return [a, b], y.sum()

    _check(*_both(summable))

    for bad, match in (
        (fg.ones(2, 2, dtype=fg.float64), "MulBackward0 returned an invalid gradient at index 1"),
        (None, "returned None for the gradient at index 1"),
    ):
        a, b = _x(), _x((1.5, 0.25, -0.5))
        y = a * b
        y.grad_fn.register_hook(lambda gi, go, bad=bad: (gi[0], bad))
        with pytest.raises(RuntimeError, match=match):
            with compiler.compiled_autograd():
                y.sum().backward()


def test_hooks_may_queue_callbacks_in_compiled_backward() -> None:
    """``engine.queue_callback`` from a hook of a compiled backward (as DDP's post-accumulate
    hooks do): the callback runs once the program has finished, before backward() returns."""
    from fusegrad.autograd import engine

    def program(log: list) -> tuple:
        x, w = _x(), _x((1.5, 0.25, -0.5))

        def on_x(p: fg.Tensor) -> None:
            log.append("x")
            engine.queue_callback(lambda: log.append(("end", w.grad is not None)))

        x.register_post_accumulate_grad_hook(on_x)
        w.register_post_accumulate_grad_hook(lambda p: log.append("w"))
        return [x, w], (x * w).sum()

    eager, compiled = _both(program)
    assert eager[0][-1] == ("end", True) and sorted(eager[0][:-1]) == ["w", "x"]
    _check(eager, compiled)
