"""Checkpointing inside compiled backward (issue 12, item 1): the recomputed forward is part of
the backward program.

Non-reentrant checkpointing records the checkpointed function's primitive calls while its
forward runs (``autograd.recording``); compiled autograd emits those calls into the backward
program where eager mode would recompute, instead of calling the unpack hook that re-runs the
Python.  Each test compares the gradients with eager mode's (float64, tight) and checks how the
backward ran: recomputation captured (no user code in the program), or -- where a replay of the
recorded calls might not compute what the Python would -- the unpack hook as an opaque step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import random_programs
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler.capture import capture
from fusegrad.compiler.key import walk
from fusegrad.utils.checkpoint import CheckpointError, checkpoint, checkpoint_sequential

pytestmark = pytest.mark.usefixtures("fresh_compiler")


def _walk(y: fg.Tensor) -> Any:
    return walk([y], [fg.ones_like(y)], None, True, False)


def _ops(y: fg.Tensor) -> list[str]:
    """The ops of the captured backward graph of ``y`` (no program is run)."""
    w = _walk(y)
    assert w.fallback is None, w.fallback
    graph = capture(w, [y], [fg.ones_like(y)], None, True).graph
    return [v.op for v in graph.values]


class _Net:
    """Two layers and a norm, float64, with a counter of forward calls."""

    def __init__(self, seed: int = 0) -> None:
        fg.manual_seed(seed)
        self.lin1 = fg.nn.Linear(6, 12).double()
        self.norm = fg.nn.LayerNorm(12).double()
        self.lin2 = fg.nn.Linear(12, 5).double()
        self.calls = 0

    def params(self) -> list[fg.Tensor]:
        return [*self.lin1.parameters(), *self.norm.parameters(), *self.lin2.parameters()]

    def block(self, x: fg.Tensor) -> fg.Tensor:
        self.calls += 1
        h = self.norm(fg.tanh(self.lin1(x)))
        return self.lin2(h * h.sigmoid())


def _grads(
    compiled: bool,
    forward: Callable[[fg.Tensor], fg.Tensor],
    leaves: list[fg.Tensor],
    x: fg.Tensor,
) -> list[np.ndarray]:
    for t in [x, *leaves]:
        t.grad = None
    y = (forward(x) ** 2).sum()
    if compiled:
        with compiler.compiled_autograd():
            y.backward()
    else:
        y.backward()
    return [t.grad.numpy().copy() for t in [x, *leaves]]


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-11, atol=1e-13)


def _x(n: int = 4, seed: int = 1) -> fg.Tensor:
    rng = np.random.default_rng(seed)
    return fg.tensor(rng.standard_normal((n, 6)), requires_grad=True)


def test_the_recomputation_is_part_of_the_program_and_gives_eagers_gradients() -> None:
    net = _Net()

    def forward(x: fg.Tensor) -> fg.Tensor:
        return checkpoint(net.block, x, use_reentrant=False)

    eager = _grads(False, lambda x: net.block(x), net.params(), _x())
    net.calls = 0
    for _ in range(3):  # one capture, then cache hits, each on a new forward
        _close(_grads(True, forward, net.params(), _x()), eager)
    # the Python ran once per forward: the backward recomputed from the recording
    assert net.calls == 3
    assert compiler.counters.captures == 1 and compiler.counters.compiled_runs == 3
    assert compiler.counters.checkpoints_replayed == 3
    assert not compiler.counters.fallbacks and not compiler.counters.checkpoints_rerun
    y = (forward(_x()) ** 2).sum()
    w = _walk(y)
    assert len(w.regions) == 1 and not w.has_hooks
    ops = _ops(y)
    assert "unpack_saved" not in ops and "matmul" in ops and "tanh" in ops
    # what the recording reads from outside the function: the parameters, nothing else
    rec = w.regions[0][0]
    assert {id(t) for t in rec.outside} == {id(p) for p in net.params()}


def test_eager_mode_still_runs_the_python_again() -> None:
    net = _Net()
    y = (checkpoint(net.block, _x(), use_reentrant=False) ** 2).sum()
    y.backward()
    assert net.calls == 2


def test_other_batch_sizes_reuse_the_symbolic_capture() -> None:
    net = _Net()

    def forward(x: fg.Tensor) -> fg.Tensor:
        return checkpoint(net.block, x, use_reentrant=False)

    for n in (3, 7, 9):  # (none equal to a layer width: that would be another key)
        x = _x(n, seed=n)
        _close(_grads(True, forward, net.params(), x), _grads(False, net.block, net.params(), x))
    assert compiler.counters.captures == 1


def test_different_python_paths_are_different_programs() -> None:
    net = _Net()
    flags = [True]

    def block(x: fg.Tensor) -> fg.Tensor:
        h = net.block(x)
        return h.exp() if flags[0] else h.cos()

    for flag in (True, False, True, False):
        flags[0] = flag
        x = _x()
        eager = _grads(False, block, net.params(), x)
        got = _grads(True, lambda x: checkpoint(block, x, use_reentrant=False), net.params(), x)
        _close(got, eager)
    assert compiler.counters.captures == 2
    assert not compiler.counters.fallbacks


@pytest.mark.parametrize(
    ("preserve", "own_generator"), [(True, False), (False, False), (True, True)]
)
def test_dropout_inside_draws_what_eager_draws(preserve: bool, own_generator: bool) -> None:
    """With the default generator's state preserved, the program draws the mask again from
    that state (the forward's numbers; the mask is not kept).  Without, or from a generator of
    its own, eager's recomputation draws anew: the unpack hook runs the Python as a step of the
    program, drawing what eager draws."""
    net = _Net()
    generator = fg.Generator().manual_seed(3) if own_generator else None

    def block(x: fg.Tensor) -> fg.Tensor:
        return fg.nn.functional.dropout(net.block(x), 0.5, generator=generator) * 3.0

    def forward(x: fg.Tensor) -> fg.Tensor:
        return checkpoint(block, x, use_reentrant=False, preserve_rng_state=preserve)

    x = _x()
    fg.manual_seed(5)
    if generator is not None:
        generator.manual_seed(3)
    eager = _grads(False, forward, net.params(), x)
    eager_next = fg.rand(3).numpy()
    for _ in range(2):
        fg.manual_seed(5)
        if generator is not None:
            generator.manual_seed(3)
        _close(_grads(True, forward, net.params(), x), eager)
        np.testing.assert_array_equal(fg.rand(3).numpy(), eager_next)
    y = (forward(x) ** 2).sum()
    w = _walk(y)
    if preserve and not own_generator:
        assert len(w.regions) == 1 and not w.has_hooks
        rec = w.regions[0][0]
        assert [op[0] for op in rec.ops].count("draw") == 1
        assert {id(t) for t in rec.outside} == {id(p) for p in net.params()}  # (no mask kept)
    else:
        assert not w.regions and w.has_hooks
        assert ("preserve_rng_state=False" if not preserve else "other than the default") in (
            _broken(y)
        )
    assert not compiler.counters.fallbacks


def _broken(y: fg.Tensor) -> str:
    """Why the checkpoint recordings in ``y``'s graph cannot be replayed, joined ("" when all
    of them can)."""
    stack, seen, reasons = [y.grad_fn], set(), {}
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        for s in getattr(n, "_saved", None) or ():
            rec = getattr(getattr(s, "_packed", None), "recording", None)
            if rec is not None:
                reasons[id(rec)] = rec.broken or ""
        stack.extend(c for c, _ in n._edges)
    assert reasons, "no checkpoint holder in the graph"
    return "; ".join(sorted(reasons.values()))


def _data_branch(x: fg.Tensor) -> fg.Tensor:
    h = x.exp()
    return h.sin() if float(h.sum()) > 0 else h.cos()


def _inplace_arg(x: fg.Tensor) -> fg.Tensor:
    h = x * 1.0
    x.data.mul_(1.0)  # (writes into the argument: no replay)
    return h.sin()


def _inplace_inside(x: fg.Tensor) -> fg.Tensor:
    h = (x * 2.0).exp() * 1.0
    h.mul_(0.5)
    return (h.relu_() * x).tanh()


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (_data_branch, "reads tensor values"),
        (_inplace_inside, None),
    ],
)
def test_what_a_replay_cannot_vouch_for_runs_the_python(fn: Callable, reason: str | None) -> None:
    x = fg.tensor(np.linspace(-1.0, 1.0, 12).reshape(2, 6), requires_grad=True)
    want = _grads(False, fn, [], x)
    y = (checkpoint(fn, x, use_reentrant=False) ** 2).sum()
    broken = _broken(y)
    if reason is None:
        assert broken == ""
    else:
        assert reason in broken
    _close(_grads(True, lambda x: checkpoint(fn, x, use_reentrant=False), [], x), want)
    assert not compiler.counters.fallbacks and compiler.counters.compiled_runs == 1
    if reason is None:
        assert compiler.counters.checkpoints_replayed == 1
    else:
        assert reason in next(iter(compiler.counters.checkpoints_rerun))


def test_nested_checkpoints() -> None:
    net = _Net()

    def inner(h: fg.Tensor) -> fg.Tensor:
        return (h * 1.5).tanh() * h

    def outer(x: fg.Tensor) -> fg.Tensor:
        h = net.block(x)
        return checkpoint(inner, h, use_reentrant=False).exp()

    x = _x()
    eager = _grads(False, outer, net.params(), x)
    for _ in range(2):
        got = _grads(True, lambda x: checkpoint(outer, x, use_reentrant=False), net.params(), x)
        _close(got, eager)
    y = (checkpoint(outer, x, use_reentrant=False) ** 2).sum()
    w = _walk(y)
    assert len(w.regions) == 2 and not w.has_hooks
    assert compiler.counters.captures == 1 and not compiler.counters.fallbacks


def test_nested_checkpoints_whose_inner_one_the_walk_meets_first() -> None:
    """The outer function returns the inner checkpoint's result: the walk keys the inner
    recording first, and keying its argument (packed by the outer one) keys the outer."""
    net = _Net()

    def outer(x: fg.Tensor) -> fg.Tensor:
        h = net.block(x).sin()
        return checkpoint(lambda a: (a * 1.5).tanh() * a, h, use_reentrant=False)

    x = _x()
    eager = _grads(False, outer, net.params(), x)
    got = _grads(True, lambda x: checkpoint(outer, x, use_reentrant=False), net.params(), x)
    _close(got, eager)
    w = _walk((checkpoint(outer, x, use_reentrant=False) ** 2).sum())
    assert len(w.regions) == 2 and not w.has_hooks


def test_checkpoint_sequential_and_conv_layers() -> None:
    fg.manual_seed(3)
    layers = fg.nn.Sequential(
        fg.nn.Conv2d(2, 4, 3, padding=1),
        fg.nn.BatchNorm2d(4),
        fg.nn.ReLU(),
        fg.nn.Conv2d(4, 4, 3),
        fg.nn.GroupNorm(2, 4),
        fg.nn.Tanh(),
        fg.nn.Flatten(),
        fg.nn.Linear(64, 3),
    ).double()
    params = list(layers.parameters())
    x = fg.randn(2, 2, 6, 6, dtype=fg.float64, requires_grad=True)

    def forward(x: fg.Tensor) -> fg.Tensor:
        return checkpoint_sequential(layers, 3, x, use_reentrant=False)

    state = [b.numpy().copy() for b in layers.buffers()]
    eager = _grads(False, forward, params, x)
    eager_buffers = [b.numpy().copy() for b in layers.buffers()]
    for b, s in zip(layers.buffers(), state):
        b.data.copy_(fg.tensor(s))
    _close(_grads(True, forward, params, x), eager)
    # batch norm's running statistics: updated again by the recomputation, as in eager mode
    _close([b.numpy() for b in layers.buffers()], eager_buffers)
    assert not compiler.counters.fallbacks
    y = (forward(x) ** 2).sum()
    w = _walk(y)
    # the first segment's recomputation writes batch norm's buffers: only its Python does that
    assert len(w.regions) == 1 and w.has_hooks
    assert "writes in place into a tensor from outside" in _broken(y)


def test_parameters_are_read_as_they_are_at_backward() -> None:
    """Eager's recomputation reads a parameter's values at backward time; so does the program."""
    net = _Net()
    results = []
    for compiled in (False, True):
        for p in net.params():
            p.grad = None
        with fg.no_grad():
            net.lin1.weight.fill_(0.1)
        x = _x()
        y = (checkpoint(net.block, x, use_reentrant=False) ** 2).sum()
        with fg.no_grad():
            net.lin1.weight.mul_(2.0)  # between forward and backward
        if compiled:
            with compiler.compiled_autograd():
                y.backward()
        else:
            y.backward()
        results.append([p.grad.numpy().copy() for p in net.params()])
    _close(results[1], results[0])
    assert compiler.counters.compiled_runs == 1


def test_an_argument_modified_after_the_forward_raises_eagers_error() -> None:
    net = _Net()
    x = _x()
    h = x * 1.0
    y = (checkpoint(net.block, h, use_reentrant=False) ** 2).sum()
    with fg.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with compiler.compiled_autograd():
            y.backward()


class _TwiceSaved(fg.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
        (x,) = ctx.saved_tensors
        (again,) = ctx.saved_tensors
        return 2 * g * again


def test_unpacking_a_checkpointed_tensor_twice_raises_eagers_error() -> None:
    def fn(x: fg.Tensor) -> fg.Tensor:
        return _TwiceSaved.apply(x.exp())

    x = _x()
    with pytest.raises(CheckpointError, match="already unpacked once"):
        (checkpoint(fn, x, use_reentrant=False) ** 2).sum().backward()
    with pytest.raises(CheckpointError, match="already unpacked once"):
        with compiler.compiled_autograd():
            (checkpoint(fn, x, use_reentrant=False) ** 2).sum().backward()


def test_retain_graph_backs_twice() -> None:
    net = _Net()
    x = _x()
    y = (checkpoint(net.block, x, use_reentrant=False) ** 2).sum()
    with compiler.compiled_autograd():
        y.backward(retain_graph=True)
        first = x.grad.numpy().copy()
        y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first, rtol=1e-12)
    assert compiler.counters.compiled_runs == 2 and not compiler.counters.fallbacks


# ---- the reentrant variant ---------------------------------------------------------------------


def _reentrant(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    return checkpoint(fn, *args, use_reentrant=True, **kwargs)


def test_reentrant_backward_is_the_recordings() -> None:
    """The reentrant variant's backward (re-run the function, backward() through it) is the
    recording's: replayed with grad on and differentiated inside the same program, writing the
    parameters' .grad as the inner backward would."""
    net = _Net()
    x = _x()
    eager = _grads(False, lambda x: _reentrant(net.block, x), net.params(), x)
    _close(eager, _grads(False, net.block, net.params(), x))
    net.calls = 0
    for _ in range(3):
        _close(_grads(True, lambda x: _reentrant(net.block, x), net.params(), x), eager)
    assert net.calls == 3  # the forwards only
    assert compiler.counters.captures == 1 and compiler.counters.compiled_runs == 3
    assert not compiler.counters.fallbacks and not compiler.counters.opaque_functions
    y = (_reentrant(net.block, x) ** 2).sum()
    w = _walk(y)
    assert len(w.reentrant) == 1 and not w.has_hooks and not w.opaque
    assert {id(t) for t in w.leaves} >= {id(p) for p in net.params()}


