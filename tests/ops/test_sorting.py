"""sort / argsort / topk / kthvalue / median beyond the op table: PyTorch's order of NaN and of
ties, its errors, the named tuples, the partial sort of topk on long rows, GPT's top-k filter
of ``generate()`` and a compiled step that replays them."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler

NAN = float("nan")


def test_nan_is_largest_and_ties_keep_their_order() -> None:
    x = fg.tensor([[3.0, 1.0, NAN, 2.0, 1.0], [0.0, 5.0, -1.0, 5.0, 2.0]])
    values, indices = fg.sort(x)
    assert indices.tolist() == [[1, 4, 3, 0, 2], [2, 0, 4, 1, 3]]
    assert np.isnan(values.numpy()[0, -1])
    down = x.sort(descending=True)
    assert down.indices.tolist() == [[2, 0, 3, 1, 4], [1, 3, 4, 0, 2]]
    assert fg.topk(x, 2).indices.tolist() == [[2, 0], [1, 3]]
    assert fg.argsort(x, dim=0).tolist() == [[1, 0, 1, 0, 0], [0, 1, 0, 1, 1]]
    # median is NaN where a row holds one (nanmedian is the op that skips them)
    assert np.isnan(x.median().item())
    med = fg.median(x, 1)
    assert np.isnan(med.values[0].item()) and med.values[1].item() == 2.0
    assert med.indices.tolist() == [2, 4]


def test_named_tuples_and_integer_inputs() -> None:
    x = fg.tensor([[4, 1, 3], [2, 9, 0]])
    out = fg.topk(x, 2, largest=False)
    assert type(out).__name__ == "topk" and type(out) is fg.return_types.topk
    assert out.values.tolist() == [[1, 3], [0, 2]] and out.values.dtype == fg.int64
    assert type(fg.sort(x)).__name__ == "sort"
    assert type(x.kthvalue(2)).__name__ == "kthvalue"
    assert type(fg.median(x, 0)).__name__ == "median"
    assert fg.median(x, 1, keepdim=True).values.tolist() == [[3], [2]]
    assert fg.msort(x).tolist() == [[2, 1, 0], [4, 9, 3]]


def test_partial_sort_agrees_with_the_full_sort() -> None:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((6, 1000))
    data[0, ::7] = NAN
    x = fg.tensor(data)
    for largest in (True, False):
        for k in (1, 5, 999, 1000):
            got = fg.topk(x, k, largest=largest)
            full = fg.sort(x, descending=largest)
            np.testing.assert_array_equal(got.values.numpy(), full.values.numpy()[:, :k])
            # the indices point at the values; they are the sort's where no NaN ties
            np.testing.assert_array_equal(
                np.take_along_axis(data, got.indices.numpy(), 1), got.values.numpy()
            )
            rows = slice(1, None)  # row 0's NaNs tie with each other
            np.testing.assert_array_equal(got.indices.numpy()[rows], full.indices.numpy()[rows, :k])


@pytest.mark.parametrize(
    "call,kind,words",
    [
        (lambda x: fg.topk(x, 5), RuntimeError, "selected index k out of range"),
        (lambda x: fg.topk(x, -1), IndexError, "selected index k out of range"),
        (lambda x: x.kthvalue(0), RuntimeError, "selected number k out of range"),
        (lambda x: x.kthvalue(5, dim=1), RuntimeError, "for dimension 1"),
        (lambda x: fg.sort(x, dim=2), IndexError, "Dimension out of range"),
        (lambda x: fg.median(x[:, :0], 1), IndexError, "to have non-zero size"),
    ],
)
def test_errors(call, kind, words) -> None:  # type: ignore[no-untyped-def]
    x = fg.randn(3, 4, requires_grad=True)
    with pytest.raises(kind, match=words):
        call(x)
    assert x.grad is None


def test_median_of_nothing_is_nan() -> None:
    assert np.isnan(fg.median(fg.zeros(0)).item())


def test_gradients_go_to_the_selected_positions() -> None:
    x = fg.tensor([[0.5, 3.0, -1.0, 2.0]], requires_grad=True)
    values, _ = fg.topk(x, 2)
    (values * fg.tensor([[10.0, 1.0]])).sum().backward()
    assert x.grad.tolist() == [[0.0, 10.0, 0.0, 1.0]]
    x.grad = None
    fg.median(x).backward()  # lower median of four: 0.5
    assert x.grad.tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_gpt_top_k_filter() -> None:
    """nanoGPT's ``generate()``: keep the k largest logits, -inf elsewhere, then sample."""
    fg.manual_seed(0)
    logits = fg.randn(3, 50)
    v, _ = fg.topk(logits, 5)
    logits[logits < v[:, [-1]]] = -float("Inf")
    assert (fg.isfinite(logits).sum(1) == 5).all()
    probs = fg.softmax(logits, dim=-1)
    idx = fg.multinomial(probs, num_samples=1)
    assert idx.shape == (3, 1)
    assert fg.isfinite(logits.gather(1, idx)).all()


def test_compiled_step_replays_sort_topk_and_median() -> None:
    compiler.reset()

    def step(x: fg.Tensor) -> fg.Tensor:
        v, _ = fg.topk(x, 3)
        m = x.median(1).values
        s = fg.sort(x, descending=True, stable=True).values
        loss = (v * v).sum() + m.sum() + (s[:, :2] ** 3).sum() + x.kthvalue(2).values.sum()
        loss.backward()
        return loss.detach()

    compiled = fg.compile(step)
    rng = np.random.default_rng(3)
    for scale in (1.0, 0.5, 2.0):
        data = rng.random((4, 7)) * scale
        a, b = fg.tensor(data, requires_grad=True), fg.tensor(data, requires_grad=True)
        np.testing.assert_allclose(compiled(a).numpy(), step(b).numpy(), rtol=1e-12)
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12)
    assert compiler.counters.step_captures == 1 and compiler.counters.step_runs == 2
    assert not compiler.counters.step_breaks
