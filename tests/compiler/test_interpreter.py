"""The precompiled interpreter for small kernels: chosen when eligible, same results as the
generated code and as eager mode, every opcode exercised."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler.codegen import interpreter
from fusegrad.compiler.codegen.interpreter import CORE, LOOPS, OPCODES, REWRITES


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


def _three_ways(fn: Any, data: list, dtype: Any, tol: float) -> dict:
    """``fn(*leaves).backward()`` in eager mode, on the interpreter only and on generated code
    only (fullgraph); the compiled gradients are checked against eager's within ``tol``.
    Returns mode -> the program (None for eager)."""
    grads, programs = {}, {}
    for mode, limit in (("eager", None), ("interpreter", 1 << 30), ("generated", 0)):
        leaves = [fg.tensor(a, dtype=dtype, requires_grad=True) for a in data]
        loss = fn(*leaves)
        programs[mode] = None
        if limit is None:
            loss.backward()
        else:
            compiler.reset()
            compiler.config.interpreter_max_elements = limit
            with compiler.compiled_autograd(fullgraph=True):
                loss.backward()
            (programs[mode],) = compiler.cached_programs()
        grads[mode] = [t.grad.numpy() for t in leaves]
    for mode in ("interpreter", "generated"):
        for got, want in zip(grads[mode], grads["eager"]):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return programs


@pytest.mark.parametrize("dtype", [fg.float32, fg.float64])
def test_interpreter_matches_generated_code_and_eager(dtype: Any) -> None:
    rng = np.random.default_rng(3)
    data = [rng.standard_normal(257) for _ in range(2)]
    programs = _three_ways(_program, data, dtype, 1e-4 if dtype is fg.float32 else 1e-10)
    assert programs["interpreter"]._interpreted
    assert not programs["generated"]._interpreted


def test_large_kernels_use_generated_code() -> None:
    compiler.config.interpreter_max_elements = 100
    x = fg.randn(1000, requires_grad=True)
    with compiler.compiled_autograd():
        x.tanh().sum().backward()
    (program,) = compiler.cached_programs()
    assert not program._interpreted and program.kernels


def test_opcode_table_is_dense() -> None:
    assert sorted(LOOPS.values()) == list(range(len(LOOPS)))
    assert set(OPCODES.values()) == set(LOOPS.values())
    for op, (loop, _) in REWRITES.items():
        assert OPCODES[op] == LOOPS[loop] and op not in LOOPS


# special values of every kind: signed zeros, denormals, infinities, NaN, ties and near-ties
_SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 1e-45, -1e-45, 1e-310, 3.4e38, -3.4e38, 1e300]
_SPECIAL += [np.inf, -np.inf, np.nan, 1.0000001, 0.99999994, -2.5, 7.0, 1e-30]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy meeting inf and nan
@pytest.mark.parametrize("dtype", [fg.float32, fg.float64], ids=lambda d: d.name)
@pytest.mark.parametrize(
    ("op", "boolean"),
    [(op, False) for op in sorted(set(REWRITES) - {"broadcast_to"})]
    + [(op, True) for op in ("cast", "clone", "logical_not")],
    ids=lambda v: ("bool" if v else "float") if isinstance(v, bool) else v,
)
def test_rewritten_ops_are_exact(op: str, boolean: bool, dtype: Any) -> None:
    """An op another loop computes (``REWRITES``: operands swapped, repeated or a constant)
    gives eager's result bit for bit, on every pair of special values (bool operands, as
    0.0 / 1.0 in the registers, for the ops that take them)."""
    from fusegrad.compiler.ir import Graph
    from fusegrad.compiler.passes.fuse import Kernel
    from fusegrad.ops.registry import REGISTRY

    arity = len(REGISTRY[op].inputs)
    values = np.array(_SPECIAL, dtype=dtype.np)
    if boolean:
        values = np.array([False, True])
    a, b = (np.ascontiguousarray(m.ravel()) for m in np.meshgrid(values, values))
    g = Graph()
    operands = tuple(
        g.input("saved", k, (a.size,), fg.bool if boolean else dtype) for k in range(arity)
    )
    attrs = {"dtype": dtype} if op == "cast" else {}
    out_dtype = REGISTRY[op].meta((a.shape,) * arity, tuple(i.dtype for i in operands), **attrs)[1]
    v = g.add(op, operands, attrs, a.shape, out_dtype)
    # (a float input beside bool operands: the kernel's one float dtype)
    extra = g.input("saved", arity, a.shape, dtype)
    kernel = Kernel(shape=a.shape, values=[v], inputs=[*operands, extra], outputs=[v])
    assert interpreter.eligible(kernel)
    env = dict(zip(operands, (a, b)))
    env[extra] = np.zeros(a.shape, dtype.np)
    got = interpreter.InterpretedKernel(kernel)(env)[v]
    want = np.asarray(REGISTRY[op].kernel(*[env[i] for i in operands], **attrs), dtype=out_dtype.np)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=op)


def _rows_and_columns(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
    """Kernels with broadcast inputs and partial reductions: a bias (column sums for its
    gradient), a layer norm and a softmax over rows (row sums), a scale per row."""
    h = (x * w + b).tanh()  # w: (1, C) broadcast down the rows, b: (C,)
    mean = h.mean(dim=-1, keepdim=True)
    var = ((h - mean) ** 2).mean(dim=-1, keepdim=True)
    h = (h - mean) / (var + 1e-5).sqrt()
    p = fg.nn.functional.softmax(h * 1.5, dim=-1)
    scale = p.sum(dim=0, keepdim=True)  # (1, C): a column sum in the forward
    return (p * scale * h + h.exp() * 0.1).sum()


@pytest.mark.parametrize("dtype", [fg.float32, fg.float64])
@pytest.mark.parametrize("rows", [1, 7, 33])
def test_broadcast_inputs_and_row_and_column_sums_are_interpreted(dtype: Any, rows: int) -> None:
    rng = np.random.default_rng(rows)
    data = [
        rng.standard_normal((rows, 24)),
        rng.standard_normal((1, 24)),
        rng.standard_normal(24),
    ]
    tol = 2e-4 if dtype is fg.float32 else 1e-10
    programs = _three_ways(_rows_and_columns, data, dtype, tol)
    interpreted = programs["interpreter"]
    kernels = list(interpreted._interpreted.values())
    assert not interpreted.default.kernel_fns  # nothing generated: all interpreted
    assert any(k.partial for k in kernels)  # with row or column sums
    assert rows == 1 or any(k.broadcast_inputs for k in kernels)
    assert not programs["generated"]._interpreted


def test_a_new_batch_size_reuses_an_interpreted_program_with_row_sums() -> None:
    # the partial reductions' dims come from the kernel's structure, the sizes from the call
    w = fg.tensor(np.linspace(-1.0, 1.0, 16), requires_grad=True)
    for rows in (3, 5, 9):
        x = fg.tensor(np.random.default_rng(rows).standard_normal((rows, 16)), requires_grad=True)
        want = None
        for compiled in (False, True):
            x.grad = w.grad = None
            with compiler.compiled_autograd() if compiled else contextlib.nullcontext():
                fg.nn.functional.log_softmax(x * w, dim=-1).sum().backward()
            got = [x.grad.numpy().copy(), w.grad.numpy().copy()]
            if want is None:
                want = got
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert compiler.counters.captures == 1


def test_kernels_of_core_ops_run_on_the_core_machine() -> None:
    # _rows_and_columns uses core ops only; _program also uses sin, cos and sign... of the full
    rng = np.random.default_rng(5)
    rows = _three_ways(
        _rows_and_columns,
        [rng.standard_normal((6, 24)), rng.standard_normal((1, 24)), rng.standard_normal(24)],
        fg.float64,
        1e-10,
    )["interpreter"]
    assert all(k.core for k in rows._interpreted.values())
    full = _three_ways(_program, [rng.standard_normal(65) for _ in range(2)], fg.float64, 1e-10)
    kernels = list(full["interpreter"]._interpreted.values())
    assert any(not k.core for k in kernels)
    names = {v.op for k in kernels if k.core for v in k.kernel.values}
    assert names <= CORE
