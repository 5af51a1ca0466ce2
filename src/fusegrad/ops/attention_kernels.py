"""Fused CPU kernels of scaled dot-product attention (the ``attention`` and
``attention_backward`` primitives of ``ops/primitives.py``), in the manner of FlashAttention:
no (L, S) score or weight matrix is ever stored.

Forward, per batch-and-head slab and query row ``i`` (slabs run in parallel, ``prange``): the
scores of the row, ``s_j = scale * q_i . k_j + bias_ij`` (causal rows stop at ``j = i``), live in
one buffer of S floats; then their maximum, ``p_j = exp(s_j - max)``, the sum of those, and
``out_i = sum_j p_j v_j / sum``.  The row's logsumexp ``max + log(sum)`` is written beside the
output (the packed output has one more column), and the backward recomputes the weights from
it, ``p_j = exp(s_j - lse_i)``, with ``ds_j = p_j (g_i . v_j - delta_i)`` and
``delta_i = g_i . out_i - g_lse_i``: ``dq_i = scale sum_j ds_j k_j``, ``dk_j += scale ds_j q_i``,
``dv_j += p_j g_i``.  A row with nothing to attend to (every bias -inf) gets zeros and
``lse = +inf`` (so its weights recompute to 0, its gradients are 0), as the composite's safe
softmax gives.

Loops are ordered so that the innermost one runs over contiguous memory without a reduction
(scores over keys with the keys transposed, outputs and gradients over the head dimension), so
numba vectorises them without reassociating any sum.  The kernels are compiled on first use
with ``cache=True``; this module (and numba with it) is imported by the primitives' kernels
on their first call, never when fusegrad is imported.
"""

from __future__ import annotations

import numba  # this module is imported on first use only (by the attention primitives' kernels)
import numpy as np
from numba.extending import overload

from fusegrad.compiler.codegen.fastmath import fast_exp_f32

from .._numba_cache import fast_loading


def _exp(x):  # type: ignore[no-untyped-def]
    """exp in the kernels: float32 through the compiler's vectorisable helper (1 ulp; numba
    has no SVML, and a libm call per weight made the forward 3x slower), float64 libm's."""
    return np.exp(x)


@overload(_exp)
def _exp_overload(x):  # type: ignore[no-untyped-def]
    if x == numba.types.float32:
        return lambda x: fast_exp_f32(x)
    return lambda x: np.exp(x)


@numba.njit(cache=True, inline="always", fastmath={"contract"}, error_model="numpy")
def _scores(q, kt, bias, n, m, i, end, has_bias, scale, s):  # type: ignore[no-untyped-def]
    """``s[:end]`` = the scaled, biased scores of query row ``i`` of slab ``n``."""
    for j in range(end):
        s[j] = 0.0
    for d in range(q.shape[2]):
        qd = q[n, i, d]
        for j in range(end):
            s[j] += qd * kt[d, j]
    for j in range(end):
        s[j] *= scale
    if has_bias:
        for j in range(end):
            s[j] += bias[m, i, j]


@numba.njit(parallel=True, cache=True, fastmath={"contract"}, error_model="numpy")
def _forward(q, k, v, bias, has_bias, shared_bias, scale, causal, out):  # type: ignore[no-untyped-def]
    slabs, length, width = q.shape
    source = k.shape[1]
    for n in numba.prange(slabs):
        kt = np.ascontiguousarray(k[n].T)
        m = np.int64(n) * (1 - np.int64(shared_bias))  # the bias slab: 0 when shared
        s = np.empty(source, q.dtype)
        acc = np.empty(width, q.dtype)
        for i in range(length):
            end = min(i + 1, source) if causal else source
            _scores(q, kt, bias, n, m, i, end, has_bias, scale, s)
            top = -np.inf
            for j in range(end):
                if s[j] > top or s[j] != s[j]:
                    top = s[j]
            if top == -np.inf:  # nothing to attend to: zeros, weights 0 in the backward
                for d in range(width):
                    out[n, i, d] = 0.0
                out[n, i, width] = np.inf
                continue
            total = 0.0
            for j in range(end):
                p = _exp(s[j] - top)
                s[j] = p
                total += p
            for d in range(width):
                acc[d] = 0.0
            for j in range(end):
                p = s[j]
                for d in range(width):
                    acc[d] += p * v[n, j, d]
            for d in range(width):
                out[n, i, d] = acc[d] / total
            out[n, i, width] = top + np.log(total)


