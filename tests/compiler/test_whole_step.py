"""Whole-step compile (``compiler.step``): ``fusegrad.compile(fn)`` records forward, backward and
optimizer calls once and replays them as one program -- with eager's parameters, gradients,
buffers, random numbers and return values; a new recording when a guard changes; and a logged
fall back to compiled backward (never a wrong replay) when Python reads tensor values."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import compiler, nn

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # ``benchmarks`` is a package at the repository root
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import models  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_compiler")


# ---- training programs written against the PyTorch API (``benchmarks.models``) -------------


def _optimizer(name: str, params: Any) -> Any:
    if name == "sgd":
        return fg.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)
    return fg.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


GPT_SIZES = {"vocab": 17, "width": 16, "heads": 4, "block": 8}


def _train(kind: str, opt_name: str, compiled: bool, steps: int) -> tuple:
    sizes = GPT_SIZES if kind == "gpt" else {}
    fg.manual_seed(0)
    model = models.make(fg, kind, fg.float64, **sizes)
    opt = _optimizer(opt_name, model.parameters())

    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = models.loss(fg, model, x, y)
        loss.backward()
        opt.step()
        return loss

    fn = fg.compile(step) if compiled else step
    rng = np.random.default_rng(1)
    fg.manual_seed(2)  # dropout draws from here on
    losses = []
    for i in range(steps):
        for group in opt.param_groups:  # a schedule: lr changes every step
            group["lr"] = (0.05 if opt_name == "sgd" else 1e-2) * (1 - i / (2 * steps))
        x, y = models.batch(fg, kind, rng, dtype=fg.float64, **sizes)
        losses.append(fn(x, y).item())
    return model, losses


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("kind", ["mlp", "cnn", "rnn", "gpt"])
def test_training_matches_eager_with_one_recording(kind: str, opt_name: str) -> None:
    steps = 20 if kind != "gpt" else 8
    want_model, want = _train(kind, opt_name, False, steps)
    compiler.reset()
    got_model, got = _train(kind, opt_name, True, steps)
    # the first call creates the optimizer's state and runs eagerly; the second is recorded
    # into the one program every later call runs, whatever the learning rate
    assert compiler.counters.step_warmups == 1, compiler.counters
    assert compiler.counters.step_captures == 1, compiler.counters
    assert compiler.counters.step_runs == steps - 2
    assert compiler.counters.builds == 1
    assert not compiler.counters.step_breaks
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    for (name, p), q in zip(got_model.named_parameters(), want_model.parameters()):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), rtol=1e-8, atol=1e-10, err_msg=name
        )
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-8, atol=1e-10)


# ---- side effects ---------------------------------------------------------------------------


class Counting(nn.Module):
    """A module with a buffer updated in place in forward (as running statistics are)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2, dtype=fg.float64)
        self.register_buffer("mean", fg.zeros(2, dtype=fg.float64))
        self.scale = 1.0
        self.use_tanh = True

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        h = self.fc(x) * self.scale
        with fg.no_grad():
            self.mean.mul_(0.9).add_(h.mean(0), alpha=0.1)
        return h.tanh() if self.use_tanh else h.sigmoid()


def _x(batch: int = 4, seed: int = 0) -> fg.Tensor:
    return fg.tensor(np.random.default_rng(seed).standard_normal((batch, 3)))


def _pair() -> tuple[Counting, Counting]:
    fg.manual_seed(0)
    a = Counting()
    return a, copy.deepcopy(a)


def _sum_backward(m: nn.Module) -> Any:
    def fn(x: fg.Tensor) -> fg.Tensor:
        out = m(x)
        out.sum().backward()
        return out.detach()

    return fn


def _same(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=name
        )
    for p, q in zip(a.parameters(), b.parameters()):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_buffers_versions_and_grad_identity_follow_eager() -> None:
    eager, comp = _pair()
    f, g = _sum_backward(eager), fg.compile(_sum_backward(comp))
    grads = []
    for i in range(4):
        want, got = f(_x(seed=i)), g(_x(seed=i))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
        grads.append(comp.fc.weight.grad)
    _same(comp, eager)
    # gradients accumulate into the same .grad object, as eager's do
    assert all(gr is grads[0] for gr in grads)
    assert comp.mean._version == eager.mean._version
    assert compiler.counters.step_captures == 1 and compiler.counters.step_runs == 3


