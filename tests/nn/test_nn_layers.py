"""Layer forward passes against numpy references, and values + gradients against PyTorch
(with the same weights copied in) where torch is importable."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad
from fusegrad import nn

RNG = np.random.default_rng(1234)


def _t(a: np.ndarray, requires_grad: bool = False) -> fusegrad.Tensor:
    return fusegrad.tensor(a, requires_grad=requires_grad)


def _np(t: fusegrad.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _copy_params(ours: nn.Module, theirs: object) -> None:
    """Copy fusegrad parameters into the torch module with the same parameter names."""
    import torch

    their_params = dict(theirs.named_parameters())  # type: ignore[attr-defined]
    our_params = dict(ours.named_parameters())
    assert set(their_params) == set(our_params)
    with torch.no_grad():
        for name, p in our_params.items():
            their_params[name].copy_(torch.from_numpy(_np(p).copy()))


def _compare_with_torch(
    ours: nn.Module,
    theirs: object,
    x: np.ndarray,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    int_input: bool = False,
) -> None:
    """Forward values, input gradient and every parameter gradient must agree."""
    import torch

    ours.double()
    theirs.double()  # type: ignore[attr-defined]
    _copy_params(ours, theirs)
    upstream = None
    xf = fusegrad.tensor(x) if int_input else _t(x, requires_grad=True)
    xt = torch.from_numpy(x.copy())
    if not int_input:
        xt.requires_grad_(True)
    out_f = ours(xf)
    out_t = theirs(xt)  # type: ignore[operator]
    np.testing.assert_allclose(_np(out_f), out_t.detach().numpy(), rtol=rtol, atol=atol)
    upstream = RNG.standard_normal(tuple(out_t.shape))
    (out_f * _t(upstream)).sum().backward()
    (out_t * torch.from_numpy(upstream)).sum().backward()
    if not int_input:
        np.testing.assert_allclose(_np(xf.grad), xt.grad.numpy(), rtol=rtol, atol=atol)
    their_params = dict(theirs.named_parameters())  # type: ignore[attr-defined]
    for name, p in ours.named_parameters():
        tp = their_params[name]
        if tp.grad is None:
            assert p.grad is None or not np.any(_np(p.grad))
            continue
        np.testing.assert_allclose(_np(p.grad), tp.grad.numpy(), rtol=rtol, atol=atol, err_msg=name)


# ---- numpy references --------------------------------------------------------------------------


def _conv2d_ref(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    stride: int,
    padding: int,
    dilation: int,
    groups: int,
) -> np.ndarray:
    n, _, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (h + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, oc, oh, ow))
    per_group = oc // groups
    for o in range(oc):
        g = o // per_group
        for i in range(oh):
            for j in range(ow):
                patch = xp[
                    :,
                    g * cg : (g + 1) * cg,
                    i * stride : i * stride + dilation * (kh - 1) + 1 : dilation,
                    j * stride : j * stride + dilation * (kw - 1) + 1 : dilation,
                ]
                out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3))
    if b is not None:
        out += b[None, :, None, None]
    return out


def _pool_ref(x: np.ndarray, k: int, s: int, p: int, reduce: str) -> np.ndarray:
    n, c, h, w = x.shape
    fill = -np.inf if reduce == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=fill)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * s : i * s + k, j * s : j * s + k]
            out[:, :, i, j] = win.max(axis=(2, 3)) if reduce == "max" else win.mean(axis=(2, 3))
    return out


# ---- Linear ------------------------------------------------------------------------------------


def test_linear_forward_matches_numpy():
    lin = nn.Linear(5, 3)
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    expected = x @ _np(lin.weight).T + _np(lin.bias)
    np.testing.assert_allclose(_np(lin(_t(x))), expected, rtol=1e-5, atol=1e-6)
    assert lin(_t(x[0])).shape == (3,)
    assert lin(_t(RNG.standard_normal((2, 6, 5)).astype(np.float32))).shape == (2, 6, 3)
    no_bias = nn.Linear(5, 3, bias=False)
    assert no_bias.bias is None and len(list(no_bias.parameters())) == 1


def test_linear_init_bounds_and_reproducibility():
    fusegrad.manual_seed(7)
    a = nn.Linear(100, 50)
    fusegrad.manual_seed(7)
    b = nn.Linear(100, 50)
    np.testing.assert_array_equal(_np(a.weight), _np(b.weight))
    bound = 1 / math.sqrt(100)  # kaiming_uniform_(a=sqrt(5)) == U(-1/sqrt(fan_in), ...)
    w = _np(a.weight)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.05 * bound
    assert np.abs(_np(a.bias)).max() <= bound
    assert a.weight.dtype == fusegrad.float32
    assert nn.Linear(2, 2, dtype=fusegrad.float64).weight.dtype == fusegrad.float64


def test_linear_against_torch():
    torch = pytest.importorskip("torch")
    _compare_with_torch(nn.Linear(6, 4), torch.nn.Linear(6, 4), RNG.standard_normal((3, 6)))
    _compare_with_torch(
        nn.Linear(6, 4, bias=False),
        torch.nn.Linear(6, 4, bias=False),
        RNG.standard_normal((2, 5, 6)),
    )


# ---- Conv2d ------------------------------------------------------------------------------------

CONV_CASES = [
    {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "bias": True},
    {"stride": 2, "padding": 1, "dilation": 1, "groups": 1, "bias": True},
    {"stride": 1, "padding": 2, "dilation": 2, "groups": 1, "bias": False},
    {"stride": 2, "padding": 1, "dilation": 1, "groups": 2, "bias": True},
    {"stride": 1, "padding": 1, "dilation": 1, "groups": 4, "bias": True},  # depthwise
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_forward_matches_numpy(case: dict):
    conv = nn.Conv2d(4, 8, 3, **case).double()
    x = RNG.standard_normal((2, 4, 7, 6))
    b = _np(conv.bias) if conv.bias is not None else None
    expected = _conv2d_ref(
        x, _np(conv.weight), b, case["stride"], case["padding"], case["dilation"], case["groups"]
    )
    np.testing.assert_allclose(_np(conv(_t(x))), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_against_torch(case: dict):
    torch = pytest.importorskip("torch")
    _compare_with_torch(
        nn.Conv2d(4, 8, 3, **case),
        torch.nn.Conv2d(4, 8, 3, **case),
        RNG.standard_normal((2, 4, 7, 6)),
    )


def test_conv2d_same_padding_rectangular_kernel_against_torch():
    torch = pytest.importorskip("torch")
    kw = {"kernel_size": (3, 5), "padding": "same", "bias": True}
    _compare_with_torch(
        nn.Conv2d(3, 2, **kw), torch.nn.Conv2d(3, 2, **kw), RNG.standard_normal((1, 3, 6, 7))
    )


def test_conv2d_shapes_init_and_errors():
    conv = nn.Conv2d(6, 4, (3, 2), groups=2)
    assert conv.weight.shape == (4, 3, 3, 2) and conv.bias.shape == (4,)
    bound = 1 / math.sqrt(3 * 3 * 2)
    assert np.abs(_np(conv.weight)).max() <= bound
    assert np.abs(_np(conv.bias)).max() <= bound
    assert conv(fusegrad.randn(6, 5, 5)).shape == (4, 3, 4)  # unbatched input
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.Conv2d(5, 4, 3, groups=2)
    with pytest.raises(ValueError, match="out_channels must be divisible by groups"):
        nn.Conv2d(4, 5, 3, groups=2)
    with pytest.raises(ValueError):
        conv(fusegrad.randn(1, 5, 5, 5))


# ---- pooling -----------------------------------------------------------------------------------


@pytest.mark.parametrize("k,s,p", [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_pooling_forward_matches_numpy(k: int, s: int, p: int):
    x = RNG.standard_normal((2, 3, 7, 8))
    np.testing.assert_allclose(_np(nn.MaxPool2d(k, s, p)(_t(x))), _pool_ref(x, k, s, p, "max"))
    np.testing.assert_allclose(
        _np(nn.AvgPool2d(k, s, p)(_t(x))), _pool_ref(x, k, s, p, "avg"), rtol=1e-12
    )


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": (2, 3), "stride": (1, 2)},
        {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    ],
)
def test_max_pool2d_against_torch(kw: dict):
    torch = pytest.importorskip("torch")
    _compare_with_torch(
        nn.MaxPool2d(**kw), torch.nn.MaxPool2d(**kw), RNG.standard_normal((2, 3, 7, 8))
    )


@pytest.mark.parametrize(
    "shape,kw",
    [
        ((2, 2, 6, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
        (
            (2, 7, 9),
            {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2},
        ),  # unbatched, dilated
    ],
)
def test_max_pool2d_return_indices_against_torch(shape: tuple, kw: dict):
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal(shape)
    out, idx = nn.MaxPool2d(**kw, return_indices=True)(_t(x))
    out_t, idx_t = torch.nn.MaxPool2d(**kw, return_indices=True)(torch.from_numpy(x))
    np.testing.assert_allclose(_np(out), out_t.numpy())
    np.testing.assert_array_equal(idx.numpy(), idx_t.numpy())


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
        {"kernel_size": 3, "stride": 2, "ceil_mode": True},
        {"kernel_size": 2, "divisor_override": 3},
    ],
)
def test_avg_pool2d_against_torch(kw: dict):
    torch = pytest.importorskip("torch")
    _compare_with_torch(
        nn.AvgPool2d(**kw), torch.nn.AvgPool2d(**kw), RNG.standard_normal((2, 3, 7, 8))
    )


# ---- LayerNorm, Embedding, Flatten, activations --------------------------------------------------


def test_layer_norm_matches_numpy_and_init():
    ln = nn.LayerNorm(6)
    assert np.all(_np(ln.weight) == 1) and np.all(_np(ln.bias) == 0)
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(_np(ln(_t(x))), expected, rtol=1e-4, atol=1e-5)
    plain = nn.LayerNorm((2, 3), elementwise_affine=False)
    assert list(plain.parameters()) == []
    with pytest.raises(ValueError):
        nn.LayerNorm(5)(fusegrad.randn(2, 6))


@pytest.mark.parametrize("shape,affine", [((6,), True), ((3, 4), True), ((4,), False)])
def test_layer_norm_against_torch(shape: tuple, affine: bool):
    torch = pytest.importorskip("torch")
    ours = nn.LayerNorm(shape, eps=1e-3, elementwise_affine=affine)
    theirs = torch.nn.LayerNorm(shape, eps=1e-3, elementwise_affine=affine)
    if affine:  # non-trivial affine parameters so their gradients mean something
        with fusegrad.no_grad():
            ours.weight.copy_(fusegrad.randn(*shape))
            ours.bias.copy_(fusegrad.randn(*shape))
    _compare_with_torch(ours, theirs, RNG.standard_normal((2, 3) + shape))


def test_embedding_lookup_init_and_padding():
    fusegrad.manual_seed(0)
    emb = nn.Embedding(1000, 8, padding_idx=2)
    w = _np(emb.weight)
    assert np.all(w[2] == 0)
    others = np.delete(w, 2, axis=0)
    assert abs(others.mean()) < 0.05 and abs(others.std() - 1) < 0.05  # N(0, 1) init
    idx = fusegrad.tensor([[1, 2, 3], [2, 2, 0]])
    out = emb(idx)
    np.testing.assert_array_equal(_np(out), w[idx.numpy()])
    out.sum().backward()
    grad = emb.weight.grad.numpy()
    assert np.all(grad[2] == 0)  # padding row gets no gradient
    np.testing.assert_array_equal(grad[1], np.ones(8))
    assert np.all(grad[4:] == 0)
    assert nn.Embedding(5, 2, padding_idx=-1).padding_idx == 4
    with pytest.raises(ValueError, match="Padding_idx must be within num_embeddings"):
        nn.Embedding(5, 2, padding_idx=5)


def test_embedding_against_torch():
    torch = pytest.importorskip("torch")
    ours, theirs = nn.Embedding(7, 3, padding_idx=1), torch.nn.Embedding(7, 3, padding_idx=1)
    idx = np.array([[0, 1, 2], [1, 6, 6]])
    _compare_with_torch(ours, theirs, idx, int_input=True)


def test_embedding_from_pretrained():
    weights = fusegrad.randn(4, 2)
    emb = nn.Embedding.from_pretrained(weights)
    assert not emb.weight.requires_grad
    np.testing.assert_array_equal(_np(emb(fusegrad.tensor([3]))), _np(weights)[[3]])
    assert nn.Embedding.from_pretrained(weights, freeze=False).weight.requires_grad


def test_flatten_and_identity():
    x = fusegrad.randn(2, 3, 4, 5)
    assert nn.Flatten()(x).shape == (2, 60)
    assert nn.Flatten(0, 1)(x).shape == (6, 4, 5)
    assert nn.Flatten(start_dim=2)(x).shape == (2, 3, 20)
    assert nn.Identity(54, unused="x")(x) is x
    assert nn.Unflatten(1, (3, 20))(nn.Flatten()(x)).shape == (2, 3, 20)


ACTIVATIONS = [
    (lambda: nn.ReLU(), lambda x: np.maximum(x, 0)),
    (lambda: nn.Tanh(), np.tanh),
    (lambda: nn.Sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
    (lambda: nn.SiLU(), lambda x: x / (1 + np.exp(-x))),
    (lambda: nn.LeakyReLU(0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    (lambda: nn.ELU(), lambda x: np.where(x > 0, x, np.expm1(x))),
    (
        lambda: nn.GELU(approximate="tanh"),
        lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    ),
    (
        lambda: nn.Softmax(dim=1),
        lambda x: (
            np.exp(x - x.max(1, keepdims=True))
            / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)
        ),
    ),
    (
        lambda: nn.LogSoftmax(dim=-1),
        lambda x: (
            x
            - x.max(-1, keepdims=True)
            - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
        ),
    ),
]


@pytest.mark.parametrize("make,ref", ACTIVATIONS)
def test_activation_modules_match_numpy(make, ref):
    x = RNG.standard_normal((4, 5)) * 3
    np.testing.assert_allclose(_np(make()(_t(x))), ref(x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("ReLU", {}),
        ("GELU", {}),
        ("GELU", {"approximate": "tanh"}),
        ("Tanh", {}),
        ("Sigmoid", {}),
        ("SiLU", {}),
        ("LeakyReLU", {"negative_slope": 0.1}),
        ("ELU", {}),
        ("Softplus", {"beta": 2.0}),
        ("Softmax", {"dim": 1}),
        ("LogSoftmax", {"dim": 0}),
        ("Mish", {}),
        ("ReLU6", {}),
    ],
)
def test_activations_against_torch(name: str, kwargs: dict):
    torch = pytest.importorskip("torch")
    _compare_with_torch(
        getattr(nn, name)(**kwargs),
        getattr(torch.nn, name)(**kwargs),
        RNG.standard_normal((3, 7)) * 4,
    )


def test_inplace_relu_module_writes_input():
    x = fusegrad.randn(10)
    y = nn.ReLU(inplace=True)(x)
    assert y is x and float(x.min()) >= 0


def test_softmax_without_dim_warns_and_uses_legacy_dim():
    x = fusegrad.randn(2, 3)
    with pytest.warns(UserWarning, match="Implicit dimension choice"):
        out = nn.Softmax()(x)
    np.testing.assert_allclose(_np(out).sum(1), np.ones(2), rtol=1e-6)


def test_small_cnn_end_to_end_against_torch():
    torch = pytest.importorskip("torch")

    def build(m):  # same architecture from either library
        return m.Sequential(
            m.Conv2d(1, 4, 3, padding=1),
            m.ReLU(),
            m.MaxPool2d(2),
            m.Conv2d(4, 4, 3, groups=2),
            m.GELU(),
            m.AvgPool2d(2),
            m.Flatten(),
            m.Linear(4, 3),
        )

    _compare_with_torch(build(nn), build(torch.nn), RNG.standard_normal((2, 1, 8, 8)))
