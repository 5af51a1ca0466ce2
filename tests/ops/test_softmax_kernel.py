"""The fused ``softmax`` primitive (``ops/classification.py``) and its one-node composite
(``autograd.native.Softmax``, what runs where the primitive does not: other dtypes, 0-d and
empty inputs, CUDA, compiled recordings): the values of the composite that ``softmax`` was
before (``ops.reduction._softmax_composite``) to the bit, over dims, layouts, ``dtype=``,
0-d and empty inputs and slices holding inf or NaN; values and gradients against numpy and
PyTorch (skipped without it); gradcheck and gradgradcheck in float64 on both paths; the
backward kernel against its op-surface form; the primitives' forward-mode and batching rules;
compiled backwards equal to eager."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
from primitive_names import PrimitiveNames as _Recorder

import fusegrad as fg
from fusegrad import compiler
from fusegrad.autograd import forward_ad as fwAD
from fusegrad.autograd import tracer
from fusegrad.autograd.gradcheck import gradcheck, gradgradcheck
from fusegrad.func import vmap
from fusegrad.ops import reduction
from fusegrad.ops.classification import softmax_grad
from fusegrad.ops.registry import REGISTRY, apply

try:
    import torch as _torch
except ImportError:  # pragma: no cover - torch is optional
    _torch = None

needs_torch = pytest.mark.skipif(_torch is None, reason="PyTorch not installed")
_TOL = {"float64": (1e-12, 1e-14), "float32": (2e-6, 1e-7)}
_INF, _NAN = float("inf"), float("nan")
# rows with the values a shift by the maximum has to get right
_SPECIAL = np.array(
    [
        [_INF, 1.0, 0.0],
        [-_INF, -_INF, -_INF],
        [0.5, -_INF, 2.0],
        [_NAN, 0.0, 1.0],
        [_INF, _INF, 1.0],
        [-_INF, 0.0, -_INF],
        [1e30, -1e30, 0.0],
        [88.0, 89.0, 90.0],
        [-0.0, 0.0, -0.0],
    ]
)


class _Composites(_Recorder):
    """A tracer that asks for composites, as a compiler's recording does: ``softmax`` then
    runs its composite inside one node (``autograd.native.Softmax``) in eager mode."""

    prefers_composites = True


def _bits(t: fg.Tensor) -> bytes:
    data = t.detach().numpy()
    return data.dtype.str.encode() + repr(data.shape).encode() + data.tobytes()


def _layouts(dtype: str) -> list:
    """(tensor, dim) pairs: dims of 1-4 d inputs, short and long rows, transposed and strided
    views, large magnitudes (exp overflows without the shift) and the special rows."""
    rng = np.random.default_rng(0)
    dt = getattr(fg, dtype)

    def t(shape: tuple, scale: float = 4.0) -> fg.Tensor:
        return fg.tensor(rng.standard_normal(shape) * scale, dtype=dt)

    cases = [(t((5,)), 0), (t((3, 4)), 1), (t((3, 4)), 0), (t((2, 3, 5)), -2)]
    cases += [(t((8, 4, 32, 32)), -1), (t((8, 4, 32, 32)), 1), (t((40, 300)), 1)]
    cases += [(t((6, 7)).T, 1), (t((6, 7)).T, 0), (t((4, 9))[:, ::2], 1)]
    cases += [(t((3, 5), 400.0), 1), (t((64, 33)).transpose(0, 1), -1)]
    special = fg.tensor(_SPECIAL, dtype=dt)
    cases += [(special, 1), (special, 0), (special.T, 0)]
    return cases


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_fused_primitive_gives_the_composites_bits(dtype: str) -> None:
    """What ``softmax`` computed before it had a primitive, bit for bit: the composite's
    operations in its order (``amax``, the non-finite maxima replaced by 0, ``exp(x - m)``,
    its sum, the division)."""
    for x, dim in _layouts(dtype):
        leaf = x.detach().requires_grad_(True)
        rec = _Recorder()
        with tracer.tracing(rec):
            got = fg.softmax(leaf, dim)
        assert "softmax" in rec.names and "div" not in rec.names, rec.names
        assert got.grad_fn.name() == "SoftmaxBackward0"
        want = reduction._softmax_composite(x, dim % x.ndim)
        assert _bits(got) == _bits(want), (tuple(x.shape), dim)
        # what a forward-AD level runs (the composite, no node of its own) agrees too
        with fwAD.dual_level():
            assert _bits(fg.softmax(x, dim)) == _bits(want)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_dtype_0d_and_empty_inputs_keep_the_composites_values(requires_grad: bool) -> None:
    """``dtype=`` casts first; a 0-d input is 1 (NaN for a non-finite one) and an empty one
    empty, each through the composite (in one ``SoftmaxBackward0`` node where a graph is
    recorded); float16 runs the composite too."""
    rng = np.random.default_rng(1)
    ints = fg.tensor(rng.integers(-5, 5, (3, 4)))
    got = fg.softmax(ints, 1, dtype=fg.float32)
    assert got.dtype == fg.float32
    assert _bits(got) == _bits(reduction._softmax_composite(ints.to(fg.float32), 1))
    x = fg.tensor(rng.standard_normal((3, 4)), dtype=fg.float32, requires_grad=requires_grad)
    got = fg.softmax(x, 0, dtype=fg.float64)
    assert got.dtype == fg.float64
    assert _bits(got) == _bits(reduction._softmax_composite(x.detach().double(), 0))
    for value, want in ((2.5, 1.0), (-_INF, _NAN), (_INF, _NAN), (_NAN, _NAN)):
        for dt in (fg.float32, fg.float64, fg.float16):
            x = fg.tensor(value, dtype=dt, requires_grad=requires_grad)
            got = fg.softmax(x, 0)
            np.testing.assert_array_equal(got.detach().numpy(), np.array(want, dt.np))
            assert _bits(got) == _bits(reduction._softmax_composite(x.detach(), None))
            assert (got.grad_fn is not None) == requires_grad
    for shape, dim in (((0, 3), 1), ((0, 3), 0), ((2, 0, 4), -1)):
        x = fg.zeros(shape, requires_grad=requires_grad)
        got = fg.softmax(x, dim)
        assert tuple(got.shape) == shape
        if requires_grad:
            assert got.grad_fn.name() == "SoftmaxBackward0"
            got.sum().backward()
            assert tuple(x.grad.shape) == shape
    half = fg.tensor(rng.standard_normal((3, 5)), dtype=fg.float16, requires_grad=requires_grad)
    assert _bits(fg.softmax(half, 1)) == _bits(reduction._softmax_composite(half.detach(), 1))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_composite_node_gives_the_composites_bits(dtype: str) -> None:
    """Where a recording asks for composites, ``softmax`` is one ``SoftmaxBackward0`` node
    whose forward is the composite: the same bits again."""
    for x, dim in _layouts(dtype):
        leaf = x.detach().requires_grad_(True)
        rec = _Composites()
        with tracer.tracing(rec):
            got = fg.softmax(leaf, dim)
        assert "softmax" not in rec.names and "div" in rec.names, rec.names
        assert got.grad_fn.name() == "SoftmaxBackward0"
        assert _bits(got) == _bits(reduction._softmax_composite(x, dim % x.ndim))


def _reference(x: np.ndarray, dim: int) -> tuple:
    """Softmax and the gradient of ``sum(softmax * c)`` for a fixed ``c``, in float64 numpy,
    written from the definitions (the Jacobian ``diag(s) - s s^T`` along ``dim``)."""
    s = np.exp(x - x.max(axis=dim, keepdims=True))
    s /= s.sum(axis=dim, keepdims=True)
    c = np.cos(np.arange(x.size, dtype=np.float64)).reshape(x.shape)
    moved_s, moved_c = np.moveaxis(s, dim, -1), np.moveaxis(c, dim, -1)
    jac = np.einsum("...i,ij->...ij", moved_s, np.eye(x.shape[dim]))
    jac -= moved_s[..., :, None] * moved_s[..., None, :]
    grad = np.einsum("...ij,...i->...j", jac, moved_c)
    return s, c, np.moveaxis(grad, -1, dim)


@pytest.mark.parametrize("composite", [False, True], ids=["fused", "composite"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_values_and_gradients_match_numpy(dtype: str, composite: bool) -> None:
    rng = np.random.default_rng(2)
    for shape, dim in (((4, 6), 1), ((4, 6), 0), ((2, 3, 5), 1), ((7,), 0)):
        x = rng.standard_normal(shape) * 3.0
        want, c, want_grad = _reference(x, dim)
        leaf = fg.tensor(x, dtype=getattr(fg, dtype), requires_grad=True)
        with tracer.tracing(_Composites() if composite else _Recorder()):
            out = fg.softmax(leaf, dim)
        (out * fg.tensor(c, dtype=leaf.dtype)).sum().backward()
        rtol, atol = _TOL[dtype]
        np.testing.assert_allclose(out.detach().numpy(), want, rtol=rtol, atol=atol)
        np.testing.assert_allclose(leaf.grad.numpy(), want_grad, rtol=10 * rtol, atol=atol)


@needs_torch
@pytest.mark.parametrize("dim", [0, 1, -1, 2])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_values_gradients_and_node_match_torch(dim: int, dtype: str) -> None:
    x = np.random.default_rng(3).standard_normal((3, 4, 5)) * 3.0
    g = np.random.default_rng(4).standard_normal((3, 4, 5))
    results = []
    for lib in (fg, _torch):
        xt = lib.tensor(x, dtype=getattr(lib, dtype), requires_grad=True)
        out = lib.nn.functional.softmax(xt, dim)
        out.backward(lib.tensor(g, dtype=getattr(lib, dtype)))
        results.append((out.detach().numpy(), xt.grad.numpy(), out.grad_fn.name()))
    rtol, atol = _TOL[dtype]
    for a, b in zip(results[0][:2], results[1][:2]):
        np.testing.assert_allclose(a, b, rtol=10 * rtol, atol=atol)
    assert results[0][2] == results[1][2] == "SoftmaxBackward0"


@needs_torch
@pytest.mark.parametrize("composite", [False, True], ids=["fused", "composite"])
def test_special_values_against_torch(composite: bool) -> None:
    """Values and gradients are PyTorch's, NaN included: a slice holding +inf is NaN
    throughout, as PyTorch's kernel gives (the shift by an infinite maximum)."""
    g = np.tile(np.array([0.0, 1.0, 2.0]), (_SPECIAL.shape[0], 1))
    results = []
    for lib in (fg, _torch):
        xt = lib.tensor(_SPECIAL, requires_grad=True)
        with tracer.tracing(_Composites() if composite and lib is fg else _Recorder()):
            out = lib.softmax(xt, 1)
        out.backward(lib.tensor(g))
        results.append((out.detach().numpy(), xt.grad.numpy()))
    (ours, our_grad), (theirs, their_grad) = results
    np.testing.assert_allclose(our_grad, their_grad, rtol=1e-14, atol=0)  # (NaN where NaN)
    np.testing.assert_allclose(ours, theirs, rtol=1e-14, atol=0)  # (NaN where NaN)
    assert np.isnan(ours[np.isposinf(_SPECIAL).any(axis=1)]).all()


