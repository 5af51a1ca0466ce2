"""``fusegrad.linalg``: PyTorch's ``torch.linalg``, batched and differentiable (docs/linalg.md).

The factorizations, solvers and matrix functions are primitives (``ops/decompositions.py``,
numpy's LAPACK bindings and a batched LU), one per output, with their derivative rules in
``autograd/derivatives.py``; everything else here is a composite of those and of the op surface
(``inv`` is a solve, ``lu_solve`` two triangular solves, norms are reductions, ``lstsq`` a
pseudoinverse, ``householder_product`` a product of reflectors), so it differentiates through
their rules to any order.  ``ldl_factor``/``ldl_solve`` are the exception: PyTorch has no
derivative for them, so they run LAPACK on the host arrays and their outputs carry a node that
raises when differentiated.

Arguments are checked before anything runs (square matrices, floating or complex dtypes, equal
dtypes), and singular or non-positive-definite inputs raise ``LinAlgError`` with PyTorch's words
(batch element, pivot, leading minor), recording nothing.  The ``_ex`` variants return an
``info`` tensor instead.
"""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import ops as F
from ..autograd.function import Function
from ..autograd.node_names import name_node as _name_node
from ..autograd.tracer import notify_host_read as _host_read
from ..errors import AutogradError, DTypeError, ShapeError, describe
from ..ops import REGISTRY, apply, to_tensor
from ..ops._util import wrap_dim, wrap_dims
from ..ops.decompositions import (
    LinAlgError,
    cholesky_info,
    hermitian_from_lower,
    ldl_factor_arrays,
    ldl_pivots_error,
    ldl_solve_arrays,
    lu_with_info,
    singular_error,
)
from ..ops.linalg import cross as _cross
from ..ops.linalg import matmul
from ..tensor import Tensor

__all__ = [
    "LinAlgError",
    "cholesky",
    "cholesky_ex",
    "cond",
    "cross",
    "det",
    "diagonal",
    "eig",
    "eigh",
    "eigvals",
    "eigvalsh",
    "householder_product",
    "inv",
    "inv_ex",
    "ldl_factor",
    "ldl_factor_ex",
    "ldl_solve",
    "lstsq",
    "lu",
    "lu_factor",
    "lu_factor_ex",
    "lu_solve",
    "matmul",
    "matrix_exp",
    "matrix_norm",
    "matrix_power",
    "matrix_rank",
    "multi_dot",
    "norm",
    "pinv",
    "qr",
    "slogdet",
    "solve",
    "solve_ex",
    "solve_triangular",
    "svd",
    "svdvals",
    "tensorinv",
    "tensorsolve",
    "vander",
    "vecdot",
    "vector_norm",
]

_SolveEx = namedtuple("linalg_solve_ex", ["result", "info"])
_InvEx = namedtuple("linalg_inv_ex", ["inverse", "info"])
_CholeskyEx = namedtuple("linalg_cholesky_ex", ["L", "info"])
_LuFactor = namedtuple("linalg_lu_factor", ["LU", "pivots"])
_LuFactorEx = namedtuple("linalg_lu_factor_ex", ["LU", "pivots", "info"])
_Lu = namedtuple("linalg_lu", ["P", "L", "U"])
_LdlFactor = namedtuple("linalg_ldl_factor", ["LD", "pivots"])
_LdlFactorEx = namedtuple("linalg_ldl_factor_ex", ["LD", "pivots", "info"])
_Slogdet = namedtuple("linalg_slogdet", ["sign", "logabsdet"])
_Eigh = namedtuple("linalg_eigh", ["eigenvalues", "eigenvectors"])
_Eig = namedtuple("linalg_eig", ["eigenvalues", "eigenvectors"])
_Svd = namedtuple("linalg_svd", ["U", "S", "Vh"])
_Qr = namedtuple("linalg_qr", ["Q", "R"])
_Lstsq = namedtuple("linalg_lstsq", ["solution", "residuals", "rank", "singular_values"])


class LinAlgArgumentError(ShapeError, RuntimeError):
    """Bad shapes or arguments of a linalg function (RuntimeErrors in PyTorch)."""


class LinAlgDTypeError(DTypeError, RuntimeError):
    """A dtype a linalg function does not take (RuntimeErrors in PyTorch)."""


# ---- checks -------------------------------------------------------------------------------------


def _prim(name: str, *inputs: Tensor, **attrs: Any) -> Tensor:
    return apply(REGISTRY[name], inputs, attrs)


def _floating(op: str, A: Any) -> Tensor:
    A = to_tensor(A)
    if A.is_cuda:  # (the kernels are numpy's; no CUDA kernel yet)
        raise NotImplementedError(f"{op}: CUDA tensors are not supported yet (got {describe(A)})")
    if A._dtype.category < 2 or A._dtype in _dt.HALF:
        raise LinAlgDTypeError(
            f"{op}: Expected a floating point or complex tensor as input. Got {A._dtype.name}"
        )
    return A


def _matrix(op: str, A: Any, square: bool = True) -> Tensor:
    A = _floating(op, A)
    if A.ndim < 2:
        raise LinAlgArgumentError(
            f"{op}: The input tensor A must have at least 2 dimensions. (got {describe(A)})"
        )
    if square and A.shape[-1] != A.shape[-2]:
        raise LinAlgArgumentError(
            f"{op}: A must be batches of square matrices, but they are {A.shape[-2]} by "
            f"{A.shape[-1]} matrices"
        )
    return A


