"""Linear algebra op surface: matmul/@ (batched, broadcasting), mm, bmm, dot, mv, outer, einsum,
linear, cdist.

``matmul`` is the one primitive (operands of rank >= 2, numpy batch broadcasting); 1-D operands
are unsqueezed and squeezed around it.  ``einsum`` reduces each contraction to permute/reshape
plus one batched matmul, so it is differentiable through those primitives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..autograd.node_names import name_node as _name_node
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..errors import DTypeError, ShapeError, describe
from ..size import broadcast_shapes
from ..tensor import Tensor
from ._util import P, apply, cast, to_tensor
from .elementwise import where
from .reduction import norm, sum
from .shape import stack


def _check_dtypes(op: str, a: Tensor, b: Tensor) -> _dt.dtype:
    if a._dtype is not b._dtype:
        raise DTypeError(
            f"{op}: expected both operands to have the same dtype, but got {describe(a, b)}"
        )
    if a._dtype is _dt.bool_:
        raise DTypeError(f"{op}: not implemented for bool tensors ({describe(a, b)})")
    return a._dtype


def matmul(input: Any, other: Any) -> Tensor:
    a, b = to_tensor(input), to_tensor(other)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(
            f"matmul: both arguments need to be at least 1D, but they are {a.ndim}D and {b.ndim}D"
        )
    _check_dtypes("matmul", a, b)
    a2 = a.unsqueeze(0) if a.ndim == 1 else a
    b2 = b.unsqueeze(-1) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ShapeError(
            f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied "
            f"({a2.shape[-1]} != {b2.shape[-2]})"
        )
    try:
        broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ShapeError(
            f"matmul: batch dimensions of {tuple(a.shape)} and {tuple(b.shape)} cannot broadcast"
        ) from None
    if a2.ndim >= 3 and b2.ndim == 2 and _should_fold(a2, b2):
        # (..., m, k) @ (k, n) as one (... m, k) @ (k, n) product, as PyTorch folds it: one
        # BLAS call instead of one per batch element, and a weight gradient that is one
        # product too, not a batch of products summed (a linear layer on a sequence)
        lead = tuple(a2.shape[:-1])
        flat = apply(P["matmul"], (a2.reshape(-1, a2.shape[-1]), b2), {})
        out = flat.reshape(*lead, b2.shape[-1])
        _name_node(out, "UnsafeViewBackward0")
    else:
        out = apply(P["matmul"], (a2, b2), {})
    if a.ndim == 1:
        out = out.squeeze(-2)
    if b.ndim == 1:
        out = out.squeeze(-1)
    if a.ndim == 1 or b.ndim == 1:
        # PyTorch's names: dot, mv, a squeeze after a vector-matrix mm, a batched product's
        # reshape (the primitive's own node is named by its ranks: mm or batched)
        if a.ndim == 1 and b.ndim == 1:
            name = "DotBackward0"
        elif b.ndim == 1:
            name = "MvBackward0" if a.ndim == 2 else "UnsafeViewBackward0"
        else:
            name = "SqueezeBackward4" if b.ndim == 2 else "UnsafeViewBackward0"
        _name_node(out, name)
    return out


def _should_fold(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` (..., m, k) @ ``b`` (k, n) runs as one 2-D product: when a gradient is
    wanted (the folded backward is one product per operand), or when ``a``'s leading dims fold
    into its rows without a copy (PyTorch's ``should_fold``)."""
    if a.requires_grad or b.requires_grad:
        return True
    if a.numel() == 0:
        return True
    strides, shape = a.stride(), a.shape
    return all(strides[d] == strides[d + 1] * shape[d + 1] for d in range(a.ndim - 2))


@_torch_node_name("MmBackward0")
def mm(input: Tensor, mat2: Tensor) -> Tensor:
    a, b = to_tensor(input), to_tensor(mat2)
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"mm: expected 2-D tensors, got {describe(a, b)}")
    return matmul(a, b)


