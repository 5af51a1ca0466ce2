"""In-place arithmetic as one ufunc call into the tensor's memory (``ops._inplace_ufunc``):
``add_``/``sub_``/``mul_``/``div_`` and ``+=``/``-=``/``*=``/``/=`` on float tensors that record
nothing.  The values are the general path's (the op out of place, then copied in) bit for bit,
including operands that overlap the written memory; versions move as they did; everything the
fast path does not take (broadcasting into ``self``, other dtypes, alpha, recording) still
behaves as before."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegrad as fg
from fusegrad import ops
from fusegrad.errors import ShapeError

_METHODS = {"add_": np.add, "sub_": np.subtract, "mul_": np.multiply, "div_": np.true_divide}
_OPERATORS = {"__iadd__": "add_", "__isub__": "sub_", "__imul__": "mul_", "__itruediv__": "div_"}


def _slow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "_INPLACE_UFUNCS", {})


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


@settings(max_examples=80, deadline=None)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    shape=st.sampled_from([(), (7,), (3, 4), (2, 3, 5)]),
    method=st.sampled_from(sorted(_METHODS) + sorted(_OPERATORS)),
    other_kind=st.sampled_from(["same", "0-d", "float", "int"]),
    seed=st.integers(0, 2**16),
)
def test_values_and_versions_are_the_general_paths(
    dtype: Any, shape: tuple, method: str, other_kind: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(shape).astype(dtype)
    o0 = rng.standard_normal(shape if other_kind == "same" else ()).astype(dtype)
    other_value: Any = None
    if other_kind == "float":
        other_value = float(o0.reshape(-1)[0])
    elif other_kind == "int":
        other_value = int(rng.integers(-3, 4)) or 2
    results = []
    for fast in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            if not fast:
                _slow(mp)
            x = fg.tensor(x0.copy())
            other = other_value if other_value is not None else fg.tensor(o0)
            before = x._version
            out = getattr(x, method)(other)
            assert out is x and x._version == before + 1
            results.append(x.numpy().copy())
    np.testing.assert_array_equal(_bits(results[0]), _bits(results[1]))


def test_the_fast_path_is_taken_and_writes_through_views(monkeypatch: pytest.MonkeyPatch) -> None:
    """A view's memory is its base's: the base sees the write and its version moves."""
    calls: list = []

    def spy(ufunc: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(ufunc.__name__)
            return ufunc(*args, **kwargs)

        return call

    monkeypatch.setattr(ops, "_INPLACE_UFUNCS", {k: spy(v) for k, v in ops._INPLACE_UFUNCS.items()})
    base = fg.arange(12, dtype=fg.float32).reshape(3, 4)
    row = base[1]
    version = base._version
    row.mul_(2.0)
    row += fg.ones(4)
    assert calls == ["multiply", "add"]
    assert base._version == version + 2
    np.testing.assert_array_equal(base.numpy()[1], np.arange(4, 8, dtype=np.float32) * 2 + 1)
    np.testing.assert_array_equal(base.numpy()[0], np.arange(4, dtype=np.float32))


def test_overlapping_operands_read_the_old_values() -> None:
    """``x[1:] += x[:-1]`` reads every element before any is written (as out of place)."""
    x = fg.arange(6, dtype=fg.float64)
    x[1:] += x[:-1]
    np.testing.assert_array_equal(x.numpy(), [0, 1, 3, 5, 7, 9])
    y = fg.arange(4, dtype=fg.float32)
    y.mul_(y)
    np.testing.assert_array_equal(y.numpy(), [0, 1, 4, 9])


def test_what_the_fast_path_leaves_alone() -> None:
    """Broadcasting into ``self`` still raises PyTorch's error with ``self`` unchanged; a
    broadcast operand, another dtype, ``alpha``, ints and recorded ops take the general path
    with its results."""
    x = fg.ones(3)
    with pytest.raises(ShapeError, match="doesn't match the broadcast shape"):
        x.mul_(fg.ones(2, 3))
    np.testing.assert_array_equal(x.numpy(), np.ones(3, np.float32))
    x = fg.ones(2, 3)
    x.add_(fg.arange(3, dtype=fg.float32))  # (broadcast operand)
    x.add_(fg.ones(2, 3, dtype=fg.float64))  # (another dtype, cast back)
    x.sub_(fg.ones(2, 3), alpha=2)
    np.testing.assert_array_equal(x.numpy(), np.ones((2, 3)) + np.arange(3) + 1 - 2)
    assert x.dtype == fg.float32
    n = fg.arange(4)
    n.mul_(3)
    assert n.dtype == fg.int64 and n.tolist() == [0, 3, 6, 9]
    w = fg.ones(3, requires_grad=True)
    h = w * 2
    h.mul_(w)  # (recorded: the general path builds its node)
    h.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.full(3, 4, np.float32))
