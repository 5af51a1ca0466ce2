"""Custom autograd Functions: apply, ctx (save_for_backward, needs_input_grad, mark_dirty,
mark_non_differentiable, set_materialize_grads), once_differentiable, error texts, double
backward through a custom backward, gradcheck / gradgradcheck, PyTorch parity."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import Function, grad, gradcheck, gradgradcheck
from fusegrad.autograd.function import once_differentiable
from fusegrad.autograd.graph import Node


def _t(data, requires_grad: bool = False) -> fg.Tensor:
    return fg.tensor(np.asarray(data, dtype=np.float64), requires_grad=requires_grad)


class Cube(Function):
    """x**3 with a backward written in fusegrad ops (so it is differentiable again)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3.0 * x * x


class ScaleBy(Function):
    """x * k for a Python number k; returns a non-tensor second output."""

    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k, "note"

    @staticmethod
    def backward(ctx, g, _unused):
        return g * ctx.k, None


def test_apply_builds_a_node_named_after_the_class() -> None:
    x = _t([1.0, 2.0], True)
    y = Cube.apply(x)
    assert y.requires_grad and not y.is_leaf
    assert y.grad_fn.name() == "CubeBackward"
    assert isinstance(y.grad_fn, Node)
    assert y.grad_fn.next_functions[0][0] is x._edge()[0]
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 12.0])


def test_ctx_is_the_grad_fn_and_needs_input_grad() -> None:
    seen = {}

    class Probe(Function):
        @staticmethod
        def forward(ctx, a, b, k):
            seen["ctx"] = ctx
            seen["needs"] = ctx.needs_input_grad
            return a * b * k

        @staticmethod
        def backward(ctx, g):
            seen["needs_in_backward"] = ctx.needs_input_grad
            return g, None, None

    a = _t([1.0], True)
    b = _t([2.0])
    y = Probe.apply(a, b, 3.0)
    assert y.grad_fn is seen["ctx"]
    assert seen["needs"] == (True, False, False)
    y.sum().backward()
    assert seen["needs_in_backward"] == (True, False, False)


def test_non_tensor_inputs_and_outputs() -> None:
    x = _t([1.0, 2.0], True)
    y, note = ScaleBy.apply(x, 4.0)
    assert note == "note"
    assert y.output_nr == 0
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 4.0])


def test_no_grad_mode_or_no_input_requiring_grad_records_nothing() -> None:
    x = _t([1.0, 2.0], True)
    with fg.no_grad():
        assert Cube.apply(x).grad_fn is None
    assert Cube.apply(_t([1.0])).grad_fn is None


def test_saved_tensors_are_version_checked() -> None:
    x = _t([1.0, 2.0], True)
    h = x * 1.0
    y = Cube.apply(h)
    with fg.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
        y.sum().backward()
    assert "CubeBackward" in str(info.value)


def test_saved_tensors_are_freed_after_backward() -> None:
    captured = {}

    class Keep(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            captured["ctx"] = ctx
            (_x,) = ctx.saved_tensors
            return g * 2.0

    x = _t([1.0], True)
    y = Keep.apply(x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
        _ = captured["ctx"].saved_tensors
    with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
        y.backward()
    # with retain_graph the saved tensors survive
    z = Keep.apply(x).sum()
    z.backward(retain_graph=True)
    z.backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0])


def test_save_for_backward_accepts_only_tensors_and_none() -> None:
    class Bad(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, 3)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(
        TypeError, match="save_for_backward can only save variables, but argument 1"
    ):
        Bad.apply(_t([1.0], True))

    class SavesNone(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(None, x)
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            none, _x = ctx.saved_tensors
            assert none is None
            return g * 2.0

    x = _t([1.0], True)
    SavesNone.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0])


def test_saved_output_gives_double_backward_through_the_node() -> None:
    class Exp(Function):
        @staticmethod
        def forward(ctx, x):
            out = x.exp()
            ctx.save_for_backward(out)
            return out

        @staticmethod
        def backward(ctx, g):
            (out,) = ctx.saved_tensors
            return g * out

    x = _t([0.5, -1.0], True)
    (g,) = grad(Exp.apply(x).sum(), x, create_graph=True)
    (gg,) = grad(g.sum(), x)
    np.testing.assert_allclose(gg.numpy(), np.exp([0.5, -1.0]))


def test_double_backward_through_a_custom_backward() -> None:
    x = _t([1.0, -2.0], True)
    (g,) = grad(Cube.apply(x).sum(), x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), [3.0, 12.0])
    (gg,) = grad(g.sum(), x, create_graph=True)
    np.testing.assert_allclose(gg.detach().numpy(), [6.0, -12.0])
    (ggg,) = grad(gg.sum(), x)
    np.testing.assert_allclose(ggg.numpy(), [6.0, 6.0])


