"""``fusegrad.linalg`` (docs/linalg.md): every public name of ``torch.linalg``; values and
gradients against PyTorch (float64 to 1e-10 relative, float32 to 1e-5) when it is importable and
against numpy otherwise; gradcheck and gradgradcheck of every differentiable function, batched,
real and complex; PyTorch's errors for singular and non-positive-definite inputs, with nothing
recorded; PyTorch's nan gradients where they are ill-defined."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.linalg as LA
from fusegrad.autograd import gradcheck, gradgradcheck

try:
    import torch
except ImportError:  # pragma: no cover - the cross-checks skip
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not importable")

RNG = np.random.default_rng(7)


def _general(shape, complex_=False):
    a = RNG.standard_normal(shape)
    if complex_:
        a = a + 1j * RNG.standard_normal(shape)
    return a


def _spd(shape, complex_=False):
    """Hermitian positive-definite, well conditioned."""
    a = _general(shape, complex_)
    n = shape[-1]
    return a @ np.conj(np.swapaxes(a, -1, -2)) + n * np.eye(n)


def _hermitian(shape, complex_=False):
    a = _general(shape, complex_)
    return a + np.conj(np.swapaxes(a, -1, -2))


# ---- the cases: name -> (function of (lib, *tensors) returning a real loss, input makers) ---
# Losses are invariant under the sign / phase of eigenvectors and singular vectors, so that they
# compare across LAPACK implementations.


def _gauge_free_vectors(V):
    return (V.abs() ** 2 * V.abs()).sum()


CASES = {
    "solve": (lambda m, A, B: (m.linalg.solve(A, B) ** 2).sum(), [(3, 4, 4), (3, 4, 2)]),
    "solve_vector": (lambda m, A, b: m.linalg.solve(A, b).sum(), [(4, 4), (4,)]),
    "solve_broadcast": (lambda m, A, B: m.linalg.solve(A, B).sum(), [(2, 1, 3, 3), (4, 3, 2)]),
    "solve_right": (lambda m, A, B: m.linalg.solve(A, B, left=False).sum(), [(3, 3), (2, 3)]),
    "solve_ex": (lambda m, A, B: m.linalg.solve_ex(A, B).result.sum(), [(2, 3, 3), (2, 3, 1)]),
    "inv": (lambda m, A: (m.linalg.inv(A) ** 2).sum(), [(2, 3, 3)]),
    "inv_ex": (lambda m, A: m.linalg.inv_ex(A).inverse.sum(), [(3, 3)]),
    "det": (lambda m, A: (m.linalg.det(A) ** 2).sum(), [(2, 4, 4)]),
    "slogdet": (lambda m, A: m.linalg.slogdet(A).logabsdet.sum(), [(2, 3, 3)]),
    "solve_triangular": (
        lambda m, A, B: m.linalg.solve_triangular(A, B, upper=True).sum(),
        [(2, 3, 3), (2, 3, 2)],
    ),
    "solve_triangular_right_unit": (
        lambda m, A, B: (
            m.linalg.solve_triangular(A, B, upper=False, left=False, unitriangular=True) ** 2
        ).sum(),
        [(3, 3), (2, 3)],
    ),
    "cholesky": (lambda m, A: (m.linalg.cholesky(A) ** 2).sum(), ["spd", (2, 3, 3)]),
    "cholesky_upper": (lambda m, A: m.linalg.cholesky(A, upper=True).sum(), ["spd", (3, 3)]),
    "cholesky_ex": (lambda m, A: m.linalg.cholesky_ex(A).L.sum(), ["spd", (3, 3)]),
    "eigh": (
        lambda m, A: (
            m.linalg.eigh(A).eigenvalues.sum() + _gauge_free_vectors(m.linalg.eigh(A).eigenvectors)
        ),
        ["hermitian", (2, 3, 3)],
    ),
    "eigvalsh": (lambda m, A: (m.linalg.eigvalsh(A, UPLO="U") ** 2).sum(), ["hermitian", (4, 4)]),
    "eig": (
        lambda m, A: (
            (m.linalg.eig(A).eigenvalues ** 2).sum().real
            + _gauge_free_vectors(m.linalg.eig(A).eigenvectors)
        ),
        [(3, 3)],
    ),
    "eigvals": (lambda m, A: m.linalg.eigvals(A).abs().sum(), [(2, 3, 3)]),
    "svd": (
        lambda m, A: (
            m.linalg.svd(A, full_matrices=False).S.sum()
            + _gauge_free_vectors(m.linalg.svd(A, full_matrices=False).U)
            + _gauge_free_vectors(m.linalg.svd(A, full_matrices=False).Vh)
        ),
        [(2, 4, 3)],
    ),
    "svd_wide": (
        lambda m, A: (
            _gauge_free_vectors(m.linalg.svd(A, full_matrices=False).Vh)
            + (m.linalg.svd(A).S ** 3).sum()
        ),
        [(3, 5)],
    ),
    "svdvals": (lambda m, A: (m.linalg.svdvals(A) ** 2).sum(), [(2, 3, 5)]),
    "qr": (lambda m, A: (m.linalg.qr(A).Q ** 3).sum() + m.linalg.qr(A).R.sum(), [(2, 4, 3)]),
    "qr_wide": (lambda m, A: m.linalg.qr(A).Q.sum() + (m.linalg.qr(A).R ** 2).sum(), [(3, 5)]),
    "qr_r": (lambda m, A: m.linalg.qr(A, mode="r").R.sum(), [(4, 4)]),
    "pinv": (lambda m, A: (m.linalg.pinv(A) ** 2).sum(), [(2, 4, 3)]),
    "pinv_wide": (lambda m, A: m.linalg.pinv(A).sum(), [(3, 5)]),
    "pinv_hermitian": (lambda m, A: m.linalg.pinv(A, hermitian=True).sum(), ["spd", (3, 3)]),
    "lstsq": (lambda m, A, B: m.linalg.lstsq(A, B).solution.sum(), [(2, 5, 3), (2, 5, 2)]),
    "matrix_exp": (lambda m, A: (m.linalg.matrix_exp(A) ** 2).sum(), [(2, 3, 3)]),
    "matrix_power": (lambda m, A: m.linalg.matrix_power(A, 3).sum(), [(3, 3)]),
    "matrix_power_negative": (lambda m, A: m.linalg.matrix_power(A, -2).sum(), [(3, 3)]),
    "lu_factor": (lambda m, A: (m.linalg.lu_factor(A).LU ** 2).sum(), [(2, 3, 3)]),
    "lu": (lambda m, A: m.linalg.lu(A).L.sum() + (m.linalg.lu(A).U ** 2).sum(), [(3, 3)]),
    "lu_solve": (
        lambda m, A, B: m.linalg.lu_solve(*m.linalg.lu_factor(A), B).sum(),
        [(2, 3, 3), (2, 3, 2)],
    ),
    "lu_solve_adjoint_right": (
        lambda m, A, B: (
            m.linalg.lu_solve(*m.linalg.lu_factor(A), B, left=False, adjoint=True) ** 2
        ).sum(),
        [(3, 3), (2, 3)],
    ),
    "vector_norm": (lambda m, x: m.linalg.vector_norm(x, 3, dim=-1).sum(), [(3, 4)]),
    "vector_norm_inf": (lambda m, x: m.linalg.vector_norm(x, float("inf")), [(5,)]),
    "matrix_norm_fro": (lambda m, A: m.linalg.matrix_norm(A).sum(), [(2, 3, 4)]),
    "matrix_norm_nuc": (lambda m, A: m.linalg.matrix_norm(A, "nuc").sum(), [(2, 3, 4)]),
    "matrix_norm_2": (lambda m, A: m.linalg.matrix_norm(A, 2).sum(), [(3, 4)]),
    "matrix_norm_-2": (lambda m, A: m.linalg.matrix_norm(A, -2).sum(), [(4, 3)]),
    "matrix_norm_1": (lambda m, A: m.linalg.matrix_norm(A, 1, keepdim=True).sum(), [(3, 4)]),
    "matrix_norm_inf": (lambda m, A: m.linalg.matrix_norm(A, float("inf")).sum(), [(3, 4)]),
    "norm": (lambda m, A: m.linalg.norm(A) + m.linalg.norm(A, 1), [(3, 4)]),
    "cond": (lambda m, A: m.linalg.cond(A) + m.linalg.cond(A, "fro"), [(3, 3)]),
    "multi_dot": (
        lambda m, a, B, C, d: m.linalg.multi_dot([a, B, C, d]),
        [(3,), (3, 4), (4, 2), (2,)],
    ),
    "householder_product": (
        lambda m, A, tau: (m.linalg.householder_product(A, tau) ** 2).sum(),
        [(4, 3), (2,)],
    ),
    "tensorinv": (lambda m, A: m.linalg.tensorinv(A, ind=1).sum(), [(6, 2, 3)]),
    "tensorsolve": (lambda m, A, B: m.linalg.tensorsolve(A, B).sum(), [(2, 3, 6), (2, 3)]),
    "vecdot": (lambda m, x, y: m.linalg.vecdot(x, y).sum(), [(3, 4), (4,)]),
    "cross": (lambda m, x, y: m.linalg.cross(x, y).sum(), [(2, 3), (2, 3)]),
    "vander": (lambda m, x: m.linalg.vander(x, N=4).sum(), [(3,)]),
    "diagonal": (lambda m, A: m.linalg.diagonal(A, offset=1).sum(), [(2, 3, 3)]),
    "matmul": (lambda m, A, B: m.linalg.matmul(A, B).sum(), [(2, 3), (3, 2)]),
}
# no complex cases for those PyTorch does not define for complex inputs (or whose real parts
# the loss reads in ways that only make sense for real values)
REAL_ONLY = {"cond", "vander", "cross", "tensorinv", "tensorsolve", "multi_dot"}


def _inputs(name, complex_):
    specs = CASES[name][1]
    kind = None
    out = []
    for s in specs:
        if isinstance(s, str):
            kind = s
            continue
        if kind == "spd":
            out.append(_spd(s, complex_))
        elif kind == "hermitian":
            out.append(_hermitian(s, complex_))
        elif name.startswith("solve_triangular") and not out:
            out.append(_general(s, complex_) + 3 * np.eye(s[-1]))
        elif name == "householder_product" and len(out) == 1:
            tau = RNG.uniform(0.5, 1.5, s)
            out.append(tau + 0.3j * tau if complex_ else tau)
        else:
            out.append(_general(s, complex_))
        kind = None if kind is None else kind
    return out


def _variants(name):
    yield False
    if name not in REAL_ONLY:
        yield True


@needs_torch
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_match_torch(name):
    fn = CASES[name][0]
    for complex_ in _variants(name):
        arrays = _inputs(name, complex_)
        for dtype, rtol in ((np.float64, 1e-10), (np.float32, 1e-5)):
            if complex_:
                dtype = np.complex128 if dtype is np.float64 else np.complex64
            results = []
            for lib in (fg, torch):
                ts = [lib.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
                out = _real(fn(lib, *ts))
                if name in TORCH_VALUES_ONLY:
                    results.append((out.detach().numpy(), []))
                    continue
                grads = [
                    g for g in (lib.autograd.grad(out, ts, allow_unused=True)) if g is not None
                ]
                results.append((out.detach().numpy(), [g.resolve_conj().numpy() for g in grads]))
            (o, gs), (to, tgs) = results
            tol = rtol if dtype in (np.float64, np.complex128) else 10 * rtol
            np.testing.assert_allclose(o, to, rtol=tol, atol=tol * max(1.0, np.abs(to).max()))
            assert len(gs) == len(tgs)
            for g, tg in zip(gs, tgs):
                scale = max(1.0, np.abs(tg).max())
                np.testing.assert_allclose(g, tg, rtol=tol * 10, atol=tol * 10 * scale)


def _real(out):
    """A real loss of a possibly complex result."""
    return out.real + 0.5 * out.imag if out.is_complex() else out


# PyTorch 2.13 cannot differentiate these (mode="r" drops the Q its rule needs; cond's "fro"
# backward trips over an in-place write of its own): values only against it
TORCH_VALUES_ONLY = {"qr_r", "cond"}

GRADCHECK = sorted(
    set(CASES)
    - {
        "vector_norm_inf",
        "matrix_norm_1",
        "matrix_norm_inf",
        "norm",
        "cond",
        "matmul",
        "diagonal",
        "cross",
        "vander",
        "vecdot",
    }
)


@pytest.mark.parametrize("name", GRADCHECK)
def test_gradcheck_and_gradgradcheck(name):
    fn = CASES[name][0]
    for complex_ in _variants(name):
        ts = [fg.tensor(a, requires_grad=True) for a in _inputs(name, complex_)]
        kind = CASES[name][1][0]

        def f(*xs, kind=kind):
            if kind in ("spd", "hermitian"):
                # these read one triangle: check them on Hermitian inputs, as PyTorch does
                xs = ((xs[0] + xs[0].mH) * 0.5,) + xs[1:]
            return _real(fn(fg, *xs))

        assert gradcheck(f, ts, atol=1e-6, rtol=1e-4)
        assert gradgradcheck(f, ts, atol=1e-5, rtol=1e-3)


def test_every_torch_linalg_name_exists():
    if torch is not None:
        public = {
            n
            for n in dir(torch.linalg)
            if not n.startswith("_") and callable(getattr(torch.linalg, n))
        }
        assert public <= set(LA.__all__) | {"ldl_factor", "ldl_factor_ex", "ldl_solve"}
    assert fg.linalg is LA
    for name in LA.__all__:
        assert hasattr(LA, name)


# ---- errors: PyTorch's words, nothing recorded -------------------------------------------


def _singular(batched=False):
    a = np.array([[1.0, 2.0], [2.0, 4.0]])
    return np.stack([np.eye(2), a]) if batched else a


def test_singular_inputs_raise_with_torch_words():
    A = fg.tensor(_singular(), requires_grad=True)
    with pytest.raises(
        RuntimeError, match="The solver failed because the input matrix is singular"
    ):
        LA.solve(A, fg.ones(2, dtype=fg.float64))
    with pytest.raises(LA.LinAlgError, match=r"\(Batch element 1\): The solver failed"):
        LA.solve(fg.tensor(_singular(True)), fg.ones(2, 2, 1, dtype=fg.float64))
    with pytest.raises(RuntimeError, match="The diagonal element 2 is zero, the inversion"):
        LA.inv(A)
    with pytest.raises(RuntimeError, match="leading minor of order 1 is not positive-definite"):
        LA.cholesky(fg.tensor(-np.eye(3)))
    with pytest.raises(RuntimeError, match=r"\(Batch element 1\).*order 2 is not"):
        LA.cholesky(fg.tensor(np.stack([np.eye(2), np.diag([1.0, -1.0])])))
    with pytest.raises(RuntimeError, match=r"U\[1,1\] is zero"):
        LA.lu_factor(fg.tensor(_singular()))
    with pytest.raises(RuntimeError, match="must be batches of square matrices"):
        LA.det(fg.ones(2, 3))
    with pytest.raises(RuntimeError, match="Expected a floating point or complex tensor"):
        LA.det(fg.ones(2, 2, dtype=fg.int64))
    with pytest.raises(RuntimeError, match="Expected UPLO argument"):
        LA.eigh(fg.eye(2), UPLO="X")
    with pytest.raises(RuntimeError, match="Order 3 not supported"):
        LA.matrix_norm(fg.ones(3, 3), 3)
    assert A.grad is None and A.grad_fn is None


def test_ex_variants_report_info_instead():
    out = LA.solve_ex(fg.tensor(_singular()), fg.ones(2, dtype=fg.float64))
    assert out.info.item() == 2 and not np.isfinite(out.result.numpy()).all()
    inv = LA.inv_ex(fg.tensor(_singular(True)))
    np.testing.assert_array_equal(inv.info.numpy(), [0, 2])
    np.testing.assert_allclose(inv.inverse.numpy()[0], np.eye(2))
    chol = LA.cholesky_ex(fg.tensor(np.stack([np.eye(2), -np.eye(2)])))
    np.testing.assert_array_equal(chol.info.numpy(), [0, 1])
    lu = LA.lu_factor_ex(fg.tensor(_singular()))
    assert lu.info.item() == 2
    with pytest.raises(RuntimeError, match="singular"):
        LA.solve_ex(fg.tensor(_singular()), fg.ones(2, dtype=fg.float64), check_errors=True)


@needs_torch
def test_info_and_pivots_match_torch():
    for a in (_singular(), _singular(True), RNG.standard_normal((2, 4, 4)), np.zeros((3, 3))):
        mine = LA.lu_factor_ex(fg.tensor(a))
        theirs = torch.linalg.lu_factor_ex(torch.tensor(a))
        np.testing.assert_array_equal(mine.pivots.numpy(), theirs.pivots.numpy())
        np.testing.assert_array_equal(mine.info.numpy(), theirs.info.numpy())
        np.testing.assert_allclose(mine.LU.numpy(), theirs.LU.numpy(), atol=1e-12)
    a = RNG.standard_normal((4, 3))
    for mine, theirs in zip(LA.lu(fg.tensor(a)), torch.linalg.lu(torch.tensor(a))):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), atol=1e-12)


@needs_torch
def test_ill_defined_gradients_are_nan_as_in_torch():
    """Eigenvectors of a repeated eigenvalue (and singular vectors of a repeated singular
    value) have no gradient: PyTorch gives nan when they are used, and a finite gradient when
    only the eigenvalues are; so does fusegrad."""
    for lib in (fg, torch):
        A = lib.eye(3, dtype=lib.float64, requires_grad=True)
        L, V = lib.linalg.eigh(A)
        L.sum().backward()
        np.testing.assert_allclose(A.grad.numpy(), np.eye(3))
        A.grad = None
        L, V = lib.linalg.eigh(A)
        V.sum().backward()
        assert np.isnan(A.grad.numpy()).all()
        A.grad = None
        lib.linalg.svd(A).U.sum().backward()
        assert np.isnan(A.grad.numpy()).all()


def test_determinant_gradient_of_a_singular_matrix_is_the_cofactor():
    a = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])
    A = fg.tensor(a, requires_grad=True)
    LA.det(A).backward()
    cofactor = np.array(
        [
            [np.linalg.det(np.delete(np.delete(a, i, 0), j, 1)) * (-1) ** (i + j) for j in range(3)]
            for i in range(3)
        ]
    )
    np.testing.assert_allclose(A.grad.numpy(), cofactor, atol=1e-12)


def test_values_match_numpy():
    a = RNG.standard_normal((2, 4, 4))
    A = fg.tensor(a)
    np.testing.assert_allclose(LA.det(A).numpy(), np.linalg.det(a), rtol=1e-12)
    np.testing.assert_allclose(LA.inv(A).numpy(), np.linalg.inv(a), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(LA.slogdet(A).logabsdet.numpy(), np.linalg.slogdet(a)[1])
    np.testing.assert_allclose(LA.svdvals(A).numpy(), np.linalg.svd(a, compute_uv=False))
    np.testing.assert_allclose(LA.pinv(A).numpy(), np.linalg.pinv(a), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(LA.matrix_rank(A).numpy(), np.linalg.matrix_rank(a))
    np.testing.assert_allclose(
        LA.matrix_exp(A).numpy()[0], _expm_reference(a[0]), rtol=1e-12, atol=1e-12
    )
    s = _spd((3, 3))
    np.testing.assert_allclose(LA.cholesky(fg.tensor(s)).numpy(), np.linalg.cholesky(s))
    np.testing.assert_allclose(LA.eigvalsh(fg.tensor(s)).numpy(), np.linalg.eigvalsh(s))
    np.testing.assert_allclose(
        LA.matrix_norm(A, "nuc").numpy(), np.linalg.norm(a, "nuc", axis=(-2, -1))
    )
    np.testing.assert_allclose(LA.cond(A).numpy(), np.linalg.cond(a))
    np.testing.assert_allclose(
        LA.multi_dot([A[0], A[1], A[0]]).numpy(), a[0] @ a[1] @ a[0], rtol=1e-12
    )


def _expm_reference(a):
    """exp(a) by its Taylor series in extended steps (a has a small norm here after scaling)."""
    s = 6
    x = a / 2.0**s
    term, total = np.eye(len(a)), np.eye(len(a))
    for k in range(1, 30):
        term = term @ x / k
        total = total + term
    for _ in range(s):
        total = total @ total
    return total


def test_compiled_backward_of_a_solve_gives_eagers_gradients():
    from fusegrad import compiler

    a = RNG.standard_normal((4, 4)) + 4 * np.eye(4)
    b = RNG.standard_normal((4, 2))
    grads = []
    for compiled in (False, True):
        A = fg.tensor(a, requires_grad=True)
        B = fg.tensor(b, requires_grad=True)
        loss = (LA.solve(A, B) ** 2).sum() + LA.cholesky(A @ A.mT).sum()
        if compiled:
            with compiler.compiled_autograd():
                loss.backward()
        else:
            loss.backward()
        grads.append((A.grad.numpy(), B.grad.numpy()))
    for g, want in zip(grads[1], grads[0]):
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-12)


def test_docs_examples_run():
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "linalg.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert blocks
    for code in blocks:
        exec(compile(code, "docs/linalg.md", "exec"), {})
