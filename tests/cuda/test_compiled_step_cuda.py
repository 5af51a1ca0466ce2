"""Whole steps (``fusegrad.compile(fn)``) and compiled modules (``fusegrad.compile(model)``) of
CUDA tensors, in numba's simulator: the recording is the CPU's, the program is built for the
device (generated CUDA kernels, the eager CUDA kernels as externs), and every replay gives what
eager gives on the CPU, to float32 rounding."""

from __future__ import annotations

from typing import Any

import modes
import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn

modes.require_device()

from test_compiled_cuda import _Transfers  # noqa: E402  (after the device check)

TOL = {"rtol": 2e-5, "atol": 2e-6}


@pytest.fixture(autouse=True)
def _foreground() -> Any:
    """Compiles in the foreground (a CUDA program always does; the CPU twins too)."""
    compiler.reset()
    before = compiler.config.background_compile
    compiler.config.background_compile = False
    yield
    compiler.config.background_compile = before


def _mlp(device: str, seed: int = 0) -> nn.Module:
    fg.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to(device)


def _classifier_step(device: str) -> tuple[nn.Module, Any]:
    model = _mlp(device)
    opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)

    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, step


def _step_programs(fn: Any) -> list:
    """The programs of compiled step ``fn``'s recordings."""
    return [program for entry in fn.entries.values() for program in entry.programs.programs()]


def _assert_same(cuda: nn.Module, cpu: nn.Module) -> None:
    for (name, a), (_, b) in zip(cuda.state_dict().items(), cpu.state_dict().items()):
        assert a.is_cuda, name
        np.testing.assert_allclose(a.cpu().numpy(), b.numpy(), **TOL, err_msg=name)


def test_a_cuda_training_step_replays_as_one_device_program() -> None:
    """Recorded once, replayed by a CUDA program: the losses and parameters after every step
    are the CPU's, and ``explain`` describes one launch sequence."""
    rng = np.random.default_rng(0)
    cuda_model, cuda_step = _classifier_step("cuda")
    cpu_model, cpu_step = _classifier_step("cpu")
    compiled = fg.compile(cuda_step)
    for _ in range(5):
        x = rng.standard_normal((5, 6)).astype(np.float32)
        y = rng.integers(0, 3, 5)
        loss = compiled(fg.tensor(x, device="cuda"), fg.tensor(y, device="cuda"))
        want = cpu_step(fg.tensor(x), fg.tensor(y))
        assert loss.is_cuda
        np.testing.assert_allclose(loss.item(), want.item(), **TOL)
        _assert_same(cuda_model, cpu_model)
    # (the first call makes SGD's momentum eagerly, the second records: three replays)
    assert compiler.counters.step_runs == 3 and not compiler.counters.step_breaks
    programs = _step_programs(compiled)
    assert programs and all(p.device == "cuda" for p in programs)
    report = str(
        compiler.explain(compiled, fg.tensor(x, device="cuda"), fg.tensor(y, device="cuda"))
    )
    assert "cuda: one launch sequence per call" in report, report
    # the class targets' range check reads them on the host before the program, as eager does
    assert "value check(s)" in report and "read on the host" in report, report


