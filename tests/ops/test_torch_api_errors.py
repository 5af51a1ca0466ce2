"""Errors of the PyTorch-API composites added for issue 11 (addmm, baddbmm, addbmm, cross, diff,
repeat_interleave): each bad call raises fusegrad's class for it, names the op, and PyTorch
rejects the same call (so the check is not stricter than PyTorch).  Values and gradients are in
the op table (``op_table.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad
from fusegrad import DTypeError, ShapeError

torch = pytest.importorskip("torch")


def _both(fn: Callable[[Any], Any]) -> tuple[Callable[[], Any], Callable[[], Any]]:
    return (lambda: fn(fusegrad)), (lambda: fn(torch))


def _t(lib: Any, shape: tuple, dtype: str = "float64") -> Any:
    data = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    return lib.tensor(data)


CASES = [
    ("addmm", ShapeError, lambda m: m.addmm(_t(m, (2, 2)), _t(m, (2, 3)), _t(m, (3, 4)))),
    ("addmm", ShapeError, lambda m: m.addmm(_t(m, (4,)), _t(m, (2, 3)), _t(m, (2, 4)))),
    ("addmm", ShapeError, lambda m: m.addmm(_t(m, (4,)), _t(m, (3,)), _t(m, (3, 4)))),
    (
        "baddbmm",
        ShapeError,
        lambda m: m.baddbmm(_t(m, (3, 2, 4)), _t(m, (2, 2, 3)), _t(m, (2, 3, 4))),
    ),
    ("addbmm", ShapeError, lambda m: m.addbmm(_t(m, (2, 4)), _t(m, (2, 3)), _t(m, (3, 4)))),
    ("cross", ShapeError, lambda m: m.cross(_t(m, (2, 4)), _t(m, (2, 4)), dim=1)),
    ("cross", ShapeError, lambda m: m.cross(_t(m, (2, 3)), _t(m, (3,)), dim=-1)),
    ("cross", ShapeError, lambda m: m.cross(_t(m, (2, 3)), _t(m, (4, 3)), dim=-1)),
    ("cross", IndexError, lambda m: m.cross(_t(m, (2, 3)), _t(m, (2, 3)), dim=2)),
    ("cross", DTypeError, lambda m: m.cross(_t(m, (3,)), _t(m, (3,), "float32"), dim=0)),
    ("diff", ShapeError, lambda m: m.diff(_t(m, ()))),
    ("diff", ValueError, lambda m: m.diff(_t(m, (3,)), n=-1)),
    (
        "repeat_interleave",
        ShapeError,
        lambda m: m.repeat_interleave(_t(m, (3, 2)), m.tensor([1, 2]), dim=0),
    ),
    (
        "repeat_interleave",
        ShapeError,
        lambda m: m.repeat_interleave(_t(m, (3, 2)), m.tensor([1, -1, 2]), dim=0),
    ),
    (
        "repeat_interleave",
        ShapeError,
        lambda m: m.repeat_interleave(_t(m, (3, 2)), m.tensor([1, -1, 2]), dim=0, output_size=2),
    ),
    ("repeat_interleave", ShapeError, lambda m: m.repeat_interleave(_t(m, (3,)), -1)),
    (
        "repeat_interleave",
        ShapeError,
        lambda m: m.repeat_interleave(_t(m, (3, 2)), m.tensor([1, 0, 2]), dim=0, output_size=4),
    ),
]


@pytest.mark.parametrize("name,error,call", CASES, ids=[f"{c[0]}{i}" for i, c in enumerate(CASES)])
def test_bad_calls_raise_like_pytorch(name: str, error: type, call: Callable[[Any], Any]) -> None:
    ours, theirs = _both(call)
    with pytest.raises(error, match=name):
        ours()
    with pytest.raises((RuntimeError, ValueError, IndexError, TypeError)):
        theirs()


def test_addmm_beta_zero_ignores_nan_in_input() -> None:
    c = fusegrad.full((2, 2), float("nan"), dtype=fusegrad.float64, requires_grad=True)
    a = fusegrad.ones(2, 3, dtype=fusegrad.float64)
    out = fusegrad.addmm(c, a, a.mT, beta=0, alpha=2)
    np.testing.assert_array_equal(out.detach().numpy(), np.full((2, 2), 6.0))
    ref = torch.addmm(
        torch.tensor(c.detach().numpy()),
        torch.ones(2, 3).double(),
        torch.ones(3, 2).double(),
        beta=0,
        alpha=2,
    )
    np.testing.assert_array_equal(out.detach().numpy(), ref.numpy())
    out.sum().backward()  # input gets a zero gradient, as in PyTorch (not None)
    np.testing.assert_array_equal(c.grad.numpy(), np.zeros((2, 2)))


def test_cumprod_gradient_with_two_zeros_matches_pytorch() -> None:
    data = np.array([2.0, 0.0, 3.0, 0.0, 5.0])
    x = fusegrad.tensor(data, requires_grad=True)
    x.cumprod(0).sum().backward()
    tx = torch.tensor(data, requires_grad=True)
    tx.cumprod(0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
    # d/dx1 of x0*x1 + x0*x1*x2 (later terms hold x3 = 0) is 2 + 2*3, not nan as via log
    assert x.grad.numpy()[1] == 8.0
