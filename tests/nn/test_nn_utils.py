"""``fusegrad.nn.utils``: gradient clipping against ``torch.nn.utils`` (when importable) and by
hand, parameters as one vector, ``rnn.pad_sequence``, and clipping inside a compiled step."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn

SHAPES = [(3, 4), (5,), (2, 2, 2)]


def _params(lib, grads):  # type: ignore[no-untyped-def]
    ps = [lib.zeros(g.shape, dtype=lib.float64, requires_grad=True) for g in grads]
    for p, g in zip(ps, grads):
        p.grad = lib.tensor(g)
    return ps


def _grads(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in SHAPES]


@pytest.mark.parametrize("norm_type", [2.0, 1, 3, 0.5, math.inf])
@pytest.mark.parametrize("max_norm", [0.1, 100.0])
def test_clip_grad_norm_matches_torch(norm_type: float, max_norm: float) -> None:
    torch = pytest.importorskip("torch")
    grads = _grads()
    tp, fp = _params(torch, grads), _params(fg, grads)
    want = torch.nn.utils.clip_grad_norm_(tp, max_norm, norm_type)
    got = nn.utils.clip_grad_norm_(fp, max_norm, norm_type=norm_type)
    assert isinstance(got, fg.Tensor) and got.shape == () and got.dtype == fg.float64
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-13)
    for p, q in zip(fp, tp):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-13)


def test_clip_grad_norm_by_hand() -> None:
    grads = _grads(1)
    ps = _params(fg, grads)
    ps.append(fg.zeros(2, requires_grad=True))  # no .grad: skipped
    total = np.sqrt(sum((g**2).sum() for g in grads))
    g0 = ps[0].grad
    out = nn.utils.clip_grad_norm_(iter(ps), max_norm=1.0)  # a generator is fine
    np.testing.assert_allclose(out.item(), total, rtol=1e-13)
    assert ps[0].grad is g0  # scaled in place
    np.testing.assert_allclose(ps[0].grad.numpy(), grads[0] / (total + 1e-6), rtol=1e-13)
    assert ps[-1].grad is None
    # a single tensor, and nothing to clip
    w = fg.ones(3, requires_grad=True)
    w.grad = fg.full((3,), 2.0)
    assert nn.utils.clip_grad_norm_(w, 100.0).item() == pytest.approx(math.sqrt(12))
    assert w.grad.tolist() == [2.0, 2.0, 2.0]
    assert nn.utils.clip_grad_norm_([fg.ones(2, requires_grad=True)], 1.0).item() == 0.0


def test_nonfinite_norm() -> None:
    w = fg.ones(2, requires_grad=True)
    w.grad = fg.tensor([1.0, math.inf])
    with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
        nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True)
    assert w.grad.tolist() == [1.0, math.inf]  # untouched by the failed call
    total = nn.utils.clip_grad_norm_([w], 1.0)  # PyTorch scales by the non-finite norm anyway
    assert math.isinf(total.item())
    assert w.grad[0].item() == 0.0 and math.isnan(w.grad[1].item())


def test_clip_grad_value() -> None:
    grads = _grads(2)
    ps = _params(fg, grads)
    assert nn.utils.clip_grad_value_(ps, 0.5) is None
    for p, g in zip(ps, grads):
        np.testing.assert_array_equal(p.grad.numpy(), np.clip(g, -0.5, 0.5))


def test_parameters_to_vector_and_back() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    vec = nn.utils.parameters_to_vector(model.parameters())
    assert vec.shape == (3 * 4 + 4 + 4 * 2 + 2,)
    np.testing.assert_array_equal(
        vec[:12].detach().numpy(), model[0].weight.detach().numpy().reshape(-1)
    )
    (vec * 2).sum().backward()  # differentiable
    assert model[0].weight.grad.tolist() == [[2.0] * 3] * 4
    new = fg.arange(vec.numel(), dtype=fg.float32)
    weight = model[2].weight
    nn.utils.vector_to_parameters(new, model.parameters())
    assert model[2].weight is weight  # same objects, new data
    np.testing.assert_array_equal(model[2].bias.detach().numpy(), [24.0, 25.0])
    np.testing.assert_array_equal(
        nn.utils.parameters_to_vector(model.parameters()).detach().numpy(), new.numpy()
    )
    with pytest.raises(TypeError, match="expected torch.Tensor, but got: list"):
        nn.utils.vector_to_parameters([1.0], model.parameters())


def test_pad_sequence() -> None:
    a, b = fg.randn(3, 2, requires_grad=True), fg.randn(5, 2, requires_grad=True)
    out = nn.utils.rnn.pad_sequence([a, b])
    assert out.shape == (5, 2, 2)
    assert out[3:, 0].tolist() == [[0.0, 0.0], [0.0, 0.0]]
    left = nn.utils.rnn.pad_sequence(
        [a, b], batch_first=True, padding_value=-1, padding_side="left"
    )
    assert left.shape == (2, 5, 2) and left[0, :2].tolist() == [[-1.0, -1.0], [-1.0, -1.0]]
    np.testing.assert_array_equal(left[0, 2:].detach().numpy(), a.detach().numpy())
    (out.sum() + left.sum()).backward()
    assert a.grad.tolist() == [[2.0, 2.0]] * 3
    torch = pytest.importorskip("torch")
    want = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(a.detach().numpy()), torch.tensor(b.detach().numpy())], padding_value=3.0
    )
    got = nn.utils.rnn.pad_sequence([a, b], padding_value=3.0)
    np.testing.assert_array_equal(got.detach().numpy(), want.numpy())


def test_clip_grad_norm_in_a_compiled_step_is_replayed() -> None:
    compiler.reset()

    def run(compiled: bool) -> tuple:
        fg.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
        opt = fg.optim.AdamW(model.parameters(), lr=1e-2)

        def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            norm = nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            opt.step()
            return loss.detach() + 0 * norm

        fn = fg.compile(step) if compiled else step
        rng = np.random.default_rng(1)
        losses = [
            fn(fg.tensor(rng.standard_normal((6, 4))), fg.tensor(rng.standard_normal((6, 1))))
            for _ in range(5)
        ]
        return [float(v) for v in losses], [p.detach().numpy() for p in model.parameters()]

    eager_losses, eager_params = run(False)
    losses, params = run(True)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-12)
    for a, b in zip(params, eager_params):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert not compiler.counters.step_breaks
    assert compiler.counters.step_runs >= 3
    compiler.reset()


@pytest.mark.parametrize("dtype", [fg.float32, fg.float64])
def test_the_total_2_norm_on_arrays_is_the_tensor_ops_bit_for_bit(
    dtype: fg.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``clip_grad._total_2_norm`` (the arrays' dot products and roots) gives the tensor ops'
    total norm and clipped gradients bit for bit, over contiguous, transposed and 0-d
    gradients; the tensor ops run where it declines (mixed dtypes, an empty gradient)."""
    from fusegrad.nn.utils import clip_grad

    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s) * 3 for s in [(40, 30), (30,), (), (7, 5, 3)]]

    def run(on_arrays: bool) -> tuple:
        with pytest.MonkeyPatch.context() as mp:
            if not on_arrays:
                mp.setattr(clip_grad, "_total_2_norm", lambda ts: None)
            ps = [fg.tensor(a, dtype=dtype, requires_grad=True) for a in arrays]
            for p, a in zip(ps, arrays):
                if a.ndim == 2:  # (a transposed view: not contiguous)
                    p.grad = fg.tensor(np.ascontiguousarray(a.T), dtype=dtype).T
                else:
                    p.grad = fg.tensor(a, dtype=dtype)
            total = nn.utils.clip_grad_norm_(ps, 0.5)
            return total.numpy().copy(), [p.grad.numpy().copy() for p in ps]

    (want_total, want), (got_total, got) = run(False), run(True)
    assert got_total.dtype == want_total.dtype and got_total.tobytes() == want_total.tobytes()
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()
    assert clip_grad._total_2_norm([fg.ones(2), fg.ones(2, dtype=fg.float64)]) is None
    assert clip_grad._total_2_norm([fg.ones(2), fg.ones(0)]) is None