def _same_dtype(op: str, A: Tensor, B: Tensor) -> None:
    if A._dtype is not B._dtype:
        raise LinAlgDTypeError(
            f"{op}: Expected A and B to have the same dtype, but found A of type "
            f"{A._dtype.name} and B of type {B._dtype.name} instead"
        )


def _broadcast_batches(A: Tensor, B: Tensor) -> tuple[Tensor, Tensor]:
    """``A`` and ``B`` with their batch dims (all but the last two) broadcast together."""
    try:
        batch = tuple(np.broadcast_shapes(tuple(A.shape[:-2]), tuple(B.shape[:-2])))
    except ValueError:
        raise LinAlgArgumentError(
            f"the batch dims of {describe(A)} and {describe(B)} cannot broadcast"
        ) from None
    if tuple(A.shape[:-2]) != batch:
        A = A.expand(batch + tuple(A.shape[-2:]))
    if tuple(B.shape[:-2]) != batch:
        B = B.expand(batch + tuple(B.shape[-2:]))
    return A, B


def _info_tensor(info: np.ndarray) -> Tensor:
    return Tensor._make(np.asarray(info, np.int32))


def _raise(error: LinAlgError | None) -> None:
    if error is not None:
        raise error


def _eye(n: int, like: Tensor) -> Tensor:
    return F.eye(n, dtype=like.dtype, device=like.device)


# ---- solvers ------------------------------------------------------------------------------------


def _solve_args(op: str, A: Any, B: Any, left: bool) -> tuple[Tensor, Tensor, bool]:
    A = _matrix(op, A)
    B = _floating(op, B)
    _same_dtype(op, A, B)
    # B is a vector when it is 1-D, or has A's batch dims and one dim less than A
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    if vector:
        B = B.unsqueeze(-1)
    n = A.shape[-1]
    rows = B.shape[-2] if left else B.shape[-1]
    if rows != n:
        raise LinAlgArgumentError(
            f"{op}: Incompatible shapes of A and B for the equation "
            f"{'AX = B' if left else 'XA = B'} ({tuple(A.shape[-2:])} and "
            f"{tuple(B.shape[-2:])})"
        )
    return A, B, vector


def _solve(op: str, A: Any, B: Any, left: bool, check: bool, info: bool) -> tuple[Tensor, Any]:
    A, B, vector = _solve_args(op, A, B, left)
    if not left:  # X A = B  <=>  A^T X^T = B^T
        A, B = A.mT, B.mT
    A, B = _broadcast_batches(A, B)
    codes = None
    if info:  # (solve_ex: the LU's info, found apart from the solve)
        codes = lu_with_info(A.detach()._data)[2] if A.numel() else np.zeros(A.shape[:-2], np.int32)
    X = _prim("linalg_solve", A, B, check="solve" if check else None)
    if not left:
        X = X.mT
    if vector:
        X = X.squeeze(-1)
    return X, codes


def solve(A: Any, B: Any, *, left: bool = True) -> Tensor:
    """The solution ``X`` of ``A X = B`` (``left=False``: ``X A = B``), batched and
    broadcast; ``B`` may be a vector."""
    return _solve("linalg.solve", A, B, left, True, False)[0]


def solve_ex(A: Any, B: Any, *, left: bool = True, check_errors: bool = False) -> Any:
    """``solve`` with an ``info`` tensor (0, or the index of the first zero pivot) instead of
    an error for a singular ``A`` (whose solution then holds inf and nan)."""
    X, info = _solve("linalg.solve_ex", A, B, left, check_errors, True)
    return _SolveEx(X, _info_tensor(info))


def solve_triangular(
    A: Any, B: Any, *, upper: bool, left: bool = True, unitriangular: bool = False
) -> Tensor:
    """``A^-1 B`` (``left=False``: ``B A^-1``) for triangular ``A``: only its ``upper`` or lower
    triangle is read (its diagonal as ones with ``unitriangular``)."""
    op = "linalg.solve_triangular"
    A = _matrix(op, A)
    B = _matrix(op, B, square=False)
    _same_dtype(op, A, B)
    n = A.shape[-1]
    if (B.shape[-2] if left else B.shape[-1]) != n:
        raise LinAlgArgumentError(
            f"{op}: Incompatible shapes of A and B for the equation "
            f"{'AX = B' if left else 'XA = B'} ({tuple(A.shape[-2:])} and {tuple(B.shape[-2:])})"
        )
    A, B = _broadcast_batches(A, B)
    attrs = {"upper": bool(upper), "left": bool(left), "unitriangular": bool(unitriangular)}
    return _prim("linalg_solve_triangular", A, B, **attrs)


_INV_SINGULAR = (  # (inv_ex's check_errors; inv's own check is the solve's)
    "The diagonal element {i} is zero, the inversion could not be completed because the input "
    "matrix is singular."
)


def inv(A: Any) -> Tensor:
    """The inverse of each square matrix (a solve against the identity)."""
    A = _matrix("linalg.inv", A)
    out = _prim("linalg_solve", A, _eye(A.shape[-1], A).expand(tuple(A.shape)), check="inv")
    return _name_node(out, "LinalgInvExBackward0")


