"""Backward hooks: the order per node, replacing gradients, handles and their removal."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg


def _hook_order_log(lib) -> list:
    log: list = []
    x = lib.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2.0
    z = y.sum()
    y.register_hook(lambda g: log.append("y.tensor_hook1"))
    y.retain_grad()
    y.register_hook(lambda g: log.append("y.tensor_hook2"))
    y.grad_fn.register_prehook(lambda go: log.append("y.node_prehook"))
    y.grad_fn.register_hook(lambda gi, go: log.append("y.node_posthook"))
    x.register_hook(lambda g: log.append("x.tensor_hook"))
    acc = y.grad_fn.next_functions[0][0]
    acc.register_prehook(lambda go: log.append("acc.prehook"))
    acc.register_hook(lambda gi, go: log.append(("acc.posthook", len(gi), len(go))))
    x.register_post_accumulate_grad_hook(
        lambda t: log.append(("x.post_accumulate", t.grad is not None))
    )
    z.backward()
    return log


EXPECTED_ORDER = [
    "y.tensor_hook1",
    "y.tensor_hook2",
    "y.node_prehook",
    "y.node_posthook",
    "x.tensor_hook",
    "acc.prehook",
    ("x.post_accumulate", True),
    ("acc.posthook", 0, 1),
]


def test_hook_order_per_node() -> None:
    assert _hook_order_log(fg) == EXPECTED_ORDER


def test_hook_order_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    assert _hook_order_log(torch) == EXPECTED_ORDER


def test_retain_grad_runs_after_tensor_hooks_and_before_pre_hooks() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    seen: list = []
    y.register_hook(lambda g: g + 1.0)
    y.retain_grad()
    y.grad_fn.register_prehook(lambda go: seen.append(y.grad.numpy().copy()))
    y.sum().backward()
    np.testing.assert_array_equal(seen[0], [2.0, 2.0])


def test_tensor_hooks_chain_in_registration_order() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    y.register_hook(lambda g: g * 2.0)
    y.register_hook(lambda g: g + 1.0)  # sees the doubled gradient
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])
    x.grad = None
    x.register_hook(lambda g: g * 10.0)
    (x * 1.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [10.0, 10.0])


def test_node_pre_hook_can_replace_incoming_gradients() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3.0
    y.grad_fn.register_prehook(lambda go: (go[0] * 0.5,))
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.5, 1.5])


def test_node_post_hook_sees_inputs_and_outputs_and_can_replace() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3.0
    seen: list = []

    def post(grad_inputs, grad_outputs):
        seen.append((grad_inputs[0].numpy().copy(), grad_outputs[0].numpy().copy()))
        return (grad_inputs[0] + 1.0, grad_inputs[1])

    y.grad_fn.register_hook(post)
    y.sum().backward()
    np.testing.assert_array_equal(seen[0][0], [3.0, 3.0])
    np.testing.assert_array_equal(seen[0][1], [1.0, 1.0])
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0])


def test_handles_remove_hooks() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    calls: list = []
    handles = [
        x.register_hook(lambda g: calls.append("tensor")),
        x.register_post_accumulate_grad_hook(lambda t: calls.append("post_acc")),
    ]
    y = x * 2.0
    handles.append(y.grad_fn.register_prehook(lambda go: calls.append("pre")))
    handles.append(y.grad_fn.register_hook(lambda gi, go: calls.append("post")))
    y.sum().backward(retain_graph=True)
    assert sorted(calls) == ["post", "post_acc", "pre", "tensor"]
    for h in handles:
        h.remove()
        h.remove()  # idempotent
    calls.clear()
    y.sum().backward()
    assert calls == []


def test_handle_as_context_manager() -> None:
    x = fg.tensor([1.0], requires_grad=True)
    calls: list = []
    with x.register_hook(lambda g: calls.append(1)):
        (x * 1.0).sum().backward()
    (x * 1.0).sum().backward()
    assert calls == [1]


def test_hook_removed_during_backward_does_not_run_later() -> None:
    x = fg.tensor([1.0], requires_grad=True)
    calls: list = []
    h = x.exp()
    later = {}

    def remover(g):
        calls.append("remover")
        later["handle"].remove()

    h.register_hook(remover)
    later["handle"] = x.register_hook(lambda g: calls.append("removed"))
    h.sum().backward()
    assert calls == ["remover"]


def test_wrong_hook_results_are_errors() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    y.register_hook(lambda g: fg.ones(3))
    with pytest.raises(RuntimeError, match="has changed the size of value"):
        y.sum().backward()
    z = x * 1.0
    z.register_hook(lambda g: g.numpy())
    with pytest.raises(TypeError, match="expected a Tensor or None"):
        z.sum().backward()
    w = x * 1.0
    w.register_hook(lambda g: g.to(fg.float64))
    with pytest.raises(RuntimeError, match="has changed the type of value"):
        w.sum().backward()


def test_hook_on_a_tensor_without_requires_grad_is_an_error() -> None:
    t = fg.ones(2)
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        t.register_hook(lambda g: None)
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        t.register_post_accumulate_grad_hook(lambda g: None)
    x = fg.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="non-leaf"):
        (x * 2.0).register_post_accumulate_grad_hook(lambda t: None)


def test_hooks_bind_to_the_grad_fn_current_at_registration() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    calls: list = []
    y.register_hook(lambda g: calls.append(("old", g.numpy().copy())))
    y.mul_(3.0)
    y.register_hook(lambda g: calls.append(("new", g.numpy().copy())))
    (y * 2.0).sum().backward()
    assert [c[0] for c in calls] == ["new", "old"]
    np.testing.assert_array_equal(calls[0][1], [2.0, 2.0])
    np.testing.assert_array_equal(calls[1][1], [6.0, 6.0])


def test_post_accumulate_grad_hook_sees_the_updated_grad() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    seen: list = []
    x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.numpy().copy()))
    (x * 2.0).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(seen[0], [2.0, 2.0])
    np.testing.assert_array_equal(seen[1], [5.0, 5.0])


def test_an_exception_in_a_hook_propagates_and_restores_grad_mode() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2.0

    def bad(g):
        raise KeyError("from hook")

    y.register_hook(bad)
    s = y.sum()
    with pytest.raises(KeyError, match="from hook"):
        s.backward(create_graph=True)
    assert fg.is_grad_enabled()
    with fg.no_grad():
        with pytest.raises(KeyError):
            s.backward(create_graph=True)
        assert not fg.is_grad_enabled()
    assert x.grad is None
