"""The fused ``log_softmax`` and ``nll_loss`` primitives (``ops/classification.py``) through
``F.log_softmax``, ``F.nll_loss`` and ``F.cross_entropy``: values and gradients against PyTorch
(skipped without it) and against the composites (what a forward-AD level runs), over dims,
reductions, weights, ``ignore_index``, spatial targets, 1-D inputs and special values;
gradcheck and gradgradcheck (the rules' op-surface form) in float64; PyTorch's node names and
errors; compiled backwards equal to eager."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from primitive_names import PrimitiveNames as _Recorder

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import compiler
from fusegrad.autograd import forward_ad as fwAD
from fusegrad.autograd import tracer
from fusegrad.autograd.gradcheck import gradcheck, gradgradcheck

try:
    import torch as _torch
except ImportError:  # pragma: no cover - torch is optional
    _torch = None

needs_torch = pytest.mark.skipif(_torch is None, reason="PyTorch not installed")
_TOL = {"float64": (1e-10, 1e-12), "float32": (2e-5, 2e-6)}


# (input shape, target shape or None for log_softmax alone, keyword arguments)
_CASES = [
    ((6, 5), (6,), {}),
    ((6, 5), (6,), {"reduction": "sum"}),
    ((6, 5), (6,), {"reduction": "none"}),
    ((6, 5), (6,), {"weight": True}),
    ((6, 5), (6,), {"weight": True, "reduction": "none", "ignore_index": 2}),
    ((7,), (), {}),  # unbatched
    ((7,), (), {"reduction": "none"}),
    ((3, 4, 2, 5), (3, 2, 5), {}),  # spatial targets (nll_loss2d)
    ((3, 4, 6), (3, 6), {"weight": True, "ignore_index": 1, "reduction": "sum"}),
    ((4, 3), (4,), {"label_smoothing": 0.2}),
]


def _ids(case: tuple) -> str:
    return f"{case[0]}-{'-'.join(f'{k}={v}' for k, v in case[2].items())}"


def _arrays(case: tuple, seed: int) -> tuple:
    xs, ts, kwargs = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs) * 2.0
    classes = xs[0] if len(xs) == 1 else xs[1]
    t = rng.integers(0, classes, ts)
    if "ignore_index" in kwargs and t.ndim:
        t.flat[::3] = kwargs["ignore_index"]
    w = rng.uniform(0.2, 2.0, classes) if kwargs.get("weight") else None
    return x, t, w


def _run(lib: Any, case: tuple, arrays: tuple, dtype: str, composite: bool = False) -> tuple:
    """The loss and the input's gradient of ``sum(loss * weights)``, in ``lib``."""
    x, t, w = arrays
    kwargs = {k: v for k, v in case[2].items() if k != "weight"}
    dt = getattr(lib, dtype)
    xt = lib.tensor(x, dtype=dt, requires_grad=True)
    wt = None if w is None else lib.tensor(w, dtype=dt)
    if composite:
        with fwAD.dual_level():
            loss = F.cross_entropy(xt, fg.tensor(t), weight=wt, **kwargs)
    else:
        loss = lib.nn.functional.cross_entropy(xt, lib.tensor(t), weight=wt, **kwargs)
    cot = np.random.default_rng(11).standard_normal(tuple(loss.shape))
    (loss * lib.tensor(cot, dtype=dt)).sum().backward()
    return loss.detach().numpy(), xt.grad.numpy()


def _close(got: tuple, want: tuple, dtype: str) -> None:
    rtol, atol = _TOL[dtype]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", _CASES, ids=_ids)
def test_cross_entropy_matches_torch(case: tuple, dtype: str) -> None:
    arrays = _arrays(case, 0)
    rec = _Recorder()
    with tracer.tracing(rec):
        got = _run(fg, case, arrays, dtype)
    assert {"log_softmax", "nll_loss"} <= rec.names, rec.names  # the primitives ran
    _close(got, _run(_torch, case, arrays, dtype), dtype)


@pytest.mark.parametrize("case", _CASES, ids=_ids)
def test_cross_entropy_matches_the_composite(case: tuple) -> None:
    arrays = _arrays(case, 1)
    _close(_run(fg, case, arrays, "float64"), _run(fg, case, arrays, "float64", True), "float64")


