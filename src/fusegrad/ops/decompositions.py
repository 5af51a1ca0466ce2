"""The linear-algebra primitives behind ``fusegrad.linalg``: solvers, factorizations and matrix
functions over batches of matrices (the last two dims), computed by numpy's LAPACK bindings,
plus a batched LU with partial pivoting written here (numpy has none).

Where this sits: beside ``primitives.py`` (records and shape/dtype rules); the derivative rules
are in ``autograd/derivatives.py``, the public functions in ``fusegrad/linalg``.  Each primitive
has one output.  A factorization with several outputs is one primitive per output (``eigh``'s
eigenvalues and eigenvectors, ``svd``'s U, S and Vh, ``qr``'s Q and R): the gradient of a
factorization is linear in the gradients of its outputs, so the rules of the parts add up to
PyTorch's joint formula, and an output that is not used contributes nothing (PyTorch's
undefined gradient) -- which matters where the unused part's term would be 0 * inf, as for
eigenvectors of repeated eigenvalues.  The forward computes the factorization once per output
that is asked for.

Singular and non-positive-definite inputs raise ``LinAlgError`` with PyTorch's words, naming
the batch element and the pivot or leading minor, before anything is recorded.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import FusegradError
from .registry import primitive, set_meta


class LinAlgError(FusegradError, RuntimeError):
    """A matrix that the operation cannot handle (singular, not positive-definite): PyTorch's
    ``torch.linalg.LinAlgError``, a ``RuntimeError``."""


# ---- helpers ------------------------------------------------------------------------------------


def _batch_prefix(op: str, index: int, batched: bool) -> str:
    return f"{op}: (Batch element {index}): " if batched else f"{op}: "


def lu_with_info(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LU factorization with partial pivoting of each matrix of ``a`` (..., m, n), as LAPACK's
    getrf: the packed ``LU`` (L's unit diagonal implied), 1-based ``pivots`` (row ``i`` was
    swapped with row ``pivots[i] - 1``) and ``info`` (0, or the 1-based index of the first
    zero pivot; elimination goes on past it, as getrf's does)."""
    lu = np.array(a, copy=True)
    m, n = lu.shape[-2], lu.shape[-1]
    k = min(m, n)
    batch = lu.shape[:-2]
    flat = lu.reshape((-1, m, n))
    pivots = np.zeros((flat.shape[0], k), np.int32)
    info = np.zeros(flat.shape[0], np.int32)
    rows = np.arange(flat.shape[0])
    for j in range(k):
        p = j + np.argmax(np.abs(flat[:, j:, j]), axis=1)
        pivots[:, j] = p + 1
        swap = p != j
        if swap.any():
            r = rows[swap]
            upper = flat[r, j, :].copy()
            flat[r, j, :] = flat[r, p[swap], :]
            flat[r, p[swap], :] = upper
        pivot = flat[:, j, j]
        zero = pivot == 0
        info[(info == 0) & zero] = j + 1
        safe = np.where(zero, 1, pivot)
        if j + 1 < m:
            factors = np.where(zero[:, None], 0, flat[:, j + 1 :, j] / safe[:, None])
            flat[:, j + 1 :, j] = factors
            flat[:, j + 1 :, j + 1 :] -= factors[:, :, None] * flat[:, j, None, j + 1 :]
    return flat.reshape(lu.shape), pivots.reshape(batch + (k,)), info.reshape(batch)


def _first_failure(info: np.ndarray) -> tuple[int, int] | None:
    """(batch index, info value) of the first nonzero ``info``, or None."""
    flat = info.reshape(-1)
    bad = np.flatnonzero(flat)
    if bad.size == 0:
        return None
    return int(bad[0]), int(flat[bad[0]])


def singular_error(op: str, a: np.ndarray, words: str) -> LinAlgError | None:
    """PyTorch's error for the first singular matrix of ``a`` (None when none is), ``words``
    formatting the zero pivot's 1-based index ``{i}``."""
    _, _, info = lu_with_info(a)
    failure = _first_failure(info)
    if failure is None:
        return None
    index, i = failure
    return LinAlgError(_batch_prefix(op, index, a.ndim > 2) + words.format(i=i))


