"""The engine: dependency counting, fan-in, execution order, depth, broadcasting, None grads,
multiple roots, and what a failing backward leaves behind."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd.node import OpNode
from fusegrad.ops.registry import REGISTRY, Rule
from fusegrad.tensor import Tensor


def _leaf(*shape: int, seed: int = 0) -> fg.Tensor:
    data = np.random.default_rng(seed).standard_normal(shape)
    return fg.tensor(data, requires_grad=True)


def _exp_with_rule(x: Tensor, rule_fn) -> Tensor:
    """``exp(x)`` recorded with a hand-written (possibly broken) rule."""
    out = Tensor._make(np.exp(x._data))
    out.grad_fn = OpNode(REGISTRY["exp"], Rule("exp", rule_fn, (), ()), {}, (x,), (out,))
    return out


# ---- dependency counting and fan-in --------------------------------------------------------


def test_x_times_x_counts_both_edges() -> None:
    x = _leaf(4)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.detach().numpy())


def test_diamond_graph() -> None:
    x = _leaf(3)
    xv = x.detach().numpy()
    h = x.exp()
    a = h.sin()
    b = h * 3.0
    (a + b).sum().backward()
    expected = (np.cos(np.exp(xv)) + 3.0) * np.exp(xv)
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)


def test_fan_in_is_summed_before_the_node_runs() -> None:
    x = _leaf(3)
    h = x.exp()
    seen = []
    h.grad_fn.register_prehook(lambda grads: seen.append(grads[0].numpy().copy()))
    hook_calls = []
    h.register_hook(lambda g: hook_calls.append(g.numpy().copy()))
    (h * 2.0 + h * 3.0 + h).sum().backward()
    assert len(seen) == 1 and len(hook_calls) == 1
    np.testing.assert_allclose(seen[0], np.full(3, 6.0))
    np.testing.assert_allclose(hook_calls[0], np.full(3, 6.0))


def test_leaf_used_many_times_accumulates_once_per_backward() -> None:
    x = _leaf(2)
    calls = []
    x.register_post_accumulate_grad_hook(lambda t: calls.append(t.grad.numpy().copy()))
    y = x * 1.0
    for _ in range(5):
        y = y + x
    y.sum().backward()
    assert len(calls) == 1
    np.testing.assert_allclose(x.grad.numpy(), np.full(2, 6.0))


def test_fan_in_sums_leave_the_gradients_they_add_alone() -> None:
    """The engine adds later gradients into the first sum it made, in place: never into a
    gradient a rule returned (``add`` hands one tensor to both inputs) or a hook saw."""
    x = _leaf(3)
    y = _leaf(3, seed=1)
    t = x.exp()
    kept: list = []
    consumers = [t + y, t * 2.0, t * 3.0, t * y, t]
    for c in consumers[:-1]:
        c.register_hook(lambda g: kept.append((g, g.numpy().copy())))
    total = consumers[0]
    for c in consumers[1:]:
        total = total + c
    total.sum().backward()
    assert len(kept) == 4
    for g, values in kept:
        np.testing.assert_array_equal(g.numpy(), values)
    xv, yv = x.detach().numpy(), y.detach().numpy()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(xv) * (1 + 2 + 3 + yv + 1), rtol=1e-12)
    np.testing.assert_allclose(y.grad.numpy(), 1 + np.exp(xv), rtol=1e-12)


@pytest.mark.parametrize("shape", [(), (3,), (2, 3)], ids=str)
def test_fan_in_into_views_and_leaves_matches_torch(shape: tuple) -> None:
    """Sums that reach a view's node and a leaf many times, against PyTorch."""
    torch = pytest.importorskip("torch")
    data = np.random.default_rng(3).standard_normal((2, *shape))

    def run(lib, x):
        first, second = x[0], x[1]
        out = first * 2.0 + first * first + second.exp() + second + x.sum(0) * second
        for _ in range(4):
            out = out + first * second
        return out.sum()

    x = fg.tensor(data, requires_grad=True)
    xt = torch.tensor(data, requires_grad=True)
    run(fg, x).backward()
    run(torch, xt).backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-12, atol=1e-12)


