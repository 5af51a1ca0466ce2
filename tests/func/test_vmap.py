"""``fusegrad.func.vmap``: against a loop over samples and against ``torch.func.vmap`` --
in_dims/out_dims (ints, None, nested), nesting, chunk_size, randomness, the batching rules of
the primitives (elementwise with broadcasting, reductions, movement, indexing, matmul) and the
sample-by-sample fallback, in-place ops, autograd through and inside ``vmap``, Jacobians under
one and two levels of ``vmap`` (``vmap(jacrev(f))``: a backward of an outer level with output
gradients of an inner one; against closed forms, torch.func and, over shapes, hypothesis), and
the errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegrad as fg
import fusegrad.nn.functional as Fn
from fusegrad.func import vmap

RNG = np.random.default_rng(7)


def _t(*shape: int, requires_grad: bool = False) -> fg.Tensor:
    return fg.tensor(RNG.standard_normal(shape), requires_grad=requires_grad)


def _looped(fn, args: tuple, in_dims: tuple) -> np.ndarray:  # type: ignore[no-untyped-def]
    size = next(a.shape[d] for a, d in zip(args, in_dims) if d is not None)
    outs = []
    for b in range(size):
        sample = [a if d is None else a.select(d, b) for a, d in zip(args, in_dims)]
        outs.append(fn(*sample).detach().numpy())
    return np.stack(outs)


# functions of one sample, with the inputs and in_dims to batch them over
CASES = [
    ("elementwise", lambda x, y: (x * y).exp() - y.sin(), ((4, 3), (4, 3)), (0, 0)),
    ("broadcast_unbatched", lambda x, y: x + y, ((4, 3), (2, 3)), (0, None)),
    ("broadcast_rank", lambda x, y: x * y, ((3,), (4, 2, 3)), (None, 0)),
    ("in_dim_1", lambda x, y: x - y, ((3, 5), (5, 3)), (1, 0)),
    ("negative_in_dim", lambda x: x.tanh(), ((3, 5),), (-1,)),
    ("sum_dims", lambda x: (x.sum(0), x.sum(), x.sum((0, 1), keepdim=True)), ((4, 2, 3),), (0,)),
    ("mean_var", lambda x: (x.mean(-1), x.var(0), x.std()), ((4, 3, 5),), (0,)),
    (
        "amax_argmax",
        lambda x: (x.amax(1), x.argmax(), x.argmax(0, keepdim=True)),
        ((4, 3, 5),),
        (0,),
    ),
    ("softmax", lambda x: (x.softmax(-1), x.log_softmax(0), x.logsumexp(1)), ((4, 3, 5),), (0,)),
    ("reshape_permute", lambda x: x.reshape(5, 3).t().flip(0), ((4, 3, 5),), (0,)),
    ("expand_cat", lambda x, y: fg.cat([x.expand(2, 3), y], 0), ((4, 3), (2, 3)), (0, None)),
    ("stack_unbind", lambda x: fg.stack(x.unbind(1), 0), ((4, 3, 2),), (0,)),
    ("slicing", lambda x: x[1:, ::2] + x[0, ::2], ((4, 3, 5),), (0,)),
    ("pad_diagonal", lambda x: Fn.pad(x, (1, 2)).diagonal(), ((4, 3, 3),), (0,)),
    ("cumsum_sort", lambda x: (x.cumsum(1), x.sort(-1)[0], x.topk(2)[1]), ((4, 3, 5),), (0,)),
    ("matmul_both", lambda a, b: a @ b, ((4, 3, 5), (4, 5, 2)), (0, 0)),
    ("matmul_weight", lambda a, w: a @ w, ((4, 5), (5, 2)), (0, None)),
    ("matmul_left", lambda w, b: w @ b, ((2, 3, 5), (4, 5)), (None, 0)),
    ("matvec", lambda a, v: a @ v, ((4, 3, 5), (4, 5)), (0, 0)),
    ("bmm_rank", lambda a, b: a @ b, ((4, 2, 3, 5), (5, 2)), (0, None)),
    ("linear", lambda x, w, b: Fn.linear(x, w, b), ((4, 3), (2, 3), (2,)), (0, None, None)),
    ("index_batched", lambda x, i: x[i], ((4, 5, 3), (4, 2)), (0, 0)),
    ("index_unbatched", lambda x, i: x[:, i], ((4, 3, 5), (2,)), (0, None)),
    ("index_data_unbatched", lambda x, i: x[i], ((5, 3), (4, 2)), (None, 0)),
    ("gather", lambda x, i: x.gather(1, i), ((4, 3, 5), (4, 3, 2)), (0, 0)),
    ("cross_entropy", lambda x, y: Fn.cross_entropy(x, y), ((4, 3, 5), (4, 3)), (0, 0)),
    ("conv2d", lambda x, w: Fn.conv2d(x, w, padding=1), ((4, 1, 2, 5, 5), (3, 2, 3, 3)), (0, None)),
    ("where_clamp", lambda x: fg.where(x > 0, x, x * 0.1).clamp(-0.5, 0.5), ((4, 6),), (0,)),
    ("layer_norm", lambda x: Fn.layer_norm(x, (5,)), ((4, 3, 5),), (0,)),
    ("special", lambda x: fg.special.i0e(x) + fg.special.ndtr(x), ((4, 3),), (0,)),
]


def _inputs(shapes: tuple, name: str) -> tuple:
    out = []
    for k, s in enumerate(shapes):
        if name.startswith("index") and k == 1:
            out.append(fg.tensor(RNG.integers(0, 3 if name == "index_unbatched" else 5, s)))
        elif name == "gather" and k == 1:
            out.append(fg.tensor(RNG.integers(0, 5, s)))
        elif name == "cross_entropy" and k == 1:
            out.append(fg.tensor(RNG.integers(0, 5, s)))
        else:
            out.append(_t(*s))
    return tuple(out)


@pytest.mark.parametrize("name,fn,shapes,in_dims", CASES, ids=[c[0] for c in CASES])
def test_vmap_equals_a_loop_over_samples(name, fn, shapes, in_dims) -> None:  # type: ignore[no-untyped-def]
    args = _inputs(shapes, name)
    got = vmap(fn, in_dims=in_dims)(*args)
    got = got if isinstance(got, tuple) else (got,)
    for k, out in enumerate(got):
        single = (lambda *a, k=k: fn(*a)[k]) if len(got) > 1 else fn
        want = _looped(single, args, in_dims)
        assert tuple(out.shape) == want.shape
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-12, err_msg=str(k))


@pytest.mark.parametrize("name,fn,shapes,in_dims", CASES[:12], ids=[c[0] for c in CASES[:12]])
def test_vmap_matches_torch(name, fn, shapes, in_dims) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    args = _inputs(shapes, name)
    # the same function in torch: fusegrad's methods have torch's names
    got = vmap(fn, in_dims=in_dims)(*args)
    want = torch.func.vmap(_torch_version(fn), in_dims=in_dims)(
        *[torch.tensor(a.numpy()) for a in args]
    )
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-12)


def _torch_version(fn):  # type: ignore[no-untyped-def]
    """``fn`` with ``fg`` replaced by torch in its globals (the lambdas above use fg.cat ...)."""
    import types

    import torch

    glob = dict(fn.__globals__, fg=torch, Fn=torch.nn.functional)
    return types.FunctionType(fn.__code__, glob, fn.__name__, fn.__defaults__, fn.__closure__)


def test_out_dims_nesting_and_structures() -> None:
    x = _t(4, 3)
    y = _t(3, 4)
    out = vmap(lambda a, b: a[:, None] * b, in_dims=(0, 1), out_dims=1)(x, y)
    assert tuple(out.shape) == (3, 4, 3)
    want = np.stack([x.numpy()[i][:, None] * y.numpy()[:, i] for i in range(4)], 1)
    np.testing.assert_allclose(out.numpy(), want)
    # nested vmap: a pairwise function over two batches
    a, b = _t(4, 3), _t(5, 3)
    pair = vmap(vmap(lambda u, v: (u - v).pow(2).sum(), in_dims=(None, 0)), in_dims=(0, None))
    d = pair(a, b)
    want = ((a.numpy()[:, None] - b.numpy()[None]) ** 2).sum(-1)
    np.testing.assert_allclose(d.numpy(), want, rtol=1e-12)
    # dict and tuple inputs, tuple outputs with their own out_dims, unbatched outputs
    tree = {"w": _t(4, 3), "b": _t(3)}
    fn = vmap(
        lambda p, k: (p["w"] * k + p["b"], p["b"]),
        in_dims=({"w": 0, "b": None}, None),
        out_dims=(0, None),
    )
    o1, o2 = fn(tree, 2.0)
    np.testing.assert_allclose(o1.numpy(), tree["w"].numpy() * 2 + tree["b"].numpy())
    assert o2 is tree["b"]
    # an output that does not depend on the batch is broadcast along it
    c = vmap(lambda u: fg.ones(2))(x)
    assert tuple(c.shape) == (4, 2)


def test_chunk_size_gives_the_same_result() -> None:
    x, w = _t(10, 3), _t(3, 2)
    fn = lambda u, v: (u @ v).sigmoid()  # noqa: E731
    full = vmap(fn, in_dims=(0, None))(x, w)
    for chunk in (1, 3, 4, 10, 20):
        np.testing.assert_allclose(
            vmap(fn, in_dims=(0, None), chunk_size=chunk)(x, w).numpy(), full.numpy()
        )


def test_randomness() -> None:
    x = fg.zeros(5, 3)
    with pytest.raises(RuntimeError, match="randomness error mode"):
        vmap(lambda u: u + fg.randn(3))(x)
    same = vmap(lambda u: u + fg.randn(3), randomness="same")(x)
    assert np.allclose(same.numpy(), same.numpy()[0])
    different = vmap(lambda u: u + fg.rand_like(u), randomness="different")(x)
    assert not np.allclose(different.numpy(), different.numpy()[0])
    assert ((different.numpy() >= 0) & (different.numpy() < 1)).all()
    dropped = vmap(lambda u: Fn.dropout(u + 1, 0.5), randomness="different")(fg.zeros(50, 40))
    rows = dropped.numpy()
    assert set(np.unique(rows)) <= {0.0, 2.0} and not np.allclose(rows, rows[0])
    with pytest.raises(RuntimeError, match="randomness"):
        vmap(lambda u: u, randomness="sometimes")(x)


def test_autograd_through_vmap() -> None:
    """vmap inside ordinary autograd: the batched computation is recorded and differentiable
    (twice), with respect to batched and unbatched inputs."""
    x = _t(4, 3, requires_grad=True)
    w = _t(3, requires_grad=True)
    out = vmap(lambda u, v: (u * v).tanh().sum(), in_dims=(0, None))(x, w)
    gx, gw = fg.autograd.grad(out.sum(), (x, w), create_graph=True)
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x.detach().numpy(), requires_grad=True)
    tw = torch.tensor(w.detach().numpy(), requires_grad=True)
    tout = torch.func.vmap(lambda u, v: (u * v).tanh().sum(), in_dims=(0, None))(tx, tw)
    tgx, tgw = torch.autograd.grad(tout.sum(), (tx, tw), create_graph=True)
    np.testing.assert_allclose(gx.detach().numpy(), tgx.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(gw.detach().numpy(), tgw.detach().numpy(), rtol=1e-12)
    (hw,) = fg.autograd.grad(gw.sum(), w)
    (thw,) = torch.autograd.grad(tgw.sum(), tw)
    np.testing.assert_allclose(hw.numpy(), thw.numpy(), rtol=1e-12)


def test_in_place_ops_under_vmap() -> None:
    x = _t(4, 3)

    def fn(u: fg.Tensor) -> fg.Tensor:
        v = u * 2
        v.add_(1)
        v[0] = 5.0
        return v

    got = vmap(fn)(x)
    want = x.numpy() * 2 + 1
    want[:, 0] = 5.0
    np.testing.assert_allclose(got.numpy(), want)
    y = fg.zeros(3)
    with pytest.raises(RuntimeError, match="inplace arithmetic"):
        vmap(lambda u: y.add_(u))(x)


def test_errors() -> None:
    x = _t(4, 3)
    with pytest.raises(RuntimeError, match="data-dependent control flow"):
        vmap(lambda u: u * 2 if u.sum() > 0 else u)(x)
    with pytest.raises(RuntimeError, match="item"):
        vmap(lambda u: u.sum().item())(x)
    with pytest.raises(ValueError, match="same size in the mapped dimension"):
        vmap(lambda u, v: u + v)(x, _t(5, 3))
    with pytest.raises(ValueError, match="in_dim=2"):
        vmap(lambda u: u, in_dims=2)(x)
    with pytest.raises(ValueError, match="non-Tensor"):
        vmap(lambda u, k: u * k, in_dims=(0, 0))(x, 3.0)
    with pytest.raises(ValueError, match="in_dims is not compatible"):
        vmap(lambda u, v: u + v, in_dims=(0,))(x, x)
    with pytest.raises(ValueError, match="must only return Tensors"):
        vmap(lambda u: 3)(x)
    with pytest.raises(ValueError, match="chunk_size"):
        vmap(lambda u: u, chunk_size=0)


def test_fallback_loop_for_primitives_without_a_rule() -> None:
    """``histc`` and ``searchsorted`` have no batching rule: computed sample by sample."""
    from fusegrad.autograd.batching import RULES

    assert "histc" not in RULES
    x = fg.tensor(RNG.uniform(0, 1, (4, 20)))
    got = vmap(lambda u: fg.histc(u, bins=5, min=0, max=1))(x)
    want = np.stack([np.histogram(r, bins=5, range=(0, 1))[0] for r in x.numpy()])
    np.testing.assert_allclose(got.numpy(), want)
    edges = fg.tensor([0.25, 0.5, 0.75])
    got = vmap(lambda u: fg.searchsorted(edges, u))(x)
    np.testing.assert_array_equal(got.numpy(), np.searchsorted(edges.numpy(), x.numpy()))


def test_views_of_a_batched_scalar() -> None:
    """A sample that is a scalar is a 0-d array (``view`` and forward AD's ``unpack_dual``
    take views of it): ``jacfwd`` of a function with a scalar output under ``vmap``."""
    from fusegrad.func import jacfwd

    x = _t(3, 4)
    np.testing.assert_allclose(
        vmap(lambda u: u.sum().view(()) * 2)(x).numpy(), 2 * x.numpy().sum(1)
    )
    got = vmap(jacfwd(lambda u: (u * u).sum()))(x)
    np.testing.assert_allclose(got.numpy(), 2 * x.numpy(), rtol=1e-12)


def test_top_level_vmap_is_func_vmap() -> None:
    assert fg.vmap is vmap


# ---- Jacobians under vmap: a backward of one level with output gradients of a level inside it


_M = RNG.standard_normal((4, 3))
_W1, _W2 = RNG.standard_normal((4, 5)), RNG.standard_normal((5, 2))


def _softmax_jacobian(x: np.ndarray) -> np.ndarray:
    s = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    return np.diag(s) - np.outer(s, s)


def _mlp_jacobian(x: np.ndarray) -> np.ndarray:
    h = np.tanh(x @ _W1)
    return (_W2.T * (1 - h * h)) @ _W1.T


# functions of one sample x of shape (4,), written for fusegrad and torch alike (``lib``), with
# their Jacobians in numpy
JACOBIAN_CASES = [
    ("sin", lambda lib, x: x.sin(), lambda x: np.diag(np.cos(x))),
    ("matmul", lambda lib, x: x @ lib.tensor(_M), lambda x: _M.T),
    ("sum", lambda lib, x: (x * x).sum(), lambda x: 2 * x),
    ("softmax", lambda lib, x: x.softmax(-1), _softmax_jacobian),
    (
        "mlp",
        lambda lib, x: (x @ lib.tensor(_W1)).tanh() @ lib.tensor(_W2),
        _mlp_jacobian,
    ),
]


def _per_sample(reference, xs: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """``reference`` of every sample along the leading dims of ``xs`` (samples of shape (4,))."""
    flat = xs.reshape(-1, xs.shape[-1])
    out = np.stack([reference(x) for x in flat])
    return out.reshape(*xs.shape[:-1], *out.shape[1:])


@pytest.mark.parametrize("name,fn,jacobian", JACOBIAN_CASES, ids=[c[0] for c in JACOBIAN_CASES])
def test_jacobians_under_vmap_are_each_samples(name, fn, jacobian) -> None:  # type: ignore[no-untyped-def]
    """``jacrev``'s rows are a ``vmap`` inside the user's: its backward runs on the outer
    level's graph with output gradients batched at the inner level, which must keep their own
    batch (each row of every sample's Jacobian was the first row before)."""
    from fusegrad.func import jacfwd, jacrev

    f = lambda x: fn(fg, x)  # noqa: E731
    xs = _t(3, 4)
    want = _per_sample(jacobian, xs.numpy())
    for label, transform in [
        ("vmap(jacrev)", vmap(jacrev(f))),
        ("vmap(jacrev, chunk_size=3)", vmap(jacrev(f, chunk_size=3))),
        ("vmap(jacfwd)", vmap(jacfwd(f))),
    ]:
        np.testing.assert_allclose(
            transform(xs).numpy(), want, rtol=1e-10, atol=1e-12, err_msg=label
        )
    # the batch along another dim, and two levels of vmap around the Jacobian
    got = vmap(jacrev(f), in_dims=1)(xs.t().contiguous())
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    xss = _t(2, 3, 4)
    want2 = _per_sample(jacobian, xss.numpy())
    for label, transform in [
        ("vmap(vmap(jacrev))", vmap(vmap(jacrev(f)))),
        ("vmap(jacrev(vmap))", vmap(jacrev(vmap(f)))),
    ]:
        got = transform(xss)
        if label == "vmap(jacrev(vmap))":  # (the Jacobian of a batch of 3 samples, per sample)
            got = fg.stack([got[:, i, ..., i, :] for i in range(3)], 1)
        np.testing.assert_allclose(got.numpy(), want2, rtol=1e-10, atol=1e-12, err_msg=label)


@pytest.mark.parametrize("name,fn,jacobian", JACOBIAN_CASES, ids=[c[0] for c in JACOBIAN_CASES])
def test_jacobians_under_vmap_match_torch(name, fn, jacobian) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    from fusegrad.func import jacfwd, jacrev

    xs = _t(2, 3, 4)
    txs = torch.tensor(xs.numpy())
    ours_f = lambda x: fn(fg, x)  # noqa: E731
    theirs_f = lambda x: fn(torch, x)  # noqa: E731
    tf = torch.func
    pairs = [
        (vmap(jacrev(ours_f)), tf.vmap(tf.jacrev(theirs_f)), xs[0], txs[0]),
        (
            vmap(jacrev(ours_f, chunk_size=2)),
            tf.vmap(tf.jacrev(theirs_f, chunk_size=2)),
            xs[0],
            txs[0],
        ),
        (vmap(jacfwd(ours_f)), tf.vmap(tf.jacfwd(theirs_f)), xs[0], txs[0]),
        (vmap(vmap(jacrev(ours_f))), tf.vmap(tf.vmap(tf.jacrev(theirs_f))), xs, txs),
        (vmap(jacrev(vmap(ours_f))), tf.vmap(tf.jacrev(tf.vmap(theirs_f))), xs, txs),
        (jacrev(vmap(jacrev(ours_f))), tf.jacrev(tf.vmap(tf.jacrev(theirs_f))), xs[0], txs[0]),
    ]
    for k, (ours, theirs, x, tx) in enumerate(pairs):
        np.testing.assert_allclose(
            ours(x).numpy(), theirs(tx).numpy(), rtol=1e-10, atol=1e-12, err_msg=str(k)
        )


def test_second_order_and_unbatched_arguments_under_vmap() -> None:
    """Reverse over reverse under ``vmap`` (three levels of batch: the user's and two of rows),
    and the Jacobian with respect to an argument that ``vmap`` does not batch."""
    from fusegrad.func import jacrev

    xs = _t(3, 4)
    x = xs.numpy()
    scalar = lambda u: (u.sin() * u).sum()  # noqa: E731
    second = np.stack([np.diag(2 * np.cos(r) - r * np.sin(r)) for r in x])
    got = vmap(jacrev(jacrev(scalar)))(xs)
    np.testing.assert_allclose(got.numpy(), second, rtol=1e-10, atol=1e-12)
    w = _t(4)
    pair = lambda u, v: (u * v).sin()  # noqa: E731
    got_w = vmap(jacrev(pair, argnums=1), in_dims=(0, None))(xs, w)
    want_w = np.stack([np.diag(np.cos(r * w.numpy()) * r) for r in x])
    np.testing.assert_allclose(got_w.numpy(), want_w, rtol=1e-10, atol=1e-12)
    got_x, got_w = vmap(jacrev(pair, argnums=(0, 1)), in_dims=(0, None))(xs, w)
    want_x = np.stack([np.diag(np.cos(r * w.numpy()) * w.numpy()) for r in x])
    np.testing.assert_allclose(got_x.numpy(), want_x, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_w.numpy(), want_w, rtol=1e-10, atol=1e-12)


class _SquareTimes(fg.autograd.Function):
    """x * x * w with a hand-written backward (run at its vmap level, ``_LevelFunction``)."""

    @staticmethod
    def forward(ctx, x: fg.Tensor, w: fg.Tensor) -> fg.Tensor:  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x, w)
        return x * x * w

    @staticmethod
    def backward(ctx, g: fg.Tensor) -> tuple:  # type: ignore[no-untyped-def]
        x, w = ctx.saved_tensors
        return 2 * x * w * g, x * x * g


