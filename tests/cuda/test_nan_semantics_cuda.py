"""NaN, inf and signed zeros in CUDA kernels (numba's simulator) are eager's: the CUDA
counterpart of ``tests/compiler/test_nan_semantics.py`` (docs/ARCHITECTURE.md, contract 8).

* Every ``lowering.EXPRESSIONS`` primitive, compiled by the CUDA emitter, at +-0, +-inf, NaN,
  +-1, +-largest, +-smallest denormal and a few ordinary values, every pair for binary ones
  (``special_values``), float32 and float64, against the primitive's eager (numpy) kernel: NaN
  where numpy gives NaN, the same infinities, the same sign of zero, finite values within the
  documented ulp bound.  Under the simulator the helpers (``cpu_helpers``' Python source) run as
  Python on numpy scalars and ``math`` is numpy's; ``test_cuda_ptx.py`` compiles the same
  formulas to PTX.
* The compiled backward of CUDA tensors through abs, sign, sqrt, maximum/minimum (ties) and pow
  at those points, against eager on the CPU.

Generated CUDA kernels carry no fast-math option (numba-cuda's default, ``fastmath=False``):
checked on the source.
"""

from __future__ import annotations

import modes  # noqa: E402
import pytest

modes.require_device()

from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import special_values as sv  # noqa: E402

import fusegrad as fg  # noqa: E402
from fusegrad import compiler  # noqa: E402
from fusegrad.compiler.codegen import numba_cuda as nc  # noqa: E402

DTYPES = [fg.float32, fg.float64]


def _run(kernel: Any, arrays: dict) -> dict:
    (compiled,), _ = nc.compile_kernels([kernel], "special values")
    out = nc.run_kernel(compiled, arrays)
    return {v: a.copy_to_host() for v, a in out.items()}


def _problems(dtype: Any, casts_to_int: bool = False) -> list[str]:
    if casts_to_int:
        x = sv.finite_in_range(dtype)
        y, c = x.copy(), np.ones(len(x), dtype=bool)
    else:
        x, y, c = sv.grid(dtype)
    kernel = sv.expression_kernel(dtype, len(x), casts_to_int=casts_to_int)
    arrays = dict(zip(kernel.inputs, (x, y, c)))
    results = _run(kernel, arrays)
    problems = []
    for v in kernel.values:
        operands = tuple(arrays[i] for i in v.inputs)
        want = sv.eager(v, arrays)
        got = sv.outside_domain_as_numpy(v.op, results[v], want, operands)
        bad = sv.mismatches(got, want, sv.ulp_bound(v.op, dtype), operands)
        problems += [f"{sv.describe(v)} {b}" for b in bad]
    return problems


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy scalars meeting inf and nan
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_expressions_match_numpy_at_special_values(dtype: Any) -> None:
    problems = _problems(dtype)
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems[:40])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_casts_to_integers_match_numpy(dtype: Any) -> None:
    problems = _problems(dtype, casts_to_int=True)
    assert not problems, "\n".join(problems)


def test_generated_kernels_use_no_fast_math() -> None:
    kernel = sv.expression_kernel(fg.float32, 4)
    source, _ = nc.emit_module([kernel], "flags")
    assert "fastmath" not in source
    assert "@cuda.jit(cache=True)" in source


GRADIENTS: dict[str, tuple[Callable[..., fg.Tensor], int]] = {
    "abs": (lambda a: a.abs(), 1),
    "sign": (lambda a: a.sign(), 1),
    "sqrt": (lambda a: a.sqrt(), 1),
    "abs_chain": (lambda a: a.abs() * 3.0 + a, 1),
    "cancel": (lambda a: (a - a).abs().sqrt(), 1),
    "maximum": (lambda a, b: fg.maximum(a, b), 2),
    "minimum": (lambda a, b: fg.minimum(a, b), 2),
    "pow": (lambda a, b: a**b, 2),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_compiled_gradients_on_cuda_match_eager_at_special_values(name: str, dtype: Any) -> None:
    f, arity = GRADIENTS[name]
    x, y, _ = sv.grid(dtype)
    arrays = [x, y] if arity == 2 else [sv.values(dtype)]
    cpu = [fg.tensor(a, requires_grad=True) for a in arrays]
    f(*cpu).sum().backward()
    compiler.reset()
    leaves = [fg.tensor(a, device="cuda", requires_grad=True) for a in arrays]
    with compiler.compiled_autograd():
        f(*leaves).sum().backward()
    (program,) = compiler.cached_programs()
    assert program.device == "cuda"
    ulp = sv.ulp_bound("log", dtype) if name == "pow" else 0
    for k, (t, c) in enumerate(zip(leaves, cpu)):
        got = t.grad.cpu().numpy()
        bad = sv.mismatches(got, c.grad.numpy(), ulp, tuple(arrays))
        assert not bad, f"gradient of input {k}: {len(bad)} mismatches: " + "; ".join(bad[:6])
