"""The PyTorch-fidelity bugs of issue 28 that real programs and a peer's op suite hit, each as a
test that failed before its fix: in-place ops on a bias-free convolution's output, the legacy
constructors, ``view(dtype)``, ``isclose`` at infinities, integer indices among advanced ones,
``copysign``'s gradient for ``other``, pooling and padding corner cases, argument validation
and PyTorch's exception classes.  Each compares with PyTorch when it is importable (values,
gradients, shapes, which calls raise); the compiled-autograd bugs (3 and 4) are in
``tests/compiler/test_fidelity_compiled.py``.
"""

from __future__ import annotations

import importlib.util
import itertools
import random
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad.autograd import gradcheck

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch cross-check")


def _torch() -> Any:
    import torch

    return torch


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", value) or ("raise", exception class) of a call."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - the class is what is compared
        return "raise", e


# ---- 1. in-place on a bias-free convolution's output -------------------------------------------


CONVS = {
    "Conv1d": (lambda m: m.Conv1d(3, 4, 3, bias=False), (2, 3, 9)),
    "Conv2d": (lambda m: m.Conv2d(3, 4, 3, bias=False), (2, 3, 7, 6)),
    "Conv3d": (lambda m: m.Conv3d(3, 4, 2, bias=False), (2, 3, 4, 5, 4)),
    "ConvTranspose2d": (lambda m: m.ConvTranspose2d(3, 4, 3, stride=2, bias=False), (2, 3, 4, 5)),
}


@pytest.mark.parametrize("name", list(CONVS))
@pytest.mark.parametrize("inplace", ["add_", "leaky_relu"])
def test_inplace_on_a_bias_free_convolution_output(name: str, inplace: str) -> None:
    make, shape = CONVS[name]
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal(shape)
    conv = make(nn).double()
    x = fg.tensor(x_np, requires_grad=True)
    y = conv(x)
    if inplace == "add_":
        y.add_(1.0)
    else:
        F.leaky_relu(y, 0.2, inplace=True)
    (y * y).sum().backward()
    assert y.grad_fn is not None and conv.weight.grad is not None
    if HAVE_TORCH:
        torch = _torch()
        tconv = make(torch.nn).double()
        with torch.no_grad():
            tconv.weight.copy_(torch.tensor(conv.weight.detach().numpy()))
        tx = torch.tensor(x_np, requires_grad=True)
        ty = tconv(tx)
        if inplace == "add_":
            ty.add_(1.0)
        else:
            torch.nn.functional.leaky_relu(ty, 0.2, inplace=True)
        (ty * ty).sum().backward()
        np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-10)
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(
            conv.weight.grad.numpy(), tconv.weight.grad.numpy(), rtol=1e-9, atol=1e-12
        )


def test_inplace_on_functional_conv2d_and_group_norm_without_affine() -> None:
    x = fg.randn(2, 4, 5, 5, dtype=fg.float64, requires_grad=True)
    w = fg.randn(6, 4, 3, 3, dtype=fg.float64, requires_grad=True)
    y = F.conv2d(x, w)
    y.mul_(2.0)
    z = F.group_norm(y, 2)  # (no weight or bias: its output was a reshape of the result)
    z.add_(1.0)
    z.pow(2).sum().backward()
    assert x.grad is not None and w.grad is not None
    gradcheck(lambda x, w: F.group_norm(F.conv2d(x, w).mul_(2.0), 2).add_(1.0), (x, w))


# ---- 2. legacy constructors --------------------------------------------------------------------


