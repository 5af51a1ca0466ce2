"""Hooks in depth: every registration kind with its handle, removal during backward, the order
against retain_grad and capture, binding to the grad_fn of registration time, hooks on custom
Functions, and the ``fusegrad.autograd.graph.Node`` surface (name, next_functions, metadata,
``_saved_<name>`` / ``_raw_saved_<name>``)."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import Function, grad
from fusegrad.autograd.graph import Node, get_gradient_edge


def _t(data, requires_grad: bool = False) -> fg.Tensor:
    return fg.tensor(np.asarray(data, dtype=np.float64), requires_grad=requires_grad)


# ---- removal during backward (semantics checked against torch) --------------------------------


def _removal_log(lib) -> list:
    """Hooks that remove other hooks (and themselves) while backward runs."""
    log: list = []
    handles: dict = {}
    x = lib.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2

    # a hook removing a later hook of the same tensor: the later one still runs this time
    # (the hooks of one tensor are snapshotted before they run), then never again
    def remove_b(g):
        log.append("a")
        handles["b"].remove()

    y.register_hook(remove_b)
    handles["b"] = y.register_hook(lambda g: log.append("b"))

    def self_removing(g):
        log.append("self")
        handles["self"].remove()

    handles["self"] = y.register_hook(self_removing)

    # a pre-hook of y's node removing x's post-accumulate hook: x's node runs later, so the
    # removal takes effect within this same backward
    def remove_acc(grad_outputs):
        log.append("pre")
        handles["acc"].remove()

    y.grad_fn.register_prehook(remove_acc)
    handles["acc"] = x.register_post_accumulate_grad_hook(lambda t: log.append("acc"))

    # a post-hook removing itself
    def post(gi, go):
        log.append("post")
        handles["post"].remove()

    handles["post"] = y.grad_fn.register_hook(post)
    y.sum().backward(retain_graph=True)
    log.append("|")
    y.sum().backward()
    return log


def test_removal_during_backward() -> None:
    assert _removal_log(fg) == ["a", "b", "self", "pre", "post", "|", "a", "pre"]


def test_removal_during_backward_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    assert _removal_log(fg) == _removal_log(torch)


# ---- registration rules -----------------------------------------------------------------------


def test_registration_errors() -> None:
    plain = fg.ones(2)
    for register in (plain.register_hook, plain.register_post_accumulate_grad_hook):
        with pytest.raises(RuntimeError, match="doesn't require gradient"):
            register(lambda *a: None)
    x = _t([1.0], True)
    with pytest.raises(
        RuntimeError, match="post accumulate grad hooks cannot be registered on non-leaf tensors"
    ):
        (x * 2.0).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(TypeError, match="callable"):
        (x * 2.0).grad_fn.register_hook(3)
    with pytest.raises(TypeError, match="callable"):
        (x * 2.0).grad_fn.register_prehook(None)


def test_leaf_hooks_run_for_grad_and_backward_inputs() -> None:
    x = _t([1.0, 2.0], True)
    calls: list = []
    x.register_hook(lambda g: (calls.append("x"), g * 10.0)[1])
    (gx,) = grad((x * 3.0).sum(), x)
    np.testing.assert_allclose(gx.numpy(), [30.0, 30.0])  # the hook's result is captured
    assert x.grad is None
    (x * 3.0).sum().backward(inputs=[x])
    np.testing.assert_allclose(x.grad.numpy(), [30.0, 30.0])
    assert calls == ["x", "x"]


def test_non_leaf_hook_with_grad_on_that_tensor() -> None:
    x = _t([1.0, 2.0], True)
    y = x * 2.0
    y.register_hook(lambda g: g + 1.0)
    (gy,) = grad((y * y).sum(), y)
    np.testing.assert_allclose(gy.numpy(), 2.0 * np.array([2.0, 4.0]) + 1.0)


def test_retain_grad_sees_hooked_gradient_and_accumulates() -> None:
    x = _t([1.0, 2.0], True)
    y = x * 2.0
    y.retain_grad()
    y.register_hook(lambda g: g * 3.0)  # registered after retain_grad: still runs before it
    (y * 1.0).sum().backward(retain_graph=True)
    np.testing.assert_allclose(y.grad.numpy(), [3.0, 3.0])
    (y * 1.0).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [6.0, 6.0])
    np.testing.assert_allclose(x.grad.numpy(), [12.0, 12.0])


def test_post_accumulate_hook_runs_once_per_backward_after_all_fan_in() -> None:
    x = _t([1.0, 2.0], True)
    seen: list = []
    x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.numpy().copy()))
    (x * x + x * 3.0 + x.exp()).sum().backward()
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], 2 * np.array([1.0, 2.0]) + 3.0 + np.exp([1.0, 2.0]))


def test_post_accumulate_hook_can_update_the_parameter_in_place() -> None:
    """The optimizer-in-backward pattern: step and clear .grad from the hook."""
    w = _t([1.0, 2.0], True)

    def step(param):
        with fg.no_grad():
            param.sub_(0.5 * param.grad)
        param.grad = None

    w.register_post_accumulate_grad_hook(step)
    (w * w).sum().backward()
    np.testing.assert_allclose(w.detach().numpy(), [0.0, 0.0])
    assert w.grad is None


def test_hooks_bind_to_registration_time_grad_fn_with_retain_grad_moving() -> None:
    x = _t([1.0, 2.0], True)
    y = x * 1.0
    y.retain_grad()
    old_node = y.grad_fn
    seen: list = []
    y.register_hook(lambda g: seen.append(("old", g.numpy().copy())))
    y.mul_(4.0)
    assert y.grad_fn is not old_node
    y.register_hook(lambda g: seen.append(("new", g.numpy().copy())))
    (y * 2.0).sum().backward()
    assert [s[0] for s in seen] == ["new", "old"]
    np.testing.assert_allclose(seen[1][1], [8.0, 8.0])
    np.testing.assert_allclose(y.grad.numpy(), [2.0, 2.0])  # .grad of the current value


def test_hooks_on_custom_function_outputs_and_nodes() -> None:
    class Double(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0, x * 3.0

        @staticmethod
        def backward(ctx, g1, g2):
            return g1 * 2.0 + g2 * 3.0

    x = _t([1.0], True)
    a, b = Double.apply(x)
    log: list = []
    b.register_hook(lambda g: (log.append("b"), g * 10.0)[1])
    a.grad_fn.register_prehook(
        lambda go: log.append(("pre", [None if g is None else float(g.sum()) for g in go]))
    )
    a.grad_fn.register_hook(lambda gi, go: log.append(("post", float(gi[0].sum()))))
    (a + b).sum().backward()
    assert log == ["b", ("pre", [1.0, 10.0]), ("post", 32.0)]
    np.testing.assert_allclose(x.grad.numpy(), [32.0])


def test_hook_results_are_checked() -> None:
    x = _t([1.0, 2.0], True)
    y = x * 1.0
    y.grad_fn.register_prehook(lambda go: (go[0], go[0]))
    with pytest.raises(RuntimeError, match="returned an incorrect number of values"):
        y.sum().backward()


# ---- the graph.Node surface -------------------------------------------------------------------


def test_graph_node_is_the_base_of_every_grad_fn() -> None:
    x = _t([1.0, 2.0], True)
    y = (x * 2.0).exp().sum()
    nodes = [y.grad_fn]
    seen = set()
    while nodes:
        node = nodes.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        assert isinstance(node, Node)
        assert isinstance(node.name(), str) and isinstance(node.metadata, dict)
        nodes.extend(n for n, _ in node.next_functions)
    assert len(seen) == 4  # Sum, Exp, Mul, AccumulateGrad
    assert isinstance(fg.autograd.graph.Node, type)  # reachable without an explicit import


def test_metadata_is_a_per_node_user_dict() -> None:
    x = _t([1.0], True)
    y = x * 2.0
    y.grad_fn.metadata["tag"] = "layer1"
    seen: list = []
    y.grad_fn.register_prehook(lambda go: seen.append(y.grad_fn.metadata["tag"]))
    y.sum().backward()
    assert seen == ["layer1"]
    assert (x * 2.0).grad_fn.metadata == {}


def test_get_gradient_edge() -> None:
    x = _t([1.0], True)
    y = x * 2.0
    assert get_gradient_edge(y) == (y.grad_fn, 0)
    node, nr = get_gradient_edge(x)
    assert node.name() == "AccumulateGrad" and nr == 0
    assert y.grad_fn.next_functions[0] == (node, 0)
    with pytest.raises(RuntimeError, match="does not require gradients"):
        get_gradient_edge(fg.ones(1))


def test_saved_accessors_with_pytorch_aliases() -> None:
    x = _t([1.0, 2.0], True)
    w = _t([3.0, 4.0], True)
    m = (x * w).grad_fn
    assert m._saved_self is x and m._saved_other is w
    assert m._saved_a is x and m._saved_b is w
    e = x.exp()
    np.testing.assert_allclose(e.grad_fn._saved_result.detach().numpy(), np.exp([1.0, 2.0]))
    assert e.grad_fn._saved_result.grad_fn is e.grad_fn  # an output comes back with its node
    assert e.grad_fn._saved_out.grad_fn is e.grad_fn
    s = x.log()
    assert s.grad_fn._saved_self is x and s.grad_fn._saved_x is x
    names = dir(m)
    assert "_saved_self" in names and "_saved_other" in names and "_raw_saved_a" in names
    with pytest.raises(AttributeError):
        _ = m._saved_result  # mul does not save its output
    with pytest.raises(AttributeError):
        _ = (x + w).grad_fn._saved_self  # add saves nothing


def test_saved_accessors_give_non_tensor_arguments() -> None:
    x = _t([[1.0, 2.0], [3.0, 4.0]], True)
    node = x.sum(dim=1, keepdim=True).grad_fn
    assert node._saved_dim == (1,) and node._saved_keepdim is True  # as torch's SumBackward1
    assert "_saved_dim" in dir(node)
    assert x.permute(1, 0).grad_fn._saved_dims == (1, 0)
    with pytest.raises(AttributeError):
        _ = node._saved_nonexistent


def test_saved_accessors_after_backward_raise() -> None:
    x = _t([1.0, 2.0], True)
    w = _t([3.0, 4.0], True)
    y = x * w
    y.sum().backward()
    with pytest.raises(RuntimeError, match="after they have already been freed"):
        _ = y.grad_fn._saved_self


def test_saved_accessors_match_torch() -> None:
    torch = pytest.importorskip("torch")
    for lib in (fg, torch):
        x = lib.tensor([1.0, 2.0], requires_grad=True)
        w = lib.tensor([3.0, 4.0], requires_grad=True)
        node = (x * w).grad_fn
        assert node._saved_self is x and node._saved_other is w
        y = x.exp()
        assert y.grad_fn._saved_result.grad_fn is y.grad_fn
        assert y.grad_fn._saved_result.requires_grad


def test_raw_saved_register_hooks() -> None:
    x = _t([1.0, 2.0], True)
    w = _t([3.0, 4.0], True)
    y = x * w
    log: list = []
    raw = y.grad_fn._raw_saved_self
    raw.register_hooks(
        lambda t: (log.append("pack"), t.detach() * 10.0)[1], lambda p: (log.append("unpack"), p)[1]
    )
    assert log == ["pack"]
    np.testing.assert_allclose(y.grad_fn._saved_self.detach().numpy(), [10.0, 20.0])
    with pytest.raises(RuntimeError, match="hooks have already been set"):
        raw.register_hooks(lambda t: t, lambda p: p)
    with pytest.raises(TypeError):
        y.grad_fn._raw_saved_other.register_hooks(lambda t: t, 3)
    y.sum().backward()
    # dw = x as the unpack hook gave it
    np.testing.assert_allclose(w.grad.numpy(), [10.0, 20.0])
    assert log == ["pack", "unpack", "unpack"]
    # the raw object outlives the node's saved values: after a backward it is freed
    z = x * x
    raw = z.grad_fn._raw_saved_self
    z.sum().backward()
    with pytest.raises(RuntimeError, match="after it has been freed"):
        raw.register_hooks(lambda t: t, lambda p: p)
