"""``linalg.ldl_factor``, ``ldl_factor_ex`` and ``ldl_solve``: LAPACK's compact Bunch-Kaufman
form checked by rebuilding A from it (an independent reading of LAPACK's documented
convention), against PyTorch's LD and pivots when PyTorch is importable, solutions, batches,
empty matrices, errors, and PyTorch's missing derivative."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.errors import AutogradError

RNG = np.random.default_rng(2929)


def _matrix(n: int, dtype: type, hermitian: bool, batch: tuple = ()) -> np.ndarray:
    a = RNG.normal(size=batch + (n, n))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * RNG.normal(size=batch + (n, n))
    a = a.astype(dtype)
    other = np.conj(np.swapaxes(a, -1, -2)) if hermitian else np.swapaxes(a, -1, -2)
    return a + other  # (indefinite: 2x2 pivot blocks are common)


def _rebuild(LD: np.ndarray, pivots: np.ndarray, hermitian: bool) -> np.ndarray:
    """A = L D L^T (L^H if hermitian) from LAPACK's ?sytrf output with uplo = "L": L is
    P(1) L(1) P(2) L(2) ..., P(k) interchanging k and pivots[k] (or k + 1 and -pivots[k] for a
    2x2 block at k, k + 1), L(k) the identity with LD's columns k (and k + 1) below the block,
    D block diagonal."""
    n = LD.shape[-1]
    L = np.eye(n, dtype=LD.dtype)
    D = np.zeros_like(LD)
    k = 0
    while k < n:
        size = 1 if pivots[k] > 0 else 2
        swap_with = abs(int(pivots[k])) - 1
        row = k if size == 1 else k + 1
        P = np.eye(n, dtype=LD.dtype)
        P[[row, swap_with]] = P[[swap_with, row]]
        Lk = np.eye(n, dtype=LD.dtype)
        Lk[k + size :, k : k + size] = LD[k + size :, k : k + size]
        L = L @ P @ Lk
        block = LD[k : k + size, k : k + size].copy()
        if size == 2:
            block[0, 1] = np.conj(block[1, 0]) if hermitian else block[1, 0]
        D[k : k + size, k : k + size] = block
        k += size
    Lt = np.conj(L.T) if hermitian else L.T
    return L @ D @ Lt


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128, np.complex64])
@pytest.mark.parametrize("hermitian", [False, True])
def test_factor_rebuilds_the_matrix_and_solves(dtype: type, hermitian: bool) -> None:
    tol = 1e-10 if np.dtype(dtype) in (np.float64, np.complex128) else 2e-4
    blocks = 0
    for n, batch in ((1, ()), (4, (3,)), (9, (2, 2)), (80, ())):  # (80: LAPACK's blocked path)
        A = _matrix(n, dtype, hermitian, batch)
        LD, pivots, info = fg.linalg.ldl_factor_ex(fg.tensor(A), hermitian=hermitian)
        assert LD.dtype == fg.tensor(A).dtype and pivots.dtype == fg.int32
        assert tuple(LD.shape) == A.shape and tuple(pivots.shape) == A.shape[:-1]
        assert tuple(info.shape) == batch and not info.numpy().any()
        ld, piv = LD.numpy(), pivots.numpy()
        assert np.all(np.triu(ld, 1) == 0)
        blocks += int((piv < 0).sum())
        for index in np.ndindex(*batch):
            rebuilt = _rebuild(ld[index], piv[index], hermitian)
            np.testing.assert_allclose(rebuilt, A[index], rtol=tol, atol=tol * n)
        B = RNG.normal(size=batch + (n, 2)).astype(dtype)
        X = fg.linalg.ldl_solve(LD, pivots, fg.tensor(B), hermitian=hermitian)
        np.testing.assert_allclose(A @ X.numpy(), B, rtol=tol * 10, atol=tol * 10 * n)
    assert blocks > 0  # (the 2x2 blocks were exercised)


def test_only_the_lower_triangle_is_read() -> None:
    A = _matrix(5, np.float64, False)
    garbage = A + np.triu(RNG.normal(size=(5, 5)), 1)
    for a, b in zip(fg.linalg.ldl_factor(fg.tensor(A)), fg.linalg.ldl_factor(fg.tensor(garbage))):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("hermitian", [False, True])
def test_matches_torch(dtype: str, hermitian: bool) -> None:
    torch = pytest.importorskip("torch")
    for n, batch in ((3, ()), (6, (4,)), (100, ())):
        A = _matrix(n, np.dtype(dtype).type, hermitian, batch)
        ours = fg.linalg.ldl_factor_ex(fg.tensor(A), hermitian=hermitian)
        theirs = torch.linalg.ldl_factor_ex(torch.tensor(A), hermitian=hermitian)
        np.testing.assert_array_equal(ours.pivots.numpy(), theirs.pivots.numpy())
        np.testing.assert_array_equal(ours.info.numpy(), theirs.info.numpy())
        # (the same LAPACK algorithm; the BLAS underneath may round differently)
        scale = np.abs(theirs.LD.numpy()).max()
        np.testing.assert_allclose(ours.LD.numpy(), theirs.LD.numpy(), atol=1e-12 * n * scale)
        B = RNG.normal(size=batch + (n, 3)).astype(dtype)
        X = fg.linalg.ldl_solve(ours.LD, ours.pivots, fg.tensor(B), hermitian=hermitian)
        Xt = torch.linalg.ldl_solve(theirs.LD, theirs.pivots, torch.tensor(B), hermitian=hermitian)
        np.testing.assert_allclose(X.numpy(), Xt.numpy(), rtol=1e-9, atol=1e-9)
    singular = np.diag([1.0, 0.0, 2.0])
    ours = fg.linalg.ldl_factor_ex(fg.tensor(singular))
    theirs = torch.linalg.ldl_factor_ex(torch.tensor(singular))
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_broadcasting_and_empty_matrices() -> None:
    A = _matrix(4, np.float64, False, (2,))
    LD, pivots = fg.linalg.ldl_factor(fg.tensor(A))
    B = RNG.normal(size=(3, 1, 4, 2))
    X = fg.linalg.ldl_solve(LD, pivots, fg.tensor(B))
    assert tuple(X.shape) == (3, 2, 4, 2)
    np.testing.assert_allclose(A @ X.numpy(), np.broadcast_to(B, (3, 2, 4, 2)), atol=1e-10)
    X0 = fg.linalg.ldl_solve(LD[0], pivots[0], fg.tensor(B[:, 0]))  # (one LD, batched B)
    np.testing.assert_allclose(A[0] @ X0.numpy(), B[:, 0], atol=1e-10)
    assert fg.linalg.ldl_solve(LD, pivots.long(), fg.tensor(B)).shape == X.shape
    LD, pivots, info = fg.linalg.ldl_factor_ex(fg.zeros(2, 0, 0))
    assert tuple(LD.shape) == (2, 0, 0) and tuple(pivots.shape) == (2, 0)
    assert info.numpy().tolist() == [0, 0]
    assert tuple(fg.linalg.ldl_solve(LD, pivots, fg.zeros(2, 0, 3)).shape) == (2, 0, 3)


def test_singular_matrices() -> None:
    singular = fg.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 2.0]]] * 2)
    singular[0] = fg.eye(3)
    LD, pivots, info = fg.linalg.ldl_factor_ex(singular)
    assert info.numpy().tolist() == [0, 2]
    with pytest.raises(fg.linalg.LinAlgError, match=r"\(Batch element 1\).*D\[1,1\] is exactly"):
        fg.linalg.ldl_factor(singular)
    with pytest.raises(RuntimeError, match="ldl_factor_ex.*singular"):
        fg.linalg.ldl_factor_ex(singular, check_errors=True)
    with pytest.raises(RuntimeError, match=r"ldl_factor: The factorization.*D\[0,0\]"):
        fg.linalg.ldl_factor(fg.zeros(3, 3))


def test_argument_errors() -> None:
    LD, pivots = fg.linalg.ldl_factor(fg.tensor(_matrix(3, np.float64, False)))
    B = fg.ones(3, 2, dtype=fg.float64)
    cases = [
        (lambda: fg.linalg.ldl_factor(fg.zeros(2, 3)), "square matrices, but they are 2 by 3"),
        (lambda: fg.linalg.ldl_factor(fg.zeros(3)), "at least 2 dimensions"),
        (lambda: fg.linalg.ldl_factor(fg.zeros(3, 3, dtype=fg.int64)), "floating point"),
        (lambda: fg.linalg.ldl_factor_ex(fg.zeros(2, 3)), "ldl_factor_ex: A must be batches"),
        (lambda: fg.linalg.ldl_solve(LD, pivots, fg.ones(4, 2, dtype=fg.float64)), "4 by 2"),
        (lambda: fg.linalg.ldl_solve(LD, pivots, fg.ones(3, 2)), "same dtype"),
        (lambda: fg.linalg.ldl_solve(LD, pivots.float(), B), "pivots to be integers"),
        (lambda: fg.linalg.ldl_solve(LD, pivots[:2], B), r"pivots with shape \[2\]"),
        (lambda: fg.linalg.ldl_solve(LD[0], pivots, B), "at least 2 dimensions"),
        (lambda: fg.linalg.ldl_solve(LD, pivots, B[0]), "B must have at least 2 dimensions"),
        (lambda: fg.linalg.ldl_solve(LD, fg.tensor([1, 2, 4]), B), "invalid pivots"),
        (lambda: fg.linalg.ldl_solve(LD, fg.tensor([1, 2, -3]), B), "repeated"),
        (lambda: fg.linalg.ldl_solve(LD, fg.tensor([1, 0, 3]), B), "invalid pivots"),
    ]
    for make, match in cases:
        with pytest.raises(RuntimeError, match=match):
            make()


def test_no_derivative_as_in_pytorch() -> None:
    A = fg.tensor(_matrix(3, np.float64, False), requires_grad=True)
    LD, pivots, info = fg.linalg.ldl_factor_ex(A)
    assert LD.requires_grad and not pivots.requires_grad and not info.requires_grad
    with pytest.raises(AutogradError, match="derivative for aten::linalg_ldl_factor_ex is not"):
        LD.sum().backward()
    B = fg.ones(3, 2, dtype=fg.float64, requires_grad=True)
    X = fg.linalg.ldl_solve(LD.detach(), pivots, B)
    assert X.requires_grad
    with pytest.raises(AutogradError, match="derivative for aten::linalg_ldl_solve is not"):
        fg.autograd.grad(X.sum(), B)
    with fg.no_grad():
        assert not fg.linalg.ldl_factor(A).LD.requires_grad
    assert not fg.linalg.ldl_solve(LD.detach(), pivots, B.detach()).requires_grad