def test_jacobian_of_a_custom_function_under_vmap() -> None:
    """The Function's backward runs at its level while the rows of ``jacrev`` batch inside it:
    its gradients for a batched and an unbatched input are each sample's."""
    from fusegrad.func import jacrev

    xs, w = _t(3, 4), _t(4)
    f = lambda u, v: _SquareTimes.apply(u.sin(), v)  # noqa: E731
    got_x, got_w = vmap(jacrev(f, argnums=(0, 1)), in_dims=(0, None))(xs, w)
    x, wn = xs.numpy(), w.numpy()
    want_x = np.stack([np.diag(2 * np.sin(r) * np.cos(r) * wn) for r in x])
    want_w = np.stack([np.diag(np.sin(r) ** 2) for r in x])
    np.testing.assert_allclose(got_x.numpy(), want_x, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_w.numpy(), want_w, rtol=1e-10, atol=1e-12)


def _exp_times(lib):  # type: ignore[no-untyped-def]
    """``exp(x) * y`` as a custom Function in PyTorch's functorch style (``setup_context``,
    ``generate_vmap_rule``), for ``lib`` (fusegrad or torch)."""

    class ExpTimes(lib.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x, y):  # type: ignore[no-untyped-def]
            return x.exp() * y

        @staticmethod
        def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
            x, y = inputs
            ctx.save_for_backward(x, output)

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            x, out = ctx.saved_tensors
            return g * out, g * x.exp()

    return ExpTimes


