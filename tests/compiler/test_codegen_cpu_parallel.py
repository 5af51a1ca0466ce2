"""The ``prange`` variant of generated CPU kernels: only for kernels without reductions, chosen by
size and thread count, and bitwise identical to the serial loop (flat and ND loops, ``+=``
accumulation included)."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import pytest

import fusegrad as fg
from fusegrad.compiler.codegen import numba_cpu
from fusegrad.compiler.ir import Graph
from fusegrad.compiler.passes.fuse import Kernel


def _kernel(x_shape: tuple, b_shape: tuple, accumulate: bool, reduce: bool = False) -> Kernel:
    """``y = tanh(x) * b + exp(-x)``, ``b`` broadcast; optionally ``+=`` into an existing array,
    or also ``sum_to(y, b's shape)``."""
    g = Graph()
    f32 = fg.float32
    x, b = g.input("saved", 0, x_shape, f32), g.input("saved", 1, b_shape, f32)
    t = g.add("tanh", (x,), {}, x_shape, f32)
    m = g.add("mul", (t, b), {}, x_shape, f32)
    e = g.add("exp", (g.add("neg", (x,), {}, x_shape, f32),), {}, x_shape, f32)
    y = g.add("add", (m, e), {}, x_shape, f32)
    kernel = Kernel(shape=x_shape, values=[t, m, e.inputs[0], e, y], inputs=[x, b], outputs=[y])
    if accumulate:
        kernel.accumulate.add(y)
    if reduce:
        r = g.add("sum_to", (y,), {"shape": b_shape}, b_shape, f32)
        kernel.reductions.append(r)
        kernel.outputs.append(r)
    return kernel


def _load(kernel: Kernel) -> tuple[Any, numba_cpu.KernelPlan]:
    source, (plan,) = numba_cpu.emit_module([kernel], "parallel test")
    module, _, _ = numba_cpu.load_module(source)
    return module, plan


def _call(fn: Any, plan: numba_cpu.KernelPlan, kernel: Kernel, out: np.ndarray) -> np.ndarray:
    """Run ``fn`` (no reductions) on fixed data, writing into ``out`` (a copy)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(kernel.shape).astype(np.float32)
    b = rng.standard_normal(kernel.inputs[1].shape).astype(np.float32)
    out = out.copy()
    if plan.flat:
        fn(x.size, x.reshape(-1), b.reshape(-1), out.reshape(-1))
    else:
        fn(*x.shape, x, b.reshape((1,) * (x.ndim - b.ndim) + b.shape), out)
    return out


def test_only_kernels_without_reductions_get_a_parallel_variant() -> None:
    module, plan = _load(_kernel((8, 5), (5,), accumulate=False))
    assert plan.parallel_name == "kernel_0_parallel"
    source = open(module.__file__).read()
    serial, parallel = source.split("def kernel_0_parallel(")
    assert "prange" not in serial and "numba.prange(n0)" in parallel
    assert "parallel=True" in serial.splitlines()[-1]  # the decorator of the parallel variant
    _, plan = _load(_kernel((8, 5), (5,), accumulate=False, reduce=True))
    assert plan.parallel_name is None


def test_parallel_variant_is_chosen_by_size_and_thread_count(monkeypatch: Any) -> None:
    monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", 100)
    many = numba.get_num_threads() > 1
    assert numba_cpu.use_parallel(99) is False
    assert numba_cpu.use_parallel(100) is many
    monkeypatch.setattr(numba, "get_num_threads", lambda: 1)
    assert numba_cpu.use_parallel(10**9) is False


@pytest.mark.parametrize(
    "x_shape, b_shape, accumulate",
    [((3000,), (1,), False), ((40, 75), (75,), True)],
    ids=["flat", "nd-accumulate"],
)
def test_parallel_variant_matches_the_serial_loop_bitwise(
    monkeypatch: Any, x_shape: tuple, b_shape: tuple, accumulate: bool
) -> None:
    if numba.get_num_threads() < 2:
        pytest.skip("numba runs with one thread: the parallel variant is never chosen")
    monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", 16)
    kernel = _kernel(x_shape, b_shape, accumulate)
    module, plan = _load(kernel)
    assert plan.flat == (len(x_shape) == 1)
    dispatch = numba_cpu.kernel_function(module, plan)
    start = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    if not accumulate:
        start[:] = np.nan  # every element must be written
    serial = _call(getattr(module, plan.name), plan, kernel, start)
    parallel = _call(dispatch, plan, kernel, start)
    assert dispatch.parallel.signatures  # the prange variant ran (and was compiled)
    assert not np.isnan(serial).any()
    assert serial.tobytes() == parallel.tobytes()
    if accumulate:
        assert not np.array_equal(serial, start)
