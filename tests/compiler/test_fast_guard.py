"""The fast guard of whole steps (``compiler.guard.FastGuard``): a replayed call is checked in
one pass over identities and the guard epoch, and every change that the full guard walk
(``recording.Watch``) would see sends the call to that walk -- compiled values always equal
eager ones.  Each case runs one step function twice, eagerly and compiled, on two copies of the
same world, makes the same change to both, and compares results, parameters and gradients; it
also counts the walks, so that a case proves the fast path ran before the change and was left
after it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn
from fusegrad.autograd.graph_base import epoch, guards_changed
from fusegrad.compiler import recording
from fusegrad.compiler import step as step_module

pytestmark = pytest.mark.usefixtures("fresh_compiler", "no_watched_tensors")


@pytest.fixture
def no_watched_tensors() -> None:
    """No tensor ids from earlier tests' guards: a new tensor that reuses one moves the epoch
    (harmless, but it would let a case below pass without the check it is about).  Emptying
    the set moves the epoch, as a full set does."""
    epoch.watched.clear()
    guards_changed()


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many full guard walks whole steps made (``[count]``)."""
    count = [0]

    class CountingWatch(recording.Watch):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            count[0] += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(step_module, "Watch", CountingWatch)
    yield count


# ---- a world: a module, an optimizer, globals and a step function ----------------------------


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 4, dtype=fg.float64), nn.Tanh())
        self.head = nn.Linear(4, 2, dtype=fg.float64)
        self.act: nn.Module = nn.Tanh()
        self.register_buffer("offset", fg.full((1, 2), 0.25, dtype=fg.float64))
        self.scale = 1.0
        self.gains = [1.0, 1.0]  # (a list attribute: in the key item by item)

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        h = self.act(self.head(self.body(x))) * self.scale * self.gains[0] + self.offset
        return h * 0.5 if self.training else h


def _identity(h: fg.Tensor) -> fg.Tensor:
    return h


def _square(h: fg.Tensor) -> fg.Tensor:
    return h * h


class World:
    """A model, its optimizer and the globals its step reads (``globals``: this world's own
    namespace, so that the eager and the compiled world change theirs alike)."""

    def __init__(self, model: Net, compiled: bool) -> None:
        self.model = model
        self.opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        self.globals: dict[str, Any] = {
            "GAIN": 1.0,
            "SCALES": [1.0, 2.0],
            "BIG": [0.5] * 70,
            "TABLE": {k: 0.5 for k in range(70)},
            "OPTIONS": {"shift": 0.0, "unused": 1.0},
            "EXTRA": fg.tensor(np.full(2, 0.1)),
            "post": _identity,
            "fg": fg,
            "model": model,
            "opt": self.opt,
        }
        source = (
            "def step(x, k=1.0):\n"
            "    opt.zero_grad()\n"
            "    out = post(model(x)) * GAIN * SCALES[0] * k + EXTRA + OPTIONS['shift']\n"
            "    loss = (out * len(BIG) * len(TABLE)).sum()\n"
            "    loss.backward()\n"
            "    opt.step()\n"
            "    return loss.detach()\n"
        )
        exec(compile(source, f"<world {id(self)}>", "exec"), self.globals)  # noqa: S102
        self.fn = self.globals["step"]
        self.step = fg.compile(self.fn) if compiled else self.fn
        # what the changes below put in place, made now: a change makes no new tensor (whose
        # id could be one a guard read, gone since)
        self.spare_parameter = nn.Parameter(fg.tensor(np.linspace(-1, 1, 8).reshape(2, 4)))
        self.spare_weight = fg.tensor(np.linspace(-1, 1, 8).reshape(2, 4))
        self.spare_bias = model.head.bias.detach().float()
        self.spare_zeros = fg.zeros_like(model.head.weight)
        self.spare_zeros2 = fg.zeros_like(model.head.weight)
        self.spare_extra = fg.tensor(np.full(2, -0.3))
        self.spare_extra_data = fg.tensor(np.full((1, 2), -0.3))
        self.spare_offset = fg.full((1, 2), -0.5, dtype=fg.float64)
        self.spare_sigmoids = (nn.Sigmoid(), nn.Sigmoid(), nn.Sigmoid())
        self.spare_empty = nn.Parameter(fg.zeros(2, dtype=fg.float64))