def test_tensor_legacy_constructor_takes_sizes_and_data() -> None:
    t = fg.Tensor(3, 4)
    assert tuple(t.shape) == (3, 4) and t.dtype is fg.float32
    t = fg.Tensor(16)
    assert tuple(t.shape) == (16,) and t.dtype is fg.float32
    assert tuple(fg.Tensor(fg.Size([2, 5])).shape) == (2, 5)
    assert tuple(fg.Tensor().shape) == (0,)
    data = fg.Tensor([1, 2, 3])
    assert data.dtype is fg.float32 and data.tolist() == [1.0, 2.0, 3.0]
    assert fg.Tensor(np.arange(3)).dtype is fg.float32
    p = nn.Parameter(fg.Tensor(16))
    assert p.requires_grad and tuple(p.shape) == (16,)
    with pytest.raises(TypeError, match="sizes"):
        fg.Tensor(2.5)
    if HAVE_TORCH:
        torch = _torch()
        for args in [(3, 4), (16,), ([1, 2, 3],), ()]:
            assert tuple(torch.Tensor(*args).shape) == tuple(fg.Tensor(*args).shape)


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("FloatTensor", "float32"),
        ("DoubleTensor", "float64"),
        ("LongTensor", "int64"),
        ("IntTensor", "int32"),
        ("BoolTensor", "bool"),
        ("HalfTensor", "float16"),
        ("ShortTensor", "int16"),
        ("CharTensor", "int8"),
        ("ByteTensor", "uint8"),
    ],
)
def test_legacy_tensor_types(name: str, dtype: str) -> None:
    kind = getattr(fg, name)
    made = kind(2, 3)
    assert tuple(made.shape) == (2, 3) and made.dtype.name == dtype
    data = kind([1, 0, 1])
    assert data.dtype.name == dtype and data.tolist() == [1, 0, 1]
    assert isinstance(data, kind) and isinstance(data, fg.Tensor)
    other = "LongTensor" if name != "LongTensor" else "FloatTensor"
    assert not isinstance(data, getattr(fg, other))
    converted = fg.zeros(2).type(kind)
    assert converted.dtype.name == dtype
    assert fg.zeros(2).type(f"torch.{name}").dtype.name == dtype
    assert fg.cuda.FloatTensor is not fg.FloatTensor
    if HAVE_TORCH:
        torch = _torch()
        assert getattr(torch, name)([1, 0, 1]).dtype == getattr(torch, dtype)


# ---- 5. view(dtype) reinterprets bits ---------------------------------------------------------


@pytest.mark.parametrize(
    "source, target",
    [
        ("float32", "int32"),
        ("float64", "int64"),
        ("float32", "float64"),
        ("float32", "int16"),
        ("int64", "float32"),
        ("float32", "uint8"),
        ("int32", "bool"),
    ][:6],
)
def test_view_dtype_reinterprets_the_bytes(source: str, target: str) -> None:
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((3, 4)) * 100).astype(source)
    x = fg.tensor(arr)
    y = x.view(getattr(fg, target))
    expected = arr.view(target)
    assert y.dtype.name == target
    np.testing.assert_array_equal(y.numpy(), expected)
    # storage and version counter are shared: a write through the view is seen
    y.zero_()
    assert x._version == 1 and not x.numpy().any()
    if HAVE_TORCH:
        torch = _torch()
        got = torch.tensor(arr).view(getattr(torch, target)).numpy()
        np.testing.assert_array_equal(got, expected)


def test_view_dtype_checks_and_is_not_differentiable() -> None:
    x = fg.randn(3, 4, requires_grad=True)
    assert not x.view(fg.int32).requires_grad
    same = x.view(fg.float32)
    assert same.requires_grad and same._base is x
    with pytest.raises(RuntimeError, match="stride"):
        fg.randn(4, 4).t().view(fg.float64)
    with pytest.raises(RuntimeError, match="divisible"):
        fg.randn(3, 3).view(fg.float64)
    with pytest.raises(RuntimeError, match="dim"):
        fg.tensor(1.0).view(fg.float64)


# ---- 6. isclose at infinities -----------------------------------------------------------------


