"""Regression tests for the bug classes that differential fuzzing (``benchmarks/fuzzgen.py``,
``tests/compiler/test_fuzz.py``) found in the compiled backward.

Each test is the minimal repro of one class, shrunk by hand from failing fuzz programs (their
seeds are named), and states the eager behaviour the compiled path must reproduce.  They failed
on the compiler as the fuzzer found it; the last two classes (debug-mode dtype, program cache
key) were fixed meanwhile by the size-generic programs commit and stay as regression tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler

pytestmark = pytest.mark.usefixtures("fresh_compiler")

INF = float("inf")
NAN = float("nan")


@contextlib.contextmanager
def _interpreter(max_elements: int | None) -> Iterator[None]:
    """``config.interpreter_max_elements`` for the block (None: unchanged)."""
    previous = compiler.config.interpreter_max_elements
    if max_elements is not None:
        compiler.config.interpreter_max_elements = max_elements
    try:
        yield
    finally:
        compiler.config.interpreter_max_elements = previous


def _leaf_grads(
    program: Callable[[], Sequence[fg.Tensor]],
    mode: str | None,
    interpreter: int | None = None,
) -> list[np.ndarray]:
    """Run ``program`` (it builds its leaves, runs forward and backward, returns the leaves)
    eagerly (``mode`` None) or compiled, and return the leaves' ``.grad`` arrays."""
    if mode is None:
        leaves = program()
    else:
        with _interpreter(interpreter), compiler.compiled_autograd(mode=mode):
            leaves = program()
    return [leaf.grad.numpy().copy() for leaf in leaves]


# ---- saved tensors of nodes the backward does not run --------------------------------------------
# seeds 35, 121, 196, 245, 277: ``backward(inputs=...)`` and ``autograd.grad`` run only the nodes
# on a path to the inputs, so eager never unpacks (version-checks) the saved tensors of the others;
# compiled mode checks every node of the graph and raises "modified by an inplace operation".


def _modified_side_branch() -> tuple[fg.Tensor, fg.Tensor, fg.Tensor]:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2.0
    w = x.exp()  # saves its output ...
    w.add_(1.0)  # ... which is modified: ExpBackward0 can no longer run
    return x, y, y.sum() + w.sum()


@pytest.mark.parametrize("mode", ["default", "debug"])
def test_grad_wrt_non_leaf_ignores_saved_tensors_off_its_path(mode: str) -> None:
    _, y, loss = _modified_side_branch()
    (expected,) = fg.autograd.grad(loss, [y], retain_graph=True)  # eager: fine
    with compiler.compiled_autograd(mode=mode):
        (got,) = fg.autograd.grad(loss, [y])
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


@pytest.mark.parametrize("mode", ["default", "debug"])
def test_backward_inputs_ignores_saved_tensors_off_its_path(mode: str) -> None:
    _, y, loss = _modified_side_branch()
    with compiler.compiled_autograd(mode=mode):
        loss.backward(inputs=[y])
    np.testing.assert_array_equal(y.grad.numpy(), [1.0, 1.0])


# ---- sign(+-inf) is NaN in compiled code ---------------------------------------------------------
# seeds 193, 195: ``cpu_helpers._sign`` computes ``a - a + 1``, NaN at +-inf, so the gradient
# of abs (and of l1_loss, whose rule uses sign) is NaN at +-inf instead of +-1.  The
# interpreter uses it in both dtypes, generated code in float32.


@pytest.mark.parametrize(
    "dtype,interpreter",
    [(fg.float32, None), (fg.float64, None), (fg.float32, 0)],
    ids=["float32-interpreter", "float64-interpreter", "float32-generated"],
)
def test_abs_gradient_at_infinity(dtype: fg.dtype, interpreter: int | None) -> None:
    def program() -> list[fg.Tensor]:
        x = fg.tensor([INF, -INF, 2.0], dtype=dtype, requires_grad=True)
        x.abs().sum().backward()
        return [x]

    (got,) = _leaf_grads(program, "default", interpreter)
    np.testing.assert_array_equal(got, [1.0, -1.0, 1.0])


