"""Error behaviour of the op surface (docs/ARCHITECTURE.md, "Conventions"): each bad call raises
the right
class (``ShapeError`` is a RuntimeError and a ValueError, ``DTypeError`` a TypeError,
``IndexOutOfRange`` an IndexError, ``AutogradError`` a RuntimeError), says what went wrong, and
leaves its inputs, their ``.grad`` and their version counters exactly as they were."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import fusegrad
from fusegrad import AutogradError, DTypeError, FusegradError, IndexOutOfRange, ShapeError
from fusegrad.ops import functional as F


def test_hierarchy() -> None:
    assert issubclass(ShapeError, ValueError) and issubclass(ShapeError, FusegradError)
    assert issubclass(ShapeError, RuntimeError)  # what PyTorch raises for shape errors
    assert issubclass(DTypeError, TypeError) and issubclass(DTypeError, FusegradError)
    assert issubclass(IndexOutOfRange, IndexError) and issubclass(IndexOutOfRange, FusegradError)
    assert issubclass(AutogradError, RuntimeError) and issubclass(AutogradError, FusegradError)


def _leaf(*shape: int, dtype: Any = fusegrad.float64) -> fusegrad.Tensor:
    """A leaf that requires grad and already holds a ``.grad`` from an earlier backward."""
    rng = np.random.default_rng(sum(shape) + 7)
    t = fusegrad.tensor(rng.uniform(-2, 2, shape), dtype=dtype, requires_grad=True)
    (t * 2).sum().backward()
    return t


def _snapshot(t: fusegrad.Tensor) -> tuple:
    grad = None if t.grad is None else t.grad.detach().numpy().copy()
    return (
        t.detach().numpy().copy(),
        grad,
        t._version,
        t.grad_fn,
        t.requires_grad,
        tuple(t.shape),
        t.dtype,
    )


@contextmanager
def unchanged(*tensors: fusegrad.Tensor) -> Iterator[None]:
    before = [_snapshot(t) for t in tensors]
    yield
    for i, (t, snap) in enumerate(zip(tensors, before)):
        data, grad, version, grad_fn, rg, shape, dtype = snap
        now = _snapshot(t)
        assert now[5] == shape and now[6] is dtype, f"input {i}: shape/dtype changed"
        np.testing.assert_array_equal(now[0], data, err_msg=f"input {i}: data changed")
        if grad is None:
            assert now[1] is None, f"input {i}: .grad appeared"
        else:
            np.testing.assert_array_equal(now[1], grad, err_msg=f"input {i}: .grad changed")
        assert now[2] == version, f"input {i}: version {now[2]} != {version}"
        assert now[3] is grad_fn and now[4] == rg, f"input {i}: autograd metadata changed"


def _check(call: Callable[[], Any], cls: type, *words: str, inputs: tuple = ()) -> None:
    with unchanged(*inputs), pytest.raises(cls) as info:
        call()
    text = str(info.value)
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"


# ---- shapes that do not broadcast ----------------------------------------------------------------

BINARY = [
    ("add", lambda a, b: a + b),
    ("sub", lambda a, b: a - b),
    ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a / b),
    ("pow", lambda a, b: a**b),
    ("maximum", fusegrad.maximum),
    ("minimum", fusegrad.minimum),
    ("eq", lambda a, b: a == b),
    ("lt", lambda a, b: a < b),
    ("remainder", lambda a, b: a % b),
]


@pytest.mark.parametrize("name,fn", BINARY, ids=[n for n, _ in BINARY])
def test_binary_broadcast_error(name: str, fn: Callable) -> None:
    a, b = _leaf(3, 4), _leaf(5)
    _check(lambda: fn(a, b), ShapeError, name, "(3, 4)", "(5,)", "dim -1: 4 vs 5", inputs=(a, b))


def test_broadcast_error_names_inner_dim() -> None:
    a, b = _leaf(2, 3, 1), _leaf(4, 1)
    _check(lambda: a * b, ShapeError, "mul", "(2, 3, 1)", "(4, 1)", "dim -2: 3 vs 4", inputs=(a, b))


def test_broadcast_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        fusegrad.ones(2) + fusegrad.ones(3)


def test_where_broadcast_error() -> None:
    a, b = _leaf(1, 4), _leaf(5)
    cond = fusegrad.ones(3, 1, dtype=fusegrad.bool)
    _check(
        lambda: fusegrad.where(cond, a, b),
        ShapeError,
        "where",
        "(1, 4)",
        "(5,)",
        "dim -1: 4 vs 5",
        inputs=(a, b),
    )


def test_inplace_broadcast_error_leaves_target_unchanged() -> None:
    x = _leaf(3, 4)
    y = x * 1.0  # a non-leaf that may be modified in place
    b = _leaf(4, 4)
    _check(lambda: y.add_(b), ShapeError, inputs=(x, y, b))
    _check(
        lambda: y.mul_(fusegrad.ones(2, 3, 4, dtype=fusegrad.float64)), ShapeError, inputs=(x, y)
    )


SHAPE_ERRORS = [
    ("matmul", lambda a: a @ _leaf(3, 2), ("matmul", "(3, 4)", "(3, 2)")),
    ("matmul_0d", lambda a: a @ _leaf(), ("matmul",)),
    ("mm", lambda a: fusegrad.mm(a, _leaf(4)), ("mm",)),
    ("bmm", lambda a: fusegrad.bmm(a, a), ("bmm",)),
    ("dot", lambda a: fusegrad.dot(_leaf(3), _leaf(4)), ("dot",)),
    ("reshape", lambda a: a.reshape(5, 3), ("reshape", "[5, 3]", "12")),
    ("reshape_two_minus1", lambda a: a.reshape(-1, -1), ("reshape",)),
    ("view_noncontig", lambda a: a.t().view(12), ("view", "reshape")),
    ("expand", lambda a: a.expand(2, 5, 4), ("expand", "5", "3")),
    ("broadcast_to", lambda a: a.broadcast_to((4,)), ("broadcast_to", "(3, 4)")),
    ("cat", lambda a: fusegrad.cat([a, _leaf(3, 5)]), ("cat", "(3, 5)")),
    ("stack", lambda a: fusegrad.stack([a, _leaf(4, 3)]), ("stack",)),
    ("permute_count", lambda a: a.permute(0, 1, 2), ("permute",)),
    ("permute_repeat", lambda a: a.permute(0, 0), ("permute",)),
    ("narrow", lambda a: a.narrow(1, 3, 2), ("narrow", "exceeds")),
    ("split_sizes", lambda a: a.split([1, 1], dim=0), ("split", "sum exactly to 3")),
    ("unflatten", lambda a: a.unflatten(1, (3, 2)), ("unflatten",)),
    ("flatten_order", lambda a: a.flatten(1, 0), ("flatten",)),
    ("repeat", lambda a: a.repeat(2), ("repeat",)),
    ("t_3d", lambda a: a.reshape(2, 3, 2).t(), ("t()",)),
    ("tril_1d", lambda a: fusegrad.tril(a.reshape(-1)), ("tril",)),
    ("diagonal_same_dims", lambda a: a.diagonal(0, 1, 1), ("diagonal",)),
    ("gather_rank", lambda a: a.gather(0, fusegrad.tensor([0, 1])), ("gather",)),
    ("masked_fill_value", lambda a: a.masked_fill(a > 0, fusegrad.ones(2)), ("masked_fill",)),
    ("linear", lambda a: F.linear(a, _leaf(2, 3)), ("linear",)),
    ("pad_odd", lambda a: F.pad(a, (1,)), ("pad",)),
    ("pad_reflect_too_big", lambda a: F.pad(a, (4, 0), mode="reflect"), ("pad",)),
    ("einsum_operands", lambda a: fusegrad.einsum("ij,jk->ik", a), ("einsum",)),
    ("einsum_rank", lambda a: fusegrad.einsum("ijk->i", a), ("einsum",)),
    ("einsum_sizes", lambda a: fusegrad.einsum("ij,ij->i", a, _leaf(3, 5)), ("einsum",)),
    ("sum_repeated_dim", lambda a: a.sum((0, 0)), ("sum", "multiple times")),
    ("layer_norm", lambda a: F.layer_norm(a, (3,)), ("layer_norm",)),
    ("cross_entropy_target", lambda a: F.cross_entropy(a, fusegrad.tensor([0, 1])), ("nll_loss",)),
    ("mse_loss", lambda a: F.mse_loss(a, _leaf(5)), ("(5,)",)),
    ("conv2d_channels", lambda a: F.conv2d(a.reshape(1, 1, 3, 4), _leaf(1, 2, 2, 2)), ("conv2d",)),
    ("max_pool_too_small", lambda a: F.max_pool2d(a.reshape(1, 1, 3, 4), 5), ("max_pool2d",)),
    ("amax_empty", lambda a: a[:0].amax(), ("amax",)),
    ("argmax_empty", lambda a: a[:0].argmax(), ("argmax",)),
]


@pytest.mark.parametrize("name,fn,words", SHAPE_ERRORS, ids=[c[0] for c in SHAPE_ERRORS])
def test_shape_errors(name: str, fn: Callable, words: tuple) -> None:
    a = _leaf(3, 4)
    _check(lambda: fn(a), ShapeError, *words, inputs=(a,))


# ---- wrong dtypes --------------------------------------------------------------------------------

DTYPE_ERRORS = [
    ("mean_int", lambda a, i, b: i.mean(), ("mean", "int64")),
    ("var_int", lambda a, i, b: i.var(), ("var",)),
    ("softmax_int", lambda a, i, b: i.softmax(0), ("softmax",)),
    ("norm_int", lambda a, i, b: i.norm(), ("norm",)),
    ("bitwise_float", lambda a, i, b: a & a, ("bitwise_and", "float64")),
    ("bitwise_not_float", lambda a, i, b: ~a, ("bitwise_not",)),
    ("where_cond", lambda a, i, b: fusegrad.where(a, a, a), ("where", "bool")),
    ("sub_bool", lambda a, i, b: b - b, ("sub", "bool")),
    ("neg_bool", lambda a, i, b: -b, ("neg", "bool")),
    ("matmul_mixed", lambda a, i, b: a @ i.to(fusegrad.float32), ("matmul", "float64")),
    ("matmul_bool", lambda a, i, b: b @ b, ("matmul", "bool")),
    ("gather_float_index", lambda a, i, b: a.gather(0, a), ("gather",)),
    ("index_select_float", lambda a, i, b: a.index_select(0, a[0]), ("index_select",)),
    ("masked_fill_mask", lambda a, i, b: a.masked_fill(i, 0.0), ("masked_fill", "bool")),
    ("masked_select_mask", lambda a, i, b: a.masked_select(i), ("masked_select",)),
    ("one_hot_float", lambda a, i, b: F.one_hot(a), ("one_hot",)),
    ("embedding_float", lambda a, i, b: F.embedding(a, a), ("embedding",)),
    ("nll_float_target", lambda a, i, b: F.nll_loss(a, a[:, 0]), ("nll_loss",)),
    ("int_requires_grad", lambda a, i, b: i.requires_grad_(), ("floating point",)),
    (
        "bool_requires_grad",
        lambda a, i, b: fusegrad.tensor([True], requires_grad=True),
        ("floating point",),
    ),
    ("int_inplace_float", lambda a, i, b: i.add_(1.5), ("float", "int64")),
]


@pytest.mark.parametrize("name,fn,words", DTYPE_ERRORS, ids=[c[0] for c in DTYPE_ERRORS])
def test_dtype_errors(name: str, fn: Callable, words: tuple) -> None:
    a = _leaf(3, 4)
    i = fusegrad.tensor([[1, 2, 3, 4]] * 3)
    b = fusegrad.tensor([True, False])
    _check(lambda: fn(a, i, b), DTypeError, *words, inputs=(a, i, b))
    with pytest.raises(TypeError):  # catchable as the builtin
        fn(a, i, b)


# ---- dims and indices out of range --------------------------------------------------------------

INDEX_ERRORS = [
    ("sum_dim", lambda a: a.sum(2), ("sum", "Dimension out of range", "2")),
    ("mean_dim", lambda a: a.mean(-3), ("mean", "-3")),
    ("softmax_dim", lambda a: a.softmax(5), ("softmax",)),
    ("max_dim", lambda a: a.max(dim=2), ("max",)),
    ("argmax_dim", lambda a: a.argmax(3), ("argmax",)),
    ("cumsum_dim", lambda a: a.cumsum(2), ("cumsum",)),
    ("transpose_dim", lambda a: a.transpose(0, 2), ("transpose",)),
    ("unsqueeze_dim", lambda a: a.unsqueeze(3), ("unsqueeze",)),
    ("squeeze_dim", lambda a: a.squeeze(2), ("squeeze",)),
    ("cat_dim", lambda a: fusegrad.cat([a, a], 2), ("cat",)),
    ("stack_dim", lambda a: fusegrad.stack([a, a], 3), ("stack",)),
    ("flip_dim", lambda a: a.flip((2,)), ("flip",)),
    ("gather_dim", lambda a: a.gather(2, fusegrad.zeros(3, 4, dtype=fusegrad.int64)), ("gather",)),
    ("getitem_int", lambda a: a[3], ("index 3", "dimension 0", "size 3")),
    ("getitem_neg", lambda a: a[-4], ("index -4",)),
    ("getitem_second_dim", lambda a: a[:, 4], ("index 4", "dimension 1", "size 4")),
    ("getitem_list", lambda a: a[[0, 5]], ("index 5",)),
    ("getitem_tensor", lambda a: a[fusegrad.tensor([[0], [7]])], ("index 7",)),
    ("getitem_too_many", lambda a: a[0, 0, 0], ("too many indices",)),
    ("getitem_mask_shape", lambda a: a[fusegrad.ones(4, dtype=fusegrad.bool)], ("mask",)),
    ("getitem_float_index", lambda a: a[a[0]], ("long, int or bool",)),
    (
        "gather_index",
        lambda a: a.gather(1, fusegrad.tensor([[0], [4], [1]])),
        ("gather", "index 4"),
    ),
    (
        "gather_negative",
        lambda a: a.gather(1, fusegrad.tensor([[0], [-1], [1]])),
        ("gather", "index -1"),
    ),
    (
        "scatter_index",
        lambda a: a.scatter(0, fusegrad.tensor([[5, 0, 0, 0]]), 1.0),
        ("scatter", "index 5"),
    ),
    (
        "scatter_add_index",
        lambda a: a.scatter_add(1, fusegrad.tensor([[9]]), a[:1, :1]),
        ("scatter_add",),
    ),
    ("index_select", lambda a: a.index_select(0, fusegrad.tensor([3])), ("index_select",)),
    (
        "take_along_dim",
        lambda a: fusegrad.take_along_dim(a, fusegrad.tensor([[4]]), 1),
        ("gather",),
    ),
    ("embedding", lambda a: F.embedding(fusegrad.tensor([3]), a), ("embedding", "index 3")),
    ("one_hot", lambda a: F.one_hot(fusegrad.tensor([4]), 3), ("one_hot",)),
    ("select", lambda a: a.select(1, 4), ("index 4",)),
]


@pytest.mark.parametrize("name,fn,words", INDEX_ERRORS, ids=[c[0] for c in INDEX_ERRORS])
def test_index_errors(name: str, fn: Callable, words: tuple) -> None:
    a = _leaf(3, 4)
    _check(lambda: fn(a), IndexOutOfRange, *words, inputs=(a,))
    with pytest.raises(IndexError):
        fn(a)


def test_setitem_out_of_range_leaves_tensor_unchanged() -> None:
    x = _leaf(3, 4)
    y = x * 1.0
    _check(lambda: y.__setitem__(3, 0.0), IndexOutOfRange, inputs=(x, y))
    _check(lambda: y.__setitem__((slice(None), [0, 9]), 0.0), IndexOutOfRange, inputs=(x, y))
    _check(
        lambda: y.__setitem__(0, fusegrad.ones(5, dtype=fusegrad.float64)),
        ShapeError,
        inputs=(x, y),
    )


def test_cross_entropy_target_out_of_range() -> None:
    a = _leaf(2, 3)
    _check(
        lambda: F.cross_entropy(a, fusegrad.tensor([0, 3])),
        IndexError,
        "out of bounds",
        inputs=(a,),
    )


# ---- autograd misuse through ops -----------------------------------------------------------------


def test_inplace_on_leaf_requiring_grad() -> None:
    a = _leaf(3, 4)
    _check(lambda: a.add_(1.0), AutogradError, "leaf Variable", inputs=(a,))
    _check(lambda: a[0].mul_(2.0), AutogradError, "view of a leaf Variable", inputs=(a,))
    _check(lambda: a.__setitem__(0, 1.0), AutogradError, "leaf Variable", inputs=(a,))


def test_inplace_on_expanded_view() -> None:
    base = fusegrad.zeros(1, 3)
    view = base.expand(2, 3)
    _check(lambda: view.add_(1.0), AutogradError, "clone", inputs=(base, view))


def test_backward_of_non_differentiable_output() -> None:
    a = _leaf(3, 4)
    out = (a > 0).sum()
    _check(lambda: out.backward(), AutogradError, "does not require grad", inputs=(a,))


def test_error_does_not_add_nodes() -> None:
    """A failed op records nothing: the later backward sees only the successful ops."""
    a = _leaf(3)
    with pytest.raises(ShapeError):
        a * fusegrad.ones(4, dtype=fusegrad.float64)
    a.grad = None
    (a * 3.0).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [3.0, 3.0, 3.0])
