"""Complex numbers (docs/complex.md): dtypes and promotion, printing, the complex op surface
(real/imag views, conj, abs, angle, polar, complex, view_as_real/view_as_complex), PyTorch's
gradient convention on complex leaves (gradients and gradcheck/gradgradcheck), forward AD, the
ops PyTorch refuses for complex tensors, and the compiler's fallback with its reason.

Values and gradients are compared with PyTorch when it is importable, else with numpy and
closed forms."""

from __future__ import annotations

import itertools
import pathlib
import re
import warnings

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import dtypes as D
from fusegrad.autograd import gradcheck, gradgradcheck
from fusegrad.errors import ComplexNotSupported

try:
    import torch
except ImportError:  # pragma: no cover - the cross-checks skip
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not importable")

RNG = np.random.default_rng(29)
Z = RNG.standard_normal((3, 4)) + 1j * RNG.standard_normal((3, 4))

# ---- dtypes and promotion -------------------------------------------------------------------


def test_dtype_records():
    assert fg.complex64.is_complex and fg.complex128.is_complex
    assert not fg.complex64.is_floating_point
    assert fg.cfloat is fg.complex64 and fg.cdouble is fg.complex128
    assert fg.complex64.to_real() is fg.float32 and fg.complex128.to_real() is fg.float64
    assert fg.float64.to_complex() is fg.complex128 and fg.float16.to_complex() is fg.complex64
    assert D.as_dtype(np.complex64) is fg.complex64 and D.as_dtype("cdouble") is fg.complex128
    assert fg.tensor(Z).is_complex() and fg.is_complex(fg.tensor(Z))
    assert fg.tensor([1 + 2j]).dtype is fg.complex64  # Python complex: the default complex
    assert fg.tensor(Z).dtype is fg.complex128  # numpy arrays keep their dtype
    assert fg.tensor(np.complex64(1j)).dtype is fg.complex64
    assert fg.tensor([1.5, 2j], dtype=fg.complex128).dtype is fg.complex128
    fg.set_default_dtype(fg.float64)
    try:
        assert fg.tensor([1j]).dtype is fg.complex128
        assert (fg.ones(2, dtype=fg.float32) * 1j).dtype is fg.complex64
    finally:
        fg.set_default_dtype(fg.float32)
    assert fg.ones(2, dtype=fg.complex64).element_size() == 8


_NAMES = ["bool", "int32", "int64", "float16", "float32", "float64", "complex64", "complex128"]


def _fg_operand(kind: str, name: str):
    return fg.zeros(2 if kind == "dim" else (), dtype=D.as_dtype(name))


@needs_torch
def test_promotion_matches_torch():
    """Every pair of dtypes, as dimensioned and 0-d tensors, and with Python scalars; PyTorch
    gives complex32 where fusegrad (without it) gives complex64."""
    for k1, k2 in itertools.product(["dim", "zero"], repeat=2):
        for a, b in itertools.product(_NAMES, repeat=2):
            want = torch.result_type(
                torch.zeros(2 if k1 == "dim" else (), dtype=getattr(torch, a)),
                torch.zeros(2 if k2 == "dim" else (), dtype=getattr(torch, b)),
            )
            got = D.result_type(_fg_operand(k1, a), _fg_operand(k2, b))
            expected = "complex64" if want == torch.complex32 else str(want).split(".")[1]
            assert got.name == expected, (k1, a, k2, b)
    for kind, name, scalar in itertools.product(["dim", "zero"], _NAMES, [True, 2, 2.5, 1j]):
        want = torch.result_type(
            torch.zeros(2 if kind == "dim" else (), dtype=getattr(torch, name)), scalar
        )
        expected = "complex64" if want == torch.complex32 else str(want).split(".")[1]
        assert D.result_type(_fg_operand(kind, name), scalar).name == expected


def test_promotion_closed_forms():
    f64, c64 = fg.ones(2, dtype=fg.float64), fg.ones(2, dtype=fg.complex64)
    assert (f64 * c64).dtype is fg.complex128  # complex wide enough for both parts
    assert (c64 * 2.0).dtype is fg.complex64
    assert (fg.ones(2, dtype=fg.int64) * 1j).dtype is fg.complex64
    assert (f64 * 1j).dtype is fg.complex128
    assert (fg.tensor(1j) + f64).dtype is fg.complex128  # a 0-d complex keeps f64's precision


