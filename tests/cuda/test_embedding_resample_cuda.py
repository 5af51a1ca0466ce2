"""The embedding's and ``interpolate``'s CUDA kernels (``cuda/embedding.py``,
``cuda/resample.py``) in numba's simulator: the lookup and its scatter-add backward
(``padding_idx``, ``scale_grad_by_freq``, repeated indices, int32 and int64 indices) and
nearest, nearest-exact, linear, bilinear and trilinear resampling forward and backward give
the CPU kernels' values and gradients, float32 and float64; the kernels ran on the device, not
the composites; double backward (the rules' composites) on the device; a compiled backward on
the device calls them (and the norms') as externs."""

from __future__ import annotations

from typing import Any

import modes
import numpy as np
import pytest
from primitive_names import PrimitiveNames as _Recorder

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.autograd import tracer

modes.require_device()


def _tol(dtype: str) -> dict:
    return {"rtol": 1e-12, "atol": 1e-12} if dtype == "float64" else {"rtol": 1e-5, "atol": 1e-5}


def _embedding(device: str, dtype: str, index_dtype: str, padding: Any, by_freq: bool) -> tuple:
    rng = np.random.default_rng(2)
    weight = fg.tensor(rng.standard_normal((7, 3)).astype(dtype), device=device, requires_grad=True)
    idx = fg.tensor(np.array([[0, 2, 2, 6], [5, 2, 1, 0]], index_dtype), device=device)
    rec = _Recorder()
    with tracer.tracing(rec):
        out = F.embedding(idx, weight, padding_idx=padding, scale_grad_by_freq=by_freq)
        g = fg.tensor(rng.standard_normal(out.shape).astype(dtype), device=device)
        (out * g).sum().backward()
    return out.detach().cpu().numpy(), weight.grad.cpu().numpy(), rec.names


@pytest.mark.parametrize(
    ("dtype", "index_dtype", "padding", "by_freq"),
    [
        ("float64", "int64", None, False),
        ("float64", "int64", 2, True),
        ("float64", "int32", -1, False),
        ("float32", "int64", None, True),
        ("float32", "int32", 0, False),
    ],
)
def test_embedding_matches_the_cpu_kernel(
    dtype: str, index_dtype: str, padding: Any, by_freq: bool
) -> None:
    want = _embedding("cpu", dtype, index_dtype, padding, by_freq)
    got = _embedding("cuda", dtype, index_dtype, padding, by_freq)
    assert {"embedding", "embedding_backward"} <= got[2], got[2]
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_allclose(a, b, **_tol(dtype))


def test_embedding_module_and_double_backward_on_the_device() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 2))
    idx = np.array([1, 3, 3, 0])
    results = []
    for device in ("cpu", "cuda"):
        layer = fg.nn.Embedding(5, 2, padding_idx=3, scale_grad_by_freq=True).to(device)
        with fg.no_grad():
            layer.weight.copy_(fg.tensor(w, dtype=fg.float32, device=device))
        out = layer(fg.tensor(idx, device=device))
        (out * out).sum().backward()
        wt = fg.tensor(w, device=device, requires_grad=True)
        y = F.embedding(fg.tensor(idx, device=device), wt, scale_grad_by_freq=True)
        (gw,) = fg.autograd.grad((y * y * y).sum(), wt, create_graph=True)
        (gg,) = fg.autograd.grad((gw * gw).sum(), wt)
        results.append((layer.weight.grad.cpu().numpy(), gg.cpu().numpy()))
    np.testing.assert_allclose(results[1][0], results[0][0], **_tol("float32"))
    np.testing.assert_allclose(results[1][1], results[0][1], **_tol("float64"))


# (input shape, interpolate's keyword arguments)
_RESAMPLE = [
    ((1, 2, 5), {"scale_factor": 2, "mode": "nearest"}),
    ((1, 2, 4, 5), {"size": (7, 3), "mode": "nearest-exact"}),
    ((1, 1, 2, 3, 3), {"scale_factor": (2, 1, 0.7), "mode": "nearest"}),
    ((2, 1, 5), {"size": 8, "mode": "linear"}),
    ((1, 2, 4, 5), {"size": (7, 3), "mode": "bilinear"}),
    ((2, 1, 3, 4), {"scale_factor": 1.5, "mode": "bilinear", "align_corners": True}),
    ((1, 1, 3, 4), {"size": (3, 6), "mode": "bilinear"}),  # (a dim copied as it is)
    ((1, 1, 2, 3, 3), {"size": (3, 5, 2), "mode": "trilinear"}),
]