# ---- numpy's floating-point error state ---------------------------------------------------


def test_backward_ignores_floating_point_errors_and_user_code_sees_its_state() -> None:
    """Kernels run with numpy's floating-point errors ignored (IEEE results, as in PyTorch)
    even where the caller asked numpy to raise -- the fan-in sums too (here 3e38 + 3e38
    overflows float32) -- while hooks see the caller's state, which backward leaves as it was."""
    x = fg.tensor([0.0, 1.0], requires_grad=True)
    big = fg.tensor([3e38], dtype=fg.float32, requires_grad=True)
    seen: list = []
    y = x.log()  # -inf at 0: its gradient divides by 0
    y.register_hook(lambda g: seen.append(np.geterr()["divide"]))
    big.register_hook(lambda g: seen.append(np.geterr()["over"]))
    with np.errstate(all="raise"):
        loss = (y * y).sum() + (big * 3e38 + big * 3e38).sum().double()
        loss.backward()
        assert np.geterr()["divide"] == "raise"
    assert seen == ["raise", "raise"]
    assert x.grad.numpy()[0] == -np.inf and np.isinf(big.grad.numpy()[0])


def test_an_error_state_a_hook_sets_lasts_after_backward() -> None:
    """``np.seterr`` in a hook changes the caller's state, as it would outside backward, while
    the kernels that run after it still ignore floating-point errors."""
    x = fg.tensor([0.0, 2.0], requires_grad=True)
    z = x.log()
    y = x * 1.0  # (made after z: its node, and so its hook, runs before z's)
    y.register_hook(lambda g: np.seterr(divide="raise") and None)
    before = np.geterr()
    try:
        (z + y).sum().backward()  # log's gradient divides by 0 after the hook ran
        assert np.geterr()["divide"] == "raise"
        assert x.grad.numpy()[0] == np.inf
    finally:
        np.seterr(**before)


def test_a_failing_backward_gives_back_the_callers_error_state() -> None:
    x = _leaf(3)
    y = x.exp()

    def fail(grads: tuple) -> None:
        raise ValueError("hook failed")

    y.grad_fn.register_prehook(fail)
    with np.errstate(all="raise"):
        with pytest.raises(ValueError, match="hook failed"):
            (y * 2.0).sum().backward()
        assert np.geterr() == {
            "divide": "raise",
            "over": "raise",
            "under": "raise",
            "invalid": "raise",
        }
    assert np.geterr()["under"] == "ignore"


# ---- execution order -----------------------------------------------------------------------


def _record_order(tensors: dict) -> list:
    order: list = []
    for name, t in tensors.items():
        t.grad_fn.register_prehook(lambda grads, name=name: order.append(name))
    return order


def test_latest_created_ready_node_runs_first() -> None:
    x = fg.tensor(1.0, requires_grad=True)
    a = x.exp()
    b = x.sin()
    c = a * b
    d = x.cos()
    e = c + d
    order = _record_order({"a": a, "b": b, "c": c, "d": d, "e": e})
    e.backward()
    # e's inputs c (older) and d (newer) become ready together: d first; then b before a
    assert order == ["e", "d", "c", "b", "a"]


def test_priority_reversed_creation_order() -> None:
    x = fg.tensor(1.0, requires_grad=True)
    d = x.cos()
    b = x.sin()
    a = x.exp()
    e = (a * b) + d
    order = _record_order({"a": a, "b": b, "d": d, "e": e})
    e.backward()
    assert order == ["e", "a", "b", "d"]


def test_accumulate_grad_runs_as_soon_as_ready() -> None:
    x = fg.tensor(1.0, requires_grad=True)
    w = fg.tensor(2.0, requires_grad=True)
    events: list = []
    p = w.exp()  # older: runs after x's accumulation below
    q = x * 3.0  # newer: runs first, then x's AccumulateGrad before p's node
    p.grad_fn.register_prehook(lambda g: events.append("p"))
    q.grad_fn.register_prehook(lambda g: events.append("q"))
    x.register_post_accumulate_grad_hook(lambda t: events.append("x.grad"))
    w.register_post_accumulate_grad_hook(lambda t: events.append("w.grad"))
    (p + q).backward()
    assert events == ["q", "x.grad", "p", "w.grad"]


