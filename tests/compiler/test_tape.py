"""The tape path of compiled backward: a forward recorded inside a compiled region keys and
binds its backward without walking the graph (``compiler.tape``: ``Tape``, ``tape_key``,
``Binding``).  It must be invisible: same gradients, same errors, same recompiles as the
walk, and a fall back to the walk whenever the tape cannot vouch for the graph."""

from __future__ import annotations

import gc
import re
import weakref
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler import tape as _tape

pytestmark = pytest.mark.usefixtures("fresh_compiler")


def _leaves(n: int = 64, seed: int = 0) -> tuple[fg.Tensor, fg.Tensor]:
    rng = np.random.default_rng(seed)
    x = fg.tensor(rng.standard_normal(n).astype(np.float32), requires_grad=True)
    w = fg.tensor(rng.standard_normal(n).astype(np.float32), requires_grad=True)
    return x, w


def _chain(x: fg.Tensor, w: fg.Tensor, blocks: int = 6) -> fg.Tensor:
    h = x
    for k in range(blocks):
        a = (h * w if k % 2 == 0 else h * 0.8) + 0.1
        a = a.tanh() * 0.5
        h = h + a.sigmoid() * (-a * a).exp()
    return h.sum()


def _eager_grads(fn: Any, x: fg.Tensor, w: fg.Tensor) -> list:
    x.grad = w.grad = None
    fn(x, w).backward()
    return [x.grad.numpy().copy(), w.grad.numpy().copy()]


def _compiled_step(fn: Any, x: fg.Tensor, w: fg.Tensor) -> list:
    x.grad = w.grad = None
    with compiler.compiled_autograd():
        fn(x, w).backward()
    return [x.grad.numpy().copy(), w.grad.numpy().copy()]


def test_second_call_takes_the_tape_and_matches_eager() -> None:
    x, w = _leaves()
    want = _eager_grads(_chain, x, w)
    for step in range(4):
        got = _compiled_step(_chain, x, w)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert compiler.counters.captures == 1
        assert compiler.counters.tape_hits == step  # the capture files the tape key
    assert not compiler.counters.fallbacks


def test_tape_path_accumulates_into_existing_grad() -> None:
    x, w = _leaves()
    want = _eager_grads(_chain, x, w)
    x.grad = w.grad = None
    for _ in range(3):
        with compiler.compiled_autograd():
            _chain(x, w).backward()
    assert compiler.counters.tape_hits >= 1
    np.testing.assert_allclose(x.grad.numpy(), 3 * want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), 3 * want[1], rtol=1e-5, atol=1e-5)


def _eager_error(fn: Any) -> str:
    """The error's message, version numbers left out (they grow from run to run)."""
    with pytest.raises(RuntimeError) as info:
        fn()
    return re.sub(r"version \d+", "version N", str(info.value))


def _small(x: fg.Tensor, w: fg.Tensor, mutate: str = "") -> None:
    h = x * w
    y = h.tanh()  # saves its output
    loss = (y * w).sum()  # saves y and w
    if mutate == "output":
        y.add_(1.0)  # y is now stale
    elif mutate == "leaf":
        with fg.no_grad():
            w.mul_(1.0)  # w is now stale (its version moved)
    loss.backward()


@pytest.mark.parametrize("mutate", ["output", "leaf"])
def test_inplace_after_save_raises_the_eager_error(mutate: str) -> None:
    x, w = _leaves()
    x.grad = w.grad = None
    eager = _eager_error(lambda: _small(x, w, mutate))
    assert "modified by an inplace operation" in eager
    for _ in range(3):  # the same structure, unmodified: the tape path is ready
        x.grad = w.grad = None
        with compiler.compiled_autograd():
            _small(x, w)
    assert compiler.counters.tape_hits == 2
    for _ in range(2):
        x.grad = w.grad = None

        def run() -> None:
            with compiler.compiled_autograd():
                _small(x, w, mutate)

        assert _eager_error(run) == eager
        assert x.grad is None and w.grad is None  # nothing written


