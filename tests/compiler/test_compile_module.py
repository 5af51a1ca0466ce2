"""``fusegrad.compile(module)`` (``compiler.module.OptimizedModule``): the original module's
state behind a wrapper, and a backward called outside the module compiled through one
``CompiledModuleBackward`` node -- with eager's gradients, errors and ``.grad`` handling, and a
fall back to the plain graph whenever the node could not be exact."""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn
from fusegrad.compiler.module import OptimizedModule

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # ``benchmarks`` is a package at the repository root
    sys.path.insert(0, str(REPO_ROOT))

pytestmark = pytest.mark.usefixtures("fresh_compiler")


class _Net(nn.Module):
    def __init__(self, width: int = 8, dtype: Any = fg.float64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, width, dtype=dtype)
        self.fc2 = nn.Linear(width, 3, dtype=dtype)
        self.register_buffer("calls", fg.zeros(1, dtype=dtype))
        self.scale = 0.5

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        with fg.no_grad():
            self.calls.add_(1.0)
        return self.fc2(self.fc1(x).tanh()) * self.scale


def _pair(seed: int = 0) -> tuple[_Net, _Net]:
    """Two identical networks: one stays eager, one is compiled."""
    fg.manual_seed(seed)
    a = _Net()
    b = _Net()
    b.load_state_dict(a.state_dict())
    return a, b


def _x(batch: int = 5, seed: int = 1, requires_grad: bool = False) -> fg.Tensor:
    rng = np.random.default_rng(seed)
    return fg.tensor(rng.standard_normal((batch, 4)), requires_grad=requires_grad)


def _grads(m: nn.Module) -> list:
    return [None if p.grad is None else p.grad.numpy().copy() for p in m.parameters()]


def _close(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


# ---- the wrapper is the original module ---------------------------------------------------------


def test_the_wrapper_shows_the_original_modules_state() -> None:
    m = _Net()
    cm = fg.compile(m)
    assert isinstance(cm, OptimizedModule) and isinstance(cm, nn.Module)
    assert cm._orig_mod is m
    assert [id(p) for p in cm.parameters()] == [id(p) for p in m.parameters()]
    assert list(cm.state_dict()) == list(m.state_dict())  # no "_orig_mod." prefix
    assert [n for n, _ in cm.named_modules()] == [n for n, _ in m.named_modules()]
    assert cm.fc1 is m.fc1 and cm.scale == 0.5
    cm.scale = 2.0  # attributes are set on the original
    assert m.scale == 2.0
    cm.eval()
    assert not m.training and not cm.training and not m.fc1.training
    m.train()
    assert cm.training
    assert "OptimizedModule" in repr(cm) and "Linear(in_features=4" in repr(cm)
    with pytest.raises(AttributeError):
        cm.no_such_attribute  # noqa: B018


def test_load_state_dict_takes_plain_keys_and_pytorchs_prefixed_keys() -> None:
    a, b = _pair()
    fg.manual_seed(7)
    c = fg.compile(_Net())
    c.load_state_dict({"_orig_mod." + k: v for k, v in a.state_dict().items()})
    _close(
        [p.detach().numpy() for p in c.parameters()], [p.detach().numpy() for p in a.parameters()]
    )
    fg.manual_seed(8)
    d = fg.compile(_Net())
    d.load_state_dict(b.state_dict())
    _close(
        [p.detach().numpy() for p in d.parameters()], [p.detach().numpy() for p in b.parameters()]
    )
    with pytest.raises(RuntimeError, match="Missing key"):
        d.load_state_dict({"fc1.weight": a.fc1.weight})


def test_mode_is_checked_and_options_are_kept() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        fg.compile(_Net(), mode="fastest")
    cm = fg.compile(_Net(), fullgraph=True, mode="debug")
    assert cm._fullgraph and cm._compile_mode == "debug"


# ---- a backward outside the module ----------------------------------------------------------


def test_backward_outside_is_one_compiled_program_with_eagers_gradients() -> None:
    eager, m = _pair()
    cm = fg.compile(m)
    for batch in (5, 5, 9):  # a new batch size costs no capture
        for net in (eager, cm):
            net.zero_grad()
            out = net(_x(batch))
            ((out - 1.0) ** 2).mean().backward()
        _close(_grads(m), _grads(eager))
    assert out.grad_fn.name() == "CompiledModuleBackward"
    assert compiler.counters.captures == 1
    assert compiler.counters.compiled_runs == 3
    assert not compiler.counters.fallbacks
    np.testing.assert_array_equal(m.calls.numpy(), [3.0])  # buffers updated as in eager


def test_gradients_flow_on_into_arguments_and_their_history() -> None:
    eager, m = _pair()
    cm = fg.compile(m)
    results = []
    for net in (eager, cm):
        a = _x(requires_grad=True)
        x = a * 2.0 + 1.0  # an argument with history made before the call
        leaf = _x(seed=3, requires_grad=True)
        out = net(x) + net(leaf).sum()
        out.sum().backward()
        results.append([a.grad.numpy(), leaf.grad.numpy(), *_grads(net)])
    _close(results[1], results[0])
    assert compiler.counters.compiled_runs == 2


def test_autograd_grad_with_respect_to_parameters_from_outside() -> None:
    eager, m = _pair()
    cm = fg.compile(m)
    want = fg.autograd.grad(eager(_x()).sum(), list(eager.parameters()))
    got = fg.autograd.grad(cm(_x()).sum(), list(cm.parameters()))
    _close([g.numpy() for g in got], [g.numpy() for g in want])
    assert all(p.grad is None for p in m.parameters())  # grad() leaves .grad alone


def test_several_outputs_in_a_structure_and_one_left_unused() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3, dtype=fg.float64)

        def forward(self, x: fg.Tensor) -> dict:
            h = self.lin(x)
            return {"a": h.sigmoid(), "pair": (h * 2.0, h.argmax(1)), "n": 3}

    fg.manual_seed(0)
    eager = Two()
    m = Two()
    m.load_state_dict(eager.state_dict())
    cm = fg.compile(m)
    for net in (eager, cm):
        out = net(_x())
        assert out["n"] == 3 and out["pair"][1].dtype == fg.int64
        out["a"].sum().backward()  # "pair"[0] gets no gradient
    _close(_grads(m), _grads(eager))
    assert out["a"].grad_fn is out["pair"][0].grad_fn  # one node for the call