def _random_dag_order(lib, n_nodes: int, seed: int) -> list:
    """Build the same random DAG in fusegrad or torch; return the node execution order."""
    rng = np.random.default_rng(seed)
    x = lib.tensor([0.3, -0.2], requires_grad=True)
    values = [x]
    names: list = []
    for i in range(n_nodes):
        picks = rng.integers(0, len(values), size=2)
        kind = rng.integers(0, 3)
        a, b = values[picks[0]], values[picks[1]]
        v = a * b if kind == 0 else (a + b if kind == 1 else a.sin())
        values.append(v)
        names.append((f"n{i}", v))
    root = values[-1]
    for t in values[1:-1]:
        root = root + t  # every node reaches the root
    order: list = []
    for name, t in names:
        t.grad_fn.register_prehook(lambda grads, name=name: order.append(name))
    root.sum().backward()
    return order


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_execution_order_matches_torch_on_random_dags(seed: int) -> None:
    torch = pytest.importorskip("torch")
    ours = _random_dag_order(fg, 30, seed)
    theirs = _random_dag_order(torch, 30, seed)
    assert ours == theirs
    assert len(ours) == 30


def _random_dag_leaf_order(lib, n_nodes: int, n_leaves: int, seed: int) -> tuple:
    """A random DAG over several leaves with no hooks on its nodes (the engine's plain path, a
    node made ready by the one before it running next without the heap); the order in which
    the leaves' gradients are accumulated and the gradients themselves."""
    rng = np.random.default_rng(seed)
    leaves = [
        lib.tensor(rng.uniform(0.5, 1.5, 3), dtype=lib.float64, requires_grad=True)
        for _ in range(n_leaves)
    ]
    values = list(leaves)
    for _ in range(n_nodes):
        picks = rng.integers(0, len(values), size=2)
        kind = rng.integers(0, 5)
        a, b = values[picks[0]], values[picks[1]]
        if kind == 0:
            v = a * b
        elif kind == 1:
            v = a + b
        elif kind == 2:
            v = a.tanh()
        elif kind == 3:
            v = -a
        else:
            v = a.sigmoid()
        values.append(v)
    root = values[-1]
    for t in values[n_leaves:-1]:
        root = root + t
    order: list = []
    for i, leaf in enumerate(leaves):
        leaf.register_post_accumulate_grad_hook(lambda t, i=i: order.append(i))
    root.sum().backward()
    return order, [np.asarray(leaf.grad.detach().numpy()) for leaf in leaves]


@pytest.mark.parametrize("seed", range(8))
def test_leaf_accumulation_order_and_gradients_match_torch_on_random_dags(seed: int) -> None:
    torch = pytest.importorskip("torch")
    ours, our_grads = _random_dag_leaf_order(fg, 40, 4, seed)
    theirs, their_grads = _random_dag_leaf_order(torch, 40, 4, seed)
    assert ours == theirs
    for mine, ref in zip(our_grads, their_grads):
        np.testing.assert_allclose(mine, ref, rtol=1e-12, atol=1e-12)


# ---- depth ---------------------------------------------------------------------------------


def test_100k_node_chain_backward_and_teardown() -> None:
    x = fg.tensor([1.0, -2.0], requires_grad=True)
    y = x
    for i in range(100_000):
        y = -y if i % 2 else y * 1.0  # neg saves nothing; mul saves its inputs
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])
    del y
    gc.collect()
    # an unexecuted deep graph (saved tensors still alive) is torn down without a crash too
    z = x
    for _ in range(100_000):
        z = z * 1.0
    del z
    gc.collect()


# ---- broadcasting and invalid gradients -----------------------------------------------------