def test_custom_function_under_nested_vmaps() -> None:
    """A Function called under two ``vmap`` levels: its node at the inner level is run by one at
    the outer level (``_LevelFunction`` of a ``_LevelFunction``; setting it on the outer batch
    raised).  Each input batched at either level, at both, or at neither."""
    import fusegrad.func as func

    fn = _exp_times(fg).apply
    x, y = _t(2, 3, 4), _t(2, 3, 4)
    xn, yn = x.numpy(), y.numpy()
    loss = lambda u, v: fn(u, v).sum()  # noqa: E731
    got = vmap(vmap(func.grad(loss, argnums=(0, 1))))(x, y)
    np.testing.assert_allclose(got[0].numpy(), np.exp(xn) * yn, rtol=1e-12)
    np.testing.assert_allclose(got[1].numpy(), np.exp(xn), rtol=1e-12)
    got = vmap(vmap(func.grad(loss, argnums=(0, 1)), in_dims=(0, None)), in_dims=(None, 0))(
        x[0], y[:, 0]
    )
    np.testing.assert_allclose(got[0].numpy(), np.exp(xn[0])[None] * yn[:, 0, None], rtol=1e-12)
    np.testing.assert_allclose(
        got[1].numpy(), np.broadcast_to(np.exp(xn[0])[None], (2, 3, 4)), rtol=1e-12
    )
    jac = vmap(vmap(func.jacrev(fn)))(x, y).numpy()
    want = np.stack([[np.diag(r) for r in m] for m in np.exp(xn) * yn])
    np.testing.assert_allclose(jac, want, rtol=1e-12)
    # and through ordinary autograd around both levels
    xr = x.detach().requires_grad_(True)
    vmap(vmap(fn))(xr, y).sum().backward()
    np.testing.assert_allclose(xr.grad.numpy(), np.exp(xn) * yn, rtol=1e-12)
    torch = pytest.importorskip("torch")
    theirs = _exp_times(torch).apply
    want = torch.func.vmap(torch.func.vmap(torch.func.jacrev(theirs, argnums=(0, 1))))(
        torch.tensor(xn), torch.tensor(yn)
    )
    ours = vmap(vmap(func.jacrev(fn, argnums=(0, 1))))(x, y)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)