def test_second_backward_raises_retain_graph_error() -> None:
    x, w = _leaves()
    for _ in range(3):
        _compiled_step(_chain, x, w)
    hits = compiler.counters.tape_hits
    x.grad = w.grad = None
    with compiler.compiled_autograd():
        loss = _chain(x, w)
        loss.backward()
        assert compiler.counters.tape_hits == hits + 1
        with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
            loss.backward()


def test_retain_graph_allows_a_second_tape_backward() -> None:
    x, w = _leaves()
    want = _eager_grads(_chain, x, w)
    for _ in range(3):
        _compiled_step(_chain, x, w)
    x.grad = w.grad = None
    with compiler.compiled_autograd():
        loss = _chain(x, w)
        loss.backward(retain_graph=True)
        loss.backward()  # the previous tape: still valid, nothing was freed
        with pytest.raises(RuntimeError, match="Specify retain_graph=True"):
            loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * want[0], rtol=1e-5, atol=1e-5)


def test_dag_sharing_is_structure() -> None:
    x, w = _leaves()

    def shared(x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
        a = (x * w).tanh()
        return (a * a).sum()

    def distinct(x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
        return ((x * w).tanh() * (x * w).tanh()).sum()

    def other_leaf(x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
        return ((x * w).tanh() * (w * w).tanh()).sum()

    for fn in (shared, distinct, other_leaf):
        want = _eager_grads(fn, x, w)
        for _ in range(3):
            got = _compiled_step(fn, x, w)
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # shared and distinct have different graphs (a node used twice vs two nodes)
    assert compiler.counters.captures == 3
    assert compiler.counters.tape_hits == 6


def test_same_structure_other_constants_checks_aliases() -> None:
    """Same tape key, but whether two saved constants are one array differs from call to call:
    the binding's alias check sends the differing call to the walk."""
    x, w = _leaves()
    c1 = fg.tensor(np.full(64, 0.5, np.float32))
    c2 = fg.tensor(np.full(64, 2.0, np.float32))

    def make(a: fg.Tensor, b: fg.Tensor) -> Any:
        return lambda x, w: ((x * a).tanh() * (w * b).tanh()).sum()

    for a, b in ((c1, c1), (c1, c1), (c1, c1), (c1, c2), (c1, c2), (c2, c1), (c1, c1)):
        want = _eager_grads(make(a, b), x, w)
        got = _compiled_step(make(a, b), x, w)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_nodes_made_outside_the_region_use_the_walk() -> None:
    x, w = _leaves()
    want = _eager_grads(_chain, x, w)
    for _ in range(3):
        x.grad = w.grad = None
        h = (x * w).tanh()  # outside: not on the tape
        with compiler.compiled_autograd():
            _chain(h, w).backward()
    assert compiler.counters.tape_hits == 0 and compiler.counters.cache_hits == 2
    x.grad = w.grad = None
    _chain((x * w).tanh(), w).backward()
    eager_x = x.grad.numpy().copy()
    x.grad = None
    h = (x * w).tanh()
    with compiler.compiled_autograd():
        _chain(h, w).backward()
    np.testing.assert_allclose(x.grad.numpy(), eager_x, rtol=1e-5, atol=1e-6)
    assert want  # (the chain itself was checked above)


def test_hooks_registered_after_the_forward_run() -> None:
    x, w = _leaves()
    for _ in range(3):
        _compiled_step(_chain, x, w)
    seen = []
    x.grad = w.grad = None
    with compiler.compiled_autograd():
        h = x * w
        loss = (h.tanh() * 2.0).sum()
        h.register_hook(lambda g: seen.append(g.shape))
        loss.backward()
    assert seen == [(64,)]
    # a hook on a leaf registered before the forward: the tape path checks leaves per call
    handle = w.register_hook(lambda g: g * 0)
    for _ in range(3):
        got = _compiled_step(_chain, x, w)
        assert not got[1].any()
    handle.remove()


def _hooked_forward(x: fg.Tensor, w: fg.Tensor, kind: str, seen: list) -> fg.Tensor:
    """``(tanh(x * w) * 2).sum()`` with a hook of ``kind`` put on ``x * w``'s node after it ran."""
    h = x * w
    loss = (h.tanh() * 2.0).sum()
    if kind == "tensor":
        h.register_hook(lambda g: seen.append("tensor") or g * 3)
    elif kind == "post":
        h.grad_fn.register_hook(lambda gi, go: seen.append("post"))
    elif kind == "pre":
        h.grad_fn.register_prehook(lambda go: seen.append("pre"))
    elif kind == "retain":
        h.retain_grad()
        seen.append(h)
    return loss


@pytest.mark.parametrize("kind", ["tensor", "post", "pre", "retain"])
def test_hooks_registered_after_a_recorded_forward_leave_the_tape_path(kind: str) -> None:
    # the same structure runs three times, so the tape path is ready; then the fourth forward
    # gets a hook after it ran: the binding must not take the tape (which runs no hooks)
    x, w = _leaves()
    eager_seen: list = []
    x.grad = w.grad = None
    _hooked_forward(x, w, kind, eager_seen).backward()
    want = x.grad.numpy().copy()
    for _ in range(3):
        x.grad = w.grad = None
        with compiler.compiled_autograd():
            _hooked_forward(x, w, "", []).backward()
    hits = compiler.counters.tape_hits
    assert hits == 2
    seen: list = []
    x.grad = w.grad = None
    with compiler.compiled_autograd():
        _hooked_forward(x, w, kind, seen).backward()
    assert compiler.counters.tape_hits == hits
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-5, atol=1e-6)
    if kind == "retain":
        np.testing.assert_allclose(seen[0].grad.numpy(), eager_seen[0].grad.numpy(), rtol=1e-6)
    else:
        assert seen == eager_seen == [kind]


def test_the_change_stamp_moves_on_every_change_to_an_existing_graph() -> None:
    # the tape skips its per-node checks while ``changes`` stands still: every change those
    # checks look for must move it
    from fusegrad.autograd.graph_base import changes

    x, w = _leaves()
    h = x * w
    y = h.tanh()
    loss = (y * w).sum()
    actions = {
        "tensor hook": lambda: h.register_hook(lambda g: g),
        "node hook": lambda: y.grad_fn.register_hook(lambda gi, go: None),
        "node prehook": lambda: y.grad_fn.register_prehook(lambda go: None),
        "retain_grad": h.retain_grad,
        "in-place op": lambda: y.add_(0.0),
        "in-place under no_grad": lambda: _no_grad_mul(w),
        "backward (releases saved tensors)": lambda: (x * 2.0).sum().backward(),
        "accumulate into .grad in place": lambda: (x * 2.0).sum().backward(),
    }
    assert loss is not None
    for what, action in actions.items():
        before = changes.value
        action()
        assert changes.value != before, what


def _no_grad_mul(t: fg.Tensor) -> None:
    with fg.no_grad():
        t.mul_(1.0)


def test_data_swap_after_the_forward_is_seen() -> None:
    x, w = _leaves()
    other = fg.tensor(np.linspace(-1, 1, 64).astype(np.float32))

    def run(compiled: bool) -> np.ndarray:
        x.grad = w.grad = None
        keep = w.data
        with compiler.compiled_autograd() if compiled else _null():
            loss = (x * w).tanh().sum()
            w.data = other  # as in PyTorch: backward reads the new data, no version bump
            loss.backward()
        w.data = keep
        return x.grad.numpy().copy()

    want = run(False)
    for _ in range(4):
        np.testing.assert_allclose(run(True), want, rtol=1e-5, atol=1e-6)


def test_the_tape_does_not_keep_graphs_alive() -> None:
    x, w = _leaves()
    for _ in range(3):
        _compiled_step(_chain, x, w)
    x.grad = w.grad = None
    hits = compiler.counters.tape_hits
    with compiler.compiled_autograd():
        loss = _chain(x, w)
        node = weakref.ref(loss.grad_fn)
        loss.backward()
        assert compiler.counters.tape_hits == hits + 1
        del loss
        assert node() is None  # dropped at once (no cycle), while the region is still open
        loss = _chain(x, w)  # a forward without backward
        node = weakref.ref(loss.grad_fn)
        del loss
        gc.collect()
        assert node() is None


def test_tape_length_and_trie_are_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(_tape, "MAX_TAPE", 10)
    x, w = _leaves()
    want = _eager_grads(_chain, x, w)
    for _ in range(3):
        got = _compiled_step(_chain, x, w)  # ~50 nodes: the tape closes, the walk runs
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert compiler.counters.tape_hits == 0
    assert _tape.state.tape is None  # outside regions nothing is recorded
    monkeypatch.setattr(_tape, "MAX_TRIE", 5)
    for _ in range(2):
        _compiled_step(lambda x, w: (x * w).sum(), x, w)
    assert len(_tape._trie) <= 5


def test_two_threads_do_not_share_a_tape() -> None:
    import threading

    x, w = _leaves()
    want = _eager_grads(_chain, x, w)
    errors: list = []

    def worker() -> None:
        try:
            a = fg.tensor(x.detach().numpy(), requires_grad=True)
            b = fg.tensor(w.detach().numpy(), requires_grad=True)
            for _ in range(4):
                got = _compiled_step(_chain, a, b)
                np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_chain_is_one_interpreted_kernel() -> None:
    x, w = _leaves()
    _compiled_step(lambda x, w: _chain(x, w, blocks=20), x, w)
    (program,) = compiler.cached_programs()
    # the fuser splits the chain at MAX_VALUES; the interpreter merges it back into one call
    assert len(program._interpreted) == 1 and len(program.kernels) == 1


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_saved_tensor_hooks_registered_after_the_forward_leave_the_tape() -> None:
    """``grad_fn._raw_saved_self.register_hooks(pack, unpack)`` on a recorded forward packs that
    saved tensor now: the tape's record of it is stale, so the backward takes the walk, whose
    program calls the unpack hook (its value is what the gradient reads, as in eager), never
    reading the packed object."""
    log: list = []
    with compiler.compiled_autograd():
        for step in range(3):
            x = fg.tensor([1.0, 2.0], dtype=fg.float64, requires_grad=True)
            w = fg.tensor([3.0, 4.0], dtype=fg.float64, requires_grad=True)
            y = x * w
            if step == 2:  # the first two made the program and its tape entry
                y.grad_fn._raw_saved_self.register_hooks(
                    lambda t: (log.append("pack"), t.detach() * 10.0)[1],
                    lambda p: (log.append("unpack"), p)[1],
                )
            y.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [10.0, 20.0])  # dw = x as unpacked
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 4.0])
    assert log == ["pack", "unpack"]
    assert compiler.counters.tape_hits == 1
    assert compiler.counters.compiled_runs == 3 and not compiler.counters.fallbacks


