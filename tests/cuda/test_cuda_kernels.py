"""Generated CUDA kernels, run in numba's CUDA simulator, against eager backward passes, the CPU
generated code and numpy: elementwise chains with broadcasts, partial and full reductions (one and
two passes), ``.grad +=`` epilogues, float32 and float64, strided inputs, one-op kernels, and
bitwise reproducibility.  Small shapes: the simulator runs every CUDA thread in Python."""

from __future__ import annotations

import modes  # noqa: E402
import pytest

modes.require_device()

import dataclasses  # noqa: E402
from typing import Any  # noqa: E402

import corpus  # noqa: E402
import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import fusegrad as fg  # noqa: E402
from fusegrad import compiler  # noqa: E402
from fusegrad.compiler.codegen import common  # noqa: E402
from fusegrad.compiler.codegen import numba_cuda as nc  # noqa: E402
from fusegrad.compiler.passes.fuse import Kernel  # noqa: E402
from fusegrad.ops.registry import REGISTRY  # noqa: E402

assert nc.device_settings().simulator


def _cuda_runner(c: corpus.Captured, settings: nc.DeviceSettings | None = None) -> Any:
    """A kernel runner for ``corpus.run_program``: the program's kernels compiled as one CUDA
    module, launched through ``run_kernel``; accumulated outputs start from a device copy of the
    leaf's ``.grad``."""
    kernels = c.program.kernels
    compiled, _ = nc.compile_kernels(kernels, "test", settings)
    by_kernel = {id(k): ck for k, ck in zip(kernels, compiled)}
    slots = corpus.grad_slots(c)

    def run(kernel: Kernel, env: dict) -> dict:
        inputs = {v: cuda.to_device(np.array(env[v])) for v in kernel.inputs}
        grads = {
            v: cuda.to_device(c.leaves[slots[v]]._grad._data.copy()) for v in kernel.accumulate
        }
        out = nc.run_kernel(by_kernel[id(kernel)], inputs, grads)
        return {v: a.copy_to_host() for v, a in out.items()}

    return run


def _cuda_grads(case: corpus.Case, dtype: str, settings: Any = None) -> tuple[list, Any]:
    leaves, loss = case.make(dtype)
    c = corpus.capture(loss)
    env = corpus.run_program(c, _cuda_runner(c, settings))
    return corpus.final_grads(c, env, leaves), c


def _assert_grads_close(got: list, want: list, dtype: str) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if w is not None:
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, **corpus.tolerance(dtype))


@pytest.mark.parametrize(
    "case, dtype",
    [(c, d) for c in corpus.CASES for d in c.dtypes],
    ids=lambda p: p.name if isinstance(p, corpus.Case) else p,
)
def test_backward_on_cuda_matches_eager(case: corpus.Case, dtype: str) -> None:
    got, c = _cuda_grads(case, dtype)
    assert c.program.kernels  # the case exercises generated code
    _assert_grads_close(got, corpus.eager_grads(case.make, dtype), dtype)


@pytest.mark.parametrize("case", corpus.op_cases(), ids=lambda c: c.name)
def test_op_table_backward_on_cuda_matches_eager(case: corpus.Case) -> None:
    got, _ = _cuda_grads(case, "float32")
    _assert_grads_close(got, corpus.eager_grads(case.make, "float32"), "float32")


def test_fusion_golden_and_mlp_match_the_cpu_generated_code() -> None:
    for case in corpus.CASES:
        if case.name not in ("golden", "mlp", "golden_2d_accumulate"):
            continue
        got, c = _cuda_grads(case, "float32")
        if case.name == "golden":
            # one kernel: the elementwise chain with b's sum_to as its epilogue
            (kernel,) = c.program.kernels
            assert [r.op for r in kernel.reductions] == ["sum_to"]
        compiler.reset()
        previous = compiler.config.interpreter_max_elements
        compiler.config.interpreter_max_elements = 0
        try:
            leaves, loss = case.make("float32")
            with compiler.compiled_autograd(fullgraph=True):
                loss().backward()
            assert compiler.counters.captures == 1
        finally:
            compiler.config.interpreter_max_elements = previous
            compiler.reset()
        _assert_grads_close(got, [t.grad.numpy() for t in leaves], "float32")