def test_retain_graph_and_the_second_backward_error() -> None:
    eager, m = _pair()
    cm = fg.compile(m)
    for net in (eager, cm):
        loss = net(_x()).sum()
        loss.backward(retain_graph=True)
        loss.backward()
    _close(_grads(m), _grads(eager))
    loss = cm(_x()).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_inplace_change_of_an_output_the_backward_needs_raises_eagers_error() -> None:
    class Tanh(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3, dtype=fg.float64)

        def forward(self, x: fg.Tensor) -> fg.Tensor:
            return self.lin(x).tanh()  # tanh saves its output

    cm = fg.compile(Tanh())
    y = cm(_x())
    with fg.no_grad():
        y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    assert all(p.grad is None for p in cm.parameters())


def test_double_backward_through_the_module() -> None:
    # a gradient penalty: create_graph=True runs the module's backward eagerly, differentiably
    eager, m = _pair()
    cm = fg.compile(m)
    for net in (eager, cm):
        x = _x(requires_grad=True)
        (gx,) = fg.autograd.grad(net(x).sum(), x, create_graph=True)
        (gx**2).sum().backward()
    _close(_grads(m), _grads(eager))


def test_leaf_hooks_and_accumulation_into_existing_grad() -> None:
    eager, m = _pair()
    cm = fg.compile(m)
    seen: dict = {"eager": [], "compiled": []}
    for name, net in (("eager", eager), ("compiled", cm)):
        net.fc1.weight.register_post_accumulate_grad_hook(
            lambda p, name=name: seen[name].append(p.grad.numpy().copy())
        )
        grad_before = None
        for _ in range(2):
            net(_x()).sum().backward()
            if grad_before is None:
                grad_before = net.fc1.weight.grad
        assert net.fc1.weight.grad is grad_before  # accumulated in place, identity kept
    _close(_grads(m), _grads(eager))
    _close(seen["compiled"], seen["eager"])
    assert len(seen["compiled"]) == 2


# ---- when the node could not be exact: the plain graph ------------------------------------------


class _Closure(nn.Module):
    def __init__(self, extra: fg.Tensor) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3, dtype=fg.float64)
        self.extra = extra  # a plain attribute that requires grad: not a parameter

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        return self.lin(x) * self.extra


def test_a_tensor_from_outside_the_module_keeps_the_plain_graph(caplog: Any) -> None:
    extra = fg.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    cm = fg.compile(_Closure(extra))
    compiler.set_logs("fallback")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            out = cm(_x())
            cm(_x())
    finally:
        compiler.set_logs(None)
    assert out.grad_fn.name() != "CompiledModuleBackward"
    out.sum().backward()
    want = _x().numpy() @ cm.lin.weight.detach().numpy().T + cm.lin.bias.detach().numpy()
    np.testing.assert_allclose(extra.grad.numpy(), want.sum(0), rtol=1e-12)
    assert caplog.text.count("neither a parameter nor an argument") == 1  # logged once
    with pytest.raises(compiler.CompilationError, match="neither a parameter nor an argument"):
        fg.compile(_Closure(extra), fullgraph=True)(_x())


def test_a_graph_made_before_the_call_that_is_no_argument_keeps_the_plain_graph() -> None:
    w = fg.tensor(np.ones(3), requires_grad=True)
    made_before = w * 3.0  # history reached from inside, but not an argument

    cm = fg.compile(_Closure(made_before))
    out = cm(_x())
    assert out.grad_fn.name() != "CompiledModuleBackward"
    out.sum().backward()
    assert w.grad is not None and np.abs(w.grad.numpy()).sum() > 0