def test_l1_loss_gradient_with_an_infinite_target() -> None:
    def program() -> list[fg.Tensor]:
        x = fg.tensor([0.0, 1.0], dtype=fg.float64, requires_grad=True)
        target = fg.tensor([-INF, 0.5], dtype=fg.float64)
        fg.nn.functional.l1_loss(x, target, reduction="sum").backward()
        return [x]

    (expected,) = _leaf_grads(program, None)
    (got,) = _leaf_grads(program, "default")
    np.testing.assert_array_equal(expected, [1.0, 1.0])
    np.testing.assert_array_equal(got, expected)


# ---- fast-math reassociation in generated code ---------------------------------------------------
# generated kernels are compiled with LLVM's ``reassoc`` and ``nsz`` flags (docs/ARCHITECTURE.md,
# contract 8
# rules both out).  Together they fold the fan-in sum g + (-g) to -0 where eager's is NaN
# (inf - inf) or +0 (``x - x`` under a root gradient holding inf); ``reassoc`` alone reorders
# div's rule -g*a/(b*b) so that it overflows to inf/inf = NaN where eager's is 0 (seed 295).


def _x_minus_x(root: list[float]) -> Callable[[], list[fg.Tensor]]:
    def program() -> list[fg.Tensor]:
        x = fg.tensor([1.0, 2.0], dtype=fg.float64, requires_grad=True)
        (x - x).backward(gradient=fg.tensor(root, dtype=fg.float64))
        return [x]

    return program


def test_fan_in_of_opposite_infinite_gradients_is_nan_in_generated_code() -> None:
    with np.errstate(invalid="ignore"):
        (expected,) = _leaf_grads(_x_minus_x([INF, 1.0]), None)
    (got,) = _leaf_grads(_x_minus_x([INF, 1.0]), "default", interpreter=0)
    np.testing.assert_array_equal(np.isnan(expected), [True, False])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))


def test_fan_in_of_opposite_gradients_is_positive_zero_in_generated_code() -> None:
    (expected,) = _leaf_grads(_x_minus_x([1.0, 2.0]), None)
    (got,) = _leaf_grads(_x_minus_x([1.0, 2.0]), "default", interpreter=0)
    assert not np.signbit(expected).any()  # g + (-g) is +0 in round-to-nearest
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))


def test_reassociation_does_not_overflow_where_eager_does_not() -> None:
    def program() -> list[fg.Tensor]:
        x = fg.tensor([1e30, 1.0], dtype=fg.float32, requires_grad=True)
        fg.div(x, x * x + 0.25).sum().backward()
        return [x]

    with np.errstate(over="ignore"):
        (expected,) = _leaf_grads(program, None)
        (got,) = _leaf_grads(program, "default", interpreter=0)
    assert expected[0] == 0.0
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-5)


# ---- debug mode: a float32 leaf's .grad comes back float64 ---------------------------------------
# seeds 412, 1271: the reference executor (mode="debug") evaluated minimum's rule in float64 when
# a float32 input was promoted against a float64 one, and stored that gradient without casting
# it back (fixed since).


def test_debug_mode_keeps_the_leaf_dtype_of_a_promoted_input() -> None:
    def program() -> list[fg.Tensor]:
        a = fg.tensor([1.0, 2.0], dtype=fg.float32, requires_grad=True)
        b = fg.tensor([3.0, 1.0], dtype=fg.float64, requires_grad=True)
        fg.minimum(a**2.0, b).sum().backward()
        return [a, b]

    with compiler.compiled_autograd(mode="debug"):
        a, b = program()
    assert a.grad.dtype == fg.float32
    assert b.grad.dtype == fg.float64
    np.testing.assert_array_equal(a.grad.numpy(), [2.0, 0.0])


