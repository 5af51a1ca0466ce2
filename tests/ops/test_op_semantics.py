"""Op-level semantics the table cannot express: which results are views (shared storage and
version counter) and which are copies, dropout's statistics, edge cases of shape ops, and
printing (compared with PyTorch's repr where it is installed)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from op_table import FG, Lib, torch_lib

import fusegrad
from fusegrad.ops import functional as F

# ---- views and copies ---------------------------------------------------------------------------

VIEWS: list[tuple[str, Callable[[Any], Any]]] = [
    ("view", lambda x: x.view(12)),
    ("reshape_contiguous", lambda x: x.reshape(4, 3)),
    ("reshape_same", lambda x: x.reshape(3, 4)),
    ("flatten", lambda x: x.flatten()),
    ("transpose", lambda x: x.transpose(0, 1)),
    ("permute", lambda x: x.permute(1, 0)),
    ("T", lambda x: x.T),
    ("mT", lambda x: x.mT),
    ("t", lambda x: x.t()),
    ("unsqueeze", lambda x: x.unsqueeze(0)),
    ("squeeze", lambda x: x.unsqueeze(1).squeeze(1)),
    ("expand", lambda x: x[:1].expand(5, 4)),
    ("broadcast_to", lambda x: x.broadcast_to((2, 3, 4))),
    ("slice", lambda x: x[1:, ::2]),
    ("row", lambda x: x[1]),
    ("element", lambda x: x[1, 2]),
    ("element_1d", lambda x: x[1][2]),
    ("ellipsis", lambda x: x[..., 0]),
    ("none", lambda x: x[None]),
    ("narrow", lambda x: x.narrow(1, 1, 2)),
    ("select", lambda x: x.select(1, 3)),
    ("diagonal", lambda x: x.diagonal()),
    ("split", lambda x: x.split(2, dim=1)[1]),
    ("chunk", lambda x: x.chunk(2)[0]),
    ("unbind", lambda x: x.unbind(1)[2]),
    ("unbind_1d", lambda x: x[0].unbind(0)[1]),
    ("detach", lambda x: x.detach()),
    ("view_as", lambda x: x.view_as(fusegrad.zeros(2, 6))),
    ("unflatten", lambda x: x.unflatten(1, (2, 2))),
]


def _grid() -> fusegrad.Tensor:
    return fusegrad.arange(12.0).reshape(3, 4).clone()


@pytest.mark.parametrize("name,fn", VIEWS, ids=[n for n, _ in VIEWS])
def test_view_shares_storage_and_version(name: str, fn: Callable) -> None:
    x = _grid()
    v = fn(x)
    assert np.shares_memory(v.numpy(), x.numpy())
    before = v._version
    x.add_(100.0)
    assert v._version == before + 1, "a view shares its base's version counter"
    assert float(v.numpy().reshape(-1)[0]) >= 100.0, "the view sees the base's new values"


@pytest.mark.parametrize(
    "name,fn",
    [c for c in VIEWS if c[0] not in ("expand", "broadcast_to", "detach")],
    ids=[n for n, _ in VIEWS if n not in ("expand", "broadcast_to", "detach")],
)
def test_writing_a_view_writes_the_base(name: str, fn: Callable) -> None:
    x = _grid()
    v = fn(x)
    total, in_view = float(x.numpy().sum()), float(v.numpy().sum())
    v.mul_(0.0)
    assert x._version == 1 and not np.any(v.numpy())
    assert float(x.numpy().sum()) == total - in_view, "exactly the view's elements were zeroed"


COPIES: list[tuple[str, Callable[[Any], Any]]] = [
    ("clone", lambda x: x.clone()),
    ("contiguous_of_transpose", lambda x: x.t().contiguous()),
    ("reshape_of_transpose", lambda x: x.t().reshape(12)),
    ("flip", lambda x: x.flip((0,))),
    ("roll", lambda x: x.roll(1, 0)),
    ("cat_single", lambda x: fusegrad.cat([x])),
    ("cat", lambda x: fusegrad.cat([x, x])),
    ("stack", lambda x: fusegrad.stack([x])),
    ("repeat", lambda x: x.repeat(1, 1)),
    ("advanced_index", lambda x: x[[0, 1]]),
    ("bool_mask", lambda x: x[x > 5]),
    ("index_select", lambda x: x.index_select(0, fusegrad.tensor([0]))),
    ("gather", lambda x: x.gather(0, fusegrad.zeros(1, 4, dtype=fusegrad.int64))),
    ("masked_fill", lambda x: x.masked_fill(x > 100, 0.0)),
    ("tril", lambda x: x.tril()),
    ("add_zero", lambda x: x + 0),
    ("pad", lambda x: F.pad(x, (0, 0))),
    ("floor", lambda x: x.floor()),
    ("int_floor", lambda x: x.long().floor()),
    ("int_round", lambda x: x.long().round()),
    ("int_trunc", lambda x: x.long().trunc()),
    ("int_ceil", lambda x: x.long().ceil()),
    ("bool_sign", lambda x: (x > 3).sign()),
    ("to_same_dtype_copy", lambda x: x.to(fusegrad.float32, copy=True)),
]


@pytest.mark.parametrize("name,fn", COPIES, ids=[n for n, _ in COPIES])
def test_copy_does_not_alias(name: str, fn: Callable) -> None:
    x = _grid()
    out = fn(x)
    assert out is not x
    before = out.numpy().copy()
    x.add_(1.0)
    np.testing.assert_array_equal(out.numpy(), before)


def test_element_view_is_zero_dim() -> None:
    x = fusegrad.tensor([1.0, 2.0, 3.0])
    e = x[1]
    assert e.shape == () and e.ndim == 0
    e.add_(10.0)
    assert x.tolist() == [1.0, 12.0, 3.0]


def test_diagonal_view_is_writable() -> None:
    x = fusegrad.zeros(3, 3)
    x.diagonal().fill_(2.0)
    x.diagonal(1).add_(1.0)
    np.testing.assert_array_equal(x.numpy(), np.diag([2.0] * 3) + np.diag([1.0] * 2, 1))


def test_expand_result_rejects_inplace() -> None:
    x = fusegrad.zeros(1, 3)
    with pytest.raises(RuntimeError, match="clone"):
        x.expand(2, 3).add_(1.0)


# ---- shape-op edge cases -------------------------------------------------------------------------


def test_chunk_of_empty_dim_gives_chunks_empties() -> None:
    parts = fusegrad.zeros(0, 2).chunk(3)
    assert [tuple(p.shape) for p in parts] == [(0, 2)] * 3


def test_chunk_may_give_fewer_chunks() -> None:
    assert [p.shape[0] for p in fusegrad.zeros(5).chunk(4)] == [2, 2, 1]


def test_empty_dim_list_reduces_everything() -> None:
    x = fusegrad.ones(2, 3)
    assert x.sum(dim=[]).item() == 6.0
    assert x.mean(dim=()).item() == 1.0


def test_split_gradients_flow_to_all_parts() -> None:
    x = fusegrad.ones(5, requires_grad=True)
    a, b, c = x.split(2)
    (a.sum() * 1 + b.sum() * 2 + c.sum() * 3).backward()
    assert x.grad.tolist() == [1.0, 1.0, 2.0, 2.0, 3.0]


def test_duplicate_index_gradient_accumulates() -> None:
    x = fusegrad.zeros(3, requires_grad=True)
    idx = fusegrad.tensor([0, 2, 0, 0])
    x[idx].sum().backward()
    assert x.grad.tolist() == [3.0, 0.0, 1.0]
    x.grad = None
    x.index_select(0, idx).sum().backward()
    assert x.grad.tolist() == [3.0, 0.0, 1.0]
    x.grad = None
    x.gather(0, idx).sum().backward()
    assert x.grad.tolist() == [3.0, 0.0, 1.0]


def test_embedding_padding_idx_gets_no_gradient() -> None:
    w = fusegrad.ones(4, 2, requires_grad=True)
    F.embedding(fusegrad.tensor([1, 2, 1, 3]), w, padding_idx=1).sum().backward()
    assert w.grad.tolist() == [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]


def test_setitem_gradient() -> None:
    x = fusegrad.ones(3, 2, requires_grad=True)
    v = fusegrad.full((2,), 5.0, requires_grad=True)
    y = x * 2.0
    y[1] = v
    (y * fusegrad.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])).sum().backward()
    assert x.grad.tolist() == [[2.0, 4.0], [0.0, 0.0], [10.0, 12.0]]
    assert v.grad.tolist() == [3.0, 4.0]


# ---- dropout -------------------------------------------------------------------------------------


def test_dropout_statistics() -> None:
    fusegrad.manual_seed(0)
    p = 0.3
    x = fusegrad.ones(20000, requires_grad=True)
    y = F.dropout(x, p=p)
    values = y.detach().numpy()
    kept = values != 0
    assert abs(1.0 - kept.mean() - p) < 0.02, "fraction dropped is p"
    np.testing.assert_allclose(values[kept], 1.0 / (1.0 - p), rtol=1e-6)
    assert abs(values.mean() - 1.0) < 0.03, "expectation preserved by the 1/(1-p) scaling"
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), values, rtol=1e-6)


def test_dropout_identity_cases() -> None:
    x = fusegrad.randn(4, 3)
    np.testing.assert_array_equal(F.dropout(x, p=0.0).numpy(), x.numpy())
    np.testing.assert_array_equal(F.dropout(x, p=0.9, training=False).numpy(), x.numpy())
    assert not np.any(F.dropout(x, p=1.0).numpy())


def test_dropout_is_reproducible_under_a_seed() -> None:
    x = fusegrad.ones(50)
    fusegrad.manual_seed(3)
    a = F.dropout(x, 0.5).numpy().copy()
    fusegrad.manual_seed(3)
    b = F.dropout(x, 0.5).numpy().copy()
    np.testing.assert_array_equal(a, b)
    gen = fusegrad.Generator().manual_seed(3)
    c = F.dropout(x, 0.5, generator=gen).numpy()
    assert c.shape == (50,)


def test_dropout_rejects_bad_p() -> None:
    with pytest.raises(ValueError):
        F.dropout(fusegrad.ones(2), p=1.5)


# ---- printing ------------------------------------------------------------------------------------

REPRS: list[tuple[str, Callable[[Lib], Any], str]] = [
    ("ints_as_floats", lambda m: m.tensor([1.0, 2.0]), "tensor([1., 2.])"),
    ("fixed", lambda m: m.tensor([1.5, -2.25]), "tensor([ 1.5000, -2.2500])"),
    ("scalar", lambda m: m.tensor(3.0), "tensor(3.)"),
    ("sci_small", lambda m: m.tensor([1e-5, 1.0]), "tensor([1.0000e-05, 1.0000e+00])"),
    ("sci_ratio", lambda m: m.tensor([1000.5, 1.0]), "tensor([1.0005e+03, 1.0000e+00])"),
    ("empty", lambda m: m.tensor([]), "tensor([])"),
    ("empty_2d", lambda m: m.zeros(0, 3), "tensor([], size=(0, 3))"),
    ("empty_int", lambda m: m.zeros(0, dtype=m.int64), "tensor([], dtype=fusegrad.int64)"),
    ("bool", lambda m: m.tensor([True, False]), "tensor([ True, False])"),
    ("int", lambda m: m.tensor([1, -20]), "tensor([  1, -20])"),
    ("int32", lambda m: m.tensor([1, 2], dtype=m.int32), "tensor([1, 2], dtype=fusegrad.int32)"),
    ("float64", lambda m: m.tensor([1.0], dtype=m.float64), "tensor([1.], dtype=fusegrad.float64)"),
    ("special", lambda m: m.tensor([math.nan, math.inf, 1.0]), "tensor([nan, inf, 1.])"),
    (
        "matrix",
        lambda m: m.tensor([[1.0, 2.0], [3.0, 4.5]]),
        "tensor([[1.0000, 2.0000],\n        [3.0000, 4.5000]])",
    ),
    (
        "requires_grad",
        lambda m: m.tensor([1.0], requires_grad=True),
        "tensor([1.], requires_grad=True)",
    ),
    (
        "grad_fn",
        lambda m: m.tensor([1.0], requires_grad=True) * 2,
        "tensor([2.], grad_fn=<MulBackward0>)",
    ),
    ("summarised", lambda m: m.arange(2000.0), None),
    ("wrapped_lines", lambda m: m.arange(30.0).reshape(3, 10) / 7, None),
    ("3d_float64_grad", lambda m: m.ones(2, 3, 4, dtype=m.float64, requires_grad=True), None),
    ("big_ints", lambda m: m.arange(2000).reshape(20, 100), None),
]


def _torch_style(text: str) -> str:
    return text.replace("torch.", "fusegrad.")


@pytest.mark.parametrize("name,fn,expected", REPRS, ids=[c[0] for c in REPRS])
def test_repr(name: str, fn: Callable, expected: str | None) -> None:
    text = repr(fn(FG))
    if expected is not None:
        assert text == expected
    assert text.startswith("tensor(") and text.endswith(")")


@pytest.mark.parametrize("name,fn,expected", REPRS, ids=[c[0] for c in REPRS])
def test_repr_matches_torch(name: str, fn: Callable, expected: str | None) -> None:
    pytest.importorskip("torch")
    assert repr(fn(FG)) == _torch_style(repr(fn(torch_lib())))


# ---- Python numbers as operands -------------------------------------------------------------

SCALARS = [1.0, 0.5, 3, -2.5, 0.0, -0.0, math.inf, -math.inf, math.nan, 1e300, 2**40]
SCALAR_OPS: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("x+s", lambda x, s: x + s),
    ("s+x", lambda x, s: s + x),
    ("x-s", lambda x, s: x - s),
    ("s-x", lambda x, s: s - x),
    ("x*s", lambda x, s: x * s),
    ("s*x", lambda x, s: s * x),
    ("x/s", lambda x, s: x / s),
    ("s/x", lambda x, s: s / x),
]


# (1e300 as a float32 operand: numpy's cast of the number warns; the result is inf either way)
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("name,op", SCALAR_OPS, ids=[n for n, _ in SCALAR_OPS])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_number_operands_with_and_without_grad_mode(name: str, op: Callable, dtype: str) -> None:
    """With grad mode off the operators share one wrapped-number tensor per value and dtype
    between calls: every value (signed zeros, inf, NaN, ints) gives numpy's result, bit for
    bit, the same as with grad mode on, call after call, and never writes into that tensor."""
    data = np.array([-0.0, 0.0, 1.5, -3.0, np.inf, np.nan], dtype=dtype)
    x = fusegrad.tensor(data)
    for s in SCALARS:
        with np.errstate(all="ignore"):
            want = np.asarray(op(data, np.asarray(s, dtype=dtype)))
        with_grad = op(x, s).numpy()
        for _ in range(2):
            with fusegrad.no_grad():
                got = op(x, s).numpy()
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (name, s)
        assert with_grad.tobytes() == want.tobytes(), (name, s)
        assert x.numpy().tobytes() == data.tobytes()


def test_a_saved_number_operand_is_its_own_tensor() -> None:
    """Under grad mode a node keeps the wrapped number it saved (``x * 0.5`` saves 0.5 for x's
    gradient): each call wraps the number anew, never the tensor that calls without grad mode
    share, as PyTorch makes one per call."""
    x = fusegrad.ones(3, requires_grad=True)
    first, second = x * 0.5, 0.5 * x
    with fusegrad.no_grad():
        x * 0.5
    saved = [first.grad_fn._saved_other, second.grad_fn._saved_self]
    with fusegrad.no_grad():
        x * 0.5
        0.5 * x
    assert saved[0] is not saved[1]
    assert all(s._wrapped_number and s.numpy().flags.writeable for s in saved)
    (first.sum() + second.sum()).backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 1.0, dtype=np.float32))
