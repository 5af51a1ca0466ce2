"""Complex CUDA tensors in numba's simulator (docs/complex.md, "CUDA"): storage, creation,
transfers, copies and views keep the values; the elementwise primitives with complex kernels
(``fusegrad.cuda.complex``), real/imag/view_as_real/view_as_complex, casts, where and sums equal
the CPU's (numpy's) values; complex autograd on CUDA gives the CPU's gradients (PyTorch's
convention); what has no complex kernel refuses with NotImplementedError naming the primitive,
never a result without its imaginary part.

Runs only in the simulator process (``NUMBA_ENABLE_CUDASIM=1``, see tests/test_cuda_suites.py)."""

from __future__ import annotations

import modes  # noqa: E402
import numpy as np
import pytest

modes.require_device()

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fusegrad as fg  # noqa: E402

RNG = np.random.default_rng(29)
Z = np.array([[1 + 2j, 3 - 1j, -0.5j], [2.0, 1j, -1 - 1j]])
DTYPES = ["complex64", "complex128"]
RTOL = {"complex64": 2e-5, "complex128": 1e-12}


def _random(shape: tuple, dtype: str, scale: float = 1.0) -> np.ndarray:
    z = RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)
    return (scale * z).astype(dtype)


def _same(cuda: fg.Tensor, cpu: fg.Tensor, rtol: float) -> None:
    assert cuda.is_cuda and cuda.dtype is cpu.dtype and tuple(cuda.shape) == tuple(cpu.shape)
    np.testing.assert_allclose(cuda.cpu().numpy(), cpu.numpy(), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_storage_creation_transfers_copies_and_views(dtype: str) -> None:
    d = getattr(fg, dtype)
    z = fg.tensor(Z, dtype=d)
    zc = z.cuda()
    assert zc.is_cuda and zc.dtype is d
    np.testing.assert_array_equal(zc.cpu().numpy(), z.numpy())
    np.testing.assert_array_equal(zc.to("cpu").numpy(), z.numpy())
    np.testing.assert_array_equal(zc.T.cpu().numpy(), z.numpy().T)
    np.testing.assert_array_equal(zc[1].cpu().numpy(), z.numpy()[1])
    np.testing.assert_array_equal(zc.reshape(3, 2).cpu().numpy(), z.numpy().reshape(3, 2))
    assert "device='cuda:0'" in repr(zc)
    # creation on the device
    np.testing.assert_array_equal(
        fg.zeros(2, 3, dtype=d, device="cuda").cpu().numpy(), np.zeros((2, 3), dtype)
    )
    full = fg.full((2,), 1 - 2j, dtype=d, device="cuda")
    np.testing.assert_array_equal(full.cpu().numpy(), np.full(2, 1 - 2j, dtype))
    made = fg.tensor(Z, dtype=d, device="cuda")
    np.testing.assert_array_equal(made.cpu().numpy(), Z.astype(dtype))
    # copies: clone, copy_ (from complex, real and other-precision sources), to(dtype)
    np.testing.assert_array_equal(zc.clone().cpu().numpy(), z.numpy())
    target = fg.zeros(2, 3, dtype=d, device="cuda")
    target.copy_(zc.T.T)
    np.testing.assert_array_equal(target.cpu().numpy(), z.numpy())
    target.copy_(fg.tensor(Z.real, device="cuda"))
    np.testing.assert_array_equal(target.cpu().numpy(), Z.real.astype(dtype))
    other = "complex128" if dtype == "complex64" else "complex64"
    _same(zc.to(getattr(fg, other)), z.to(getattr(fg, other)), 1e-7)
    _same(fg.tensor(Z.real, device="cuda").to(d), fg.tensor(Z.real).to(d), 0)
    # movement that copies elements
    _same(zc.flip(0), z.flip(0), 0)
    _same(fg.cat([zc, zc[:1]]), fg.cat([z, z[:1]]), 0)
    index = fg.tensor([1, 0, 1])
    _same(zc[index], z[index], 0)
    _same(zc[:, index.cuda()], z[:, index], 0)
    pairs = fg.tensor([[0, 2], [1, 1]])
    _same(zc.gather(1, pairs.cuda()), z.gather(1, pairs), 0)
    _same(fg.nn.functional.pad(zc, (1, 2)), fg.nn.functional.pad(z, (1, 2)), 0)
    _same(zc.index_add(0, index[:2].cuda(), zc), z.index_add(0, index[:2], z), 1e-7)
    written = [t.clone() for t in (z, zc)]
    for t in written:
        t[0, 1] = 5 - 5j
        t[:, 1:] = t[:, :2] * 2
        t[index[:2].to(t.device)] = t[1]
    _same(written[1], written[0], 1e-7)


@pytest.mark.parametrize("dtype", DTYPES)
def test_real_imag_and_views_are_views(dtype: str) -> None:
    z = fg.tensor(Z, dtype=getattr(fg, dtype))
    zc = z.cuda()
    for name in ("real", "imag"):
        part = getattr(zc, name)
        assert part.dtype is getattr(z, name).dtype
        np.testing.assert_array_equal(part.cpu().numpy(), getattr(z, name).numpy())
        np.testing.assert_array_equal(part.T.cpu().numpy(), getattr(z, name).numpy().T)
    pairs = fg.view_as_real(zc)
    np.testing.assert_array_equal(pairs.cpu().numpy(), fg.view_as_real(z).numpy())
    back = fg.view_as_complex(pairs)
    np.testing.assert_array_equal(back.cpu().numpy(), z.numpy())
    np.testing.assert_array_equal(zc.angle().cpu().numpy(), z.angle().numpy())
    # writes through the views change the base, as on the CPU
    with fg.no_grad():
        zc.imag.mul_(-1)
        fg.view_as_real(zc)[0, 0, 0] = 7.0
    want = np.conj(Z).astype(dtype)
    want[0, 0] = 7 + want[0, 0].imag * 1j
    np.testing.assert_array_equal(zc.cpu().numpy(), want)
    # view_as_complex's checks hold on the device too
    with pytest.raises(RuntimeError, match="stride 1"):
        fg.view_as_complex(fg.zeros(2, 4, device="cuda", dtype=fg.float64)[:, ::2])


UNARY = ["neg", "conj", "reciprocal", "exp", "log", "sqrt", "sin", "cos", "sinh", "cosh"]
UNARY += ["tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "abs", "sgn", "angle"]
UNARY += ["isnan", "isinf"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", UNARY)
def test_unary_ops_equal_the_cpu(name: str, dtype: str) -> None:
    z = fg.tensor(_random((3, 4), dtype, 1.5))
    _same(getattr(z.cuda(), name)(), getattr(z, name)(), RTOL[dtype])


def test_large_and_special_values_follow_numpy() -> None:
    z = fg.tensor(np.array([30 + 1j, -40 - 2j, 1e-3 + 700j, 0j, 1 + 0j, np.inf + 0j, np.nan + 1j]))
    # (infinities and nan: where numpy and C99's complex functions agree)
    for name in ("abs", "isnan", "isinf", "conj", "neg"):
        _same(getattr(z.cuda(), name)(), getattr(z, name)(), 1e-12)
    finite = z[:5]
    for name in ("tanh", "exp"):
        _same(getattr(finite.cuda(), name)(), getattr(finite, name)(), 1e-12)
    for name in ("sin", "cos", "sinh", "cosh"):
        _same(getattr(finite[:2].cuda(), name)(), getattr(finite[:2], name)(), 1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_ops_mixed_operands_and_broadcasting(dtype: str) -> None:
    d = getattr(fg, dtype)
    a = fg.tensor(_random((2, 3, 4), dtype))
    b = fg.tensor(_random((3, 1), dtype))
    x = fg.tensor(RNG.standard_normal(4))  # a float64 operand
    i = fg.tensor(RNG.integers(-3, 4, (4,)))
    ac, bc, xc, ic = a.cuda(), b.cuda(), x.cuda(), i.cuda()
    rtol = RTOL[dtype]
    for op in (
        lambda p, q: p + q,
        lambda p, q: p - q,
        lambda p, q: p * q,
        lambda p, q: p / q,
        lambda p, q: p == q,
        lambda p, q: p != q,
    ):
        _same(op(ac, bc), op(a, b), rtol)
        _same(op(ac, xc), op(a, x), rtol)
        _same(op(xc, ac), op(x, a), rtol)
        _same(op(ac, ic), op(a, i), rtol)
    for scalar in (2, -0.5, 1 - 1j):
        _same(ac * scalar, a * scalar, rtol)
        _same(scalar - ac, scalar - a, rtol)
    _same(ac == ac.clone(), a == a.clone(), 0)
    _same(fg.where(xc > 0, ac, bc), fg.where(x > 0, a, b), 0)
    _same(fg.where(xc > 0, ac, 0.0), fg.where(x > 0, a, 0.0), 0)
    _same(fg.complex(xc, xc * 2), fg.complex(x, x * 2), 0)
    _same(fg.polar(xc.abs(), xc), fg.polar(x.abs(), x), 1e-12)
    r = fg.tensor(RNG.standard_normal(3), dtype=fg.float32)
    _same(fg.complex(r.cuda(), r.cuda()), fg.complex(r, r), 0)
    assert (ac * 1).dtype is d


@pytest.mark.parametrize("dtype", DTYPES)
def test_casts(dtype: str) -> None:
    z = fg.tensor(_random((5,), dtype))
    zc = z.cuda()
    with pytest.warns(UserWarning, match="discards the imaginary part"):
        _same(zc.to(fg.float64), z.to(fg.float64), 0)
    _same(zc.to(fg.bool), z.to(fg.bool), 0)
    _same((zc * 0).to(fg.bool), (z * 0).to(fg.bool), 0)
    for src in (fg.float32, fg.int64, fg.bool):
        x = fg.tensor(RNG.integers(0, 3, 5)).to(src)
        _same(x.cuda().to(getattr(fg, dtype)), x.to(getattr(fg, dtype)), 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sums_and_means(dtype: str) -> None:
    z = fg.tensor(_random((3, 4, 5), dtype))
    zc = z.cuda()
    rtol = 1e-5 if dtype == "complex64" else 1e-12
    _same(zc.sum(), z.sum(), rtol)
    _same(zc.sum(1), z.sum(1), rtol)
    _same(zc.sum((0, 2), keepdim=True), z.sum((0, 2), keepdim=True), rtol)
    _same(zc.mean(-1), z.mean(-1), rtol)
    _same(zc.mean(), z.mean(), rtol)
    _same(zc.T.sum(0), z.T.sum(0), rtol)  # a non-contiguous operand
    _same(zc[0, 0, 0].sum(), z[0, 0, 0].sum(), rtol)  # 0-d


FUNCTIONS = {
    "abs_squared": lambda z, w, x: (z.abs() ** 2).sum(),
    "mul_abs": lambda z, w, x: (z * w).abs().sum(),
    "div_real": lambda z, w, x: (z / w).real.sum(),
    "exp_imag": lambda z, w, x: z.exp().imag.sum(),
    "log_sqrt": lambda z, w, x: (z.log() + z.sqrt()).abs().mean(),
    "trig": lambda z, w, x: (z.sin() * z.cos() + z.tanh()).real.sum(),
    "conj": lambda z, w, x: (z.conj() * w).imag.sum(),
    "angle": lambda z, w, x: z.angle().sum(),
    "real_operand": lambda z, w, x: ((z * x) + x).abs().sum(),
    "means": lambda z, w, x: (z.mean(0) * w.sum(0)).real.sum(),
    "complex_of_parts": lambda z, w, x: fg.complex(z.real * 2, w.imag).abs().sum(),
    "view_as_real": lambda z, w, x: (fg.view_as_real(z) ** 2).sum(),
    "sgn": lambda z, w, x: (z.sgn() * w).real.sum(),
    "reciprocal": lambda z, w, x: (-(z - w).reciprocal()).real.sum(),
    "where": lambda z, w, x: fg.where(z.real > 0, z, w).abs().sum(),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_complex_autograd_on_cuda_equals_the_cpu(name: str) -> None:
    fn = FUNCTIONS[name]
    z0, w0 = _random((2, 3), "complex128"), _random((2, 3), "complex128")
    x0 = RNG.standard_normal(3)
    results = []
    for device in ("cpu", "cuda"):
        z = fg.tensor(z0, device=device, requires_grad=True)
        w = fg.tensor(w0, device=device, requires_grad=True)
        x = fg.tensor(x0, device=device, requires_grad=True)
        loss = fn(z, w, x)
        loss.backward()
        grads = [t.grad.cpu().numpy() if t.grad is not None else None for t in (z, w, x)]
        results.append((loss.detach().cpu().numpy(), grads))
    (cpu_loss, cpu_grads), (cuda_loss, cuda_grads) = results
    np.testing.assert_allclose(cuda_loss, cpu_loss, rtol=1e-12)
    for got, want in zip(cuda_grads, cpu_grads):
        assert (got is None) == (want is None)
        if want is not None:
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_pytorch_convention_on_cuda() -> None:
    z = fg.tensor(Z, device="cuda", requires_grad=True)
    (z.abs() ** 2).sum().backward()
    np.testing.assert_allclose(z.grad.cpu().numpy(), 2 * Z, rtol=1e-14)


@settings(max_examples=20, deadline=None)
@given(
    shape_a=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    trailing=st.integers(0, 2),
    dtype=st.sampled_from(DTYPES),
)
def test_broadcast_arithmetic_and_sum_to(shape_a: list, trailing: int, dtype: str) -> None:
    """Broadcast shapes: the products and their gradients (sum_to) equal the CPU's."""
    shape_b = shape_a[len(shape_a) - trailing :] if trailing <= len(shape_a) else shape_a
    rng = np.random.default_rng(len(shape_a) * 7 + trailing)
    a0 = (rng.standard_normal(shape_a) + 1j * rng.standard_normal(shape_a)).astype(dtype)
    b0 = (rng.standard_normal(shape_b) + 1j * rng.standard_normal(shape_b)).astype(dtype)
    grads = []
    for device in ("cpu", "cuda"):
        a = fg.tensor(a0, device=device, requires_grad=True)
        b = fg.tensor(b0, device=device, requires_grad=True)
        ((a * b - b).abs() ** 2).sum().backward()
        grads.append((a.grad.cpu().numpy(), b.grad.cpu().numpy()))
    rtol = 1e-4 if dtype == "complex64" else 1e-12
    for got, want in zip(grads[1], grads[0]):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


def test_ops_without_complex_kernels_refuse() -> None:
    zc = fg.tensor(Z).cuda()
    for fn, name in (
        (lambda: zc @ zc.T, "matmul"),
        (lambda: zc**2, "pow"),
        (lambda: zc.cumsum(0), "cumsum"),
        (lambda: zc.expm1(), "expm1"),
        (lambda: zc.prod(), "prod"),
    ):
        with pytest.raises(NotImplementedError, match=f"{name} is not implemented for CUDA"):
            fn()
    with pytest.raises(NotImplementedError, match="CUDA"):
        fg.linalg.inv(zc[:, :2])
    with pytest.raises(NotImplementedError, match="CUDA"):
        fg.fft.fft(zc)


def test_compiled_autograd_runs_complex_cuda_backwards_eagerly() -> None:
    """Compiled programs take no complex values: the backward runs eagerly on the device, with
    the reason counted, and gives the CPU's gradient."""
    from fusegrad import compiler

    compiler.reset()
    z = fg.tensor(Z, device="cuda", requires_grad=True)
    with compiler.compiled_autograd():
        (z.abs() ** 2 * z.real.exp()).sum().backward()
    w = fg.tensor(Z, requires_grad=True)
    (w.abs() ** 2 * w.real.exp()).sum().backward()
    np.testing.assert_allclose(z.grad.cpu().numpy(), w.grad.numpy(), rtol=1e-13)
    assert any("a complex value" in reason for reason in compiler.counters.fallbacks)