@pytest.mark.parametrize("composite", [False, True], ids=["fused", "composite"])
def test_gradcheck_and_gradgradcheck(composite: bool) -> None:
    """First order runs the backward kernel (fused) or the node's op-surface backward;
    second order differentiates the op-surface form (``create_graph``)."""
    rng = np.random.default_rng(5)
    for shape, dim in (((3, 4), 1), ((3, 4), 0), ((2, 3, 2), -2), ((), 0), ((5,), 0)):
        leaf = fg.tensor(rng.standard_normal(shape), dtype=fg.float64, requires_grad=True)

        def fn(x: fg.Tensor, dim: int = dim) -> fg.Tensor:
            return fg.softmax(x, dim)

        with tracer.tracing(_Composites() if composite else _Recorder()):
            assert gradcheck(fn, [leaf])
            assert gradgradcheck(fn, [leaf])


def test_the_backward_kernel_is_its_op_surface_form_to_the_bit() -> None:
    rng = np.random.default_rng(6)
    for dt in (np.float32, np.float64):
        for shape, dim in (((8, 4, 32, 32), 3), ((8, 4, 32, 32), 1), ((5, 7), 0), ((300,), 0)):
            g = fg.tensor(rng.standard_normal(shape).astype(dt))
            out = fg.softmax(fg.tensor(rng.standard_normal(shape).astype(dt)), dim)
            kernel = apply(REGISTRY["softmax_backward"], (g, out), {"dim": dim})
            assert _bits(kernel) == _bits(softmax_grad(g, out, dim)), (dt, shape, dim)