def inv_ex(A: Any, *, check_errors: bool = False) -> Any:
    A = _matrix("linalg.inv_ex", A)
    info = lu_with_info(A.detach()._data)[2] if A.numel() else np.zeros(A.shape[:-2], np.int32)
    if check_errors and info.any():
        _raise(singular_error("linalg.inv_ex", A.detach()._data, _INV_SINGULAR))
    out = _prim("linalg_solve", A, _eye(A.shape[-1], A).expand(tuple(A.shape)), check=None)
    return _InvEx(out, _info_tensor(info))


# ---- determinants -------------------------------------------------------------------------------


def det(A: Any) -> Tensor:
    """The determinant of each square matrix."""
    A = _matrix("linalg.det", A)
    return _name_node(_prim("linalg_det", A), "LinalgDetBackward0")


def slogdet(A: Any) -> Any:
    """``(sign, logabsdet)``: the sign (for complex matrices, the phase ``det / |det|``) and the
    log of the absolute value of the determinant, without overflow."""
    A = _matrix("linalg.slogdet", A)
    logabsdet = _prim("linalg_logabsdet", A)
    if A._dtype.is_complex:
        sign = det(A).sgn()  # (differentiable: the phase of the determinant)
    else:
        sign = _prim("linalg_slogdet_sign", A)
    return _Slogdet(sign, logabsdet)


def logdet(A: Any) -> Tensor:
    """``log(det(A))``: nan for a negative real determinant, -inf for a zero one; for complex
    matrices the principal log."""
    sign, logabsdet = slogdet(A)
    if sign._dtype.is_complex:
        return sign.log() + logabsdet
    return F.where(sign < 0, math.nan, logabsdet)


# ---- Cholesky and LU ----------------------------------------------------------------------------


def _cholesky_check(op: str, A: Tensor) -> np.ndarray:
    if not A.numel():
        return np.zeros(A.shape[:-2], np.int32)
    # (the Hermitian matrix LAPACK reads: A's lower triangle)
    return cholesky_info(hermitian_from_lower(A.detach()._data))


def cholesky(A: Any, *, upper: bool = False) -> Tensor:
    """The Cholesky factor of each Hermitian positive-definite matrix (its lower triangle is
    read): lower triangular, or its conjugate transpose with ``upper``."""
    A = _matrix("linalg.cholesky", A)
    L = _name_node(_prim("linalg_cholesky", A, check=True), "LinalgCholeskyExBackward0")
    return L.mH if upper else L


def cholesky_ex(A: Any, *, upper: bool = False, check_errors: bool = False) -> Any:
    A = _matrix("linalg.cholesky_ex", A)
    info = _cholesky_check("linalg.cholesky_ex", A)
    if check_errors and info.any():
        return cholesky(A, upper=upper)  # raises
    L = _prim("linalg_cholesky", A, check=False)
    return _CholeskyEx(L.mH if upper else L, _info_tensor(info))


def _lu_factor(op: str, A: Any, pivot: bool) -> tuple[Tensor, Tensor, np.ndarray]:
    A = _matrix(op, A, square=False)
    if not pivot:
        raise LinAlgArgumentError(f"{op}: LU without pivoting is not implemented on the CPU.")
    data = A.detach()._data
    info = lu_with_info(data)[2] if A.numel() else np.zeros(A.shape[:-2], np.int32)
    LU = _prim("linalg_lu_factor", A)
    pivots = _prim("linalg_lu_pivots", A.detach())
    return LU, pivots, info


def lu_factor_ex(A: Any, *, pivot: bool = True, check_errors: bool = False) -> Any:
    """The packed LU factorization with partial pivoting (``LU``, 1-based ``pivots``) and
    ``info`` (the 1-based index of the first zero pivot, else 0)."""
    LU, pivots, info = _lu_factor("linalg.lu_factor_ex", A, pivot)
    if check_errors and info.any():
        lu_factor(A, pivot=pivot)  # raises
    return _LuFactorEx(LU, pivots, _info_tensor(info))


def lu_factor(A: Any, *, pivot: bool = True) -> Any:
    """``(LU, pivots)``; a zero pivot raises, as PyTorch's."""
    LU, pivots, info = _lu_factor("torch.linalg.lu_factor", A, pivot)
    if info.any():
        flat = info.reshape(-1)
        index = int(np.flatnonzero(flat)[0])
        i = int(flat[index]) - 1
        prefix = "torch.linalg.lu_factor: " + (
            f"(Batch element {index}): " if to_tensor(A).ndim > 2 else ""
        )
        raise LinAlgError(
            prefix + f"U[{i},{i}] is zero and using it on lu_solve would result in a division by "
            "zero. If you still want to perform the factorization, consider calling "
            "linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)"
        )
    return _LuFactor(LU, pivots)


def _permutation(pivots: Tensor, m: int, like: Tensor) -> Tensor:
    return _prim("linalg_lu_permutation", pivots, m=m, dtype=like.dtype)


def lu(A: Any, *, pivot: bool = True) -> Any:
    """``(P, L, U)`` with ``A = P L U``: ``L`` unit lower trapezoidal (m x k), ``U`` upper
    trapezoidal (k x n), k = min(m, n)."""
    LU, pivots, _ = _lu_factor("linalg.lu", A, pivot)
    m, n = LU.shape[-2], LU.shape[-1]
    k = min(m, n)
    L = LU.narrow(-1, 0, k).tril(-1) + F.eye(m, k, dtype=LU.dtype, device=LU.device)
    U = LU.narrow(-2, 0, k).triu()
    return _Lu(_permutation(pivots, m, LU), L, U)


