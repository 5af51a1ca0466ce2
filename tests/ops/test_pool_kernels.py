"""The pooling primitives' loop kernels (``ops/pool_kernels.py``: ``avg_pool``,
``avg_pool_backward``, ``pool_index``, ``pool_take``, ``pool_scatter``) through
``F.max_pool1d/2d/3d`` (indices, ceil_mode, dilation, padding), ``F.avg_pool1d/2d/3d``
(count_include_pad, divisor_override, ceil_mode) and ``F.adaptive_{max,avg}_pool1d/2d/3d``:
values, indices and gradients against PyTorch (skipped without it) and against the composites
(what a forward-AD level runs), with hypothesis over the shapes; NaN and -inf windows as
PyTorch's CPU kernels give them; gradcheck and gradgradcheck in float64."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from primitive_names import PrimitiveNames as _Recorder

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.autograd import forward_ad as fwAD
from fusegrad.autograd import tracer
from fusegrad.autograd.gradcheck import gradcheck, gradgradcheck

try:
    import torch as _torch
except ImportError:  # pragma: no cover - torch is optional
    _torch = None

needs_torch = pytest.mark.skipif(_torch is None, reason="PyTorch not installed")

_SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
_TOL = {"float64": (1e-10, 1e-12), "float32": (1e-5, 1e-6)}


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, tuple) else out


def _run(fn: Any, x: np.ndarray, dtype: str, composite: bool = False) -> tuple:
    """Values, indices (or None) and the input's gradient of ``sum(out * weights)``."""
    leaf = fg.tensor(x.astype(dtype), requires_grad=True)
    rec = _Recorder()
    if composite:
        with fwAD.dual_level():
            out = fn(leaf)
    else:
        with tracer.tracing(rec):
            out = fn(leaf)
        assert rec.names & {"pool_index", "avg_pool"}, rec.names  # a kernel ran
    values = _first(out)
    indices = out[1].numpy() if isinstance(out, tuple) else None
    weights = np.random.default_rng(9).standard_normal(values.shape).astype(dtype)
    (values * fg.tensor(weights)).sum().backward()
    return values.detach().numpy(), indices, leaf.grad.numpy()


def _run_torch(fn: Any, x: np.ndarray, dtype: str) -> tuple:
    leaf = _torch.tensor(x.astype(dtype), requires_grad=True)
    out = fn(leaf)
    values = _first(out)
    indices = out[1].numpy() if isinstance(out, tuple) else None
    weights = np.random.default_rng(9).standard_normal(tuple(values.shape)).astype(dtype)
    (values * _torch.tensor(weights)).sum().backward()
    return values.detach().numpy(), indices, leaf.grad.numpy()


def _close(got: tuple, want: tuple, dtype: str) -> None:
    rtol, atol = _TOL[dtype]
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol)
    if want[1] is not None:
        np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[2], want[2], rtol=rtol, atol=atol)


# (function name, input shape, positional arguments, keyword arguments)
_CASES = [
    ("max_pool1d", (2, 3, 9), (3,), {"stride": 2, "padding": 1, "return_indices": True}),
    ("max_pool1d", (3, 8), (2,), {"dilation": 3, "ceil_mode": True}),
    ("max_pool2d", (2, 2, 7, 6), (3,), {"stride": 2, "padding": 1, "return_indices": True}),
    ("max_pool2d", (1, 2, 7, 7), ((2, 3),), {"stride": 2, "dilation": 2, "ceil_mode": True}),
    ("max_pool2d", (3, 6, 6), (2,), {"return_indices": True}),  # unbatched
    ("max_pool2d", (2, 1, 5, 5), (3,), {"stride": 1}),  # overlapping windows
    ("max_pool3d", (1, 2, 5, 6, 5), (2,), {"stride": (1, 2, 2), "return_indices": True}),
    ("max_pool3d", (2, 1, 5, 5, 5), (3,), {"stride": 2, "padding": 1, "ceil_mode": True}),
    ("avg_pool1d", (2, 3, 9), (3,), {"stride": 2, "padding": 1, "count_include_pad": False}),
    ("avg_pool1d", (2, 8), (3,), {"stride": 2, "ceil_mode": True}),
    ("avg_pool2d", (2, 2, 7, 6), (3,), {"stride": 2, "padding": 1}),
    ("avg_pool2d", (1, 2, 7, 7), ((2, 3),), {"ceil_mode": True, "count_include_pad": False}),
    ("avg_pool2d", (1, 2, 6, 6), (3,), {"stride": 2, "padding": 1, "divisor_override": 5}),
    ("avg_pool2d", (2, 5, 5), (2,), {"stride": 1}),  # unbatched, overlapping
    ("avg_pool3d", (1, 2, 5, 6, 5), (2,), {"stride": (1, 2, 2), "padding": 1}),
    ("avg_pool3d", (1, 1, 5, 5, 5), (3,), {"stride": 2, "ceil_mode": True, "padding": 1}),
    ("adaptive_max_pool1d", (2, 3, 10), (4,), {"return_indices": True}),
    ("adaptive_max_pool2d", (2, 2, 7, 9), ((3, 4),), {"return_indices": True}),
    ("adaptive_max_pool2d", (2, 7, 9), ((None, 5),), {}),  # unbatched, None keeps a size
    ("adaptive_max_pool3d", (1, 2, 5, 7, 6), ((2, 3, 4),), {"return_indices": True}),
    ("adaptive_max_pool3d", (1, 2, 4, 4, 4), (6,), {}),  # more outputs than inputs
    ("adaptive_avg_pool1d", (2, 3, 10), (4,), {}),
    ("adaptive_avg_pool2d", (2, 2, 7, 9), ((3, 4),), {}),
    ("adaptive_avg_pool2d", (3, 7, 9), (1,), {}),  # unbatched, global
    ("adaptive_avg_pool3d", (1, 2, 5, 7, 6), ((2, 3, 4),), {}),
]