def test_reentrant_with_a_parameter_used_outside_too_and_dropout() -> None:
    net = _Net()
    drop = fg.nn.Dropout(0.3)

    def block(x: fg.Tensor) -> fg.Tensor:
        return drop(net.block(x))

    def forward(x: fg.Tensor) -> fg.Tensor:
        h = _reentrant(block, x)
        return h + net.lin2(fg.zeros(x.shape[0], 12, dtype=fg.float64) + x.sum())  # lin2 twice

    x = _x()
    fg.manual_seed(9)
    eager = _grads(False, forward, net.params(), x)
    for _ in range(2):
        fg.manual_seed(9)
        _close(_grads(True, forward, net.params(), x), eager)
    assert not compiler.counters.fallbacks and not compiler.counters.opaque_functions


def test_reentrant_runs_its_python_where_a_replay_cannot_vouch() -> None:
    """A hook on a parameter, or a tensor with history read from outside: the eager backward
    runs as an opaque step (its inner backward is itself compiled)."""
    net = _Net()
    seen: list = []
    handle = net.lin1.weight.register_hook(lambda g: seen.append(1))
    x = _x()
    eager = _grads(False, lambda x: _reentrant(net.block, x), net.params(), x)
    assert seen == [1]
    _close(_grads(True, lambda x: _reentrant(net.block, x), net.params(), x), eager)
    assert seen == [1, 1]
    handle.remove()

    def forward(x: fg.Tensor) -> fg.Tensor:
        outside = x * 2.0  # (the inner backward goes on into the outer graph through it)
        return _reentrant(lambda h: net.block(h) * outside.sum(), x)

    eager = _grads(False, forward, net.params(), x)
    _close(_grads(True, forward, net.params(), x), eager)
    assert sum(compiler.counters.opaque_functions.values()) == 2
    assert not compiler.counters.fallbacks


