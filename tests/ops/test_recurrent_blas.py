"""The recurrent kernels' per-step products (``ops/recurrent_kernels.py``): the kernels call
numpy's own BLAS through its CBLAS interface where numpy exports one (``BLAS``), else numba's
``np.dot``.  Both paths give the same forward values and gradients, within float rounding, for
every mode, both float dtypes, both directions, an LSTM's projection and packed sequences; so
does the CBLAS interface with 32-bit integers (tried on scipy's OpenBLAS); the product helper
itself against numpy's matmul over shapes (hypothesis), the empty ones included.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

numba = pytest.importorskip("numba")

from fusegrad.ops import recurrent_kernels as rk  # noqa: E402

MODES = ("LSTM", "GRU", "RNN_TANH", "RNN_RELU")
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
TOLERANCE = {np.float32: {"rtol": 2e-5, "atol": 2e-6}, np.float64: {"rtol": 1e-12, "atol": 1e-13}}


def test_numpys_openblas_is_called_through_its_ilp64_cblas() -> None:
    """numpy's wheels ship OpenBLAS with 64-bit integers: the kernels find its CBLAS
    functions (where numpy's BLAS is something else, this test does not apply)."""
    config = np.show_config(mode="dicts")
    blas = config.get("Build Dependencies", {}).get("blas", {})
    if "openblas" not in str(blas.get("name", "")) or "USE64BITINT" not in str(
        blas.get("openblas configuration", "")
    ):
        pytest.skip(f"numpy's BLAS is {blas.get('name')!r}, not a 64-bit-integer OpenBLAS")
    assert isinstance(rk.BLAS, np.int64)


def _scipy_blas_lp64() -> object:
    """The kernels' ``blas`` argument for scipy's BLAS's CBLAS with 32-bit integers (scipy's
    wheels ship an OpenBLAS with them), registered for this test process; skips where scipy's
    BLAS exports none, or where the kernels already use a 32-bit CBLAS (registering another
    under the same names would change which library they call)."""
    if isinstance(rk.BLAS, np.int32):
        pytest.skip("the kernels already call a CBLAS with 32-bit integers (covered above)")
    cython_blas = pytest.importorskip("scipy.linalg.cython_blas")
    blas = rk._bind_cblas(ctypes.CDLL(cython_blas.__file__), widths=(32,))
    if blas is None:
        pytest.skip("scipy's BLAS exports no CBLAS with 32-bit integers")
    assert isinstance(blas, np.int32)
    return blas


def _layer(mode: str, dtype: type, proj: bool, packed: bool, rng: np.random.Generator) -> dict:
    hidden, size = 7, (3 if proj else 7)
    batch = 4
    gates = GATES[mode] * hidden
    batch_sizes = (4, 4, 3, 1, 1) if packed else None
    rows = sum(batch_sizes) if packed else None
    x_shape = (rows, gates) if packed else (5, batch, gates)
    arrays = {
        "x_gates": rng.standard_normal(x_shape),
        "w_hh": rng.standard_normal((gates, size)) * 0.4,
        "h0": rng.standard_normal((batch, size)) * 0.5,
        "c0": rng.standard_normal((batch, hidden)) * 0.5 if mode == "LSTM" else None,
        "b_hh": rng.standard_normal(gates) * 0.1,
        "w_hr": rng.standard_normal((size, hidden)) * 0.4 if proj else None,
    }
    arrays = {k: None if a is None else a.astype(dtype) for k, a in arrays.items()}
    arrays["batch_sizes"] = batch_sizes
    return arrays


def _forward_backward(mode: str, reverse: bool, a: dict, rng: np.random.Generator) -> tuple:
    out = rk.rnn_forward(
        mode, a["x_gates"], a["w_hh"], a["h0"], a["c0"], a["b_hh"], reverse, a["w_hr"],
        a["batch_sizes"],
    )  # fmt: skip
    g = np.random.default_rng(5).standard_normal(out.shape).astype(out.dtype)
    rows = int(np.prod(a["x_gates"].shape[:-1]))
    size, hidden = a["w_hh"].shape[1], a["w_hh"].shape[0] // GATES[mode]
    parts = [rk.packed_parts(v, rows, size, rk.STATE_WIDTH[mode] * hidden) for v in (g, out)]
    grads = rk.rnn_backward(
        mode, *parts[0], *parts[1], a["w_hh"], a["h0"], a["c0"], reverse, a["w_hr"],
        a["batch_sizes"],
    )  # fmt: skip
    return out, grads


CASES = [(mode, False, False) for mode in MODES]
CASES += [
    ("LSTM", True, False),
    ("LSTM", True, True),
    ("GRU", False, True),
    ("RNN_TANH", False, True),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forwards", "reverse"])
@pytest.mark.parametrize(("mode", "proj", "packed"), CASES)
def test_cblas_and_numba_dot_agree(
    mode: str, proj: bool, packed: bool, reverse: bool, dtype: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels' outputs and every gradient with numpy's CBLAS (as found) and with numba's
    ``np.dot`` (``BLAS`` None): the same within float rounding (only the products' summation
    order may differ)."""
    if rk.BLAS is None:
        pytest.skip("numpy exports no CBLAS here: the kernels already use numba's np.dot")
    rng = np.random.default_rng(3)
    arrays = _layer(mode, dtype, proj, packed, rng)
    out, grads = _forward_backward(mode, reverse, arrays, rng)
    monkeypatch.setattr(rk, "BLAS", None)
    out_dot, grads_dot = _forward_backward(mode, reverse, arrays, rng)
    assert out.dtype == out_dot.dtype == dtype and grads.dtype == dtype
    np.testing.assert_allclose(out, out_dot, **TOLERANCE[dtype])
    np.testing.assert_allclose(grads, grads_dot, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize(("mode", "proj", "packed"), [("LSTM", True, True), ("GRU", False, False)])
def test_a_cblas_with_32_bit_integers_agrees(
    mode: str, proj: bool, packed: bool, dtype: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels' other CBLAS interface (32-bit integers, as a CBLAS other than numpy's
    OpenBLAS has), here scipy's: the same values and gradients as numba's ``np.dot``."""
    blas = _scipy_blas_lp64()
    rng = np.random.default_rng(4)
    arrays = _layer(mode, dtype, proj, packed, rng)
    monkeypatch.setattr(rk, "BLAS", blas)
    out, grads = _forward_backward(mode, True, arrays, rng)
    monkeypatch.setattr(rk, "BLAS", None)
    out_dot, grads_dot = _forward_backward(mode, True, arrays, rng)
    np.testing.assert_allclose(out, out_dot, **TOLERANCE[dtype])
    np.testing.assert_allclose(grads, grads_dot, **TOLERANCE[dtype])


@numba.njit(cache=False)
def _product(a, b, out, blas):  # type: ignore[no-untyped-def]
    rk._gemm(a, b, out, blas)


@numba.njit(cache=False)
def _product_of_rows(a, b, out, first, rows, blas):  # type: ignore[no-untyped-def]
    """The product of a slice of rows, written into the same rows of ``out`` (as the kernels'
    per-step products of one step's rows)."""
    rk._gemm(a[first : first + rows], b, out[first : first + rows], blas)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(0, 9),
    k=st.integers(0, 9),
    n=st.integers(0, 9),
    double=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gemm_matches_matmul(m: int, k: int, n: int, double: bool, seed: int) -> None:
    """``_gemm`` writes ``a @ b`` over shapes with empty dimensions too (k = 0: zeros), through
    the CBLAS binding and through ``np.dot``; a slice of rows writes those rows only."""
    dtype = np.float64 if double else np.float32
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    expected = a @ b
    choices = [None] if rk.BLAS is None else [rk.BLAS, None]
    if isinstance(rk.BLAS, np.int64):
        choices.append(_scipy_blas_lp64())
    for blas in choices:
        out = np.full((m, n), np.nan, dtype)
        _product(a, b, out, blas)
        np.testing.assert_allclose(out, expected, **TOLERANCE[dtype])
        if m >= 2:
            out = np.full((m, n), 7.0, dtype)
            _product_of_rows(a, b, out, 1, m - 1, blas)
            np.testing.assert_array_equal(out[:1], np.full((1, n), 7.0, dtype))
            np.testing.assert_allclose(out[1:], expected[1:], **TOLERANCE[dtype])
