"""``jacobian(..., vectorize=True)`` through one batched program (``compiler.batching``).

Every Jacobian here is compared with the row-by-row one (``vectorize=False``: one backward
pass per output element, eager), in float64 to 1e-12, and the tests check that the batched path
was the one taken (a program per graph and batch size) or, for graphs it cannot batch, that the
rows were computed one by one with the same result.  Random programs (hypothesis) mix
broadcasting elementwise ops, reductions over random dims, permutations, reshapes and batched
matmuls of non-square shapes, where a wrong dimension shift would not go unnoticed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import compiler
from fusegrad.autograd import Function
from fusegrad.autograd.functional import hessian, jacobian
from fusegrad.compiler.service import service


def _t(rng: np.random.Generator, *shape: int) -> fg.Tensor:
    return fg.tensor(rng.standard_normal(shape))


def _blocks(j: Any) -> list:
    out: list = []
    for item in j if isinstance(j, tuple) else (j,):
        out.extend(_blocks(item) if isinstance(item, tuple) else [item.numpy()])
    return out


def _same_jacobian(f: Any, inputs: tuple, batched: bool = True) -> None:
    loop = jacobian(f, inputs)
    before = compiler.counters.batched_vjps
    vec = jacobian(f, inputs, vectorize=True)
    for a, b in zip(_blocks(loop), _blocks(vec)):
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
    outputs = f(*inputs)
    n = len(outputs) if isinstance(outputs, tuple) else 1
    assert compiler.counters.batched_vjps - before == (n if batched else 0)


RNG = np.random.default_rng(0)
CASES = {
    "mlp": (lambda x, w: ((x @ w).tanh() @ w.t()).sigmoid(), (_t(RNG, 3, 4), _t(RNG, 4, 4))),
    "broadcast": (lambda a, b: (a * b + b.exp()).sum(1), (_t(RNG, 3, 4), _t(RNG, 4))),
    "sum over dims": (
        lambda a: (a.sin().sum((0, 2), keepdim=True) * a).mean(-1),
        (_t(RNG, 2, 3, 4),),
    ),
    "reshape, transpose": (lambda a: a.reshape(4, 3).t().cos() * 2, (_t(RNG, 3, 4),)),
    "batched @ matrix": (lambda a, b: a @ b, (_t(RNG, 2, 3, 4), _t(RNG, 4, 5))),
    "matrix @ batched": (lambda a, b: a @ b, (_t(RNG, 3, 4), _t(RNG, 2, 4, 5))),
    "matrix @ vector": (lambda a, b: a @ b, (_t(RNG, 3, 4), _t(RNG, 4))),
    "slices": (lambda a: a[1:, ::2].exp() * a[0, :2].sum(), (_t(RNG, 3, 4),)),
    "cat": (lambda a, b: fg.cat([a.sin(), b * 2], 0), (_t(RNG, 2, 3), _t(RNG, 1, 3))),
    "pad": (lambda a: F.pad(a.tanh(), (1, 2)) ** 2, (_t(RNG, 2, 3),)),
    "cross entropy": (lambda x: F.cross_entropy(x, fg.tensor([1, 0, 2])), (_t(RNG, 3, 4),)),
    "gather": (lambda x: x.gather(1, fg.tensor([[0], [2], [1]])).exp(), (_t(RNG, 3, 4),)),
    "layer norm": (lambda x: F.layer_norm(x, (4,)), (_t(RNG, 3, 4),)),
    "max, cumsum, flip": (
        lambda x: x.amax(1) * x.cumsum(0).flip(1).sum(0)[:3],
        (_t(RNG, 3, 4),),
    ),
    "two outputs": (lambda a: (a.exp(), (a * a).sum(0)), (_t(RNG, 2, 3),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_vectorized_jacobian_equals_the_row_by_row_one(name: str) -> None:
    f, inputs = CASES[name]
    service.batched.clear()
    _same_jacobian(f, inputs)


def test_a_second_jacobian_reuses_the_program() -> None:
    service.batched.clear()
    f, inputs = CASES["mlp"]
    jacobian(f, inputs, vectorize=True)
    assert len(service.batched) == 1
    x, w = inputs
    got = jacobian(f, (x * 2.0, w), vectorize=True)  # new values, same graph
    ref = jacobian(f, (x * 2.0, w))
    for a, b in zip(_blocks(ref), _blocks(got)):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
    assert len(service.batched) == 1


def test_a_large_jacobian_goes_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from fusegrad.autograd import functional

    # 32 rows of 32 + 32 elements each (cotangent and result): 5 rows per chunk
    monkeypatch.setattr(functional, "BATCH_ELEMENTS", 5 * 8 * 64)
    x = _t(np.random.default_rng(4), 8, 4)

    def f(x: fg.Tensor) -> fg.Tensor:
        return (x.tanh() * x[:, :1]).t().reshape(32)

    before = compiler.counters.batched_vjps
    vec = jacobian(f, x, vectorize=True)
    assert compiler.counters.batched_vjps - before == 7  # ceil(32 / 5) chunks
    np.testing.assert_allclose(vec.numpy(), jacobian(f, x).numpy(), rtol=1e-12, atol=1e-12)


def test_the_same_structure_with_other_sizes_gets_its_own_program() -> None:
    service.batched.clear()
    rng = np.random.default_rng(5)
    for rows in (2, 5, 2):  # (5: the walk key and batch of 2, other concrete sizes)
        _same_jacobian(lambda x, w: (x @ w).tanh().sum(0), (_t(rng, rows, 3), _t(rng, 3, 4)))
    assert len(service.batched) == 2


def test_vectorized_hessian() -> None:
    x = _t(np.random.default_rng(1), 5)
    f = lambda x: (x.sin() * x).sum() ** 2 + (x[:3] * x[2:]).prod()  # noqa: E731
    service.batched.clear()
    np.testing.assert_allclose(
        hessian(f, x, vectorize=True).numpy(), hessian(f, x).numpy(), rtol=1e-12, atol=1e-12
    )
    assert len(service.batched) == 1


class _Numpy(Function):
    @staticmethod
    def forward(ctx: Any, x: fg.Tensor) -> fg.Tensor:
        return x * 3.0

    @staticmethod
    def backward(ctx: Any, g: fg.Tensor) -> fg.Tensor:
        return fg.tensor(np.asarray(g) * 3.0)


def test_what_cannot_be_batched_is_computed_row_by_row() -> None:
    service.batched.clear()
    x = _t(np.random.default_rng(2), 3)
    # a custom Function that reads numpy: no program may run it
    _same_jacobian(lambda x: _Numpy.apply(x.exp()), (x,), batched=False)
    # indexing with a tensor: no batching rule for its backward (index_add_at with indices)
    _same_jacobian(lambda x: x[fg.tensor([2, 0, 0])].sin(), (x,), batched=False)


def test_against_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))

    def f(m: Any) -> Any:
        return lambda x, w: (x @ w).tanh().softmax(-1)

    ours = jacobian(f(fg), (fg.tensor(x), fg.tensor(w)), vectorize=True)
    theirs = torch.autograd.functional.jacobian(
        f(torch), (torch.tensor(x), torch.tensor(w)), vectorize=True
    )
    for a, b in zip(_blocks(ours), [t.numpy() for t in theirs]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


_UNARY = ["sin", "tanh", "exp", "sigmoid", "neg"]


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 4),
    cols=st.integers(2, 5),
    inner=st.integers(1, 4),
    steps=st.lists(
        st.sampled_from(["unary", "bias", "sum0", "t", "matmul", "reshape"]), min_size=1, max_size=5
    ),
    unary=st.sampled_from(_UNARY),
    seed=st.integers(0, 1000),
)
def test_random_programs(
    rows: int, cols: int, inner: int, steps: list, unary: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    x = _t(rng, rows, cols)
    w = _t(rng, cols, inner)
    b = _t(rng, cols)

    def f(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
        h = x
        for step in steps:
            if step == "unary":
                h = getattr(h, unary)()
            elif step == "bias" and h.shape[-1] == b.shape[0]:
                h = h * b + b.exp()
            elif step == "sum0" and h.ndim == 2:
                h = h.sum(0, keepdim=True) * h
            elif step == "t" and h.ndim == 2:
                h = h.t()
            elif step == "matmul" and h.ndim == 2 and h.shape[-1] == w.shape[0]:
                h = h @ w
            elif step == "reshape":
                h = h.reshape(-1)[None, :]
        return h

    _same_jacobian(f, (x, w, b))