def test_returned_item_keeps_the_step_compiled() -> None:
    eager, comp = _pair()
    opt_e = fg.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = fg.optim.SGD(comp.parameters(), lr=0.1)

    def make(m: nn.Module, opt: Any) -> Any:
        def fn(x: fg.Tensor) -> float:
            opt.zero_grad()
            loss = m(x).square().mean()
            loss.backward()
            opt.step()
            return loss.item()

        return fn

    f, g = make(eager, opt_e), fg.compile(make(comp, opt_c))
    for i in range(3):
        want, got = f(_x(seed=i)), g(_x(seed=i))
        assert type(got) is float and got == pytest.approx(want, rel=1e-12)
    _same(comp, eager)
    assert compiler.counters.step_runs == 2 and not compiler.counters.step_breaks


def test_inplace_ops_on_activations_are_replayed() -> None:
    fg.manual_seed(0)
    w = fg.randn(3, 5, dtype=fg.float64, requires_grad=True)

    def fn(x: fg.Tensor) -> fg.Tensor:
        h = x @ w
        h.relu_()
        h.mul_(2.0)
        loss = h.sum()
        loss.backward()
        return h.detach()

    g = fg.compile(fn)
    for i in range(3):
        w.grad = None
        want = fn(_x(seed=i))
        want_grad = w.grad.numpy().copy()
        w.grad = None
        got = g(_x(seed=i))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), want_grad, rtol=1e-12)
    assert compiler.counters.step_runs == 2, compiler.counters


def test_autograd_grad_inside_the_step() -> None:
    fg.manual_seed(0)
    w = fg.randn(3, 2, dtype=fg.float64, requires_grad=True)

    def fn(x: fg.Tensor) -> tuple:
        loss = (x @ w).sin().sum()
        (gw,) = fg.autograd.grad(loss, [w])
        return loss.detach(), gw

    g = fg.compile(fn)
    for i in range(3):
        want, got = fn(_x(seed=i)), g(_x(seed=i))
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    assert w.grad is None
    assert compiler.counters.step_runs == 2


def test_dropout_draws_the_numbers_eager_draws() -> None:
    def fn(x: fg.Tensor) -> fg.Tensor:
        return F.dropout(x * 2.0, 0.5) + fg.rand(x.shape, dtype=x.dtype)

    g = fg.compile(fn)
    with fg.no_grad():
        for i in range(3):
            fg.manual_seed(i)
            want = fn(_x(seed=i))
            fg.manual_seed(i)
            got = g(_x(seed=i))
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert compiler.counters.step_runs == 2


# ---- guards -----------------------------------------------------------------------------------