def test_forward_ad_of_the_primitive_equals_the_composites() -> None:
    """With a dual level the surface runs the composite; the primitive's own JVP rule (a
    direct ``registry.apply``) gives the same tangent."""
    rng = np.random.default_rng(7)
    x, t = fg.tensor(rng.standard_normal((3, 4))), fg.tensor(rng.standard_normal((3, 4)))
    for dim in (0, 1):
        with fwAD.dual_level():
            d = fwAD.make_dual(x, t)
            got = fwAD.unpack_dual(apply(REGISTRY["softmax"], (d,), {"dim": dim})).tangent
            want = fwAD.unpack_dual(fg.softmax(d, dim)).tangent
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_vmap_batches_the_primitives_without_a_loop(monkeypatch: Any, name: str) -> None:
    """``softmax`` and ``log_softmax`` and their backward primitives under ``vmap`` run once on
    the whole batch (their batching rules), batched and unbatched operands alike, and equal a
    loop over samples."""

    def no_loop(prim: Any, *args: Any) -> Any:
        raise AssertionError(f"{prim.name} was computed sample by sample")

    monkeypatch.setattr(sys.modules["fusegrad.func.vmap"], "loop", no_loop)
    op = getattr(fg, name)
    rng = np.random.default_rng(8)
    x = fg.tensor(rng.standard_normal((4, 3, 5)))
    for dim in (0, 1, -1):
        got = vmap(lambda s, dim=dim: op(s, dim))(x)
        want = np.stack([op(x[b], dim).numpy() for b in range(4)])
        np.testing.assert_array_equal(got.numpy(), want)
    out = op(fg.tensor(rng.standard_normal((3, 5))), 1)
    g = fg.tensor(rng.standard_normal((4, 3, 5)))
    prim = REGISTRY[f"{name}_backward"]
    for operands, in_dims in (((g, out), (0, None)), ((g, op(g, -1)), (0, 0))):
        got = vmap(lambda a, b: apply(prim, (a, b), {"dim": -1}), in_dims=in_dims)(*operands)
        samples = [[o[b] if d == 0 else o for o, d in zip(operands, in_dims)] for b in range(4)]
        want = np.stack([apply(prim, tuple(s), {"dim": 1}).numpy() for s in samples])
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("mode", ["default", "debug"])
def test_compiled_backward_equals_eager(mode: str) -> None:
    """A compiled backward of an eager graph through the fused primitive: the rule in the op
    surface, which the compiler fuses with the rest."""
    compiler.config.background_compile = False
    rng = np.random.default_rng(9)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    w = fg.tensor(rng.standard_normal((5, 7)).astype(np.float32))
    grads = []
    runs = compiler.counters.compiled_runs
    for compiled in (False, True, True):
        xt = fg.tensor(x, requires_grad=True)
        loss = (fg.softmax(xt * 2.0, -1) * w).sum()
        assert loss.grad_fn.next_functions[0][0].next_functions[0][0].name() == "SoftmaxBackward0"
        if compiled:
            with compiler.compiled_autograd(mode=mode):
                loss.backward()
        else:
            loss.backward()
        grads.append(xt.grad.numpy())
    assert compiler.counters.compiled_runs == runs + 2
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads[2], grads[0], rtol=1e-5, atol=1e-7)
