"""The ops and Tensor methods of ``fusegrad.ops.extra`` (issue 28's missing API) against
PyTorch and numpy: bit shifts and ``<<``/``>>``, gcd/lcm, frexp, nextafter, histograms,
``index_put``/``put``/``masked_scatter``, ``renorm``, ``nanmedian``, ``scatter_reduce`` and
``index_reduce`` (values and gradients, ties included), the ``*_scatter`` and ``*_copy`` forms,
``Tensor.unfold``, ``gradient``, in-place view ops, random fills, predicates and the Tensor
methods that are other names of existing ops."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import gradcheck

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch cross-check")
RNG = np.random.default_rng(28)


def _torch() -> Any:
    import torch

    return torch


def _same(got: Any, want: Any) -> None:
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
        return
    g = got.detach().numpy() if isinstance(got, fg.Tensor) else np.asarray(got)
    w = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    assert g.shape == w.shape, (g.shape, w.shape)
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9, equal_nan=True)


def _both(call: Any, *arrays: np.ndarray) -> None:
    """``call(module, *tensors)`` in fusegrad and PyTorch (when importable): equal results."""
    got = call(fg, *[fg.tensor(a) for a in arrays])
    if HAVE_TORCH:
        torch = _torch()
        _same(got, call(torch, *[torch.tensor(a) for a in arrays]))
    return got


INTS = RNG.integers(-40, 40, (3, 4))
SHIFTS = RNG.integers(0, 9, (3, 4))


@pytest.mark.parametrize("dtype", ["int64", "int32", "int16", "int8", "uint8"])
def test_bit_shifts(dtype: str) -> None:
    a = np.abs(INTS).astype(dtype) if dtype == "uint8" else INTS.astype(dtype)
    b = SHIFTS.astype(dtype)
    _both(lambda m, x, y: m.bitwise_left_shift(x, y), a, b)
    _both(lambda m, x, y: m.bitwise_right_shift(x, y), a, b)
    _both(lambda m, x, y: (x << y, x >> y, x << 2, x >> 1), a, b)
    x = fg.tensor(a)
    x <<= 1
    assert x.tolist() == (fg.tensor(a) << 1).tolist()
    with pytest.raises(TypeError):
        fg.bitwise_left_shift(fg.ones(2), 1)


def test_shift_by_the_width_or_more() -> None:
    x = fg.tensor([-5, 5], dtype=fg.int8)
    assert (x >> 9).tolist() == [-1, 0]
    assert (x << 9).tolist() == [0, 0]


def test_gcd_lcm_frexp_nextafter() -> None:
    a, b = INTS, RNG.integers(-12, 12, (3, 4))
    _both(lambda m, x, y: (m.gcd(x, y), m.lcm(x, y), x.gcd(y)), a, b)
    f = RNG.standard_normal((3, 4)) * 100
    _both(lambda m, x: tuple(m.frexp(x)), f)
    _both(lambda m, x, y: m.nextafter(x, y), f, np.zeros((3, 4)))


def test_histograms() -> None:
    x = RNG.standard_normal(100)
    _both(lambda m, t: tuple(m.histogram(t, 7)), x)
    _both(lambda m, t: tuple(m.histogram(t, 5, range=(-1.0, 1.0), density=True)), x)
    _both(lambda m, t, e: tuple(m.histogram(t, e)), x, np.array([-2.0, 0.0, 0.5, 3.0]))
    pts = RNG.standard_normal((50, 2))
    got = fg.histogramdd(fg.tensor(pts), [3, 4])
    want = np.histogramdd(pts, [3, 4])
    _same(got[0], want[0])
    _same(got[1], want[1])


def test_index_put_put_and_masked_scatter() -> None:
    x = RNG.standard_normal((4, 5))
    rows, cols = np.array([0, 2, 0]), np.array([1, 3, 1])
    v = RNG.standard_normal(3)
    # (repeated indices: accumulate adds them; plain assignment gets unique ones)
    _both(lambda m, t, r, c, val: m.index_put(t, (r, c), val, True), x, rows, cols, v)
    _both(lambda m, t, r, c, val: m.index_put(t, (r[1:], c[1:]), val[1:]), x, rows, cols, v)
    _both(lambda m, t, i, s: t.put(i, s), x, np.array([0, 7, -1]), v)
    _both(lambda m, t, i, s: t.put(i, s, accumulate=True), x, np.array([0, 7, 0]), v)
    mask = RNG.random((4, 5)) > 0.5
    _both(lambda m, t, k, s: t.masked_scatter(k, s), x, mask, RNG.standard_normal(20))
    _both(lambda m, t, k, s: t.masked_scatter(k, s), x, mask[0], RNG.standard_normal(20))


def test_index_put_accumulate_differentiates_both() -> None:
    x = fg.randn(4, 5, dtype=fg.float64, requires_grad=True)
    v = fg.randn(3, dtype=fg.float64, requires_grad=True)
    r, c = fg.tensor([0, 2, 0]), fg.tensor([1, 3, 1])
    gradcheck(lambda a, b: fg.index_put(a, (r, c), b, accumulate=True), (x, v))
    gradcheck(lambda a, b: fg.index_put(a, (fg.tensor(1), c), b, accumulate=True), (x, v))


def test_renorm_and_nanmedian() -> None:
    x = RNG.standard_normal((3, 4, 2)) * 3
    for p, dim, maxnorm in [(2, 0, 1.0), (1, 1, 2.0), (3, 2, 0.5)]:
        _both(lambda m, t, p=p, d=dim, k=maxnorm: t.renorm(p, d, k), x)
    xx = fg.tensor(x, requires_grad=True)
    gradcheck(lambda t: t.renorm(2, 0, 1.0), (xx,))
    y = x.copy()
    y[0, 1, 0] = y[2, 2, 1] = y[1, :, 0] = np.nan
    _both(lambda m, t: m.nanmedian(t), y)
    # (where a slice is all NaN, which index PyTorch returns is an artifact of its selection
    # algorithm: compare the values there)
    _both(lambda m, t: m.nanmedian(t, 1).values, y)
    _both(lambda m, t: m.nanmedian(t, 2, keepdim=True), y[:, :, 1:])
    values, indices = fg.nanmedian(fg.tensor(y), 1)
    picked = np.take_along_axis(y, indices.numpy()[:, None, :], 1)[:, 0, :]
    np.testing.assert_array_equal(picked, values.numpy())


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_values_and_gradients(reduce: str, include_self: bool) -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        # small integers: ties and zeros, where the gradients are delicate
        x = rng.integers(-2, 3, (3, 4)).astype(float)
        src = rng.integers(-2, 3, (5, 4)).astype(float)
        idx = rng.integers(0, 3, (5, 4))
        fx, fs = fg.tensor(x, requires_grad=True), fg.tensor(src, requires_grad=True)
        out = fg.scatter_reduce(fx, 0, fg.tensor(idx), fs, reduce, include_self=include_self)
        g = rng.standard_normal(tuple(out.shape))
        out.backward(fg.tensor(g))
        if not HAVE_TORCH:
            continue
        torch = _torch()
        tx, ts = torch.tensor(x, requires_grad=True), torch.tensor(src, requires_grad=True)
        want = torch.scatter_reduce(tx, 0, torch.tensor(idx), ts, reduce, include_self=include_self)
        want.backward(torch.tensor(g))
        _same(out, want)
        _same(fx.grad, tx.grad)
        _same(fs.grad, ts.grad)


def test_scatter_reduce_gradcheck_and_index_reduce() -> None:
    x = fg.randn(3, 4, dtype=fg.float64, requires_grad=True)
    src = fg.randn(5, 4, dtype=fg.float64, requires_grad=True)
    idx = fg.tensor(RNG.integers(0, 3, (5, 4)))
    for reduce in ("sum", "mean", "amax", "prod"):
        gradcheck(lambda a, b, r=reduce: a.scatter_reduce(0, idx, b, r), (x, src))
    gradgradcheck = fg.autograd.gradgradcheck
    gradgradcheck(lambda a, b: a.scatter_reduce(0, idx, b, "amax"), (x, src))
    weights = fg.randn(3, 4, dtype=fg.float64, requires_grad=True)
    out = x.scatter_reduce(0, idx, src, "prod")
    (g,) = fg.autograd.grad(out, src, weights, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g.sum().backward()  # prod's gradient is not differentiable again: an error, not zeros
    base, source = RNG.standard_normal((4, 3)), RNG.standard_normal((5, 3))
    index = np.array([0, 3, 3, 1, 0])
    for reduce in ("prod", "mean", "amax", "amin"):
        for include in (True, False):
            _both(
                lambda m, b, s, i, r=reduce, inc=include: b.index_reduce(
                    0, i, s, r, include_self=inc
                ),
                base,
                source,
                index,
            )


def test_scatter_forms_and_copies() -> None:
    x = RNG.standard_normal((3, 4, 5))
    _both(lambda m, t, s: m.select_scatter(t, s, 1, 2), x, RNG.standard_normal((3, 5)))
    _both(lambda m, t, s: m.slice_scatter(t, s, 2, 1, 5, 2), x, RNG.standard_normal((3, 4, 2)))
    _both(lambda m, t, s: m.diagonal_scatter(t, s, 1, 0, 2), x, RNG.standard_normal((4, 3)))
    _both(lambda m, t, s: m.diagonal_scatter(t, s, -1, 1, 2), x, RNG.standard_normal((3, 3)))
    _both(lambda m, t: (m.permute_copy(t, (2, 0, 1)), m.narrow_copy(t, 1, 1, 2)), x)
    _both(lambda m, t: (m.unsqueeze_copy(t, 1), m.transpose_copy(t, 0, 2), m.t_copy(t[0])), x)
    _both(lambda m, t: m.split_with_sizes(t, [1, 3], 1), x)
    _both(lambda m, t: (m.unsafe_chunk(t, 2, 2), m.unsafe_split(t, 2, 1)), x)
    y = fg.tensor(x)
    copy = fg.view_copy(y, (12, 5))
    copy.zero_()
    assert y.abs().sum().item() > 0  # a copy, not a view


def test_tensor_unfold() -> None:
    x = RNG.standard_normal((4, 7))
    for dim, size, step in [(1, 3, 2), (0, 2, 1), (1, 7, 1), (-1, 1, 3)]:
        _both(lambda m, t, d=dim, s=size, k=step: t.unfold(d, s, k), x)
    xx = fg.tensor(x, requires_grad=True)
    gradcheck(lambda t: t.unfold(1, 3, 2), (xx,))


def test_gradient() -> None:
    x = RNG.standard_normal((5, 6))
    _both(lambda m, t: m.gradient(t), x)
    _both(lambda m, t: m.gradient(t, spacing=2.0, dim=1, edge_order=2), x)
    _both(lambda m, t: m.gradient(t, spacing=[0.5, 3.0]), x)
    coords = np.cumsum(RNG.random(6) + 0.1)
    _both(lambda m, t, c: m.gradient(t, spacing=(c,), dim=1), x, coords)
    _both(lambda m, t, c: m.gradient(t, spacing=(c,), dim=1, edge_order=2), x, coords)
    xx = fg.tensor(x, requires_grad=True)
    gradcheck(lambda t: fg.gradient(t, edge_order=2)[1], (xx,))


def test_view_ops_in_place() -> None:
    x = fg.randn(3, 1, 4)
    data = x.numpy().copy()
    assert x.squeeze_(1) is x and tuple(x.shape) == (3, 4)
    x.unsqueeze_(0)
    assert tuple(x.shape) == (1, 3, 4)
    x.transpose_(0, 2)
    assert tuple(x.shape) == (4, 3, 1)
    np.testing.assert_array_equal(x.numpy()[:, :, 0], data[:, 0, :].T)
    m = fg.randn(2, 3, requires_grad=True)
    y = m * 2
    y.t_()
    y.sum().backward()
    assert tuple(y.shape) == (3, 2) and m.grad.tolist() == [[2.0] * 3] * 2
    with pytest.raises(RuntimeError, match="leaf Variable"):
        m.t_()


def test_random_fills_and_apply() -> None:
    fg.manual_seed(0)
    x = fg.empty(1000)
    assert 0 <= x.random_(10).min().item() and x.max().item() <= 9
    assert (x.exponential_(2.0) >= 0).all()
    assert abs(x.cauchy_().median().item()) < 0.5
    assert set(x.bernoulli_(0.3).unique().tolist()) <= {0.0, 1.0}
    assert (x.geometric_(0.5) >= 1).all()
    assert (x.log_normal_() > 0).all()
    y = fg.arange(4.0)
    y.apply_(lambda v: v * v + 1)
    assert y.tolist() == [1.0, 2.0, 5.0, 10.0]
    y.map_(fg.ones(4), lambda a, b: a - b)
    assert y.tolist() == [0.0, 1.0, 4.0, 9.0]
    z = fg.zeros(3, 4)
    z.fill_diagonal_(5.0)
    assert z.diagonal().tolist() == [5.0] * 3 and z.sum().item() == 15.0
    tall = fg.zeros(7, 3)
    tall.fill_diagonal_(1.0, wrap=True)
    if HAVE_TORCH:
        torch = _torch()
        _same(tall, torch.zeros(7, 3).fill_diagonal_(1.0, wrap=True))


def test_predicates_sizes_and_legacy_methods() -> None:
    x = fg.randn(3, 4)
    assert x.is_cpu and not x.is_xpu and not x.is_mps and not x.is_meta and not x.is_quantized
    assert x.itemsize == 4 and x.nbytes == 48 and x.ndimension() == 2
    assert x.type_as(fg.zeros(1, dtype=fg.float64)).dtype is fg.float64
    assert x.is_signed() and not fg.zeros(1, dtype=fg.uint8).is_signed()
    assert not x.is_complex() and x.is_same_size(fg.zeros(3, 4))
    assert x[1:].storage_offset() == 4 and x.t().dim_order() == (1, 0)
    assert x.is_set_to(x) and not x.is_set_to(x.clone())
    assert fg.tensor([2.0]).is_nonzero()
    made = x.new(2, 5)
    assert tuple(made.shape) == (2, 5) and made.dtype is fg.float32
    assert x.new([1, 2]).tolist() == [1.0, 2.0]
    r = fg.arange(6.0)
    r.resize_(2, 2)
    assert r.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    r.resize_as_(fg.zeros(3))
    assert r.tolist() == [0.0, 1.0, 2.0]


@needs_torch
def test_methods_that_name_existing_ops() -> None:
    x = RNG.standard_normal((3, 4)) + 2
    y = RNG.standard_normal((3, 4)) + 2
    calls = [
        lambda t, u: t.copysign(u),
        lambda t, u: t.fmod(1.5),
        lambda t, u: t.frac(),
        lambda t, u: t.xlogy(u.abs()),
        lambda t, u: t.logit(1e-3),
        lambda t, u: t.fmax(u),
        lambda t, u: t.fliplr(),
        lambda t, u: t.rot90(1, (0, 1)),
        lambda t, u: t.kron(u),
        lambda t, u: t.nansum(),
        lambda t, u: t.trace(),
        lambda t, u: t.deg2rad(),
        lambda t, u: t.clamp_min(2.0),
        lambda t, u: t.ravel(),
        lambda t, u: t.moveaxis(0, 1),
        lambda t, u: t.subtract(u, alpha=2),
        lambda t, u: t.diag_embed(),
        lambda t, u: t.tensor_split(3, 1),
        lambda t, u: t.hardshrink(2.5),
        lambda t, u: t.clone().copysign_(u),
        lambda t, u: t.clone().tril_(),
        lambda t, u: t.clone().cumsum_(1),
        lambda t, u: t.clone().mul_(1).multiply_(u),
    ]
    torch = _torch()
    for call in calls:
        _same(call(fg.tensor(x), fg.tensor(y)), call(torch.tensor(x), torch.tensor(y)))


def test_top_level_in_place_forms() -> None:
    x = fg.tensor([-1.0, 4.0])
    assert fg.abs_(x) is x and x.tolist() == [1.0, 4.0]
    fg.sqrt_(x)
    assert x.tolist() == [1.0, 2.0]
    fg.zero_(x)
    assert x.tolist() == [0.0, 0.0]


def test_binomial_and_nonzero_static() -> None:
    fg.manual_seed(1)
    draws = fg.binomial(fg.full((2000,), 10.0), fg.full((2000,), 0.3))
    assert draws.dtype is fg.float32 and 2.7 < draws.mean().item() < 3.3
    x = fg.tensor([[0, 1], [2, 0]])
    assert fg.nonzero_static(x, size=3).tolist() == [[0, 1], [1, 0], [-1, -1]]
    assert fg.nonzero_static(x, size=1, fill_value=7).tolist() == [[0, 1]]
