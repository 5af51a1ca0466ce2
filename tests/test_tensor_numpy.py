"""numpy interop of ``Tensor`` (``tensor.py``): ``numpy()``, ``np.asarray(t)``, ``np.array(t)``
and ``t.__array__()`` refuse a tensor that requires grad with PyTorch's message (the array would
silently leave the graph), work for one that does not, and a read through ``np.asarray`` inside
a compiled step is still seen as a host read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg

MESSAGE = "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."

READS: dict[str, Callable[[Any], Any]] = {
    "numpy()": lambda t: t.numpy(),
    "np.asarray": lambda t: np.asarray(t),
    "np.asarray with dtype": lambda t: np.asarray(t, dtype=np.float32),
    "np.array": lambda t: np.array(t),
    "__array__": lambda t: t.__array__(),
    "np.testing": lambda t: np.testing.assert_allclose(t, 2.0),
}


def _requiring_grad(lib: Any) -> dict[str, Any]:
    leaf = lib.ones(2, dtype=lib.float64, requires_grad=True)
    return {"leaf": leaf, "non-leaf": leaf * 2.0}


@pytest.mark.parametrize("kind", ["leaf", "non-leaf"])
@pytest.mark.parametrize("read", list(READS))
def test_reading_a_tensor_that_requires_grad_raises(read: str, kind: str) -> None:
    t = _requiring_grad(fg)[kind]
    with pytest.raises(RuntimeError) as info:
        READS[read](t)
    assert str(info.value) == MESSAGE
    assert isinstance(info.value, fg.AutogradError)
    assert t.requires_grad and t._version == 0  # nothing changed


@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept:DeprecationWarning")
@pytest.mark.parametrize("kind", ["leaf", "non-leaf"])
@pytest.mark.parametrize("read", list(READS))
def test_torch_raises_the_same(read: str, kind: str) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as info:
        READS[read](_requiring_grad(torch)[kind])
    assert str(info.value) == MESSAGE


@pytest.mark.parametrize("read", [r for r in READS if r != "np.testing"])
def test_tensors_that_do_not_require_grad_convert(read: str) -> None:
    t = fg.tensor([1.5, -2.0], dtype=fg.float64, requires_grad=True)
    for free in (t.detach(), (t * 1.0).detach(), fg.tensor([1.5, -2.0], dtype=fg.float64)):
        arr = READS[read](free)
        assert isinstance(arr, np.ndarray)
        np.testing.assert_array_equal(arr, [1.5, -2.0])
    with fg.no_grad():
        np.testing.assert_array_equal(READS[read](t * 2.0), [3.0, -4.0])
    np.testing.assert_array_equal(READS[read](fg.tensor([1, 2])), [1, 2])  # an int tensor
    assert np.asarray(t.detach(), dtype=np.float32).dtype == np.float32
    assert t.numpy(force=True).tolist() == [1.5, -2.0]  # PyTorch's escape hatch
    assert float(t.sum()) == -0.5  # __float__ is not __array__ (PyTorch allows it too)


def test_np_asarray_in_a_compiled_step_is_a_host_read() -> None:
    from fusegrad import compiler

    compiler.reset()
    fg.manual_seed(0)
    w = fg.randn(3, 2, dtype=fg.float64, requires_grad=True)

    def step(x: fg.Tensor) -> float:
        loss = (x @ w).square().sum()
        loss.backward()
        return float(np.asarray(loss.detach()).sum())

    compiled = fg.compile(step)
    for i in range(3):
        x = fg.tensor(np.random.default_rng(i).standard_normal((4, 3)), dtype=fg.float64)
        assert compiled(x) == pytest.approx(step(x), rel=1e-12)
    breaks = compiler.counters.step_breaks
    assert any("numpy.asarray()" in reason for reason in breaks), breaks
    compiler.reset()


def test_np_asarray_of_a_tensor_requiring_grad_raises_in_a_compiled_function() -> None:
    w = fg.ones(3, 2, dtype=fg.float64, requires_grad=True)

    def fn(x: fg.Tensor) -> Any:
        return np.asarray(x @ w)

    with pytest.raises(RuntimeError, match="Can't call numpy\\(\\) on Tensor that requires grad"):
        fg.compile(fn)(fg.ones(4, 3, dtype=fg.float64))
