"""Property tests (hypothesis): binary ops on random broadcastable shape pairs match numpy and
their gradients have the inputs' shapes and equal the sum-reduced numpy gradient; reshape,
permute and friends round-trip; failing shapes are rejected with a ShapeError."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fusegrad
from fusegrad import ShapeError

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reduce_to(g: np.ndarray, shape: tuple) -> np.ndarray:
    """numpy's version of undoing a broadcast: sum leading dims and dims of size 1."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


# name, op, forward reference, (d out / d a, d out / d b) as functions of (a, b, out)
BINARY: list[tuple[str, Callable, Callable, Callable, Callable]] = [
    (
        "add",
        lambda a, b: a + b,
        np.add,
        lambda a, b, o: np.ones_like(o),
        lambda a, b, o: np.ones_like(o),
    ),
    (
        "sub",
        lambda a, b: a - b,
        np.subtract,
        lambda a, b, o: np.ones_like(o),
        lambda a, b, o: -np.ones_like(o),
    ),
    ("mul", lambda a, b: a * b, np.multiply, lambda a, b, o: b + 0 * o, lambda a, b, o: a + 0 * o),
    (
        "div",
        lambda a, b: a / b,
        np.divide,
        lambda a, b, o: 1 / b + 0 * o,
        lambda a, b, o: -a / b**2 + 0 * o,
    ),
    (
        "pow",
        lambda a, b: a**b,
        np.power,
        lambda a, b, o: b * a ** (b - 1) + 0 * o,
        lambda a, b, o: o * np.log(a),
    ),
    (
        "maximum",
        fusegrad.maximum,
        np.maximum,
        lambda a, b, o: (a > b) + 0 * o,
        lambda a, b, o: (b > a) + 0 * o,
    ),
    (
        "tanh_of_product",
        lambda a, b: (a * b).tanh() + a,
        lambda a, b: np.tanh(a * b) + a,
        lambda a, b, o: (1 - np.tanh(a * b) ** 2) * b + 1,
        lambda a, b, o: (1 - np.tanh(a * b) ** 2) * a,
    ),
]

shape_pairs = hnp.mutually_broadcastable_shapes(
    num_shapes=2, min_dims=0, max_dims=3, min_side=0, max_side=3
)


def _values(rng: np.random.Generator, shape: tuple, positive: bool) -> np.ndarray:
    if positive:
        return rng.uniform(0.5, 2.0, shape)
    # distinct-ish magnitudes away from 0 (no ties for maximum, no blow-up for div)
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], size=shape)


@pytest.mark.parametrize("name,op,ref,da,db", BINARY, ids=[b[0] for b in BINARY])
@SETTINGS
@given(shapes=shape_pairs, seed=st.integers(0, 2**16))
def test_binary_broadcasting(
    name: str, op: Callable, ref: Callable, da: Callable, db: Callable, shapes: Any, seed: int
) -> None:
    (sa, sb), out_shape = shapes.input_shapes, shapes.result_shape
    rng = np.random.default_rng(seed)
    a_np = _values(rng, sa, name == "pow")
    b_np = _values(rng, sb, name == "div") + (0.25 if name == "maximum" else 0.0)
    a = fusegrad.tensor(a_np, requires_grad=True)
    b = fusegrad.tensor(b_np, requires_grad=True)
    out = op(a, b)
    expected = ref(a_np, b_np)
    assert tuple(out.shape) == tuple(out_shape)
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-12, atol=1e-12)
    g = rng.standard_normal(out_shape)
    ga, gb = fusegrad.autograd.grad(out, [a, b], fusegrad.tensor(g))
    assert tuple(ga.shape) == sa and tuple(gb.shape) == sb
    np.testing.assert_allclose(
        ga.numpy(), reduce_to(g * da(a_np, b_np, expected), sa), rtol=1e-10, atol=1e-12
    )
    np.testing.assert_allclose(
        gb.numpy(), reduce_to(g * db(a_np, b_np, expected), sb), rtol=1e-10, atol=1e-12
    )


@SETTINGS
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3),
    seed=st.integers(0, 2**16),
)
def test_where_broadcasting(shapes: Any, seed: int) -> None:
    sc, sa, sb = shapes.input_shapes
    rng = np.random.default_rng(seed)
    c_np, a_np, b_np = rng.random(sc) < 0.5, rng.standard_normal(sa), rng.standard_normal(sb)
    a = fusegrad.tensor(a_np, requires_grad=True)
    b = fusegrad.tensor(b_np, requires_grad=True)
    out = fusegrad.where(fusegrad.tensor(c_np), a, b)
    np.testing.assert_array_equal(out.detach().numpy(), np.where(c_np, a_np, b_np))
    g = rng.standard_normal(shapes.result_shape)
    ga, gb = fusegrad.autograd.grad(out, [a, b], fusegrad.tensor(g))
    cb = np.broadcast_to(c_np, shapes.result_shape)
    np.testing.assert_allclose(ga.numpy(), reduce_to(np.where(cb, g, 0.0), sa))
    np.testing.assert_allclose(gb.numpy(), reduce_to(np.where(cb, 0.0, g), sb))