def test_inside_a_compiled_region_and_without_grad_the_outputs_are_plain() -> None:
    cm = fg.compile(_Net())
    with fg.no_grad():
        assert cm(_x()).grad_fn is None
    with compiler.compiled_autograd():
        out = cm(_x())
        assert out.grad_fn.name() != "CompiledModuleBackward"
        out.sum().backward()
    assert compiler.counters.compiled_runs == 1


# ---- the forward replayed ahead of time (``AOTEntry``) --------------------------------------


def test_replayed_forward_and_its_backward_program_give_eagers_gradients() -> None:
    eager, m = _pair()
    cm = fg.compile(m)
    for step in range(4):
        for net in (eager, cm):
            net.zero_grad()
            out = net(_x(5, seed=step))
            ((out - 1.0) ** 2).mean().backward()
        _close(_grads(m), _grads(eager))
    assert compiler.counters.step_captures == 1
    assert compiler.counters.step_runs == 3  # the forward replayed: no op-by-op forward
    np.testing.assert_array_equal(m.calls.numpy(), eager.calls.numpy())
    (entry,) = cm._aot.values()
    stats = entry.stats
    assert stats["saved bytes"] <= stats["eager saved bytes"]


def test_a_compiled_module_on_another_compiled_modules_output() -> None:
    """A GAN's discriminator on the generator's output, both compiled: each replays its own
    forward and backward programs (the discriminator's backward stops at its input, the
    generator's node), with eager's gradients for both; also on a detached output."""
    fg.manual_seed(0)
    gen = nn.Sequential(
        nn.Linear(4, 8, dtype=fg.float64), nn.Tanh(), nn.Linear(8, 6, dtype=fg.float64)
    )
    disc = nn.Sequential(
        nn.Linear(6, 5, dtype=fg.float64), nn.LeakyReLU(0.2), nn.Linear(5, 1, dtype=fg.float64)
    )
    gen2, disc2 = copy.deepcopy(gen), copy.deepcopy(disc)
    cgen, cdisc = fg.compile(gen2), fg.compile(disc2)
    for step in range(4):
        z = _x(3, seed=step)
        for g, d in ((gen, disc), (cgen, cdisc)):
            fake = g(z)
            (d(fake).sum() + d(fake.detach()).pow(2).sum()).backward()
        _close(_grads(gen2) + _grads(disc2), _grads(gen) + _grads(disc))
    assert not compiler.counters.fallbacks and not compiler.counters.step_breaks
    assert compiler.counters.step_runs >= 6  # both forwards replayed from the second call


def test_replayed_forward_with_dropout_draws_eagers_numbers() -> None:
    from benchmarks import models  # (the repository root is on the path: above)

    fg.manual_seed(0)
    a = models.make(fg, "gpt", fg.float64, vocab=11, width=8, heads=2, block=4)
    b = copy.deepcopy(a)
    cb = fg.compile(b)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x, y = models.batch(fg, "gpt", rng, 2, vocab=11, block=4)
        for net in (a, cb):
            net.zero_grad()
            fg.manual_seed(7)
            models.loss(fg, net, x, y).backward()
        _close(_grads(b), _grads(a))
    assert compiler.counters.step_runs == 3, compiler.counters


def test_replayed_forward_double_backward_and_inplace_errors() -> None:
    eager, m = _pair()
    cm = fg.compile(m)
    cm(_x())  # recorded
    for net in (eager, cm):  # replayed: create_graph re-runs the forward eagerly
        x = _x(requires_grad=True)
        (gx,) = fg.autograd.grad(net(x).sum(), x, create_graph=True)
        (gx**2).sum().backward()
    _close(_grads(m), _grads(eager))
    y = cm(_x())
    with fg.no_grad():
        m.fc2.weight.mul_(2.0)  # read by the backward (the input gradient's matmul)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    y = cm(_x())
    y.sum().backward(retain_graph=True)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second"):
        y.sum().backward()


def test_replayed_double_backward_with_dropout_uses_the_replays_masks() -> None:
    fg.manual_seed(0)
    a = nn.Sequential(
        nn.Linear(4, 6, dtype=fg.float64), nn.Dropout(0.5), nn.Linear(6, 1, dtype=fg.float64)
    )
    b = copy.deepcopy(a)
    cb = fg.compile(b)
    cb(_x(requires_grad=True))  # recorded
    for net in (a, cb):  # replayed; the gradient penalty re-runs the forward with its masks
        fg.manual_seed(3)
        x = _x(requires_grad=True)
        (gx,) = fg.autograd.grad(net(x).sum(), x, create_graph=True)
        (gx**2).sum().backward()
    _close(_grads(b), _grads(a))
    assert compiler.counters.step_runs == 1