def cholesky_info(a: np.ndarray) -> np.ndarray:
    """Per matrix, 0 when it is positive-definite, else the order of its first leading minor
    that is not (LAPACK potrf's info)."""
    flat = a.reshape((-1,) + a.shape[-2:])
    info = np.zeros(flat.shape[0], np.int32)
    try:
        np.linalg.cholesky(flat)  # (all of them at once: the common case)
        return info.reshape(a.shape[:-2])
    except np.linalg.LinAlgError:
        pass
    for b, m in enumerate(flat):
        try:
            np.linalg.cholesky(m)
            continue
        except np.linalg.LinAlgError:
            pass
        for order in range(1, m.shape[-1] + 1):
            try:
                np.linalg.cholesky(m[:order, :order])
            except np.linalg.LinAlgError:
                info[b] = order
                break
    return info.reshape(a.shape[:-2])


def hermitian_from_lower(a: np.ndarray) -> np.ndarray:
    """The Hermitian matrix whose lower triangle is ``a``'s (what LAPACK reads with UPLO=L)."""
    low = np.tril(a, -1)
    return low + np.conj(np.swapaxes(low, -1, -2)) + _real_diagonal(a)


def _real_diagonal(a: np.ndarray) -> np.ndarray:
    d = np.diagonal(a, axis1=-2, axis2=-1)
    return d.real[..., None] * np.eye(a.shape[-1], dtype=a.dtype)