def _resample(device: str, dtype: str, shape: tuple, kwargs: dict) -> tuple:
    rng = np.random.default_rng(len(shape))
    x = fg.tensor(rng.standard_normal(shape).astype(dtype), device=device, requires_grad=True)
    rec = _Recorder()
    with tracer.tracing(rec):
        out = F.interpolate(x, **kwargs)
        g = fg.tensor(rng.standard_normal(out.shape).astype(dtype), device=device)
        (out * g).sum().backward()
    return out.detach().cpu().numpy(), x.grad.cpu().numpy(), rec.names


@pytest.mark.parametrize(
    ("shape", "kwargs", "dtype"),
    [(s, k, "float64") for s, k in _RESAMPLE] + [(*_RESAMPLE[i], "float32") for i in (0, 4)],
    ids=lambda v: v.get("mode") if isinstance(v, dict) else str(v),
)
def test_interpolate_matches_the_cpu_kernels(shape: tuple, kwargs: dict, dtype: str) -> None:
    want = _resample("cpu", dtype, shape, kwargs)
    got = _resample("cuda", dtype, shape, kwargs)
    assert {"resample", "resample_backward"} <= got[2], got[2]
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_allclose(a, b, **_tol(dtype))


# (the simulator's numpy scalars warn at inf times a zero weight, in threads of its own)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_interpolate_nonfinite_input_reaches_its_neighbours_only() -> None:
    x = np.arange(12.0).reshape(1, 1, 3, 4)
    x[0, 0, 1, 1] = np.inf
    outs = [
        F.interpolate(fg.tensor(x, device=d), size=(5, 6), mode="bilinear").cpu().numpy()
        for d in ("cpu", "cuda")
    ]
    np.testing.assert_array_equal(np.isfinite(outs[1]), np.isfinite(outs[0]))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-12, atol=1e-12)


def test_interpolate_double_backward_on_the_device() -> None:
    x = np.random.default_rng(5).standard_normal((1, 1, 3, 3))
    results = []
    for device in ("cpu", "cuda"):
        xt = fg.tensor(x, device=device, requires_grad=True)
        y = F.interpolate(xt, size=(4, 5), mode="bilinear")
        (gx,) = fg.autograd.grad((y * y * y).sum(), xt, create_graph=True)
        (gg,) = fg.autograd.grad((gx * gx).sum(), xt)
        results.append(gg.cpu().numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-11, atol=1e-12)


def test_compiled_backward_runs_the_kernels_as_externs() -> None:
    """A compiled backward on the device (``compiled_autograd``) calls the norm, resample and
    embedding backward kernels as externs and gives eager CUDA's gradients."""
    from fusegrad import compiler

    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal(s) for s in ((2, 3, 2, 2), (3,), (3,), (6, 4))]
    idx = fg.tensor(np.array([[1, 2], [2, 5]]), device="cuda")

    def run(compiled: bool) -> list:
        leaves = [fg.tensor(a, device="cuda", requires_grad=True) for a in arrays]
        x, w, b, table = leaves
        y = F.group_norm(F.batch_norm(x, None, None, w, b, training=True), 3, w, b)
        y = F.interpolate(y, scale_factor=2, mode="nearest")
        e = F.layer_norm(F.embedding(idx, table), (4,))
        loss = (y * y).sum() + (e * e * e).sum()
        if compiled:
            with compiler.compiled_autograd():
                loss.backward()
        else:
            loss.backward()
        return [t.grad.cpu().numpy() for t in leaves]

    want = run(False)
    compiler.reset()
    got = run(True)
    assert compiler.counters.captures == 1 and compiler.counters.compiled_runs == 1
    assert not compiler.counters.fallbacks
    (program,) = compiler.cached_programs()
    externs = {str(v.op) for v in program.externs}
    assert {"norm_backward", "resample_backward", "embedding_backward"} <= externs, externs
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
