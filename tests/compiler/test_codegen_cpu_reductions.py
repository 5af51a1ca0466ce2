"""Fused sums in generated CPU kernels (``numba_cpu``, module docstring "Reductions"): a sum
along the innermost loop keeps ``REDUCTION_LANES`` partial sums over whole blocks plus one for
the tail, added pairwise in a fixed order, so that LLVM vectorises the loop without ``reassoc``.

* The result is bitwise that order (a numpy model of it) for full sums and row sums, at sizes
  around the block boundaries, in float32 and float64, and equal to eager within the tolerances;
* it is the same from run to run, whatever the number of threads;
* the loop over each block vectorises (the partial sums are added with vector instructions).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numba
import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler.codegen import numba_cpu
from fusegrad.compiler.symbolic import substitute

LANES = numba_cpu.REDUCTION_LANES
SIZES = [1, LANES - 1, LANES, LANES + 1, 2 * LANES + 37, 7 * LANES]


@pytest.fixture(autouse=True)
def _generated_code() -> Iterator[None]:
    compiler.reset()
    previous = compiler.config.interpreter_max_elements
    compiler.config.interpreter_max_elements = 0  # every kernel generated code
    yield
    compiler.config.interpreter_max_elements = previous
    compiler.reset()


def _documented_sum(terms: np.ndarray) -> float:
    """The order of the module docstring, in numpy: partial sum j adds element j of every whole
    block, in block order; the tail is added in order; the partial sums pairwise, then the tail."""
    terms = terms.astype(np.float64)
    whole = len(terms) - len(terms) % LANES
    lanes = np.zeros(LANES)
    for start in range(0, whole, LANES):
        lanes = lanes + terms[start : start + LANES]
    tail = 0.0
    for t in terms[whole:]:
        tail += t
    half = LANES // 2
    while half > 0:
        lanes[:half] = lanes[:half] + lanes[half : 2 * half]
        half //= 2
    return float(lanes[0] + tail)


def _data(shape: tuple, dtype: Any) -> np.ndarray:
    rng = np.random.default_rng(sum(shape))
    # magnitudes over many binades: a different order of addition gives different bits
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)).astype(dtype.np)


def _backward(arrays: list[np.ndarray], compiled: bool) -> list[np.ndarray]:
    leaves = [fg.tensor(a, requires_grad=True) for a in arrays]
    loss = (leaves[0] * leaves[1]).sum()
    if compiled:
        with compiler.compiled_autograd(fullgraph=True):
            loss.backward()
    else:
        loss.backward()
    return [t.grad.numpy() for t in leaves]


@pytest.mark.parametrize("dtype", [fg.float32, fg.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("n", SIZES)
def test_full_sums_add_in_the_documented_order(n: int, dtype: Any) -> None:
    """``x * b`` with ``b`` of shape (1,): b's gradient is the fused full sum of x."""
    x = _data((n,), dtype)
    b = np.ones(1, dtype=dtype.np)
    _, got = _backward([x, b], compiled=True)
    assert got.tobytes() == np.array([_documented_sum(x)], dtype=dtype.np).tobytes()
    _, eager = _backward([x, b], compiled=False)
    tol = 1e-5 if dtype is fg.float32 else 1e-10
    np.testing.assert_allclose(got, eager, rtol=tol, atol=tol * np.abs(x).sum())