def cholesky_lower(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(L, info)``: Cholesky factors of the Hermitian matrices given by ``a``'s lower
    triangles, and potrf's info (0, or the order of the failing minor; L is then partial)."""
    h = hermitian_from_lower(a)
    try:
        return np.linalg.cholesky(h), np.zeros(a.shape[:-2], np.int32)
    except np.linalg.LinAlgError:
        pass
    info = cholesky_info(h)
    out = np.zeros_like(h)
    flat_h, flat_out = h.reshape((-1,) + h.shape[-2:]), out.reshape((-1,) + h.shape[-2:])
    for b, code in enumerate(info.reshape(-1)):
        k = h.shape[-1] if code == 0 else code - 1  # the leading block that factors
        if k:
            flat_out[b, :k, :k] = np.linalg.cholesky(flat_h[b, :k, :k])
    return out, info


# ---- solvers ------------------------------------------------------------------------------------

_SOLVE_SINGULAR = "The solver failed because the input matrix is singular."


# the errors of a singular matrix, by the ``check`` attribute of ``linalg_solve``
SOLVE_ERRORS = {
    "solve": ("torch.linalg.solve", _SOLVE_SINGULAR),
    "inv": (
        "linalg.inv",
        "The diagonal element {i} is zero, the inversion could not be completed because the "
        "input matrix is singular.",
    ),
}


@primitive("linalg_solve", "opaque", "A B")
def _solve(A, B, check):  # type: ignore[no-untyped-def]
    """``A^-1 B`` for square ``A`` (..., n, n) and ``B`` (..., n, k), batch dims equal.  A
    singular ``A`` raises PyTorch's error of ``check`` ("solve", "inv"); with ``check`` None its
    solution holds inf and nan, as the LU substitution gives them (PyTorch's ``solve_ex``)."""
    if A.shape[-1] == 0 or A.size == 0:
        return np.zeros(B.shape, np.result_type(A, B))
    try:
        return np.linalg.solve(A, B)
    except np.linalg.LinAlgError:
        pass
    lu, pivots, info = lu_with_info(A)
    if check is not None:
        index, i = _first_failure(info)
        op, words = SOLVE_ERRORS[check]
        raise LinAlgError(_batch_prefix(op, index, A.ndim > 2) + words.format(i=i))
    return lu_solve_arrays(lu, pivots, B)


def permutation_from_pivots(pivots: np.ndarray, m: int) -> np.ndarray:
    """``perm`` with ``A[..., perm, :] = L U`` for LAPACK's 1-based row swaps ``pivots``."""
    perm = np.broadcast_to(np.arange(m), pivots.shape[:-1] + (m,)).copy()
    flat_perm = perm.reshape(-1, m)
    flat_piv = pivots.reshape(-1, pivots.shape[-1])
    rows = np.arange(flat_perm.shape[0])
    for i in range(flat_piv.shape[-1]):
        j = flat_piv[:, i] - 1
        a, b = flat_perm[rows, i].copy(), flat_perm[rows, j].copy()
        flat_perm[rows, i], flat_perm[rows, j] = b, a
    return perm


def lu_solve_arrays(lu: np.ndarray, pivots: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``A^-1 B`` from ``A``'s packed LU factors, by substitution (inf / nan where U has a zero
    on its diagonal)."""
    perm = permutation_from_pivots(pivots, lu.shape[-2])
    PB = np.take_along_axis(B, perm[..., None], axis=-2)
    n = lu.shape[-1]
    L = np.tril(lu, -1) + np.eye(n, dtype=lu.dtype)
    Y = _triangular_substitution(L, PB, upper=False)
    return _triangular_substitution(np.triu(lu), Y, upper=True)


@primitive("linalg_solve_triangular", "opaque", "A B")
def _solve_triangular(A, B, upper, left, unitriangular):  # type: ignore[no-untyped-def]
    """``A^-1 B`` (``left``) or ``B A^-1`` with ``A`` triangular: only its ``upper`` or lower
    triangle is read, its diagonal as ones when ``unitriangular``.  A zero on the diagonal
    gives inf / nan, as LAPACK's trtrs without the check (PyTorch's behaviour)."""
    T = np.triu(A) if upper else np.tril(A)
    n = A.shape[-1]
    if unitriangular:
        T = T - _diag_embed(np.diagonal(T, axis1=-2, axis2=-1)) + np.eye(n, dtype=A.dtype)
    if not left:  # X A = B  <=>  A^T X^T = B^T
        T, B = np.swapaxes(T, -1, -2), np.swapaxes(B, -1, -2)
        upper = not upper
    if n and np.all(np.diagonal(T, axis1=-2, axis2=-1) != 0):
        X = np.linalg.solve(T, B)  # (LAPACK, batched: much faster than substitution in Python)
    else:  # a zero on the diagonal: substitution gives PyTorch's inf / nan
        X = _triangular_substitution(T, B, upper)
    return np.ascontiguousarray(np.swapaxes(X, -1, -2) if not left else X)


def _diag_embed(d: np.ndarray) -> np.ndarray:
    return d[..., :, None] * np.eye(d.shape[-1], dtype=d.dtype)


def _triangular_substitution(T: np.ndarray, B: np.ndarray, upper: bool) -> np.ndarray:
    """Back (``upper``) or forward substitution, one row at a time over the whole batch."""
    n = T.shape[-1]
    X = np.zeros(
        np.broadcast_shapes(T.shape[:-2], B.shape[:-2]) + B.shape[-2:], np.result_type(T, B)
    )
    order = range(n - 1, -1, -1) if upper else range(n)
    with np.errstate(all="ignore"):
        for i in order:
            rest = slice(i + 1, n) if upper else slice(0, i)
            acc = B[..., i, :] - np.einsum("...j,...jk->...k", T[..., i, rest], X[..., rest, :])
            X[..., i, :] = acc / T[..., i, i, None]
    return X


# ---- factorizations -------------------------------------------------------------------------


_NOT_PD = (
    "The factorization could not be completed because the input is not positive-definite "
    "(the leading minor of order {i} is not positive-definite)."
)


@primitive("linalg_cholesky", "opaque", "A")
def _cholesky(A, check):  # type: ignore[no-untyped-def]
    """Lower Cholesky factor of the Hermitian positive-definite matrices whose lower triangles
    ``A`` holds; one that is not raises PyTorch's error when ``check`` (else its factor is
    partial, as ``cholesky_ex``'s)."""
    L, info = cholesky_lower(A)
    if check and info.any():
        index, order = _first_failure(info)
        raise LinAlgError(
            _batch_prefix("linalg.cholesky", index, A.ndim > 2) + _NOT_PD.format(i=order)
        )
    return L


@primitive("linalg_lu_factor", "opaque", "A")
def _lu_factor(A):  # type: ignore[no-untyped-def]
    """The packed LU factorization with partial pivoting (L strictly below the diagonal, unit
    diagonal implied; U on and above it)."""
    return lu_with_info(A)[0]


@primitive("linalg_lu_pivots", "opaque", "A", differentiable=False)
def _lu_pivots(A):  # type: ignore[no-untyped-def]
    """The 1-based pivots of ``linalg_lu_factor`` (int32, LAPACK's convention)."""
    return lu_with_info(A)[1]


@primitive("linalg_lu_permutation", "opaque", "pivots", differentiable=False)
def _lu_permutation(pivots, m, dtype):  # type: ignore[no-untyped-def]
    """The permutation matrix ``P`` (``dtype``, m x m) with ``A = P L U`` for ``pivots``."""
    perm = permutation_from_pivots(pivots, m)
    P = np.zeros(pivots.shape[:-1] + (m, m), dtype.np)
    np.put_along_axis(P, perm[..., None, :], 1, axis=-2)
    return P


