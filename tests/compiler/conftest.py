"""Compiler tests share the op table of tests/ops, the ``fresh_compiler`` fixture, and a whole
step whose kernels are over ``service.GENERATED_ABOVE`` elements (``larger_kernels_step``)."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "ops"))


@pytest.fixture
def fresh_compiler() -> Iterator[None]:
    """Empty program caches and counters, and the IR verified after every pass."""
    compiler.reset()
    compiler._debug.check = True
    yield
    compiler._debug.check = False
    compiler.reset()


@pytest.fixture
def larger_kernels_step() -> Callable[[bool], tuple]:
    """``run(compiled)``: a linear layer, tanh * sigmoid and a square-sum loss over 64 x 128 =
    8,192 elements per elementwise kernel (over ``service.GENERATED_ABOVE``, under the
    interpreter's limit), trained with SGD for enough steps to end a ``Trial`` after the
    background compile (waited for at the fourth call); the losses and the final parameters."""
    from fusegrad.compiler import service

    def run(compiled: bool) -> tuple:
        rng = np.random.default_rng(13)
        w = fg.tensor(rng.standard_normal((32, 128)) / 6, requires_grad=True)
        b = fg.tensor(rng.standard_normal(128) / 6, requires_grad=True)
        opt = fg.optim.SGD([w, b], lr=0.05, momentum=0.9)

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            h = x @ w + b
            loss = (h.tanh() * h.sigmoid()).square().sum()
            loss.backward()
            opt.step()
            return loss

        fn = fg.compile(step) if compiled else step
        losses = []
        for i in range(2 * (service.Trial.RUNS + 1) + 6):
            if compiled and i == 3:
                assert compiler.wait_for_compiles(300)
            losses.append(fn(fg.tensor(rng.standard_normal((64, 32)))).item())
        return losses, w.detach().numpy(), b.detach().numpy()

    return run
