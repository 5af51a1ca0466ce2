"""Output dtypes: PyTorch's type promotion (dimensioned tensors > 0-d tensors > Python numbers,
by category bool < integer < floating) and the dtype rules of individual ops.  Each case is
written once against a library namespace and checked against the expected dtype name, and
against PyTorch where it is installed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from op_table import FG, Lib, torch_lib

import fusegrad


def _t(m: Lib, data: Any, dtype: str | None = None) -> Any:
    return m.tensor(data, dtype=None if dtype is None else getattr(m, dtype))


f32 = lambda m, *s: m.ones(tuple(s), dtype=m.float32)
f64 = lambda m, *s: m.ones(tuple(s), dtype=m.float64)
i64 = lambda m, *s: m.ones(tuple(s), dtype=m.int64)
i32 = lambda m, *s: m.ones(tuple(s), dtype=m.int32)
b8 = lambda m, *s: m.ones(tuple(s), dtype=m.bool)

CASES: list[tuple[str, Callable[[Lib], Any], str]] = [
    # Python numbers are weak
    ("f32*float", lambda m: f32(m, 3) * 2.5, "float32"),
    ("f32+int", lambda m: f32(m, 3) + 2, "float32"),
    ("float*f32", lambda m: 2.5 * f32(m, 3), "float32"),
    ("f64*float", lambda m: f64(m, 3) * 0.1, "float64"),
    ("i64*float", lambda m: i64(m, 3) * 2.5, "float32"),
    ("i32*int", lambda m: i32(m, 3) * 2, "int32"),
    ("i64+bool", lambda m: i64(m, 3) + True, "int64"),
    ("bool+int", lambda m: b8(m, 3) + 1, "int64"),
    ("bool*float", lambda m: b8(m, 3) * 1.5, "float32"),
    ("i32/int", lambda m: i32(m, 3) / 2, "float32"),
    ("float**i64", lambda m: 2.0 ** i64(m, 3), "float32"),
    # tensors of the same category: the wider wins; across categories the higher category
    ("f32+f64", lambda m: f32(m, 3) + f64(m, 3), "float64"),
    ("f64+f32", lambda m: f64(m, 3) + f32(m, 3), "float64"),
    ("i32+i64", lambda m: i32(m, 3) + i64(m, 3), "int64"),
    ("i64+f32", lambda m: i64(m, 3) + f32(m, 3), "float32"),
    ("i64*f64", lambda m: i64(m, 3) * f64(m, 3), "float64"),
    ("bool+i32", lambda m: b8(m, 3) + i32(m, 3), "int32"),
    ("bool&bool", lambda m: b8(m, 3) & b8(m, 3), "bool"),
    ("bool+bool", lambda m: b8(m, 3) + b8(m, 3), "bool"),
    # 0-d tensors are weaker than dimensioned ones of the same category
    ("f32+0d_f64", lambda m: f32(m, 3) + f64(m), "float32"),
    ("i32+0d_i64", lambda m: i32(m, 3) + i64(m), "int32"),
    ("i64+0d_f64", lambda m: i64(m, 3) + f64(m), "float64"),
    ("0d_i64+0d_f64", lambda m: i64(m) + f64(m), "float64"),
    ("0d_f32+0d_f64", lambda m: f32(m) + f64(m), "float64"),
    ("0d_f64*float", lambda m: f64(m) * 2.5, "float64"),
    # true division of integers gives the default float dtype
    ("i64/i64", lambda m: i64(m, 3) / i64(m, 3), "float32"),
    ("i32/i32", lambda m: m.div(i32(m, 3), i32(m, 3)), "float32"),
    ("i64//i64", lambda m: i64(m, 3) // i64(m, 3), "int64"),
    ("i64_div_floor", lambda m: m.div(i64(m, 3), 2, rounding_mode="floor"), "int64"),
    ("i64_div_trunc", lambda m: m.div(i64(m, 3), 2, rounding_mode="trunc"), "int64"),
    ("f32_div_trunc", lambda m: m.div(f32(m, 3), 2, rounding_mode="trunc"), "float32"),
    ("i64%int", lambda m: i64(m, 3) % 2, "int64"),
    # comparisons and predicates are bool
    ("f32<f64", lambda m: f32(m, 3) < f64(m, 3), "bool"),
    ("i64==float", lambda m: i64(m, 3) == 1.0, "bool"),
    ("isnan", lambda m: m.isnan(f32(m, 3)), "bool"),
    ("isfinite_int", lambda m: m.isfinite(i64(m, 3)), "bool"),
    ("logical_and", lambda m: m.logical_and(f32(m, 3), i64(m, 3)), "bool"),
    ("logical_not", lambda m: m.logical_not(f64(m, 3)), "bool"),
    ("all_float", lambda m: f32(m, 3).all(), "bool"),
    # float functions of integers give the default float dtype
    ("exp_int", lambda m: m.exp(i64(m, 3)), "float32"),
    ("sqrt_int", lambda m: m.sqrt(i32(m, 3)), "float32"),
    ("sigmoid_int", lambda m: m.sigmoid(i64(m, 3)), "float32"),
    ("sin_bool", lambda m: m.sin(b8(m, 3)), "float32"),
    ("log2_int", lambda m: m.log2(i64(m, 3)), "float32"),
    ("erf_int", lambda m: m.erf(i64(m, 3)), "float32"),
    ("reciprocal_int", lambda m: m.reciprocal(i64(m, 3)), "float32"),
    ("rsqrt_f64", lambda m: m.rsqrt(f64(m, 3)), "float64"),
    ("gelu_f64", lambda m: m.F.gelu(f64(m, 3)), "float64"),
    ("softplus_f64", lambda m: m.F.softplus(f64(m, 3)), "float64"),
    # ops that keep integer dtypes
    ("abs_int", lambda m: m.abs(i32(m, 3)), "int32"),
    ("neg_int", lambda m: -i64(m, 3), "int64"),
    ("square_int", lambda m: m.square(i64(m, 3)), "int64"),
    ("relu_int", lambda m: m.relu(i64(m, 3)), "int64"),
    ("floor_int", lambda m: m.floor(i32(m, 3)), "int32"),
    ("round_int", lambda m: m.round(i64(m, 3)), "int64"),
    ("sign_int", lambda m: m.sign(i64(m, 3)), "int64"),
    ("clamp_int", lambda m: m.clamp(i64(m, 3), 0, 2), "int64"),
    ("clamp_int_float_bound", lambda m: m.clamp(i64(m, 3), min=0.5), "float32"),
    ("maximum_i32_f64", lambda m: m.maximum(i32(m, 3), f64(m, 3)), "float64"),
    ("where_mixed", lambda m: m.where(b8(m, 3), i64(m, 3), f32(m, 3)), "float32"),
    ("where_scalar", lambda m: m.where(b8(m, 3), f32(m, 3), 0.0), "float32"),
    ("where_int_scalar", lambda m: m.where(b8(m, 3), i32(m, 3), 0), "int32"),
    ("tril_bool", lambda m: m.tril(b8(m, 3, 3)), "bool"),
    ("triu_i32", lambda m: m.triu(i32(m, 3, 3)), "int32"),
    # reductions
    ("sum_bool", lambda m: b8(m, 3).sum(), "int64"),
    ("sum_i32", lambda m: i32(m, 3).sum(), "int64"),
    ("sum_f32", lambda m: f32(m, 3).sum(), "float32"),
    ("sum_dtype", lambda m: f32(m, 3).sum(dtype=m.float64), "float64"),
    ("prod_i32", lambda m: i32(m, 3).prod(), "int64"),
    ("cumsum_bool", lambda m: b8(m, 3).cumsum(0), "int64"),
    ("mean_f64", lambda m: f64(m, 3).mean(), "float64"),
    ("mean_dtype", lambda m: i64(m, 3).mean(dtype=m.float64), "float64"),
    ("amax_i32", lambda m: i32(m, 3).amax(), "int32"),
    ("max_int", lambda m: i64(m, 3).max(), "int64"),
    ("argmax", lambda m: f32(m, 3).argmax(), "int64"),
    ("max_dim_indices", lambda m: f32(m, 2, 3).max(dim=1).indices, "int64"),
    ("var_f64", lambda m: f64(m, 3).var(), "float64"),
    ("norm_f64", lambda m: f64(m, 3).norm(), "float64"),
    ("logsumexp_int", lambda m: m.logsumexp(i64(m, 3), 0), "float32"),
    ("count_nonzero", lambda m: m.count_nonzero(f32(m, 3)), "int64"),
    # shape ops, indexing, creation
    ("cat_mixed", lambda m: m.cat([i32(m, 2), f64(m, 2)]), "float64"),
    ("cat_int_bool", lambda m: m.cat([i32(m, 2), b8(m, 2)]), "int32"),
    ("stack_f32_f64", lambda m: m.stack([f32(m, 2), f64(m, 2)]), "float64"),
    ("one_hot", lambda m: m.F.one_hot(m.tensor([0, 2]), 3), "int64"),
    ("masked_fill_int", lambda m: i64(m, 3).masked_fill(b8(m, 3), 2), "int64"),
    ("gather_i32", lambda m: i32(m, 3).gather(0, m.tensor([0, 1])), "int32"),
    ("tensor_float", lambda m: m.tensor([1.0, 2.0]), "float32"),
    ("tensor_int", lambda m: m.tensor([1, 2]), "int64"),
    ("tensor_bool", lambda m: m.tensor([True]), "bool"),
    ("tensor_mixed", lambda m: m.tensor([1, 2.5]), "float32"),
    ("tensor_empty", lambda m: m.tensor([]), "float32"),
    ("arange_int", lambda m: m.arange(3), "int64"),
    ("arange_float", lambda m: m.arange(0, 1, 0.25), "float32"),
    ("full_int", lambda m: m.full((2,), 3), "int64"),
    ("full_float", lambda m: m.full((2,), 3.0), "float32"),
    ("full_bool", lambda m: m.full((2,), True), "bool"),
    ("zeros_like_i32", lambda m: m.zeros_like(i32(m, 2)), "int32"),
    ("float()", lambda m: i64(m, 2).float(), "float32"),
    ("double()", lambda m: i64(m, 2).double(), "float64"),
    ("long()", lambda m: f32(m, 2).long(), "int64"),
    ("to(int32)", lambda m: f32(m, 2).to(m.int32), "int32"),
    ("matmul_int", lambda m: i64(m, 2, 2) @ i64(m, 2), "int64"),
    ("einsum_f64", lambda m: m.einsum("ij,j->i", f64(m, 2, 2), f64(m, 2)), "float64"),
]


def _name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "").replace("fusegrad.", "")


@pytest.mark.parametrize("name,fn,expected", CASES, ids=[c[0] for c in CASES])
def test_result_dtype(name: str, fn: Callable, expected: str) -> None:
    assert _name(fn(FG).dtype) == expected


@pytest.mark.parametrize("name,fn,expected", CASES, ids=[c[0] for c in CASES])
def test_result_dtype_matches_torch(name: str, fn: Callable, expected: str) -> None:
    pytest.importorskip("torch")
    assert _name(fn(torch_lib()).dtype) == expected


def test_default_dtype_changes_promotion() -> None:
    fusegrad.set_default_dtype(fusegrad.float64)
    try:
        assert (fusegrad.ones(2, dtype=fusegrad.int64) / 2).dtype is fusegrad.float64
        assert fusegrad.tensor([1.5]).dtype is fusegrad.float64
        assert (fusegrad.ones(2, dtype=fusegrad.float32) * 2.5).dtype is fusegrad.float32
    finally:
        fusegrad.set_default_dtype(fusegrad.float32)
    assert fusegrad.tensor([1.5]).dtype is fusegrad.float32


def test_gradient_dtype_follows_input() -> None:
    """Mixed-precision graphs: each leaf's gradient has the leaf's own dtype."""
    a = fusegrad.ones(3, dtype=fusegrad.float32, requires_grad=True)
    b = fusegrad.ones(3, dtype=fusegrad.float64, requires_grad=True)
    (a * b).sum().backward()
    assert a.grad.dtype is fusegrad.float32 and b.grad.dtype is fusegrad.float64
    c = fusegrad.ones(3, dtype=fusegrad.float32, requires_grad=True)
    (c.double() ** 2).sum().backward()
    assert c.grad.dtype is fusegrad.float32


def test_scalar_precision_is_kept_in_float64() -> None:
    """A Python float exponent saved by pow keeps float64 precision in the derivative rule."""
    x = fusegrad.tensor([1.3, 2.7], dtype=fusegrad.float64, requires_grad=True)
    (x ** (1.0 / 3.0)).sum().backward()
    expected = (1.0 / 3.0) * x.detach().numpy() ** (-2.0 / 3.0)
    assert abs(x.grad.numpy() - expected).max() < 1e-15