@pytest.mark.parametrize("dtype", [fg.float32, fg.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("n", SIZES)
def test_row_sums_add_in_the_documented_order(n: int, dtype: Any) -> None:
    """``x * w`` with ``w`` of shape (rows, 1): w's gradient is the fused row sums of x."""
    x = _data((3, n), dtype)
    w = np.ones((3, 1), dtype=dtype.np)
    _, got = _backward([x, w], compiled=True)
    want = np.array([[_documented_sum(row)] for row in x], dtype=dtype.np)
    assert got.tobytes() == want.tobytes()


def test_sums_do_not_depend_on_the_thread_count() -> None:
    x = _data((5, 3 * LANES + 11), fg.float32)
    w = np.ones((5, 1), dtype=np.float32)
    b = np.ones((1, 1), dtype=np.float32)
    previous = numba.get_num_threads()
    results = []
    try:
        for threads in sorted({1, previous}):
            numba.set_num_threads(threads)
            for _ in range(2):
                results.append([g.tobytes() for g in _backward([x, w], compiled=True)])
                results.append([g.tobytes() for g in _backward([x, b], compiled=True)])
    finally:
        numba.set_num_threads(previous)
    assert all(r == results[0] for r in results[0::2])
    assert all(r == results[1] for r in results[1::2])


VECTOR_FADD = re.compile(r"fadd [^\n]*<(\d+) x double>")


@pytest.mark.parametrize("shape, other", [((1000,), (1,)), ((4, 1000), (4, 1))])
def test_block_loops_vectorise(shape: tuple, other: tuple) -> None:
    """The partial sums of a full sum and of row sums are added with vector instructions (the
    point of the layout: without ``reassoc`` a single running sum keeps the loop scalar)."""
    x = np.ones(shape, dtype=np.float32)
    _backward([x, np.ones(other, dtype=np.float32)], compiled=True)
    (program,) = compiler.cached_programs()
    (kernel,) = program.kernels
    assert kernel.reductions
    source, (plan,) = numba_cpu.emit_module([kernel], "vectorisation")
    assert f"for lane in range({LANES}):" in source and "_partial_sums(" in source
    module, _, _ = numba_cpu.load_module(source)
    # compiled afresh with the kernel's own options: code loaded from numba's disk cache has no
    # LLVM IR to inspect
    cached = getattr(module, plan.name)
    options = {k: v for k, v in cached.targetoptions.items() if k not in ("cache", "nopython")}
    function = numba.njit(**options)(cached.py_func)
    hints = program.graph.hints  # the sizes the symbols of the capture stood for

    def concrete(s: tuple) -> tuple:
        return tuple(int(d) for d in substitute(s, hints))

    sizes = (int(np.prod(shape)),) if plan.flat else shape
    arrays = []
    for v in plan.inputs:
        a = np.ones(concrete(v.shape), np.float32)
        arrays.append(a.reshape(-1) if plan.flat else a.reshape((1,) * (2 - a.ndim) + a.shape))
    outputs = [np.empty(sizes, np.float32) for _ in plan.outputs]
    reductions = [np.zeros(concrete(s)) for s in plan.reduced_shapes]
    function(*sizes, *arrays, *outputs, *reductions)
    ir = function.inspect_llvm(function.signatures[0])
    widths = [int(w) for w in VECTOR_FADD.findall(ir)]
    assert widths and max(widths) >= 2, "the partial sums are not added with vector instructions"


def test_dims_read_alike_loop_as_one_and_sum_in_the_documented_order() -> None:
    """A conv-style channel sum over (N, C, H, W) (``x * w`` with ``w`` of shape (1, C, 1, 1)):
    H and W are read alike by every input and summed alike, so the kernel loops over (N, C,
    H W) (``collapse_groups``), and each channel's gradient is the documented order over its
    rows of H W elements, added over N; equal to eager within tolerance (native segments:
    ``test_native_programs``)."""
    n, c, h, w_ = 3, 4, 13, 11  # (H W = 143: one whole block and a tail per row)
    x = _data((n, c, h, w_), fg.float64)
    w = np.ones((1, c, 1, 1))
    got_x, got = _backward([x, w], compiled=True)
    (program,) = compiler.cached_programs()
    (kernel,) = [k for k in program.kernels if k.reductions]
    _, (plan,) = numba_cpu.emit_module([kernel], "collapse")
    assert plan.groups == ((0,), (1,), (2, 3))
    want = np.zeros((1, c, 1, 1))
    for j in range(c):
        total = 0.0
        for i in range(n):
            total += _documented_sum(x[i, j].reshape(-1))
        want[0, j, 0, 0] = total
    assert got.tobytes() == want.tobytes()
    np.testing.assert_array_equal(got_x, np.ones_like(x))
    _, eager = _backward([x, w], compiled=False)
    np.testing.assert_allclose(got, eager, rtol=1e-12)
