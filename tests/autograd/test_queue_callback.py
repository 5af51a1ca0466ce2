"""engine.queue_callback: end-of-backward callbacks (what DistributedDataParallel waits in)."""

from __future__ import annotations

import pytest

import fusegrad as fg
from fusegrad.autograd import engine


def test_callback_runs_after_every_node_and_before_backward_returns() -> None:
    w = fg.tensor([1.0, 2.0], requires_grad=True)
    b = fg.tensor([3.0], requires_grad=True)
    events: list = []

    def on_w(p: fg.Tensor) -> None:
        events.append("w")
        engine.queue_callback(lambda: events.append(("end", b.grad is not None)))

    w.register_post_accumulate_grad_hook(on_w)
    b.register_post_accumulate_grad_hook(lambda p: events.append("b"))
    ((w * 2).sum() + b.sum()).backward()
    assert events[-1] == ("end", True)  # after b's gradient, whichever leaf came last
    assert sorted(events[:-1]) == ["b", "w"]


def test_callback_may_queue_another_and_each_call_has_its_own_queue() -> None:
    x = fg.tensor(2.0, requires_grad=True)
    ran: list = []

    def hook(p: fg.Tensor) -> None:
        def first() -> None:
            ran.append(1)
            engine.queue_callback(lambda: ran.append(2))

        engine.queue_callback(first)

    x.register_post_accumulate_grad_hook(hook)
    (x * x).backward()
    assert ran == [1, 2]
    (x * 3).backward()
    assert ran == [1, 2, 1, 2]


def test_queue_callback_outside_backward_raises() -> None:
    with pytest.raises(RuntimeError, match="no backward is running"):
        engine.queue_callback(lambda: None)


def test_failing_callback_propagates_from_backward() -> None:
    x = fg.tensor(1.0, requires_grad=True)

    def boom() -> None:
        raise ValueError("boom")

    x.register_post_accumulate_grad_hook(lambda p: engine.queue_callback(boom))
    with pytest.raises(ValueError, match="boom"):
        (x * 2).backward()
    assert engine.current_graph_task_id() == -1  # the task was left