def lu_solve(LU: Any, pivots: Any, B: Any, *, left: bool = True, adjoint: bool = False) -> Tensor:
    """The solution of ``A X = B`` (``left=False``: ``X A = B``; ``adjoint``: with ``A^H``) from
    ``A``'s ``lu_factor``: two triangular solves and the permutation."""
    op = "linalg.lu_solve"
    LU = _matrix(op, LU)
    B = _matrix(op, B, square=False)
    _same_dtype(op, LU, B)
    pivots = to_tensor(pivots)
    n = LU.shape[-1]
    P = _permutation(pivots, n, LU)
    L = LU.tril(-1) + _eye(n, LU)
    U = LU.triu()
    # A = P L U; A^H = U^H L^H P^T
    if left and not adjoint:
        Y = solve_triangular(L, P.mT @ B, upper=False, unitriangular=True)
        return solve_triangular(U, Y, upper=True)
    if left and adjoint:
        Y = solve_triangular(U.mH, B, upper=False)
        return P @ solve_triangular(L.mH, Y, upper=True, unitriangular=True)
    if not adjoint:  # X P L U = B
        Y = solve_triangular(U, B, upper=True, left=False)
        return solve_triangular(L, Y, upper=False, left=False, unitriangular=True) @ P.mT
    # X U^H L^H P^T = B
    Y = solve_triangular(L.mH, B @ P, upper=True, left=False, unitriangular=True)
    return solve_triangular(U.mH, Y, upper=False, left=False)


# ---- LDL^T --------------------------------------------------------------------------------------


class _NoDerivative(Function):
    """``value`` (computed on the host from ``inputs``) as an output of ``inputs`` whose
    backward raises, as PyTorch's ``NotImplemented`` node does for ``aten_name``."""

    @staticmethod
    def forward(ctx: Any, aten_name: str, value: Tensor, *inputs: Tensor) -> Tensor:
        ctx.aten_name = aten_name
        return value

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        raise AutogradError(f"derivative for aten::{ctx.aten_name} is not implemented")


def _ldl_factor(op: str, A: Any, hermitian: bool) -> tuple[Tensor, Tensor, np.ndarray]:
    A = _matrix(op, A)
    data = _host_read(A, op, A.detach()._data)
    LD, pivots, info = ldl_factor_arrays(data, hermitian)
    LD_tensor = _NoDerivative.apply("linalg_ldl_factor_ex", Tensor._make(LD), A)
    return LD_tensor, Tensor._make(pivots), info


def ldl_factor_ex(A: Any, *, hermitian: bool = False, check_errors: bool = False) -> Any:
    """The compact LDL^T (Bunch-Kaufman) factorization of each symmetric (``hermitian``:
    Hermitian) matrix, read from its lower triangle, as LAPACK's ?sytrf / ?hetrf returns it:
    ``LD`` (L below the diagonal, the 1x1 and 2x2 blocks of D on and next to it), ``pivots``
    (1-based, int32; a 2x2 block shows as two equal negative entries) and ``info`` (0, or the
    1-based index of a zero block of D).  Not differentiable (as in PyTorch)."""
    LD, pivots, info = _ldl_factor("torch.linalg.ldl_factor_ex", A, hermitian)
    if check_errors:
        _ldl_check("torch.linalg.ldl_factor_ex", info)
    return _LdlFactorEx(LD, pivots, _info_tensor(info))


def ldl_factor(A: Any, *, hermitian: bool = False) -> Any:
    """``(LD, pivots)`` of ``ldl_factor_ex``; a singular D raises ``LinAlgError``."""
    LD, pivots, info = _ldl_factor("torch.linalg.ldl_factor", A, hermitian)
    _ldl_check("torch.linalg.ldl_factor", info)
    return _LdlFactor(LD, pivots)


def _ldl_check(op: str, info: np.ndarray) -> None:
    # (PyTorch 2.13 fails here with an internal assert, "Unknown error code"; this says what
    # LAPACK reported)
    if info.any():
        flat = info.reshape(-1)
        index = int(np.flatnonzero(flat)[0])
        i = int(flat[index]) - 1
        prefix = f"{op}: " + (f"(Batch element {index}): " if info.ndim else "")
        raise LinAlgError(
            prefix + f"The factorization could not be completed because the input is singular: "
            f"D[{i},{i}] is exactly zero. linalg.ldl_factor_ex returns the factorization with "
            "info > 0 instead of raising"
        )