def test_isclose_of_infinities() -> None:
    inf = float("inf")
    a = fg.tensor([inf, -inf, inf, 0.0, 0.0, 1.0, float("nan")])
    b = fg.tensor([-inf, inf, inf, inf, -inf, 1.0 + 1e-7, float("nan")])
    got = fg.isclose(a, b).tolist()
    assert got == [False, False, True, False, False, True, False]
    assert fg.isclose(a, b, equal_nan=True).tolist()[-1] is True
    assert not fg.allclose(fg.tensor([inf]), fg.tensor([-inf]))
    if HAVE_TORCH:
        torch = _torch()
        for equal_nan in (False, True):
            expected = torch.isclose(
                torch.tensor(a.numpy()), torch.tensor(b.numpy()), equal_nan=equal_nan
            ).tolist()
            assert fg.isclose(a, b, equal_nan=equal_nan).tolist() == expected


# ---- 7. integer indices are basic indexing ----------------------------------------------------


def test_integer_index_among_advanced_ones_keeps_its_place() -> None:
    x = fg.randn(2, 3, 4, 5, 6)
    idx = fg.tensor([[0, 1], [2, 3]])
    assert tuple(x[1, :, 1:3, idx, 0:2].shape) == (3, 2, 2, 2, 2)
    small = fg.tensor([[0, 1], [2, 1]])
    assert tuple(x[:, small, :, 1].shape) == (2, 2, 2, 4, 6)


KEY_PARTS = ["int", "slice", "tensor", "full", "none"]


@needs_torch
def test_mixed_keys_match_torch_in_values_gradients_and_assignment() -> None:
    torch = _torch()
    rng = random.Random(3)
    data = np.random.default_rng(3).standard_normal((2, 3, 4, 5, 6))
    checked = 0
    for _ in range(150):
        key: list = []
        for d in range(5):
            kind = rng.choice(KEY_PARTS)
            if kind == "int":
                key.append(rng.randrange(-data.shape[d], data.shape[d]))
            elif kind == "slice":
                key.append(slice(rng.randrange(0, 2), data.shape[d], rng.choice([1, 2])))
            elif kind == "tensor":
                key.append(np.array([[0, 1], [1, 0]]))
            elif kind == "full":
                key.append(slice(None))
            else:
                key += [None, slice(None)]
        fkey = tuple(fg.tensor(k) if isinstance(k, np.ndarray) else k for k in key)
        tkey = tuple(torch.tensor(k) if isinstance(k, np.ndarray) else k for k in key)
        if not any(isinstance(k, np.ndarray) for k in key):
            continue
        x, tx = fg.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
        y, ty = x[fkey], tx[tkey]
        assert tuple(y.shape) == tuple(ty.shape), key
        np.testing.assert_array_equal(y.detach().numpy(), ty.detach().numpy())
        g = np.random.default_rng(0).standard_normal(tuple(ty.shape))
        y.backward(fg.tensor(g))
        ty.backward(torch.tensor(g))
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
        a, b = fg.tensor(data.copy()), torch.tensor(data.copy())
        a[fkey] = fg.tensor(g)
        b[tkey] = torch.tensor(g)
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        checked += 1
    assert checked > 50


# ---- 8. copysign's gradient for other ---------------------------------------------------------


def test_copysign_gradient_with_respect_to_other_is_zeros() -> None:
    x = fg.randn(2, 3, dtype=fg.float64, requires_grad=True)
    other = fg.randn(3, dtype=fg.float64, requires_grad=True)
    y = fg.copysign(x, other)
    assert y.grad_fn.name() == "CopysignBackward0"
    gx, go = fg.autograd.grad(y.sum(), [x, other])
    assert go.tolist() == [0.0, 0.0, 0.0]
    gradcheck(fg.copysign, (x, other))
    if HAVE_TORCH:
        torch = _torch()
        tx = torch.tensor(x.detach().numpy(), requires_grad=True)
        to = torch.tensor(other.detach().numpy(), requires_grad=True)
        tgx, tgo = torch.autograd.grad(torch.copysign(tx, to).sum(), [tx, to])
        np.testing.assert_array_equal(gx.numpy(), tgx.numpy())
        np.testing.assert_array_equal(go.numpy(), tgo.numpy())