# ---- printing ---------------------------------------------------------------------------------

_PRINTED = [
    [1 + 2j, 3.5 - 1j],
    [1 + 2j, 3 - 1j],
    [1e-5 + 2j, 3e6 - 1j],
    [complex("nan") + 1j, complex(float("inf"), -2)],
    [0j],
    [[1 + 2j, 3.25 - 1j], [0j, -1.5j]],
]


@needs_torch
@pytest.mark.parametrize("values", _PRINTED, ids=range(len(_PRINTED)))
def test_printing_matches_torch(values):
    for dtype in ("complex64", "complex128"):
        mine = repr(fg.tensor(values, dtype=getattr(fg, dtype)))
        theirs = repr(torch.tensor(values, dtype=getattr(torch, dtype)))
        assert mine == theirs.replace("torch.", "fusegrad.")


def test_printing_without_torch():
    assert repr(fg.tensor([1 + 2j, 3 - 1j])) == "tensor([1.+2.j, 3.-1.j])"
    assert repr(fg.tensor([1.5j], dtype=fg.complex128)) == (
        "tensor([0.+1.5000j], dtype=fusegrad.complex128)"
    )
    assert repr(fg.tensor([], dtype=fg.complex64)) == "tensor([], dtype=fusegrad.complex64)"
    assert repr(fg.tensor(1 + 2j, requires_grad=True)) == "tensor(1.+2.j, requires_grad=True)"
    big = repr(fg.tensor(Z.repeat(200, 0)))
    assert "..." in big and big.startswith("tensor([[")


# ---- the op surface -----------------------------------------------------------------------------


def test_parts_and_conjugate_values():
    z = fg.tensor(Z)
    np.testing.assert_array_equal(z.real.numpy(), Z.real)
    np.testing.assert_array_equal(z.imag.numpy(), Z.imag)
    np.testing.assert_array_equal(z.conj().numpy(), np.conj(Z))
    np.testing.assert_array_equal(fg.conj_physical(z).numpy(), np.conj(Z))
    np.testing.assert_allclose(z.abs().numpy(), np.abs(Z), rtol=1e-15)
    assert z.abs().dtype is fg.float64 and z.angle().dtype is fg.float64
    np.testing.assert_allclose(z.angle().numpy(), np.angle(Z), rtol=1e-15)
    np.testing.assert_allclose(z.sgn().numpy(), Z / np.abs(Z), rtol=1e-15)
    assert fg.tensor([0j]).sgn().item() == 0
    np.testing.assert_array_equal(fg.view_as_real(z).numpy(), np.stack([Z.real, Z.imag], -1))
    np.testing.assert_array_equal(fg.view_as_complex(fg.view_as_real(z)).numpy(), Z)
    r, t = fg.tensor(np.abs(Z)), fg.tensor(np.angle(Z))
    np.testing.assert_allclose(fg.polar(r, t).numpy(), Z, rtol=1e-14)
    np.testing.assert_array_equal(fg.complex(z.real, z.imag).numpy(), Z)
    x = fg.tensor([-2.0, 0.0, 3.0, float("nan")], dtype=fg.float64)
    np.testing.assert_array_equal(x.angle().numpy(), [np.pi, 0, 0, np.nan])
    assert not np.signbit(x.angle().numpy()[1:3]).any()  # +0, as PyTorch
    assert x.real is x and x.conj() is x and not x.is_conj() and x.resolve_conj() is x
    np.testing.assert_allclose((z.mH).numpy(), np.conj(Z).T)
    np.testing.assert_allclose(fg.vdot(z[0], z[1]).item(), np.vdot(Z[0], Z[1]))
    np.testing.assert_array_equal(fg.isreal(fg.tensor([1 + 0j, 1j])).numpy(), [True, False])


