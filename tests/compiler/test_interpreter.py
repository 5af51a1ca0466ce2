"""The precompiled interpreter for small kernels: chosen when eligible, same results as the
generated code and as eager mode, every opcode exercised."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler.codegen.interpreter import OPCODES


@pytest.fixture(autouse=True)
def _fresh_compiler() -> Any:
    compiler.reset()
    compiler._debug.check = True
    previous = compiler.config.interpreter_max_elements
    yield
    compiler.config.interpreter_max_elements = previous
    compiler._debug.check = False
    compiler.reset()


def _program(x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
    h = (x * w + 0.5).tanh() * x.sigmoid() + (-x * x).exp() * 0.25
    h = fg.where(h > 0, h.log1p(), h.expm1()) + fg.maximum(x, w) - fg.minimum(x, w)
    h = h + x.sin() * w.cos() + (x * x + 1).sqrt() + (x.abs() + 1).log() + x.erf()
    h = h + x.clamp(-0.5, 0.5) + (x / (w.abs() + 1)) + x.sign() * w.relu()
    return (h * h).sum()


@pytest.mark.parametrize("dtype", [fg.float32, fg.float64])
def test_interpreter_matches_generated_code_and_eager(dtype: Any) -> None:
    rng = np.random.default_rng(3)
    data = [rng.standard_normal(257) for _ in range(2)]
    grads = {}
    for mode, limit in (("eager", None), ("interpreter", 1 << 30), ("generated", 0)):
        leaves = [fg.tensor(a, dtype=dtype, requires_grad=True) for a in data]
        loss = _program(*leaves)
        if limit is None:
            loss.backward()
        else:
            compiler.reset()
            compiler.config.interpreter_max_elements = limit
            with compiler.compiled_autograd(fullgraph=True):
                loss.backward()
            (program,) = compiler.cached_programs()
            interpreted = len(program._interpreted)
            assert (interpreted > 0) == (mode == "interpreter")
        grads[mode] = [t.grad.numpy() for t in leaves]
    tol = 1e-4 if dtype is fg.float32 else 1e-10
    for mode in ("interpreter", "generated"):
        for got, want in zip(grads[mode], grads["eager"]):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_large_kernels_use_generated_code() -> None:
    compiler.config.interpreter_max_elements = 100
    x = fg.randn(1000, requires_grad=True)
    with compiler.compiled_autograd():
        x.tanh().sum().backward()
    (program,) = compiler.cached_programs()
    assert not program._interpreted and program.kernels


def test_opcode_table_is_dense() -> None:
    assert sorted(OPCODES.values()) == list(range(len(OPCODES)))