@primitive("linalg_det", "opaque", "A")
def _det(A):  # type: ignore[no-untyped-def]
    if A.shape[-1] == 0:
        return np.ones(A.shape[:-2], A.dtype)
    return np.asarray(np.linalg.det(A)).astype(A.dtype, copy=False)


@primitive("linalg_logabsdet", "opaque", "A")
def _logabsdet(A):  # type: ignore[no-untyped-def]
    real = _dt.as_dtype(A.dtype).to_real().np
    if A.shape[-1] == 0:
        return np.zeros(A.shape[:-2], real)
    return np.asarray(np.linalg.slogdet(A)[1]).astype(real, copy=False)


@primitive("linalg_slogdet_sign", "opaque", "A")
def _slogdet_sign(A):  # type: ignore[no-untyped-def]
    """The sign of the determinant of real matrices (-1, 0 or 1; piecewise constant, so its
    gradient is zero, as PyTorch's)."""
    if A.shape[-1] == 0:
        return np.ones(A.shape[:-2], A.dtype)
    return np.asarray(np.linalg.slogdet(A)[0]).astype(A.dtype, copy=False)


@primitive("linalg_eigh_values", "opaque", "A")
def _eigh_values(A, upper):  # type: ignore[no-untyped-def]
    """Eigenvalues (ascending, real) of the Hermitian matrices given by ``A``'s lower (or
    ``upper``) triangles."""
    return np.linalg.eigh(A, UPLO="U" if upper else "L")[0]


@primitive("linalg_eigh_vectors", "opaque", "A")
def _eigh_vectors(A, upper):  # type: ignore[no-untyped-def]
    return np.linalg.eigh(A, UPLO="U" if upper else "L")[1]


@primitive("linalg_eig_values", "opaque", "A")
def _eig_values(A):  # type: ignore[no-untyped-def]
    """Eigenvalues of general square matrices: complex (LAPACK's geev order)."""
    return np.linalg.eig(A)[0].astype(_dt.as_dtype(A.dtype).to_complex().np, copy=False)


@primitive("linalg_eig_vectors", "opaque", "A")
def _eig_vectors(A):  # type: ignore[no-untyped-def]
    """Unit-norm right eigenvectors (columns), complex."""
    return np.linalg.eig(A)[1].astype(_dt.as_dtype(A.dtype).to_complex().np, copy=False)


def _svd(A, full_matrices):  # type: ignore[no-untyped-def]
    if A.size == 0:
        m, n = A.shape[-2:]
        k = min(m, n)
        u = np.zeros(A.shape[:-2] + (m, m if full_matrices else k), A.dtype)
        vh = np.zeros(A.shape[:-2] + (n if full_matrices else k, n), A.dtype)
        if full_matrices:
            u[...] = np.eye(m, dtype=A.dtype)
            vh[...] = np.eye(n, dtype=A.dtype)
        s = np.zeros(A.shape[:-2] + (k,), _dt.as_dtype(A.dtype).to_real().np)
        return u, s, vh
    return np.linalg.svd(A, full_matrices=full_matrices)


@primitive("linalg_svd_u", "opaque", "A")
def _svd_u(A, full_matrices):  # type: ignore[no-untyped-def]
    return _svd(A, full_matrices)[0]


@primitive("linalg_svd_s", "opaque", "A")
def _svd_s(A):  # type: ignore[no-untyped-def]
    """Singular values, descending (real)."""
    if A.size == 0:
        return _svd(A, False)[1]
    return np.linalg.svd(A, compute_uv=False)


@primitive("linalg_svd_vh", "opaque", "A")
def _svd_vh(A, full_matrices):  # type: ignore[no-untyped-def]
    return _svd(A, full_matrices)[2]


def _qr(A, mode):  # type: ignore[no-untyped-def]
    return np.linalg.qr(A, mode="complete" if mode == "complete" else "reduced")


@primitive("linalg_qr_q", "opaque", "A")
def _qr_q(A, mode):  # type: ignore[no-untyped-def]
    return _qr(A, mode)[0]


@primitive("linalg_qr_r", "opaque", "A")
def _qr_r(A, mode):  # type: ignore[no-untyped-def]
    return _qr(A, mode)[1]


