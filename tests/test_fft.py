"""``fusegrad.fft`` (docs/fft.md): every name of ``torch.fft``, each transform in every norm mode
with ``n`` / ``s`` padding and cropping, against numpy's FFT and against PyTorch when it is
importable (values and gradients, float64 and float32), gradcheck and gradgradcheck of every
transform on real and complex inputs, PyTorch's errors, and the frequency and shift helpers."""

from __future__ import annotations

import itertools
import pathlib
import re

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.fft as ff
from fusegrad.autograd import gradcheck, gradgradcheck

try:
    import torch
except ImportError:  # pragma: no cover - the cross-checks skip
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not importable")

RNG = np.random.default_rng(2)
X = RNG.standard_normal((3, 4, 5))
Z = X + 1j * RNG.standard_normal((3, 4, 5))

ONE_D = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"]
MULTI_D = [f"{k}{suffix}" for suffix in ("2", "n") for k in ONE_D]
REAL_INPUT_ONLY = ("rfft", "ihfft")  # (their complex inputs are refused)
NORMS = [None, "backward", "forward", "ortho"]


def _swap(norm):
    return {None: "forward", "backward": "forward", "forward": "backward", "ortho": "ortho"}[norm]


def _numpy(name, a, kw):
    """numpy's (or, for the n-D Hermitian transforms, the defining composite's) result."""
    kw = dict(kw)
    one_d = name in ONE_D
    if kw.get("s") is not None and -1 in kw["s"]:
        # PyTorch's -1: the input's size, or 2 (m - 1) for the output of a transform to real
        # values (numpy reads -1 as the input's size everywhere)
        axes = kw.get("dim") or (tuple(range(a.ndim - len(kw["s"]), a.ndim)))
        to_real = name.startswith(("irfft", "hfft"))
        kw["s"] = tuple(
            (2 * (a.shape[ax] - 1) if to_real and i == len(axes) - 1 else a.shape[ax])
            if n == -1
            else n
            for i, (n, ax) in enumerate(zip(kw["s"], axes))
        )
    if "dim" in kw:
        kw["axis" if one_d else "axes"] = kw.pop("dim")
    if not one_d and kw.get("s") is not None and "axes" not in kw:
        kw["axes"] = tuple(range(a.ndim - len(kw["s"]), a.ndim))  # (numpy wants them given)
    if one_d:
        return getattr(np.fft, name)(a, **kw)
    base = name[:-1]
    if base in ("hfft", "ihfft"):
        norm = _swap(kw.pop("norm", None))
        if name.endswith("2"):
            kw.setdefault("axes", (-2, -1))
        if base == "hfft":
            return np.fft.irfftn(np.conj(a), norm=norm, **kw)
        return np.conj(np.fft.rfftn(a, norm=norm, **kw))
    return getattr(np.fft, name)(a, **kw)


def _cases():
    for name, norm in itertools.product(ONE_D, NORMS):
        for n in (None, 3, 8):
            yield name, {"n": n, "dim": 1, "norm": norm}
    for name, norm in itertools.product(MULTI_D, NORMS):
        for s, dim in ((None, None), ((3, 6), None), ((2, -1), (0, 2)), (None, (2, 0))):
            kw = {"norm": norm}
            if s is not None:
                kw["s"] = s
            if dim is not None:
                kw["dim"] = dim
            yield name, kw


CASES = list(_cases())


def _inputs(name):
    return [X] if name.startswith(REAL_INPUT_ONLY) else [X, Z]


def _case_id(case):
    name, kw = case
    return name + "-" + "-".join(f"{k}={v}" for k, v in kw.items() if v is not None)


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_values_match_numpy(case):
    name, kw = case
    for a in _inputs(name):
        got = getattr(ff, name)(fg.tensor(a), **kw)
        want = _numpy(name, a, kw)
        assert tuple(got.shape) == want.shape
        assert got.dtype is (fg.complex128 if np.iscomplexobj(want) else fg.float64)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


def _loss(lib, out, weights):
    """A real function of the transform's output that uses every element."""
    w = lib.tensor(weights[tuple(slice(0, k) for k in out.shape)])
    if out.is_complex():
        return (out * w).real.sum() + (out.abs() ** 2).sum()
    return (out * w.real).sum() + (out**3).sum()


