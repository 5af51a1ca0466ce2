"""Views and in-place mutation: shared storage and version counters, version checks through views,
leaf errors, history rebasing, in-place on views (the base's history is rewritten, PyTorch's
CopySlices), lazily regenerated view ``grad_fn``, multi-output and no_grad-created views, ``.data``,
expanded views, inference tensors and the index_* in-place ops.

Gradients are checked against numpy references written out by hand; the same programs are run
against PyTorch in ``test_views_inplace_torch.py`` and through gradcheck in
``test_views_inplace_gradcheck.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.errors import AutogradError

MODIFIED = "one of the variables needed for gradient computation has been modified by an inplace"
MULTI = "This view is the output of a function that returns multiple views"
LEAF = "a leaf Variable that requires grad is being used in an in-place operation"
VIEW_OF_LEAF = "a view of a leaf Variable that requires grad is being used in an in-place operation"
NO_GRAD_VIEW = "A view was created in no_grad mode and"
OVERLAP = "more than one element of the written-to tensor refers to a single memory location"
INFERENCE = "Inplace update to inference tensor outside InferenceMode is not allowed"


def _leaf(shape: tuple, seed: int = 0) -> fg.Tensor:
    rng = np.random.default_rng(seed)
    return fg.tensor(rng.standard_normal(shape), requires_grad=True)


def _grid() -> fg.Tensor:
    return fg.arange(12.0, dtype=fg.float64).reshape(3, 4).clone()


# ---- views share storage and one version counter ------------------------------------------------

VIEW_OPS: list[tuple[str, Callable[[Any], Any]]] = [
    ("view", lambda x: x.view(12)),
    ("reshape", lambda x: x.reshape(2, 6)),
    ("flatten", lambda x: x.flatten()),
    ("transpose", lambda x: x.transpose(0, 1)),
    ("permute", lambda x: x.permute(1, 0)),
    ("T", lambda x: x.T),
    ("t", lambda x: x.t()),
    ("slice", lambda x: x[1:, ::2]),
    ("select", lambda x: x.select(1, 2)),
    ("narrow", lambda x: x.narrow(1, 1, 2)),
    ("index_int", lambda x: x[2]),
    ("element", lambda x: x[1, 3]),
    ("squeeze", lambda x: x[None].squeeze(0)),
    ("unsqueeze", lambda x: x.unsqueeze(1)),
    ("expand", lambda x: x[:1].expand(4, 4)),
    ("diagonal", lambda x: x.diagonal()),
    ("diagonal_offset", lambda x: x.diagonal(1)),
    ("movedim", lambda x: x.movedim(0, 1)),
    ("view_of_view", lambda x: x.t()[1:].unsqueeze(0)[0, :, 1]),
]


@pytest.mark.parametrize("name,fn", VIEW_OPS, ids=[n for n, _ in VIEW_OPS])
def test_views_share_storage_base_and_version(name: str, fn: Callable) -> None:
    x = _grid()
    v = fn(x)
    assert v._base is x, "a view (also of a view) records the root base"
    assert np.shares_memory(v.numpy(), x.numpy())
    d = x.detach()
    x.add_(1.0)
    assert x._version == v._version == d._version == 1
    if name != "expand":
        v.mul_(2.0)  # writing the view writes the base and bumps the shared counter
        assert x._version == v._version == d._version == 2
    assert x.detach()._base is None and not x.detach().requires_grad


@pytest.mark.parametrize("name,fn", VIEW_OPS, ids=[n for n, _ in VIEW_OPS])
def test_view_values_follow_the_base(name: str, fn: Callable) -> None:
    x = _grid()
    v = fn(x)
    expected = fn(fg.tensor(x.numpy() * 3.0 + 1.0)).numpy()
    x.mul_(3.0).add_(1.0)
    np.testing.assert_array_equal(v.numpy(), expected)


def test_reshape_that_copies_is_not_a_view() -> None:
    x = _grid()
    y = x.t().reshape(12)  # non-contiguous: reshape copies
    assert y._base is None and not np.shares_memory(y.numpy(), x.numpy())
    x.add_(1.0)
    assert y._version == 0


# ---- every in-place op bumps the version, also under no_grad ------------------------------------

INPLACE_OPS: list[tuple[str, Callable[[Any], Any]]] = [
    ("add_", lambda t: t.add_(1.0)),
    ("add_alpha", lambda t: t.add_(fg.ones(3, 4, dtype=fg.float64), alpha=2.0)),
    ("sub_", lambda t: t.sub_(0.5)),
    ("mul_", lambda t: t.mul_(2.0)),
    ("div_", lambda t: t.div_(2.0)),
    ("true_divide_", lambda t: t.true_divide_(2.0)),
    ("pow_", lambda t: t.pow_(2.0)),
    ("neg_", lambda t: t.neg_()),
    ("abs_", lambda t: t.abs_()),
    ("exp_", lambda t: t.exp_()),
    ("exp2_", lambda t: t.exp2_()),
    ("expm1_", lambda t: t.expm1_()),
    ("log_", lambda t: t.abs_().add_(1.0).log_()),
    ("log2_", lambda t: t.log2_()),
    ("log10_", lambda t: t.log10_()),
    ("log1p_", lambda t: t.log1p_()),
    ("sqrt_", lambda t: t.sqrt_()),
    ("rsqrt_", lambda t: t.rsqrt_()),
    ("sin_", lambda t: t.sin_()),
    ("cos_", lambda t: t.cos_()),
    ("tan_", lambda t: t.tan_()),
    ("tanh_", lambda t: t.tanh_()),
    ("sigmoid_", lambda t: t.sigmoid_()),
    ("relu_", lambda t: t.relu_()),
    ("clamp_", lambda t: t.clamp_(2.0, 5.0)),
    ("clip_", lambda t: t.clip_(max=5.0)),
    ("clamp_min_", lambda t: t.clamp_min_(3.0)),
    ("clamp_max_", lambda t: t.clamp_max_(3.0)),
    ("floor_", lambda t: t.floor_()),
    ("ceil_", lambda t: t.ceil_()),
    ("round_", lambda t: t.round_()),
    ("trunc_", lambda t: t.trunc_()),
    ("fix_", lambda t: t.fix_()),
    ("sign_", lambda t: t.sign_()),
    ("square_", lambda t: t.square_()),
    ("reciprocal_", lambda t: t.reciprocal_()),
    ("erf_", lambda t: t.erf_()),
    ("lerp_", lambda t: t.lerp_(fg.zeros(3, 4, dtype=fg.float64), 0.5)),
    ("remainder_", lambda t: t.remainder_(5.0)),
    ("floor_divide_", lambda t: t.floor_divide_(5.0)),
    ("nan_to_num_", lambda t: t.nan_to_num_()),
    ("zero_", lambda t: t.zero_()),
    ("fill_", lambda t: t.fill_(7.0)),
    ("copy_", lambda t: t.copy_(fg.ones(4, dtype=fg.float64))),
    ("masked_fill_", lambda t: t.masked_fill_(t > 5, 0.0)),
    ("index_add_", lambda t: t.index_add_(0, fg.tensor([0, 2]), fg.ones(2, 4, dtype=fg.float64))),
    ("index_copy_", lambda t: t.index_copy_(1, fg.tensor([3]), fg.ones(3, 1, dtype=fg.float64))),
    ("index_fill_", lambda t: t.index_fill_(1, fg.tensor([0, 1]), -1.0)),
    ("scatter_", lambda t: t.scatter_(0, fg.tensor([[2, 0, 1, 0]]), 9.0)),
    (
        "scatter_add_",
        lambda t: t.scatter_add_(1, fg.tensor([[0], [0], [3]]), fg.ones(3, 1, dtype=fg.float64)),
    ),
    ("addcmul_", lambda t: t.addcmul_(t + 1.0, t - 2.0, value=0.5)),  # add saves nothing
    ("addcdiv_", lambda t: t.addcdiv_(t - 1.0, t + 1.0, value=0.5)),
    ("eq_", lambda t: t.eq_(3.0)),
    ("lt_", lambda t: t.lt_(3.0)),
    ("ge_", lambda t: t.ge_(3.0)),
    ("logical_not_", lambda t: t.logical_not_()),
    ("setitem_int", lambda t: t.__setitem__(0, 1.0)),
    ("setitem_slice", lambda t: t.__setitem__((slice(None), 1), fg.ones(3, dtype=fg.float64))),
    ("setitem_advanced", lambda t: t.__setitem__(([0, 2], [1, 3]), 5.0)),
    ("setitem_mask", lambda t: t.__setitem__(t > 6, 0.0)),
    ("iadd", lambda t: t.__iadd__(1.0)),
    ("isub", lambda t: t.__isub__(1.0)),
    ("imul", lambda t: t.__imul__(2.0)),
    ("itruediv", lambda t: t.__itruediv__(2.0)),
    ("normal_", lambda t: t.normal_()),
    ("uniform_", lambda t: t.uniform_()),
]


@pytest.mark.parametrize("grad_enabled", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("name,op", INPLACE_OPS, ids=[n for n, _ in INPLACE_OPS])
def test_every_inplace_op_bumps_the_shared_version(
    name: str, op: Callable, grad_enabled: bool
) -> None:
    a = _leaf((3, 4))
    x = (a * 1.0).abs() + 1.0  # non-leaf, positive (log/sqrt stay finite)
    view = x[1:]
    alias = x.detach()
    y = x.sin()  # SinBackward0 saves x
    before = x._version
    with fg.set_grad_enabled(grad_enabled):
        out = op(x)
    # ``log_`` runs three in-place ops; everything else exactly one
    bumps = 3 if name == "log_" else 1
    assert x._version == view._version == alias._version == before + bumps
    if out is not None:
        assert out is x, "in-place methods return self"
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.sum().backward()


def _run_on(target: str, op: Callable) -> tuple:
    """``op`` applied to a non-leaf (3, 4) tensor itself or to a full view ``x[:]`` of it, with
    grad mode on; returns the values and the gradient reaching the leaf."""
    a = _leaf((3, 4))
    x = (a * 1.0).abs() + 1.0
    fg.manual_seed(0)  # normal_ / uniform_ draw the same numbers both times
    op(x if target == "tensor" else x[:])
    if x.requires_grad:
        (x * fg.arange(12.0, dtype=fg.float64).reshape(3, 4)).sum().backward()
    return x.detach().numpy().copy(), None if a.grad is None else a.grad.numpy()


@pytest.mark.parametrize("name,op", INPLACE_OPS, ids=[n for n, _ in INPLACE_OPS])
def test_every_inplace_op_on_a_full_view_equals_the_op_on_the_tensor(
    name: str, op: Callable
) -> None:
    # the view path (the base's history rewritten with index_put) must give the same values and
    # gradients as the direct rebase, for every in-place op
    values, grad = _run_on("tensor", op)
    view_values, view_grad = _run_on("view", op)
    np.testing.assert_allclose(view_values, values, rtol=1e-12)
    assert (grad is None) == (view_grad is None)
    if grad is not None:
        np.testing.assert_allclose(view_grad, grad, rtol=1e-12, atol=1e-12)


def test_inplace_method_list_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    for name, _ in INPLACE_OPS:
        if name.endswith("_") and not name.startswith(("add_alpha", "setitem")):
            assert hasattr(torch.Tensor, name), f"{name} is not a PyTorch in-place method"
            assert hasattr(fg.Tensor, name)


def test_inplace_on_a_view_under_no_grad_is_plain_writing() -> None:
    a = _leaf((3, 4))
    b = a * 1.0
    fn = b.grad_fn
    with fg.no_grad():
        b[0].mul_(0.0)
        b.t()[1].add_(1.0)
    assert b.grad_fn is fn, "no history change under no_grad"
    assert b._version == 2
    expected = a.detach().numpy().copy()
    expected[0] = 0.0
    expected[:, 1] += 1.0
    np.testing.assert_array_equal(b.detach().numpy(), expected)


# ---- saved tensors are checked through views ----------------------------------------------------


def test_modifying_a_view_invalidates_a_saved_base() -> None:
    a = _leaf((3, 4))
    b = a * 1.0
    y = (b * b).sum()  # saves b
    with fg.no_grad():
        b[1].zero_()
    with pytest.raises(RuntimeError, match=MODIFIED) as info:
        y.backward()
    assert "[float64 [3, 4]]" in str(info.value) and "version 1; expected version 0" in str(
        info.value
    )


def test_modifying_the_base_invalidates_a_saved_view() -> None:
    a = _leaf((3, 4))
    b = a * 1.0
    v = b.t()[0]
    y = (v * v).sum()  # saves the view
    b.add_(1.0)  # recorded: rebases b, bumps the version v shares
    with pytest.raises(RuntimeError, match=MODIFIED) as info:
        y.backward()
    assert "[float64 [3]]" in str(info.value)


def test_modifying_a_sibling_view_invalidates_a_saved_view() -> None:
    a = _leaf((3, 4))
    b = a * 1.0
    r0, r1 = b[0], b[1]
    y = (r0.exp() * r0).sum()  # saves r0
    r1.mul_(2.0)  # another view of the same base: same counter
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.backward()


def test_detach_alias_modification_is_detected_but_data_is_not() -> None:
    a = _leaf((3,))
    b = a * 1.0
    y = (b * b).sum()
    b.data.mul_(1.0)  # .data has its own version counter: invisible to autograd (PyTorch)
    y.backward(retain_graph=True)
    b.detach().mul_(1.0)  # detach() shares the counter
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.backward()


# ---- leaves --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda a: a, LEAF),
        (lambda a: a[0], VIEW_OF_LEAF),
        (lambda a: a.view(6), VIEW_OF_LEAF),
        (lambda a: a.t()[1:], VIEW_OF_LEAF),
        (lambda a: a.diagonal(), VIEW_OF_LEAF),
    ],
    ids=["leaf", "row", "view", "view_of_view", "diagonal"],
)
def test_inplace_on_a_leaf_or_its_view_raises_in_grad_mode(make: Callable, match: str) -> None:
    a = _leaf((2, 3))
    target = make(a)
    before = a.detach().numpy().copy()
    with pytest.raises(RuntimeError, match=match):
        target.mul_(2.0)
    assert a._version == 0 and a.grad_fn is None
    np.testing.assert_array_equal(a.detach().numpy(), before)
    with fg.no_grad():  # optimizers and initialisers write leaves under no_grad
        make(a).mul_(2.0)
    assert a._version == 1 and a.is_leaf and a.requires_grad


def test_leaf_error_also_for_a_value_not_requiring_grad_and_setitem() -> None:
    a = _leaf((3,))
    with pytest.raises(RuntimeError, match=LEAF):
        a[0] = 1.0
    with pytest.raises(RuntimeError, match=VIEW_OF_LEAF):
        a[1:].copy_(fg.zeros(2, dtype=fg.float64))


def test_leaf_view_made_under_no_grad_raises_the_no_grad_view_error() -> None:
    a = _leaf((3,))
    with fg.no_grad():
        v = a[1:]
    with pytest.raises(RuntimeError, match=f"{NO_GRAD_VIEW} is being modified inplace"):
        v.add_(1.0)  # PyTorch reports the no_grad view before the view of a leaf
    assert a._version == 0


# ---- in-place rebases history -------------------------------------------------------------------

REBASE_NAMES = [
    ("add_", lambda t, w: t.add_(w), "AddBackward0"),
    ("mul_", lambda t, w: t.mul_(w), "MulBackward0"),
    ("sub_", lambda t, w: t.sub_(w), "SubBackward0"),
    ("div_", lambda t, w: t.div_(w), "DivBackward0"),
    ("exp_", lambda t, w: t.exp_(), "ExpBackward0"),
    ("tanh_", lambda t, w: t.tanh_(), "TanhBackward0"),
    ("iadd", lambda t, w: t.__iadd__(w), "AddBackward0"),
    ("imul", lambda t, w: t.__imul__(w), "MulBackward0"),
]


@pytest.mark.parametrize("name,op,node", REBASE_NAMES, ids=[n for n, _, _ in REBASE_NAMES])
def test_inplace_rebases_grad_fn(name: str, op: Callable, node: str) -> None:
    a = _leaf((3,))
    w = _leaf((3,), 1)
    b = a.clone()
    old = b.grad_fn
    op(b, w)
    assert b.grad_fn.name() == node and b.grad_fn is not old
    assert not b.is_leaf and b.requires_grad
    # the new node's first edge leads to the old history
    assert b.grad_fn.next_functions[0][0] is old


def test_inplace_on_a_plain_tensor_with_a_grad_operand_makes_it_require_grad() -> None:
    w = _leaf((3,))
    b = fg.zeros(3, dtype=fg.float64)
    b.mul_(2.0).add_(w)
    assert b.requires_grad and b.grad_fn.name() == "AddBackward0"
    (b * b).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 2.0 * w.detach().numpy())


def test_rebased_chain_gradients_match_numpy() -> None:
    a = _leaf((4,))
    w = _leaf((4,), 1)
    b = a * 1.0
    b.mul_(w).add_(1.0).exp_()
    b.sum().backward()
    an, wn = a.detach().numpy(), w.detach().numpy()
    e = np.exp(an * wn + 1.0)
    np.testing.assert_allclose(a.grad.numpy(), e * wn)
    np.testing.assert_allclose(w.grad.numpy(), e * an)


# ---- in-place on a view rewrites the base's history ---------------------------------------------


def test_row_mul_gives_correct_grads_for_base_and_operand() -> None:
    a = _leaf((3, 4))
    w = _leaf((4,), 1)
    b = a.clone()
    b[0].mul_(w)
    b.sum().backward()
    expected = np.ones((3, 4))
    expected[0] = w.detach().numpy()
    np.testing.assert_allclose(a.grad.numpy(), expected)
    np.testing.assert_allclose(w.grad.numpy(), a.detach().numpy()[0])


def test_base_grad_fn_is_rewritten_and_view_grad_fn_regenerated() -> None:
    a = _leaf((3, 4))
    w = _leaf((4,), 1)
    b = a.clone()
    row = b[0]
    old_base_fn, old_row_fn = b.grad_fn, row.grad_fn
    row.mul_(w)
    assert b.grad_fn is not old_base_fn and b.grad_fn.name() == "IndexPutBackward0"
    # the base's node: old history for the rest, the in-place op's node for the region
    inputs = [n for n, _ in b.grad_fn.next_functions if n is not None]
    assert inputs[0] is old_base_fn and inputs[1].name() == "MulBackward0"
    # the view's grad_fn is rebuilt from the base (the view op replayed on its new history)
    assert row.grad_fn is not old_row_fn and row.grad_fn.name() == "SelectBackward0"
    assert row.grad_fn.next_functions[0][0] is b.grad_fn
    assert row.grad_fn is row.grad_fn, "regenerated once, then cached until the next change"


def test_gradient_through_the_modified_view_itself() -> None:
    a = _leaf((3, 4))
    w = _leaf((4,), 1)
    c = _leaf((4,), 2)
    b = a * 1.0
    row = b[2]
    row.mul_(w)
    (row * c).sum().backward()  # only the view is used after the change
    expected = np.zeros((3, 4))
    expected[2] = w.detach().numpy() * c.detach().numpy()
    np.testing.assert_allclose(a.grad.numpy(), expected)
    np.testing.assert_allclose(w.grad.numpy(), a.detach().numpy()[2] * c.detach().numpy())
    np.testing.assert_allclose(c.grad.numpy(), a.detach().numpy()[2] * w.detach().numpy())


def test_setitem_column_with_a_value_requiring_grad() -> None:
    a = _leaf((3, 4))
    x = _leaf((3,), 1)
    b = a.clone()
    b[:, 1] = x
    (b * b).sum().backward()
    an, xn = a.detach().numpy(), x.detach().numpy()
    expected = 2.0 * an
    expected[:, 1] = 0.0
    np.testing.assert_allclose(a.grad.numpy(), expected)
    np.testing.assert_allclose(x.grad.numpy(), 2.0 * xn)


def test_setitem_on_a_view_with_advanced_indices() -> None:
    a = _leaf((4, 5))
    x = _leaf((2,), 1)
    b = a * 2.0
    v = b.t()[1:]  # (4, 4) view
    v[[0, 2], [1, 3]] = x
    b.pow(2).sum().backward()
    an, xn = a.detach().numpy(), x.detach().numpy()
    bn = 2.0 * an
    # v[i, j] is b[j, i + 1]: the written elements are b[1, 1] and b[3, 3]
    bn[1, 1], bn[3, 3] = xn
    expected = 2.0 * bn * 2.0
    expected[1, 1] = expected[3, 3] = 0.0
    np.testing.assert_allclose(a.grad.numpy(), expected)
    np.testing.assert_allclose(x.grad.numpy(), 2.0 * xn)


def test_inplace_on_a_view_can_make_the_base_require_grad() -> None:
    x = _leaf((2,))
    b = fg.zeros(3, dtype=fg.float64)
    head = b[:1]  # a view made before the base required grad
    assert not b.requires_grad and not head.requires_grad
    b[1:].copy_(x)
    assert b.requires_grad and not b.is_leaf
    assert head.requires_grad, "views of the base follow it"
    (b * fg.tensor([1.0, 2.0, 3.0], dtype=fg.float64)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 3.0])
    np.testing.assert_array_equal(b.detach().numpy(), np.r_[0.0, x.detach().numpy()])


def test_sibling_view_made_before_the_change_routes_to_the_new_history() -> None:
    a = _leaf((3, 4))
    w = _leaf((4,), 1)
    b = a.clone()
    r0, whole = b[0], b.view(12)
    r0.mul_(w)
    # ``whole`` was made before the change; its values include it, so must its gradient
    whole.pow(2).sum().backward()
    an, wn = a.detach().numpy(), w.detach().numpy()
    bn = an.copy()
    bn[0] *= wn
    expected = 2.0 * bn
    expected[0] *= wn
    np.testing.assert_allclose(a.grad.numpy(), expected)
    np.testing.assert_allclose(w.grad.numpy(), 2.0 * bn[0] * an[0])


def test_several_inplace_ops_on_overlapping_views() -> None:
    a = _leaf((3, 4))
    w = _leaf((3,), 1)
    b = a.clone()
    b.t()[1].mul_(w)  # column 1 scaled by w
    b[1].add_(1.0)  # row 1 shifted
    b.diagonal().sigmoid_()  # then the diagonal squashed
    out = (b * fg.arange(12.0, dtype=fg.float64).reshape(3, 4)).sum()
    out.backward()
    an, wn = a.detach().numpy(), w.detach().numpy()
    coef = np.arange(12.0).reshape(3, 4)
    pre = an.copy()
    pre[:, 1] *= wn
    pre[1] += 1.0
    sig = 1.0 / (1.0 + np.exp(-np.diagonal(pre)))
    d_pre = coef.copy()
    for i in range(3):
        d_pre[i, i] = coef[i, i] * sig[i] * (1.0 - sig[i])
    expected = d_pre.copy()
    expected[:, 1] *= wn
    np.testing.assert_allclose(a.grad.numpy(), expected)
    np.testing.assert_allclose(w.grad.numpy(), d_pre[:, 1] * an[:, 1])


def test_view_of_view_chain() -> None:
    a = _leaf((4, 6))
    w = _leaf((2,), 1)
    b = a * 1.0
    v = b[1:].view(3, 2, 3).permute(2, 0, 1)[1]  # (3, 2): b[1 + i, 3 * j + 1]
    assert v._base is b
    v[:, 1].mul_(w[1])  # b[1 + i, 4] *= w[1]
    v[0].add_(w)  # b[1, 1] += w[0], b[1, 4] += w[1]
    b.sum().backward()
    an = a.detach().numpy()
    expected = np.ones((4, 6))
    expected[1:, 4] = w.detach().numpy()[1]
    np.testing.assert_allclose(a.grad.numpy(), expected)
    wn1_grad = an[1:, 4].sum()
    np.testing.assert_allclose(w.grad.numpy(), [1.0, 1.0 + wn1_grad])


def test_inplace_on_a_zero_dim_view_and_of_a_zero_dim_base() -> None:
    a = _leaf((3,))
    w = _leaf((), 1)
    b = a * 1.0
    b[1].mul_(w)  # a 0-d view
    s = a.sum() * 1.0  # a 0-d base
    s.view(1).mul_(w)
    s.unsqueeze(0)[0].add_(1.0)
    (b.sum() + s).backward()
    an, wn = a.detach().numpy(), float(w.detach().numpy())
    np.testing.assert_allclose(a.grad.numpy(), np.array([1.0, wn, 1.0]) + wn)
    np.testing.assert_allclose(w.grad.numpy(), an[1] + an.sum())


def test_diagonal_and_transpose_views() -> None:
    a = _leaf((3, 3))
    w = _leaf((3,), 1)
    b = a + 0.0
    b.diagonal().copy_(w)
    b.T[0].mul_(2.0)  # column 0
    b.sum().backward()
    expected = np.ones((3, 3))
    np.fill_diagonal(expected, 0.0)
    expected[:, 0] *= 2.0
    np.testing.assert_allclose(a.grad.numpy(), expected)
    np.testing.assert_allclose(w.grad.numpy(), [2.0, 1.0, 1.0])


def test_retain_grad_follows_the_regenerated_view_and_the_base() -> None:
    a = _leaf((2, 3))
    b = a * 1.0
    row = b[0]
    row.retain_grad()
    b.retain_grad()
    row.mul_(3.0)
    (b * 2.0).sum().backward()
    # as in PyTorch: the row's new node reads the base, the loss does not read the row
    assert row.grad is None
    np.testing.assert_allclose(b.grad.numpy(), np.full((2, 3), 2.0))
    np.testing.assert_allclose(a.grad.numpy(), [[6.0] * 3, [2.0] * 3])
    a.grad = None
    b = a * 1.0
    row = b[0]
    row.retain_grad()
    row.mul_(3.0)
    (row * 2.0).sum().backward()
    np.testing.assert_allclose(row.grad.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_allclose(a.grad.numpy(), [[6.0] * 3, [0.0] * 3])


def test_hook_on_the_view_before_the_change_is_not_called() -> None:
    # As in PyTorch: the in-place op reads the view's old value from the base's old history,
    # so a hook bound to the view's previous grad_fn is not on the path.
    a = _leaf((3,))
    b = a * 1.0
    v = b[0]
    calls: list = []
    v.register_hook(lambda g: calls.append(g))
    v.mul_(2.0)
    b.sum().backward()
    assert calls == []
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 1.0, 1.0])


def test_failed_inplace_on_a_view_changes_nothing() -> None:
    a = _leaf((3, 4))
    b = a * 1.0
    row = b[0]
    fn, row_fn, data = b.grad_fn, row.grad_fn, b.detach().numpy().copy()
    with pytest.raises(ValueError):
        row.add_(fg.ones(3, 4, dtype=fg.float64))  # result (3, 4) does not fit the row
    with pytest.raises(TypeError):
        fg.zeros(3, dtype=fg.int64)[0:2].add_(_leaf((2,)))  # float result into an int view
    assert b.grad_fn is fn and row.grad_fn is row_fn and b._version == 0
    np.testing.assert_array_equal(b.detach().numpy(), data)


def test_double_backward_through_an_inplace_on_a_view() -> None:
    a = _leaf((2, 3))
    w = _leaf((3,), 1)
    b = a.clone()
    b[1].mul_(w)
    (ga, gw) = fg.autograd.grad((b * b).sum(), (a, w), create_graph=True)
    (ga.sum() + gw.sum()).backward()
    an, wn = a.detach().numpy(), w.detach().numpy()
    # ga[1] = 2 a1 w^2, gw = 2 a1^2 w; d/da1 (sum) = 4 a1 w^2 / (2 w^2)... written out:
    expected_a = np.full((2, 3), 2.0)
    expected_a[1] = 2.0 * wn**2 + 4.0 * an[1] * wn
    np.testing.assert_allclose(a.grad.numpy(), expected_a)
    np.testing.assert_allclose(w.grad.numpy(), 4.0 * an[1] * wn + 2.0 * an[1] ** 2)


# ---- multi-output views and views made under no_grad / inference_mode ---------------------------


@pytest.mark.parametrize(
    "split,node",
    [
        (lambda b: b.split(2), "SplitBackward0"),
        (lambda b: b.chunk(2), "SplitBackward0"),
        (lambda b: b.unbind(0), "UnbindBackward0"),
        (lambda b: tuple(b), "UnbindBackward0"),
    ],
    ids=["split", "chunk", "unbind", "iter"],
)
def test_multi_output_views_refuse_inplace(split: Callable, node: str) -> None:
    a = _leaf((4, 2))
    b = a.clone()
    parts = split(b)
    with pytest.raises(RuntimeError, match=MULTI) as info:
        parts[1].mul_(2.0)
    assert f"Output 1 of {node} is a view and is being modified inplace" in str(info.value)
    assert b._version == 0
    with pytest.raises(RuntimeError, match=MULTI):
        parts[0][0].add_(1.0)  # a view of such a view too
    with fg.no_grad():
        parts[0].mul_(2.0)  # allowed: no history to rewrite
    # the base was modified: the outputs may not be used by autograd any more
    with pytest.raises(RuntimeError, match="its base or another view of its base has been"):
        _ = parts[1].grad_fn
    with pytest.raises(RuntimeError, match=MULTI):
        (parts[1] * 2.0).sum().backward()


def test_multi_output_views_of_a_plain_tensor() -> None:
    b = fg.zeros(4, dtype=fg.float64)
    p, q = b.split(2)
    p.mul_(2.0)  # nothing requires grad: fine
    with pytest.raises(RuntimeError, match=f"{NO_GRAD_VIEW} is being modified inplace.*{MULTI}"):
        q.copy_(_leaf((2,)))
    assert b._version == 1


def test_multi_output_views_read_before_any_change_are_fine() -> None:
    a = _leaf((4,))
    p, q = a.clone().split(2)
    (p * 2.0 + q).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 2.0, 1.0, 1.0])


def test_view_made_under_no_grad_may_not_be_modified_with_grad() -> None:
    a = _leaf((4,))
    b = a.clone()
    with fg.no_grad():
        v = b[:2]
    with pytest.raises(RuntimeError, match=f"{NO_GRAD_VIEW} is being modified inplace") as info:
        v.mul_(2.0)
    assert "moving both the view and the inplace" in str(info.value)
    with fg.no_grad():
        v.mul_(2.0)
    with pytest.raises(RuntimeError, match=f"{NO_GRAD_VIEW} its base or another view"):
        _ = v.grad_fn
    w = b[2:]  # made with grad mode on: regenerated from the base
    assert w.grad_fn.name() == "SliceBackward0"


def test_view_made_in_inference_mode_of_a_normal_tensor() -> None:
    b = fg.zeros(4, dtype=fg.float64)
    with fg.inference_mode():
        v = b[:2]
        assert not v.is_inference(), "a view of a normal tensor is normal"
        v.add_(1.0)
    v.add_(1.0)  # nothing to record: allowed
    with pytest.raises(RuntimeError, match="A view was created in inference mode"):
        v.mul_(_leaf((2,)))
    np.testing.assert_array_equal(b.numpy(), [2.0, 2.0, 0.0, 0.0])


# ---- inference tensors, expanded views, .data ---------------------------------------------------


def test_inplace_on_inference_tensors_outside_inference_mode() -> None:
    with fg.inference_mode():
        t = fg.ones(3)
        t.add_(1.0)  # allowed inside
        view = t[1:]
    assert t.is_inference() and view.is_inference()
    for fn in (lambda: t.add_(1.0), lambda: view.zero_(), lambda: t.__setitem__(0, 5.0)):
        with pytest.raises(RuntimeError, match=INFERENCE):
            fn()
        with fg.no_grad(), pytest.raises(RuntimeError, match=INFERENCE):
            fn()
    assert t.tolist() == [2.0, 2.0, 2.0] and t._version == 1


def test_inplace_on_an_expanded_view_raises() -> None:
    base = fg.zeros(1, 3, dtype=fg.float64)
    e = base.expand(2, 3)
    for fn in (lambda: e.add_(1.0), lambda: e[:, 0].fill_(1.0), lambda: e.__setitem__(0, 1.0)):
        with pytest.raises(RuntimeError, match=OVERLAP) as info:
            fn()
        assert "clone()" in str(info.value)
    a = _leaf((1, 3))
    with pytest.raises(RuntimeError, match=OVERLAP):
        (a * 1.0).expand(2, 3).mul_(2.0)
    assert base._version == 0 and not base.numpy().any()


def test_a_view_of_an_expanded_view_without_overlap_is_writable() -> None:
    base = fg.zeros(3, dtype=fg.float64)
    row = base.expand(2, 3)[0]  # no element repeated: PyTorch writes through
    row.add_(1.0)
    np.testing.assert_array_equal(base.numpy(), [1.0, 1.0, 1.0])
    a = _leaf((3,))
    b = a * 1.0
    b.expand(4, 3)[2].mul_(3.0)
    b.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [3.0, 3.0, 3.0])


def test_data_get_shares_storage_not_the_version_counter() -> None:
    a = _leaf((3,))
    d = a.data
    assert np.shares_memory(d.numpy(), a.detach().numpy())
    assert d.is_leaf and not d.requires_grad and d._base is None
    d.add_(1.0)  # no leaf error, and autograd does not see it
    assert a._version == 0 and d._version == 1
    np.testing.assert_array_equal(a.detach().numpy(), d.numpy())


def test_data_set_swaps_storage_keeps_identity_and_version() -> None:
    a = _leaf((3,))
    y = fg.ones(5)
    a.data = y
    assert a.shape == (5,) and a.dtype == fg.float32 and a.requires_grad and a.is_leaf
    assert np.shares_memory(a.detach().numpy(), y.numpy())
    y.add_(1.0)
    assert a._version == 0 and a.tolist() == [2.0] * 5
    b = fg.zeros(4, dtype=fg.float64)
    v = b[:2]
    v.data = fg.ones(3, dtype=fg.float64)  # the view's storage is no longer the base's
    assert v._base is None
    v.mul_(_leaf((3,)))
    assert not b.requires_grad and b.tolist() == [0.0] * 4


# ---- index_add_ / index_copy_ / index_fill_ ------------------------------------------------------


def test_index_add_accumulates_duplicates_and_differentiates() -> None:
    a = _leaf((3, 2))
    s = _leaf((4, 2), 1)
    idx = fg.tensor([2, 0, 2, 1])
    b = a * 1.0
    b.index_add_(0, idx, s, alpha=2.0)
    an, sn = a.detach().numpy(), s.detach().numpy()
    expected = an.copy()
    np.add.at(expected, [2, 0, 2, 1], 2.0 * sn)
    np.testing.assert_allclose(b.detach().numpy(), expected)
    g = np.arange(6.0).reshape(3, 2)
    b.backward(fg.tensor(g))
    np.testing.assert_allclose(a.grad.numpy(), g)
    np.testing.assert_allclose(s.grad.numpy(), 2.0 * g[[2, 0, 2, 1]])


def test_index_copy_and_index_fill_values_and_grads() -> None:
    a = _leaf((2, 4))
    s = _leaf((2, 2), 1)
    v = _leaf((), 2)
    b = a * 1.0
    b.index_copy_(1, fg.tensor([3, 0]), s)
    b.index_fill_(1, fg.tensor([1]), v)
    an, sn = a.detach().numpy(), s.detach().numpy()
    expected = an.copy()
    expected[:, [3, 0]] = sn
    expected[:, 1] = float(v.detach().numpy())
    np.testing.assert_allclose(b.detach().numpy(), expected)
    g = np.arange(8.0).reshape(2, 4)
    b.backward(fg.tensor(g))
    ga = g.copy()
    ga[:, [0, 1, 3]] = 0.0
    np.testing.assert_allclose(a.grad.numpy(), ga)
    np.testing.assert_allclose(s.grad.numpy(), g[:, [3, 0]])
    np.testing.assert_allclose(v.grad.numpy(), g[:, 1].sum())


@pytest.mark.parametrize(
    "call,error",
    [
        (lambda b: b.index_add_(0, fg.tensor([3]), fg.ones(1, 2)), IndexError),
        (lambda b: b.index_add_(0, fg.tensor([0]), fg.ones(2, 2)), ValueError),
        (lambda b: b.index_add_(0, fg.tensor([0]), fg.ones(1, 2, dtype=fg.float64)), TypeError),
        (lambda b: b.index_copy_(1, fg.tensor([[0]]), fg.ones(3, 1)), ValueError),
        (lambda b: b.index_fill_(0, fg.tensor([0]), fg.ones(2)), ValueError),
        (lambda b: b.index_fill_(0, fg.tensor([0.0]), 1.0), TypeError),
    ],
    ids=["index_range", "source_shape", "source_dtype", "index_2d", "value_not_0d", "float_index"],
)
def test_index_op_errors_leave_the_target_unchanged(call: Callable, error: type) -> None:
    b = fg.zeros(3, 2)
    with pytest.raises(error):
        call(b)
    assert b._version == 0 and not b.numpy().any()


def test_custom_function_alias_output_refuses_inplace() -> None:
    class Identity(fg.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g

    a = _leaf((3,))
    out = Identity.apply(a * 1.0)
    assert out.grad_fn.name() == "IdentityBackward"
    with pytest.raises(AutogradError, match="custom Function"):
        out.mul_(2.0)


def _double_in_place(lib: Any) -> Any:
    class DoubleInPlace(lib.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            x.mul_(2.0)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g * 2.0

    return DoubleInPlace


def test_custom_function_mark_dirty_on_a_view_rewrites_the_base() -> None:
    a = _leaf((3, 4))
    b = a.clone()
    out = _double_in_place(fg).apply(b[1])
    assert out._base is b and out.grad_fn.name() == "SelectBackward0"
    (b * b).sum().backward()
    an = a.detach().numpy()
    bn = an.copy()
    bn[1] *= 2.0
    expected = 2.0 * bn
    expected[1] *= 2.0
    np.testing.assert_allclose(a.grad.numpy(), expected)
    np.testing.assert_allclose(b.detach().numpy(), bn)
    with pytest.raises(RuntimeError, match=VIEW_OF_LEAF):
        _double_in_place(fg).apply(_leaf((3,))[1:])
    with pytest.raises(RuntimeError, match=MULTI):
        _double_in_place(fg).apply(_leaf((4,)).clone().split(2)[0])


def test_custom_function_mark_dirty_on_a_view_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    grads = []
    for lib in (fg, torch):
        a = lib.tensor(np.arange(12.0).reshape(3, 4) / 7.0, requires_grad=True)
        b = a.clone()
        out = _double_in_place(lib).apply(b.t()[2])
        (b.exp().sum() + (out * out).sum()).backward()
        grads.append(a.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12)


def test_view_of_a_leaf_follows_updates_made_under_no_grad() -> None:
    w = _leaf((2, 3))
    wt = w.t()  # e.g. kept by a module between optimizer steps
    old = wt.grad_fn
    with fg.no_grad():
        w.sub_(0.5)  # an optimizer step
    assert wt.grad_fn is not old, "regenerated: the version moved"
    assert wt.grad_fn.next_functions[0][0].variable is w
    (wt * 2.0).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.full((2, 3), 2.0))


def test_views_are_tensors_and_copies_of_them_are_plain() -> None:
    import copy
    import pickle

    b = _grid()
    v = b.t()[1:]
    assert isinstance(v, fg.Tensor) and v._is_view() and not b._is_view()
    for clone in (pickle.loads(pickle.dumps(v)), copy.deepcopy(v)):
        assert type(clone) is fg.Tensor and not clone._is_view()
        np.testing.assert_array_equal(clone.numpy(), v.numpy())
    p = fg.nn.Parameter(v)
    assert type(p) is fg.nn.Parameter and p.is_leaf and p.requires_grad


def test_readonly_numpy_memory_is_refused() -> None:
    arr = np.arange(4.0)
    arr.flags.writeable = False
    t = fg.from_numpy(arr)
    for fn in (lambda: t.add_(1.0), lambda: t[1:].zero_()):
        with pytest.raises(RuntimeError, match="read-only"):
            fn()
    assert t._version == 0 and arr.tolist() == [0.0, 1.0, 2.0, 3.0]
