"""``multinomial``: distributions (with and without replacement), reproducibility under
``manual_seed`` and ``generator=``, PyTorch's errors.  Draws are fusegrad's own (numpy PCG64),
so these check frequencies, not PyTorch's numbers."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg

P = np.array([0.1, 0.0, 0.6, 0.3])


def _close(freq: np.ndarray, p: np.ndarray, n: int) -> None:
    """Frequencies within 5 standard errors of the probabilities."""
    sigma = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(freq - p) <= 5 * sigma + 1e-12), (freq, p)


def test_with_replacement_follows_the_distribution() -> None:
    fg.manual_seed(1)
    n = 40_000
    draws = fg.multinomial(fg.tensor(P * 7.0), n, replacement=True)  # unnormalised weights
    assert draws.shape == (n,) and draws.dtype == fg.int64
    freq = np.bincount(draws.numpy(), minlength=4) / n
    assert freq[1] == 0  # a zero weight is never drawn
    _close(freq, P, n)


def test_without_replacement_draws_one_by_one() -> None:
    fg.manual_seed(2)
    rows = 20_000
    probs = fg.tensor(np.tile(P, (rows, 1)))
    draws = fg.multinomial(probs, 2).numpy()
    assert draws.shape == (rows, 2)
    assert np.all(draws[:, 0] != draws[:, 1])
    _close(np.bincount(draws[:, 0], minlength=4) / rows, P, rows)
    # the second draw: P(j second) = sum_i p_i p_j / (1 - p_i)
    second = np.array([sum(P[i] * P[j] / (1 - P[i]) for i in range(4) if i != j) for j in range(4)])
    _close(np.bincount(draws[:, 1], minlength=4) / rows, second, rows)


def test_all_categories_without_replacement_is_a_permutation() -> None:
    fg.manual_seed(3)
    out = fg.multinomial(fg.rand(5, 6) + 0.1, 6)
    assert all(sorted(r) == list(range(6)) for r in out.tolist())
    # zero weights come last once the others are used up (as PyTorch's CPU kernel)
    out = fg.multinomial(fg.tensor([[0.0, 1.0, 0.0, 2.0]]), 4)
    assert out[0, 2:].tolist() == [0, 2]


def test_reproducible_under_manual_seed_and_generator() -> None:
    probs = fg.rand(3, 10)
    fg.manual_seed(7)
    a = fg.multinomial(probs, 4)
    b = probs.multinomial(4, replacement=True)
    fg.manual_seed(7)
    assert fg.equal(fg.multinomial(probs, 4), a)
    assert fg.equal(probs.multinomial(4, replacement=True), b)
    g1, g2 = fg.Generator().manual_seed(5), fg.Generator().manual_seed(5)
    assert fg.equal(fg.multinomial(probs, 6, generator=g1), fg.multinomial(probs, 6, generator=g2))
    draws = {tuple(fg.multinomial(probs[0], 3).tolist()) for _ in range(20)}
    assert len(draws) > 1


@pytest.mark.parametrize(
    "args,words",
    [
        ((fg.tensor([1.0, -1.0]), 1), "element < 0"),
        ((fg.tensor([1.0, float("nan")]), 1), "`inf`, `nan`"),
        ((fg.tensor([1.0, float("inf")]), 1, True), "`inf`, `nan`"),
        ((fg.tensor([0.0, 0.0]), 1), "sum of probabilities <= 0"),
        ((fg.ones(3), 4), "cannot sample n_sample > prob_dist.size"),
        ((fg.ones(3), 0), "cannot sample n_sample <= 0"),
        ((fg.ones(2, 2, 2), 1), "prob_dist must be 1 or 2 dim"),
        ((fg.ones(3, dtype=fg.int64), 1), "only supports floating-point dtypes"),
    ],
)
def test_errors_are_runtime_errors(args: tuple, words: str) -> None:
    with pytest.raises(RuntimeError, match=words):
        fg.multinomial(*args)


def test_gpt_sampling_in_a_compiled_function_matches_eager() -> None:
    """A host read of the probabilities: the compiled function gives eager's draws."""

    def sample(logits: fg.Tensor) -> fg.Tensor:
        v, _ = fg.topk(logits, 3)
        logits = logits.masked_fill(logits < v[:, [-1]], -float("inf"))
        return fg.multinomial(fg.softmax(logits, dim=-1), 1)

    compiled = fg.compile(sample)
    logits = fg.randn(4, 9)
    for _ in range(3):
        fg.manual_seed(11)
        want = sample(logits)
        fg.manual_seed(11)
        assert fg.equal(compiled(logits), want)