@_torch_node_name("BmmBackward0")
def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    a, b = to_tensor(input), to_tensor(mat2)
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0]:
        raise ShapeError(f"bmm: expected 3-D tensors with equal batch size, got {describe(a, b)}")
    return matmul(a, b)


@_torch_node_name("MvBackward0")
def mv(input: Tensor, vec: Tensor) -> Tensor:
    a, b = to_tensor(input), to_tensor(vec)
    if a.ndim != 2 or b.ndim != 1:
        raise ShapeError(f"mv: expected a matrix and a vector, got {describe(a, b)}")
    return matmul(a, b)


@_torch_node_name("DotBackward0")
def dot(input: Tensor, other: Tensor) -> Tensor:
    a, b = to_tensor(input), to_tensor(other)
    if a.ndim != 1 or b.ndim != 1:
        raise ShapeError(f"dot: 1D tensors expected, but got {describe(a, b)}")
    if a.shape[0] != b.shape[0]:
        raise ShapeError(
            f"dot: inconsistent tensor size, expected tensor [{a.shape[0]}] and src "
            f"[{b.shape[0]}] to have the same number of elements"
        )
    return matmul(a, b)


inner = dot


def outer(input: Tensor, vec2: Tensor) -> Tensor:
    a, b = to_tensor(input), to_tensor(vec2)
    if a.ndim != 1 or b.ndim != 1:
        raise ShapeError(f"outer: 1D tensors expected, but got {describe(a, b)}")
    return a.unsqueeze(1) * b.unsqueeze(0)


ger = outer


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    x, w = to_tensor(input), to_tensor(weight)
    if x.shape[-1] != w.shape[-1]:
        raise ShapeError(
            f"linear: input {describe(x)} and weight {describe(w)} are incompatible "
            f"(in_features {x.shape[-1]} != {w.shape[-1]})"
        )
    out = matmul(x, w.mT if w.ndim == 2 else w)
    if bias is None:
        return out  # (named by matmul: MmBackward0, or a batched product's UnsafeViewBackward0)
    # PyTorch adds the bias inside addmm for a matrix input, and reshapes an addmm's result
    # for a batched one
    return _name_node(out + bias, "AddmmBackward0" if x.ndim == 2 else "ViewBackward0")


# ---- einsum ----------------------------------------------------------------------------------


def _parse(equation: str, operands: list[Tensor]) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, rhs = eq.split("->")
    else:
        lhs, rhs = eq, None
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ShapeError(
            f"einsum(): {len(terms)} operand subscripts for {len(operands)} operands in "
            f"{equation!r}"
        )
    # expand '...' into fresh upper-case letters, right-aligned across operands (broadcasting)
    ell_letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    ranks = []
    for term, op in zip(terms, operands):
        if "..." in term:
            n = op.ndim - (len(term) - 3)
            if n < 0:
                raise ShapeError(
                    f"einsum(): subscript {term!r} has too many dims for {describe(op)}"
                )
            ranks.append(n)
        else:
            if len(term) != op.ndim:
                raise ShapeError(
                    f"einsum(): the number of subscripts in {term!r} does not match the number "
                    f"of dimensions ({op.ndim}) of operand {describe(op)}"
                )
            ranks.append(0)
    ell_rank = max(ranks, default=0)
    expanded = [
        term.replace("...", ell_letters[ell_rank - n : ell_rank]) for term, n in zip(terms, ranks)
    ]
    ell = ell_letters[:ell_rank]
    if rhs is None:
        counts: dict[str, int] = {}
        for term in expanded:
            for c in term:
                counts[c] = counts.get(c, 0) + 1
        rhs = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c.islower()))
    else:
        rhs = rhs.replace("...", ell)
    return expanded, rhs