def ldl_solve(LD: Any, pivots: Any, B: Any, *, hermitian: bool = False) -> Tensor:
    """The solution ``X`` of ``A X = B`` from ``A``'s ``ldl_factor`` (``LD``, ``pivots``; the
    same ``hermitian``), by LAPACK's ?sytrs / ?hetrs; batch dims broadcast.  Not
    differentiable (as in PyTorch)."""
    op = "torch.linalg.ldl_solve"
    LD = _matrix(op, LD)
    B = _floating(op, B)
    pivots = to_tensor(pivots)
    if B.ndim < 2:
        raise LinAlgArgumentError(
            f"{op}: The input tensor B must have at least 2 dimensions. (got {describe(B)})"
        )
    if pivots._dtype.category != 1:
        raise LinAlgDTypeError(f"{op}: Expected pivots to be integers. Got {pivots._dtype.name}")
    if tuple(pivots.shape) != tuple(LD.shape[:-1]):
        raise LinAlgArgumentError(
            f"{op}: Expected LD.shape[:-1] and pivots.shape to be the same, but got pivots "
            f"with shape {list(pivots.shape)} instead (LD: {describe(LD)})"
        )
    if B.shape[-2] != LD.shape[-1]:
        raise LinAlgArgumentError(
            f"Incompatible matrix sizes for {op}: each A matrix is {LD.shape[-1]} by "
            f"{LD.shape[-1]} but each b matrix is {B.shape[-2]} by {B.shape[-1]}"
        )
    _same_dtype(op, LD, B)
    LD_b, B_b = _broadcast_batches(LD, B)
    pivot_data = np.broadcast_to(
        _host_read(pivots, op, pivots._data), tuple(LD_b.shape[:-1])
    ).astype(np.int32)
    problem = ldl_pivots_error(pivot_data)
    if problem is not None:
        raise LinAlgArgumentError(f"{op}: invalid pivots: {problem}")
    X = ldl_solve_arrays(
        _host_read(LD, op, LD_b.detach()._data),
        pivot_data,
        _host_read(B, op, B_b.detach()._data),
        hermitian,
    )
    return _NoDerivative.apply("linalg_ldl_solve", Tensor._make(X), LD, B)


# ---- spectral decompositions --------------------------------------------------------------------


def _uplo(op: str, UPLO: str) -> bool:
    if UPLO not in ("L", "U"):
        raise LinAlgArgumentError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    return UPLO == "U"


def eigh(A: Any, UPLO: str = "L") -> Any:
    """Eigenvalues (ascending, real) and orthonormal eigenvectors (columns) of each Hermitian
    matrix, read from its lower (``UPLO="U"``: upper) triangle."""
    A = _matrix("linalg.eigh", A)
    upper = _uplo("linalg.eigh", UPLO)
    L = _prim("linalg_eigh_values", A, upper=upper)
    V = _prim("linalg_eigh_vectors", A, upper=upper)
    return _Eigh(L, V)


def eigvalsh(A: Any, UPLO: str = "L") -> Tensor:
    A = _matrix("linalg.eigvalsh", A)
    return _prim("linalg_eigh_values", A, upper=_uplo("linalg.eigvalsh", UPLO))


def eig(A: Any) -> Any:
    """Eigenvalues and unit-norm eigenvectors of general square matrices: complex."""
    A = _matrix("linalg.eig", A)
    return _Eig(_prim("linalg_eig_values", A), _prim("linalg_eig_vectors", A))


def eigvals(A: Any) -> Tensor:
    A = _matrix("linalg.eigvals", A)
    return _prim("linalg_eig_values", A)


def svd(A: Any, full_matrices: bool = True, *, driver: str | None = None) -> Any:
    """``(U, S, Vh)`` with ``A = U diag(S) Vh``, singular values descending."""
    A = _matrix("linalg.svd", A, square=False)
    full = bool(full_matrices)
    U = _prim("linalg_svd_u", A, full_matrices=full)
    S = _prim("linalg_svd_s", A)
    Vh = _prim("linalg_svd_vh", A, full_matrices=full)
    return _Svd(U, S, Vh)


def svdvals(A: Any, *, driver: str | None = None) -> Tensor:
    A = _matrix("linalg.svdvals", A, square=False)
    return _prim("linalg_svd_s", A)


def qr(A: Any, mode: str = "reduced") -> Any:
    """``(Q, R)``: ``mode`` "reduced" (Q m x k), "complete" (Q m x m) or "r" (R only; Q is an
    empty tensor)."""
    op = "linalg.qr"
    A = _matrix(op, A, square=False)
    if mode not in ("reduced", "complete", "r"):
        raise LinAlgArgumentError(
            f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), "
            "'r', or 'complete'"
        )
    R = _prim("linalg_qr_r", A, mode="complete" if mode == "complete" else "reduced")
    if mode == "r":
        return _Qr(F.empty(0, dtype=A.dtype, device=A.device), R)
    return _Qr(_prim("linalg_qr_q", A, mode=mode), R)


def householder_product(A: Any, tau: Any) -> Tensor:
    """The first n columns of ``H_1 H_2 ... H_k``, ``H_i = I - tau_i v_i v_i^H`` with ``v_i``
    the i-th column of ``A`` below the diagonal (1 on it): LAPACK's orgqr, as a product of
    reflectors."""
    op = "linalg.householder_product"
    A = _matrix(op, A, square=False)
    tau = _floating(op, tau)
    _same_dtype(op, A, tau)
    m, n = A.shape[-2], A.shape[-1]
    k = tau.shape[-1]
    if m < n:
        raise LinAlgArgumentError(
            f"{op}: input.shape[-2] must be greater than or equal to input.shape[-1]"
        )
    if k > n:
        raise LinAlgArgumentError(
            f"{op}: input.shape[-1] must be greater than or equal to tau.shape[-1]"
        )
    Q = F.eye(m, n, dtype=A.dtype, device=A.device)
    # build from the last reflector: Q = H_1 (H_2 (... (H_k I)))
    for i in range(k - 1, -1, -1):
        below = A.narrow(-1, i, 1).narrow(-2, i + 1, m - i - 1)
        v = F.cat(
            [
                F.zeros(tuple(A.shape[:-2]) + (i, 1), dtype=A.dtype),
                F.ones(tuple(A.shape[:-2]) + (1, 1), dtype=A.dtype),
                below,
            ],
            -2,
        )
        t = tau.narrow(-1, i, 1).unsqueeze(-1)
        Q = Q - (v * t) @ (v.mH @ Q)
    return Q