def test_inference_under_no_grad_is_replayed() -> None:
    eager, m = _pair()
    cm = fg.compile(m)
    with fg.no_grad():
        for seed in range(3):
            np.testing.assert_allclose(
                cm(_x(seed=seed)).numpy(), eager(_x(seed=seed)).numpy(), rtol=1e-12
            )
    assert compiler.counters.step_captures == 1 and compiler.counters.step_runs == 2
    np.testing.assert_array_equal(m.calls.numpy(), eager.calls.numpy())


def test_an_output_without_gradient_is_pruned_not_zeroed() -> None:
    """``logits, loss = model(x, y); loss.backward()`` (nanoGPT's call): the backward program for
    that pattern leaves out what would flow from the logits -- zeros times an inf would be NaN
    where eager computes nothing."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3, dtype=fg.float64)

        def forward(self, x: fg.Tensor, big: fg.Tensor) -> tuple:
            logits = self.fc(x)
            side = logits * big  # its gradient path meets an inf: only the logits'
            return side, (logits**2).mean()

    fg.manual_seed(0)
    eager = Net()
    cm = fg.compile(copy.deepcopy(eager))
    big = fg.tensor([1.0, np.inf, 2.0], dtype=fg.float64)
    for seed in range(3):
        for net in (eager, cm):
            net.zero_grad()
            _, loss = net(_x(seed=seed), big)
            loss.backward()
        _close(_grads(cm._orig_mod), _grads(eager))
    (entry,) = cm._aot.values()
    assert list(entry.backward_programs) == [(False, True)]  # no eager re-run
    assert compiler.counters.step_runs == 2


def test_a_gradient_of_no_known_path_is_not_pruned() -> None:
    """``ceil``'s gradient is zeros whatever flows in: with only some outputs' gradients,
    whether such a value lies on a path eager runs cannot be told from the values, so that
    pattern is re-run eagerly (fuzzer finding 6236: x2.grad was None where eager had 0)."""

    class Net(nn.Module):
        def forward(self, x: fg.Tensor, y: fg.Tensor) -> tuple:
            return (x * y).ceil().sum(), y.relu() * 3, (x * 2).ceil().sum()

    x = fg.tensor([0.5, -1.5], dtype=fg.float64, requires_grad=True)
    y = fg.tensor(2.0, dtype=fg.float64, requires_grad=True)
    eager, cm = Net(), fg.compile(Net())
    results = []
    for net in (eager, cm):
        got = []
        for present in ((True, False, False), (False, True, False), (False, False, True)):
            x.grad = y.grad = None
            outs = net(x, y)
            fg.autograd.backward([o for o, p in zip(outs, present) if p])
            got.append([None if t.grad is None else t.grad.numpy().copy() for t in (x, y)])
        results.append(got)
    for want, got in zip(*results):
        for a, b in zip(want, got):
            assert (a is None) == (b is None), (want, got)
            if a is not None:
                np.testing.assert_array_equal(b, a)
    assert compiler.counters.step_runs >= 2


def test_anomaly_mode_names_the_eager_node() -> None:
    """Under anomaly mode the compiled module runs its own graph eagerly: a NaN gradient is
    reported by the node eager names (not by one node for the whole module)."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(fg.tensor(np.array([1.0, -1.0, 4.0])))

        def forward(self, x: fg.Tensor) -> fg.Tensor:
            return (x * self.w).sqrt().sum()

    x = fg.tensor(np.array([1.0, 0.0, 1.0]))  # d sqrt(x*w)/dw at x = 0: 0 * inf = nan
    messages = []
    for net in (Net(), fg.compile(Net())):
        for _ in range(3):
            net.zero_grad()
            net(x).backward()  # (recorded, then replayed: NaN in .grad, no error)
        with pytest.warns(UserWarning, match="Anomaly Detection has been enabled"):
            mode = fg.autograd.detect_anomaly()
        with mode, pytest.warns(UserWarning, match="Error detected in MulBackward0"):
            with pytest.raises(RuntimeError) as info:
                net(x).backward()
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "MulBackward0" in messages[0]


# ---- outputs computed from each other: nanoGPT's ``(logits, loss)`` ----------------------------