@primitive("linalg_pinv", "opaque", "A")
def _pinv(A, atol, rtol, hermitian):  # type: ignore[no-untyped-def]
    """The pseudoinverse, singular values below ``max(atol, rtol * largest)`` treated as 0
    (``atol``, ``rtol`` arrays broadcasting over the batch)."""
    m, n = A.shape[-2:]
    if A.size == 0:
        return np.zeros(A.shape[:-2] + (n, m), A.dtype)
    if hermitian:
        w, V = np.linalg.eigh(A)
        s = np.abs(w)
        cutoff = np.maximum(atol, rtol * s.max(-1))[..., None]
        inv = np.where(s > cutoff, 1 / np.where(s > cutoff, w, 1), 0)
        return (V * inv[..., None, :].astype(V.dtype)) @ np.conj(np.swapaxes(V, -1, -2))
    U, s, Vh = np.linalg.svd(A, full_matrices=False)
    cutoff = np.maximum(atol, rtol * s.max(-1, initial=0))[..., None]
    inv = np.where(s > cutoff, 1 / np.where(s > cutoff, s, 1), 0)
    V = np.conj(np.swapaxes(Vh, -1, -2))
    return (V * inv[..., None, :].astype(V.dtype)) @ np.conj(np.swapaxes(U, -1, -2))


# ---- LDL^T (Bunch-Kaufman) -------------------------------------------------------------------
#
# Not primitives: PyTorch defines no derivative for ``ldl_factor`` or ``ldl_solve``, so
# ``fusegrad.linalg`` calls these on the host arrays and gives the results a node whose
# backward raises, as PyTorch's does.


def _ldl_routine(dtype: np.dtype, hermitian: bool, step: str) -> tuple:
    """scipy's binding of LAPACK's ?sytrf / ?sytrs (``step`` "trf" or "trs"; ?hetrf / ?hetrs
    for Hermitian complex matrices), and for "trf" its workspace query."""
    from scipy.linalg import lapack  # (scipy: a dependency, imported on first use)

    prefix = {"f": "s", "d": "d", "F": "c", "D": "z"}[np.dtype(dtype).char]
    kind = "he" if hermitian and prefix in "cz" else "sy"
    name = prefix + kind + step
    return getattr(lapack, name), getattr(lapack, name + "_lwork", None)


def ldl_factor_arrays(a: np.ndarray, hermitian: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(LD, pivots, info)`` of each matrix in ``a`` (its lower triangle is read) by LAPACK's
    Bunch-Kaufman factorization with ``uplo = "L"``, as PyTorch's ``ldl_factor_ex``: ``LD``
    holds L (unit diagonal implied) below the diagonal and the 1x1 and 2x2 blocks of D on and
    next to it, zeros above; ``pivots`` are LAPACK's 1-based interchanges (int32, a 2x2 block
    marked by two equal negative entries); ``info`` is 0, or the 1-based index of a zero
    diagonal block of D (the factorization is complete but D is singular).  The optimal
    (blocked) workspace is asked for, as PyTorch does, so results agree with its LAPACK to
    rounding."""
    n = a.shape[-1]
    batch = a.shape[:-2]
    LD = np.zeros(a.shape, a.dtype)
    pivots = np.zeros(batch + (n,), np.int32)
    info = np.zeros(batch, np.int32)
    if n == 0:
        return LD, pivots, info
    factor, workspace = _ldl_routine(a.dtype, hermitian, "trf")
    work, _ = workspace(n, lower=1)
    lwork = max(1, int(np.real(work)))
    for index in np.ndindex(*batch):
        ld, ipiv, status = factor(a[index], lower=1, lwork=lwork)
        LD[index] = np.tril(ld)  # (LAPACK leaves the upper triangle as it found it)
        pivots[index] = ipiv
        info[index] = status
    return LD, pivots, info


def ldl_pivots_error(pivots: np.ndarray) -> str | None:
    """What is wrong with ``pivots`` for ?sytrs (a bad index would read outside the matrix),
    or None: each entry's magnitude in 1..n, negative entries in equal pairs."""
    n = pivots.shape[-1]
    if pivots.size == 0:
        return None
    flat = pivots.reshape(-1, n)
    if np.abs(flat).max() > n or (flat == 0).any():
        return f"every pivot must lie in [-{n}, -1] or [1, {n}]"
    for row in flat:
        k = 0
        while k < n:
            if row[k] < 0:
                if k + 1 >= n or row[k + 1] != row[k]:
                    return "a negative pivot (a 2x2 block) must be repeated in the next entry"
                k += 2
            else:
                k += 1
    return None