# ---- least squares and pseudoinverse ------------------------------------------------------------


def _tolerances(op: str, A: Tensor, atol: Any, rtol: Any) -> tuple[float, float]:
    def value(x: Any) -> float | None:
        if x is None:
            return None
        if isinstance(x, Tensor):
            if x.numel() != 1:
                raise LinAlgArgumentError(f"{op}: only scalar atol / rtol are supported")
            return float(x.item())
        return float(x)

    a, r = value(atol), value(rtol)
    if r is None:
        eps = float(np.finfo(A._dtype.to_real().np).eps)
        r = eps * max(A.shape[-2], A.shape[-1]) if a is None or a == 0 else 0.0
    return (a or 0.0), r


def pinv(
    A: Any, *, atol: Any = None, rtol: Any = None, hermitian: bool = False, rcond: Any = None
) -> Tensor:
    """The Moore-Penrose pseudoinverse: singular values below ``max(atol, rtol * largest)``
    count as zero (``rtol`` defaults to eps * max(m, n) when ``atol`` is not given)."""
    A = _matrix("linalg.pinv", A, square=bool(hermitian))
    if rcond is not None:
        rtol = rcond
    a, r = _tolerances("linalg.pinv", A, atol, rtol)
    return _prim("linalg_pinv", A, atol=a, rtol=r, hermitian=bool(hermitian))


def matrix_rank(
    A: Any, *, atol: Any = None, rtol: Any = None, hermitian: bool = False, tol: Any = None
) -> Tensor:
    """The number of singular values above ``max(atol, rtol * largest)`` (int64)."""
    A = _matrix("linalg.matrix_rank", A, square=bool(hermitian)).detach()
    if tol is not None:
        atol, rtol = tol, 0.0
    a, r = _tolerances("linalg.matrix_rank", A, atol, rtol)
    S = eigvalsh(A).abs() if hermitian else svdvals(A)
    if S.shape[-1] == 0:
        return F.zeros(tuple(A.shape[:-2]), dtype=_dt.int64)
    cutoff = F.maximum(F.full((), a, dtype=S.dtype), S.amax(-1, keepdim=True) * r)
    return (S > cutoff).sum(-1)


def lstsq(A: Any, B: Any, rcond: float | None = None, *, driver: str | None = None) -> Any:
    """The least-squares solution of ``A X = B`` (minimum norm where rank-deficient), with
    PyTorch's extra outputs for ``driver`` ("gelsy" by default on the CPU: ``rank``;
    "gelsd"/"gelss": ``rank``, ``singular_values`` and, for full-rank tall ``A``, the squared
    residuals; "gels": the residuals).  Computed through the pseudoinverse."""
    op = "torch.linalg.lstsq"
    A = _matrix(op, A, square=False)
    B = _floating(op, B)
    _same_dtype(op, A, B)
    driver = driver or "gelsy"
    if driver not in ("gels", "gelsy", "gelsd", "gelss"):
        raise LinAlgArgumentError(
            f"{op}: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)"
        )
    vector = B.ndim == A.ndim - 1
    if vector:
        B = B.unsqueeze(-1)
    if B.shape[-2] != A.shape[-2]:
        raise LinAlgArgumentError(
            f"{op}: input.size(-2) should match other.size(-2) (got {describe(A, B)})"
        )
    A, B = _broadcast_batches(A, B)
    m, n = A.shape[-2], A.shape[-1]
    eps = float(np.finfo(A._dtype.to_real().np).eps)
    r = eps * max(m, n) if rcond is None or rcond < 0 else float(rcond)
    X = pinv(A, rtol=r if driver != "gels" else 0.0, atol=0.0) @ B
    empty = F.empty(0, dtype=A._dtype.to_real(), device=A.device)
    rank = matrix_rank(A, rtol=r, atol=0.0) if driver != "gels" else F.empty(0, dtype=_dt.int64)
    singular_values = svdvals(A.detach()) if driver in ("gelsd", "gelss") else empty
    residuals = empty
    if m > n and driver != "gelsy" and bool((rank == n).all() if driver != "gels" else True):
        residuals = ((A @ X - B).abs() ** 2).sum(-2)
    if vector:
        X = X.squeeze(-1)
    return _Lstsq(X, residuals, rank, singular_values)


# ---- matrix functions ---------------------------------------------------------------------------


def matrix_exp(A: Any) -> Tensor:
    A = _matrix("linalg.matrix_exp", A)
    return _prim("linalg_matrix_exp", A)