class _LogitsAndLoss(nn.Module):
    """A model returning ``(logits, loss)``, the loss computed from the logits (nanoGPT)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8, dtype=fg.float64)
        self.head = nn.Linear(8, 11, dtype=fg.float64)

    def forward(self, idx: fg.Tensor, targets: fg.Tensor | None = None) -> tuple:
        logits = self.head(self.emb(idx).tanh())
        if targets is None:
            return logits, None
        loss = nn.functional.cross_entropy(logits.view(-1, 11), targets.view(-1))
        return logits, loss


@pytest.mark.parametrize("root", ["loss", "logits", "both"])
def test_outputs_computed_from_each_other_replay_with_eagers_gradients(root: str) -> None:
    fg.manual_seed(0)
    eager = _LogitsAndLoss()
    m = _LogitsAndLoss()
    m.load_state_dict(eager.state_dict())
    cm = fg.compile(m, fullgraph=True)  # (no reason to fall back: fullgraph does not raise)
    rng = np.random.default_rng(3)
    for _ in range(4):
        idx = fg.tensor(rng.integers(0, 11, (2, 5)))
        targets = fg.tensor(rng.integers(0, 11, (2, 5)))
        weights = fg.tensor(rng.standard_normal((2, 5, 11)))
        for net in (eager, cm):
            net.zero_grad()
            logits, loss = net(idx, targets)
            if root == "loss":
                loss.backward()
            elif root == "logits":
                (logits * weights).sum().backward()
            else:
                (loss + (logits * weights).sum()).backward()
        _close(_grads(m), _grads(eager))
    assert compiler.counters.step_captures == 1
    assert compiler.counters.step_runs == 3
    assert compiler.counters.fallbacks == {}
    logits, loss = cm(idx, targets)
    # two nodes, as in eager's graph: the loss's has an edge to the logits'
    assert any(node is logits.grad_fn for node, _ in loss.grad_fn._edges)
    # the other signature (no targets) is its own recording, with one output
    logits, none = cm(idx)
    assert none is None and logits.shape == (2, 5, 11)


class _Vae(nn.Module):
    """pytorch/examples' VAE in small: ``(recon, mu, logvar)``, the reconstruction computed
    from ``mu`` and ``logvar``, which the loss's KL term uses too."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(6, 5, dtype=fg.float64)
        self.mu = nn.Linear(5, 2, dtype=fg.float64)
        self.logvar = nn.Linear(5, 2, dtype=fg.float64)
        self.dec = nn.Linear(2, 6, dtype=fg.float64)

    def forward(self, x: fg.Tensor, eps: fg.Tensor) -> tuple:
        h = self.enc(x).relu()
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + eps * (0.5 * logvar).exp()
        return self.dec(z).sigmoid(), mu, logvar


class _NoGrad(fg.autograd.Function):
    """The identity, whose backward sends no gradient (None)."""

    @staticmethod
    def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> Any:
        return None


@pytest.mark.parametrize("kl", ["kl", "none-from-outside"])
def test_inner_outputs_used_outside_run_one_backward_program(kl: str) -> None:
    """A VAE's loss uses ``mu`` and ``logvar`` (its KL term) beside the reconstruction computed
    from them: the outer output's node hands its gradient on to the inner outputs' node, which
    runs one backward program for all three (the encoder's backward once, not once per node),
    with eager's gradients.  ``none-from-outside``: the path from the loss into ``mu`` sends no
    gradient (a Function returning None); the inner node still runs what was handed to it."""
    fg.manual_seed(0)
    eager = _Vae()
    m = _Vae()
    m.load_state_dict(eager.state_dict())
    cm = fg.compile(m, fullgraph=True)
    rng = np.random.default_rng(6)
    for step in range(4):
        x = fg.tensor(rng.uniform(0.0, 1.0, (3, 6)))
        eps = fg.tensor(rng.standard_normal((3, 2)))
        for net in (eager, cm):
            net.zero_grad()
            recon, mu, logvar = net(x, eps)
            loss = nn.functional.binary_cross_entropy(recon, x, reduction="sum")
            if kl == "kl":
                loss = loss - 0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum()
            else:
                loss = loss + _NoGrad.apply(mu).sum()
            before = compiler.counters.compiled_runs
            loss.backward()
        _close(_grads(m), _grads(eager))
        if step > 0:  # (replayed: one backward program per backward)
            assert compiler.counters.compiled_runs - before == 1
    assert compiler.counters.step_captures == 1 and compiler.counters.fallbacks == {}


def test_outputs_computed_from_each_other_without_replay_use_one_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same model on the path that does not replay the forward (its recording refused):
    the compiled backward of the real outputs, with eager's gradients."""
    fg.manual_seed(0)
    eager = _LogitsAndLoss()
    m = _LogitsAndLoss()
    m.load_state_dict(eager.state_dict())
    cm = fg.compile(m)
    rng = np.random.default_rng(4)
    idx = fg.tensor(rng.integers(0, 11, (3, 4)))
    targets = fg.tensor(rng.integers(0, 11, (3, 4)))
    monkeypatch.setattr(compiler.config, "step_recordings", 0)  # (nothing recorded)
    for net in (eager, cm):
        logits, loss = net(idx, targets)
        (loss * 2.0 + logits.square().mean()).backward()
    _close(_grads(m), _grads(eager))
    assert type(loss.grad_fn).__name__ == "CompiledModuleBackward"


