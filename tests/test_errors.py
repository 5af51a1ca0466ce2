"""Error classes against PyTorch (``errors.py``): every kind of shape mismatch is a ``ShapeError``,
catchable as ``RuntimeError`` (what PyTorch raises for the same call, checked here when torch is
importable) and still as ``ValueError`` (what fusegrad raised before, so old callers keep
working)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import fusegrad
from fusegrad import ShapeError


def _backward_with_wrong_root_gradient(m: Any) -> None:
    x = m.ones(2, requires_grad=True)
    (x * 2).backward(m.ones(3))


def _grad_with_wrong_grad_outputs(m: Any) -> None:
    x = m.ones(2, requires_grad=True)
    m.autograd.grad(x * 2, x, m.ones(3))


def _setitem_wrong_shape(m: Any) -> None:
    x = m.ones(4)
    x[0:2] = m.ones(3)


def _inplace_broadcast_to_larger(m: Any) -> None:
    m.ones(3).add_(m.ones(2, 3))


def _view_of_transpose(m: Any) -> None:
    m.ones(2, 3).t().view(6)


def _long(m: Any, *shape: int) -> Any:
    return m.zeros(*shape, dtype=m.int64)


# name -> the same call written for a module ``m`` (fusegrad or torch) and its functional ``F``
CASES: dict[str, Callable[[Any, Any], Any]] = {
    "broadcast (add)": lambda m, F: m.ones(3, 4) + m.ones(5),
    "broadcast (where)": lambda m, F: m.where(m.ones(3) > 0, m.ones(4), m.ones(5)),
    "broadcast_to": lambda m, F: m.ones(3).broadcast_to((4,)),
    "expand": lambda m, F: m.ones(3).expand(4),
    "in-place broadcast": lambda m, F: _inplace_broadcast_to_larger(m),
    "copy_": lambda m, F: m.ones(3).copy_(m.ones(4)),
    "setitem": lambda m, F: _setitem_wrong_shape(m),
    "take_along_dim": lambda m, F: m.take_along_dim(m.ones(2, 3), _long(m, 3, 3), 1),
    "matmul": lambda m, F: m.ones(3, 4) @ m.ones(5, 6),
    "matmul batch dims": lambda m, F: m.ones(2, 3, 4) @ m.ones(3, 4, 5),
    "mm": lambda m, F: m.mm(m.ones(3, 4), m.ones(5, 6)),
    "bmm": lambda m, F: m.bmm(m.ones(2, 3, 4), m.ones(2, 5, 6)),
    "dot": lambda m, F: m.dot(m.ones(3), m.ones(4)),
    "einsum": lambda m, F: m.einsum("ij,jk->ik", m.ones(2, 3), m.ones(4, 5)),
    "linear": lambda m, F: F.linear(m.ones(2, 3), m.ones(4, 5)),
    "conv2d": lambda m, F: F.conv2d(m.ones(1, 3, 5, 5), m.ones(2, 4, 3, 3)),
    "layer_norm": lambda m, F: F.layer_norm(m.ones(2, 3), (4,)),
    "view": lambda m, F: m.ones(6).view(4),
    "view of a non-contiguous tensor": lambda m, F: _view_of_transpose(m),
    "reshape": lambda m, F: m.ones(6).reshape(4),
    "unflatten": lambda m, F: m.ones(6).unflatten(0, (4, 2)),
    "permute": lambda m, F: m.ones(2, 3).permute(0),
    "cat": lambda m, F: m.cat([m.ones(2, 3), m.ones(2, 4)]),
    "stack": lambda m, F: m.stack([m.ones(2, 3), m.ones(2, 4)]),
    "split sizes": lambda m, F: m.split(m.ones(5), [2, 2]),
    "gather": lambda m, F: m.gather(m.ones(2, 3), 1, _long(m, 2, 3, 4)),
    "backward: Mismatch in shape": lambda m, F: _backward_with_wrong_root_gradient(m),
    "grad: Mismatch in shape": lambda m, F: _grad_with_wrong_grad_outputs(m),
}


def test_shape_error_is_runtime_and_value_error() -> None:
    assert issubclass(ShapeError, RuntimeError)
    assert issubclass(ShapeError, ValueError)
    assert issubclass(ShapeError, fusegrad.FusegradError)


@pytest.mark.parametrize("name", list(CASES))
def test_shape_error_classes(name: str) -> None:
    call = CASES[name]
    with pytest.raises(RuntimeError) as info:
        call(fusegrad, fusegrad.nn.functional)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ShapeError)
    # an old ``except ValueError`` still catches it
    with pytest.raises(ValueError):
        call(fusegrad, fusegrad.nn.functional)


@pytest.mark.parametrize("name", list(CASES))
def test_torch_raises_runtime_error_for_the_same_call(name: str) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError):
        CASES[name](torch, torch.nn.functional)


def test_mismatch_in_shape_message_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="Mismatch in shape: grad_output\\[0\\]") as ours:
        _backward_with_wrong_root_gradient(fusegrad)
    with pytest.raises(RuntimeError, match="Mismatch in shape: grad_output\\[0\\]") as theirs:
        _backward_with_wrong_root_gradient(torch)
    assert str(ours.value).replace("fusegrad", "torch") == str(theirs.value)