def test_gradcheck_and_gradgradcheck_on_custom_functions() -> None:
    class Mix(Function):
        """(a * b, sin(a)) with a hand-written backward in fusegrad ops."""

        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * b, a.sin()

        @staticmethod
        def backward(ctx, ga, gs):
            a, b = ctx.saved_tensors
            return ga * b + gs * a.cos(), ga * a

    rng = np.random.default_rng(1)
    a = _t(rng.standard_normal(3), True)
    b = _t(rng.standard_normal(3), True)
    assert gradcheck(Mix.apply, (a, b))
    assert gradgradcheck(Mix.apply, (a, b))
    assert gradcheck(Cube.apply, (a,))
    assert gradgradcheck(Cube.apply, (a,))


def test_gradcheck_catches_a_wrong_custom_backward() -> None:
    class Wrong(Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, g):
            return g  # should be 2 x g

    with pytest.raises(RuntimeError, match="Jacobian mismatch"):
        gradcheck(Wrong.apply, (_t([1.0, 2.0], True),))


def test_wrong_number_of_gradients() -> None:
    class TooFew(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a + b

        @staticmethod
        def backward(ctx, g):
            return g

    a, b = _t([1.0], True), _t([2.0], True)
    with pytest.raises(RuntimeError, match="returned an incorrect number of gradients"):
        TooFew.apply(a, b).sum().backward()

    class TrailingNones(Function):
        @staticmethod
        def forward(ctx, a):
            return a * 1.0

        @staticmethod
        def backward(ctx, g):
            return g, None, None  # extra Nones are allowed, as in PyTorch

    TrailingNones.apply(a).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [1.0])


def test_wrong_shape_of_a_gradient_is_the_engines_invalid_gradient_error() -> None:
    class BadShape(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return fg.ones(3, dtype=fg.float64)

    with pytest.raises(RuntimeError, match="invalid gradient at index 0"):
        BadShape.apply(_t([1.0, 2.0], True)).sum().backward()


def test_broadcastable_gradient_is_summed_and_dtype_cast() -> None:
    class Wide(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return fg.ones((2, 3), dtype=fg.float32)  # summed to (3,), cast to float64

    x = _t([1.0, 2.0, 3.0], True)
    Wide.apply(x).sum().backward()
    assert x.grad.dtype == fg.float64
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0, 2.0])


