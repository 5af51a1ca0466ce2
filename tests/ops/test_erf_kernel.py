"""The float32 ``erf`` kernel (``ops/erf_kernels.py``): the compiler's vectorisable helper in
a numba loop, used by eager ``erf`` (and ``F.gelu``) from ``_ERF_LOOP_MIN`` elements on.  Its
values are checked against float64 scipy over a dense grid and at the special values, and
against compiled code's."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special

import fusegrad as fg
from fusegrad.ops import primitives


def _ulps(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    return np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32))


def test_float32_erf_is_within_a_ulp_and_a_fraction_of_the_exact_value() -> None:
    x = np.linspace(-6.0, 6.0, 400_001, dtype=np.float32)
    x = np.concatenate([x, np.float32(2.0) ** np.arange(-140, 3, dtype=np.float32)])
    got = fg.erf(fg.tensor(x)).numpy()
    assert got.dtype == np.float32
    # fast_erf_f32 is <= 1 ulp from the correctly rounded value: <= 1.5 from the exact one
    assert float(_ulps(got, scipy.special.erf(x.astype(np.float64))).max()) <= 1.5


def test_special_values_and_shapes() -> None:
    values = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 3.92, -4.5, 1e-30], np.float32)
    x = np.tile(values, 16).reshape(2, 8, 8)  # above the loop's threshold, not flat
    got = fg.erf(fg.tensor(x)).numpy()
    assert got.shape == x.shape
    first = got.reshape(-1)[: len(values)]
    assert np.isnan(first[0])
    np.testing.assert_array_equal(first[1:6], [1.0, -1.0, -0.0, 0.0, 1.0])
    assert np.signbit(first[3]) and not np.signbit(first[4])
    assert first[6] == -1.0 and first[7] == np.float32(2 / np.sqrt(np.pi) * 1e-30)
    # a non-contiguous operand
    strided = fg.tensor(np.linspace(-3, 3, 400, dtype=np.float32).reshape(20, 20)).t()
    want = scipy.special.erf(strided.numpy().astype(np.float64))
    assert float(_ulps(fg.erf(strided).numpy(), want).max()) <= 1.5


@pytest.mark.parametrize("n", [primitives._ERF_LOOP_MIN - 1, primitives._ERF_LOOP_MIN])
def test_both_paths_agree_around_the_threshold(n: int) -> None:
    x = np.linspace(-3.5, 3.5, n, dtype=np.float32)
    got = fg.erf(fg.tensor(x)).numpy()
    assert float(_ulps(got, scipy.special.erf(x.astype(np.float64))).max()) <= 1.5


def test_float64_stays_scipys() -> None:
    x = np.linspace(-5, 5, 1001)
    np.testing.assert_array_equal(fg.erf(fg.tensor(x)).numpy(), scipy.special.erf(x))


def test_gelu_gradient_in_float64_and_float32_against_float64() -> None:
    from fusegrad.autograd.gradcheck import gradcheck

    x = fg.tensor(np.linspace(-3, 3, 70), requires_grad=True)
    assert gradcheck(fg.nn.functional.gelu, (x,))
    x32 = fg.tensor(np.linspace(-3, 3, 700, dtype=np.float32), requires_grad=True)
    y = fg.nn.functional.gelu(x32)
    y.sum().backward()
    x64 = fg.tensor(np.linspace(-3, 3, 700), requires_grad=True)
    y64 = fg.nn.functional.gelu(x64)
    y64.sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), y64.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(x32.grad.numpy(), x64.grad.numpy(), rtol=1e-5, atol=1e-6)
