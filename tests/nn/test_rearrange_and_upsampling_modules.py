"""F.pixel_shuffle/pixel_unshuffle/channel_shuffle with nn.PixelShuffle/PixelUnshuffle/
ChannelShuffle, nn.Softmax2d, nn.UpsamplingNearest2d/UpsamplingBilinear2d and the deprecated
F.upsample aliases: outputs, gradients, node names, reprs and errors against torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad
import fusegrad.nn.functional as F
from fusegrad import nn

RNG = np.random.default_rng(0)


def _both(torch: Any, data: np.ndarray, ours: Any, theirs: Any) -> None:
    x = fusegrad.tensor(data, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    y, z = ours(x), theirs(t)
    np.testing.assert_allclose(y.detach().numpy(), z.detach().numpy(), rtol=1e-12, atol=1e-14)
    w = RNG.standard_normal(tuple(z.shape))
    (y * fusegrad.tensor(w)).sum().backward()
    (z * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-14)
    assert y.grad_fn.name() == z.grad_fn.name()


@pytest.mark.parametrize(
    "name,args,shape",
    [
        ("PixelShuffle", (2,), (2, 8, 3, 4)),
        ("PixelShuffle", (3,), (9, 2, 2)),
        ("PixelUnshuffle", (2,), (2, 3, 4, 6)),
        ("PixelUnshuffle", (3,), (1, 2, 3, 6, 9)),
        ("ChannelShuffle", (2,), (2, 6, 3, 4)),
        ("ChannelShuffle", (3,), (1, 6, 5)),
        ("Softmax2d", (), (2, 3, 4, 5)),
        ("Softmax2d", (), (3, 4, 5)),
        ("UpsamplingNearest2d", (None, 2), (1, 2, 3, 4)),
        ("UpsamplingBilinear2d", ((5, 7),), (1, 2, 3, 4)),
    ],
)
def test_modules_match_torch(name: str, args: tuple, shape: tuple) -> None:
    torch = pytest.importorskip("torch")
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert repr(ours) == repr(theirs)
    _both(torch, RNG.standard_normal(shape), ours, theirs)


def test_deprecated_upsample_functions_warn_and_interpolate() -> None:
    torch = pytest.importorskip("torch")
    data = RNG.standard_normal((1, 2, 3, 4))
    for name, kwargs in [
        ("upsample", {"scale_factor": 2}),
        ("upsample", {"size": (5, 6), "mode": "bilinear", "align_corners": False}),
        ("upsample_nearest", {"scale_factor": 2}),
        ("upsample_bilinear", {"size": (5, 7)}),
    ]:
        with pytest.warns(UserWarning, match=f"nn.functional.{name}` is deprecated"):
            y = getattr(F, name)(fusegrad.tensor(data), **kwargs)
        with pytest.warns(UserWarning):
            z = getattr(torch.nn.functional, name)(torch.tensor(data), **kwargs)
        np.testing.assert_allclose(y.numpy(), z.numpy(), rtol=1e-12, atol=1e-14)


def test_errors_say_what_torch_says() -> None:
    with pytest.raises(RuntimeError, match="input.size\\(-3\\)=7 is not divisible by 4"):
        F.pixel_shuffle(fusegrad.ones(1, 7, 2, 3), 2)
    with pytest.raises(RuntimeError, match="not both divisible by 2"):
        F.pixel_unshuffle(fusegrad.ones(1, 2, 3, 4), 2)
    with pytest.raises(RuntimeError, match="Got 5 channels and 2 groups"):
        F.channel_shuffle(fusegrad.ones(1, 5, 2), 2)
    with pytest.raises(ValueError, match="Softmax2d: expected input to be 3D or 4D, got 2D"):
        nn.Softmax2d()(fusegrad.ones(2, 3))
    assert F.native_channel_shuffle is F.channel_shuffle