_sample_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


@settings(max_examples=20, deadline=None)
@given(outer=st.integers(1, 3), inner=st.integers(1, 3), shape=_sample_shapes)
def test_jacrev_under_nested_vmaps_over_shapes(outer: int, inner: int, shape: tuple) -> None:
    """``x.sin() * x.sum()`` (a Jacobian that is not diagonal) of every sample of one and of two
    levels of ``vmap``, against its closed form."""
    from fusegrad.func import jacrev

    xs = _t(outer, inner, *shape)
    f = lambda u: u.sin() * u.sum()  # noqa: E731
    n = int(np.prod(shape))

    def jacobian(x: np.ndarray) -> np.ndarray:
        flat = x.reshape(-1)
        j = np.diag(np.cos(flat) * flat.sum()) + np.sin(flat)[:, None]
        return j.reshape(shape + shape)

    flat = xs.numpy().reshape(outer, inner, n)
    want = np.stack([[jacobian(s.reshape(shape)) for s in row] for row in flat])
    np.testing.assert_allclose(vmap(vmap(jacrev(f)))(xs).numpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vmap(jacrev(f))(xs[0]).numpy(), want[0], rtol=1e-10, atol=1e-12)


# ---- forward mode under vmap: Hessians of every sample ----------------------------------------

_v = _W2[:, 0]