def _fn(lib: Any, case: tuple) -> Any:
    name, _, args, kwargs = case
    fn = getattr(lib.nn.functional, name)
    return lambda x: fn(x, *args, **kwargs)


def _ids(case: tuple) -> str:
    return f"{case[0]}{case[1]}{case[3]}"


@needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", _CASES, ids=_ids)
def test_matches_torch(case: tuple, dtype: str) -> None:
    x = np.random.default_rng(0).standard_normal(case[1])
    _close(_run(_fn(fg, case), x, dtype), _run_torch(_fn(_torch, case), x, dtype), dtype)


@pytest.mark.parametrize("case", _CASES, ids=_ids)
def test_matches_the_composite(case: tuple) -> None:
    x = np.random.default_rng(1).standard_normal(case[1])
    fn = _fn(fg, case)
    _close(_run(fn, x, "float64"), _run(fn, x, "float64", composite=True), "float64")


@pytest.mark.parametrize("case", _CASES[::2], ids=_ids)
def test_gradcheck_and_gradgradcheck(case: tuple) -> None:
    """First and second order through the kernels: ``pool_take`` and ``pool_scatter`` are
    each other's transposes, as ``avg_pool`` and ``avg_pool_backward`` are."""
    # distinct values, far apart: no max is within the finite-difference step of another
    x = np.random.default_rng(2).permutation(int(np.prod(case[1]))).reshape(case[1]) * 0.1
    leaf = fg.tensor(x, requires_grad=True)
    fn = _fn(fg, case)

    def values(t: fg.Tensor) -> fg.Tensor:
        return _first(fn(t))

    assert gradcheck(values, [leaf])
    assert gradgradcheck(values, [leaf])


@needs_torch
@pytest.mark.parametrize("name", ["max_pool2d", "adaptive_max_pool2d"])
def test_nan_and_minus_infinity_windows_as_torch(name: str) -> None:
    """A window holding NaN gives NaN at the last NaN (PyTorch's CPU order); a window of -inf
    gives -inf at its first position; the gradient goes there."""
    x = np.random.default_rng(3).standard_normal((1, 2, 6, 6))
    x[0, 0, 0, 1] = x[0, 0, 1, 0] = np.nan
    x[0, 1, 2:4, 2:4] = -np.inf
    args = (2,) if name == "max_pool2d" else ((3, 3),)
    fgv, fgi = getattr(F, name)(fg.tensor(x), *args, return_indices=True)
    tv, ti = getattr(_torch.nn.functional, name)(_torch.tensor(x), *args, return_indices=True)
    np.testing.assert_array_equal(fgv.numpy(), tv.numpy())
    np.testing.assert_array_equal(fgi.numpy(), ti.numpy())
    leaf = fg.tensor(x, requires_grad=True)
    getattr(F, name)(leaf, *args).sum().backward()
    tleaf = _torch.tensor(x, requires_grad=True)
    getattr(_torch.nn.functional, name)(tleaf, *args).sum().backward()
    np.testing.assert_array_equal(leaf.grad.numpy(), tleaf.grad.numpy())