def _worlds() -> tuple[World, World]:
    fg.manual_seed(0)
    model = Net()
    return World(model, False), World(copy.deepcopy(model), True)


def _x(seed: int, batch: int = 5) -> fg.Tensor:
    return fg.tensor(np.random.default_rng(seed).standard_normal((batch, 3)))


def _call(eager: World, comp: World, x: fg.Tensor, *args: Any, **kwargs: Any) -> None:
    want = eager.step(x, *args, **kwargs)
    got = comp.step(x.detach().clone(), *args, **kwargs)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-14)
    a, b = comp.model, eager.model
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert p.dtype == q.dtype and p.shape == q.shape, name
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14)


def _settle(eager: World, comp: World, walks: list[int]) -> None:
    """Calls until the compiled world replays through its fast guard (the first creates the
    optimizer's state, the second is recorded, the third replays after a walk)."""
    for i in range(3):
        _call(eager, comp, _x(i))
    assert compiler.counters.step_runs == 1
    before = walks[0]
    _call(eager, comp, _x(3))
    assert walks[0] == before, "an unchanged call walked: the fast guard did not stand"
    assert compiler.counters.step_runs == 2


def _new_parameter(w: World) -> None:
    w.model.head.weight = w.spare_parameter


def _same_shape_data(w: World) -> None:
    w.model.head.weight.data = w.spare_weight


def _float32_bias(w: World) -> None:
    w.model.head.bias.data = w.spare_bias


def _frozen(w: World) -> None:
    w.model.head.bias.requires_grad_(False)
    w.model.head.bias.grad = None


def _squeezed_buffer(w: World) -> None:
    w.model.offset.squeeze_(0)


def _resized_buffer(w: World) -> None:
    w.model.offset.resize_(2)


def _eval(w: World) -> None:
    w.model.eval()


def _module_number(w: World) -> None:
    w.model.scale = 0.5


def _submodule(w: World) -> None:
    w.model.act = w.spare_sigmoids[0]


def _sequential_item(w: World) -> None:
    w.model.body[1] = w.spare_sigmoids[1]


def _private_dict(w: World) -> None:
    w.model._modules["act"] = w.spare_sigmoids[2]


def _module_list_item(w: World) -> None:
    w.model.gains[0] = 0.25


def _buffer_registered_over(w: World) -> None:
    w.model.register_buffer("offset", w.spare_offset)


def _global_number(w: World) -> None:
    w.globals["GAIN"] = 2.0


def _global_function(w: World) -> None:
    w.globals["post"] = _square


def _global_tensor(w: World) -> None:
    w.globals["EXTRA"] = w.spare_extra


def _global_tensor_data(w: World) -> None:
    w.globals["EXTRA"].data = w.spare_extra_data


def _list_item(w: World) -> None:
    w.globals["SCALES"][0] = 3.0


def _dict_item(w: World) -> None:
    w.globals["OPTIONS"]["shift"] = 1.5


def _dict_key_renamed(w: World) -> None:
    options = w.globals["OPTIONS"]
    options["renamed"] = options.pop("unused")  # (the same value, another name: a new key)


def _large_list_shrinks(w: World) -> None:
    del w.globals["BIG"][60:]


def _large_dict_shrinks(w: World) -> None:
    for k in range(60, 70):
        del w.globals["TABLE"][k]


def _momentum_off(w: World) -> None:
    w.opt.param_groups[0]["momentum"] = 0.0


def _nesterov(w: World) -> None:
    w.opt.param_groups[0]["nesterov"] = True


def _state_replaced(w: World) -> None:
    p = w.model.head.weight
    w.opt.state[p]["momentum_buffer"] = w.spare_zeros