def test_engine_sums_broadcast_gradients_to_input_shapes() -> None:
    a = _leaf(3, 1)
    b = _leaf(4, seed=1)
    c = _leaf(seed=2)  # 0-d
    (a * b + c).sum().backward()
    assert a.grad.shape == (3, 1) and b.grad.shape == (4,) and c.grad.shape == ()
    bv, av = b.detach().numpy(), a.detach().numpy()
    np.testing.assert_allclose(a.grad.numpy(), np.full((3, 1), bv.sum()))
    np.testing.assert_allclose(b.grad.numpy(), np.full(4, av.sum()))
    np.testing.assert_allclose(c.grad.numpy(), 12.0)


def test_rule_gradient_with_extra_broadcast_dims_is_summed() -> None:
    x = _leaf(3)
    y = _exp_with_rule(x, lambda node, g: (g.broadcast_to((2, 3)),))
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 2.0))


def test_rule_gradient_that_cannot_be_summed_is_an_error() -> None:
    x = _leaf(3)
    y = _exp_with_rule(x, lambda node, g: (fg.ones(4, dtype=fg.float64),))
    with pytest.raises(RuntimeError, match=r"invalid gradient at index 0") as info:
        y.sum().backward()
    assert "ExpBackward0" in str(info.value) and "[4]" in str(info.value)
    assert x.grad is None


def test_custom_function_returning_a_wrong_shape_is_an_invalid_gradient() -> None:
    class WrongShape(fg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return fg.ones(2, 2, dtype=g.dtype)

    x = _leaf(3)
    with pytest.raises(
        RuntimeError, match=r"WrongShape\w* returned an invalid gradient at index 0"
    ):
        WrongShape.apply(x).sum().backward()
    assert x.grad is None


def test_post_hook_returning_a_wrong_shape_is_an_invalid_gradient() -> None:
    a = _leaf(3)
    b = _leaf(3, seed=1)
    y = a * b
    y.grad_fn.register_hook(lambda gi, go: (gi[0], fg.ones(2, 2, dtype=fg.float64)))
    with pytest.raises(RuntimeError, match=r"MulBackward0 returned an invalid gradient at index 1"):
        y.sum().backward()


def test_rule_returning_wrong_number_of_gradients() -> None:
    x = _leaf(3)
    y = _exp_with_rule(x, lambda node, g: (g, g))
    with pytest.raises(RuntimeError, match="incorrect number of gradients"):
        y.sum().backward()


def test_gradient_is_cast_to_the_input_dtype() -> None:
    x = fg.tensor([1.0, 2.0], dtype=fg.float32, requires_grad=True)
    y = _exp_with_rule(x, lambda node, g: (g.to(fg.float64),))
    y.sum().backward()
    assert x.grad.dtype == fg.float32


# ---- None gradients ------------------------------------------------------------------------


@pytest.mark.compiled_differs(
    "a post hook dropping a gradient raises in compiled backward (docs/compile.md)"
)
def test_none_gradients_are_never_materialised() -> None:
    a = _leaf(3)
    w = _leaf(3, seed=1)
    c = fg.tensor([1.0, 2.0, 3.0])  # does not require grad
    seen: dict = {}
    y = a - c
    y.grad_fn.register_hook(lambda gi, go: seen.setdefault("sub", gi))
    h = w.exp()
    w_hook_calls = []
    w.register_hook(lambda g: w_hook_calls.append(g))
    z = y * h
    # drop the gradient for h: the exp node gets only None and its leaf gets nothing
    z.grad_fn.register_hook(lambda gi, go: (gi[0], None))
    z.sum().backward()
    assert seen["sub"][1] is None
    assert w.grad is None and w_hook_calls == []
    assert a.grad is not None


# ---- roots ---------------------------------------------------------------------------------


def test_backward_on_a_leaf_copies_the_gradient() -> None:
    x = _leaf(3)
    g = fg.tensor([1.0, 2.0, 3.0], dtype=fg.float64)
    x.backward(g)
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0, 3.0])
    assert x.grad.data_ptr() != g.data_ptr()
    g.add_(10.0)
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0, 3.0])
    s = fg.tensor(2.0, requires_grad=True)
    s.backward()
    assert s.grad.item() == 1.0