def _run_both(eager: nn.Module, comp: nn.Module, g: Any, x: fg.Tensor) -> None:
    want = _sum_backward(eager)(x)
    got = g(x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    _same(comp, eager)


def test_guards_batch_size_mode_and_python_flags() -> None:
    eager, comp = _pair()
    g = fg.compile(_sum_backward(comp))
    _run_both(eager, comp, g, _x())
    _run_both(eager, comp, g, _x(seed=1))
    assert compiler.counters.step_captures == 1
    _run_both(eager, comp, g, _x(batch=7))  # a new batch size: a new recording
    assert compiler.counters.step_captures == 2
    for m in (eager, comp):
        m.eval()
    _run_both(eager, comp, g, _x(seed=2))  # training flag
    assert compiler.counters.step_captures == 3
    for m in (eager, comp):
        m.use_tanh = False  # a Python branch in forward
    _run_both(eager, comp, g, _x(seed=3))
    assert compiler.counters.step_captures == 4
    for m in (eager, comp):
        m.scale = 0.5  # a Python number folded into the trace
    _run_both(eager, comp, g, _x(seed=4))
    assert compiler.counters.step_captures == 5
    assert compiler.counters.step_runs == 1


def test_guards_parameters_replaced_modified_or_frozen() -> None:
    eager, comp = _pair()
    g = fg.compile(_sum_backward(comp))
    _run_both(eager, comp, g, _x())
    # modified in place outside: the program reads the parameter's data, nothing to recompile
    for m in (eager, comp):
        with fg.no_grad():
            m.fc.weight.mul_(0.5)
    _run_both(eager, comp, g, _x(seed=1))
    assert compiler.counters.step_captures == 1 and compiler.counters.step_runs == 1
    # replaced by a new Parameter
    new = np.random.default_rng(5).standard_normal((2, 3))
    for m in (eager, comp):
        m.fc.weight = nn.Parameter(fg.tensor(new.copy()))
    _run_both(eager, comp, g, _x(seed=2))
    assert compiler.counters.step_captures == 2
    # frozen: no gradient any more
    for m in (eager, comp):
        m.fc.bias.requires_grad_(False)
        m.fc.bias.grad = None
    _run_both(eager, comp, g, _x(seed=3))
    assert comp.fc.bias.grad is None
    assert compiler.counters.step_captures == 3


FLAG = True


def test_guards_a_global_flag() -> None:
    global FLAG
    fg.manual_seed(0)
    w = fg.randn(3, 2, dtype=fg.float64)

    def fn(x: fg.Tensor) -> fg.Tensor:
        return (x @ w).exp() if FLAG else (x @ w).cos()

    g = fg.compile(fn)
    try:
        for flag in (True, True, False, False, True):
            FLAG = flag
            np.testing.assert_allclose(g(_x()).numpy(), fn(_x()).numpy(), rtol=1e-12)
    finally:
        FLAG = True
    assert compiler.counters.step_captures == 2 and compiler.counters.step_runs == 3


# ---- graph breaks -----------------------------------------------------------------------------


def _breaking(kind: str, m: nn.Module) -> Any:
    def fn(x: fg.Tensor) -> fg.Tensor:
        loss = m(x).sum()
        if kind == "item":
            scale = 1.0 / (1.0 + abs(loss.item()))
            loss = loss * scale
        elif kind == "bool":
            if loss > 0:
                loss = loss * 2.0
        else:
            print(loss)
        loss.backward()
        return loss.detach()

    return fn


@pytest.mark.parametrize(
    "kind, what", [("item", "item()"), ("bool", "bool()"), ("print", "print/repr")]
)
def test_python_reading_values_splits_or_falls_back_with_the_source_line(
    kind: str, what: str, capsys: Any
) -> None:
    eager, comp = _pair()
    g = fg.compile(_breaking(kind, comp))
    for i in range(3):
        want = _breaking(kind, eager)(_x(seed=i))
        got = g(_x(seed=i))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
        _same(comp, eager)
        x = _x(seed=i) * -1.0  # the other branch
        want = _breaking(kind, eager)(x)
        got = g(x)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    # the function is split at the read (``compiler.breaks``); the part before it returns a
    # loss that still needs its history, so it cannot replay either (a second break)
    split, *rest = compiler.counters.step_breaks
    assert split.startswith("graph break at line") and "split into" in split
    assert what in split and "test_whole_step.py" in split
    assert all("autograd history" in r or "backward" in r for r in rest), rest
    assert compiler.counters.compiled_runs >= 5  # the backward is still compiled


def test_fullgraph_raises_the_reason() -> None:
    _, comp = _pair()
    g = fg.compile(_breaking("item", comp), fullgraph=True)
    with pytest.raises(compiler.CompilationError, match=r"item\(\)"):
        g(_x())


def test_outputs_differentiated_outside_compile_the_function_as_a_module() -> None:
    """A function whose output a backward outside it differentiates (a loss function) is no
    whole step: from its second call it runs compiled as a module (``FunctionModule``: its
    forward replayed, the backward a second program), with eager's gradients for the
    parameters of the module it reads from its closure."""
    eager, comp = _pair()
    g = fg.compile(lambda x: (comp(x) ** 2).sum())
    for i in range(4):
        for m, fn in ((eager, lambda x: (eager(x) ** 2).sum()), (comp, g)):
            m.zero_grad()
            loss = fn(_x(seed=i))
            loss.backward()
        np.testing.assert_allclose(float(g(_x(seed=i))), float((eager(_x(seed=i)) ** 2).sum()))
        for p, q in zip(comp.parameters(), eager.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14)
    assert not compiler.counters.step_breaks
    assert compiler.counters.step_runs >= 6  # the forward replayed from the third call on
    text = str(compiler.explain(g, _x(seed=9)))
    assert "compiled as a module" in text and "not replayable" not in text
    before = compiler.counters.step_runs
    g(_x(seed=10)).backward()  # (explain kept the module form for these guards)
    assert compiler.counters.step_runs == before + 1


def test_inplace_write_into_a_view_falls_back() -> None:
    fg.manual_seed(0)
    w = fg.randn(3, 4, dtype=fg.float64, requires_grad=True)

    def fn(x: fg.Tensor) -> fg.Tensor:
        h = (x @ w) + 1.0
        h[:, 1:3].mul_(3.0)  # writes through a view into h
        h.sum().backward()
        return h.detach()

    g = fg.compile(fn)
    for i in range(2):
        w.grad = None
        want = fn(_x(seed=i))
        want_grad = w.grad.numpy().copy()
        w.grad = None
        np.testing.assert_allclose(g(_x(seed=i)).numpy(), want.numpy(), rtol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), want_grad, rtol=1e-12)
    (reason,) = compiler.counters.step_breaks
    assert "view" in reason