def _diagonalise(x: Tensor, term: str) -> tuple[Tensor, str]:
    """Take diagonals for repeated letters within one operand ('ii' -> 'i')."""
    while len(set(term)) != len(term):
        for i, c in enumerate(term):
            j = term.find(c, i + 1)
            if j >= 0:
                x = x.diagonal(0, i, j)  # diagonal dim goes last
                term = term[:i] + term[i + 1 : j] + term[j + 1 :] + c
                break
    return x, term


def _sum_out(x: Tensor, term: str, keep: set[str]) -> tuple[Tensor, str]:
    drop = [i for i, c in enumerate(term) if c not in keep]
    if drop:
        x = x.sum(dim=tuple(drop))
        term = "".join(c for c in term if c in keep)
    return x, term


def _contract(a: Tensor, ta: str, b: Tensor, tb: str, keep: set[str]) -> tuple[Tensor, str]:
    """Contract two operands over the letters they share that are not kept."""
    batch = [c for c in ta if c in tb and c in keep]
    contracted = [c for c in ta if c in tb and c not in keep]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    # a contracted letter of size 1 on one side broadcasts: sum(a_0 * b_c) = a_0 * sum(b_c)
    for c in contracted:
        na, nb = a.shape[ta.index(c)], b.shape[tb.index(c)]
        if na == 1 and nb != 1:
            b = b.sum(dim=tb.index(c), keepdim=True)
        elif nb == 1 and na != 1:
            a = a.sum(dim=ta.index(c), keepdim=True)
    a = a.permute([ta.index(c) for c in batch + left + contracted])
    b = b.permute([tb.index(c) for c in batch + contracted + right])
    nb = len(batch)
    bshape = tuple(broadcast_shapes(tuple(a.shape[:nb]), tuple(b.shape[:nb])))
    lsz = [a.shape[nb + i] for i in range(len(left))]
    rsz = [b.shape[nb + len(contracted) + i] for i in range(len(right))]
    csz_a = [a.shape[nb + len(left) + i] for i in range(len(contracted))]
    csz_b = [b.shape[nb + i] for i in range(len(contracted))]
    if csz_a != csz_b:
        raise ShapeError(f"einsum(): contracted dims {contracted} differ: {csz_a} vs {csz_b}")
    a3 = a.reshape(tuple(a.shape[:nb]) + (int(np.prod(lsz)), int(np.prod(csz_a))))
    b3 = b.reshape(tuple(b.shape[:nb]) + (int(np.prod(csz_b)), int(np.prod(rsz))))
    out = matmul(a3, b3).reshape(bshape + tuple(lsz) + tuple(rsz))
    return out, "".join(batch + left + right)


def einsum(equation: str, *operands: Any) -> Tensor:
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    ops = [to_tensor(o) for o in operands]
    dt = _dt.result_type(*ops)
    ops = [cast(o, dt) for o in ops]
    terms, rhs = _parse(equation, ops)
    pairs = [_diagonalise(o, t) for o, t in zip(ops, terms)]
    sizes: dict[str, int] = {}
    for o, t in pairs:
        for c, s in zip(t, o.shape):
            if c in sizes and s != sizes[c] and 1 not in (s, sizes[c]):
                raise ShapeError(
                    f"einsum(): subscript {c} has size {s} which does not broadcast with "
                    f"previously seen size {sizes[c]}"
                )
            sizes[c] = s if c not in sizes or sizes[c] == 1 else sizes[c]
    # contract left to right; a letter is kept while the output or a later operand needs it
    x, tx = pairs[0]
    later = "".join(t for _, t in pairs[1:])
    x, tx = _sum_out(x, tx, set(rhs) | set(later))
    for k in range(1, len(pairs)):
        y, ty = pairs[k]
        later = "".join(t for _, t in pairs[k + 1 :])
        keep = set(rhs) | set(later)
        y, ty = _sum_out(y, ty, keep | set(tx))
        x, tx = _contract(x, tx, y, ty, keep)
    for c in rhs:
        if c not in tx:
            raise ShapeError(f"einsum(): output subscript {c} does not appear in the inputs")
    x, tx = _sum_out(x, tx, set(rhs))
    out = x.permute([tx.index(c) for c in rhs]) if tx != rhs else x
    return out


