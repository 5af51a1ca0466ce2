"""Forward-mode AD (``fusegrad.autograd.forward_ad``): dual levels, make_dual / unpack_dual and
their errors, tangents through views and in-place ops, grad-mode independence, reverse over
forward and forward over reverse, the completeness of the JVP table, and PyTorch's
``torch.autograd.forward_ad`` example programs run in both libraries.

Every primitive's JVP against finite differences is in ``tests/ops/test_op_table.py``
(``test_jvp_matches_finite_differences``, ``test_jvp_matches_torch``).
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
import fusegrad.nn.functional as FF
from fusegrad.autograd import forward_ad as fwAD
from fusegrad.autograd.jvps import UNSUPPORTED
from fusegrad.ops import registry
from fusegrad.ops.registry import JVPS, REGISTRY


def _t(a):
    return fusegrad.tensor(np.asarray(a, dtype=np.float64))


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# ---- levels ------------------------------------------------------------------------------------


def test_dual_level_index_and_tangents_dropped_on_exit() -> None:
    x, t = _t(_rand(3)), _t(_rand(3, seed=1))
    with fwAD.dual_level() as level:
        assert level == 0
        y = fwAD.make_dual(x, t).exp()
        tangent = fwAD.unpack_dual(y).tangent
        np.testing.assert_allclose(tangent.numpy(), (x.exp() * t).numpy())
    assert fwAD.unpack_dual(y).tangent is None
    assert fwAD.unpack_dual(y).primal is y
    # a new level starts clean
    with fwAD.dual_level():
        assert fwAD.unpack_dual(y).tangent is None


def test_a_long_level_keeps_no_record_of_dead_tensors() -> None:
    from fusegrad.autograd.forward_state import state

    x = fusegrad.tensor(_rand(3), requires_grad=True)  # nodes save outputs (exp)
    with fwAD.dual_level():
        d = fwAD.make_dual(x, _t(np.ones(3)))
        for _ in range(200):
            y = (d * 2.0).exp()
        assert len(state.level.holders) < 10  # d, y and its inputs, not 400 entries
        assert fwAD.unpack_dual(y).tangent is not None


def test_nested_levels_and_bad_exits_raise() -> None:
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match="Nested forward mode AD is not supported"):
            fwAD.enter_dual_level()
        with pytest.raises(RuntimeError, match="not the last one that was created"):
            fwAD.exit_dual_level(level=3)
    with pytest.raises(RuntimeError, match="Dual level must be a positive number"):
        fwAD.exit_dual_level()
    assert fwAD.enter_dual_level() == 0
    fwAD.exit_dual_level(level=0)


def test_dual_level_as_decorator_and_after_an_error() -> None:
    @fwAD.dual_level()
    def tangent_of_square(x, t):
        return fwAD.unpack_dual(fwAD.make_dual(x, t) ** 2).tangent

    x, t = _t([1.0, 2.0]), _t([1.0, 1.0])
    np.testing.assert_allclose(tangent_of_square(x, t).numpy(), [2.0, 4.0])
    with pytest.raises(ValueError):
        with fwAD.dual_level():
            raise ValueError("inside")
    with fwAD.dual_level():  # the level was left
        pass


# ---- make_dual / unpack_dual -------------------------------------------------------------------


def test_make_dual_errors() -> None:
    x = _t(_rand(3))
    with pytest.raises(RuntimeError, match="no level exists, make sure to enter_dual_level"):
        fwAD.make_dual(x, x)
    with fwAD.dual_level():
        with pytest.raises(ValueError, match="Expected primal to be floating point"):
            fwAD.make_dual(fusegrad.arange(3), x)
        with pytest.raises(ValueError, match="Expected tangent to be floating point"):
            fwAD.make_dual(x, fusegrad.arange(3))
        with pytest.raises(
            RuntimeError,
            match=r"Tensor is of size \[3\] while the given forward "
            r"gradient is of size \[4\]",
        ):
            fwAD.make_dual(x, _t(_rand(4)))
        d = fwAD.make_dual(x, x)
        with pytest.raises(RuntimeError, match="already has a forward gradient at the same level"):
            fwAD.make_dual(d, x)


def test_unpack_dual_returns_namedtuple_with_views() -> None:
    x, t = _t(_rand(2, 3)), _t(_rand(2, 3, seed=1))
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        assert fwAD.unpack_dual(x) == (x, None)  # the primal itself has no tangent
        unpacked = fwAD.unpack_dual(d)
        assert isinstance(unpacked, fwAD.UnpackedDualTensor)
        primal, tangent = unpacked
        assert unpacked.tangent is t
        assert primal is not d and fwAD.unpack_dual(primal).tangent is None
        assert np.shares_memory(primal.numpy(), x.numpy())
        # ops on the primal carry no tangent
        assert fwAD.unpack_dual(primal * 2).tangent is None
        # a float32 tangent of a float64 primal is cast
        d32 = fwAD.make_dual(x.clone(), t.float())
        assert fwAD.unpack_dual(d32).tangent.dtype == fusegrad.float64


def test_make_dual_stays_differentiable_in_reverse_mode() -> None:
    x = fusegrad.tensor(_rand(3), requires_grad=True)
    with fwAD.dual_level():
        d = fwAD.make_dual(x, _t(np.ones(3)))
        (d * d).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.detach().numpy())


# ---- semantics ---------------------------------------------------------------------------------


def test_forward_ad_ignores_grad_mode_and_detach_drops_tangent() -> None:
    x, t = _t(_rand(3)), _t(_rand(3, seed=1))
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        with fusegrad.no_grad():
            y = d.sin()
        np.testing.assert_allclose(fwAD.unpack_dual(y).tangent.numpy(), (x.cos() * t).numpy())
        assert fwAD.unpack_dual(d.detach()).tangent is None


def test_nondifferentiable_and_piecewise_constant_results() -> None:
    x, t = _t(_rand(4)), _t(_rand(4, seed=1))
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        assert fwAD.unpack_dual(d.argmax()).tangent is None
        assert fwAD.unpack_dual(d > 0).tangent is None
        assert fwAD.unpack_dual(d.to(fusegrad.int64)).tangent is None
        floor = fwAD.unpack_dual(d.floor()).tangent
        np.testing.assert_array_equal(floor.numpy(), np.zeros(4))
        cast = fwAD.unpack_dual(d.float()).tangent
        assert cast.dtype == fusegrad.float32
        np.testing.assert_allclose(cast.numpy(), t.numpy(), rtol=1e-6)


def test_broadcast_tangent_is_materialised_in_the_output_shape() -> None:
    a, ta = _t(_rand(3, 1)), _t(_rand(3, 1, seed=1))
    b = _t(_rand(3, 4, seed=2))
    with fwAD.dual_level():
        out = fwAD.make_dual(a, ta) + b
        tangent = fwAD.unpack_dual(out).tangent
        assert tuple(tangent.shape) == (3, 4)
        expected = np.broadcast_to(ta.numpy(), (3, 4))
        np.testing.assert_allclose(tangent.numpy(), expected)
        out.mul_(2.0)  # the tangent can be written
        np.testing.assert_allclose(fwAD.unpack_dual(out).tangent.numpy(), 2 * expected)


def test_view_tangent_is_a_view_of_the_tangent() -> None:
    x, t = _t(_rand(3, 4)), _t(_rand(3, 4, seed=1))
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        for view in (d[1], d.T, d[:, 1:3], d.reshape(12), d.unsqueeze(0), d.diagonal()):
            vt = fwAD.unpack_dual(view).tangent
            assert np.shares_memory(vt.numpy(), t.numpy())
        np.testing.assert_array_equal(fwAD.unpack_dual(d.T).tangent.numpy(), t.numpy().T)


def test_inplace_on_dual_updates_its_tangent_and_its_views() -> None:
    x, t = _t(_rand(3)), _t(_rand(3, seed=1))
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t).clone()  # a non-view dual
        tangent = fwAD.unpack_dual(d).tangent
        view = d[1:]
        d.mul_(d)  # d := d * d, tangent := 2 d t
        expected = 2 * x.numpy() * t.numpy()
        assert fwAD.unpack_dual(d).tangent is tangent  # written in place
        np.testing.assert_allclose(tangent.numpy(), expected)
        np.testing.assert_allclose(fwAD.unpack_dual(view).tangent.numpy(), expected[1:])
        d.zero_()
        np.testing.assert_array_equal(fwAD.unpack_dual(d).tangent.numpy(), np.zeros(3))


def test_inplace_on_a_view_updates_the_base_tangent() -> None:
    x, t = _t(_rand(4)), _t(_rand(4, seed=1))
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t).clone()
        d[1:3].mul_(3.0)
        np.testing.assert_allclose(
            fwAD.unpack_dual(d).tangent.numpy(), t.numpy() * np.array([1, 3, 3, 1])
        )


def test_writing_a_dual_into_a_plain_tensor_gives_it_a_tangent() -> None:
    x, t = _t(_rand(3)), _t(_rand(3, seed=1))
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        whole = fusegrad.zeros(3, dtype=fusegrad.float64)
        whole.copy_(d)
        np.testing.assert_allclose(fwAD.unpack_dual(whole).tangent.numpy(), t.numpy())
        # into a view: the base gets a zero tangent with the view's part written
        base = fusegrad.zeros(3, dtype=fusegrad.float64)
        earlier_view = base[2:]
        base[:2] = d[:2]
        np.testing.assert_allclose(
            fwAD.unpack_dual(base).tangent.numpy(), [t.numpy()[0], t.numpy()[1], 0.0]
        )
        # a view made before the base had a tangent sees the base's tangent
        np.testing.assert_array_equal(fwAD.unpack_dual(earlier_view).tangent.numpy(), [0.0])
        # fill_ with a dual 0-d value fills the tangent with its tangent
        filled = fusegrad.zeros(3, dtype=fusegrad.float64)
        filled.fill_(fwAD.make_dual(_t(2.0), _t(0.5)))
        np.testing.assert_array_equal(fwAD.unpack_dual(filled).tangent.numpy(), [0.5] * 3)
        # overwriting a dual with a plain value zeroes its tangent
        whole.copy_(fusegrad.ones(3, dtype=fusegrad.float64))
        np.testing.assert_array_equal(fwAD.unpack_dual(whole).tangent.numpy(), np.zeros(3))


def test_reverse_over_forward() -> None:
    # the tangent computation is recorded by reverse mode: d/dx of the JVP of sin at x along
    # v is -sin(x) v
    x = fusegrad.tensor(_rand(3), requires_grad=True)
    v = _t(_rand(3, seed=1))
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(fwAD.make_dual(x, v).sin()).tangent
        (g,) = fusegrad.autograd.grad(tangent.sum(), x)
    np.testing.assert_allclose(g.numpy(), -np.sin(x.detach().numpy()) * v.numpy())


def test_forward_over_reverse_gives_hessian_vector_products() -> None:
    # f(x) = sum(exp(x) * x^2 / 2) ... via softmax-free composites; H v against an explicit
    # Hessian from finite differences of the gradient
    def f(x):
        return (x.exp() * x * x).sum() + (x[:-1] * x[1:]).tanh().sum()

    x0, v0 = _rand(4), _rand(4, seed=1)

    def gradient(a):
        x = fusegrad.tensor(a, requires_grad=True)
        return fusegrad.autograd.grad(f(x), x)[0].numpy()

    eps = 1e-6
    expected = (gradient(x0 + eps * v0) - gradient(x0 - eps * v0)) / (2 * eps)
    x = fusegrad.tensor(x0, requires_grad=True)
    with fwAD.dual_level():
        d = fwAD.make_dual(x, _t(v0))
        (g,) = fusegrad.autograd.grad(f(d), x)
        hv = fwAD.unpack_dual(g).tangent
    np.testing.assert_allclose(hv.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_compiled_function_runs_eagerly_inside_a_dual_level() -> None:
    @fusegrad.compile
    def step(x):
        return (x.sin() * 2.0).sum()

    x, t = _t(_rand(3)), _t(_rand(3, seed=1))
    step(x)  # compiled outside the level
    with fwAD.dual_level():
        out = step(fwAD.make_dual(x, t))
        tangent = fwAD.unpack_dual(out).tangent
    np.testing.assert_allclose(tangent.numpy(), (2 * np.cos(x.numpy()) * t.numpy()).sum())


@pytest.mark.compiled_differs(
    "in a compiled region a compiled function is part of it (the test counts recordings)"
)
def test_a_dual_level_inside_a_compiled_function_is_recorded_and_replayed() -> None:
    # JVP rules are ordinary ops: a whole-step compile records them with the forward and
    # replays them for new inputs
    from fusegrad import compiler

    compiler.reset()

    @fusegrad.compile
    def jvp_of_sin(x, v):
        with fwAD.dual_level():
            y = (fwAD.make_dual(x, v).sin() * 2.0).sum()
            return fwAD.unpack_dual(y).tangent

    for seed in range(3):
        x0, v0 = _rand(5, seed=seed), _rand(5, seed=seed + 10)
        out = jvp_of_sin(_t(x0), _t(v0))
        np.testing.assert_allclose(out.numpy(), (2 * np.cos(x0) * v0).sum(), rtol=1e-12)
    assert compiler.counters.step_captures == 1 and compiler.counters.step_runs == 2


def test_compiled_backward_keeps_tangents_inside_a_dual_level() -> None:
    # compiled autograd falls back to the eager engine while a level exists, so forward over
    # reverse sees the tangents (a compiled program would drop them)
    from fusegrad import compiler

    x0, v0 = _rand(5), _rand(5, seed=1)
    x = fusegrad.tensor(x0, requires_grad=True)
    with fwAD.dual_level(), compiler.compiled_autograd():
        d = fwAD.make_dual(x, _t(v0))
        (g,) = fusegrad.autograd.grad((d.exp() * d).sum(), x)  # (x + 1) e^x
        hv = fwAD.unpack_dual(g).tangent
    np.testing.assert_allclose(hv.numpy(), (x0 + 2) * np.exp(x0) * v0, rtol=1e-12)


# ---- custom Functions --------------------------------------------------------------------------


class _Cube(fusegrad.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        ctx.scale = scale
        return fusegrad.tensor(x.numpy() ** 3 * scale)  # leaves the op surface

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x * ctx.scale, None

    @staticmethod
    def jvp(ctx, tx, tscale):
        assert tscale is None  # a Python number has no tangent
        (x,) = ctx.saved_tensors  # what save_for_forward kept
        return tx * 3 * x * x * ctx.scale


class _NoJvp(fusegrad.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def test_custom_function_jvp() -> None:
    x, t = _t(_rand(3)), _t(_rand(3, seed=1))
    with fwAD.dual_level():
        out = _Cube.apply(fwAD.make_dual(x, t), 2.0)
        tangent = fwAD.unpack_dual(out).tangent
        np.testing.assert_allclose(tangent.numpy(), 6 * x.numpy() ** 2 * t.numpy())
        assert fwAD.unpack_dual(_Cube.apply(x, 2.0)).tangent is None  # no dual input: no jvp
        with pytest.raises(
            NotImplementedError,
            match="You must implement the jvp function for "
            "custom autograd.Function to use it with forward mode AD",
        ):
            _NoJvp.apply(fwAD.make_dual(x, t))


# ---- the JVP table -----------------------------------------------------------------------------


def test_every_differentiable_primitive_has_a_jvp_or_is_listed_unsupported() -> None:
    missing = [
        name
        for name, prim in REGISTRY.items()
        if prim.differentiable and name not in JVPS and name not in UNSUPPORTED
    ]
    assert not missing, f"primitives without a JVP rule (add one to autograd/jvps.py): {missing}"
    both = sorted(set(JVPS) & set(UNSUPPORTED))
    assert not both, f"listed unsupported but has a rule: {both}"
    for name in UNSUPPORTED:
        assert REGISTRY[name].differentiable


def test_unsupported_primitive_raises_naming_it() -> None:
    assert "attention" in UNSUPPORTED
    q = _t(_rand(1, 2, 3))
    with fwAD.dual_level():
        d = fwAD.make_dual(q, _t(_rand(1, 2, 3, seed=1)))
        with pytest.raises(NotImplementedError, match="forward AD with attention"):
            registry.apply(REGISTRY["attention"], (d, q, q), {"scale": 1.0, "causal": False})


# ---- PyTorch's example programs, in both libraries ---------------------------------------------


def _mlp(lib, F, x, w1, b1, w2):
    h = F.gelu(x @ w1 + b1)
    h = F.layer_norm(h, (h.shape[-1],))
    return F.log_softmax(h @ w2, dim=-1).sum(dim=0)


def _run(lib, fw, F, program, primals, tangents):
    with fw.dual_level():
        duals = [fw.make_dual(lib.tensor(p), lib.tensor(t)) for p, t in zip(primals, tangents)]
        out = program(lib, F, *duals)
        primal, tangent = fw.unpack_dual(out)
        return primal.detach().numpy(), tangent.detach().numpy()


PROGRAMS = {
    "mlp": (_mlp, [(5, 3), (3, 4), (4,), (4, 2)]),
    "softmax_attention": (
        lambda lib, F, q, k, v: F.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ v,
        [(2, 3, 4), (2, 3, 4), (2, 3, 4)],
    ),
    "inplace_and_views": (
        lambda lib, F, a, b: (lambda c: (c[:, 1:].mul_(b[:, 1:]), c.cumsum(0))[1])(a.clone()),
        [(3, 4), (3, 4)],
    ),
    "reductions": (
        lambda lib, F, a: lib.stack([a.amax(1), a.logsumexp(1), a.prod(1), a.std(1)]),
        [(3, 5)],
    ),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_match_torch_forward_ad(name: str) -> None:
    torch = pytest.importorskip("torch")
    import torch.autograd.forward_ad as tfw

    program, shapes = PROGRAMS[name]
    rng = np.random.default_rng(7)
    primals = [rng.standard_normal(s) for s in shapes]
    tangents = [rng.standard_normal(s) for s in shapes]
    ours = _run(fusegrad, fwAD, FF, program, primals, tangents)
    theirs = _run(torch, tfw, torch.nn.functional, program, primals, tangents)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-9, atol=1e-12)
