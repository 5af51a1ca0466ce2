"""NaN, inf and signed zeros in compiled code are eager's (docs/ARCHITECTURE.md, contract 8, and
docs/numerics.md).

* Generated kernels carry no fast-math flag that reassociates or drops signed zeros: ``g + (-g)``
  stays NaN at inf, ``x - x`` keeps +0 (the facts of the issue), checked through the public
  ``compiled_autograd`` path and in the emitted decorator.
* Every ``lowering.EXPRESSIONS`` primitive, as generated CPU code (serial and ``prange``
  variants) and as interpreter ops, at +-0, +-inf, NaN, +-1, +-largest, +-smallest denormal and a
  few ordinary values, every pair for binary ones (``special_values``), in float32 and float64,
  against the primitive's eager (numpy) kernel: NaN where numpy gives NaN, the same infinities,
  the same sign of zero, finite values bitwise equal or, for libm and the float32 helpers,
  within their documented ulp bound.  The CUDA emitter gets the same test in the simulator
  (``tests/cuda/test_nan_semantics_cuda.py``).
* The scalar helpers of ``cpu_helpers`` called directly, compiled and as plain Python (what the
  CUDA simulator runs), against numpy.
* Gradients of abs, sign, sqrt, maximum/minimum (ties) and pow at those points: generated code,
  interpreter and debug mode against eager, float32 and float64.
* Debug mode keeps every dtype eager's (a float32 leaf gets a float32 ``.grad``) and computes
  bitwise what eager computes; IR scalars keep their dtype and the sign of zero.
* Fused sums keep NaN and inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numba
import numpy as np
import pytest
import special_values as sv

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler.codegen import cpu_helpers, numba_cpu
from fusegrad.compiler.codegen.interpreter import InterpretedKernel, eligible
from fusegrad.compiler.ir import Graph
from fusegrad.ops.registry import REGISTRY

DTYPES = [fg.float32, fg.float64]
COMPILED_MODES = ("generated", "interpreter", "debug")


@pytest.fixture(autouse=True)
def _fresh_compiler() -> Iterator[None]:
    compiler.reset()
    compiler._debug.check = True
    previous = compiler.config.interpreter_max_elements
    yield
    compiler.config.interpreter_max_elements = previous
    compiler._debug.check = False
    compiler.reset()


def _grads(f: Callable[..., fg.Tensor], arrays: list[np.ndarray], mode: str) -> list[np.ndarray]:
    """The leaves' gradients of ``f(*leaves).sum()``: ``mode`` is "eager", "generated" (every
    kernel generated code), "interpreter" (every kernel interpreted) or "debug"; the compiled
    modes check that the backward took that path."""
    leaves = [fg.tensor(a, requires_grad=True) for a in arrays]
    if mode == "eager":
        f(*leaves).sum().backward()
    else:
        compiler.reset()
        compiler.config.interpreter_max_elements = 1 << 30 if mode == "interpreter" else 0
        with compiler.compiled_autograd(
            mode="debug" if mode == "debug" else "default", fullgraph=True
        ):
            f(*leaves).sum().backward()
        (program,) = compiler.cached_programs()
        if mode == "generated":
            assert not program._interpreted
        elif mode == "interpreter":
            assert program._interpreted or not program.kernels
        else:
            assert not program.kernels
    return [t.grad.numpy() for t in leaves]


def _assert_grads_match_eager(
    f: Callable[..., fg.Tensor], arrays: list[np.ndarray], mode: str, ulp: int = 0
) -> None:
    want = _grads(f, arrays, "eager")
    got = _grads(f, arrays, mode)
    for k, (g, w) in enumerate(zip(got, want)):
        bad = sv.mismatches(g, w, ulp, tuple(arrays))
        assert not bad, f"{mode}: gradient of input {k}: {len(bad)} mismatches, " + "; ".join(
            bad[:6]
        )


# ---- fast-math: the facts of the issue ----------------------------------------------------------


def test_generated_kernels_allow_only_contraction() -> None:
    """``contract`` (FMA) keeps NaN, inf and signed zeros; ``reassoc``/``nsz``/``nnan``/``ninf``/
    ``arcp``/``afn`` (or ``fast``) would not."""
    assert numba_cpu.FASTMATH == ("contract",)
    kernel = sv.expression_kernel(fg.float64, 4)
    source, _ = numba_cpu.emit_module([kernel], "flags")
    decorators = [line for line in source.splitlines() if line.startswith("@numba.njit")]
    assert len(decorators) == 2  # the serial kernel and its prange variant
    assert all("fastmath={'contract'}" in line for line in decorators)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", COMPILED_MODES)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cancelling_gradients_keep_nan_and_signed_zeros(dtype: Any, mode: str) -> None:
    """``sqrt(abs(x - x))`` at +-inf: the gradient of ``x - x`` is ``g + (-g)`` times NaN, which
    eager leaves NaN (reassociation folded it to 0); the gradient of ``x - x`` alone is
    ``g + (-g) = +0`` (``nsz`` made it -0)."""
    x = sv.values(dtype)
    _assert_grads_match_eager(lambda a: (a - a).abs().sqrt(), [x], mode)
    _assert_grads_match_eager(lambda a: a - a + 1.0, [x], mode)
    _assert_grads_match_eager(lambda a: a * 2.0 - a - a, [x], mode)


# ---- every expression of the lowering table at special values -------------------------------


def _expression_results(
    dtype: Any, run: Callable[[Any, dict], dict], casts_to_int: bool = False, **kernel_args: Any
) -> list[str]:
    """Mismatches, in words, of every value of ``special_values.expression_kernel`` computed by
    ``run(kernel, {input: array})`` against the eager kernels."""
    if casts_to_int:
        x = sv.finite_in_range(dtype)
        y, c = x.copy(), np.ones(len(x), dtype=bool)
    else:
        x, y, c = sv.grid(dtype)
    kernel = sv.expression_kernel(dtype, len(x), casts_to_int=casts_to_int, **kernel_args)
    arrays = dict(zip(kernel.inputs, (x, y, c)))
    results = run(kernel, arrays)
    problems = []
    for v in kernel.values:
        operands = tuple(arrays[i] for i in v.inputs)
        got, want = results[v], sv.eager(v, arrays)
        got = sv.outside_domain_as_numpy(v.op, got, want, operands)
        bad = sv.mismatches(got, want, sv.ulp_bound(v.op, dtype), operands)
        problems += [f"{sv.describe(v)} {b}" for b in bad]
    return problems


def _run_generated(variant: str) -> Callable[[Any, dict], dict]:
    def run(kernel: Any, arrays: dict) -> dict:
        source, (plan,) = numba_cpu.emit_module([kernel], f"special values, {variant}")
        module, _, _ = numba_cpu.load_module(source)
        name = plan.parallel_name if variant == "parallel" else plan.name
        assert name is not None and plan.flat
        n = kernel.shape[0]
        outputs = [np.empty(n, dtype=v.dtype.np) for v in plan.outputs]
        getattr(module, name)(n, *[arrays[v] for v in plan.inputs], *outputs)
        return dict(zip(plan.outputs, outputs))

    return run


def _run_interpreter(kernel: Any, arrays: dict) -> dict:
    assert eligible(kernel)
    n = kernel.shape[0]
    return InterpretedKernel(kernel)(arrays, n, {v: (n,) for v in kernel.outputs})


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("variant", ["serial", "parallel"])
def test_generated_expressions_match_numpy_at_special_values(dtype: Any, variant: str) -> None:
    problems = _expression_results(dtype, _run_generated(variant))
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems[:40])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_generated_casts_to_integers_match_numpy(dtype: Any) -> None:
    problems = _expression_results(dtype, _run_generated("serial"), casts_to_int=True)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_interpreter_ops_match_numpy_at_special_values(dtype: Any) -> None:
    problems = _expression_results(dtype, _run_interpreter, other_floats=False)
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems[:40])


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="numpy's power loop (like torch's pow) takes sqrt for a scalar exponent of 0.5: "
    "pow(-0, 0.5) = -0 and pow(-inf, 0.5) = nan, where C's pow (the compiled code, and numpy "
    "with an array exponent) gives +0 and +inf; left to a decision on eager's semantics",
)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_pow_with_a_scalar_exponent_of_one_half(dtype: Any) -> None:
    _assert_grads_match_eager(lambda a: a**1.5, [sv.values(dtype)], "generated", ulp=1)


# ---- the scalar helpers, called directly ---------------------------------------------------------

# helper -> (primitive whose eager kernel is the reference, arity, attrs)
HELPERS: dict[str, tuple[str, int, dict]] = {
    "_maximum": ("maximum", 2, {}),
    "_minimum": ("minimum", 2, {}),
    "_sign": ("sign", 1, {}),
    "_pow": ("pow", 2, {}),
    "_sigmoid": ("sigmoid", 1, {}),  # the records' scalar functions (cpu_helpers.RECORD_HELPERS)
    "_logaddexp": ("logaddexp", 2, {}),
    "_digamma": ("digamma", 1, {}),
    "_trigamma": ("trigamma", 1, {}),
    "_cast_float32": ("cast", 1, {"dtype": fg.float32}),
    "_cast_float64": ("cast", 1, {"dtype": fg.float64}),
    "_cast_bool": ("cast", 1, {"dtype": fg.bool}),
}


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "python"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(HELPERS))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_scalar_helpers_match_numpy(name: str, dtype: Any, compiled: bool) -> None:
    """Each ``cpu_helpers`` helper on numpy scalars of ``dtype``: numba-compiled, and its Python
    source run by Python (the CUDA simulator runs that), against the eager kernel."""
    if name == "_sigmoid" and dtype is fg.float32:
        pytest.skip("float32 sigmoid is fastmath.fast_sigmoid_f32 (tested with the expressions)")
    if name == "_pow" and not compiled:
        pytest.skip("the CUDA emitter has its own _pow (tests/cuda/test_nan_semantics_cuda.py)")
    primitive, arity, attrs = HELPERS[name]
    helper = getattr(cpu_helpers, name)
    fn = helper if compiled else helper.py_func
    x, y, _ = sv.grid(dtype)
    operands = (x, y)[:arity]
    got = np.array([fn(*args) for args in zip(*operands)])
    with np.errstate(all="ignore"):
        want = np.asarray(REGISTRY[primitive].kernel(*operands, **attrs))
    got = got.astype(want.dtype) if got.dtype != want.dtype and got.dtype.kind == "f" else got
    bad = sv.mismatches(got, want, sv.ulp_bound(primitive, dtype), operands)
    assert not bad, f"{name}: {len(bad)} mismatches: " + "; ".join(bad[:10])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_scalar_helpers_keep_the_operand_dtype(dtype: Any) -> None:
    """numba's return type of each helper is the operand's: no float64 detour in float32 loops
    (which would halve their vector width)."""
    x = dtype.np.type(-2.5)
    for name, arity in (("_maximum", 2), ("_minimum", 2), ("_pow", 2), ("_sign", 1)):
        helper = getattr(cpu_helpers, name)
        helper(*(x,) * arity)
        (signature,) = [
            s for s in helper.nopython_signatures if s.args == (numba.typeof(x),) * arity
        ]
        assert signature.return_type == numba.typeof(x), name


# ---- gradients at special values --------------------------------------------------------------

GRADIENTS: dict[str, tuple[Callable[..., fg.Tensor], int]] = {
    "abs": (lambda a: a.abs(), 1),
    "sign": (lambda a: a.sign(), 1),
    "sqrt": (lambda a: a.sqrt(), 1),
    "abs_chain": (lambda a: a.abs() * 3.0 + a, 1),
    "maximum": (lambda a, b: fg.maximum(a, b), 2),
    "minimum": (lambda a, b: fg.minimum(a, b), 2),
    "pow": (lambda a, b: a**b, 2),
    "pow_scalar": (lambda a: a**2.0, 1),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", COMPILED_MODES)
@pytest.mark.parametrize("name", sorted(GRADIENTS))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gradients_at_special_values_match_eager(name: str, mode: str, dtype: Any) -> None:
    f, arity = GRADIENTS[name]
    x, y, _ = sv.grid(dtype)
    arrays = [x, y][:arity] if arity == 2 else [sv.values(dtype)]
    # pow's gradient takes a log: libm or the float32 helper against numpy's
    ulp = sv.ulp_bound("log", dtype) + 1 if name.startswith("pow") else 0
    _assert_grads_match_eager(f, arrays, mode, ulp)


# ---- debug mode keeps eager's dtypes ------------------------------------------------------------

MIXED: dict[str, Callable[..., fg.Tensor]] = {
    # the case: minimum's gradient is float64, pow's must come back to float32
    "minimum_of_pow": lambda a, b: fg.minimum(a**2.0, b),
    "erf_both": lambda a, b: a.erf() * 0.5 + b.erf(),
    "pow_sub": lambda a, b: (a - 1.0) ** 3.0 + b * a,
    "sigmoid_where": lambda a, b: fg.where(a > 0, a.sigmoid(), a * 0.25) + (b * 2.0).tanh(),
}


@pytest.mark.parametrize("mode", ["debug", "default"])
@pytest.mark.parametrize("name", sorted(MIXED))
def test_mixed_dtype_gradients_keep_eager_dtypes(name: str, mode: str) -> None:
    rng = np.random.default_rng(7)
    a = rng.standard_normal(33).astype(np.float32)
    b = rng.standard_normal(33)
    want = _grads(MIXED[name], [a, b], "eager")
    got = _grads(MIXED[name], [a, b], "debug" if mode == "debug" else "generated")
    assert [g.dtype for g in got] == [np.float32, np.float64] == [w.dtype for w in want]
    for g, w in zip(got, want):
        if mode == "debug":  # eager kernels value by value: eager's result, bit for bit
            assert g.tobytes() == w.tobytes()
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5)


def test_scalars_intern_by_dtype_and_sign_of_zero() -> None:
    """The IR interns equal values once; a scalar's identity is its dtype and bits: 1.0 in
    float32 is not the float64 one (a float32 op reading it computed in float64: the debug-mode
    float64 ``.grad`` of the issue), and -0.0 is not 0.0 (which compare equal)."""
    g = Graph()
    one32, one64 = g.scalar(1.0, fg.float32), g.scalar(1.0, fg.float64)
    assert one32 is not one64 and (one32.dtype, one64.dtype) == (fg.float32, fg.float64)
    zero, negative_zero = g.scalar(0.0, fg.float32), g.scalar(-0.0, fg.float32)
    assert zero is not negative_zero and math.copysign(1.0, negative_zero.attr("value")) < 0
    assert g.scalar(1.0, fg.float32) is one32 and g.scalar(-0.0, fg.float32) is negative_zero


def test_captured_scalars_have_the_dtype_of_their_operation() -> None:
    """In the capture of the issue's graph every scalar operand of a floating operation has that
    operation's dtype (as eager's Python scalars take their tensor's)."""
    a = fg.tensor(np.array([1.5, -2.0], np.float32), requires_grad=True)
    b = fg.tensor(np.array([2.0, 5.0]), requires_grad=True)
    with compiler.compiled_autograd(mode="debug"):
        fg.minimum(a**2.0, b).sum().backward()
    (program,) = compiler.cached_programs()
    mixed = [
        f"%{v.id} = {v.op} ({v.dtype.name}) reads scalar %{i.id} ({i.dtype.name})"
        for v in program.graph.values
        if v.dtype.is_floating_point and v.op not in ("cast", "where")
        for i in v.inputs
        if i.op == "scalar" and i.dtype is not v.dtype
    ]
    assert not mixed, mixed


