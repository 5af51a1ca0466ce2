"""``normal`` (PyTorch's four overloads) and ``poisson``: the distribution of many draws,
reproducibility under ``manual_seed`` and ``generator=``, dtypes and shapes, PyTorch's zero
gradients and errors, and whole-step compiled functions that draw what eager draws."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None


def _np(t: fg.Tensor) -> np.ndarray:
    return t.detach().numpy()


def test_normal_with_tensor_parameters_follows_them() -> None:
    fg.manual_seed(0)
    n = 20000
    mean = fg.tensor([[-3.0], [5.0]], dtype=fg.float64)  # (2, 1) broadcast with (n,)
    std = fg.full((n,), 2.0, dtype=fg.float64)
    out = fg.normal(mean, std)
    assert tuple(out.shape) == (2, n) and out.dtype == fg.float64
    draws = _np(out)
    # sample mean within 5 standard errors, sample std within 3%
    np.testing.assert_allclose(draws.mean(1), [-3.0, 5.0], atol=5 * 2.0 / math.sqrt(n))
    np.testing.assert_allclose(draws.std(1), [2.0, 2.0], rtol=0.03)


@pytest.mark.parametrize(
    "call",
    [
        lambda g: fg.normal(fg.zeros(4000) + 1.0, 0.5, generator=g),
        lambda g: fg.normal(1.0, fg.full((4000,), 0.5), generator=g),
        lambda g: fg.normal(1.0, 0.5, (4000,), generator=g),
        lambda g: fg.normal(1.0, 0.5, size=(40, 100), generator=g),
    ],
)
def test_normal_overloads_and_generators(call) -> None:  # type: ignore[no-untyped-def]
    g = fg.Generator().manual_seed(3)
    a = _np(call(g))
    assert a.size == 4000 and a.dtype == np.float32
    assert abs(a.mean() - 1.0) < 5 * 0.5 / math.sqrt(4000)
    assert abs(a.std() - 0.5) < 0.05
    np.testing.assert_array_equal(_np(call(fg.Generator().manual_seed(3))), a)
    assert not np.array_equal(_np(call(g)), a)  # the generator moved on
    # the default generator, reseeded, repeats itself
    fg.manual_seed(9)
    first = _np(call(None))
    fg.manual_seed(9)
    np.testing.assert_array_equal(_np(call(None)), first)


def test_normal_dtypes_and_requires_grad() -> None:
    assert fg.normal(2.0, 3.0, (2,), dtype=fg.float64).dtype == fg.float64
    assert fg.normal(fg.zeros(2, dtype=fg.float64), 1.0).dtype == fg.float64
    assert fg.normal(0.0, fg.ones(2, dtype=fg.float64)).dtype == fg.float64
    assert fg.normal(fg.zeros(2), fg.ones(2, dtype=fg.float64)).dtype == fg.float32
    leaf = fg.normal(2.0, 3.0, (2,), requires_grad=True)
    assert leaf.requires_grad and leaf.is_leaf
    assert not fg.normal(fg.zeros(2), 1.0).requires_grad


def test_normal_and_poisson_gradients_are_zero_as_in_pytorch() -> None:
    m = fg.tensor([1.0, 2.0], requires_grad=True)
    s = fg.tensor([1.0, 2.0], requires_grad=True)
    out = fg.normal(m, s)
    assert out.requires_grad
    out.sum().backward()
    np.testing.assert_array_equal(_np(m.grad), [0.0, 0.0])
    np.testing.assert_array_equal(_np(s.grad), [0.0, 0.0])
    r = fg.tensor([1.0, 4.0], requires_grad=True)
    p = fg.poisson(r)
    assert p.requires_grad
    p.sum().backward()
    np.testing.assert_array_equal(_np(r.grad), [0.0, 0.0])
    if torch is not None:
        tm = torch.tensor([1.0, 2.0], requires_grad=True)
        torch.normal(tm, 1.0).sum().backward()
        assert tm.grad.tolist() == [0.0, 0.0]
        tr = torch.tensor([1.0], requires_grad=True)
        assert torch.poisson(tr).requires_grad


def test_poisson_follows_the_rates() -> None:
    fg.manual_seed(1)
    rates = fg.tensor([[0.0], [0.5], [3.0], [40.0]], dtype=fg.float64).expand(4, 20000)
    draws = _np(fg.poisson(rates))
    assert draws.dtype == np.float64
    assert (draws[0] == 0).all()
    assert (draws == np.round(draws)).all() and (draws >= 0).all()
    for row, lam in zip(draws[1:], (0.5, 3.0, 40.0)):
        assert abs(row.mean() - lam) < 5 * math.sqrt(lam / row.size)
        assert abs(row.var() - lam) < 0.05 * lam
    g = fg.Generator().manual_seed(4)
    a = _np(fg.poisson(fg.full((50,), 2.0), generator=g))
    b = _np(fg.poisson(fg.full((50,), 2.0), generator=fg.Generator().manual_seed(4)))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("call", "exc", "words"),
    [
        (lambda: fg.normal(fg.zeros(2), -1.0), RuntimeError, "std >= 0.0, but found std -1"),
        (lambda: fg.normal(0.0, fg.tensor([1.0, -1.0])), RuntimeError, "all elements of std"),
        (lambda: fg.normal(0.0, -2.0, (2,)), RuntimeError, "std >= 0.0"),
        (lambda: fg.normal(fg.zeros(2, dtype=fg.int64), 1.0), NotImplementedError, "int64"),
        (lambda: fg.normal(2.0, 3.0), TypeError, "size is required"),
        (lambda: fg.poisson(fg.tensor([-1.0])), RuntimeError, "rate to be non-negative"),
        (lambda: fg.poisson(fg.tensor([math.nan])), RuntimeError, "rate to be non-negative"),
        (lambda: fg.poisson(fg.tensor([1, 2])), NotImplementedError, "poisson_cpu"),
    ],
)
def test_errors(call, exc: type, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)


def test_compiled_step_redraws_normal_numbers_as_eager() -> None:
    """normal's draw is a creation the whole-step recording redraws on every replay: the
    compiled function gives eager's numbers for each seed, from one recording."""
    from fusegrad import compiler

    def step(x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
        noise = fg.normal(fg.zeros_like(x), 0.5)  # (float std: a pure draw)
        y = fg.normal(x * w, 0.1 + x.abs()) + noise
        loss = ((y - w) ** 2).sum()
        loss.backward()
        return loss.detach()

    compiler.reset()  # (counters and caches are per process: count this test's own)
    compiled = fg.compile(step)
    x = fg.randn(3, 4, dtype=fg.float64)
    w = fg.randn(4, dtype=fg.float64, requires_grad=True)
    for seed in range(4):
        w.grad = None
        fg.manual_seed(seed)
        want = step(x, w)
        want_grad = _np(w.grad).copy()
        w.grad = None
        fg.manual_seed(seed)
        got = compiled(x, w)
        np.testing.assert_allclose(_np(got), _np(want), rtol=1e-12)
        np.testing.assert_allclose(_np(w.grad), want_grad, rtol=1e-12)
    assert compiler.counters.step_captures == 1, compiler.counters
    assert compiler.counters.step_runs == 3, compiler.counters  # replayed, with fresh draws
    assert not compiler.counters.step_breaks, compiler.counters


def test_compiled_step_with_poisson_gives_eagers_draws() -> None:
    def draw(rates: fg.Tensor) -> fg.Tensor:
        return fg.poisson(rates * 2.0) + 1.0

    compiled = fg.compile(draw)
    rates = fg.rand(5, dtype=fg.float64) * 3
    for seed in range(3):
        fg.manual_seed(seed)
        want = draw(rates)
        fg.manual_seed(seed)
        np.testing.assert_array_equal(_np(compiled(rates)), _np(want))