@pytest.mark.parametrize("replayed", [False, True])
def test_what_the_loss_sends_into_the_logits_reaches_them_as_in_eager(replayed: bool) -> None:
    """Hooks, ``retain_grad`` and ``autograd.grad`` on an output that another output is
    computed from see the gradient eager gives them (PyTorch's torch.compile does not: its
    logits get nothing from the loss)."""
    fg.manual_seed(0)
    eager = _LogitsAndLoss()
    m = _LogitsAndLoss()
    m.load_state_dict(eager.state_dict())
    cm = fg.compile(m)
    idx = fg.tensor(np.arange(6).reshape(2, 3))
    if replayed:
        for _ in range(2):  # (recorded, then replayed from here on)
            cm(idx, idx)
    weights = fg.tensor(np.random.default_rng(5).standard_normal((2, 3, 11)))
    seen: dict = {"eager": [], "compiled": []}
    for name, net in (("eager", eager), ("compiled", cm)):
        net.zero_grad()
        logits, loss = net(idx, idx)
        logits.retain_grad()
        logits.register_hook(lambda g, name=name: seen[name].append(g.numpy().copy()))
        (loss + (logits * weights).sum()).backward()
        seen[name].append(logits.grad.numpy().copy())
        logits, loss = net(idx, idx)
        (d_logits,) = fg.autograd.grad(loss, logits)
        seen[name].append(d_logits.numpy().copy())
        logits, loss = net(idx, idx)
        both = fg.autograd.grad(loss * 3.0, [logits, *net.parameters()])
        seen[name].extend(g.numpy().copy() for g in both)
    _close(seen["compiled"], seen["eager"])
    _close(_grads(m), _grads(eager))
    assert compiler.counters.fallbacks == {}


def test_explain_of_a_compiled_module_shows_its_forward_and_backward_programs() -> None:
    _, m = _pair()
    cm = fg.compile(m)
    report = compiler.explain(cm, _x())
    text = str(report)
    assert "explain ran compile(_Net) once" in text
    assert "program:" in text and "compile(model): its backward program" in text
    assert len(report.captures) == 1 and not report.breaks
    cm(_x()).sum().backward()  # the recording explain made is replayed
    assert compiler.counters.step_runs == 1


def test_explain_of_a_compiled_module_that_cannot_replay_says_why() -> None:
    class Reads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3, dtype=fg.float64)

        def forward(self, x: fg.Tensor) -> fg.Tensor:
            h = self.lin(x)
            return h * 2.0 if h.sum().item() > 0 else h

    report = compiler.explain(fg.compile(Reads()), _x())
    assert len(report.breaks) == 1 and "item()" in report.breaks[0]


class _LossHead(nn.Module):
    """Returns ``(h, loss)`` with the loss computed from ``h`` (two levels of outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3, dtype=fg.float64)

    def forward(self, x: fg.Tensor, scale: fg.Tensor) -> tuple:
        h = self.fc(x)
        return h, (h.tanh() ** 2).sum() / (scale.abs() + 0.1)


@pytest.mark.parametrize("replayed", [False, True], ids=["recorded", "replayed"])
def test_a_grad_through_an_inner_output_frees_what_it_ran_as_eager_does(replayed: bool) -> None:
    """``autograd.grad(loss, [loss, scale, h])`` (the inner output ``h`` among the inputs: the
    outer outputs' backward stops there) frees the graph it ran, as eager's does: a second
    backward from the loss without ``retain_graph`` raises eager's error (fuzz seeds 5023, 5306
    and four more); with ``retain_graph`` it runs and gives eager's gradients."""
    results = []
    for compiled in (False, True):
        fg.manual_seed(0)
        m = _LossHead()
        net = fg.compile(m) if compiled else m
        x, scale = _x(), fg.tensor([0.7], dtype=fg.float64, requires_grad=True)
        for _ in range(2 if replayed else 0):  # (recorded, then replayed from here on)
            net(x, scale)
        h, loss = net(x, scale)
        gs = fg.autograd.grad(loss, [loss, scale, h])
        with pytest.raises(RuntimeError, match="backward through the graph a second"):
            (loss * 0.5).backward()
        h, loss = net(x, scale)
        kept = fg.autograd.grad(loss, [scale, h], retain_graph=True)
        (loss * 0.5).backward()
        results.append([g.numpy() for g in (*gs, *kept, scale.grad, m.fc.weight.grad)])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


class _CeilAndLog(nn.Module):
    """Two independent outputs: ``ceil`` (its backward saves nothing, its gradient is zeros)
    and ``log(silu(y))`` (its backward reads saved values)."""

    def forward(self, x: fg.Tensor, y: fg.Tensor) -> tuple:
        return x.ceil(), nn.functional.silu(y).log()