# ---- 9. pooling and padding ---------------------------------------------------------------------


POOL_CASES = [
    (k, s, p, include)
    for k, s, p, include in itertools.product([2, 3], [1, 2, 3], [0, 1], [True, False])
    if p <= k // 2
]


@pytest.mark.parametrize("kernel, stride, padding, include", POOL_CASES)
def test_avg_pool_ceil_mode(kernel: int, stride: int, padding: int, include: bool) -> None:
    rng = np.random.default_rng(kernel * 100 + stride * 10 + padding)
    x2 = rng.standard_normal((1, 2, 7, 6))
    args = (kernel, stride, padding, True, include)
    out2 = F.avg_pool2d(fg.tensor(x2), *args)
    out1 = F.avg_pool1d(fg.tensor(x2[:, :, 0]), *args)
    gradcheck(lambda t: F.avg_pool2d(t, *args), (fg.tensor(x2, requires_grad=True),))
    if HAVE_TORCH:
        torch = _torch()
        tf = torch.nn.functional
        np.testing.assert_allclose(out2.numpy(), tf.avg_pool2d(torch.tensor(x2), *args).numpy())
        np.testing.assert_allclose(
            out1.numpy(), tf.avg_pool1d(torch.tensor(x2[:, :, 0]), *args).numpy()
        )


def test_avg_pool_ceil_mode_once_failed_with_a_shape_error() -> None:
    out = F.avg_pool2d(fg.ones(1, 1, 5, 4), 2, 2, 1, ceil_mode=True)
    assert tuple(out.shape) == (1, 1, 3, 3)
    # each window averages what it covers of the zero-padded input
    assert out[0, 0, 0, 0].item() == pytest.approx(0.25)


def test_max_pool_with_padding_on_integers() -> None:
    x = fg.arange(2 * 3 * 7 * 6).reshape(2, 3, 7, 6) - 50
    out = F.max_pool2d(x, 3, padding=1)
    assert out.dtype is fg.int64
    out1 = F.max_pool1d(x[:, :, 0].to(fg.int32), 2, padding=1)
    assert out1.dtype is fg.int32
    if HAVE_TORCH:
        torch = _torch()
        tf = torch.nn.functional
        want = tf.max_pool2d(torch.tensor(x.numpy()), 3, padding=1)
        np.testing.assert_array_equal(out.numpy(), want.numpy())
        # (PyTorch's max_pool1d has no integer kernel: compare with its float result)
        want1 = tf.max_pool1d(torch.tensor(x[:, :, 0].numpy()).double(), 2, padding=1)
        np.testing.assert_array_equal(out1.numpy(), want1.numpy())


PAD_MODES = ["reflect", "replicate", "circular", "constant"]


def test_pad_with_negative_widths_in_every_mode() -> None:
    x = fg.arange(10.0).reshape(1, 2, 5)
    assert F.pad(x, (-1, 2), mode="reflect")[0, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 3.0, 2.0]
    assert F.pad(x, (-2, 1), mode="replicate")[0, 0].tolist() == [2.0, 3.0, 4.0, 4.0]
    assert F.pad(x, (-1, 1), mode="circular")[0, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 1.0]
    # reflect widths are checked against the input, not what a crop leaves
    assert F.pad(fg.arange(3.0).reshape(1, 1, 3), (-1, 2), mode="reflect")[0, 0].tolist() == [
        1.0,
        2.0,
        1.0,
        0.0,
    ]


