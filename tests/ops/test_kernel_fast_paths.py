"""The eager kernels' fast paths give exactly what their plain numpy formulas give.

``where`` selects on the items' bits for large C-contiguous numeric arrays, and ``sigmoid``
computes its formula (PyTorch's 1 / (1 + exp(-x)) for float32 and float64, the stable one for
float16) in place, with fewer numpy calls; both must match the plain formula bit for
bit (values, NaN payloads, signed zeros), in dtype, shape, strides and ownership, and leave
their inputs alone.  The references are numpy's own ``np.where`` and the formula the kernel
documents, computed here."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fusegrad.ops.registry import REGISTRY

FLOATS = [np.float16, np.float32, np.float64]
WHERE_DTYPES = [*FLOATS, np.int16, np.int32, np.int64, np.uint32, np.uint64, np.int8, np.bool_]
SHAPES = [(5000,), (64, 100), (2, 3, 1000), (4096,), (100,), (1, 4100), (0,)]


def _assert_identical(got: np.ndarray, want: np.ndarray) -> None:
    assert type(got) is type(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.strides == want.strides
    assert got.flags.owndata == want.flags.owndata and got.flags.writeable == want.flags.writeable
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def _values(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
    """Random values with the awkward ones mixed in for float dtypes: NaNs with odd payloads
    and signs, signed zeros and infinities."""
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    if np.dtype(dtype).kind == "f" and a.size:
        flat = a.reshape(-1)
        flat[::7] = np.nan
        flat[1::7] = -0.0
        flat[2::7] = np.inf
        flat[3::11] = -np.inf
        flat.view(np.uint8)[::97] ^= 1  # NaN payloads and low bits that differ
    return a


@pytest.mark.parametrize("dtype", WHERE_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_where_kernel_is_np_where_bit_for_bit(dtype: Any, shape: tuple) -> None:
    rng = np.random.default_rng(len(shape) * 1000 + np.dtype(dtype).num)
    where = REGISTRY["where"].kernel
    a, b = _values(rng, shape, dtype), _values(rng, shape, dtype)
    cond = rng.random(shape) > 0.5
    # a bool array whose true bytes are not all 1 (np.where reads any nonzero byte as true)
    odd = cond.view(np.uint8).copy()
    odd[::5] *= 2
    odd_cond = odd.view(np.bool_)
    scalars = [np.array(0, dtype), np.array(True if dtype == np.bool_ else 7, dtype)]
    if np.dtype(dtype).kind == "f":
        scalars += [np.array(-0.0, dtype), np.array(np.nan, dtype)]
    for c in (cond, odd_cond):
        before = (c.tobytes(), a.tobytes(), b.tobytes())
        cases = [(c, a, b)] + [(c, a, s) for s in scalars] + [(c, s, b) for s in scalars]
        for args in cases:
            _assert_identical(where(*args), np.where(*args))
        assert (c.tobytes(), a.tobytes(), b.tobytes()) == before


def test_where_kernel_on_other_layouts_is_np_where() -> None:
    rng = np.random.default_rng(3)
    where = REGISTRY["where"].kernel
    a = _values(rng, (80, 90), np.float32)
    cond = rng.random((80, 90)) > 0.5
    zero = np.array(0, np.float32)
    for args in [
        (cond.T, a.T, zero),  # F-contiguous
        (cond[:, ::2], a[:, ::2], zero),  # strided
        (cond, a[0], zero),  # broadcast
        (cond, a, np.zeros((80, 90), np.float64)),  # mixed dtypes
    ]:
        _assert_identical(where(*args), np.where(*args))


def _sigmoid_formula(x: np.ndarray) -> np.ndarray:
    """The kernel's documented formula, spelled as plainly as possible: PyTorch's for float32 and
    float64, the stable one for float16."""
    with np.errstate(all="ignore"):
        if x.dtype in (np.float32, np.float64):
            return np.asarray(1 / (1 + np.exp(-x)), x.dtype)
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(1000,), (7, 13), (), (0,), (3, 1, 5), (1, 4), (4, 1)], ids=str)
@pytest.mark.parametrize("scale", [0.1, 10.0, 1e4])
def test_sigmoid_kernel_is_its_formula_bit_for_bit(dtype: Any, shape: tuple, scale: float) -> None:
    rng = np.random.default_rng(int(scale * 10) + len(shape))
    sigmoid = REGISTRY["sigmoid"].kernel
    with np.errstate(all="ignore"):
        x = (rng.standard_normal(shape) * scale).astype(dtype)
    layouts = [x]
    if x.ndim > 1:
        layouts.append(x.T)
    if x.ndim == 1:
        layouts.append(x[::2])
    for v in layouts:
        before = v.tobytes()
        _assert_identical(sigmoid(v), _sigmoid_formula(v))
        assert v.tobytes() == before


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_sigmoid_kernel_at_special_values(dtype: Any) -> None:
    big = float(np.finfo(dtype).max)
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, big, -big, 1e-7, -1e-7], dtype)
    _assert_identical(REGISTRY["sigmoid"].kernel(x), _sigmoid_formula(x))