@st.composite
def non_broadcastable(draw: Any) -> tuple[tuple, tuple]:
    """Two shapes equal everywhere except one dim, where both sizes differ and neither is 1;
    the second may lack leading dims (broadcasting aligns shapes on the right)."""
    a = list(draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)))
    i = draw(st.integers(0, len(a) - 1))
    if a[i] == 1:
        a[i] = draw(st.integers(2, 4))
    b = list(a)
    b[i] = draw(st.integers(2, 5).filter(lambda k: k != a[i]))
    drop = draw(st.integers(0, i))
    return tuple(a), tuple(b[drop:])


@SETTINGS
@given(shapes=non_broadcastable())
def test_non_broadcastable_shapes_raise(shapes: tuple[tuple, tuple]) -> None:
    sa, sb = shapes
    a = fusegrad.ones(sa, requires_grad=True)
    b = fusegrad.ones(sb)
    with pytest.raises(ShapeError) as info:
        a * b
    text = str(info.value)
    assert "mul" in text and str(sa) in text and str(sb) in text and "dim -" in text
    assert a.grad is None and a._version == 0


# ---- shape round trips ---------------------------------------------------------------------------

small_shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=3)


@SETTINGS
@given(shape=small_shapes, data=st.data())
def test_permute_round_trip(shape: tuple, data: Any) -> None:
    perm = data.draw(st.permutations(range(len(shape))))
    inverse = np.argsort(perm)
    x_np = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    x = fusegrad.tensor(x_np, requires_grad=True)
    y = x.permute(*perm) if perm else x.permute(())
    np.testing.assert_array_equal(y.detach().numpy(), np.transpose(x_np, perm))
    z = y.permute(tuple(int(i) for i in inverse))
    np.testing.assert_array_equal(z.detach().numpy(), x_np)
    g = np.random.default_rng(0).standard_normal(y.shape)
    (gx,) = fusegrad.autograd.grad(y, [x], fusegrad.tensor(g))
    np.testing.assert_array_equal(gx.numpy(), np.transpose(g, inverse))


@st.composite
def reshape_targets(draw: Any) -> tuple[tuple, tuple]:
    shape = draw(small_shapes)
    n = int(np.prod(shape))
    if n == 0:
        return shape, draw(st.sampled_from([(0,), (0, 2), (2, 0, 1)]))
    factors: list[int] = []
    rest = n
    while rest > 1 and len(factors) < 4:
        divisors = [d for d in range(2, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        factors.append(d)
        rest //= d
    factors += [1] * draw(st.integers(0, 1))
    return shape, tuple(draw(st.permutations(factors)))


@SETTINGS
@given(shapes=reshape_targets(), infer=st.booleans(), transposed=st.booleans())
def test_reshape_round_trip(shapes: tuple[tuple, tuple], infer: bool, transposed: bool) -> None:
    shape, target = shapes
    x_np = np.random.default_rng(1).standard_normal(shape)
    x = fusegrad.tensor(x_np, requires_grad=True)
    src = x.mT if transposed and x.ndim >= 2 else x
    src_np = np.swapaxes(x_np, -1, -2) if transposed and x.ndim >= 2 else x_np
    spec = target
    if infer and target and int(np.prod(target)) > 0:
        spec = (-1,) + target[1:]
    y = src.reshape(spec)
    assert tuple(y.shape) == target
    np.testing.assert_array_equal(y.detach().numpy(), src_np.reshape(target))
    back = y.reshape(tuple(src.shape))
    np.testing.assert_array_equal(back.detach().numpy(), src_np)
    flat = src.flatten()
    assert flat.ndim == 1 and flat.numel() == src.numel()
    g = np.random.default_rng(2).standard_normal(target)
    (gx,) = fusegrad.autograd.grad(y, [x], fusegrad.tensor(g))
    expected = g.reshape(src_np.shape)
    if transposed and x.ndim >= 2:
        expected = np.swapaxes(expected, -1, -2)
    np.testing.assert_array_equal(gx.numpy(), expected)


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3), data=st.data())
def test_squeeze_unsqueeze_round_trip(shape: tuple, data: Any) -> None:
    dim = data.draw(st.integers(-len(shape) - 1, len(shape)))
    x = fusegrad.tensor(np.random.default_rng(3).standard_normal(shape))
    y = x.unsqueeze(dim)
    assert y.ndim == x.ndim + 1 and y.shape[dim] == 1
    np.testing.assert_array_equal(y.squeeze(dim).numpy(), x.numpy())
    np.testing.assert_array_equal(y.squeeze().numpy(), np.squeeze(x.numpy()))


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), data=st.data())
def test_transpose_and_flip_are_involutions(shape: tuple, data: Any) -> None:
    d0 = data.draw(st.integers(-len(shape), len(shape) - 1))
    d1 = data.draw(st.integers(-len(shape), len(shape) - 1))
    x_np = np.random.default_rng(4).standard_normal(shape)
    x = fusegrad.tensor(x_np)
    np.testing.assert_array_equal(x.transpose(d0, d1).transpose(d0, d1).numpy(), x_np)
    np.testing.assert_array_equal(x.transpose(d0, d1).numpy(), np.swapaxes(x_np, d0, d1))
    np.testing.assert_array_equal(x.flip((d0,)).flip((d0,)).numpy(), x_np)


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4), data=st.data())
def test_split_cat_round_trip(shape: tuple, data: Any) -> None:
    dim = data.draw(st.integers(0, len(shape) - 1))
    size = data.draw(st.integers(1, 4))
    x_np = np.random.default_rng(5).standard_normal(shape)
    x = fusegrad.tensor(x_np, requires_grad=True)
    parts = x.split(size, dim)
    assert sum(p.shape[dim] for p in parts) == shape[dim]
    y = fusegrad.cat(parts, dim)
    np.testing.assert_array_equal(y.detach().numpy(), x_np)
    g = np.random.default_rng(6).standard_normal(shape)
    (gx,) = fusegrad.autograd.grad(y, [x], fusegrad.tensor(g))
    np.testing.assert_array_equal(gx.numpy(), g)