def test_reentrant_under_grad_raises_eagers_error() -> None:
    net = _Net()
    x = _x()
    y = (_reentrant(net.block, x) ** 2).sum()
    with pytest.raises(RuntimeError, match="use_reentrant=True, .* incompatible with .grad"):
        with compiler.compiled_autograd():
            fg.autograd.grad(y, [x])


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")  # (the inner one)
def test_nested_reentrant_checkpoints() -> None:
    net = _Net()

    def outer(x: fg.Tensor) -> fg.Tensor:
        return _reentrant(lambda h: (h * 1.5).tanh() * h, net.block(x)).exp()

    x = _x()
    eager = _grads(False, lambda x: _reentrant(outer, x), net.params(), x)
    _close(_grads(False, outer, net.params(), x), eager)
    _close(_grads(True, lambda x: _reentrant(outer, x), net.params(), x), eager)
    assert not compiler.counters.fallbacks and not compiler.counters.opaque_functions


# ---- random programs ---------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(ops=random_programs.steps(10), shapes=random_programs.SHAPES, reentrant=st.booleans())
def test_random_checkpointed_programs_match_eager(
    ops: list, shapes: tuple, reentrant: bool
) -> None:
    """A random program over two arguments and a parameter from outside, checkpointed, then
    reduced: compiled backward (replayed recomputation) gives eager's gradients."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in (*shapes, shapes[0])]

    def region(a: fg.Tensor, b: fg.Tensor, w: fg.Tensor) -> tuple:
        return tuple(random_programs.run(ops, [a, b, w]))

    def run(compiled: bool) -> list:
        x, y, w = (fg.tensor(a, requires_grad=True) for a in arrays)
        outs = checkpoint(lambda a, b: region(a, b, w), x * 1.0, y, use_reentrant=reentrant)
        loss = sum(o.sum() * (k + 1) for k, o in enumerate(outs))
        if compiled:
            with compiler.compiled_autograd():
                loss.backward()
        else:
            loss.backward()
        return [None if t.grad is None else t.grad.numpy() for t in (x, y, w)]

    eager, comp = run(False), run(True)
    for e, c in zip(eager, comp):
        assert (e is None) == (c is None)
        if e is not None:
            np.testing.assert_allclose(c, e, rtol=1e-12, atol=1e-12)
    assert not compiler.counters.fallbacks
    assert not compiler.counters.checkpoints_rerun and not compiler.counters.opaque_functions


# ---- whole steps and compiled modules ----------------------------------------------------------


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_whole_step_replays_a_checkpointed_forward_and_its_recomputation(reentrant: bool) -> None:
    net = _Net()
    opt = fg.optim.SGD(net.params(), lr=0.05)

    def step(x: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = (checkpoint(net.block, x, use_reentrant=reentrant) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    xs = [_x(seed=s) for s in range(5)]
    start = [p.detach().clone() for p in net.params()]
    eager = [step(x).item() for x in xs]
    after = [p.detach().clone() for p in net.params()]
    with fg.no_grad():
        for p, s in zip(net.params(), start):
            p.copy_(s)
    compiled = fg.compile(step)
    got = [compiled(x).item() for x in xs]
    np.testing.assert_allclose(got, eager, rtol=1e-10)
    _close([p.detach().numpy() for p in net.params()], [p.numpy() for p in after])
    assert compiler.counters.step_runs >= 3 and not compiler.counters.step_breaks


class _Module(fg.nn.Module):
    """``_Net``'s layers as a module whose forward checkpoints ``_Net.block`` (None: plain)."""

    def __init__(self, net: _Net, reentrant: bool | None) -> None:
        super().__init__()
        self.lin1, self.norm, self.lin2 = net.lin1, net.norm, net.lin2
        self.net = net
        self.reentrant = reentrant

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        if self.reentrant is None:
            return self.net.block(x)
        return checkpoint(self.net.block, x, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_compiled_module_with_a_checkpoint(reentrant: bool) -> None:
    """Non-reentrant: the module's forward is replayed and its backward program recomputes the
    checkpointed part from the forward's inputs.  Reentrant: its backward needs a plain
    ``backward()``, so the outputs keep the eager graph (no ``autograd.grad`` inside)."""
    net = _Net()

    module = _Module(net, reentrant)
    cmodule = fg.compile(module)
    for seed in range(4):
        x = _x(seed=seed)
        want = _grads(False, module, net.params(), x)
        _close(_grads(False, cmodule, net.params(), x), want)
    if reentrant:
        assert compiler.counters.step_runs == 0
    else:
        assert compiler.counters.step_runs >= 2 and not compiler.counters.step_breaks


def test_a_whole_step_with_dropout_in_a_checkpoint_runs_with_compiled_backward() -> None:
    """The recomputation draws the mask again; a whole step would have to read the forward's:
    it breaks (one reason) and every call runs with compiled backward, as eager draws."""
    net = _Net()
    model = _Module(net, None)

    def step(x: fg.Tensor) -> fg.Tensor:
        h = checkpoint(lambda a: fg.nn.functional.dropout(model(a), 0.4), x, use_reentrant=False)
        loss = (h**2).sum()
        loss.backward()
        return loss.detach()

    compiled = fg.compile(step)
    for seed in range(3):
        x = _x(seed=seed)
        results = []
        for fn in (step, compiled):
            for p in net.params():
                p.grad = None
            fg.manual_seed(seed)
            results.append([fn(x).numpy(), *(p.grad.numpy().copy() for p in net.params())])
        _close(results[1], results[0])
    (reason,) = compiler.counters.step_breaks
    assert "random draw of a checkpointed function" in reason
    assert compiler.counters.checkpoints_replayed >= 2


def test_explain_says_how_checkpoints_recompute() -> None:
    net = _Net()
    x = _x()

    def step() -> None:
        h = checkpoint(net.block, x, use_reentrant=False)
        checkpoint(_data_branch, h, use_reentrant=False).sum().backward()

    report = str(compiler.explain(step))
    assert "checkpoint recomputation: 1 replayed from the forward's recording" in report
    assert "checkpoint recomputation: its Python runs again (it reads tensor values" in report
