"""The non-differentiable top-level composites of ``ops/composites.py`` (predicates, creation
functions, index helpers) against PyTorch, and their errors; the differentiable ones are rows of
the op table."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import fusegrad as fg

torch = pytest.importorskip("torch")

C = np.array([0.0, -0.0, 1.5, -2.5, np.inf, -np.inf, np.nan, 3.0])
D = np.array([2.0, -2.0, -1.0, 0.7, 1.0, 2.0, 0.0, -0.0])


def _same(ours: object, theirs: object) -> None:
    if isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs)
        for o, t in zip(ours, theirs):
            _same(o, t)
        return
    assert tuple(ours.shape) == tuple(theirs.shape)
    assert ours.dtype.name == str(theirs.dtype).replace("torch.", "")
    np.testing.assert_allclose(
        np.asarray(ours.numpy(), float), theirs.double().numpy(), rtol=1e-6, atol=1e-7
    )


CASES = {
    "signbit": lambda m: m.signbit(m.tensor(C)),
    "isneginf": lambda m: m.isneginf(m.tensor(C)),
    "isposinf": lambda m: m.isposinf(m.tensor(C)),
    "isreal": lambda m: m.isreal(m.tensor(C)),
    "heaviside": lambda m: m.heaviside(m.tensor(C), m.tensor(D)),
    "isin": lambda m: m.isin(m.tensor([[1, 2], [3, 4]]), m.tensor([2, 4, 9])),
    "isin_invert": lambda m: m.isin(m.tensor([1, 2, 3]), m.tensor([2]), invert=True),
    "fmod_int": lambda m: m.fmod(m.tensor([-7, 7, 5, -5]), m.tensor([3, -3, 2, 2])),
    # (without nan: PyTorch's sign and sgn give 0 there, fusegrad's sign nan, as numpy's)
    "sgn": lambda m: m.sgn(m.tensor(C[~np.isnan(C)])),
    "logspace": lambda m: m.logspace(0, 3, 4, base=2),
    "scalar_tensor": lambda m: m.scalar_tensor(3),
    "tril_indices": lambda m: m.tril_indices(3, 4, 1),
    "triu_indices": lambda m: m.triu_indices(4, 3, -1),
    "aminmax_all": lambda m: tuple(m.aminmax(m.tensor([[1.0, -2.0], [5.0, 0.0]]))),
    "float_power_int": lambda m: m.float_power(m.tensor([1, 2, 3]), 2),
    "rad2deg_int": lambda m: m.rad2deg(m.tensor([1, 2])),
    "meshgrid_ij3": lambda m: m.meshgrid(
        m.tensor([1, 2]), m.tensor([3, 4, 5]), m.tensor([6, 7, 8, 9]), indexing="ij"
    ),
    "meshgrid_xy3": lambda m: m.meshgrid(
        m.tensor([1, 2]), m.tensor([3, 4, 5]), m.tensor([6, 7, 8, 9]), indexing="xy"
    ),
    "hsplit_1d": lambda m: m.hsplit(m.arange(6), 3),
    "vsplit": lambda m: m.vsplit(m.ones(4, 2), [1, 3]),
    "atleast_2d_tuple": lambda m: m.atleast_2d((m.tensor(1.0), m.tensor([1.0, 2.0]))),
    "block_diag_empty": lambda m: m.block_diag(m.ones(0, 2), m.ones(1, 1)),
    "bincount": lambda m: m.bincount(m.tensor([1, 1, 3]), minlength=6),
    "bincount_weights": lambda m: m.bincount(m.tensor([1, 1, 3]), m.tensor([0.5, 1.0, 2.0])),
    "unravel_index": lambda m: m.unravel_index(m.tensor([4, -1, 7]), (2, 4)),
    "quantile_nan": lambda m: m.quantile(m.tensor([[1.0, math.nan], [2.0, 3.0]]), 0.5, dim=0),
    "nanquantile_all_nan": lambda m: m.nanquantile(
        m.tensor([[math.nan, math.nan], [2.0, 3.0]]), 0.5, dim=1
    ),
    "cov_1d": lambda m: m.cov(m.tensor([1.0, 2.5, 4.0, 3.0])),
    "unique_consecutive": lambda m: m.unique_consecutive(
        m.tensor([1, 1, 2, 2, 3, 1, 1, 2]), return_inverse=True, return_counts=True
    ),
    "unique_consecutive_dim": lambda m: m.unique_consecutive(
        m.tensor([[1, 1], [1, 1], [2, 3], [2, 3], [1, 1]]), return_counts=True, dim=0
    ),
    "unique_consecutive_nan": lambda m: m.tensor(
        [1.0, math.nan, math.nan, 2.0, 2.0]
    ).unique_consecutive(return_inverse=True),
}
for _window in ("hann", "hamming", "blackman", "bartlett", "kaiser"):
    for _periodic in (True, False):
        for _n in (0, 1, 6):
            CASES[f"{_window}_window_{_periodic}_{_n}"] = lambda m, w=_window, p=_periodic, n=_n: (
                getattr(m, f"{w}_window")(n, p)
            )


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name: str) -> None:
    _same(CASES[name](fg), CASES[name](torch))


def test_range_includes_its_end_and_warns_as_deprecated() -> None:
    with pytest.warns(UserWarning, match="torch.range is deprecated"):
        ours = fg.range(1, 4, 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same(ours, torch.range(1, 4, 0.5))


def test_meshgrid_without_indexing_warns_and_uses_ij() -> None:
    with pytest.warns(UserWarning, match="indexing"):
        a, b = fg.meshgrid(fg.tensor([1, 2]), fg.tensor([3, 4, 5]))
    assert a.shape == (2, 3) and b.tolist() == [[3, 4, 5], [3, 4, 5]]


def test_randint_like_keeps_shape_and_dtype_and_range() -> None:
    x = fg.zeros(50, 3, dtype=fg.int32)
    r = fg.randint_like(x, 3, 6)
    assert r.shape == (50, 3) and r.dtype is fg.int32
    assert set(np.unique(r.numpy())) <= {3, 4, 5}


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: fg.trace(fg.ones(2, 2, 2)), RuntimeError, "expected a matrix"),
        (lambda: fg.frac(fg.tensor([1, 2])), TypeError, "frac"),
        (lambda: fg.heaviside(fg.ones(2), fg.ones(2, dtype=fg.float64)), TypeError, "dtypes"),
        (lambda: fg.rot90(fg.ones(2, 2), 1, (0, 0)), RuntimeError, "different"),
        (lambda: fg.fliplr(fg.ones(3)), RuntimeError, ">= 2-d"),
        (lambda: fg.vsplit(fg.ones(3, 2), 2), RuntimeError, "not divisible"),
        (lambda: fg.tensordot(fg.ones(2, 3), fg.ones(4, 3), ([1], [0])), RuntimeError, "match"),
        (lambda: fg.positive(fg.tensor([True])), TypeError, "bool"),
        (lambda: fg.hann_window(3, dtype=fg.int64), TypeError, "floating point"),
        (lambda: fg.meshgrid(fg.ones(2, 2), indexing="ij"), RuntimeError, "0D or 1D"),
        (lambda: fg.quantile(fg.ones(3), 1.5), ValueError, r"range \[0, 1\]"),
        (lambda: fg.bincount(fg.tensor([1, -1])), ValueError, "non-negative"),
        (lambda: fg.mvlgamma(fg.tensor([0.5]), 3), ValueError, "greater than"),
        (lambda: fg.fill(fg.ones(2), fg.ones(2)), RuntimeError, "0-dimension"),
    ],
)
def test_errors(call: object, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        call()  # type: ignore[operator]
