"""compiler/logs.py: channels, events counted instead of printed every step, and an unknown
channel in ``FUSEGRAD_LOGS`` warned about and ignored."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad import compiler
from fusegrad.compiler import logs

pytestmark = pytest.mark.usefixtures("fresh_compiler")


@pytest.fixture
def log_lines(caplog: Any) -> Iterator[Any]:
    """The ``fusegrad.compiler`` records, with every channel off again afterwards."""
    with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
        try:
            yield caplog
        finally:
            compiler.set_logs(None)


def _messages(caplog: Any, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_counted_event_is_printed_the_first_time_and_at_each_power_of_ten(
    log_lines: Any,
) -> None:
    compiler.set_logs("cache")
    for _ in range(1234):
        logs.log_counted("cache", "event", "something happened")
    lines = _messages(log_lines, "something happened")
    assert len(lines) == 4, lines  # the 1st, 10th, 100th and 1,000th
    assert "repeats are counted" in lines[0]
    assert [re.search(r"the ([\d,]+)th time", line)[1] for line in lines[1:]] == [
        "10",
        "100",
        "1,000",
    ]


def test_counts_are_per_key_and_nothing_is_counted_while_the_channel_is_off(
    log_lines: Any,
) -> None:
    compiler.set_logs("graph")  # "cache" off: these are neither printed nor counted
    for _ in range(9):
        logs.log_counted("cache", "a", "event a")
    compiler.set_logs("cache")
    logs.log_counted("cache", "a", "event a")  # the first while the channel is on
    for _ in range(10):
        logs.log_counted("cache", "b", "event b")
    assert len(_messages(log_lines, "event a")) == 1
    assert "repeats are counted" in _messages(log_lines, "event a")[0]
    assert len(_messages(log_lines, "event b")) == 2  # b's own 1st and 10th
    compiler.set_logs("cache")  # counts start again
    logs.log_counted("cache", "b", "event b")
    assert "repeats are counted" in _messages(log_lines, "event b")[-1]


def test_steady_state_cache_hits_do_not_print_a_line_per_step(log_lines: Any) -> None:
    compiler.set_logs("all")
    w = fg.randn(8, 3, requires_grad=True)
    x = fg.randn(5, 8)
    with compiler.compiled_autograd():
        for _ in range(30):
            w.grad = None
            (x @ w).tanh().sum().backward()
    assert compiler.counters.cache_hits == 29  # one capture, then hits
    hits = _messages(log_lines, "program cache hit")
    # each kind of hit (found by a graph walk or through the tape) logs its 1st and 10th
    assert 1 <= len(hits) <= 4, hits
    assert any("repeats are counted" in line for line in hits)
    assert any("the 10th time" in line for line in hits)  # 29 hits of at most two kinds


def test_whole_step_replays_are_counted_on_the_cache_channel(log_lines: Any) -> None:
    compiler.set_logs("cache")
    model = nn.Linear(4, 2)
    opt = fg.optim.SGD(model.parameters(), lr=0.1)
    x, y = fg.randn(3, 4), fg.randint(0, 2, (3,))

    @fg.compile
    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(13):
        step(x, y)
    replays = compiler.counters.step_runs
    assert replays >= 10
    lines = _messages(log_lines, "whole step replayed")
    assert len(lines) == 2 and "the 10th time" in lines[1], lines


def test_an_unknown_channel_in_the_environment_warns_and_is_ignored(
    log_lines: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FUSEGRAD_LOGS", "recompiles,nonsense")
    with pytest.warns(UserWarning, match=r"unknown log channels \['nonsense'\] ignored") as w:
        logs._set_logs_from_environment()
    assert "graph, fusion, output_code, recompiles, cache, perf, fallback" in str(w[0].message)
    assert logs.enabled("recompiles") and not logs.enabled("nonsense")
    x = fg.randn(4, requires_grad=True)
    with compiler.compiled_autograd():  # compiles, and logs the channel that is known
        x.exp().sum().backward()
    assert _messages(log_lines, "capture #1")


def test_set_logs_in_code_still_raises_on_an_unknown_channel() -> None:
    with pytest.raises(ValueError, match="unknown log channels.*choose from"):
        compiler.set_logs("graph,nonsense")


def test_key_differences_are_described_for_every_kind_of_entry() -> None:
    """``cache.describe_difference`` (the ``recompiles`` log's words) never raises on entries
    that are not primitive nodes: a node past grad()'s inputs, a short entry, attributes that
    are no (name, value) pairs."""
    from fusegrad.compiler.cache import describe_difference

    unrun = describe_difference(3, ("unrun", "A", 1), ("unrun", "B", 1))
    assert "does not run" in unrun and "A" in unrun and "B" in unrun
    assert describe_difference(0, ("checkpoint", 1), ("checkpoint", 2)) == "checkpoint node changed"
    odd = describe_difference(0, ("f", "xyz", 0, 0, 0, 0), ("f", "xz", 0, 0, 0, 0))
    assert "xyz" in odd and "xz" in odd
    pairs = describe_difference(
        0, ("add", (("a", 1),), 0, 0, 0, 0), ("add", (("a", 2),), 0, 0, 0, 0)
    )
    assert "{'a': 1} -> {'a': 2}" in pairs