def test_views_share_memory_and_version():
    z = fg.tensor(Z.copy())
    re, im, pairs = z.real, z.imag, fg.view_as_real(z)
    for v in (re, im, pairs):
        assert v._base is z and v._version_counter is z._version_counter
    with fg.no_grad():
        re.mul_(2)
        im[0] = 0.5
        pairs[1, :, 0] = 7.0
    want = Z.copy()
    want.real *= 2
    want.imag[0] = 0.5
    want.real[1] = 7.0
    np.testing.assert_array_equal(z.numpy(), want)
    assert z._version == 3
    x = fg.zeros(3, 2)
    fg.view_as_complex(x).add_(1 - 1j)
    np.testing.assert_array_equal(x.numpy(), [[1, -1]] * 3)
    z.real = fg.tensor(np.ones((3, 4)))
    z.imag = 0.25
    np.testing.assert_array_equal(z.numpy(), np.full((3, 4), 1 + 0.25j))


def test_errors_use_torch_words_and_change_nothing():
    x = fg.ones(3)
    with pytest.raises(RuntimeError, match="imag is not implemented for tensors with non-complex"):
        _ = x.imag
    with pytest.raises(RuntimeError, match="view_as_real is only supported for complex"):
        fg.view_as_real(x)
    with pytest.raises(RuntimeError, match="last dimension of size 2"):
        fg.view_as_complex(x)
    with pytest.raises(RuntimeError, match="last dimension with stride 1"):
        fg.view_as_complex(fg.ones(2, 3).T)
    with pytest.raises(RuntimeError, match="storage_offset divisible by 2"):
        fg.view_as_complex(fg.arange(6.0)[1:5].reshape(2, 2))
    with pytest.raises(RuntimeError, match="Expected object of scalar type"):
        fg.complex(fg.ones(2), fg.ones(2, dtype=fg.float64))
    with pytest.raises(RuntimeError, match="Float or Double"):
        fg.complex(fg.ones(2, dtype=fg.int64), fg.ones(2, dtype=fg.int64))
    z = fg.tensor(Z)
    before = z.numpy().copy()
    for fn in (
        lambda: z.floor(),
        lambda: z < z,
        lambda: fg.maximum(z, z),
        lambda: z.amax(),
        lambda: fg.atan2(z, z),
        lambda: z.erf(),
        lambda: z.sort(),
        lambda: z.clamp(0, 1),
        lambda: z.sign(),
        lambda: z % 2,
    ):
        with pytest.raises(NotImplementedError, match="not supported for complex"):
            fn()
    np.testing.assert_array_equal(z.numpy(), before)
    assert issubclass(ComplexNotSupported, NotImplementedError)


def test_casts():
    z = fg.tensor([1.5 + 2j, -0.5 + 0j])
    with pytest.warns(UserWarning, match="discards the imaginary part"):
        r = z.to(fg.float32)
    np.testing.assert_array_equal(r.numpy(), [1.5, -0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(z.bool().numpy(), [True, True])
        np.testing.assert_array_equal(z.int().numpy(), [1, 0])
    assert fg.ones(2).to(fg.complex64).dtype is fg.complex64
    assert fg.ones(2).cdouble().dtype is fg.complex128
    assert complex(fg.tensor(1 + 2j)) == 1 + 2j and fg.tensor(1 - 1j).item() == 1 - 1j


def test_reductions():
    z = fg.tensor(Z)
    np.testing.assert_allclose(z.sum(1).numpy(), Z.sum(1))
    np.testing.assert_allclose(z.mean().item(), Z.mean())
    np.testing.assert_allclose(z.prod(0).numpy(), Z.prod(0))
    np.testing.assert_allclose(z.cumsum(1).numpy(), Z.cumsum(1))
    np.testing.assert_allclose(z.var(1).numpy(), Z.var(1, ddof=1))
    assert z.var().dtype is fg.float64
    np.testing.assert_allclose(z.norm().item(), np.linalg.norm(Z))
    np.testing.assert_allclose((z @ z.mH).numpy(), Z @ Z.conj().T)


# ---- autograd ----------------------------------------------------------------------------------


def test_modulus_squared_gradient_is_two_z():
    z = fg.tensor(Z, requires_grad=True)
    (z.abs() ** 2).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), 2 * Z, rtol=1e-14)
    assert z.grad.dtype is fg.complex128


