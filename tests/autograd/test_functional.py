"""``fusegrad.autograd.functional``: vjp, jvp, jacobian (reverse and forward mode), hessian
(reverse over reverse, forward over reverse), hvp and vhp against central finite differences in
float64 and against ``torch.autograd.functional`` where torch is installed; result structures
(Tensor or tuple), create_graph, strict mode and PyTorch's error messages.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
from fusegrad.autograd import functional as AF

EPS = 1e-6


def _t(a, requires_grad=False):
    return fusegrad.tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# ---- functions (written once, run with either library) ----------------------------------------


def f_single(x):  # (2, 3) -> (3,)
    return (x.sin() * x).sum(0) + x[0].exp()


def f_pair(x, y):  # (3,), (3,) -> ((3,), ())
    return (x * y).tanh(), (x.exp() * y).sum()


def scalar_single(x):  # (2, 2) -> ()
    return (x.exp() * x.sin()).sum() + (x @ x).sum() * 0.5


def scalar_pair(x, y):  # (3,), (2,) -> ()
    return (x.sin().sum() * y.exp()).sum() + (x * x).sum() * (y * y).sum()


FUNCTIONS = {
    "single": (f_single, [(2, 3)]),
    "pair": (f_pair, [(3,), (3,)]),
}
SCALARS = {
    "single": (scalar_single, [(2, 2)]),
    "pair": (scalar_pair, [(3,), (2,)]),
}


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _numeric_jacobian(fn, arrays):
    """J[i][j] of shape out_i.shape + in_j.shape by central differences (numpy arrays)."""
    outs = [o.numpy() for o in _as_tuple(fn(*[_t(a) for a in arrays]))]
    jac = [[np.zeros(o.shape + a.shape) for a in arrays] for o in outs]
    for j, a in enumerate(arrays):
        for k in np.ndindex(a.shape):
            plus = [b.copy() for b in arrays]
            minus = [b.copy() for b in arrays]
            plus[j][k] += EPS
            minus[j][k] -= EPS
            hi = _as_tuple(fn(*[_t(b) for b in plus]))
            lo = _as_tuple(fn(*[_t(b) for b in minus]))
            for i in range(len(outs)):
                jac[i][j][(...,) + k] = (hi[i].numpy() - lo[i].numpy()) / (2 * EPS)
    return jac


def _numeric_hessian(fn, arrays):
    def gradient(*xs):
        xs = [x.detach().requires_grad_() for x in xs]
        return fusegrad.autograd.grad(fn(*xs), xs, allow_unused=True, materialize_grads=True)

    return _numeric_jacobian(gradient, arrays)


def _close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def _inputs(shapes, as_tuple, seed=0):
    arrays = [_rand(*s, seed=seed + i) for i, s in enumerate(shapes)]
    tensors = tuple(_t(a) for a in arrays)
    return arrays, (tensors if as_tuple else tensors[0])


# ---- jacobian ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"vectorize": True}, {"vectorize": True, "strategy": "forward-mode"}],
    ids=["reverse", "reverse-vectorize", "forward"],
)
def test_jacobian_matches_finite_differences(name, kwargs) -> None:
    fn, shapes = FUNCTIONS[name]
    arrays, inputs = _inputs(shapes, as_tuple=len(shapes) > 1)
    jac = AF.jacobian(fn, inputs, **kwargs)
    expected = _numeric_jacobian(fn, arrays)
    if name == "single":  # one input, one output: a Tensor
        assert isinstance(jac, fusegrad.Tensor)
        assert tuple(jac.shape) == (3, 2, 3)
        _close(jac.numpy(), expected[0][0])
    else:  # a tuple of outputs, a tuple of inputs: nested tuples
        assert isinstance(jac, tuple) and all(isinstance(row, tuple) for row in jac)
        for i in range(2):
            for j in range(2):
                _close(jac[i][j].numpy(), expected[i][j])
        assert tuple(jac[1][0].shape) == (3,)  # a 0-d output's block has the input's shape
    for block in _as_tuple(jac) if name == "single" else [b for row in jac for b in row]:
        assert not block.requires_grad


def test_jacobian_structures_single_input_tuple_output() -> None:
    x = _t(_rand(3))
    jac = AF.jacobian(lambda x: (x * 2.0, x.sum()), x)
    assert isinstance(jac, tuple) and len(jac) == 2
    _close(jac[0].numpy(), 2 * np.eye(3))
    _close(jac[1].numpy(), np.ones(3))
    jac = AF.jacobian(lambda x, y: x * y, (x, x))
    assert isinstance(jac, tuple) and len(jac) == 2 and isinstance(jac[0], fusegrad.Tensor)


def test_jacobian_independent_output_gives_zeros_or_strict_error() -> None:
    x, y = _t(_rand(2)), _t(_rand(3))
    jac = AF.jacobian(lambda x, y: x * 2.0, (x, y))
    _close(jac[1].numpy(), np.zeros((2, 3)))
    with pytest.raises(
        RuntimeError,
        match="Output 0 of the user-provided function is "
        "independent of input 1. This is not allowed in strict mode.",
    ):
        AF.jacobian(lambda x, y: x * 2.0, (x, y), strict=True)
    with pytest.raises(
        RuntimeError, match="Output 0 of the user-provided function does not require gradients"
    ):
        AF.jacobian(lambda x: fusegrad.ones(2), x, strict=True)


def test_jacobian_create_graph_is_differentiable() -> None:
    x = _t(_rand(3), requires_grad=True)
    jac = AF.jacobian(lambda x: x.exp() * x, x, create_graph=True)
    assert jac.requires_grad
    (g,) = fusegrad.autograd.grad(jac.sum(), x)
    a = x.detach().numpy()
    _close(g.numpy(), np.exp(a) * (a + 2))  # d/dx of the diagonal (x + 1) e^x


def test_jacobian_option_errors() -> None:
    x = _t(_rand(2))
    with pytest.raises(AssertionError, match='Expected strategy to be either "forward-mode" or'):
        AF.jacobian(f_single, x, strategy="sideways")
    with pytest.raises(NotImplementedError, match="only implemented for `vectorize=True`"):
        AF.jacobian(f_single, x, strategy="forward-mode")
    with pytest.raises(NotImplementedError, match="`create_graph=True` and "):
        AF.jacobian(f_single, x, create_graph=True, vectorize=True, strategy="forward-mode")
    with pytest.raises(RuntimeError, match="`strict=True` and "):
        AF.jacobian(f_single, x, strict=True, vectorize=True, strategy="forward-mode")
    with pytest.raises(RuntimeError, match="`strict=True` and `vectorized=True` are not"):
        AF.jacobian(lambda x: x * 2.0, x, strict=True, vectorize=True)
    with pytest.raises(
        TypeError,
        match="The inputs given to jacobian must be either a Tensor or "
        "a tuple of Tensors but the value at index 1 has type <class 'int'>",
    ):
        AF.jacobian(lambda x, y: x, (x, 3))
    with pytest.raises(
        TypeError,
        match="outputs of the user-provided function given to "
        "jacobian must be either a Tensor or a tuple of Tensors but the given",
    ):
        AF.jacobian(lambda x: [x], x)


# ---- hessian -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCALARS))
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"vectorize": True, "outer_jacobian_strategy": "forward-mode"}],
    ids=["reverse-over-reverse", "forward-over-reverse"],
)
def test_hessian_matches_finite_differences(name, kwargs) -> None:
    fn, shapes = SCALARS[name]
    arrays, inputs = _inputs(shapes, as_tuple=len(shapes) > 1)
    hess = AF.hessian(fn, inputs, **kwargs)
    expected = _numeric_hessian(fn, arrays)
    if name == "single":
        assert tuple(hess.shape) == (2, 2, 2, 2)
        _close(hess.numpy(), expected[0][0])
    else:
        for i in range(2):
            for j in range(2):
                assert tuple(hess[i][j].shape) == shapes[i] + shapes[j]
                _close(hess[i][j].numpy(), expected[i][j])


def test_hessian_errors() -> None:
    x = _t(_rand(3))
    with pytest.raises(
        RuntimeError, match="The function given to hessian should return a single Tensor"
    ):
        AF.hessian(lambda x: (x.sum(), x.sum()), x)
    with pytest.raises(
        RuntimeError,
        match="returned by the function given to hessian should contain a single element",
    ):
        AF.hessian(lambda x: x * x, x)
    with pytest.raises(
        RuntimeError,
        match="jacobian of the user-provided function with "
        "respect to input 0 is independent of the input",
    ):
        AF.hessian(lambda x: (x * 2.0).sum(), x, strict=True)
    linear = AF.hessian(lambda x: (x * 2.0).sum(), x)  # not strict: zeros
    _close(linear.numpy(), np.zeros((3, 3)))


# ---- vjp / jvp / vhp / hvp ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_vjp_and_jvp_match_finite_differences(name) -> None:
    fn, shapes = FUNCTIONS[name]
    single = len(shapes) == 1
    arrays, inputs = _inputs(shapes, as_tuple=not single)
    jac = _numeric_jacobian(fn, arrays)
    outs = _as_tuple(fn(*_as_tuple(inputs)))
    u = [_rand(*tuple(o.shape), seed=10 + i) for i, o in enumerate(outs)]
    v = [_rand(*s, seed=20 + j) for j, s in enumerate(shapes)]
    u_arg = _t(u[0]) if single else tuple(_t(a) for a in u)
    v_arg = _t(v[0]) if single else tuple(_t(a) for a in v)

    out, vj = AF.vjp(fn, inputs, u_arg)
    for j, g in enumerate(_as_tuple(vj)):
        expected = sum(np.tensordot(u[i], jac[i][j], axes=u[i].ndim) for i in range(len(outs)))
        _close(g.numpy(), expected)
    for o, ref in zip(_as_tuple(out), outs):
        _close(o.numpy(), ref.numpy(), rtol=0, atol=0)
        assert not o.requires_grad

    out, jv = AF.jvp(fn, inputs, v_arg)
    assert isinstance(jv, tuple) != single
    for i, t in enumerate(_as_tuple(jv)):
        expected = sum(np.tensordot(jac[i][j], v[j], axes=v[j].ndim) for j in range(len(v)))
        _close(t.numpy(), expected)


@pytest.mark.parametrize("name", sorted(SCALARS))
@pytest.mark.parametrize("which", ["hvp", "vhp"])
def test_hvp_and_vhp_match_finite_differences(name, which) -> None:
    fn, shapes = SCALARS[name]
    single = len(shapes) == 1
    arrays, inputs = _inputs(shapes, as_tuple=not single)
    hess = _numeric_hessian(fn, arrays)
    v = [_rand(*s, seed=30 + j) for j, s in enumerate(shapes)]
    v_arg = _t(v[0]) if single else tuple(_t(a) for a in v)
    out, result = getattr(AF, which)(fn, inputs, v_arg)
    assert out.ndim == 0
    _close(out.numpy(), fn(*[_t(a) for a in arrays]).numpy(), rtol=0, atol=0)
    for i, r in enumerate(_as_tuple(result)):
        expected = sum(np.tensordot(hess[i][j], v[j], axes=v[j].ndim) for j in range(len(v)))
        _close(r.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_v_none_and_v_errors() -> None:
    x = _t([0.5])
    _, g = AF.vjp(lambda x: (x * x).sum(), x)  # one-element output: v may be omitted
    _close(g.numpy(), [1.0])
    _, t = AF.jvp(lambda x: x.exp(), x)  # one-element input
    _close(t.numpy(), np.exp([0.5]))
    y = _t(_rand(3))
    with pytest.raises(
        RuntimeError,
        match="The vector v can only be None if the user-provided "
        "function returns a single Tensor with a single element.",
    ):
        AF.vjp(lambda y: y * 2.0, y)
    with pytest.raises(
        RuntimeError,
        match="The vector v can only be None if the input to the "
        "user-provided function is a single Tensor with a single element.",
    ):
        AF.jvp(lambda y: y * 2.0, y)
    with pytest.raises(
        RuntimeError,
        match=r"v has invalid size: should be fusegrad.Size\(\[3\]\) "
        r"but got fusegrad.Size\(\[2\]\)",
    ):
        AF.vjp(lambda y: y * 2.0, y, _t([1.0, 2.0]))
    with pytest.raises(RuntimeError, match=r"Entry 1 in v has invalid size"):
        AF.jvp(lambda a, b: a * b, (y, y), (y, _t([1.0])))
    with pytest.raises(RuntimeError, match="v is a tuple of invalid length: should be 2 but got 1"):
        AF.jvp(lambda a, b: a * b, (y, y), (y,))
    with pytest.raises(RuntimeError, match="The given v should contain a single Tensor."):
        AF.vjp(lambda y: y * 2.0, y, (y, y))
    with pytest.raises(
        RuntimeError, match="The function given to vhp should return a single Tensor"
    ):
        AF.vhp(lambda y: (y.sum(),), y, y)
    with pytest.raises(
        RuntimeError, match="returned by the function given to hvp should contain a single element"
    ):
        AF.hvp(lambda y: y, y, y)


def test_strict_mode_errors() -> None:
    x, y = _t(_rand(2)), _t(_rand(2))
    with pytest.raises(
        RuntimeError,
        match="The output of the user-provided function is "
        "independent of input 1. This is not allowed in strict mode.",
    ):
        AF.vjp(lambda x, y: x * 2.0, (x, y), _t(_rand(2)), strict=True)
    _, g = AF.vjp(lambda x, y: x * 2.0, (x, y), _t([1.0, 1.0]))  # not strict: zeros
    _close(g[1].numpy(), [0.0, 0.0])
    with pytest.raises(RuntimeError, match="does not require gradients"):
        AF.jvp(lambda x: fusegrad.ones(2), x, x, strict=True)
    with pytest.raises(
        RuntimeError,
        match="The jacobian of the user-provided function is "
        "independent of input 0. This is not allowed in strict mode when "
        "create_graph=True.",
    ):
        AF.vjp(lambda x: x * 2.0, x, x, create_graph=True, strict=True)


def test_create_graph_results_stay_differentiable() -> None:
    x = _t(_rand(3), requires_grad=True)
    v = _t(_rand(3, seed=1))
    _, hv = AF.hvp(lambda x: (x**3).sum(), x, v, create_graph=True)
    assert hv.requires_grad
    (g,) = fusegrad.autograd.grad(hv.sum(), x)  # d/dx sum(6 x v) = 6 v
    _close(g.numpy(), 6 * v.numpy())
    out, jv = AF.jvp(lambda x: x.sin(), x, v, create_graph=True)
    assert out.requires_grad and jv.requires_grad
    (g,) = fusegrad.autograd.grad(jv.sum(), x)
    _close(g.numpy(), -np.sin(x.detach().numpy()) * v.numpy())
    _, vj = AF.vjp(lambda x: x.sin(), x, v)  # without create_graph: detached
    assert not vj.requires_grad


class _TimesThree(fusegrad.autograd.Function):
    """No ``jvp``: forward AD cannot run it, so ``functional.jvp`` uses the double backward."""

    @staticmethod
    def forward(ctx, x):
        return x * 3.0

    @staticmethod
    def backward(ctx, g):
        return g * 3.0


class _TimesThreeWithJvp(_TimesThree):
    calls: list = []

    @staticmethod
    def jvp(ctx, t):
        _TimesThreeWithJvp.calls.append("jvp")
        return t * 3.0


def test_jvp_runs_forward_mode_unless_strict() -> None:
    x, v = _t(_rand(4)), _t(_rand(4, seed=1))
    _TimesThreeWithJvp.calls.clear()
    _, jv = AF.jvp(_TimesThreeWithJvp.apply, x, v)
    assert _TimesThreeWithJvp.calls == ["jvp"]
    _close(jv.numpy(), 3.0 * v.numpy(), rtol=1e-12, atol=0)
    AF.jvp(_TimesThreeWithJvp.apply, x, v, strict=True)
    assert _TimesThreeWithJvp.calls == ["jvp"]  # the double backward uses backward only

    # hvp: forward over reverse unless strict; the same values
    def cube(x):
        return (_TimesThreeWithJvp.apply(x) ** 3).sum()

    expected = 6.0 * 27.0 * x.numpy() * v.numpy()  # H of sum((3 x)^3) is diag(162 x)
    _close(AF.hvp(cube, x, v)[1].numpy(), expected, rtol=1e-12, atol=0)
    assert _TimesThreeWithJvp.calls == ["jvp", "jvp"]
    _close(AF.hvp(cube, x, v, strict=True)[1].numpy(), expected, rtol=1e-12, atol=0)
    assert _TimesThreeWithJvp.calls == ["jvp", "jvp"]
    _close(
        AF.hvp(lambda x: (_TimesThree.apply(x) ** 3).sum(), x, v)[1].numpy(),
        expected,
        rtol=1e-12,
        atol=0,
    )  # no jvp: the double backward


def test_jvp_forward_mode_and_its_double_backward_fallbacks_agree() -> None:
    from fusegrad.autograd import forward_ad as fwAD

    x, v = _t(_rand(4)), _t(_rand(4, seed=1))
    expected = np.cos(x.numpy()) * v.numpy() * 3.0

    def fn(x):
        return _TimesThree.apply(x.sin())

    def plain(x):
        return x.sin() * 3.0

    _close(AF.jvp(plain, x, v)[1].numpy(), expected, rtol=1e-12, atol=0)  # forward AD
    _close(AF.jvp(plain, x, v, strict=True)[1].numpy(), expected, rtol=1e-12, atol=0)
    _close(AF.jvp(fn, x, v)[1].numpy(), expected, rtol=1e-12, atol=0)  # custom Function
    with fwAD.dual_level():  # levels do not nest: double backward
        _close(AF.jvp(plain, x, v)[1].numpy(), expected, rtol=1e-12, atol=0)


def test_jvp_create_graph_is_differentiable_in_v() -> None:
    x = _t(_rand(3), requires_grad=True)
    v = _t(_rand(3, seed=1), requires_grad=True)
    _, jv = AF.jvp(lambda x: x.sin(), x, v, create_graph=True)  # cos(x) v
    gx, gv = fusegrad.autograd.grad(jv.sum(), (x, v))
    _close(gv.numpy(), np.cos(x.detach().numpy()))
    _close(gx.numpy(), -np.sin(x.detach().numpy()) * v.detach().numpy())


# ---- against torch.autograd.functional ---------------------------------------------------------


def _torch_args(torch, value):
    if isinstance(value, tuple):
        return tuple(torch.tensor(v.numpy()) for v in value)
    return torch.tensor(value.numpy())


def _compare(ours, theirs) -> None:
    if isinstance(theirs, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _compare(a, b)
        return
    assert tuple(ours.shape) == tuple(theirs.shape)
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "api,fn,shapes,with_v",
    [
        ("jacobian", f_single, [(2, 3)], False),
        ("jacobian", f_pair, [(3,), (3,)], False),
        ("hessian", scalar_single, [(2, 2)], False),
        ("hessian", scalar_pair, [(3,), (2,)], False),
        ("vjp", f_pair, [(3,), (3,)], "out"),
        ("jvp", f_pair, [(3,), (3,)], "in"),
        ("hvp", scalar_pair, [(3,), (2,)], "in"),
        ("vhp", scalar_single, [(2, 2)], "in"),
    ],
)
def test_matches_torch_functional(api, fn, shapes, with_v) -> None:
    torch = pytest.importorskip("torch")
    import torch.autograd.functional as TF

    _, inputs = _inputs(shapes, as_tuple=len(shapes) > 1)
    args, t_args = [inputs], [_torch_args(torch, inputs)]
    if with_v:
        ref = _as_tuple(fn(*_as_tuple(inputs))) if with_v == "out" else _as_tuple(inputs)
        v = tuple(_t(_rand(*tuple(r.shape), seed=40 + i)) for i, r in enumerate(ref))
        v = v if len(v) > 1 else v[0]
        args.append(v)
        t_args.append(_torch_args(torch, v))
    _compare(getattr(AF, api)(fn, *args), getattr(TF, api)(fn, *t_args))