def _state_dict_replaced(w: World) -> None:
    p = w.model.head.weight
    w.opt.state[p] = {"momentum_buffer": w.spare_zeros2}


def _state_entry_added(w: World) -> None:
    w.opt.state[w.model.head.weight]["note"] = 1.5  # (SGD ignores it; the key holds it)


def _parameter_appended(w: World) -> None:
    w.opt.param_groups[0]["params"].append(w.spare_empty)


def _parameter_dropped(w: World) -> None:
    w.opt.param_groups[0]["params"].pop()


def _group_added(w: World) -> None:
    params = list(w.model.parameters())
    w.opt.param_groups[0]["params"] = params[:-1]
    w.opt.add_param_group({"params": params[-1:], "lr": 0.01})


CHANGES: dict[str, Callable[[World], None]] = {
    "a parameter replaced": _new_parameter,
    "a parameter's data replaced (same shape)": _same_shape_data,
    "a parameter's dtype changed": _float32_bias,
    "requires_grad flipped": _frozen,
    "a buffer squeezed in place": _squeezed_buffer,
    "a buffer resized": _resized_buffer,
    "train/eval": _eval,
    "a module's Python number": _module_number,
    "a submodule replaced": _submodule,
    "a Sequential item assigned": _sequential_item,
    "a module's _modules written": _private_dict,
    "a module's list attribute written in place": _module_list_item,
    "a buffer registered again": _buffer_registered_over,
    "a global number": _global_number,
    "a global function rebound": _global_function,
    "a global tensor replaced": _global_tensor,
    "a global tensor's data replaced": _global_tensor_data,
    "a list item": _list_item,
    "a dict item": _dict_item,
    "a dict key renamed": _dict_key_renamed,
    "a large list shrinks": _large_list_shrinks,
    "a large dict shrinks": _large_dict_shrinks,
    "momentum set to zero": _momentum_off,
    "nesterov turned on": _nesterov,
    "optimizer state replaced": _state_replaced,
    "a parameter's optimizer state dict replaced": _state_dict_replaced,
    "an optimizer state entry added": _state_entry_added,
    "a parameter left out of the optimizer": _parameter_dropped,
    "a parameter appended to a group (no grad: not updated)": _parameter_appended,
    "a parameter group added": _group_added,
}


@pytest.mark.parametrize("change", list(CHANGES), ids=list(CHANGES))
def test_a_change_sends_the_call_to_the_walk_and_values_follow_eager(
    change: str, walks: list[int]
) -> None:
    eager, comp = _worlds()
    _settle(eager, comp, walks)
    for w in (eager, comp):
        CHANGES[change](w)
    before, captures = walks[0], compiler.counters.step_captures
    for i in range(4, 8):
        _call(eager, comp, _x(i))
    assert walks[0] > before, "the change was not seen"
    # the changed key is recorded (or replayed) once, then the fast guard stands again
    assert walks[0] <= before + 3
    assert compiler.counters.step_captures <= captures + 1
    assert not compiler.counters.step_breaks


def _scaled_in_place(w: World) -> None:
    with fg.no_grad():
        w.model.head.weight.mul_(0.5)
        w.globals["EXTRA"].add_(1.0)


def _learning_rate(w: World) -> None:
    w.opt.param_groups[0]["lr"] = 0.05


def _unchanged_assignment(w: World) -> None:
    w.globals["SCALES"][1] = 7.0  # (an item the step does not read, but the key holds)


@pytest.mark.parametrize(
    "change",
    [_scaled_in_place, _learning_rate],
    ids=["in-place writes (versions)", "the learning rate (a runtime input)"],
)
def test_what_the_program_reads_on_every_call_keeps_the_fast_path(
    change: Callable[[World], None], walks: list[int]
) -> None:
    eager, comp = _worlds()
    _settle(eager, comp, walks)
    for w in (eager, comp):
        change(w)
    before, captures = walks[0], compiler.counters.step_captures
    for i in range(4, 7):
        _call(eager, comp, _x(i))
    assert walks[0] == before
    assert compiler.counters.step_captures == captures
    assert compiler.counters.step_runs == 5


