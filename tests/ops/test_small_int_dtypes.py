"""int16, int8 and uint8 (issue 28): PyTorch's promotion (``uint8 + int8`` is int16), wrapping
arithmetic, reductions that accumulate in int64, conversions, indexing, printing, saving, and
compiled code falling back to eager for them.  Cross-checked with PyTorch where importable."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch cross-check")
INTS = ["uint8", "int8", "int16", "int32", "int64"]
ALL = INTS + ["bool", "float16", "float32", "float64"]


def _torch() -> Any:
    import torch

    return torch


def test_the_dtypes_and_their_names() -> None:
    assert fg.uint8.itemsize == 1 and fg.int8.itemsize == 1 and fg.int16.itemsize == 2
    assert fg.short is fg.int16 and fg.dtype is type(fg.int8)
    assert not fg.uint8.is_signed and fg.int8.is_signed and not fg.uint8.is_floating_point
    assert fg.tensor([1], dtype="short").dtype is fg.int16
    assert fg.tensor(np.array([1], np.uint8)).dtype is fg.uint8
    assert fg.from_numpy(np.zeros(2, np.int8)).dtype is fg.int8
    x = fg.arange(4)
    assert x.byte().dtype is fg.uint8 and x.char().dtype is fg.int8 and x.short().dtype is fg.int16
    assert repr(fg.tensor([1, 2], dtype=fg.int8)) == "tensor([1, 2], dtype=fusegrad.int8)"


@needs_torch
@pytest.mark.parametrize("a, b", list(itertools.product(ALL, ALL)))
def test_promotion_matches_torch(a: str, b: str) -> None:
    torch = _torch()
    x, y = fg.ones(2, dtype=getattr(fg, a)), fg.ones(2, dtype=getattr(fg, b))
    want = (torch.ones(2, dtype=getattr(torch, a)) + torch.ones(2, dtype=getattr(torch, b))).dtype
    assert (x + y).dtype.name == str(want).split(".")[1]
    assert fg.promote_types(getattr(fg, a), getattr(fg, b)).name == str(want).split(".")[1]
    # with a 0-d tensor and a Python scalar of each kind
    for scalar in (3, 2.5, True):
        want = (torch.ones(2, dtype=getattr(torch, a)) * scalar).dtype
        assert (x * scalar).dtype.name == str(want).split(".")[1], scalar
    want = (torch.ones(2, dtype=getattr(torch, a)) + torch.tensor(1, dtype=getattr(torch, b))).dtype
    assert (x + fg.tensor(1, dtype=getattr(fg, b))).dtype.name == str(want).split(".")[1]


@needs_torch
@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16"])
def test_arithmetic_reductions_and_ops_match_torch(dtype: str) -> None:
    torch = _torch()
    rng = np.random.default_rng(0)
    low, high = (0, 255) if dtype == "uint8" else (-100, 100)
    a = rng.integers(low, high, (3, 4)).astype(dtype)
    b = rng.integers(1, 50, (3, 4)).astype(dtype)
    calls = [
        lambda m, x, y: x + y,
        lambda m, x, y: x * y,  # wraps around, as PyTorch's
        lambda m, x, y: x - y,
        lambda m, x, y: x // y,
        lambda m, x, y: x % y,
        lambda m, x, y: x / y,
        lambda m, x, y: x * 3,
        lambda m, x, y: x.sum(),
        lambda m, x, y: x.sum(1),
        lambda m, x, y: x.prod(1),
        lambda m, x, y: x.cumsum(0),
        lambda m, x, y: x.max(),
        lambda m, x, y: x.argmin(1),
        lambda m, x, y: x.float().mean(),
        lambda m, x, y: (x > y) & (x != 0),
        lambda m, x, y: x & y,
        lambda m, x, y: x ^ y,
        lambda m, x, y: ~x,
        lambda m, x, y: x << 1,
        lambda m, x, y: x.abs() if dtype != "uint8" else x,
        lambda m, x, y: m.where(x > y, x, y),
        lambda m, x, y: x.clamp(10, 60),
        lambda m, x, y: x.sort(1).values,
        lambda m, x, y: x.flip(0)[1:, ::2].contiguous(),
        lambda m, x, y: x.to(m.float32) * 0.5,
        lambda m, x, y: m.cat([x, y]),
        lambda m, x, y: x.view(m.uint8) if dtype != "int16" else x.view(m.int8),
    ]
    for call in calls:
        got = call(fg, fg.tensor(a), fg.tensor(b))
        want = call(torch, torch.tensor(a), torch.tensor(b))
        assert got.dtype.name == str(want.dtype).split(".")[1]
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_small_int_indices_a_uint8_mask_and_saving(tmp_path: Path) -> None:
    x = fg.arange(6.0)
    index = fg.tensor([0, 3, 5], dtype=fg.int16)
    assert x[index].tolist() == [0.0, 3.0, 5.0]
    with pytest.warns(UserWarning, match="uint8 is now deprecated"):
        picked = x[fg.tensor([1, 0, 0, 1, 0, 1], dtype=fg.uint8)]
    assert picked.tolist() == [0.0, 3.0, 5.0]
    assert x.index_select(0, index.to(fg.int8)).tolist() == [0.0, 3.0, 5.0]
    image = fg.tensor(np.arange(12, dtype=np.uint8).reshape(3, 4))
    fg.save({"image": image}, tmp_path / "img.pt")
    loaded = fg.load(tmp_path / "img.pt")["image"]
    assert loaded.dtype is fg.uint8 and fg.equal(loaded, image)
    # a typical pipeline: uint8 images to normalised floats
    normed = image.float() / 255.0
    assert normed.dtype is fg.float32 and normed.max().item() == pytest.approx(11 / 255)


def test_compiled_code_runs_them_eagerly() -> None:
    """Compiled programs take no small integers: a step holding one runs eagerly (same
    values), with the reason counted."""
    compiler.reset()
    w = fg.randn(4, requires_grad=True)
    images = fg.tensor(np.arange(4, dtype=np.uint8))

    @fg.compile
    def step(pixels: fg.Tensor) -> fg.Tensor:
        loss = (w * (pixels.float() / 255.0)).sum()
        loss.backward()
        return loss

    for _ in range(3):
        w.grad = None
        got = step(images)
        np.testing.assert_allclose(w.grad.numpy(), np.arange(4) / 255.0, rtol=1e-6)
    expected = (w * (images.float() / 255.0)).sum()
    np.testing.assert_allclose(got.item(), expected.item(), rtol=1e-6)
    assert any("small integers" in why for why in compiler.counters.step_breaks)
