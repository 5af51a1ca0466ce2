"""The normalisation layers' fused kernels (``ops/norms.py``: ``norm_stats``, ``norm``,
``norm_backward``): values and gradients against numpy references and PyTorch over the
layouts, ranks, dtypes and affine options; gradcheck and gradgradcheck in float64; running
statistics as PyTorch moves them; the composite path (``fused_norm_kernels(False)``) agreeing;
hypothesis over shapes.  Compiled programs: tests/compiler/test_norm_kernels_compiled.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fusegrad as fg
from fusegrad import nn
from fusegrad.autograd import gradcheck, gradgradcheck
from fusegrad.ops.norms import fused_norm_kernels

F = nn.functional

try:
    import torch
except ImportError:  # pragma: no cover  (torch is optional)
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


# ---- numpy references ----------------------------------------------------------------------------


def _ref(x: np.ndarray, kind: str, arg: Any, w: Any, b: Any, eps: float) -> np.ndarray:
    """The normalisation in float64 numpy: ``arg`` is the normalised shape (layer), the group
    count (group), or unused."""
    if kind == "layer":
        axes = tuple(range(x.ndim - len(arg), x.ndim))
        xs = x
    elif kind == "batch":
        axes, xs = (0, *range(2, x.ndim)), x
    elif kind == "instance":
        axes, xs = tuple(range(2, x.ndim)), x
    else:
        xs, axes = x.reshape(x.shape[0], arg, -1), (2,)
    mean = xs.mean(axes, keepdims=True)
    var = xs.var(axes, keepdims=True)
    y = ((xs - mean) / np.sqrt(var + eps)).reshape(x.shape)
    shape = None if kind == "layer" else [1, -1] + [1] * (x.ndim - 2)
    if w is not None:
        y = y * (w if shape is None else w.reshape(shape))
    if b is not None:
        y = y + (b if shape is None else b.reshape(shape))
    return y


def _call(lib: Any, kind: str, x: Any, arg: Any, w: Any, b: Any, eps: float) -> Any:
    f = lib.nn.functional
    if kind == "layer":
        return f.layer_norm(x, arg, w, b, eps)
    if kind == "batch":
        return f.batch_norm(x, None, None, w, b, True, 0.1, eps)
    if kind == "instance":
        return f.instance_norm(x, None, None, w, b, True, 0.1, eps)
    return f.group_norm(x, arg, w, b, eps)


CASES = [
    ("layer", (6, 5), (5,)),
    ("layer", (2, 3, 4, 5), (4, 5)),
    ("layer", (7, 33), (33,)),  # a row length that is not a multiple of the partial sums
    ("batch", (4, 3), None),
    ("batch", (3, 2, 5), None),
    ("batch", (2, 3, 4, 3), None),
    ("batch", (2, 2, 2, 3, 2), None),
    ("instance", (2, 3, 7), None),
    ("instance", (2, 2, 3, 4), None),
    ("instance", (1, 2, 2, 2, 3), None),
    ("group", (2, 6, 5), 3),
    ("group", (3, 4), 2),
    ("group", (2, 4, 3, 3), 1),
    ("group", (2, 4, 2, 2, 2), 4),
]


def _params(kind: str, shape: tuple, arg: Any, rng: np.random.Generator) -> tuple:
    pshape = tuple(arg) if kind == "layer" else (shape[1],)
    return rng.uniform(0.5, 1.5, pshape), rng.standard_normal(pshape)


def _uses_kernel(out: fg.Tensor) -> bool:
    prim = getattr(out.grad_fn, "_prim", None)
    return prim is not None and prim.name == "norm"


@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
@pytest.mark.parametrize("kind,shape,arg", CASES)
def test_values_and_gradients_match_numpy(kind: str, shape: tuple, arg: Any, affine: str) -> None:
    rng = np.random.default_rng(len(shape) * 7 + shape[-1])
    x = rng.standard_normal(shape) * 3 + 1
    w, b = _params(kind, shape, arg, rng)
    w = w if affine in ("both", "weight") else None
    b = b if affine in ("both", "bias") else None
    g = rng.standard_normal(shape)
    leaves = [fg.tensor(v, requires_grad=True) for v in (x, w, b) if v is not None]
    xt = leaves[0]
    wt = fg.tensor(w, requires_grad=True) if w is not None else None
    bt = fg.tensor(b, requires_grad=True) if b is not None else None
    out = _call(fg, kind, xt, arg, wt, bt, 1e-5)
    assert _uses_kernel(out)
    np.testing.assert_allclose(out.detach().numpy(), _ref(x, kind, arg, w, b, 1e-5), 1e-10, 1e-12)
    (out * fg.tensor(g)).sum().backward()
    # the gradients by central differences of the numpy reference (float64)
    h = 1e-6

    def loss(xv: np.ndarray, wv: Any, bv: Any) -> float:
        return float((_ref(xv, kind, arg, wv, bv, 1e-5) * g).sum())

    def numeric(which: int) -> np.ndarray:
        values = [x, w, b]
        base = values[which]
        grad = np.zeros_like(base)
        for i in np.ndindex(base.shape):
            up, down = base.copy(), base.copy()
            up[i] += h
            down[i] -= h
            values[which] = up
            plus = loss(*values)
            values[which] = down
            minus = loss(*values)
            grad[i] = (plus - minus) / (2 * h)
        values[which] = base
        return grad

    np.testing.assert_allclose(xt.grad.numpy(), numeric(0), rtol=1e-5, atol=1e-6)
    if wt is not None:
        np.testing.assert_allclose(wt.grad.numpy(), numeric(1), rtol=1e-5, atol=1e-6)
    if bt is not None:
        np.testing.assert_allclose(bt.grad.numpy(), numeric(2), rtol=1e-5, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind,shape,arg", CASES)
def test_values_and_gradients_match_torch(kind: str, shape: tuple, arg: Any, dtype: str) -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 2 - 1).astype(dtype)
    w, b = (v.astype(dtype) for v in _params(kind, shape, arg, rng))
    g = rng.standard_normal(shape).astype(dtype)
    got, want = [], []
    for lib, out_list in ((fg, got), (torch, want)):
        make = fg.tensor if lib is fg else torch.tensor
        ts = [make(v, requires_grad=True) for v in (x, w, b)]
        out = _call(lib, kind, ts[0], arg, ts[1], ts[2], 1e-5)
        (out * make(g)).sum().backward()
        out_list += [out.detach().numpy()] + [t.grad.numpy() for t in ts]
    tol = (2e-5, 2e-5) if dtype == "float32" else (1e-11, 1e-12)
    for a, e in zip(got, want):
        assert a.dtype == e.dtype
        np.testing.assert_allclose(a, e, *tol)


@pytest.mark.parametrize("kind,shape,arg", CASES[::2])
def test_gradcheck_and_gradgradcheck(kind: str, shape: tuple, arg: Any) -> None:
    rng = np.random.default_rng(5)
    x = fg.tensor(rng.standard_normal(shape), requires_grad=True)
    w, b = (fg.tensor(v, requires_grad=True) for v in _params(kind, shape, arg, rng))

    def fn(xv: fg.Tensor, wv: fg.Tensor, bv: fg.Tensor) -> fg.Tensor:
        return _call(fg, kind, xv, arg, wv, bv, 1e-3)

    assert gradcheck(fn, (x, w, b))
    assert gradgradcheck(fn, (x, w, b))


def test_gradcheck_of_evaluation_mode_batch_norm() -> None:
    rng = np.random.default_rng(6)
    x = fg.tensor(rng.standard_normal((3, 4, 5)), requires_grad=True)
    w, b = (fg.tensor(v, requires_grad=True) for v in _params("batch", (3, 4), None, rng))
    rm, rv = fg.tensor(rng.standard_normal(4)), fg.tensor(rng.uniform(0.5, 2, 4))

    def fn(xv: fg.Tensor, wv: fg.Tensor, bv: fg.Tensor) -> fg.Tensor:
        return F.batch_norm(xv, rm, rv, wv, bv, False)

    assert gradcheck(fn, (x, w, b))
    assert gradgradcheck(fn, (x, w, b))
    with fg.no_grad():  # without a graph the fused kernel runs: the same values
        fused = F.batch_norm(x, rm, rv, w, b, False)
    np.testing.assert_allclose(fused.numpy(), fn(x, w, b).detach().numpy(), 1e-12, 1e-12)


@pytest.mark.parametrize("kind,shape,arg", CASES)
def test_composite_path_agrees(kind: str, shape: tuple, arg: Any) -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal(shape).astype(np.float32)
    w, b = (v.astype(np.float32) for v in _params(kind, shape, arg, rng))
    results = []
    for fused in (True, False):
        ts = [fg.tensor(v, requires_grad=True) for v in (x, w, b)]
        with fused_norm_kernels(fused):
            out = _call(fg, kind, ts[0], arg, ts[1], ts[2], 1e-5)
        assert _uses_kernel(out) == fused
        (out * out).sum().backward()
        results.append([out.detach().numpy()] + [t.grad.numpy() for t in ts])
    for a, e in zip(*results):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_composite_over_one_element_gives_the_kernels_bits(dtype: str) -> None:
    """A layer norm over one element: the composite (what compiled programs, CUDA and other
    dtypes run) gives the fused kernels' bits -- the shift forward (+0 before it, also for
    ``x = -0.0``, where ``x - mean`` gave -0; NaN for an infinite or NaN ``x``), and an input
    gradient of exactly +0, NaN where ``x`` or ``g`` is not finite (as PyTorch's, up to the
    rounding of a product its kernel contracts); differentiated again (``create_graph``), 0
    too.  Its backward multiplies by 0 only: the general form cancels a product against its
    rounded value, which compiled code contracts into an FMA (native fuzz seeds 3000330,
    1009234: 1e-14 in float64; tests/compiler/test_norm_kernels_compiled.py)."""
    values = [0.4034, -3.0, -0.0, 0.0, np.inf, -np.inf, np.nan]
    grads = [-0.134, 2.5, -0.0, np.inf, np.nan]
    x = np.array([[v] for v in values for _ in grads], dtype=dtype)
    g = np.array([[v] for _ in values for v in grads], dtype=dtype)
    w, b = np.array([0.7], dtype=dtype), np.array([0.2], dtype=dtype)
    results = []
    for fused in (True, False):
        ts = [fg.tensor(v, requires_grad=True) for v in (x, w)]
        with fused_norm_kernels(fused):
            out = F.layer_norm(ts[0], (1,), ts[1], fg.tensor(b))
            no_bias = F.layer_norm(ts[0].detach(), (1,))
        assert _uses_kernel(out) == fused
        out.backward(fg.tensor(g))
        results.append([out.detach().numpy(), no_bias.numpy()] + [t.grad.numpy() for t in ts])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_array_equal(got, want)
        zeros = want == 0
        np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))
    finite = np.isfinite(x) & np.isfinite(g)
    gx = results[1][2]
    assert not gx[finite].any() and np.isnan(gx[~finite]).all()
    if torch is not None:  # (0 too, or where its kernel contracts a product, its rounding)
        t = torch.tensor(x, requires_grad=True)
        torch.nn.functional.layer_norm(t, (1,), torch.tensor(w), torch.tensor(b)).backward(
            torch.tensor(g)
        )
        np.testing.assert_allclose(
            gx, t.grad.numpy(), rtol=0, atol=1e-4 if dtype == "float32" else 1e-12
        )
    # create_graph (the kernel's rule then takes the composite, ``norm_grads``): the input's
    # gradient, differentiated again, is 0 as well
    for fused in (True, False):
        t = fg.tensor(x[finite][:, None], requires_grad=True)
        with fused_norm_kernels(fused):
            out = F.layer_norm(t, (1,), fg.tensor(w, requires_grad=True))
            (gt,) = fg.autograd.grad(out, t, fg.tensor(g[finite][:, None]), create_graph=True)
            (ggt,) = fg.autograd.grad(gt.sum(), t, allow_unused=True, materialize_grads=True)
        assert not gt.detach().numpy().any() and not ggt.numpy().any()
        assert not np.signbit(gt.detach().numpy()).any()


@pytest.mark.parametrize("need", ["x", "w", "b", "wb", "xb"])
def test_only_the_wanted_gradients(need: str) -> None:
    rng = np.random.default_rng(9)
    x, w, b = rng.standard_normal((3, 4, 5)), rng.uniform(0.5, 1.5, 4), rng.standard_normal(4)
    ts = [fg.tensor(v, requires_grad=k in need) for v, k in zip((x, w, b), "xwb")]
    out = F.group_norm(ts[0], 2, ts[1], ts[2])
    out.backward(fg.ones_like(out) * 0.5 + out.detach())
    want = [fg.tensor(v, requires_grad=True) for v in (x, w, b)]
    ref = F.group_norm(want[0], 2, want[1], want[2])
    ref.backward(fg.ones_like(ref) * 0.5 + ref.detach())
    for t, r, k in zip(ts, want, "xwb"):
        if k in need:
            np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), 1e-12, 1e-12)
        else:
            assert t.grad is None


# ---- running statistics --------------------------------------------------------------------------


@needs_torch
@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
@pytest.mark.parametrize("cls,shape", [("BatchNorm1d", (6, 3)), ("BatchNorm2d", (4, 3, 5, 2)),
                                       ("BatchNorm3d", (2, 3, 2, 3, 2)),
                                       ("InstanceNorm1d", (4, 3, 6)),
                                       ("InstanceNorm2d", (2, 3, 4, 3))])  # fmt: skip
def test_running_statistics_follow_torch(cls: str, shape: tuple, momentum: Any) -> None:
    kwargs: dict = {"momentum": momentum}
    if cls.startswith("Instance"):
        kwargs.update(affine=True, track_running_stats=True)
    ours = getattr(nn, cls)(shape[1], **kwargs).double()
    theirs = getattr(torch.nn, cls)(shape[1], **kwargs).double()
    rng = np.random.default_rng(10)
    for _ in range(3):
        x = rng.standard_normal(shape) * 2 + 0.5
        a, b = ours(fg.tensor(x, requires_grad=True)), theirs(torch.tensor(x, requires_grad=True))
        assert _uses_kernel(a)
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), 1e-10, 1e-12)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            np.testing.assert_allclose(
                getattr(ours, name).numpy(), getattr(theirs, name).numpy(), 1e-12, 1e-14
            )
    ours.eval()
    theirs.eval()
    x = rng.standard_normal(shape)
    with fg.no_grad():
        a = ours(fg.tensor(x))
    np.testing.assert_allclose(a.numpy(), theirs(torch.tensor(x)).detach().numpy(), 1e-10, 1e-12)


def test_running_statistics_of_float32_match_the_composite() -> None:
    rng = np.random.default_rng(11)
    x = fg.tensor(rng.standard_normal((8, 3, 4, 4)).astype(np.float32) * 3 + 2)
    stats = []
    for fused in (True, False):
        rm, rv = fg.zeros(3), fg.ones(3)
        with fused_norm_kernels(fused):
            F.batch_norm(x, rm, rv, None, None, True, 0.2)
        stats.append((rm.numpy(), rv.numpy()))
    for a, e in zip(*stats):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


# ---- paths ---------------------------------------------------------------------------------------


def test_other_dtypes_and_forward_ad_use_the_composites() -> None:
    x = fg.randn(2, 3, 4, requires_grad=True)
    assert not _uses_kernel(F.layer_norm(x.half(), (4,)))
    w = fg.ones(4, dtype=fg.float64, requires_grad=True)
    assert not _uses_kernel(F.layer_norm(x, (4,), w))  # mixed dtypes: the composite promotes
    import fusegrad.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        dual = fwAD.make_dual(x.detach(), fg.ones_like(x))
        out = F.layer_norm(dual, (4,))
        tangent = fwAD.unpack_dual(out).tangent
    assert tangent is not None and tangent.shape == x.shape


def test_errors_leave_state_unchanged() -> None:
    rm, rv = fg.zeros(3), fg.ones(3)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        F.batch_norm(fg.randn(1, 3), rm, rv, training=True)
    assert rm.tolist() == [0.0] * 3 and rv.tolist() == [1.0] * 3
    with pytest.raises(RuntimeError, match="divisible by num_groups"):
        F.group_norm(fg.randn(2, 5, 3), 2)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(fg.randn(2, 5, 3), (5,))


# ---- hypothesis over shapes ---------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["layer", "batch", "instance", "group"]),
    batch=st.integers(1, 4),
    channels=st.sampled_from([1, 2, 4, 6]),
    spatial=st.lists(st.integers(1, 5), min_size=0, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_shapes_property(kind: str, batch: int, channels: int, spatial: list, seed: int) -> None:
    shape = (batch, channels, *spatial)
    count = {"batch": batch, "layer": 1, "instance": 1, "group": 1}[kind]
    for s in spatial:
        count *= s
    if kind in ("batch", "instance") and count <= 1 or kind == "batch" and batch * count <= 1:
        return
    arg = {"layer": tuple(shape[1:]), "group": 2 if channels % 2 == 0 else 1}.get(kind)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    w, b = _params(kind, shape, arg, rng)
    ts = [fg.tensor(v, requires_grad=True) for v in (x, w, b)]
    out = _call(fg, kind, ts[0], arg, ts[1], ts[2], 1e-5)
    np.testing.assert_allclose(out.detach().numpy(), _ref(x, kind, arg, w, b, 1e-5), 1e-9, 1e-10)
    (out * out).sum().backward()
    with fused_norm_kernels(False):
        refs = [fg.tensor(v, requires_grad=True) for v in (x, w, b)]
        ref = _call(fg, kind, refs[0], arg, refs[1], refs[2], 1e-5)
        (ref * ref).sum().backward()
    for t, r in zip(ts, refs):
        np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), 1e-8, 1e-9)


# ---- infinities and NaNs in a layer norm's backward: PyTorch's placement -------------------------


def _special_layer_norm_case(dtype: str, weight: str) -> tuple:
    """(x, w, b, g): rows of 5, an infinite bias element and a NaN one, rows holding an
    infinite or NaN input or gradient, and the last three finite; a row whose x elements'
    signs differ from those of x - mean (where PyTorch's uncentred sum and a centred one put
    their infinities apart).  ``weight`` "infinite": one weight element is +inf (every row's
    ``g w`` then holds one), and the first row is fuzz seed 301666's (x, g, w, b)."""
    rng = np.random.default_rng(301666)
    x = rng.standard_normal((10, 5))
    x[0, :3] = [-1.1387, 0.9702, 0.0248]
    x[1, 2] = np.inf
    x[2, 0] = np.nan
    x[3] = [0.4, 0.1, 0.3, 0.2, -0.05]  # (mean 0.19: x's and x - mean's signs differ)
    g = rng.standard_normal((10, 5))
    g[0, :3] = [0.839, -0.204, 0.594]
    g[4, 1] = np.inf
    g[5, 3] = -np.inf
    g[6, 0] = np.nan
    w = np.array([-0.1472, np.inf if weight == "infinite" else 0.7, -0.0993, 0.8, -1.2])
    b = np.array([0.1333, -0.6738, np.inf, np.nan, 0.5])
    return (*(a.astype(dtype) for a in (x, w, b, g)),)