def _logsumexp_hessian(x: np.ndarray) -> np.ndarray:
    p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    return np.diag(p) - np.outer(p, p)


def _coupled_hessian(x: np.ndarray) -> np.ndarray:
    ones = np.ones_like(x)
    return 2 * x.sum() * np.eye(x.size) + 2 * (np.outer(x, ones) + np.outer(ones, x))


def _mlp_hessian(x: np.ndarray) -> np.ndarray:
    h = np.tanh(x @ _W1)
    return (_W1 * (_v * -2 * h * (1 - h * h))) @ _W1.T


# scalar functions of one sample x of shape (4,), for fusegrad and torch alike (``lib``), with
# their Hessians in numpy
HESSIAN_CASES = [
    (
        "sin_times",
        lambda lib, x: (x.sin() * x).sum(),
        lambda x: np.diag(2 * np.cos(x) - x * np.sin(x)),
    ),
    ("coupled", lambda lib, x: (x * x).sum() * x.sum(), _coupled_hessian),
    ("logsumexp", lambda lib, x: x.logsumexp(-1), _logsumexp_hessian),
    ("mlp", lambda lib, x: (x @ lib.tensor(_W1)).tanh() @ lib.tensor(_v), _mlp_hessian),
]


def _forward_transforms(func, f, t):  # type: ignore[no-untyped-def]
    """Every nesting of forward mode and ``vmap`` that gives each sample's Hessian (or its
    product with ``t``), by label, for ``func`` (fusegrad.func or torch.func)."""
    return [
        ("vmap(hessian)", func.vmap(func.hessian(f)), False),
        ("vmap(jacfwd(grad))", func.vmap(func.jacfwd(func.grad(f))), False),
        ("vmap(jacfwd(jacrev))", func.vmap(func.jacfwd(func.jacrev(f))), False),
        ("vmap(jacfwd(jacfwd))", func.vmap(func.jacfwd(func.jacfwd(f))), False),
        ("vmap(hessian, chunk_size=2)", func.vmap(func.hessian(f), chunk_size=2), False),
        ("vmap(jvp(grad))", func.vmap(lambda u: func.jvp(func.grad(f), (u,), (t,))[1]), True),
        (
            "jvp(vmap(grad))",
            lambda xs: func.jvp(func.vmap(func.grad(f)), (xs,), (t.expand(xs.shape),))[1],
            True,
        ),
    ]


