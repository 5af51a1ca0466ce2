"""A compiled module's backward hands the engine its parameters' gradients in arrays of their
own (``Program.fresh_outputs``, ``engine.give``): a parameter whose ``.grad`` is unset takes
such a gradient as it is, without the engine's defensive copy, as PyTorch steals a gradient no
one else references.  Everything that could see the same array elsewhere still gets a copy:
one value that is two inputs' gradient, a hook on the parameter, an accumulation into an
existing ``.grad``, ``create_graph``; and the values are eager's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import storage
from fusegrad.autograd import engine

pytestmark = pytest.mark.usefixtures("fresh_compiler")


class _Net(fg.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = fg.nn.Parameter(fg.tensor(np.linspace(0.5, 1.5, 12).reshape(3, 4)))
        self.b = fg.nn.Parameter(fg.tensor(np.linspace(-1.0, 1.0, 4)))
        self.c = fg.nn.Parameter(fg.tensor(np.linspace(-1.0, 1.0, 4)))

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        # b and c get one and the same gradient value: never handed out as one array twice
        return ((x @ self.a).tanh() + self.b + self.c).square().sum()


def _copies(monkeypatch: pytest.MonkeyPatch) -> list:
    made: list = []
    original = storage.copy

    def counting(*args: Any, **kwargs: Any) -> Any:
        made.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(storage, "copy", counting)
    return made


def _run(net: Any, x: fg.Tensor, steps: int) -> list:
    for _ in range(steps):
        net(x).backward()
    return [p.grad.numpy().copy() for p in (net.a, net.b, net.c)]


def test_parameters_take_the_programs_gradients_without_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = fg.tensor(np.random.default_rng(0).standard_normal((5, 3)))
    eager = _Net()
    want = _run(eager, x, 1)
    model = _Net()
    compiled = fg.compile(model)
    compiled(x).backward()  # (records and compiles)
    for p in model.parameters():
        p.grad = None
    made = _copies(monkeypatch)
    got = _run(compiled, x, 1)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    # a's gradient was taken as it is; b and c share one value, so each got a copy
    assert (3, 4) not in made and made.count((4,)) == 2
    model.b.grad.add_(1.0)
    np.testing.assert_allclose(model.c.grad.numpy(), want[2], rtol=1e-12)  # (not aliased)
    # the next backward accumulates into the taken arrays (the program made new ones)
    got = _run(compiled, x, 1)
    np.testing.assert_allclose(got[0], 2 * want[0], rtol=1e-12)


def test_a_hook_on_the_parameter_keeps_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor hook may keep the gradient it is given: the ``.grad`` must not be that array."""
    x = fg.tensor(np.random.default_rng(1).standard_normal((5, 3)))
    model = _Net()
    compiled = fg.compile(model)
    compiled(x).backward()
    kept: list = []
    model.a.register_hook(lambda g: kept.append(g))
    for p in model.parameters():
        p.grad = None
    compiled(x).backward()
    assert kept and not np.shares_memory(kept[-1].numpy(), model.a.grad.numpy())


def test_only_a_given_tensor_is_taken_and_only_once() -> None:
    t = fg.ones(3)
    engine.give(t)
    assert engine._taken(t) and not engine._taken(t)
    u = fg.ones(3)
    assert not engine._taken(u)
    engine.give(u)
    key = id(u)
    del u
    assert key not in engine._given  # (dropped with the tensor)