# ---- the region observes: ops run on the op surface's fast paths, nodes come to ``made`` -------


def _op_nodes(root: fg.Tensor) -> list:
    """The OpNodes reachable from ``root`` (iteratively)."""
    from fusegrad.autograd.node import OpNode

    seen: dict[int, Any] = {}
    stack = [root.grad_fn]
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen[id(n)] = n
        stack.extend(child for child, _ in n._edges)
    return [n for n in seen.values() if type(n) is OpNode]


def _fast_path_ops(x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:
    # every form the op surface's fast paths take (``ops._fast_forward``, ``_fast_reverse``,
    # ``_fast_rsub``, the generated functions, ``neg``): + - * / of two tensors of one dtype and
    # of a tensor and a Python number, a number on the left, rsub, unary and binary functions
    a = x + w
    b = a - x
    c = b * w
    d = c / (w * w + 1.0)
    e = ((d + 0.5) - 1.5) * 2.0 / 3.0
    f = 1.0 / ((3.0 * (2.0 + e)) ** 2 + 1.0)
    g = 1.0 - f
    h = fg.maximum(fg.exp(g * 0.1), x)
    return fg.tanh(-h).sum()


def test_ops_on_the_fast_paths_are_recorded() -> None:
    """Inside a region the op surface's fast paths run (the region takes no calls); every node
    they make is on the tape, and the tape path's gradients are eager's."""
    x, w = _leaves()
    want = _eager_grads(_fast_path_ops, x, w)
    for _ in range(3):
        x.grad = w.grad = None
        with compiler.compiled_autograd():
            loss = _fast_path_ops(x, w)
            tape = _tape.state.tape
            nodes = _op_nodes(loss)
            assert tape.open and len(nodes) == len(tape.states) == 22
            assert sorted(tape.position(n) for n in nodes) == list(range(len(nodes)))
            loss.backward()
        np.testing.assert_allclose(x.grad.numpy(), want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(w.grad.numpy(), want[1], rtol=1e-5, atol=1e-6)
    assert compiler.counters.captures == 1 and compiler.counters.tape_hits == 2
    assert not compiler.counters.fallbacks


def test_a_node_made_off_the_tape_closes_it_where_a_recorded_node_was() -> None:
    """A node the tape never recorded -- made while the region's tracer was hidden, likely at the
    address of a recorded node that is gone -- is not taken for that node: the tape closes, and
    the walk computes eager's gradients."""
    from fusegrad.autograd.tracer import tracing

    x, w = _leaves()
    want = _eager_grads(lambda x, w: ((x * w).tanh() * 3.0).sum(), x, w)
    x.grad = w.grad = None
    with compiler.compiled_autograd():
        gone = (x * w).tanh()  # recorded at positions 0 and 1
        tape = _tape.state.tape
        del gone
        with tracing(None):  # not recorded
            h = (x * w).tanh()
        assert tape.position(h.grad_fn) == -1
        loss = (h * 3.0).sum()
        assert not tape.open and len(tape.states) == 2
        loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), want[1], rtol=1e-5, atol=1e-6)
    assert compiler.counters.tape_hits == 0