@pytest.mark.parametrize("replayed", [False, True], ids=["recorded", "replayed"])
def test_a_second_backward_through_an_output_whose_nodes_save_nothing_runs_as_eager(
    replayed: bool,
) -> None:
    """Fuzz seed 30007: after a backward through both outputs (the saved values freed), a
    second one from the ``ceil`` output alone runs in eager (its node saved nothing) and must
    run compiled too (it raised "backward through the graph a second time": the backward for
    that output alone could not be pruned exactly, because ceil's zeros depend on no gradient);
    one from the ``log`` output raises eager's error in both."""
    results = []
    for compiled in (False, True):
        net = fg.compile(_CeilAndLog()) if compiled else _CeilAndLog()
        x = fg.tensor([-0.25, 1.5], dtype=fg.float64, requires_grad=True)
        y = fg.tensor([0.5, 2.0], dtype=fg.float64, requires_grad=True)
        for _ in range(2 if replayed else 0):  # (recorded, then replayed from here on)
            net(x, y)
        c, lg = net(x, y)
        ((c * 0.3).sum() + (lg * 0.7).sum()).backward()
        (c * 0.5).sum().backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second"):
            (lg * 0.5).sum().backward()
        results.append([x.grad.numpy().copy(), y.grad.numpy().copy()])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_array_equal(got, want)


class _FlipHead(nn.Module):
    """Returns ``(h, out)``, ``out`` computed from ``h`` by ops that save nothing (fuzz seed
    40280: neg, cumsum, flip)."""

    def forward(self, x: fg.Tensor) -> tuple:
        h = -nn.functional.softplus(x.T)
        return h.cumsum(0).flip(0), h


@pytest.mark.parametrize("replayed", [False, True], ids=["recorded", "replayed"])
def test_a_cut_through_nodes_that_save_nothing_leaves_a_second_backward_running(
    replayed: bool,
) -> None:
    """``autograd.grad(out, [out, h])`` stops the outer output's backward at the inner output
    and frees the nodes it ran; eager's there (neg's, cumsum's, flip's) saved nothing, so a
    later ``out.backward()`` runs in eager and must run compiled too (it raised "backward
    through the graph a second time")."""
    results = []
    for compiled in (False, True):
        m = _FlipHead()
        net = fg.compile(m) if compiled else m
        x = fg.tensor([[0.4], [0.9], [-3.1]], dtype=fg.float64, requires_grad=True)
        for _ in range(2 if replayed else 0):  # (recorded, then replayed from here on)
            net(x)
        out, h = net(x)
        gs = fg.autograd.grad(out, [out, h], grad_outputs=fg.ones_like(out))
        (out * 0.5).sum().backward()
        results.append([g.numpy().copy() for g in gs] + [x.grad.numpy().copy()])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


class _TwoLossHeads(nn.Module):
    """Returns ``(h, loss, e)``, the loss and ``e`` each computed from ``h`` by ops that save
    what they read (tanh, pow; exp)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3, dtype=fg.float64)

    def forward(self, x: fg.Tensor) -> tuple:
        h = self.fc(x)
        return h, (h.tanh() ** 2).sum(), h.exp()


@pytest.mark.parametrize("replayed", [False, True], ids=["recorded", "replayed"])
def test_a_cut_frees_only_the_nodes_it_ran_for_a_later_backward_from_another_output(
    replayed: bool,
) -> None:
    """Fuzz seed 3005251: ``autograd.grad(loss, [h])`` stops at the inner output ``h`` and
    frees only the loss's nodes; a later backward from the other outer output ``e`` runs
    nodes that backward did not run, and runs in eager (compiled, it raised "backward through
    the graph a second time"); a later one from the loss raises in both."""
    results = []
    for compiled in (False, True):
        fg.manual_seed(0)
        m = _TwoLossHeads()
        net = fg.compile(m) if compiled else m
        x = _x(requires_grad=True)
        for _ in range(2 if replayed else 0):  # (recorded, then replayed from here on)
            net(x)
        h, loss, e = net(x)
        (d_h,) = fg.autograd.grad(loss, [h])
        (e * 0.5).sum().backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second"):
            loss.backward()
        results.append([d_h.numpy(), x.grad.numpy(), m.fc.weight.grad.numpy()])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


class _SharedBelow(nn.Module):
    """Returns ``(h, loss)``, the loss computed from ``h`` and from ``a``, which ``h`` is
    computed from (``a``'s tanh saves its output)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3, dtype=fg.float64)

    def forward(self, x: fg.Tensor) -> tuple:
        a = self.fc(x).tanh()
        h = a * 2.0
        return h, (h**2).sum() + a.sum()


@pytest.mark.parametrize("replayed", [False, True], ids=["recorded", "replayed"])
def test_a_cut_that_ran_nodes_below_the_inner_output_frees_them_for_its_backward(
    replayed: bool,
) -> None:
    """``autograd.grad(loss, [h, fc.weight])`` runs ``a``'s tanh node by the loss's path
    around the inner output ``h`` (and frees it): a later ``h.sum().backward()`` reaches it
    and raises eager's error (compiled, it ran)."""
    results = []
    for compiled in (False, True):
        fg.manual_seed(0)
        m = _SharedBelow()
        net = fg.compile(m) if compiled else m
        x = _x()
        for _ in range(2 if replayed else 0):  # (recorded, then replayed from here on)
            net(x)
        h, loss = net(x)
        gs = fg.autograd.grad(loss, [h, m.fc.weight])
        with pytest.raises(RuntimeError, match="backward through the graph a second"):
            h.sum().backward()
        results.append([g.numpy() for g in gs])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


class _Twice(fg.autograd.Function):
    """``2 x``, saving ``x`` (a custom Function: its backward runs without gradients too)."""

    @staticmethod
    def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
        ctx.save_for_backward(x)
        return x * 2.0

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
        (x,) = ctx.saved_tensors
        return g * 2.0


class _FunctionHead(nn.Module):
    """Returns ``(h, loss)``, ``h`` made by custom Functions, the loss computed from it."""

    def forward(self, x: fg.Tensor) -> tuple:
        h = _Twice.apply(_Twice.apply(x.mean(0, keepdim=True)))
        return h, (h * h).sum()


def test_a_cut_at_an_output_a_custom_function_made_runs_nothing_below_it() -> None:
    """``autograd.grad(loss, [h, x])`` stops the loss's backward at the inner output ``h``,
    whose node is a custom Function's: it must not run there (a Function's backward runs
    without gradients too: its zeros flowed on below the cut, ran ``mean``'s node and freed
    it, and the inner output's own backward raised "backward through the graph a second time"
    on the recorded call)."""
    results = []
    for compiled in (False, True):
        net = fg.compile(_FunctionHead()) if compiled else _FunctionHead()
        for _ in range(3):  # (recorded, then replayed)
            x = fg.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
            h, loss = net(x)
            results.append([g.numpy() for g in fg.autograd.grad(loss, [h, x])])
    for got, want in zip(results[3:], results[:3]):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


class _WritesIntoResult(nn.Module):
    """Writes into its ``op``'s result in place (log_softmax: fuzz seed 1009962)."""

    def __init__(self, op: Any, bound: float) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3, dtype=fg.float64)
        self.op, self.bound = op, bound

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        y = self.op(self.fc(x), -1)
        y.masked_fill_(y > self.bound, self.bound)
        return y