def test_the_backward_kernels_run() -> None:
    """An ordinary backward of max and average pooling runs their backward kernels (max
    pooling's without searching the windows again), no scatter, gather or slice."""
    rng = np.random.default_rng(4)
    for fn, kernel in (
        (lambda t: F.max_pool2d(t, 3, 2, 1), "pool_scatter"),
        (lambda t: F.avg_pool2d(t, 3, 2, 1), "avg_pool_backward"),
        (lambda t: F.adaptive_avg_pool2d(t, (3, 2)), "avg_pool_backward"),
        (lambda t: F.adaptive_max_pool2d(t, (3, 2)), "pool_scatter"),
    ):
        x = fg.tensor(rng.standard_normal((2, 3, 7, 7)), requires_grad=True)
        out = fn(x)
        rec = _Recorder()
        with tracer.tracing(rec):
            out.sum().backward()
        assert kernel in rec.names, rec.names
        assert not rec.names & {"scatter_add", "gather", "getitem", "index_add_at", "pool_index"}


# ---- hypothesis over shapes, kernels, strides, padding, dilation and modes -------------------


@st.composite
def _pool_case(draw: Any) -> tuple:
    n = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["max", "avg", "adaptive_max", "adaptive_avg"]))
    sizes = tuple(draw(st.integers(1, 7)) for _ in range(n))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3))) + sizes
    if kind.startswith("adaptive"):
        outs = tuple(draw(st.integers(1, 5)) for _ in range(n))
        kwargs = {"return_indices": True} if kind == "adaptive_max" else {}
        return (f"{kind}_pool{n}d", shape, (outs if n > 1 else outs[0],), kwargs)
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(n))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(n))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(n)) if kind == "max" else (1,) * n
    spans = [dilation[i] * (kernel[i] - 1) + 1 for i in range(n)]
    padding = tuple(
        draw(st.integers(0, (spans[i] if kind == "max" else kernel[i]) // 2)) for i in range(n)
    )
    # at least one window: the padded size covers one effective kernel
    sizes = tuple(max(sizes[i], spans[i] - 2 * padding[i]) for i in range(n))
    shape = shape[:2] + sizes
    kwargs: dict = {"stride": stride, "padding": padding, "ceil_mode": draw(st.booleans())}
    if kind == "max":
        kwargs.update(dilation=dilation, return_indices=True)
    else:
        kwargs["count_include_pad"] = draw(st.booleans())
        if n > 1 and draw(st.booleans()):
            kwargs["divisor_override"] = draw(st.integers(1, 5))
    if n == 1:  # (the 1-d functions take ints)
        kwargs = {k: (v[0] if isinstance(v, tuple) else v) for k, v in kwargs.items()}
        kernel = kernel[0]  # type: ignore[assignment]
    return (f"{kind}_pool{n}d", shape, (kernel,), kwargs)


@needs_torch
@_SETTINGS
@given(case=_pool_case())
def test_hypothesis_matches_torch(case: tuple) -> None:
    x = np.random.default_rng(5).standard_normal(case[1])
    _close(
        _run(_fn(fg, case), x, "float64"), _run_torch(_fn(_torch, case), x, "float64"), "float64"
    )


@_SETTINGS
@given(case=_pool_case())
def test_hypothesis_matches_the_composite(case: tuple) -> None:
    x = np.random.default_rng(6).standard_normal(case[1])
    fn = _fn(fg, case)
    _close(_run(fn, x, "float64"), _run(fn, x, "float64", composite=True), "float64")


# ---- errors: the same words on the kernel path as on the composite ----------------------------

_BAD = [
    (lambda x: F.max_pool2d(x, 3, padding=2), (1, 1, 5, 5), "pad should be at most half"),
    (lambda x: F.max_pool2d(x, 4), (1, 1, 3, 3), "too small"),
    (lambda x: F.max_pool2d(x, 0), (1, 1, 3, 3), "greater than zero"),
    (lambda x: F.avg_pool2d(x, 2, divisor_override=0), (1, 1, 4, 4), "divisor must be not zero"),
    (lambda x: F.avg_pool3d(x, 2), (1, 4, 4), "Expected 4D (unbatched) or 5D"),
    (lambda x: F.max_pool2d(x, (2, 2, 2)), (1, 1, 4, 4), "tuple of two ints"),
]


@pytest.mark.parametrize("fn, shape, words", _BAD)
@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_errors_name_the_problem(fn: Any, shape: tuple, words: str, dtype: str) -> None:
    x = fg.ones(*shape, dtype=getattr(fg, dtype), requires_grad=True)
    with pytest.raises(RuntimeError) as info:
        fn(x)
    assert words in str(info.value)
    assert x.grad is None
