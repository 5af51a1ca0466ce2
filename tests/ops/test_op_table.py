"""Tests generated from the op table (``op_table.OPS``): for every op and every sample case,
forward vs the numpy reference (float64 tight, float32 within the entry's tolerance), output
dtypes, ``gradcheck`` in float64, ``gradgradcheck`` where twice differentiable, float32
backward, zero gradients of piecewise-constant ops, no grad through non-differentiable ops, and
a cross-check of values and gradients against PyTorch where it is installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from op_table import (
    FG,
    OPS,
    Lib,
    OpInfo,
    Sample,
    build,
    flat_outputs,
    is_float,
    run_ref,
    to_numpy,
    torch_lib,
)

import fusegrad
from fusegrad.autograd import gradcheck, gradgradcheck

CASES = [(e, s) for e in OPS for s in e.get_samples()]
IDS = [f"{e.name}-{s.name}" for e, s in CASES]
GRAD_CASES = [(e, s) for e, s in CASES if e.differentiable and s.grad]
GRAD_IDS = [f"{e.name}-{s.name}" for e, s in GRAD_CASES]
GRADGRAD_CASES = [(e, s) for e, s in GRAD_CASES if e.twice and s.gradgrad]
GRADGRAD_IDS = [f"{e.name}-{s.name}" for e, s in GRADGRAD_CASES]
ZERO_CASES = [(e, s) for e, s in GRAD_CASES if e.zero_grad]
NONDIFF_CASES = [(e, s) for e, s in CASES if not e.differentiable]


def _has_float_array(sample: Sample) -> bool:
    def check(a: Any) -> bool:
        if isinstance(a, np.ndarray):
            return a.dtype.kind == "f"
        return isinstance(a, list) and any(check(e) for e in a)

    return any(check(a) for a in list(sample.args) + list(sample.kwargs.values()))


def _expected_dtype(entry: OpInfo, ref: np.ndarray, sample: Sample, float_dtype: str) -> str:
    kind = ref.dtype.kind
    if kind == "f" and entry.out_dtype is not None:
        return entry.out_dtype
    if kind == "f":
        return float_dtype if _has_float_array(sample) else "float32"
    return {"b": "bool", "i": "int64", "u": "int64"}[kind]


def _forward(entry: OpInfo, sample: Sample, dtype: str) -> list:
    _, fn = build(entry, FG, sample, dtype, requires_grad=False)
    return flat_outputs(fn())


def _check_forward(entry: OpInfo, sample: Sample, dtype: str, tol: tuple[float, float]) -> None:
    outs = _forward(entry, sample, dtype)
    refs = run_ref(entry, sample, dtype)
    assert len(outs) == len(refs), f"{len(outs)} outputs, reference has {len(refs)}"
    for k, (o, r) in enumerate(zip(outs, refs)):
        assert isinstance(o, fusegrad.Tensor), f"output {k} is {type(o).__name__}"
        assert tuple(o.shape) == r.shape, f"output {k}: shape {tuple(o.shape)} vs {r.shape}"
        assert o.dtype.name == _expected_dtype(entry, r, sample, dtype), f"output {k}: {o.dtype}"
        got = to_numpy(o)
        assert got.shape == r.shape
        if r.dtype.kind == "f":
            # integer operands promoted to the default dtype give float32 in a float64 run
            rtol, atol = entry.f32_tol if got.dtype == np.float32 else tol
            np.testing.assert_allclose(
                got, r, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"output {k}"
            )
        else:
            np.testing.assert_array_equal(got, r, err_msg=f"output {k}")


@pytest.mark.parametrize("entry,sample", CASES, ids=IDS)
def test_forward_float64(entry: OpInfo, sample: Sample) -> None:
    _check_forward(entry, sample, "float64", entry.f64_tol)


@pytest.mark.parametrize("entry,sample", CASES, ids=IDS)
def test_forward_float32(entry: OpInfo, sample: Sample) -> None:
    _check_forward(entry, sample, "float32", entry.f32_tol)


def _float_outputs(fn: Any) -> Any:
    def call(*leaves: Any) -> tuple:
        return tuple(o for o in flat_outputs(fn(*leaves)) if is_float(o))

    return call


@pytest.mark.parametrize("entry,sample", GRAD_CASES, ids=GRAD_IDS)
def test_gradcheck(entry: OpInfo, sample: Sample) -> None:
    leaves, fn = build(entry, FG, sample, "float64")
    if not leaves:
        pytest.skip("no differentiable input in this case")
    assert gradcheck(_float_outputs(fn), tuple(leaves))


@pytest.mark.parametrize("entry,sample", GRADGRAD_CASES, ids=GRADGRAD_IDS)
def test_gradgradcheck(entry: OpInfo, sample: Sample) -> None:
    leaves, fn = build(entry, FG, sample, "float64")
    if not leaves:
        pytest.skip("no differentiable input in this case")
    assert gradgradcheck(_float_outputs(fn), tuple(leaves))


def _jvp_by_forward_ad(fn: Any, leaves: list, tangents: list, lib: Lib = FG) -> list:
    """The tangents of ``fn``'s float outputs with ``tangents`` on the leaves (forward AD of
    ``lib``); None where an output has none."""
    if lib is FG:
        from fusegrad.autograd import forward_ad as fwAD
    else:
        import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        duals = [fwAD.make_dual(x, lib.tensor(t)) for x, t in zip(leaves, tangents)]
        try:
            outs = [o for o in flat_outputs(fn(*duals)) if is_float(o)]
        except NotImplementedError as e:
            if lib is FG and _unsupported_jvp(e):
                pytest.skip(f"no forward-mode rule, on purpose (jvps.UNSUPPORTED): {e}")
            raise
        return [None if (u := fwAD.unpack_dual(o).tangent) is None else to_numpy(u) for o in outs]


def _unsupported_jvp(error: NotImplementedError) -> bool:
    """The error names a primitive that ``autograd/jvps.py`` leaves without a rule on purpose."""
    from fusegrad.autograd.jvps import UNSUPPORTED

    return any(f"'{name}'" in str(error) or f" {name} " in str(error) for name in UNSUPPORTED)


@pytest.mark.parametrize("entry,sample", GRAD_CASES, ids=GRAD_IDS)
def test_jvp_matches_finite_differences(entry: OpInfo, sample: Sample) -> None:
    """Forward AD (every primitive's JVP rule, ``autograd/jvps.py``) against central finite
    differences along a random direction, in float64 (gradcheck's tolerances)."""
    leaves, fn = build(entry, FG, sample, "float64")
    if not leaves:
        pytest.skip("no differentiable input in this case")
    rng = np.random.default_rng(4321)
    tangents = [rng.standard_normal(tuple(x.shape)) for x in leaves]
    jvps = _jvp_by_forward_ad(fn, leaves, tangents)
    eps = 1e-6

    def shifted(sign: float) -> list:
        moved = [fusegrad.tensor(to_numpy(x) + sign * eps * t) for x, t in zip(leaves, tangents)]
        return [to_numpy(o) for o in flat_outputs(fn(*moved)) if is_float(o)]

    plus, minus = shifted(1.0), shifted(-1.0)
    assert len(jvps) == len(plus)
    for k, (jv, hi, lo) in enumerate(zip(jvps, plus, minus)):
        numeric = (hi - lo) / (2 * eps)
        analytic = np.zeros_like(numeric) if jv is None else jv
        # a nan output (the mean of nothing) has no finite difference to compare with
        finite = np.isfinite(numeric)
        np.testing.assert_allclose(
            analytic[finite], numeric[finite], rtol=1e-3, atol=1e-5, err_msg=f"output {k}"
        )


# fusegrad's mean of nothing is built so that no nan reaches derivatives (ops/reduction.py):
# its tangent is 0 where PyTorch's is nan (0 / 0); and PyTorch's logcumsumexp JVP underflows
# to 0 at a prefix 800 below the row's maximum, where out[0] = x[0] has tangent t[0] (fusegrad
# gives t[0]; the finite-difference test checks it)
_JVP_NOT_AS_TORCH = {
    ("mean", "empty_reduced"),
    ("mean", "empty_full"),
    ("logcumsumexp", "spread"),
}
JVP_TORCH_CASES = [
    (e, s)
    for e, s in GRAD_CASES
    if s.torch and e.torch_grad and (e.name, s.name) not in _JVP_NOT_AS_TORCH
]
JVP_TORCH_IDS = [f"{e.name}-{s.name}" for e, s in JVP_TORCH_CASES]


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch performance notes
@pytest.mark.parametrize("entry,sample", JVP_TORCH_CASES, ids=JVP_TORCH_IDS)
def test_jvp_matches_torch(entry: OpInfo, sample: Sample) -> None:
    """Forward AD against ``torch.autograd.forward_ad`` on the same case and direction."""
    pytest.importorskip("torch")
    tl = torch_lib()
    leaves, fn = build(entry, FG, sample, "float64")
    t_leaves, t_fn = build(entry, tl, sample, "float64")
    if not leaves:
        pytest.skip("no differentiable input in this case")
    rng = np.random.default_rng(4321)
    tangents = [rng.standard_normal(tuple(x.shape)) for x in leaves]
    try:
        theirs = _jvp_by_forward_ad(t_fn, t_leaves, tangents, tl)
    except (NotImplementedError, RuntimeError) as e:
        pytest.skip(f"torch has no forward AD here: {str(e)[:80]}")
    ours = _jvp_by_forward_ad(fn, leaves, tangents)
    assert len(ours) == len(theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        if a is None or b is None:
            # None and zeros are the same derivative (PyTorch gives None for some
            # piecewise-constant results, fusegrad zeros, or the other way round)
            assert not np.any(a if a is not None else 0), f"output {k}"
            assert not np.any(b if b is not None else 0), f"output {k}"
            continue
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10, equal_nan=True, err_msg=f"{k}")


def _cotangents(outs: list, dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(1234)
    return [rng.standard_normal(tuple(o.shape)).astype(dtype) for o in outs]


def grads(
    entry: OpInfo, lib: Lib, sample: Sample, dtype: str, requires_grad: bool = True
) -> tuple[list, list, list]:
    """All outputs, the leaves, and the leaves' gradients for a fixed random cotangent on every
    float output (None: no gradient)."""
    leaves, fn = build(entry, lib, sample, dtype, requires_grad=requires_grad)
    outs = flat_outputs(fn(*leaves))
    floats = [o for o in outs if is_float(o)]
    cots = _cotangents(floats, dtype)
    pairs = [(o, lib.tensor(c)) for o, c in zip(floats, cots) if o.requires_grad]
    if not leaves or not pairs:
        return outs, leaves, [None] * len(leaves)
    gs = lib.autograd.grad([p[0] for p in pairs], leaves, [p[1] for p in pairs], allow_unused=True)
    return outs, leaves, list(gs)


def _grad_array(g: Any, leaf: Any) -> np.ndarray:
    return np.zeros(tuple(leaf.shape)) if g is None else to_numpy(g).astype(np.float64)


@pytest.mark.parametrize("entry,sample", GRAD_CASES, ids=GRAD_IDS)
def test_backward_float32(entry: OpInfo, sample: Sample) -> None:
    _, leaves32, g32 = grads(entry, FG, sample, "float32")
    _, _, g64 = grads(entry, FG, sample, "float64")
    rtol, atol = entry.f32_tol
    for leaf, g, g_ref in zip(leaves32, g32, g64):
        if g is None:
            assert g_ref is None
            continue
        assert g.dtype.name == "float32"
        assert tuple(g.shape) == tuple(leaf.shape)
        np.testing.assert_allclose(to_numpy(g), to_numpy(g_ref), rtol=rtol * 20, atol=atol * 20)


@pytest.mark.parametrize(
    "entry,sample", ZERO_CASES, ids=[f"{e.name}-{s.name}" for e, s in ZERO_CASES]
)
def test_zero_gradient(entry: OpInfo, sample: Sample) -> None:
    outs, leaves, gs = grads(entry, FG, sample, "float64")
    assert all(o.requires_grad for o in outs if is_float(o)), "output must take part in autograd"
    for _leaf, g in zip(leaves, gs):
        assert g is not None and not np.any(to_numpy(g))


@pytest.mark.parametrize(
    "entry,sample", NONDIFF_CASES, ids=[f"{e.name}-{s.name}" for e, s in NONDIFF_CASES]
)
def test_nondifferentiable_output_needs_no_grad(entry: OpInfo, sample: Sample) -> None:
    leaves, fn = build(entry, FG, sample, "float64", requires_grad=True)
    for o in flat_outputs(fn(*leaves)):
        assert not o.requires_grad and o.grad_fn is None


# ---- PyTorch cross-check ------------------------------------------------------------------------

TORCH_CASES = [(e, s) for e, s in CASES if e.torch and s.torch]
TORCH_IDS = [f"{e.name}-{s.name}" for e, s in TORCH_CASES]


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch performance notes
@pytest.mark.parametrize("entry,sample", TORCH_CASES, ids=TORCH_IDS)
def test_matches_torch(entry: OpInfo, sample: Sample) -> None:
    pytest.importorskip("torch")
    tl = torch_lib()
    with_grad = entry.differentiable and entry.torch_grad
    outs, leaves, gs = grads(entry, FG, sample, "float64", with_grad)
    t_outs, _, t_gs = grads(entry, tl, sample, "float64", with_grad)
    assert len(outs) == len(t_outs)
    for k, (o, t) in enumerate(zip(outs, t_outs)):
        assert tuple(o.shape) == tuple(t.shape), f"output {k}"
        assert o.dtype.name == str(t.dtype).replace("torch.", ""), f"output {k}"
        assert o.requires_grad == t.requires_grad, f"output {k}"
        # float32 outputs (integer operands promoted): both libraries round, differently
        rtol, atol = entry.f32_tol if o.dtype.name == "float32" else (1e-7, 1e-10)
        np.testing.assert_allclose(
            to_numpy(o), to_numpy(t), rtol=rtol, atol=atol, equal_nan=True, err_msg=f"output {k}"
        )
    for i, (leaf, g, tg) in enumerate(zip(leaves, gs, t_gs)):
        np.testing.assert_allclose(
            _grad_array(g, leaf),
            _grad_array(tg, leaf),
            rtol=1e-7,
            atol=1e-10,
            equal_nan=True,
            err_msg=f"gradient of leaf {i}",
        )


# ---- special values: signs of zero --------------------------------------------------------------

SPECIAL_CASES = [(e, s) for e, s in CASES if s.name == "special"]


@pytest.mark.parametrize(
    "entry,sample", SPECIAL_CASES, ids=[f"{e.name}-{s.name}" for e, s in SPECIAL_CASES]
)
def test_special_values_keep_signs_of_zero(entry: OpInfo, sample: Sample) -> None:
    """Samples of special values (op_table.SPECIAL): where a result is zero, its sign is the
    reference's and (where installed) PyTorch's — allclose alone cannot see ``-0.0``."""
    (out,) = _forward(entry, sample, "float64")
    (ref,) = run_ref(entry, sample, "float64")
    got = to_numpy(out)
    zero = got == 0
    np.testing.assert_array_equal(zero, ref == 0)
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(ref[zero]))
    if entry.torch and sample.torch:
        pytest.importorskip("torch")
        _, fn = build(entry, torch_lib(), sample, "float64", requires_grad=False)
        want = to_numpy(fn())
        np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]))
