"""``F.embedding``'s primitive and its one-kernel backward (``embedding_backward``, a numba
scatter-add): values and gradients against PyTorch with ``padding_idx``,
``scale_grad_by_freq`` and ``max_norm``, index dtypes and ranks; gradcheck / gradgradcheck in
float64; the differentiable form the rule uses under ``create_graph`` equal to the kernel."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegrad as fg
from fusegrad import nn
from fusegrad.autograd import gradcheck, gradgradcheck

F = nn.functional

try:
    import torch
except ImportError:  # pragma: no cover  (torch is optional)
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def _numpy_grad(idx: np.ndarray, g: np.ndarray, rows: int, padding: Any, by_freq: bool) -> Any:
    """The weight's gradient by a Python loop over the lookups."""
    out = np.zeros((rows, g.shape[-1]), g.dtype)
    flat, gs = idx.reshape(-1), g.reshape(-1, g.shape[-1])
    counts = np.bincount(flat, minlength=rows)
    for i, r in enumerate(flat):
        if r != padding:
            out[r] += gs[i] / (counts[r] if by_freq else 1)
    return out


@pytest.mark.parametrize("by_freq", [False, True])
@pytest.mark.parametrize("padding", [None, 2, -1])
@pytest.mark.parametrize("idx_shape", [(), (5,), (3, 4), (2, 2, 3)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_values_and_gradient(idx_shape: tuple, padding: Any, by_freq: bool, dtype: str) -> None:
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((6, 4)).astype(dtype)
    idx = rng.integers(0, 6, idx_shape)
    g = rng.standard_normal(idx_shape + (4,)).astype(dtype)
    w = fg.tensor(weight, requires_grad=True)
    out = F.embedding(fg.tensor(idx), w, padding, scale_grad_by_freq=by_freq)
    assert out.grad_fn._prim.name == "embedding"
    assert out.grad_fn.name() == "EmbeddingBackward0"
    np.testing.assert_array_equal(out.detach().numpy(), weight[idx])
    out.backward(fg.tensor(g))
    pad = None if padding is None else padding % 6
    want = _numpy_grad(idx, g, 6, pad, by_freq)
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-6, atol=1e-6)
    if torch is not None:
        tw = torch.tensor(weight, requires_grad=True)
        tout = torch.nn.functional.embedding(
            torch.tensor(idx), tw, padding, scale_grad_by_freq=by_freq
        )
        tout.backward(torch.tensor(g))
        np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_int32_indices_and_module() -> None:
    rng = np.random.default_rng(2)
    module = nn.Embedding(7, 3, padding_idx=0, scale_grad_by_freq=True)
    idx = rng.integers(0, 7, (4, 5)).astype(np.int32)
    out = module(fg.tensor(idx))
    out.sum().backward()
    want = _numpy_grad(idx, np.ones((4, 5, 3), np.float32), 7, 0, True)
    np.testing.assert_allclose(module.weight.grad.numpy(), want, rtol=1e-6)
    assert "scale_grad_by_freq=True" in repr(module)


@needs_torch
def test_max_norm_renormalises_the_looked_up_rows_like_torch() -> None:
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((5, 3)) * 3
    idx = np.array([[0, 2], [2, 4]])
    ours, theirs = fg.tensor(weight.copy()), torch.tensor(weight.copy())
    a = F.embedding(fg.tensor(idx), ours, max_norm=1.5)
    b = torch.nn.functional.embedding(torch.tensor(idx), theirs, max_norm=1.5)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-12)


def test_gradcheck_and_gradgradcheck() -> None:
    rng = np.random.default_rng(4)
    idx = fg.tensor(rng.integers(0, 5, (3, 4)))
    w = fg.tensor(rng.standard_normal((5, 3)), requires_grad=True)
    assert gradcheck(lambda t: F.embedding(idx, t) ** 2, (w,))
    assert gradgradcheck(lambda t: F.embedding(idx, t, padding_idx=1) ** 2, (w,))


@pytest.mark.parametrize("by_freq", [False, True])
def test_create_graph_form_equals_the_kernel(by_freq: bool) -> None:
    rng = np.random.default_rng(5)
    idx = fg.tensor(rng.integers(0, 5, (6,)))
    g = fg.tensor(rng.standard_normal((6, 3)), requires_grad=True)  # (a graph of gw: through g)
    grads = []
    for create_graph in (False, True):
        w = fg.tensor(rng.standard_normal((5, 3)), requires_grad=True)
        out = F.embedding(idx, w, 3, scale_grad_by_freq=by_freq)
        (gw,) = fg.autograd.grad(out, w, g, create_graph=create_graph)
        assert gw.requires_grad == create_graph
        grads.append(gw.detach().numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12, atol=1e-15)


def test_sparse_and_bad_padding_are_refused() -> None:
    w = fg.randn(4, 2)
    with pytest.raises(NotImplementedError, match="sparse"):
        F.embedding(fg.tensor([1]), w, sparse=True)
    with pytest.raises(ValueError, match="Padding_idx"):
        F.embedding(fg.tensor([1]), w, padding_idx=4)
    with pytest.raises(IndexError, match="out of bounds"):
        F.embedding(fg.tensor([4]), w)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 8),
    width=st.integers(1, 9),
    lookups=st.lists(st.integers(0, 7), min_size=0, max_size=12),
    by_freq=st.booleans(),
)
def test_property_against_the_loop(rows: int, width: int, lookups: list, by_freq: bool) -> None:
    idx = np.array([v % rows for v in lookups], np.int64)
    rng = np.random.default_rng(rows * 100 + width)
    w = fg.tensor(rng.standard_normal((rows, width)), requires_grad=True)
    g = rng.standard_normal((idx.size, width))
    F.embedding(fg.tensor(idx), w, scale_grad_by_freq=by_freq).backward(fg.tensor(g))
    want = _numpy_grad(idx, g, rows, None, by_freq)
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-12, atol=1e-14)