# functions of one complex tensor with a real result (``backward()`` with no gradient), written
# against either library (``m`` is fusegrad or torch)
REAL_RESULTS = {
    "abs_exp_sin": lambda m, z: (z.exp() * z.sin()).abs().sum(),
    "conj_log": lambda m, z: (z * z.conj() + z.log()).real.sum(),
    "sqrt_tanh": lambda m, z: (z.sqrt() / (z.tanh() + 2)).imag.sum(),
    "pow_angle": lambda m, z: (z.reciprocal() ** 2.5).angle().sum(),
    "view_as_real": lambda m, z: (m.view_as_real(z * 1j) ** 2).sum(),
    "sigmoid_sgn_asinh": lambda m, z: (z.sigmoid().sgn() * z.asinh()).abs().sum(),
    "inverse_trig": lambda m, z: (
        (z.acosh() + z.acos() + z.atanh() + z.asin() + z.atan()).abs().sum()
    ),
    "prod_cumsum": lambda m, z: (z.prod() * z.cumsum(0)).abs().sum(),
    "outer": lambda m, z: (z.reshape(-1, 1) @ z.reshape(1, -1)).abs().sum(),
    "polar": lambda m, z: m.polar(z.abs(), z.real).imag.sum(),
    "complex": lambda m, z: m.complex(z.real * 2, z.imag**2).abs().sum(),
    "view_round_trip": lambda m, z: m.view_as_complex(m.view_as_real(z) * 2).abs().sum(),
    "z_pow_z": lambda m, z: (z**z).abs().sum(),
    "mean_var": lambda m, z: (z.mean() + z.var()).abs(),
    "norm": lambda m, z: z.norm(),
    "hyperbolic": lambda m, z: (z.cosh() * z.sinh() - z.cos() + z.expm1() * z.log1p()).abs().sum(),
    "casts": lambda m, z: (z.real.to(m.complex128) * z + z.imag.double()).abs().sum(),
    "vdot": lambda m, z: m.vdot(z, z * 2).real,
    "adjoint": lambda m, z: (z.reshape(-1, 1).mH @ z.reshape(-1, 1)).abs().sum(),
    "div_reciprocal": lambda m, z: (z / (z.flip(0) + 3)).real.sum(),
    "inplace_parts": lambda m, z: _inplace_parts(z).abs().sum(),
}


def _inplace_parts(z):
    w = z * 1
    w.real.mul_(2)
    w.imag.add_(w.real)
    w[1:].imag.mul_(3)
    return w


_POINTS = np.array([1 + 2j, -3 + 0.5j, 0.3 - 0.7j, -0.4 - 1.1j])