# ---- a float64 rule computed in float32 next to a float32 one ------------------------------------
# seeds 802, 1119, 1189: capture interns constants (``scalar(1.0)``, the zeros of a scatter)
# with the dtype of their first use, and a float64 rule that reuses a float32 one computes in
# float32, then casts back: the float64 gradient carries float32 rounding (relative error
# ~5e-10 to 3e-8).  For ``x64.tanh().sum() + x32.tanh()`` tanh's ``1 - y*y`` for x64 is
# ``sub(scalar(1.0): float32[], mul: float64[s0]) -> float32[s0]``; for ``x64.min(dim=0)``
# beside an in-place op through a view of a float32 value, min's scatter_add starts from the
# float32 zeros of IndexPutBackward0 (in debug mode too).  Eager computes in float64.


def test_float64_gradient_keeps_float64_precision_beside_a_float32_rule() -> None:
    def program() -> list[fg.Tensor]:
        x64 = fg.tensor([0.9064, 1.4501, -0.6329], dtype=fg.float64, requires_grad=True)
        x32 = fg.tensor(0.195, dtype=fg.float32, requires_grad=True)
        (x64.tanh().sum() + x32.tanh()).backward()
        return [x64]

    (expected,) = _leaf_grads(program, None)
    (got,) = _leaf_grads(program, "default")
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("mode", ["default", "debug"])
def test_float64_scatter_keeps_float64_precision_beside_float32_zeros(mode: str) -> None:
    def program() -> list[fg.Tensor]:
        x64 = fg.tensor([0.0125], dtype=fg.float64, requires_grad=True)
        x32 = fg.tensor([-0.0109], dtype=fg.float32, requires_grad=True)
        w32 = fg.tensor([-1.2248], dtype=fg.float32, requires_grad=True)
        m = x64.min(dim=0).values  # created first, so its rule runs after the float32 one
        y = x32 + 0.0
        y.reshape(-1).mul_(w32)  # in place through a view: IndexPutBackward0 (float32 zeros)
        (m * 1.949 + y.sum()).backward()
        return [x64]

    (expected,) = _leaf_grads(program, None)
    (got,) = _leaf_grads(program, mode)
    np.testing.assert_array_equal(expected, [1.949])
    np.testing.assert_allclose(got, expected, rtol=1e-12)


# ---- the program cache ignores the compile mode and the interpreter setting ----------------------
# found when the fuzzer's debug runs never captured: a backward whose structure was compiled in
# default mode reused that program in mode="debug" (and vice versa), and changing
# ``config.interpreter_max_elements`` reused programs built under the old setting;
# docs/ARCHITECTURE.md,
# contract 5 puts the compile mode and config in the key (fixed since: the captured graph may
# be shared, the program may not).


def _square_sum() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()


def test_debug_mode_does_not_reuse_a_default_mode_program() -> None:
    with compiler.compiled_autograd(mode="default"):
        _square_sum()
    with compiler.compiled_autograd(mode="debug"):
        _square_sum()
    assert compiler.counters.builds == 2
    assert compiler.counters.cache_hits == 0


def test_interpreter_setting_does_not_reuse_programs_built_under_another() -> None:
    with compiler.compiled_autograd():
        _square_sum()
    with _interpreter(0), compiler.compiled_autograd():
        _square_sum()
    assert compiler.counters.builds == 2
    assert compiler.counters.cache_hits == 0


# ---- a leaf's gradient that is also an input of later steps --------------------------------------
# seed 2011 of the 10,000-program campaign: a kernel output that is one leaf's gradient was
# accumulated straight into that leaf's existing ``.grad`` (the epilogue) although an extern
# later read the value, so the extern read ``.grad + g`` instead of ``g``.  Here linear's bias
# gradient feeds the matmul that gives the input's gradient; eager leaves ``x.grad`` alone.


@pytest.mark.parametrize("interpreter", [0, None])
def test_gradient_accumulated_into_grad_is_not_read_back_by_later_steps(
    interpreter: int | None,
) -> None:
    def program() -> list[fg.Tensor]:
        x = fg.tensor([0.5, -0.25], requires_grad=True)
        w = fg.tensor([[0.75], [-1.5], [0.25]])
        b = fg.tensor([0.1, 0.2, 0.3], requires_grad=True)
        b.grad = fg.tensor([10.0, 20.0, 30.0])  # a .grad to accumulate into
        out = fg.nn.functional.linear(x[1:], w, b)
        (out * fg.tensor([1.0, 2.0, 3.0])).sum().backward()
        return [x, b]

    expected = _leaf_grads(program, None)
    np.testing.assert_allclose(expected[0], [0.0, 0.75 - 3.0 + 0.75])
    np.testing.assert_allclose(expected[1], [11.0, 22.0, 33.0])
    got = _leaf_grads(program, "default", interpreter)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