def test_root_gradient_dtype_follows_the_root() -> None:
    x = fg.tensor([1.0, 2.0], dtype=fg.float32, requires_grad=True)
    x.backward(fg.ones(2, dtype=fg.float64))
    assert x.grad.dtype == fg.float32
    y = x * 2.0
    y.backward(np.array([1.0, 1.0]))  # array-likes are accepted as gradients
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])
    assert x.grad.dtype == fg.float32


def test_multiple_roots_where_one_depends_on_the_other() -> None:
    x = _leaf(3)
    y1 = x * 2.0
    y2 = y1 * 3.0
    g1 = fg.tensor([1.0, 2.0, 3.0], dtype=fg.float64)
    g2 = fg.tensor([0.5, 0.5, 0.5], dtype=fg.float64)
    fg.autograd.backward([y1, y2], [g1, g2])
    np.testing.assert_allclose(x.grad.numpy(), 2.0 * (g1.numpy() + 3.0 * g2.numpy()))
    np.testing.assert_array_equal(g1.numpy(), [1.0, 2.0, 3.0])  # not mutated by fan-in
    np.testing.assert_array_equal(g2.numpy(), [0.5, 0.5, 0.5])


def test_same_root_twice_sums_its_gradients() -> None:
    x = _leaf(2)
    y = x * 2.0
    fg.autograd.backward([y, y], [fg.ones(2, dtype=fg.float64), fg.ones(2, dtype=fg.float64)])
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 4.0])


def test_leaf_root_and_a_root_depending_on_it() -> None:
    x = _leaf(2)
    y = x * 3.0
    fg.autograd.backward([x, y], [fg.ones(2, dtype=fg.float64), fg.ones(2, dtype=fg.float64)])
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 4.0])


# ---- failures ------------------------------------------------------------------------------


def test_argument_errors_leave_grads_and_graph_untouched() -> None:
    x = _leaf(3)
    y = x.exp()
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar"):
        y.backward()
    with pytest.raises(ValueError, match="Mismatch in shape"):
        y.backward(fg.ones(4, dtype=fg.float64))
    z = y.sum()
    with pytest.raises(ValueError, match="Mismatch in shape"):
        fg.autograd.backward([z, y], [None, fg.ones(2, dtype=fg.float64)])
    assert x.grad is None
    y.sum().backward()  # saved tensors were not freed by the failed calls
    np.testing.assert_allclose(x.grad.numpy(), np.exp(x.detach().numpy()))


def test_root_that_does_not_require_grad() -> None:
    t = fg.ones(3)
    with pytest.raises(RuntimeError, match="does not require grad"):
        t.sum().backward()
    with pytest.raises(RuntimeError, match="element 1 of tensors does not require grad"):
        fg.autograd.backward([_leaf(1).sum(), t.sum()])


def _partial_failure(lib, inplace_ctx) -> tuple:
    a = lib.tensor([1.0, 2.0], requires_grad=True)
    b = lib.tensor([3.0, 4.0], requires_grad=True)
    c = lib.tensor([5.0, 6.0])
    bc = b * c  # older node: runs second and fails
    a2 = a * 2.0  # newer node: runs first, then a's accumulation
    with inplace_ctx():
        c.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (bc + a2).sum().backward()
    return a.grad, b.grad


@pytest.mark.compiled_differs(
    "compiled backward checks every saved tensor before it writes anything (docs/compile.md)"
)
def test_failing_backward_keeps_what_already_ran_like_pytorch() -> None:
    a_grad, b_grad = _partial_failure(fg, fg.no_grad)
    np.testing.assert_array_equal(a_grad.numpy(), [2.0, 2.0])
    assert b_grad is None
    try:
        import torch
    except ImportError:
        return
    ta, tb = _partial_failure(torch, torch.no_grad)
    np.testing.assert_array_equal(ta.numpy(), a_grad.numpy())
    assert tb is None