@pytest.mark.parametrize("name,fn,hessian", HESSIAN_CASES, ids=[c[0] for c in HESSIAN_CASES])
def test_hessians_under_vmap_are_each_samples(name, fn, hessian) -> None:  # type: ignore[no-untyped-def]
    """Forward mode inside ``vmap`` differentiates a backward that runs on the batch's graph
    (``BatchTracer.backward``): the batch must carry the samples' tangents (every Hessian was
    zeros before), and a dummy cotangent of ``jvp`` of ``jvp`` be one per sample (each sample
    got the sum of the samples' products before)."""
    import fusegrad.func as func

    f = lambda x: fn(fg, x)  # noqa: E731
    xs, t = _t(3, 4), _t(4)
    want = _per_sample(hessian, xs.numpy())
    for label, transform, is_product in _forward_transforms(func, f, t):
        expected = want @ t.numpy() if is_product else want
        got = transform(xs).detach().numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-11, err_msg=label)
    # the batch along another dim, two levels of vmap, and the Jacobian of a batched gradient
    got = func.vmap(func.hessian(f), in_dims=1)(xs.t().contiguous())
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-9, atol=1e-11)
    xss = _t(2, 3, 4)
    got = func.vmap(func.vmap(func.hessian(f)))(xss)
    np.testing.assert_allclose(
        got.detach().numpy(), _per_sample(hessian, xss.numpy()), rtol=1e-9, atol=1e-11
    )
    blocks = func.jacfwd(func.vmap(func.grad(f)))(xs).detach().numpy()  # (3, 4, 3, 4)
    for i in range(3):
        np.testing.assert_allclose(blocks[i, :, i], want[i], rtol=1e-9, atol=1e-11)
        others = np.delete(blocks[i], i, axis=1)
        np.testing.assert_array_equal(others, np.zeros_like(others))


@pytest.mark.parametrize("name,fn,hessian", HESSIAN_CASES, ids=[c[0] for c in HESSIAN_CASES])
def test_hessians_under_vmap_match_torch(name, fn, hessian) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    import fusegrad.func as func

    xs, t = _t(3, 4), _t(4)
    txs, tt = torch.tensor(xs.numpy()), torch.tensor(t.numpy())
    ours = _forward_transforms(func, lambda x: fn(fg, x), t)
    theirs = _forward_transforms(torch.func, lambda x: fn(torch, x), tt)
    for (label, mine, _), (_, reference, _) in zip(ours, theirs):
        np.testing.assert_allclose(
            mine(xs).detach().numpy(),
            reference(txs).detach().numpy(),
            rtol=1e-9,
            atol=1e-11,
            err_msg=label,
        )
    xss = _t(2, 3, 4)
    np.testing.assert_allclose(
        func.vmap(func.vmap(func.hessian(lambda x: fn(fg, x))))(xss).detach().numpy(),
        torch.func.vmap(torch.func.vmap(torch.func.hessian(lambda x: fn(torch, x))))(
            torch.tensor(xss.numpy())
        ).numpy(),
        rtol=1e-9,
        atol=1e-11,
    )


