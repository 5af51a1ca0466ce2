"""A convolution's weight gradient reads the columns (im2col) its forward made of the same input
array (``conv_kernels._columns_of``): the gradients are the ones computed afresh, in each of the
three column layouts; the forward always computes its own; what the weight's gradient finds is
only ever the latest forward's of that array object, and inputs changed in place in between are
refused by autograd as before."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.errors import AutogradError
from fusegrad.ops import conv_kernels as ck

# (input shape, out channels, kernel, stride, padding): one shape per column layout --
# channels-last over the batch, per sample, channel-major over the batch
LAYOUTS = {
    "last": ((4, 16, 8, 8), 8, 4, 2, 1),
    "sample": ((4, 3, 32, 32), 8, 4, 2, 1),
    "batch": ((4, 3, 6, 6), 5, 3, 1, 1),
}


def _count_columns(monkeypatch: pytest.MonkeyPatch) -> list:
    made: list = []
    for name in ("_columns", "_columns_last"):
        original = getattr(ck, name)

        def counting(*args: Any, _original: Any = original, _name: str = name) -> Any:
            made.append(_name)
            return _original(*args)

        monkeypatch.setattr(ck, name, counting)
    return made


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_weight_gradient_reads_the_forwards_columns(
    layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape, out_c, k, s, p = LAYOUTS[layout]
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(shape)
    w0 = rng.standard_normal((out_c, shape[1], k, k)) * 0.1

    def grads(reuse: bool) -> tuple:
        if not reuse:
            monkeypatch.setattr(ck, "_RECENT_ENTRIES", 0)
        x = fg.tensor(x0, requires_grad=True)
        w = fg.tensor(w0, requires_grad=True)
        y = fg.nn.functional.conv2d(x, w, stride=s, padding=p)
        (y * y).sum().backward()
        return x.grad.numpy(), w.grad.numpy()

    made = _count_columns(monkeypatch)
    got = grads(True)
    assert len(made) == 1  # (the forward's, read again by the weight's gradient)
    ck._recent.entries.clear()
    made.clear()
    want = grads(False)
    assert len(made) == 2
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_two_forwards_then_one_backward_each_reads_its_own() -> None:
    """Two inputs through the same layer before either backward (a GAN's real and generated
    batches): each weight gradient gets its own input's columns."""
    rng = np.random.default_rng(1)
    conv = fg.nn.Conv2d(16, 8, 4, 2, 1, bias=False).double()
    xs = [fg.tensor(rng.standard_normal((2, 16, 8, 8))) for _ in range(2)]
    loss = conv(xs[0]).square().sum() + conv(xs[1]).tanh().sum()
    loss.backward()
    got = conv.weight.grad.numpy().copy()
    ck._recent.entries.clear()
    conv.weight.grad = None
    for x, f in zip(xs, (lambda y: y.square().sum(), lambda y: y.tanh().sum())):
        ck._recent.entries.clear()
        f(conv(x)).backward()
    np.testing.assert_allclose(got, conv.weight.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_an_input_reused_with_new_values_gets_new_columns() -> None:
    """One input array filled with new values for each step (a data loader's buffer): each
    forward makes its own columns, so each backward reads the current values'."""
    rng = np.random.default_rng(2)
    conv = fg.nn.Conv2d(16, 4, 4, 2, 1, bias=False).double()
    buffer = fg.zeros(2, 16, 8, 8, dtype=fg.float64)
    for _ in range(3):
        values = rng.standard_normal((2, 16, 8, 8))
        with fg.no_grad():
            buffer.copy_(fg.tensor(values))
        conv.weight.grad = None
        conv(buffer).square().sum().backward()
        got = conv.weight.grad.numpy().copy()
        ref = fg.nn.Conv2d(16, 4, 4, 2, 1, bias=False).double()
        with fg.no_grad():
            ref.weight.copy_(conv.weight)
        ck._recent.entries.clear()
        ref(fg.tensor(values)).square().sum().backward()
        np.testing.assert_allclose(got, ref.weight.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_an_input_changed_in_place_before_the_backward_is_refused() -> None:
    conv = fg.nn.Conv2d(16, 4, 4, 2, 1, bias=False)
    x = fg.randn(2, 16, 8, 8)
    y = conv(x).sum()
    with fg.no_grad():
        x.mul_(2.0)
    with pytest.raises(AutogradError, match="modified by an inplace operation"):
        y.backward()


def test_at_most_a_few_small_columns_are_kept() -> None:
    ck._recent.entries.clear()
    conv = fg.nn.Conv2d(16, 4, 4, 2, 1, bias=False)
    with fg.no_grad():
        for _ in range(2 * ck._RECENT_ENTRIES):
            conv(fg.randn(2, 16, 8, 8))
    assert len(ck._recent.entries) == ck._RECENT_ENTRIES
    big = fg.nn.Conv2d(64, 4, 3, 1, 1, bias=False)
    with fg.no_grad():
        big(fg.randn(64, 64, 16, 16))  # (columns of 2,359,296 values: too large to keep)
    assert all(cols.nbytes <= ck._RECENT_BYTES for _, _, cols in ck._recent.entries)
    medium = fg.nn.Conv2d(64, 4, 3, 1, 1, bias=False)
    with fg.no_grad():
        for _ in range(ck._RECENT_ENTRIES):  # (columns of 5.3 MB each)
            medium(fg.randn(16, 64, 12, 12))
    held = [cols.nbytes for _, _, cols in ck._recent.entries]
    assert 0 < sum(held) <= ck._RECENT_TOTAL and len(held) < ck._RECENT_ENTRIES