def matrix_power(A: Any, n: int) -> Tensor:
    """``A`` to the integer power ``n`` (repeated squaring; a negative ``n`` inverts first)."""
    A = _matrix("linalg.matrix_power", A)
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"linalg.matrix_power(): argument 'n' must be int, not {type(n).__name__}")
    if n == 0:
        return _eye(A.shape[-1], A).expand(tuple(A.shape)).clone()
    if n < 0:
        A, n = inv(A), -n
    result = None
    power = A
    while n:
        if n & 1:
            result = power if result is None else result @ power
        n >>= 1
        if n:
            power = power @ power
    return result if result is not A else A.clone()


def multi_dot(tensors: Sequence[Any]) -> Tensor:
    """The product of a chain of matrices (the first may be a row vector, the last a column
    vector), multiplied in the order that costs the fewest scalar products."""
    ts = [to_tensor(t) for t in tensors]
    if len(ts) < 2:
        raise LinAlgArgumentError("multi_dot(): expected at least 2 tensors but got 1")
    first, last = ts[0].ndim == 1, ts[-1].ndim == 1
    if first:
        ts[0] = ts[0].unsqueeze(0)
    if last:
        ts[-1] = ts[-1].unsqueeze(-1)
    for i, t in enumerate(ts):
        if t.ndim != 2:
            raise LinAlgArgumentError(
                f"multi_dot(): tensor {i} must be 2D but got {t.ndim}D (the first and last may "
                "be 1D)"
            )
    dims = [ts[0].shape[0]] + [t.shape[1] for t in ts]
    for i in range(len(ts) - 1):
        if ts[i].shape[1] != ts[i + 1].shape[0]:
            raise LinAlgArgumentError(
                f"multi_dot(): tensors {i} and {i + 1} with shapes {tuple(ts[i].shape)} and "
                f"{tuple(ts[i + 1].shape)} cannot be multiplied"
            )
    out = _chain(ts, dims)
    if first:
        out = out.squeeze(0)
    if last:
        out = out.squeeze(-1)
    return out


def _chain(ts: list, dims: list) -> Tensor:
    """The matrix-chain order by dynamic programming (cost in scalar products)."""
    k = len(ts)
    cost = [[0] * k for _ in range(k)]
    split = [[0] * k for _ in range(k)]
    for length in range(1, k):
        for i in range(k - length):
            j = i + length
            cost[i][j] = math.inf  # type: ignore[call-overload]
            for s in range(i, j):
                c = cost[i][s] + cost[s + 1][j] + dims[i] * dims[s + 1] * dims[j + 1]
                if c < cost[i][j]:
                    cost[i][j], split[i][j] = c, s

    def product(i: int, j: int) -> Tensor:
        if i == j:
            return ts[i]
        s = split[i][j]
        return matmul(product(i, s), product(s + 1, j))

    return product(0, k - 1)


# ---- norms --------------------------------------------------------------------------------------


def _check_norm_dtype(op: str, x: Tensor, dtype: Any) -> Tensor:
    if dtype is not None:
        x = x.to(_dt.as_dtype(dtype))
    if x._dtype.category < 2:
        raise LinAlgDTypeError(
            f"{op}: Expected a floating point or complex tensor as input. Got {x._dtype.name}"
        )
    return x


def vector_norm(
    x: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype: Any = None
) -> Tensor:
    """The vector ``ord``-norm over ``dim`` (all elements by default): inf / -inf are the max /
    min modulus, 0 the count of nonzeros, other p the p-th root of the sum of powers."""
    op = "linalg.vector_norm"
    x = _check_norm_dtype(op, to_tensor(x), dtype)
    if isinstance(ord, str) or isinstance(ord, bool):
        raise TypeError(
            f"linalg_vector_norm(): argument 'ord' must be Number, not {type(ord).__name__}"
        )
    a = x.abs() if x._dtype.is_complex else x
    dims = wrap_dims(op, dim, x.ndim) if x.ndim else None
    if (
        dims is not None
        and x.numel() == 0
        and ord in (math.inf, -math.inf)
        and any(x.shape[d] == 0 for d in dims)
    ):
        raise LinAlgArgumentError(
            f"{op}: Expected a non-empty reduction for ord = {ord} (got {describe(x)})"
        )
    return F.norm(a, ord, dims, keepdim)


def _matrix_dims(op: str, A: Tensor, dim: Any) -> tuple[int, int]:
    if A.ndim < 2:
        raise LinAlgArgumentError(f"{op}: The input tensor A must have at least 2 dimensions.")
    d0, d1 = (wrap_dim(op, d, A.ndim) for d in dim)
    if d0 == d1:
        raise LinAlgArgumentError(f"{op}: dims must be different. Got ({dim[0]}, {dim[1]})")
    return d0, d1