def ldl_solve_arrays(
    LD: np.ndarray, pivots: np.ndarray, B: np.ndarray, hermitian: bool
) -> np.ndarray:
    """The solutions X of A X = B from ``ldl_factor_arrays``' ``LD`` and ``pivots`` (batch
    dims already broadcast to B's), by LAPACK's ?sytrs / ?hetrs."""
    X = np.zeros(B.shape, B.dtype)
    if LD.shape[-1] == 0 or B.shape[-1] == 0:
        return X
    solve, _ = _ldl_routine(LD.dtype, hermitian, "trs")
    for index in np.ndindex(*B.shape[:-2]):
        X[index] = solve(LD[index], pivots[index].astype(np.int32), B[index], lower=1)[0]
    return X


# ---- matrix functions ------------------------------------------------------------------------

# Pade approximants of degree 3, 5, 7, 9, 13 and the 1-norm bounds up to which each reaches
# double precision (Higham 2005, "The scaling and squaring method for the matrix exponential
# revisited"); float32 uses the same, which is more than it needs
_PADE = {
    3: (120.0, 60.0, 12.0, 1.0),
    5: (30240.0, 15120.0, 3360.0, 420.0, 30.0, 1.0),
    7: (17297280.0, 8648640.0, 1995840.0, 277200.0, 25200.0, 1512.0, 56.0, 1.0),
    9: (
        17643225600.0,
        8821612800.0,
        2075673600.0,
        302702400.0,
        30270240.0,
        2162160.0,
        110880.0,
        3960.0,
        90.0,
        1.0,
    ),
    13: (
        64764752532480000.0,
        32382376266240000.0,
        7771770303897600.0,
        1187353796428800.0,
        129060195264000.0,
        10559470521600.0,
        670442572800.0,
        33522128640.0,
        1323241920.0,
        40840800.0,
        960960.0,
        16380.0,
        182.0,
        1.0,
    ),
}
_THETA = {
    3: 1.495585217958292e-2,
    5: 2.539398330063230e-1,
    7: 9.504178996162932e-1,
    9: 2.097847961257068e0,
    13: 5.371920351148152e0,
}


def _expm_one(A: np.ndarray) -> np.ndarray:
    """exp(A) of one square matrix: scaling and squaring with a Pade approximant."""
    n = A.shape[-1]
    ident = np.eye(n, dtype=A.dtype)
    norm = np.abs(A).sum(0).max() if n else 0.0
    for degree in (3, 5, 7, 9):
        if norm <= _THETA[degree]:
            return _pade(A, degree, ident)
    squarings = max(0, int(np.ceil(np.log2(norm / _THETA[13])))) if norm > _THETA[13] else 0
    X = _pade(A / (2.0**squarings), 13, ident)
    for _ in range(squarings):
        X = X @ X
    return X