def _torch_layer_norm_input_grad(x: np.ndarray, w: np.ndarray, g: np.ndarray) -> np.ndarray:
    """PyTorch's CPU layer norm input gradient (``layer_norm_kernel.cpp``), ``a g w + b x + c``
    per row with ``ds = sum(g w x)``, ``db = sum(g w)``, ``b = (db mean - ds) a^3 / N``, ``c =
    -b mean - db a / N``, ``a = rstd`` -- in float64, for where its infinities and NaNs fall."""
    x, w, g = (v.astype(np.float64) for v in (x, w, g))
    n = x.shape[-1]
    with np.errstate(all="ignore"):
        mean = x.mean(-1, keepdims=True)
        a = 1.0 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
        gw = g * w
        db = gw.sum(-1, keepdims=True)
        ds = (gw * x).sum(-1, keepdims=True)
        b = (db * mean - ds) * a * a * a / n
        c = -b * mean - db * a / n
        return a * gw + b * x + c


def _assert_same_specials(got: np.ndarray, want: np.ndarray) -> None:
    for test in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(test(got), test(want), err_msg=test.__name__)


@pytest.mark.parametrize("weight", ["infinite", "finite"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_norm_input_gradient_puts_infinities_and_nans_where_pytorch_does(
    dtype: str, weight: str
) -> None:
    """Where ``g w`` is not finite in a row, eager's kernel (and the composite it takes under
    ``create_graph``, ``ops.norms.norm_grads``) gives PyTorch's infinities and NaNs: its
    centred sum ``sum(g w (x - mean))`` put them by the signs of ``x - mean``, PyTorch's
    ``sum(g w x)`` by those of ``x`` (fuzz seed 301666's row: [nan, nan, inf]).  Finite rows
    keep their values (the composite path's, to rounding)."""
    x, w, b, g = _special_layer_norm_case(dtype, weight)
    want = _torch_layer_norm_input_grad(x, w, g)
    if torch is not None:
        t = torch.tensor(x, requires_grad=True)
        torch.nn.functional.layer_norm(t, (5,), torch.tensor(w), torch.tensor(b)).backward(
            torch.tensor(g)
        )
        _assert_same_specials(t.grad.numpy(), want)
    results = []
    for create_graph in (False, True):
        xt = fg.tensor(x, requires_grad=True)
        out = F.layer_norm(xt, (5,), fg.tensor(w, requires_grad=True), fg.tensor(b))
        assert _uses_kernel(out)
        out.backward(fg.tensor(g), create_graph=create_graph)
        results.append(xt.grad.detach().numpy())
    if weight == "infinite":
        assert np.isnan(results[0][0, :2]).all() and np.isposinf(results[0][0, 2])
    else:
        assert np.isfinite(results[0][7:]).all()  # (rows without infinities)
    for got in results:
        _assert_same_specials(got, want)
    finite = np.isfinite(results[0])
    np.testing.assert_allclose(
        results[1][finite], results[0][finite], rtol=1e-4 if dtype == "float32" else 1e-10
    )


# ---- statistics that overflow: the composites' products ----------------------------------------


@pytest.mark.parametrize(
    "kind,shape,arg",
    [("layer", (2, 3), (3,)), ("batch", (2, 2, 3), None), ("instance", (2, 2, 3), None),
     ("group", (2, 4, 3), 2)],
)  # fmt: skip
def test_the_composites_gradients_where_a_variance_overflows_are_the_kernels(
    kind: str, shape: tuple, arg: Any
) -> None:
    """A float32 statistic whose variance overflows (rstd 0) and whose ``g w (x - mean)``
    overflows float32 too: the kernels sum those products in float64, so its input gradient is
    0 (``inf * 0`` nowhere); the composite (taken under ``create_graph``, and by other dtypes,
    CUDA and compiled programs: ``fused_norm_kernels(False)``) formed them in float32 and gave
    NaN throughout the statistic (fuzz seed 304442, a layer norm compiled).  The weight's and
    bias's gradients too."""
    rng = np.random.default_rng(304442)
    x = rng.standard_normal(shape).astype(np.float32)
    w, b = (v.astype(np.float32) for v in _params(kind, shape, arg, rng))
    g = rng.standard_normal(shape).astype(np.float32)
    x.flat[0] = w.flat[0] = 1e30  # (x - mean and g w: about 1e30 each, the variance 1e59)
    results = []
    for fused, create_graph in ((True, False), (True, True), (False, False)):
        ts = [fg.tensor(v, requires_grad=True) for v in (x, w, b)]
        with fused_norm_kernels(fused):
            out = _call(fg, kind, ts[0], arg, ts[1], ts[2], 1e-5)
        assert _uses_kernel(out) == fused
        out.backward(fg.tensor(g), create_graph=create_graph)
        results.append([t.grad.detach().numpy() for t in ts])
    assert all(np.isfinite(r).all() for r in results[0])
    for got in results[1:]:
        for a, e in zip(got, results[0]):
            _assert_same_specials(a, e)
            # (the finite statistics' gradients cancel terms of 1e30: their rounding is
            # relative to the largest, as the fuzz checker's floor)
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5 * np.abs(e).max())