def matrix_norm(
    A: Any,
    ord: Any = "fro",
    dim: tuple[int, int] = (-2, -1),
    keepdim: bool = False,
    *,
    dtype: Any = None,
) -> Tensor:
    """Matrix norms over ``dim``: "fro", "nuc" (sum of singular values), 2 / -2 (largest /
    smallest singular value), 1 / -1 (max / min column sum), inf / -inf (max / min row sum)."""
    op = "linalg.matrix_norm"
    A = _check_norm_dtype(op, to_tensor(A), dtype)
    d0, d1 = _matrix_dims(op, A, dim)
    if ord == "fro":
        return vector_norm(A, 2, (d0, d1), keepdim)
    if ord in ("nuc", 2, -2):
        moved = A.movedim((d0, d1), (-2, -1))
        S = svdvals(moved)
        if ord == "nuc":
            out = S.sum(-1)
        else:
            out = S.amax(-1) if ord == 2 else S.amin(-1)
        if keepdim:
            lo, hi = sorted((d0, d1))
            out = out.unsqueeze(lo).unsqueeze(hi)
        return out
    if ord in (1, -1, math.inf, -math.inf):
        a = A.abs()
        # 1: max over columns of the column sums (sum over d0); inf: over rows (sum over d1)
        summed, over = (d0, d1) if ord in (1, -1) else (d1, d0)
        sums = a.sum(summed, keepdim=True)
        out = sums.amax(over, keepdim=True) if ord > 0 else sums.amin(over, keepdim=True)
        if not keepdim:
            out = out.squeeze((d0, d1))
        return out
    raise LinAlgArgumentError(f"{op}: Order {ord} not supported.")


def norm(
    A: Any, ord: Any = None, dim: Any = None, keepdim: bool = False, *, dtype: Any = None
) -> Tensor:
    """``vector_norm`` or ``matrix_norm``: a matrix norm when ``dim`` has two entries or
    ``ord`` is given for a 2-D input, else a vector norm (2 over everything by default)."""
    A = to_tensor(A)
    if isinstance(dim, int):
        dim = (dim,)
    if dim is not None and len(dim) == 2:
        return matrix_norm(A, "fro" if ord is None else ord, tuple(dim), keepdim, dtype=dtype)
    if dim is None and ord is not None:
        if A.ndim == 2:
            return matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype)
        if A.ndim != 1:
            raise LinAlgArgumentError(
                f"linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. "
                f"Got {A.ndim}D."
            )
    if isinstance(ord, str):
        raise LinAlgArgumentError(f"linalg.norm: Order {ord} not supported for a vector norm.")
    return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)


def cond(A: Any, p: Any = None) -> Tensor:
    """The condition number in the ``p`` norm (None / 2: largest over smallest singular value;
    -2 the inverse; others ``norm(A) * norm(inv(A))``)."""
    A = _matrix("linalg.cond", A, square=p not in (None, 2, -2))
    if p in (None, 2, -2):
        S = svdvals(A)
        big, small = S.amax(-1), S.amin(-1)
        return big / small if p != -2 else small / big
    return matrix_norm(A, p) * matrix_norm(inv(A), p)


# ---- the rest of torch.linalg -------------------------------------------------------------------


def cross(input: Any, other: Any, *, dim: int = -1) -> Tensor:
    return _cross(input, other, dim)


def diagonal(A: Any, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    return to_tensor(A).diagonal(offset, dim1, dim2)


def vecdot(x: Any, y: Any, *, dim: int = -1) -> Tensor:
    """``sum(conj(x) * y)`` over ``dim`` (broadcast)."""
    x, y = to_tensor(x), to_tensor(y)
    return (x.conj() * y).sum(dim)


def vander(x: Any, *, N: int | None = None) -> Tensor:
    """The Vandermonde matrix of the last dim: columns ``x^0, x^1, ..., x^(N-1)``."""
    x = to_tensor(x)
    if x.ndim < 1:
        raise LinAlgArgumentError("linalg.vander: x must have at least one dimension")
    n = x.shape[-1] if N is None else int(N)
    if n < 1:
        raise LinAlgArgumentError("linalg.vander: N must be greater than 1.")
    if x._dtype.category < 2 and x._dtype is not _dt.bool_:
        x = x.to(_dt.int64)
    cols = [F.ones_like(x)]
    for _ in range(1, n):
        cols.append(cols[-1] * x)
    return F.stack(cols, -1)


def tensorinv(A: Any, ind: int = 2) -> Tensor:
    """The inverse of ``A`` seen as a linear map from its last ``ndim - ind`` dims to its first
    ``ind`` dims."""
    A = to_tensor(A)
    if ind <= 0:
        raise LinAlgArgumentError(f"Expected a strictly positive integer for 'ind', but got {ind}")
    rows, cols = A.shape[:ind], A.shape[ind:]
    m, n = math.prod(rows), math.prod(cols)
    if m != n:
        raise LinAlgArgumentError(
            f"Expected self to satisfy the requirement prod(self.shape[ind:]) == "
            f"prod(self.shape[:ind]), but got {n} != {m}"
        )
    return inv(A.reshape(m, n)).reshape(tuple(cols) + tuple(rows))


def tensorsolve(A: Any, B: Any, dims: Sequence[int] | None = None) -> Tensor:
    """``X`` with ``tensordot(A, X, X.ndim) = B``."""
    A, B = to_tensor(A), to_tensor(B)
    if dims is not None:
        moved = [wrap_dim("linalg.tensorsolve", d, A.ndim) for d in dims]
        A = A.movedim(moved, list(range(A.ndim - len(moved), A.ndim)))
    rest = A.shape[B.ndim :]
    m, n = math.prod(A.shape[: B.ndim]), math.prod(rest)
    if m != n:
        raise LinAlgArgumentError(
            f"Expected self to satisfy the requirement prod(self.shape[other.ndim:]) == "
            f"prod(self.shape[:other.ndim]), but got {n} != {m}"
        )
    return solve(A.reshape(m, n), B.reshape(m)).reshape(tuple(rest))