def test_gradient_for_a_non_tensor_input_is_an_error() -> None:
    class GradForNumber(Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * k

        @staticmethod
        def backward(ctx, g):
            return g, g

    with pytest.raises(RuntimeError, match="forward input was not a Tensor"):
        GradForNumber.apply(_t([1.0], True), 2.0).sum().backward()


def test_none_gradients_stay_none() -> None:
    class OnlyFirst(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a * b

        @staticmethod
        def backward(ctx, g):
            return g, None

    a, b = _t([1.0], True), _t([2.0], True)
    OnlyFirst.apply(a, b).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [1.0])
    assert b.grad is None
    _ga, gb = grad(OnlyFirst.apply(a, b).sum(), (a, b), allow_unused=True)
    assert gb is None
    # a gradient for an input that does not require grad is dropped
    c = _t([3.0])
    OnlyFirst.apply(a, c).sum().backward()
    assert c.grad is None


def test_materialize_grads_true_gives_zeros_false_gives_none() -> None:
    seen: list = []

    def make(materialize: bool) -> type:
        class TwoOut(Function):
            @staticmethod
            def forward(ctx, x):
                ctx.set_materialize_grads(materialize)
                return x * 1.0, x * 2.0

            @staticmethod
            def backward(ctx, g1, g2):
                seen.append((g1, g2))
                total = g1 if g1 is not None else None
                if g2 is not None:
                    total = g2 * 2.0 if total is None else total + g2 * 2.0
                return total

        return TwoOut

    x = _t([1.0, 2.0], True)
    first, _second = make(True).apply(x)
    first.sum().backward()
    assert seen[-1][1] is not None
    np.testing.assert_array_equal(seen[-1][1].numpy(), [0.0, 0.0])
    first, _second = make(False).apply(x)
    first.sum().backward()
    assert seen[-1][1] is None


def test_backward_runs_even_when_every_output_gradient_is_none() -> None:
    """PyTorch calls a custom backward whose outputs got no gradient at all (with Nones when
    materialize_grads is off); its None results then stay None."""
    calls: list = []

    class NoneIn(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            calls.append(g)
            return g

    class Blocks(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return None

    x = _t([1.0], True)
    Blocks.apply(NoneIn.apply(x)).sum().backward()
    assert calls == [None]
    assert x.grad is None


def test_mark_non_differentiable() -> None:
    class SortLike(Function):
        @staticmethod
        def forward(ctx, x):
            idx = fg.tensor(np.argsort(x.detach().numpy()))
            values = x * 1.0
            flags = x > 0.0
            ctx.mark_non_differentiable(flags)
            return values, idx, flags

        @staticmethod
        def backward(ctx, g, g_idx, g_flags):
            assert g_flags is not None and not g_flags.any()  # materialized zeros
            return g

    x = _t([3.0, -1.0], True)
    values, idx, flags = SortLike.apply(x)
    assert values.requires_grad
    assert not idx.requires_grad and not flags.requires_grad  # integer/bool, marked

    class MarkFloat(Function):
        @staticmethod
        def forward(ctx, x):
            out, aux = x * 2.0, x * 3.0
            ctx.mark_non_differentiable(aux)
            return out, aux

        @staticmethod
        def backward(ctx, g, g_aux):
            np.testing.assert_array_equal(g_aux.numpy(), [0.0, 0.0])
            return g * 2.0

    out, aux = MarkFloat.apply(x)
    assert not aux.requires_grad and aux.grad_fn is None
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


def test_mark_dirty_rebases_the_input_history() -> None:
    class AddOneInPlace(Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1.0)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2.0  # deliberately not 1, to see the path taken

    a = _t([1.0, 2.0], True)
    h = a * 3.0
    version = h._version
    out = AddOneInPlace.apply(h)
    assert out is h  # the dirty input itself is returned
    assert h._version > version
    assert h.grad_fn.name() == "AddOneInPlaceBackward"
    np.testing.assert_array_equal(h.detach().numpy(), [4.0, 7.0])
    h.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [6.0, 6.0])


def test_mark_dirty_errors() -> None:
    class DirtyLeaf(Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1.0)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    leaf = _t([1.0], True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        DirtyLeaf.apply(leaf)

    class DirtyNotReturned(Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.mark_dirty(x)
            return y * 1.0

        @staticmethod
        def backward(ctx, g):
            return g, g

    with pytest.raises(RuntimeError, match="were not returned as output"):
        DirtyNotReturned.apply(_t([1.0], True) * 1.0, _t([1.0], True))


def test_input_returned_unchanged_is_a_new_alias() -> None:
    class Identity(Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 5.0

    x = _t([1.0], True)
    y = Identity.apply(x)
    assert y is not x and x.is_leaf and y.grad_fn.name() == "IdentityBackward"
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0])


def test_once_differentiable_runs_without_grad_and_refuses_double_backward() -> None:
    modes: list = []

    class Square(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @once_differentiable
        def backward(ctx, g):
            modes.append(fg.is_grad_enabled())
            (x,) = ctx.saved_tensors
            return g * 2.0 * x

    x = _t([3.0], True)
    Square.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0])
    # the incoming gradient does not require grad: the result is a plain tensor (as in torch)
    (g,) = grad(Square.apply(x).sum(), x, create_graph=True)
    assert not g.requires_grad
    # it does here (d/dy of y*y is 2y): the result carries a node that refuses to differentiate
    y = Square.apply(x)
    (g,) = grad((y * y).sum(), x, create_graph=True)
    assert modes == [False, False, False]
    np.testing.assert_allclose(g.detach().numpy(), [108.0])
    assert g.requires_grad
    with pytest.raises(
        RuntimeError,
        match="trying to differentiate twice a function that was marked with @once_differentiable",
    ):
        g.sum().backward()


def test_setup_context_style() -> None:
    class MulConst(Function):
        @staticmethod
        def forward(x, k):
            return x * k

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, k = inputs
            ctx.k = k
            ctx.save_for_backward(x)

        @staticmethod
        def backward(ctx, g):
            (_x,) = ctx.saved_tensors
            return g * ctx.k, None

    x = _t([1.0, 2.0], True)
    MulConst.apply(x, 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def test_custom_function_matches_torch() -> None:
    torch = pytest.importorskip("torch")

    def run(lib):
        class MyCube(lib.autograd.Function):
            @staticmethod
            def forward(ctx, x, k):
                ctx.save_for_backward(x)
                ctx.k = k
                return x * x * x * k, x * 2.0

            @staticmethod
            def backward(ctx, g, g2):
                (x,) = ctx.saved_tensors
                return g * 3.0 * x * x * ctx.k + g2 * 2.0, None

        x = lib.tensor([0.5, -1.5, 2.0], dtype=lib.float64, requires_grad=True)
        a, b = MyCube.apply(x, 2.0)
        (g,) = lib.autograd.grad((a * b).sum(), x, create_graph=True)
        (gg,) = lib.autograd.grad(g.sum(), x)
        return (
            a.grad_fn.name(),
            g.detach().numpy().copy(),
            gg.detach().numpy().copy(),
        )

    ours, theirs = run(fg), run(torch)
    assert ours[0] == theirs[0]
    np.testing.assert_allclose(ours[1], theirs[1])
    np.testing.assert_allclose(ours[2], theirs[2])