def test_accumulation_adds_into_the_given_grad_arrays_in_place() -> None:
    case = next(c for c in corpus.CASES if c.name == "golden_2d_accumulate")
    leaves, loss = case.make("float64")
    c = corpus.capture(loss)
    accumulated = corpus.grad_slots(c)
    assert accumulated  # x's and w's gradients are added by the kernel itself
    (kernel,) = [k for k in c.program.kernels if k.accumulate]
    (compiled,), _ = nc.compile_kernels([kernel])
    env = corpus.run_program(c, _cuda_runner(c))  # every value the kernel reads
    buffers = {v: cuda.to_device(c.leaves[s]._grad._data.copy()) for v, s in accumulated.items()}
    before = {v: b.copy_to_host() for v, b in buffers.items()}
    inputs = {v: np.array(env[v]) for v in kernel.inputs}
    out = nc.run_kernel(compiled, inputs, buffers)
    for v, buf in buffers.items():
        assert out[v] is buf  # the result is the .grad array itself
        increment = buf.copy_to_host() - before[v]
        fresh = nc.run_kernel(compiled, inputs, {v: cuda.to_device(np.zeros(v.shape))})[v]
        np.testing.assert_allclose(increment, fresh.copy_to_host(), rtol=1e-12, atol=1e-12)
        assert np.abs(increment).max() > 0


def test_results_are_bitwise_reproducible_and_split_sums_are_right() -> None:
    # more blocks wanted than the default simulator settings: sums split into several slices
    settings = dataclasses.replace(nc.SIMULATOR, reduction_blocks=8)
    assert nc._slices(1, 70, 4, settings) > 1 and nc._slices(1, 300, 32, settings) > 1
    for name in ("long_reductions", "golden", "mlp"):
        case = next(c for c in corpus.CASES if c.name == name)
        first, _ = _cuda_grads(case, "float32", settings)
        second, _ = _cuda_grads(case, "float32", settings)
        for a, b in zip(first, second):
            assert a.tobytes() == b.tobytes()
        _assert_grads_close(first, corpus.eager_grads(case.make, "float32"), "float32")


# ---- one-op kernels (the eager CUDA path builds these) ----------------------------------------


def test_one_op_elementwise_kernels_are_cached_by_source() -> None:
    first = nc.compile_kernel(corpus.one_op_kernel("maximum", [(3, 4), (4,)], fg.float32))
    again = corpus.one_op_kernel("maximum", [(5, 4), (4,)], fg.float32)  # new sizes only
    second = nc.compile_kernel(again)
    assert second.functions == first.functions  # the same compiled functions
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    b[1] = np.nan
    (out,) = nc.run_kernel(second, {again.inputs[0]: a, again.inputs[1]: b}).values()
    np.testing.assert_array_equal(out.copy_to_host(), np.maximum(a, b))  # NaN propagates


SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -2.5, 3.0, 1e-30, 80.0]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy scalars meeting inf and nan
@pytest.mark.parametrize("dtype", [fg.float32, fg.float64], ids=lambda d: d.name)
def test_every_elementwise_formula_matches_numpy(dtype: Any) -> None:
    """Each ``lowering.EXPRESSIONS`` formula, compiled for CUDA, against the primitive's eager
    (numpy) kernel, special values included (not for casts: float -> int of nan is undefined)."""
    rng = np.random.default_rng(3)
    kernels = corpus.expression_kernels(dtype)
    compiled, _ = nc.compile_kernels(kernels, "every formula")
    for kernel, ck in zip(kernels, compiled):
        (v,) = kernel.values
        arrays = []
        for k, x in enumerate(kernel.inputs):
            if x.dtype is fg.bool:
                arrays.append(rng.random(x.shape) < 0.5)
                continue
            data = rng.standard_normal(x.shape) * 2
            if k == 0 and v.op != "cast":
                data.reshape(-1)[:] = SPECIAL
            arrays.append(data.astype(x.dtype.np))
        (out,) = nc.run_kernel(ck, dict(zip(kernel.inputs, arrays))).values()
        with np.errstate(all="ignore"):
            want = np.asarray(REGISTRY[v.op].kernel(*arrays, **dict(v.attrs)))
        got = out.copy_to_host()
        assert got.dtype == want.dtype, v.op
        rtol = 1e-6 if dtype is fg.float32 else 1e-13
        np.testing.assert_allclose(got, want, rtol=rtol, atol=0, equal_nan=True, err_msg=v.op)


def test_sign_of_infinity() -> None:
    kernel = corpus.one_op_kernel("sign", [(2,)], fg.float64)
    data = np.array([np.inf, -np.inf])
    (out,) = nc.run_kernel(nc.compile_kernel(kernel), {kernel.inputs[0]: data}).values()
    np.testing.assert_array_equal(out.copy_to_host(), [1.0, -1.0])