# ---- matrix products with an added term (composites) -----------------------------------------


def _scaled_sum(op: str, input: Tensor, product: Tensor, beta: Any, alpha: Any) -> Tensor:
    """``beta * input + alpha * product`` with PyTorch's rules: ``input`` broadcasts to the
    product's shape, and ``beta == 0`` ignores ``input`` (its nan and inf do not propagate)."""
    try:
        shape = broadcast_shapes(tuple(input.shape), tuple(product.shape))
    except ValueError:
        shape = None
    if shape != tuple(product.shape):
        raise ShapeError(
            f"{op}: input {describe(input)} cannot broadcast to the product's shape "
            f"{tuple(product.shape)}"
        )
    out = product if alpha == 1 else product * alpha
    if beta == 0:
        if input.requires_grad:
            # PyTorch gives ``input`` a zero gradient (not None); where() drops its values
            out = out + where(True, 0.0, input)
        return out
    return out + (input if beta == 1 else input * beta)


def _check_product(op: str, a: Tensor, b: Tensor, rank: int) -> None:
    if a.ndim != rank or b.ndim != rank:
        raise ShapeError(f"{op}: expected two {rank}-D tensors, got {describe(a, b)}")
    if a.shape[-1] != b.shape[-2] or (rank == 3 and a.shape[0] != b.shape[0]):
        raise ShapeError(f"{op}: shapes of {describe(a, b)} cannot be multiplied")


