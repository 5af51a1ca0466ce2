"""nonzero/argwhere/unique (data-dependent shapes, outside the op table), and what the op table
cannot express for searchsorted/bucketize/histc/cummax/mode: int32 outputs, NaN order,
PyTorch's errors.  Values against numpy and, when importable, against torch."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


def _np(t: fusegrad.Tensor) -> np.ndarray:
    return t.detach().numpy()


# ---- nonzero / argwhere ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        np.array([[0, 1, 0], [2, 0, 3]]),
        np.array([0.0, -1.5, 0.0, math.nan]),
        np.array([[True, False], [False, False]]),
        np.zeros((2, 0, 3)),
        np.array(5),
        np.array(0.0),
    ],
)
def test_nonzero_matches_numpy_and_torch(data: np.ndarray) -> None:
    x = fusegrad.tensor(data)
    got = fusegrad.nonzero(x)
    assert got.dtype == fusegrad.int64
    if data.ndim:
        np.testing.assert_array_equal(_np(got), np.argwhere(data))
    np.testing.assert_array_equal(_np(fusegrad.argwhere(x)), _np(got))
    np.testing.assert_array_equal(_np(x.nonzero()), _np(got))
    tup = x.nonzero(as_tuple=True)
    assert isinstance(tup, tuple)
    if torch is not None:
        tx = torch.tensor(data)
        want = torch.nonzero(tx)
        assert tuple(got.shape) == tuple(want.shape)
        np.testing.assert_array_equal(_np(got), want.numpy())
        want_tup = torch.nonzero(tx, as_tuple=True)
        assert len(tup) == len(want_tup)
        for a, b in zip(tup, want_tup):
            np.testing.assert_array_equal(_np(a), b.numpy())


def test_nonzero_is_a_constant_index() -> None:
    x = fusegrad.tensor([0.0, 2.0, 3.0], requires_grad=True)
    idx = fusegrad.nonzero(x)
    assert not idx.requires_grad
    (x[idx.squeeze(1)] ** 2).sum().backward()
    np.testing.assert_allclose(_np(x.grad), [0.0, 4.0, 6.0])


# ---- unique ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "dim"),
    [
        (np.array([3, 1, 2, 3, 1]), None),
        (np.array([[2.0, 1.0], [2.0, 1.0], [0.0, 5.0]]), None),
        (np.array([[2.0, 1.0], [2.0, 1.0], [0.0, 5.0]]), 0),
        (np.array([[3.0, 1.0, 3.0], [3.0, 1.0, 3.0]]), 1),
        (np.array([[1, 2], [1, 2], [0, 5]]), -2),
        (np.array([True, False, True]), None),
        (np.array(4.0), None),
        (np.zeros((0, 2)), 0),
    ],
)
def test_unique_matches_torch(data: np.ndarray, dim: int | None) -> None:
    x = fusegrad.tensor(data)
    values, inverse, counts = fusegrad.unique(x, return_inverse=True, return_counts=True, dim=dim)
    ref_values = np.unique(data) if dim is None else np.unique(data, axis=dim)
    np.testing.assert_array_equal(_np(values), ref_values)
    assert values.dtype == x.dtype and inverse.dtype == fusegrad.int64
    # the inverse rebuilds the input
    if dim is None:
        np.testing.assert_array_equal(_np(values)[_np(inverse)], data)
    assert int(_np(counts).sum()) == (data.size if dim is None else data.shape[dim])
    np.testing.assert_array_equal(_np(x.unique(dim=dim)), ref_values)
    if torch is not None:
        want = torch.unique(torch.tensor(data), return_inverse=True, return_counts=True, dim=dim)
        for got, w in zip((values, inverse, counts), want):
            assert tuple(got.shape) == tuple(w.shape)
            np.testing.assert_array_equal(_np(got), w.numpy())


def test_unique_return_shapes_and_nan() -> None:
    x = fusegrad.tensor([1.0, math.nan, math.nan, 1.0])
    assert isinstance(fusegrad.unique(x), fusegrad.Tensor)
    out = fusegrad.unique(x, return_counts=True)
    assert isinstance(out, tuple) and len(out) == 2
    # NaNs are never equal: each is its own element, as in PyTorch
    np.testing.assert_array_equal(_np(out[1]), [2, 1, 1])
    _, inverse = fusegrad.unique(fusegrad.tensor([[3, 1], [1, 3]]), return_inverse=True)
    np.testing.assert_array_equal(_np(inverse), [[1, 0], [0, 1]])


# ---- searchsorted / bucketize ------------------------------------------------------------------


def test_searchsorted_int32_scalar_and_sides() -> None:
    seq = fusegrad.tensor([1.0, 3.0, 3.0, 5.0])
    out = fusegrad.searchsorted(seq, fusegrad.tensor([3.0, 4.0]), out_int32=True)
    assert out.dtype == fusegrad.int32
    np.testing.assert_array_equal(_np(out), [1, 3])
    right = fusegrad.searchsorted(seq, fusegrad.tensor([3.0]), side="right")
    np.testing.assert_array_equal(_np(right), [3])
    scalar = fusegrad.searchsorted(seq, 3)
    assert scalar.shape == () and int(scalar) == 1
    b = fusegrad.bucketize(fusegrad.tensor([[0.0, 3.0, 9.0]]), seq, right=True, out_int32=True)
    assert b.dtype == fusegrad.int32
    np.testing.assert_array_equal(_np(b), [[0, 3, 4]])


def test_searchsorted_nan_value_goes_last() -> None:
    seq = fusegrad.tensor([1.0, 2.0, 4.0])
    for side in ("left", "right"):
        got = fusegrad.searchsorted(seq, fusegrad.tensor([math.nan, 3.0]), side=side)
        np.testing.assert_array_equal(_np(got), [3, 2])
        if torch is not None:
            want = torch.searchsorted(
                torch.tensor([1.0, 2.0, 4.0]), torch.tensor([math.nan, 3.0]), side=side
            )
            assert want.tolist() == [3, 2]


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (
            lambda: fusegrad.searchsorted(
                fusegrad.tensor([1.0]), fusegrad.tensor([1.0]), side="up"
            ),
            "side can only be 'left' or 'right'",
        ),
        (
            lambda: fusegrad.searchsorted(
                fusegrad.tensor([1.0]), fusegrad.tensor([1.0]), side="left", right=True
            ),
            "side and right can't be set to opposites",
        ),
        (
            lambda: fusegrad.searchsorted(fusegrad.tensor(1.0), fusegrad.tensor([1.0])),
            "should have positive dimension",
        ),
        (
            lambda: fusegrad.searchsorted(fusegrad.ones(2, 3), fusegrad.ones(3)),
            "first N-1 dimensions",
        ),
        (
            lambda: fusegrad.searchsorted(
                fusegrad.ones(3), fusegrad.ones(1), sorter=fusegrad.tensor([0, 1])
            ),
            "boundary and sorter must have the same size",
        ),
        (
            lambda: fusegrad.bucketize(fusegrad.ones(2), fusegrad.ones(2, 2)),
            "boundaries tensor must be 1 dimension",
        ),
        (lambda: fusegrad.histc(fusegrad.ones(2), bins=0), "bins must be > 0"),
        (lambda: fusegrad.histc(fusegrad.ones(2), min=3, max=1), "max must be larger than min"),
        (
            lambda: fusegrad.histc(fusegrad.tensor([1.0, math.inf])),
            "range of [1, inf] is not finite",
        ),
        (lambda: fusegrad.cdist(fusegrad.ones(3), fusegrad.ones(2, 3)), "at least 2D"),
        (
            lambda: fusegrad.cdist(fusegrad.ones(2, 3), fusegrad.ones(2, 4)),
            "must have the same number of columns",
        ),
        (lambda: fusegrad.cdist(fusegrad.ones(2, 3), fusegrad.ones(2, 3), p=-1), "non-negative"),
    ],
)
def test_runtime_errors(call, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RuntimeError) as info:
        call()
    assert words in str(info.value)


def test_dtype_errors() -> None:
    with pytest.raises(NotImplementedError, match="not implemented"):
        fusegrad.histc(fusegrad.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="floating-point"):
        fusegrad.cdist(fusegrad.tensor([[1, 2]]), fusegrad.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="not a valid value for compute_mode"):
        fusegrad.cdist(fusegrad.ones(2, 3), fusegrad.ones(2, 3), compute_mode="fast")
    with pytest.raises(IndexError, match="non-zero size"):  # as PyTorch's
        fusegrad.mode(fusegrad.ones(2, 0))
    with pytest.raises(TypeError, match="floating point"):
        fusegrad.logcumsumexp(fusegrad.tensor([1, 2]), 0)


# ---- cummax / cummin / mode: NaN, ties, gradients ----------------------------------------------


def test_cummax_nan_and_ties_match_torch() -> None:
    data = np.array([1.0, math.nan, 2.0, math.nan, 0.0])
    values, indices = fusegrad.cummax(fusegrad.tensor(data), 0)
    np.testing.assert_array_equal(_np(indices), [0, 1, 1, 3, 3])
    assert np.isnan(_np(values)[1:]).all()
    ties = np.array([2.0, 2.0, 1.0, 2.0, 0.0])
    np.testing.assert_array_equal(_np(fusegrad.tensor(ties).cummax(0).indices), [0, 1, 1, 3, 3])
    np.testing.assert_array_equal(_np(fusegrad.tensor(ties).cummin(0).indices), [0, 1, 2, 2, 4])
    if torch is not None:
        for arr in (data, ties):
            for name in ("cummax", "cummin"):
                got = getattr(fusegrad, name)(fusegrad.tensor(arr), 0)
                want = getattr(torch, name)(torch.tensor(arr), 0)
                np.testing.assert_array_equal(_np(got.indices), want.indices.numpy())


def test_cummax_gradient_goes_to_the_argmax_positions() -> None:
    x = fusegrad.tensor([1.0, 3.0, 2.0, 3.0, 0.5], requires_grad=True)
    fusegrad.cummax(x, 0).values.sum().backward()
    np.testing.assert_array_equal(_np(x.grad), [1.0, 2.0, 0.0, 2.0, 0.0])


def test_mode_picks_the_smallest_most_frequent_at_its_last_position() -> None:
    data = np.array([[1, 2, 2, 3, 3, 1, 0], [4, 4, 4, 1, 1, 1, 1]])
    got = fusegrad.mode(fusegrad.tensor(data), 1)
    np.testing.assert_array_equal(_np(got.values), [1, 1])
    np.testing.assert_array_equal(_np(got.indices), [5, 6])
    x = fusegrad.tensor([2.0, 1.0, 2.0, 1.0], requires_grad=True)
    out = x.mode()
    assert float(out.values) == 1.0 and int(out.indices) == 3
    out.values.backward()
    np.testing.assert_array_equal(_np(x.grad), [0.0, 0.0, 0.0, 1.0])
    if torch is not None:
        rng = np.random.default_rng(0)
        for _ in range(5):
            arr = rng.integers(0, 4, (5, 9))
            got = fusegrad.mode(fusegrad.tensor(arr), 1)
            want = torch.mode(torch.tensor(arr), 1)
            np.testing.assert_array_equal(_np(got.values), want.values.numpy())
            np.testing.assert_array_equal(_np(got.indices), want.indices.numpy())


@needs_torch
def test_logcumsumexp_far_apart_values_match_torch() -> None:
    data = np.array([-1000.0, 0.0, -1.0, 3.0, -math.inf, 2.0, 700.0])
    x = fusegrad.tensor(data, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    y, w = fusegrad.logcumsumexp(x, 0), torch.logcumsumexp(t, 0)
    np.testing.assert_allclose(_np(y), w.detach().numpy(), rtol=1e-12)
    y.sum().backward()
    w.sum().backward()
    np.testing.assert_allclose(_np(x.grad), t.grad.numpy(), rtol=1e-10, atol=1e-300)