@needs_torch
@pytest.mark.parametrize("dim", [0, 1, -1, 2])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_log_softmax_along_any_dim_matches_torch(dim: int, dtype: str) -> None:
    x = np.random.default_rng(2).standard_normal((3, 4, 5)) * 3.0
    g = np.random.default_rng(3).standard_normal((3, 4, 5))
    results = []
    for lib in (fg, _torch):
        xt = lib.tensor(x, dtype=getattr(lib, dtype), requires_grad=True)
        out = lib.nn.functional.log_softmax(xt, dim)
        out.backward(lib.tensor(g, dtype=getattr(lib, dtype)))
        results.append((out.detach().numpy(), xt.grad.numpy(), out.grad_fn.name()))
    _close(results[0][:2], results[1][:2], dtype)
    assert results[0][2] == results[1][2] == "LogSoftmaxBackward0"


@needs_torch
def test_special_values_as_pytorch() -> None:
    """A row holding inf or only -inf is NaN throughout (PyTorch's kernel: x - max - log(sum
    exp(x - max))); an ignored target contributes 0 whatever the input holds there; every
    target ignored: NaN mean loss, zero gradient."""
    inf = float("inf")
    x = np.array([[inf, 1.0, 0.0], [-inf, -inf, -inf], [0.5, -inf, 2.0], [np.nan, 0.0, 1.0]])
    for lib in (fg, _torch):
        out = lib.nn.functional.log_softmax(lib.tensor(x), 1).numpy()
        if lib is fg:
            got = out
        else:
            np.testing.assert_array_equal(np.isnan(got), np.isnan(out))
            np.testing.assert_array_equal(got[np.isfinite(out)], out[np.isfinite(out)])
    x = np.array([[inf, 1.0], [0.5, 2.0]])
    results = []
    for lib in (fg, _torch):
        for t, reduction in (([-100, 1], "none"), ([-100, -100], "mean"), ([-100, 1], "sum")):
            xt = lib.tensor(x, requires_grad=True)
            loss = lib.nn.functional.nll_loss(xt, lib.tensor(t), reduction=reduction)
            loss.sum().backward()
            results.append((loss.detach().numpy(), xt.grad.numpy()))
    for (a, ga), (b, gb) in zip(results[:3], results[3:]):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ga, gb)


@pytest.mark.parametrize("case", _CASES[::2], ids=_ids)
def test_gradcheck_and_gradgradcheck(case: tuple) -> None:
    x, t, w = _arrays(case, 4)
    kwargs = {k: v for k, v in case[2].items() if k != "weight"}
    wt = None if w is None else fg.tensor(w)

    def fn(xt: fg.Tensor) -> fg.Tensor:
        return F.cross_entropy(xt, fg.tensor(t), weight=wt, **kwargs)

    leaf = fg.tensor(x, requires_grad=True)
    assert gradcheck(fn, [leaf])
    assert gradgradcheck(fn, [leaf])
    assert gradgradcheck(lambda xt: F.log_softmax(xt, -1), [leaf])


@needs_torch
def test_node_names_and_edges_as_pytorch() -> None:
    """``NllLossBackward0`` (``NllLoss2DBackward0`` with spatial dims) on
    ``LogSoftmaxBackward0``; PyTorch views a 3-d input as 4-d first (a ``ViewBackward0`` in
    between), fusegrad does not."""
    for shape, target in (((4, 3), (4,)), ((2, 3, 5, 2), (2, 5, 2)), ((3,), ())):
        names = []
        for lib in (fg, _torch):
            x = lib.zeros(shape, requires_grad=True)
            loss = lib.nn.functional.cross_entropy(x, lib.zeros(target, dtype=lib.int64))
            inner = [n.name() for n, _ in loss.grad_fn.next_functions if n is not None]
            names.append((loss.grad_fn.name(), inner))
        assert names[0] == names[1], names


def test_a_target_out_of_range_raises_pytorchs_error() -> None:
    x = fg.zeros((3, 4), requires_grad=True)
    for bad in ([0, 4, 1], [0, -3, 1]):
        with pytest.raises(IndexError, match=r"nll_loss: Target (4|-3) is out of bounds"):
            F.cross_entropy(x, fg.tensor(bad))
    assert x.grad is None