# ---- infinities in a layer norm's weight ---------------------------------------------------------
# seed 20485: eager's fused layer-norm backward computes dx = g w rstd + x beta + gamma (per-row
# beta and gamma, as PyTorch's CPU kernel); the backward a compiled program captures was the
# composite rstd (g w - mean(g w) - xhat mean(g w xhat)), equal in exact arithmetic but not where
# the weight holds -inf: eager (and PyTorch) give NaN everywhere, the composite +inf at two places.


@pytest.mark.parametrize("mode", ["default", "debug"])
@pytest.mark.parametrize("dtype", [fg.float32, fg.float64])
def test_layer_norm_backward_with_an_infinite_weight_has_eagers_nan_and_inf(
    mode: str, dtype: fg.dtype
) -> None:
    def program() -> list[fg.Tensor]:
        x = fg.tensor([0.1416, 1.6086, 1.6852, -2.8691, 0.6566], dtype=dtype, requires_grad=True)
        w = fg.tensor([-0.2604, -0.146, 1e-30, -INF, 0.0762], dtype=dtype, requires_grad=True)
        b = fg.tensor([-1.253, -0.5951, -1.4786, -0.4013, NAN], dtype=dtype, requires_grad=True)
        y = fg.nn.functional.layer_norm(x.square().log1p(), (5,), w, b)
        (y * fg.tensor([0.3, -1.2, 0.5, 0.7, -0.4], dtype=dtype)).sum().backward()
        return [x, w, b]

    expected = _leaf_grads(program, None)
    assert np.isnan(expected[0]).all()  # (PyTorch's too)
    got = _leaf_grads(program, mode)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(e))
        np.testing.assert_array_equal(np.isinf(g), np.isinf(e))
        finite = np.isfinite(e)
        np.testing.assert_allclose(g[finite], e[finite], rtol=1e-5)


@pytest.mark.parametrize("dtype", [fg.float32, fg.float64])
def test_layer_norm_backward_with_an_infinite_weight_in_a_whole_step(dtype: fg.dtype) -> None:
    """The same in a compiled whole step, whose recording runs layer norm as the traced
    ``NativeLayerNormBackward0`` Function (``autograd/native.py``): its backward is written in
    the kernels' form too (fuzz seed 20485's whole-step and compile(module) findings)."""
    leaves = [
        fg.tensor([0.1416, 1.6086, 1.6852, -2.8691, 0.6566], dtype=dtype, requires_grad=True),
        fg.tensor([-0.2604, -0.146, 1e-30, -INF, 0.0762], dtype=dtype, requires_grad=True),
        fg.tensor([-1.253, -0.5951, -1.4786, -0.4013, NAN], dtype=dtype, requires_grad=True),
    ]
    cot = fg.tensor([0.3, -1.2, 0.5, 0.7, -0.4], dtype=dtype)

    def step(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
        y = fg.nn.functional.layer_norm(x.square().log1p(), (5,), w, b)
        loss = (y * cot).sum()
        loss.backward()
        return loss

    def clear() -> None:
        for t in leaves:
            t.grad = None

    step(*leaves)
    expected = [t.grad.numpy().copy() for t in leaves]
    compiled = fg.compile(step)
    for _ in range(3):  # (recorded, then replayed)
        clear()
        compiled(*leaves)
    assert compiler.counters.step_runs >= 1
    for t, e in zip(leaves, expected):
        g = t.grad.numpy()
        np.testing.assert_array_equal(np.isnan(g), np.isnan(e))
        np.testing.assert_array_equal(np.isinf(g), np.isinf(e))
        np.testing.assert_allclose(g[np.isfinite(e)], e[np.isfinite(e)], rtol=1e-5)