def test_arguments_are_checked_on_the_fast_path(walks: list[int]) -> None:
    eager, comp = _worlds()
    _settle(eager, comp, walks)
    captures = compiler.counters.step_captures
    calls: list[tuple] = [
        (_x(4, batch=7),),  # a new batch size: recorded
        (fg.tensor(np.random.default_rng(6).standard_normal((3, 5))).t(),),  # (strides: any)
        (_x(7), 2.0),  # a Python number argument, by value
        (_x(8), {"k": 2.0}),  # the same, by keyword
    ]
    for _ in range(2):  # recorded, then replayed after a walk (which keeps a fast guard)
        for x, *rest in calls:
            kwargs = rest.pop() if rest and isinstance(rest[-1], dict) else {}
            _call(eager, comp, x, *rest, **kwargs)
    assert compiler.counters.step_captures == captures + 3
    before = walks[0]
    for x, *rest in calls:  # the four latest keys replay through their fast guards
        kwargs = rest.pop() if rest and isinstance(rest[-1], dict) else {}
        _call(eager, comp, x, *rest, **kwargs)
    assert walks[0] == before
    _call(eager, comp, _x(9), k=3)  # another type: a new key
    _call(eager, comp, _x(9), 2.5)  # another value
    assert walks[0] == before + 2
    assert compiler.counters.step_captures == captures + 5
    assert not compiler.counters.step_breaks


def test_guards_of_the_latest_keys_are_kept(walks: list[int]) -> None:
    eager, comp = _worlds()
    _settle(eager, comp, walks)
    for batch in (6, 7):  # two more keys (a last batch of another size)
        _call(eager, comp, _x(batch, batch=batch))
        _call(eager, comp, _x(batch, batch=batch))
    for batch in (5, 6, 7):  # (a merge over sizes retired the first key's guard: walked again)
        _call(eager, comp, _x(batch, batch=batch))
    before = walks[0]
    for i in range(6):
        _call(eager, comp, _x(i, batch=(5, 6, 7)[i % 3]))
    assert walks[0] == before
    assert len(comp.step.guards) == 3


def test_grad_mode_and_autocast_are_part_of_the_key(walks: list[int]) -> None:
    w = fg.tensor(np.array([0.5, -1.0, 2.0]))

    def fn(x: fg.Tensor) -> fg.Tensor:
        if fg.amp.is_autocast_enabled("cpu"):
            return (x * w).exp().sum()
        if fg.is_grad_enabled():
            return (x * w).sum()
        return (x * w).cos().sum()

    g = fg.compile(fn)
    x = fg.tensor(np.arange(3.0))
    for _ in range(3):
        np.testing.assert_allclose(g(x).numpy(), fn(x).numpy())
    before = walks[0]
    g(x)
    assert walks[0] == before
    for mode in (fg.no_grad, lambda: fg.autocast("cpu")):
        with mode():
            for _ in range(3):
                np.testing.assert_allclose(g(x).numpy(), fn(x).numpy())
    assert walks[0] == before + 4  # (per mode: recorded, then replayed after a walk)
    np.testing.assert_allclose(g(x).numpy(), fn(x).numpy())
    assert walks[0] == before + 4
    assert compiler.counters.step_captures == 3


