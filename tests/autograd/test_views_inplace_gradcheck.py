"""gradcheck and gradgradcheck (float64, central differences) through programs that modify views
in place: the rewritten base history (index_put at the view's positions), the regenerated view
nodes and the in-place ops' own rules must give exact first and second derivatives.  A few
programs also mix in tensor hooks and activation checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import gradcheck, gradgradcheck
from fusegrad.utils.checkpoint import checkpoint


def _row_scale(a: Any, w: Any) -> Any:
    b = a.clone()
    b[0].mul_(w)
    return b.sin()


def _column_assign(a: Any, w: Any) -> Any:
    b = a * 1.0
    b[:, 1] = w[:3] * w[:3]
    return b * a


def _base_from_zeros(a: Any, w: Any) -> Any:
    b = fg.zeros(3, 4, dtype=fg.float64)
    b[1:].copy_(a[1:] * w)
    b[0].add_(w.exp())
    return b.tanh()


def _chain_of_views(a: Any, w: Any) -> Any:
    b = a.clone()
    v = b.t()[1:].unsqueeze(0)[0]  # (3, 3)
    v.mul_(w[1:])
    v.diagonal().sigmoid_()
    return b * b


def _sibling_and_base(a: Any, w: Any) -> Any:
    b = a * 2.0
    r0, col = b[0], b[:, 3]
    r0.mul_(w)
    col.add_(r0[1])
    b.mul_(a)
    return b + col.sum()


def _advanced_on_view(a: Any, w: Any) -> Any:
    b = a.clone()
    v = b.view(2, 6)
    v[[0, 1, 1], [5, 0, 2]] = w[:3]
    v[:, 1::2].div_(w[3] + 2.0)
    return b


def _augmented(a: Any, w: Any) -> Any:
    b = a.clone()
    b[1:] *= w
    b[:, :2] += b[0, :2].exp()
    b.narrow(1, 2, 2).select(0, 0).pow_(2)
    return b


def _zero_dim_views(a: Any, w: Any) -> Any:
    b = a * 1.0
    b[2, 3].mul_(w[0])
    s = (a * a).sum()
    s.view(1).mul_(w[1])
    return b * s


def _index_ops(a: Any, w: Any) -> Any:
    b = a.clone()
    b.index_add_(1, fg.tensor([0, 3, 0]), a[:, :3] * w[:3], alpha=0.5)
    b[1:].index_copy_(1, fg.tensor([2]), (w[:2] * w[1:3]).reshape(2, 1))
    b.t()[1].index_fill_(0, fg.tensor([0, 2]), 0.0)
    return b


HOOK_CALLS: list = []


def _with_hook(a: Any, w: Any) -> Any:
    b = a.clone()
    row = b[1]
    row.mul_(w)
    # bound to the regenerated view node; it replaces the gradient by an equal tensor
    row.register_hook(lambda g: HOOK_CALLS.append(g) or g * 1.0)
    b.register_hook(lambda g: g.clone())
    return row * 3.0 + b.sum(0)


def _with_checkpoint(a: Any, w: Any) -> Any:
    # non-reentrant checkpointing: gradcheck differentiates with grad(), which the reentrant
    # variant does not support (as in PyTorch)
    def block(x: Any, y: Any) -> Any:
        b = x.clone()
        b[0].mul_(y)
        b.t()[2].add_(b[1, 1])
        return b.tanh()

    h = checkpoint(block, a, w, use_reentrant=False)
    return checkpoint(block, h * 0.5, w, use_reentrant=False)


PROGRAMS: list[Callable[..., Any]] = [
    _row_scale,
    _column_assign,
    _base_from_zeros,
    _chain_of_views,
    _sibling_and_base,
    _advanced_on_view,
    _augmented,
    _zero_dim_views,
    _index_ops,
    _with_hook,
    _with_checkpoint,
]


def _inputs(seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    a = fg.tensor(rng.uniform(0.5, 1.5, (3, 4)), requires_grad=True)
    w = fg.tensor(rng.uniform(0.5, 1.5, 4), requires_grad=True)
    return a, w


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.__name__.strip("_") for p in PROGRAMS])
def test_gradcheck_through_inplace_on_views(prog: Callable) -> None:
    HOOK_CALLS.clear()
    assert gradcheck(prog, _inputs(PROGRAMS.index(prog)))
    assert (prog is _with_hook) == bool(HOOK_CALLS), "the view hook runs in backward"


def test_reentrant_checkpoint_with_inplace_on_views_matches_plain_backward() -> None:
    def block(x: Any, y: Any) -> Any:
        b = x.clone()
        b[0].mul_(y)
        b.t()[2].add_(b[1, 1])
        return b.tanh()

    grads = []
    for wrap in (lambda f, *xs: f(*xs), lambda f, *xs: checkpoint(f, *xs, use_reentrant=True)):
        a, w = _inputs(7)
        (wrap(block, wrap(block, a, w) * 0.5, w) ** 2).sum().backward()
        grads.append((a.grad.numpy(), w.grad.numpy()))
    for mine, ref in zip(*grads):
        np.testing.assert_allclose(mine, ref, rtol=1e-12)


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.__name__.strip("_") for p in PROGRAMS])
def test_gradgradcheck_through_inplace_on_views(prog: Callable) -> None:
    assert gradgradcheck(prog, _inputs(100 + PROGRAMS.index(prog)))


def test_gradcheck_catches_a_wrong_view_gradient() -> None:
    """The check above can fail: a program whose hook corrupts the gradient of a modified view
    is reported as a Jacobian mismatch."""

    def wrong(a: Any, w: Any) -> Any:
        b = a.clone()
        b[0].mul_(w)
        b.register_hook(lambda g: g + 1.0 if g.shape == (3, 4) else g)
        return b

    with pytest.raises(RuntimeError, match="Jacobian mismatch"):
        gradcheck(wrong, _inputs(0))