def test_hessians_under_vmap_of_an_unbatched_argument() -> None:
    """The Hessian with respect to an argument that ``vmap`` does not batch: forward over
    reverse lifts the dual input to one per sample (primal and tangent apart), or each
    sample's Hessian is the sum of all the samples'."""
    import fusegrad.func as func

    x, ws = _t(4), _t(3, 4)
    g = lambda u, w: (u * w).sin().sum()  # noqa: E731
    xn, wn = x.numpy(), ws.numpy()
    want_x = np.stack([np.diag(-np.sin(xn * w) * w * w) for w in wn])
    want_w = np.stack([np.diag(-np.sin(xn * w) * xn * xn) for w in wn])
    for label, transform in [
        ("vmap(hessian)", func.hessian(g)),
        ("vmap(jacfwd(grad))", func.jacfwd(func.grad(g))),
        ("vmap(jacfwd(jacfwd))", func.jacfwd(func.jacfwd(g))),
    ]:
        got = func.vmap(transform, in_dims=(None, 0))(x, ws)
        np.testing.assert_allclose(
            got.detach().numpy(), want_x, rtol=1e-9, atol=1e-11, err_msg=label
        )
    got = func.vmap(func.hessian(g, argnums=1), in_dims=(None, 0))(x, ws)
    np.testing.assert_allclose(got.detach().numpy(), want_w, rtol=1e-9, atol=1e-11)
    got = func.vmap(func.hessian(lambda w, u: g(u, w)), in_dims=(0, None))(ws, x)
    np.testing.assert_allclose(got.detach().numpy(), want_w, rtol=1e-9, atol=1e-11)


def test_forward_over_forward_keeps_a_graph_only_when_asked() -> None:
    """``jvp`` inside ``jvp`` (by a double vjp) returns no graph for inputs that do not require
    grad, as torch.func (``.numpy()`` of ``vmap(jacfwd(jacfwd(f)))`` raised before), and one
    that reverse mode differentiates correctly where they do."""
    import fusegrad.func as func

    f = lambda u: (u.sin() * u).sum() * u.sum()  # noqa: E731
    xs = _t(3, 4)
    assert not func.jacfwd(func.jacfwd(f))(xs[0]).requires_grad
    assert not func.vmap(func.jacfwd(func.jacfwd(f)))(xs).requires_grad
    x = xs[0].clone().requires_grad_(True)
    func.jacfwd(func.jacfwd(f))(x).sum().backward()
    want = func.grad(lambda u: func.hessian(f)(u).sum())(xs[0])
    np.testing.assert_allclose(x.grad.numpy(), want.numpy(), rtol=1e-9, atol=1e-11)
    h = 1e-6  # against central differences of the Hessian's sum
    numeric = np.zeros(4)
    for i in range(4):
        step = fg.tensor(np.eye(4)[i] * h)
        up = func.hessian(f)(xs[0] + step).sum().item()
        down = func.hessian(f)(xs[0] - step).sum().item()
        numeric[i] = (up - down) / (2 * h)
    np.testing.assert_allclose(x.grad.numpy(), numeric, rtol=1e-5, atol=1e-6)


def test_hessian_with_in_place_ops_keeps_one_primal_per_column() -> None:
    """``jacfwd``'s columns share one primal computation: a dual input is not lifted along the
    level only its tangent is batched at (the Hessian of a function with an in-place op on a
    slice was wrong once it was)."""
    import fusegrad.func as func

    def f(u: fg.Tensor) -> fg.Tensor:
        y = u.clone()
        y[1:].add_(u[:-1].sin() * 2)
        return (y * y).sum()

    x = _t(4)
    xn = x.numpy()
    # y = x + 2 [0, sin x0, sin x1, sin x2]; f = sum y^2; its Hessian by the chain rule
    dy = np.eye(4) + 2 * np.diag(np.cos(xn[:-1]), -1)
    y = xn + 2 * np.concatenate([[0.0], np.sin(xn[:-1])])
    curvature = np.zeros((4, 4))
    curvature[:-1, :-1] = np.diag(-2 * np.sin(xn[:-1]) * 2 * y[1:])
    want = 2 * dy.T @ dy + curvature
    for label, transform in [
        ("hessian", func.hessian(f)),
        ("jacfwd(grad)", func.jacfwd(func.grad(f))),
        ("jacrev(grad)", func.jacrev(func.grad(f))),
    ]:
        np.testing.assert_allclose(
            transform(x).detach().numpy(), want, rtol=1e-9, atol=1e-11, err_msg=label
        )


def _central_difference(fn, x: np.ndarray, t: np.ndarray, h: float = 1e-6) -> np.ndarray:  # type: ignore[no-untyped-def]
    up = fn(fg.tensor(x + h * t)).detach().numpy()
    down = fn(fg.tensor(x - h * t)).detach().numpy()
    return (up - down) / (2 * h)


# one sample's functions with an in-place op on an intermediate, or on a view of one
IN_PLACE = ["slice_mul_", "slice_setitem", "transposed_row", "flat_view", "sigmoid_", "copy_"]


def _in_place(name: str, u: fg.Tensor) -> fg.Tensor:  # (works on torch tensors too)
    if name == "slice_mul_":
        z = u.clone()
        z[1:].mul_(2)
        return z
    if name == "slice_setitem":
        z = u.clone()
        z[1:] = z[1:] * 2
        return z
    if name == "transposed_row":
        z = u.clone()
        z.t()[0].mul_(u[1])
        return z.sin()
    if name == "flat_view":
        z = u.clone()
        z.reshape(-1)[2:5].mul_(u[0, :3].exp())
        return z
    if name == "sigmoid_":
        z = u * 3
        z.sigmoid_()
        return z
    z = u.clone()  # copy_
    z.copy_(u.exp())
    return z * u


