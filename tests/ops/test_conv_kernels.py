"""The convolution primitive's kernels (``ops/conv_kernels.py``: im2col + BLAS, col2im) through
``F.conv1d/2d/3d`` and ``F.conv_transpose1d/2d/3d``: values and gradients against PyTorch
(skipped without it) and against the composites (what a forward-AD level runs: strided-slice
windows and matmuls), over every option (stride, padding ints / 'same' / 'valid', dilation,
groups, output_padding, padding modes, unbatched inputs, float32 and float64), with hypothesis
over the shapes; gradcheck and gradgradcheck (the rule's create_graph composite) in float64;
errors as the composites raise them."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from primitive_names import PrimitiveNames as _Recorder

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import nn
from fusegrad.autograd import forward_ad as fwAD
from fusegrad.autograd import tracer
from fusegrad.autograd.gradcheck import gradcheck, gradgradcheck
from fusegrad.ops import conv_kernels

try:
    import torch as _torch
except ImportError:  # pragma: no cover - torch is optional
    _torch = None

needs_torch = pytest.mark.skipif(_torch is None, reason="PyTorch not installed")

_SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
_TOL = {"float64": (1e-9, 1e-11), "float32": (2e-4, 2e-5)}


def _run(fn: Any, arrays: list, dtype: str, composite: bool = False) -> tuple[np.ndarray, list]:
    """``fn(*tensors)``'s value and the gradients of ``sum(out * weights)`` for each input, in
    fusegrad; ``composite``: inside a forward-AD level, where the composites run."""
    leaves = [fg.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    rec = _Recorder()
    if composite:
        with fwAD.dual_level():
            out = fn(*leaves)
    else:
        with tracer.tracing(rec):
            out = fn(*leaves)
    if not composite:
        assert "convolution" in rec.names, rec.names  # the kernel ran, not the composite
    else:
        assert "convolution" not in rec.names
    weights = np.random.default_rng(9).standard_normal(out.shape).astype(dtype)
    (out * fg.tensor(weights)).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() for t in leaves]


def _run_torch(fn: Any, arrays: list, dtype: str, shape: tuple) -> tuple[np.ndarray, list]:
    leaves = [_torch.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    out = fn(*leaves)
    assert tuple(out.shape) == tuple(shape)
    weights = np.random.default_rng(9).standard_normal(out.shape).astype(dtype)
    (out * _torch.tensor(weights)).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() for t in leaves]


def _close(got: tuple, want: tuple, dtype: str) -> None:
    rtol, atol = _TOL[dtype]
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol)
    for a, b in zip(got[1], want[1]):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * 10)


# ---- cases: (n, transposed, input shape, weight shape, bias?, keyword arguments) -------------

_CASES = [
    (1, False, (2, 4, 9), (6, 2, 3), True, {"stride": 2, "padding": 1, "groups": 2}),
    (1, False, (3, 7), (2, 3, 2), False, {"dilation": 3}),  # unbatched
    (1, False, (2, 3, 8), (4, 3, 4), True, {"padding": "same", "dilation": 1}),  # uneven 'same'
    (2, False, (2, 3, 9, 8), (5, 3, 3, 2), True, {"stride": (2, 1), "padding": (1, 2)}),
    (2, False, (2, 4, 7, 7), (4, 1, 3, 3), True, {"groups": 4, "padding": "same"}),  # depthwise
    (2, False, (1, 6, 8, 9), (6, 3, 2, 3), True, {"dilation": (2, 1), "groups": 2}),
    (2, False, (2, 3, 5, 5), (4, 3, 1, 1), True, {}),  # pointwise: columns are a view
    (2, False, (3, 6, 6), (2, 3, 3, 3), False, {"padding": "valid"}),  # unbatched
    (3, False, (2, 2, 5, 6, 4), (4, 2, 2, 3, 2), True, {"stride": (1, 2, 1), "padding": 1}),
    (3, False, (1, 4, 5, 5, 5), (2, 2, 3, 3, 3), False, {"groups": 2, "dilation": 2}),
    (1, True, (2, 4, 5), (4, 3, 3), True, {"stride": 2, "padding": 1, "output_padding": 1}),
    (1, True, (4, 6), (4, 2, 2), False, {"groups": 2, "dilation": 2}),  # unbatched
    (2, True, (2, 6, 4, 5), (6, 2, 3, 3), True, {"stride": 2, "groups": 3, "output_padding": 1}),
    (2, True, (1, 3, 5, 4), (3, 4, 2, 3), True, {"stride": (1, 3), "padding": (1, 0)}),
    # output_padding not below stride but below dilation: rows no window of x reaches
    (2, True, (1, 2, 3, 3), (2, 3, 2, 2), True, {"dilation": 3, "output_padding": 2}),
    (3, True, (2, 2, 3, 4, 3), (2, 3, 2, 2, 3), True, {"stride": 2, "padding": (0, 1, 1)}),
]


def _fns(n: int, transposed: bool, kwargs: dict) -> tuple[Any, Any]:
    name = f"conv_transpose{n}d" if transposed else f"conv{n}d"
    fg_fn = getattr(F, name)
    torch_fn = getattr(_torch.nn.functional, name) if _torch is not None else None
    return (
        lambda x, w, b=None: fg_fn(x, w, b, **kwargs),
        (lambda x, w, b=None: torch_fn(x, w, b, **kwargs)) if torch_fn else None,
    )


def _arrays(case: tuple, seed: int = 0) -> list:
    n, transposed, xs, ws, bias, kwargs = case
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(xs), rng.standard_normal(ws)]
    if bias:
        groups = kwargs.get("groups", 1)
        arrays.append(rng.standard_normal(ws[1] * groups if transposed else ws[0]))
    return arrays


@needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", _CASES, ids=lambda c: f"{c[0]}d{'T' if c[1] else ''}{c[2]}")
def test_matches_torch(case: tuple, dtype: str) -> None:
    fg_fn, torch_fn = _fns(case[0], case[1], case[5])
    arrays = _arrays(case)
    got = _run(fg_fn, arrays, dtype)
    _close(got, _run_torch(torch_fn, arrays, dtype, got[0].shape), dtype)


@pytest.mark.parametrize("case", _CASES, ids=lambda c: f"{c[0]}d{'T' if c[1] else ''}{c[2]}")
def test_matches_the_composite(case: tuple) -> None:
    """The kernels against the composites (strided-slice windows, matmuls) in float64."""
    fg_fn, _ = _fns(case[0], case[1], case[5])
    arrays = _arrays(case, seed=1)
    _close(_run(fg_fn, arrays, "float64"), _run(fg_fn, arrays, "float64", True), "float64")


@pytest.mark.parametrize("case", _CASES[::2], ids=lambda c: f"{c[0]}d{'T' if c[1] else ''}")
def test_gradcheck_and_gradgradcheck(case: tuple) -> None:
    """First order through the backward kernels, second order through the rule's composite."""
    fg_fn, _ = _fns(case[0], case[1], case[5])
    leaves = [fg.tensor(a * 0.5, requires_grad=True) for a in _arrays(case, seed=2)]
    assert gradcheck(fg_fn, leaves)
    assert gradgradcheck(fg_fn, leaves)