@pytest.mark.parametrize(
    ("op", "bound"),
    [(nn.functional.log_softmax, -1.0), (nn.functional.softmax, 0.5)],
    ids=["log_softmax", "softmax"],
)
def test_a_write_into_a_softmax_result_fails_the_backward_as_in_eager(
    op: Any, bound: float
) -> None:
    """The recorded forward's log_softmax and softmax (their composites, each inside one node,
    ``autograd.native``) save their results, as eager's fused primitives: the in-place write
    into one fails the backward with eager's error on every call (the composite the recording
    ran saved none, and the compiled module ran on: fuzz seeds 1000552, 1005447, 1009384,
    1009962)."""
    messages = []
    for compiled in (False, True):
        fg.manual_seed(0)
        m = _WritesIntoResult(op, bound)
        net = fg.compile(m) if compiled else m
        for _ in range(3):
            with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
                net(_x()).sum().backward()
            messages.append(str(info.value))
    assert len(set(messages)) == 1, messages


class _SharedBelowHooked(nn.Module):
    """Fuzz seed 309663's shape: returns ``(out, h)``, ``out`` computed from the inner output
    ``h`` and from ``a``, which ``h`` is computed from too; a tensor hook inside (its backward
    runs eagerly, through the real graph: ``CompiledModuleBackward``)."""

    def forward(self, x: fg.Tensor) -> tuple:
        a = fg.nn.functional.logsigmoid(x)
        s = (a.roll(1, 0) + 1).sigmoid()
        s.register_hook(lambda g: g + 1.0)
        h = fg.addcmul(s, s, s, value=0.5)
        return fg.addcmul(h, a, h, value=0.5), h


@pytest.mark.parametrize("replayed", [False, True], ids=["recorded", "replayed"])
def test_a_cut_that_runs_no_shared_node_frees_the_nodes_it_ran(replayed: bool) -> None:
    """Fuzz seed 309663: ``autograd.grad(out, [out, h])`` runs only ``out``'s node (to reach
    the inner output ``h``) and eager frees it: a later ``out.sum().backward()`` raises.  The
    node below both (``a``'s) leads to no target, so the cut does not run it and need not
    keep the graph for the inner output's backward (compiled, it kept it: nothing raised)."""
    results = []
    for compiled in (False, True):
        m = _SharedBelowHooked()
        net = fg.compile(m) if compiled else m
        x0 = np.linspace(-1.5, 0.7, 20).reshape(4, 5)
        for _ in range(2 if replayed else 0):  # (recorded, then replayed from here on)
            net(fg.tensor(x0, requires_grad=True))
        x = fg.tensor(x0, requires_grad=True)
        out, h = net(x)
        d_out, d_h = fg.autograd.grad(out, [out, h], grad_outputs=fg.ones_like(out))
        with pytest.raises(RuntimeError, match="backward through the graph a second"):
            (out * 0.5).sum().backward()
        h.sum().backward()
        results.append([d_out.numpy(), d_h.numpy(), x.grad.numpy()])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