def test_a_closure_cell_and_a_function_code_are_watched(walks: list[int]) -> None:
    fg.manual_seed(0)
    w = fg.randn(3, dtype=fg.float64)
    factor = 1.0

    def helper(h: fg.Tensor) -> fg.Tensor:
        return h * 2.0

    def fn(x: fg.Tensor) -> fg.Tensor:
        return helper(x * w * factor).sum()

    g = fg.compile(fn)
    x = fg.tensor(np.arange(3.0))
    for _ in range(3):
        np.testing.assert_allclose(g(x).numpy(), fn(x).numpy())
    before = walks[0]
    g(x)
    assert walks[0] == before
    factor = 3.0  # the closure cell's contents: a new key
    for _ in range(3):  # (recorded, replayed after a walk, then through the fast guard)
        np.testing.assert_allclose(g(x).numpy(), fn(x).numpy())
    assert walks[0] == before + 2
    helper.__code__ = _square.__code__  # the same function object, new code: a new key
    for _ in range(3):
        np.testing.assert_allclose(g(x).numpy(), fn(x).numpy())
    assert walks[0] == before + 4
    assert compiler.counters.step_captures == 3


def test_the_epoch_moves_on_what_guards_read_and_not_on_values() -> None:
    m = nn.Linear(2, 2)
    moved = []

    def did(action: Callable[[], Any]) -> bool:
        start = epoch.value
        action()
        return epoch.value != start

    t = fg.zeros(2, 3)
    epoch.watch([m.weight, t])  # (as a guard whose walk read them does)
    moved.append(did(lambda: m.eval()))
    moved.append(did(lambda: setattr(m, "extra", 3)))
    moved.append(did(lambda: delattr(m, "extra")))
    moved.append(did(lambda: m.weight.requires_grad_(False)))
    moved.append(did(lambda: setattr(m.weight, "data", fg.zeros(2, 2))))
    moved.append(did(lambda: m._parameters.pop("bias")))
    moved.append(did(lambda: m.register_buffer("b", fg.zeros(1))))
    moved.append(did(lambda: t.resize_(6)))
    moved.append(did(lambda: t.unsqueeze_(0)))
    assert all(moved)
    stays = []
    with fg.no_grad():
        stays.append(did(lambda: m.weight.add_(1.0)))
    stays.append(did(lambda: m.weight.requires_grad_(False)))  # (no change)
    stays.append(did(lambda: fg.zeros(3) + 1))
    stays.append(did(lambda: fg.zeros(3).requires_grad_(True)))  # (a tensor no guard read)
    stays.append(did(lambda: fg.zeros(3).unsqueeze_(0)))
    assert not any(stays)