def test_the_backward_kernels_run_and_save_no_columns() -> None:
    """An ordinary backward runs the two backward kernels (no composite primitive), and the
    node keeps only the input and the weight, no im2col columns."""
    rng = np.random.default_rng(3)
    x = fg.tensor(rng.standard_normal((2, 3, 6, 6)), requires_grad=True)
    w = fg.tensor(rng.standard_normal((4, 3, 3, 3)), requires_grad=True)
    out = F.conv2d(x, w, padding=1)
    rec = _Recorder()
    with tracer.tracing(rec):
        out.sum().backward()
    assert {"convolution_backward_input", "convolution_backward_weight"} <= rec.names
    assert not rec.names & {"getitem", "index_add_at", "stack", "matmul"}, rec.names
    out = F.conv2d(x, w, padding=1)
    saved = sorted(tuple(t.shape) for t in out.grad_fn.saved_values())
    assert saved == [(2, 3, 6, 6), (4, 3, 3, 3)], saved
    x.requires_grad_(False)
    out = F.conv2d(x, w, padding=1)  # the weight's gradient alone needs only the input
    assert [tuple(t.shape) for t in out.grad_fn.saved_values()] == [(2, 3, 6, 6)]


def test_only_what_a_gradient_needs_is_computed() -> None:
    """The weight alone requiring grad: no input gradient kernel; the input alone: no weight
    gradient kernel."""
    rng = np.random.default_rng(4)
    for want_x, kernel in (
        (True, "convolution_backward_input"),
        (False, "convolution_backward_weight"),
    ):
        x = fg.tensor(rng.standard_normal((1, 2, 5, 5)), requires_grad=want_x)
        w = fg.tensor(rng.standard_normal((3, 2, 3, 3)), requires_grad=not want_x)
        out = F.conv2d(x, w)
        rec = _Recorder()
        with tracer.tracing(rec):
            out.sum().backward()
        other = {"convolution_backward_input", "convolution_backward_weight"} - {kernel}
        assert kernel in rec.names and not rec.names & other, rec.names


