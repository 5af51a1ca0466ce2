"""Dropout's keep-or-drop draws (``functional._keep_draw``): 32 random bits per element, kept
when the bits as a fraction of 2**32 are at least p.  The kept fraction matches 1 - p within a
few standard deviations, the threshold is exact at its ends, draws follow the generator's
state (a seed repeats them, an explicit generator leaves the default one alone), and odd sizes
use half-used 64-bit outputs correctly."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.ops import functional


@pytest.mark.parametrize("p", [0.05, 0.1, 0.5, 0.9])
def test_kept_fraction_and_scale(p: float) -> None:
    fg.manual_seed(3)
    n = 200_001  # odd: the last 64-bit draw is half used
    y = F.dropout(fg.ones(n), p).numpy()
    kept = y != 0
    sd = math.sqrt(n * p * (1 - p))
    assert abs(int(kept.sum()) - n * (1 - p)) < 5 * sd
    np.testing.assert_array_equal(y[kept], np.float32(1 / (1 - p)))


def test_threshold_at_its_ends() -> None:
    rng = np.random.Generator(np.random.PCG64(0))
    bits = np.random.Generator(np.random.PCG64(0)).bit_generator.random_raw(5).view(np.uint32)
    # p = 2**-32: only an all-zero draw is dropped; the draws are the generator's raw bits
    np.testing.assert_array_equal(
        functional._keep_draw(rng, (2, 5), 2.0**-32), (bits != 0).reshape(2, 5)
    )
    rng = np.random.Generator(np.random.PCG64(0))
    nearly_one = 1.0 - 2.0**-40  # ceil(p * 2**32) is 2**32: nothing is kept
    assert not functional._keep_draw(rng, (7,), nearly_one).any()
    half = functional._keep_draw(np.random.Generator(np.random.PCG64(0)), (10,), 0.5)
    np.testing.assert_array_equal(half, bits >= 2**31)


def test_seed_and_generator() -> None:
    x = fg.ones(4, 33)
    fg.manual_seed(11)
    a = F.dropout(x, 0.3).numpy()
    fg.manual_seed(11)
    b = F.dropout(x, 0.3).numpy()
    np.testing.assert_array_equal(a, b)
    fg.manual_seed(11)
    g = fg.Generator().manual_seed(5)
    other = F.dropout(x, 0.3, generator=g).numpy()
    assert not np.array_equal(other, a)
    c = F.dropout(x, 0.3).numpy()  # the default generator: as if the other draw never happened
    np.testing.assert_array_equal(a, c)
    d = F.dropout2d(fg.ones(6, 40, 2, 2), 0.5).numpy()
    per_channel = d.reshape(6, 40, 4)
    assert (per_channel == per_channel[..., :1]).all()  # one draw per sample and channel