def test_index_checks_still_raise_on_replay() -> None:
    fg.manual_seed(0)
    emb = nn.Embedding(5, 3, dtype=fg.float64)

    def fn(idx: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        loss = F.cross_entropy(emb(idx), y)
        loss.backward()
        return loss.detach()

    g = fg.compile(fn)
    ok = fg.tensor([0, 4, 2]), fg.tensor([1, 2, 0])
    g(*ok)
    g(*ok)
    assert compiler.counters.step_runs == 1
    before = emb.weight.grad.numpy().copy()
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        g(fg.tensor([0, 5, 2]), fg.tensor([1, 2, 0]))
    with pytest.raises(IndexError, match="index -1 is out of bounds"):
        g(fg.tensor([0, -1, 2]), fg.tensor([1, 2, 0]))
    with pytest.raises(IndexError, match="Target 3 is out of bounds"):
        g(fg.tensor([0, 1, 2]), fg.tensor([1, 3, 0]))
    np.testing.assert_array_equal(emb.weight.grad.numpy(), before)  # nothing changed
    assert compiler.counters.step_runs == 1 and compiler.counters.step_captures == 1


def test_outputs_are_fresh_and_not_overwritten_by_the_next_call() -> None:
    fg.manual_seed(0)
    w = fg.randn(3, 2, dtype=fg.float64)

    def fn(x: fg.Tensor) -> tuple:
        return x * 1.0, (x @ w).tanh(), x

    g = fg.compile(fn)
    x0, x1 = _x(seed=0), _x(seed=1)
    g(x0)
    a, b, c = g(x0)
    assert c is x0
    want_b = b.numpy().copy()
    g(x1)
    np.testing.assert_array_equal(b.numpy(), want_b)  # not a reused buffer
    a.mul_(0.0)
    assert float(x0.abs().sum()) > 0  # the output does not alias the argument
    assert compiler.counters.step_runs == 2


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_float32_updates_take_the_learning_rate_of_each_call(opt_name: str) -> None:
    """float32 parameters: the runtime scalars (learning rate, bias corrections) are cast to
    float32 inside the op surface; the cast must stay a cast of the program's input."""

    def train(compiled: bool) -> tuple:
        fg.manual_seed(0)
        lin = nn.Linear(3, 2)
        opt = _optimizer(opt_name, lin.parameters())

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = lin(x).square().sum()
            loss.backward()
            opt.step()
            return loss

        fn = fg.compile(step) if compiled else step
        x = fg.tensor(np.arange(6.0).reshape(2, 3) / 7, dtype=fg.float32)
        for i in range(6):
            opt.param_groups[0]["lr"] = 0.01 * (i + 1)
            fn(x)
        return lin.weight.detach().numpy(), lin.bias.detach().numpy()

    want = train(False)
    got = train(True)
    assert compiler.counters.step_runs == 4
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# ---- the op table through a whole step -------------------------------------------------------

sys.path.insert(0, str(REPO_ROOT / "tests" / "ops"))
from op_table import FG, OPS, build, flat_outputs, is_float  # noqa: E402

FIRST_CASES = list(
    {
        e.name: (e, s)
        for e in OPS
        for s in reversed(e.get_samples())
        if e.differentiable and s.grad
    }.values()
)
# what may stop a recording of one op (the op's own nature, never a wrong replay)
ALLOWED_BREAKS = ("data-dependent", "a complex value")
# entries whose op lambda itself makes a tensor from data (``m.tensor([...])``): an untraced
# path, which stops the recording (the replay could not make it again)
MAKES_TENSORS = ("cov", "quantile")


@pytest.mark.parametrize(
    "entry,sample", FIRST_CASES, ids=[f"{e.name}-{s.name}" for e, s in FIRST_CASES]
)
def test_op_table_whole_step_matches_eager(entry: Any, sample: Any) -> None:
    """Each op's forward and backward as one compiled function: recorded on the first call,
    replayed on new leaves (scaled data), against eager on the same leaves."""
    leaves, fn = build(entry, FG, sample, "float64")
    outs = [o for o in flat_outputs(fn(*leaves)) if is_float(o) and o.requires_grad]
    if not leaves or not outs:
        pytest.skip("no differentiable input")
    rng = np.random.default_rng(7)
    cots = [fg.tensor(rng.standard_normal(tuple(o.shape))) for o in outs]

    def whole(xs: list, cots: list) -> list:
        outs = [o for o in flat_outputs(fn(*xs)) if is_float(o) and o.requires_grad]
        fg.autograd.backward(outs, cots)
        return [o.detach() for o in outs]

    step = fg.compile(whole)
    for scale in (1.0, 0.75):
        results = []
        for f in (whole, step):
            xs = [
                fg.tensor(t.detach().numpy() * scale, requires_grad=True, dtype=t.dtype)
                for t in leaves
            ]
            got = f(xs, cots)
            results.append([o.numpy() for o in got] + [x.grad for x in xs])
        for a, b in zip(results[1], results[0]):
            if a is None or b is None:  # (an input no output depends on: no .grad)
                assert a is None and b is None
                continue
            if isinstance(b, fg.Tensor) or isinstance(a, fg.Tensor):
                a, b = a.numpy(), b.numpy()
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    for reason in compiler.counters.step_breaks:
        allowed = ALLOWED_BREAKS + (("untraced path",) if entry.name in MAKES_TENSORS else ())
        assert any(k in reason for k in allowed), reason
    # the second call was a replay (193 of the 194 ops; masked_select's shape is data)
    assert compiler.counters.step_runs == 1 or compiler.counters.step_breaks


def test_a_tensor_returned_twice_is_one_tensor() -> None:
    fg.manual_seed(0)
    w = fg.randn(3, 2, dtype=fg.float64)

    def fn(x: fg.Tensor) -> tuple:
        y = (x @ w).exp()
        return y, {"again": y}

    g = fg.compile(fn)
    for seed in range(3):
        y, d = g(_x(seed=seed))
        assert d["again"] is y
    assert compiler.counters.step_runs == 2


def test_workload_a_whole_step_is_one_loop() -> None:
    """Forward, loss and the three gradients of benchmark A in one generated loop, as the
    hand-fused reference computes them."""
    rng = np.random.default_rng(0)
    x, w = (fg.tensor(rng.standard_normal(4096), requires_grad=True) for _ in range(2))
    b = fg.tensor(rng.standard_normal(1), requires_grad=True)

    def step(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
        loss = ((x * w + b).tanh() * x.sigmoid() + (-x * x).exp() * 0.5).sum()
        loss.backward()
        return loss.detach()

    report = compiler.explain(step, x, w, b)
    ((entry, program),) = report.steps
    assert len(program.kernels) == 1 and not program.externs
    kernel = program.kernels[0]
    assert sorted(r.op for r in kernel.reductions) == ["sum", "sum_to"]  # the loss, grad b


def test_backward_with_leaf_inputs_is_replayed() -> None:
    fg.manual_seed(0)
    w1 = fg.randn(3, 4, dtype=fg.float64, requires_grad=True)
    w2 = fg.randn(4, 2, dtype=fg.float64, requires_grad=True)

    def fn(x: fg.Tensor) -> fg.Tensor:
        loss = ((x @ w1).tanh() @ w2).square().sum()
        loss.backward(inputs=[w2])  # only w2 gets a gradient
        return loss.detach()

    g = fg.compile(fn)
    for seed in range(3):
        w1.grad = w2.grad = None
        want = fn(_x(seed=seed))
        want_grad = w2.grad.numpy().copy()
        assert w1.grad is None
        w2.grad = None
        got = g(_x(seed=seed))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
        np.testing.assert_allclose(w2.grad.numpy(), want_grad, rtol=1e-12)
        assert w1.grad is None
    assert compiler.counters.step_runs == 2, compiler.counters


def test_explain_says_it_ran_the_step_once_and_why_it_recorded() -> None:
    """``explain`` is one real call: its first line says so, and the call's effects happen once
    (``.grad`` accumulates once, the optimizer steps once); a recording after a guard change
    gives the reason in words."""
    fg.manual_seed(0)
    model = nn.Linear(3, 2).double()
    opt = fg.optim.SGD(model.parameters(), lr=0.1)

    def step(x: fg.Tensor) -> fg.Tensor:
        loss = model(x).square().sum()
        loss.backward()
        opt.step()
        return loss.detach()

    g = fg.compile(step)
    before = model.weight.detach().clone()
    x = _x(batch=4).double()[:, :3]
    report = compiler.explain(g, x)
    text = str(report)
    assert text.splitlines()[0].startswith("explain ran ")
    assert "once" in text.splitlines()[0] and "effects happened" in text.splitlines()[0]
    assert "recording: first call of this function" in text
    # exactly one step happened: one gradient (not accumulated twice), one update
    bias = model.bias.detach().numpy() + 0.1 * model.bias.grad.numpy()  # the bias before
    want_grad = 2 * (x.numpy() @ before.numpy().T + bias).T @ x.numpy()
    np.testing.assert_allclose(model.weight.grad.numpy(), want_grad, rtol=1e-12)
    want_w = before.numpy() - 0.1 * want_grad
    np.testing.assert_allclose(model.weight.detach().numpy(), want_w, rtol=1e-12)
    # a new batch size: the report says which guard changed
    report = compiler.explain(g, _x(batch=5).double()[:, :3])
    assert "the positional arguments changed" in str(report), str(report)


def test_a_slow_whole_step_build_says_what_is_compiling_once(capsys: Any, monkeypatch: Any) -> None:
    # config.compile_notice_s = 0: every build counts as slow
    monkeypatch.setattr(compiler.config, "compile_notice_s", 0.0)
    w = fg.tensor(np.linspace(-1.0, 1.0, 8), requires_grad=True)

    @fg.compile
    def step(x: fg.Tensor) -> fg.Tensor:
        loss = (x * w).tanh().sum()
        loss.backward()
        return loss.detach()

    x = fg.tensor(np.linspace(0.0, 1.0, 8))
    step(x)  # recorded (eager): nothing is compiled yet
    assert capsys.readouterr().err == ""
    for _ in range(2):
        w.grad = None
        step(x)  # the program is built and JIT-compiled once, then replayed silently
    err = capsys.readouterr().err
    assert err.count("fusegrad.compiler: compiling a whole step (") == 1, err
    assert err.count("\n") == 1
    assert compiler.counters.step_runs == 2


def test_returned_loss_keeps_eagers_freed_history() -> None:
    """A loss returned after ``backward()``: as in eager it requires grad, its ``grad_fn`` has
    eager's name, and a second backward raises eager's freed-graph error."""
    w = fg.tensor(np.linspace(-1.0, 1.0, 6), requires_grad=True)

    def step(x: fg.Tensor) -> fg.Tensor:
        loss = (x * w).tanh().sum()
        loss.backward()
        return loss

    g = fg.compile(step)
    x = fg.tensor(np.linspace(0.0, 1.0, 6))
    want = step(x)
    for _ in range(3):
        w.grad = None
        got = g(x)
    assert compiler.counters.step_runs == 2, compiler.counters
    assert got.requires_grad and want.requires_grad and not got.is_leaf
    assert got.grad_fn.name() == want.grad_fn.name() == "SumBackward0"
    for t in (want, got):
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            t.backward()
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)


def test_returned_tensor_with_a_usable_graph_is_not_replayed() -> None:
    """With ``retain_graph=True`` eager's returned loss can be backpropagated again: the
    recording stops with a reason instead of returning a tensor without that history."""
    w = fg.tensor(np.linspace(-1.0, 1.0, 6), requires_grad=True)

    @fg.compile
    def step(x: fg.Tensor) -> fg.Tensor:
        loss = (x * w).tanh().sum()
        loss.backward(retain_graph=True)
        return loss

    x = fg.tensor(np.linspace(0.0, 1.0, 6))
    for _ in range(2):
        w.grad = None
        loss = step(x)
        loss.backward()  # works, as in eager: the gradient doubles
        np.testing.assert_allclose(
            w.grad.numpy(), 2 * x.numpy() * (1 - np.tanh(x.numpy() * w.detach().numpy()) ** 2)
        )
    assert compiler.counters.step_runs == 0
    (reason,) = compiler.counters.step_breaks
    assert "autograd graph a later backward could still use" in reason


@pytest.mark.parametrize("opt_name", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("dtype", [fg.float64, fg.float32])
def test_hyperparameters_changed_every_call_are_runtime_inputs(opt_name: str, dtype: Any) -> None:
    """lr, betas, eps, weight decay, momentum and dampening changed before every call (as
    OneCycleLR's momentum cycling does): one recording, eager's parameters."""

    def train(compiled: bool) -> list:
        fg.manual_seed(0)
        lin = nn.Linear(3, 2, dtype=dtype)
        if opt_name == "sgd":
            opt = fg.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9, dampening=0.1)
        elif opt_name == "adam":
            opt = fg.optim.Adam(lin.parameters(), lr=0.01, weight_decay=0.1)
        else:
            opt = fg.optim.AdamW(lin.parameters(), lr=0.01, weight_decay=0.1)

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = lin(x).tanh().square().sum()
            loss.backward()
            opt.step()
            return loss.detach()

        fn = fg.compile(step) if compiled else step
        x = fg.tensor(np.arange(12.0).reshape(4, 3) / 7, dtype=dtype)
        for i in range(7):
            group = opt.param_groups[0]
            group["lr"] = 0.01 * (i + 1)
            group["weight_decay"] = 0.05 * (i + 1)
            if opt_name == "sgd":
                group["momentum"] = 0.5 + 0.05 * i
                group["dampening"] = 0.02 * i
            else:
                group["betas"] = (0.8 + 0.02 * i, 0.99 - 0.001 * i)
                group["eps"] = 1e-8 * (i + 1)
            fn(x)
        return [p.detach().numpy().copy() for p in lin.parameters()]

    want = train(False)
    compiler.reset()
    got = train(True)
    assert compiler.counters.step_captures == 1, compiler.counters
    assert compiler.counters.step_runs == 5 and not compiler.counters.step_breaks
    tol = 1e-12 if dtype is fg.float64 else 1e-5
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_a_replaced_param_group_is_read_not_its_old_dict() -> None:
    """A recorded update reads its options from the param group dict on every call: a group
    replaced by a new dict (as code that rebuilds ``param_groups`` does) is a new recording,
    never a replay that keeps reading the old dict; an option shared by parameters of a group
    is one runtime input."""

    def train(compiled: bool) -> list:
        fg.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()
        opt = fg.optim.Adam(model.parameters(), lr=0.01)

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = model(x).square().sum()
            loss.backward()
            opt.step()
            return loss.detach()

        fn = fg.compile(step) if compiled else step
        x = fg.tensor(np.arange(6.0).reshape(2, 3) / 5, dtype=fg.float64)
        for i in range(6):
            if i == 3:
                opt.param_groups[0] = dict(opt.param_groups[0], lr=0.1, betas=(0.5, 0.9))
            fn(x)
        return [p.detach().numpy().copy() for p in model.parameters()], fn

    want, _ = train(False)
    compiler.reset()
    got, fn = train(True)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert compiler.counters.step_captures == 2, compiler.counters
    ((entry, _),) = compiler.explain(fn, fg.tensor(np.ones((2, 3)))).steps
    scalars = [s for s in entry.sources if s[0] == "scalar"]
    # lr-dependent bias corrections per parameter (4 of them); betas, eps: once per group
    assert len(scalars) < 4 * 5, len(scalars)


def test_anomaly_mode_runs_the_backward_nodes_not_a_replay() -> None:
    """Under anomaly mode eager checks each node's outputs for NaN and raises naming the node:
    a compiled step with a recording must not replay past that check."""
    w = fg.tensor(np.array([1.0, -1.0, 4.0]), requires_grad=True)

    @fg.compile
    def step(x: fg.Tensor) -> fg.Tensor:
        loss = (x * w).sqrt().sum()
        loss.backward()
        return loss.detach()

    x = fg.tensor(np.array([1.0, 0.0, 1.0]))  # sqrt(0): an inf gradient, then 0 * inf = nan
    for _ in range(3):
        w.grad = None
        step(x)
    assert compiler.counters.step_runs == 2
    w.grad = None
    with pytest.warns(UserWarning, match="Anomaly Detection has been enabled"):
        mode = fg.autograd.detect_anomaly()
    with mode, pytest.warns(UserWarning, match="Error detected in"):
        with pytest.raises(RuntimeError, match="returned nan values"):
            step(x)
    assert compiler.counters.step_runs == 2  # not replayed


def test_runtime_scalars_are_computed_once_per_group_and_count() -> None:
    """An AdamW step over several parameters: its per-step scalars (bias corrections, the
    decay factor, betas, eps) are runtime inputs shared by the group's parameters, and a
    scalar cast to float32 is computed from its float64 input, not replayed again."""
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2), nn.Tanh(), nn.Linear(2, 1))
    opt = fg.optim.AdamW(model.parameters(), lr=1e-2)

    def step(x: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = model(x).square().sum()
        loss.backward()
        opt.step()
        return loss.detach()

    g = fg.compile(step)
    x = fg.tensor(np.arange(6.0).reshape(2, 3) / 5, dtype=fg.float32)
    g(x)  # makes AdamW's state
    ((entry, _),) = compiler.explain(g, x).steps
    kinds = [s[0] for s in entry.sources]
    # 6 parameters, one group: decay, bias corrections and options once each, not per parameter
    assert kinds.count("scalar") <= 8, kinds
    assert kinds.count("cast") <= kinds.count("scalar"), kinds
    want = [p.detach().numpy().copy() for p in model.parameters()]
    g(x)
    replayed = [p.detach().numpy().copy() for p in model.parameters()]
    assert compiler.counters.step_runs == 1
    assert all(not np.array_equal(a, b) for a, b in zip(want, replayed))


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_zero_grad_without_set_to_none_stays_compiled(opt_name: str) -> None:
    """``opt.zero_grad(set_to_none=False)`` keeps the ``.grad`` tensors: the backward adds
    into them and the optimizer reads the sums.  The program reads each ``.grad`` before it
    runs (zeros when the user set it to None meanwhile): one recording, eager's parameters,
    gradients and ``.grad`` identities."""

    def run(compiled: bool) -> tuple:
        fg.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
        opt = _optimizer(opt_name, model.parameters())

        def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        fn = fg.compile(step) if compiled else step
        rng = np.random.default_rng(3)
        identities, losses = [], []
        for i in range(8):
            x = fg.tensor(rng.standard_normal((5, 6)))
            y = fg.tensor(rng.integers(0, 3, 5))
            losses.append(fn(x, y).item())
            identities.append([id(p.grad) for p in model.parameters()])
            if i == 4:  # a fresh .grad from here on (the backward makes it)
                for p in model.parameters():
                    p.grad = None
        same = [row == identities[1] for row in identities]
        params = [p.detach().numpy().copy() for p in model.parameters()]
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        return losses, params, grads, same

    want = run(False)
    compiler.reset()
    got = run(True)
    assert compiler.counters.step_captures == 1 and not compiler.counters.step_breaks
    assert compiler.counters.step_runs == 6, compiler.counters
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for a, b in zip(got[1] + got[2], want[1] + want[2]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
    assert got[3] == want[3] == [True] * 5 + [False] * 3


@pytest.mark.parametrize("clip", ["norm", "value"])
def test_gradient_clipping_after_backward_is_the_grad_a_replay_leaves(clip: str) -> None:
    """``clip_grad_norm_``/``clip_grad_value_`` write into ``.grad`` after ``backward()``: a
    replay leaves the clipped ``.grad`` eager leaves (it used to write the unclipped one; the
    update itself was right)."""

    def run(compiled: bool) -> tuple[list, list]:
        fg.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
        opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = (model(x) ** 2).sum()
            loss.backward()
            if clip == "norm":
                nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            else:
                nn.utils.clip_grad_value_(model.parameters(), 0.05)
            opt.step()
            return loss

        fn = fg.compile(step) if compiled else step
        rng = np.random.default_rng(0)
        for _ in range(5):
            fn(fg.tensor(rng.standard_normal((5, 4))))
        return (
            [p.grad.numpy().copy() for p in model.parameters()],
            [p.detach().numpy().copy() for p in model.parameters()],
        )

    want = run(False)
    got = run(True)
    assert compiler.counters.step_runs == 3, compiler.counters
    for g, w in zip(got[0] + got[1], want[0] + want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15)


def test_clipping_grads_kept_by_zero_grad_set_to_none_false() -> None:
    """``zero_grad(set_to_none=False)`` keeps the ``.grad`` tensors (zeroed in place, then
    accumulated into); clipping them after the backward: replays leave eager's ``.grad``."""

    def run(compiled: bool) -> list:
        fg.manual_seed(0)
        lin = nn.Linear(3, 2).double()
        opt = fg.optim.SGD(lin.parameters(), lr=0.1)

        def step(x: fg.Tensor) -> fg.Tensor:
            opt.zero_grad(set_to_none=False)
            loss = lin(x).square().sum()
            loss.backward()
            nn.utils.clip_grad_norm_(lin.parameters(), 0.5)
            opt.step()
            return loss.detach()

        fn = fg.compile(step) if compiled else step
        for k in range(4):
            fn(_x(batch=4).double()[:, :3] * (k + 1))
        return [lin.weight.grad.numpy().copy(), lin.weight.detach().numpy().copy()]

    want = run(False)
    got = run(True)
    assert compiler.counters.step_runs == 3, compiler.counters
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)


@pytest.mark.parametrize(
    ("op", "write", "node"),
    [
        (fg.log_softmax, lambda y: y.exp_(), "LogSoftmaxBackward0"),
        (fg.softmax, lambda y: y.mul_(2.0), "SoftmaxBackward0"),
    ],
    ids=["log_softmax", "softmax"],
)
def test_a_compiled_step_writing_into_a_softmax_result_fails_like_eager(
    op: Any, write: Any, node: str
) -> None:
    """The recording's log_softmax and softmax (their composites, which the compiler fuses)
    are each one node that saves its result (``autograd.native``), as eager's fused primitives
    and PyTorch's: an in-place write into the result fails the backward with eager's error,
    on every call (the composites' own nodes saved ``exp(x - max)`` and the sum: fuzz seeds
    1000552, 1005447, 1009384, 1009962)."""

    def step(x: fg.Tensor) -> None:
        y = op(x, 0)
        write(y)
        y.sum().backward()

    messages = []
    compiled = fg.compile(step)
    for fn in (step, compiled, compiled, compiled):
        with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
            fn(fg.tensor([0.1, 0.2, -0.3], requires_grad=True))
        messages.append(str(info.value))
    assert len(set(messages)) == 1, messages
    assert f"output 0 of {node}" in messages[0]