# ---- hypothesis over shapes, strides, padding, dilation and groups --------------------------


@st.composite
def _conv_case(draw: Any) -> tuple:
    n = draw(st.integers(1, 3))
    transposed = draw(st.booleans())
    groups = draw(st.integers(1, 3))
    cin = groups * draw(st.integers(1, 2))
    cout = groups * draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(n))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(n))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(n))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(n))
    spans = [dilation[i] * (kernel[i] - 1) + 1 for i in range(n)]
    if transposed:
        sizes = tuple(draw(st.integers(1, 4)) for _ in range(n))
        # the output must not be empty: (in - 1) s - 2 p + span + op >= 1
        padding = tuple(
            min(padding[i], ((sizes[i] - 1) * stride[i] + spans[i] - 1) // 2) for i in range(n)
        )
        output_padding = tuple(
            draw(st.integers(0, max(stride[i], dilation[i]) - 1)) for i in range(n)
        )
        kwargs = {
            "stride": stride,
            "padding": padding,
            "dilation": dilation,
            "groups": groups,
            "output_padding": output_padding,
        }
        ws = (cin, cout // groups, *kernel)
    else:
        sizes = tuple(
            draw(st.integers(max(1, spans[i] - 2 * padding[i]), spans[i] + 4)) for i in range(n)
        )
        kwargs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
        ws = (cout, cin // groups, *kernel)
    batch = draw(st.integers(1, 2))
    return (n, transposed, (batch, cin, *sizes), ws, draw(st.booleans()), kwargs)


@needs_torch
@_SETTINGS
@given(case=_conv_case())
def test_hypothesis_matches_torch(case: tuple) -> None:
    fg_fn, torch_fn = _fns(case[0], case[1], case[5])
    arrays = _arrays(case, seed=5)
    got = _run(fg_fn, arrays, "float64")
    _close(got, _run_torch(torch_fn, arrays, "float64", got[0].shape), "float64")


@_SETTINGS
@given(case=_conv_case())
def test_hypothesis_matches_the_composite(case: tuple) -> None:
    fg_fn, _ = _fns(case[0], case[1], case[5])
    arrays = _arrays(case, seed=6)
    _close(_run(fg_fn, arrays, "float64"), _run(fg_fn, arrays, "float64", True), "float64")


# (_FEW_OUTPUTS, _LAST_MIN_CHANNELS, _CHUNK_BYTES) per layout
_LAYOUTS = {
    "per-sample": (1, 10**9, 1),  # one sample at a time
    "per-sample-whole-batch": (1, 10**9, 10**12),
    "batch-in-columns": (10**9, 10**9, 1),
    "channels-last": (10**9, 1, 1),  # one group only: grouped cases run batch-in-columns
}
_ROW_KERNELS = {"loops": 0, "numpy": 10**9}


def _forced(layout: str, rows: str) -> dict:
    """``conv_kernels``' shape-class thresholds that force one column layout and one kind of
    im2col / col2im kernel (``_by_sample``, ``_channels_last``, ``_SHORT_ROWS``)."""
    return {
        "_FEW_OUTPUTS": _LAYOUTS[layout][0],
        "_LAST_MIN_CHANNELS": _LAYOUTS[layout][1],
        "_CHUNK_BYTES": _LAYOUTS[layout][2],
        "_SHORT_ROWS": _ROW_KERNELS[rows],
        "_SHORT_ROWS_ADD": _ROW_KERNELS[rows],
    }


@pytest.mark.parametrize("rows", list(_ROW_KERNELS))
@pytest.mark.parametrize("layout", list(_LAYOUTS))
@pytest.mark.parametrize("case", _CASES, ids=lambda c: f"{c[0]}d{'T' if c[1] else ''}{c[2]}")
def test_each_column_layout_and_kernel_matches_the_composite(
    case: tuple, layout: str, rows: str, monkeypatch: Any
) -> None:
    """The columns are (N, C taps, L) per sample from ``_FEW_OUTPUTS`` outputs per sample on
    (made ``_CHUNK_BYTES`` at a time), and (C taps, N L) below, or (N L, taps C) there from
    ``_LAST_MIN_CHANNELS`` channels on; im2col and col2im are loop kernels or numpy copies and
    slice-adds by the length of an output row.  Each combination, forced, gives the
    composites' values and gradients."""
    for name, value in _forced(layout, rows).items():
        monkeypatch.setattr(conv_kernels, name, value)
    fg_fn, _ = _fns(case[0], case[1], case[5])
    arrays = _arrays(case, seed=7)
    _close(_run(fg_fn, arrays, "float64"), _run(fg_fn, arrays, "float64", True), "float64")


@_SETTINGS
@given(
    case=_conv_case(),
    layout=st.sampled_from(list(_LAYOUTS)),
    rows=st.sampled_from(list(_ROW_KERNELS)),
)
def test_hypothesis_column_layouts_match_the_composite(case: tuple, layout: str, rows: str) -> None:
    fg_fn, _ = _fns(case[0], case[1], case[5])
    arrays = _arrays(case, seed=8)
    forced = _forced(layout, rows)
    saved = {name: getattr(conv_kernels, name) for name in forced}
    for name, value in forced.items():
        setattr(conv_kernels, name, value)
    try:
        got = _run(fg_fn, arrays, "float64")
    finally:
        for name, value in saved.items():
            setattr(conv_kernels, name, value)
    _close(got, _run(fg_fn, arrays, "float64", True), "float64")


@pytest.mark.parametrize("case", _CASES, ids=lambda c: f"{c[0]}d{'T' if c[1] else ''}{c[2]}")
def test_an_empty_batch_gives_empty_outputs_and_zero_weight_gradients(case: tuple) -> None:
    """A batch of no samples (PyTorch's behaviour): an empty output of the right shape, an
    empty input gradient and a weight (and bias) gradient of zeros."""
    n, transposed, xs, ws, bias, kwargs = case
    if len(xs) == n + 1:
        return  # unbatched: no batch dim to empty
    fg_fn, _ = _fns(n, transposed, kwargs)
    arrays = _arrays(case)
    full = fg_fn(*[fg.tensor(a) for a in arrays])
    arrays[0] = arrays[0][:0]
    leaves = [fg.tensor(a, requires_grad=True) for a in arrays]
    out = fg_fn(*leaves)
    assert tuple(out.shape) == (0,) + tuple(full.shape[1:])
    (out * 2).sum().backward()
    assert tuple(leaves[0].grad.shape) == tuple(arrays[0].shape)
    for leaf, a in zip(leaves[1:], arrays[1:]):
        np.testing.assert_array_equal(leaf.grad.numpy(), np.zeros_like(a))


# ---- modules: padding modes, and the layers as a whole ---------------------------------------


@needs_torch
@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_padding_modes_of_the_modules(mode: str, n: int) -> None:
    cls = {1: "Conv1d", 2: "Conv2d", 3: "Conv3d"}[n]
    fg.manual_seed(0)
    layer = getattr(nn, cls)(2, 4, 3, stride=2, padding=1, padding_mode=mode, groups=2).double()
    ref = getattr(_torch.nn, cls)(2, 4, 3, stride=2, padding=1, padding_mode=mode, groups=2)
    ref = ref.double()
    with _torch.no_grad():
        ref.weight.copy_(_torch.tensor(layer.weight.detach().numpy()))
        ref.bias.copy_(_torch.tensor(layer.bias.detach().numpy()))
    x = np.random.default_rng(7).standard_normal((2, 2) + (5,) * n)
    xf, xt = fg.tensor(x, requires_grad=True), _torch.tensor(x, requires_grad=True)
    yf, yt = layer(xf), ref(xt)
    np.testing.assert_allclose(yf.detach().numpy(), yt.detach().numpy(), rtol=1e-9, atol=1e-11)
    yf.sum().backward()
    yt.sum().backward()
    np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(
        layer.weight.grad.numpy(), ref.weight.grad.numpy(), rtol=1e-9, atol=1e-11
    )


def test_in_place_ops_on_the_output_and_no_grad() -> None:
    """The output is a tensor of its own (an in-place op on it is fine); without grad mode the
    kernel runs and records nothing."""
    rng = np.random.default_rng(8)
    x = fg.tensor(rng.standard_normal((1, 2, 4, 4)), requires_grad=True)
    w = fg.tensor(rng.standard_normal((3, 2, 3, 3)), requires_grad=True)
    out = F.conv2d(x, w)
    want = out.detach().numpy() + 1.0
    out.add_(1.0)
    np.testing.assert_allclose(out.detach().numpy(), want)
    out.sum().backward()
    assert x.grad is not None
    with fg.no_grad():
        y = F.conv2d(x, w)
    assert y.grad_fn is None and not y.requires_grad


def test_mixed_dtypes_and_half_run_the_composite() -> None:
    """float16 runs the composite (the kernels are float32 / float64); a float32 input with a
    float64 weight is refused as before."""
    rng = np.random.default_rng(9)
    x = fg.tensor(rng.standard_normal((1, 2, 4, 4)), dtype=fg.float16)
    w = fg.tensor(rng.standard_normal((3, 2, 3, 3)), dtype=fg.float16)
    rec = _Recorder()
    with tracer.tracing(rec):
        out = F.conv2d(x, w)
    assert out.dtype == fg.float16 and "convolution" not in rec.names


# ---- errors: the same words on the kernel path as on the composite ----------------------------

_BAD = [
    (lambda x, w: F.conv2d(x, w), (1, 2, 2, 2), (3, 2, 3, 3), "too small"),
    (lambda x, w: F.conv2d(x, w), (1, 3, 5, 5), (3, 2, 3, 3), "expected 2 input channels"),
    (lambda x, w: F.conv2d(x, w, groups=2), (1, 4, 5, 5), (3, 2, 3, 3), "groups=2"),
    (lambda x, w: F.conv2d(x, w), (5, 5), (3, 2, 3, 3), "Expected 3D (unbatched) or 4D"),
    (lambda x, w: F.conv2d(x, w), (1, 2, 5, 5), (3, 2, 3), "weight must be 4-D"),
    (lambda x, w: F.conv2d(x, w, stride=2, padding="same"), (1, 2, 5, 5), (3, 2, 3, 3), "same"),
    (lambda x, w: F.conv1d(x, w, padding=-1), (1, 2, 5), (3, 2, 3), "negative padding"),
    (
        lambda x, w: F.conv_transpose2d(x, w, stride=2, output_padding=2),
        (1, 2, 3, 3),
        (2, 3, 3, 3),
        "output padding must be smaller",
    ),
    (lambda x, w: F.conv_transpose2d(x, w), (1, 3, 3, 3), (2, 3, 3, 3), "to have 2 channels"),
    (lambda x, w: F.conv3d(x, w, stride=(1, 2)), (1, 1, 4, 4, 4), (1, 1, 2, 2, 2), "stride"),
]


@pytest.mark.parametrize("fn, xs, ws, words", _BAD)
@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_errors_name_the_problem(fn: Any, xs: tuple, ws: tuple, words: str, dtype: str) -> None:
    """float64 reaches the kernels, float16 the composite: the same error either way, and the
    inputs unchanged."""
    x = fg.ones(*xs, dtype=getattr(fg, dtype), requires_grad=True)
    w = fg.ones(*ws, dtype=getattr(fg, dtype), requires_grad=True)
    with pytest.raises(RuntimeError, match=re.escape(words)):
        fn(x, w)
    assert x.grad is None and w.grad is None


# ---- Winograd F(4x4, 3x3) (ops/winograd.py): the 3x3 stride-1 shape class ---------------------

_WINOGRAD_CASES = [
    # (batch, in channels, out channels, height, width, padding)
    (2, 32, 64, 26, 26, 0),  # the MNIST network's second layer (outputs a multiple of 4: 24)
    (4, 64, 32, 15, 17, 1),  # outputs not a multiple of 4: partial tiles cropped
    (8, 32, 96, 11, 10, 2),  # padding 2: the input's gradient has no padding
]


@pytest.mark.parametrize("per_chunk", [1, 3, 10**6])
@pytest.mark.parametrize("case", _WINOGRAD_CASES, ids=str)
def test_winograd_forward_and_input_gradient_equal_the_im2col_kernels(
    case: tuple, per_chunk: int, monkeypatch: Any
) -> None:
    """In float64 the Winograd forward is exact to rounding: equal to im2col's product (the
    shape rule picks Winograd for these shapes, im2col when forced off); the input's gradient
    (im2col either way) is unchanged.  The samples go ``per_chunk`` at a time (the last chunk
    shorter where they do not divide the batch)."""
    from fusegrad.ops import conv_kernels as ck

    n, c, o, h, w_, p = case
    rng = np.random.default_rng(sum(case))
    x, w = rng.standard_normal((n, c, h, w_)), rng.standard_normal((o, c, 3, 3))
    outs = (h + 2 * p - 2, w_ + 2 * p - 2)
    tiles = -(-outs[0] // 4) * -(-outs[1] // 4)
    monkeypatch.setattr(ck, "_CHUNK_BYTES", per_chunk * 36 * (c + o) * tiles * 8)
    g = rng.standard_normal((n, o, *outs))
    assert ck._winograd_fits(c, o, n, (3, 3), (1, 1), (1, 1), 1, outs, x.dtype)
    got = ck.conv_forward(x, w, None, (1, 1), (p, p), (1, 1), 1, outs)
    got_gx = ck.conv_backward_input(g, w, (h, w_), (1, 1), (p, p), (1, 1), 1)
    # the im2col kernels: the same call where the rule says no (an unused group of one is
    # not possible, so the rule is bypassed by a patched predicate)
    original = ck._winograd_fits
    ck._winograd_fits = lambda *a: False
    try:
        want = ck.conv_forward(x, w, None, (1, 1), (p, p), (1, 1), 1, outs)
        want_gx = ck.conv_backward_input(g, w, (h, w_), (1, 1), (p, p), (1, 1), 1)
    finally:
        ck._winograd_fits = original
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(got_gx, want_gx, rtol=1e-11, atol=1e-11)


@needs_torch
@pytest.mark.parametrize("case", _WINOGRAD_CASES, ids=str)
def test_winograd_float32_matches_torch_within_its_rounding(case: tuple) -> None:
    """float32: values and gradients through ``F.conv2d`` (Winograd forward, im2col
    gradients) within float32 tolerances of PyTorch's; the transforms' rounding is
    bounded relative to the output's scale (module docstring of ``ops/winograd.py``)."""
    n, c, o, h, w_, p = case
    rng = np.random.default_rng(sum(case) + 1)
    arrays = [
        rng.standard_normal((n, c, h, w_)),
        rng.standard_normal((o, c, 3, 3)) / np.sqrt(9 * c),
        rng.standard_normal(o),
    ]
    tx, tw, tb = (_torch.tensor(a.astype("float32"), requires_grad=True) for a in arrays)
    ty = _torch.nn.functional.conv2d(tx, tw, tb, padding=p)
    weights = rng.standard_normal(tuple(ty.shape)).astype("float32")
    (ty * _torch.tensor(weights)).sum().backward()
    fx, fw, fb = (fg.tensor(a.astype("float32"), requires_grad=True) for a in arrays)
    fy = F.conv2d(fx, fw, fb, padding=p)
    (fy * fg.tensor(weights)).sum().backward()
    for got, want in ((fy, ty), (fx.grad, tx.grad), (fw.grad, tw.grad), (fb.grad, tb.grad)):
        want = want.detach().numpy()
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=0, atol=2e-5 * scale)


# ---- the channels-last column kernels against numpy's windows ------------------------------


@st.composite
def _column_geometry(draw: Any) -> tuple:
    n = draw(st.integers(1, 3))
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(n))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(n))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(n))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(n))
    spans = [dilation[i] * (kernel[i] - 1) + 1 for i in range(n)]
    sizes = tuple(
        draw(st.integers(max(1, spans[i] - 2 * padding[i]), spans[i] + 5)) for i in range(n)
    )
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 5)), *sizes)
    return shape, kernel, stride, padding, dilation


