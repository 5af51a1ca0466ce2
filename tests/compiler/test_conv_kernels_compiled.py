"""The convolution and pooling primitives (externs in compiled programs: the kernels of
``ops/conv_kernels.py`` called between fused loops) under the three front ends: a whole
training step of a small CNN (``compile(step)``), a compiled backward (``compiled_autograd()``)
and a compiled module (``compile(model)``) give eager's values and gradients, with the captures
and replays counted.  (Compiles run in the foreground: tests/conftest.py sets
FUSEGRAD_BACKGROUND_COMPILE=0.)"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import compiler, nn
from fusegrad.autograd import tracer

pytestmark = pytest.mark.usefixtures("fresh_compiler")


class _Net(nn.Module):
    """The MNIST example's layers, small, plus a transposed convolution, average and adaptive
    pooling: every kind of window the kernels have."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1, groups=2)
        self.up = nn.ConvTranspose2d(6, 3, 3, stride=2, padding=1, output_padding=1)
        self.conv3 = nn.Conv1d(3, 2, 3, padding=1, padding_mode="reflect")
        self.fc = nn.Linear(2 * 25, 10)

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.avg_pool2d(self.up(x), 2, ceil_mode=True, count_include_pad=False)
        x = F.adaptive_avg_pool2d(F.adaptive_max_pool2d(x, (6, 6)), (5, 5))
        x = self.conv3(x.flatten(2))
        return F.log_softmax(self.fc(x.flatten(1)), 1)


def _batches(count: int, batch: int = 4) -> list:
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((batch, 1, 14, 14)), rng.integers(0, 10, batch)) for _ in range(count)
    ]


def test_training_step_compiles_and_matches_eager() -> None:
    """compile(step) of forward, backward and Adadelta (the MNIST example's optimiser): equal
    losses and parameters, the kernels inside the recorded step, later calls replaying it."""
    fg.manual_seed(0)
    eager = _Net().double()
    comp = copy.deepcopy(eager)

    def make_step(model: nn.Module) -> Callable:
        opt = fg.optim.Adadelta(model.parameters(), lr=1.0)

        def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    class Recorder(tracer.Tracer):
        names: set = set()

        def apply(self, prim, inputs, attrs):  # type: ignore[no-untyped-def]
            Recorder.names.add(prim.name)
            return NotImplemented

    losses = []
    for step in (make_step(eager), fg.compile(make_step(comp))):
        losses.append([step(fg.tensor(x), fg.tensor(y)).item() for x, y in _batches(4)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-10, atol=1e-12)
    for (name, p), q in zip(comp.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-11, err_msg=name
        )
    counters = compiler.counters
    assert not counters.step_breaks, counters.step_breaks
    assert counters.step_captures == 1, counters
    assert counters.step_runs >= 2, counters
    # the eager step reaches the kernels (so the compiled one recorded them as externs)
    with tracer.tracing(Recorder()):
        make_step(copy.deepcopy(eager))(*(fg.tensor(a) for a in _batches(1)[0]))
    assert {"convolution", "pool_take", "convolution_backward_input", "pool_scatter"} <= (
        Recorder.names
    )


def test_compiled_backward_matches_eager() -> None:
    """compiled_autograd(): the backward kernels as externs give eager's gradients, captured
    once, replayed for a new batch size too."""
    fg.manual_seed(0)
    model = _Net()
    rng = np.random.default_rng(1)

    def grads(x: np.ndarray, compiled: bool) -> list:
        model.zero_grad()
        xt = fg.tensor(x, requires_grad=True)
        loss = (model(xt) ** 2).sum()
        if compiled:
            with compiler.compiled_autograd():
                loss.backward()
        else:
            loss.backward()
        return [xt.grad.numpy()] + [p.grad.numpy().copy() for p in model.parameters()]

    for batch in (3, 3, 5):
        x = rng.standard_normal((batch, 1, 14, 14)).astype(np.float32)
        want = grads(x, False)
        got = grads(x, True)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not compiler.counters.fallbacks, compiler.counters
    assert compiler.counters.compiled_runs == 3, compiler.counters


def test_compiled_module_matches_eager() -> None:
    """compile(model): the forward program and the backward program (the kernels as externs)
    give eager's outputs and gradients."""
    fg.manual_seed(0)
    eager = _Net().double()
    comp = fg.compile(copy.deepcopy(eager))
    for x, _ in _batches(3, batch=2):
        results = []
        for model in (eager, comp):
            model.zero_grad()
            out = model(fg.tensor(x))
            (out * out).sum().backward()
            results.append([out.detach().numpy()] + [p.grad.numpy() for p in model.parameters()])
        for a, b in zip(*results):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert not compiler.counters.fallbacks, compiler.counters
