"""``F.interpolate``'s nearest, nearest-exact and linear (linear / bilinear / trilinear) modes
as fused kernels (``ops/resample.py``: ``resample`` and ``resample_backward``): values and
gradients against a numpy reference and PyTorch over ranks, sizes, scale factors,
``align_corners`` and ``recompute_scale_factor``; non-finite inputs reaching only their
neighbours, as PyTorch's; gradcheck / gradgradcheck in float64; ``nn.Upsample``; hypothesis
over shapes and factors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
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
LINEAR = {3: "linear", 4: "bilinear", 5: "trilinear"}


def _ref_matrix(n: int, out: int, scale: Any, mode: str, align: bool, rank: int) -> np.ndarray:
    """(out, n): the weights of dim's resampling, written from PyTorch's documented formulas
    (source = (dst + 0.5) / scale - 0.5, clamped at 0; or dst (n - 1) / (out - 1) aligned)."""
    m = np.zeros((out, n))
    if out == n and not (mode == "nearest" and rank in (1, 3)):
        return np.eye(n)  # (PyTorch's kernels copy a dim whose size does not change)
    step = 1.0 / scale if scale else n / out
    for j in range(out):
        if mode == "nearest":
            m[j, min(int(np.floor(np.float32(j) * np.float32(step))), n - 1)] = 1.0
        elif mode == "nearest-exact":
            src = np.floor((np.float32(j) + np.float32(0.5)) * np.float32(step))
            m[j, min(int(src), n - 1)] = 1.0
        else:
            if align:
                src = j * (n - 1) / (out - 1) if out > 1 else 0.0
            else:
                src = max(step * (j + 0.5) - 0.5, 0.0)
            lo = min(int(math.floor(src)), n - 1)
            hi = min(lo + 1, n - 1)
            m[j, lo] += 1.0 - (src - lo)
            m[j, hi] += src - lo
    return m


def _ref(x: np.ndarray, sizes: list, scales: list, mode: str, align: bool) -> np.ndarray:
    for k, (out, scale) in enumerate(zip(sizes, scales)):
        dim = 2 + k
        m = _ref_matrix(x.shape[dim], out, scale, mode, align, len(sizes))
        x = np.moveaxis(np.tensordot(x, m, axes=([dim], [1])), -1, dim)
    return x


CASES = [
    ((2, 3, 5), "nearest", {"scale_factor": 2}),
    ((2, 3, 5), "nearest", {"size": 3}),
    ((1, 2, 7), "nearest-exact", {"scale_factor": 0.6}),
    ((2, 3, 5), "linear", {"size": 8, "align_corners": True}),
    ((2, 3, 5), "linear", {"size": 8, "align_corners": False}),
    ((2, 2, 4, 5), "bilinear", {"size": (7, 3)}),
    ((2, 2, 4, 5), "bilinear", {"scale_factor": 1.7, "align_corners": True}),
    ((2, 2, 4, 5), "bilinear", {"scale_factor": (1.3, 0.6)}),
    ((2, 2, 4, 5), "bilinear", {"scale_factor": 1.3, "recompute_scale_factor": True}),
    ((1, 1, 1, 5), "bilinear", {"size": (3, 5)}),
    ((2, 2, 4, 5), "nearest", {"size": (7, 3)}),
    ((2, 2, 4, 5), "nearest-exact", {"scale_factor": (2.5, 1.5)}),
    ((1, 2, 3, 4, 5), "trilinear", {"scale_factor": (1.5, 2, 0.7)}),
    ((1, 2, 3, 4, 2), "trilinear", {"size": (2, 5, 3), "align_corners": True}),
    ((1, 2, 3, 4, 5), "nearest", {"scale_factor": 2.5}),
    # a size that does not change: copied (every mode but nearest over 1 or 3 dims)
    ((1, 2, 2, 3), "bilinear", {"scale_factor": (1.25, 1.5)}),
    ((1, 2, 2, 3), "nearest", {"scale_factor": (1.25, 1.5)}),
    ((1, 2, 2), "nearest", {"scale_factor": 1.25}),
    ((1, 2, 3), "linear", {"scale_factor": 1.2}),
    ((1, 1, 2, 2, 3), "nearest", {"scale_factor": (1.25, 1, 1.5)}),
    ((1, 1, 2, 2, 3), "nearest-exact", {"scale_factor": (1.25, 1, 1.5)}),
]


def _sizes_and_scales(shape: tuple, kw: dict) -> tuple:
    spatial = len(shape) - 2
    if "size" in kw:
        size = kw["size"]
        return (list(size) if isinstance(size, tuple) else [size] * spatial), [None] * spatial
    factors = kw["scale_factor"]
    factors = list(factors) if isinstance(factors, tuple) else [factors] * spatial
    sizes = [math.floor(n * f) for n, f in zip(shape[2:], factors)]
    return sizes, ([None] * spatial if kw.get("recompute_scale_factor") else factors)


@pytest.mark.parametrize("shape,mode,kw", CASES)
def test_values_and_gradient_match_numpy(shape: tuple, mode: str, kw: dict) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    xt = fg.tensor(x, requires_grad=True)
    out = F.interpolate(xt, mode=mode, **kw)
    assert out.grad_fn._prim.name == "resample"
    sizes, scales = _sizes_and_scales(shape, kw)
    align = bool(kw.get("align_corners"))
    kind = "linear" if mode in LINEAR.values() else mode
    np.testing.assert_allclose(out.detach().numpy(), _ref(x, sizes, scales, kind, align), 1e-12)
    g = rng.standard_normal(out.shape)
    out.backward(fg.tensor(g))
    # the adjoint: the transposed matrices applied to g
    want = g
    for k, (n, scale) in enumerate(zip(shape[2:], scales)):
        m = _ref_matrix(n, sizes[k], scale, kind, align, len(sizes))
        want = np.moveaxis(np.tensordot(want, m, axes=([2 + k], [0])), -1, 2 + k)
    np.testing.assert_allclose(xt.grad.numpy(), want, rtol=1e-12, atol=1e-12)


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,mode,kw", CASES)
def test_values_and_gradient_match_torch(shape: tuple, mode: str, kw: dict, dtype: str) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(dtype)
    results = []
    for lib in (fg, torch):
        xt = lib.tensor(x, requires_grad=True)
        out = lib.nn.functional.interpolate(xt, mode=mode, **kw)
        g = np.random.default_rng(3).standard_normal(tuple(out.shape)).astype(dtype)
        out.backward(lib.tensor(g))
        results.append((out.detach().numpy(), xt.grad.numpy()))
    tol = 2e-6 if dtype == "float32" else 1e-12
    sizes, _ = _sizes_and_scales(shape, kw)
    if (
        mode == "nearest"
        and len(shape) in (3, 5)
        and any(n == o and "scale_factor" in kw for n, o in zip(shape[2:], sizes))
    ):
        # PyTorch's backward copies a dim of unchanged size where its forward (nearest over 1
        # or 3 dims) read floor(j / scale): the gradient of what the forward computed is the
        # numpy test's; compare the values only
        results = [r[:1] for r in results]
    for a, e in zip(*results):
        assert a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=tol, atol=tol)


@needs_torch
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_a_nan_reaches_only_its_neighbours(mode: str) -> None:
    x = np.zeros((1, 1, 4, 6))
    x[0, 0, 1, 2] = np.nan
    ours = F.interpolate(fg.tensor(x), size=(8, 9), mode=mode).numpy()
    theirs = torch.nn.functional.interpolate(torch.tensor(x), size=(8, 9), mode=mode).numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    assert 0 < np.isnan(ours).sum() < ours.size


@pytest.mark.parametrize("shape,mode,kw", CASES[::2])
def test_gradcheck_and_gradgradcheck(shape: tuple, mode: str, kw: dict) -> None:
    x = fg.tensor(np.random.default_rng(4).standard_normal(shape), requires_grad=True)

    def fn(t: fg.Tensor) -> fg.Tensor:
        return F.interpolate(t, mode=mode, **kw) ** 2

    assert gradcheck(fn, (x,))
    assert gradgradcheck(fn, (x,))


def test_upsample_module_and_composite_agree() -> None:
    rng = np.random.default_rng(5)
    x = fg.tensor(rng.standard_normal((2, 3, 4, 5)).astype(np.float32), requires_grad=True)
    up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
    out = up(x)
    assert out.grad_fn._prim.name == "resample"
    out.backward(out.detach())
    fused = (out.detach().numpy(), x.grad.numpy())
    x.grad = None
    import fusegrad.autograd.forward_ad as fwAD

    with fwAD.dual_level():  # the composite runs under forward AD
        dual = fwAD.make_dual(x.detach(), fg.ones_like(x))
        composite = fwAD.unpack_dual(up(dual)).primal
    np.testing.assert_allclose(composite.numpy(), fused[0], rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rank=st.integers(1, 3),
    sizes=st.lists(st.integers(1, 6), min_size=3, max_size=3),
    factors=st.lists(st.floats(0.3, 3.0), min_size=3, max_size=3),
    mode=st.sampled_from(["nearest", "nearest-exact", "linear"]),
    align=st.booleans(),
)
def test_property_against_the_reference(
    rank: int, sizes: list, factors: list, mode: str, align: bool
) -> None:
    shape = (2, 1, *sizes[:rank])
    factors = factors[:rank]
    if any(math.floor(n * f) < 1 for n, f in zip(shape[2:], factors)):
        return
    real_mode = LINEAR[rank + 2] if mode == "linear" else mode
    kw: dict = {"scale_factor": tuple(factors)}
    if mode == "linear":
        kw["align_corners"] = align
    x = np.random.default_rng(sum(sizes)).standard_normal(shape)
    out = F.interpolate(fg.tensor(x), mode=real_mode, **kw)
    out_sizes = [math.floor(n * f) for n, f in zip(shape[2:], factors)]
    want = _ref(x, out_sizes, factors, mode, align and mode == "linear")
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-12)