# ---- fused sums ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", COMPILED_MODES)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_fused_sums_keep_nan_and_inf(dtype: Any, mode: str) -> None:
    """A broadcast leaf's gradient is a fused sum of ``g * x``: inf, -inf and NaN terms give
    what numpy's sum gives (one sign of inf, both signs, NaN among finite values; a row of -0s
    gives +0), in the block part of generated code's sums and in their tail (``numba_cpu``:
    300 = 2 blocks of 128 + 44).  Full sums (a leaf of shape (1,)); for generated code and
    debug mode also row sums (a (5, 1) leaf) and column sums (a (1, 300) leaf)."""
    x = np.ones((5, 300), dtype=dtype.np)
    x[0, 5] = np.inf
    x[1, 3], x[1, 290] = np.inf, -np.inf
    x[2, 17] = np.nan
    x[3, 299] = -np.inf
    x[4] = -0.0  # numpy's sum of -0s is +0 (it starts from +0)
    full = lambda x_, b_: x_ * b_  # noqa: E731
    for row in x:
        _assert_grads_match_eager(full, [row.copy(), np.ones(1, dtype=dtype.np)], mode)
    if mode != "interpreter":  # (the interpreter runs flat kernels only)
        b = np.ones((1, 300), dtype=dtype.np)
        w = np.ones((5, 1), dtype=dtype.np)
        _assert_grads_match_eager(lambda x_, b_, w_: x_ * b_ * w_, [x, b, w], mode)