@_SETTINGS
@given(geometry=_column_geometry())
def test_channels_last_columns_match_numpy_windows(geometry: tuple) -> None:
    """``pool_kernels.im2col_last`` (a row per output position: per kernel tap the C channels
    it reads, zeros in the padding; one copy per run of in-bounds taps along the last dim)
    equals numpy's strided windows of the zero-padded input, and ``col2im_last`` is its
    adjoint: <im2col(x), c> = <x, col2im(c)>, and col2im of ones counts each position's
    readers."""
    shape, kernel, stride, padding, dilation = geometry
    n = len(kernel)
    outs = conv_kernels.out_sizes(shape[2:], kernel, stride, padding, dilation)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape)
    got = conv_kernels._columns_last(x, kernel, stride, padding, dilation, outs)
    view = conv_kernels._window_view(
        conv_kernels._padded(x, padding), kernel, stride, dilation, outs
    )  # (N, C, *kernel, *outs) -> (N, *outs, *kernel, C)
    order = (0, *range(2 + n, 2 + 2 * n), *range(2, 2 + n), 1)
    want = np.ascontiguousarray(view.transpose(order)).reshape(got.shape)
    np.testing.assert_array_equal(got, want)

    loops = conv_kernels._loops()
    geometry_table = conv_kernels._geometry(shape, kernel, outs, stride, padding, dilation)
    last_shape = (shape[0], *shape[2:], shape[1])
    cols = rng.standard_normal(got.shape)
    back = np.zeros(last_shape)
    loops.col2im_last(cols.reshape(-1), back.reshape(-1), geometry_table)
    x_last = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    np.testing.assert_allclose(np.sum(got * cols), np.sum(x_last * back), rtol=1e-12)
    counts = np.zeros(last_shape)
    loops.col2im_last(np.ones(got.size), counts.reshape(-1), geometry_table)
    # per position of the padded input, how many outputs read it
    readers = np.zeros(shape[:2] + tuple(s + 2 * p for s, p in zip(shape[2:], padding)))
    for tap in np.ndindex(*kernel):
        index = (slice(None), slice(None)) + tuple(
            slice(
                tap[i] * dilation[i],
                tap[i] * dilation[i] + (outs[i] - 1) * stride[i] + 1,
                stride[i],
            )
            for i in range(n)
        )
        readers[index] += 1
    crop = (slice(None), slice(None)) + tuple(slice(p, p + s) for s, p in zip(shape[2:], padding))
    np.testing.assert_array_equal(counts, np.moveaxis(readers[crop], 1, -1))