WEIGHTS = RNG.standard_normal((9, 9, 9)) + 1j * RNG.standard_normal((9, 9, 9))


@needs_torch
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_values_and_gradients_match_torch(case):
    name, kw = case
    for a, (fdt, _, rtol) in itertools.product(
        _inputs(name), [("float64", "float64", 1e-10), ("float32", "float32", 1e-5)]
    ):
        a = (
            a.astype(np.complex64 if fdt == "float32" else np.complex128)
            if np.iscomplexobj(a)
            else a.astype(fdt)
        )
        results = []
        for lib in (fg, torch):
            t = lib.tensor(a, requires_grad=True)
            out = getattr(lib.fft, name)(t, **kw)
            loss = _loss(lib, out, WEIGHTS.astype(np.complex128))
            loss.backward()
            results.append((out.detach().resolve_conj().numpy(), t.grad.numpy()))
        (o, g), (to, tg) = results
        scale_o, scale_g = np.abs(to).max(initial=1.0), np.abs(tg).max(initial=1.0)
        np.testing.assert_allclose(o, to, rtol=rtol, atol=rtol * scale_o)
        np.testing.assert_allclose(g, tg, rtol=rtol, atol=rtol * scale_g)


SMALL_CASES = [
    ("fft", {}),
    ("ifft", {"n": 4, "norm": "ortho"}),
    ("fft", {"n": 2, "norm": "forward"}),
    ("rfft", {"n": 5}),
    ("rfft", {"n": 2, "norm": "ortho"}),
    ("irfft", {"n": 5}),
    ("irfft", {}),
    ("irfft", {"n": 2, "norm": "forward"}),
    ("hfft", {"n": 3}),
    ("hfft", {"norm": "ortho"}),
    ("ihfft", {}),
    ("ihfft", {"n": 4, "norm": "forward"}),
    ("fft2", {"s": (3, 2)}),
    ("ifft2", {"norm": "forward"}),
    ("rfft2", {"s": (1, 4)}),
    ("irfft2", {"norm": "ortho"}),
    ("hfft2", {"s": (2, 3)}),
    ("ihfft2", {}),
    ("fftn", {"dim": (0,)}),
    ("ifftn", {"s": (4,), "norm": "ortho"}),
    ("rfftn", {}),
    ("irfftn", {"s": (2, 4)}),
    ("hfftn", {"norm": "forward"}),
    ("ihfftn", {"s": (3, 2)}),
]


@pytest.mark.parametrize("case", SMALL_CASES, ids=[_case_id(c) for c in SMALL_CASES])
def test_gradcheck_and_gradgradcheck(case):
    name, kw = case
    small = RNG.standard_normal((2, 3))
    arrays = [small] if name.startswith(REAL_INPUT_ONLY) else [small, small + 1j * small[::-1]]
    for a in arrays:
        t = fg.tensor(a, requires_grad=True)

        def f(t):
            return getattr(ff, name)(t, **kw)

        assert gradcheck(f, (t,))
        assert gradgradcheck(f, (t,))
        assert gradcheck(f, (t,), fast_mode=True)


def test_every_torch_fft_name_exists():
    names = [
        "fft ifft fft2 ifft2 fftn ifftn rfft irfft rfft2 irfft2 rfftn irfftn hfft ihfft hfft2 "
        "ihfft2 hfftn ihfftn fftfreq rfftfreq fftshift ifftshift"
    ][0].split()
    assert sorted(ff.__all__) == sorted(names)
    if torch is not None:
        public = {
            n
            for n in dir(torch.fft)
            if not n.startswith("_") and callable(getattr(torch.fft, n)) and n not in ("Tensor",)
        }
        assert public <= set(ff.__all__), public - set(ff.__all__)
    assert fg.fft is ff


def test_promotion_and_dtypes():
    assert ff.fft(fg.arange(4)).dtype is fg.complex64  # integers: the default float first
    assert ff.rfft(fg.ones(4, dtype=fg.float64)).dtype is fg.complex128
    assert ff.irfft(fg.ones(3, dtype=fg.complex64)).dtype is fg.float32
    assert ff.fftn(fg.tensor(2.0)).shape == ()
    np.testing.assert_allclose(ff.fft(fg.ones(4)).numpy(), [4, 0, 0, 0])
    assert ff.hfftn(fg.ones((2, 3, 4), dtype=fg.complex64)).shape == (2, 3, 6)


