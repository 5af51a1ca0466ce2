"""The environment a PyTorch script touches: ``amp`` (``GradScaler`` on the CPU against
``torch.amp.GradScaler``, disabled scalers, ``autocast`` state and warnings), ``backends``
flags, ``accelerator`` and ``cuda.manual_seed_all``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


def _train(lib, scaler_kwargs: dict, blow_up: set[int], steps: int = 6) -> tuple:  # type: ignore[no-untyped-def]
    """A few SGD steps on one weight with a GradScaler; gradients made inf at ``blow_up``."""
    w = lib.nn.Parameter(lib.tensor([1.0, -2.0, 0.5], dtype=lib.float64))
    opt = lib.optim.SGD([w], lr=0.1)
    scaler = lib.amp.GradScaler("cpu", **scaler_kwargs)
    scales, results = [], []
    for i in range(steps):
        opt.zero_grad()
        factor = float("inf") if i in blow_up else 1.0
        loss = ((w * w).sum() * factor) if i in blow_up else (w * w).sum()
        scaler.scale(loss).backward()
        results.append(scaler.step(opt))
        scaler.update()
        scales.append(scaler.get_scale())
    return w.detach().numpy().copy(), scales, scaler.state_dict(), results


@needs_torch
@pytest.mark.parametrize(
    ("kwargs", "blow_up"),
    [
        ({}, set()),
        ({}, {1, 2}),
        ({"init_scale": 8.0, "growth_interval": 2}, {3}),
        ({"growth_factor": 3.0, "backoff_factor": 0.25, "growth_interval": 1}, {0, 4}),
    ],
)
def test_cpu_grad_scaler_matches_torch(kwargs: dict, blow_up: set[int]) -> None:
    import importlib

    got = _train(fg, kwargs, blow_up)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _train(importlib.import_module("torch"), kwargs, blow_up)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    assert got[1] == want[1]
    assert got[2] == {k: (float(v) if k == "scale" else v) for k, v in want[2].items()}
    # skipped steps return None, taken ones what optimizer.step returns (None for SGD too)
    assert [r is None for r in got[3]] == [r is None for r in want[3]]


def test_grad_scaler_scales_unscales_and_refuses_misuse() -> None:
    scaler = fg.amp.GradScaler("cpu", init_scale=4.0)
    w = nn.Parameter(fg.tensor([1.0, 2.0]))
    opt = fg.optim.SGD([w], lr=1.0)
    out = scaler.scale([w.sum(), (w * 2).sum()])
    assert isinstance(out, list) and float(out[0]) == 12.0
    out[0].backward()
    np.testing.assert_array_equal(w.grad.numpy(), [4.0, 4.0])
    scaler.unscale_(opt)
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 1.0])
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)
    scaler.step(opt)  # uses the unscaled gradients once
    np.testing.assert_array_equal(w.detach().numpy(), [0.0, 1.0])
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
        scaler.step(opt, closure=lambda: None)
    scaler.update()
    with pytest.raises(AssertionError, match="No inf checks were recorded"):
        scaler.update()
    scaler.update(new_scale=2.0)
    assert scaler.get_scale() == 2.0
    other = fg.amp.GradScaler("cpu")
    other.load_state_dict(scaler.state_dict())
    assert other.state_dict() == scaler.state_dict()
    with pytest.raises(RuntimeError, match="source state dict is empty"):
        other.load_state_dict({})
    with pytest.raises(ValueError, match="growth factor must be > 1.0"):
        fg.amp.GradScaler("cpu", growth_factor=1.0)


@pytest.mark.skipif(fg.cuda.is_available(), reason="the CPU-only behaviour")
def test_cuda_grad_scaler_without_cuda_is_disabled_as_in_pytorch() -> None:
    with pytest.warns(UserWarning, match="CUDA is not available.  Disabling"):
        scaler = fg.amp.GradScaler()
    with pytest.warns(FutureWarning, match="deprecated"), pytest.warns(UserWarning):
        legacy = fg.cuda.amp.GradScaler()
    for s in (scaler, legacy, fg.amp.GradScaler("cpu", enabled=False)):
        assert not s.is_enabled() and s.get_scale() == 1.0 and s.state_dict() == {}
        w = nn.Parameter(fg.tensor([1.0]))
        opt = fg.optim.SGD([w], lr=0.5)
        loss = (w * 3).sum()
        assert s.scale(loss) is loss
        loss.backward()
        s.unscale_(opt)  # nothing
        s.step(opt)  # optimizer.step()
        s.update()
        np.testing.assert_allclose(w.detach().numpy(), [-0.5])


def test_autocast_state_warnings_and_no_casting() -> None:
    assert not fg.is_autocast_enabled("cpu")
    assert fg.get_autocast_dtype("cpu").__str__().endswith("bfloat16")

    @fg.autocast("cpu", dtype=fg.get_autocast_dtype("cpu"))
    def inside() -> tuple:
        x = fg.ones(2, 2)
        return fg.is_autocast_enabled("cpu"), (x @ x).dtype

    assert inside() == (True, fg.float32)  # accepted; ops keep their dtypes
    assert not fg.is_autocast_enabled("cpu")
    with fg.amp.autocast(device_type="cpu", enabled=False):
        assert not fg.is_autocast_enabled("cpu")
    with pytest.warns(UserWarning, match="target dtype is not supported. Disabling autocast"):
        ctx = fg.autocast("cpu", dtype=fg.float32)
    with ctx:
        assert not fg.is_autocast_enabled("cpu")
    with pytest.raises(RuntimeError, match="device type at start of device string: tpu"):
        fg.autocast("tpu")
    if not fg.cuda.is_available():
        with pytest.warns(UserWarning, match="CUDA is not available"):
            with fg.autocast("cuda"):
                assert not fg.is_autocast_enabled()


def test_backends_flags_are_stored() -> None:
    b = fg.backends
    saved = (b.cudnn.benchmark, b.cudnn.deterministic, b.cuda.matmul.allow_tf32)
    try:
        b.cudnn.benchmark = True
        b.cudnn.deterministic = True
        b.cudnn.allow_tf32 = True
        b.cuda.matmul.allow_tf32 = True
        assert b.cudnn.benchmark and b.cudnn.deterministic and b.cuda.matmul.allow_tf32
    finally:
        b.cudnn.benchmark, b.cudnn.deterministic, b.cuda.matmul.allow_tf32 = saved
    assert b.mps.is_available() is False and b.cudnn.is_available() is False
    assert b.cudnn.version() is None
    with b.cuda.sdp_kernel(enable_flash=False):
        assert not b.cuda.flash_sdp_enabled()
    assert b.cuda.flash_sdp_enabled()
    if torch is not None:
        assert b.cudnn.enabled == torch.backends.cudnn.enabled
        assert b.cudnn.benchmark == torch.backends.cudnn.benchmark
        assert b.cuda.matmul.allow_tf32 == torch.backends.cuda.matmul.allow_tf32


def test_accelerator_and_manual_seed_all() -> None:
    available = fg.cuda.is_available()
    assert fg.accelerator.is_available() is available
    current = fg.accelerator.current_accelerator()
    assert (current is None) is (not available)
    assert fg.accelerator.device_count() == (fg.cuda.device_count() if available else 0)
    fg.cuda.manual_seed_all(5)
    a = fg.randn(4)
    fg.cuda.manual_seed_all(5)
    assert fg.equal(fg.randn(4), a)