# ---- indexing ------------------------------------------------------------------------------------


@st.composite
def index_keys(draw: Any) -> tuple[tuple, tuple]:
    """A shape and a key mixing ints, slices (with steps), None, Ellipsis, int lists (with
    duplicates), int arrays and bool masks, valid for numpy."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    ndim = len(shape)
    ellipsis = draw(st.booleans())
    count = draw(st.integers(0 if ellipsis else 1, ndim))
    dims = range(ndim - count, ndim) if ellipsis else range(count)
    key: list = [Ellipsis] if ellipsis else []
    for d in dims:
        if draw(st.integers(0, 5)) == 0:
            key.append(None)
        n = shape[d]
        kind = draw(st.sampled_from(["int", "slice", "list", "array", "mask"]))
        if kind == "int":
            key.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            bound = st.none() | st.integers(-n - 1, n + 1)
            key.append(slice(draw(bound), draw(bound), draw(st.none() | st.integers(1, 3))))
        elif kind == "list":
            key.append(draw(st.lists(st.integers(-n, n - 1), max_size=3)))
        elif kind == "array":
            key.append(np.array(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))))
        else:
            key.append(np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n))))
    return shape, tuple(key)


@SETTINGS
@given(case=index_keys(), seed=st.integers(0, 2**16))
def test_getitem_matches_numpy_and_accumulates(case: tuple[tuple, tuple], seed: int) -> None:
    shape, key = case
    rng = np.random.default_rng(seed)
    x_np = rng.standard_normal(shape)
    # PyTorch applies integers as basic indices (a select) before the advanced ones, so whether
    # the advanced indices are adjacent is judged without them; numpy counts an integer as an
    # advanced index. The reference therefore selects the integers first, then indexes the rest.
    ints = tuple(
        k if isinstance(k, int) or k is Ellipsis else slice(None) for k in key if k is not None
    )
    if Ellipsis not in ints:
        ints += (Ellipsis,)  # keeps a view (not a scalar) when every dimension is selected
    rest = tuple(k for k in key if not isinstance(k, int))
    try:
        expected = x_np[ints][rest]
    except IndexError:
        return  # e.g. advanced indices that do not broadcast together: numpy rejects it too
    fkey = tuple(fusegrad.tensor(k) if isinstance(k, np.ndarray) else k for k in key)
    x = fusegrad.tensor(x_np, requires_grad=True)
    out = x[fkey]
    assert tuple(out.shape) == np.shape(expected)
    np.testing.assert_array_equal(out.detach().numpy(), expected)
    g = rng.standard_normal(np.shape(expected))
    (gx,) = fusegrad.autograd.grad(out, [x], fusegrad.tensor(g))
    grad = np.zeros(shape)
    np.add.at(grad[ints], rest, g)  # a view of grad; duplicate indices accumulate
    np.testing.assert_allclose(gx.numpy(), grad, rtol=1e-12, atol=1e-12)
