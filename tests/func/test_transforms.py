"""``fusegrad.func``'s differentiating transforms and module helpers against ``torch.func``
(values to 1e-10 in float64) and against loops: grad / grad_and_value (argnums, has_aux,
pytrees, nesting without perturbation confusion, composition with ordinary autograd), vjp,
jvp, linearize, jacrev / jacfwd (several inputs and outputs, chunk_size), hessian,
functional_call, stack_module_state, per-sample gradients and ensembles, and the helpers."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as Fn
from fusegrad import func

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(11)


def _pair(*shape: int) -> tuple:
    a = RNG.standard_normal(shape)
    return fg.tensor(a), torch.tensor(a)


def _close(ours, theirs, rtol: float = 1e-10) -> None:  # type: ignore[no-untyped-def]
    if isinstance(ours, (tuple, list)):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _close(a, b, rtol)
    elif isinstance(ours, dict):
        assert set(ours) == set(theirs)
        for k in ours:
            _close(ours[k], theirs[k], rtol)
    else:
        np.testing.assert_allclose(
            ours.detach().numpy(), theirs.detach().numpy(), rtol=rtol, atol=1e-12
        )


def f_two(lib, x, y):  # type: ignore[no-untyped-def]
    return ((x.sin() * y).sum() + (x * x).sum() * y.cos().sum()).tanh()


def test_grad_argnums_and_aux() -> None:
    (x, tx), (y, ty) = _pair(3), _pair(3)
    _close(
        func.grad(lambda a, b: f_two(fg, a, b))(x, y),
        torch.func.grad(lambda a, b: f_two(torch, a, b))(tx, ty),
    )
    _close(
        func.grad(lambda a, b: f_two(fg, a, b), argnums=(0, 1))(x, y),
        torch.func.grad(lambda a, b: f_two(torch, a, b), argnums=(0, 1))(tx, ty),
    )
    _close(
        func.grad(lambda a, b: f_two(fg, a, b), argnums=-1)(x, y),
        torch.func.grad(lambda a, b: f_two(torch, a, b), argnums=-1)(tx, ty),
    )
    g, aux = func.grad(lambda a: ((a * a).sum(), a.mean()), has_aux=True)(x)
    np.testing.assert_allclose(g.numpy(), 2 * x.numpy())
    np.testing.assert_allclose(aux.numpy(), x.numpy().mean())
    gs, (value, aux) = func.grad_and_value(lambda a: ((a * a).sum(), {"m": a.max()}), has_aux=True)(
        x
    )
    np.testing.assert_allclose(value.numpy(), (x.numpy() ** 2).sum())
    assert not value.requires_grad and set(aux) == {"m"}
    # pytrees of inputs, and an input the output does not use (its gradient is zeros)
    tree = {"w": x, "b": (y, fg.zeros(2))}
    g = func.grad(lambda p: (p["w"] * p["b"][0]).sum())(tree)
    np.testing.assert_allclose(g["w"].numpy(), y.numpy())
    np.testing.assert_allclose(g["b"][0].numpy(), x.numpy())
    np.testing.assert_array_equal(g["b"][1].numpy(), np.zeros(2))


def test_grad_nests_without_perturbation_confusion() -> None:
    x, tx = _pair(3)
    c = fg.tensor(2.0, dtype=fg.float64)
    # d/dc [ d/dy (c * y)|_{y=c} ] = d/dc c = 1 (not 2)
    assert func.grad(lambda a: func.grad(lambda b: a * b)(a))(c).item() == 1.0
    second = func.grad(lambda a: func.grad(lambda b: (b.sin() * b).sum())(a).sum())(x)
    tsecond = torch.func.grad(lambda a: torch.func.grad(lambda b: (b.sin() * b).sum())(a).sum())(tx)
    _close(second, tsecond)
    third = func.grad(func.grad(func.grad(lambda a: a.sin() * a.exp())))(c)
    t3 = torch.func.grad(torch.func.grad(torch.func.grad(lambda a: a.sin() * a.exp())))(
        torch.tensor(2.0, dtype=torch.float64)
    )
    _close(third, t3)


def test_grad_composes_with_autograd() -> None:
    """An input that requires grad outside: the gradient ``grad`` returns is differentiable
    with respect to it (a gradient penalty)."""
    a = RNG.standard_normal(4)
    x = fg.tensor(a, requires_grad=True)
    tx = torch.tensor(a, requires_grad=True)
    g = func.grad(lambda v: (v.sin() * v).sum())(x)
    tg = torch.func.grad(lambda v: (v.sin() * v).sum())(tx)
    assert g.requires_grad
    (gg,) = fg.autograd.grad((g * g).sum(), x)
    (tgg,) = torch.autograd.grad((tg * tg).sum(), tx)
    _close(gg, tgg)


def test_grad_errors() -> None:
    x = fg.ones(3)
    with pytest.raises(RuntimeError, match="scalar Tensor"):
        func.grad(lambda a: a * 2)(x)
    with pytest.raises(RuntimeError, match="argnums"):
        func.grad(lambda a: a.sum(), argnums=2)(x)
    with pytest.raises(RuntimeError, match=r"\(output, aux\)"):
        func.grad(lambda a: a.sum(), has_aux=True)(x)
    with pytest.raises(RuntimeError, match="floating point"):
        func.grad(lambda a: a.sum())(fg.ones(3, dtype=fg.int64))


def test_vjp_jvp_linearize() -> None:
    (x, tx), (y, ty) = _pair(3), _pair(3)

    def two(lib, a, b):  # type: ignore[no-untyped-def]
        return a.sin() * b, (a * b).sum()

    out, fn = func.vjp(lambda a, b: two(fg, a, b), x, y)
    tout, tfn = torch.func.vjp(lambda a, b: two(torch, a, b), tx, ty)
    _close(out, tout)
    (c1, tc1), (c2, tc2) = _pair(3), _pair()
    _close(fn((c1, c2)), tfn((tc1, tc2)))
    _close(fn((c1 * 2, c2)), tfn((tc1 * 2, tc2)))  # vjp_fn can be called again
    out, fn, aux = func.vjp(lambda a: (a.exp(), a.sum()), x, has_aux=True)
    np.testing.assert_allclose(fn(fg.ones(3))[0].numpy(), np.exp(x.numpy()))
    (t1, tt1), (t2, tt2) = _pair(3), _pair(3)
    got = func.jvp(lambda a, b: two(fg, a, b), (x, y), (t1, t2))
    want = torch.func.jvp(lambda a, b: two(torch, a, b), (tx, ty), (tt1, tt2))
    _close(got, want)
    out, jvp_fn = func.linearize(lambda a: (a.sin() * a).sum(), x)
    tout, tjvp_fn = torch.func.linearize(lambda a: (a.sin() * a).sum(), tx)
    _close(out, tout)
    _close(jvp_fn(t1), tjvp_fn(tt1))
    with pytest.raises(RuntimeError, match="primals to be a tuple"):
        func.jvp(lambda a: a, x, t1)


def test_jacobians_and_hessian() -> None:
    (x, tx), (y, ty) = _pair(4), _pair(3)

    def fn(lib, a, b):  # type: ignore[no-untyped-def]
        return (a[:3] * b.exp()).tanh(), (a.sum() * b).sin()

    for ours, theirs in [(func.jacrev, torch.func.jacrev), (func.jacfwd, torch.func.jacfwd)]:
        _close(ours(lambda a, b: fn(fg, a, b))(x, y), theirs(lambda a, b: fn(torch, a, b))(tx, ty))
        _close(
            ours(lambda a, b: fn(fg, a, b), argnums=(0, 1))(x, y),
            theirs(lambda a, b: fn(torch, a, b), argnums=(0, 1))(tx, ty),
        )
    _close(
        func.jacrev(lambda a: a.outer(a).sin(), chunk_size=3)(x),
        torch.func.jacrev(lambda a: a.outer(a).sin())(tx),
    )
    m, tm = _pair(2, 3)
    _close(
        func.jacrev(lambda w: (w @ x[:3]).exp())(m),
        torch.func.jacrev(lambda w: (w @ tx[:3]).exp())(tm),
    )

    def scalar(lib, a, b):  # type: ignore[no-untyped-def]
        return (a[:3].sin() * b * b).sum() + (a * a).prod()

    _close(
        func.hessian(lambda a, b: scalar(fg, a, b))(x, y),
        torch.func.hessian(lambda a, b: scalar(torch, a, b))(tx, ty),
    )
    _close(
        func.hessian(lambda a, b: scalar(fg, a, b), argnums=(0, 1))(x, y),
        torch.func.hessian(lambda a, b: scalar(torch, a, b), argnums=(0, 1))(tx, ty),
    )
    # every composition of the two modes gives the same Hessian
    h = torch.func.hessian(lambda a: scalar(torch, a, ty))(tx)
    for outer in (func.jacrev, func.jacfwd):
        for inner in (func.jacrev, func.jacfwd):
            _close(outer(inner(lambda a: scalar(fg, a, y)))(x), h)
    j, aux = func.jacrev(lambda a: (a.sin(), a.sum()), has_aux=True)(x)
    np.testing.assert_allclose(np.diag(j.numpy()), np.cos(x.numpy()))


@pytest.mark.parametrize("outer", ["jacfwd", "jacrev"])
@pytest.mark.parametrize("inner", ["jacfwd", "jacrev"])
@pytest.mark.parametrize("argnums", [(1, 0), (0, 1)])
@pytest.mark.parametrize("scalar", [True, False])
def test_mixed_partials_with_different_argnums(outer, inner, argnums, scalar) -> None:  # type: ignore[no-untyped-def]
    # the outer transform's tangents (or rows) reach the inner one through an argument it does
    # not differentiate: ``jacfwd(jacrev(g, argnums=1), argnums=0)`` gave every column of the
    # mixed partials the first one's values
    (x, tx), (y, ty) = _pair(3), _pair(4)

    def g(a, b):  # type: ignore[no-untyped-def]
        if scalar:
            return (a.sin()[:, None] * b.exp()).sum()
        return a[:, None] * b.tanh() * a.sum()

    inner_num, outer_num = argnums
    ours = getattr(func, outer)(getattr(func, inner)(g, argnums=inner_num), argnums=outer_num)
    theirs = getattr(torch.func, outer)(
        getattr(torch.func, inner)(g, argnums=inner_num), argnums=outer_num
    )
    _close(ours(x, y), theirs(tx, ty))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        return self.fc2(Fn.relu(self.fc1(x)))


def _torch_mlp(model: MLP) -> object:
    t = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).double()
    with torch.no_grad():
        for (_, p), q in zip(model.named_parameters(), t.parameters()):
            q.copy_(torch.tensor(p.detach().numpy()))
    return t


def test_per_sample_gradients_of_an_mlp() -> None:
    """The pattern ``vmap(grad(loss), in_dims=(None, 0, 0))`` over ``functional_call``: equal
    to a loop over samples and to torch.func."""
    fg.manual_seed(0)
    model = MLP().double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = fg.tensor(RNG.standard_normal((6, 5)))
    y = fg.tensor(RNG.integers(0, 3, 6))

    def loss(p, xi, yi):  # type: ignore[no-untyped-def]
        out = func.functional_call(model, p, (xi.unsqueeze(0),))
        return Fn.cross_entropy(out, yi.unsqueeze(0))

    per_sample = func.vmap(func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    for i in range(6):
        single = func.grad(loss)(params, x[i], y[i])
        for k in params:
            np.testing.assert_allclose(per_sample[k][i].numpy(), single[k].numpy(), rtol=1e-12)
    tmodel = _torch_mlp(model)
    tparams = {k: v.detach() for k, v in tmodel.named_parameters()}
    names = dict(zip(params, tparams))

    def tloss(p, xi, yi):  # type: ignore[no-untyped-def]
        out = torch.func.functional_call(tmodel, p, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, yi.unsqueeze(0))

    want = torch.func.vmap(torch.func.grad(tloss), in_dims=(None, 0, 0))(
        tparams, torch.tensor(x.numpy()), torch.tensor(y.numpy())
    )
    for k, tk in names.items():
        _close(per_sample[k], want[tk])
    # the model's own parameters are untouched and unused
    assert all(p.grad is None for p in model.parameters())


def test_functional_call_and_ensembles() -> None:
    fg.manual_seed(1)
    models = [MLP().double() for _ in range(3)]
    x = fg.tensor(RNG.standard_normal((4, 5)))
    params, buffers = func.stack_module_state(models)
    assert tuple(params["fc1.weight"].shape) == (3, 8, 5) and buffers == {}
    assert params["fc1.weight"].requires_grad and params["fc1.weight"].is_leaf
    base = MLP().double()
    out = func.vmap(lambda p, b: func.functional_call(base, (p, b), (x,)), in_dims=(0, 0))(
        params, buffers
    )
    for i, m in enumerate(models):
        np.testing.assert_allclose(out[i].detach().numpy(), m(x).detach().numpy(), rtol=1e-12)
    # the parameters are put back, also after an error
    before = base.fc1.weight
    with pytest.raises(ValueError):
        func.functional_call(base, {"fc1.weight": fg.zeros(8, 5)}, (fg.zeros(2, 7),))
    assert base.fc1.weight is before
    with pytest.raises(RuntimeError, match="missing key"):
        func.functional_call(base, {"fc1.weight": fg.zeros(8, 5)}, (x,), strict=True)
    # tied weights follow the given tensor
    tied = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False))
    tied[1].weight = tied[0].weight
    w = fg.eye(3)
    np.testing.assert_allclose(
        func.functional_call(tied, {"0.weight": w}, (fg.ones(1, 3),)).detach().numpy(), [[1, 1, 1]]
    )


def test_helpers() -> None:
    x = fg.tensor(RNG.standard_normal((2, 6, 3)))
    want = torch.func.rearrange if hasattr(torch.func, "rearrange") else None
    out = func.rearrange(x, "b (h w) c -> b h w c", h=2)
    np.testing.assert_array_equal(out.numpy(), x.numpy().reshape(2, 2, 3, 3))
    out = func.rearrange(x, "b n c -> (b c) n")
    np.testing.assert_array_equal(out.numpy(), x.numpy().transpose(0, 2, 1).reshape(6, 6))
    out = func.rearrange(x, "b ... -> ... b 1")
    np.testing.assert_array_equal(out.numpy(), np.moveaxis(x.numpy(), 0, -1)[..., None])
    if want is not None:
        got = func.rearrange(x, "b (h w) c -> c b w h", w=3)
        np.testing.assert_array_equal(
            got.numpy(), want(torch.tensor(x.numpy()), "b (h w) c -> c b w h", w=3).numpy()
        )
    seen = []
    func.vmap(lambda t: seen.append(func.debug_unwrap(t)) or t)(x)
    assert tuple(seen[0].shape) == (2, 6, 3)
    assert func.functionalize(lambda t: t.add_(1))(x.clone()).shape == x.shape
    bn = nn.Sequential(nn.BatchNorm1d(3))
    func.replace_all_batch_norm_modules_(bn)
    assert bn[0].running_mean is None and not bn[0].track_running_stats
    assert set(func.__all__) >= {n for n in dir(torch.func) if not n.startswith("_")}
