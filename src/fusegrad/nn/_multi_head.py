"""``F.multi_head_attention_forward``: the computation behind ``nn.MultiheadAttention``, with
PyTorch's signature and semantics (re-exported by ``fusegrad.nn.functional``).

Conventions that differ from ``F.scaled_dot_product_attention``: a bool ``attn_mask`` or
``key_padding_mask`` marks the positions that may NOT be attended (True = masked); float masks
are added to the scores.  A 2-D ``attn_mask`` is (L, S), a 3-D one (N * num_heads, L, S);
``key_padding_mask`` is (N, S).  ``is_causal`` is only a hint that ``attn_mask`` is causal:
the mask is required, and it is replaced by a causal ``scaled_dot_product_attention`` only when
no weights are returned and there is no padding mask, as PyTorch does.

With ``need_weights=True`` the scores go through a plain softmax (a fully masked row is NaN, as
in PyTorch); without, through ``scaled_dot_product_attention`` (a fully masked row is zero).
Everything is ordinary ops (linear, matmul, softmax, views), so it differentiates and compiles.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import DTypeError, ShapeError
from ..ops.creation import zeros
from ..ops.elementwise import where
from ..ops.functional import dropout, linear, scaled_dot_product_attention
from ..ops.reduction import softmax
from ..ops.shape import cat, pad
from ..tensor import Tensor

__all__ = ["multi_head_attention_forward"]


class MultiheadAttentionError(ShapeError):
    """A shape that multi-head attention cannot use (PyTorch raises RuntimeError or
    AssertionError; ShapeError is a RuntimeError and a ValueError)."""


def _canonical_mask(mask: Tensor | None, name: str, dtype: Any) -> Tensor | None:
    """A bool mask (True = masked) as an additive float mask of ``dtype``; float masks as are."""
    if mask is None:
        return None
    if mask.dtype.name == "bool":
        return where(mask, -math.inf, 0.0).to(dtype)
    if not mask.dtype.is_floating_point:
        raise DTypeError(f"only bool and floating types of {name} are supported, got {mask.dtype}")
    return mask


def _in_projection(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    weights: tuple[Tensor, Tensor, Tensor],
    biases: tuple[Any, Any, Any],
    packed: Tensor | None,
    packed_bias: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    if packed is not None and query is key and key is value:
        # self-attention: one matmul with the packed (3E, E) weight, then three slices
        return linear(query, packed, packed_bias).chunk(3, -1)  # type: ignore[return-value]
    return (
        linear(query, weights[0], biases[0]),
        linear(key, weights[1], biases[1]),
        linear(value, weights[2], biases[2]),
    )


def multi_head_attention_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: Tensor | None,
    in_proj_bias: Tensor | None,
    bias_k: Tensor | None,
    bias_v: Tensor | None,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: Tensor,
    out_proj_bias: Tensor | None,
    training: bool = True,
    key_padding_mask: Tensor | None = None,
    need_weights: bool = True,
    attn_mask: Tensor | None = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: Tensor | None = None,
    k_proj_weight: Tensor | None = None,
    v_proj_weight: Tensor | None = None,
    static_k: Tensor | None = None,
    static_v: Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Multi-head attention over (L, N, E) query and (S, N, E_k), (S, N, E_v) key and value
    (or unbatched (L, E), (S, E_k), (S, E_v)); returns the (L, N, E) output and, with
    ``need_weights``, the attention weights (N, L, S) averaged over heads, or (N, H, L, S)."""
    if query.ndim not in (2, 3):
        raise MultiheadAttentionError(
            "query should be unbatched 2D or batched 3D tensor but received "
            f"{query.ndim}-D query tensor"
        )
    batched = query.ndim == 3
    if key.ndim != query.ndim or value.ndim != query.ndim:
        raise MultiheadAttentionError(
            f"For {'batched (3-D)' if batched else 'unbatched (2-D)'} `query`, expected `key` "
            f"and `value` to be {query.ndim}-D but found {key.ndim}-D and {value.ndim}-D "
            "tensors respectively"
        )
    if key_padding_mask is not None and key_padding_mask.ndim != (2 if batched else 1):
        raise MultiheadAttentionError(
            f"For {'batched (3-D)' if batched else 'unbatched (2-D)'} `query`, expected "
            f"`key_padding_mask` to be `None` or {2 if batched else 1}-D but found "
            f"{key_padding_mask.ndim}-D tensor instead"
        )
    if attn_mask is not None and attn_mask.ndim not in (2, 3):
        raise MultiheadAttentionError(f"attn_mask's dimension {attn_mask.ndim} is not supported")
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    key_padding_mask = _canonical_mask(key_padding_mask, "key_padding_mask", query.dtype)
    if is_causal and attn_mask is None:
        raise MultiheadAttentionError(
            "Need attn_mask if specifying the is_causal hint. You may use the Transformer "
            "module method `generate_square_subsequent_mask` to create this mask."
        )
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None  # the hint goes to scaled_dot_product_attention as is_causal
    else:
        attn_mask = _canonical_mask(attn_mask, "attn_mask", query.dtype)
        if key_padding_mask is not None:
            is_causal = False  # the merged mask is no longer causal
    if embed_dim != embed_dim_to_check:
        raise MultiheadAttentionError(
            f"was expecting embedding dimension of {embed_dim_to_check}, but got {embed_dim}"
        )
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise MultiheadAttentionError(
            f"embed_dim {embed_dim} not divisible by num_heads {num_heads}"
        )
    if use_separate_proj_weight:
        if tuple(key.shape[:2]) != tuple(value.shape[:2]):
            raise MultiheadAttentionError(
                f"key's sequence and batch dims {tuple(key.shape[:2])} do not match value's "
                f"{tuple(value.shape[:2])}"
            )
        if q_proj_weight is None or k_proj_weight is None or v_proj_weight is None:
            raise MultiheadAttentionError(
                "use_separate_proj_weight is True but q_proj_weight, k_proj_weight or "
                "v_proj_weight is None"
            )
        weights = (q_proj_weight, k_proj_weight, v_proj_weight)
        packed = None
    else:
        if tuple(key.shape) != tuple(value.shape):
            raise MultiheadAttentionError(
                f"key shape {tuple(key.shape)} does not match value shape {tuple(value.shape)}"
            )
        if in_proj_weight is None:
            raise MultiheadAttentionError(
                "use_separate_proj_weight is False but in_proj_weight is None"
            )
        weights = in_proj_weight.chunk(3)  # type: ignore[assignment]
        packed = in_proj_weight
    biases = (None, None, None) if in_proj_bias is None else in_proj_bias.chunk(3)
    q, k, v = _in_projection(query, key, value, weights, biases, packed, in_proj_bias)

    if attn_mask is not None:
        if attn_mask.ndim == 2:
            if tuple(attn_mask.shape) != (tgt_len, src_len):
                raise MultiheadAttentionError(
                    f"The shape of the 2D attn_mask is {tuple(attn_mask.shape)}, but should be "
                    f"{(tgt_len, src_len)}."
                )
            attn_mask = attn_mask.unsqueeze(0)
        elif tuple(attn_mask.shape) != (bsz * num_heads, tgt_len, src_len):
            raise MultiheadAttentionError(
                f"The shape of the 3D attn_mask is {tuple(attn_mask.shape)}, but should be "
                f"{(bsz * num_heads, tgt_len, src_len)}."
            )
    if bias_k is not None and bias_v is not None:
        if static_k is not None or static_v is not None:
            raise MultiheadAttentionError("bias cannot be added to static key or value.")
        k = cat([k, bias_k.expand(1, bsz, embed_dim)])
        v = cat([v, bias_v.expand(1, bsz, embed_dim)])
        attn_mask = None if attn_mask is None else pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else pad(key_padding_mask, (0, 1))
    elif (bias_k is None) != (bias_v is None):
        raise MultiheadAttentionError("bias_k and bias_v must be given together")

    # (len, N, E) -> (N * heads, len, head_dim)
    q = q.reshape(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = _heads(k, static_k, bsz * num_heads, head_dim, "static_k")
    v = _heads(v, static_v, bsz * num_heads, head_dim, "static_v")
    if add_zero_attn:
        zero = zeros(bsz * num_heads, 1, head_dim, dtype=k.dtype, device=k.device)
        k, v = cat([k, zero], 1), cat([v, zero], 1)
        attn_mask = None if attn_mask is None else pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else pad(key_padding_mask, (0, 1))
    src_len = k.shape[1]
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (bsz, src_len):
            raise MultiheadAttentionError(
                f"expected key_padding_mask of shape {(bsz, src_len)}, but got "
                f"{tuple(key_padding_mask.shape)}"
            )
        padding = (
            key_padding_mask.reshape(bsz, 1, 1, src_len)
            .expand(bsz, num_heads, 1, src_len)
            .reshape(bsz * num_heads, 1, src_len)
        )
        attn_mask = padding if attn_mask is None else attn_mask + padding
    if not training:
        dropout_p = 0.0

    if need_weights:
        scores = (q * math.sqrt(1.0 / head_dim)) @ k.transpose(-2, -1)
        if attn_mask is not None:
            scores = attn_mask + scores
        attn_weights = softmax(scores, -1)
        if dropout_p > 0.0:
            attn_weights = dropout(attn_weights, dropout_p)
        out = (attn_weights @ v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        out = linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, -1)
        attn_weights = attn_weights.reshape(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            attn_weights = attn_weights.mean(1)
        if not batched:
            out, attn_weights = out.squeeze(1), attn_weights.squeeze(0)
        return out, attn_weights
    if attn_mask is not None:
        if attn_mask.shape[0] == 1:
            attn_mask = attn_mask.unsqueeze(0)
        else:
            attn_mask = attn_mask.reshape(bsz, num_heads, -1, src_len)
    out = scaled_dot_product_attention(
        q.reshape(bsz, num_heads, tgt_len, head_dim),
        k.reshape(bsz, num_heads, src_len, head_dim),
        v.reshape(bsz, num_heads, src_len, head_dim),
        attn_mask,
        dropout_p,
        is_causal,
    )
    out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
    out = linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, -1)
    return (out if batched else out.squeeze(1)), None


def _heads(x: Tensor, static: Tensor | None, rows: int, head_dim: int, name: str) -> Tensor:
    """(len, N, E) as (N * heads, len, head_dim), or the given static (N * heads, S, head_dim)."""
    if static is None:
        return x.reshape(x.shape[0], rows, head_dim).transpose(0, 1)
    if static.shape[0] != rows or static.shape[2] != head_dim:
        raise MultiheadAttentionError(
            f"expecting {name} of shape ({rows}, *, {head_dim}), but got {tuple(static.shape)}"
        )
    return static
