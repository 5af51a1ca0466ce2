"""Saved-tensor hooks: ``fusegrad.autograd.graph.saved_tensors_hooks`` (pack once at save,
unpack on every access, innermost wins, validation errors, thread-local and carried into
reentrant worker threads), ``save_on_cpu`` and ``disable_saved_tensors_hooks``."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import Function, engine, grad
from fusegrad.autograd import node as node_module
from fusegrad.autograd.graph import (
    disable_saved_tensors_hooks,
    save_on_cpu,
    saved_tensors_hooks,
)


def _t(data, requires_grad: bool = False) -> fg.Tensor:
    return fg.tensor(np.asarray(data, dtype=np.float64), requires_grad=requires_grad)


class _Log:
    """Pack / unpack hooks that record what they see."""

    def __init__(self, tag: str = "") -> None:
        self.packed: list = []
        self.unpacked: list = []
        self.tag = tag

    def pack(self, t):
        self.packed.append(t)
        return (self.tag, t.detach())

    def unpack(self, packed):
        self.unpacked.append(packed)
        return packed[1]

    def hooks(self) -> saved_tensors_hooks:
        return saved_tensors_hooks(self.pack, self.unpack)


def test_pack_once_at_save_unpack_at_each_use() -> None:
    log = _Log()
    a = _t([1.0, 2.0], True)
    b = _t([3.0, 4.0], True)
    with log.hooks():
        y = a * b  # mul saves both inputs
        z = y.exp()  # exp saves its output
    assert len(log.packed) == 3
    assert log.packed[0] is a and log.packed[1] is b  # the tensors themselves, as in torch
    assert log.packed[2] is z
    assert log.unpacked == []
    s = z.sum()
    s.backward(retain_graph=True)
    assert len(log.unpacked) == 3
    s.backward()
    assert len(log.unpacked) == 6
    assert len(log.packed) == 3
    expected = np.exp([3.0, 8.0]) * np.array([3.0, 4.0]) * 2
    np.testing.assert_allclose(a.grad.numpy(), expected)


def test_gradients_with_hooks_equal_gradients_without() -> None:
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((3, 4))
    w0 = rng.standard_normal((4, 2))

    def run(with_hooks: bool):
        x, w = _t(x0, True), _t(w0, True)
        log = _Log()
        if with_hooks:
            with log.hooks():
                loss = ((x @ w).tanh() * x.sum(1, keepdim=True)).sigmoid().sum()
        else:
            loss = ((x @ w).tanh() * x.sum(1, keepdim=True)).sigmoid().sum()
        loss.backward()
        return x.grad.numpy(), w.grad.numpy(), len(log.packed)

    gx, gw, n = run(True)
    rx, rw, _ = run(False)
    assert n > 0
    np.testing.assert_allclose(gx, rx)
    np.testing.assert_allclose(gw, rw)


def test_innermost_hooks_win() -> None:
    outer, inner = _Log("outer"), _Log("inner")
    x = _t([1.0], True)
    with outer.hooks():
        a = x.exp()
        with inner.hooks():
            b = a.sin()
        c = b.cos()
    assert [p is a for p in outer.packed] == [True, False]  # a (exp output), then b (for cos)
    assert [p is a for p in inner.packed] == [True]  # sin saves its input a
    c.backward()
    assert [u[0] for u in inner.unpacked] == ["inner"]
    assert [u[0] for u in outer.unpacked] == ["outer", "outer"]


def test_unpacked_tensor_keeps_its_place_in_the_graph() -> None:
    """Whatever the unpack hook returns, the saved tensor is rebuilt with the original's
    grad_fn (or leaf accumulator), so double backward still reaches the inputs."""
    x = _t([0.5, 1.5], True)
    with saved_tensors_hooks(lambda t: t.detach().clone(), lambda p: p):
        y = (x * x).sin()
    (g,) = grad(y.sum(), x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), np.cos([0.25, 2.25]) * 2 * np.array([0.5, 1.5]))
    (gg,) = grad(g.sum(), x)
    xv = np.array([0.5, 1.5])
    expected = -np.sin(xv**2) * (2 * xv) ** 2 + np.cos(xv**2) * 2
    np.testing.assert_allclose(gg.numpy(), expected)
    node = y.grad_fn
    assert node._saved_self.grad_fn is node.next_functions[0][0]


def test_saved_accessor_goes_through_the_unpack_hook() -> None:
    x = _t([1.0, 2.0], True)
    with saved_tensors_hooks(lambda t: 5, lambda p: fg.zeros(2, dtype=fg.float64)):
        y = x * x
    saved = y.grad_fn._saved_self
    np.testing.assert_array_equal(saved.detach().numpy(), [0.0, 0.0])
    assert saved.requires_grad and saved.is_leaf and saved is not x


def test_hooks_apply_to_custom_function_saved_tensors() -> None:
    class Square(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2.0 * x

    log = _Log()
    x = _t([3.0], True)
    with log.hooks():
        y = Square.apply(x)
    assert len(log.packed) == 1 and log.packed[0] is x
    y.sum().backward()
    assert len(log.unpacked) == 1
    np.testing.assert_allclose(x.grad.numpy(), [6.0])


def test_python_numbers_are_not_shown_to_hooks() -> None:
    log = _Log()
    x = _t([1.0], True)
    with log.hooks():
        y = 2.0 / x  # x's gradient needs both operands; the wrapped 2.0 is not packed
    assert len(log.packed) == 1 and log.packed[0] is x
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [-2.0])
    with log.hooks():
        x * 2.0  # mul saves only the 2.0 (for x's gradient): nothing is packed
    assert len(log.packed) == 1


def test_unpack_hook_must_return_a_tensor() -> None:
    x = _t([1.0], True)
    with saved_tensors_hooks(lambda t: t, lambda p: 3):
        y = (x * x).sum()
    with pytest.raises(
        TypeError,
        match="Output of saved tensor unpack_hook expected to be a "
        "Tensor but got result of type int",
    ):
        y.backward()


def test_pack_hook_may_not_modify_its_input_in_place() -> None:
    x = _t([1.0], True)
    h = x * 1.0

    def pack(t):
        t.add_(1.0)
        return t

    with (
        saved_tensors_hooks(pack, lambda p: p),
        pytest.raises(
            RuntimeError, match="A saved tensor pack hook is modifying its input in place"
        ),
    ):
        h * h


def test_pack_hook_runs_under_no_grad() -> None:
    modes: list = []
    x = _t([1.0], True)
    with saved_tensors_hooks(
        lambda t: modes.append(fg.is_grad_enabled()) or t.detach(), lambda p: p
    ):
        x.exp()
    assert modes == [False]


def test_hooks_must_be_callable() -> None:
    with pytest.raises(TypeError, match="callable"):
        saved_tensors_hooks(3, lambda p: p)


def test_no_hooks_outside_the_context_and_under_inference_mode() -> None:
    log = _Log()
    x = _t([1.0], True)
    with log.hooks():
        pass
    x.exp()
    assert log.packed == []
    with fg.inference_mode(), log.hooks():
        x.exp()  # nothing is recorded, so nothing is saved
    with log.hooks(), fg.no_grad():
        x.exp()
    assert log.packed == []


def test_disable_saved_tensors_hooks() -> None:
    message = "saved tensors default hooks are disabled"
    with disable_saved_tensors_hooks(message):
        with pytest.raises(RuntimeError, match=message), saved_tensors_hooks(lambda t: t, id):
            pass
        with pytest.raises(RuntimeError, match=message), save_on_cpu():
            pass
    with saved_tensors_hooks(lambda t: t, lambda p: p):  # allowed again
        pass


def test_exceptions_inside_the_context_pop_the_hooks() -> None:
    log = _Log()
    with pytest.raises(KeyError), log.hooks():
        raise KeyError("x")
    x = _t([1.0], True)
    x.exp()
    assert log.packed == []


def test_hooks_are_thread_local() -> None:
    log = _Log()
    other_thread_packed: list = []

    def work():
        x = _t([1.0], True)
        x.exp()
        other_thread_packed.append(len(log.packed))

    with log.hooks():
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert other_thread_packed == [0]


def test_reentrant_worker_threads_see_the_callers_hooks() -> None:
    """Past MAX_REENTRANT_DEPTH a nested backward runs on a fresh thread; ops that its nodes
    run (create_graph) save through the same hooks as on the calling thread."""
    depth = engine.MAX_REENTRANT_DEPTH + 2
    log = _Log()
    counts: list = []

    class Nest(Function):
        @staticmethod
        def forward(ctx, x, level):
            ctx.level = level
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            if ctx.level > 0:
                with fg.enable_grad():
                    inner = _t([1.0], True)
                    y = Nest.apply(inner, ctx.level - 1)
                    before = len(log.packed)
                    y = y.exp()  # exp saves its output: packed by the active hooks
                    counts.append((threading.current_thread().name, len(log.packed) - before))
                    grad(y.sum(), inner)
            return g, None

    x = _t([1.0], True)
    with log.hooks():
        Nest.apply(x, depth).sum().backward()
    assert len(counts) == depth
    assert all(n == 1 for _, n in counts)
    assert any(name.startswith("fusegrad-reentrant") for name, _ in counts)
    # and the worker threads put their state back: nothing is left active here
    y = _t([1.0], True).exp()
    assert not log.packed or log.packed[-1] is not y
    assert node_module._hooks_in_use == 0  # the fast-path counter is back to zero


def test_save_on_cpu_keeps_a_copy() -> None:
    x = _t([1.0, 2.0], True)
    with save_on_cpu(pin_memory=True):
        h = x * 1.0
        y = (h * h).sum()
    with fg.no_grad():
        h.mul_(100.0)  # no version error: backward uses the copies made at save time
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


def test_saved_tensor_hooks_match_torch() -> None:
    torch = pytest.importorskip("torch")

    def run(lib):
        packed: list = []
        x = lib.tensor([0.3, -0.7], dtype=lib.float64, requires_grad=True)
        w = lib.tensor([1.5, 2.5], dtype=lib.float64, requires_grad=True)

        def pack(t):
            packed.append(tuple(t.shape))
            return t.detach() * 2.0  # the unpacked values differ: gradients show which were used

        hooks = lib.autograd.graph.saved_tensors_hooks(pack, lambda p: p * 0.5)
        with hooks:
            y = (x * w).tanh()
        y.sum().backward()
        return len(packed), x.grad.numpy().copy(), w.grad.numpy().copy()

    ours, theirs = run(fg), run(torch)
    assert ours[0] == theirs[0]
    np.testing.assert_allclose(ours[1], theirs[1])
    np.testing.assert_allclose(ours[2], theirs[2])