@pytest.mark.parametrize("name", IN_PLACE)
def test_gradients_of_in_place_ops_on_views_under_vmap(name: str) -> None:
    """``vmap(grad(f))`` where ``f`` writes in place into a view of an intermediate: the view's
    batch is a view of the intermediate's batch (``batching._view``), so the write rewrites
    its history (it was lost: ``z[1:].mul_(2)`` gave the gradient without the factor 2), and
    the op runs on a copy of the old value (a version error otherwise)."""
    import fusegrad.func as func

    def loss(u):  # type: ignore[no-untyped-def]
        return (_in_place(name, u) ** 2).sum()

    x = _t(3, 3, 3)
    got = vmap(func.grad(loss))(x).numpy()
    np.testing.assert_allclose(got, _looped(func.grad(loss), (x,), (0,)), rtol=1e-10)
    np.testing.assert_allclose(
        vmap(vmap(func.grad(loss)))(x.reshape(3, 1, 3, 3)).numpy().reshape(3, 3, 3), got
    )
    torch = pytest.importorskip("torch")
    want = torch.func.vmap(torch.func.grad(loss))(torch.tensor(x.numpy())).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", IN_PLACE)
def test_forward_mode_jacobians_of_in_place_ops_under_vmap(name: str) -> None:
    """``vmap(jacfwd(f))`` with an in-place op in ``f``: the columns' tangents are one for
    every sample; a sample's in-place op makes them the sample's own.  The batch's tangent was a
    broadcast view (the write raised), then the samples' tangents did not see the write."""
    import fusegrad.func as func

    x, t = _t(3, 3, 3), _t(3, 3, 3)
    fn = lambda u: _in_place(name, u)  # noqa: E731
    jac = vmap(func.jacfwd(fn))(x).numpy()
    assert jac.shape == (3, 3, 3, 3, 3)
    np.testing.assert_allclose(jac, _looped(func.jacfwd(fn), (x,), (0,)), rtol=1e-10)
    along = np.einsum("bijkl,bkl->bij", jac, t.numpy())
    np.testing.assert_allclose(
        along, _central_difference(vmap(fn), x.numpy(), t.numpy()), rtol=1e-6, atol=1e-7
    )
    tangent = func.jvp(vmap(fn), (x,), (t,))[1].numpy()
    np.testing.assert_allclose(tangent, along, rtol=1e-10, atol=1e-12)
    torch = pytest.importorskip("torch")
    want = torch.func.vmap(torch.func.jacfwd(fn))(torch.tensor(x.numpy())).numpy()
    np.testing.assert_allclose(jac, want, rtol=1e-10, atol=1e-12)


def test_jvp_of_vmap_with_an_in_place_op_on_an_intermediate() -> None:
    """``jvp(vmap(h))`` with ``y = x * 2; y.mul_(y)``: the tangent is ``8 x t``, as finite
    differences say.  (PyTorch 2.13's forward AD gives ``12 x t`` here: its ``mul_`` formula
    reads the tangent of ``other`` after writing that of ``self``, the same tensor.)"""
    import fusegrad.func as func

    def h(u: fg.Tensor) -> fg.Tensor:
        y = u * 2
        y.mul_(y)
        return y

    x, t = _t(3, 4), _t(3, 4)
    for fn in (vmap(h), vmap(vmap(h)), vmap(vmap(h), in_dims=1, out_dims=1)):
        value, tangent = func.jvp(fn, (x,), (t,))
        np.testing.assert_allclose(value.numpy(), 4 * x.numpy() ** 2)
        np.testing.assert_allclose(tangent.numpy(), 8 * x.numpy() * t.numpy(), rtol=1e-12)
    jac = vmap(func.jacfwd(h))(x).numpy()
    np.testing.assert_allclose(jac, np.stack([np.diag(8 * row) for row in x.numpy()]))


@pytest.mark.parametrize("modes", ["jacfwd-jacrev", "jacrev-jacfwd", "jacfwd-jacfwd"])
@pytest.mark.parametrize("argnums", [(1, 0), (0, 1), (0, 0)])
@pytest.mark.parametrize("in_dims", [(0, 0), (None, 0), (0, None)])
def test_second_derivatives_of_two_arguments_under_vmap(modes, argnums, in_dims) -> None:  # type: ignore[no-untyped-def]
    """Mixed partials (and same-argument ones) of a two-argument function under ``vmap``: the
    outer transform's tangents reach the inner one through an argument it may not
    differentiate, whose primal is shared by the columns."""
    import fusegrad.func as func

    torch = pytest.importorskip("torch")
    x, y = _t(4, 3), _t(4, 2)

    def g(a, b):  # type: ignore[no-untyped-def]
        return a[:, None] * b.tanh() * a.sum()

    def build(lib):  # type: ignore[no-untyped-def]
        outer, inner = (getattr(lib, name) for name in modes.split("-"))
        return lib.vmap(outer(inner(g, argnums=argnums[0]), argnums=argnums[1]), in_dims=in_dims)

    args = tuple(t if d == 0 else t[0] for t, d in zip((x, y), in_dims))
    got = build(func)(*args).numpy()
    want = build(torch.func)(*(torch.tensor(a.numpy()) for a in args))
    np.testing.assert_allclose(got, want.numpy(force=True), rtol=1e-10, atol=1e-12)