class _Scale(fg.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
        return x * 3.0

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
        return g * 3.0


def test_tensors_made_on_every_call_keep_the_fast_path(walks: list[int]) -> None:
    # a custom Function's output and func.grad's input are new tensors made to require grad on
    # every call: no guard reads them, so the stamp stands
    fg.manual_seed(0)
    w = fg.randn(3, dtype=fg.float64, requires_grad=True)

    def fn(x: fg.Tensor) -> fg.Tensor:
        loss = (_Scale.apply(x * w) ** 2).sum()
        loss.backward()
        gx = fg.func.grad(lambda v: (v * v).sum())(x)
        return loss.detach() + gx.sum()

    g = fg.compile(fn)
    x = fg.tensor(np.arange(3.0))
    for _ in range(3):
        got = g(x)
    grad = w.grad.numpy().copy()
    w.grad = None
    want = fn(x)
    np.testing.assert_allclose(got.numpy(), want.numpy())
    np.testing.assert_allclose(grad / 3, w.grad.numpy())  # (three compiled calls accumulated)
    assert compiler.counters.step_runs == 2
    before = walks[0]
    for _ in range(3):
        g(x)
    assert walks[0] == before
    assert compiler.counters.step_runs == 5


# ---- compiled modules (``compile(model)``) ----------------------------------------------------


@pytest.fixture
def module_walks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many full guard walks compiled modules made (``[count]``)."""
    from fusegrad.compiler import module as module_module

    count = [0]

    class CountingWatch(recording.Watch):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            count[0] += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(module_module, "Watch", CountingWatch)
    yield count


def _doubled_forward(self: Net, x: fg.Tensor) -> fg.Tensor:
    return Net.forward(self, x) * 2.0


def _module_call(eager: Net, compiled: Any, x: fg.Tensor) -> None:
    want = eager(x)
    got = compiled(x.detach().clone())
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)
    want.sum().backward()
    got.sum().backward()
    inner = compiled._orig_mod
    for (name, p), q in zip(inner.named_parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, err_msg=name)
        p.grad = q.grad = None


def _new_parameter_of(m: Net) -> None:
    m.head.weight = nn.Parameter(fg.tensor(np.linspace(-1, 1, 8).reshape(2, 4)))


MODULE_CHANGES: dict[str, Callable[[Net], None]] = {
    "train/eval": lambda m: m.eval(),
    "a parameter replaced": _new_parameter_of,
    "requires_grad flipped": lambda m: m.head.bias.requires_grad_(False),
    "a Python number": lambda m: setattr(m, "scale", 0.5),
    "forward replaced on the instance": lambda m: setattr(
        m, "forward", _doubled_forward.__get__(m)
    ),
    "forward replaced on the class": lambda m: setattr(type(m), "forward", _doubled_forward),
}


@pytest.mark.parametrize("change", list(MODULE_CHANGES), ids=list(MODULE_CHANGES))
def test_a_compiled_module_sees_every_change(change: str, module_walks: list[int]) -> None:
    class Own(Net):  # (a class of its own: a case may replace its forward)
        pass

    fg.manual_seed(0)
    eager = Own()
    compiled = fg.compile(copy.deepcopy(eager))
    for i in range(3):  # recorded, replayed after a walk, then through the fast guard
        _module_call(eager, compiled, _x(i))
    before = module_walks[0]
    _module_call(eager, compiled, _x(3))
    assert module_walks[0] == before, "an unchanged call walked"
    MODULE_CHANGES[change](eager)
    MODULE_CHANGES[change](compiled._orig_mod)
    for i in range(4, 7):
        _module_call(eager, compiled, _x(i))
    assert module_walks[0] > before, "the change was not seen"


def test_a_module_loaded_from_a_file_moves_the_epoch(tmp_path: Any, walks: list[int]) -> None:
    # a module pickles its parameters, buffers and submodules as plain ordered dicts; loaded
    # (or copied), they move the epoch again
    fg.manual_seed(0)
    fg.save(Net(), tmp_path / "net.pt")
    eager_model = fg.load(tmp_path / "net.pt", weights_only=False)
    eager = World(eager_model, False)
    comp = World(fg.load(tmp_path / "net.pt", weights_only=False), True)
    _settle(eager, comp, walks)
    for w in (eager, comp):
        w.model._modules["act"] = nn.Sigmoid()
    before = walks[0]
    for i in range(4, 7):
        _call(eager, comp, _x(i))
    assert walks[0] > before


def test_a_function_compiled_as_a_module_keeps_a_fast_guard(
    walks: list[int], module_walks: list[int]
) -> None:
    # its outputs are differentiated outside it: the key is filed "as a module", and the
    # module form's forward is replayed; both guards stand on unchanged calls, and a change
    # to a global it reads is seen by both
    fg.manual_seed(0)
    w = fg.randn(3, dtype=fg.float64, requires_grad=True)
    scale = [2.0]

    def fn(x: fg.Tensor) -> fg.Tensor:
        return (x * w * scale[0]).tanh().sum()

    g = fg.compile(fn)
    x = fg.tensor(np.arange(3.0) / 3)

    def call() -> None:
        got, want = g(x), fn(x)
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)
        (grad_got,) = fg.autograd.grad(got, [w])
        (grad_want,) = fg.autograd.grad(want, [w])
        np.testing.assert_allclose(grad_got.numpy(), grad_want.numpy(), rtol=1e-12)

    for _ in range(4):
        call()
    before, module_before = walks[0], module_walks[0]
    call()
    assert (walks[0], module_walks[0]) == (before, module_before)
    scale[0] = 3.0  # (a closure list's item)
    for _ in range(3):
        call()
    assert walks[0] > before and module_walks[0] > module_before