@_torch_node_name("AddmmBackward0")
def addmm(input: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """``beta * input + alpha * (mat1 @ mat2)``, ``mat1`` and ``mat2`` 2-D."""
    a, b = to_tensor(mat1), to_tensor(mat2)
    _check_product("addmm", a, b, 2)
    return _scaled_sum("addmm", to_tensor(input), mm(a, b), beta, alpha)


@_torch_node_name("BaddbmmBackward0")
def baddbmm(input: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """``beta * input + alpha * bmm(batch1, batch2)``."""
    a, b = to_tensor(batch1), to_tensor(batch2)
    _check_product("baddbmm", a, b, 3)
    return _scaled_sum("baddbmm", to_tensor(input), bmm(a, b), beta, alpha)


@_torch_node_name("AddbmmBackward0")
def addbmm(input: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """``beta * input + alpha * sum_b(batch1[b] @ batch2[b])``."""
    a, b = to_tensor(batch1), to_tensor(batch2)
    _check_product("addbmm", a, b, 3)
    return _scaled_sum("addbmm", to_tensor(input), bmm(a, b).sum(0), beta, alpha)


def cross(input: Any, other: Any, dim: int | None = None) -> Tensor:
    """The cross product of 3-vectors along ``dim`` (inputs broadcast).  ``dim=None`` means
    ``-1``, the semantics of ``torch.linalg.cross`` (``torch.cross``'s deprecated default picks
    the first dimension of size 3 instead)."""
    a, b = to_tensor(input), to_tensor(other)
    if a.ndim != b.ndim:  # PyTorch broadcasts sizes but not ranks here
        raise ShapeError(
            f"cross: inputs must have the same number of dimensions, got {describe(a, b)}"
        )
    _check_dtypes("cross", a, b)
    try:
        shape = broadcast_shapes(tuple(a.shape), tuple(b.shape))
    except ValueError:
        raise ShapeError(f"cross: shapes of {describe(a, b)} cannot broadcast") from None
    d = -1 if dim is None else dim
    if not -len(shape) <= d < len(shape):
        raise IndexError(
            f"cross: dimension {d} out of range for a {len(shape)}-D tensor "
            f"(expected in [{-len(shape)}, {len(shape) - 1}])"
        )
    if shape[d] != 3:
        raise ShapeError(f"cross: dimension {d} must have size 3, got inputs {describe(a, b)}")
    a, b = a.expand(shape), b.expand(shape)
    a0, a1, a2 = (a.select(d, i) for i in range(3))
    b0, b1, b2 = (b.select(d, i) for i in range(3))
    return stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], d % len(shape))


class CdistError(ShapeError, RuntimeError):
    """Bad arguments of ``cdist`` (ranks, column counts, p): RuntimeErrors in PyTorch."""


class CdistDTypeError(DTypeError, RuntimeError):
    """Non-float or mismatched dtypes in ``cdist`` (a RuntimeError in PyTorch)."""


_CDIST_MODES = (
    "use_mm_for_euclid_dist_if_necessary",
    "use_mm_for_euclid_dist",
    "donot_use_mm_for_euclid_dist",
)


@_torch_node_name("CdistBackward0")
def cdist(
    x1: Any,
    x2: Any,
    p: float = 2.0,
    compute_mode: str = "use_mm_for_euclid_dist_if_necessary",
) -> Tensor:
    """p-norm distances between the rows of ``x1`` (``B x P x M``) and of ``x2``
    (``B x R x M``): ``B x P x R``, batch dimensions broadcast.  ``p`` is any non-negative
    number, 0 (count of differing coordinates) and inf included; gradients are those of
    ``norm`` (zero where two rows coincide, as PyTorch's).  For ``p == 2`` with more than 25
    rows on a side (or ``compute_mode="use_mm_for_euclid_dist"``) distances come from one
    matmul, ``sqrt(clamp_min(|a|^2 + |b|^2 - 2 a.b, 1e-30))``, as PyTorch computes them (faster
    and lighter, less exact for near points); otherwise from the differences directly."""
    a, b = to_tensor(x1), to_tensor(x2)
    if compute_mode not in _CDIST_MODES:
        raise ValueError(f"{compute_mode} is not a valid value for compute_mode")
    for name, t in (("X1", a), ("X2", b)):
        if t.ndim < 2:
            raise CdistError(f"cdist only supports at least 2D tensors, {name} got: {t.ndim}D")
        if t._dtype.category != 2:
            raise CdistDTypeError(
                f"cdist only supports floating-point dtypes, {name} got: {describe(t)}"
            )
    if a._dtype is not b._dtype:
        raise CdistDTypeError(
            f"cdist: expected both inputs to have one dtype, got {describe(a, b)}"
        )
    if a.shape[-1] != b.shape[-1]:
        raise CdistError(
            f"X1 and X2 must have the same number of columns. X1: {a.shape[-1]} X2: {b.shape[-1]}"
        )
    p = float(p)
    if not p >= 0:
        raise CdistError("cdist only supports non-negative p values")
    rows_a, rows_b = a.shape[-2], b.shape[-2]
    use_mm = p == 2.0 and (
        compute_mode == "use_mm_for_euclid_dist"
        or (compute_mode == _CDIST_MODES[0] and (rows_a > 25 or rows_b > 25))
    )
    if use_mm:
        sq_a = sum(a * a, -1, keepdim=True)  # B x P x 1
        sq_b = sum(b * b, -1, keepdim=True)  # B x R x 1
        cross_term = matmul(a, b.transpose(-1, -2))
        squared = sq_a - 2.0 * cross_term + sq_b.transpose(-1, -2)
        return squared.clamp(min=1e-30).sqrt()
    diff = a.unsqueeze(-2) - b.unsqueeze(-3)  # B x P x R x M
    if p == 0:
        # the count of differing coordinates, through sign so that the result stays in the
        # graph with a zero gradient, as PyTorch's (norm's p=0 count is a constant)
        return sum(diff.sign().abs(), -1)
    return norm(diff, p, dim=-1)
