"""Training on CUDA (numba's simulator) gives the CPU's numbers: nn.Module.to("cuda"), the
engine's .grad accumulation on the device, optimizers updating device parameters in place."""

from __future__ import annotations

import os

import modes
import numpy as np
import pytest

import fusegrad
from fusegrad import nn, optim

modes.require_device()


def _model(seed: int) -> nn.Module:
    fusegrad.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _train(device: str, opt_name: str, steps: int = 3) -> tuple[list[float], list[np.ndarray]]:
    model = _model(0).to(device)
    rng = np.random.default_rng(1)
    x = fusegrad.tensor(rng.standard_normal((5, 6)).astype(np.float32), device=device)
    y = fusegrad.tensor(rng.integers(0, 3, 5), device=device)
    params = list(model.parameters())
    opt = (
        optim.SGD(params, lr=0.1, momentum=0.9)
        if opt_name == "sgd"
        else optim.Adam(params, lr=0.01)
        if opt_name == "adam"
        else optim.AdamW(params, lr=0.01, weight_decay=0.1)
    )
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu().numpy() for p in params]


# (Adam's CUDA update is AdamW's without weight decay: the simulator's 17 s go to the two that
# differ, and a real GPU, FUSEGRAD_CUDA_FULL=1, runs all three)
OPTIMIZERS = (
    ["sgd", "adam", "adamw"] if os.environ.get("FUSEGRAD_CUDA_FULL") == "1" else ["sgd", "adamw"]
)


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
def test_training_steps_match_the_cpu(opt_name: str) -> None:
    cpu_losses, cpu_params = _train("cpu", opt_name)
    gpu_losses, gpu_params = _train("cuda", opt_name)
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-5)
    for g, c in zip(gpu_params, cpu_params):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-6)


def test_module_to_moves_parameters_and_keeps_their_identity() -> None:
    model = _model(0)
    weight = model[0].weight
    model.to("cuda")
    assert model[0].weight is weight and weight.is_cuda
    assert all(p.is_cuda for p in model.parameters())
    model.cpu()
    assert not weight.is_cuda


def test_grad_accumulates_in_place_on_the_device() -> None:
    w = fusegrad.ones(3, device="cuda", requires_grad=True)
    (w * 2).sum().backward()
    first = w.grad
    assert first is not None and first.is_cuda
    (w * 3).sum().backward()
    assert w.grad is first  # accumulated into the same tensor
    np.testing.assert_array_equal(first.cpu().numpy(), [5.0, 5.0, 5.0])


def test_fan_in_and_broadcast_gradients_on_the_device() -> None:
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    x = fusegrad.tensor(a, device="cuda", requires_grad=True)
    b = fusegrad.tensor([1.0, 2.0, 3.0], dtype=fusegrad.float64, device="cuda", requires_grad=True)
    y = (x * b + x.exp() * b).sum()
    y.backward()
    assert x.grad is not None and b.grad is not None
    np.testing.assert_allclose(x.grad.cpu().numpy(), (1 + np.exp(a)) * [1.0, 2.0, 3.0])
    np.testing.assert_allclose(b.grad.cpu().numpy(), (a + np.exp(a)).sum(0))


def test_in_place_through_a_view_reaches_the_base() -> None:
    x = fusegrad.zeros(3, 4, device="cuda")
    row = x[1]
    row.add_(2.0)
    x[:, 0] = 7.0
    want = np.zeros((3, 4))
    want[1] += 2
    want[:, 0] = 7
    np.testing.assert_array_equal(x.cpu().numpy(), want)
    assert x._version > 0
