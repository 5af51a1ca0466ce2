"""Every CUDA kernel generated for the corpus of backward graphs (tests/cuda/corpus.py, op-table
sample included) and for one-op kernels compiles to PTX for compute capability 9.0, with the
argument types the launcher passes: numba-cuda's type inference and lowering, which the simulator
never runs (it executes the Python source).  No GPU needed; not under the simulator."""

from __future__ import annotations

import modes  # noqa: E402
import pytest

modes.require_ptx()

import corpus  # noqa: E402
from numba import cuda  # noqa: E402

import fusegrad as fg  # noqa: E402
from fusegrad.compiler.codegen import numba_cuda as nc  # noqa: E402
from fusegrad.compiler.passes.fuse import Kernel  # noqa: E402

CC = (9, 0)
SETTINGS = nc.settings_for(CC, multiprocessors=132, max_threads_per_block=1024)


def _compile_all(kernels: list[Kernel]) -> int:
    """Compile every function the launcher may call for ``kernels``; returns how many."""
    source, plans = nc.emit_module(kernels, "PTX test", SETTINGS)
    module, path, _ = nc.load_module(source, SETTINGS)
    count = 0
    for plan in plans:
        for name, signature in nc.launch_signatures(plan):
            try:
                ptx, _ = cuda.compile_ptx(getattr(module, name).py_func, signature, cc=CC)
            except Exception as e:
                raise AssertionError(f"{name} in {path} does not compile: {e}") from e
            assert ".entry" in ptx and ".target sm_90" in ptx
            count += 1
    return count


@pytest.mark.parametrize(
    "case, dtype",
    [(c, d) for c in corpus.CASES for d in c.dtypes] + [(c, "float32") for c in corpus.op_cases()],
    ids=lambda p: p.name if isinstance(p, corpus.Case) else p,
)
def test_generated_kernels_compile_to_ptx(case: corpus.Case, dtype: str) -> None:
    c = corpus.capture(case.make(dtype)[1])
    kernels = c.program.kernels
    if not kernels:
        pytest.skip(f"{case.name}: the backward has no fused kernel")
    assert _compile_all(kernels) >= len(kernels)


def test_one_op_kernels_compile_to_ptx() -> None:
    kernels = [
        corpus.one_op_kernel("exp", [()], fg.float32),
        corpus.one_op_kernel("pow", [(3, 4), (4,)], fg.float64),
        corpus.one_op_kernel("sqrt", [(5,)], fg.float32),
        corpus.one_op_kernel("floor", [(2, 3)], fg.float64),
        corpus.one_op_kernel("cast", [(2, 3)], fg.float32, dtype=fg.int64),
        corpus.one_op_kernel("sum", [(4, 5)], fg.int64, dim=(1,), keepdim=False),
        corpus.one_op_kernel("sum", [(4, 5)], fg.bool, dim=None, keepdim=False),
        corpus.one_op_kernel("sum_to", [(2, 3, 4)], fg.float32, shape=(3, 1)),
    ]
    assert _compile_all(kernels) >= len(kernels)


@pytest.mark.parametrize("dtype", [fg.float32, fg.float64], ids=lambda d: d.name)
def test_every_elementwise_formula_compiles_to_ptx(dtype: fg.dtype) -> None:
    kernels = corpus.expression_kernels(dtype)
    assert _compile_all(kernels) >= len(kernels)