@needs_torch
def test_pad_matches_torch_for_random_widths() -> None:
    torch = _torch()
    rng = random.Random(5)
    checked = 0
    for _ in range(600):
        dims = rng.choice([1, 2, 3])
        shape = [2] + [rng.randint(1, 5) for _ in range(dims)]
        if dims == 1:
            shape = [1] + shape
        data = np.random.default_rng(0).standard_normal(shape)
        widths = [rng.randint(-3, 3) for _ in range(2 * dims)]
        mode = rng.choice(PAD_MODES)
        want = _outcome(partial(torch.nn.functional.pad, torch.tensor(data), widths, mode=mode))
        if want[0] == "ok" and 0 in want[1].shape:
            continue  # (PyTorch's checks of empty outputs differ by mode and rank)
        got = _outcome(partial(F.pad, fg.tensor(data), widths, mode=mode))
        if want[0] == "raise":
            assert got[0] == "raise", (shape, widths, mode)
            assert isinstance(got[1], RuntimeError)
            continue
        if got[0] == "raise" and mode == "circular":
            # a wrap around a middle the crop left shorter than the pad: PyTorch reads
            # uninitialised memory there, fusegrad refuses
            assert "wrapping around" in str(got[1]) or "crops" in str(got[1])
            continue
        assert got[0] == "ok", (shape, widths, mode, got[1])
        np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
        checked += 1
    assert checked > 200


def test_pad_gradients_with_negative_widths() -> None:
    for mode in ("reflect", "replicate", "circular"):
        x = fg.randn(1, 2, 5, 4, dtype=fg.float64, requires_grad=True)
        gradcheck(partial(F.pad, pad=(-1, 2, 1, -1), mode=mode), (x,))


# ---- 10. validation -----------------------------------------------------------------------------

VALIDATION = {
    "linspace to bool": lambda m, F: m.linspace(0, 1, 3, dtype=m.bool),
    "max_pool2d kernel of 3": lambda m, F: F.max_pool2d(m.ones(1, 1, 5, 5), (2, 2, 2)),
    "max_pool2d stride of 3": lambda m, F: F.max_pool2d(m.ones(1, 1, 5, 5), 2, (1, 1, 1)),
    "avg_pool2d padding of 3": lambda m, F: F.avg_pool2d(m.ones(1, 1, 5, 5), 2, 2, (1, 1, 1)),
    "avg_pool1d kernel of 2": lambda m, F: F.avg_pool1d(m.ones(1, 1, 5), (2, 2)),
    "conv2d stride of 3": lambda m, F: F.conv2d(
        m.ones(1, 1, 5, 5), m.ones(1, 1, 3, 3), stride=(1, 1, 1)
    ),
    "conv2d padding of 3": lambda m, F: F.conv2d(
        m.ones(1, 1, 5, 5), m.ones(1, 1, 3, 3), padding=(1, 1, 1)
    ),
    "conv1d dilation of 2": lambda m, F: F.conv1d(
        m.ones(1, 1, 5), m.ones(1, 1, 3), dilation=(1, 1)
    ),
    "circular pad wider than the input": lambda m, F: F.pad(
        m.ones(1, 1, 3), (4, 4), mode="circular"
    ),
}


@pytest.mark.parametrize("case", list(VALIDATION))
def test_invalid_arguments_raise(case: str) -> None:
    with pytest.raises(RuntimeError):
        VALIDATION[case](fg, F)
    if HAVE_TORCH:
        torch = _torch()
        with pytest.raises(RuntimeError):
            VALIDATION[case](torch, torch.nn.functional)


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dim", [1, -2])
def test_cumulative_ops_check_the_dim_of_a_0d_tensor(op: str, dim: int) -> None:
    with pytest.raises(IndexError, match="range"):
        getattr(fg, op)(fg.tensor(1.0), dim)
    if HAVE_TORCH:
        torch = _torch()
        with pytest.raises(IndexError):
            getattr(torch, op)(torch.tensor(1.0), dim)


def test_valid_length_one_tuples_still_work() -> None:
    assert tuple(F.max_pool2d(fg.ones(1, 1, 6, 6), (2,)).shape) == (1, 1, 3, 3)
    assert tuple(F.conv2d(fg.ones(1, 1, 5, 5), fg.ones(1, 1, 3, 3), stride=[2]).shape) == (
        1,
        1,
        2,
        2,
    )
    assert fg.cumsum(fg.tensor(2.0), -1).item() == 2.0


# ---- 11. exception classes ----------------------------------------------------------------------

