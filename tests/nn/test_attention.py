"""F.scaled_dot_product_attention beyond the op table (values, gradients and compiled runs are
there): its errors against PyTorch's, dropout on the attention weights, and that nn.functional
exports it (nanoGPT looks for it with ``hasattr``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import DTypeError, ShapeError


def _qkv(lib: Any, q: tuple = (2, 3, 4), k: tuple = (2, 5, 4), v: tuple = (2, 5, 3)) -> list:
    rng = np.random.default_rng(0)
    return [lib.tensor(rng.standard_normal(s)) for s in (q, k, v)]


ERROR_CASES = [
    (ShapeError, "Explicit attn_mask", lambda m, q, k, v: (q, k, v, m.ones(4, 5) > 0), True),
    (DTypeError, "same dtype", lambda m, q, k, v: (q, k.float(), v), False),
    (ShapeError, "at least 2", lambda m, q, k, v: (q[0, 0], k[0, 0], v[0, 0]), False),
    (DTypeError, "attn_mask", lambda m, q, k, v: (q, k, v, m.zeros(3, 5, dtype=m.int64)), False),
    (
        DTypeError,
        "attn_mask",
        lambda m, q, k, v: (q.float(), k.float(), v.float(), m.zeros(3, 5, dtype=m.float64)),
        False,
    ),
    (ShapeError, "", lambda m, q, k, v: (q, k[..., :3], v), False),
    (ShapeError, "", lambda m, q, k, v: (q, k, v[:, :4]), False),
    (ShapeError, "", lambda m, q, k, v: (q, k, v, m.zeros(4, 5, dtype=m.bool)), False),
]


@pytest.mark.parametrize("error,words,args,causal", ERROR_CASES)
def test_errors_match_torch(error: type, words: str, args: Any, causal: bool) -> None:
    with pytest.raises(error, match=words or None):
        F.scaled_dot_product_attention(*args(fg, *_qkv(fg)), is_causal=causal)
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError):
        torch.nn.functional.scaled_dot_product_attention(
            *args(torch, *_qkv(torch)), is_causal=causal
        )


def test_error_classes_are_runtime_errors_as_in_torch() -> None:
    with pytest.raises(RuntimeError, match="same dtype"):
        F.scaled_dot_product_attention(*_qkv(fg)[:2], _qkv(fg)[2].float())
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.scaled_dot_product_attention(*_qkv(fg), dropout_p=1.5)


def test_float32_mask_with_float64_query_is_accepted_as_in_torch() -> None:
    q, k, v = _qkv(fg)
    bias = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    out = F.scaled_dot_product_attention(q, k, v, fg.tensor(bias))
    want = F.scaled_dot_product_attention(q, k, v, fg.tensor(bias.astype(np.float64)))
    assert out.dtype == fg.float64
    np.testing.assert_allclose(out.numpy(), want.numpy(), atol=1e-12)


def test_gqa_heads_must_divide() -> None:
    q, k, v = _qkv(fg, (1, 3, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4))
    with pytest.raises(ShapeError, match="must divide"):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def test_dropout_drops_attention_weights() -> None:
    """The same draw as F.dropout applied to the softmax weights, scaled by 1 / (1 - p)."""
    q, k, v = (t.requires_grad_() for t in _qkv(fg))
    fg.manual_seed(3)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    fg.manual_seed(3)
    weights = F.softmax(q @ k.mT / 2.0, -1)
    want = F.dropout(weights, 0.4) @ v
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), atol=1e-12)
    assert not np.allclose(out.detach().numpy(), (weights @ v).detach().numpy())
    out.sum().backward()
    assert q.grad is not None and np.isfinite(q.grad.numpy()).all()


def test_fully_masked_row_is_zero_with_zero_gradient() -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(fg))
    keep = np.ones((3, 5), dtype=bool)
    keep[1] = False
    out = F.scaled_dot_product_attention(q, k, v, fg.tensor(keep))
    assert (out.detach().numpy()[:, 1] == 0).all()
    out.sum().backward()
    assert (q.grad.numpy()[:, 1] == 0).all()
    assert np.isfinite(k.grad.numpy()).all() and np.isfinite(v.grad.numpy()).all()


def test_exported_as_in_torch() -> None:
    import fusegrad.nn.functional as nnf

    assert hasattr(nnf, "scaled_dot_product_attention")
    assert "scaled_dot_product_attention" in nnf.__all__
