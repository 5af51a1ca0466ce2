"""Views and in-place mutation against PyTorch: the same programs (clone, views, in-place ops on
views, setitem with basic and advanced indices, chains of views) run in both libraries with the
same inputs and cotangents; forward values, gradients, version numbers, node names and error
texts are compared.  Skipped when torch is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg

torch = pytest.importorskip("torch")


# ---- programs: ``prog(lib, *leaves) -> tensor``, written once for both libraries ----------------


def _row_mul(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    b[0].mul_(w)
    return b * 2.0


def _setitem_column(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    b[:, 1] = w[:3]
    return b.sin()


def _copy_into_zeros(L: Any, a: Any, w: Any) -> Any:
    b = L.zeros(3, 4, dtype=a.dtype)
    head = b[0]  # made before the base requires grad
    b[1:].copy_(a[1:] * w)
    return b * a + head.sum()


def _transposed_slices(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    v = b.t()[1:]  # (3, 3)
    v.mul_(w[:3])
    v.add_(1.0)
    return b.exp() + v.sum()


def _flat_view_and_diagonal(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    b.view(12)[3:7].mul_(w)
    b.diagonal().zero_()
    return b * b


def _rows_and_columns(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    r = b[1]
    r.mul_(w)
    r.sigmoid_()  # saves its output; nothing writes b afterwards
    return b.tanh() + r.sum()


def _advanced_setitem(L: Any, a: Any, w: Any) -> Any:
    b = a * 1.0
    b[[0, 2], [1, 3]] = w[:2]
    b[b > 0.5] = 0.0
    return b * a


def _permuted_view_chain(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    v = b[1:, :2].unsqueeze(0).squeeze(0).permute(1, 0)  # (2, 2)
    v.clamp_(-0.5, 0.5)
    v.mul_(w[:2].unsqueeze(1))
    return b.sum(0)


def _sibling_views(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    x, y = b[0], b[1]
    x.mul_(w)
    z = y * 3.0
    return z + x + b.sum(0)


def _augmented_assignment(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    b[0] += w
    b[1:] *= 2.0
    b[:, 2] -= w[1]
    b.mul_(a)
    return b


def _masked_and_divided(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    v = b.reshape(4, 3)
    v[:, 0].masked_fill_(v[:, 0] > 0, 2.0)
    v.transpose(0, 1)[2].div_(w)
    return b


def _transpose_and_diagonal(L: Any, a: Any, w: Any) -> Any:
    b = a[:, :3].clone()  # (3, 3)
    b.T[0].copy_(w[:3])
    b.diagonal(1).mul_(w[:2])
    return b.sum(1)


def _narrow_select(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    b.narrow(1, 1, 2).select(0, 2).pow_(2)
    b.select(1, 0).sub_(w[:3])
    return b


def _view_of_view(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    v = b[0]
    v[1:3].mul_(w[:2])
    return v * b[0] + b.sum()


def _index_ops(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    b.index_add_(0, L.tensor([0, 2, 0]), w.reshape(1, 4).expand(3, 4) * 1.0)
    b.t().index_fill_(0, L.tensor([1]), 0.5)
    b[1:].index_copy_(1, L.tensor([3, 0]), w[:2].reshape(1, 2).expand(2, 2) * 2.0)
    b.scatter_(1, L.tensor([[0], [1], [2]]), w[:3].reshape(3, 1))
    return b


def _expanded_row(L: Any, a: Any, w: Any) -> Any:
    b = a[0] * 1.0
    b.expand(5, 4)[2].mul_(w)  # a view of an expanded view without repeated elements
    return b * a


def _zero_dim(L: Any, a: Any, w: Any) -> Any:
    b = a * 1.0
    b[1, 2].mul_(w[0])
    s = a.sum() * 1.0
    s.view(1).mul_(w[1])
    s.unsqueeze(0)[0].add_(1.0)
    return b + s


def _fill_lerp_addcmul(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    b[2].fill_(w[3])
    b[0].lerp_(w, 0.25)
    b[:, 1].addcmul_(w[:3], w[1:], value=0.5)
    return b.exp()


def _broadcast_setitem(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    b[:, 1:3] = w[:3].unsqueeze(1)
    b[0][1:] = w[0]
    return b * b


def _base_modified_after_views(L: Any, a: Any, w: Any) -> Any:
    b = a.clone()
    head, tail = b[:1], b.t()[2:]
    b.mul_(w)  # the base itself: both views follow its new history
    tail.add_(head.sum())
    return head * 3.0 + tail.sum()


def _relu_clamp_on_views(L: Any, a: Any, w: Any) -> Any:
    b = a * w
    b[1].clamp_(min=-0.1)
    b.diagonal().neg_()
    b[:, ::2].relu_()  # last: relu saves its output, a later write would invalidate it in torch
    return b


PROGRAMS: list[Callable[..., Any]] = [
    _row_mul,
    _setitem_column,
    _copy_into_zeros,
    _transposed_slices,
    _flat_view_and_diagonal,
    _rows_and_columns,
    _advanced_setitem,
    _permuted_view_chain,
    _sibling_views,
    _augmented_assignment,
    _masked_and_divided,
    _transpose_and_diagonal,
    _narrow_select,
    _view_of_view,
    _index_ops,
    _expanded_row,
    _zero_dim,
    _fill_lerp_addcmul,
    _broadcast_setitem,
    _base_modified_after_views,
    _relu_clamp_on_views,
]


def _inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((3, 4)), rng.uniform(0.5, 1.5, 4)]


def _run(lib: Any, prog: Callable, arrays: list[np.ndarray], cot: np.ndarray | None) -> tuple:
    leaves = [lib.tensor(a, requires_grad=True) for a in arrays]
    out = prog(lib, *leaves)
    g = lib.tensor(cot if cot is not None else np.ones(tuple(out.shape)))
    out.backward(g)
    return out.detach().numpy().copy(), [leaf.grad.numpy().copy() for leaf in leaves]


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.__name__.strip("_") for p in PROGRAMS])
def test_program_matches_torch(prog: Callable) -> None:
    arrays = _inputs(PROGRAMS.index(prog))
    theirs = _run(torch, prog, arrays, None)
    cot = np.random.default_rng(99).standard_normal(theirs[0].shape)
    theirs = _run(torch, prog, arrays, cot)
    ours = _run(fg, prog, arrays, cot)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-12, atol=1e-12)
    for mine, ref in zip(ours[1], theirs[1]):
        np.testing.assert_allclose(mine, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("prog", PROGRAMS[:8], ids=[p.__name__.strip("_") for p in PROGRAMS[:8]])
def test_second_order_matches_torch(prog: Callable) -> None:
    arrays = _inputs(50 + PROGRAMS.index(prog))
    results = []
    for lib in (fg, torch):
        leaves = [lib.tensor(a, requires_grad=True) for a in arrays]
        out = prog(lib, *leaves)
        grads = lib.autograd.grad((out * out).sum(), leaves, create_graph=True)
        second = lib.autograd.grad(sum((g * g).sum() for g in grads), leaves)
        results.append([g.detach().numpy() for g in second])
    for mine, ref in zip(*results):
        np.testing.assert_allclose(mine, ref, rtol=1e-9, atol=1e-12)


# ---- version numbers ----------------------------------------------------------------------------


def _version_trace(L: Any) -> list[int]:
    b = L.zeros(3, 4, dtype=L.float64)
    v = b[1]
    alias = b.detach()
    seen = []
    for step in (
        lambda: b.add_(1.0),
        lambda: v.mul_(2.0),
        lambda: b.__setitem__(0, 3.0),
        lambda: b[:, 1].__iadd__(1.0),
        lambda: b.__setitem__((slice(None), 1), b[:, 1] + 1.0),
        lambda: b.t().zero_(),
        lambda: b.fill_(1.0),
        lambda: b.copy_(L.ones(3, 4, dtype=L.float64)),
        lambda: b.clamp_(0.0, 1.0),
        lambda: b.masked_fill_(b > 0, 2.0),
        lambda: b.scatter_(0, L.zeros(1, 4, dtype=L.int64), 1.0),
        lambda: b.index_add_(0, L.tensor([0]), L.ones(1, 4, dtype=L.float64)),
        lambda: b.relu_(),
        lambda: b.exp_(),
        lambda: b.sub_(1.0).div_(2.0),
        lambda: b.__setitem__(([0, 1], [1, 2]), L.tensor([5.0, 6.0], dtype=L.float64)),
        lambda: b.__setitem__(b > 3, 0.0),
        lambda: b.diagonal().sigmoid_(),
        lambda: alias.mul_(2.0),
        lambda: b.view(12)[::3].neg_(),
        lambda: b.data.add_(1.0),  # .data has a counter of its own
    ):
        step()
        seen.append(b._version)
        assert v._version == alias._version == b._version
    with L.no_grad():
        b.t()[0].tanh_()
        v.add_(1.0)
    seen.append(b._version)
    return seen


def test_version_numbers_match_torch() -> None:
    assert _version_trace(fg) == _version_trace(torch)


def test_version_numbers_with_autograd_match_torch() -> None:
    def trace(L: Any) -> list[int]:
        a = L.tensor(np.linspace(-1.0, 1.0, 12).reshape(3, 4), requires_grad=True)
        w = L.tensor(np.linspace(0.5, 1.0, 4), requires_grad=True)
        b = a.clone()
        seen = [b._version]
        b[0].mul_(w)
        seen.append(b._version)
        b[:, 1] = w[:3]
        seen.append(b._version)
        b += 1.0
        seen.append(b._version)
        b.t()[2].add_(w[1])
        seen.append(b._version)
        with L.no_grad():
            a.add_(1.0)
        seen.append(a._version)
        return seen

    assert trace(fg) == trace(torch)


# ---- node names after in-place ------------------------------------------------------------------

NAMED = [
    ("add_", lambda t, w: t.add_(w)),
    ("sub_", lambda t, w: t.sub_(w)),
    ("mul_", lambda t, w: t.mul_(w)),
    ("div_", lambda t, w: t.div_(w)),
    ("pow_", lambda t, w: t.pow_(2.0)),
    ("exp_", lambda t, w: t.exp_()),
    ("log_", lambda t, w: t.log_()),
    ("sin_", lambda t, w: t.sin_()),
    ("tanh_", lambda t, w: t.tanh_()),
    ("sigmoid_", lambda t, w: t.sigmoid_()),
    ("sqrt_", lambda t, w: t.sqrt_()),
    ("neg_", lambda t, w: t.neg_()),
    ("abs_", lambda t, w: t.abs_()),
    ("iadd", lambda t, w: t.__iadd__(w)),
    ("imul", lambda t, w: t.__imul__(w)),
]


@pytest.mark.parametrize("name,op", NAMED, ids=[n for n, _ in NAMED])
def test_rebased_node_name_matches_torch(name: str, op: Callable) -> None:
    names = []
    for L in (fg, torch):
        a = L.tensor([1.0, 2.0, 3.0], requires_grad=True)
        w = L.tensor([0.5, 1.5, 2.5], requires_grad=True)
        b = a.clone()
        op(b, w)
        names.append(b.grad_fn.name())
    assert names[0] == names[1]


# ---- errors -------------------------------------------------------------------------------------


def _leaf_inplace(L: Any) -> None:
    L.ones(3, requires_grad=True).add_(1.0)


def _leaf_view_inplace(L: Any) -> None:
    L.ones(3, requires_grad=True)[1:].mul_(2.0)


def _split_inplace(L: Any) -> None:
    L.ones(4, requires_grad=True).clone().split(2)[1].mul_(2.0)


def _unbind_inplace(L: Any) -> None:
    L.ones(2, 2, requires_grad=True).clone().unbind(0)[0].add_(1.0)


def _split_used_after_base_change(L: Any) -> None:
    b = L.ones(4, requires_grad=True).clone()
    p, _ = b.split(2)
    b.mul_(2.0)
    (p * 2.0).sum().backward()


def _no_grad_view_inplace(L: Any) -> None:
    b = L.ones(4, requires_grad=True).clone()
    with L.no_grad():
        v = b[:2]
    v.mul_(2.0)


def _no_grad_view_of_a_plain_tensor(L: Any) -> None:
    b = L.zeros(4, dtype=L.float64)
    with L.no_grad():
        v = b[:2]
    v.copy_(L.ones(2, dtype=L.float64, requires_grad=True))


def _no_grad_view_after_base_change(L: Any) -> None:
    b = L.ones(4, requires_grad=True).clone()
    with L.no_grad():
        v = b[:2]
    b.mul_(2.0)
    _ = v.grad_fn


def _expanded_inplace(L: Any) -> None:
    L.zeros(1, 3).expand(2, 3).add_(1.0)


def _inference_inplace(L: Any) -> None:
    with L.inference_mode():
        t = L.zeros(3)
    with L.no_grad():
        t.add_(1.0)


def _saved_base_modified_through_view(L: Any) -> None:
    b = L.ones(3, requires_grad=True) * 2.0
    y = (b * b).sum()
    b[0].mul_(3.0)
    y.backward()


_MULTI = (
    "This view is the output of a function that returns multiple views. Such functions do not "
    "allow the output views to be modified inplace. You should replace the inplace operation by "
    "an out-of-place one."
)
_NO_GRAD = (
    "Given that this use case is ambiguous and error-prone, it is forbidden. You can clarify "
    "your code by moving both the view and the inplace either both inside the no_grad block"
)
ERRORS = [
    (_leaf_inplace, "a leaf Variable that requires grad is being used in an in-place operation"),
    (_leaf_view_inplace, "a view of a leaf Variable that requires grad is being used in an"),
    (_split_inplace, f"is a view and is being modified inplace. {_MULTI}"),
    (_unbind_inplace, f"is a view and is being modified inplace. {_MULTI}"),
    (
        _split_used_after_base_change,
        f"is a view and its base or another view of its base has been modified inplace. {_MULTI}",
    ),
    (
        _no_grad_view_inplace,
        (
            "A view was created in no_grad mode and is being modified inplace with grad mode "
            f"enabled. {_NO_GRAD}"
        ),
    ),
    (
        _no_grad_view_of_a_plain_tensor,
        (
            "A view was created in no_grad mode and is being modified inplace with grad mode "
            f"enabled. {_NO_GRAD}"
        ),
    ),
    (
        _no_grad_view_after_base_change,
        (
            "A view was created in no_grad mode and its base or another view of its base has "
            f"been modified inplace with grad mode enabled. {_NO_GRAD}"
        ),
    ),
    (
        _expanded_inplace,
        (
            "unsupported operation: more than one element of the written-to tensor refers to a "
            "single memory location. Please clone() the tensor before performing the operation."
        ),
    ),
    (_inference_inplace, "Inplace update to inference tensor outside InferenceMode is not allowed"),
    (
        _saved_base_modified_through_view,
        "one of the variables needed for gradient computation has been modified by an inplace",
    ),
]


@pytest.mark.parametrize("program,text", ERRORS, ids=[p.__name__.strip("_") for p, _ in ERRORS])
def test_error_text_matches_torch(program: Callable, text: str) -> None:
    for L in (torch, fg):
        with pytest.raises(RuntimeError) as info:
            program(L)
        assert text in str(info.value), f"{L.__name__}: {info.value}"


def test_outputs_saved_by_inplace_ops_are_copies_in_fusegrad() -> None:
    """A documented difference: an in-place op whose rule saves its output (sigmoid_, exp_,
    tanh_, ...) keeps the out-of-place result it computed, so modifying the tensor again does not
    invalidate that node (PyTorch saves the tensor itself and raises).  The gradient is correct:
    the saved values are the ones the op produced."""

    def prog(L: Any, a: Any) -> Any:
        b = a.clone()
        b.sigmoid_()
        b.mul_(2.0)
        return b

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        prog(torch, torch.tensor([0.5, -1.0], requires_grad=True)).sum().backward()
    a = fg.tensor([0.5, -1.0], requires_grad=True)
    prog(fg, a).sum().backward()
    s = 1.0 / (1.0 + np.exp(-np.array([0.5, -1.0])))
    np.testing.assert_allclose(a.grad.numpy(), 2.0 * s * (1.0 - s), rtol=1e-6)


def test_requires_grad_and_leaf_flags_match_torch() -> None:
    def flags(L: Any) -> list:
        x = L.ones(2, requires_grad=True)
        b = L.zeros(3)
        head = b[:1]
        out = [b.requires_grad, head.requires_grad, b.is_leaf]
        b[1:].copy_(x)
        out += [b.requires_grad, head.requires_grad, b.is_leaf, head.is_leaf]
        with L.no_grad():
            c = b * 1.0
        out += [c.requires_grad, b.detach().requires_grad, b.data.requires_grad]
        out += [head._is_view(), b._is_view(), b.detach()._is_view(), b.data._is_view()]
        out += [b.t()._is_view(), b.reshape(3)._is_view(), b[[0, 1]]._is_view()]
        # a non-differentiable in-place result keeps the tensor in the graph (zero gradient)
        y = L.ones(3, requires_grad=True) * 1.0
        y.eq_(1.0)
        z = L.ones(3, requires_grad=True) * 1.0
        z[1:].ge_(0.0)
        out += [y.requires_grad, y.is_leaf, z.requires_grad, z.is_leaf]
        return out

    assert flags(fg) == flags(torch)