def _pade(A: np.ndarray, degree: int, ident: np.ndarray) -> np.ndarray:
    b = _PADE[degree]
    A2 = A @ A
    if degree == 13:
        A4 = A2 @ A2
        A6 = A4 @ A2
        U = A @ (
            A6 @ (b[13] * A6 + b[11] * A4 + b[9] * A2)
            + b[7] * A6
            + b[5] * A4
            + b[3] * A2
            + b[1] * ident
        )
        V = (
            A6 @ (b[12] * A6 + b[10] * A4 + b[8] * A2)
            + b[6] * A6
            + b[4] * A4
            + b[2] * A2
            + (b[0] * ident)
        )
    else:
        powers = [ident, A2]
        while len(powers) < degree // 2 + 1:
            powers.append(powers[-1] @ A2)
        U = A @ sum(b[2 * k + 1] * powers[k] for k in range(degree // 2 + 1))
        V = sum(b[2 * k] * powers[k] for k in range(degree // 2 + 1))
    return np.linalg.solve(V - U, V + U)


@primitive("linalg_matrix_exp", "opaque", "A")
def _matrix_exp(A):  # type: ignore[no-untyped-def]
    """The matrix exponential of each square matrix (scaling and squaring, Pade 13)."""
    flat = A.reshape((-1,) + A.shape[-2:])
    out = np.empty_like(flat)
    with np.errstate(all="ignore"):
        for b, m in enumerate(flat):
            out[b] = _expm_one(m)
    return out.reshape(A.shape)


# ---- shape/dtype rules --------------------------------------------------------------------------


def _same(shapes, dtypes, **attrs):  # type: ignore[no-untyped-def]
    return tuple(shapes[0]), dtypes[0]


def _batch(shape: tuple) -> tuple:
    return tuple(shape[:-2])


def _svd_meta(part: str):  # type: ignore[no-untyped-def]
    def meta(shapes, dtypes, full_matrices=False):  # type: ignore[no-untyped-def]
        shape = tuple(shapes[0])
        m, n = shape[-2], shape[-1]
        k = min(m, n)
        if part == "u":
            return _batch(shape) + (m, m if full_matrices else k), dtypes[0]
        if part == "vh":
            return _batch(shape) + (n if full_matrices else k, n), dtypes[0]
        return _batch(shape) + (k,), dtypes[0].to_real()

    return meta


def _qr_meta(part: str):  # type: ignore[no-untyped-def]
    def meta(shapes, dtypes, mode):  # type: ignore[no-untyped-def]
        shape = tuple(shapes[0])
        m, n = shape[-2], shape[-1]
        k = m if mode == "complete" else min(m, n)
        if part == "q":
            return _batch(shape) + (m, k), dtypes[0]
        return _batch(shape) + (k, n), dtypes[0]

    return meta


set_meta("linalg_solve", lambda shapes, dtypes, check: (tuple(shapes[1]), dtypes[0]))
set_meta(
    "linalg_lu_permutation",
    lambda shapes, dtypes, m, dtype: (tuple(shapes[0][:-1]) + (m, m), dtype),
)
set_meta(
    "linalg_solve_triangular",
    lambda shapes, dtypes, upper, left, unitriangular: (tuple(shapes[1]), dtypes[0]),
)
set_meta("linalg_cholesky", lambda shapes, dtypes, check: (tuple(shapes[0]), dtypes[0]))
set_meta("linalg_lu_factor", _same)
set_meta(
    "linalg_lu_pivots",
    lambda shapes, dtypes: (_batch(tuple(shapes[0])) + (min(shapes[0][-2:]),), _dt.int32),
)
set_meta("linalg_det", lambda shapes, dtypes: (_batch(tuple(shapes[0])), dtypes[0]))
set_meta("linalg_logabsdet", lambda shapes, dtypes: (_batch(tuple(shapes[0])), dtypes[0].to_real()))
set_meta("linalg_slogdet_sign", lambda shapes, dtypes: (_batch(tuple(shapes[0])), dtypes[0]))
set_meta(
    "linalg_eigh_values",
    lambda shapes, dtypes, upper: (tuple(shapes[0][:-1]), dtypes[0].to_real()),
)
set_meta("linalg_eigh_vectors", lambda shapes, dtypes, upper: (tuple(shapes[0]), dtypes[0]))
set_meta(
    "linalg_eig_values", lambda shapes, dtypes: (tuple(shapes[0][:-1]), dtypes[0].to_complex())
)
set_meta("linalg_eig_vectors", lambda shapes, dtypes: (tuple(shapes[0]), dtypes[0].to_complex()))
set_meta("linalg_svd_u", _svd_meta("u"))
set_meta("linalg_svd_s", _svd_meta("s"))
set_meta("linalg_svd_vh", _svd_meta("vh"))
set_meta("linalg_qr_q", _qr_meta("q"))
set_meta("linalg_qr_r", _qr_meta("r"))
set_meta(
    "linalg_pinv",
    lambda shapes, dtypes, atol, rtol, hermitian: (
        _batch(tuple(shapes[0])) + (shapes[0][-1], shapes[0][-2]),
        dtypes[0],
    ),
)
set_meta("linalg_matrix_exp", _same)

NAMES = (
    "linalg_solve linalg_solve_triangular linalg_cholesky linalg_lu_factor linalg_lu_pivots "
    "linalg_lu_permutation linalg_det linalg_logabsdet linalg_slogdet_sign linalg_eigh_values "
    "linalg_eigh_vectors "
    "linalg_eig_values linalg_eig_vectors linalg_svd_u linalg_svd_s linalg_svd_vh linalg_qr_q "
    "linalg_qr_r linalg_pinv linalg_matrix_exp"
).split()