def test_errors_use_torch_words():
    x = fg.ones(4, 5)
    cases = [
        (lambda: ff.fft(x, n=0), RuntimeError, r"Invalid number of data points \(0\)"),
        (lambda: ff.fft(x, norm="xyz"), RuntimeError, 'Invalid normalization mode: "xyz"'),
        (lambda: ff.fftn(x, dim=(0, 0)), RuntimeError, "FFT dims must be unique"),
        (lambda: ff.fftn(x, s=(3,), dim=(0, 1)), RuntimeError, "same length"),
        (lambda: ff.fft(x, dim=2), IndexError, "out of range"),
        (lambda: ff.rfft(fg.ones(3, dtype=fg.complex64)), RuntimeError, "expects a real input"),
        (lambda: ff.irfft(fg.ones(1)), RuntimeError, r"Invalid number of data points \(0\)"),
        (lambda: ff.fft(fg.ones(4, dtype=fg.float16)), RuntimeError, "Unsupported dtype"),
        (lambda: ff.fft(fg.ones(0)), RuntimeError, "Invalid number of data points"),
    ]
    for fn, cls, words in cases:
        with pytest.raises(cls, match=words):
            fn()


def test_frequencies_and_shifts():
    for n, d in [(5, 1.0), (6, 0.3), (1, 2.0)]:
        np.testing.assert_allclose(ff.fftfreq(n, d).numpy(), np.fft.fftfreq(n, d), rtol=1e-6)
        np.testing.assert_allclose(ff.rfftfreq(n, d).numpy(), np.fft.rfftfreq(n, d), rtol=1e-6)
    f = ff.fftfreq(4, dtype=fg.float64, requires_grad=True)
    assert f.dtype is fg.float64 and f.requires_grad
    assert ff.fftfreq(0).shape == (0,)
    a = np.arange(24.0).reshape(4, 6)
    for dim in (None, 0, (1,), (0, 1)):
        np.testing.assert_array_equal(
            ff.fftshift(fg.tensor(a), dim).numpy(), np.fft.fftshift(a, dim)
        )
        np.testing.assert_array_equal(
            ff.ifftshift(fg.tensor(a), dim).numpy(), np.fft.ifftshift(a, dim)
        )
    x = fg.tensor(a, requires_grad=True)
    (ff.fftshift(x) * fg.tensor(a)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.fft.ifftshift(a))


def test_round_trips_and_parseval():
    x = fg.tensor(X)
    np.testing.assert_allclose(ff.ifftn(ff.fftn(x)).real.numpy(), X, atol=1e-12)
    np.testing.assert_allclose(ff.irfftn(ff.rfftn(x), s=X.shape).numpy(), X, atol=1e-12)
    np.testing.assert_allclose(ff.hfft(ff.ihfft(x), n=5).numpy(), X, atol=1e-12)
    energy = (ff.fft(x, norm="ortho").abs() ** 2).sum()
    np.testing.assert_allclose(energy.item(), (X**2).sum(), rtol=1e-12)


def test_node_names():
    x = fg.tensor(X, requires_grad=True)
    assert ff.rfft(x).grad_fn.name() == "FftR2CBackward0"
    assert ff.irfft(ff.rfft(x)).grad_fn.name() == "FftC2RBackward0"
    assert ff.fft(x.to(fg.complex128)).grad_fn.name() == "FftC2CBackward0"


def test_compiled_backward_falls_back_with_the_reason():
    from fusegrad import compiler

    x = fg.tensor(X, requires_grad=True)
    compiler.reset()
    with compiler.compiled_autograd():
        (ff.rfft(x).abs() ** 2).sum().backward()
    want = fg.tensor(X, requires_grad=True)
    (ff.rfft(want).abs() ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), want.grad.numpy(), rtol=1e-12)
    assert any("complex value" in r for r in compiler.counters.fallbacks)


def test_docs_examples_run():
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "fft.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert blocks
    for code in blocks:
        exec(compile(code, "docs/fft.md", "exec"), {})