@needs_torch
@pytest.mark.parametrize("name", sorted(REAL_RESULTS))
def test_values_and_gradients_match_torch(name):
    fn = REAL_RESULTS[name]
    z = fg.tensor(_POINTS, requires_grad=True)
    zt = torch.tensor(_POINTS, requires_grad=True)
    out, want = fn(fg, z), fn(torch, zt)
    out.backward()
    want.backward()
    np.testing.assert_allclose(out.item(), want.item(), rtol=1e-10)
    np.testing.assert_allclose(z.grad.numpy(), zt.grad.numpy(), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", sorted(REAL_RESULTS))
def test_gradcheck_and_gradgradcheck(name):
    fn = REAL_RESULTS[name]
    z = fg.tensor(_POINTS, requires_grad=True)
    assert gradcheck(lambda z: fn(fg, z), (z,))
    assert gradcheck(lambda z: fn(fg, z), (z,), fast_mode=True)
    assert gradgradcheck(lambda z: fn(fg, z), (z,))


COMPLEX_RESULTS = {
    "exp_sin": lambda z: z.exp() * z.sin(),
    "conj_mul": lambda z: z.conj() * z,
    "sqrt_div": lambda z: z.sqrt() / (z.tanh() + 2),
    "pow": lambda z: z**2.5,
    "sigmoid": lambda z: z.sigmoid(),
    "matmul": lambda z: z.reshape(2, 2) @ z.reshape(2, 2).mH,
    "prod": lambda z: z.prod(),
}


@pytest.mark.parametrize("name", sorted(COMPLEX_RESULTS))
def test_gradcheck_complex_outputs(name):
    z = fg.tensor(_POINTS, requires_grad=True)
    fn = COMPLEX_RESULTS[name]
    assert gradcheck(fn, (z,))
    assert gradgradcheck(fn, (z,))


def test_mixed_real_and_complex_inputs():
    x = fg.tensor(_POINTS.real, requires_grad=True)
    z = fg.tensor(_POINTS, requires_grad=True)
    assert gradcheck(lambda x, z: (x * z).exp(), (x, z))
    assert gradgradcheck(lambda x, z: fg.polar(x.abs() + 1, x) * z, (x, z))
    (x * z).abs().sum().backward()
    assert x.grad.dtype is fg.float64  # a real leaf gets the real part
    np.testing.assert_allclose(x.grad.numpy(), np.abs(_POINTS) * np.sign(_POINTS.real))


def test_gradcheck_catches_a_missing_conjugate():
    class Square(fg.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            ctx.save_for_backward(z)
            return z * z

        @staticmethod
        def backward(ctx, g):
            (z,) = ctx.saved_tensors
            return g * 2 * z  # should be g * conj(2 z)

    z = fg.tensor(_POINTS, requires_grad=True)
    with pytest.raises(RuntimeError, match="Jacobian mismatch"):
        gradcheck(Square.apply, (z,))
    with pytest.raises(RuntimeError, match="Jacobian mismatch"):
        gradcheck(Square.apply, (z,), fast_mode=True)


def test_backward_of_complex_outputs():
    z = fg.tensor(_POINTS, requires_grad=True)
    w = (z * z).sum()
    with pytest.raises(RuntimeError, match="real scalar outputs"):
        w.backward()
    (g,) = fg.autograd.grad(z * z, z, fg.tensor(np.full(4, 1j)))
    np.testing.assert_allclose(g.numpy(), 1j * np.conj(2 * _POINTS))


def test_forward_ad_through_complex():
    import fusegrad.autograd.forward_ad as fwAD

    a, b = fg.tensor([1.0, 2.0], dtype=fg.float64), fg.tensor([0.5, -1.0], dtype=fg.float64)
    with fwAD.dual_level():
        da = fwAD.make_dual(a, fg.ones_like(a))
        w = fg.complex(da, b).exp().abs()
        tangent = fwAD.unpack_dual(w).tangent
    # d|exp(a + ib)|/da = exp(a)
    np.testing.assert_allclose(tangent.numpy(), np.exp([1.0, 2.0]), rtol=1e-14)


# ---- the compiler ------------------------------------------------------------------------------


def test_compiled_code_falls_back_with_the_reason():
    from fusegrad import compiler

    z = fg.tensor(_POINTS, requires_grad=True)
    w = fg.tensor(_POINTS.real, requires_grad=True)

    @fg.compile
    def step(z, w):
        loss = ((z * w).abs() ** 2).sum() + w.exp().sum()
        loss.backward()
        return loss

    compiler.reset()
    loss = step(z, w)
    want_z = 2 * _POINTS * _POINTS.real**2
    np.testing.assert_allclose(z.grad.numpy(), want_z, rtol=1e-12)
    np.testing.assert_allclose(
        w.grad.numpy(), 2 * _POINTS.real * np.abs(_POINTS) ** 2 + np.exp(_POINTS.real)
    )
    want_loss = np.sum(np.abs(_POINTS * _POINTS.real) ** 2) + np.sum(np.exp(_POINTS.real))
    np.testing.assert_allclose(loss.item(), want_loss, rtol=1e-12)
    text = str(compiler.explain(step, z, w))
    assert "complex value" in text
    reasons = " ".join(list(compiler.counters.step_breaks) + list(compiler.counters.fallbacks))
    assert "a complex value" in reasons


def test_docs_examples_run():
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "complex.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert blocks
    for code in blocks:
        exec(compile(code, "docs/complex.md", "exec"), {})