def test_a_weight_that_requires_grad_runs_the_composite() -> None:
    x = fg.tensor(np.random.default_rng(5).standard_normal((4, 3)), requires_grad=True)
    w = fg.tensor([0.5, 1.0, 2.0], dtype=fg.float64, requires_grad=True)
    F.cross_entropy(x, fg.tensor([0, 1, 2, 1]), weight=w).backward()
    assert w.grad is not None and x.grad is not None


@pytest.mark.parametrize("mode", ["default", "debug"])
def test_compiled_backward_equals_eager(mode: str) -> None:
    """A compiled backward of an eager cross-entropy graph: both rules as composite ops, which
    the compiler fuses with the rest."""
    compiler.config.background_compile = False
    rng = np.random.default_rng(6)
    x, t = rng.standard_normal((5, 7)).astype(np.float32), rng.integers(0, 7, 5)
    t[1] = -100
    grads = []
    for compiled in (False, True, True):
        xt = fg.tensor(x, requires_grad=True)
        loss = F.cross_entropy(xt * 2.0, fg.tensor(t), label_smoothing=0.1)
        if compiled:
            with compiler.compiled_autograd(mode=mode):
                loss.backward()
        else:
            loss.backward()
        grads.append(xt.grad.numpy())
    assert compiler.counters.compiled_runs >= 1
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads[2], grads[0], rtol=1e-5, atol=1e-7)


def test_forward_ad_of_the_primitives_equals_the_composites() -> None:
    """With a dual level the surface runs the composites; the primitives' own JVP rules (a
    direct ``registry.apply``) give the same tangent."""
    from fusegrad.ops.registry import REGISTRY, apply

    rng = np.random.default_rng(7)
    x, t = fg.tensor(rng.standard_normal((3, 4))), fg.tensor(rng.standard_normal((3, 4)))
    target, w = fg.tensor([0, 3, -100]), fg.tensor(rng.uniform(0.5, 2.0, 4))
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        out = apply(REGISTRY["log_softmax"], (d,), {"dim": 1})
        loss = apply(
            REGISTRY["nll_loss"],
            (out, target, w),
            {"ignore_index": -100, "reduction": "mean", "weighted": True},
        )
        want = F.cross_entropy(d, target, weight=w)
        got_t, want_t = fwAD.unpack_dual(loss).tangent, fwAD.unpack_dual(want).tangent
        lsm_t = fwAD.unpack_dual(out).tangent
        want_lsm = fwAD.unpack_dual(F.log_softmax(d, 1)).tangent
    np.testing.assert_allclose(got_t.numpy(), want_t.numpy(), rtol=1e-12)
    np.testing.assert_allclose(lsm_t.numpy(), want_lsm.numpy(), rtol=1e-12, atol=1e-14)


@needs_torch
def test_the_composites_give_pytorchs_special_values_too() -> None:
    """What compiled programs and forward AD run: the same NaN where a row holds inf, and 0
    for an ignored target whatever the input holds there."""
    inf = float("inf")
    x = np.array([[inf, 1.0, 0.0], [-inf, -inf, -inf], [0.5, -inf, 2.0]])
    want = _torch.log_softmax(_torch.tensor(x), 1).numpy()
    with fwAD.dual_level():
        got = F.log_softmax(fg.tensor(x), 1).numpy()
        loss = F.nll_loss(
            fg.tensor([[inf, 1.0], [0.5, 2.0]]), fg.tensor([-100, 1]), reduction="none"
        )
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isfinite(want)], want[np.isfinite(want)])
    np.testing.assert_array_equal(loss.numpy(), [0.0, -2.0])


@needs_torch
def test_amax_over_a_nonempty_dim_of_an_empty_tensor() -> None:
    """``amax``/``amin`` of a (0, 5) tensor over dim 1 is empty (its check called this
    module's ``any`` reduction on a generator and raised TypeError); over dim 0 it raises
    PyTorch's error; log_softmax of such a tensor is empty too."""
    for name in ("amax", "amin"):
        got = getattr(fg, name)(fg.zeros((0, 5)), 1)
        assert tuple(got.shape) == tuple(getattr(_torch, name)(_torch.zeros(0, 5), 1).shape)
        with pytest.raises(RuntimeError, match="Expected reduction dim"):
            getattr(fg, name)(fg.zeros((0, 5)), 0)
    assert tuple(F.log_softmax(fg.zeros((0, 5)), 1).shape) == (0, 5)