@pytest.mark.parametrize(
    "op, shape, attrs, dtype",
    [
        ("sum_to", (6, 5), {"shape": (1, 5)}, fg.float32),
        ("sum_to", (6, 5), {"shape": (6, 1)}, fg.float64),
        ("sum_to", (2, 3, 4), {"shape": (3, 1)}, fg.float32),
        ("sum", (7, 3), {"dim": None, "keepdim": False}, fg.float32),
        ("sum", (2, 3, 4), {"dim": (0, 2), "keepdim": True}, fg.float64),
        ("sum", (4, 5), {"dim": (1,), "keepdim": False}, fg.int64),
        ("sum", (4, 5), {"dim": None, "keepdim": False}, fg.bool),
    ],
)
def test_one_op_reductions_match_numpy(op: str, shape: tuple, attrs: dict, dtype: Any) -> None:
    kernel = corpus.one_op_kernel(op, [shape], dtype, **attrs)
    (x,) = kernel.inputs
    compiled = nc.compile_kernel(kernel)
    rng = np.random.default_rng(1)
    data = (rng.standard_normal(shape) * 5).astype(dtype.np)
    (out,) = nc.run_kernel(compiled, {x: data}).values()
    want = REGISTRY[op].kernel(data, **attrs)
    got = out.copy_to_host()
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_strided_inputs_take_the_general_form() -> None:
    compiled = nc.compile_kernel(corpus.one_op_kernel("mul", [(4, 6), (6,)], fg.float64))
    assert compiled.plan.flat is None and compiled.plan.strided  # a broadcast input: ND only
    kernel = corpus.one_op_kernel("sub", [(4, 6), (4, 6)], fg.float64)
    x, y = kernel.inputs
    compiled = nc.compile_kernel(kernel)
    assert compiled.plan.flat is not None
    called: list = []

    class Launched:  # a kernel function that records its launches (``fn[grid, block]``)
        def __init__(self, name: str, fn: Any) -> None:
            self.name, self.fn = name, fn

        def __getitem__(self, config: Any) -> Any:
            called.append(self.name)
            return self.fn[config]

    functions = {name: Launched(name, fn) for name, fn in compiled.functions.items()}
    compiled = dataclasses.replace(compiled, functions=functions)
    rng = np.random.default_rng(2)
    a, c = rng.standard_normal((6, 4)), rng.standard_normal((4, 6))
    transposed = cuda.to_device(a).T  # a non-contiguous view
    assert not transposed.is_c_contiguous()
    (out,) = nc.run_kernel(compiled, {x: transposed, y: cuda.to_device(c)}).values()
    np.testing.assert_array_equal(out.copy_to_host(), a.T - c)
    (out,) = nc.run_kernel(compiled, {x: cuda.to_device(a.T.copy()), y: c}).values()
    np.testing.assert_array_equal(out.copy_to_host(), a.T - c)
    assert called == [compiled.plan.strided[0].name, compiled.plan.flat.name]


def test_generated_module_names_every_value_and_hashes_its_target() -> None:
    case = next(c for c in corpus.CASES if c.name == "partial_reductions")
    c = corpus.capture(case.make("float32")[1])
    source, plans = nc.emit_module(c.program.kernels, "test")
    for kernel in c.program.kernels:
        for v in kernel.values + kernel.reductions:
            assert f"# %{v.id} = {v.op}" in source
    assert "@cuda.jit(cache=True)" in source and "cuda.shared.array(" in source
    assert "atomic" not in source and "np.sqrt" not in source
    # reductions keeping different dims of one loop: one function per group
    assert any(len(p.strided) > 1 for p in plans)
    # the module name hashes the target with the source: a cache file per compute capability
    device = nc.settings_for((9, 0), 132, 1024)
    assert "sm90" in nc._flags(device) and "sm80" in nc._flags(nc.settings_for((8, 0), 108, 1024))
    names = {common.module_name(source, nc._flags(t)) for t in (device, nc.SIMULATOR)}
    assert len(names) == 2
    module, path, _ = nc.load_module(source, nc.SIMULATOR)
    assert open(path).read() == source and hasattr(module, "kernel_0")


def test_kernels_it_cannot_generate_raise_not_implemented() -> None:
    kernel = corpus.one_op_kernel("amax", [(3, 4)], fg.float32, dim=(1,), keepdim=False)
    kernel.reductions, kernel.values = kernel.values, []  # a reduction fuse never fuses
    with pytest.raises(NotImplementedError, match="amax is not a fused reduction"):
        nc.emit_kernel(kernel, "kernel_0")