def test_a_node_of_the_previous_tape_closes_the_new_one() -> None:
    """After a backward, new nodes go on a new tape, whose positions start again at 0: an edge
    to a node of the previous tape (at a position the new tape also has) closes the new tape."""
    x, w = _leaves()

    def step(compiled: bool) -> list:
        x.grad = w.grad = None
        with compiler.compiled_autograd() if compiled else _null():
            h = (x * w).tanh()  # positions 0, 1 of the first tape
            (h * 2.0).sum().backward(retain_graph=True)
            first = _tape.state.previous
            y = (w + 1.0) * h  # positions 0, 1 of the second tape; h's node is not on it
            if compiled:
                assert first is not None and first.position(h.grad_fn) == 1
                assert _tape.state.tape.position(h.grad_fn) == -1
                assert not _tape.state.tape.open
            y.sum().backward()
        return [x.grad.numpy().copy(), w.grad.numpy().copy()]

    want = step(False)
    for _ in range(3):
        for a, b in zip(step(True), want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_binding_reaches_every_node_from_several_roots() -> None:
    """Two roots, one an ancestor of the other, over a DAG (a node used twice, a leaf used
    three times): the binding finds the nodes of each new graph through the edges from the
    roots' nodes -- the tape keeps none -- and the tape path's gradients are eager's."""

    def roots(x: fg.Tensor, w: fg.Tensor) -> list:
        a = (x * w).tanh()
        b = a * a + w
        c = (b.exp() * a).sum()
        return [c, (b * w).sum()]

    def run(compiled: bool) -> list:
        x, w = _leaves(seed=3)
        with compiler.compiled_autograd() if compiled else _null():
            outs = roots(x, w)
            fg.autograd.backward(outs, [fg.ones_like(o) for o in outs])
        return [x.grad.numpy().copy(), w.grad.numpy().copy()]

    want = run(False)
    for _ in range(4):
        for a, b in zip(run(True), want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert compiler.counters.tape_hits == 3 and not compiler.counters.fallbacks
