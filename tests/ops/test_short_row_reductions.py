"""The short-row ``sum``/``amax``/``amin`` kernels (``ops/reduce_kernels.py``): many float rows
of under 256 elements reduced along the last axis by a numba loop instead of numpy's
row-at-a-time reduction.  Sums are numpy's pairwise sums to the bit (every row length, both
dtypes, magnitudes far apart so the order shows); extremes' values and NaNs are numpy's;
shapes, dims and layouts the kernel does not take still go to numpy, and the gradient is
amax's.  Of a +0 and a -0 in one row, which is the extreme is numpy's choice only by chance
(numpy's depends on its vector width)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegrad as fg
from fusegrad.ops import primitives


@settings(max_examples=25, deadline=None)
@given(
    lead=st.lists(st.integers(1, 9), min_size=0, max_size=3),
    last=st.integers(1, 300),
    dtype=st.sampled_from([np.float32, np.float64]),
    keepdim=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_values_are_numpys(lead: list, last: int, dtype: Any, keepdim: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (*lead, last) if lead else (1500, last)  # (no leading dims drawn: many rows)
    # a few values drawn from a small set, so rows have ties of +0 and -0 and repeated extremes
    x = rng.choice(np.array([0.0, -0.0, 1.5, -1.5, 3.0], dtype), size=shape)
    x = x + rng.standard_normal(shape).astype(dtype) * (rng.random(shape) < 0.5)
    if x.size > 3:
        x.reshape(-1)[rng.integers(0, x.size, 2)] = np.nan
    for ours, theirs in ((fg.amax, np.amax), (fg.amin, np.amin)):
        got = ours(fg.tensor(x), dim=-1, keepdim=keepdim).numpy()
        want = theirs(x, axis=-1, keepdims=keepdim)
        assert got.dtype == want.dtype and got.shape == want.shape
        # (equal values: +0 and -0 tie, and which one numpy returns depends on its vector
        # width, so only the values are compared; the loop returns the last of the tied)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sums_are_numpys_to_the_bit(dtype: Any) -> None:
    rng = np.random.default_rng(4)
    for n in [*range(1, 256), 300]:
        rows = max(8, 1024 // n + 1)
        scale = rng.choice(np.array([1e-4, 1.0, 1e5]), size=(rows, n))
        x = (rng.standard_normal((rows, n)) * scale).astype(dtype)
        got = fg.sum(fg.tensor(x), dim=-1).numpy()
        want = np.sum(x, axis=-1)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want, err_msg=f"row length {n}")
    x = np.full((64, 20), -0.0, dtype)
    x[0, 3] = np.nan
    x[1, 4] = np.inf
    got = fg.sum(fg.tensor(x), dim=1, keepdim=True).numpy()
    want = np.sum(x, axis=1, keepdims=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_the_kernel_takes_many_short_rows_only() -> None:
    x = np.zeros((64, 32), np.float32)
    assert primitives._short_rows(x, -1) and primitives._short_rows(x, (1,))
    assert not primitives._short_rows(x, 0)  # (not the last axis)
    assert not primitives._short_rows(x, (0, 1)) and not primitives._short_rows(x, None)
    assert not primitives._short_rows(x.T, -1)  # (not C-contiguous)
    assert not primitives._short_rows(np.zeros((64, 256), np.float32), -1)  # (long rows)
    assert not primitives._short_rows(np.zeros((4, 32), np.float32), -1)  # (few elements)
    assert not primitives._short_rows(np.zeros((64, 32), np.int32), -1)
    assert not primitives._short_rows(np.zeros((64, 0), np.float32), -1)
    assert not primitives._short_rows(np.zeros((64, 32), np.float16), -1)
    assert not primitives._short_rows(np.zeros((64, 32), np.longdouble), -1)


@pytest.mark.parametrize("dim", [-1, 0, (0, 1)])
def test_other_dims_and_layouts_agree_with_numpy(dim: Any) -> None:
    x = np.random.default_rng(1).standard_normal((40, 50, 30)).astype(np.float32)
    t = fg.tensor(x).permute(2, 0, 1)  # (not C-contiguous)
    axis = dim if not isinstance(dim, tuple) else dim
    np.testing.assert_array_equal(fg.amax(t, dim=dim).numpy(), np.amax(x.transpose(2, 0, 1), axis))
    np.testing.assert_array_equal(fg.amin(t, dim=dim).numpy(), np.amin(x.transpose(2, 0, 1), axis))


def test_gradient_and_softmax_through_the_kernel() -> None:
    x = fg.tensor(
        np.random.default_rng(2).standard_normal((64, 24)), dtype=fg.float64, requires_grad=True
    )
    assert fg.autograd.gradcheck(lambda a: fg.amax(a, dim=-1, keepdim=True) * 2.0, (x,))
    y = fg.softmax(x, dim=-1)
    e = np.exp(x.detach().numpy() - x.detach().numpy().max(-1, keepdims=True))
    np.testing.assert_allclose(y.detach().numpy(), e / e.sum(-1, keepdims=True), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_rows_sum_as_numpys_pairwise_tree(dtype: Any) -> None:
    """Rows longer than 128 elements split into halves, several levels deep (the kernel walks
    numpy's recursive tree with a stack of its own): still numpy's sums to the bit."""
    from fusegrad.ops import reduce_kernels

    rng = np.random.default_rng(7)
    for n in (129, 136, 257, 1000, 4099, 70001):
        scale = rng.choice(np.array([1e-4, 1.0, 1e6]), size=(3, n))
        x = (rng.standard_normal((3, n)) * scale).astype(dtype)
        got = reduce_kernels.last_axis_sum(x, keepdim=False)
        np.testing.assert_array_equal(got, np.sum(x, axis=-1), err_msg=f"row length {n}")


def test_a_second_process_loads_the_row_sum_from_the_disk_cache(tmp_path: Any) -> None:
    """The row-sum loop is cached across processes: a second process compiles nothing for it
    (a self-recursive numba function was compiled again in every process)."""
    import json
    import os
    import subprocess
    import sys

    script = (
        "import json, numpy as np\n"
        "from fusegrad.ops import reduce_kernels as rk\n"
        "x = np.ones((40, 300), np.float32)\n"
        "rk.last_axis_sum(x, False)\n"
        "fn = rk._rows_sum\n"
        "print(json.dumps([sum(fn.stats.cache_hits.values()),"
        " sum(fn.stats.cache_misses.values())]))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
            ).stdout.splitlines()[-1]
        )
        for _ in range(2)
    ]
    assert runs[0] == [0, 1], runs  # (compiled, then saved)
    assert runs[1] == [1, 0], runs  # (loaded)