ERRORS: dict[str, tuple[Callable, type]] = {
    "clamp without bounds": (lambda m, F: m.clamp(m.ones(3)), RuntimeError),
    "div with a typo": (lambda m, F: m.div(m.ones(3), 2, rounding_mode="typo"), RuntimeError),
    "meshgrid indexing": (lambda m, F: m.meshgrid(m.ones(3), indexing="bad"), RuntimeError),
    "int to a negative power": (lambda m, F: m.tensor([2]) ** -1, RuntimeError),
    "pad mode typo": (
        lambda m, F: F.pad(m.ones(1, 1, 3), (1, 1), mode="typo"),
        NotImplementedError,
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_exception_classes_are_torchs(case: str) -> None:
    call, cls = ERRORS[case]
    with pytest.raises(cls) as info:
        call(fg, F)
    assert not isinstance(info.value, ValueError)
    if HAVE_TORCH:
        torch = _torch()
        with pytest.raises(cls):
            call(torch, torch.nn.functional)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_python_float_beyond_the_dtype_range_is_inf_without_a_warning(dtype: str) -> None:
    """``x * 1e300`` on a float32 tensor is inf in PyTorch, with no warning; numpy's cast of
    the scalar warned "overflow encountered in cast"."""
    x = fg.ones(3, dtype=getattr(fg, dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = [(x * 1e300).numpy(), (x + -1e300).numpy(), x.mul(1e300).numpy()]
        small = (x * 2.5).numpy()
    assert np.isposinf(got[0]).all() and np.isneginf(got[1]).all() and np.isposinf(got[2]).all()
    np.testing.assert_array_equal(small, np.full(3, 2.5, dtype=dtype))


def test_binary_cross_entropy_values_at_the_ends_are_pytorchs() -> None:
    """PyTorch's loss is (t - 1) max(log1p(-p), -100) - t max(log p, -100): log1p keeps a tiny
    p's loss (1e-30, not -0), and both logs stop at -100 where p is 0 or 1."""
    p = np.array([0.0, 1.0, 0.5, 1e-30, 1 - 1e-7, 0.3], np.float32)
    t = np.array([0.0, 1.0, 1.0, 0.0, 1.0, 0.2], np.float32)
    with np.errstate(divide="ignore"):
        want = (t - 1) * np.maximum(np.log1p(-p), -100) - t * np.maximum(np.log(p), -100)
    got = F.binary_cross_entropy(fg.tensor(p), fg.tensor(t), reduction="none").numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    ends = F.binary_cross_entropy(fg.tensor([0.0, 1.0]), fg.tensor([1.0, 0.0]), reduction="none")
    np.testing.assert_array_equal(ends.numpy(), [100.0, 100.0])


# ``fg.tensor(data, dtype=...)`` of Python numbers beyond the dtype's range: a float dtype gives
# +-inf silently (numpy's cast warned "overflow encountered in cast"); an integer dtype refuses
# a number it cannot hold ("value cannot be converted to type ... without overflow"), except
# PyTorch's wrap of negative ints into uint8 (-1 -> 255, down to -255); Python ints beyond int64
# refuse an integer dtype and convert to a float one; numpy arrays cast as numpy casts them
# (wrapping), silently.  Each case in three spellings: a scalar, a list, a nested list.
_OVERFLOW_CASES = [
    (1e300, "float32"),
    (-1e300, "float16"),
    (3.5e38, "float32"),
    (65519.0, "float16"),  # (rounds to the largest finite float16)
    (65520.0, "float16"),
    (1e300, None),  # (the default float dtype)
    (1e300j, "complex64"),
    (1e300, "complex64"),
    (2**64, "float32"),
    (10**400, "float64"),
    (float("nan"), "bool"),
    (1e300, "bool"),
    (-1, "uint8"),
    (-255, "uint8"),
    (-256, "uint8"),
    (300, "uint8"),
    (255.9, "uint8"),
    (-0.5, "uint8"),
    (127.9, "int8"),
    (-128.0, "int8"),
    (-129.0, "int8"),
    (-129, "int8"),
    (2**31, "int32"),
    (-(2**31), "int32"),
    (1e20, "int16"),
    (2**63 - 1, "int64"),
    (9.3e18, "int64"),
    (float(2**63), "int64"),  # (PyTorch's bound check passes it: INT64_MIN, as numpy's cast)
    (float("nan"), "int64"),
    (float("inf"), "int32"),
    (2**63, "int64"),
    (2**63, None),
    (2**100, None),
    (-(2**63) - 1, "int64"),
    (True, "int8"),
]


def _build(lib: Any, value: Any, dtype: str | None, spelling: int) -> Any:
    data = [value, [value, 0], [[value], [0]]][spelling]
    return lib.tensor(data, dtype=None if dtype is None else getattr(lib, dtype))


def _tensor_outcome(lib: Any, value: Any, dtype: str | None, spelling: int) -> Any:
    """The values (float64 or complex128, compared with NaN) and dtype name, or the error's
    base class among RuntimeError, ValueError, OverflowError, TypeError."""
    try:
        t = _build(lib, value, dtype, spelling)
    except (OverflowError, TypeError, ValueError, RuntimeError) as e:
        for base in (OverflowError, TypeError, ValueError, RuntimeError):
            if isinstance(e, base):
                return base
    return np.asarray(t.tolist()), str(t.dtype).rsplit(".", 1)[-1]


@needs_torch
@pytest.mark.parametrize("spelling", [0, 1, 2], ids=["scalar", "list", "nested"])
@pytest.mark.parametrize(("value", "dtype"), _OVERFLOW_CASES, ids=lambda v: repr(v)[:24])
def test_tensor_of_numbers_beyond_the_dtypes_range_is_pytorchs(
    value: Any, dtype: str | None, spelling: int
) -> None:
    torch = _torch()
    want = _tensor_outcome(torch, value, dtype, spelling)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no numpy RuntimeWarning on the way)
        got = _tensor_outcome(fg, value, dtype, spelling)
    if isinstance(want, type):
        assert got is want or (isinstance(got, type) and issubclass(got, want)), (got, want)
        return
    assert not isinstance(got, type), f"fusegrad raised {got.__name__}, PyTorch gave {want}"
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1]


def test_an_integer_dtypes_overflow_error_names_the_value_and_range() -> None:
    with pytest.raises(RuntimeError, match=r"cannot be converted to type uint8 without overflow"):
        fg.tensor([1, 300], dtype=fg.uint8)
    with pytest.raises(RuntimeError, match=r"-129.*\[-128, 127\]"):
        fg.tensor([[1.0], [-129.0]], dtype=fg.int8)


@needs_torch
@pytest.mark.parametrize(
    ("array", "dtype"),
    [
        (np.array([300, -1, 2]), "uint8"),
        (np.array([1e300, -1e300]), "float32"),
        (np.array([2.0**40, 3.5]), "int32"),
    ],
)
def test_a_numpy_array_is_cast_silently_as_numpy_casts_it(array: np.ndarray, dtype: str) -> None:
    torch = _torch()
    want = torch.tensor(array, dtype=getattr(torch, dtype)).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fg.tensor(array, dtype=getattr(fg, dtype)).numpy()
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype


def test_tensor_where_takes_the_tensor_as_the_values_where_the_condition_holds() -> None:
    """``x.where(condition, y)`` is ``torch.where(condition, x, y)`` (found while fixing fuzz
    seed 301666: the tensor was taken as the condition)."""
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    condition = fg.tensor([True, False, True])
    y = x.where(condition, -1.0)
    np.testing.assert_array_equal(y.detach().numpy(), [1.0, -1.0, 3.0])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 0.0, 1.0])
    other = fg.tensor([10.0, 20.0, 30.0])
    np.testing.assert_array_equal(x.detach().where(condition, other).numpy(), [1.0, 20.0, 3.0])