def test_a_cuda_step_without_value_checks_moves_nothing_between_host_and_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A regression step (no index to check): once recorded and compiled, a replay reads
    nothing back from the device and uploads nothing -- the learning rate and momentum are
    scalars uploaded once -- and never waits for the device."""
    rng = np.random.default_rng(1)
    model = _mlp("cuda")
    cpu_model = _mlp("cpu")
    opts = [
        fg.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True)
        for m in (model, cpu_model)
    ]

    def step(m: nn.Module, opt: Any, x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    compiled = fg.compile(step)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    y = rng.standard_normal((4, 3)).astype(np.float32)
    xs, ys = fg.tensor(x, device="cuda"), fg.tensor(y, device="cuda")
    transfers = _Transfers(monkeypatch)
    for call in range(5):
        transfers.watching = call >= 3  # (call 1 records, call 2 compiles and uploads constants)
        compiled(model, opts[0], xs, ys)
        transfers.watching = False
        step(cpu_model, opts[1], fg.tensor(x), fg.tensor(y))
    assert compiler.counters.step_runs == 3
    assert transfers.counts == {"to host": 0, "to device": 0, "synchronize": 0}
    _assert_same(model, cpu_model)


def test_a_cuda_step_with_in_place_writes_and_a_grad_that_exists() -> None:
    """BatchNorm's running statistics are in-place writes (``write`` effects: device copies into
    the buffers, versions bumped as eager bumps them); ``.grad`` kept between calls (no
    ``zero_grad``: the program adds into it on the device)."""
    rng = np.random.default_rng(2)

    def make(device: str) -> tuple[nn.Module, Any]:
        fg.manual_seed(3)
        model = nn.Sequential(nn.Linear(6, 8, bias=False), nn.BatchNorm1d(8), nn.Tanh())
        model.to(device)
        opt = fg.optim.SGD(model.parameters(), lr=0.02)

        def step(x: fg.Tensor) -> fg.Tensor:
            loss = model(x).pow(2).mean()
            loss.backward()  # (accumulates: .grad is never cleared)
            opt.step()
            return loss

        return model, step

    cuda_model, cuda_step = make("cuda")
    cpu_model, cpu_step = make("cpu")
    compiled = fg.compile(cuda_step)
    versions = []
    for _ in range(4):
        x = rng.standard_normal((5, 6)).astype(np.float32)
        compiled(fg.tensor(x, device="cuda"))
        cpu_step(fg.tensor(x))
        versions.append((cuda_model[1].running_mean._version, cpu_model[1].running_mean._version))
        _assert_same(cuda_model, cpu_model)
        for p, q in zip(cuda_model.parameters(), cpu_model.parameters()):
            np.testing.assert_allclose(p.grad.cpu().numpy(), q.grad.numpy(), **TOL)
    assert compiler.counters.step_runs >= 2 and not compiler.counters.step_breaks
    # (``.to("cuda")`` made the buffers anew: the versions differ by a constant)
    assert len({a - b for a, b in versions}) == 1, versions


def test_a_compiled_cuda_module_runs_forward_and_backward_programs_on_the_device() -> None:
    """``compile(model)``: the forward program and the backward program both run on the device;
    the gradients, parameters and buffers after each SGD step are the CPU's."""
    rng = np.random.default_rng(3)

    def make(device: str) -> nn.Module:
        fg.manual_seed(4)
        return nn.Sequential(
            nn.Linear(6, 8, bias=False), nn.BatchNorm1d(8), nn.GELU(), nn.Linear(8, 2)
        ).to(device)

    cuda_model, cpu_model = make("cuda"), make("cpu")
    compiled = fg.compile(cuda_model)
    opts = [fg.optim.SGD(m.parameters(), lr=0.05) for m in (cuda_model, cpu_model)]
    for _ in range(3):
        x = rng.standard_normal((5, 6)).astype(np.float32)
        for model, opt, device in ((compiled, opts[0], "cuda"), (cpu_model, opts[1], "cpu")):
            opt.zero_grad()
            out = model(fg.tensor(x, device=device))
            assert out.is_cuda == (device == "cuda")
            (out.tanh() * out).sum().backward()
            opt.step()
        _assert_same(cuda_model, cpu_model)
    # (the forward program is the module entry's, the backward program in the graph cache's
    # place: ``compiler.cached_programs`` lists every program built)
    programs = compiler.cached_programs()
    assert programs and all(p.device == "cuda" for p in programs)
    assert compiler.counters.step_runs >= 2 and not compiler.counters.step_breaks


def test_a_copy_between_devices_inside_a_step_breaks_with_its_reason() -> None:
    """``.cpu()`` inside the function: a program runs on one device, so the step is not
    replayed (its backward still compiles); every call gives eager's result."""
    rng = np.random.default_rng(4)
    lin = nn.Linear(3, 2, bias=False).to("cuda")
    w = lin.weight
    opt = fg.optim.SGD(lin.parameters(), lr=0.0)

    def step(x: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = lin(x).tanh().sum()
        loss.backward()
        return loss.cpu() * 2.0

    compiled = fg.compile(step)
    for _ in range(3):
        x = rng.standard_normal((4, 3)).astype(np.float32)
        got = compiled(fg.tensor(x, device="cuda"))
        grad = w.grad.cpu().numpy()
        t = np.tanh(x @ w.detach().cpu().numpy().T)
        assert not got.is_cuda
        np.testing.assert_allclose(got.item(), 2.0 * t.sum(), rtol=1e-5)
        np.testing.assert_allclose(grad, ((1 - t * t).T @ x), rtol=1e-5, atol=1e-6)
    assert compiler.counters.step_runs == 0
    assert any("between the CPU and a CUDA device" in r for r in compiler.counters.step_breaks)


def test_an_out_of_range_target_in_a_replayed_cuda_step_raises_eagers_error() -> None:
    """The replay checks the class targets before the program runs (on the host, as eager's
    CUDA kernel does): eager's error class and message, and the parameters and buffers are
    untouched (the ``zero_grad()`` before the loss ran, as in eager)."""
    rng = np.random.default_rng(5)
    model, step = _classifier_step("cuda")
    compiled = fg.compile(step)
    x = fg.tensor(rng.standard_normal((5, 6)).astype(np.float32), device="cuda")
    for _ in range(3):
        compiled(x, fg.tensor(rng.integers(0, 3, 5), device="cuda"))
    assert compiler.counters.step_runs == 1
    before = {k: v.cpu().numpy().copy() for k, v in model.state_dict().items()}
    bad = fg.tensor(np.array([0, 1, 7, 2, 0]), device="cuda")
    with pytest.raises(IndexError) as compiled_error:
        compiled(x, bad)
    # (before the program: the prefix's zero_grad ran, as eager's does; nothing else moved)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.cpu().numpy(), before[k], err_msg=k)
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(IndexError) as eager_error:
        step(x, bad)
    assert str(compiled_error.value) == str(eager_error.value)
    assert "Target 7 is out of bounds" in str(compiled_error.value)