@numba.njit(parallel=True, cache=True, fastmath={"contract"}, error_model="numpy")
def _backward(g, q, k, v, packed, bias, has_bias, shared_bias, scale, causal, grads):  # type: ignore[no-untyped-def]
    slabs, length, width = q.shape
    source = k.shape[1]
    for n in numba.prange(slabs):
        kt = np.ascontiguousarray(k[n].T)
        vt = np.ascontiguousarray(v[n].T)
        m = np.int64(n) * (1 - np.int64(shared_bias))  # the bias slab: 0 when shared
        s = np.empty(source, q.dtype)
        dp = np.empty(source, q.dtype)
        dq = np.empty(width, q.dtype)
        for i in range(length):
            lse = packed[n, i, width]
            if lse == np.inf:  # a row with nothing to attend to: no gradient
                continue
            end = min(i + 1, source) if causal else source
            delta = -g[n, i, width]
            for d in range(width):
                delta += g[n, i, d] * packed[n, i, d]
            _scores(q, kt, bias, n, m, i, end, has_bias, scale, s)
            for j in range(end):
                dp[j] = 0.0
            for d in range(width):
                gd = g[n, i, d]
                for j in range(end):
                    dp[j] += gd * vt[d, j]
            for j in range(end):
                p = _exp(s[j] - lse)
                s[j] = p
                dp[j] = p * (dp[j] - delta) * scale
            for d in range(width):
                dq[d] = 0.0
            for j in range(end):
                p = s[j]
                ds = dp[j]
                for d in range(width):
                    grads[n, length + source + j, d] += p * g[n, i, d]
                    grads[n, length + j, d] += ds * q[n, i, d]
                    dq[d] += ds * k[n, j, d]
            for d in range(width):
                grads[n, i, d] = dq[d]


def _bias(mask: np.ndarray | None, dtype: np.dtype) -> tuple[np.ndarray, bool, bool]:
    """``(bias, has_bias, shared)``: the mask as an additive bias in the inputs' dtype (a bool
    mask's False is -inf), one slab shared by every slab or one per slab."""
    if mask is None:
        return np.zeros((1, 1, 1), dtype), False, True
    if mask.dtype == np.bool_:
        bias = np.where(mask, 0.0, -np.inf).astype(dtype)
    else:
        bias = np.ascontiguousarray(mask, dtype=dtype)
    return bias, True, bias.shape[0] == 1


def attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    scale: float,
    causal: bool,
) -> np.ndarray:
    """``(N, L, E + 1)``: the attention output of every slab, its rows' logsumexp last."""
    dtype = q.dtype
    q, k, v = (np.ascontiguousarray(a) for a in (q, k, v))
    bias, has_bias, shared = _bias(mask, dtype)
    out = np.empty(q.shape[:2] + (q.shape[2] + 1,), dtype)
    _forward(q, k, v, bias, has_bias, shared, dtype.type(scale), causal, out)
    return out


def attention_backward(
    g: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    packed: np.ndarray,
    mask: np.ndarray | None,
    scale: float,
    causal: bool,
) -> np.ndarray:
    """``(N, L + 2 S, E)``: the gradients of q, k and v stacked along dim 1."""
    dtype = q.dtype
    g, q, k, v, packed = (np.ascontiguousarray(a) for a in (g, q, k, v, packed))
    bias, has_bias, shared = _bias(mask, dtype)
    slabs, length, width = q.shape
    grads = np.zeros((slabs, length + 2 * k.shape[1], width), dtype)
    _backward(g, q, k, v, packed, bias, has_bias, shared, dtype.type(scale), causal, grads)
    return grads


fast_loading(globals())  # (loaded from the disk cache without numba's start-up work)
